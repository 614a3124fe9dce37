"""The design's layers hold, and each CLI command imports only what it uses.

import-linter's contracts in .importlinter (the core never imports the CLI; the adapters do not import
each other; the layers of docs/architecture.md; the client path imports no server, database, Triton
client or numpy code), and, at run time, the modules a real `tritonctl` process has loaded when it
exits: a static contract cannot see that `versions` on a SQLite registry never takes the SQLAlchemy
branch, a process can.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from controlplane.store import migrate, schema
from controlplane.store.records import iso, utcnow
from controlplane.store.registry import Registry
from tests.harness import DaemonProcess

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("sqlalchemy", "alembic", "tritonclient", "numpy")
# What the client path must not load either: gRPC and protobuf (gone from the control API), the HTTP server
# stack (the client is http.client over the socket).
SERVER_STACK = ("grpc", "google", "fastapi", "starlette", "uvicorn", "pydantic", "anyio", "h11")
CONTRACTS = ("The core never imports the CLI", "The core's layers", "The CLI and the API client import no server")

# Runs `tritonctl ARGS...` as `python -m cli.main` would, then writes the names of the loaded modules.
_PROBE = """
import atexit, json, runpy, sys
out = sys.argv[1]
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
sys.argv = ["tritonctl", *sys.argv[2:]]
runpy.run_module("cli.main", run_name="__main__")
"""


def test_import_contracts_are_kept() -> None:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint, "import-linter is part of the test extra"
    # --no-cache: grimp's cache can serve a graph built with the other TYPE_CHECKING setting (1-2 s to build)
    result = subprocess.run([lint, "--no-cache", "--config", str(ROOT / ".importlinter")], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout
    flat = " ".join(result.stdout.split())
    for name in CONTRACTS:
        assert name in flat, f"contract missing from .importlinter: {name}"


def _layers_contract() -> str:
    text = (ROOT / ".importlinter").read_text()
    return text[text.index("[importlinter:contract:layers]"):text.index("[importlinter:contract:client-path-is-light]")]


def test_every_module_of_the_core_is_in_a_layer() -> None:
    core = ROOT / "controlplane"
    named = {w.split(".", 1)[1] for w in _layers_contract().replace(":", " ").split() if w.startswith("controlplane.")}
    modules = {p.stem for p in core.glob("*.py") if p.stem != "__init__"}
    for package in (p for p in core.iterdir() if (p / "__init__.py").is_file()):
        if package.name in named:  # a layer of its own, as a whole
            modules.add(package.name)
        else:  # its modules each in a layer
            modules |= {f"{package.name}.{p.stem}" for p in package.glob("*.py") if p.stem != "__init__"}
    assert sorted(modules - named) == [], "add them to the layers contract in .importlinter (and architecture.md)"


def test_type_checking_imports_are_counted() -> None:
    """An import under `if TYPE_CHECKING:` costs nothing at run time but is a dependency all the same:
    every contract counts it (test_import_contracts_are_kept runs them), and a type-only edge the client
    path needs is a named ignore_imports line."""
    settings = (ROOT / ".importlinter").read_text().split("[importlinter:contract:")[0]
    assert "exclude_type_checking_imports = False" in settings


def test_no_import_circles_among_the_core_and_the_cli() -> None:
    """No module reaches itself through imports (TYPE_CHECKING and function-level ones included)."""
    import grimp

    graph = grimp.build_graph("controlplane", "cli", exclude_type_checking_imports=False)
    circles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            if graph.chain_exists(importer=imported, imported=module):
                circles.append(f"{module} <-> {imported}")
    assert circles == [], circles


def test_only_the_daemon_and_the_api_import_the_control_plane() -> None:
    """The control plane is verbs over the parts below it: the daemon builds it and the control API calls
    it; no other module of controlplane/ imports it (TYPE_CHECKING and function-level imports included),
    so no part reaches back up into the plane it serves."""
    import grimp

    graph = grimp.build_graph("controlplane", exclude_type_checking_imports=False)
    importers = graph.find_modules_that_directly_import("controlplane.control_plane")
    allowed = {m for m in importers if m == "controlplane.daemon" or m.startswith("controlplane.api.")}
    assert sorted(importers - allowed) == []
    assert "controlplane.daemon" in importers  # the rule reads the real graph


# What would let a verb tell which target it runs on: the fleet itself, or the target's kind.
FLEET_NAMES = frozenset({"fleet", "FleetTarget", "HostTarget", "FleetStrategy", "FleetMember"})


def fleet_reads(source: str, cls: str = "ControlPlane",
                allowed: frozenset[str] = frozenset({"fleet", "__init__"})) -> list[str]:
    """Every read, in a method of `cls` but the `allowed` ones (the `fleet` property; `__init__`, where the
    target is chosen once), of a name or attribute that says whether it runs on a fleet (FLEET_NAMES:
    `self.fleet`, `self.target.fleet`, `isinstance(t, FleetTarget)`, ...), or of the target's type:
    `method: expression` each."""
    import ast

    tree = ast.parse(source)
    plane = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    found = []
    for method in plane.body:
        if not isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef) or method.name in allowed:
            continue
        for node in ast.walk(method):
            asked = (isinstance(node, ast.Attribute) and node.attr in FLEET_NAMES
                     or isinstance(node, ast.Name) and node.id in FLEET_NAMES
                     or isinstance(node, ast.Call) and ast.unparse(node.func) == "type")
            if asked:
                found.append(f"{method.name}: {ast.unparse(node)}")
    return found


def test_no_verb_asks_whether_it_runs_on_a_fleet() -> None:
    """The verbs hand every change to the target the daemon chose once (controlplane/target/targets.py: this host
    or the fleet): no method of the plane but its `fleet` property (which the web view and the fleet routes
    read) and its constructor reads the fleet or the target's kind, in a branch or anywhere else (the syntax
    tree, not the text: issue 57 found `if self.fleet: pass` in a verb passing a text match)."""
    source = (ROOT / "controlplane" / "control_plane.py").read_text()
    assert fleet_reads(source) == []
    assert "self.target." in source
    # the check itself: each way a verb could ask is found
    for asking in ("if self.fleet:\n            pass", "x = self.target.fleet", "isinstance(self.target, FleetTarget)",
                   "type(self.target)", "return self.fleet is not None"):
        verb = "        validate_model_name(model)\n"
        probe = source.replace(verb, f"        {asking}\n{verb}", 1)
        assert probe != source and fleet_reads(probe), asking


def test_change_sets_and_tags_take_no_plane() -> None:
    """Change sets take the intake (`ports.SetIntake`) and return plans; tags take their target
    (`ports.TagTarget`): no parameter or attribute of either module is a plane, and neither runs a
    deploy itself (the target does)."""
    import ast

    for name in ("intake/changeset.py", "intake/tags.py"):
        tree = ast.parse((ROOT / "controlplane" / name).read_text())
        annotations = [ast.unparse(a.annotation) for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                       for a in node.args.args + node.args.kwonlyargs if a.annotation is not None]
        assert [a for a in annotations if "Plane" in a] == [], name
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
            n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert not names & {"plane", "deployer", "Deployer"}, (name, names & {"plane", "deployer", "Deployer"})


def test_parts_are_handed_narrow_protocols_not_the_plane() -> None:
    """No module of the core takes the plane as `Any` or reaches a private attribute of one of its parts
    (`plane.deployer._serves`): each part names what it uses as a protocol (controlplane/ports.py,
    fleet/hostplane.py), so a change to the plane is not a change to them."""
    import re

    reach = re.compile(r"plane: Any|plane\.[a-z_]*\._")
    offenders = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
                 for path in sorted((ROOT / "controlplane").rglob("*.py"))
                 for number, line in enumerate(path.read_text().splitlines(), 1) if reach.search(line)]
    assert offenders == [], offenders


def test_head_revision_constant_is_the_head_of_migrations() -> None:
    # Read commands compare the registry's revision with this constant instead of importing Alembic.
    assert migrate.HEAD_REVISION == migrate.head_revision()


def test_every_command_is_registered_lazily() -> None:
    from cli.main import COMMAND_MODULES, LAZY_COMMANDS, _module_commands

    defined = {name: module for module in COMMAND_MODULES for name in _module_commands(module)}
    assert defined == LAZY_COMMANDS  # a command missing here would import every command module


def run_cli(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    modules_file = tmp_path / "modules.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", _PROBE, str(modules_file), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    return proc, set(json.loads(modules_file.read_text()))


def heavy(modules: set[str], extra: tuple[str, ...] = ()) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY + extra
                  or m in ("controlplane.api.server", "controlplane.api.app", "controlplane.control_plane",
                           "controlplane.deploy.engine", "controlplane.daemon"))


@pytest.fixture
def history_registry(tmp_path: Path) -> tuple[str, str]:
    """A migrated SQLite registry with one model, two snapshots, audit events and serving changes."""
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    registry = Registry(url)
    migrate.upgrade(registry)
    now = utcnow()
    tables = schema.Base.metadata.tables
    with registry.engine.begin() as conn:
        conn.execute(sa.insert(tables["models"]), [{"name": "linear", "pinned": False, "active_digest": "b" * 64,
                                                    "state": "serving", "created_at": now, "updated_at": now,
                                                    "active_since": now}])
        conn.execute(sa.insert(tables["snapshots"]), [
            {"model": "linear", "digest": d * 64, "manifest": "{}", "versions": "[1]", "served_versions": "[1]",
             "valid": True, "problems": "[]", "total_bytes": 10, "first_seen": now - timedelta(hours=h),
             "last_seen": now, "quarantined": False, "collected": False} for d, h in (("a", 2), ("b", 1))])
        conn.execute(sa.insert(tables["audit_events"]), [
            {"time": now - timedelta(minutes=m), "actor": "alice", "action": "deploy", "model": "linear",
             "digest": "a" * 64, "outcome": "ok", "duration_ms": m, "message": f"event {m}", "host": ""}
            for m in range(1, 6)])
        conn.execute(sa.insert(tables["serving_log"]), [
            {"time": now - timedelta(hours=h), "model": "linear", "digest": d * 64, "versions": "[1]", "host": ""}
            for d, h in (("a", 2), ("b", 1))])
    registry.close()
    return url, iso(now - timedelta(minutes=90)) or ""


def test_read_commands_skip_sqlalchemy_and_answer_as_the_registry_does(
        tmp_path: Path, history_registry: tuple[str, str]) -> None:
    from controlplane.intake import tags
    from controlplane.views import queries

    url, moment = history_registry
    registry = migrate.open_existing(url)
    try:
        expected = {
            "versions": tags.annotate_versions(registry, "linear", queries.versions(registry, "linear")).to_json(),
            "audit": queries.audit(registry, model="linear", since="1d").to_json(),
            "at": tags.annotate_serving_at(registry, queries.serving_at(registry, moment), None).to_json(),
        }
    finally:
        registry.close()
    for key, args in (("versions", ["versions", "linear"]), ("audit", ["audit", "--model", "linear", "--since", "1d"]),
                      ("at", ["audit", "--at", moment])):
        proc, modules = run_cli(tmp_path, *args, "--json", "--db-url", url)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout) == expected[key]
        assert heavy(modules, ("grpc", "rich")) == [], args


def test_read_commands_refuse_an_old_schema_without_alembic(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    registry = Registry(url)
    migrate.upgrade(registry, "0003")
    registry.close()
    proc, modules = run_cli(tmp_path, "versions", "linear", "--db-url", url)
    assert proc.returncode == 1
    assert f"registry schema is at 0003, this tritonctl needs {migrate.HEAD_REVISION}" in proc.stderr
    assert heavy(modules) == []


def test_validate_of_one_model_loads_only_the_config_schema(tmp_path: Path) -> None:
    proc, modules = run_cli(tmp_path, "validate", str(ROOT / "examples" / "model_repository" / "linear"))
    assert proc.returncode == 0, proc.stderr
    assert "tritonclient.grpc.model_config_pb2" in modules
    assert heavy(modules, ("grpc",)) == ["tritonclient.grpc.model_config_pb2"]
    assert "rich" not in {m.split(".")[0] for m in modules}  # its lines are plain (cli/plain.py styles them)


def test_status_process_imports_no_database_triton_or_numpy_code(tmp_path: Path, triton: Any) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    daemon = DaemonProcess(repo, tmp_path / "state", launch=False,
                           extra_args=["--triton-url", triton.grpc_url, "--policy", "manual"]).start()
    try:
        for args, code in ((["status", "--json"], 0), (["status"], 0), (["pin", "nothing-here"], 2),
                           (["policy", "m", "manual", "--json"], 0), (["versions", "nothing-here"], 2),
                           (["audit", "--json"], 0), (["audit"], 0), (["audit", "--at", "0s"], 0), (["tags"], 0)):
            proc, modules = run_cli(tmp_path, *args, "--state-dir", str(daemon.state_dir))
            assert proc.returncode == code, proc.stderr
            assert heavy(modules, SERVER_STACK) == [], args  # http.client over the socket, nothing else
            assert sorted(m for m in modules if m.endswith("_pb2")) == [], args
            # JSON needs no rich, nor a table that fits, nor a short error (cli/plain.py draws them)
            assert "rich" not in {m.split(".")[0] for m in modules}, args
    finally:
        daemon.stop()


def test_no_module_of_the_core_or_the_cli_is_over_600_lines() -> None:
    """Rooms (issue 37): a module past 600 lines holds more than one responsibility; split it by what it
    does (docs/architecture.md "Module map") rather than raising the bound."""
    long = {str(p.relative_to(ROOT)): n for p in [*(ROOT / "controlplane").rglob("*.py"), *(ROOT / "cli").rglob("*.py")]
            if (n := len(p.read_text().splitlines())) > 600}
    assert long == {}


def _module_map_rows() -> dict[str, set[str]]:
    """docs/architecture.md's "Rooms" table: each package (its path under controlplane/, "" for the top
    level) with the modules its row names."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("## Rooms: the module map"):]
    section = section[:section.index("\n## ", 1)]
    rows: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] in ("Package", "---"):
            continue
        package = "" if cells[0] == "(top level)" else cells[0].rstrip("/")
        rows[package] = set(re.findall(r"\b(\w+)\.py\b", cells[3]))
    return rows


def test_every_module_is_in_the_module_map() -> None:
    """The map stays true: every package of controlplane/ has its row, every module is named in it, and
    the map names nothing that is not there."""
    rows = _module_map_rows()
    core = ROOT / "controlplane"
    packages = {str(p.parent.relative_to(core)).replace(".", "") for p in core.rglob("__init__.py")}
    assert sorted(packages - set(rows)) == [], "a package without a row in docs/architecture.md's module map"
    assert sorted(set(rows) - packages) == [], "the module map names a package that does not exist"
    for package in sorted(packages):
        here = core / package
        modules = {p.stem for p in here.glob("*.py") if p.stem != "__init__" and "_pb2" not in p.stem}
        missing, gone = sorted(modules - rows[package]), sorted(rows[package] - modules)
        assert not missing, f"controlplane/{package}: {missing} not in docs/architecture.md's module map"
        assert not gone, f"docs/architecture.md's module map names {gone} under controlplane/{package}: not there"


def test_the_top_level_keeps_only_entry_points_and_vocabulary() -> None:
    """`ls controlplane` shows the stages: at most 12 entries besides the packages (issue 59)."""
    core = ROOT / "controlplane"
    loose = [p.name for p in core.iterdir() if p.suffix == ".py" or (p.is_dir() and not (p / "__init__.py").exists()
                                                                      and p.name != "__pycache__")]
    assert len(loose) <= 12, sorted(loose)
