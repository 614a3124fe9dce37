"""`validate`'s documents: each finding (`Problem`), one model's verdict (`ValidationResult`) and a run's
(`ValidationReport`), and `one_line`, which makes a file's name or a message printable on one line. Apart
from results.py (every other `--json` document) because `tritonctl validate` loads these alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controlplane.vocab import ERROR, WARNING

# --- validate --------------------------------------------------------------------------------------------


def one_line(text: str) -> str:
    """Printable, one line: undecodable bytes of file names and control characters become escapes."""
    try:
        text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


@dataclass(frozen=True)
class Problem:
    file: str
    field: str
    message: str
    severity: str  # "error" | "warning"

    def __post_init__(self) -> None:
        for name in ("file", "field", "message"):
            object.__setattr__(self, name, one_line(getattr(self, name)))

    def line(self) -> str:
        return f"{self.file}: {self.field}: {self.message}" if self.field else f"{self.file}: {self.message}"


@dataclass
class ValidationResult:
    model: str
    path: Path
    problems: list[Problem] = field(default_factory=list)
    config: dict[str, Any] | None = None
    versions: list[int] = field(default_factory=list)
    served_versions: list[int] = field(default_factory=list)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == ERROR]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == WARNING]

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def first_error(self) -> Problem | None:
        errors = self.errors
        return errors[0] if errors else None


@dataclass
class ValidationReport:
    """`validate --json`: one object per model checked, keys in this order. Iterates as its results."""

    results: list[ValidationResult]

    def __iter__(self) -> Iterator[ValidationResult]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, index: int) -> ValidationResult:
        return self.results[index]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    def to_json(self) -> list[dict[str, Any]]:
        return [
            {
                "model": r.model,
                "path": str(r.path),
                "ok": r.ok,
                "versions": list(r.versions),
                "served_versions": list(r.served_versions),
                "problems": [{"file": p.file, "field": p.field, "message": p.message, "severity": p.severity}
                             for p in r.problems],
            }
            for r in self.results
        ]
