"""Row-level and file-level differences between two worlds.

Tables whose manifest digests agree are skipped without reading a row. Rows are matched
by primary key where the key is a total order (INTEGER PRIMARY KEY, WITHOUT ROWID);
otherwise a table is compared as a multiset of whole rows.
"""

from __future__ import annotations

import base64
import difflib
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec

from replay.errors import WorldDirError
from replay.files import SPECIAL_KINDS, read_regular
from replay.hashing import FileDigest, Manifest, ServiceManifest, table_infos
from replay.layout import service_db, workspace_path
from replay.sqlite import open_readonly, quote_ident
from worldstore.errors import PathError

MAX_TEXT_DIFF_LINES = 200
MAX_TEXT_DIFF_BYTES = 1 << 20  # larger files are compared by size and digest only


class RowChange(msgspec.Struct, omit_defaults=True):
    change: str  # added | removed | changed
    key: dict[str, Any]
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    columns: list[str] | None = None  # the changed columns, for 'changed'


class TableDiff(msgspec.Struct, omit_defaults=True):
    service: str
    table: str
    change: str  # added | removed | changed | schema
    added: int = 0
    removed: int = 0
    changed: int = 0
    rows: list[RowChange] = []
    truncated: bool = False


class FileDiff(msgspec.Struct, omit_defaults=True):
    path: str
    change: str  # added | removed | changed
    size_before: int | None = None
    size_after: int | None = None
    text_diff: list[str] | None = None
    # Set only for what is not a regular file: 'symlink' (with its target, which is
    # never followed), 'fifo', 'socket', 'char-device', 'block-device'.
    kind_before: str | None = None
    kind_after: str | None = None
    link_before: str | None = None
    link_after: str | None = None


class WorldDiff(msgspec.Struct):
    before: str
    after: str
    services_added: list[str]
    services_removed: list[str]
    tables: list[TableDiff]
    files: list[FileDiff]

    @property
    def empty(self) -> bool:
        return not (self.services_added or self.services_removed or self.tables or self.files)


def diff_worlds(a_root: Path, a: Manifest, b_root: Path, b: Manifest,
                *, max_rows: int = 1000) -> WorldDiff:
    tables: list[TableDiff] = []
    for service in sorted(set(a.services) | set(b.services)):
        sa_, sb = a.services.get(service), b.services.get(service)
        tables.extend(_service_diff(service, a_root, sa_, b_root, sb, max_rows))
    return WorldDiff(
        before=a.world_hash(), after=b.world_hash(),
        services_added=sorted(set(b.services) - set(a.services)),
        services_removed=sorted(set(a.services) - set(b.services)),
        tables=tables, files=_file_diffs(a_root, a, b_root, b),
    )


def _service_diff(service: str, a_root: Path, a: ServiceManifest | None, b_root: Path,
                  b: ServiceManifest | None, max_rows: int) -> list[TableDiff]:
    a_tables = a.tables if a else {}
    b_tables = b.tables if b else {}
    a_schema = {(t, n): sql for t, n, _tb, sql in (a.schema if a else [])}
    b_schema = {(t, n): sql for t, n, _tb, sql in (b.schema if b else [])}
    out = []
    for name in sorted(set(a_tables) | set(b_tables)):
        da, db = a_tables.get(name), b_tables.get(name)
        if da == db and a_schema.get(("table", name)) == b_schema.get(("table", name)):
            continue
        if da is None or db is None:
            rows = _read_rows(b_root if da is None else a_root, service, name)
            change = "added" if da is None else "removed"
            diff = TableDiff(service, name, change)
            for key_dict, row in list(rows.values())[:max_rows]:
                diff.rows.append(RowChange(change, key_dict, after=row if da is None
                                           else None, before=row if db is None else None))
            if da is None:
                diff.added = len(rows)
            else:
                diff.removed = len(rows)
            diff.truncated = len(rows) > max_rows
            out.append(diff)
            continue
        out.append(_table_rows_diff(service, name, a_root, b_root, max_rows,
                                    schema_changed=a_schema.get(("table", name))
                                    != b_schema.get(("table", name))))
    for kind, name in sorted(set(a_schema) | set(b_schema)):
        if kind != "table" and a_schema.get((kind, name)) != b_schema.get((kind, name)):
            out.append(TableDiff(service, f"{kind}:{name}", "schema"))
    return out


def _table_rows_diff(service: str, table: str, a_root: Path, b_root: Path, max_rows: int,
                     *, schema_changed: bool) -> TableDiff:
    before = _read_rows(a_root, service, table)
    after = _read_rows(b_root, service, table)
    diff = TableDiff(service, table, "schema" if schema_changed else "changed")
    changes: list[RowChange] = []
    for key in before.keys() - after.keys():
        diff.removed += 1
        changes.append(RowChange("removed", before[key][0], before=before[key][1]))
    for key in after.keys() - before.keys():
        diff.added += 1
        changes.append(RowChange("added", after[key][0], after=after[key][1]))
    for key in before.keys() & after.keys():
        old, new = before[key][1], after[key][1]
        cols = sorted(c for c in set(old) | set(new) if _typed(old.get(c)) != _typed(new.get(c)))
        if cols:
            diff.changed += 1
            changes.append(RowChange("changed", before[key][0], before=old, after=new,
                                     columns=cols))
    changes.sort(key=lambda c: (msgspec.json.encode(c.key, order="deterministic"), c.change))
    diff.rows = changes[:max_rows]
    diff.truncated = len(changes) > max_rows
    return diff


Keyed = dict[tuple[Any, ...], tuple[dict[str, Any], dict[str, Any]]]


def _read_rows(root: Path, service: str, table: str) -> Keyed:
    """key -> (key as a dict, row) for every row of one table.

    The key is the primary key where it totally orders the rows; otherwise it is the
    whole row plus its occurrence number, so duplicate rows are counted, not merged.
    """
    with open_readonly(service_db(root, service)) as conn:
        info = next(i for i in table_infos(conn) if i.name == table)
        pk = info.key
        cols = info.columns
        select = ", ".join(quote_ident(c) for c in cols)
        rows: Keyed = {}
        occurrences: Counter[tuple[Any, ...]] = Counter()
        for values in conn.execute(f"SELECT {select} FROM {quote_ident(table)}"):
            row = {c: _jsonable(v) for c, v in zip(cols, values, strict=True)}
            if pk:
                key_dict = {c: row[c] for c in pk}
                key = tuple(_freeze(row[c]) for c in pk)
            else:
                whole = tuple(_freeze(row[c]) for c in cols)
                occurrences[whole] += 1
                key_dict = {"occurrence": occurrences[whole]}
                key = (*whole, occurrences[whole])
            rows[key] = (key_dict, row)
        return rows


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"$base64": base64.b64encode(value).decode("ascii")}
    return value


def _typed(value: Any) -> tuple[str, Any]:
    # Python calls 1 == 1.0 and 0.0 == -0.0; SQLite stores them differently and the hash
    # sees the difference, so the diff must too.
    if isinstance(value, float):
        return ("float", value.hex())
    return (type(value).__name__, value)


def _freeze(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    return _typed(value)


def _file_diffs(a_root: Path, a: Manifest, b_root: Path, b: Manifest) -> list[FileDiff]:
    out = [_app_diff(name, a, b) for name in sorted(set(a.apps) | set(b.apps))
           if a.apps.get(name) != b.apps.get(name)]
    for path in sorted(set(a.files) | set(b.files)):
        fa, fb = a.files.get(path), b.files.get(path)
        if fa == fb:
            continue
        change = "added" if fa is None else "removed" if fb is None else "changed"
        diff = FileDiff(path, change, size_before=fa.size if fa else None,
                        size_after=fb.size if fb else None,
                        kind_before=_odd_kind(fa), kind_after=_odd_kind(fb),
                        link_before=fa.link if fa else None,
                        link_after=fb.link if fb else None)
        if fa is not None and fb is not None and _odd_kind(fa) is None \
                and _odd_kind(fb) is None:
            diff.text_diff = _text_diff(a_root, b_root, path)
        out.append(diff)
    return out


def _odd_kind(found: FileDigest | None) -> str | None:
    """What a manifest entry is when it is not a regular file (None for one)."""
    if found is None:
        return None
    if found.link is not None:
        return "symlink"
    return found.digest if found.digest in SPECIAL_KINDS else None


def _app_diff(name: str, a: Manifest, b: Manifest) -> FileDiff:
    fa, fb = a.apps.get(name), b.apps.get(name)
    change = "added" if fa is None else "removed" if fb is None else "changed"
    return FileDiff(f"apps/{name}", change, size_before=fa.size if fa else None,
                    size_after=fb.size if fb else None)


def _text_diff(a_root: Path, b_root: Path, path: str) -> list[str] | None:
    """A unified diff of two regular UTF-8 files of at most MAX_TEXT_DIFF_BYTES each;
    None for anything else. Both are opened without following a symlink on the way
    (an agent may have put one there since the manifest was taken)."""
    try:
        before = _small_text(a_root, path)
        after = _small_text(b_root, path)
    except (OSError, WorldDirError, PathError):
        return None
    if before is None or after is None:
        return None
    lines = list(difflib.unified_diff(before, after, f"a/{path}", f"b/{path}", lineterm=""))
    if len(lines) > MAX_TEXT_DIFF_LINES:
        lines = [*lines[:MAX_TEXT_DIFF_LINES], f"... ({len(lines) - MAX_TEXT_DIFF_LINES} more)"]
    return lines


def _small_text(root: Path, path: str) -> list[str] | None:
    data = read_regular(workspace_path(root, path), limit=MAX_TEXT_DIFF_BYTES)
    if data is None:
        return None
    try:
        return data.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        return None
