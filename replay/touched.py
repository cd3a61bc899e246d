"""What a day could have changed: the tables, workspace files and app pins it wrote.

Per-day hashing re-hashes only these (``replay.rehash``), so what is recorded here must
over-approximate every change, never miss one. Tables come from SQLite's own authorizer,
which is consulted while a statement is compiled and names every table the compiled
program may write, the bodies of the triggers it fires included. A statement's write set
is learnt on a fresh compile (never from apsw's statement cache, whose compiles happened
out of sight) and remembered by SQL text until the service's schema changes. Anything
the authorizer reports that is not a plain row write or read (DDL, ANALYZE, a statement
that compiled without consulting it at all) marks the whole service as changed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import apsw

from replay.sqlite import MAX_ROWID, host_aware, host_compiling, refuse_max_rowid

Authorizer = Callable[[int, str | None, str | None, str | None, str | None], int]

# Row writes: p1 names the table written (by the statement or a trigger it fires).
_WRITES = frozenset({apsw.SQLITE_INSERT, apsw.SQLITE_UPDATE, apsw.SQLITE_DELETE})
# Operations that change nothing a world hash covers: reads. (A PRAGMA may set the
# header's user_version or application_id, so it counts as a change of anything: per-day
# hashing re-reads a service's header only on a day that may have changed it.)
_HARMLESS = frozenset({apsw.SQLITE_READ, apsw.SQLITE_SELECT, apsw.SQLITE_FUNCTION,
                       apsw.SQLITE_RECURSIVE})
_MEMO_LIMIT = 4096  # distinct SQL texts remembered per service; forgetting is always safe


ROWIDS_PER_TABLE = 65536  # rowids remembered per table a day; past that, re-read it all


@dataclass(slots=True)
class DayChanges:
    """What the current day wrote. A service mapped to None may have changed anywhere.

    ``rows`` holds, per service and table (as declared), the rowids SQLite's preupdate hook
    reported written, old and new (``TOO_MANY_ROWS``: more than ROWIDS_PER_TABLE). It
    narrows which rows of a rowid table to read again, never which tables. The preupdate
    hook, unlike the update hook, reports every row change of a real table: the rows
    REPLACE deletes, and each row of a DELETE without WHERE (SQLite turns off its truncate
    optimisation while the hook is set), as the session extension needs.
    """

    services: dict[str, set[str] | None] = field(default_factory=dict)
    files: set[str] = field(default_factory=set)
    apps: bool = False
    rows: dict[str, dict[str, set[int]]] = field(default_factory=dict)


class _TooManyRows(set[int]):
    """Stands for a table's rowids once there are too many to keep: adds nothing."""

    def add(self, element: int) -> None:
        pass

    def __len__(self) -> int:
        return ROWIDS_PER_TABLE


TOO_MANY_ROWS: set[int] = _TooManyRows()


class RowTracker:
    """The preupdate hook of one service's connection (``hook()``): notes each rowid
    written, per table, until ``take()`` hands them over (for the day's
    ``DayChanges.rows``)."""

    __slots__ = ("_rows",)

    def __init__(self) -> None:
        self._rows: dict[str, set[int]] = {}

    def take(self) -> dict[str, set[int]]:
        """The rowids noted since the last call, by table (as declared)."""
        # (The hook keeps one dict for good: what it noted is moved out.)
        noted = dict(self._rows)
        self._rows.clear()
        return noted

    def hook(self) -> Callable[[apsw.PreUpdate], None]:
        """The preupdate hook itself: a closure over the rowids' dict, not a bound method
        (SQLite calls it for every row written: kept to a few lookups and adds). It stands
        in for the event guards' own update hook, so it keeps that hook's one check."""
        rows = self._rows
        find = rows.get

        def written(change: apsw.PreUpdate) -> None:
            table = change.table_name
            old, new = change.rowid, change.rowid_new  # (equal but for a rowid UPDATE)
            if new == MAX_ROWID:
                refuse_max_rowid(table)
            found = find(table)
            if found is None:
                rows[table] = found = set()
            elif len(found) >= ROWIDS_PER_TABLE:
                rows[table] = TOO_MANY_ROWS
                return
            found.add(old)
            found.add(new)

        return written


class WriteLog:
    """Learns, per SQL text, which tables of one service a statement writes.

    Installed in front of the connection's guard authorizer (which still decides); it
    only listens.
    """

    def __init__(self, conn: apsw.Connection) -> None:
        self._guard: Authorizer | None = conn.authorizer
        # SQL text -> the tables it writes (cleared in place, never replaced: the
        # builder's per-event lookup holds this dict)
        self.write_sets: dict[str, frozenset[str]] = {}
        self._heard = False
        self._tables: set[str] = set()
        self._everything = False
        conn.authorizer = self._authorize

    @host_aware
    def _authorize(self, op: int, p1: str | None, p2: str | None, db: str | None,
                   trigger: str | None) -> int:
        if host_compiling():  # the host's own statement: not an event's write
            return apsw.SQLITE_OK
        self._heard = True
        if op in _WRITES:
            self._tables.add((p1 or "").lower())
        elif op not in _HARMLESS:
            self._everything = True
        return apsw.SQLITE_OK if self._guard is None else self._guard(op, p1, p2, db, trigger)

    def known(self, sql: str) -> frozenset[str] | None:
        """The tables `sql` writes, if learnt under the current schema."""
        return self.write_sets.get(sql)

    def start(self) -> None:
        """Listen to the fresh compile of one statement."""
        self._heard = self._everything = False
        self._tables = set()

    def learnt(self, sql: str) -> frozenset[str] | None:
        """What the statement since ``start()`` writes; None: possibly anything."""
        if self._everything or not self._heard:
            # The schema may have changed, so every remembered write set may be stale.
            self.write_sets.clear()
            return None
        tables = frozenset(self._tables)
        if len(self.write_sets) >= _MEMO_LIMIT:
            self.write_sets.clear()
        self.write_sets[sql] = tables
        return tables


def note_tables(changes: DayChanges, service: str, tables: frozenset[str] | None) -> None:
    """Add a statement's write set to the day's changes of `service`."""
    if service in changes.services:
        seen = changes.services[service]
        if seen is not None:
            if tables is None:
                changes.services[service] = None
            else:
                seen |= tables
    else:
        changes.services[service] = None if tables is None else set(tables)

