"""MLflow's REST API, the few calls an `mlflow+http://HOST:PORT` source makes (docs/mlflow.md).

Why plain HTTP and not `MlflowClient`: importing the MLflow client costs seconds of every daemon start
(measured: 13 s on a loaded 2-core machine); the registry calls and the served-artifact calls
(`--serve-artifacts`, MLflow's default) are a handful of JSON requests. The `mlflow` extra
(`mlflow-skinny`, checked when the settings load, never imported by the daemon) brings the YAML reader
for `MLmodel` files and the MLflow client the promotion workflow uses (docs/mlflow.md). Artifacts the
tracking server does not serve itself (an `s3://` root it only names) are refused with that reason.

Credentials come from MLflow's own environment variables, never from a tritonctl flag:
`MLFLOW_TRACKING_TOKEN` (a bearer token) or `MLFLOW_TRACKING_USERNAME` / `MLFLOW_TRACKING_PASSWORD`
(basic auth); `MLFLOW_TRACKING_INSECURE_TLS=true` skips certificate checks, `MLFLOW_TRACKING_SERVER_CERT_PATH`
names a CA bundle. Every failure is one `MLflowError` line.

What a tracking server can make the daemon do is bounded (controlplane/remote/httpbounds.py, issue 58):
a redirect is followed only within the server's origin (the credentials never reach another host, nor
plain HTTP); a JSON answer is at most `MAX_ANSWER_BYTES` and must be whole within `ANSWER_S`; an artifact
is read to its listed size plus one byte at most, within `download_budget_s` of its size. Plain HTTP to a
non-loopback server with credentials is refused at start unless `allow_insecure_http` (`insecure_refusal`).
"""

from __future__ import annotations

import base64
import http.client
import ipaddress
import json
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from controlplane.errors import ConfigError, MLflowError
from controlplane.remote import httpbounds

SCHEMES = ("mlflow+http://", "mlflow+https://")
TIMEOUT_S = 10.0  # each read or connect
API = "/api/2.0"
MAX_ANSWER_BYTES = 16 << 20  # a JSON answer (1,000 registered models with their aliases: well under 1 MiB)
ANSWER_S = 30.0  # a whole JSON answer, from connect to its last byte
DOWNLOAD_S, DOWNLOAD_MIN_RATE = 60.0, 256 << 10  # an artifact: a minute, plus its size at 256 KiB/s
CREDENTIAL_VARIABLES = ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


def download_budget_s(size: int) -> float:
    """The seconds a download of `size` bytes may take, connect to last byte."""
    return DOWNLOAD_S + max(0, size) / DOWNLOAD_MIN_RATE


def ended_early(answer: Any, deadline: float) -> bool:
    """Whether an answer read to its end was cut short: its deadline passed, or bytes it announced are missing."""
    return time.monotonic() >= deadline or bool(getattr(answer, "length", None))


def insecure_refusal(url: str, env: Mapping[str, str], allow_insecure_http: bool) -> ConfigError | None:
    """The error for credentials sent in clear: `mlflow+http://` to a host that is not loopback while an
    MLflow credential variable is set, unless `allow_insecure_http`; None when allowed."""
    parts = urllib.parse.urlsplit(url[len("mlflow+"):] if is_mlflow_url(url) else url)
    credentials = [name for name in CREDENTIAL_VARIABLES if env.get(name)]
    if parts.scheme != "http" or not credentials or allow_insecure_http or _loopback(parts.hostname or ""):
        return None
    return ConfigError(f"repository: {url} is plain HTTP to a host that is not loopback, and {credentials[0]} would "
                       "be sent in clear: use mlflow+https://, or allow it with --allow-insecure-http")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def require_extra(find: Callable[[str], object] | None = None) -> None:
    """ConfigError (exit 2) naming the extra when the MLflow client (`tritonctl[mlflow]`) is not installed;
    looked up, not imported (importing it costs seconds)."""
    import importlib.util

    if (find or importlib.util.find_spec)("mlflow") is None:
        raise ConfigError("repository mlflow+http://...: the MLflow client is not installed: "
                          "pip install 'tritonctl[mlflow]'")


def is_mlflow_url(value: object) -> bool:
    return isinstance(value, str) and value.startswith(SCHEMES)


def tracking_url(url: str) -> str:
    """`mlflow+http://HOST:PORT[/PATH]` -> `http://HOST:PORT[/PATH]`; ConfigError when it is not one."""
    if not is_mlflow_url(url):
        raise ConfigError(f"{url}: expected mlflow+http://HOST:PORT or mlflow+https://HOST:PORT")
    plain = url[len("mlflow+"):].rstrip("/")
    parts = urllib.parse.urlsplit(plain)
    if not parts.hostname or parts.query or parts.fragment or parts.username or parts.password:
        raise ConfigError(f"{url}: expected mlflow+http://HOST:PORT (credentials go in MLFLOW_TRACKING_TOKEN or "
                          "MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD)")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ConfigError(f"{url}: invalid port") from None
    return plain


class MLflowRest:
    """JSON calls to one tracking server (`base`: http://HOST:PORT)."""

    def __init__(self, base: str, env: Mapping[str, str] | None = None, timeout_s: float = TIMEOUT_S) -> None:
        self.base = base.rstrip("/")
        self.timeout_s = timeout_s
        env = os.environ if env is None else env
        self._headers = {"User-Agent": "tritonctl"}
        if env.get("MLFLOW_TRACKING_TOKEN"):
            self._headers["Authorization"] = f"Bearer {env['MLFLOW_TRACKING_TOKEN']}"
        elif env.get("MLFLOW_TRACKING_USERNAME"):
            pair = f"{env['MLFLOW_TRACKING_USERNAME']}:{env.get('MLFLOW_TRACKING_PASSWORD', '')}"
            self._headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        self._context: ssl.SSLContext | None = None
        if self.base.startswith("https://"):
            self._context = ssl.create_default_context(cafile=env.get("MLFLOW_TRACKING_SERVER_CERT_PATH") or None)
            if env.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true":
                self._context.check_hostname = False
                self._context.verify_mode = ssl.CERT_NONE
        self._opener = httpbounds.opener(self._context)
        self.requests = 0  # counters for tests and docs
        self.downloads = 0

    # -- plumbing -------------------------------------------------------------------------------------
    def _open(self, method: str, path: str, what: str, *, params: Mapping[str, str] | None = None,
              body: bytes | None = None, content_type: str = "application/json", deadline: float | None = None) -> Any:
        """The answer (headers read) of one request, whose connection ends at `deadline` (default ANSWER_S
        from now) whatever is left unread then."""
        url = self.base + path + ("?" + urllib.parse.urlencode(params) if params else "")
        headers = dict(self._headers)
        if body is not None:
            headers["Content-Type"] = content_type
        request = urllib.request.Request(url, data=body, method=method, headers=headers)
        self.requests += 1
        deadline = time.monotonic() + ANSWER_S if deadline is None else deadline
        try:
            with httpbounds.until(deadline):
                return self._opener.open(request, timeout=self.timeout_s)
        except urllib.error.HTTPError as exc:
            raise self._refused(exc, what) from None
        except httpbounds.CrossOrigin as exc:
            raise MLflowError(f"{what}: MLflow at {self.base} redirected to {exc}, another origin: not followed (the "
                              "credentials stay with the tracking server; give the address it redirects to)") from None
        except (OSError, ValueError, http.client.HTTPException) as exc:  # refused, reset, timed out, DNS
            raise self.cut_off(what, exc, deadline) from None

    def cut_off(self, what: str, exc: BaseException, deadline: float) -> MLflowError:
        """The error for an exchange that failed midway: too slow (its deadline passed), or unreachable."""
        if time.monotonic() >= deadline:
            return MLflowError(f"{what}: MLflow at {self.base} answered too slowly (not whole by its deadline); "
                               "abandoned")
        reason = getattr(exc, "reason", exc)
        return MLflowError(f"{what}: MLflow at {self.base} unreachable ({reason})")

    def _json(self, answer: Any, what: str, deadline: float) -> Any:
        """The JSON document of an answer, at most MAX_ANSWER_BYTES read."""
        with answer:
            try:
                text = httpbounds.read_at_most(answer, MAX_ANSWER_BYTES)
            except httpbounds.TooLarge:
                raise MLflowError(f"{what}: MLflow at {self.base} answered more than {MAX_ANSWER_BYTES} bytes; "
                                  "refusing the answer") from None
            except (OSError, http.client.HTTPException) as exc:
                raise self.cut_off(what, exc, deadline) from None
            if ended_early(answer, deadline):  # the watchdog ended it: a read then sees the end, not an error
                raise self.cut_off(what, EOFError("the answer ended early"), deadline)
        try:
            return json.loads(text or b"{}")
        except ValueError:
            raise MLflowError(f"{what}: MLflow at {self.base} answered something that is not JSON") from None

    def _refused(self, exc: urllib.error.HTTPError, what: str) -> MLflowError:
        try:
            answer = json.loads(exc.read(4096) or b"{}")
            message = str(answer.get("message") or answer.get("error_code") or "")
        except (OSError, ValueError, AttributeError):
            message = ""
        message = message.splitlines()[0][:200] if message else exc.reason
        error = MLflowError(f"{what}: MLflow at {self.base} refused: HTTP {exc.code} {message}")
        error.auth = exc.code in (401, 403)
        error.answered = True
        error.missing = exc.code == 404 or "RESOURCE_DOES_NOT_EXIST" in message or "not found" in message
        return error

    def call(self, method: str, endpoint: str, what: str, **fields: Any) -> dict[str, Any]:
        """One JSON call of the REST API (`endpoint` below /api/2.0/mlflow/)."""
        path = f"{API}/mlflow/{endpoint}"
        deadline = time.monotonic() + ANSWER_S
        if method == "GET":
            answer = self._open("GET", path, what, params={k: str(v) for k, v in fields.items() if v is not None},
                                deadline=deadline)
        else:
            answer = self._open(method, path, what, body=json.dumps(fields).encode(), deadline=deadline)
        data = self._json(answer, what, deadline)
        return data if isinstance(data, dict) else {}

    # -- the model registry -------------------------------------------------------------------------------
    def registered_models(self) -> Iterator[dict[str, Any]]:
        """Every registered model (name, aliases), one request per 1000."""
        token: str | None = None
        while True:
            page = self.call("GET", "registered-models/search", "listing registered models",
                             max_results=1000, page_token=token)
            yield from page.get("registered_models", ())
            token = page.get("next_page_token")
            if not token:
                return

    def version_by_alias(self, name: str, alias: str) -> dict[str, Any] | None:
        """The model version `alias` names (version, run_id, source, aliases, tags); None: no such alias or model."""
        try:
            answer = self.call("GET", "registered-models/alias", f"{name}@{alias}", name=name, alias=alias)
        except MLflowError as exc:
            if exc.missing:
                return None
            raise
        version = answer.get("model_version")
        return version if isinstance(version, dict) else None

    def tagged_versions(self, key: str) -> Iterator[dict[str, Any]]:
        """Every model version (name, version, tags) carrying the tag `key`, one request per 1000."""
        token: str | None = None
        while True:
            page = self.call("GET", "model-versions/search", f"listing versions tagged {key}",
                             filter=f"tags.`{key}` LIKE '%'", max_results=1000, page_token=token)
            yield from page.get("model_versions", ())
            token = page.get("next_page_token")
            if not token:
                return

    def set_version_tag(self, name: str, version: str, key: str, value: str) -> None:
        self.call("POST", "model-versions/set-tag", f"tagging {name} version {version}",
                  name=name, version=version, key=key, value=value)

    def delete_version_tag(self, name: str, version: str, key: str) -> None:
        self.call("DELETE", "model-versions/delete-tag", f"tagging {name} version {version}",
                  name=name, version=version, key=key)

    def artifact_uri(self, version: dict[str, Any]) -> str:
        """Where a model version's artifacts are: its source resolved (runs:/, models:/m-...) to the
        artifact URI of the run or logged model."""
        what = f"{version.get('name')} version {version.get('version')}"
        uri = str(self.call("GET", "model-versions/get-download-uri", what, name=version.get("name"),
                            version=version.get("version")).get("artifact_uri") or version.get("source") or "")
        if uri.startswith("runs:/"):
            run_id, _, sub = uri[len("runs:/"):].partition("/")
            info = self.call("GET", "runs/get", what, run_id=run_id).get("run", {}).get("info", {})
            uri = _join(str(info.get("artifact_uri", "")), sub)
        elif uri.startswith("models:/m-"):
            model_id, _, sub = uri[len("models:/"):].partition("/")
            info = self.call("GET", f"logged-models/{urllib.parse.quote(model_id)}", what).get("model", {})
            uri = _join(str(info.get("info", {}).get("artifact_uri", "")), sub)
        if not uri:
            raise MLflowError(f"{what}: MLflow at {self.base} names no artifact location for it")
        return uri

    # -- served artifacts (mlflow-artifacts:/ URIs) ----------------------------------------------------
    def list_artifacts(self, path: str) -> list[dict[str, Any]]:
        """The entries of one artifact folder (path, is_dir, file_size), names relative to it."""
        what, deadline = f"listing artifacts {path}", time.monotonic() + ANSWER_S
        answer = self._open("GET", f"{API}/mlflow-artifacts/artifacts", what, params={"path": path}, deadline=deadline)
        data = self._json(answer, what, deadline)
        files = data.get("files", []) if isinstance(data, dict) else []
        return [f for f in files if isinstance(f, dict)]

    def open_artifact(self, path: str, deadline: float) -> Any:
        """A file-like answer with one artifact's bytes, its connection ended at `deadline` (the caller
        reads it with `read1`, at most the listed size plus one byte, and closes it)."""
        self.downloads += 1
        return self._open("GET", f"{API}/mlflow-artifacts/artifacts/{urllib.parse.quote(path)}",
                          f"downloading artifact {path}", deadline=deadline)

    def put_artifact(self, path: str, data: bytes) -> None:
        """Upload one artifact (tests and the docs' examples log models this way)."""
        with self._open("PUT", f"{API}/mlflow-artifacts/artifacts/{urllib.parse.quote(path)}",
                        f"uploading artifact {path}", body=data, content_type="application/octet-stream"):
            pass


def _join(base: str, sub: str) -> str:
    return base.rstrip("/") + ("/" + sub.strip("/") if sub.strip("/") else "")
