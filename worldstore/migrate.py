"""Bring a store's own schema to the code's head revision when it is opened.

Opening a store happens on every command, and alembic costs more to import than the rest
of a short command together. So the open path reads the stored revision with one query
and compares it with ``HEAD_REVISION``, the head this code knows (a test checks it against
alembic's script directory); alembic is imported only when a migration is actually due.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from worldstore.errors import StoreVersionError

if TYPE_CHECKING:
    from alembic.config import Config

HEAD_REVISION = "0003_claims"
_PG_LOCK_KEY = 0x776F726C64  # advisory lock: one migrator at a time on PostgreSQL


def _config() -> Config:
    from alembic.config import Config

    from worldstore import migrations

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    return cfg


def head_revision() -> str:
    """The head of the migration scripts, as alembic computes it (slow: imports alembic)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None
    return head


def stored_revisions(engine: Engine) -> list[str]:
    """The revisions recorded in the store (empty for a new store). Connection errors
    propagate: the caller translates them."""
    with engine.connect() as conn:
        try:
            rows = conn.execute(sa.text("SELECT version_num FROM alembic_version")).all()
        except sa.exc.DBAPIError:
            # The connection works but the statement failed: no version table yet (a new
            # store). Anything else shows up again in migrate(), which checks under a lock.
            return []
    return sorted(str(row[0]) for row in rows)


def ensure_schema(engine: Engine, url: str) -> None:
    """Nothing to do for a store at ``HEAD_REVISION`` (one query); otherwise migrate."""
    if stored_revisions(engine) == [HEAD_REVISION]:
        return
    migrate(engine, url)


def migrate(engine: Engine, url: str) -> None:
    """Upgrade to head; refuse a store whose revision this code does not know. One
    migration at a time in this process: alembic runs its migration scripts through
    module-level proxies (``alembic.context``, ``alembic.op``), so two threads creating
    stores at once would run each other's migrations on the wrong connection."""
    with _MIGRATING:
        _migrate(engine, url)


_MIGRATING = threading.Lock()


def _migrate(engine: Engine, url: str) -> None:
    from alembic import command
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    cfg = _config()
    script = ScriptDirectory.from_config(cfg)
    writer = engine.execution_options(worldstore_write=True)
    with writer.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_KEY})
        current = MigrationContext.configure(conn).get_current_revision()
        if current == script.get_current_head():
            return
        if current is not None and current not in {r.revision for r in script.walk_revisions()}:
            raise StoreVersionError(
                f"{url}: the store is at schema revision {current!r}, which this version of "
                "agent-worlds does not know (the store was written by newer code); upgrade "
                "agent-worlds to open it. Nothing was changed."
            )
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
