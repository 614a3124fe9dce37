"""The dependency floors are past every known advisory: pip-audit, offline.

setup.cfg's floors (`name>=X`) are what a fresh install may still resolve to, so each floor is audited as
a pinned requirement (`name==X`), with pip-audit itself (the PyPI tool) and its OSV service pointed at a
local answerer of OSV's query API that reads the advisories shipped in tests/data/advisories.osv.json:
the test runs without the network (this project's test machines reach PyPI's index but not OSV's API
nor PyPI's per-version JSON, which pip-audit's default service reads). The answerer only picks the
records whose affected ranges hold the asked version, as OSV does; what is reported, with which fix
versions, is pip-audit's. The old floors are audited too, so a list or a tool that finds nothing fails.
docs/operations.md "Security" (Dependencies) says how the list is kept.
"""

from __future__ import annotations

import configparser
import json
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
ADVISORIES = Path(__file__).parent / "data" / "advisories.osv.json"
PIP_AUDIT = shutil.which("pip-audit", path=str(Path(sys.executable).parent)) or shutil.which("pip-audit")
pytestmark = pytest.mark.skipif(PIP_AUDIT is None, reason="pip-audit is not installed (pip install -e '.[test]')")
# The floors before issue 43: each had at least one advisory.
OLD_FLOORS = {"fastapi": "0.115.0", "starlette": "0.40.0", "h11": "0.14.0", "jinja2": "3.1.0"}


def affects(record: dict[str, Any], name: str, version: Version) -> bool:
    for affected in record["affected"]:
        if affected["package"]["name"].lower() != name or affected["package"]["ecosystem"] != "PyPI":
            continue
        for span in affected.get("ranges", []):
            introduced, fixed = Version("0"), None
            for event in span["events"]:
                introduced = Version(event["introduced"]) if "introduced" in event else introduced
                fixed = Version(event["fixed"]) if "fixed" in event else fixed
            if introduced <= version and (fixed is None or version < fixed):
                return True
    return False


@pytest.fixture(scope="module")
def osv_url() -> Iterator[str]:
    records = json.loads(ADVISORIES.read_text())["vulns"]

    class Answer(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            query = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            name, version = query["package"]["name"].lower(), Version(query["version"])
            body = json.dumps({"vulns": [r for r in records if affects(r, name, version)]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/v1/query"
    server.shutdown()


def floors() -> dict[str, str]:
    """setup.cfg's install_requires: each package's lowest allowed version."""
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    found = {}
    for line in parser["options"]["install_requires"].strip().splitlines():
        match = re.match(r"^([A-Za-z0-9_.\[\]-]+?)(\[[^\]]*\])?>=([0-9][^,;\s]*)", line.strip())
        if match and ";" not in line:
            found[match.group(1).lower()] = match.group(3)
    return found


def audit(pins: dict[str, str], osv_url: str, tmp_path: Path) -> tuple[int, dict[str, list[dict[str, Any]]]]:
    requirements = tmp_path / "floors.txt"
    requirements.write_text("".join(f"{name}=={version}\n" for name, version in sorted(pins.items())))
    result = subprocess.run([str(PIP_AUDIT), "-r", str(requirements), "--no-deps", "--disable-pip",
                             "-s", "osv", "--osv-url", osv_url, "--cache-dir", str(tmp_path / "cache"),
                             "--progress-spinner", "off", "-f", "json"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode in (0, 1), result.stderr
    report = json.loads(result.stdout)
    return result.returncode, {d["name"].lower(): d.get("vulns", []) for d in report["dependencies"]}


def test_the_floors_of_the_web_stack_are_past_the_known_advisories(osv_url: str, tmp_path: Path) -> None:
    pins = floors()
    assert {"fastapi", "starlette", "h11", "jinja2", "uvicorn"} <= set(pins)
    code, found = audit(pins, osv_url, tmp_path)
    assert code == 0 and not any(found.values()), {k: [v["id"] for v in vs] for k, vs in found.items() if vs}
    assert set(found) == set(pins)  # every floor was asked about


def test_the_old_floors_are_caught(osv_url: str, tmp_path: Path) -> None:
    """The shipped list and pip-audit find what the floors before issue 43 allowed."""
    code, found = audit(OLD_FLOORS, osv_url, tmp_path)
    assert code == 1
    ids = {name: {i for v in vulns for i in (v["id"], *v.get("aliases", []))} for name, vulns in found.items()}
    assert {"GHSA-7f5h-v6xp-fcq8", "GHSA-82w8-qh3p-5jfq"} <= ids["starlette"]
    assert "GHSA-vqfr-h8mv-ghfj" in ids["h11"] and "GHSA-cpwx-vrp4-4pq7" in ids["jinja2"]
    fixes = {i: v["fix_versions"] for v in found["starlette"] for i in (v["id"], *v.get("aliases", []))}
    assert fixes["GHSA-7f5h-v6xp-fcq8"] == ["0.49.1"]


def test_the_installed_versions_are_past_the_known_advisories(osv_url: str, tmp_path: Path) -> None:
    """What this environment resolved to (the web stack and the rest of install_requires)."""
    from importlib.metadata import PackageNotFoundError, version

    installed = {}
    for name in floors():
        try:
            installed[name] = version(name)
        except PackageNotFoundError:
            continue
    code, found = audit(installed, osv_url, tmp_path)
    assert code == 0 and not any(found.values()), {k: [v["id"] for v in vs] for k, vs in found.items() if vs}
