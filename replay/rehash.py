"""Per-day hashing that re-hashes only what the day changed.

The world hash is combined from per-table and per-file digests (``replay.hashing``), so a
day's manifest can carry over every digest of the previous day's manifest that the day
could not have changed, and stay equal to a full re-hash: the hash stays
history-independent. What "could have changed" comes from ``replay.touched`` and is
widened here, never narrowed:

* a service no event of the day wrote keeps its whole manifest (only its own connection
  writes its file);
* a written service whose day only wrote rows (every statement's write set known: no
  DDL, no PRAGMA) keeps its header and schema; otherwise they are read again, and if the
  schema differs at all (CREATE / DROP / ALTER / RENAME), or the day did anything but row
  writes there, or it has a virtual table (whose module writes shadow tables out of the
  authorizer's sight), every table is re-hashed;
* otherwise the tables written are re-hashed, plus every table whose foreign key reaches
  one of them (cascades), plus SQLite's own tables (``sqlite_sequence``, ``sqlite_stat1``);
* re-hashing a table keyed by an INTEGER PRIMARY KEY (a rowid table) re-reads only the
  rows SQLite's preupdate hook reported written, old and new rowids, in one query, when
  the hasher holds the table's rows from an earlier day (``_Rows``, within
  ROW_CACHE_BYTES). The preupdate hook reports every row change of a real table, the rows
  a REPLACE deletes included, and while it is set SQLite does not truncate a table
  wholesale; a rowid not found again is a deleted row. Rows are held as runs of a few
  dozen joined encodings: a day re-joins only the runs it wrote, and the digest hashes
  the runs in turn, the very byte stream a full read hashes;
* the workspace paths the day's events named are looked at again (only file events write
  the workspace while a world is built); app pins are re-read on a day with an app event.

The first day a ``DayHasher`` sees is hashed in full. Services are read through the
builder's idle connection (its page cache is hot): on a day that only wrote rows, under
the event guard (the hashing queries only read, so they pass it); otherwise with the
guard set aside, and through a fresh read-only connection when there are TEMP objects.
``tests/replay/test_rehash.py`` checks, for many generated logs, that every day's manifest
equals a full re-hash.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import json
import operator
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw
import msgspec
import xxhash

from replay.errors import WorldDirError
from replay.hashing import (
    MANIFEST_FORMAT,
    ROW_CHUNK,
    FileDigest,
    Manifest,
    Schema,
    ServiceManifest,
    TableDigest,
    TableInfo,
    file_digest,
    service_header,
    table_digests,
    table_infos,
    world_manifest,
)
from replay.layout import WORKSPACE, iter_apps, list_services, service_db
from replay.sqlite import open_readonly, quote_ident, unguarded
from replay.touched import TOO_MANY_ROWS, DayChanges
from worldstore.canonical import array_header, canonical_bytes

ROW_CACHE_BYTES = 128 << 20  # row encodings a hasher keeps in all, over every table
# Past one row in _REREAD_SHARE of a table written (other than new rows at its end), one
# scan of the whole table costs less than looking rows up by key.
_REREAD_SHARE = 3


SEGMENT_ROWS = 32  # rows a segment of a held table starts with (split past twice that)
_RAWS = msgspec.msgpack.Decoder(list[msgspec.Raw])  # an array's items, each as its bytes


@dataclass(slots=True)
class _Segment:
    """A run of a held table's rows, in key order: their keys and their canonical
    encodings joined; ``lengths`` (each encoding's length) is worked out from the joined
    bytes when a row of the run first changes."""

    keys: list[int]
    joined: bytes
    lengths: list[int] | None = None

    def row_lengths(self) -> list[int]:
        if self.lengths is None:
            raws = _RAWS.decode(array_header(len(self.keys)) + self.joined)
            self.lengths = [len(raw) for raw in raws]
        return self.lengths


class _Rows:
    """One rowid table's rows as last hashed, in key order, as segments of a few dozen
    rows, each holding its rows' encodings joined. A day re-joins only the segments it
    wrote, and the digest hashes the segments in turn: the same byte stream as hashing
    all of the table's encodings joined, without copying the table each day."""

    __slots__ = ("count", "firsts", "segments", "size")

    def __init__(self) -> None:
        self.segments: list[_Segment] = []
        self.firsts: list[int] = []  # each segment's first key (for bisect)
        self.count = 0
        self.size = 0  # bytes of the encodings

    @property
    def last(self) -> int | None:
        """The largest key held."""
        return self.segments[-1].keys[-1] if self.segments else None

    def add_rows(self, keys: list[int], rows: list[tuple[Any, ...]]) -> None:
        """Rows read from the table, in key order, all past the last key held: each run of
        SEGMENT_ROWS is encoded in one call (an array's encoding is its header followed by
        its items' encodings)."""
        start = 0
        segments = self.segments
        if segments and len(segments[-1].keys) < SEGMENT_ROWS and keys:
            start = SEGMENT_ROWS - len(segments[-1].keys)
            self._grow(segments[-1], keys[:start], rows[:start])
        for at in range(start, len(keys), SEGMENT_ROWS):
            part = rows[at:at + SEGMENT_ROWS]
            joined = canonical_bytes(part)[len(array_header(len(part))):]
            segments.append(_Segment(keys[at:at + SEGMENT_ROWS], joined))
            self.firsts.append(keys[at])
            self.size += len(joined)
        self.count += len(keys)

    def _grow(self, segment: _Segment, keys: list[int], rows: list[tuple[Any, ...]]) -> None:
        encoded = list(map(canonical_bytes, rows))
        if segment.lengths is not None:
            segment.lengths += map(len, encoded)
        grown = b"".join((segment.joined, *encoded))
        self.size += len(grown) - len(segment.joined)
        segment.joined = grown
        segment.keys += keys

    def change(self, rows: dict[int, bytes | None]) -> None:
        """Set the encodings of the rows keyed in `rows` (None: the row is gone); every
        key is at most the last held. Each segment written is re-joined once."""
        by_segment: dict[int, list[int]] = {}
        for key in sorted(rows):
            at = max(0, bisect.bisect_right(self.firsts, key) - 1)
            by_segment.setdefault(at, []).append(key)
        # From the last segment back, so that a split or a removal keeps the indices of
        # the segments still to do.
        for at in sorted(by_segment, reverse=True):
            self._rewrite(at, by_segment[at], rows)

    def _rewrite(self, at: int, changed: list[int], rows: dict[int, bytes | None]) -> None:
        """Re-join segment `at` with the rows keyed in `changed` (sorted) set from `rows`:
        the runs between them are copied as they are (one join in all)."""
        segment = self.segments[at]
        keys, lengths = segment.keys, segment.row_lengths()
        ends = list(itertools.accumulate(lengths))  # where each row's encoding ends
        view = memoryview(segment.joined)
        parts: list[bytes | memoryview] = []
        new_keys: list[int] = []
        new_lengths: list[int] = []
        done = offset = 0  # the first old row not yet taken, and where it starts
        for key in changed:
            row = bisect.bisect_left(keys, key, done)
            if row > done:  # the unchanged run before it
                parts.append(view[offset:ends[row - 1]])
                new_keys += keys[done:row]
                new_lengths += lengths[done:row]
                done, offset = row, ends[row - 1]
            if row < len(keys) and keys[row] == key:  # replaced or gone
                done, offset = row + 1, ends[row]
            data = rows[key]
            if data is not None:
                parts.append(data)
                new_keys.append(key)
                new_lengths.append(len(data))
        if done < len(keys):
            parts.append(view[offset:])
            new_keys += keys[done:]
            new_lengths += lengths[done:]
        joined = b"".join(parts)
        self.count += len(new_keys) - len(keys)
        self.size += len(joined) - len(segment.joined)
        if not new_keys:
            del self.segments[at], self.firsts[at]
        elif len(new_keys) <= 2 * SEGMENT_ROWS:
            self.segments[at] = _Segment(new_keys, joined, new_lengths)
            self.firsts[at] = new_keys[0]
        else:  # split in runs of SEGMENT_ROWS
            bounds = [0, *itertools.accumulate(new_lengths)]
            pieces = [_Segment(new_keys[i:i + SEGMENT_ROWS],
                               joined[bounds[i]:bounds[min(i + SEGMENT_ROWS, len(new_keys))]],
                               new_lengths[i:i + SEGMENT_ROWS])
                      for i in range(0, len(new_keys), SEGMENT_ROWS)]
            self.segments[at:at + 1] = pieces
            self.firsts[at:at + 1] = [piece.keys[0] for piece in pieces]

    def digest(self) -> TableDigest:
        """The table's digest, as ``table_digest`` reads it: its rows' encodings in
        chunks of ROW_CHUNK rows, each opening with its array header."""
        h = xxhash.xxh3_128()
        count = self.count
        if count <= ROW_CHUNK:
            if count:
                h.update(array_header(count))
                for segment in self.segments:
                    h.update(segment.joined)
            return TableDigest(rows=count, digest=h.hexdigest())
        done = 0  # rows hashed so far; a chunk of ROW_CHUNK rows opens with its header
        for segment in self.segments:
            rows = len(segment.keys)
            row = offset = 0
            while row < rows:
                if done % ROW_CHUNK == 0:
                    h.update(array_header(min(ROW_CHUNK, count - done)))
                take = min(rows - row, ROW_CHUNK - done % ROW_CHUNK)
                if take == rows:
                    h.update(segment.joined)
                else:  # a chunk ends inside this segment
                    size = sum(segment.row_lengths()[row:row + take])
                    h.update(memoryview(segment.joined)[offset:offset + size])
                    offset += size
                row += take
                done += take
        return TableDigest(rows=count, digest=h.hexdigest())


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
        # A service file appears only when an event runs SQL on a new service (and the
        # builder is the only writer of the world while it is built), so the folder is
        # listed again only then.
        known = changes.services.keys() <= last.services.keys()
        for name in list(last.services) if known else list_services(self.root):
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
            try:
                known = self._unchanged_header(name, before, written)
                if known is not None:
                    return self._read_rows_live(name, live, before, written, known)
                return self._read_all_live(name, live, before, written)
            except apsw.Error:
                pass  # the event connection's guards (limits, deadline) got in the way
        try:
            with open_readonly(path) as conn:
                return self._read_service(name, conn, before, written, service_header(conn))
        except apsw.Error as exc:  # the same refusal as a full hash gives
            raise WorldDirError(f"{path}: not a readable SQLite database ({exc})") from None

    def _unchanged_header(self, name: str, before: ServiceManifest | None,
                          written: set[str] | None) -> _Shape | None:
        """The service's shape when the day only wrote rows of it (every statement's
        write set known: no DDL, no PRAGMA), so its header and schema are as they were,
        and it has no virtual table (whose module may run SQL the event guard refuses)."""
        shape = self._shapes.get(name)
        if (written is None or before is None or shape is None or shape.cookie is None
                or shape.has_virtual or shape.schema != before.schema):
            return None
        return shape

    def _read_rows_live(self, name: str, live: apsw.Connection, before: ServiceManifest | None,
                        written: set[str] | None, shape: _Shape) -> ServiceManifest:
        """Re-hash a service whose day only wrote rows, through the builder's connection
        and under its event guard: the hashing queries only read tables, so they pass it
        and stay in the connection's statement cache from one day to the next."""
        assert before is not None
        # One read transaction for all of the queries: each on its own would take and
        # drop the file's lock and check its header again.
        unguarded(live, "BEGIN")
        try:
            return self._read_service(name, live, before, written,
                                      (before.user_version, before.application_id,
                                       before.schema), shape.cookie)
        finally:
            if live.in_transaction:  # (not after SQLite rolled back an error)
                unguarded(live, "COMMIT")

    def _read_all_live(self, name: str, live: apsw.Connection, before: ServiceManifest | None,
                       written: set[str] | None) -> ServiceManifest:
        """Re-hash a service through the builder's connection with its guard set aside:
        reading the header and the schema takes pragmas an event may not run. (Setting
        the guard back expires the statements compiled without it, so no event can use
        them unguarded.)"""
        guard = live.authorizer
        live.authorizer = None
        try:
            live.execute("BEGIN")
            try:
                # The header's numbers, the schema's version (SQLite's schema cookie, moved
                # by every schema change) and whether there are TEMP objects (one could
                # shadow a main table in the unqualified hashing queries).
                found = live.execute(_HEADER).fetchone()
                if found is None or found[3]:
                    raise apsw.SQLError("TEMP objects: hash through a fresh connection")
                user_version, application_id, cookie = found[0], found[1], found[2]
                shape = self._shapes.get(name)
                schema = (shape.schema if shape is not None and shape.cookie == cookie
                          else service_header(live)[2])
                return self._read_service(name, live, before, written,
                                          (user_version, application_id, schema), cookie)
            finally:
                if live.in_transaction:  # (not after SQLite rolled back an error)
                    live.execute("COMMIT")
        finally:
            live.authorizer = guard

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
            if reread:
                found = rows.digest()
                self._rows_bytes += rows.size - before
                return found
            self._rows_bytes += rows.size - before
        # No encodings held, too many rows written: read it all.
        self._drop_rows(key)
        rows = _read_all(conn, info)
        found = rows.digest()
        if self._rows_bytes + rows.size <= ROW_CACHE_BYTES:
            self._rows[key] = rows
            self._rows_bytes += rows.size
        return found

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
        """The workspace's file digests: those of the previous day, with each path the
        day's events named looked at again (without following it). Only file events
        change the workspace while a world is built, and each changes only its own path
        (plus empty folders, which are not hashed)."""
        if not written:
            return before
        files = dict(before)
        workspace = self.root / WORKSPACE
        for rel in written:
            path = workspace / rel
            try:
                if stat.S_ISDIR(os.lstat(path).st_mode):
                    files.pop(rel, None)
                else:
                    files[rel] = file_digest(path)
            except (FileNotFoundError, NotADirectoryError):
                files.pop(rel, None)
        if files.keys() - before.keys():  # a new path: keep the listing's order
            files = dict(sorted(files.items(), key=_path_order))
        return files

    def _apps(self, before: dict[str, FileDigest], written: bool) -> dict[str, FileDigest]:
        if not written:
            return before
        return {name: file_digest(path) for name, path in iter_apps(self.root)}


def _select(info: TableInfo) -> str:
    cols = ", ".join(quote_ident(c) for c in info.columns)
    return f"SELECT {cols} FROM {quote_ident(info.name)}"


def _read_all(conn: apsw.Connection, info: TableInfo) -> _Rows:
    rows = _Rows()
    found = conn.execute(f"{_select(info)} ORDER BY {info.order_by}").fetchall()
    rows.add_rows(list(map(operator.itemgetter(info.columns.index(info.key[0])), found)),
                  found)
    return rows


def _reread(conn: apsw.Connection, info: TableInfo, rows: _Rows, written: set[int]
            ) -> bool:
    """Bring `rows` up to date for the rowids written, read again in one query by key;
    a rowid not found any more is a deleted row. False: reading the whole table is
    cheaper (past one row in _REREAD_SHARE of it written, not counting new rows at its
    end). (The query binds the keys, so its text is the same every day.) Safe to run
    again for the same rowids: rows already brought up to date are set to what they are."""
    if not written:
        return True
    last = rows.last
    if last is None:
        last = min(written) - 1
    earlier = [r for r in written if r <= last]
    if len(earlier) * _REREAD_SHARE > rows.count:
        return False
    at = info.columns.index(info.key[0])
    key = quote_ident(info.key[0])
    found = conn.execute(
        f"{_select(info)} WHERE {key} IN (SELECT value FROM json_each(?)) ORDER BY {key}",
        (json.dumps(sorted(written)),)).fetchall()
    keys = list(map(operator.itemgetter(at), found))
    new = bisect.bisect_right(keys, last)  # rows from here on are past the last held
    if earlier:
        changed: dict[int, bytes | None] = dict.fromkeys(earlier)
        changed.update(zip(keys[:new], map(canonical_bytes, found[:new]), strict=True))
        rows.change(changed)
    if new < len(keys):
        rows.add_rows(keys[new:], found[new:])
    return True


_HEADER = ("SELECT (SELECT user_version FROM pragma_user_version), "
           "(SELECT application_id FROM pragma_application_id), "
           "(SELECT schema_version FROM pragma_schema_version), "
           "EXISTS (SELECT 1 FROM temp.sqlite_schema)")


def _path_order(item: tuple[str, FileDigest]) -> bytes:
    return item[0].encode("utf-8", "surrogateescape")  # as iter_workspace sorts paths


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
