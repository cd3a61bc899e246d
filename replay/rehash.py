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
* the workspace is re-listed only on a day with file events, and only the files those
  events name are re-read; app pins are re-read on a day with an app event.

The first day a ``DayHasher`` sees is hashed in full. Services are read through the
builder's idle connection when it has no TEMP objects (its page cache is hot), else a
fresh read-only one; either runs the same queries as a full hash. ``tests/test_rehash.py`` checks,
for many generated logs, that every day's manifest equals a full re-hash.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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
    file_digest,
    service_header,
    service_manifest,
    table_digests,
    table_infos,
    world_manifest,
)
from replay.layout import iter_apps, iter_workspace, list_services, service_db
from replay.sqlite import open_readonly
from replay.touched import DayChanges


@dataclass(frozen=True, slots=True)
class _Shape:
    """What a service's schema implies for hashing: its tables, and who cascades from whom."""

    schema: Schema
    infos: list[TableInfo]
    referrers: dict[str, frozenset[str]]  # table -> tables with a foreign key to it
    has_virtual: bool

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

    def manifest(self, changes: DayChanges) -> Manifest:
        """The world's manifest now; `changes` is everything written since the last call."""
        last = self._last
        found = world_manifest(self.root) if last is None else self._update(last, changes)
        self._last = found
        return found

    def _update(self, last: Manifest, changes: DayChanges) -> Manifest:
        services = {}
        for name in list_services(self.root):
            before = last.services.get(name)
            if before is not None and name not in changes.services:
                services[name] = before
            elif before is None:
                services[name] = service_manifest(service_db(self.root, name))
            else:
                services[name] = self._service(name, before, changes.services[name])
        return Manifest(format=MANIFEST_FORMAT, services=services,
                        files=self._files(last.files, changes.files),
                        apps=self._apps(last.apps, changes.apps))

    def _service(self, name: str, before: ServiceManifest, written: set[str] | None
                 ) -> ServiceManifest:
        path = service_db(self.root, name)
        live = self._connection(name) if self._connection else None
        if live is not None:
            guard = live.authorizer
            live.authorizer = None  # hashing's own queries are not events
            try:
                # (A TEMP table could shadow a main one in the unqualified hashing queries.)
                if not _has_temp_objects(live):
                    return self._read_service(name, live, before, written)
            except apsw.Error:
                pass  # the event connection's guards (limits, deadline) got in the way
            finally:
                live.authorizer = guard
        try:
            with open_readonly(path) as conn:
                return self._read_service(name, conn, before, written)
        except apsw.Error as exc:  # the same refusal as a full hash gives
            raise WorldDirError(f"{path}: not a readable SQLite database ({exc})") from None

    def _read_service(self, name: str, conn: apsw.Connection, before: ServiceManifest,
                      written: set[str] | None) -> ServiceManifest:
        user_version, application_id, schema = service_header(conn)
        shape = self._shape(name, conn, schema)
        keep = None
        if written is not None and schema == before.schema and not shape.has_virtual:
            keep = _unchanged(before.tables, shape.dirty(written))
        tables = table_digests(conn, shape.infos, keep)
        return ServiceManifest(user_version, application_id, schema, tables)

    def _shape(self, name: str, conn: apsw.Connection, schema: Schema) -> _Shape:
        shape = self._shapes.get(name)
        if shape is None or shape.schema != schema:
            # Equal schema entries (their SQL included) give equal table infos.
            infos = table_infos(conn)
            shape = _Shape(schema, infos, _referrers(conn, infos),
                           any(info.kind == "virtual" for info in infos))
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


def _has_temp_objects(conn: apsw.Connection) -> bool:
    return conn.execute("SELECT 1 FROM temp.sqlite_schema LIMIT 1").fetchone() is not None


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
