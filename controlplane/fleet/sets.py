"""Change sets in the fleet: which of a host's rollout steps belong together, and in what order.

Why: the fleet rolls out one model per rollout, but an ensemble and the steps that change with it
(a renamed intermediate tensor) only serve consistently as one unit (controlplane/deploy/plans.py). The
leader proposes a set's rollouts steps first (so their ids, and every host's steps, come in that
order); a host's agent deploys the steps it claimed that are connected through ensembles as one
change set, with the host's own staged switch (the old pipeline answering until the new one does),
and everything else steps before ensembles. Connection is read from the shared registry's snapshot
configs, so it holds for content no host serves yet.
"""

from __future__ import annotations

from collections.abc import Sequence

from controlplane.deploy.plans import Member, order
from controlplane.errors import TritonctlError
from controlplane.store.records import Step
from controlplane.store.registry import Registry
from controlplane.validation.ensemblemembers import step_models


def members(registry: Registry, pairs: Sequence[tuple[str, str]]) -> list[Member]:
    """(model, digest) pairs as change-set members, their steps from the shared registry's configs."""
    out = []
    for model, digest in pairs:
        try:
            config = registry.get_snapshot(model, digest).config if digest else None
        except TritonctlError:
            config = None
        steps = step_models(config)
        out.append(Member(model, digest, None, bool(steps) or (config or {}).get("platform") == "ensemble", steps))
    return out


def steps_first(registry: Registry, pairs: Sequence[tuple[str, str]]) -> list[str]:
    """The models of `pairs`, every ensemble after the models it names (stable otherwise)."""
    return [m.model for m in order(members(registry, pairs))]


def connected(items: Sequence[Member]) -> list[list[Member]]:
    """`items` split into groups connected through ensembles (an ensemble with the steps it names
    among them), each group in dependency order, groups in the order of their first member."""
    names = {m.model for m in items}
    parent = {m.model: m.model for m in items}

    def root(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    for member in items:
        for step in member.steps:
            if step in names:
                parent[root(step)] = root(member.model)
    groups: dict[str, list[Member]] = {}
    for member in items:
        groups.setdefault(root(member.model), []).append(member)
    return [order(group) for group in groups.values()]


def related(registry: Registry, mine: Sequence[Member], others: Sequence[tuple[str, str]]) -> list[str]:
    """Models of `others` connected to `mine` through ensembles, transitively (a step and the ensemble
    over it, and that ensemble's other steps)."""
    names = {m.model for m in mine}
    extra = [m for m in members(registry, others) if m.model not in names]
    out: list[str] = []
    for group in connected([*mine, *extra]):
        if names & {m.model for m in group}:
            out.extend(m.model for m in group if m.model not in names)
    return sorted(out)


def batches(steps: Sequence[Step], registry: Registry) -> list[list[Step]]:
    """Claimed steps as batches to run: each group connected through ensembles (two or more) one
    batch, in dependency order; lone steps first, then the sets, then lone ensembles."""
    if len({s.model for s in steps}) < len(steps):  # one model twice (a deploy and a rollback): in claim order
        return [[s] for s in steps]
    by_model = {s.model: s for s in steps}
    groups = connected(members(registry, [(s.model, s.digest or "") for s in steps]))
    sets = [[by_model[m.model] for m in g] for g in groups if len(g) > 1]
    lone = [g[0] for g in groups if len(g) == 1]
    return ([[by_model[m.model]] for m in lone if not m.ensemble] + sets
            + [[by_model[m.model]] for m in lone if m.ensemble])
