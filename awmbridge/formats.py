"""Strict readers of AWM's JSON Lines files (AgentWorldModel-1K, ``awm gen ...``).

A directory holds any subset of:

=============================  ==========================================================
``gen_scenario.jsonl``         ``{"name", "description"}``: a scenario's seed
``gen_tasks.jsonl``            ``{"scenario", "tasks": [str]}``
``gen_db.jsonl``               ``{"scenario", "db_schema": {"tables": [{"name", "ddl",
                               "indexes": [str]}]}, "db_path"}``
``gen_sample.jsonl``           ``{"scenario", "tables_count", "inserts_count", "sample_data":
                               {"tables": [{"table_name", "reasoning",
                               "insert_statements": [str]}]}}``
``gen_envs.jsonl``             ``{"scenario", "db_path", "full_code"}``: the FastAPI server
``gen_verifier.jsonl``         sql mode: ``{"scenario", "task_idx", "task", "verification":
                               {"code", "raw_response"}}``, raw_response a JSON object with
                               the criteria
``gen_verifier.pure_code.jsonl``  code mode, the same fields (raw_response empty)
``gen_spec.jsonl``             the API spec: not read (the server code is the source of
                               truth, and nothing needs it at run time)
=============================  ==========================================================

Two kinds of bad input:

* a file that is not AWM's format where no scenario can be named (a line that is not
  JSON, not an object, or without its scenario's name): ``AwmFormatError``, the whole
  import is refused;
* anything else (a wrong key or type, a duplicate line, code that does not parse, a
  verifier without its function, a scenario named in one file but missing where it must
  be, such as a verifier for a scenario with no tasks or data for one with no database):
  a ``Problem`` of that scenario, which is then not imported; the others are.

A scenario that only ``gen_scenario.jsonl`` names (a seed AWM never built) is not a world
and not a problem: it is listed in ``AwmFiles.described_only``.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from awmbridge.errors import AwmFormatError
from replay.files import open_regular

SCENARIO_FILE = "gen_scenario.jsonl"
TASKS_FILE = "gen_tasks.jsonl"
DB_FILE = "gen_db.jsonl"
SAMPLE_FILE = "gen_sample.jsonl"
SPEC_FILE = "gen_spec.jsonl"
ENVS_FILE = "gen_envs.jsonl"
SQL_VERIFIER_FILE = "gen_verifier.jsonl"
CODE_VERIFIER_FILE = "gen_verifier.pure_code.jsonl"
READ_FILES = (DB_FILE, TASKS_FILE, SAMPLE_FILE, ENVS_FILE, SQL_VERIFIER_FILE,
              CODE_VERIFIER_FILE, SCENARIO_FILE)
AWM_FILES = (*READ_FILES, SPEC_FILE)

# The function each verifier mode defines (AWM's `awm gen verifier --mode code|sql`).
CODE_VERIFIER_FUNCTION = "verify_task_completion"
SQL_VERIFIER_FUNCTION = "verify_task"

VerifierMode = Literal["code", "sql"]


@dataclass(frozen=True, slots=True)
class Origin:
    """Where an item came from: the file's path and its 1-based line."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True, slots=True)
class Problem:
    """Why a scenario cannot be imported, naming the file, the line and the scenario."""

    scenario: str
    origin: Origin
    message: str

    def __str__(self) -> str:
        return f"{self.origin}: scenario {self.scenario}: {self.message}"


@dataclass(frozen=True, slots=True)
class Table:
    name: str
    ddl: str
    indexes: tuple[str, ...]
    origin: Origin  # the gen_db.jsonl line


@dataclass(frozen=True, slots=True)
class TableInserts:
    table: str
    statements: tuple[str, ...]
    reasoning: str | None
    origin: Origin  # the gen_sample.jsonl line


@dataclass(frozen=True, slots=True)
class Verifier:
    """One task's verifier. `fields` holds the mode's other fields (sql mode: the decoded
    raw_response, with success_criteria, failure_criteria, function_name, reasoning);
    `raw` is the whole line as AWM wrote it."""

    mode: VerifierMode
    task_idx: int
    task: str
    code: str
    function_name: str
    fields: Mapping[str, Any]
    raw: Mapping[str, Any]
    origin: Origin

    @property
    def success_criteria(self) -> str | None:
        value = self.fields.get("success_criteria")
        return value if isinstance(value, str) else None

    @property
    def failure_criteria(self) -> str | None:
        value = self.fields.get("failure_criteria")
        return value if isinstance(value, str) else None


@dataclass(frozen=True, slots=True)
class Scenario:
    """Everything the files hold for one scenario, in AWM's order. `problems` is empty for
    a scenario that can be imported. `origins` maps each file that names the scenario to
    its line there (verifier files: the first of its lines)."""

    name: str
    description: str | None
    tasks: tuple[str, ...]
    tables: tuple[Table, ...]
    inserts: tuple[TableInserts, ...]
    code: str | None
    code_verifiers: Mapping[int, Verifier]
    sql_verifiers: Mapping[int, Verifier]
    origins: Mapping[str, Origin]
    problems: tuple[Problem, ...] = ()

    def origin(self) -> Origin:
        """The line that best names this scenario in messages: its database, else the
        first file that names it."""
        found = self.origins.get(DB_FILE)
        return found if found is not None else next(iter(self.origins.values()))


@dataclass(frozen=True, slots=True)
class AwmFiles:
    """What a directory holds: scenarios by name (in the order of gen_db.jsonl, then of
    the other files), seeds only gen_scenario.jsonl names, and the files read."""

    directory: Path
    scenarios: Mapping[str, Scenario]
    described_only: Mapping[str, Origin]
    files: tuple[str, ...]


class _Bad(Exception):
    """A problem of the line being read (caught in this module, made a Problem)."""


# --- reading a directory -------------------------------------------------------------


def read_awm_dir(directory: Path) -> AwmFiles:
    """Read every AWM file of `directory`. Raises AwmFormatError for a file that is not
    AWM's format; any other problem is recorded on its scenario."""
    if not directory.is_dir():
        raise AwmFormatError("not a directory of AWM files", file=str(directory))
    present = [name for name in READ_FILES if (directory / name).is_file()]
    if not present and not (directory / SPEC_FILE).is_file():
        raise AwmFormatError(f"no AWM file here (expected any of {', '.join(AWM_FILES)})",
                             file=str(directory))
    collector = _Collector()
    for name in present:
        path = directory / name
        for line, obj in _json_objects(path, name_key="name" if name == SCENARIO_FILE
                                       else "scenario"):
            collector.add(name, Origin(str(path), line), obj)
    return AwmFiles(directory, MappingProxyType(collector.scenarios()),
                    MappingProxyType(collector.described_only()), tuple(present))


def _json_objects(path: Path, *, name_key: str) -> list[tuple[int, dict[str, Any]]]:
    """The objects of a JSON Lines file with their line numbers; refuses the file if a
    line is not JSON, not an object, or has no scenario name (`name_key`)."""
    found: list[tuple[int, dict[str, Any]]] = []
    with open(open_regular(path), "rb") as fh:  # never through a link, never a FIFO
        for number, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise AwmFormatError(f"not AWM's JSON Lines: the line is not JSON ({exc})",
                                     file=str(path), line=number) from None
            except RecursionError:
                raise AwmFormatError("not AWM's JSON Lines: JSON nested too deeply",
                                     file=str(path), line=number) from None
            if not isinstance(obj, dict):
                raise AwmFormatError(
                    f"not AWM's JSON Lines: the line is a JSON {type(obj).__name__}, not "
                    "an object", file=str(path), line=number)
            name = obj.get(name_key)
            if not isinstance(name, str) or not name.strip():
                raise AwmFormatError(
                    f"not AWM's format: no scenario name (a non-empty string '{name_key}'); "
                    f"the line has keys {sorted(obj)[:8]}", file=str(path), line=number)
            found.append((number, obj))
    return found


# --- one line of each file -----------------------------------------------------------


def _keys(obj: dict[str, Any], required: Collection[str], optional: Collection[str] = ()
          ) -> None:
    missing = sorted(set(required) - set(obj))
    if missing:
        raise _Bad(f"missing key {', '.join(map(repr, missing))}")
    unknown = sorted(set(obj) - set(required) - set(optional))
    if unknown:
        raise _Bad(f"unknown key {', '.join(map(repr, unknown))} (not AWM's format)")


def _typed(value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__
                                                                           for k in kind)
        raise _Bad(f"{what} must be a {_json_name(names)}, not {_json_type(value)}")
    return value


def _strings(value: Any, what: str) -> tuple[str, ...]:
    items = _typed(value, list, what)
    for i, item in enumerate(items):
        _typed(item, str, f"{what}[{i}]")
    return tuple(items)


def _json_name(python: str) -> str:
    return {"str": "string", "list": "list", "dict": "object", "int": "integer"}.get(
        python, python)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return _json_name(type(value).__name__)


def _parse_scenario(obj: dict[str, Any]) -> str | None:
    _keys(obj, {"name"}, {"description"})
    description = obj.get("description")
    return None if description is None else str(_typed(description, str, "'description'"))


def _parse_tasks(obj: dict[str, Any]) -> tuple[str, ...]:
    _keys(obj, {"scenario", "tasks"})
    return _strings(obj["tasks"], "'tasks'")


def _parse_db(obj: dict[str, Any], origin: Origin) -> tuple[Table, ...]:
    _keys(obj, {"scenario", "db_schema"}, {"db_path"})
    schema = _typed(obj["db_schema"], dict, "'db_schema'")
    _keys(schema, {"tables"})
    tables: list[Table] = []
    seen: set[str] = set()
    for i, item in enumerate(_typed(schema["tables"], list, "'db_schema.tables'")):
        where = f"db_schema.tables[{i}]"
        entry = _typed(item, dict, where)
        try:
            _keys(entry, {"name", "ddl"}, {"indexes"})
        except _Bad as exc:
            raise _Bad(f"{where}: {exc}") from None
        name = _typed(entry["name"], str, f"{where}.name")
        if name.lower() in seen:
            raise _Bad(f"{where}: table {name!r} is defined twice")
        seen.add(name.lower())
        ddl = _typed(entry["ddl"], str, f"{where}.ddl")
        indexes = _strings(entry.get("indexes", []), f"{where}.indexes")
        tables.append(Table(name, ddl, indexes, origin))
    return tuple(tables)


def _parse_sample(obj: dict[str, Any], origin: Origin) -> tuple[TableInserts, ...]:
    _keys(obj, {"scenario", "sample_data"}, {"tables_count", "inserts_count"})
    data = _typed(obj["sample_data"], dict, "'sample_data'")
    _keys(data, {"tables"})
    found: list[TableInserts] = []
    for i, item in enumerate(_typed(data["tables"], list, "'sample_data.tables'")):
        where = f"sample_data.tables[{i}]"
        entry = _typed(item, dict, where)
        try:
            _keys(entry, {"table_name", "insert_statements"}, {"reasoning"})
        except _Bad as exc:
            raise _Bad(f"{where}: {exc}") from None
        reasoning = entry.get("reasoning")
        found.append(TableInserts(
            _typed(entry["table_name"], str, f"{where}.table_name"),
            _strings(entry["insert_statements"], f"{where}.insert_statements"),
            None if reasoning is None else _typed(reasoning, str, f"{where}.reasoning"),
            origin))
    _check_counts(obj, found)
    return tuple(found)


def _check_counts(obj: dict[str, Any], found: list[TableInserts]) -> None:
    """AWM writes how many tables and INSERTs the line holds: a line that disagrees was
    cut or edited, and importing it would build another database than AWM's."""
    counts = {"tables_count": len(found),
              "inserts_count": sum(len(t.statements) for t in found)}
    for key, actual in counts.items():
        if key in obj and _typed(obj[key], int, repr(key)) != actual:
            raise _Bad(f"{key} says {obj[key]} but sample_data holds {actual}")


def _parse_envs(obj: dict[str, Any]) -> str:
    _keys(obj, {"scenario", "full_code"}, {"db_path"})
    code = _typed(obj["full_code"], str, "'full_code'")
    _parse_python(code, "the server code (full_code)")
    return str(code)


def _parse_python(code: str, what: str) -> ast.Module:
    try:
        return ast.parse(code)
    except SyntaxError as exc:
        raise _Bad(f"{what} does not parse: {exc.msg} (its line {exc.lineno})") from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise _Bad(f"{what} does not parse: {exc}") from None


def _parse_verifier(obj: dict[str, Any], mode: VerifierMode, origin: Origin) -> Verifier:
    _keys(obj, {"scenario", "task_idx", "task", "verification"})
    task_idx = _typed(obj["task_idx"], int, "'task_idx'")
    if task_idx < 0:
        raise _Bad(f"'task_idx' {task_idx} is negative")
    task = _typed(obj["task"], str, "'task'")
    verification = _typed(obj["verification"], dict, "'verification'")
    _keys(verification, {"code"}, {"raw_response"})
    code = _typed(verification["code"], str, "'verification.code'")
    raw_response = verification.get("raw_response", "")
    _typed(raw_response, str, "'verification.raw_response'")
    fields = _sql_fields(raw_response) if mode == "sql" else {}
    function = fields.get("function_name") or (
        SQL_VERIFIER_FUNCTION if mode == "sql" else CODE_VERIFIER_FUNCTION)
    _typed(function, str, "raw_response.function_name")
    _check_function(code, function, task_idx)
    return Verifier(mode, task_idx, task, code, function, MappingProxyType(fields),
                    MappingProxyType(obj), origin)


def _sql_fields(raw_response: str) -> dict[str, Any]:
    """sql mode keeps its criteria in raw_response, a JSON object (AWM's model answer)."""
    try:
        fields = json.loads(raw_response)
    except json.JSONDecodeError as exc:
        raise _Bad(f"verification.raw_response is not JSON ({exc}); sql mode keeps "
                   "success_criteria and failure_criteria there") from None
    if not isinstance(fields, dict):
        raise _Bad("verification.raw_response is not a JSON object")
    for key in ("success_criteria", "failure_criteria"):
        if key in fields:
            _typed(fields[key], str, f"raw_response.{key}")
    return fields


def _check_function(code: str, function: str, task_idx: int) -> None:
    tree = _parse_python(code, f"the verifier code of task {task_idx}")
    defined = {node.name for node in tree.body
               if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
    if function not in defined:
        raise _Bad(f"the verifier code of task {task_idx} defines no function {function}() "
                   f"(it defines {', '.join(sorted(defined)) or 'no function'})")


# --- collecting the lines of all files into scenarios --------------------------------


@dataclass
class _Parts:
    """What the files said about one scenario so far."""

    origins: dict[str, Origin] = field(default_factory=dict)
    description: str | None = None
    tasks: tuple[str, ...] | None = None
    tables: tuple[Table, ...] | None = None
    inserts: tuple[TableInserts, ...] | None = None
    code: str | None = None
    verifiers: dict[VerifierMode, dict[int, Verifier]] = field(
        default_factory=lambda: {"code": {}, "sql": {}})
    problems: list[Problem] = field(default_factory=list)


class _Collector:
    def __init__(self) -> None:
        self._parts: dict[str, _Parts] = {}
        self._handlers: dict[str, Callable[[_Parts, dict[str, Any], Origin], None]] = {
            SCENARIO_FILE: self._scenario, TASKS_FILE: self._tasks, DB_FILE: self._db,
            SAMPLE_FILE: self._sample, ENVS_FILE: self._envs,
            SQL_VERIFIER_FILE: self._sql_verifier, CODE_VERIFIER_FILE: self._code_verifier,
        }

    def add(self, file: str, origin: Origin, obj: dict[str, Any]) -> None:
        name = obj["name" if file == SCENARIO_FILE else "scenario"]
        parts = self._parts.setdefault(name, _Parts())
        try:
            self._handlers[file](parts, obj, origin)
        except _Bad as exc:
            parts.problems.append(Problem(name, origin, str(exc)))
        parts.origins.setdefault(file, origin)

    def _once(self, parts: _Parts, file: str, origin: Origin) -> None:
        first = parts.origins.get(file)
        if first is not None:
            raise _Bad(f"a second line for this scenario in {Path(first.file).name} (the "
                       f"first is line {first.line}); AWM writes one")

    def _scenario(self, parts: _Parts, obj: dict[str, Any], origin: Origin) -> None:
        self._once(parts, SCENARIO_FILE, origin)
        parts.description = _parse_scenario(obj)

    def _tasks(self, parts: _Parts, obj: dict[str, Any], origin: Origin) -> None:
        self._once(parts, TASKS_FILE, origin)
        parts.tasks = _parse_tasks(obj)

    def _db(self, parts: _Parts, obj: dict[str, Any], origin: Origin) -> None:
        self._once(parts, DB_FILE, origin)
        parts.tables = _parse_db(obj, origin)

    def _sample(self, parts: _Parts, obj: dict[str, Any], origin: Origin) -> None:
        self._once(parts, SAMPLE_FILE, origin)
        parts.inserts = _parse_sample(obj, origin)

    def _envs(self, parts: _Parts, obj: dict[str, Any], origin: Origin) -> None:
        self._once(parts, ENVS_FILE, origin)
        parts.code = _parse_envs(obj)

    def _sql_verifier(self, parts: _Parts, obj: dict[str, Any], origin: Origin) -> None:
        self._verifier(parts, _parse_verifier(obj, "sql", origin))

    def _code_verifier(self, parts: _Parts, obj: dict[str, Any], origin: Origin) -> None:
        self._verifier(parts, _parse_verifier(obj, "code", origin))

    def _verifier(self, parts: _Parts, verifier: Verifier) -> None:
        known = parts.verifiers[verifier.mode]
        first = known.get(verifier.task_idx)
        if first is not None:
            raise _Bad(f"a second {verifier.mode}-mode verifier for task_idx "
                       f"{verifier.task_idx} (the first is line {first.origin.line})")
        known[verifier.task_idx] = verifier

    def described_only(self) -> dict[str, Origin]:
        return {name: parts.origins[SCENARIO_FILE] for name, parts in self._parts.items()
                if set(parts.origins) == {SCENARIO_FILE} and not parts.problems}

    def scenarios(self) -> dict[str, Scenario]:
        found: dict[str, Scenario] = {}
        for name, parts in sorted(self._parts.items(), key=_file_order):
            if set(parts.origins) == {SCENARIO_FILE} and not parts.problems:
                continue
            problems = [*parts.problems, *_missing_parts(name, parts)]
            found[name] = Scenario(
                name=name, description=parts.description, tasks=parts.tasks or (),
                tables=parts.tables or (), inserts=parts.inserts or (), code=parts.code,
                code_verifiers=MappingProxyType(dict(sorted(parts.verifiers["code"].items()))),
                sql_verifiers=MappingProxyType(dict(sorted(parts.verifiers["sql"].items()))),
                origins=MappingProxyType(dict(parts.origins)), problems=tuple(problems))
        return found


def _file_order(item: tuple[str, _Parts]) -> tuple[int, int]:
    """Scenarios in the order of gen_db.jsonl, then of the other files (as read)."""
    origins = item[1].origins
    for rank, file in enumerate(READ_FILES):
        if file in origins:
            return rank, origins[file].line
    return len(READ_FILES), 0


def _missing_parts(name: str, parts: _Parts) -> list[Problem]:
    """A scenario named in one file and missing from the one it depends on: a database
    for data, server code and tasks; tasks for verifiers (whose task they must match)."""
    problems: list[Problem] = []
    if parts.tables is None and DB_FILE not in parts.origins:
        for file in (SAMPLE_FILE, ENVS_FILE, TASKS_FILE, SQL_VERIFIER_FILE,
                     CODE_VERIFIER_FILE):
            if file in parts.origins:
                problems.append(Problem(name, parts.origins[file],
                                        f"{_what(file)} for a scenario with no database: "
                                        f"{DB_FILE} has no line for it"))
    for verifier in [*parts.verifiers["code"].values(), *parts.verifiers["sql"].values()]:
        problem = _verifier_task_problem(verifier, parts)
        if problem is not None:
            problems.append(Problem(name, verifier.origin, problem))
    return problems


def _what(file: str) -> str:
    return {SAMPLE_FILE: "sample data", ENVS_FILE: "server code", TASKS_FILE: "tasks",
            SQL_VERIFIER_FILE: "a verifier", CODE_VERIFIER_FILE: "a verifier"}[file]


def _verifier_task_problem(verifier: Verifier, parts: _Parts) -> str | None:
    if parts.tasks is None:
        if TASKS_FILE in parts.origins:
            return None  # the tasks line itself is bad: that problem is already recorded
        return (f"a verifier for task_idx {verifier.task_idx} of a scenario with no tasks: "
                f"{TASKS_FILE} has no line for it")
    if verifier.task_idx >= len(parts.tasks):
        return (f"task_idx {verifier.task_idx} is past the scenario's {len(parts.tasks)} "
                f"tasks in {TASKS_FILE}")
    if verifier.task != parts.tasks[verifier.task_idx]:
        return (f"the verifier's task text differs from task {verifier.task_idx} of "
                f"{TASKS_FILE} (line {parts.origins[TASKS_FILE].line}): it would grade "
                "another task")
    return None


def unverified_tasks(scenario: Scenario) -> list[int]:
    """The tasks of a scenario with neither a code-mode nor a sql-mode verifier."""
    return [i for i in range(len(scenario.tasks))
            if i not in scenario.code_verifiers and i not in scenario.sql_verifiers]
