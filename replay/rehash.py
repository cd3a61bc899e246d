"""Per-day hashing that re-hashes only what the day changed.

The world hash is combined from per-table and per-file digests (``replay.hashing``), so a
day's manifest can carry over every digest of the previous day's manifest that the day
could not have changed, and stay equal to a full re-hash: the hash stays
history-independent. What "could have changed" comes from ``replay.touched`` and is
widened here, never narrowed:

* a service no event of the day wrote keeps its whole manifest (only its own connection
  writes its file);
* a written service has its header and schema re-read; if the schema differs at all
  (CREATE / DROP / ALTER / RENAME), or the day did anything but row writes there, or it
  has a virtual table (whose module writes shadow tables out of the authorizer's sight),
  every table is re-hashed;
* otherwise the tables written are re-hashed, plus every table whose foreign key reaches
  one of them (cascades), plus SQLite's own tables (``sqlite_sequence``, ``sqlite_stat1``);
* re-hashing a table keyed by an INTEGER PRIMARY KEY (a rowid table) re-reads only the
  rows SQLite's update hook reported written, when the hasher holds the table's row
  encodings from an earlier day (``_Rows``, within ROW_CACHE_BYTES): the digest is then
  computed from the encodings, in key order, exactly as a full read hashes them. SQLite
  does not report every change (REPLACE's deletions, the truncate optimisation), so the
  table's row count is checked as well and any difference means a full re-read;
* the workspace is re-listed only on a day with file events, and only the files those
  events name are re-read; app pins are re-read on a day with an app event.

The first day a ``DayHasher`` sees is hashed in full. Services are read through the
builder's idle connection when it has no TEMP objects (its page cache is hot), else a
fresh read-only one; either runs the same queries as a full hash. ``tests/test_rehash.py`` checks,
for many generated logs, that every day's manifest equals a full re-hash.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import apsw

from replay.errors import WorldDirError
from replay.hashing import (
    MANIFEST_FORMAT,
    FileDigest,
    Manifest,
    Schema,
    ServiceManifest,
    TableDigest,
    TableInfo,
    digest_of_encoded_rows,
    file_digest,
    service_header,
    table_digests,
    table_infos,
    world_manifest,
)
from replay.layout import iter_apps, iter_workspace, list_services, service_db
from replay.sqlite import open_readonly, quote_ident
from replay.touched import TOO_MANY_ROWS, DayChanges
from worldstore.canonical import canonical_bytes

ROW_CACHE_BYTES = 128 << 20  # row encodings a hasher keeps in all, over every table
# Past one row in _REREAD_SHARE of a table written (other than new rows at its end), one
# scan of the whole table costs less than looking rows up by key.
_REREAD_SHARE = 3


@dataclass(slots=True)
class _Rows:
    """One rowid table's rows as last hashed: keys in order, and each row's canonical
    encoding at the same position (so a digest joins them without a per-row step)."""

    keys: list[int] = field(default_factory=list)
    encoded: list[bytes] = field(default_factory=list)
    size: int = 0  # bytes of the encodings

    def put(self, key: int, data: bytes) -> None:
        keys = self.keys
        if not keys or key > keys[-1]:  # new rows mostly take the next key
            keys.append(key)
            self.encoded.append(data)
        else:
            at = bisect.bisect_left(keys, key)
            if at < len(keys) and keys[at] == key:
                self.size -= len(self.encoded[at])
                self.encoded[at] = data
            else:
                keys.insert(at, key)
                self.encoded.insert(at, data)
        self.size += len(data)

    def drop(self, key: int) -> None:
        keys = self.keys
        at = bisect.bisect_left(keys, key)
        if at < len(keys) and keys[at] == key:
            self.size -= len(self.encoded[at])
            del keys[at]
            del self.encoded[at]

    def extend(self, keys: list[int], encoded: list[bytes]) -> None:
        """Rows whose keys are all past the last one held, in key order."""
        self.keys += keys
        self.encoded += encoded
        self.size += sum(map(len, encoded))

    def digest(self) -> TableDigest:
        return digest_of_encoded_rows(self.encoded)


@dataclass(frozen=True, slots=True)
class _Shape:
    """What a service's schema implies for hashing: its tables, and who cascades from whom."""

    schema: Schema
    infos: list[TableInfo]
    referrers: dict[str, frozenset[str]]  # table -> tables with a foreign key to it
    has_virtual: bool
    # The schema cookie it was read at, through the builder's connection (None: not
    # known). While the cookie stays, so does the schema: SQLite moves it on every change.
    cookie: int | None = None

    def dirty(self, written: set[str]) -> set[str]:
        """The written tables and every table a foreign key cascade could reach from them."""
        dirty = set(written)
        todo = list(written)
        while todo:
            for child in self.referrers.get(todo.pop(), ()):
                if child not in dirty:
                    dirty.add(child)
                    todo.append(child)
        return dirty


class DayHasher:
    """Hashes one world directory after each day, carrying digests from the day before."""

    def __init__(self, root: Path,
                 connection: Callable[[str], apsw.Connection | None] | None = None) -> None:
        self.root = root
        # The builder's own idle connection to a service, when it has one: reading
        # through it skips opening the file and re-reading pages it has cached.
        self._connection = connection
        self._last: Manifest | None = None
        self._shapes: dict[str, _Shape] = {}
        self._rows: dict[tuple[str, str], _Rows] = {}  # (service, table) -> encodings
        self._rows_bytes = 0
        self._written_rows: dict[str, dict[str, set[int]]] = {}

    @property
    def reads_rows(self) -> bool:
        """Whether the next manifest reads ``DayChanges.rows`` (not on the first day, which
        is hashed in full)."""
        return self._last is not None

    def manifest(self, changes: DayChanges) -> Manifest:
        """The world's manifest now; `changes` is everything written since the last call."""
        last = self._last
        self._written_rows = changes.rows
        found = self._first() if last is None else self._update(last, changes)
        self._last = found
        return found

    def _first(self) -> Manifest:
        """A full hash, as ``world_manifest``, that keeps rowid tables' rows for later days."""
        return world_manifest(self.root, lambda name: self._service(name, None, None))

    def _update(self, last: Manifest, changes: DayChanges) -> Manifest:
        services = {}
        for name in list_services(self.root):
            before = last.services.get(name)
            if before is not None and name not in changes.services:
                services[name] = before
            elif before is None:
                services[name] = self._service(name, None, None)
            else:
                services[name] = self._service(name, before, changes.services[name])
        return Manifest(format=MANIFEST_FORMAT, services=services,
                        files=self._files(last.files, changes.files),
                        apps=self._apps(last.apps, changes.apps))

    def _service(self, name: str, before: ServiceManifest | None, written: set[str] | None
                 ) -> ServiceManifest:
        path = service_db(self.root, name)
        live = self._connection(name) if self._connection else None
        if live is not None:
            guard = live.authorizer
            live.authorizer = None  # hashing's own queries are not events
            try:
                # One read transaction for all of the service's queries: each on its own
                # would take and drop the file's lock and check its header again.
                live.execute("BEGIN")
                try:
                    # The header's numbers, the schema's version (SQLite's schema cookie,
                    # moved by every schema change) and whether there are TEMP objects
                    # (one could shadow a main table in the unqualified hashing queries).
                    found = live.execute(_HEADER).fetchone()
                    if found is not None and not found[3]:
                        user_version, application_id, cookie = found[0], found[1], found[2]
                        shape = self._shapes.get(name)
                        schema = (shape.schema if shape is not None and shape.cookie == cookie
                                  else service_header(live)[2])
                        return self._read_service(name, live, before, written,
                                                  (user_version, application_id, schema),
                                                  cookie)
                finally:
                    if live.in_transaction:  # (not after SQLite rolled back an error)
                        live.execute("COMMIT")
            except apsw.Error:
                pass  # the event connection's guards (limits, deadline) got in the way
            finally:
                live.authorizer = guard
        try:
            with open_readonly(path) as conn:
                return self._read_service(name, conn, before, written, service_header(conn))
        except apsw.Error as exc:  # the same refusal as a full hash gives
            raise WorldDirError(f"{path}: not a readable SQLite database ({exc})") from None

    def _read_service(self, name: str, conn: apsw.Connection, before: ServiceManifest | None,
                      written: set[str] | None, header: tuple[int, int, Schema],
                      cookie: int | None = None) -> ServiceManifest:
        user_version, application_id, schema = header
        shape = self._shape(name, conn, schema, cookie)
        if shape.has_virtual:  # always hashed in full: no rows worth keeping
            self._forget_rows(name)
            tables = table_digests(conn, shape.infos)
        elif before is None or written is None or schema != before.schema:
            self._forget_rows(name)
            tables = {info.name: self._rowid_table(name, conn, info) if info.rowid_key
                      else table_digests(conn, [info])[info.name] for info in shape.infos}
        else:
            keep = _unchanged(before.tables, shape.dirty(written))
            tables = {}
            for info in shape.infos:
                kept = keep.get(info.name)
                tables[info.name] = kept if kept is not None else (
                    self._rowid_table(name, conn, info) if info.rowid_key
                    else table_digests(conn, [info])[info.name])
        return ServiceManifest(user_version, application_id, schema, tables)

    def _rowid_table(self, service: str, conn: apsw.Connection, info: TableInfo
                     ) -> TableDigest:
        """A rowid table's digest, re-reading only its written rows when it can."""
        key = (service, info.name)
        rows = self._rows.get(key)
        written = self._written_rows.get(service, {}).get(info.name, set())
        if rows is not None and written is not TOO_MANY_ROWS:
            before = rows.size
            reread = _reread(conn, info, rows, written)
            self._rows_bytes += rows.size - before
            if reread and _row_count(conn, info) == len(rows.keys):
                return rows.digest()
        # No encodings held, too many rows written, or a change SQLite did not report.
        self._drop_rows(key)
        rows = _read_all(conn, info)
        if self._rows_bytes + rows.size <= ROW_CACHE_BYTES:
            self._rows[key] = rows
            self._rows_bytes += rows.size
        return rows.digest()

    def _drop_rows(self, key: tuple[str, str]) -> None:
        rows = self._rows.pop(key, None)
        if rows is not None:
            self._rows_bytes -= rows.size

    def _forget_rows(self, service: str) -> None:
        for key in [k for k in self._rows if k[0] == service]:
            self._drop_rows(key)

    def _shape(self, name: str, conn: apsw.Connection, schema: Schema, cookie: int | None
               ) -> _Shape:
        shape = self._shapes.get(name)
        if shape is not None and cookie is not None and shape.cookie == cookie:
            return shape  # (its schema is this one: the cookie has not moved)
        if shape is None or shape.schema != schema:
            # Equal schema entries (their SQL included) give equal table infos.
            infos = table_infos(conn)
            shape = _Shape(schema, infos, _referrers(conn, infos),
                           any(info.kind == "virtual" for info in infos), cookie)
        elif shape.cookie != cookie:
            shape = dataclasses.replace(shape, cookie=cookie)
        self._shapes[name] = shape
        return shape

    def _files(self, before: dict[str, FileDigest], written: set[str]
               ) -> dict[str, FileDigest]:
        if not written:
            return before
        # The listing decides which paths exist (as a full hash would); only the paths
        # the day's events named are read again.
        files = {}
        for rel, path in iter_workspace(self.root):
            kept = before.get(rel)
            files[rel] = kept if kept is not None and rel not in written else file_digest(path)
        return files

    def _apps(self, before: dict[str, FileDigest], written: bool) -> dict[str, FileDigest]:
        if not written:
            return before
        return {name: file_digest(path) for name, path in iter_apps(self.root)}


def _row_count(conn: apsw.Connection, info: TableInfo) -> int:
    found = conn.execute(f"SELECT count(*) FROM {quote_ident(info.name)}").fetchone()
    return -1 if found is None else int(found[0])


def _select(info: TableInfo) -> str:
    cols = ", ".join(quote_ident(c) for c in info.columns)
    return f"SELECT {cols} FROM {quote_ident(info.name)}"


def _read_all(conn: apsw.Connection, info: TableInfo) -> _Rows:
    rows = _Rows()
    _append_scan(conn, info, rows, f"{_select(info)} ORDER BY {info.order_by}")
    return rows


def _append_scan(conn: apsw.Connection, info: TableInfo, rows: _Rows, sql: str,
                 params: tuple[int, ...] = ()) -> None:
    found = conn.execute(sql, params).fetchall()
    rows.extend(list(map(operator.itemgetter(info.columns.index(info.key[0])), found)),
                list(map(canonical_bytes, found)))


def _reread(conn: apsw.Connection, info: TableInfo, rows: _Rows, written: set[int]
            ) -> bool:
    """Bring `rows` up to date for the rowids written; False: reading the whole table is
    cheaper. Rows past the last key held are new: one range scan reads them all, whether
    SQLite reported them or not. The others written are read again by key. (The texts
    bind their values, so each is compiled once and then found in the statement cache.)"""
    at = info.columns.index(info.key[0])
    key = quote_ident(info.key[0])
    if not rows.keys:
        _append_scan(conn, info, rows, f"{_select(info)} ORDER BY {key}")
        return True
    top = rows.keys[-1]
    earlier = sorted(r for r in written if r <= top)
    if len(earlier) * _REREAD_SHARE > len(rows.keys):
        return False
    if earlier:
        for rowid in earlier:
            rows.drop(rowid)
        by_key = f"{_select(info)} WHERE {key} IN (SELECT value FROM json_each(?))"
        for row in conn.execute(by_key, (json.dumps(earlier),)):
            rows.put(row[at], canonical_bytes(row))
    _append_scan(conn, info, rows, f"{_select(info)} WHERE {key} > ? ORDER BY {key}", (top,))
    return True


_HEADER = ("SELECT (SELECT user_version FROM pragma_user_version), "
           "(SELECT application_id FROM pragma_application_id), "
           "(SELECT schema_version FROM pragma_schema_version), "
           "EXISTS (SELECT 1 FROM temp.sqlite_schema)")


def _unchanged(tables: dict[str, TableDigest], dirty: set[str]) -> dict[str, TableDigest]:
    """The digests that carry over: tables not dirty and not SQLite's own (which SQLite
    writes without asking the authorizer)."""
    return {name: d for name, d in tables.items()
            if name.lower() not in dirty and not name.lower().startswith("sqlite_")}


def _referrers(conn: apsw.Connection, infos: list[TableInfo]) -> dict[str, frozenset[str]]:
    found: dict[str, set[str]] = {}
    for info in infos:
        if info.kind != "table":
            continue
        for (parent,) in conn.execute(
            'SELECT "table" FROM pragma_foreign_key_list(?)', (info.name,)
        ):
            found.setdefault(str(parent).lower(), set()).add(info.name.lower())
    return {parent: frozenset(children) for parent, children in found.items()}
