"""Bring a store's own schema to the code's head revision when it is opened."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Engine

import migrations
from worldstore.errors import StoreVersionError

_PG_LOCK_KEY = 0x776F726C64  # advisory lock: one migrator at a time on PostgreSQL


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None
    return head


def migrate(engine: Engine, url: str) -> None:
    """Upgrade to head; refuse a store whose revision this code does not know."""
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
