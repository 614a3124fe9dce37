"""The S3 source's snapshot rules against a real S3-protocol server (moto_server on loopback, credentials
enforced): writers that upload object by object, multipart uploads, deletes and re-uploads during a
capture, the commit marker, the hold object, wrong credentials, the endpoint going away; and the fleet's
shared store on S3 (every object verified against the manifest)."""

from __future__ import annotations

import hashlib
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from controlplane.errors import ConfigError, ObjectStoreError, SnapshotError
from controlplane.fleet.sharedcontent import S3SharedStore, open_shared_store
from controlplane.snapshot import ContentStore
from controlplane.source.s3 import S3Source
from tests.s3server import MotoServer, s3env, s3server  # noqa: F401 - fixtures

# ruff: noqa: F811 - the fixtures imported above are parameters below

CONFIG = b'name: "m"\nbackend: "python"\n'
MODEL_V1 = {"config.pbtxt": CONFIG, "1/model.py": b"GEN = 1\n", "1/weights.bin": b"a" * 1000}


@pytest.fixture
def bucket(s3env: MotoServer) -> str:
    name = f"t-{uuid.uuid4().hex[:12]}"
    s3env.client().create_bucket(Bucket=name)
    return name


def put(client: Any, bucket: str, model: str, files: dict[str, bytes], pause_s: float = 0.0) -> None:
    for rel, data in files.items():
        client.put_object(Bucket=bucket, Key=f"models/{model}/{rel}", Body=data)
        time.sleep(pause_s)


def tree_files(store: ContentStore, digest: str) -> dict[str, bytes]:
    root = store.tree_path(digest)
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def source(bucket: str, settled: list[str] | None = None, **kw: Any) -> S3Source:
    on = settled.append if settled is not None else (lambda _m: None)
    return S3Source(f"s3://{bucket}/models", on, **{"settle_s": 0.6, "poll_interval_s": 0.1, **kw})


def test_object_by_object_upload_is_captured_only_whole(s3env: MotoServer, bucket: str, tmp_path: Path) -> None:
    """`aws s3 sync`: one object at a time, pauses longer than the poll interval, shorter than the settle
    window. Every model handed on, and every capture, holds all of the writer's objects."""
    store = ContentStore(tmp_path / "store", fsync=False)
    captured: list[dict[str, bytes]] = []
    refused: list[str] = []

    def on_settled(model: str) -> None:
        try:
            captured.append(tree_files(store, src.capture(model, store).digest))
        except SnapshotError as exc:
            refused.append(str(exc))

    src = S3Source(f"s3://{bucket}/models", on_settled, settle_s=0.6, poll_interval_s=0.1)
    src.start()
    try:
        client = s3env.client()
        for gen in (1, 2):
            files = {"config.pbtxt": CONFIG + f"# gen {gen}\n".encode(), "1/model.py": f"GEN = {gen}\n".encode(),
                     "1/weights.bin": bytes([gen]) * 5000}
            put(client, bucket, "m", files, pause_s=0.3)
            deadline = time.monotonic() + 15
            while not any(c.get("1/model.py") == files["1/model.py"] for c in captured):
                assert time.monotonic() < deadline, (captured, refused)
                time.sleep(0.05)
    finally:
        src.stop()
    for content in captured:  # never a mix of two generations, never a partial model
        gens = {content["config.pbtxt"][-2:-1], content["1/model.py"][-2:-1], bytes([content["1/weights.bin"][0] + 48])}
        assert len(gens) == 1 and set(content) == {"config.pbtxt", "1/model.py", "1/weights.bin"}, content
    assert len(captured) == 2
    assert src.lists > 0


@pytest.mark.parametrize("parts", [pytest.param(8, marks=pytest.mark.slow, id="64MiB"), pytest.param(2, id="16MiB")])
def test_multipart_upload_in_progress_is_never_taken(s3env: MotoServer, bucket: str, tmp_path: Path,
                                                     parts: int) -> None:
    """A weights file uploaded in 8 MiB parts (64 MiB behind -m slow), pauses between parts."""
    client = s3env.client()
    store = ContentStore(tmp_path / "store", fsync=False)
    put(client, bucket, "big", {"config.pbtxt": CONFIG, "1/model.py": b"GEN = 1\n"})
    settled: list[str] = []
    src = source(bucket, settled, settle_s=0.2)
    part = os.urandom(8 << 20)
    key = "models/big/1/weights.bin"
    upload = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    done = []
    for n in range(1, parts + 1):  # a pause after the first and the last part, longer than the settle window
        etag = client.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=n, Body=part)["ETag"]
        done.append({"ETag": etag, "PartNumber": n})
        if n in (1, parts):
            time.sleep(0.3)
            assert src.poll() == [] and settled == []
            with pytest.raises(SnapshotError, match="multipart upload of 1/weights.bin in progress"):
                src.capture("big", store, settled=False)
    client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": done})
    src.poll()
    time.sleep(0.3)
    assert src.poll() == ["big"]
    snap = src.capture("big", store)
    weights = next(e for e in snap.entries if e.path == "1/weights.bin")
    assert weights.size == parts * (8 << 20)
    assert weights.sha256 == hashlib.sha256(part * parts).hexdigest()
    assert src.downloads == 3
    # captured again: nothing changed in the listing, nothing is downloaded again
    again = src.capture("big", store, settled=False)
    assert again.digest == snap.digest and src.downloads == 3


class _Racing:
    """The real client, with a writer that deletes and re-uploads an object right after the first GET."""

    def __init__(self, client: Any, race: Any) -> None:
        self._client, self._race, self._done = client, race, False

    def get_object(self, **kw: Any) -> Any:
        answer = self._client.get_object(**kw)
        if not self._done:
            self._done = True
            self._race()
        return answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_objects_deleted_and_reuploaded_mid_capture_are_refused(s3env: MotoServer, bucket: str,
                                                                tmp_path: Path) -> None:
    client = s3env.client()
    store = ContentStore(tmp_path / "store", fsync=False)
    put(client, bucket, "m", MODEL_V1)

    def rewrite() -> None:  # a second sync run: delete, then put new content
        client.delete_object(Bucket=bucket, Key="models/m/1/model.py")
        client.put_object(Bucket=bucket, Key="models/m/1/model.py", Body=b"GEN = 2\n")

    racing = S3Source(f"s3://{bucket}/models", lambda _m: None, settle_s=0.1,
                      client=_Racing(s3env.client(), rewrite))
    with pytest.raises(SnapshotError, match="still changing"):
        racing.capture("m", store, settled=False)
    assert store.digests() == set()  # nothing recorded
    # deleted only (not yet re-uploaded): the listing after the download differs
    racing = S3Source(f"s3://{bucket}/models", lambda _m: None, settle_s=0.1,
                      client=_Racing(s3env.client(),
                                     lambda: client.delete_object(Bucket=bucket, Key="models/m/1/weights.bin")))
    with pytest.raises(SnapshotError, match="still changing"):
        racing.capture("m", store, settled=False)
    put(client, bucket, "m", {"1/weights.bin": b"b" * 10})
    ok = S3Source(f"s3://{bucket}/models", lambda _m: None).capture("m", store, settled=False)
    assert tree_files(store, ok.digest)["1/model.py"] == b"GEN = 2\n"


def test_commit_marker_publishes_at_once_and_later_objects_wait(s3env: MotoServer, bucket: str,
                                                                 tmp_path: Path) -> None:
    client = s3env.client()
    store = ContentStore(tmp_path / "store", fsync=False)
    settled: list[str] = []
    src = source(bucket, settled, settle_s=30.0, commit_marker="READY")
    put(client, bucket, "m", MODEL_V1)
    assert src.poll() == []
    with pytest.raises(SnapshotError, match="awaiting commit marker READY"):
        src.capture("m", store, settled=False)
    time.sleep(1.1)  # S3 last-modified has one-second resolution
    put(client, bucket, "m", {"READY": b""})
    assert src.poll() == ["m"]  # at once, long before the 30 s settle window
    snap = src.capture("m", store)
    assert "READY" not in {e.path for e in snap.entries}
    time.sleep(1.1)
    put(client, bucket, "m", {"1/model.py": b"GEN = 2\n"})  # the next upload, marker not yet renewed
    assert src.poll() == []
    with pytest.raises(SnapshotError, match=r"awaiting commit marker READY \(older than 1/model.py\)"):
        src.capture("m", store)


def test_hold_object_holds_the_model(s3env: MotoServer, bucket: str, tmp_path: Path) -> None:
    client = s3env.client()
    store = ContentStore(tmp_path / "store", fsync=False)
    settled: list[str] = []
    src = source(bucket, settled, settle_s=0.1)
    put(client, bucket, "m", {".tritonctl-hold": b"", **MODEL_V1})
    src.poll()
    time.sleep(0.3)
    assert src.poll() == []
    assert set(src.settling()) == {"m"}  # `status`: sync pending while held
    with pytest.raises(SnapshotError, match="on hold"):
        src.capture("m", store, settled=False)
    client.delete_object(Bucket=bucket, Key="models/m/.tritonctl-hold")
    src.poll()
    time.sleep(0.3)
    assert src.poll() == ["m"]
    assert src.settling() == {}  # handed on: the capture and the deploy say what comes next
    assert set(tree_files(store, src.capture("m", store).digest)) == set(MODEL_V1)


@pytest.mark.parametrize("case", ["wrong secret", "unknown key", "missing", "no bucket"])
def test_bad_credentials_are_one_line_config_errors(s3env: MotoServer, bucket: str, case: str,
                                                    monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    url = f"s3://{bucket}/models"
    if case == "wrong secret":
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    elif case == "unknown key":
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIANOTAKEY")
    elif case == "missing":
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.delenv(name)
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
        monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    else:
        url = "s3://no-such-bucket-here/models"
    with pytest.raises(ConfigError) as info:
        S3Source(url, lambda _m: None).check()
    text = str(info.value)
    assert "\n" not in text and "object storage" in text
    expected = {"wrong secret": "SignatureDoesNotMatch", "unknown key": "InvalidAccessKeyId",
                "missing": "no AWS credentials", "no bucket": "NoSuchBucket"}[case]
    assert expected in text


def test_endpoint_down_changes_nothing_and_polling_resumes(s3env: MotoServer, bucket: str, tmp_path: Path) -> None:
    client = s3env.client()
    store = ContentStore(tmp_path / "store", fsync=False)
    settled: list[str] = []
    src = source(bucket, settled, settle_s=0.1)
    put(client, bucket, "m", MODEL_V1)
    assert src.initial_scan() == ["m"]
    s3env.relay.down()
    try:
        assert src.poll() == [] and settled == []  # no listing: nothing is handed on, nothing removed
        with pytest.raises(ObjectStoreError, match="unreachable"):
            src.capture("m", store, settled=False)
        put(client, bucket, "m", {"1/model.py": b"GEN = 2\n"})  # written while we cannot see it
    finally:
        s3env.relay.up()
    src.poll()
    time.sleep(0.3)
    assert src.poll() == ["m"]
    assert tree_files(store, src.capture("m", store).digest)["1/model.py"] == b"GEN = 2\n"


def test_shared_store_on_s3_round_trip_verifies_every_object(s3env: MotoServer, bucket: str,
                                                             tmp_path: Path) -> None:
    client = s3env.client()
    put(client, bucket, "m", MODEL_V1)
    leader = ContentStore(tmp_path / "leader", fsync=False)
    snap = S3Source(f"s3://{bucket}/models", lambda _m: None).capture("m", leader, settled=False)
    shared = open_shared_store(f"s3://{bucket}/fleet")
    assert isinstance(shared, S3SharedStore) and not shared.has(snap.digest)
    shared.export(leader, "m", snap.digest)
    assert shared.has(snap.digest)
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="fleet/")["Contents"]]
    assert f"fleet/manifests/{snap.digest}.json" in keys and len(keys) == 4  # 3 objects + manifest
    host = ContentStore(tmp_path / "host", fsync=False)
    imported = shared.import_into(host, "m", snap.digest)
    assert imported.digest == snap.digest and tree_files(host, snap.digest) == tree_files(leader, snap.digest)
    # a corrupted object in the bucket never reaches a host
    sha = next(e.sha256 for e in snap.entries if e.path == "1/model.py")
    client.put_object(Bucket=bucket, Key=f"fleet/objects/{sha[:2]}/{sha[2:]}", Body=b"GEN = 666\n")
    other = ContentStore(tmp_path / "other", fsync=False)
    with pytest.raises(SnapshotError, match="corrupt"):
        shared.import_into(other, "m", snap.digest)
    assert not other.tree_path(snap.digest).exists()
    with pytest.raises(SnapshotError, match="not in the shared store"):
        shared.import_into(other, "m", "0" * 64)


def test_concurrent_captures_share_downloads(s3env: MotoServer, bucket: str, tmp_path: Path) -> None:
    """Two models with the same weights: both capture concurrently; one object in the store."""
    client = s3env.client()
    store = ContentStore(tmp_path / "store", fsync=False)
    for name in ("a", "b"):
        put(client, bucket, name, {**MODEL_V1, "config.pbtxt": f'name: "{name}"\n'.encode()})
    src = S3Source(f"s3://{bucket}/models", lambda _m: None)
    results: dict[str, str] = {}
    threads = [threading.Thread(target=lambda n=n: results.__setitem__(n, src.capture(n, store, settled=False).digest))
               for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results.values())) == 2
    weights = hashlib.sha256(b"a" * 1000).hexdigest()
    assert store.object_path(weights).stat().st_nlink >= 3  # the object and both trees link it


def test_empty_version_folders_survive_as_on_a_disk(s3env: MotoServer, bucket: str, tmp_path: Path) -> None:
    """An ensemble's empty version folder: kept by a `1/.gitkeep` (debris, left out) or a `2/` folder object."""
    client = s3env.client()
    store = ContentStore(tmp_path / "store", fsync=False)
    put(client, bucket, "ens", {"config.pbtxt": CONFIG, "1/.gitkeep": b"", "2/": b""})
    snap = S3Source(f"s3://{bucket}/models", lambda _m: None).capture("ens", store, settled=False)
    assert [(e.path, e.kind) for e in snap.entries] == [("1", "dir"), ("2", "dir"), ("config.pbtxt", "file")]
    assert (store.tree_path(snap.digest) / "1").is_dir()


def test_a_model_over_max_model_bytes_is_refused_before_any_download(s3env: MotoServer, bucket: str,
                                                                     tmp_path: Path) -> None:
    """The listing's sizes are added up first: nothing of an oversized model is fetched."""
    from controlplane.errors import SnapshotTooLargeError

    client = s3env.client()
    put(client, bucket, "m", MODEL_V1)
    total = sum(len(data) for data in MODEL_V1.values())
    store = ContentStore(tmp_path / "store", fsync=False, max_model_bytes=total - 1)
    with pytest.raises(SnapshotTooLargeError, match=f"its files are {total} bytes, over max_model_bytes"):
        S3Source(f"s3://{bucket}/models", lambda _m: None).capture("m", store, settled=False)
    assert not [p for p in (tmp_path / "store" / "objects").rglob("*") if p.is_file()]  # nothing downloaded
    store.max_model_bytes = total  # at the cap: taken
    assert S3Source(f"s3://{bucket}/models", lambda _m: None).capture("m", store, settled=False).total_bytes == total


def test_repository_setting_takes_an_s3_url(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from cli.main import cli
    from controlplane.settings.config import load_settings

    s = load_settings({"repository": "s3://bkt/team/models/"}, env={})
    assert (s.repository, s.repository_url, s.poll_interval_s) == (None, "s3://bkt/team/models/", 2.0)
    assert load_settings({}, env={"TRITONCTL_REPOSITORY_URL": "s3://bkt"}).repository_url == "s3://bkt/"
    assert load_settings({"repository": str(tmp_path)}, env={}).repository == tmp_path
    with pytest.raises(ConfigError, match="either a directory or an s3:// URL"):
        load_settings({"repository": str(tmp_path), "repository_url": "s3://bkt/p"}, env={})
    with pytest.raises(ConfigError, match=r"repository: invalid value 's3://' \(.*expected s3://BUCKET/PREFIX"):
        load_settings({"repository": "s3://"}, env={})
    # the flag keeps both slashes of the URL, and a bad one is one line, exit code 2
    result = CliRunner().invoke(cli, ["daemon", "--repository", "s3://"], env={"TRITONCTL_CONFIG": None})
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output


def test_missing_boto3_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "boto3", None)  # what `import boto3` meets when it is not installed
    with pytest.raises(ConfigError) as info:
        S3Source("s3://bkt/models", lambda _m: None)
    assert str(info.value) == "object storage needs boto3: pip install 'tritonctl[s3]'"


class _Lying:
    """The real client (a real server cannot lie about sizes): its listing says `sizes` for some keys, and
    its GETs of `flood` keys answer an endless body; `read` counts the bytes taken from those."""

    def __init__(self, client: Any, *, sizes: dict[str, Any] | None = None, flood: str | None = None) -> None:
        self._client, self._sizes, self._flood, self.read = client, sizes or {}, flood, 0

    def get_paginator(self, name: str) -> Any:
        real, sizes = self._client.get_paginator(name), self._sizes

        class Pages:
            def paginate(self, **kw: Any) -> Any:
                for page in real.paginate(**kw):
                    for row in page.get("Contents", ()):
                        row["Size"] = sizes.get(row["Key"].rsplit("/", 1)[-1], row["Size"])
                    yield page

        return Pages()

    def get_object(self, **kw: Any) -> Any:
        answer = self._client.get_object(**kw)
        if self._flood and kw["Key"].endswith(self._flood):
            owner = self

            class Endless:
                def read(self, n: int = -1) -> bytes:
                    n = 1 << 20 if n is None or n < 0 else n
                    owner.read += n
                    return b"#" * n

                def close(self) -> None:
                    pass

            answer["Body"] = Endless()
        return answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_an_object_longer_than_listed_is_not_read_past_its_size(s3env: MotoServer, bucket: str,
                                                                 tmp_path: Path) -> None:
    put(s3env.client(), bucket, "m", MODEL_V1)
    lying = _Lying(s3env.client(), flood="model.py")
    source = S3Source(f"s3://{bucket}/models", lambda _m: None, client=lying)
    with pytest.raises(SnapshotError, match=r"more than the 8 bytes the listing said; stopped reading"):
        source.capture("m", ContentStore(tmp_path / "store", fsync=False), settled=False)
    assert lying.read == 8 + 1


@pytest.mark.parametrize("size", [-1, True, 2.5])
def test_a_listed_size_that_is_no_size_is_refused(s3env: MotoServer, bucket: str, tmp_path: Path,
                                                  size: Any) -> None:
    put(s3env.client(), bucket, "m", MODEL_V1)
    source = S3Source(f"s3://{bucket}/models", lambda _m: None,
                      client=_Lying(s3env.client(), sizes={"weights.bin": size}))
    with pytest.raises(SnapshotError, match=r"'1/weights.bin' is listed with size .*not a number of bytes"):
        source.capture("m", ContentStore(tmp_path / "store", fsync=False), settled=False)
