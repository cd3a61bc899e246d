"""One tool call against a service database: the dispatch shared by in-process instances and
the sandboxed worker of a carried app (``worldenv.sandbox.app_worker``), so both validate
arguments, run
the tool, record its effects and encode its result exactly alike.

``compile_app(app)`` derives, once per app, each tool's description and schemas, its
argument validator and its result encoder from the tool function's signature, with FastMCP
and pydantic as a FastMCP server would: the schemas, validation errors and result texts an
agent sees are FastMCP's own. No FastMCP server takes part in a call: ``CompiledTool.call``
is the whole of it (validate, run under the call's frozen clock, encode), and a bad call
(bad arguments, a refusal, a tool that fails) is an error result, never an exception.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import apsw
from fastmcp.exceptions import FastMCPError
from fastmcp.tools import FunctionTool
from pydantic import TypeAdapter, ValidationError

from replay.sqlite import (
    FROZEN_VFS,
    describe_failure,
    freeze,
    guarded,
    open_event_db,
    open_event_db_snapshot,
    take_denial,
)
from worldenv.core.app import App, ToolContext, ToolSpec, bind
from worldenv.core.contract import CallContext, Effect, ToolInfo, ToolResult

Connect = Callable[[], apsw.Connection]

# Keyed by the identity of the App objects (kept alive by the entry, so ids stay unique).
_COMPILED: dict[int, tuple[App, dict[str, CompiledTool]]] = {}
_COMPILED_LOCK = threading.Lock()


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


def tool_failure(name: str, reason: object) -> ToolResult:
    """The error result of a call that failed other than by a refusal (the wording of
    FastMCP's servers, which agents may have learned)."""
    return ToolResult(True, f"Error calling tool {name!r}: {reason}")


@dataclass(frozen=True, slots=True, eq=False)
class CompiledTool:
    """A tool ready to call: what agents see of it, its argument validator and its result
    encoder (FastMCP's tool object for the same function, used only to encode)."""

    spec: ToolSpec
    info: ToolInfo
    validator: TypeAdapter[Any]
    encoder: FunctionTool

    def call(self, connect: Connect, arguments: dict[str, Any], context: CallContext
             ) -> ToolResult:
        """Validate `arguments`, then run the tool on the database `connect` gives (asked
        for only once the arguments are valid) under `context`'s clock."""
        try:
            kwargs = self.validator.validate_python(arguments)
        except ValidationError as exc:
            return ToolResult(True, str(exc))
        try:
            raw = execute_tool(connect(), self.spec, kwargs, context)
            encoded = self.encoder.convert_result(raw)
        except FastMCPError as exc:  # ToolError: a refusal, its message verbatim
            return ToolResult(True, str(exc))
        except Exception as exc:
            return tool_failure(self.info.name, exc)
        text = "".join(getattr(block, "text", "") for block in encoded.content)
        return ToolResult(bool(getattr(encoded, "is_error", False)), text,
                          encoded.structured_content)


def compile_app(app: App) -> dict[str, CompiledTool]:
    """The app's tools by the name agents call them, in name order; built once per app."""
    with _COMPILED_LOCK:
        found = _COMPILED.get(id(app))
        if found is None:
            tools = (_compile(spec) for spec in sorted(app.tools.values(), key=lambda s: s.name))
            found = _COMPILED[id(app)] = (app, {t.info.name: t for t in tools})
    return found[1]


def _compile(spec: ToolSpec) -> CompiledTool:
    # The validator calls a function with the tool's signature (less ctx) that returns
    # its validated keyword arguments, so pydantic checks them exactly as a FastMCP server
    # calling the tool would, errors worded alike.
    signature = bind(spec, _validated_arguments)
    encoder = FunctionTool.from_function(signature, name=spec.full_name,
                                         description=spec.description)
    info = ToolInfo(spec.full_name, spec.description, encoder.parameters,
                    encoder.output_schema, spec.writes)
    # (pydantic takes a function where it takes a type: it validates a call of it)
    validator: TypeAdapter[Any] = TypeAdapter(cast(Any, signature))
    return CompiledTool(spec, info, validator, encoder)


def _validated_arguments(spec: ToolSpec, kwargs: dict[str, Any]) -> dict[str, Any]:
    return kwargs


def execute_tool(conn: apsw.Connection, spec: ToolSpec, kwargs: dict[str, Any],
                 context: CallContext) -> Any:
    """Run `spec` on `conn` with the call's frozen clock; returns its result. A write that
    changed anything records its changeset and ``sqlite_sequence`` rows in `context`."""
    clock = context.clock
    freeze(clock.millis, clock.seed)
    ctx = ToolContext(conn, clock.now, clock.index)
    if not spec.writes:
        # A tool that says it only reads must not write: its effects would escape the
        # episode. query_only makes SQLite refuse any write it attempts.
        conn.execute("PRAGMA query_only=1")
        try:
            return spec.fn(ctx, **kwargs)
        finally:
            conn.execute("PRAGMA query_only=0")
    with captured_writes(conn, spec.service, context, "tool_call"):
        return spec.fn(ctx, **kwargs)


@contextlib.contextmanager
def captured_writes(conn: apsw.Connection, service: str, context: CallContext,
                    savepoint: str) -> Iterator[None]:
    """Run the block in a savepoint with the session extension attached: when it ends, the
    changeset and the ``sqlite_sequence`` rows it left are recorded in `context` (if it
    changed anything); when it raises, all of it is rolled back and the exception goes on."""
    session = apsw.Session(conn, "main")
    session.config(apsw.SQLITE_SESSION_OBJCONFIG_ROWID, 1)
    session.attach()
    sequences_before = sequences(conn)
    conn.execute(f"SAVEPOINT {savepoint}")
    try:
        yield
    except BaseException:
        conn.execute(f"ROLLBACK TO {savepoint}")
        conn.execute(f"RELEASE {savepoint}")
        session.close()
        raise
    conn.execute(f"RELEASE {savepoint}")
    changeset = session.changeset()
    session.close()
    after = sequences(conn)
    if changeset or after != sequences_before:
        context.record(Effect(service, changeset,
                              after if after != sequences_before else None))


SQL_ROWS_SHOWN = 50  # rows of a query's result in the text an agent reads


def execute_sql(conn: apsw.Connection, service: str, sql: str, params: list[Any],
                context: CallContext) -> ToolResult:
    """Run `sql` on `conn` under the events' gate (``replay.sqlite.guarded``) and the
    call's frozen clock: its rows (the first ``SQL_ROWS_SHOWN`` in the text, as JSON
    lists) and the changes it made, recorded in `context` as a tool's writes are. A
    refusal or an SQL error rolls the statement back and is an error result."""
    clock = context.clock
    freeze(clock.millis, clock.seed)
    recorded = len(context.effects)
    try:
        with captured_writes(conn, service, context, "sql_call"), guarded(conn):
            cursor = conn.execute(sql, params)
            try:
                columns = [d[0] for d in cursor.description]
            except apsw.ExecutionCompleteError:  # a statement that returns no rows
                columns = []
            rows = [list(row) for row in cursor]
            refused = take_denial()
            if refused is not None:  # found while rows were written, not compiled
                raise apsw.AuthError(refused)
    except (apsw.Error, TypeError, ValueError, OverflowError) as exc:
        reason = take_denial() or (describe_failure(exc) if isinstance(exc, apsw.Error)
                                   else str(exc))
        return ToolResult(True, f"SQL on {service!r} refused: {reason}")
    changed = sum(1 for effect in context.effects[recorded:]
                  for _ in apsw.Changeset.iter(effect.changeset))
    shown = rows[:SQL_ROWS_SHOWN]
    text = json.dumps({"columns": columns, "rows": shown, "more_rows": len(rows) - len(shown),
                       "changed_rows": changed}, default=_shown_value)
    return ToolResult(False, text, {"columns": columns, "rows": shown,
                                    "more_rows": len(rows) - len(shown),
                                    "changed_rows": changed})


def _shown_value(value: object) -> str:
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    return repr(value)


def sequences(conn: apsw.Connection) -> list[tuple[str, int]] | None:
    exists = conn.execute(
        "SELECT 1 FROM sqlite_schema WHERE name = 'sqlite_sequence'").fetchone()
    if not exists:
        return None
    return [(str(n), int(s)) for n, s in
            conn.execute("SELECT name, seq FROM sqlite_sequence ORDER BY name")]
