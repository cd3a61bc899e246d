"""The world hash: one logical, history-independent digest of a world directory.

Why logical rather than canonical file bytes: two databases with equal content can
differ in page layout, freelist, root-page numbers and the order tables were created;
``VACUUM INTO`` removes the first two but not the last, so its bytes still remember
history. Here every database contributes its ``user_version`` and ``application_id``,
its schema entries sorted by (type, name) without root pages, and every row of every
table (``sqlite_sequence`` included) in primary-key order, encoded with the canonical
MessagePack encoding in fixed-size chunks. The workspace contributes sorted relative
paths and the digests of their contents. The result is a manifest (per-table and
per-file digests, used by verify and diff to name what differs) whose canonical
encoding is hashed into the world hash.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw
import msgspec
import xxhash

from replay.errors import WorldDirError
from replay.files import SPECIAL_KINDS, SYMLINK, kind_of, read_chunks
from replay.layout import iter_apps, iter_workspace, list_services, service_db
from replay.sqlite import open_readonly, quote_ident
from worldstore.canonical import canonical_bytes, digest, digest_of

MANIFEST_FORMAT = 1
ROW_CHUNK = 1024
FILE_CHUNK = 1 << 20


class TableDigest(msgspec.Struct, frozen=True, array_like=True):
    rows: int
    digest: str


class ServiceManifest(msgspec.Struct, frozen=True):
    user_version: int
    application_id: int
    schema: list[tuple[str, str, str, str | None]]  # (type, name, tbl_name, sql)
    tables: dict[str, TableDigest]


class FileDigest(msgspec.Struct, frozen=True, array_like=True):
    size: int
    digest: str
    link: str | None = None  # symlink target, for symlinks


class Manifest(msgspec.Struct, frozen=True, omit_defaults=True):
    format: int
    services: dict[str, ServiceManifest]
    files: dict[str, FileDigest]
    # App pins (apps/<service>.json, carried code apps/<service>.py). Omitted when empty,
    # so worlds without pins hash exactly as before pins existed.
    apps: dict[str, FileDigest] = {}

    def world_hash(self) -> str:
        return digest_of(self)


@dataclass(frozen=True, slots=True)
class TableInfo:
    name: str
    columns: list[str]
    order_by: str
    kind: str  # 'table' or 'virtual'
    key: tuple[str, ...] = ()  # primary-key columns when they totally order the rows
    # The key is one INTEGER PRIMARY KEY of a rowid table: its value is the rowid, which
    # SQLite's preupdate hook reports for every row a statement writes.
    rowid_key: bool = False


def table_infos(conn: apsw.Connection) -> list[TableInfo]:
    infos = []
    rows: list[tuple[Any, ...]] = conn.execute(
        "SELECT name, type, wr FROM pragma_table_list WHERE schema = 'main' "
        "AND type IN ('table', 'virtual') ORDER BY name"
    ).fetchall()
    for name, kind, without_rowid in rows:
        if name.startswith("sqlite_") and name not in ("sqlite_sequence", "sqlite_stat1"):
            continue
        cols: list[tuple[Any, ...]] = conn.execute(
            "SELECT name, pk, hidden FROM pragma_table_xinfo(?) ORDER BY cid", (name,)
        ).fetchall()
        visible = [c[0] for c in cols if c[2] == 0]
        order_by, key, rowid_key = _order_by(conn, name, cols, kind, bool(without_rowid))
        infos.append(TableInfo(name, visible, order_by, kind, key, rowid_key=rowid_key))
    return infos


def _order_by(conn: apsw.Connection, table: str, cols: list[Any], kind: str,
              without_rowid: bool) -> tuple[str, tuple[str, ...], bool]:
    """The ORDER BY that hashes a table's rows, the primary key when it alone gives that
    order (otherwise empty), and whether that key is the rowid (see TableInfo)."""
    if kind == "virtual":
        return "rowid", (), False
    pk = sorted((c for c in cols if c[1] > 0), key=lambda c: c[1])
    integer_pk = len(pk) == 1 and not without_rowid and _is_rowid_alias(conn, table, pk[0][0])
    if integer_pk or (pk and without_rowid):
        # Unique and NOT NULL: primary-key order is a total order on the rows.
        return (", ".join(quote_ident(c[0]) for c in pk), tuple(c[0] for c in pk),
                integer_pk and not table.startswith("sqlite_"))
    # No primary key, or one that admits NULLs: order by every column, byte-wise, so equal
    # rows in any insertion order come out the same.
    keys = [c[0] for c in pk] + [c[0] for c in cols if c[1] == 0 and c[2] == 0]
    return ", ".join(_value_order(quote_ident(k)) for k in keys), (), False


def _value_order(column: str) -> str:
    # SQL calls integer 1 and real 1.0 equal, and 0.0 and -0.0; such ties would come out
    # in insertion order. typeof() and the sign of a zero (atan2(-0.0, -1) = -pi) break them,
    # so rows that differ at all are ordered the same way whatever their history.
    return f"{column} COLLATE BINARY, typeof({column}), atan2({column}, -1)"


def _is_rowid_alias(conn: apsw.Connection, table: str, column: str) -> bool:
    decl = _scalar(conn, "SELECT type FROM pragma_table_xinfo(?) WHERE name = ?",
                   (table, column))
    return str(decl).upper() == "INTEGER"


def _scalar(conn: apsw.Connection, sql: str, params: tuple[Any, ...] = ()) -> Any:
    row = conn.execute(sql, params).fetchone()
    return None if row is None else row[0]


def table_digest(conn: apsw.Connection, info: TableInfo) -> TableDigest:
    h = xxhash.xxh3_128()
    cols = ", ".join(quote_ident(c) for c in info.columns) or "*"
    cursor = conn.execute(
        f"SELECT {cols} FROM {quote_ident(info.name)} ORDER BY {info.order_by}"
    )
    count = 0
    while chunk := list(itertools.islice(cursor, ROW_CHUNK)):
        count += len(chunk)
        h.update(canonical_bytes(chunk))
    return TableDigest(rows=count, digest=h.hexdigest())


def service_manifest(path: Path) -> ServiceManifest:
    try:
        return _service_manifest(path)
    except apsw.Error as exc:  # a damaged or foreign file: refuse it in our own terms
        raise WorldDirError(f"{path}: not a readable SQLite database ({exc})") from None


def _service_manifest(path: Path) -> ServiceManifest:
    with open_readonly(path) as conn:
        user_version, application_id, schema = service_header(conn)
        tables = table_digests(conn, table_infos(conn))
    return ServiceManifest(user_version, application_id, schema, tables)


Schema = list[tuple[str, str, str, str | None]]


def service_header(conn: apsw.Connection) -> tuple[int, int, Schema]:
    """``user_version``, ``application_id`` and the schema entries of a database."""
    user_version = int(_scalar(conn, "PRAGMA user_version"))
    application_id = int(_scalar(conn, "PRAGMA application_id"))
    schema = [
        (t, n, tb, sql)
        for t, n, tb, sql in conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_schema "
            "WHERE name NOT LIKE 'sqlite_autoindex_%' ORDER BY type, name"
        )
    ]
    return user_version, application_id, schema


def table_digests(conn: apsw.Connection, infos: list[TableInfo],
                  keep: dict[str, TableDigest] | None = None) -> dict[str, TableDigest]:
    """The digest of every table in `infos`, taken from `keep` where it has one (the
    caller vouches that those tables are unchanged)."""
    tables = {}
    for info in infos:
        kept = None if keep is None else keep.get(info.name)
        if kept is not None:
            tables[info.name] = kept
            continue
        try:
            tables[info.name] = table_digest(conn, info)
        except apsw.SQLError:
            if info.kind != "virtual":
                raise
            # Contentless virtual tables cannot be read back; their schema is hashed.
    return tables


def file_digest(path: Path) -> FileDigest:
    """A file's digest, read without trusting it: a symlink is recorded by its target
    (never followed); a special file (FIFO, socket, device) by its kind as the digest
    (never opened; no content digest is a kind name); a regular file is streamed."""
    st = os.lstat(path)
    kind = kind_of(st.st_mode)
    if kind == SYMLINK:
        target = os.readlink(path)
        return FileDigest(size=0, digest=digest(os.fsencode(target)), link=target)
    if kind in SPECIAL_KINDS:
        return FileDigest(size=0, digest=kind)
    h = xxhash.xxh3_128()
    size = 0
    for block in read_chunks(path, FILE_CHUNK, st):
        size += len(block)
        h.update(block)
    return FileDigest(size=size, digest=h.hexdigest())


def world_manifest(root: Path, service: Callable[[str], ServiceManifest] | None = None
                   ) -> Manifest:
    """The manifest of the world at `root`; `service` hashes one service by name (default:
    ``service_manifest`` of its database)."""
    services = {name: service(name) if service else service_manifest(service_db(root, name))
                for name in list_services(root)}
    files = {rel: file_digest(path) for rel, path in iter_workspace(root)}
    apps = {name: file_digest(path) for name, path in iter_apps(root)}
    return Manifest(format=MANIFEST_FORMAT, services=services, files=files, apps=apps)


def hash_world(root: Path) -> str:
    return world_manifest(root).world_hash()


def encode_manifest(manifest: Manifest) -> bytes:
    return msgspec.json.encode(manifest, order="deterministic")


def decode_manifest(data: bytes) -> Manifest:
    return msgspec.json.decode(data, type=Manifest)
