"""Reading a world's tables for people: the tables of a service, a page of rows, a search.

Pages come in the order the world hash reads a table (``replay.hashing.table_infos``): the
primary key where it totally orders the rows (an INTEGER PRIMARY KEY, or the key of a
``WITHOUT ROWID`` table, which has no rowid to order by), otherwise every column byte-wise.
That order depends on the rows alone, so two worlds with the same hash page alike, and
paging through a table meets each row once.

A search keeps the rows where any column, read as text, contains the words literally: the
pattern's ``%``, ``_`` and ``\\`` are escaped (``worldstore.sqlcheck.like_escape``), and as
LIKE does, ASCII letters match in either case.

Everything is read through a read-only connection of the world directory given, which the
caller keeps in place for the call (``Worlds.pinned``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw

from replay.errors import WorldDirError
from replay.hashing import TableInfo, table_infos
from replay.layout import list_services, service_db
from replay.sqlite import open_readonly, quote_ident
from worldstore.errors import NotFoundError
from worldstore.sqlcheck import like_escape

MAX_PAGE_ROWS = 10_000


@dataclass(frozen=True)
class TableSummary:
    """One table of a service: its visible columns, its primary-key columns (empty when it
    has none that orders the rows), whether it is ``WITHOUT ROWID``, and its row count."""

    name: str
    kind: str  # 'table' or 'virtual'
    columns: tuple[str, ...]
    key: tuple[str, ...]
    without_rowid: bool
    rows: int | None  # None for a virtual table that cannot be read back


@dataclass(frozen=True)
class RowsPage:
    """Rows ``offset`` .. ``offset + len(rows)`` of a table (of those that match ``search``
    when one is given) and how many there are in all."""

    service: str
    table: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    total: int
    offset: int
    search: str


def service_tables(world: Path, service: str) -> list[TableSummary]:
    """The tables of `service` in the world directory `world`, sorted by name."""
    with _open(world, service) as conn:
        without = {str(name) for (name,) in conn.execute(
            "SELECT name FROM pragma_table_list WHERE schema = 'main' AND wr = 1")}
        found = []
        for info in table_infos(conn):
            try:
                counted: list[tuple[Any, ...]] = conn.execute(
                    f"SELECT count(*) FROM {quote_ident(info.name)}").fetchall()
                rows: int | None = int(counted[0][0])
            except apsw.SQLError:
                if info.kind != "virtual":
                    raise
                rows = None  # contentless: nothing to read back (the hash skips it too)
            found.append(TableSummary(info.name, info.kind, tuple(info.columns), info.key,
                                      info.name in without, rows))
        return found


def read_rows(world: Path, service: str, table: str, *, offset: int = 0, limit: int = 50,
              search: str = "") -> RowsPage:
    """A page of `table`'s rows in the order of the world hash (see the module docstring),
    at most `limit` from `offset`, of those with a column containing `search` when given.

    NotFoundError for a service or table the world lacks; WorldDirError for a table that
    cannot be read back (a contentless virtual table)."""
    if offset < 0 or not 1 <= limit <= MAX_PAGE_ROWS:
        raise ValueError(f"offset must be 0 or more and limit 1 to {MAX_PAGE_ROWS}, got "
                         f"offset {offset}, limit {limit}")
    with _open(world, service) as conn:
        info = _table(conn, service, table)
        where, params = _search(info, search)
        name = quote_ident(info.name)
        try:
            counted: list[tuple[Any, ...]] = conn.execute(
                f"SELECT count(*) FROM {name}{where}", params).fetchall()
            shown = ", ".join(quote_ident(c) for c in info.columns) or "*"
            rows = conn.execute(
                f"SELECT {shown} FROM {name}{where} ORDER BY {info.order_by} LIMIT ? OFFSET ?",
                [*params, limit, offset]).fetchall()
        except apsw.SQLError as exc:
            raise WorldDirError(f"table {service}.{table} cannot be read back: {exc}") from None
    return RowsPage(service, info.name, tuple(info.columns), tuple(tuple(r) for r in rows),
                    int(counted[0][0]), offset, search)


def _open(world: Path, service: str) -> AbstractContextManager[apsw.Connection]:
    # Only a service the world lists: the name never becomes a path of its own choosing.
    if service not in list_services(world):
        raise NotFoundError(f"no service {service!r} in the world")
    return open_readonly(service_db(world, service))


def _table(conn: apsw.Connection, service: str, table: str) -> TableInfo:
    for info in table_infos(conn):
        if info.name == table:
            return info
    raise NotFoundError(f"no table {service}.{table} in the world")


def _search(info: TableInfo, text: str) -> tuple[str, list[str]]:
    if not text or not info.columns:
        return "", []
    pattern = f"%{like_escape(text)}%"
    clause = " OR ".join(f"CAST({quote_ident(c)} AS TEXT) LIKE ? ESCAPE '\\'"
                         for c in info.columns)
    return f" WHERE {clause}", [pattern] * len(info.columns)


__all__ = ["MAX_PAGE_ROWS", "RowsPage", "TableSummary", "read_rows", "service_tables"]
