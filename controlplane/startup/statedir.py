"""The daemon's state directory: its layout, and the lock that keeps it to one daemon.

`<state>/` holds the content store (`store/`), the trees Triton reads (`serving/`, `published/`), a
launched tritonserver's working directory (`triton/`), the registry of a single host (`registry.db`) and
`daemon.lock`, flock-ed by the daemon that runs on it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

from controlplane.snapshot.fsutil import ensure_dir
from controlplane.startup import preflight

LOCK_FILE = preflight.LOCK_FILE
SUBDIRECTORIES = ("store", "serving", "published", "triton")
STATE_MODE = 0o750  # the state directory and its parts: its group (tritonserver) reads, nobody else


class StateDir:
    """One daemon's hold on its state directory (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock: IO[str] | None = None  # <state>/daemon.lock, held while this daemon runs

    def prepare(self) -> None:
        """Create the directory and its parts (0750 each, whatever the umask: issue 58), and take its lock
        (a second daemon is refused)."""
        self.path.mkdir(parents=True, exist_ok=True)
        os.chmod(self.path, STATE_MODE)
        self.lock()
        for sub in SUBDIRECTORIES:
            ensure_dir(self.path / sub, STATE_MODE)

    def lock(self) -> None:
        """One daemon per state directory: a second one would adopt the first one's tritonserver and
        take its control socket. An flock, so the kernel releases it when the holder dies, SIGKILL too;
        the file is opened close-on-exec, so a launched tritonserver never inherits it."""
        handle = os.fdopen(os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640), "r+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = handle.read().strip() or "?"
            handle.close()
            raise preflight.in_use_error(self.path, holder) from None
        handle.truncate(0)
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._lock = handle

    def unlock(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None
