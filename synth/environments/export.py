"""A synthesis run's environments as AWM's files and code (``worldctl synth export-awm``).

``synthesized_scenario(run_dir, scenario, tasks_dir)`` reads what ``synth envs`` kept for
one built scenario: the accepted output of each stage in ``RUN/log/<scenario>.jsonl``
(tasks, schema, data, spec, code: the attempt marked kept, the last one when the stage ran
again), its description from the run's scenarios input, and the verifier of each task the
gates accepted from the pack's task folder (``tasks_dir/<task id>/verifier``, with its
success and failure criteria from ``rubric.md``). It gives the ``awmbridge.formats.Scenario``
the import path builds day 0 from (``database.scenario_files``), with the app rendered
as AWM's server code (``awmbridge.export_code.render_server``) and each accepted task's
checks as AWM's two verifier modes (``awmbridge.export.awsdk_verifiers``).

``export_run`` writes every built scenario of a run (or the ones named) with
``awmbridge.export.export_files``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import msgspec

from awmbridge.errors import ExportRefused
from awmbridge.export import DATABASE_DIR, awsdk_verifiers, export_files, write_export
from awmbridge.export_code import Operation, render_server
from awmbridge.formats import Scenario, Verifier
from gates.task import RUBRIC_FILE, VERIFIER_DIR
from synth.environments.appgen import CodeOut, SpecOut
from synth.environments.database import (
    TASKS_PER_SCENARIO,
    DataOut,
    ScenarioSpec,
    SchemaOut,
    TasksOut,
    scenario_files,
    valid_tasks,
)

__all__ = ["built_scenarios", "export_run", "render_from_outputs", "synthesized_scenario"]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        raise ExportRefused("missing: not a synthesis run, or the stage did not run",
                            file=str(path)) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ExportRefused(f"not JSON ({exc})", file=str(path)) from None


def built_scenarios(run_dir: Path) -> list[str]:
    """The scenarios of the run whose world was built (``RUN/envs/*.json``), by name."""
    found = []
    for path in sorted((run_dir / "envs").glob("*.json")):
        result = _read_json(path)
        if isinstance(result, dict) and result.get("world_hash"):
            found.append(str(result["scenario"]))
    return found


def _kept_outputs(log: Path, scenario: str) -> dict[str, Any]:
    """The kept attempt's output of each of the scenario's own stages (the last one)."""
    kept: dict[str, Any] = {}
    try:
        text = log.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ExportRefused("missing: the scenario has no stage log", file=str(log)) from None
    for number, raw in enumerate(text.splitlines(), start=1):
        try:
            line = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ExportRefused(f"line {number} is not JSON ({exc})", file=str(log)) from None
        if line.get("kept") and line.get("subject") == scenario:
            kept[str(line.get("stage"))] = line.get("output")
    return kept


def _stage(kept: dict[str, Any], stage: str, kind: type[Any], log: Path) -> Any:
    if stage not in kept:
        raise ExportRefused(f"no accepted {stage} stage: run `worldctl synth envs` to the end",
                            file=str(log), field=stage)
    try:
        return msgspec.convert(kept[stage], kind)
    except msgspec.ValidationError as exc:
        raise ExportRefused(f"the {stage} output is not the stage's format: {exc}",
                            file=str(log), field=stage) from None


def _description(run_dir: Path, scenario: str) -> str:
    for path in sorted((run_dir / "inputs").glob("scenarios-*.jsonl")):
        for raw in path.read_text(encoding="utf-8").splitlines():
            if not raw.strip():
                continue
            line = json.loads(raw)
            if isinstance(line, dict) and line.get("name") == scenario:
                return str(line.get("description") or "")
    return ""


def _tasks_per_scenario(run_dir: Path) -> int:
    run = _read_json(run_dir / "run.json")
    for command in reversed(run.get("commands", []) if isinstance(run, dict) else []):
        if command.get("kind") == "envs":
            return int(command.get("args", {}).get("tasks_per_scenario", TASKS_PER_SCENARIO))
    return TASKS_PER_SCENARIO


def render_from_outputs(scenario: str, description: str, schema: SchemaOut, spec: SpecOut,
                        code: str) -> str:
    """AWM's server code for a synthesized app (``render_server`` on the stages' outputs)."""
    operations = {op.operation_id: Operation(op.summary, op.description, tuple(op.tables))
                  for op in spec.tools}
    return render_server(scenario, [(t.name, t.ddl) for t in schema.tables], code,
                         operations, description)


def _criteria(rubric: str) -> tuple[str, str]:
    """Success and failure criteria from a rubric written by ``write_task_folder``."""
    success, _, failure = rubric.partition("# Failure")
    return (success.replace("# Success", "", 1).strip(), failure.strip())


def _verifiers(folder: Path, task_idx: int, task: str) -> tuple[Verifier, Verifier]:
    scripts = []
    for path in sorted((folder / VERIFIER_DIR).glob("*.py")):
        if path.name.startswith("_"):
            raise ExportRefused("a verifier helper module: AWM's verifier is one function "
                                "and cannot import it", file=str(path))
        scripts.append((path.name, path.read_text(encoding="utf-8")))
    if not scripts:
        raise ExportRefused("no verifier script", file=str(folder / VERIFIER_DIR))
    rubric = folder / RUBRIC_FILE
    success, failure = _criteria(rubric.read_text(encoding="utf-8")) if rubric.is_file() \
        else ("", "")
    return awsdk_verifiers(task_idx, task, scripts, success, failure)


def synthesized_scenario(run_dir: Path, scenario: str, tasks_dir: Path) -> Scenario:
    """One built scenario of the run (see the module docstring)."""
    result = _read_json(run_dir / "envs" / f"{scenario}.json")
    if not isinstance(result, dict) or not result.get("world_hash"):
        raise ExportRefused("the scenario's world was not built (see `worldctl synth status`)",
                            file=str(run_dir / "envs" / f"{scenario}.json"), field="world_hash")
    log = run_dir / "log" / f"{scenario}.jsonl"
    kept = _kept_outputs(log, scenario)
    description = _description(run_dir, scenario)
    tasks = valid_tasks(_stage(kept, "tasks", TasksOut, log), _tasks_per_scenario(run_dir))
    schema: SchemaOut = _stage(kept, "schema", SchemaOut, log)
    data: DataOut = _stage(kept, "data", DataOut, log)
    spec: SpecOut = _stage(kept, "spec", SpecOut, log)
    code: CodeOut = _stage(kept, "code", CodeOut, log)
    base = scenario_files(ScenarioSpec(scenario, description), tasks, schema, data)
    code_verifiers: dict[int, Verifier] = {}
    sql_verifiers: dict[int, Verifier] = {}
    for task in result.get("tasks", []):
        if not task.get("accepted"):
            continue
        task_id = str(task["task_id"])
        task_idx = int(task_id.rsplit("-", 1)[-1]) - 1
        if not 0 <= task_idx < len(tasks):
            raise ExportRefused(f"task {task_id} is past the scenario's {len(tasks)} tasks",
                                file=str(run_dir / "envs" / f"{scenario}.json"), field="tasks")
        code_verifiers[task_idx], sql_verifiers[task_idx] = _verifiers(
            tasks_dir / task_id, task_idx, tasks[task_idx])
    return dataclasses.replace(
        base, code=render_from_outputs(scenario, description, schema, spec, code.code),
        code_verifiers=MappingProxyType(dict(sorted(code_verifiers.items()))),
        sql_verifiers=MappingProxyType(dict(sorted(sql_verifiers.items()))))


def export_run(run_dir: Path, out: Path, tasks_dir: Path, scenarios: Sequence[str] = (),
               database_dir: str = DATABASE_DIR) -> dict[str, Any]:
    """Write the run's built scenarios (or the ones named) as AWM's files into `out`."""
    built = built_scenarios(run_dir)
    unknown = sorted(set(scenarios) - set(built))
    if unknown:
        raise ExportRefused("not a built scenario of the run (built: "
                            f"{', '.join(built) or 'none'})", file=str(run_dir),
                            field=", ".join(unknown))
    chosen = [s for s in built if not scenarios or s in scenarios]
    if not chosen:
        raise ExportRefused("the run has no built scenario to export", file=str(run_dir))
    exported = [synthesized_scenario(run_dir, name, tasks_dir) for name in chosen]
    files = export_files(exported, database_dir)
    written = write_export(out, files)
    return {"out": str(out), "files": [p.name for p in written],
            "scenarios": [{"scenario": s.name, "tasks": len(s.tasks), "tables": len(s.tables),
                           "verified_tasks": sorted(s.code_verifiers)} for s in exported]}
