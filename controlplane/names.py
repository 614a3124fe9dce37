"""Checks for names, digests and relative paths that arrive from outside (CLI, control API, files).

A model name becomes a directory under `<state>/serving/`, a path in the store and a key in the
registry; a digest picks a snapshot tree; a relative path names a file inside one. Each is checked
here once, before it touches the file system, so that no request can reach outside the state
directory or create a name Triton, the shell or the database would treat specially. Every refusal is
a `UsageError` with a one-line reason.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

from controlplane.errors import UsageError

MAX_NAME_LENGTH = 128
MIN_DIGEST_PREFIX = 6
DIGEST_LENGTH = 64

_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", re.ASCII)
_NAME_CHAR_RE = re.compile(r"[A-Za-z0-9_.-]", re.ASCII)
_HEX_RE = re.compile(r"[0-9a-f]+", re.ASCII)
# Private names, `<model>__<8 hex>`: a change set's staged steps (controlplane/intake/changeset.py) and, with a
# gateway, the name each digest is loaded under (controlplane/deploy/aliases.py). Reserved, so that a user's
# model can never be taken for (or collide with) one.
PRIVATE_NAME_RE = re.compile(r".+__[0-9a-f]{8}", re.ASCII)


def is_private_name(name: str) -> bool:
    """Whether `name` is a private name (a staged step, or a digest's name behind the gateway; never a model of
    its own). The substring test
    first: the reconcile asks this of every model in Triton's index each round (issue 39, item 3)."""
    return "__" in name and bool(PRIVATE_NAME_RE.fullmatch(name))


def public_of(name: str) -> str:
    """The public model a private name belongs to (a change set's step, or with a gateway the name one digest
    is loaded under: controlplane/deploy/aliases.py); a public name: itself."""
    return name.rsplit("__", 1)[0] if is_private_name(name) else name


def printable_name(name: str) -> str:
    """A source entry's name as text any database, JSON document and terminal takes (`status` rows and audit
    events of names no model can have): a byte of a file name that is not UTF-8, which os.fsdecode keeps as a
    lone surrogate (U+DC80..U+DCFF), shown as `\\xNN`; any other lone surrogate as `\\uNNNN`. A valid name is
    returned as it is."""
    try:
        raw = name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no file name decodes to
        return name.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def _shown(value: str, limit: int = 60) -> str:
    """The value as a short, printable, one-line quote for an error message."""
    text = ascii(value)
    return text if len(text) <= limit else text[: limit - 4] + "...'"


def validate_model_name(name: str) -> str:
    """Return `name` if it is a safe model name: ASCII letters, digits, `_`, `.`, `-`, at most 128
    characters, not starting with `.` or `-`, and without `..`."""
    if not isinstance(name, str) or not name:
        raise UsageError("model name is empty")
    if "\x00" in name:
        raise UsageError(f"model name {_shown(name)} contains a NUL character")
    if "/" in name or "\\" in name:
        raise UsageError(f"model name {_shown(name)} contains a path separator")
    if ".." in name:
        raise UsageError(f"model name {_shown(name)} contains '..'")
    if len(name) > MAX_NAME_LENGTH:
        raise UsageError(f"model name {_shown(name)} is longer than {MAX_NAME_LENGTH} characters")
    if name[0] in ".-":
        raise UsageError(f"model name {_shown(name)} starts with {name[0]!r}")
    bad = next((ch for ch in name if not _NAME_CHAR_RE.fullmatch(ch)), None)
    if bad is not None:
        what = "a space" if bad == " " else f"the character {ascii(bad)}"
        raise UsageError(f"model name {_shown(name)} contains {what}: use only A-Z a-z 0-9 _ . -")
    if is_private_name(name):
        raise UsageError(f"model name {_shown(name)} ends in '__' and 8 hex digits, which tritonctl reserves "
                         "for change sets' private step names")
    if not _NAME_RE.fullmatch(name):  # pragma: no cover - the checks above cover every way to fail
        raise UsageError(f"model name {_shown(name)} is not valid")
    return name


def validate_digest(digest: str, allow_prefix: bool = True) -> str:
    """Return the digest in lower case: a hex sha256 (64 digits), or with `allow_prefix` a prefix
    of at least 6 digits (whether the prefix is unique is the registry's question). A leading
    `sha256:` is accepted and dropped."""
    if not isinstance(digest, str) or not digest:
        raise UsageError("digest is empty")
    value = digest.lower()
    if value.startswith("sha256:"):
        value = value[len("sha256:"):]
    if not _HEX_RE.fullmatch(value):
        raise UsageError(f"digest {_shown(digest)} is not hexadecimal")
    if len(value) == DIGEST_LENGTH:
        return value
    if len(value) > DIGEST_LENGTH:
        raise UsageError(f"digest {_shown(digest)} is longer than a sha256 ({DIGEST_LENGTH} hex digits)")
    if not allow_prefix:
        raise UsageError(f"digest {_shown(digest)} must be a full sha256 ({DIGEST_LENGTH} hex digits)")
    if len(value) < MIN_DIGEST_PREFIX:
        raise UsageError(f"digest prefix {_shown(digest)} is shorter than {MIN_DIGEST_PREFIX} hex digits")
    return value


def _is_within(root: str, path: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def resolve_inside(root: Path, relative: str) -> Path:
    """The real path of `relative` under `root`, refusing absolute paths, `..` and any symlink
    (existing or not yet followed) that resolves outside the real `root`."""
    if not isinstance(relative, str) or not relative:
        raise UsageError("path is empty")
    if "\x00" in relative:
        raise UsageError(f"path {_shown(relative)} contains a NUL character")
    pure = PurePosixPath(relative)
    if pure.is_absolute():
        raise UsageError(f"path {_shown(relative)} is absolute: give it relative to {root}")
    if ".." in pure.parts:
        raise UsageError(f"path {_shown(relative)} contains '..'")
    try:
        real_root = os.path.realpath(root)
        real = os.path.realpath(os.path.join(real_root, *pure.parts))
    except (OSError, ValueError) as exc:
        raise UsageError(f"path {_shown(relative)} cannot be resolved: {exc}") from None
    if not _is_within(real_root, real):
        raise UsageError(f"path {_shown(relative)} leaves {root} through a symlink")
    return Path(real)
