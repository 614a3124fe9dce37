"""An ensemble's step models as the daemon knows them, for the capture and pre-deploy checks.

The daemon deploys one model at a time, so an ensemble's steps are other models of the registry:
their config is the one of their active snapshot (what Triton serves), else of their latest valid
snapshot (what they will serve); for a step whose model completes its config at load, the config
Triton completed, once a load recorded it (before that, the checks that need it wait, with a warning).
A map key or a type that does not fit that config is the ensemble's content fault (`member_problems`,
recorded with the snapshot); a step model that the daemon does not serve is an environment fault
(`require_members` raises EnvironmentFault: deploying the step first fixes it, and the ensemble's
digest must not be quarantined for it). `step_models` lists the models an ensemble needs, for `load`
(members first) and `unload --dependents`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from controlplane.errors import EnvironmentFault, ModelConfigError
from controlplane.store.records import SnapshotRecord
from controlplane.store.registry import Registry
from controlplane.validation.autocomplete import completes_at_load
from controlplane.validation.completions import completed_config, completes
from controlplane.validation.ensembles import EnsembleFinding, StepModel, as_config, check_ensemble_members, is_ensemble
from controlplane.vocab import SERVING_STATES


def step_models(config: dict[str, Any] | None) -> list[str]:
    """The ensemble's composing models in step order, each once; [] for a model that is no ensemble."""
    if not config or config.get("platform") != "ensemble":
        return []
    names: list[str] = []
    for step in (config.get("ensemble_scheduling") or {}).get("step", []):
        name = step.get("model_name")
        if name and name not in names:
            names.append(name)
    return names


def _step_model(registry: Registry, name: str, digest: str, config: dict[str, Any], served: Sequence[int],
                completing: bool) -> StepModel:
    """The step model of a content: its recorded config, or the one Triton completed for a content whose
    model completes it at load (`pending` until a load recorded it)."""
    if completing:
        done = completed_config(registry, name, digest)
        if done is None:
            return StepModel(as_config(config), served, pending=True)
        return StepModel(as_config(done), served)
    return StepModel(as_config(config), served)


def _served_step(registry: Registry, name: str, digest: str) -> StepModel | None:
    """The step model a recorded content makes, parsed once per digest (Registry.contents; a pending one
    is not kept: its completed config comes with its load)."""
    def parse() -> tuple[StepModel | None, bool]:
        config, served = registry.snapshot_content(name, digest)
        if config is None:
            return None, True
        step = _step_model(registry, name, digest, config, served, completes(registry, name, digest))
        return step, not step.pending

    step: StepModel | None = registry.contents.get(("step", name, digest), parse)
    return step


def _member(registry: Registry, name: str, *, served_only: bool,
            overrides: Mapping[str, SnapshotRecord] | None = None) -> StepModel | None:
    override = (overrides or {}).get(name)
    if override is not None and override.config is not None:  # a change set's member: its new content
        return _step_model(registry, name, override.digest, override.config, override.served_versions,
                           completes_at_load(override.problems))
    record = registry.find_model(name)
    if record is None or record.removed_at is not None:
        return None
    if record.active_digest and record.state in SERVING_STATES:
        step = _served_step(registry, name, record.active_digest)
        if step is not None:
            return step
    if served_only:
        return None
    for snap in registry.list_snapshots(name):  # newest first
        if snap.valid and snap.config is not None:
            return _step_model(registry, name, snap.digest, snap.config, snap.served_versions,
                               completes_at_load(snap.problems))
    return None


def _findings(registry: Registry, model: str, config: dict[str, Any] | None, *,
              served_only: bool, overrides: Mapping[str, SnapshotRecord] | None = None) -> list[EnsembleFinding]:
    if config is None or config.get("platform") != "ensemble":  # no ensemble: not parsed back (issue 39)
        return []
    parsed = as_config(config)
    if not is_ensemble(parsed):
        return []
    return check_ensemble_members(parsed, model, lambda name: _member(registry, name, served_only=served_only,
                                                                           overrides=overrides))


def member_problems(registry: Registry, model: str, config: dict[str, Any] | None,
                     overrides: Mapping[str, SnapshotRecord] | None = None) -> list[dict[str, str]]:
    """The ensemble's problems against its step models' recorded configs, as snapshot problems;
    steps that are not in the registry yet are not the content's fault and are left out. `overrides`:
    the new snapshots of the steps that change with the ensemble in one change set."""
    return [{"file": f"{model}/config.pbtxt", "field": f.field, "message": f.message, "severity": f.severity}
            for f in _findings(registry, model, config, served_only=False, overrides=overrides)
            if not f.environment]


def require_members(registry: Registry, snap: SnapshotRecord,
                    overrides: Mapping[str, SnapshotRecord] | None = None) -> None:
    """Before deploying an ensemble: every step model served by this daemon, in the version the
    step asks for (EnvironmentFault otherwise), and fitting the ensemble (ModelConfigError)."""
    findings = _findings(registry, snap.model, snap.config, served_only=True, overrides=overrides)
    environment = [f for f in findings if f.environment]
    if environment:
        f = environment[0]
        why = f.message.replace("is not in the repository", "is not served by this daemon")
        raise EnvironmentFault(f"{snap.model}/config.pbtxt: {f.field}: {why}; deploy it first")
    content = [f for f in findings if f.severity == "error"]
    if content:
        f = content[0]
        raise ModelConfigError(f"{snap.model}/config.pbtxt: {f.field}: {f.message}")
