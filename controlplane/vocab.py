"""The control plane's words, in one place: outcomes, model states, deploy steps, sync states, causes.

Each is a `str` enum (`class X(str, Enum)`, which Python 3.10 supports; `enum.StrEnum` needs 3.11), so a
member *is* its string: it compares equal to it, JSON-encodes to it and is stored in the registry as
it. The values are a contract (registry columns, `--json` documents, metrics labels): add members,
never rename one.
"""

from __future__ import annotations

from enum import Enum


class Word(str, Enum):
    """A str enum whose str() and format() are its value on every Python version."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Result(Word):
    """How an operation (deploy, rollback, unload, restore, rollout) ended; also audit outcomes."""

    OK = "ok"
    NOOP = "noop"
    FAILED = "failed"
    ROLLED_BACK = "rolled_back"
    INVALID = "invalid"  # audit only: a snapshot recorded invalid, a quarantined digest skipped
    SKIPPED = "skipped"  # audit only: a held host's rollout step
    INCONCLUSIVE = "inconclusive"  # audit only: a bake that ended with too few requests (controlplane/bake/baker.py)
    WARNING = "warning"  # audit only: a bake's warning, a load or footprint over its ratio (controlplane/bake/warn.py)


SUCCEEDED = (Result.OK, Result.NOOP)


class ModelState(Word):
    """A model's state in the registry."""

    NEW = "new"
    SERVING = "serving"
    DEGRADED = "degraded"
    FAILED = "failed"
    UNLOADED = "unloaded"


# A validation problem's severity (validate --json "severity"): an error refuses the content.
ERROR = "error"
WARNING = "warning"

# Registry states in which a model is meant to be loaded in Triton.
SERVING_STATES: tuple[str, ...] = (ModelState.SERVING.value, ModelState.DEGRADED.value)

# The audit actor of what the source's watcher (or a start-up scan) did, not an operator.
WATCHER_ACTOR = "watcher"
# The audit actor of a bake's own rollback (controlplane/bake/baker.py): it holds the model like an operator's.
BAKE_ACTOR = "tritonctl:bake"
# A model's last_error starts with this when the source's content was refused at capture (a symlink out
# of the repository, over max_model_bytes, a fifo, ...): status shows it `invalid` until a capture succeeds.
CAPTURE_REFUSED = "capture refused: "
# How a digest held back by its own smoke test is told (a quarantine reason that starts so: status says it, not
# `invalid`, for the content validates; controlplane/views/sync.py)
SMOKE_FAILED = "smoke test failed: "


class DeployStep(Word):
    """A step of an operation as streamed to the CLI (`Progress.step`)."""

    VALIDATE = "validate"
    DEPLOY = "deploy"
    PUBLISH = "publish"
    LOAD = "load"
    VERIFY = "verify"
    SMOKE = "smoke"
    COMMIT = "commit"
    ROLLBACK = "rollback"
    UNLOAD = "unload"
    MEMBER = "member"


class RecordedStep(Word):
    """The step a deployment has reached in the registry (what crash recovery reads)."""

    INTENT = "intent"
    PUBLISHED = "published"
    LOADED = "loaded"
    VERIFIED = "verified"
    ROLLING_BACK = "rolling_back"


class StepState(Word):
    """The state of one streamed step."""

    START = "start"
    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"


class SyncState(Word):
    """`status`'s sync column: is what serves the source's newest content (controlplane.views.sync)."""

    SYNCED = "synced"
    PENDING = "pending"
    HELD = "held"
    INVALID = "invalid"
    REMOVED = "removed"


class Cause(Word):
    """Whose fault a failed operation is (controlplane.deploy.causes): the content's is quarantined, the
    environment's is retried with backoff, an unreachable tritonserver exits 4 in the CLI."""

    NONE = ""
    CONTENT = "content"
    ENVIRONMENT = "environment"
    TRITON_UNREACHABLE = "triton_unreachable"
    ANALYSIS = "analysis"  # live traffic failed a bake (controlplane/bake/baker.py): rolled back, not quarantined
    # the digest's own smoke requests failed (a wrong answer, or a failure no other request shared): rolled back
    # and held back (quarantined), but its content validates: `status` says its smoke test failed, not invalid
    SMOKE = "smoke"
    # its smoke requests failed only in batches where other requests failed too, others passing meanwhile
    # (controlplane/deploy/smoke.py): not shown to be the content's, so not quarantined; retried with backoff
    SMOKE_SHARED = "smoke_shared"

    @property
    def retried(self) -> bool:
        """Not the content's fault: the control plane deploys it again later."""
        return self in (Cause.ENVIRONMENT, Cause.TRITON_UNREACHABLE, Cause.SMOKE_SHARED)

    @property
    def quarantines(self) -> bool:
        """The content's own failure: its digest is held back until `load --force`."""
        return self in (Cause.CONTENT, Cause.SMOKE)


class Policy(Word):
    AUTO = "auto"
    MANUAL = "manual"
    INHERIT = "inherit"
    ONDEMAND = "ondemand"  # recorded and validated, loaded only when ensured (controlplane/memory/ondemand.py)


# The two things a footprint and a memory budget count, by their attribute names (controlplane/memory/
# footprint.py measures them; store/placements.py and the fleet's placement record them per host).
MEMORY = "memory_mb"
GPU = "gpu_memory_mb"
MEMORY_KINDS = (MEMORY, GPU)


class Role(Word):
    """Who may do what on the control API (docs/operations.md "Identities and roles"): each role may do all
    that the roles before it may. `viewer` reads, `deployer` changes what serves, `admin` the rest."""

    VIEWER = "viewer"
    DEPLOYER = "deployer"
    ADMIN = "admin"

    @property
    def rank(self) -> int:
        return ROLES.index(self)

    def allows(self, needed: Role) -> bool:
        return self.rank >= needed.rank


ROLES: tuple[Role, ...] = (Role.VIEWER, Role.DEPLOYER, Role.ADMIN)
