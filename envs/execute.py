"""Running one tool call against a service database: shared by in-process instances and the
sandboxed app worker (``envs.worker``), so both record exactly the same effects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import apsw

from envs.app import ToolContext, ToolSpec
from replay.sqlite import FROZEN_VFS, freeze, open_event_db, open_event_db_snapshot

Effect = tuple[bytes, list[tuple[str, int]] | None]


def open_tool_db(path: Path, *, vfs: str = FROZEN_VFS) -> apsw.Connection:
    """A service database connection as tools use it (`vfs`: see ``open_event_db``)."""
    conn = open_event_db(path, vfs=vfs)
    conn.authorizer = None  # tools are app code; guards are for events
    # An instance is a scratch copy, re-creatable from its snapshot and episode.
    conn.execute("PRAGMA synchronous=OFF")
    return conn


def open_snapshot_tool_db(path: Path) -> apsw.Connection:
    """A read-only connection on a snapshot's own database, for read tools of an instance
    that has not written that service yet (nothing to copy until it does)."""
    conn = open_event_db_snapshot(path)
    conn.authorizer = None
    return conn


def execute_tool(conn: apsw.Connection, spec: ToolSpec, kwargs: dict[str, Any], *,
                 millis: int, seed: str, now: str, call_index: int
                 ) -> tuple[Any, Effect | None]:
    """Run `spec` on `conn` with a frozen clock; returns its result and, for a write that
    changed anything, its changeset and the ``sqlite_sequence`` rows (None if unchanged)."""
    freeze(millis, seed)
    ctx = ToolContext(conn, now, call_index)
    if not spec.writes:
        # A tool that says it only reads must not write: its effects would escape the
        # episode. query_only makes SQLite refuse any write it attempts.
        conn.execute("PRAGMA query_only=1")
        try:
            return spec.fn(ctx, **kwargs), None
        finally:
            conn.execute("PRAGMA query_only=0")
    session = apsw.Session(conn, "main")
    session.config(apsw.SQLITE_SESSION_OBJCONFIG_ROWID, 1)
    session.attach()
    sequences_before = sequences(conn)
    conn.execute("SAVEPOINT tool_call")
    try:
        result = spec.fn(ctx, **kwargs)
    except BaseException:
        conn.execute("ROLLBACK TO tool_call")
        conn.execute("RELEASE tool_call")
        session.close()
        raise
    conn.execute("RELEASE tool_call")
    changeset = session.changeset()
    session.close()
    after = sequences(conn)
    if changeset or after != sequences_before:
        return result, (changeset, after if after != sequences_before else None)
    return result, None


def sequences(conn: apsw.Connection) -> list[tuple[str, int]] | None:
    exists = conn.execute(
        "SELECT 1 FROM sqlite_schema WHERE name = 'sqlite_sequence'").fetchone()
    if not exists:
        return None
    return [(str(n), int(s)) for n, s in
            conn.execute("SELECT name, seq FROM sqlite_sequence ORDER BY name")]
