"""Snapshot cost: capturing a model with one big file, against `cp` and `sha256sum` of the same file.

A model (config.pbtxt, 1/model.py, 1/weights.bin of 1 GiB; --quick 100 MiB of random bytes) is
snapshotted into a fresh content store (`ContentStore.capture`, as the daemon does it: read once,
hash while copying into the store, fsync the object, build the read-only tree of hard links),
alternating, 3 rounds, with `cp weights.bin <dest>` and `sha256sum weights.bin`; medians compared.
The page cache is NOT dropped (that needs privileges and would disturb other work on a shared
machine): the file is warm, and `fincore` reports how much of it is resident before each step. The
capture also runs with fsync off (informational: how much of its cost is the flush to disk).

Then the config-only edit: with the store warm, config.pbtxt is edited and the model captured again;
the stat cache (device, inode, size, mtime, ctime) spares the big file, so only the small files are
read. Targets: config-only re-snapshot <= 50 ms (median); first snapshot within 1.5x sha256sum.

    python bench/snapshot_cost.py            # 1 GiB
    python bench/snapshot_cost.py --quick    # 100 MiB
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c  # noqa: E402

from controlplane.snapshot import ContentStore  # noqa: E402

NAME = "snapshot_cost"
MODEL = "big"
MiB = 1 << 20
TARGET_RESNAPSHOT_MS = 50.0
TARGET_RATIO = 1.5


def make_model(root: Path, size: int) -> Path:
    model = root / MODEL
    (model / "1").mkdir(parents=True)
    c.write_pair_model(root, MODEL, 1)
    block = 8 * MiB
    with open(model / "1" / "weights.bin", "wb") as fh:
        left = size
        while left > 0:
            n = min(block, left)
            fh.write(os.urandom(n))
            left -= n
    subprocess.run(["sync"], check=False)  # the source's dirty pages on disk: captures flush only their own
    return model


def resident(path: Path) -> str:
    """How much of `path` is in the page cache (fincore), e.g. '100%'."""
    try:
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES,SIZE", str(path)],
                             capture_output=True, text=True, timeout=30, check=True).stdout.split()
        return f"{100 * int(out[0]) / max(1, int(out[1])):.0f}%"
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return "unknown"


def hash_file(path: Path) -> str:
    """Read + sha256 in this process, 1 MiB at a time (what the capture's hashing costs without the copy)."""
    digest = hashlib.sha256()
    buf = bytearray(MiB)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            digest.update(view[:n])
    return digest.hexdigest()


def timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def quiet_disk() -> None:
    subprocess.run(["sync"], check=False)
    time.sleep(0.2)


def run(args: argparse.Namespace, console: Any) -> dict[str, Any]:
    machine = c.machine_info()
    size = args.size_mib * MiB
    with c.workspace(NAME, keep=False) as base:
        console.print(f"[dim]writing a {args.size_mib} MiB model under {base}[/dim]")
        model = make_model(base / "repo", size)
        weights = model / "1" / "weights.bin"
        fstype = subprocess.run(["findmnt", "-T", str(base), "-n", "-o", "FSTYPE"], capture_output=True,
                                text=True, check=False).stdout.strip() or "?"
        times: dict[str, list[float]] = {"capture": [], "capture_nofsync": [], "cp": [], "sha256sum": [],
                                         "hashlib": []}
        residency: dict[str, list[str]] = {k: [] for k in times}
        digests: set[str] = set()
        reflinks = 0
        last_store: Path | None = None

        def capture(fsync: bool) -> None:
            nonlocal reflinks, last_store
            root = base / f"store-{time.time_ns()}"
            store = ContentStore(root, fsync=fsync)
            snap = store.capture(model, MODEL)
            digests.add(snap.digest)
            reflinks += store.reflinks
            last_store = root

        steps = {
            "capture": lambda: capture(True),
            "capture_nofsync": lambda: capture(False),
            "cp": lambda: subprocess.run(["cp", str(weights), str(base / "copy.bin")], check=True),
            "sha256sum": lambda: subprocess.run(["sha256sum", str(weights)], check=True, capture_output=True),
            "hashlib": lambda: hash_file(weights),
        }
        names = list(steps)
        for r in range(args.rounds):
            order = names[r % len(names):] + names[: r % len(names)]  # rotate: nobody always goes first
            for name in order:
                (base / "copy.bin").unlink(missing_ok=True)  # untimed: remove the previous copies
                if last_store is not None and name.startswith("capture"):
                    shutil.rmtree(last_store, ignore_errors=True)
                quiet_disk()
                residency[name].append(resident(weights))
                times[name].append(timed(steps[name]))
            console.print(f"[dim]round {r + 1}/{args.rounds}: " + ", ".join(
                f"{n} {times[n][-1]:.2f} s" for n in names) + "[/dim]")
        (base / "copy.bin").unlink(missing_ok=True)

        # the store of the last capture is warm: edit only the config and capture again
        assert last_store is not None
        store = ContentStore(last_store)
        store.capture(model, MODEL)  # as the daemon: the previous snapshot is in this store
        resnap, unchanged = [], []
        read_before = store.bytes_read
        for i in range(args.edits):
            config = model / "config.pbtxt"
            text = config.read_text().split("\n# edit")[0]
            config.write_text(text + f"\n# edit {i}\n")
            resnap.append(timed(lambda: store.capture(model, MODEL)))
            unchanged.append(timed(lambda: store.capture(model, MODEL)))
        read_in_edits = store.bytes_read - read_before
        shutil.rmtree(last_store, ignore_errors=True)

    med = {k: c.median(v) for k, v in times.items()}
    report = c.base_report(NAME, args.argv, args.quick, machine)
    report.update({
        "settings": {"size_mib": args.size_mib, "rounds": args.rounds, "edits": args.edits, "filesystem": fstype,
                     "page_cache": "not dropped (warm); residency of weights.bin before each step below"},
        "times_s": {k: [round(x, 4) for x in v] for k, v in times.items()},
        "median_s": {k: round(v, 4) for k, v in med.items()},
        "throughput_mib_s": {k: round(args.size_mib / v, 1) for k, v in med.items() if v > 0},
        "residency_before": residency,
        "reflinks_used": reflinks,
        "distinct_digests": len(digests),
        "config_only_resnapshot_ms": [round(x * 1000, 2) for x in resnap],
        "unchanged_resnapshot_ms": [round(x * 1000, 2) for x in unchanged],
        "bytes_read_by_config_only_resnapshots": read_in_edits,
    })
    report["rows"] = [r.to_json() for r in rows(report)]
    return report


def rows(report: dict[str, Any]) -> list[c.Row]:
    med, thr = report["median_s"], report["throughput_mib_s"]
    size = report["settings"]["size_mib"]
    warm = ", ".join(sorted(set(report["residency_before"]["capture"])))
    out = [
        c.Row(f"first snapshot of a {size} MiB model", "tritonctl (ContentStore.capture)", c.fmt_s(med["capture"]),
              value=med["capture"], note=f"{thr.get('capture', 0):.0f} MiB/s; copy + sha256 + fsync; cache {warm} "
                                         "resident"),
        c.Row("  same, fsync off", "tritonctl (ContentStore.capture)", c.fmt_s(med["capture_nofsync"]),
              value=med["capture_nofsync"], note="informational: the cost of the flush to disk"),
        c.Row(f"cp of the {size} MiB file", "cp", c.fmt_s(med["cp"]), value=med["cp"],
              note=f"{thr.get('cp', 0):.0f} MiB/s; no fsync"),
        c.Row(f"sha256sum of the {size} MiB file", "sha256sum", c.fmt_s(med["sha256sum"]), value=med["sha256sum"],
              note=f"{thr.get('sha256sum', 0):.0f} MiB/s (coreutils)"),
        c.Row("  read + hashlib.sha256, in-process", "Python (OpenSSL)", c.fmt_s(med["hashlib"]),
              value=med["hashlib"], note=f"{thr.get('hashlib', 0):.0f} MiB/s: the capture's hashing alone"),
    ]
    ratio = med["capture"] / med["sha256sum"]
    out.append(c.Row("first snapshot / sha256sum", "tritonctl", f"{ratio:.2f}x", f"<= {TARGET_RATIO:g}x",
                     ratio <= TARGET_RATIO, f"capture / cp: {med['capture'] / med['cp']:.2f}x; "
                     f"medians of {report['settings']['rounds']} alternating rounds", value=round(ratio, 3)))
    rs = report["config_only_resnapshot_ms"]
    m = c.median(rs)
    out.append(c.Row("re-snapshot after a config-only edit (median)", "tritonctl", f"{m:.1f} ms",
                     f"<= {TARGET_RESNAPSHOT_MS:g} ms", m <= TARGET_RESNAPSHOT_MS,
                     f"max {max(rs):.1f} ms over {len(rs)} edits; {report['bytes_read_by_config_only_resnapshots']:,} "
                     "bytes read", value=round(m, 2)))
    un = report["unchanged_resnapshot_ms"]
    out.append(c.Row("re-snapshot, nothing changed (median)", "tritonctl", f"{c.median(un):.1f} ms",
                     value=round(c.median(un), 2)))
    return out


def render(report: dict[str, Any], console: Any) -> None:
    s = report["settings"]
    c.render_rows(f"snapshot cost: {s['size_mib']} MiB model on {s['filesystem']}, {s['rounds']} alternating rounds, "
                  "page cache warm (not dropped)", [c.Row(**r) for r in report["rows"]], console,
                  c.machine_line(report["machine"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="100 MiB")
    parser.add_argument("--size-mib", type=int, help="size of the big file (default 1024; 100 with --quick)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--edits", type=int, default=10, help="config-only edits re-snapshotted")

    def prepare(args: argparse.Namespace) -> None:
        args.size_mib = args.size_mib or (100 if args.quick else 1024)

    return c.bench_main(NAME, parser, argv, run, prepare=prepare, render=render, timed=True)


if __name__ == "__main__":
    sys.exit(main())
