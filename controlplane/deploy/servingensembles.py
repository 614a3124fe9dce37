"""Which ensembles serve now, over which steps: the map change sets group by and reconcile orders by.

Why: forming a change set (controlplane/intake/changeset.py) asks which serving ensembles sit over a changed
step, and reconcile restores and recovers steps before the ensembles over them. Both read the same
map, kept here: read from the registry once, then kept up to date from every deploy outcome, so a
settle costs no registry scan (10,000 models at start-up). A model serving its newest recorded
source content takes its steps from the source graph (controlplane/source/recorded.py), without a query.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from controlplane.deploy.plans import Member, order
from controlplane.deploy.publish import ServingRepository
from controlplane.errors import TritonctlError
from controlplane.snapshot import CONFIG_FILE
from controlplane.source.recorded import SourceGraph
from controlplane.store.registry import Registry
from controlplane.validation.ensemblemembers import step_models
from controlplane.validation.modelconfig import is_ensemble_text, parse_config_text
from controlplane.vocab import SERVING_STATES


def step_names(serving: ServingRepository, name: str) -> list[str]:
    """The step names the tree published as `name` points at (an ensemble's; [] for any other model)."""
    tree = serving.current(name)
    if tree is None:
        return []
    try:
        text = (tree / CONFIG_FILE).read_text(errors="replace")
        if not is_ensemble_text(text):
            return []
        return list(dict.fromkeys(s.model_name for s in parse_config_text(text, CONFIG_FILE).ensemble_scheduling.step))
    except (OSError, TritonctlError):
        return []


class ServingEnsembles:
    """Each serving ensemble and the steps its active config names (see the module docstring)."""

    def __init__(self, registry: Registry, graph: SourceGraph, serving: ServingRepository) -> None:
        self.registry = registry
        self.graph = graph
        self.serving = serving
        self._guard = threading.Lock()
        self._serving: dict[str, list[str]] | None = None  # serving ensemble -> steps (None: not read yet)

    def get(self) -> dict[str, list[str]]:
        """Each serving ensemble and its steps (a copy)."""
        with self._guard:
            if self._serving is not None:
                return dict(self._serving)
        out: dict[str, list[str]] = {}
        for record in self.registry.list_models(states=SERVING_STATES):
            if not record.active_digest:
                continue
            entry = self.graph.entry(record.name)
            if entry is None or entry.digest != record.active_digest:
                tree = self.serving.current(record.name)
                try:  # the published config says cheaply which ones are ensembles; only those are looked up
                    if tree is not None and not is_ensemble_text((tree / CONFIG_FILE).read_text(errors="replace")):
                        continue
                except OSError:
                    pass
            steps = self._steps(record.name, record.active_digest)
            if steps:
                out[record.name] = steps
        with self._guard:
            self._serving = out
        return dict(out)

    def _steps(self, model: str, digest: str) -> list[str]:
        """The steps the content `digest` of `model` names: from the source graph when that is the
        model's newest recorded source content (no query), else from its recorded config."""
        entry = self.graph.entry(model)
        if entry is not None and entry.digest == digest:
            return list(entry.steps or [])
        return step_models(self.registry.snapshot_content(model, digest)[0])

    def warm(self) -> None:
        """Read the map now (after the start-up scan), not at the first edit."""
        self.get()

    def note(self, model: str, active_digest: str | None) -> None:
        """A deploy, rollback, restore or unload of `model` ended: it serves `active_digest` now."""
        with self._guard:
            if self._serving is None:
                return
        try:
            steps = self._steps(model, active_digest) if active_digest else []
        except TritonctlError:
            steps = []
        with self._guard:
            if self._serving is None:
                return
            if steps:
                self._serving[model] = steps
            else:
                self._serving.pop(model, None)

    def steps_first(self, models: Sequence[str]) -> list[str]:
        """`models` with every ensemble after the models it names (stable otherwise): what reconcile
        restores and recovers in, so an ensemble never loads over steps that do not serve yet."""
        if not models:
            return []
        serving = self.get()
        members = [Member(m, "", None, m in serving, serving.get(m, [])) for m in dict.fromkeys(models)]
        return [m.model for m in order(members)]

    def levels(self, models: Sequence[str]) -> list[list[str]]:
        """`models` in waves that may load at once: first every model that needs none of the others,
        then the ensembles over those, and so on (nested ensembles after their inner ones)."""
        serving = self.get()
        wanted = list(dict.fromkeys(models))
        within = set(wanted)
        depth: dict[str, int] = {}

        def level(model: str, chain: frozenset[str]) -> int:
            if model not in depth:
                inner = [s for s in serving.get(model, []) if s in within and s not in chain and s != model]
                depth[model] = 1 + max((level(s, chain | {model}) for s in inner), default=-1)
            return depth[model]

        waves: dict[int, list[str]] = {}
        for model in wanted:
            waves.setdefault(level(model, frozenset()), []).append(model)
        return [waves[k] for k in sorted(waves)]
