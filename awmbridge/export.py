"""Scenarios written as AWM's JSON Lines files (AgentWorldModel-1K): the importer's inverse.

``export_files(scenarios)`` gives the bytes of each file ``awmbridge.formats`` reads, for
scenarios held as ``formats.Scenario`` (what environment synthesis builds its day 0 from,
``synth.environments.database.scenario_files``): ``gen_scenario.jsonl``,
``gen_tasks.jsonl``, ``gen_db.jsonl`` (``db_path`` under ``database_dir``, relative: AWM's
``env reset_db --database_dir`` makes it), ``gen_sample.jsonl`` (with AWM's counts),
``gen_envs.jsonl`` (the server code, ``full_code``), ``gen_verifier.jsonl`` (sql mode) and
``gen_verifier.pure_code.jsonl`` (code mode). A file no scenario has a line for is not
written. Pure and byte-stable: keys sorted, no timestamps, scenarios in the order given.

``awsdk_verifiers`` wraps a task's verifier scripts (the project's ``awsdk`` checks, run
on ``/w0`` and ``/w``) as AWM's two verifier modes:

* code mode, ``verify_task_completion(initial_db_path, final_db_path, final_answer)``:
  ``{"result": "complete"}`` when every check of every script holds, else ``"others"``,
  with the checks;
* sql mode, ``verify_task(initial_db_path, final_db_path)``: the checks as evidence for
  AWM's judge (no answer: AWM's sql mode grades the databases), the task's success and
  failure criteria in ``raw_response``.

Both carry the scripts and the SDK's own source (``gates/sdk/awsdk.py``) verbatim: the
function lays the two databases out as the worlds ``awsdk.worlds()`` reads (the service
``awm``), runs each script as ``__main__`` with its output captured, and reads its
``RESULT_JSON=`` line, so the checks are the ones the project's gates ran, not a rewrite.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from awmbridge.errors import ExportRefused
from awmbridge.formats import (
    CODE_VERIFIER_FILE,
    CODE_VERIFIER_FUNCTION,
    DB_FILE,
    ENVS_FILE,
    SAMPLE_FILE,
    SCENARIO_FILE,
    SQL_VERIFIER_FILE,
    SQL_VERIFIER_FUNCTION,
    TASKS_FILE,
    Origin,
    Scenario,
    Verifier,
    VerifierMode,
)
from awmbridge.world import AWM_SERVICE
from gates.verifier import SDK_DIR

__all__ = ["DATABASE_DIR", "EXPORT_FILES", "awsdk_verifiers", "db_path", "export_files",
           "normalized_name", "write_export"]

DATABASE_DIR = "databases"
EXPORT_FILES = (SCENARIO_FILE, TASKS_FILE, DB_FILE, SAMPLE_FILE, ENVS_FILE, SQL_VERIFIER_FILE,
                CODE_VERIFIER_FILE)
_SDK = SDK_DIR / "awsdk.py"


def normalized_name(scenario: str) -> str:
    """The name AWM's tools key a scenario's database and server by (lower case, runs of
    anything but [a-z0-9_] as one underscore)."""
    out = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_"
                  for c in scenario.lower())
    while "__" in out:
        out = out.replace("__", "_")
    return out.strip("_")


def db_path(scenario: str, database_dir: str = DATABASE_DIR) -> str:
    return f"{database_dir}/{normalized_name(scenario)}.db"


def _line(obj: Mapping[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False).encode("utf-8") + b"\n"


def _verifier_line(scenario: str, v: Verifier) -> bytes:
    raw_response = v.raw.get("verification", {}).get("raw_response", "")
    return _line({"scenario": scenario, "task_idx": v.task_idx, "task": v.task,
                  "verification": {"code": v.code, "raw_response": raw_response}})


def export_files(scenarios: Sequence[Scenario], database_dir: str = DATABASE_DIR
                 ) -> dict[str, bytes]:
    """The AWM files of `scenarios`, by file name (see the module docstring)."""
    lines: dict[str, list[bytes]] = {name: [] for name in EXPORT_FILES}
    seen: set[str] = set()
    for s in scenarios:
        key = normalized_name(s.name)
        if not key or key in seen:
            raise ExportRefused("no name, or the same name as another scenario once "
                                "normalized as AWM does", file=s.name, field="name")
        seen.add(key)
        lines[SCENARIO_FILE].append(_line({"name": s.name, "description": s.description or ""}))
        lines[TASKS_FILE].append(_line({"scenario": s.name, "tasks": list(s.tasks)}))
        lines[DB_FILE].append(_line({
            "scenario": s.name, "db_path": db_path(s.name, database_dir),
            "db_schema": {"tables": [{"name": t.name, "ddl": t.ddl, "indexes": list(t.indexes)}
                                     for t in s.tables]}}))
        lines[SAMPLE_FILE].append(_line({
            "scenario": s.name, "tables_count": len(s.inserts),
            "inserts_count": sum(len(t.statements) for t in s.inserts),
            "sample_data": {"tables": [
                {"table_name": t.table, "insert_statements": list(t.statements),
                 **({"reasoning": t.reasoning} if t.reasoning is not None else {})}
                for t in s.inserts]}}))
        if s.code is not None:
            lines[ENVS_FILE].append(_line({"scenario": s.name, "full_code": s.code,
                                           "db_path": db_path(s.name, database_dir)}))
        for file, verifiers in ((SQL_VERIFIER_FILE, s.sql_verifiers),
                                (CODE_VERIFIER_FILE, s.code_verifiers)):
            for idx in sorted(verifiers):
                lines[file].append(_verifier_line(s.name, verifiers[idx]))
    return {name: b"".join(found) for name, found in lines.items() if found}


def write_export(out: Path, files: Mapping[str, bytes]) -> list[Path]:
    """Write `files` into the directory `out` (made if missing); the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in files.items():
        path = out / name
        tmp = path.with_name(f".{name}.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
        written.append(path)
    return written


# --- verifiers ------------------------------------------------------------------------

_RUNNER = '''\
import contextlib
import io
import json
import os
import sys
import tempfile
import types

SERVICE = {service!r}
AWSDK_SOURCE = {sdk!r}
SCRIPTS = {scripts!r}


def _run_scripts(initial_db_path, final_db_path, final_answer):
    checks = {{}}
    evidence = {{}}
    names = ("AW_W0", "AW_W", "AW_ANSWER")
    saved_env = {{name: os.environ.get(name) for name in names}}
    saved_sdk = sys.modules.get("awsdk")
    with tempfile.TemporaryDirectory() as scratch:
        worlds = []
        for world, path in (("w0", initial_db_path), ("w", final_db_path)):
            services = os.path.join(scratch, world, "services")
            os.makedirs(services)
            os.symlink(os.path.abspath(path), os.path.join(services, SERVICE + ".sqlite"))
            worlds.append(os.path.join(scratch, world))
        answer = os.path.join(scratch, "answer.txt")
        with open(answer, "w", encoding="utf-8") as fh:
            fh.write(final_answer or "")
        os.environ.update(AW_W0=worlds[0], AW_W=worlds[1], AW_ANSWER=answer)
        try:
            for name, source in SCRIPTS:
                sdk = types.ModuleType("awsdk")
                exec(compile(AWSDK_SOURCE, "awsdk.py", "exec"), sdk.__dict__)
                sys.modules["awsdk"] = sdk
                out = io.StringIO()
                with contextlib.redirect_stdout(out):
                    try:
                        exec(compile(source, name, "exec"), {{"__name__": "__main__"}})
                    except SystemExit:
                        pass
                for conn in sdk._connections.values():
                    conn.close()
                found = [line for line in out.getvalue().splitlines()
                         if line.startswith("RESULT_JSON=")]
                if not found:
                    raise RuntimeError(name + ": no RESULT_JSON= line")
                verdict = json.loads(found[-1][len("RESULT_JSON="):])
                given = verdict.get("checks", {{}})
                if isinstance(given, list):
                    given = {{item["name"]: item["passed"] for item in given}}
                for check, passed in given.items():
                    if not isinstance(passed, bool):
                        raise RuntimeError(name + ": check " + check + " is not true or false")
                    checks[check] = passed
                evidence.update(verdict.get("evidence") or {{}})
        finally:
            for name, value in saved_env.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            if saved_sdk is None:
                sys.modules.pop("awsdk", None)
            else:
                sys.modules["awsdk"] = saved_sdk
    return checks, evidence


'''

_CODE_MODE = '''\
def verify_task_completion(initial_db_path, final_db_path, final_answer):
    checks, evidence = _run_scripts(initial_db_path, final_db_path, final_answer)
    done = bool(checks) and all(checks.values())
    return {"result": "complete" if done else "others", "checks": checks,
            "evidence": evidence}
'''

_SQL_MODE = '''\
def verify_task(initial_db_path, final_db_path):
    checks, evidence = _run_scripts(initial_db_path, final_db_path, "")
    return {"checks": checks, "evidence": evidence}
'''


def _runner(scripts: Sequence[tuple[str, str]]) -> str:
    if not scripts:
        raise ExportRefused("the task's verifier has no script", file="verifier",
                            field="scripts")
    return _RUNNER.format(service=AWM_SERVICE, sdk=_SDK.read_text(encoding="utf-8"),
                          scripts=[list(pair) for pair in scripts])


def awsdk_verifiers(task_idx: int, task: str, scripts: Sequence[tuple[str, str]],
                    success_criteria: str, failure_criteria: str
                    ) -> tuple[Verifier, Verifier]:
    """AWM's code-mode and sql-mode verifier for one task whose verifier is `scripts`
    ((file name, source) of each awsdk script, in the order the runner takes them)."""
    runner = _runner(scripts)
    made: list[Verifier] = []
    for mode, function, tail, raw_response in (
            ("code", CODE_VERIFIER_FUNCTION, _CODE_MODE, ""),
            ("sql", SQL_VERIFIER_FUNCTION, _SQL_MODE, json.dumps(
                {"function_name": SQL_VERIFIER_FUNCTION,
                 "success_criteria": success_criteria,
                 "failure_criteria": failure_criteria}, sort_keys=True))):
        code = runner + tail
        fields: dict[str, Any] = json.loads(raw_response) if raw_response else {}
        verifier_mode: VerifierMode = "code" if mode == "code" else "sql"
        made.append(Verifier(
            verifier_mode, task_idx, task, code, function, MappingProxyType(fields),
            MappingProxyType({"task_idx": task_idx, "task": task,
                              "verification": {"code": code, "raw_response": raw_response}}),
            Origin("verifier", task_idx + 1)))
    return made[0], made[1]
