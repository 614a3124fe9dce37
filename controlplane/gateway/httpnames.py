"""KServe v2 over HTTP/REST as the gateway reads it: which path names which model, and answers renamed.

Paths: `/v2/models/{name}[/versions/{v}][/(infer|ready|config|stats|generate|generate_stream|trace/setting)]`
name a model (the name is rewritten, the body passes untouched); `/v2/models/stats` asks for every
model; `/v2/repository/index` is answered from the routes; `/v2/repository/models/{name}/(load|unload)`
is refused; everything else (`/v2`, `/v2/health/*`, shared memory, trace, logging) passes through.

Answers: only the JSON part is rewritten — an inference answer's `model_name` (the first field Triton
writes: replaced once, byte for byte, never a tensor byte), metadata's `name`, a config's `name` and
its ensemble steps, statistics' `name`s, and in an error any private name.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import unquote

from controlplane.gateway.wire import public_name, public_text

PASS, INFER, GENERATE, STREAM, META, READY, CONFIG, STATS, STATS_ALL, INDEX, REFUSE, TRACE = range(12)
_ACTIONS = {"": META, "/infer": INFER, "/ready": READY, "/config": CONFIG, "/stats": STATS,
            "/generate": GENERATE, "/generate_stream": STREAM, "/trace/setting": TRACE}
COUNTED = frozenset({INFER, GENERATE, STREAM})  # what figures count as requests
_MODEL_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?"
                         r"(|/infer|/ready|/config|/stats|/generate|/generate_stream|/trace/setting)")
_REPOSITORY_ACTION = re.compile(r"/v2/repository/models/[^/]+/(load|unload)")


class PathInfo:
    """What a request path means: its kind, the model it names, and how to put a private name in."""

    __slots__ = ("kind", "name", "version", "action")

    def __init__(self, kind: int, name: str = "", version: str | None = None, action: str = "") -> None:
        self.kind = kind
        self.name = name
        self.version = version
        self.action = action

    def private_path(self, private: str) -> str:
        version = f"/versions/{self.version}" if self.version is not None else ""
        return f"/v2/models/{private}{version}{self.action}"


def classify(path: str) -> PathInfo:
    if path == "/v2/models/stats":
        return PathInfo(STATS_ALL)
    match = _MODEL_PATH.fullmatch(path)
    if match is not None:
        name, version, action = match.group(1), match.group(2), match.group(3)
        return PathInfo(_ACTIONS[action], unquote(name), unquote(version) if version is not None else None, action)
    if path == "/v2/repository/index":
        return PathInfo(INDEX)
    if _REPOSITORY_ACTION.fullmatch(path):
        return PathInfo(REFUSE)
    return PathInfo(PASS)


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}, separators=(",", ":")).encode()


def renamed_first(body: bytes, key: bytes, private: bytes, public: bytes) -> bytes:
    """`"key":"private"` → `"key":"public"`, the first time only (Triton writes the name first)."""
    return body.replace(b'"' + key + b'":"' + private + b'"', b'"' + key + b'":"' + public + b'"', 1)


def public_json_text(body: bytes) -> bytes:
    """An error answer with its private names made public."""
    return public_text(body)


def _public(name: Any) -> Any:
    return public_name(name.encode()).decode() if isinstance(name, str) else name


def rename_config_json(body: bytes) -> bytes:
    config = json.loads(body)
    if isinstance(config, dict):
        config["name"] = _public(config.get("name"))
        steps = (config.get("ensemble_scheduling") or {}).get("step") or []
        for step in steps:
            if isinstance(step, dict) and "model_name" in step:
                step["model_name"] = _public(step["model_name"])
    return json.dumps(config, separators=(",", ":")).encode()


def rename_stats_json(body: bytes, shown: dict[str, str]) -> bytes:
    stats = json.loads(body)
    entries = stats.get("model_stats", []) if isinstance(stats, dict) else []
    kept = []
    for entry in entries:
        if isinstance(entry, dict) and entry.get("name") in shown:
            entry["name"] = shown[entry["name"]]
            kept.append(entry)
    if isinstance(stats, dict):
        stats["model_stats"] = kept
    return json.dumps(stats, separators=(",", ":")).encode()


def index_json(entries: list[tuple[str, str, str]]) -> bytes:
    out = []
    for name, state, reason in entries:
        item = {"name": name, "state": state}
        if reason:
            item["reason"] = reason
        out.append(item)
    return json.dumps(out, separators=(",", ":")).encode()


class SseRenamer:
    """generate_stream's server-sent events renamed event by event: whole lines only, the cut one kept."""

    def __init__(self, private: bytes, public: bytes) -> None:
        self.old = b'"model_name":"' + private + b'"'
        self.new = b'"model_name":"' + public + b'"'
        self.tail = b""

    def feed(self, data: bytes) -> bytes:
        data = self.tail + data
        cut = data.rfind(b"\n") + 1
        self.tail = data[cut:]
        return public_text(data[:cut].replace(self.old, self.new))

    def end(self) -> bytes:
        tail, self.tail = self.tail, b""
        return public_text(tail.replace(self.old, self.new))
