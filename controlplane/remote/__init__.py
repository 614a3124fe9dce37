"""Clients of the remote services a source or a fleet reads: S3-compatible object storage (`objectstore`)
and MLflow's REST API (`mlflowrest`). One-line errors; no tritonctl state.
"""
