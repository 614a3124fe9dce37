"""Alembic migrations for the tritonctl registry (run by `tritonctl db upgrade` and at daemon start)."""
