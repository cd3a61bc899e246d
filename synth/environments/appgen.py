"""Stage 5 of environment synthesis: the API spec, then the app code (methods.md
section 2).

* **spec**: every operation with its operation id, summary (<= 80 characters),
  description (<= 200), typed parameters with examples, response schema and the tables
  and fields it uses, checked against the accepted schema. Accepted only with 0 errors.
* **code**: the tools in the project's own app contract (``worldenv.core.app``: documented for the
  model in the prompt), carried in the world's log as the app of service ``awm``. The code
  is untrusted: it is only parsed here (``ast``) and run in the sandboxed app worker, on
  a scratch store holding day 0 with the code pinned. Accepted only with 0 errors: it
  loads in a worker, every operation of the spec is listed as a tool with its schema, and
  a smoke call of every tool with the spec's examples, each on a fresh instance, returns
  a result. An error result that is a refusal (a ToolError naming a missing row) is fine;
  an exception, a timeout or arguments the tool's own schema refuses are not.
"""

from __future__ import annotations

import ast
import io
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec

from awmbridge.world import AWM_DAY0_TS, AWM_SERVICE
from replay.engine import Worlds
from synth.stage import Measure, Stage
from worldenv.core.contract import ToolResult
from worldenv.errors import AppPinError
from worldenv.instances.instance import Environment
from worldenv.sandbox.workers import WorkerLimits, WorkerPool
from worldstore.errors import WorldError

APP_VERSION = "1.0.0"
SUMMARY_CHARS = 80
DESCRIPTION_CHARS = 200
ParamType = Literal["string", "integer", "number", "boolean", "array", "object"]
_PY_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list,), "object": (dict,)}
_OPERATION_ID = re.compile(r"[a-z][a-z0-9_]{0,63}\Z")
_PARAM = re.compile(r"[a-z_][a-z0-9_]{0,63}\Z")
_FORBIDDEN_PARAMS = frozenset({"user_id", "password", "token", "session", "api_key"})
# Bounds of the sandboxed worker that loads and smoke-calls generated code: tighter than
# serving's, since a generated app that needs more is one to regenerate.
# One spare is kept started, so the next code to check loads without waiting for Python.
SMOKE_LIMITS = WorkerLimits(timeout_s=5.0, start_timeout_s=30.0, cpu_s=120, memory_mib=1024,
                            max_file_mib=64, max_workers=1, spares=1)
_EXCEPTION = "Error calling tool"  # the wording of a call that raised (worldenv.core.dispatch)
_REFUSED_ARGUMENTS = "validation error"  # pydantic's wording for arguments refused


# --- the spec -------------------------------------------------------------------------


class ParamSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    type: ParamType
    description: str = ""
    required: bool = True
    example: Any = None


class OperationSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    operation_id: str
    summary: str
    description: str
    parameters: list[ParamSpec] = []
    response: dict[str, Any] = {}
    tables: list[str] = []
    fields: list[str] = []
    writes: bool = False


class SpecOut(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    tools: list[OperationSpec]


def operation_problems(op: OperationSpec, columns: dict[str, list[str]]) -> list[str]:
    """What is wrong with one operation of the spec, against the schema's columns."""
    where = f"operation {op.operation_id}"
    found = []
    if not _OPERATION_ID.match(op.operation_id):
        found.append(f"{where}: operation_id must be snake_case (a-z, 0-9, _), at most 64")
    if not op.summary.strip() or len(op.summary) > SUMMARY_CHARS:
        found.append(f"{where}: summary has {len(op.summary)} characters; 1 to "
                     f"{SUMMARY_CHARS}")
    if not op.description.strip() or len(op.description) > DESCRIPTION_CHARS:
        found.append(f"{where}: description has {len(op.description)} characters; 1 to "
                     f"{DESCRIPTION_CHARS}")
    names = [p.name for p in op.parameters]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        found.append(f"{where}: parameter {dup} is given twice")
    for param in op.parameters:
        found.extend(_param_problems(where, param))
    for table in op.tables:
        if table not in columns:
            found.append(f"{where}: table {table} is not in the schema")
    for ref in op.fields:
        table, _, column = ref.partition(".")
        if table not in columns or column not in columns[table]:
            found.append(f"{where}: field {ref} is not a column of the schema (write "
                         "fields as table.column)")
    return found


def _param_problems(where: str, param: ParamSpec) -> list[str]:
    found = []
    if not _PARAM.match(param.name):
        found.append(f"{where}: parameter name {param.name!r} is not snake_case")
    if param.name in _FORBIDDEN_PARAMS:
        found.append(f"{where}: parameter {param.name}: the user is logged in; no tool "
                     "takes the current user's id or credentials")
    if param.example is None:
        if param.required:
            found.append(f"{where}: required parameter {param.name} has no example (the "
                         "smoke call needs one)")
    elif not _is_type(param.example, param.type):
        found.append(f"{where}: parameter {param.name}: example {param.example!r} is not "
                     f"a{'n' if param.type[0] in 'aeio' else ''} {param.type}")
    return found


def _is_type(value: Any, kind: str) -> bool:
    if isinstance(value, bool):
        return kind == "boolean"
    return isinstance(value, _PY_TYPES[kind])


class SpecStage(Stage[SpecOut]):
    name = "spec"
    threshold = 0.0
    output_type = SpecOut
    max_tokens = 8192

    def __init__(self, scenario: str, tasks: Sequence[str], ddl: Sequence[str],
                 columns: dict[str, list[str]]) -> None:
        self.scenario = scenario
        self.tasks = list(tasks)
        self.ddl = list(ddl)
        self.columns = columns

    def inputs(self) -> Any:
        return {"scenario": self.scenario, "tasks": self.tasks, "ddl": self.ddl}

    def request(self) -> str:
        tasks = "\n".join(f"{i}. {t}" for i, t in enumerate(self.tasks, 1))
        ddl = "\n".join(s + ";" for s in self.ddl)
        return f"Scenario: {self.scenario}\n\nTasks:\n{tasks}\n\nSchema:\n{ddl}"

    def execute(self, output: SpecOut) -> Measure:
        if not output.tools:
            return Measure(1.0, ("the spec has no operation",))
        errors: list[str] = []
        bad = 0
        ids = [op.operation_id for op in output.tools]
        for dup in sorted({i for i in ids if ids.count(i) > 1}):
            errors.append(f"operation_id {dup} is given twice")
        for op in output.tools:
            problems = operation_problems(op, self.columns)
            bad += bool(problems) or ids.count(op.operation_id) > 1
            errors.extend(problems)
        return Measure(bad / len(output.tools), tuple(errors),
                       {"tools": len(output.tools),
                        "writing": sum(op.writes for op in output.tools)})


# --- the code -------------------------------------------------------------------------


class CodeOut(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    code: str


def app_line(persona: str, app: str, code: str) -> bytes:
    """The interchange line that pins `code` as the app of the world's service."""
    return msgspec.json.encode({"persona": persona, "day": 0, "ts": AWM_DAY0_TS,
                                "type": "app", "service": AWM_SERVICE, "app": app,
                                "version": APP_VERSION, "code": code}) + b"\n"


def app_name(persona: str) -> str:
    return f"synth-{persona.replace('_', '-')}"


def smoke_arguments(op: OperationSpec) -> dict[str, Any]:
    return {p.name: p.example for p in op.parameters if p.example is not None}


def smoke_problem(op: str, result: ToolResult) -> str | None:
    """Why a smoke call's result is not acceptable, or None (a result, or a refusal)."""
    if not result.is_error:
        return None
    if result.text.startswith(_EXCEPTION):
        return f"tool {op}: the smoke call raised: {result.text}"
    if _REFUSED_ARGUMENTS in result.text:
        return (f"tool {op}: the spec's example arguments are refused by the tool's own "
                f"schema: {result.text}")
    return None


class CodeStage(Stage[CodeOut]):
    name = "code"
    threshold = 0.0
    output_type = CodeOut
    max_tokens = 16384

    def __init__(self, scenario: str, persona: str, spec: SpecOut, ddl: Sequence[str],
                 day_lines: bytes, *, workers: WorkerPool | None = None,
                 cache: Path | None = None) -> None:
        """`workers` and `cache` (not part of the key): a worker pool and a snapshot cache
        shared with the store the world will go to, so the accepted code's worker, started
        for its smoke calls, serves the world's instances afterwards."""
        self.scenario = scenario
        self.persona = persona
        self.spec = spec
        self.ddl = list(ddl)
        self.day_lines = day_lines  # day 0 without its app (interchange lines)
        self.workers = workers
        self.cache = cache

    @property
    def app(self) -> str:
        return app_name(self.persona)

    def inputs(self) -> Any:
        return {"scenario": self.scenario, "app": self.app, "ddl": self.ddl,
                "spec": msgspec.to_builtins(self.spec),
                "day0": msgspec.json.decode(b"[" + b",".join(
                    self.day_lines.splitlines()) + b"]")}

    def request(self) -> str:
        ddl = "\n".join(s + ";" for s in self.ddl)
        spec = msgspec.json.format(msgspec.json.encode(self.spec), indent=1).decode()
        return (f"Scenario: {self.scenario}\nThe app name: {self.app}\n\nSchema:\n{ddl}\n\n"
                f"API specification:\n{spec}")

    def parse(self, text: str) -> CodeOut:
        """The JSON ``{"code": ...}`` asked for, or the one fenced python block of a model
        that answered with the module itself."""
        fenced = re.search(r"```(?:python)?\n(.*?)```", text, re.DOTALL)
        if fenced is not None and not text.lstrip().startswith("{"):
            return CodeOut(fenced.group(1))
        return super().parse(text)

    def execute(self, output: CodeOut) -> Measure:
        try:
            ast.parse(output.code)
        except SyntaxError as exc:
            return Measure(1.0, (f"the code does not parse: line {exc.lineno}: {exc.msg}",))
        with tempfile.TemporaryDirectory(prefix="synth-app-") as scratch:
            measure = smoke_app(Path(scratch), self.persona, self.app, self.day_lines,
                                output.code, self.spec, workers=self.workers,
                                cache=self.cache)
        if measure.errors and self.workers is not None:
            self.workers.release(AWM_SERVICE, output.code)  # never served: stop it now
        return measure


def smoke_app(scratch: Path, persona: str, app: str, day_lines: bytes, code: str,
              spec: SpecOut, *, workers: WorkerPool | None = None,
              cache: Path | None = None) -> Measure:
    """Load `code` in a sandboxed worker on a scratch store holding day 0, check that the
    spec's operations are its tools, and smoke-call each on a fresh instance. `workers`
    and `cache`: see ``CodeStage``."""
    worlds = Worlds.open(scratch / "store", cache if cache is not None else scratch / "cache")
    try:
        try:
            worlds.import_stream(io.BytesIO(day_lines + app_line(persona, app, code)),
                                 source="<synthesized day 0>")
        except WorldError as exc:
            return Measure(1.0, (_scrub(f"day 0 with the app does not import: {exc}",
                                        scratch, cache),))
        with Environment(worlds, bare_names=True, worker_limits=SMOKE_LIMITS,
                         workers=workers) as env:
            measure = _smoke(env, f"{persona}@0", spec, scratch)
        return Measure(measure.error_rate,
                       tuple(_scrub(e, scratch, cache) for e in measure.errors),
                       measure.facts)
    finally:
        worlds.close()


def _smoke(env: Environment, ref: str, spec: SpecOut, scratch: Path) -> Measure:
    try:
        with env.open(ref) as instance:
            listed = {t.name: t for t in instance.list_tools()}
    except AppPinError as exc:
        return Measure(1.0, (_scrub(f"the app does not load: {exc}", scratch),))
    errors: list[str] = []
    failed = 0
    for op in spec.tools:
        tool = listed.get(op.operation_id)
        if tool is None:
            errors.append(f"operation {op.operation_id} is in the spec but the app has no "
                          f"tool of that name (its tools: {', '.join(sorted(listed))})")
            failed += 1
            continue
        with env.open(ref) as instance:
            result = instance.call_tool(op.operation_id, smoke_arguments(op))
        problem = smoke_problem(op.operation_id, result)
        if problem is not None:
            errors.append(_scrub(problem, scratch))
            failed += 1
    return Measure(failed / len(spec.tools) if spec.tools else 1.0, tuple(errors),
                   {"tools": len(listed), "smoked": len(spec.tools) - failed})


def _scrub(text: str, scratch: Path, cache: Path | None = None) -> str:
    """Error texts go into the next request: no scratch or cache path in them (a replay's
    folders have other names)."""
    text = text.replace(str(scratch), "<scratch>")
    return text if cache is None else text.replace(str(cache), "<cache>")


__all__ = ["APP_VERSION", "SMOKE_LIMITS", "CodeOut", "CodeStage", "OperationSpec",
           "ParamSpec", "SpecOut", "SpecStage", "app_line", "app_name", "operation_problems",
           "smoke_app", "smoke_arguments", "smoke_problem"]
