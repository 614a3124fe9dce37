"""Offline validation of Triton model directories, with Triton's own config schema.

tritonserver explains most mistakes in a model directory only when it loads it, many with nothing
but "failed to poll from model repository", and one (a python version without model.py) by hanging.
tritonctl validates every snapshot here first, so a broken model is recorded and explained instead
of deployed. config.pbtxt is parsed with tritonclient's `model_config_pb2`, the schema Triton
itself uses; the rest of the directory is only stat'ed: nothing but config.pbtxt (and a python model's
served model.py, for its `auto_complete_config`: controlplane/validation/autocomplete.py) is ever opened,
no symlink is followed out of the model directory, and nothing can block on a FIFO or device. Every
problem is a `Problem` (file, field, one-line reason); the field rules live in
`controlplane.validation.fields`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import stat
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory, text_format

from controlplane.documents.validation import Problem, ValidationReport, ValidationResult, one_line
from controlplane.errors import ModelConfigError, SnapshotEnvironmentError, UsageError, is_environment_error
from controlplane.names import validate_model_name
from controlplane.snapshot.fsutil import read_small_text
from controlplane.snapshot.layout import CONFIG_FILE, MAX_CONFIG_BYTES
from controlplane.triton.model_config import model_config_pb2 as mc
from controlplane.validation.autocomplete import check_completion, completes_at_load, read_code
from controlplane.validation.content import MAX_PY_BYTES, content_problems
from controlplane.validation.ensembles import StepModel, as_config, check_ensemble_members, is_ensemble
from controlplane.validation.fields import check_config, check_version_policy
from controlplane.validation.warmup import check_warmup
from controlplane.vocab import ERROR, WARNING

PYTHON_FILE = "model.py"
MAX_ENTRIES = 100_000  # entries looked at per model before the scan gives up (with a warning)
MAX_DEPTH = 32
# Directories at a model's root that Triton reads for other purposes, never as versions.
RESERVED_DIRS = frozenset({"warmup", "initial_state", "configs"})
_VERSION_RE = re.compile(r"0|[1-9][0-9]*", re.ASCII)
_STOLL_RE = re.compile(r"\s*([+-]?[0-9]+)", re.ASCII)  # what std::stoll reads: Triton takes "2a" as 2
_INT64_MAX = 2**63 - 1
# The files from which Triton (AutoCompleteBackendFields) infers a missing backend, in its order.
_BACKEND_FILES = (("model.savedmodel", "tensorflow"), ("model.graphdef", "tensorflow"), ("model.plan", "tensorrt"),
                  ("model.onnx", "onnxruntime"), ("model.xml", "openvino"), ("model.pt", "pytorch"),
                  ("model.py", "python"))
_MISSING = "missing"
EXECUTION_ENV_PATH = "EXECUTION_ENV_PATH"
MODEL_DIRECTORY_VAR = "$$TRITON_MODEL_DIRECTORY"


# --- config.pbtxt --------------------------------------------------------------------------------


def _parse(text: str) -> mc.ModelConfig:
    config = mc.ModelConfig()
    text_format.Parse(text, config)
    return config


def _parse_failure(exc: Exception, text: str) -> tuple[int, int, str]:
    if not isinstance(exc, text_format.ParseError):
        return 0, 0, f"{type(exc).__name__}: {exc}"
    line, col = exc.GetLine() or 0, exc.GetColumn() or 0
    reason = re.sub(r"^\d+:\d+ : ", "", str(exc))
    lines = text.splitlines()
    if 0 < line <= len(lines):  # protobuf repeats the whole line first; the line:col says enough
        reason = reason.removeprefix(f"'{lines[line - 1]}': ")
    return line, col, reason


def parse_config_text(text: str, file: str) -> mc.ModelConfig:
    """Parse config.pbtxt text; unparsable text raises ModelConfigError `"{file}:{line}:{col}: why"`."""
    try:
        return _parse(text)
    except (text_format.ParseError, ValueError, RecursionError) as exc:
        line, col, reason = _parse_failure(exc, text)
        raise ModelConfigError(f"{file}:{line}:{col}: {reason}") from None


@functools.lru_cache(maxsize=1)
def _explicit_class() -> Any:
    """ModelConfig's schema as proto2, where every scalar records whether the text wrote it."""
    proto = descriptor_pb2.FileDescriptorProto()
    mc.DESCRIPTOR.CopyToProto(proto)
    proto.name = "tritonctl/explicit/" + proto.name
    proto.syntax = "proto2"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("inference.ModelConfig"))


def _parse_explicit(text: str) -> Any:
    try:
        return text_format.Parse(text, _explicit_class()())
    except Exception:  # noqa: BLE001 - presence is a refinement; without it the checks still run
        return None


def served_versions(config: mc.ModelConfig | Mapping[str, Any] | None, available: Iterable[int]) -> list[int]:
    """The versions Triton serves out of `available` under the config's version_policy (measured,
    TRITON_NOTES "version_policy"): none set → the latest 1; `latest {n}` → the n highest; `all`
    (or an empty `version_policy {}`) → all; `specific` → those listed that exist."""
    versions = sorted({int(v) for v in available})
    kind, arg = _policy(config)
    if kind == "latest":
        return versions[-arg:] if arg > 0 else []
    if kind == "specific":
        return sorted(set(arg) & set(versions))
    return versions


def _policy(config: mc.ModelConfig | Mapping[str, Any] | None) -> tuple[str, Any]:
    if config is None:
        return "latest", 1
    if isinstance(config, Mapping):
        policy = config.get("version_policy")
        if policy is None:
            return "latest", 1
        if "latest" in policy:
            return "latest", int((policy["latest"] or {}).get("num_versions", 0))
        if "specific" in policy:
            return "specific", [int(v) for v in (policy["specific"] or {}).get("versions", [])]
        return "all", None
    if not config.HasField("version_policy"):
        return "latest", 1
    which = config.version_policy.WhichOneof("policy_choice")
    if which == "latest":
        return "latest", config.version_policy.latest.num_versions
    if which == "specific":
        return "specific", list(config.version_policy.specific.versions)
    return "all", None


def stamp_parameter(config_text: str, key: str, value: str) -> str:
    """The config text with `parameters { key: K value { string_value: V } }` set. A new key is
    appended (the user's text and comments stay as they are); an existing one is replaced, which
    rewrites the text in protobuf's canonical form."""
    config = parse_config_text(config_text, CONFIG_FILE)
    if key in config.parameters:
        config.parameters[key].string_value = value
        return text_format.MessageToString(config)
    stamp = mc.ModelConfig()
    stamp.parameters[key].string_value = value
    separator = "" if not config_text or config_text.endswith("\n") else "\n"
    return config_text + separator + text_format.MessageToString(stamp)


# --- the model directory -------------------------------------------------------------------------


def _is_within(root: str, path: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _stat_inside(root: str, rel: str) -> tuple[os.stat_result | None, str]:
    """lstat of `root/rel` after resolving it, or None and why; never follows a link out of root.
    `root` is resolved already (`validate_model_dir`)."""
    path = os.path.join(root, rel)
    if "/" not in rel and rel not in ("", ".", ".."):  # one entry of root: its lstat says it unless a link
        try:
            st = os.lstat(path)
        except (OSError, ValueError):
            return None, _MISSING  # what lexists says below
        if not stat.S_ISLNK(st.st_mode):
            return st, ""  # realpath would walk root's components again for this: 8 syscalls per entry
    try:
        if not os.path.lexists(path):
            return None, _MISSING
        real = os.path.realpath(path)
        if not _is_within(root, real):
            return None, f"symlink leaves the model directory (-> {real})"
        st = os.lstat(real)
    except FileNotFoundError:
        return None, "dangling symlink"
    except OSError as exc:
        return None, f"cannot stat: {exc.strerror}"
    if stat.S_ISLNK(st.st_mode):  # realpath gave up: a symlink loop
        return None, "dangling symlink (a loop)"
    return st, ""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISDIR, "directory")):
        if test(mode):
            return name
    return "special file"


class _Checker:
    """Collects the problems of one model directory; `label` names it in every Problem."""

    def __init__(self, root: str, label: str) -> None:
        self.root = root
        self.label = label
        self.config_label = f"{label}/{CONFIG_FILE}"
        self.problems: list[Problem] = []
        self.config_missing = False

    def add(self, where: str, message: str, severity: str = ERROR, file: str | None = None) -> None:
        self.problems.append(Problem(file or self.label, where, message, severity))

    def read_config(self) -> str | None:
        st, reason = _stat_inside(self.root, CONFIG_FILE)
        if st is None:
            self.config_missing = reason == _MISSING  # a python model may complete it (`completion`)
            if not self.config_missing:
                self.add(CONFIG_FILE, reason)
            return None
        if not stat.S_ISREG(st.st_mode):
            self.add(CONFIG_FILE, f"is a {_kind(st.st_mode)}, not a regular file")
            return None
        if st.st_size > MAX_CONFIG_BYTES:
            self.add(CONFIG_FILE, f"is {st.st_size} bytes, over the {MAX_CONFIG_BYTES} byte limit")
            return None
        try:  # O_NONBLOCK + fstat: a FIFO swapped in after the lstat cannot make us wait
            fd = os.open(os.path.realpath(os.path.join(self.root, CONFIG_FILE)),
                         os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            host_failed(exc, f"{self.config_label}: cannot open")
            self.add(CONFIG_FILE, f"cannot open: {exc.strerror}")
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                self.add(CONFIG_FILE, "is not a regular file")
                return None
            data = _read_at_most(fd, MAX_CONFIG_BYTES + 1)
        except OSError as exc:
            host_failed(exc, f"{self.config_label}: cannot read")
            self.add(CONFIG_FILE, f"cannot read: {exc.strerror}")
            return None
        finally:
            os.close(fd)
        if len(data) > MAX_CONFIG_BYTES:
            self.add(CONFIG_FILE, f"is over the {MAX_CONFIG_BYTES} byte limit")
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = data.count(b"\n", 0, exc.start) + 1
            col = exc.start - data.rfind(b"\n", 0, exc.start)
            reason = f"not valid UTF-8 (byte 0x{data[exc.start]:02x})"
            self.add(f"{line}:{col}", reason, file=self.config_label)
            return None

    def parse(self, text: str) -> tuple[mc.ModelConfig | None, Any]:
        """The config and its explicit (proto2) twin, `_parse_explicit`'s, from one pure-Python text
        parse where the text is proto2-parsable (all but an unknown enum number): the config is the
        twin's wire bytes read back into Triton's proto3 class, the same message the text gives it, at
        a fraction of a second text parse (the start-up scan validates every model: issue 39)."""
        explicit = _parse_explicit(text)
        if explicit is not None:
            with contextlib.suppress(Exception):  # the text parse below says what is wrong
                return mc.ModelConfig.FromString(explicit.SerializeToString()), explicit
        try:
            return _parse(text), None
        except (text_format.ParseError, ValueError, RecursionError) as exc:
            line, col, reason = _parse_failure(exc, text)
            self.add(f"{line}:{col}", reason, file=self.config_label)
            return None, None

    def version_dirs(self) -> list[int]:
        """Numeric version directories, as Triton's VersionsToLoad reads them; odd entries reported."""
        versions: list[int] = []
        for name in _list(self.root):
            if name == CONFIG_FILE:
                continue
            st, _ = _stat_inside(self.root, name)
            if st is None:
                continue  # the walk reports dangling and escaping links
            numeric = _VERSION_RE.fullmatch(name) is not None
            if not stat.S_ISDIR(st.st_mode):
                if numeric or name.isdigit():
                    self.add(name, f"is a {_kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else 'file'}: "
                             "a version must be a directory")
                continue
            if name in RESERVED_DIRS:
                continue
            if numeric and int(name) <= _INT64_MAX:
                versions.append(int(name))
            elif numeric:
                self.add(name, "too large for a version number (int64)")
            elif name.isdigit():
                self.add(name, "ignored by Triton: a version directory name has no leading zeros", WARNING)
            elif match := _STOLL_RE.match(name):
                self.add(name, f"Triton reads this name as version {int(match.group(1))}: "
                         "name version directories with digits only")
            else:
                self.add(name, "not a numeric version directory: Triton ignores it", WARNING)
        if not versions:
            self.add("versions", "no numeric version directory (e.g. 1/): Triton has nothing to load")
        return sorted(versions)

    def inferred_backend(self, config: mc.ModelConfig) -> tuple[str, str] | None:
        """(backend, evidence) Triton fills in when config.pbtxt names neither backend nor platform:
        from default_model_filename, else from the files of its first sub-directory by name."""
        if config.backend or config.platform:
            return None
        if config.default_model_filename:
            found = [b for f, b in _BACKEND_FILES if f == config.default_model_filename]
            return (found[0], "default_model_filename") if found else None
        subdirs = [n for n in _list(self.root) if (st := _stat_inside(self.root, n)[0]) and stat.S_ISDIR(st.st_mode)]
        if not subdirs:
            return None
        for filename, backend in _BACKEND_FILES:
            if _stat_inside(self.root, f"{subdirs[0]}/{filename}")[0] is not None:
                return backend, f"{subdirs[0]}/{filename}"
        return None

    def python_files(self, config: mc.ModelConfig, versions: list[int], served: list[int]) -> None:
        filename = config.default_model_filename or PYTHON_FILE
        if "/" in filename or filename in (".", ".."):
            return  # modelchecks reports the name itself
        for version in versions:
            rel = f"{version}/{filename}"
            st, reason = _stat_inside(self.root, rel)
            severity, note = (ERROR, "") if version in served else (WARNING, " (version not served now)")
            if st is None:
                if reason == _MISSING:
                    self.add(rel, f"missing: Triton hangs loading a python model without it{note}", severity)
                else:
                    self.add(rel, reason)
            elif stat.S_ISDIR(st.st_mode):
                self.add(rel, f"is a directory, not a file{note}", severity)
            elif not stat.S_ISREG(st.st_mode):
                self.add(rel, f"is a {_kind(st.st_mode)}, not a regular file{note}", severity)

    def completion(self, config: mc.ModelConfig | None, served: list[int]) -> None:
        """A python model's completion by its `auto_complete_config` (controlplane/validation/autocomplete.py),
        read from each served version's model file; `config` None: the model has no config.pbtxt."""
        filename = (config.default_model_filename if config is not None else "") or PYTHON_FILE
        codes = {}
        for rel in (f"{v}/{filename}" for v in served):
            st, _ = _stat_inside(self.root, rel)
            text = read_small_text(Path(os.path.realpath(os.path.join(self.root, rel))), MAX_PY_BYTES) \
                if st is not None and stat.S_ISREG(st.st_mode) else None
            if text is not None:
                codes[rel] = read_code(text)
        for f in check_completion(config, codes):
            where = f"{self.label}/{f.file}" if f.file else self.label if f.field == CONFIG_FILE else self.config_label
            self.add(f.field, f.message, f.severity, file=where)

    def file_size(self, rel: str) -> int | None:
        """Size of the regular file `rel` inside the model, None when absent (or not a file)."""
        st, _ = _stat_inside(self.root, rel)
        return st.st_size if st is not None and stat.S_ISREG(st.st_mode) else None

    def referenced_files(self, config: mc.ModelConfig) -> None:
        """Files config.pbtxt names that Triton opens at load: warmup data, label files, the python
        EXECUTION_ENV_PATH archive (`$$TRITON_MODEL_DIRECTORY` is the model directory)."""
        for finding in check_warmup(config, self.file_size):
            self.add(finding.field, finding.message, finding.severity, file=self.config_label)
        for i, output in enumerate(config.output):
            if output.label_filename and self.file_size(output.label_filename) is None:
                self.add(f"output[{i}].label_filename", f'"{output.label_filename}": no such file in the '
                         "model directory", file=self.config_label)
        if EXECUTION_ENV_PATH not in config.parameters:
            return
        value = config.parameters[EXECUTION_ENV_PATH].string_value
        where = f'parameters["{EXECUTION_ENV_PATH}"]'
        if value.startswith(MODEL_DIRECTORY_VAR):
            rel = value[len(MODEL_DIRECTORY_VAR):].lstrip("/")
            if not rel or self.file_size(rel) is None:
                self.add(where, f'"{value}": no such archive {rel or "(empty)"} in the model directory',
                         file=self.config_label)
        elif not value:  # measured: Triton 2.51 loads it, with no execution environment
            self.add(where, "empty: Triton ignores it (no execution environment)", WARNING, file=self.config_label)
        elif not os.path.isabs(value):
            self.add(where, f'"{value}" is relative: Triton resolves it against the tritonserver\'s working '
                     f"directory; use {MODEL_DIRECTORY_VAR}/... or an absolute path", file=self.config_label)
        else:  # checked at deploy against a launched server's host (controlplane/triton/capabilities.py)
            self.add(where, f'"{value}" lies outside the model directory: present only if the serving host '
                     f"has it (use {MODEL_DIRECTORY_VAR}/...)", WARNING, file=self.config_label)

    def walk(self) -> None:
        """Every entry, by lstat: dangling or escaping symlinks and special files are errors."""
        seen = 0
        stack: list[tuple[str, int]] = [("", 0)]
        while stack:
            rel_dir, depth = stack.pop()
            for name in _list(os.path.join(self.root, rel_dir)):
                seen += 1
                if seen > MAX_ENTRIES:
                    self.add(".", f"more than {MAX_ENTRIES} entries: stopped checking", WARNING)
                    return
                rel = os.path.join(rel_dir, name) if rel_dir else name
                try:
                    mode = os.lstat(os.path.join(self.root, rel)).st_mode
                except OSError:
                    continue
                if stat.S_ISLNK(mode):
                    _, reason = _stat_inside(self.root, rel)
                    if reason:
                        self.add(rel, reason)
                elif stat.S_ISDIR(mode):
                    if depth < MAX_DEPTH:
                        stack.append((rel, depth + 1))
                elif not stat.S_ISREG(mode) and rel != CONFIG_FILE:  # read_config reports that one
                    self.add(rel, f"is a {_kind(mode)}: a model may hold only files, directories, symlinks")


def host_failed(exc: OSError, what: str) -> None:
    """Raise SnapshotEnvironmentError when `exc` is the host's failure (out of descriptors, space, an I/O
    error): a model is never judged on it (issue 58); its capture is tried again."""
    if is_environment_error(exc):
        raise SnapshotEnvironmentError(f"{what} ({exc.strerror}); trying again") from exc


def _list(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError as exc:
        host_failed(exc, f"cannot list {path}")
        return []


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks, size = [], 0
    while size < limit:
        chunk = os.read(fd, min(65536, limit - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def validate_model_dir(path: Path, name: str | None = None) -> ValidationResult:
    """Check one model directory offline. `name` is the model's name when the directory is named
    otherwise (a snapshot tree). Never raises for bad content: every finding is a Problem."""
    path = Path(path)
    model = name or Path(os.path.abspath(path)).name  # may hold undecodable bytes as surrogates
    result = ValidationResult(model=one_line(model), path=path)
    checker = _Checker("", result.model)
    checker.problems = result.problems
    try:
        validate_model_name(model)
    except UsageError as exc:
        checker.add("directory", str(exc))
    if not os.path.lexists(path):
        checker.add(".", "does not exist")
        return result
    root = os.path.realpath(path)
    if not os.path.isdir(root):
        checker.add(".", "dangling symlink" if os.path.islink(path) else "is not a directory")
        return result
    checker.root = root
    text = checker.read_config()
    config, explicit = checker.parse(text) if text is not None else (None, None)
    if checker.config_missing:  # Triton starts from its name and the backend its files show
        found = checker.inferred_backend(mc.ModelConfig())
        config = mc.ModelConfig(name=model, backend="python") if found and found[0] == "python" else None
        if config is None:
            checker.add(CONFIG_FILE, "missing: Triton cannot load the model")
    inferred = checker.inferred_backend(config) if config is not None else None
    if config is not None:
        for finding in check_config(config, explicit, model, inferred):
            checker.add(finding.field, finding.message, finding.severity, file=checker.config_label)
    versions = checker.version_dirs()
    if config is not None:
        for finding in check_version_policy(config, versions):
            checker.add(finding.field, finding.message, finding.severity, file=checker.config_label)
        result.config = json_format.MessageToDict(config, preserving_proto_field_name=True)
        result.served_versions = served_versions(config, versions)
        if (config.backend or (inferred and inferred[0])) == "python":
            checker.python_files(config, versions, result.served_versions)
            checker.completion(None if checker.config_missing else config, result.served_versions)
        checker.referenced_files(config)
    result.versions = versions
    checker.walk()
    completed = completes_at_load(result.problems)  # smoke.json's tensors: checked against the completed config
    result.problems.extend(content_problems(root, result.model, None if completed else result.config))
    result.problems[:] = list(dict.fromkeys(result.problems))  # one line per problem, first kept
    return result


def model_dirs(path: Path) -> list[Path]:
    """The model directories PATH names: itself, or, for a repository (no config.pbtxt nor python version
    of its own, but sub-directories with one), each non-hidden sub-directory."""
    path = Path(path)
    if os.path.lexists(path / CONFIG_FILE) or not path.is_dir() or _python_versions(path):
        return [path]
    children = sorted(
        p for p in _entries(path) if not p.name.startswith(".") and (p.is_dir() or p.is_symlink())
    )
    if any(os.path.lexists(child / CONFIG_FILE) or _python_versions(child) for child in children if child.is_dir()):
        return children
    return [path]


def _python_versions(path: Path) -> bool:
    """Whether `path` holds a version directory with a model.py: a model even without config.pbtxt (its
    auto_complete_config may complete it)."""
    return any(p.name.isdigit() and os.path.lexists(p / PYTHON_FILE) for p in _entries(path))


def _entries(path: Path) -> list[Path]:
    try:
        return list(path.iterdir())
    except OSError:
        return []


def validate_paths(paths: Iterable[str | os.PathLike[str]]) -> ValidationReport:
    """Validate each PATH: a model directory, a repository of them, or a config.pbtxt. Triton ignores
    plain files in a repository: given beside directories (`validate repo/*` over a README.md) they
    are passed over in silence; a plain file given alone gets a warning saying so."""
    results: list[ValidationResult] = []
    given = [Path(raw) for raw in paths]
    beside_models = any(path.is_dir() for path in given)
    for path in given:
        if not os.path.lexists(path):
            raise UsageError(f"{path}: no such file or directory")
        if path.name == CONFIG_FILE and not path.is_dir():
            results.append(validate_model_dir(path.parent if str(path.parent) else Path(".")))
        elif path.is_dir() or (path.is_symlink() and not path.exists()):
            results.extend(validate_model_dir(p) for p in model_dirs(path))
        elif not beside_models:
            result = ValidationResult(model=one_line(path.name), path=path)
            reason = "not a directory: Triton ignores files here"
            result.problems.append(Problem(result.model, ".", reason, WARNING))
            results.append(result)
    check_ensembles(results)
    return ValidationReport(results)


def ensemble_problems(result: ValidationResult, lookup: Callable[[str], StepModel | None]) -> list[Problem]:
    """The cross-repository problems of an ensemble `result` (none for other models), its step
    models found with `lookup`. Content problems are errors; a missing or unserved step model too
    (the repository given is incomplete), flagged in the message; a step whose config its model completes
    at load, a warning (checked once it has loaded)."""
    if result.config is None:
        return []
    config = as_config(result.config)
    if not is_ensemble(config):
        return []
    label = f"{result.model}/{CONFIG_FILE}"
    findings = check_ensemble_members(config, result.model, lookup)
    return [Problem(label, f.field, f.message, f.severity) for f in findings]


def check_ensembles(results: list[ValidationResult]) -> None:
    """Check every ensemble among `results` against its step models: the one in the ensemble's own
    repository (its parent directory: validated with it, or on disk), else one of that name among
    `results` (given on the command line)."""
    by_path = {os.path.abspath(r.path): r for r in results}
    by_name: dict[str, ValidationResult] = {}
    for r in results:
        by_name.setdefault(r.model, r)
    siblings: dict[str, ValidationResult] = {}

    def find(ensemble: ValidationResult, name: str) -> ValidationResult | None:
        try:
            validate_model_name(name)
        except UsageError:
            return None
        sibling = os.path.join(os.path.dirname(os.path.abspath(ensemble.path)), name)
        if sibling in by_path:
            return by_path[sibling]
        if os.path.isdir(sibling):
            if sibling not in siblings:
                siblings[sibling] = validate_model_dir(Path(sibling))
            return siblings[sibling]
        return by_name.get(name)

    for result in results:
        if result.config is None or not is_ensemble(as_config(result.config)):
            continue

        def lookup(name: str, ensemble: ValidationResult = result) -> StepModel | None:
            member = find(ensemble, name)
            if member is None:
                return None
            usable = member.config is not None and member.ok  # an invalid step is reported as such, below
            return StepModel(as_config(member.config) if usable else None, member.served_versions,
                             pending=completes_at_load(member.problems))

        problems = ensemble_problems(result, lookup)
        for step in as_config(result.config).ensemble_scheduling.step:
            member = find(result, step.model_name)
            if member is not None and member is not result and not member.ok:
                problems.append(Problem(f"{result.model}/{CONFIG_FILE}", "ensemble_scheduling",
                                        f'step model "{step.model_name}" does not validate: '
                                        f"{member.first_error.line() if member.first_error else ''}", ERROR))
        result.problems.extend(p for p in problems if p not in result.problems)
def is_ensemble_dir(model_dir: Path) -> bool:
    """Whether the model's config.pbtxt declares an ensemble (start-up scans deploy these last). A source
    being edited: only a regular config file of at most MAX_CONFIG_BYTES is read."""
    return is_ensemble_text(read_small_text(model_dir / CONFIG_FILE, MAX_CONFIG_BYTES) or "")


def is_ensemble_text(text: str) -> bool:
    """Whether config.pbtxt text declares an ensemble: a cheap look, no parse (start-up ordering)."""
    return 'platform: "ensemble"' in text or 'platform:"ensemble"' in text
