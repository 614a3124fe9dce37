"""The read verbs against a registry named by `--db-url`, without a daemon.

Every verb is one HTTP call to the daemon (controlplane/api/client.py); this is the one exception, chosen
explicitly: `versions`, `diff`, `audit` (`--at`), `tags`, `hosts`, `rollouts` and `status --fleet` given
`--db-url` (or TRITONCTL_DB_URL) read that registry directly, for a post-mortem while the daemon is down or
a fleet's PostgreSQL registry from a machine that runs no daemon. The answers are the documents the
daemon's routes return (the same core functions: controlplane/views/queries.py, intake/tags.py, fleet/queries.py), with
the methods of the API client, so the commands do not know which one answered.

A SQLite file is read through the standard library's sqlite3 (migrate.open_reader); a PostgreSQL URL
(and the fleet views, which need SQLAlchemy) through the Registry.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from controlplane.store.registry import Registry
    from controlplane.store.sqlite_reader import SqliteReader


class RegistryReader:
    """Answers the read methods of `ControlClient` from the registry at `url` (opened on first use)."""

    def __init__(self, url: str, state_dir: Path) -> None:
        self.url = url
        self.state_dir = state_dir  # diff reads file contents from <state-dir>/store
        self._reader: Registry | SqliteReader | None = None
        self._fleet: Registry | None = None

    def _history(self) -> Registry:
        """The registry, or a SqliteReader: it answers the same read methods with the same records."""
        if self._reader is None:
            from controlplane.store.migrate import open_reader

            self._reader = open_reader(self.url)
        return cast("Registry", self._reader)

    def _shared(self) -> Registry:
        if self._fleet is None:
            from controlplane.store.migrate import open_existing

            self._fleet = open_existing(self.url)
        return self._fleet

    def close(self) -> None:
        for registry in (self._reader, self._fleet):
            if registry is not None:
                registry.close()

    # -- the history of this registry's models -------------------------------------------------------------

    def versions(self, model: str) -> list[dict[str, Any]]:
        from controlplane.intake import tags
        from controlplane.names import validate_model_name
        from controlplane.views import queries

        validate_model_name(model)
        registry = self._history()
        return list(tags.annotate_versions(registry, model, queries.versions(registry, model)).to_json())

    def diff(self, model: str, ref_a: str, ref_b: str) -> dict[str, Any]:
        from controlplane.intake import tags
        from controlplane.names import validate_model_name
        from controlplane.snapshot import ContentStore
        from controlplane.views import queries

        validate_model_name(model)
        registry = self._history()
        digest_a, digest_b = (tags.resolve_ref(registry, model, ref) for ref in (ref_a, ref_b))
        store = ContentStore(self.state_dir / "store")
        return dict(queries.diff(registry, store, model, digest_a, digest_b).to_json())

    def audit(self, **filters: Any) -> list[dict[str, Any]]:
        from controlplane.views import queries

        return list(queries.audit(self._history(), **filters).to_json())

    def serving_at(self, at: str, model: str | None = None) -> dict[str, Any]:
        from controlplane.intake import tags
        from controlplane.views import queries

        registry = self._history()
        result = queries.serving_at(registry, at, [model] if model else None)
        return dict(tags.annotate_serving_at(registry, result, model).to_json())

    def tags(self, model: str | None = None, at: str | None = None) -> dict[str, Any]:
        from controlplane.intake import tags

        return dict(tags.listing(self._history(), model, at).to_json())

    # -- the fleet's shared registry ---------------------------------------------------------------------

    def hosts(self) -> list[dict[str, Any]]:
        from controlplane.fleet import queries

        return [row.to_json() for row in queries.hosts(self._shared())]

    def rollouts(self, only_open: bool = False, limit: int = 20) -> list[dict[str, Any]]:
        from controlplane.fleet import queries

        return [row.to_json() for row in queries.rollouts(self._shared(), not only_open, limit)]

    def fleet_matrix(self, models: list[str] | None = None) -> dict[str, Any]:
        from controlplane.fleet import queries

        result = queries.matrix(self._shared())
        if models:
            result.models = [row for row in result.models if row.model in models]
        return dict(result.to_json())
