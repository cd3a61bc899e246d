"""Layer 3, declarations: every entry of produces.json holds in the day's world."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import msgspec

from replay.layout import WORKSPACE, service_db
from replay.sqlite import open_readonly, quote_ident
from synth.worlds.validate_day.context import DayContext, DayWorld
from synth.worlds.validate_day.lint import path_problem, table_columns
from synth.worlds.validate_day.produces import (
    CrossRef,
    FileWrite,
    Place,
    Produces,
    RowRef,
    RowWrite,
    load_produces,
)
from synth.worlds.validate_day.report import LayerResult
from worldstore.errors import WorldError

__all__ = ["declarations_layer", "exists_problem", "select_in"]


def declarations_layer(context: DayContext, world: DayWorld,
                       produces: Path | Mapping[str, Any] | Produces | None
                       ) -> tuple[LayerResult, Produces | None]:
    if produces is None:
        return LayerResult("declarations", "not_run",
                           "no produces.json given: nothing declared to check"), None
    try:
        parsed = produces if isinstance(produces, Produces) else load_produces(produces)
    except WorldError as exc:
        return LayerResult("declarations", "failed", str(exc)), None
    checks = list(_declaration_checks(world, parsed))
    failures = [c for c in checks if c["problem"] is not None]
    evidence = {"entries": checks}
    if failures:
        first = failures[0]
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        return LayerResult("declarations", "failed",
                           f"{first['entry']}: {first['problem']}{more}", evidence), parsed
    if not checks:
        return LayerResult("declarations", "passed", "produces.json declares nothing",
                           evidence), parsed
    return LayerResult("declarations", "passed", f"all {len(checks)} declared entries exist "
                       f"in {context.name} (writes changed since the day before)",
                       evidence), parsed


def _declaration_checks(world: DayWorld, produces: Produces) -> Iterator[dict[str, Any]]:
    def entry(name: str, problem: str | None) -> dict[str, Any]:
        return {"entry": name, "problem": problem}

    for i, write in enumerate(produces.db_writes):
        yield entry(f"db_writes[{i}]", _row_write_problem(world, write))
    for i, item in enumerate(produces.files):
        file = FileWrite(item) if isinstance(item, str) else item
        yield entry(f"files[{i}]", _file_write_problem(world, file))
    for i, account in enumerate(produces.accounts):
        yield entry(f"accounts[{i}]", _row_exists_problem(world.root, account))
    for i, cross in enumerate(produces.cross_refs):
        yield entry(f"cross_refs[{i}]", _cross_ref_problem(world, cross))


class _Rows(msgspec.Struct, frozen=True):
    rows: list[dict[str, Any]]
    problem: str | None = None  # the table or a column does not exist


def _select(root: Path | None, ref: RowRef) -> _Rows:
    """The rows of a world directory that match `ref`."""
    return select_in(service_db(root, ref.service) if root is not None else None, ref)


def select_in(db: Path | None, ref: RowRef) -> _Rows:
    label = f"{ref.service}.{ref.table}"
    if db is None or not db.is_file():
        return _Rows([], f"no service {ref.service!r}")
    with open_readonly(db) as conn:
        tables = {name for (name,) in conn.execute(
            "SELECT name FROM sqlite_schema WHERE type = 'table'")}
        if ref.table not in tables:
            return _Rows([], f"no table {label}")
        columns = table_columns(conn, ref.table)
        unknown = sorted(set(ref.where) - set(columns))
        if unknown:
            return _Rows([], f"where.{unknown[0]}: {label} has no column {unknown[0]!r}")
        names = sorted(ref.where)
        condition = " AND ".join(f"{quote_ident(c)} IS ?" for c in names) or "1"
        values = [int(v) if isinstance(v, bool) else v for v in (ref.where[c] for c in names)]
        select = ", ".join(quote_ident(c) for c in columns)
        # Unordered: callers count rows as a multiset or look for any match.
        query = f"SELECT {select} FROM {quote_ident(ref.table)} WHERE {condition}"
        rows = [dict(zip(columns, row, strict=True)) for row in conn.execute(query, values)]
    return _Rows(rows)


def _describe(ref: RowRef) -> str:
    where = json.dumps(ref.where, sort_keys=True)
    return f"{ref.service}.{ref.table} where {where}"


def _row_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    # 1 and 1.0 are different values to SQLite and to the world hash: keep them apart.
    return tuple((column, type(value).__name__, value.hex() if isinstance(value, float)
                  else value) for column, value in sorted(row.items()))


def _row_write_problem(world: DayWorld, write: RowWrite) -> str | None:
    today = _select(world.root, write)
    before = _select(world.before_root, write)
    if write.change == "removed":
        if today.problem is None and today.rows:
            return f"{_describe(write)}: declared removed, but {len(today.rows)} still match"
        if not before.rows:
            return f"{_describe(write)}: declared removed, but no row matched the day before"
        return None
    if today.problem is not None:
        return f"{_describe(write)}: missing ({today.problem})"
    if not today.rows:
        return f"{_describe(write)}: missing (no matching row in the day's world)"
    old = Counter(_row_key(row) for row in before.rows)
    new = Counter(_row_key(row) for row in today.rows)
    if not new - old:
        rows = f"{len(today.rows)} matching row" + ("s" if len(today.rows) != 1 else "")
        return f"{_describe(write)}: unchanged ({rows}, none added or changed this day)"
    return None


def _row_exists_problem(root: Path, ref: RowRef) -> str | None:
    return exists_problem(_select(root, ref), ref)


def exists_problem(found: _Rows, ref: RowRef) -> str | None:
    if found.problem is not None:
        return f"{_describe(ref)}: missing ({found.problem})"
    return None if found.rows else f"{_describe(ref)}: missing (no matching row)"


def _file_write_problem(world: DayWorld, file: FileWrite) -> str | None:
    problem = path_problem(file.path)
    if problem is not None:
        return f"path: {problem}"
    today, before = world.manifest.files.get(file.path), world.before.files.get(file.path)
    if file.change == "removed":
        if today is not None:
            return f"file {file.path!r}: declared removed, but it exists"
        return None if before is not None else \
            f"file {file.path!r}: declared removed, but it did not exist the day before"
    if today is None:
        return f"file {file.path!r}: missing from the day's workspace"
    if before is not None and before == today:
        return f"file {file.path!r}: unchanged (same content as the day before)"
    return None


def _cross_ref_problem(world: DayWorld, cross: CrossRef) -> str | None:
    shape = _place_problem(cross.source, "from") or (
        _place_problem(cross.to, "to") if cross.to is not None else None)
    if shape is not None:
        return shape
    problem = _mention_problem(world, cross.source, cross.mentions)
    if problem is not None:
        return f"from: {problem}"
    if cross.to is not None:
        target = cross.to
        if target.file is not None:
            if target.file not in world.manifest.files:
                return f"to: file {target.file!r} does not exist"
        else:
            missing = _row_exists_problem(world.root, _row_of(target))
            if missing is not None:
                return f"to: {missing}"
    return None


def _place_problem(place: Place, name: str) -> str | None:
    is_row = place.service is not None and place.table is not None
    if (place.file is None) == (not is_row) or (place.file is not None and (
            place.service or place.table or place.where or place.column)):
        return f"{name}: give either 'file' or 'service', 'table' and 'where'"
    if place.file is not None:
        problem = path_problem(place.file)
        return f"{name}.file: {problem}" if problem else None
    return None


def _row_of(place: Place) -> RowRef:
    assert place.service is not None and place.table is not None
    return RowRef(place.service, place.table, place.where)


def _mention_problem(world: DayWorld, place: Place, mentions: str) -> str | None:
    if place.file is not None:
        file = FileWrite(place.file)
        problem = _file_write_problem(world, file)
        if problem is not None:
            return problem
        text = (world.root / WORKSPACE / place.file).read_bytes().decode("utf-8", "replace")
        return None if mentions in text else f"file {place.file!r} does not mention {mentions!r}"
    ref = _row_of(place)
    written = RowWrite(ref.service, ref.table, ref.where)
    problem = _row_write_problem(world, written)
    if problem is not None:
        return problem
    before = Counter(_row_key(r) for r in _select(world.before_root, ref).rows)
    fresh = [r for r in _select(world.root, ref).rows if not before[_row_key(r)]]
    if place.column is not None and place.column not in fresh[0]:
        return f"{_describe(ref)} has no column {place.column!r}"
    for row in fresh:
        values = [row[place.column]] if place.column is not None else list(row.values())
        if any(isinstance(v, str) and mentions in v for v in values):
            return None
    column = f"column {place.column!r}" if place.column else "any text column"
    return f"no row of {_describe(ref)} written this day mentions {mentions!r} in {column}"
