"""AWM tasks as task folders: written by the importer from the real AWM-1K samples, loaded
by gates.task, their code-mode verifiers run in the verifier sandbox with the final
answer, their sql-mode evidence judged by the code-augmented judge through litellm's real
path (a loopback server with scripted answers), and the broken e_commerce_33 verifier
rejected at the solvability gate with a correct reference solution.

e_commerce_33 has no server code in the samples, so its tasks are worked here through a
small SQL app (`awm_sql_query`, `awm_sql_execute`) serving the world's `awm` database;
that is how the reference solution's steps act on the database (tool calls, the only
interface besides the shell, which cannot reach a service's database).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import msgspec
import pytest
from click.testing import CliRunner
from pydantic import Field

from awmbridge.errors import AwmError
from awmbridge.formats import read_awm_dir
from awmbridge.importer import import_awm
from awmbridge.tasks import (
    CODE_HELPER,
    CODE_SCRIPT,
    README_FILE,
    SQL_HELPER,
    SQL_SCRIPT,
    add_solution,
    task_id_for,
    unverified_tasks,
    write_tasks,
)
from gates.agents import ScriptedAgent, scripted
from gates.contract import Rollout, Solution, Step
from gates.errors import TaskError
from gates.judges import CodeJudge
from gates.quality import GateRun, check_task, render_report
from gates.rewards import awm_outcome_reward
from gates.rollout import run_rollout, scripted_rollouts, task_w0
from gates.task import Task, load_task
from gates.verifier import run_verifier
from replay import Worlds
from tests.support.llm_server import serving
from worldctl.main import cli
from worldenv.core.app import App, ToolContext, ToolError
from worldenv.instances.instance import Environment
from worldllm.client import LLMClient

HERE = Path(__file__).resolve().parents[1]
SAMPLES = HERE / "fixtures" / "awm-1k-samples"  # AWM-1K's own files
FIXTURES = HERE / "fixtures" / "awm_tasks"
SCENARIO = "e_commerce_33"
SERVICE = "awm"



# --- a SQL app over the scenario's database (e_commerce_33 ships no server code) ----------


def sql_app() -> App:
    app = App(service=SERVICE, name="awm-sql", version="1")

    @app.tool(writes=False)
    def sql_query(ctx: ToolContext,
                  sql: Annotated[str, Field(description="One SELECT statement")]
                  ) -> list[dict[str, Any]]:
        """Run one read-only SELECT on the scenario's database; returns its rows."""
        if not sql.lstrip().upper().startswith(("SELECT", "WITH")):
            raise ToolError("only SELECT statements are allowed here")
        return ctx.rows(sql)

    @app.tool(writes=True)
    def sql_execute(ctx: ToolContext,
                    sql: Annotated[str, Field(description="One INSERT, UPDATE or DELETE")]
                    ) -> int:
        """Run one write on the scenario's database; returns the number of rows changed."""
        return ctx.execute(sql)

    return app


# --- the store, the imported scenarios and their task folders -----------------------------


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("awm-tasks") / "store"


@pytest.fixture(scope="module")
def worlds(store: Path) -> Iterator[Worlds]:
    with Worlds.open(store) as opened:
        yield opened


@pytest.fixture(scope="module")
def imported(worlds: Worlds, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both sample scenarios imported, with their task folders."""
    tasks_out = tmp_path_factory.mktemp("awm-task-folders")
    report = import_awm(worlds, SAMPLES, tasks_out=tasks_out)
    return {"report": report, "tasks_out": tasks_out,
            "scenarios": {s.scenario: s for s in report.imported}}


@pytest.fixture(scope="module")
def env(worlds: Worlds) -> Iterator[Environment]:
    with Environment(worlds, apps={SERVICE: sql_app()}) as environment:
        yield environment


def task_dir(imported: dict[str, Any], index: int) -> Path:
    return Path(imported["tasks_out"]) / task_id_for(SCENARIO, index)


def copy_task(imported: dict[str, Any], index: int, dest: Path) -> Path:
    target = dest / task_id_for(SCENARIO, index)
    shutil.copytree(task_dir(imported, index), target)
    return target


def agent(name: str, steps: list[dict[str, Any]]) -> ScriptedAgent:
    decoded = msgspec.convert(steps, list[Step])
    return ScriptedAgent(name, lambda _task: decoded)


# --- the folders -------------------------------------------------------------------------------


def test_the_importer_writes_a_loadable_folder_per_verified_task(imported: dict[str, Any]
                                                                 ) -> None:
    scenario = read_awm_dir(SAMPLES).scenarios[SCENARIO]
    report = imported["scenarios"][SCENARIO]
    assert [p.name for p in report.tasks] == [f"{SCENARIO}-task-{i}" for i in (0, 1, 2)]
    assert unverified_tasks(scenario) == list(range(3, 10))
    # content_platform_1 has no verifier in the samples: nothing could grade its tasks.
    assert imported["scenarios"]["content_platform_1"].tasks == ()

    for index, folder in enumerate(report.tasks):
        task = load_task(folder)
        spec = task.spec
        assert spec.task_id == f"{SCENARIO}-task-{index}"
        assert spec.instruction == scenario.tasks[index]
        assert (spec.world, spec.world_hash) == (f"{report.persona}@0", report.world_hash)
        assert spec.interfaces == ["mcp"] and spec.difficulty == "unlabeled"
        assert [s.interface for s in spec.subtasks] == ["mcp"]
        assert spec.absent == ["solution", "hint", "rubric"]
        assert "gen_tasks.jsonl:1" in spec.source and "gen_verifier.pure_code.jsonl" \
            in spec.source
        assert task.solution.steps == [] and task.hint == "" and task.rubric == ""
        assert task.instruction(hinted=True) == spec.instruction  # no hint to add
        readme = (folder / README_FILE).read_text()
        assert "no reference solution, hint or rubric" in readme and "not_run" in readme
        # AWM's code is carried verbatim, byte for byte, in a helper the script calls.
        helper = (folder / "verifier" / CODE_HELPER).read_text(encoding="utf-8")
        assert helper == scenario.code_verifiers[index].code
        expected = (CODE_SCRIPT, SQL_SCRIPT) if index == 0 else (CODE_SCRIPT,)
        assert task.scripts == expected
    sql = (report.tasks[0] / "verifier" / SQL_HELPER).read_text(encoding="utf-8")
    assert sql == scenario.sql_verifiers[0].code
    script = (report.tasks[0] / "verifier" / SQL_SCRIPT).read_text(encoding="utf-8")
    assert scenario.sql_verifiers[0].success_criteria in script


def test_task_ids_and_refusals(imported: dict[str, Any], tmp_path: Path) -> None:
    assert task_id_for("e_commerce_33", 4) == "e_commerce_33-task-4"
    assert task_id_for("Content Platform #1", 0) == "content-platform-1-task-0"
    with pytest.raises(AwmError, match="gives no task id"):
        task_id_for("!!!", 0)
    scenario = read_awm_dir(SAMPLES).scenarios[SCENARIO]
    report = imported["scenarios"][SCENARIO]
    # Writing again replaces the folders of the same tasks; anything else is refused.
    again = write_tasks(scenario, persona=report.persona, world_hash=report.world_hash,
                        out=tmp_path)
    first = (again[0] / "task.json").read_bytes()
    assert write_tasks(scenario, persona=report.persona, world_hash=report.world_hash,
                       out=tmp_path) == again
    assert (again[0] / "task.json").read_bytes() == first
    shutil.rmtree(again[1])
    again[1].mkdir()
    (again[1] / "notes.txt").write_text("mine")
    with pytest.raises(AwmError, match="not a task folder"):
        write_tasks(scenario, persona=report.persona, world_hash=report.world_hash,
                    out=tmp_path)
    assert (again[1] / "notes.txt").read_text() == "mine"
    # A file the spec declares absent is a contradiction the loader names.
    (again[0] / "hint.md").write_text("a hint")
    with pytest.raises(TaskError, match="declares the hint absent"):
        load_task(again[0])


# --- code mode: the checklist, with the final answer -----------------------------------


def verdict_on(worlds: Worlds, task: Task, sql: str | None, answer: str) -> tuple[bool, str]:
    """V of the task's verifier on W0 and W = W0 with `sql` applied to the awm database."""
    w0 = task_w0(worlds, task)
    with worlds.mount(task.spec.world_hash) as mount:
        if sql is not None:
            import sqlite3

            conn = sqlite3.connect(mount.db_path(SERVICE))
            conn.execute(sql)
            conn.commit()
            conn.close()
        mount.hash()
        verdict = run_verifier(task.verifier_dir, w0, mount.path, answer)
    assert not verdict.errors, verdict.errors
    result = next(s for s in verdict.scripts if s.script == CODE_SCRIPT).evidence["result"]
    return verdict.passed, result


REORDER = "INSERT INTO cart_items (cart_id, product_offer_id, quantity) VALUES (1, 8, 1)"


def test_code_mode_runs_with_the_final_answer(worlds: Worlds, imported: dict[str, Any]
                                              ) -> None:
    # Task 1: reorder the most recent paper towels (offer 8, quantity 1). AWM's verifier
    # reads the answer too: one that names another quantity is "others".
    task = load_task(task_dir(imported, 1))
    good = "I reordered your Household Paper Towels 12-Roll Pack, quantity 1."
    assert verdict_on(worlds, task, None, good) == (False, "others")
    assert verdict_on(worlds, task, REORDER, good) == (True, "complete")
    assert verdict_on(worlds, task, REORDER, "") == (True, "complete")  # no answer: None
    assert verdict_on(worlds, task, REORDER, "Reordered 3 paper towels.") == (False, "others")
    assert verdict_on(worlds, task, REORDER.replace("8, 1)", "9, 2)"), good) == (
        False, "others")


def test_code_mode_misbehaviour_is_a_verifier_error_in_the_sandbox(
        worlds: Worlds, imported: dict[str, Any], tmp_path: Path) -> None:
    folder = copy_task(imported, 1, tmp_path)
    task = load_task(folder)
    w0 = task_w0(worlds, task)
    helper = folder / "verifier" / CODE_HELPER
    cases = {
        "def verify_task_completion(i, f, a=None):\n    return {'result': 'maybe'}\n":
            "not a dict whose 'result' is 'complete' or 'others'",
        "def something_else(i, f, a=None):\n    return {'result': 'complete'}\n":
            "defines no function verify_task_completion()",
        # Generated code is untrusted: a write to the world's database cannot happen.
        "import sqlite3\ndef verify_task_completion(i, f, a=None):\n"
        "    sqlite3.connect(f).execute('DELETE FROM carts')\n"
        "    return {'result': 'complete'}\n": "readonly",
    }
    for code, message in cases.items():
        helper.write_text(code)
        verdict = run_verifier(task.verifier_dir, w0, w0, "")
        assert verdict.is_error and not verdict.passed
        assert message in verdict.errors[0], verdict.errors
    assert worlds.resolve(task.spec.world).world_hash == task.spec.world_hash


# --- sql mode: evidence to the code-augmented judge, four outcomes -----------------------


JUDGE_RULES: list[dict[str, Any]] = [
    {"when": {"has_tools": False, "any_contains": "[error]"},
     "reply": {"content": json.dumps({"verdict": "Environment Error",
                                      "reasoning": "The SQL tool failed; nothing changed."})}},
    {"when": {"has_tools": False,
              "any_contains": '"correct_offer_quantity_in_final_cart": 1'},
     "reply": {"content": json.dumps({"verdict": "Completed", "reasoning":
                                      "The top-rated offer under $200 was added, qty 1."})}},
    {"when": {"has_tools": False,
              "any_contains": '"correct_offer_quantity_in_final_cart": 2'},
     "reply": {"content": json.dumps({"verdict": "Partially Completed", "reasoning":
                                      "The right item, but quantity 2, not 1."})}},
    {"when": {"has_tools": False, "any_contains": '"correct_offer_in_final_cart": false'},
     "reply": {"content": json.dumps({"verdict": "Agent Error", "reasoning":
                                      "Another product was added: not the one asked for."})}},
]


def insert(offer: int, quantity: int) -> dict[str, Any]:
    return {"kind": "tool", "tool": "awm_sql_execute", "arguments": {
        "sql": f"INSERT INTO cart_items (cart_id, product_offer_id, quantity) "
               f"VALUES (1, {offer}, {quantity})"}}


def answer(text: str) -> dict[str, Any]:
    return {"kind": "answer", "text": text}


def test_sql_mode_evidence_reaches_the_judge_and_maps_to_awm_rewards(
        env: Environment, imported: dict[str, Any]) -> None:
    task = load_task(task_dir(imported, 0))
    attempts = {
        "Completed": [insert(1, 1), answer("Added the Sony WH-CH710N to your cart.")],
        "Partially Completed": [insert(1, 2), answer("Added two Sony WH-CH710N.")],
        "Agent Error": [insert(2, 1), answer("Added the Bose QC35 II.")],
        "Environment Error": [
            {"kind": "tool", "tool": "awm_sql_execute",
             "arguments": {"sql": "INSERT INTO cart_itemz VALUES (1)"}},
            answer("The cart could not be changed.")],
    }
    rewards = {"Completed": 1.0, "Partially Completed": 0.1, "Agent Error": 0.0,
               "Environment Error": 0.0}
    with serving(JUDGE_RULES) as server:
        judge = CodeJudge(LLMClient("openai/awm-judge", api_base=server.url,
                                    api_key="sk-loopback", num_retries=0, timeout=30))
        for outcome, steps in attempts.items():
            rollout: Rollout = run_rollout(env, task, agent(f"scripted:{outcome}", steps),
                                           hinted=False)
            # The code-mode check is AWM's broken one: "others" whatever was added.
            assert not rollout.verdict.passed and not rollout.verdict.errors
            evidence = next(s.evidence for s in rollout.verdict.scripts
                            if s.script == SQL_SCRIPT)
            assert set(evidence) == {"verify_task", "success_criteria", "failure_criteria"}
            judgement = judge.judge(task, rollout)
            assert (judgement.status, judgement.verdict) == ("ran", outcome), judgement
            assert awm_outcome_reward(judgement) == rewards[outcome]
            shown = server.requests[-1]["messages"][1]["content"]
            assert f"Evidence from {SQL_SCRIPT}:" in shown
            assert "top_candidate_under_200_initial" in shown
            assert "correct_offer_was_newly_added" in shown
            assert "(none: the task has no rubric)" in shown
    assert len(server.requests) == 4
    # The criteria travel with the evidence, as AWM's judge reads them.
    criteria = read_awm_dir(SAMPLES).scenarios[SCENARIO].sql_verifiers[0]
    assert criteria.success_criteria is not None
    assert criteria.success_criteria[:80] in server.requests[0]["messages"][1]["content"]


# --- the broken verifier of e_commerce_33 task 0 -----------------------------------------


def with_solution(imported: dict[str, Any], tmp_path: Path) -> Path:
    folder = copy_task(imported, 0, tmp_path)
    solution = msgspec.json.decode(
        (FIXTURES / f"{SCENARIO}-task-0.solution.json").read_bytes(), type=Solution)
    add_solution(folder, solution)
    return folder


def outcome(report: Any) -> dict[str, tuple[str, str]]:
    return {r.gate: (r.status, r.reason) for r in report.rounds[-1]}


def test_the_broken_verifier_is_rejected_at_solvability(env: Environment,
                                                        imported: dict[str, Any],
                                                        tmp_path: Path) -> None:
    """AWM's code-mode verifier of task 0 picks the top-rated product overall (the Bose,
    4.8 stars, $299.99) and then wants it under $200: no world satisfies it. The reference
    solution adds the top-rated item under $200 (the Sony, 4.5 stars, $149.99), which AWM's
    own sql-mode verifier finds correct; the gates reject the task at solvability."""
    task = load_task(with_solution(imported, tmp_path))
    assert task.spec.absent == ["hint", "rubric"] and task.solution.steps
    report = check_task(GateRun(env=env, rollouts=lambda t: scripted_rollouts(env, t)), task)
    got = outcome(report)
    assert not report.accepted
    assert got["initially_unsatisfied"][0] == "passed"
    assert got["solvability"] == ("failed", "no_success")
    assert got["difficulty"][0] == "not_run" and "not reached" in got["difficulty"][1]
    text = render_report(report)
    assert text.startswith(f"task {SCENARIO}-task-0: REJECTED")
    assert "solvability            failed   no_success: none of the 6 rollouts succeeded" \
        in text

    # The reference really does the task: AWM's sql-mode evidence on its rollout says so.
    reference = run_rollout(env, task, scripted("reference"), hinted=False)
    evidence = next(s.evidence for s in reference.verdict.scripts if s.script == SQL_SCRIPT)
    summary = evidence["verify_task"]["judgment_summary"]
    assert summary == {"has_top_candidate": True, "top_candidate_product_id": 1,
                       "top_candidate_product_offer_id": 1, "top_candidate_price": 149.99,
                       "top_candidate_avg_rating": 4.5, "correct_offer_in_final_cart": True,
                       "correct_offer_quantity_in_final_cart": 1,
                       "correct_offer_was_newly_added": True}
    assert reference.verdict.checks[0].passed is False  # the broken code-mode check

    # The same verifier with its filter in the right order (under $200 first, then the
    # top rating) accepts the reference: the defect is the verifier's, not the solution's.
    helper = task.verifier_dir / CODE_HELPER
    code = helper.read_text(encoding="utf-8")
    fixed = code.replace("    if not rated_qualifying:\n", (
        "    rated_qualifying = [(pid, r) for pid, r in rated_qualifying if safe_query(\n"
        "        initial_db_path, \"SELECT 1 FROM product_offers WHERE product_id = ? AND \"\n"
        "        \"currency = 'USD' AND is_active = 1 AND price < 200\", (pid,))]\n"
        "    if not rated_qualifying:\n"), 1)
    assert fixed != code
    helper.write_text(fixed, encoding="utf-8")
    repaired = check_task(GateRun(env=env, rollouts=lambda t: scripted_rollouts(env, t)),
                          load_task(task.path))
    assert outcome(repaired)["solvability"][0] == "passed", outcome(repaired)
    assert repaired.accepted and repaired.difficulty == "hard"


# --- no solution: the gates that need rollouts say they did not run ----------------------


def test_without_a_solution_the_rollout_gates_are_not_run_and_the_task_undecided(
        env: Environment, imported: dict[str, Any], store: Path) -> None:
    task = load_task(task_dir(imported, 1))
    report = check_task(GateRun(env=env, rollouts=lambda t: scripted_rollouts(env, t)), task)
    got = outcome(report)
    assert got["initially_unsatisfied"][0] == "passed"
    for gate in ("judge_consistency", "solvability", "difficulty", "counterfactual_probe"):
        assert got[gate][0] == "not_run"
        assert "no reference solution" in got[gate][1] and "llm:MODEL" in got[gate][1]
    assert not report.accepted and report.difficulty is None
    assert any(n.startswith("undecided: solvability, difficulty not run") for n in
               report.notes)
    assert render_report(report).startswith(f"task {SCENARIO}-task-1: UNDECIDED")

    # `worldctl task check` says the same and exits 1 (not accepted).
    result = CliRunner().invoke(cli, ["--store", str(store), "task", "check",
                                      str(task.path)], catch_exceptions=False)
    assert result.exit_code == 1, result.output
    assert "UNDECIDED" in result.output and "no reference solution" in result.output
    lines = {line.split()[1]: line.split()[2] for line in result.output.splitlines()
             if line.strip()[:2] in {"1.", "2.", "3.", "4.", "5."}}
    assert lines == {"judge_consistency": "not_run", "initially_unsatisfied": "passed",
                     "solvability": "not_run", "difficulty": "not_run",
                     "counterfactual_probe": "not_run"}


def test_a_sql_mode_only_task_leaves_v_to_the_judge(env: Environment,
                                                    imported: dict[str, Any],
                                                    tmp_path: Path) -> None:
    """Without a code-mode verifier there is no check: gate 2 cannot say V(W0) = 0 without
    a judge, and says so instead of passing."""
    folder = copy_task(imported, 0, tmp_path)
    (folder / "verifier" / CODE_SCRIPT).unlink()
    (folder / "verifier" / CODE_HELPER).unlink()
    task = load_task(folder)
    assert task.scripts == (SQL_SCRIPT,)
    verdict = run_verifier(task.verifier_dir, task_w0(env.worlds, task),
                           task_w0(env.worlds, task), "")
    assert not verdict.errors and verdict.checks == [] and not verdict.passed
    report = check_task(GateRun(env=env, rollouts=lambda t: scripted_rollouts(env, t)), task)
    got = outcome(report)
    assert got["initially_unsatisfied"][0] == "not_run"
    assert "only collects evidence" in got["initially_unsatisfied"][1]
    assert not report.accepted and render_report(report).startswith(
        f"task {SCENARIO}-task-0: UNDECIDED")


@pytest.mark.parametrize(("line", "error"), [
    ('{"checks": {}, "evidence": []}', '"evidence" must be an object'),
    ('{"checks": {}}', '"checks" is empty'),
    ('{"checks": {}, "evidence": {}}', '"checks" is empty'),
])
def test_evidence_only_output_must_carry_evidence(worlds: Worlds, imported: dict[str, Any],
                                                  tmp_path: Path, line: str,
                                                  error: str) -> None:
    folder = tmp_path / "verifier"
    folder.mkdir()
    (folder / "evidence.py").write_text(f"print('RESULT_JSON=' + {line!r})\n")
    folder.chmod(0o755)
    w0 = task_w0(worlds, load_task(task_dir(imported, 1)))
    verdict = run_verifier(folder, w0, w0, "")
    assert verdict.is_error and error in verdict.errors[0], verdict.errors
    assert verdict.scripts[0].evidence == {}
