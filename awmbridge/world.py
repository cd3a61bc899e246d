"""One AWM scenario as day 0 of a persona's world.

**Persona.** ``persona_for(name)`` is AWM's own normalisation of scenario names (what AWM
names a scenario's database file with): lower case, every character outside
``[a-z0-9_]`` (spaces, ``-``, punctuation, non-ASCII) becomes ``_``, runs of ``_`` become
one, leading and trailing ``_`` go. AWM-1K's names are normalised already, so
``e_commerce_33`` is persona ``e_commerce_33``. A name that maps to nothing, or to more
than 64 characters (``worldstore.names.MAX_NAME``), is refused: never cut, since two
scenarios could then share a persona.

**Service.** The world has one service, ``AWM_SERVICE`` (``awm``): the scenario's
database (``services/awm.sqlite`` in a checkout).

**Day 0.** AWM's own order (``awm gen db`` then ``awm gen sample``): table by table its
CREATE TABLE then its indexes, then the INSERTs table by table, every statement an event
at one frozen instant, ``AWM_DAY0_TS``, so AWM's ``datetime('now', '-3 days')`` and
``DEFAULT CURRENT_TIMESTAMP`` read that instant (replay freezes SQLite's clock at each
event's ``ts``). Where the scenario has server code, day 0 ends with the app pin that
carries it (``worldenv.awm.host``); code that imports a module the AWM adapter refuses to run
(``worldenv.awm.host.refused_imports``: ctypes, cffi) refuses the scenario.

**Failing statements.** AWM keeps a scenario when few of its statements fail and skips
the failing ones. Before anything is stored every statement is pre-run, in AWM's order,
in a scratch database opened the way replay opens event databases (frozen clock, the same
guards) with foreign keys enforced as AWM enforces them when it inserts its data; a
statement that fails (or that the interchange format refuses, such as two statements in
one text) is dropped and reported. As in AWM, once a table's CREATE TABLE or one of its
indexes fails, the rest of that table's indexes are not run. The scenario is refused when
``DROP_LIMIT_PERCENT`` (10 %) or more of its statements fail, when no CREATE TABLE
succeeds, or, with ``strict``, when any statement fails. Replay itself then applies the
kept statements (foreign keys not enforced, which only lets more through); in the corner
where it refuses one the pre-run kept, that one is dropped and reported too.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import apsw
import msgspec

from awmbridge.errors import AwmError, ScenarioRefused
from awmbridge.formats import ENVS_FILE, Origin, Scenario
from replay.sqlite import describe_failure, freeze, open_event_db, take_denial, unguarded
from worldenv.awm.host import (
    AWM_ADAPTER_VERSION,
    AWM_APP,
    AWM_SERVICE,
    awm_app_source,
    refused_imports,
)
from worldstore.errors import InputError
from worldstore.events import SqlLine
from worldstore.interchange import check_line
from worldstore.names import MAX_NAME, is_persona, ts_millis

__all__ = ["AWM_DAY0_TS", "AWM_SERVICE", "DROP_LIMIT_PERCENT", "Day0", "DroppedStatement",
           "Statement", "app_pin", "check_dropped", "day0_statements", "persona_for",
           "plan_day0", "prerun"]

# AWM_SERVICE ("awm", from worldenv.awm.host): one name for the service, here and in the adapter.
# The frozen instant of every day-0 event: the month AWM was published (arXiv 2602.10090).
# AWM's data is relative to "now" (datetime('now', '-365 days')), so any fixed instant
# works; one constant keeps every import of the same files identical.
AWM_DAY0_TS = "2026-02-01T00:00:00Z"
# A scenario with this share of failing statements or more is refused (whole percents,
# compared in integers: 3 of 30 is exactly 10 %).
DROP_LIMIT_PERCENT = 10
_NOT_PERSONA = re.compile(r"[^a-z0-9_]+")
_UNDERSCORES = re.compile(r"_+")

StatementKind = Literal["table", "index", "insert"]


def persona_for(scenario_name: str) -> str:
    """The persona a scenario's world is stored under (see the module docstring)."""
    persona = _UNDERSCORES.sub("_", _NOT_PERSONA.sub("_", scenario_name.lower())).strip("_")
    if not persona:
        raise AwmError(f"scenario name {scenario_name[:60]!r} has no letter or digit a "
                       "persona name could be made of")
    if len(persona) > MAX_NAME:
        raise AwmError(f"scenario name {scenario_name[:60]!r} maps to a persona of "
                       f"{len(persona)} characters; persona names have at most {MAX_NAME}")
    assert is_persona(persona), persona
    return persona


@dataclass(frozen=True, slots=True)
class Statement:
    """One of AWM's statements. `index` is its place in day 0's statements (from 0),
    `origin` the line of gen_db.jsonl or gen_sample.jsonl it comes from."""

    kind: StatementKind
    table: str
    index: int
    sql: str
    origin: Origin


@dataclass(frozen=True, slots=True)
class DroppedStatement:
    statement: Statement
    error: str

    def __str__(self) -> str:
        st = self.statement
        return (f"{st.origin}: {st.kind} statement #{st.index} ({_kind_of(st)} "
                f"{st.table}) dropped: {self.error}")

    def as_dict(self) -> dict[str, Any]:
        st = self.statement
        return {"kind": st.kind, "table": st.table, "index": st.index, "sql": st.sql,
                "file": st.origin.file, "line": st.origin.line, "error": self.error}


def _kind_of(st: Statement) -> str:
    return {"table": "table", "index": "an index of table", "insert": "into table"}[st.kind]


@dataclass(frozen=True, slots=True)
class Day0:
    """Day 0 of a scenario's world, ready to import: the statements kept, those dropped,
    and the app pin (None without server code)."""

    scenario: str
    persona: str
    kept: tuple[Statement, ...]
    dropped: tuple[DroppedStatement, ...]
    total: int
    app: dict[str, Any] | None

    def lines(self) -> bytes:
        """The day as interchange JSON Lines (``worldstore.interchange``)."""
        head = {"persona": self.persona, "day": 0, "ts": AWM_DAY0_TS}
        out = [msgspec.json.encode({**head, "type": "sql", "service": AWM_SERVICE,
                                    "sql": st.sql}) for st in self.kept]
        if self.app is not None:
            out.append(msgspec.json.encode({**head, **self.app}))
        return b"".join(line + b"\n" for line in out)

    def without(self, event_index: int, error: str) -> Day0:
        """The day with its `event_index`-th event (a statement) dropped for `error`."""
        st = self.kept[event_index]
        return Day0(self.scenario, self.persona,
                    self.kept[:event_index] + self.kept[event_index + 1:],
                    tuple(sorted((*self.dropped, DroppedStatement(st, error)),
                                 key=lambda d: d.statement.index)),
                    self.total, self.app)


def day0_statements(scenario: Scenario) -> list[Statement]:
    """AWM's statements in AWM's order: each table's DDL then its indexes, then the
    INSERTs table by table."""
    found: list[Statement] = []

    def add(kind: StatementKind, table: str, sql: str, origin: Origin) -> None:
        found.append(Statement(kind, table, len(found), sql, origin))

    for table in scenario.tables:
        add("table", table.name, table.ddl, table.origin)
        for index in table.indexes:
            add("index", table.name, index, table.origin)
    for inserts in scenario.inserts:
        for sql in inserts.statements:
            add("insert", inserts.table, sql, inserts.origin)
    return found


def app_pin(code: str) -> dict[str, Any]:
    """The interchange fields of the app line that carries a scenario's server code."""
    return {"type": "app", "service": AWM_SERVICE, "app": AWM_APP,
            "version": AWM_ADAPTER_VERSION, "code": awm_app_source(code)}


def plan_day0(scenario: Scenario, *, strict: bool = False) -> Day0:
    """Pre-run the scenario's statements and build its day 0, or raise ScenarioRefused
    (with the scenario's own problems first, if it has any)."""
    if scenario.problems:
        raise ScenarioRefused(scenario.name, [str(p) for p in scenario.problems])
    try:
        persona = persona_for(scenario.name)
    except AwmError as exc:
        raise ScenarioRefused(scenario.name, [
            f"{scenario.origin()}: scenario {scenario.name}: {exc}"]) from None
    statements = day0_statements(scenario)
    kept, dropped = prerun(statements, persona)
    day = Day0(scenario.name, persona, tuple(kept), tuple(dropped), len(statements),
               app_pin(scenario.code) if scenario.code is not None else None)
    check_dropped(scenario, day, strict=strict)
    check_imports(scenario)
    return day


def check_imports(scenario: Scenario) -> None:
    """Refuse server code that imports a module the AWM adapter refuses to run
    (``worldenv.awm.host.refused_imports``): no worker could load it."""
    if scenario.code is None:
        return
    refused = refused_imports(scenario.code)
    if refused:
        origin = scenario.origins.get(ENVS_FILE) or scenario.origin()
        raise ScenarioRefused(scenario.name, [
            f"{origin}: scenario {scenario.name}: its server code imports {name} (line "
            f"{line} of the code), which generated AWM code may not use: it reaches the "
            "machine's clock and entropy around the frozen ones" for line, name in refused])


def check_dropped(scenario: Scenario, day: Day0, *, strict: bool) -> None:
    """Refuse the day if too many statements (any, with `strict`) were dropped."""
    where = f"{scenario.origin()}: scenario {scenario.name}"
    if not scenario.tables:
        raise ScenarioRefused(scenario.name, [f"{where}: the database schema has no table"])
    if not any(st.kind == "table" for st in day.kept):
        raise ScenarioRefused(scenario.name, [
            f"{where}: the DDL fails entirely: none of its {len(scenario.tables)} CREATE "
            "TABLE statements runs", *[str(d) for d in day.dropped[:3]]])
    if strict and day.dropped:
        raise ScenarioRefused(scenario.name, [
            f"{where}: {len(day.dropped)} of {day.total} statements fail and --strict "
            "drops none", *[str(d) for d in day.dropped]])
    if len(day.dropped) * 100 >= DROP_LIMIT_PERCENT * day.total:
        raise ScenarioRefused(scenario.name, [
            f"{where}: {len(day.dropped)} of {day.total} statements fail "
            f"({len(day.dropped) / day.total:.0%}); AWM keeps a scenario only when fewer "
            f"than {DROP_LIMIT_PERCENT}% fail", *[str(d) for d in day.dropped]])


# --- the pre-run ---------------------------------------------------------------------


def prerun(statements: Sequence[Statement], persona: str
           ) -> tuple[list[Statement], list[DroppedStatement]]:
    """Run `statements` one by one on a scratch database; the ones that run, and the
    ones dropped with why."""
    kept: list[Statement] = []
    dropped: list[DroppedStatement] = []
    failed_tables: set[str] = set()  # tables whose DDL stopped (AWM skips the rest)
    millis = ts_millis(AWM_DAY0_TS)
    with tempfile.TemporaryDirectory(prefix="awm-prerun-") as scratch:
        conn = open_event_db(Path(scratch) / f"{AWM_SERVICE}.sqlite")
        try:
            _scratch_durability(conn)
            _enforce_foreign_keys(conn)
            for st in statements:
                error = _line_problem(st, persona)
                if error is None and st.kind == "index" and st.table in failed_tables:
                    error = ("not run: an earlier statement of this table's DDL failed, and "
                             "AWM runs no further index of the table")
                if error is None:
                    error = _run(conn, st, millis)
                if error is None:
                    kept.append(st)
                    continue
                dropped.append(DroppedStatement(st, error))
                if st.kind != "insert":
                    failed_tables.add(st.table)
        finally:
            conn.close()
    return kept, dropped


def _scratch_durability(conn: apsw.Connection) -> None:
    """The scratch database is thrown away: no statement waits for the disk (with the
    default journal, each one's commit synced it: ~1 ms a statement, most of a pre-run)."""
    unguarded(conn, "PRAGMA journal_mode = MEMORY")
    unguarded(conn, "PRAGMA synchronous = OFF")


def _enforce_foreign_keys(conn: apsw.Connection) -> None:
    """AWM inserts its sample data with ``PRAGMA foreign_keys = ON``: an INSERT naming a
    missing parent fails there, so it fails here. (Events may not set pragmas; this is
    the scratch connection, not an event.)"""
    unguarded(conn, "PRAGMA foreign_keys = ON")


def _line_problem(st: Statement, persona: str) -> str | None:
    """Why the interchange format refuses the statement as an event, or None."""
    line = SqlLine(persona=persona, day=0, ts=AWM_DAY0_TS, service=AWM_SERVICE, sql=st.sql)
    try:
        check_line(line, source=st.origin.file, line=st.origin.line)
    except InputError as exc:
        return exc.reason
    return None


def _run(conn: apsw.Connection, st: Statement, millis: int) -> str | None:
    """Run one statement as replay runs an event (the clock frozen at day 0's instant);
    the error, or None."""
    freeze(millis, f"awm-prerun-{st.index}")
    try:
        for _row in conn.execute(st.sql):
            pass
    except apsw.Error as exc:
        return describe_failure(exc)
    except KeyError as exc:  # apsw's lookup of a named parameter: AWM binds none
        take_denial()
        return f"no value for named parameter {exc}: AWM's statements bind no parameters"
    return take_denial()
