"""What the daemon process sets for itself before it creates anything: its umask and its file limit.

Why (issue 58, items 1 and 4): the daemon trusted what it was started with. Under umask 002 the
directories and files it made (`triton/`, the python backend stub, `store/`, `bakes.json`) were writable by
the state directory's group, whose members could then replace the stub the daemon's tritonserver runs;
and under systemd's default soft file limit, 1,024, a few hundred idle connections were enough to make
every `open` fail. So, at start: umask 027 (nothing it creates is writable by its group or open to others;
each file and directory is also given an explicit mode where it is made), and the soft limit on open files
raised to the hard limit (systemd's default hard limit is 524,288). Both are process-wide, so they are set
once, from `tritonctl daemon`, before any thread starts.
"""

from __future__ import annotations

import os
import resource

DAEMON_UMASK = 0o027
# Linux refuses a soft limit above /proc/sys/fs/nr_open (1,048,576 by default) even when the hard limit is
# "unlimited": the largest soft limit tried then.
NR_OPEN_DEFAULT = 1 << 20


def set_umask() -> int:
    """The daemon's umask (027); returns the one it was started with."""
    return os.umask(DAEMON_UMASK)


def raise_file_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard one (at most nr_open); returns (soft before, soft now)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else _nr_open()
    if soft != resource.RLIM_INFINITY and soft >= wanted:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError):
        return soft, soft
    return soft, wanted


def _nr_open() -> int:
    try:
        with open("/proc/sys/fs/nr_open", encoding="ascii") as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return NR_OPEN_DEFAULT


def harden() -> tuple[int, int, int]:
    """Set the umask and raise the file limit (see the module docstring): (the umask it was started with,
    the soft file limit before, the soft file limit now)."""
    return (set_umask(), *raise_file_limit())
