"""The start-up scan's capture and validation on every core: worker processes, from a batch size on.

Why: capturing a model (the scan, the copy and hash into the content store, the manifest and tree)
and validating it (config.pbtxt through protobuf's text parser, pure Python even with the upb
backend; the checks of its directory) is most of a first start's CPU, and the scan's threads ran its
Python on one core, under the GIL: a first start of 10,000 models took 42 s to READY (issue 39).
Here a changed model's capture and the `validate_model_dir` of its captured tree run in a worker
process, one per core up to `MAX_WORKERS`, eight models per task (one message each way); the daemon
keeps what needs its state: the models' capture locks (held while their worker captures), the
ensemble check against the registry's step models (`intake.validated`), the records, the counters,
and the stat cache's journal (a worker's new entries come back with its result:
`ContentStore.remember`). Measured (docs/benchmarks.md, bench/results/scale-parallel.json): the
daemon's own CPU to READY falls to a third or a quarter; the CPU of daemon and workers together
falls less, since much of a capture is the kernel's file creation, so a machine whose cores are busy
gains little in wall time.

The workers are started with `spawn`, never `fork`: the daemon runs threads by then. Starting one
costs about 0.2 s of CPU, so only a wave of `POOL_FROM` models or more uses them, and only for a
repository directory (`Source.capture_job`: the capture as data); object storage and MLflow capture
in the daemon, as before. A worker's result is the same as the daemon's own capture and validation
(the same functions; tests/test_capture_cores.py compares them); a capture that fails in a worker is
left to the model's own path, which captures it again and reports why, as a failed capture in the
daemon is. Workers that die (BrokenProcessPool) are not replaced: the rest of the scan captures in
the daemon.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import traceback
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from controlplane.documents.validation import ValidationResult
from controlplane.errors import TritonctlError
from controlplane.snapshot import ContentStore
from controlplane.source.protocol import Captured, CaptureJob
from controlplane.validation.modelconfig import validate_model_dir

log = logging.getLogger("tritonctl.startcores")

POOL_FROM = 200  # changed models in a wave from which worker processes pay for their start
# at most this many workers: the daemon's own part of each model (the records, the ensemble check, about
# a third of the CPU a worker spends on it) keeps a few busy, and each worker holds ~30 MB while it runs
MAX_WORKERS = 8


def cpu_count() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass(frozen=True)
class StoreSpec:
    """A content store as a worker opens it: the daemon's, without a stat cache journal of its own."""

    root: str
    fsync: bool
    max_model_bytes: int | None


@dataclass
class Done:
    """A worker's capture and validation of one model."""

    captured: Captured | None
    result: ValidationResult | None
    failure: str = ""  # why the capture failed: the model's own path captures it again and says so
    unexpected: bool = False  # a bug, not a refusal: its traceback is `failure`
    remembered: list[tuple[str, str]] = field(default_factory=list)  # new stat cache entries
    files_read: int = 0
    bytes_read: int = 0


_stores: dict[StoreSpec, ContentStore] = {}  # a worker's store, opened once


def _store(spec: StoreSpec) -> ContentStore:
    store = _stores.get(spec)
    if store is None:
        store = _stores[spec] = ContentStore(Path(spec.root), fsync=spec.fsync, max_model_bytes=spec.max_model_bytes,
                                             journal=False)
    return store


def capture_and_validate(spec: StoreSpec, jobs: list[CaptureJob]) -> list[Done]:
    """In a worker: each job's capture into the store and the validation of its tree (what the daemon's
    `snapshot_source` and `validate_model_dir` do)."""
    return [_capture_and_validate(_store(spec), job) for job in jobs]


def _capture_and_validate(store: ContentStore, job: CaptureJob) -> Done:
    files, read = store.files_read, store.bytes_read
    try:
        with store.deferred_sync():  # the daemon syncs the store's filesystem before it records
            captured = job.run(store)
        result = validate_model_dir(store.tree_path(captured.snapshot.digest), name=job.model)
        return Done(captured, result, remembered=store.take_remembered(), files_read=store.files_read - files,
                    bytes_read=store.bytes_read - read)
    except (TritonctlError, OSError) as exc:
        failure, unexpected = str(exc), False
    except Exception:  # noqa: BLE001 - one model's bug must not stop the others': the daemon logs it
        failure, unexpected = traceback.format_exc(), True
    return Done(None, None, failure, unexpected, store.take_remembered(), store.files_read - files,
                store.bytes_read - read)


class Cores:
    """The worker processes of one start-up wave (a context manager), or none: below `POOL_FROM`
    models, on one core, or after the workers died. `threads`: the threads that wait on the workers,
    one per capture in flight (a model's capture lock is held while its worker captures)."""

    def __init__(self, store: ContentStore, models: int, *, workers: int | None = None,
                 pool_from: int = POOL_FROM) -> None:
        self.store = store
        self.workers = workers or min(cpu_count(), MAX_WORKERS)
        self._spec = StoreSpec(str(store.root), store.fsync, store.max_model_bytes)
        self._pool: ProcessPoolExecutor | None = None  # None once no worker can capture
        self._started: ProcessPoolExecutor | None = None
        self.threads: Executor | None = None
        self._lock = threading.Lock()
        if models >= pool_from and self.workers > 1:
            try:
                self._pool = self._started = ProcessPoolExecutor(self.workers,
                                                                 mp_context=multiprocessing.get_context("spawn"))
            except (OSError, ImportError, NotImplementedError) as exc:  # no working semaphores (/dev/shm)
                log.warning("start-up scan: no capture workers (%s); capturing in the daemon", exc)
                return
            self.threads = ThreadPoolExecutor(2 * self.workers, thread_name_prefix="startcores")

    @property
    def active(self) -> bool:
        return self._pool is not None

    def __enter__(self) -> Cores:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        if self.threads is not None:
            self.threads.shutdown(wait=True)
        with self._lock:
            pool, self._pool, self._started = self._started, None, None
        if pool is not None:
            pool.shutdown(wait=True)

    def capture_many(self, jobs: list[CaptureJob]) -> list[tuple[Captured, ValidationResult] | None] | None:
        """Each job captured and its tree validated by one worker, in one task; per job None where
        the capture failed there (an unexpected error logged). None: no worker can (the caller
        captures in the daemon)."""
        with self._lock:
            pool = self._pool
        if pool is None:
            return None
        if not jobs:
            return []
        try:
            done = pool.submit(capture_and_validate, self._spec, jobs).result()
        except (BrokenProcessPool, RuntimeError, OSError) as exc:  # a worker died or did not start: the daemon goes on
            with self._lock:
                if self._pool is pool:
                    log.warning("start-up scan: capture workers stopped (%s); capturing in the daemon", exc)
                    self._pool = None
            return None
        out: list[tuple[Captured, ValidationResult] | None] = []
        for job, one in zip(jobs, done, strict=True):
            self.store.remember(one.remembered, one.files_read, one.bytes_read)
            if one.captured is None or one.result is None:
                if one.unexpected:
                    log.error("unexpected error capturing %s at start-up:\n%s", job.model, one.failure)
                out.append(None)
            else:
                out.append((one.captured, one.result))
        return out
