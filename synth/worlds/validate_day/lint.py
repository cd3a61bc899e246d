"""Layer 1, lint: static checks of the day's stored events (timestamps, workspace paths,
clock and randomness reads, the cross-persona identity rule)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replay.engine import Worlds
from replay.layout import WORKSPACE, list_services, service_db
from replay.sqlite import open_readonly, quote_ident
from synth.worlds.validate_day.context import DayContext
from synth.worlds.validate_day.report import LayerResult
from worldstore.errors import PathError, WorldError
from worldstore.events import (
    FileDeletePayload,
    FileWritePayload,
    Params,
    SqlPayload,
)
from worldstore.names import check_relpath, ts_key
from worldstore.sqlcheck import sql_tokens

__all__ = [
    "ACCOUNTS_FILE",
    "IDENTITY_COLUMNS",
    "IDENTITY_TABLES",
    "MAX_SEGMENT_BYTES",
    "Reservation",
    "accounts_file_identities",
    "clock_and_random_uses",
    "identity_key",
    "inserted_identities",
    "lint_layer",
    "path_problem",
    "reserved_identities",
    "table_columns",
]

IDENTITY_TABLES = frozenset({"users", "contacts", "accounts", "people", "profiles"})
IDENTITY_COLUMNS = frozenset({"name", "full_name", "display_name", "email", "handle",
                              "username"})
ACCOUNTS_FILE = "accounts.json"
MAX_SEGMENT_BYTES = 255  # NAME_MAX of common file systems


@dataclass
class _Findings:
    problems: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[dict[str, Any]] = field(default_factory=list)

    def problem(self, context: DayContext, index: int | None, message: str,
                **extra: Any) -> None:
        self.problems.append(_finding(context, index, message, extra))

    def warning(self, context: DayContext, index: int, message: str) -> None:
        self.warnings.append(_finding(context, index, message, {}))


def _finding(context: DayContext, index: int | None, message: str,
             extra: dict[str, Any]) -> dict[str, Any]:
    if index is None:
        return {"message": message, **extra}
    seq = context.events[index].seq
    return {"seq": seq, "index": index, "message": f"{context.where(index)}: {message}",
            **extra}


def lint_layer(context: DayContext, reserved_by: Worlds | None = None) -> LayerResult:
    findings = _Findings()
    _lint_timestamps(context, findings)
    for index, event in enumerate(context.events):
        payload = event.payload
        if isinstance(payload, SqlPayload):
            for message in clock_and_random_uses(payload.sql):
                findings.warning(context, index, message)
        elif isinstance(payload, FileWritePayload | FileDeletePayload):
            problem = path_problem(payload.path)
            if problem:
                findings.problem(context, index, problem)
    try:
        reserved = reserved_identities(reserved_by or context.worlds, context.record.persona)
    except WorldError as exc:  # an unchecked name must not pass: fail closed
        reserved = {}
        findings.problem(context, None, f"cannot read the names other personas reserve: {exc}")
    _lint_identities(context, reserved, findings)
    evidence = {"events": len(context.events), "problems": findings.problems,
                "warnings": findings.warnings, "reserved_values": len(reserved),
                "other_personas": sorted({r.persona for r in reserved.values()})}
    if findings.problems:
        first = findings.problems[0]["message"]
        more = len(findings.problems) - 1
        return LayerResult("lint", "failed", first + (f" (and {more} more)" if more else ""),
                           evidence)
    warned = f", {len(findings.warnings)} warnings (see evidence)" if findings.warnings else ""
    return LayerResult("lint", "passed", f"{len(context.events)} events clean{warned}; "
                       f"{len(reserved)} values reserved by other personas checked", evidence)


def _lint_timestamps(context: DayContext, findings: _Findings) -> None:
    last = context.previous.last_ts if context.previous else None
    for index, event in enumerate(context.events):
        if last is not None and ts_key(event.ts) < ts_key(last):
            findings.problem(context, index, f"timestamp {event.ts} is before {last}, the "
                             "timestamp of the event before it")
        last = event.ts


def path_problem(path: str) -> str | None:
    """Why a workspace path is not sane, or None."""
    try:
        check_relpath(path)
    except PathError as exc:
        return str(exc)
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in path):
        return f"path {path!r} contains a control character"
    long = next((s for s in path.split("/") if len(s.encode()) > MAX_SEGMENT_BYTES), None)
    if long is not None:
        return f"path {path!r} has a segment longer than {MAX_SEGMENT_BYTES} bytes"
    return None


# The tokens of the store's one SQL lexer (``worldstore.sqlcheck.sql_tokens``): enough to
# find clock and randomness reads outside string literals and to read the values of an
# INSERT. Whitespace, comments and a quote left open (SQL that cannot apply) are dropped.
_DROPPED = frozenset({"ws", "comment", "open"})


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str
    text: str

    @property
    def upper(self) -> str:
        return self.text.upper() if self.kind == "word" else ""

    @property
    def name(self) -> str:
        """The identifier this token names (unquoted), or '' if it names none."""
        if self.kind == "word":
            return self.text
        if self.kind == "ident":
            quote = self.text[0]
            inner = self.text[1:-1]
            return inner if quote == "[" else inner.replace(quote * 2, quote)
        return ""


def _tokens(sql: str) -> list[_Token]:
    return [_Token(t.kind, t.text) for t in sql_tokens(sql)
            if t.kind not in _DROPPED and not t.text.isspace()]


_CLOCK_WORDS = {"CURRENT_TIMESTAMP", "CURRENT_DATE", "CURRENT_TIME"}
_RANDOM_FUNCTIONS = {"RANDOM", "RANDOMBLOB"}


def clock_and_random_uses(sql: str) -> list[str]:
    """Warnings for SQL that reads the clock or randomness. Replay neutralises both (frozen
    clock, seeded random), but a day should write the literal values it means."""
    tokens = _tokens(sql)
    found: list[str] = []
    for i, token in enumerate(tokens):
        follows = tokens[i + 1].text if i + 1 < len(tokens) else ""
        if token.upper in _CLOCK_WORDS:
            found.append(f"reads the clock ({token.text}); write the frozen timestamp literal")
        elif token.upper in _RANDOM_FUNCTIONS and follows == "(":
            found.append(f"draws randomness ({token.text}()); write the value it should be")
        elif token.upper == "UNIXEPOCH" and follows == "(" and i + 2 < len(tokens) \
                and tokens[i + 2].text == ")":
            found.append("reads the clock (unixepoch()); write the frozen timestamp literal")
        elif token.kind == "str" and token.text[1:-1].strip().lower() == "now":
            found.append("reads the clock ('now'); write the frozen timestamp literal")
    return found


@dataclass(frozen=True, slots=True)
class Reservation:
    """A value another persona holds: who, where, and the value as written there."""

    persona: str
    where: str
    value: str


def identity_key(value: str) -> str:
    return " ".join(value.split()).casefold()


def reserved_identities(worlds: Worlds, persona: str) -> dict[str, Reservation]:
    """Identity values held by every other persona at its last stored day, by key. When
    several hold one value, the first persona by name is named."""
    reserved: dict[str, Reservation] = {}
    for summary in worlds.store.personas():
        if summary.persona == persona:
            continue
        world = worlds.snapshot(summary.persona, summary.last_day)
        for where, value in _world_identities(world):
            key = identity_key(value)
            if key and key not in reserved:
                reserved[key] = Reservation(summary.persona, where, value)
    return reserved


def _world_identities(root: Path) -> Iterator[tuple[str, str]]:
    for service in list_services(root):
        with open_readonly(service_db(root, service)) as conn:
            for table in _identity_tables(conn):
                columns = sorted(c for c in table_columns(conn, table)
                                 if c.lower() in IDENTITY_COLUMNS)
                for column in columns:
                    name = quote_ident(column)
                    query = f"SELECT DISTINCT {name} FROM {quote_ident(table)} ORDER BY {name}"
                    for (value,) in conn.execute(query):
                        if isinstance(value, str):
                            yield f"{service}.{table}.{column}", value
    accounts = root / WORKSPACE / ACCOUNTS_FILE
    if accounts.is_file() and not accounts.is_symlink():
        for where, value in accounts_file_identities(accounts.read_bytes()):
            yield f"workspace {ACCOUNTS_FILE}{where}", value


def _identity_tables(conn: Any) -> list[str]:
    rows = conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table' "
                        "ORDER BY name").fetchall()
    return [name for (name,) in rows if name.lower() in IDENTITY_TABLES]


def table_columns(conn: Any, table: str) -> list[str]:
    return [row[0] for row in conn.execute("SELECT name FROM pragma_table_info(?)", (table,))]


def accounts_file_identities(data: bytes) -> list[tuple[str, str]]:
    """(location, value) of the identity values in an accounts.json; an unreadable file
    holds none (it reserves nothing rather than failing somebody else's day)."""
    try:
        parsed = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return []
    items = parsed.get("accounts") if isinstance(parsed, dict) else parsed
    if not isinstance(items, list):
        return []
    found = []
    for index, item in enumerate(items):
        if isinstance(item, dict):
            for key in sorted(k for k in item if k.lower() in IDENTITY_COLUMNS):
                if isinstance(item[key], str):
                    found.append((f"[{index}].{key}", item[key]))
    return found


def _lint_identities(context: DayContext, reserved: Mapping[str, Reservation],
                     findings: _Findings) -> None:
    for index, event in enumerate(context.events):
        payload = event.payload
        if isinstance(payload, SqlPayload):
            inserted = inserted_identities(payload.sql, payload.params)
            if isinstance(inserted, str):
                findings.problem(context, index, f"service {payload.service!r}: {inserted}")
                continue
            values = [(f"{payload.service}.{where}", value) for where, value in inserted]
        elif isinstance(payload, FileWritePayload) and payload.path == ACCOUNTS_FILE:
            data = context.worlds.store.blob(payload.blob)
            values = [(f"workspace {ACCOUNTS_FILE}{where}", value)
                      for where, value in accounts_file_identities(data)]
        else:
            continue
        for where, value in values:
            holder = reserved.get(identity_key(value))
            if holder is not None:
                findings.problem(
                    context, index, f"inserts {value!r} into {where}, a value reserved by "
                    f"persona {holder.persona!r} ({holder.where}: {holder.value!r})",
                    value=value, persona=holder.persona, reserved_at=holder.where)


def inserted_identities(sql: str, params: Params | None) -> list[tuple[str, str]] | str:
    """(table.column, value) of the identity values an INSERT/REPLACE writes; a string
    saying why when it writes an identity table in a form that cannot be read."""
    tokens = _tokens(sql)
    target = _insert_target(tokens)
    if target is None:
        return []
    table, position = target
    if table.lower() not in IDENTITY_TABLES:
        return []
    columns, position = _column_list(tokens, position)
    if columns is None:
        return (f"INSERT into identity table {table!r} without a column list; name the "
                "columns so the identity check can read the values")
    rows = _values_rows(tokens, position)
    if rows is None:
        return (f"INSERT into identity table {table!r} takes its rows from something other "
                "than VALUES; the identity check cannot read them")
    binder = _Binder(params)
    found: list[tuple[str, str]] = []
    for row in rows:
        if len(row) != len(columns):
            return f"INSERT into {table!r}: {len(row)} values for {len(columns)} columns"
        for column, expression in zip(columns, row, strict=True):
            value = binder.value(expression)  # bind every value: parameters count in order
            if column.lower() not in IDENTITY_COLUMNS:
                continue
            if value is _UNREADABLE:
                return (f"INSERT into {table!r}: the value of identity column {column!r} "
                        "is an expression; use a literal or a parameter")
            if isinstance(value, str):
                found.append((f"{table}.{column}", value))
    return found


def _insert_target(tokens: Sequence[_Token]) -> tuple[str, int] | None:
    """The table an INSERT/REPLACE statement writes, and where its column list starts."""
    if not tokens or tokens[0].upper not in ("INSERT", "REPLACE"):
        return None
    i = 1
    if tokens[0].upper == "INSERT" and i < len(tokens) and tokens[i].upper == "OR":
        i += 2
    if i >= len(tokens) or tokens[i].upper != "INTO":
        return None
    i += 1
    if i + 2 < len(tokens) and tokens[i + 1].text == ".":
        i += 2  # schema.table: the table is what counts
    if i >= len(tokens) or not tokens[i].name:
        return None
    table = tokens[i].name
    i += 1
    if i < len(tokens) and tokens[i].upper == "AS":
        i += 2
    return table, i


def _column_list(tokens: Sequence[_Token], i: int) -> tuple[list[str] | None, int]:
    if i >= len(tokens) or tokens[i].text != "(":
        return None, i
    columns: list[str] = []
    i += 1
    while i < len(tokens) and tokens[i].text != ")":
        if tokens[i].text != ",":
            columns.append(tokens[i].name or tokens[i].text)
        i += 1
    return columns, i + 1


_EXPRESSION = list[_Token]


def _values_rows(tokens: Sequence[_Token], i: int) -> list[list[_EXPRESSION]] | None:
    if i >= len(tokens) or tokens[i].upper != "VALUES":
        return None
    rows: list[list[_EXPRESSION]] = []
    i += 1
    while i < len(tokens) and tokens[i].text == "(":
        row, i = _one_row(tokens, i + 1)
        rows.append(row)
        if i < len(tokens) and tokens[i].text == ",":
            i += 1
        else:
            break  # ON CONFLICT, RETURNING, or the end
    return rows


def _one_row(tokens: Sequence[_Token], i: int) -> tuple[list[_EXPRESSION], int]:
    """The comma-separated expressions up to the matching ')', and the index after it."""
    row: list[_EXPRESSION] = [[]]
    depth = 0
    while i < len(tokens):
        text = tokens[i].text
        if text == "(":
            depth += 1
        elif text == ")":
            if depth == 0:
                return row, i + 1
            depth -= 1
        elif text == "," and depth == 0:
            row.append([])
            i += 1
            continue
        row[-1].append(tokens[i])
        i += 1
    return row, i


_UNREADABLE = object()


class _Binder:
    """SQLite's parameter numbering: ``?`` takes the next number, ``?N`` number N, a name
    the next number the first time it appears; a dict binds names by name."""

    def __init__(self, params: Params | None) -> None:
        self.params = params
        self.highest = 0
        self.numbers: dict[str, int] = {}

    def value(self, expression: Sequence[_Token]) -> Any:
        if len(expression) != 1:
            return _UNREADABLE
        token = expression[0]
        if token.kind == "str":
            return token.text[1:-1].replace("''", "'")
        if token.kind == "param":
            return self._bound(token.text)
        if token.kind in ("num", "blob") or token.upper in ("NULL", "TRUE", "FALSE"):
            return None  # not text: no identity value
        return _UNREADABLE

    def _bound(self, marker: str) -> Any:
        if marker.startswith("?"):
            number = int(marker[1:]) if len(marker) > 1 else self.highest + 1
        else:
            if isinstance(self.params, dict):
                return self.params.get(marker[1:], self.params.get(marker))
            number = self.numbers.setdefault(marker, self.highest + 1)
        self.highest = max(self.highest, number)
        if isinstance(self.params, list) and 1 <= number <= len(self.params):
            return self.params[number - 1]
        return None
