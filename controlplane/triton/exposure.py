"""Whether other local users can read a launched tritonserver's command line, and with it its key.

Why: Triton takes its restricted-protocol key only on its command line (`--grpc-restricted-protocol`,
`--http-restricted-api`; no variable, file or API takes it: docs/operations.md, "The Triton key"), and
`/proc/PID/cmdline` is readable by every local user unless `/proc` is mounted with `hidepid`. Whoever
holds the key can load a python model, whose code runs as the daemon's user. The daemon asks this before
it launches (or adopts) a tritonserver: it warns, or with `launch_triton_exposed_key = "refuse"` it
refuses to start.

The mount table read is PID 1's when this process may read it (what users who log in see), else this
process's own. Of several procfs instances stacked on `/proc` the first counts: a service manager's
private instance (systemd's `ProtectProc=` in a unit's own namespace) hides other users' processes
from the service, not the service's processes from other users.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# hidepid values under which a user cannot read another user's /proc/PID/cmdline (numbers: before Linux 5.8)
HIDING = frozenset({"1", "2", "4", "noaccess", "invisible", "ptraceable"})
HOW_TO_HIDE = "mount /proc with hidepid=invisible, docs/operations.md \"The Triton key\""


@dataclass(frozen=True)
class KeyExposure:
    """`exposed`: other local users can read the command line; `reason`: why, in one line."""

    exposed: bool
    reason: str


def proc_mount_options(mountinfo: str) -> dict[str, str] | None:
    """The options (mount and superblock) of the first procfs mounted at /proc in a mountinfo text."""
    for line in mountinfo.splitlines():
        before, sep, after = line.partition(" - ")
        head, tail = before.split(), after.split()
        if not sep or len(head) < 6 or len(tail) < 3 or head[4] != "/proc" or tail[0] != "proc":
            continue
        options: dict[str, str] = {}
        for option in f"{head[5]},{tail[2]}".split(","):
            key, _, value = option.partition("=")
            options[key] = value
        return options
    return None


def key_exposure(proc: Path = Path("/proc")) -> KeyExposure:
    """Whether users other than this process's can read the command line of a process it starts."""
    text = None
    for table in ("1/mountinfo", "self/mountinfo"):
        try:
            text = (proc / table).read_text()
            break
        except OSError:
            continue
    options = proc_mount_options(text or "")
    if options is None:
        return KeyExposure(True, "no /proc mount in the mount table: other local users may read tritonserver's "
                                 f"command line, which holds its key ({HOW_TO_HIDE})")
    hidepid = options.get("hidepid", "")
    if hidepid in HIDING:
        group = options.get("gid")
        but = f" (but members of group {group}, its gid= option, can)" if group else ""
        return KeyExposure(False, f"/proc is mounted hidepid={hidepid}: other local users cannot read "
                                  f"tritonserver's command line{but}")
    return KeyExposure(True, "/proc is not mounted with hidepid: every local user can read tritonserver's "
                             f"command line, which holds the key that lets a caller load code into it ({HOW_TO_HIDE})")
