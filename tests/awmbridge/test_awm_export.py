"""A synthesized environment in AWM's formats (``worldctl synth export-awm``): the recorded
synthesis run of examples/recorded/synth (library_loans, made from the scripted answers of
tests/support/synth_script.py) written as AWM-1K files.

* the files are byte-stable and read back by the project's own AWM reader with no problem,
  holding the run's tasks, tables, rows, server code and a verifier of both modes per
  accepted task;
* the server code (the synthesized app rendered as FastAPI + SQLAlchemy + Pydantic v2),
  imported with ``import-awm`` and served by the AWM adapter, answers every call as the
  synthesized app does in the project's own contract (the recorded world), and the task
  folders ``import-awm`` writes grade with the exported code-mode verifiers in the
  project's verifier sandbox: not passed at the start, passed after the calls;
* the export block of docs/peers/awm.md runs as written;
* code the render cannot carry is refused naming what;
* (slow, AWM's own package) AWM's ``env reset_db`` and ``env start`` load the files, its
  server answers the same calls with the same text as the AWM adapter, and AWM's
  verifier executor runs the exported verifiers: "others" at the start, "complete" once
  the tasks' reference solutions ran.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from awmbridge.errors import ExportRefused
from awmbridge.export_code import render_server
from awmbridge.formats import read_awm_dir
from awmbridge.importer import import_awm
from gates.contract import Verdict
from gates.rollout import grade, open_task_instance
from gates.task import load_task
from replay.engine import Worlds
from synth.environments.export import export_run
from tests.support import peer_venv, synth_script
from tests.support.awm_peer import awm_environment
from tests.support.cli_harness import invoke
from worldenv.core.contract import ToolResult
from worldenv.instances.instance import Environment

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "examples" / "recorded" / "synth"
TASKS = RUN / "pack" / "synth" / "tasks"
DRIVER = ROOT / "tests" / "support" / "awm_export_driver.py"
SCENARIO = "library_loans"
# The two tasks' reference solutions, with a refusal each: what both servers must agree on.
CALLS: list[dict[str, Any]] = [
    {"tool": "search_books", "arguments": {"query": "Dune"}},
    {"tool": "borrow_book", "arguments": {"book_id": 1, "due_date": "2026-02-20"}},
    {"tool": "borrow_book", "arguments": {"book_id": 2, "due_date": "2026-02-21"}},
    {"tool": "list_loans", "arguments": {}},
    {"tool": "return_book", "arguments": {"loan_id": 2}},
    {"tool": "return_book", "arguments": {"loan_id": 99}},
]
ANSWER = "You have borrowed Dune, due 2026-02-20. Neuromancer is returned."


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("awm-export")
    export_run(RUN, out, TASKS)
    return out


def _calls(worlds: Worlds) -> list[ToolResult]:
    with Environment(worlds, bare_names=True) as env, env.open(f"{SCENARIO}@0") as instance:
        assert sorted(t.name for t in instance.list_tools()) == [
            "borrow_book", "list_loans", "return_book", "search_books"]
        return [instance.call_tool(c["tool"], c["arguments"]) for c in CALLS]


@dataclass
class Adapter:
    results: list[ToolResult]
    verdicts: list[tuple[Verdict, Verdict]]  # per task: at the start, after the calls


@pytest.fixture(scope="module")
def adapter(exported: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Adapter]:
    """The calls on the exported files as ``worldctl import-awm --tasks-out`` stores them,
    and each task's exported code-mode verifier run by the project's verifier sandbox."""
    root = tmp_path_factory.mktemp("adapter")
    with Worlds.open(root / "store", root / "cache") as worlds:
        report = import_awm(worlds, exported, tasks_out=root / "tasks")
        assert [r.status for r in report.imported] == ["imported"] and not report.refused
        tasks = [load_task(root / "tasks" / f"{SCENARIO}-task-{i}") for i in (0, 1)]
        with Environment(worlds, bare_names=True) as env:
            with open_task_instance(env, tasks[0]) as instance:
                at_start = [grade(env, t, instance, "") for t in tasks]
            with open_task_instance(env, tasks[0]) as instance:
                assert sorted(t.name for t in instance.list_tools()) == [
                    "borrow_book", "list_loans", "return_book", "search_books"]
                results = [instance.call_tool(c["tool"], c["arguments"]) for c in CALLS]
                at_end = [grade(env, t, instance, ANSWER) for t in tasks]
        yield Adapter(results, list(zip(at_start, at_end, strict=True)))


@pytest.fixture(scope="module")
def adapter_results(adapter: Adapter) -> list[ToolResult]:
    return adapter.results


def test_the_files_are_byte_stable_and_read_back_whole(exported: Path, tmp_path: Path
                                                       ) -> None:
    made = invoke("synth", "export-awm", str(RUN), "--out", str(tmp_path / "again"))
    assert made.exit_code == 0, made.output
    assert "library_loans: 3 tables, 2 tasks (verifiers for tasks 1, 2)" in made.stdout
    names = ["gen_db.jsonl", "gen_envs.jsonl", "gen_sample.jsonl", "gen_scenario.jsonl",
             "gen_tasks.jsonl", "gen_verifier.jsonl", "gen_verifier.pure_code.jsonl"]
    assert sorted(p.name for p in exported.iterdir()) == names
    for name in names:
        assert (tmp_path / "again" / name).read_bytes() == (exported / name).read_bytes()

    files = read_awm_dir(exported)
    scenario = files.scenarios[SCENARIO]
    assert scenario.problems == ()
    assert scenario.description == synth_script.SCENARIO["description"]
    assert list(scenario.tasks) == synth_script.TASKS
    assert [(t.name, t.ddl, list(t.indexes)) for t in scenario.tables] == [
        (t["name"], t["ddl"], t.get("indexes", [])) for t in synth_script.TABLES_OK]
    assert [(t.table, list(t.statements)) for t in scenario.inserts] == [
        (d["table"], d["statements"]) for d in synth_script.DATA_OK]
    assert sorted(scenario.code_verifiers) == sorted(scenario.sql_verifiers) == [0, 1]
    sql = scenario.sql_verifiers[0]
    assert sql.function_name == "verify_task" and sql.success_criteria == (
        "The task's change is in the database.")
    db = json.loads((exported / "gen_db.jsonl").read_text())
    assert db["db_path"] == "databases/library_loans.db"
    assert scenario.code is not None
    for needle in ("from fastapi import FastAPI", "Base = declarative_base()",
                   "class Loans(Base):", "class BorrowBookRequest(BaseModel):",
                   "operation_id='borrow_book'", 'uvicorn.run(app, host=host, port=port)'):
        assert needle in scenario.code


def test_the_exported_verifiers_grade_in_the_projects_sandbox(adapter: Adapter) -> None:
    for at_start, at_end in adapter.verdicts:
        assert not at_start.is_error and not at_start.passed, at_start.errors
        assert at_end.passed, (at_end.errors, at_end.checks)


def test_the_adapter_serves_the_rendered_code_as_the_synthesized_app_answers(
        adapter_results: list[ToolResult], tmp_path: Path) -> None:
    with Worlds.open(tmp_path / "store", tmp_path / "cache") as worlds:
        with open(RUN / "worlds" / f"{SCENARIO}.jsonl", "rb") as world:
            worlds.import_stream(world, source="the recorded run")
        native = _calls(worlds)
    assert [r.is_error for r in native] == [False, False, True, False, False, True]
    for ours, theirs in zip(adapter_results, native, strict=True):
        assert ours.is_error == theirs.is_error
        if theirs.is_error:  # the ToolError's message, as AWM's fastapi-mcp words an HTTP 400
            assert ours.text.endswith(json.dumps({"detail": theirs.text},
                                                 separators=(",", ":")))
        else:
            assert json.loads(ours.text) == json.loads(theirs.text)


@pytest.mark.parametrize(("code", "field", "message"), [
    (synth_script.CODE_OK.replace("ctx.now, book_id", "ctx.db, book_id"),
     "tool borrow_book, line 31", "ctx.db (the raw database connection) has no counterpart"),
    (synth_script.CODE_OK.replace("from pydantic import Field",
                                  "from pydantic import Field\nfrom worldstore import x"),
     "line 4", "imports worldstore, which AWM's server cannot load"),
    (synth_script.CODE_OK + "\nNAME = app.name\n", "line 56", "uses its App object 'app'"),
    (synth_script.CODE_OK + "\nBase = 1\n", "names", "binds 'Base', which the rendered"),
    ("x = 1\n", "app", "no `app = App(...)`"),
])
def test_code_the_render_cannot_carry_is_refused_naming_where(code: str, field: str,
                                                              message: str) -> None:
    tables = [(t["name"], t["ddl"]) for t in synth_script.TABLES_OK]
    with pytest.raises(ExportRefused) as refused:
        render_server(SCENARIO, tables, code)
    assert refused.value.field == field
    assert message in str(refused.value)


def test_the_docs_export_block_runs(tmp_path: Path) -> None:
    """The export block of docs/peers/awm.md, as a user runs it from the checkout."""
    page = (ROOT / "docs" / "peers" / "awm.md").read_text(encoding="utf-8")
    section = page.split("## Synthesized environments in AWM's formats", 1)[1]
    block = re.findall(r"```sh\n(.*?)```", section, re.S)[0]
    assert "worldctl synth export-awm" in block
    env = {**os.environ, "TMPDIR": str(tmp_path),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for name in ("WORLDCTL_STORE", "WORLDCTL_CACHE"):
        env.pop(name, None)
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "library_loans: imported" in done.stdout
    (out,) = tmp_path.iterdir()
    assert sorted(p.name for p in (out / "tasks").iterdir()) == [
        "library_loans-task-0", "library_loans-task-1"]


def test_a_scenario_the_run_did_not_build_is_an_error_line(tmp_path: Path) -> None:
    made = invoke("synth", "export-awm", str(RUN), "--out", str(tmp_path),
                  "--scenario", "library_loans_two")
    assert made.exit_code == 2
    assert made.output.strip().splitlines()[-1] == (
        f"error: {RUN}: library_loans_two: not a built scenario of the run (built: "
        "library_loans)")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.peer("awm")
def test_awms_own_code_loads_serves_and_grades_the_export(
        exported: Path, adapter_results: list[ToolResult], tmp_path: Path) -> None:
    python = peer_venv.python("awm")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"calls": CALLS, "answer": ANSWER,
                                "tables": ["loans", "books"]}))
    done = subprocess.run([str(python), str(DRIVER), str(exported), str(tmp_path), SCENARIO,
                           str(plan)], capture_output=True, text=True, timeout=600,
                          env=awm_environment(), check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    awm = json.loads(done.stdout.strip().splitlines()[-1])
    assert awm["tools"] == ["mcp_tool_borrow_book", "mcp_tool_list_loans",
                            "mcp_tool_return_book", "mcp_tool_search_books"]
    # The same text, call by call: AWM's server (fastapi-mcp over HTTP) and the adapter.
    assert [(c["is_error"], c["text"]) for c in awm["calls"]] == [
        (r.is_error, [r.text]) for r in adapter_results]
    loans = [(r["id"], r["user_id"], r["book_id"], r["due_date"], r["returned"])
             for r in awm["rows"]["loans"]]
    assert loans == [(1, 2, 3, "2026-01-20", 1), (2, 1, 2, "2026-01-25", 1),
                     (3, 1, 1, "2026-02-20", 0)]
    assert awm["verifiers"] == {
        str(i): {"awm_check": "success", "at_start": "others", "at_end": "complete"}
        for i in (0, 1)}
