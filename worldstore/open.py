"""Open a store by URL or directory: the one place that decides where things live.

* a directory (default ``./.worldctl``): ``events.sqlite`` (events + blobs) and
  ``cache/`` (snapshots) inside it;
* a ``postgresql://`` URL: events and blobs in that database; snapshots in a local cache
  directory (``--cache`` / ``WORLDCTL_CACHE``, default ``./.worldctl-cache``).

Errors of opening (no driver, a server that cannot be reached, bad credentials) are
translated here into one StoreError that names the URL, never its password. SQLAlchemy is
imported only when a store is actually opened, so that importing this module (and the
``worldstore`` package) stays cheap.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from worldstore.errors import NotFoundError, StoreError, WorldError

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from worldstore.sqlstore import SqlEventStore

DEFAULT_STORE = ".worldctl"
DEFAULT_PG_CACHE = ".worldctl-cache"
DEFAULT_PG_PACKS = ".worldctl-packs"
STORE_DB = "events.sqlite"
PG_DRIVER_HINT = "pip install 'agent-worlds[postgres]'"


def is_database_url(location: str) -> bool:
    return location.startswith(("postgresql://", "postgresql+psycopg://", "postgres://"))


def open_event_store(location: str | os.PathLike[str], *, create: bool = True) -> SqlEventStore:
    """Open (and migrate) a store; with create=False a missing embedded store is an error."""
    from worldstore.sqlstore import SqlEventStore

    location = str(location)
    if is_database_url(location):
        url = location
        engine = _pg_engine(url)
    else:
        root = Path(location)
        if root.exists() and not root.is_dir():
            raise StoreError(f"{root}: a store location must be a directory or a postgresql URL")
        if not create and not (root / STORE_DB).is_file():
            raise NotFoundError(f"no store at {root} (create one with `worldctl import FILE`)")
        root.mkdir(parents=True, exist_ok=True)
        url = str(root / STORE_DB)
        if not os.path.lexists(url) and not os.path.lexists(url + "-wal"):
            _new_sqlite_store(Path(url))
        engine = _engine(url)
    try:
        _bring_to_head(engine, url)
    except BaseException:
        engine.dispose()
        raise
    return SqlEventStore(engine, redact(url))


def _new_sqlite_store(path: Path) -> None:
    """Make a new embedded store as a copy of an empty one migrated once per process: the
    migrations' ~20 ms (alembic reading its scripts, each DDL statement committed) are paid
    once, not per store, and the copy is the migrations' own result byte for byte. The
    copy is written and fsynced under a temporary name, then linked into place, so a
    store that another process made meanwhile is kept, and a crash leaves no half store.
    Where anything of it fails, the store is left for the migrations to make."""
    try:
        template = _store_template()
        staged = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.new")
        shutil.copyfile(template, staged)
        try:
            fd = os.open(staged, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            with contextlib.suppress(FileExistsError):
                os.link(staged, path)
        finally:
            os.unlink(staged)
    except (OSError, StoreError):
        return


_TEMPLATE_LOCK = threading.Lock()
_TEMPLATES: dict[int, Path] = {}  # by pid: a forked child makes its own


def _store_template() -> Path:
    with _TEMPLATE_LOCK:
        found = _TEMPLATES.get(os.getpid())
        if found is not None and found.is_file():
            return found
        folder = Path(tempfile.mkdtemp(prefix="agentworlds-store-template-"))
        atexit.register(_remove_template, folder, os.getpid())
        engine = _engine(str(folder / STORE_DB))
        try:
            _bring_to_head(engine, str(folder / STORE_DB))
            with engine.connect() as conn:  # everything into the main file, no -wal left
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            engine.dispose()
        for leftover in (STORE_DB + "-wal", STORE_DB + "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(folder / leftover)
        _TEMPLATES[os.getpid()] = folder / STORE_DB
        return folder / STORE_DB


def _remove_template(folder: Path, owner: int) -> None:
    if os.getpid() == owner:
        shutil.rmtree(folder, ignore_errors=True)


def _engine(url: str) -> Engine:
    from worldstore.sqlstore import create_engine_for

    return create_engine_for(url)


def _pg_engine(url: str) -> Engine:
    try:
        return _engine(url)
    except ImportError as exc:  # SQLAlchemy imports the driver when the engine is made
        raise StoreError(f"{redact(url)}: a PostgreSQL store needs the psycopg driver, which "
                         f"is not installed ({exc}): {PG_DRIVER_HINT}") from None


def _bring_to_head(engine: Engine, url: str) -> None:
    import sqlalchemy as sa

    from worldstore.migrate import ensure_schema

    try:
        ensure_schema(engine, url)
    except WorldError:
        raise
    except sa.exc.DBAPIError as exc:
        raise StoreError(f"cannot open the store {redact(url)}: "
                         f"{_driver_reason(exc, url)}") from None


def _driver_reason(exc: Exception, url: str) -> str:
    """The driver's own first line (psycopg says which host and port refused, or which
    user failed to authenticate), with the password scrubbed should it appear."""
    orig = getattr(exc, "orig", None) or exc
    lines = [line.strip() for line in str(orig).splitlines() if line.strip()]
    reason = lines[0] if lines else type(orig).__name__
    password = _password(url)
    return reason.replace(password, "***") if password else reason


def default_cache_dir(location: str | os.PathLike[str]) -> Path:
    location = str(location)
    if is_database_url(location):
        return Path(DEFAULT_PG_CACHE)
    return Path(location) / "cache"


def default_packs_dir(location: str | os.PathLike[str]) -> Path:
    """Where packs installed into a store are unpacked: beside its events for a directory
    store, ``./.worldctl-packs`` for a PostgreSQL one."""
    location = str(location)
    if is_database_url(location):
        return Path(DEFAULT_PG_PACKS)
    return Path(location) / "packs"


def _credentials(url: str) -> tuple[str, str, str] | None:
    """(scheme, user info, host part) of a URL with user info, else None."""
    if "://" not in url:
        return None
    scheme, rest = url.split("://", 1)
    authority, slash, path = rest.partition("/")
    if "@" not in authority:
        return None
    creds, host = authority.rsplit("@", 1)
    return scheme, creds, host + slash + path


def _password(url: str) -> str | None:
    found = _credentials(url)
    if found is None or ":" not in found[1]:
        return None
    return found[1].split(":", 1)[1] or None


def redact(url: str) -> str:
    """Hide a password in a database URL before it reaches a message."""
    found = _credentials(url)
    if found is None or ":" not in found[1]:
        return url
    scheme, creds, rest = found
    return f"{scheme}://{creds.split(':', 1)[0]}:***@{rest}"
