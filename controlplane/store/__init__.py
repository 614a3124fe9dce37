"""The registry adapter: SQLAlchemy schema (`schema`), repository functions (`registry`) returning the
plain dataclasses of `records`, and migrations (`migrate`).

Nothing outside this package sees an ORM object or a SQLAlchemy exception: failures become
`controlplane.errors.StoreError`. Import the submodules directly (this package imports nothing, so the
CLI's light commands do not pay for SQLAlchemy).
"""
