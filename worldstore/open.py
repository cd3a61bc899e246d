"""Open a store by URL or directory: the one place that decides where things live.

* a directory (default ``./.worldctl``): ``events.sqlite`` (events + blobs) and
  ``cache/`` (snapshots) inside it;
* a ``postgresql://`` URL: events and blobs in that database; snapshots in a local cache
  directory (``--cache`` / ``WORLDCTL_CACHE``, default ``./.worldctl-cache``).
"""

from __future__ import annotations

import os
from pathlib import Path

from worldstore.errors import NotFoundError, StoreError
from worldstore.migrate import migrate
from worldstore.sqlstore import SqlEventStore, create_engine_for

DEFAULT_STORE = ".worldctl"
DEFAULT_PG_CACHE = ".worldctl-cache"
STORE_DB = "events.sqlite"


def is_database_url(location: str) -> bool:
    return location.startswith(("postgresql://", "postgresql+psycopg://", "postgres://"))


def open_event_store(location: str | os.PathLike[str], *, create: bool = True) -> SqlEventStore:
    """Open (and migrate) a store; with create=False a missing embedded store is an error."""
    location = str(location)
    if is_database_url(location):
        url = location
        engine = create_engine_for(url)
    else:
        root = Path(location)
        if root.exists() and not root.is_dir():
            raise StoreError(f"{root}: a store location must be a directory or a postgresql URL")
        if not create and not (root / STORE_DB).is_file():
            raise NotFoundError(f"no store at {root} (create one with `worldctl import FILE`)")
        root.mkdir(parents=True, exist_ok=True)
        url = str(root / STORE_DB)
        engine = create_engine_for(url)
    try:
        migrate(engine, url)
    except Exception:
        engine.dispose()
        raise
    return SqlEventStore(engine, _redact(url))


def default_cache_dir(location: str | os.PathLike[str]) -> Path:
    location = str(location)
    if is_database_url(location):
        return Path(DEFAULT_PG_CACHE)
    return Path(location) / "cache"


def _redact(url: str) -> str:
    """Hide a password in a database URL before it reaches a message."""
    if "://" not in url or "@" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in creds else url
