"""tritonctl's core: watch a model repository, snapshot it atomically, record every version,
and deploy snapshots to a real tritonserver in explicit mode with verification and rollback."""

__version__ = "0.1.0"
