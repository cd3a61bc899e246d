"""Applying events to a world: replay is a fold of ``apply_event`` over the log.

``apply_event(builder, event)`` is a pure function of the world and the event: it reads
no clock (SQLite's clock is frozen to the event's ``ts``), draws no randomness (seeded by
the event id) and does no I/O besides the world it writes. A ``WorldBuilder`` holds one
connection per service and keeps each service's changes of the current day in one
transaction, committed by ``commit()``.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import apsw
import msgspec

from replay.errors import EventFailed
from replay.layout import APPS, SERVICES, WORKSPACE, service_db, workspace_path
from replay.sqlite import (
    describe_failure,
    event_clock,
    freeze_at,
    open_event_db,
    take_denial,
    unguarded,
    watch_rowids,
)
from replay.touched import DayChanges, RowTracker, WriteLog, note_tables
from worldstore.canonical import digest
from worldstore.errors import PathError
from worldstore.events import (
    SCHEMA_VERSION,
    AppPayload,
    EventRow,
    FileDeletePayload,
    FileWritePayload,
    Params,
    Payload,
    SqlPayload,
    StoredEvent,
    decode_current_payload,
    decode_payload,
    event_row,
)
from worldstore.interchange import BLOB_PARAM_KEY

BlobSource = Callable[[str], bytes]


class WorldBuilder:
    """Writes events into one world directory.

    Connections stay open across days (their statement and page caches with them); each
    service's writes of the current day form one transaction, committed by ``commit()``.
    """

    def __init__(self, root: Path, blobs: BlobSource) -> None:
        self.root = root
        self.blobs = blobs
        self._conns: dict[str, apsw.Connection] = {}
        self._logs: dict[str, WriteLog] = {}
        # One cursor per connection runs every event's statement: cheaper than a fresh
        # cursor per statement (each is run to its end before the next).
        self._cursors: dict[str, apsw.Cursor] = {}
        self._in_day: set[str] = set()
        # Per service, the write sets of the SQL it ran since ``take_changes`` (None: it may
        # have written anything): one set add per event, unioned once a day.
        self._writes: dict[str, set[frozenset[str] | None]] = {}
        # (cursor, write sets learnt, writes) of each service whose day transaction is
        # open: the one lookup a SQL event needs.
        self._live: dict[str, _Live] = {}
        self.failed_at = -1  # the index in its rows of the event apply_rows failed on
        self.changes = DayChanges()
        self._trackers: dict[str, RowTracker] = {}
        self._track_rows = True
        (root / SERVICES).mkdir(parents=True, exist_ok=True)
        (root / WORKSPACE).mkdir(parents=True, exist_ok=True)

    def connection(self, service: str) -> apsw.Connection:
        conn = self._conns.get(service)
        if conn is None:
            # SQLite's default VFS: the guards freeze the clock by function (see
            # replay.sqlite), and this way no page read or write goes through Python.
            conn = open_event_db(service_db(self.root, service), vfs=None,
                                 statement_cache=_STATEMENT_CACHE)
            unguarded(conn, "PRAGMA journal_mode=MEMORY")
            # Worlds are built in scratch dirs and are rebuildable from the log; nothing
            # relies on their durability (cache entries are copies), so skip the fsyncs.
            unguarded(conn, "PRAGMA synchronous=OFF")
            unguarded(conn, f"PRAGMA cache_size=-{_CACHE_KIB}")
            # Pinned, not left to the file system's sector size: events may read it (rtree
            # sizes its nodes by it), so it must be the same on every machine.
            unguarded(conn, f"PRAGMA page_size={_PAGE_SIZE}")
            tracker = RowTracker()
            if self._track_rows:  # (else the event guards' own update hook stays)
                _hook_rows(conn, tracker)
            self._trackers[service] = tracker
            self._conns[service] = conn
            self._logs[service] = WriteLog(conn)
            self._cursors[service] = conn.cursor()
        if service not in self._in_day:
            unguarded(conn, "BEGIN")
            # A day sees no rowid inserted before it: whether the connection lived through
            # the previous day depends on how the log was split and on the cache.
            conn.set_last_insert_rowid(0)
            self._in_day.add(service)
            writes = self._writes.get(service)
            if writes is None:
                writes = self._writes[service] = set()
            self._live[service] = (self._cursors[service].execute,
                                   self._logs[service].write_sets, writes)
        return conn

    def apply(self, event: StoredEvent, payload: Payload | None = None) -> None:
        """Apply one event (`payload`: its payload, already decoded)."""
        if payload is None:
            self.apply_rows((event_row(event),))
            return
        freeze_at(event.ts, event.event_id)
        apply_event(payload, self)

    def apply_rows(self, rows: Sequence[EventRow], start: int = 0) -> int:
        """Apply the events of ``rows[start:]`` up to the first of another day than
        ``rows[start]``'s; return the index after the last one applied. When an event
        fails (EventFailed), ``failed_at`` is its index in `rows`.

        The per-event path of replay, so kept to a few lookups and calls per SQL event
        (most events): the same steps as ``apply_event`` after ``freeze_at``."""
        day = rows[start][1]
        live = self._live
        clock = event_clock()
        index = start
        try:
            for index in range(start, len(rows)):
                _seq, row_day, ts, event_id, version, body = rows[index]
                if row_day != day:
                    return index
                # clock.freeze_at(ts, event_id), its steps written out (no call per event)
                clock.ts = ts
                clock.seed = event_id
                clock.counter = clock.ticks = 0
                clock.denied = None
                clock.altering = False
                if version == SCHEMA_VERSION:
                    payload = _decode(body)
                    # No "{" in the body past its own opening one: no JSON object among
                    # the parameters (no blob to convert), so the values bind as they are.
                    plain = body.find(b"{", 1) < 0
                else:
                    payload = decode_payload(body, version)
                    plain = False
                if type(payload) is not SqlPayload:
                    apply_event(payload, self)
                    continue
                service = payload.service
                found = live.get(service)
                if found is None:
                    self.connection(service)
                    found = live[service]
                execute, write_sets, writes = found
                sql = payload.sql
                tables = write_sets.get(sql)
                if tables is None:  # first sight of this text under this schema
                    _apply_sql(payload, self)
                    continue
                params = payload.params
                try:
                    # Plain positional values (the common case) bind as they are (apsw
                    # binds a bool as the integer _binding makes of it).
                    if params is not None and not plain and (
                            type(params) is not list
                            or not _PLAIN_TYPES.issuperset(map(type, params))):
                        params = _bindings(params)
                    for _row in execute(sql, params):
                        pass
                except apsw.Error as exc:
                    raise EventFailed(f"service {service!r}: {describe_failure(exc)}") from None
                except KeyError as exc:  # apsw's lookup of a named parameter missing
                    raise _missing_parameter(service, exc) from None
                finally:
                    writes.add(tables)
                if clock.denied is not None:  # found while rows were written (2^63-1)
                    raise EventFailed(f"service {service!r}: {take_denial()}")
        except EventFailed:
            self.failed_at = index
            raise
        return len(rows)

    def track_rows(self, on: bool) -> None:
        """Whether to note the rowids written (``DayChanges.rows``; on by default). Per-day
        hashing reads them on every day but its first, which it hashes in full: noting
        each row of a big first day would be work for nothing."""
        if on != self._track_rows:
            self._track_rows = on
            for service, conn in self._conns.items():
                if on:
                    _hook_rows(conn, self._trackers[service])
                else:
                    conn.preupdate_hook(None)
                    conn.set_update_hook(watch_rowids)

    def commit(self) -> None:
        """End the day: commit every service transaction the day opened."""
        for service in sorted(self._in_day):
            unguarded(self._conns[service], "COMMIT")
        self._in_day.clear()
        self._live.clear()

    def idle_connection(self, service: str) -> apsw.Connection | None:
        """The service's open connection while no day transaction is open on it (its
        page cache is hot: hashing through it reads no page twice), or None."""
        return None if service in self._in_day else self._conns.get(service)

    def take_changes(self) -> DayChanges:
        """What was written since the last call (tables, files, app pins), and start
        afresh: per-day hashing re-hashes exactly this."""
        changes, self.changes = self.changes, DayChanges()
        for service, writes in self._writes.items():
            for tables in writes:
                note_tables(changes, service, tables)
            writes.clear()  # (in place: an open day's lookup holds it)
        for service, tracker in self._trackers.items():
            changes.rows[service] = tracker.take()
        return changes

    def close(self) -> None:
        """Roll back an unfinished day and close every connection."""
        conns, self._conns = self._conns, {}
        self._cursors.clear()
        self._trackers.clear()
        in_day, self._in_day = self._in_day, set()
        self._live.clear()
        for service, conn in conns.items():
            try:
                # (SQLite has rolled the transaction back itself after an interrupted or
                # out-of-memory statement)
                if service in in_day and conn.in_transaction:
                    unguarded(conn, "ROLLBACK")
            finally:
                conn.close()

    abort = close


_Live = tuple[Callable[..., apsw.Cursor], dict[str, frozenset[str]],
              set[frozenset[str] | None]]
_decode = decode_current_payload


_CACHE_KIB = 65536  # page cache per service connection while building (64 MiB at most)
_PAGE_SIZE = 4096  # SQLite's default, the page size of every world built so far


def _hook_rows(conn: apsw.Connection, tracker: RowTracker) -> None:
    """Note the rowids `conn` writes in `tracker` (its preupdate hook, which also keeps
    the guards' watch on rowid 2^63-1) instead of the guards' update hook."""
    conn.set_update_hook(None)
    conn.preupdate_hook(tracker.hook())


def apply_event(payload: Payload, world: WorldBuilder) -> None:
    """Apply one event's payload to the world: the step of the fold."""
    handler = _HANDLERS.get(type(payload))
    if handler is None:
        raise EventFailed(f"unknown payload type {type(payload).__name__}")
    handler(payload, world)


def _apply_sql(payload: SqlPayload, world: WorldBuilder) -> None:
    service, sql, params = payload.service, payload.sql, payload.params
    live = world._live.get(service)
    if live is None:
        world.connection(service)
        live = world._live[service]
    execute, write_sets, writes = live
    log = world._logs[service]
    tables = write_sets.get(sql)
    try:
        bindings = _bindings(params)
        if tables is not None:
            for _row in execute(sql, bindings):
                pass
        else:
            # First sight of this text under this schema: compile it afresh so that the
            # write log hears every table it (or a trigger it fires) writes.
            log.start()
            try:
                for _row in execute(sql, bindings, can_cache=False):
                    pass
            finally:
                tables = log.learnt(sql)
    except apsw.Error as exc:
        raise EventFailed(f"service {payload.service!r}: {describe_failure(exc)}") from None
    except KeyError as exc:  # apsw's lookup of a named parameter missing from `params`
        raise _missing_parameter(service, exc) from None
    finally:
        writes.add(tables)
    refused = take_denial()  # found while rows were written (rowid 2^63-1), not compiled
    if refused is not None:
        raise EventFailed(f"service {payload.service!r}: {refused}")


def _missing_parameter(service: str, exc: KeyError) -> EventFailed:
    return EventFailed(
        f"service {service!r}: no value for named parameter {exc} in 'params'"
    )


def _bindings(params: Params | None) -> Any:
    if params is None:
        return None
    if isinstance(params, dict):
        return {k: _binding(v) for k, v in params.items()}
    if _PLAIN_TYPES.issuperset(map(type, params)):
        return params  # nothing to convert (the common case): skip the per-value calls
    return tuple(_binding(v) for v in params)


_PLAIN_TYPES = frozenset({int, float, str, type(None)})
# Statements a builder's connection keeps compiled. apsw's cache is a ring that every run
# moves through, so with its default of 100 a statement run once in a while (a table's
# DELETE, per-day hashing's re-read of a table written every few days) is compiled again
# each time. A compiled INSERT holds about 1 kB; only distinct texts run take slots.
_STATEMENT_CACHE = 1024


def _binding(value: Any) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, dict):
        return base64.b64decode(value[BLOB_PARAM_KEY])
    return value


def _apply_file_write(payload: FileWritePayload, world: WorldBuilder) -> None:
    data = world.blobs(payload.blob)
    if digest(data) != payload.blob or len(data) != payload.size:
        raise EventFailed(f"blob {payload.blob} for {payload.path!r} does not match its digest")
    target = _target(world, payload.path)
    world.changes.files.add(payload.path)
    try:
        try:
            _write_file(target, data)
        except FileNotFoundError:  # a new folder: make it (once), then write
            target.parent.mkdir(parents=True, exist_ok=True)
            _write_file(target, data)
    except IsADirectoryError:
        raise EventFailed(f"file_write {payload.path!r}: a directory is in the way") from None
    except (NotADirectoryError, FileExistsError):
        raise EventFailed(
            f"file_write {payload.path!r}: a parent of this path is a file"
        ) from None


def _write_file(target: Path, data: bytes) -> None:
    # A file written again is a new file: truncating one that has data costs ext4 a
    # writeback of it (its replace-by-truncate heuristic), ten times the unlink, and a
    # new inode shares nothing with a copy that linked the old one. No stat of the parent
    # or the target first: the errors say what was in the way, and most writes go to
    # folders that exist.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(target)
    with open(target, "xb") as fh:
        fh.write(data)


def _apply_file_delete(payload: FileDeletePayload, world: WorldBuilder) -> None:
    target = _target(world, payload.path)
    world.changes.files.add(payload.path)
    try:
        os.unlink(target)
    except FileNotFoundError:
        raise EventFailed(f"file_delete {payload.path!r}: no such file in the workspace") from None
    except (IsADirectoryError, PermissionError, NotADirectoryError) as exc:
        raise EventFailed(f"file_delete {payload.path!r}: not a file ({exc.strerror})") from None
    _prune_empty_parents(target.parent, world.root / WORKSPACE)


def _apply_app(payload: AppPayload, world: WorldBuilder) -> None:
    folder = world.root / APPS
    world.changes.apps = True
    folder.mkdir(exist_ok=True)
    pin = {"service": payload.service, "app": payload.app, "version": payload.version,
           "digest": payload.digest, "carried": payload.carried}
    (folder / f"{payload.service}.json").write_bytes(msgspec.json.encode(pin) + b"\n")
    code_file = folder / f"{payload.service}.py"
    if payload.carried:
        code = world.blobs(payload.digest)
        if digest(code) != payload.digest:
            raise EventFailed(f"app code for {payload.service!r} does not match its digest")
        code_file.write_bytes(code)
    elif code_file.exists():
        code_file.unlink()  # a shipped app replaces earlier carried code


_HANDLERS: dict[type[Any], Callable[[Any, WorldBuilder], None]] = {
    SqlPayload: _apply_sql,
    FileWritePayload: _apply_file_write,
    FileDeletePayload: _apply_file_delete,
    AppPayload: _apply_app,
}


def _target(world: WorldBuilder, path: str) -> Path:
    try:
        return workspace_path(world.root, path)
    except PathError as exc:
        raise EventFailed(str(exc)) from None


def _prune_empty_parents(folder: Path, stop: Path) -> None:
    while folder != stop:
        try:
            folder.rmdir()
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                return
            raise
        folder = folder.parent
