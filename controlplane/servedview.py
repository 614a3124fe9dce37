"""What Triton serves, at the cost of one repository-index call per round, not one call per model.

Reconcile and `status` compare each READY model's served digest (stamped in the config Triton
serves) with the registry's. Asking Triton for every READY model's config each round is one gRPC
call per model: at 10,000 models that is the whole reconcile interval's CPU (issue 15, item 2). This
view asks for the repository index every round and keeps the digest it last read per model; it asks
Triton again only where that can have changed or matters:

- a model READY now that was not READY in the previous round (loaded, reloaded after a Triton
  restart, or new): its digest is read fresh;
- a model whose remembered digest is not the one the registry wants: read fresh before anyone acts
  on it, so a deploy between rounds is never mistaken for drift;
- and a rotating slice of the rest (`recheck_per_round`), so a change no index shows (a reload with
  a config override that stayed READY throughout) is still found within a bounded number of rounds.

A deploy, rollback or restore that ended OK has just read the served digest itself (its
verification): `note` hands that reading on, so the first round after a start that deployed N models
does not read N configs again (5,000 at 5,000 models: the first `status` after such a start took
seconds, issue 26). A note newer than a round's index call outlives that round's own readings.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Protocol

from controlplane.errors import TritonctlError
from controlplane.names import is_private_name
from controlplane.triton.client import IndexEntry

if TYPE_CHECKING:
    from controlplane.store.records import ModelRecord

RECHECK_PER_ROUND = 10


class _Triton(Protocol):
    def index(self) -> list[IndexEntry]: ...

    def served_digest(self, model: str) -> str | None: ...


class ServedView:
    """The repository index plus each READY model's served digest, read as little as it can be."""

    def __init__(self, recheck_per_round: int = RECHECK_PER_ROUND) -> None:
        self.recheck_per_round = recheck_per_round
        self._known: dict[str, str | None] = {}  # READY last round -> digest read then
        self._cursor = 0
        self._lock = threading.Lock()
        self._seq = 0  # notes so far
        self._notes: dict[str, tuple[int, str | None]] = {}  # model -> (seq, digest) noted since a round began
        self.calls_last_round = 0  # served-digest calls made by the last view() (bench/scale.py reads it)

    def assume(self, digests: Mapping[str, str | None]) -> None:
        """Take `digests` as what Triton serves, without asking it: a daemon restarted over the
        tritonserver it launched (adopted: only it holds the key that loads models) knows what it left
        serving, so a restart with nothing changed costs one index call, not one call per model.
        The rotating recheck slice still reads every model again over the following rounds."""
        with self._lock:
            self._known = dict(digests)

    def note(self, model: str, digest: str | None) -> None:
        """Triton was just verified to serve `digest` for `model` (a deploy's, rollback's or restore's
        own reading of the stamped config, after its load): taken as read, as a round's reading is."""
        with self._lock:
            self._seq += 1
            self._known[model] = digest
            self._notes[model] = (self._seq, digest)

    def public(
        self, triton: _Triton, models: Iterable[ModelRecord] | None = None, wanted: dict[str, str | None] | None = None
    ) -> tuple[list[IndexEntry], dict[str, str | None]]:
        """`view` without a change set's private step names, which are no models of their own
        (controlplane/changeset.py). `models`: the registry's view (None: read every digest); `wanted`:
        every model's active digest when `models` is only some (a digest missing from it is read fresh)."""
        if wanted is None:
            wanted = None if models is None else {m.name: m.active_digest for m in models}
        index, served = self.view(triton, wanted)
        return [e for e in index if not is_private_name(e.name)], {
            name: digest for name, digest in served.items() if not is_private_name(name)}

    def view(
        self, triton: _Triton, wanted: Mapping[str, str | None] | None = None
    ) -> tuple[list[IndexEntry], dict[str, str | None]]:
        """The index and {READY model: served digest}. `wanted`: the registry's digest per model
        (None: read every READY model's digest fresh, the old behaviour)."""
        with self._lock:
            began = self._seq  # notes after this are newer than the index below
        index = triton.index()
        ready = sorted({e.name for e in index if e.state == "READY"})
        with self._lock:
            known = self._known
            if wanted is None:
                fresh = set(ready)
            else:
                fresh = {n for n in ready if n not in known or known[n] != wanted.get(n)}
                rest = [n for n in ready if n not in fresh]
                if rest and self.recheck_per_round > 0:
                    start = self._cursor % len(rest)
                    fresh.update((rest + rest)[start:start + min(self.recheck_per_round, len(rest))])
                    self._cursor = start + self.recheck_per_round
        served: dict[str, str | None] = {}
        for name in ready:
            if name in fresh:
                try:
                    served[name] = triton.served_digest(name)
                except TritonctlError:
                    served[name] = None
            else:
                served[name] = known[name]
        with self._lock:
            known = dict(served)
            newer = {m: note for m, note in self._notes.items() if note[0] > began}
            known.update({m: digest for m, (_, digest) in newer.items()})
            self._known, self._notes = known, newer
            self.calls_last_round = len(fresh)
        return index, served
