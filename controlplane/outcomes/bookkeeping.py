"""What this host keeps of each finished operation, beside the registry's rows: the last action (systemd's
STATUS= line, `status`), which ensembles serve (change sets group by it), the retries an environment
fault owes, the restores the reconcile owes, and the digest each model was last verified serving.

A subscriber of controlplane/outcomes/bus.py (the first one, so the others read it up to date); it changes
no deploy and calls nothing back.
"""

from __future__ import annotations

import logging

from controlplane.deploy.causes import RetryBook
from controlplane.deploy.plans import ACTION as CHANGESET
from controlplane.deploy.servedview import ServedView
from controlplane.deploy.servingensembles import ServingEnsembles
from controlplane.documents.results import Outcome
from controlplane.outcomes.counters import Counters
from controlplane.vocab import Cause, Result

log = logging.getLogger("tritonctl.plane")


class Bookkeeping:
    """An `Outcomes` subscriber (see the module docstring)."""

    def __init__(self, counters: Counters, serving_ensembles: ServingEnsembles, retries: RetryBook,
                 restores: RetryBook, served_view: ServedView) -> None:
        self.counters = counters
        self.serving_ensembles = serving_ensembles
        self.retries = retries
        self.restores = restores
        self.served_view = served_view

    def note(self, outcome: Outcome) -> None:
        self.counters.last_action = f"{outcome.action} {outcome.model}: {outcome.outcome}"
        if outcome.action != CHANGESET:  # a set's members each end with their own outcome
            self.serving_ensembles.note(outcome.model, outcome.active_digest)
        if outcome.action in ("deploy", "rollback"):
            if outcome.retried and outcome.digest:
                retry = self.retries.failed(outcome.model, outcome.digest, outcome.message)
                log.warning("%s: not the content's fault; retry %d in %d s", outcome.model, retry.attempt,
                            retry.seconds_left())
            elif outcome.outcome != Result.FAILED or outcome.cause == Cause.CONTENT:
                self.retries.clear(outcome.model)
        if outcome.outcome == Result.OK and outcome.action == "unload":
            self.retries.clear(outcome.model)  # an operator's unload: nothing retries what it took out
        if outcome.outcome == Result.OK and outcome.action in ("deploy", "rollback", "restore", "unload"):
            self.restores.clear(outcome.model)  # it serves what the registry says now (or nothing, meant)
        if (outcome.outcome == Result.OK and outcome.action in ("deploy", "rollback", "restore")
                and outcome.active_digest):
            self.served_view.note(outcome.model, outcome.active_digest)  # its verification read it just now
