"""S3-compatible object storage: `s3://BUCKET/PREFIX` locations, the client, and one-line errors.

Both users of object storage (the S3 source repository, `controlplane.source.s3`, and the fleet's
shared store on S3, `controlplane.fleet.sharedcontent`) get their client here. The endpoint comes from
the standard `AWS_ENDPOINT_URL` (MinIO, Ceph, GCS's interoperability endpoint, a test server),
credentials and region from the standard AWS chain (environment, shared files, instance roles): never
from a tritonctl flag, so no secret ever lands in a command line or the process table. boto3 signs the
requests; a missing boto3 is a one-line error naming the extra that installs it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controlplane.errors import ConfigError, ObjectStoreError

SCHEME = "s3://"
_CHUNK = 1 << 20
# Error codes that mean "this request will never work as configured": reported, not retried quietly.
AUTH_CODES = frozenset({
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken",
    "AuthorizationHeaderMalformed", "NoSuchBucket", "AllAccessDisabled", "InvalidBucketName", "403",
})  # fmt: skip


def is_s3_url(value: object) -> bool:
    return isinstance(value, str) and value.startswith(SCHEME)


@dataclass(frozen=True)
class S3Location:
    """A bucket and a key prefix (always "" or ending in "/")."""

    bucket: str
    prefix: str

    @classmethod
    def parse(cls, url: str) -> S3Location:
        if not is_s3_url(url):
            raise ConfigError(f"{url}: expected s3://BUCKET/PREFIX")
        bucket, _, prefix = url[len(SCHEME):].partition("/")
        if not bucket or "/" in bucket or any(p in ("", ".", "..") for p in prefix.strip("/").split("/")[:-1]):
            raise ConfigError(f"{url}: expected s3://BUCKET/PREFIX")
        prefix = prefix.strip("/")
        return cls(bucket, f"{prefix}/" if prefix else "")

    @property
    def url(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}"

    def key(self, *parts: str) -> str:
        return self.prefix + "/".join(parts)


def new_client() -> Any:
    """A boto3 S3 client from the standard AWS configuration (AWS_ENDPOINT_URL, credential chain)."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise ConfigError("object storage needs boto3: pip install 'tritonctl[s3]'") from None
    config = Config(
        retries={"max_attempts": 3, "mode": "standard"},
        connect_timeout=3, read_timeout=30, max_pool_connections=16,
    )  # addressing style, retries and the rest may also come from the AWS config file (`s3 =` section)
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    session = boto3.session.Session()
    return session.client("s3", config=config, region_name=region or session.region_name or "us-east-1")


def error_code(exc: BaseException) -> str:
    """The S3 error code of a boto3/botocore failure ("NoSuchKey", "404", ...; "" when it has none)."""
    response = getattr(exc, "response", None)
    error = response.get("Error", {}) if isinstance(response, dict) else {}
    return str(error.get("Code", ""))


def describe(exc: BaseException, what: str) -> ObjectStoreError:
    """One line for a boto3/botocore failure; `auth` set when retrying cannot help."""
    name = type(exc).__name__
    response = getattr(exc, "response", None)
    error = response.get("Error", {}) if isinstance(response, dict) else {}
    code, message = error_code(exc), str(error.get("Message", ""))
    if name in ("NoCredentialsError", "PartialCredentialsError"):
        text, auth = "no AWS credentials found (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile)", True
    elif code in AUTH_CODES:
        text, auth = f"refused: {code}" + (f" ({message})" if message else ""), True
    elif name in ("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError"):
        text, auth = f"unreachable ({exc})", False
    else:
        text, auth = f"{code or name}: {exc}", False
    failure = ObjectStoreError(f"{what}: object storage {text}")
    failure.auth = auth
    return failure


def list_objects(client: Any, bucket: str, prefix: str) -> list[dict[str, Any]]:
    """Every object under `prefix` (key, size, ETag, last-modified), one LIST per 1000 keys."""
    rows: list[dict[str, Any]] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        rows.extend(page.get("Contents", ()))
    return rows


def list_uploads(client: Any, bucket: str, prefix: str) -> list[str]:
    """Keys with a multipart upload in progress under `prefix`."""
    keys: list[str] = []
    try:
        for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=prefix):
            keys.extend(u["Key"] for u in page.get("Uploads", ()))
    except Exception as exc:
        code = error_code(exc)
        if code in ("NotImplemented", "501"):
            return []  # a server without the call: its uploads are invisible until complete anyway
        raise
    return keys


def download_verified(client: Any, bucket: str, key: str, tmp_dir: Path, *, size: int | None = None,
                      etag: str | None = None, on_mismatch: Callable[[str], Exception]) -> tuple[Path, str]:
    """GET one object into a temporary file under `tmp_dir`, hashing it on the way: (path, sha256).

    With `etag`/`size` (from the listing that decided a capture) the object must still be exactly that
    one: the GET is conditional (If-Match) and the answer is read to `size` + 1 bytes at most (a server
    that sends more is not read further); `on_mismatch` builds the error raised otherwise. The caller
    renames the file into place or removes it."""
    extra = {"IfMatch": etag} if etag else {}
    fd, tmp = tempfile.mkstemp(dir=tmp_dir, prefix="s3-")
    try:
        try:
            answer = client.get_object(Bucket=bucket, Key=key, **extra)
        except Exception as exc:
            code = error_code(exc)
            if code in ("PreconditionFailed", "412", "NoSuchKey", "404"):
                raise on_mismatch(f"{key} replaced or removed during the download") from None
            raise
        if etag and answer.get("ETag") not in (None, etag):
            raise on_mismatch(f"{key} replaced during the download")
        hasher, copied = hashlib.sha256(), 0
        body = answer["Body"]
        limit = None if size is None else size + 1  # a longer answer is not read past its size + 1 byte
        with os.fdopen(fd, "wb") as writer, contextlib.closing(body):
            fd = -1
            while limit is None or copied < limit:
                chunk = body.read(_CHUNK if limit is None else min(_CHUNK, limit - copied))
                if not chunk:
                    break
                hasher.update(chunk)
                writer.write(chunk)
                copied += len(chunk)
        if size is not None and copied > size:
            raise on_mismatch(f"{key} is more than the {size} bytes the listing said; stopped reading there")
        if size is not None and copied != size:
            raise on_mismatch(f"{key} is {copied} bytes, the listing said {size}")
        return Path(tmp), hasher.hexdigest()
    except BaseException:
        if fd >= 0:
            os.close(fd)
        Path(tmp).unlink(missing_ok=True)
        raise
