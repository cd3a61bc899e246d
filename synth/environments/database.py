"""Stages 2-4 of environment synthesis: tasks, schema, sample data (methods.md section 2).

* **tasks**: ``TASKS_PER_SCENARIO`` self-contained tasks per scenario; every task must be
  well-formed (not empty, not a duplicate, no log-in: the user is logged in already).
* **schema**: SQLite DDL (tables with their indexes) inferred from the tasks, executed
  statement by statement on a scratch database exactly as ``import-awm`` pre-runs AWM's
  (``awmbridge.world.prerun``: the replay's guards, a frozen clock, foreign keys enforced).
  Each failing statement is an error, and so is a table without created_at/updated_at or
  one that stores credentials. Accepted when fewer than 10 % of statements fail.
* **data**: INSERTs per table in foreign-key order, executed after the accepted schema
  the same way (a row naming a missing parent fails). Accepted when fewer than 10 % of
  the INSERTs fail.

Schema and data then become day 0 of the scenario's world through the AWM import path
(``day0``): the same pre-run, the same refusal at 10 % of failing statements, the same
reports as ``import-awm``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import apsw
import msgspec

from awmbridge.formats import Origin, Scenario, Table, TableInserts
from awmbridge.world import Day0, Statement, plan_day0, prerun
from synth.stage import Measure, Stage

TASKS_PER_SCENARIO = 10
TASK_CHARS = (15, 800)
ACCEPT_BELOW = 0.10  # schema and data: the share of failing statements AWM accepts
_LOGIN = re.compile(r"\b(log ?in|logs ?in|sign ?in|sign ?up|password)\b", re.IGNORECASE)
_AUTH_COLUMN = re.compile(r"(password|passwd|secret|token|session)", re.IGNORECASE)
_AUTH_TABLE = re.compile(r"^(sessions?|auth\w*|tokens?|credentials?|passwords?)$",
                         re.IGNORECASE)
_INSERT = re.compile(r"\s*INSERT\s+(OR\s+\w+\s+)?INTO\b", re.IGNORECASE)
TIMESTAMPS = ("created_at", "updated_at")


class ScenarioSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A scenario as the scenarios stage writes it (a line of scenarios.jsonl)."""

    name: str
    description: str
    category: str = ""


# --- stage 2: tasks -------------------------------------------------------------------


class TasksOut(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    tasks: list[str]


def task_problems(tasks: Sequence[str]) -> list[tuple[int, str]]:
    """(index, problem) of every task that is not well-formed."""
    problems: list[tuple[int, str]] = []
    seen: dict[str, int] = {}
    lo, hi = TASK_CHARS
    for i, task in enumerate(tasks):
        text = " ".join(task.split())
        if not lo <= len(text) <= hi:
            problems.append((i, f"task {i + 1} has {len(text)} characters; a task has "
                                f"{lo} to {hi}"))
        elif _LOGIN.search(text):
            problems.append((i, f"task {i + 1} asks to log in, sign up or use a password; "
                                "the user is logged in already"))
        elif text.casefold() in seen:
            problems.append((i, f"task {i + 1} repeats task {seen[text.casefold()] + 1}"))
        seen.setdefault(text.casefold(), i)
    return problems


def valid_tasks(output: TasksOut, n: int = TASKS_PER_SCENARIO) -> list[str]:
    """The well-formed tasks, at most `n` (what later stages build on)."""
    bad = {i for i, _ in task_problems(output.tasks)}
    return [" ".join(t.split()) for i, t in enumerate(output.tasks) if i not in bad][:n]


class TasksStage(Stage[TasksOut]):
    name = "tasks"
    threshold = 0.0
    keeps_best = True  # the well-formed tasks of the best attempt go on
    output_type = TasksOut

    def __init__(self, scenario: ScenarioSpec, n: int = TASKS_PER_SCENARIO) -> None:
        self.scenario = scenario
        self.n = n

    def inputs(self) -> Any:
        return {"scenario": msgspec.to_builtins(self.scenario), "n": self.n}

    def request(self) -> str:
        return (f"Scenario: {self.scenario.name}\n\n{self.scenario.description}\n\n"
                f"Write exactly {self.n} tasks.")

    def execute(self, output: TasksOut) -> Measure:
        errors = [p for _i, p in task_problems(output.tasks)]
        if len(output.tasks) != self.n:
            errors.insert(0, f"{len(output.tasks)} tasks given; exactly {self.n} are asked for")
        bad = len({i for i, _ in task_problems(output.tasks)}) + abs(len(output.tasks) - self.n)
        return Measure(min(1.0, bad / self.n), tuple(errors),
                       {"tasks": len(output.tasks), "valid": len(valid_tasks(output, self.n))})


# --- stage 3: schema ------------------------------------------------------------------


class TableOut(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    ddl: str
    indexes: list[str] = []


class SchemaOut(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    tables: list[TableOut]


def _tasks_text(tasks: Sequence[str]) -> str:
    return "\n".join(f"{i}. {t}" for i, t in enumerate(tasks, 1))


def schema_statements(schema: SchemaOut) -> list[Statement]:
    """The schema's statements in AWM's order (each table's DDL, then its indexes)."""
    found: list[Statement] = []
    for t, table in enumerate(schema.tables):
        origin = Origin("schema", t + 1)
        found.append(Statement("table", table.name, len(found), table.ddl, origin))
        for index in table.indexes:
            found.append(Statement("index", table.name, len(found), index, origin))
    return found


def table_columns(statements: Sequence[Statement]) -> dict[str, list[str]]:
    """The columns of each table the DDL statements create, in declaration order (the
    statements run on an in-memory database: they passed the guarded pre-run already)."""
    conn = apsw.Connection(":memory:")
    try:
        for st in statements:
            if st.kind == "table":
                for _row in conn.execute(st.sql):
                    pass
        names = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE "
            "'sqlite_%' ORDER BY rowid")]
        return {n: [str(r[1]) for r in conn.execute(f'PRAGMA table_info("{n}")')]
                for n in names}
    finally:
        conn.close()


def _dropped_text(st: Statement, error: str) -> str:
    what = {"table": "CREATE TABLE of", "index": "an index of", "insert": "an INSERT into"}
    return f"statement {st.index + 1} ({what[st.kind]} {st.table}) fails: {error}"


class SchemaStage(Stage[SchemaOut]):
    name = "schema"
    threshold = ACCEPT_BELOW
    keeps_best = True
    output_type = SchemaOut

    def __init__(self, scenario: ScenarioSpec, tasks: Sequence[str], persona: str) -> None:
        self.scenario = scenario
        self.tasks = list(tasks)
        self.persona = persona

    def inputs(self) -> Any:
        return {"scenario": msgspec.to_builtins(self.scenario), "tasks": self.tasks}

    def request(self) -> str:
        return (f"Scenario: {self.scenario.name}\n\n{self.scenario.description}\n\n"
                f"Tasks the database must support:\n{_tasks_text(self.tasks)}")

    def execute(self, output: SchemaOut) -> Measure:
        statements = schema_statements(output)
        if not statements:
            return Measure(1.0, ("the schema has no table",))
        kept, dropped = prerun(statements, self.persona)
        errors = [_dropped_text(d.statement, d.error) for d in dropped]
        columns = table_columns(kept)
        for table in output.tables:
            if table.name not in columns:
                if not any(d.statement.kind == "table" and d.statement.table == table.name
                           for d in dropped):
                    errors.append(f"table {table.name}: its DDL creates no table of that "
                                  f"name (it creates: {', '.join(columns) or 'none'})")
                continue
            errors.extend(_table_problems(table.name, columns[table.name]))
        return Measure(min(1.0, len(errors) / len(statements)), tuple(errors),
                       {"tables": len(columns), "columns": sum(map(len, columns.values())),
                        "statements": len(statements), "failed": len(dropped)})


def _table_problems(name: str, columns: Sequence[str]) -> list[str]:
    problems = []
    missing = [c for c in TIMESTAMPS if c not in columns]
    if missing:
        problems.append(f"table {name} has no {' or '.join(missing)} column")
    if _AUTH_TABLE.match(name):
        problems.append(f"table {name} is an authentication table; the user is logged in "
                        "and no schema stores credentials")
    secret = [c for c in columns if _AUTH_COLUMN.search(c)]
    if secret:
        problems.append(f"table {name} stores credentials ({', '.join(secret)}); no schema "
                        "does")
    return problems


# --- stage 4: sample data -------------------------------------------------------------


class InsertsOut(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    table: str
    statements: list[str]


class DataOut(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    inserts: list[InsertsOut]


def data_statements(schema: SchemaOut, data: DataOut) -> list[Statement]:
    found = schema_statements(schema)
    for t, block in enumerate(data.inserts):
        origin = Origin("data", t + 1)
        for sql in block.statements:
            found.append(Statement("insert", block.table, len(found), sql, origin))
    return found


class DataStage(Stage[DataOut]):
    name = "data"
    threshold = ACCEPT_BELOW
    keeps_best = True
    output_type = DataOut
    max_tokens = 8192

    def __init__(self, scenario: ScenarioSpec, tasks: Sequence[str], schema: SchemaOut,
                 persona: str) -> None:
        self.scenario = scenario
        self.tasks = list(tasks)
        self.schema = schema
        self.persona = persona

    def inputs(self) -> Any:
        return {"scenario": msgspec.to_builtins(self.scenario), "tasks": self.tasks,
                "schema": msgspec.to_builtins(self.schema)}

    def request(self) -> str:
        ddl = "\n".join(st.sql + ";" for st in schema_statements(self.schema))
        return (f"Scenario: {self.scenario.name}\n\nTasks:\n{_tasks_text(self.tasks)}\n\n"
                f"Schema:\n{ddl}")

    def execute(self, output: DataOut) -> Measure:
        statements = data_statements(self.schema, output)
        inserts = [st for st in statements if st.kind == "insert"]
        if not inserts:
            return Measure(1.0, ("no INSERT statement given",))
        errors = [f"statement {st.index + 1} (into {st.table}) is not an INSERT"
                  for st in inserts if not _INSERT.match(st.sql)]
        runnable = [st for st in statements if st.kind != "insert" or _INSERT.match(st.sql)]
        kept, dropped = prerun(runnable, self.persona)
        errors.extend(_dropped_text(d.statement, d.error) for d in dropped
                      if d.statement.kind == "insert")
        rows: dict[str, int] = {}
        for st in kept:
            if st.kind == "insert":
                rows[st.table] = rows.get(st.table, 0) + 1
        empty = [t.name for t in self.schema.tables if t.name not in rows]
        return Measure(min(1.0, len(errors) / len(inserts)), tuple(errors),
                       {"inserts": len(inserts), "failed": len(errors), "rows": rows,
                        "empty_tables": empty})


# --- day 0 ----------------------------------------------------------------------------


def scenario_files(spec: ScenarioSpec, tasks: Sequence[str], schema: SchemaOut,
                   data: DataOut) -> Scenario:
    """The synthesized scenario as the AWM importer reads one (its tables and INSERTs;
    the server code is pinned separately, in the project's own app contract)."""
    tables = tuple(Table(t.name, t.ddl, tuple(t.indexes), Origin("schema", i + 1))
                   for i, t in enumerate(schema.tables))
    inserts = tuple(TableInserts(b.table, tuple(b.statements), None, Origin("data", i + 1))
                    for i, b in enumerate(data.inserts))
    return Scenario(name=spec.name, description=spec.description, tasks=tuple(tasks),
                    tables=tables, inserts=inserts, code=None, code_verifiers={},
                    sql_verifiers={}, origins={"schema": Origin("schema", 1)})


def day0(spec: ScenarioSpec, tasks: Sequence[str], schema: SchemaOut, data: DataOut) -> Day0:
    """Day 0 without its app: AWM's pre-run and refusal (ScenarioRefused at 10 % of
    failing statements)."""
    return plan_day0(scenario_files(spec, tasks, schema, data))


__all__ = ["ACCEPT_BELOW", "TASKS_PER_SCENARIO", "DataOut", "DataStage", "InsertsOut",
           "ScenarioSpec", "SchemaOut", "SchemaStage", "TableOut", "TasksOut", "TasksStage",
           "data_statements", "day0", "scenario_files", "schema_statements", "table_columns",
           "task_problems", "valid_tasks"]
