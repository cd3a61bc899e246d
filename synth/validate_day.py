"""Five-layer validation of one persona-day (methods.md section 4).

``validate_day(worlds, "lars@5", produces=..., reviewer=..., env=...)`` runs, in order:

1. **lint** — static checks of the day's stored events: timestamps never go back (within
   the day and against the previous day's last event); workspace paths are clean; SQL that
   reads the clock or randomness (``datetime('now')``, ``CURRENT_TIMESTAMP``, ``random()``)
   is a *warning* (replay freezes both, but the day should write literals); and the
   cross-persona identity check (below), whose collisions fail the layer.
2. **replay** — the day's events applied twice to copies of the previous day's snapshot:
   both runs must give the same world hash, and it must be the recorded one. A difference
   names the first differing table or file and the first event of the day that writes it.
3. **declarations** — every entry of ``produces.json`` (format below) exists in the day's
   world and, for writes, changed against the day before. No produces.json: not run.
4. **health** — an instance of the day opens with ``worldenv.instances.instance.Environment`` (every
   pinned app loads), one read-only tool without required arguments answers without an
   error on every service that has tools, the declared accounts exist in the live
   instance and the declared credentials are found in its workspace. A world that pins no
   apps and declares neither has nothing to check: "not_run", never "passed".
5. **review** — a ``Reviewer`` checks the day's world against the day's plan. Without a
   reviewer the layer is "not_run" ("no model configured"), never "passed".

Layers 3-5 need the day's world, so they are "not_run" when replay failed; a failed lint
does not stop anything. The report is ``ok`` when no layer failed, and says how many were
not run.

**Cross-persona identity rule.** A value is *reserved* by another persona Q when it is in
Q's world at Q's last stored day, either (a) in a column named ``name``, ``full_name``,
``display_name``, ``email``, ``handle`` or ``username`` of a table named ``users``,
``contacts``, ``accounts``, ``people`` or ``profiles`` (any service), or (b) under one of
those keys in an object of the workspace file ``accounts.json`` (a JSON list of objects,
or ``{"accounts": [...]}``). The day *inserts* a value when one of its ``sql`` events is an
``INSERT``/``REPLACE`` into such a table that puts the value into such a column (literal or
bound parameter), or when it writes ``accounts.json`` with the value. Values are compared
after collapsing whitespace and case-folding. A collision fails the layer naming the event
(seq and index), the other persona, where that persona holds the value, and the value. An
``INSERT`` into an identity table whose identity values cannot be read statically (no
column list, ``INSERT ... SELECT``, an expression in an identity column) fails too: the
check must not be bypassable. The rule is symmetric: if two stored personas share a
value, each one's inserting day reports the other.

**produces.json** (every field optional, unknown fields refused)::

    {
      "db_writes":   [{"service": "shop", "table": "orders", "where": {"id": 2},
                       "change": "written"}],             # or "removed"; default written
      "files":       ["jobs/nordlys/bom.md", {"path": "docs/old.txt", "change": "removed"}],
      "accounts":    [{"service": "chat", "table": "users", "where": {"id": 1}}],
      "cross_refs":  [{"from": {"service": "chat", "table": "messages", "where": {"id": 50},
                                "column": "body"},
                       "mentions": "AVL-2026-10533",
                       "to": {"service": "shop", "table": "orders", "where": {"id": 2}}}],
      "credentials": [{"file": "accounts.json", "contains": "lars.eriksen"}]
    }

* ``db_writes``: "written" means at least one row matching ``where`` (column = value, all
  of them; ``{}`` matches every row) is in the day's world and no identical row matched
  the day before (the row was added, or changed, or came to match); "removed" means rows
  matched the day before and none matches now.
* ``files``: "written" means the file exists and was created or changed this day;
  "removed" means it existed the day before and does not now.
* ``accounts``: the row exists in the day's world (accounts are used by later days too,
  so they need not change); layer 4 checks them again in the live instance.
* ``cross_refs``: ``from`` (a row, optionally one ``column``, or ``{"file": path}``) was
  written this day and contains the text ``mentions``; ``to``, if given, exists.
* ``credentials`` (layer 4): the workspace file exists and contains the text.

A malformed produces.json fails layer 3, naming the field.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import msgspec

from gates.contract import GateStatus
from replay.engine import Worlds
from replay.errors import ApplyError
from replay.files import remove_tree
from replay.fold import BuiltDay, build_day_on
from replay.hashing import Manifest, decode_manifest
from replay.layout import WORKSPACE, list_services, service_db, workspace_path
from replay.sqlite import open_readonly, quote_ident
from replay.verify import first_difference, touched_by
from synth.errors import BudgetSpent
from worldenv.errors import AppPinError
from worldenv.instances.instance import Environment, Instance, read_pins
from worldllm.errors import NoModel, RecordingMissing
from worldstore.errors import PathError, WorldError
from worldstore.events import (
    FileDeletePayload,
    FileWritePayload,
    Params,
    SqlPayload,
    StoredEvent,
)
from worldstore.names import check_relpath, ts_key
from worldstore.store import DayRecord

LAYERS = ("lint", "replay", "declarations", "health", "review")
IDENTITY_TABLES = frozenset({"users", "contacts", "accounts", "people", "profiles"})
IDENTITY_COLUMNS = frozenset({"name", "full_name", "display_name", "email", "handle",
                              "username"})
ACCOUNTS_FILE = "accounts.json"
MAX_SEGMENT_BYTES = 255  # NAME_MAX of common file systems


# --- the report ---------------------------------------------------------------------------


class LayerResult(msgspec.Struct, frozen=True):
    layer: str
    status: GateStatus
    reason: str
    evidence: dict[str, Any] = {}


class DayReport(msgspec.Struct):
    """One result per layer, in order. ``ok``: no layer failed; ``not_run`` says how many
    layers did not run (an ok report with layers not run is not a full pass)."""

    persona: str
    day: int
    world_hash: str
    layers: list[LayerResult]
    ok: bool = False
    passed: int = 0
    failed: int = 0
    not_run: int = 0

    def __post_init__(self) -> None:
        counts = Counter(layer.status for layer in self.layers)
        self.passed, self.failed, self.not_run = (
            counts["passed"], counts["failed"], counts["not_run"])
        self.ok = self.failed == 0

    def layer(self, name: str) -> LayerResult:
        return next(result for result in self.layers if result.layer == name)

    @property
    def summary(self) -> str:
        verdict = "ok" if self.ok else "FAILED"
        return (f"{verdict}: {self.passed} passed, {self.failed} failed, "
                f"{self.not_run} not run")


def render_day_report(report: DayReport) -> str:
    """A plain-text table: one line per layer, then the summary."""
    head = f"{report.persona}@{report.day}  world {report.world_hash}"
    width = max(len(name) for name in LAYERS)
    lines = [head, f"  #  {'layer':<{width}}  {'status':<8}  reason"]
    for number, result in enumerate(report.layers, start=1):
        reason = " ".join(result.reason.split())
        lines.append(f"  {number}  {result.layer:<{width}}  {result.status:<8}  {reason}")
    lines.append(report.summary)
    return "\n".join(lines) + "\n"


# --- the reviewer -------------------------------------------------------------------------


class ReviewOutcome(msgspec.Struct, frozen=True):
    passed: bool
    reason: str
    findings: list[str] = []
    model: str | None = None


class Reviewer(Protocol):
    """An independent reviewer (an LLM agent, say) outside the implementer's container."""

    def review(self, world_dir: Path, plan: str) -> ReviewOutcome:
        """Check the world at `world_dir` (a private copy, ``services/`` and
        ``workspace/``) against the day's plan."""
        ...


# --- produces.json --------------------------------------------------------------------------

Scalar = int | float | str | bool | None
Change = Literal["written", "removed"]


class RowRef(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    service: str
    table: str
    where: dict[str, Scalar] = {}


class RowWrite(RowRef, frozen=True, forbid_unknown_fields=True):
    change: Change = "written"


class FileWrite(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    path: str
    change: Change = "written"


class Place(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A row (service, table, where, optionally one column) or a workspace file."""

    file: str | None = None
    service: str | None = None
    table: str | None = None
    where: dict[str, Scalar] = {}
    column: str | None = None


class CrossRef(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    source: Place = msgspec.field(name="from")
    mentions: str
    to: Place | None = None


class Credential(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    file: str
    contains: str


class Produces(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    db_writes: list[RowWrite] = []
    files: list[str | FileWrite] = []
    accounts: list[RowRef] = []
    cross_refs: list[CrossRef] = []
    credentials: list[Credential] = []


def load_produces(source: Path | Mapping[str, Any]) -> Produces:
    """Decode produces.json (a path or its parsed object); WorldError names the field."""
    where = str(source) if isinstance(source, Path) else "produces"
    try:
        if isinstance(source, Path):
            return msgspec.json.decode(source.read_bytes(), type=Produces)
        return msgspec.convert(dict(source), Produces)
    except OSError as exc:
        raise WorldError(f"{where}: cannot read it ({exc.strerror})") from None
    except msgspec.DecodeError as exc:  # ValidationError too: its message names the field
        raise WorldError(f"{where}: {exc}") from None


# --- the entry point --------------------------------------------------------------------------


def validate_day(worlds: Worlds, ref: str, *,
                 produces: Path | Mapping[str, Any] | Produces | None = None,
                 reviewer: Reviewer | None = None, env: Environment | None = None,
                 plan: str | None = None, reserved_by: Worlds | None = None) -> DayReport:
    """Run the five layers on the persona-day `ref` (``persona@day`` or a world hash).
    `reserved_by`: the store whose other personas reserve names (default `worlds`; a
    candidate day checked in a scratch store is held to the real store's personas)."""
    record = worlds.resolve(ref)
    context = _DayContext.load(worlds, record)
    layers = [lint_layer(context, reserved_by)]
    scratch = worlds.cache.scratch()
    try:
        replayed, world = replay_layer(context, scratch)
        layers.append(replayed)
        if world is None:
            why = "not run: replay failed, so the day's world is not trustworthy"
            layers += [LayerResult(name, "not_run", why) for name in LAYERS[2:]]
        else:
            declared, parsed = declarations_layer(context, world, produces)
            layers.append(declared)
            layers.append(health_layer(context, parsed, env))
            layers.append(review_layer(world.root, reviewer, plan))
    finally:
        remove_tree(scratch)
    return DayReport(record.persona, record.day, record.world_hash, layers)


@dataclass(frozen=True)
class _DayContext:
    worlds: Worlds
    record: DayRecord
    previous: DayRecord | None
    events: list[StoredEvent]

    @classmethod
    def load(cls, worlds: Worlds, record: DayRecord) -> _DayContext:
        earlier = [r for r in worlds.store.days(record.persona) if r.day < record.day]
        events = list(worlds.store.events(record.persona, record.first_seq, record.last_seq))
        return cls(worlds, record, earlier[-1] if earlier else None, events)

    @property
    def name(self) -> str:
        return f"{self.record.persona}@{self.record.day}"

    def where(self, index: int) -> str:
        return f"event seq {self.events[index].seq} (#{index} of {self.name})"


@dataclass(frozen=True)
class _World:
    """The day's materialized world and the day before, with their manifests."""

    root: Path
    manifest: Manifest
    before_root: Path | None
    before: Manifest


# --- layer 1: lint ------------------------------------------------------------------------------


@dataclass
class _Findings:
    problems: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[dict[str, Any]] = field(default_factory=list)

    def problem(self, context: _DayContext, index: int | None, message: str,
                **extra: Any) -> None:
        self.problems.append(_finding(context, index, message, extra))

    def warning(self, context: _DayContext, index: int, message: str) -> None:
        self.warnings.append(_finding(context, index, message, {}))


def _finding(context: _DayContext, index: int | None, message: str,
             extra: dict[str, Any]) -> dict[str, Any]:
    if index is None:
        return {"message": message, **extra}
    seq = context.events[index].seq
    return {"seq": seq, "index": index, "message": f"{context.where(index)}: {message}",
            **extra}


def lint_layer(context: _DayContext, reserved_by: Worlds | None = None) -> LayerResult:
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


def _lint_timestamps(context: _DayContext, findings: _Findings) -> None:
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


# A small SQL tokenizer: enough to find clock and randomness reads outside string literals
# and to read the values of an INSERT. Comments and whitespace are dropped.
_TOKEN = re.compile(r"""
    (?P<skip>\s+|--[^\n]*|/\*.*?(?:\*/|$))
  | (?P<blob>[xX]'[0-9a-fA-F]*')
  | (?P<str>'(?:[^']|'')*')
  | (?P<ident>"(?:[^"]|"")*"|`(?:[^`]|``)*`|\[[^\]]*\])
  | (?P<num>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<param>\?\d*|[:@$][A-Za-z_][A-Za-z0-9_]*)
  | (?P<word>[A-Za-z_][A-Za-z0-9_$]*)
  | (?P<op>.)
""", re.S | re.X)


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
    return [_Token(m.lastgroup or "op", m.group()) for m in _TOKEN.finditer(sql)
            if m.lastgroup != "skip"]


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
                columns = sorted(c for c in _columns(conn, table)
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


def _columns(conn: Any, table: str) -> list[str]:
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


def _lint_identities(context: _DayContext, reserved: Mapping[str, Reservation],
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


# --- layer 2: replay --------------------------------------------------------------------------


def replay_layer(context: _DayContext, scratch: Path) -> tuple[LayerResult, _World | None]:
    """Apply the day twice to copies of the previous day's snapshot; compare the hashes
    with each other and with the recorded one. Returns the first run's world if sound."""
    try:
        base = _previous_world(context)
        runs = [_replay_once(context, base, scratch / f"run{number}") for number in (1, 2)]
    except ApplyError as exc:
        return LayerResult("replay", "failed", f"{context.where(exc.index)} does not apply: "
                           f"{exc.reason}", {"seq": context.events[exc.index].seq,
                                             "index": exc.index}), None
    except WorldError as exc:  # the previous day or a blob cannot be read back
        return LayerResult("replay", "failed", f"{context.name} cannot be replayed: {exc}"), None
    first, second = runs
    evidence: dict[str, Any] = {"runs": [first.world_hash, second.world_hash],
                                "recorded": context.record.world_hash}
    if first.world_hash != second.world_hash:
        where = _difference(context, first.manifest, second.manifest)
        return LayerResult("replay", "failed", f"two replays of {context.name} from the same "
                           f"state differ ({first.world_hash} vs {second.world_hash}): "
                           f"{where}", evidence), None
    if first.world_hash != context.record.world_hash:
        where = _difference(context, decode_manifest(context.record.manifest), first.manifest)
        return LayerResult("replay", "failed", f"replaying {context.name} gives "
                           f"{first.world_hash}, the store recorded "
                           f"{context.record.world_hash}: {where}", evidence), None
    before = (decode_manifest(context.previous.manifest) if context.previous
              else Manifest(format=first.manifest.format, services={}, files={}))
    world = _World(scratch / "run1", first.manifest, base, before)
    return LayerResult("replay", "passed", f"two replays of {context.name} both give the "
                       f"recorded hash {first.world_hash}", evidence), world


def _replay_once(context: _DayContext, base: Path | None, root: Path) -> BuiltDay:
    return build_day_on(base, root, context.events, context.worlds.store.blob)


def _previous_world(context: _DayContext) -> Path | None:
    """The previous day's snapshot, re-hashed first: a cache entry modified on disk would
    make a sound day look nondeterministic, so a bad entry is rebuilt from the log."""
    previous = context.previous
    if previous is None:
        return None
    worlds = context.worlds
    snapshot = worlds.snapshot(previous.persona, previous.day)
    if worlds.cache.check(previous.world_hash):
        worlds.cache.evict(previous.world_hash)
        snapshot = worlds.snapshot(previous.persona, previous.day)
    return snapshot


def _difference(context: _DayContext, a: Manifest, b: Manifest) -> str:
    service, table, file = first_difference(a, b)
    if file:
        thing = f"file {file!r}"
    elif table:
        thing = f"table {service}.{table}"
    else:
        thing = f"service {service!r}" if service else "the manifest"
    writer = next((i for i, e in enumerate(context.events)
                   if touched_by(e.payload, table, file, service)), None)
    return f"first difference in {thing}" + (
        f", first written by {context.where(writer)}" if writer is not None else "")


# --- layer 3: declarations ---------------------------------------------------------------------


def declarations_layer(context: _DayContext, world: _World,
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


def _declaration_checks(world: _World, produces: Produces) -> Iterator[dict[str, Any]]:
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
    return _select_in(service_db(root, ref.service) if root is not None else None, ref)


def _select_in(db: Path | None, ref: RowRef) -> _Rows:
    label = f"{ref.service}.{ref.table}"
    if db is None or not db.is_file():
        return _Rows([], f"no service {ref.service!r}")
    with open_readonly(db) as conn:
        tables = {name for (name,) in conn.execute(
            "SELECT name FROM sqlite_schema WHERE type = 'table'")}
        if ref.table not in tables:
            return _Rows([], f"no table {label}")
        columns = _columns(conn, ref.table)
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


def _row_write_problem(world: _World, write: RowWrite) -> str | None:
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
    return _exists_problem(_select(root, ref), ref)


def _exists_problem(found: _Rows, ref: RowRef) -> str | None:
    if found.problem is not None:
        return f"{_describe(ref)}: missing ({found.problem})"
    return None if found.rows else f"{_describe(ref)}: missing (no matching row)"


def _file_write_problem(world: _World, file: FileWrite) -> str | None:
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


def _cross_ref_problem(world: _World, cross: CrossRef) -> str | None:
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


def _mention_problem(world: _World, place: Place, mentions: str) -> str | None:
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


# --- layer 4: live health ------------------------------------------------------------------------


def health_layer(context: _DayContext, produces: Produces | None,
                 env: Environment | None) -> LayerResult:
    owned = env is None
    environment = env if env is not None else Environment(context.worlds)
    try:
        try:
            instance = environment.open(context.name)
        except AppPinError as exc:
            return LayerResult("health", "failed", f"{context.name} cannot be served: {exc}",
                               {"pins": "refused"})
        except WorldError as exc:
            return LayerResult("health", "failed", f"{context.name} cannot be opened: {exc}")
        with instance:
            return _probe(context, instance, produces)
    finally:
        if owned:
            environment.close()


def _probe(context: _DayContext, instance: Instance, produces: Produces | None) -> LayerResult:
    declared = produces or Produces()
    if not read_pins(instance.mount.snapshot) and not (declared.accounts
                                                       or declared.credentials):
        # Nothing serves this world with its own code and nothing is declared to look
        # for: a "passed" here would claim a check that never happened.
        return LayerResult("health", "not_run", (
            f"nothing to check: {context.name} pins no apps (its log has no `app` event), "
            "so no service runs the world's own code, and produces.json declares no "
            "accounts or credentials"), {"pins": {}})
    services: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for service in sorted(instance.mount.manifest.services):
        outcome = _probe_service(instance, service)
        services[service] = outcome
        if outcome.get("problem"):
            problems.append(f"service {service!r}: {outcome['problem']}")
    for i, account in enumerate(declared.accounts):
        # Instances copy a database on first write; until then it is read in the snapshot.
        found = _select_in(_live_db(instance, account.service), account)
        missing = _exists_problem(found, account)
        if missing is not None:
            problems.append(f"accounts[{i}]: {missing} in the live instance")
    for i, credential in enumerate(declared.credentials):
        problem = _credential_problem(instance, credential)
        if problem is not None:
            problems.append(f"credentials[{i}]: {problem}")
    evidence = {"services": services, "accounts": len(declared.accounts),
                "credentials": len(declared.credentials)}
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return LayerResult("health", "failed", problems[0] + more,
                           {**evidence, "problems": problems})
    probed = sum(1 for s in services.values() if "tool" in s)
    return LayerResult("health", "passed", f"{context.name} opens with its pinned apps; "
                       f"{probed} of {len(services)} services answered a read-only call; "
                       f"{len(declared.accounts)} accounts and {len(declared.credentials)} "
                       "credentials found", evidence)


def _live_db(instance: Instance, service: str) -> Path | None:
    if service not in instance.mount.manifest.services:
        return None
    return instance.mount.read_db_path(service)


def _probe_service(instance: Instance, service: str) -> dict[str, Any]:
    tool = probe_tool(instance, service)
    if tool is None:
        served = any(spec.service == service for spec in instance.tools.values())
        note = ("no read-only tool without required arguments; not probed" if served
                else "no app serves it (data only)")
        return {"note": note}
    result = instance.call_tool(tool, {})
    if result.is_error:
        return {"tool": tool, "problem": f"{tool}({{}}) answered an error: {result.text[:200]}"}
    return {"tool": tool, "ok": True}


def probe_tool(instance: Instance, service: str) -> str | None:
    """The read-only tool of `service` to call with no arguments: none required; names
    with "list" or "search" first, then by name."""
    candidates = []
    for info in instance.list_tools():
        spec = instance.tools.get(info.name)
        if spec is None or spec.service != service or info.writes:
            continue
        if info.input_schema.get("required"):
            continue
        preferred = "list" in info.name or "search" in info.name
        candidates.append((not preferred, info.name))
    return min(candidates)[1] if candidates else None


def _credential_problem(instance: Instance, credential: Credential) -> str | None:
    workspace = instance.mount.workspace  # the instance's own copy, as an agent sees it
    try:
        path = workspace_path(workspace.parent, credential.file)
    except PathError as exc:
        return f"file: {exc}"
    if not path.is_file():
        return f"file {credential.file!r} is not in the workspace"
    text = path.read_bytes().decode("utf-8", "replace")
    if credential.contains not in text:
        return f"file {credential.file!r} does not contain {credential.contains!r}"
    return None


# --- layer 5: review ------------------------------------------------------------------------------


def review_layer(world_dir: Path, reviewer: Reviewer | None, plan: str | None) -> LayerResult:
    if reviewer is None:
        return LayerResult("review", "not_run", "no model configured")
    if plan is None:
        return LayerResult("review", "not_run", "no plan given to review the world against")
    try:
        outcome = reviewer.review(world_dir, plan)
    except (NoModel, RecordingMissing, BudgetSpent):
        raise  # the review did not happen: the caller says so (not run, stopped)
    except Exception as exc:  # the reviewer is plugged in from outside: report, never pass
        return LayerResult("review", "failed", f"the reviewer raised "
                           f"{type(exc).__name__}: {exc}")
    evidence = {"findings": list(outcome.findings), "model": outcome.model}
    return LayerResult("review", "passed" if outcome.passed else "failed", outcome.reason,
                       evidence)


__all__ = [
    "ACCOUNTS_FILE",
    "IDENTITY_COLUMNS",
    "IDENTITY_TABLES",
    "LAYERS",
    "CrossRef",
    "DayReport",
    "LayerResult",
    "Produces",
    "ReviewOutcome",
    "Reviewer",
    "RowRef",
    "RowWrite",
    "accounts_file_identities",
    "clock_and_random_uses",
    "inserted_identities",
    "load_produces",
    "path_problem",
    "probe_tool",
    "render_day_report",
    "reserved_identities",
    "validate_day",
]
