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

A round whose index is the very list of the round before (the Triton client hands back the same list
while the index is unchanged), with the same registry view and no note since, changed nothing a round
can see but the slice: it re-reads the slice and the models that did not match, and when they read as
before it returns the same `served` dict (and `public` the same filtered lists), so a reconcile over
them can keep its plan: an idle round costs no per-model work (issue 39, item 3).

A deploy, rollback or restore that ended OK has just read the served digest itself (its
verification): `note` hands that reading on, so the first round after a start that deployed N models
does not read N configs again (5,000 at 5,000 models: the first `status` after such a start took
seconds, issue 26). A note newer than a round's index call outlives that round's own readings.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from controlplane.errors import TritonctlError
from controlplane.names import is_private_name
from controlplane.triton.client import IndexEntry

if TYPE_CHECKING:
    from controlplane.store.records import ModelRecord

RECHECK_PER_ROUND = 10


class _Triton(Protocol):
    def index(self) -> list[IndexEntry]: ...

    def served_digest(self, model: str) -> str | None: ...


@dataclass(frozen=True)
class _Round:
    """What a full round saw: its index list, the registry view it compared, the note count when it began,
    what it returned, the READY names and those whose digest was not the one wanted."""

    index: list[IndexEntry]
    wanted: Mapping[str, str | None]
    began: int
    served: dict[str, str | None]
    ready: list[str]
    mismatched: list[str]


class ServedView:
    """The repository index plus each READY model's served digest, read as little as it can be."""

    def __init__(self, recheck_per_round: int = RECHECK_PER_ROUND,
                 routes: Callable[[], Mapping[str, Any]] | None = None) -> None:
        self.recheck_per_round = recheck_per_round
        # with a gateway: public model -> its route's Target (name, digest), controlplane/deploy/aliases.py.
        # Triton then knows only private names; `public` answers in public names through the routes.
        self.routes = routes
        self._known: dict[str, str | None] = {}  # READY last round -> digest read then
        self._cursor = 0
        self._lock = threading.Lock()
        self._seq = 0  # notes so far
        self._notes: dict[str, tuple[int, str | None]] = {}  # model -> (seq, digest) noted since a round began
        self.calls_last_round = 0  # served-digest calls made by the last view() (bench/scale.py reads it)
        self._last: _Round | None = None
        self._wanted_of: tuple[Any, dict[str, str | None]] | None = None  # (models list, its digests)
        self._public: tuple[Any, ...] | None = None
        self._routed_wanted: tuple[Any, Any, dict[str, str | None] | None] | None = None

    def _name(self, model: str) -> str:
        """The name Triton serves `model` under (its route's private name with a gateway)."""
        if self.routes is None:
            return model
        target = self.routes().get(model)
        return target.name if target is not None else model

    def assume(self, digests: Mapping[str, str | None]) -> None:
        """Take `digests` as what Triton serves, without asking it: a daemon restarted over the
        tritonserver it launched (adopted: only it holds the key that loads models) knows what it left
        serving, so a restart with nothing changed costs one index call, not one call per model.
        The rotating recheck slice still reads every model again over the following rounds."""
        with self._lock:
            self._known = {self._name(model): digest for model, digest in digests.items()}
            self._last = None

    def note(self, model: str, digest: str | None) -> None:
        """Triton was just verified to serve `digest` for `model` (a deploy's, rollback's or restore's
        own reading of the stamped config, after its load): taken as read, as a round's reading is."""
        name = self._name(model)
        with self._lock:
            self._seq += 1
            self._known[name] = digest
            self._notes[name] = (self._seq, digest)

    def public(
        self, triton: _Triton, models: Iterable[ModelRecord] | None = None, wanted: dict[str, str | None] | None = None
    ) -> tuple[list[IndexEntry], dict[str, str | None]]:
        """`view` without a change set's private step names, which are no models of their own
        (controlplane/intake/changeset.py). `models`: the registry's view (None: read every digest); `wanted`:
        every model's active digest when `models` is only some (a digest missing from it is read fresh)."""
        if wanted is None and models is not None:
            memo = self._wanted_of  # the registry's serving list is one shared list until it changes
            if memo is None or memo[0] is not models:
                memo = self._wanted_of = (models, {m.name: m.active_digest for m in models})
            wanted = memo[1]
        if self.routes is not None:
            return self._routed(triton, wanted)
        index, served = self.view(triton, wanted)
        kept = self._public
        if kept is not None and kept[0] is index and kept[1] is served:
            return kept[2], kept[3]
        out = [e for e in index if not is_private_name(e.name)], {
            name: digest for name, digest in served.items() if not is_private_name(name)}
        self._public = (index, served, *out)
        return out

    def _routed(self, triton: _Triton, wanted: Mapping[str, str | None] | None,
                ) -> tuple[list[IndexEntry], dict[str, str | None]]:
        """`public` through the gateway's routes: each routed model's index entries and served digest are its
        private name's, under its public name; unrouted private names are no model's (they drain)."""
        assert self.routes is not None
        targets = self.routes()
        memo = self._routed_wanted
        if memo is None or memo[0] is not targets or memo[1] is not wanted:
            private = None if wanted is None else {t.name: wanted.get(m) for m, t in targets.items()}
            memo = self._routed_wanted = (targets, wanted, private)
        index, served = self.view(triton, memo[2])
        kept = self._public
        if kept is not None and kept[0] is index and kept[1] is served and kept[2] is targets:
            return kept[3], kept[4]
        public_of = {t.name: m for m, t in targets.items()}
        entries = [IndexEntry(public_of[e.name], e.version, e.state, e.reason) if e.name in public_of else e
                   for e in index if e.name in public_of or not is_private_name(e.name)]
        digests = {public_of.get(name, name): digest for name, digest in served.items()
                   if name in public_of or not is_private_name(name)}
        self._public = (index, served, targets, entries, digests)
        return entries, digests

    def view(
        self, triton: _Triton, wanted: Mapping[str, str | None] | None = None
    ) -> tuple[list[IndexEntry], dict[str, str | None]]:
        """The index and {READY model: served digest}. `wanted`: the registry's digest per model
        (None: read every READY model's digest fresh, the old behaviour)."""
        with self._lock:
            began = self._seq  # notes after this are newer than the index below
        index = triton.index()
        readings: dict[str, str | None] = {}  # read by the check below: a full round takes them as read
        if wanted is not None and (same := self._unchanged(triton, index, wanted, began, readings)) is not None:
            return index, same
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
            if name in readings:
                served[name] = readings[name]
                fresh.add(name)
            elif name in fresh:
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
            self._last = None if wanted is None else _Round(
                index, wanted, began, served, ready, [n for n in ready if served[n] != wanted.get(n)])
        return index, served

    def _unchanged(self, triton: _Triton, index: list[IndexEntry], wanted: Mapping[str, str | None],
                   began: int, readings: dict[str, str | None]) -> dict[str, str | None] | None:
        """The last round's `served` when this round can see nothing else: the same index list and
        registry view, no note since that round began, and its mismatched models and this round's slice
        read as before. None: a full round is needed (what was read is left in `readings`)."""
        with self._lock:
            last = self._last
            if last is None or last.index is not index or last.wanted is not wanted or last.began != began:
                return None
            start = self._cursor % len(last.ready) if last.ready else 0
            count = min(self.recheck_per_round, len(last.ready))
            reread = [*last.mismatched, *(last.ready + last.ready)[start:start + count]]
        for name in reread:
            try:
                digest = triton.served_digest(name)
            except TritonctlError:
                digest = None
            readings[name] = digest
            if digest != last.served.get(name):
                return None
        with self._lock:
            if self._seq != began or self._last is not last:  # a note, or another round, meanwhile
                return None
            self._cursor = start + count
            self.calls_last_round = len(reread)
        return last.served
