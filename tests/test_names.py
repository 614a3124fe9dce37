"""Names, digests and relative paths from outside: what passes, what is refused, and the property that
`resolve_inside` never returns a path outside its root."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.errors import UsageError
from controlplane.names import printable_name, resolve_inside, validate_digest, validate_model_name

NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", re.ASCII)


@pytest.mark.parametrize("name", ["linear", "a", "_x", "9", "model.v2", "sentiment_pipeline", "A-b.c_d", "x" * 128])
def test_good_model_names(name: str) -> None:
    assert validate_model_name(name) == name


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("", "empty"),
        (".", "starts with '.'"),
        ("..", "'..'"),
        ("a..b", "'..'"),
        (".hidden", "starts with '.'"),
        ("-linear", "starts with '-'"),
        ("a/b", "path separator"),
        ("a\\b", "path separator"),
        ("a\x00b", "NUL"),
        ("my model", "a space"),
        ("mod\u00e8le", "the character"),
        ("\u6a21\u578b", "the character"),
        ("m\udcff", "the character"),  # an undecodable file name byte
        ("tab\there", "the character"),
        ("new\nline", "the character"),
        ("x" * 129, "longer than 128"),
        ("a:b", "the character"),
    ],
)
def test_bad_model_names(name: str, reason: str) -> None:
    with pytest.raises(UsageError) as err:
        validate_model_name(name)
    assert reason in str(err.value)
    assert "\n" not in str(err.value)


@given(st.text(max_size=140))
def test_model_names_accepted_are_safe(name: str) -> None:
    try:
        assert validate_model_name(name) == name
    except UsageError as exc:
        assert "\n" not in str(exc)
        return
    assert NAME_RE.fullmatch(name) and ".." not in name
    assert os.path.basename(name) == name and name not in (".", "..")


@given(st.from_regex(NAME_RE, fullmatch=True).filter(lambda n: ".." not in n))
def test_every_name_of_the_documented_form_is_accepted(name: str) -> None:
    assert validate_model_name(name) == name


@pytest.mark.parametrize(("name", "shown"), [("linear", "linear"), ("my model", "my model"), ("线性", "线性"),
                                             (os.fsdecode(b"m\xff"), "m\\xff"), ("a\ud800b", "a\\ud800b")])
def test_printable_name_escapes_what_utf8_cannot_hold(name: str, shown: str) -> None:
    """A directory name that is not UTF-8 (os.fsdecode keeps its bytes as lone surrogates) is shown with the
    byte escaped, which UTF-8 (the registry, JSON, a terminal) can hold; a valid name is unchanged."""
    assert printable_name(name) == shown
    shown.encode("utf-8")


@given(st.text(st.characters(codec=None, exclude_categories=())))  # lone surrogates included
def test_printable_name_always_encodes_as_utf8(name: str) -> None:
    printable_name(name).encode("utf-8")


FULL = "0123456789abcdef" * 4


@pytest.mark.parametrize(
    ("digest", "expected"),
    [(FULL, FULL), (FULL.upper(), FULL), ("sha256:" + FULL, FULL), ("abcdef", "abcdef"), (FULL[:20], FULL[:20])],
)
def test_good_digests(digest: str, expected: str) -> None:
    assert validate_digest(digest) == expected


@pytest.mark.parametrize(
    ("digest", "allow_prefix", "reason"),
    [
        ("", True, "empty"),
        ("abcde", True, "shorter than 6"),
        ("xyz123", True, "not hexadecimal"),
        ("abc def", True, "not hexadecimal"),
        ("../../etc", True, "not hexadecimal"),
        (FULL + "0", True, "longer"),
        (FULL[:10], False, "full sha256"),
    ],
)
def test_bad_digests(digest: str, allow_prefix: bool, reason: str) -> None:
    with pytest.raises(UsageError) as err:
        validate_digest(digest, allow_prefix=allow_prefix)
    assert reason in str(err.value)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A root with a subdirectory, a file, and symlinks inside, outside, dangling and looping."""
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "file").write_text("x")
    (tmp_path / "outside").mkdir()
    (root / "in").symlink_to("sub")
    (root / "out").symlink_to(tmp_path / "outside")
    (root / "up").symlink_to("..")
    (root / "sub" / "deep_out").symlink_to("../../outside")
    (root / "dangling").symlink_to("nowhere")
    (root / "loop").symlink_to("loop")
    return root


def test_resolve_inside_basics(root: Path) -> None:
    real = Path(os.path.realpath(root))
    assert resolve_inside(root, "sub/file") == real / "sub" / "file"
    assert resolve_inside(root, "in/file") == real / "sub" / "file"
    assert resolve_inside(root, "not/yet/there") == real / "not" / "yet" / "there"
    assert resolve_inside(root, ".") == real
    for bad, reason in [("/etc/passwd", "absolute"), ("../x", "'..'"), ("sub/../../x", "'..'"), ("a\x00", "NUL"),
                        ("", "empty"), ("out", "symlink"), ("out/x", "symlink"), ("up", "symlink"),
                        ("sub/deep_out/f", "symlink")]:
        with pytest.raises(UsageError) as err:
            resolve_inside(root, bad)
        assert reason in str(err.value), bad


PARTS = st.sampled_from(["sub", "file", "in", "out", "up", "dangling", "loop", "deep_out", ".", "..", "", "x",
                         "/", "\x00", "~", "\u6a21", " "])


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(PARTS, max_size=6).map("/".join) | st.text(max_size=40))
def test_resolve_inside_never_leaves_root(root: Path, relative: str) -> None:
    real_root = Path(os.path.realpath(root))
    try:
        resolved = resolve_inside(root, relative)
    except UsageError as exc:
        assert "\n" not in str(exc)
        return
    assert resolved == real_root or real_root in resolved.parents
    assert Path(os.path.realpath(resolved)) == resolved  # nothing left to follow
