"""Nothing reaches the host's time zone, however a modifier is spelt (hardening, class 4).

SQLite's date functions convert with the host's time zone (TZ, /etc/localtime) for the
'localtime' and 'utc' modifiers as SQLite reads them: a text up to its first NUL, in any
letter case, a blob's bytes as text. ``'localtime' || char(0)`` once passed the guard and
gave one log two world hashes under two time zones. The guard now asks SQLite itself
(``replay.sqlite.reads_time_zone``), so the corpus below is written against SQLite's
reading, not against the guard's.

The corpus (``CORPUS``): logs whose last events apply a time-zone modifier, in families:
spelt in SQL (NUL, case, blobs, casts, char/printf/replace/substr/unhex/json/unistr...),
bound parameters (text with a NUL, blobs, named), read from the world (a column, CTEs, a
recursive CTE, json_each, a view, a trigger's body and WHEN, a subquery, a window), the
schema (DEFAULT, CHECK, STORED and VIRTUAL generated columns, an index expression, a
partial index, UPSERT, UPDATE, DELETE) and every date function and position (nested
calls included). ``LOOKALIKES`` are what SQLite never converts with the host's zone: they
must be accepted and give one world.

* Every case is imported in fresh processes under TZ=UTC and TZ=Pacific/Kiritimati: the
  same outcome, a hostile case refused in one line naming the persona-day and event.
* Every case is applied in-process (``WorldBuilder``) under three zones: the same world or
  refusal; with the refusal switched off, every hostile case gives worlds that differ
  between zones (so the corpus does reach the host's zone: it can fail).
* Hypothesis draws spellings (case, NUL anywhere, spaces, pieces joined, blobs, bound or
  computed) and checks the guard against SQLite itself, run unguarded in two zones.
* The other places world SQL runs: the agent's SQL tool, app tools in process and in the
  sandboxed app worker, the judge's queries, episode effects applied with the world's
  triggers, verifier sandboxes, and the store on SQLite and PostgreSQL.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import replay.sqlite as guards
from gates.errors import InspectionRefused
from gates.judges import WorldInspector
from gates.verifier import run_verifier
from gates.verifier_server import close_servers
from replay.apply import WorldBuilder
from replay.engine import Worlds
from replay.errors import ApplyError, EventFailed
from replay.hashing import service_manifest
from replay.layout import service_db
from tests.support.sandbox_uids import free_uid
from worldenv.core.app import App, ToolContext
from worldenv.core.episode import apply_effects
from worldenv.instances.instance import Environment
from worldenv.sandbox.bubblewrap import BubblewrapSandbox
from worldenv.sandbox.choice import default_sandbox
from worldenv.sandbox.workers import WorkerLimits, WorkerPool
from worldstore.events import SqlPayload, StoredEvent

REPO = Path(__file__).resolve().parents[2]
# POSIX TZ strings (no time zone database needed): UTC, UTC+14, UTC-3:30.
ZONES = ("UTC0", "XKT-14", "XNT+3:30")
NOON = "'2026-03-02 10:00:00'"  # the time value the corpus converts
Event = tuple[str, Any]  # (sql, params as in the interchange format)


@contextlib.contextmanager
def host_zone(tz: str) -> Iterator[None]:
    """This process's local time zone is `tz` for the block (SQLite's localtime_r reads
    the C library's, which ``time.tzset`` reloads from TZ)."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = tz
    time.tzset()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = before
        time.tzset()


def blob(data: bytes) -> dict[str, str]:
    return {"$base64": base64.b64encode(data).decode()}


# --- the corpus --------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    name: str
    events: tuple[Event, ...]  # after PRELUDE
    refused_at: int | None  # the index (in the whole log) of the event refused; None: accepted
    # whether SQLite, unguarded, would convert with the host's zone (not: a modifier with
    # spaces around it, which SQLite reads as no modifier; refused to say why)
    reaches: bool = True


PRELUDE: tuple[Event, ...] = (
    ("CREATE TABLE t(v)", None),
    (f"INSERT INTO t VALUES ({NOON})", None),
    ("CREATE TABLE out(x)", None),
    ("CREATE TABLE m(v)", None),
)


def case(name: str, *events: str | Event, refused: int | None = -1) -> Case:
    """A case; `refused`: which of `events` is refused (-1: the last; None: none)."""
    shaped = tuple(e if isinstance(e, tuple) else (e, None) for e in events)
    at = None if refused is None else len(PRELUDE) + (refused % len(shaped))
    return Case(name, shaped, at)


def spelt(name: str, modifier: str) -> Case:
    return case(f"spelt:{name}", f"INSERT INTO out VALUES (datetime({NOON}, {modifier}))")


def bound(name: str, params: Any, sql: str = f"datetime({NOON}, ?)") -> Case:
    return case(f"bound:{name}", (f"INSERT INTO out VALUES ({sql})", params))


def stored(name: str, modifier: str, *events: str) -> Case:
    """`modifier` kept in m.v first, then `events` apply it."""
    return case(f"world:{name}", f"INSERT INTO m VALUES ({modifier})", *events)


LT0 = "'localtime' || char(0)"  # the issue's own spelling
UTC0 = "'UTC' || char(0)"

CORPUS: list[Case] = [
    # spelt in SQL
    spelt("nul", LT0),
    spelt("nul-then-text", "'LOCALTIME' || char(0) || ' and more'"),
    spelt("utc-nul", "'uTc' || char(0)"),
    spelt("many-nuls", "'localtime' || char(0, 0, 32)"),
    spelt("blob", "x'6c6f63616c74696d65'"),
    spelt("blob-nul", "x'75746300ff'"),
    spelt("cast-blob", "CAST(x'4c6f63616c54696d6500' AS TEXT)"),
    spelt("char-codes", "char(108, 111, 99, 97, 108, 116, 105, 109, 101)"),
    spelt("printf", "printf('%s%c%s', 'LOCAL', 't', 'ime')"),
    spelt("replace", "replace('lXcaltime', 'X', 'o') || char(0)"),
    spelt("substr", "substr('xxUTC', 3)"),
    spelt("upper", "upper('utc')"),
    spelt("unhex", "unhex('6c6f63616c74696d6500')"),
    spelt("concat", "concat('loc', 'altime', char(0))"),
    Case("spelt:spaces", ((f"INSERT INTO out VALUES (datetime({NOON}, ' UTC '))", None),),
         len(PRELUDE), reaches=False),
    spelt("json", "json_extract('[\"localtime\\u0000\"]', '$[0]')"),
    spelt("unistr", "unistr('\\006cocaltime')"),
    spelt("trim", "trim(char(9) || 'localtime' || char(10), char(9, 10))"),
    spelt("case", "CASE WHEN 1 THEN 'Utc' END"),
    spelt("coalesce", f"coalesce(NULL, {LT0})"),
    spelt("hex-roundtrip", "CAST(unhex(hex('localtime')) AS TEXT)"),
    spelt("format", "format('%.9s', 'localtimeXYZ')"),
    spelt("iif", f"iif(length({NOON}) > 0, {UTC0}, '+1 day')"),
    # bound parameters
    bound("nul", ["localtime\u0000"]),
    bound("nul-then-text", ["UTC\u0000junk"]),
    bound("blob", [blob(b"localtime")]),
    bound("blob-nul", [blob(b"utc\x00\xff")]),
    bound("named", {"m": "LocalTime\u0000"}, sql=f"datetime({NOON}, :m)"),
    bound("strftime", ["localtime\u0000x"], sql=f"strftime('%Y-%m-%d %H', {NOON}, ?)"),
    bound("numbered", [NOON.strip("'"), "utc\u0000"], sql="datetime(?1, ?2)"),
    bound("after-modifiers", ["+1 day", "start of day", "LOCALTIME\u0000"],
          sql=f"datetime({NOON}, ?, ?, '+10 hours', ?)"),
    # read from the world
    stored("column", LT0, f"INSERT INTO out SELECT datetime({NOON}, v) FROM m"),
    stored("column-blob", "x'55544300'", f"INSERT INTO out SELECT datetime({NOON}, v) FROM m"),
    case("world:cte", f"WITH c(v) AS (SELECT 'local' || 'time' || char(0)) "
                      f"INSERT INTO out SELECT datetime({NOON}, v) FROM c"),
    case("world:recursive-cte",
         "WITH RECURSIVE c(i, s) AS (SELECT 1, 'l' UNION ALL SELECT i + 1, "
         "s || substr('localtime', i + 1, 1) FROM c WHERE i < 9) "
         f"INSERT INTO out SELECT datetime({NOON}, s || char(0)) FROM c WHERE i = 9"),
    case("world:json-each", f"INSERT INTO out SELECT datetime({NOON}, value) FROM "
                            "json_each('[\"+1 day\", \"localtime\\u0000\"]')"),
    case("world:view", f"CREATE VIEW lv AS SELECT datetime(v, {LT0}) AS d FROM t",
         "INSERT INTO out SELECT d FROM lv"),
    case("world:trigger", "CREATE TRIGGER tr AFTER INSERT ON m BEGIN "
                          f"INSERT INTO out VALUES (datetime({NOON}, new.v)); END",
         f"INSERT INTO m VALUES ({UTC0})"),
    case("world:trigger-when", f"CREATE TRIGGER tr AFTER INSERT ON m WHEN datetime({NOON}, "
                               f"new.v) = {NOON} BEGIN INSERT INTO out VALUES ('seen'); END",
         f"INSERT INTO m VALUES ({LT0})"),
    stored("subquery", "'LOCALTIME' || char(0)",
           f"INSERT INTO out VALUES (datetime({NOON}, (SELECT v FROM m LIMIT 1)))"),
    stored("window", UTC0, f"INSERT INTO out SELECT datetime({NOON}, first_value(v) OVER ()) "
                           "FROM m"),
    stored("group-concat", "'loc'", "INSERT INTO m VALUES ('altime')",
           f"INSERT INTO out SELECT datetime({NOON}, group_concat(v, '')) FROM m"),
    # the schema
    case("schema:default", f"CREATE TABLE d(a, b DEFAULT (datetime({NOON}, {LT0})))",
         "INSERT INTO d(a) VALUES (1)"),
    case("schema:check", f"CREATE TABLE c(v CHECK (datetime({NOON}, v) = {NOON}))",
         f"INSERT INTO c VALUES ({LT0})"),
    case("schema:generated-stored",
         f"CREATE TABLE g(m, d AS (datetime({NOON}, m)) STORED)",
         f"INSERT INTO g(m) VALUES ({UTC0})", "INSERT INTO out SELECT d FROM g", refused=1),
    # (SQLite computes a virtual column on insert too, and the insert is refused)
    case("schema:generated-virtual", f"CREATE TABLE g(m, d AS (datetime({NOON}, m)))",
         f"INSERT INTO g(m) VALUES ({UTC0})", "INSERT INTO out SELECT d FROM g", refused=1),
    case("schema:index-expression", f"CREATE INDEX ix ON t(datetime(v, {LT0}))",
         f"INSERT INTO out SELECT v FROM t WHERE datetime(v, {LT0}) = {NOON}", refused=0),
    # (unguarded, the second row breaks the unique index only where 'UTC' is the identity)
    case("schema:partial-index",
         f"CREATE UNIQUE INDEX p ON t(v) WHERE datetime(v, {UTC0}) = v",
         f"INSERT INTO t VALUES ({NOON})", refused=0),
    case("schema:add-column-generated", f"ALTER TABLE t ADD COLUMN g AS (datetime(v, {LT0}))",
         "INSERT INTO out SELECT g FROM t"),
    # (SQLite allows a non-constant default on an empty table: each insert evaluates it)
    case("schema:add-column-default", "CREATE TABLE e(a)",
         f"ALTER TABLE e ADD COLUMN d DEFAULT (datetime({NOON}, {LT0}))",
         "INSERT INTO e(a) VALUES (1)"),
    case("schema:index-maintenance", "CREATE TABLE i(v, m)",
         f"INSERT INTO i VALUES ({NOON}, '+1 day')", "CREATE INDEX ix ON i(datetime(v, m))",
         f"UPDATE i SET m = {LT0}",
         f"INSERT INTO out SELECT v FROM i WHERE datetime(v, m) = {NOON}", refused=3),
    # (with sqlite_stat4, the planner evaluates the right-hand side while it plans)
    case("schema:analyzed-index", "CREATE INDEX ix ON t(datetime(v, '+1 day'))", "ANALYZE",
         "INSERT INTO out SELECT v FROM t WHERE datetime(v, '+1 day') = "
         f"datetime('2026-03-03 10:00:00', {LT0})"),
    case("schema:upsert", "CREATE TABLE u(k PRIMARY KEY, at)", "INSERT INTO u VALUES (1, 'x')",
         f"INSERT INTO u VALUES (1, 'y') ON CONFLICT(k) DO UPDATE SET at = "
         f"datetime({NOON}, {LT0})"),
    case("schema:update", f"UPDATE t SET v = datetime(v, {UTC0})"),
    case("schema:delete", f"DELETE FROM t WHERE datetime(v, {LT0}) = v"),
    # every date function and position
    case("function:date", f"INSERT INTO out VALUES (date('2026-03-02 20:00:00', {LT0}))"),
    case("function:time", f"INSERT INTO out VALUES (time('10:00', {LT0}))"),
    case("function:julianday", f"INSERT INTO out VALUES (julianday({NOON}, '+1 day', {LT0}))"),
    case("function:unixepoch", f"INSERT INTO out VALUES (unixepoch({NOON}, {UTC0}))"),
    case("function:strftime-now", f"INSERT INTO out VALUES (strftime('%F %T', 'now', {LT0}))"),
    case("function:after-modifiers",
         f"INSERT INTO out VALUES (datetime({NOON}, 'start of day', '+10 hours', {LT0}))"),
    case("function:subsec", f"INSERT INTO out VALUES (datetime('now', 'subsec', {LT0}))"),
    case("function:auto", f"INSERT INTO out VALUES (datetime(1772445600, 'auto', {UTC0}))"),
    case("function:nested-timediff",
         f"INSERT INTO out VALUES (timediff(datetime({NOON}, {LT0}), {NOON}))"),
    case("function:nested-date", "INSERT INTO out VALUES "
                                 f"(date(datetime('2026-03-02 23:00:00', {LT0}), '+1 day'))"),
    case("function:modifier-from-strftime",
         f"INSERT INTO out VALUES (datetime({NOON}, strftime('localtime', {NOON})))"),
]

LOOKALIKES: list[Case] = [
    case(f"lookalike:{name}", f"INSERT INTO out VALUES ({expr})", refused=None)
    for name, expr in [
        ("prefix", f"datetime({NOON}, 'localtim')"),
        ("two-words", f"datetime({NOON}, 'local time')"),
        ("suffix", f"datetime({NOON}, 'localtimes')"),
        ("nul-first", f"datetime({NOON}, char(0) || 'localtime')"),
        ("blob-nul-first", f"datetime({NOON}, x'00' || 'utc')"),
        ("offset-modifier", f"datetime({NOON}, '+14:00')"),
        ("offset-in-value", "datetime('2026-03-02T10:00:00+14:00')"),
        ("format-letters", f"strftime('%z %Z %c %x %X', {NOON})"),
        ("word-in-format", f"strftime('localtime %H', {NOON})"),
        ("time-value", "date('localtime')"),
        ("plain-value", "'localtime' || char(0)"),
        ("others", "datetime(1772445600, 'unixepoch', 'subsec', 'start of month', "
                   "'weekday 0', '+1 day', 'ceiling')"),
        ("now", "datetime('now') || CURRENT_TIMESTAMP || julianday('now', '+14 hours')"),
    ]
]
LOOKALIKES.append(case(  # a view is only text until something reads it
    "lookalike:never-read-view", f"CREATE VIEW w AS SELECT datetime(v, {LT0}) FROM t",
    "ALTER TABLE t RENAME TO t2", refused=None))
ALL = CORPUS + LOOKALIKES
REACHING = [c for c in CORPUS if c.reaches]


def log_lines(persona: str, c: Case) -> list[dict[str, Any]]:
    lines = []
    for n, (text, params) in enumerate(PRELUDE + c.events):
        line: dict[str, Any] = {"persona": persona, "day": 0,
                                "ts": f"2026-03-02T08:00:{n:02d}Z", "type": "sql",
                                "service": "app", "sql": text}
        if params is not None:
            line["params"] = params
        lines.append(line)
    return lines


def test_the_corpus_is_what_it_says() -> None:
    assert len(CORPUS) >= 50 and len({c.name for c in ALL}) == len(ALL)
    assert all(c.refused_at is not None for c in CORPUS)


# --- one log, one outcome in every time zone (fresh processes) ----------------------------

_IMPORT = r"""
import io, json, sys
from pathlib import Path
from replay.engine import Worlds
from worldstore.errors import WorldError
where, cases = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
seen = {}
with Worlds.open(where / "store", where / "cache") as worlds:
    for persona, lines in cases.items():
        data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
        try:
            worlds.import_stream(io.BytesIO(data), source="log.jsonl")
        except WorldError as exc:
            seen[persona] = ["refused", str(exc), worlds.store.persona(persona) is None]
        else:
            seen[persona] = ["hashes", [d.world_hash for d in worlds.store.days(persona)]]
print(json.dumps(seen))
"""


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Each case imported (one persona each) by a fresh process per zone, both at once."""
    root = tmp_path_factory.mktemp("zones")
    cases = root / "cases.json"
    cases.write_text(json.dumps({f"c{n}": log_lines(f"c{n}", c) for n, c in enumerate(ALL)}))
    runs = {}
    for zone in ("UTC", "Pacific/Kiritimati"):
        where = root / zone.replace("/", "-")
        where.mkdir()
        runs[zone] = subprocess.Popen(
            [sys.executable, "-c", _IMPORT, str(where), str(cases)],
            env={**os.environ, "TZ": zone}, cwd=REPO, stdout=subprocess.PIPE, text=True)
    seen = {}
    for zone, proc in runs.items():
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0
        seen[zone] = json.loads(out)
    return seen


@pytest.mark.parametrize("n", range(len(ALL)), ids=[c.name for c in ALL])
def test_one_log_gives_one_outcome_in_every_time_zone(imported: dict[str, dict[str, Any]],
                                                      n: int) -> None:
    c, persona = ALL[n], f"c{n}"
    utc, kiritimati = imported["UTC"][persona], imported["Pacific/Kiritimati"][persona]
    assert utc == kiritimati
    if c.refused_at is None:
        assert utc[0] == "hashes" and len(utc[1]) == 1
        return
    kind, message, nothing_stored = utc
    assert kind == "refused" and nothing_stored and "\n" not in message
    assert f"{persona}@0 event #{c.refused_at} refused" in message
    assert "modifier is not allowed" in message and "time zone" in message


# --- in-process, with the refusal and without it --------------------------------------------

def build(root: Path, c: Case, zone: str) -> tuple[str, object]:
    """Apply the case's log with the replay builder under `zone`: the refused event and
    why, or the service's manifest (what the world hash is made of)."""
    root.mkdir(parents=True)
    builder = WorldBuilder(root, lambda digest: b"")
    try:
        with host_zone(zone):
            for n, (text, params) in enumerate(PRELUDE + c.events):
                event = StoredEvent(persona="p", seq=n, day=0, ts=f"2026-03-02T08:00:{n:02d}Z",
                                    prev="", event_id=f"e{n}", schema_version=0, body=b"")
                try:
                    builder.apply(event, SqlPayload(service="app", sql=text, params=params))
                except EventFailed as exc:
                    return "refused", (n, str(exc))
            builder.commit()
    finally:
        builder.close()
    return "world", service_manifest(service_db(root, "app"))


@pytest.mark.parametrize("c", ALL, ids=[c.name for c in ALL])
def test_the_builder_gives_one_world_or_one_refusal_in_every_zone(tmp_path: Path, c: Case
                                                                  ) -> None:
    outcomes = [build(tmp_path / zone, c, zone) for zone in ZONES]
    assert outcomes[1:] == outcomes[:-1]
    kind, what = outcomes[0]
    if c.refused_at is None:
        assert kind == "world"
    else:
        assert kind == "refused" and isinstance(what, tuple) and what[0] == c.refused_at


@pytest.mark.parametrize("c", REACHING, ids=[c.name for c in REACHING])
def test_without_the_refusal_each_case_reaches_the_host_time_zone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, c: Case) -> None:
    """The corpus's own check: with the guard's decision switched off, every hostile case
    makes the world (or whether it is refused) depend on the zone."""
    monkeypatch.setattr(guards, "reads_time_zone", lambda modifier: False)
    outcomes = {repr(build(tmp_path / zone, c, zone)) for zone in ZONES}
    assert len(outcomes) > 1


# --- spellings drawn at random, decided against SQLite itself --------------------------------

BASES = ["localtime", "utc", "start of day", "+1 day", "subsec", "unixepoch", "auto", "now",
         "localtim", "utcx", "weekday 3", "ceiling", "local time", "u", ""]
SPACES = ["", " ", "\t", "\n", "\x0b", "\x0c", "\r", "  ", "\u3000"]
FUNCTIONS = [f"datetime({NOON}, {{}})", f"date({NOON}, '+1 day', {{}})",
             f"time({NOON}, {{}})", f"julianday({NOON}, {{}})", f"unixepoch({NOON}, {{}})",
             f"strftime('%F %T', {NOON}, {{}})", "datetime('now', 'start of day', {})"]


@st.composite
def spellings(draw: st.DrawFn) -> str:
    base = draw(st.sampled_from(BASES))
    upper = draw(st.lists(st.booleans(), min_size=len(base), max_size=len(base)))
    text = "".join(ch.upper() if up else ch for ch, up in zip(base, upper, strict=True))
    if draw(st.booleans()):
        at = draw(st.integers(0, len(text)))
        text = text[:at] + "\0" + text[at:] + draw(st.sampled_from(["", "x", "\0", " z"]))
    return draw(st.sampled_from(SPACES)) + text + draw(st.sampled_from(SPACES))


def sql_text(piece: str, how: str) -> str:
    """`piece` as an SQL expression giving that text (NULs as char(0))."""
    if how == "hex" and piece:
        return f"CAST(x'{piece.encode().hex()}' AS TEXT)"
    if how == "char" and piece:
        return f"char({', '.join(str(ord(ch)) for ch in piece)})"
    parts = ["'" + part.replace("'", "''") + "'" for part in piece.split("\0")]
    return " || char(0) || ".join(parts)


@st.composite
def deliveries(draw: st.DrawFn, value: str) -> tuple[str, list[Any], str | bytes]:
    """An SQL expression (with its parameters) that gives `value`, and the value as the
    date function receives it."""
    how = draw(st.sampled_from(["literal", "pieces", "param", "param-blob", "blob-literal",
                                "subquery", "cte"]))
    if how == "param":
        return "?", [value], value
    if how == "param-blob":
        return "?", [value.encode()], value.encode()
    if how == "blob-literal":
        return f"x'{value.encode().hex()}'", [], value.encode()
    cut = sorted(draw(st.lists(st.integers(0, len(value)), max_size=3)))
    pieces = [value[a:b] for a, b in zip([0, *cut], [*cut, len(value)], strict=True)]
    expr = " || ".join(sql_text(p, draw(st.sampled_from(["quote", "hex", "char"])))
                       for p in pieces) if how == "pieces" else sql_text(value, "quote")
    if how == "subquery":
        expr = f"(SELECT v FROM (SELECT {expr} AS v))"
    elif how == "cte":
        expr = f"(WITH c(v) AS (SELECT {expr}) SELECT v FROM c)"
    return expr, [], value


def run(conn: apsw.Connection, sql: str, params: Sequence[Any], zone: str) -> object:
    with host_zone(zone):
        guards.freeze(1772445600000, "fuzz")
        try:
            return conn.execute(sql, params).fetchall()
        except apsw.Error as exc:
            return ("refused", guards.describe_failure(exc))


def converts_with_the_zone(plain: apsw.Connection, value: str | bytes) -> bool:
    """Whether SQLite, unguarded, gives a different answer in two zones for `value` as a
    modifier."""
    return len({repr(run(plain, f"SELECT datetime({NOON}, ?)", [value], zone))
                for zone in ZONES[:2]}) > 1


@pytest.fixture(scope="module")
def connections(tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[tuple[apsw.Connection, apsw.Connection]]:
    guarded = guards.open_event_db(tmp_path_factory.mktemp("fuzz") / "app.sqlite")
    plain = apsw.Connection(":memory:", vfs=guards.frozen_vfs())  # (its 'now' is frozen too)
    yield guarded, plain
    guarded.close()
    plain.close()


def test_drawn_spellings_are_refused_exactly_when_sqlite_would_convert_them(
        connections: tuple[apsw.Connection, apsw.Connection]) -> None:
    guarded, plain = connections

    @settings(max_examples=300, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(st.data())
    def check(data: st.DataObject) -> None:
        value = data.draw(spellings())
        expr, params, received = data.draw(deliveries(value))
        sql = "SELECT " + data.draw(st.sampled_from(FUNCTIONS)).format(expr)
        seen = [run(guarded, sql, params, zone) for zone in ZONES[:2]]
        assert seen[0] == seen[1]  # one answer (or one refusal) whatever the zone
        refused = isinstance(seen[0], tuple)
        bare = received.strip()
        assert refused == (converts_with_the_zone(plain, received)
                           or converts_with_the_zone(plain, bare)), (sql, params)
        if refused:
            assert "modifier is not allowed" in str(seen[0])
        else:  # and what was accepted is SQLite's own answer
            assert seen[0] == run(plain, sql, params, "UTC0")

    check()


# --- every other place world SQL runs -----------------------------------------------------

APP = App(service="app", name="tz-app", version="1")


@APP.tool(writes=True)
def add(ctx: ToolContext, v: str) -> str:
    """Add a row to t."""
    ctx.execute("INSERT INTO t(v) VALUES (?)", (v,))
    return "added"


@APP.tool(writes=True)
def convert(ctx: ToolContext, modifier: str) -> str:
    """Store a converted time."""
    ctx.execute(f"INSERT INTO t(v) VALUES (datetime({NOON}, ?))", (modifier,))
    return "converted"


CARRIED = f'''
import os, time
from worldenv.core.app import App, ToolContext
app = App(service="app", name="tz-carried", version="1")


@app.tool(writes=True)
def convert(ctx: ToolContext, modifier: str) -> str:
    """Store a converted time."""
    ctx.execute("INSERT INTO t(v) VALUES (datetime({NOON}, ?))", (modifier,))
    return "converted"


@app.tool(writes=False)
def zone(ctx: ToolContext) -> str:
    """This process's local time zone."""
    return f"{{os.environ.get('TZ')}} {{time.localtime(0).tm_gmtoff}}"
'''


def world_log(persona: str, *, carried: bool = False) -> bytes:
    """A world from 2001 whose trigger rewrites `mark` with the host's local time, but
    only when the clock reads after 2010: never under an instance's frozen clock."""
    texts = ["CREATE TABLE t(id INTEGER PRIMARY KEY, v)",
             "CREATE TABLE mark(id INTEGER PRIMARY KEY, at)",
             "INSERT INTO mark VALUES (1, 'never')",
             "CREATE TRIGGER tr AFTER INSERT ON t WHEN date('now') > '2010-01-01' BEGIN "
             "UPDATE mark SET at = datetime('now', (SELECT 'local' || 'time')) WHERE id = 1; "
             "END"]
    lines: list[dict[str, Any]] = [
        {"persona": persona, "day": 0, "ts": f"2001-01-01T00:00:0{n}Z", "type": "sql",
         "service": "app", "sql": text} for n, text in enumerate(texts)]
    if carried:
        lines.append({"persona": persona, "day": 0, "ts": "2001-01-01T00:00:09Z",
                      "type": "app", "service": "app", "app": "tz-carried", "version": "1",
                      "code": CARRIED})
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worlds]:
    with Worlds.open(tmp_path_factory.mktemp("paths") / "store") as opened:
        opened.import_stream(io.BytesIO(world_log("w")), source="w.jsonl")
        opened.import_stream(io.BytesIO(world_log("carried", carried=True)), source="c.jsonl")
        yield opened


HOSTILE = ["localtime\u0000", "UTC\u0000junk", "LocalTime"]


def test_the_agents_sql_tool_and_app_tools_refuse_every_spelling(worlds: Worlds) -> None:
    env = Environment(worlds, apps={"app": APP}, check_pins=False)
    with env.open("w@0") as inst:
        for modifier in HOSTILE:
            result = inst.sql("app", f"INSERT INTO t(v) VALUES (datetime({NOON}, ?))",
                              [modifier])
            assert result.is_error and "modifier is not allowed" in result.text
            result = inst.call_tool("app_convert", {"modifier": modifier})
            assert result.is_error and "modifier is not allowed" in result.text
        assert inst.hash() == inst.record.world_hash  # nothing was written


def test_episode_effects_do_not_fire_the_worlds_triggers_again(worlds: Worlds,
                                                               tmp_path: Path) -> None:
    """An episode's changeset holds what its triggers wrote; applied with triggers on,
    the world's trigger ran again on the host's clock and zone (and wrote twice)."""
    env = Environment(worlds, apps={"app": APP}, check_pins=False)
    with env.open("w@0") as inst:
        assert not inst.call_tool("app_add", {"v": "x"}).is_error
        final = inst.hash()
        events = inst.episode.events
    assert final != inst.record.world_hash
    for zone in ZONES:
        with host_zone(zone), worlds.mount(inst.record.world_hash) as fresh:
            apply_effects(fresh, events)
            assert fresh.hash() == final


def test_the_judges_queries_refuse_every_spelling(worlds: Worlds) -> None:
    inspector = WorldInspector({"initial": worlds.snapshot("w", 0)})
    for modifier in ("'localtime' || char(0)", "x'55544300'", "'LocalTime'"):
        with pytest.raises(InspectionRefused, match="modifier is not allowed"):
            inspector.query("initial", "app", f"SELECT datetime({NOON}, {modifier})")
    ok = inspector.query("initial", "app", f"SELECT datetime({NOON}, '+1 day') AS d")
    assert json.loads(ok)["rows"] == [["2026-03-03 10:00:00"]]


def test_the_app_worker_refuses_every_spelling_and_runs_in_utc(worlds: Worlds) -> None:
    env = Environment(worlds, apps={})
    env._pool = WorkerPool(WorkerLimits(timeout_s=10))
    try:
        with env.open("carried@0") as inst:
            assert inst.call_tool("app_zone", {}).text == "UTC 0"
            for modifier in HOSTILE:
                result = inst.call_tool("app_convert", {"modifier": modifier})
                assert result.is_error and "modifier is not allowed" in result.text
            assert not inst.call_tool("app_convert", {"modifier": "+1 day"}).is_error
    finally:
        env.close()


@pytest.mark.parametrize("served", [False, True], ids=["own-sandbox", "server"])
def test_verifier_sandboxes_run_in_utc(worlds: Worlds, tmp_path: Path, served: bool) -> None:
    """A verifier's SQLite (the standard library's) and Python read local time as UTC,
    never the host's /etc/localtime, which the sandbox can read."""
    if not isinstance(default_sandbox(), BubblewrapSandbox):
        pytest.fail("this test needs bubblewrap (apt-get install bubblewrap util-linux)")
    uid = free_uid(67_000 + 2 * (os.getpid() % 1_000))
    folder = tmp_path / "verifier"
    folder.mkdir()
    (folder / "zone.py").write_text(
        "import os, sqlite3, time, awsdk\n"
        "local = sqlite3.connect(':memory:').execute(\n"
        f"    \"SELECT datetime({NOON}, 'localtime')\").fetchone()[0]\n"
        "awsdk.result(tz_is_utc=os.environ.get('TZ') == 'UTC',\n"
        "             python_is_utc=time.localtime(0).tm_gmtoff == 0,\n"
        f"             sqlite_is_utc=local == {NOON})\n")
    folder.chmod(0o755)
    w0 = worlds.snapshot("w", 0)
    try:
        verdict = run_verifier(folder, w0, w0, "", sandbox=BubblewrapSandbox(uid=uid, gid=uid),
                               scratch=worlds.cache.tmp if served else None)
    finally:
        close_servers()
    assert not verdict.errors
    assert {c.name: c.passed for c in verdict.checks} == {
        "tz_is_utc": True, "python_is_utc": True, "sqlite_is_utc": True}


def test_the_issues_log_is_refused_on_every_store(store_location: str, tmp_path: Path) -> None:
    lines = log_lines("eva", CORPUS[0])
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    with Worlds.open(store_location, tmp_path / "cache") as opened:
        with pytest.raises(ApplyError, match=r"eva@0 event #4 refused.*'localtime\\x00' modifier"):
            opened.import_stream(io.BytesIO(data), source="log.jsonl")
        assert opened.store.personas() == []
