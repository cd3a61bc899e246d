"""The judges: the code-augmented LLM judge and the agent judge, with scripted models
behind a loopback server, judging real rollouts and inspecting real world checkouts."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from gates.agents import reference_agent
from gates.contract import (
    JUDGE_CLASSES,
    AnswerStep,
    Check,
    JudgeClass,
    Judgement,
    Rollout,
    ShellStep,
    ToolStep,
    Trajectory,
    TurnRecord,
    Verdict,
)
from gates.errors import InspectionRefused, InvalidAnswer
from gates.judges import (
    MAX_FILE_BYTES,
    MAX_ROWS,
    NOT_RUN_REASON,
    RESPONSE_FORMAT,
    AgentJudge,
    CodeJudge,
    WorldInspector,
    judged_success,
    parse_answer,
    render_trajectory,
    render_verdict,
)
from gates.rollout import run_rollout
from gates.task import Task, load_task
from replay import Worlds
from tests.support.llm_server import FIXTURES, LoopbackLLM, load_script, serving
from worldenv.instances.instance import Environment
from worldllm.client import LLMClient
from worldstore.errors import ConfigError

DEMO = Path(__file__).resolve().parents[2] / "packs" / "demo" / "world" / "lars.jsonl"
MODEL = "openai/judge"
TITLE = "Nordlys Studio - Fjellrommet brief"
PASSING = Verdict(checks=[Check(script="title.py", name="summary_is_the_title", passed=True)],
                  scripts=[], errors=[])


@pytest.fixture(scope="module")
def worlds(demo_worlds: Worlds) -> Worlds:
    return demo_worlds


@pytest.fixture(scope="module")
def task() -> Task:
    return load_task(FIXTURES / "fjellrommet-title")


@pytest.fixture(scope="module")
def rollout(worlds: Worlds, task: Task) -> Rollout:
    """A real, graded rollout of the reference solution, its episode in the store."""
    with Environment(worlds) as env:
        return run_rollout(env, task, reference_agent(), hinted=False)


@pytest.fixture
def pair(worlds: Worlds, tmp_path: Path) -> tuple[Path, Path]:
    """Writable checkouts: lars@6 as the initial world, lars@7 as the final one."""
    initial, final = tmp_path / "w0", tmp_path / "w"
    worlds.checkout("lars@6", initial)
    worlds.checkout("lars@7", final)
    return initial, final


def client(server: LoopbackLLM | None) -> LLMClient:
    return LLMClient(MODEL, api_base=server.url if server else None, api_key="sk-loopback",
                     num_retries=0, timeout=30)


def case(marker: str) -> Trajectory:
    """A one-turn trajectory whose answer carries a marker the scripted model keys on."""
    return Trajectory(turns=[TurnRecord(index=0, step=AnswerStep(text=f"case {marker}"),
                                        observation="")],
                      answer=f"case {marker}", stopped="answer")


# --- the code-augmented judge -------------------------------------------------------------


@pytest.mark.parametrize("cls", JUDGE_CLASSES)
def test_each_class_is_parsed(task: Task, cls: JudgeClass) -> None:
    with serving(load_script("code_judge")) as server:
        judgement = CodeJudge(client(server)).judge_trajectory(task, case(cls), PASSING)
    assert judgement.status == "ran" and judgement.verdict == cls
    assert judgement.reasoning and judgement.model == MODEL
    assert judged_success(judgement) is (cls == "Completed")
    (request,) = server.requests
    assert request["response_format"] == RESPONSE_FORMAT and request["temperature"] == 0.0
    system, user = request["messages"]
    assert system["role"] == "system" and "Environment Error" in system["content"]
    assert task.spec.instruction in user["content"] and task.rubric.strip() in user["content"]
    assert "V = 1 (1/1 checks pass)" in user["content"]
    assert task.hint.strip() not in user["content"]


def test_the_judge_reads_a_real_rollout(task: Task, rollout: Rollout) -> None:
    with serving(load_script("code_judge")) as server:
        judgement = CodeJudge(client(server)).judge(task, rollout)
    assert (judgement.status, judgement.verdict) == ("ran", "Completed")
    shown = server.requests[0]["messages"][1]["content"]
    assert "V = 1 (3/3 checks pass)" in shown
    assert "- [x] title.py: answer_names_the_title" in shown
    assert 'mcp notes_search_notes {"query": "Fjellrommet"}' in shown
    assert "shell \"printf '%s\\\\n' 'Nordlys Studio - Fjellrommet brief' > summary.txt\"" \
        in shown


def test_an_invalid_answer_gets_one_retry_with_the_error(task: Task) -> None:
    with serving(load_script("code_judge")) as server:
        judgement = CodeJudge(client(server)).judge_trajectory(task, case("retry-ok"), PASSING)
    assert (judgement.status, judgement.verdict) == ("ran", "Agent Error")
    first, second = (r["messages"] for r in server.requests)
    assert second[:2] == first
    assert second[2] == {"role": "assistant",
                         "content": "The agent failed: summary.txt was never written."}
    assert second[3]["role"] == "user" and second[3]["content"].startswith(
        "That answer is invalid: not a JSON object")


def test_an_invalid_answer_twice_is_an_error_never_a_verdict(task: Task) -> None:
    with serving(load_script("code_judge")) as server:
        judgement = CodeJudge(client(server)).judge_trajectory(task, case("always-bad"),
                                                               PASSING)
    assert judgement.status == "error" and judgement.verdict is None
    assert "invalid judge answer twice" in judgement.reasoning
    assert "verdict" in judgement.reasoning and "Done" not in JUDGE_CLASSES
    assert len(server.requests) == 2 and judged_success(judgement) is None


def test_without_a_model_the_judges_do_not_run(task: Task, rollout: Rollout) -> None:
    nothing = LLMClient(None)
    for judgement in (CodeJudge(nothing).judge(task, rollout),
                      AgentJudge(nothing).judge(task, rollout)):
        assert judgement == Judgement(status="not_run", verdict=None,
                                      reasoning=NOT_RUN_REASON)
        assert judged_success(judgement) is None


def test_a_failed_model_call_is_an_error_judgement(task: Task) -> None:
    with serving([]) as server:  # answers nothing: every request is refused
        judgement = CodeJudge(client(server)).judge_trajectory(task, case("x"), PASSING)
    assert judgement.status == "error" and judgement.verdict is None
    assert MODEL in judgement.reasoning


def test_framing_and_sessions(task: Task) -> None:
    framing = ("A reviewer says this rollout was actually NOT completed (failed). "
               "Re-investigate the evidence and give your verdict.")
    judge_case = case("Completed")
    with serving(load_script("code_judge")) as server:
        judge = CodeJudge(client(server))
        blind = judge.judge_trajectory(task, judge_case, PASSING, fresh=True)
        framed = judge.judge_trajectory(task, judge_case, PASSING, framing=framing)
        continued = judge.judge_trajectory(task, judge_case, PASSING, framing=framing,
                                           fresh=False, previous=blind)
    assert blind.verdict == framed.verdict == continued.verdict == "Completed"
    plain, fresh, kept = (r["messages"] for r in server.requests)
    assert fresh == [*plain, {"role": "user", "content": framing}]
    earlier = json.loads(kept[2]["content"])
    assert kept[2]["role"] == "assistant" and earlier == {
        "verdict": "Completed", "reasoning": blind.reasoning}
    assert kept == [*plain, kept[2], {"role": "user", "content": framing}]
    with pytest.raises(ValueError, match="fresh=False"):
        CodeJudge(client(None)).judge_trajectory(task, judge_case, PASSING, previous=blind)
    with pytest.raises(ValueError, match="previous judgement"):
        CodeJudge(client(None)).judge_trajectory(task, judge_case, PASSING, fresh=False)


@pytest.mark.parametrize(("text", "problem"), [
    ("", "not a JSON object"),
    ("Completed", "not a JSON object"),
    ('```json\n{"verdict": "Completed", "reasoning": "r"}\n```', "not a JSON object"),
    ('{"verdict": "Completed"}', "missing required field `reasoning`"),
    ('{"verdict": "Done", "reasoning": "r"}', "Invalid enum value 'Done'"),
    ('{"verdict": "Completed", "reasoning": ""}', "Expected `str` of length >= 1"),
    ('{"verdict": "Completed", "reasoning": "r", "score": 1}', "unknown field `score`"),
    ('["Completed", "r"]', "Expected `object`, got `array`"),
])
def test_answers_are_validated_strictly(text: str, problem: str) -> None:
    with pytest.raises(InvalidAnswer) as caught:
        parse_answer(text)
    assert problem in str(caught.value)


def test_a_valid_answer_parses() -> None:
    answer = parse_answer(' {"reasoning": "All checks pass.", "verdict": "Completed"}\n')
    assert (answer.verdict, answer.reasoning) == ("Completed", "All checks pass.")


def test_rendering_is_compact_and_flags_errors() -> None:
    trajectory = Trajectory(turns=[
        TurnRecord(index=0, step=ToolStep(tool="notes_get_note", arguments={"note_id": 4}),
                   observation="x" * 1000, reasoning="<thinking>read it</thinking>"),
        TurnRecord(index=1, step=ShellStep(command="cat nope"), observation="no such file",
                   is_error=True),
    ], stopped="step_limit")
    text = render_trajectory(trajectory)
    assert text.splitlines()[0] == "stopped: step_limit"
    assert "   thought: <thinking>read it</thinking>" in text
    assert f"0. mcp notes_get_note {{\"note_id\": 4}} -> '{'x' * 397}...'" in text
    assert "1. shell 'cat nope' [error] -> 'no such file'" in text
    assert text.splitlines()[-1] == "final answer: None"
    errored = Verdict(checks=[Check("a.py", "one", True), Check("a.py", "two", False)],
                      scripts=[], errors=["b.py: timed out"])
    assert render_verdict(errored) == ("V = 0 (1/2 checks pass)\n- [x] a.py: one\n"
                                       "- [ ] a.py: two\n- error: b.py: timed out")


# --- the agent judge ----------------------------------------------------------------------


def tool_results(server: LoopbackLLM) -> list[str]:
    return [m["content"] for m in server.requests[-1]["messages"] if m["role"] == "tool"]


def test_the_agent_judge_inspects_a_real_rollouts_worlds(worlds: Worlds, task: Task,
                                                         rollout: Rollout) -> None:
    with serving(load_script("agent_judge")) as server:
        judgement = AgentJudge(client(server), worlds=worlds).judge(task, rollout)
    assert judgement == Judgement(
        status="ran", verdict="Completed", model=MODEL,
        reasoning="summary.txt exists only in the final world and holds the title of "
                  "note 4, the brief.")
    assert len(server.requests) == 4
    tables, files, in_initial, in_final, rows = tool_results(server)
    assert "notes:\nCREATE TABLE notes" in tables
    assert f"summary.txt\t{len(TITLE) + 1} bytes" in files.splitlines()
    assert "jobs/nordlys/bom.md\t" in files
    assert in_initial == "Error: initial: no file 'summary.txt' in the workspace"
    assert in_final == f"{TITLE}\n"
    assert json.loads(rows) == {"columns": ["title"], "rows": [[TITLE]], "truncated": False}
    case_text = server.requests[0]["messages"][1]["content"]
    assert "## Verifier" not in case_text  # independent of the code tier by default
    assert "- final: services calendar, chat, notes, shop" in case_text


def test_the_agent_judge_can_be_shown_the_verifier(worlds: Worlds, task: Task,
                                                   rollout: Rollout) -> None:
    with serving(load_script("agent_judge")) as server:
        AgentJudge(client(server), worlds=worlds, show_verdict=True).judge(task, rollout)
    assert "## Verifier\nV = 1 (3/3 checks pass)" in server.requests[0]["messages"][1]["content"]


def test_a_rollout_needs_the_worlds_store(task: Task, rollout: Rollout) -> None:
    with pytest.raises(ConfigError, match="worlds="):
        AgentJudge(client(None)).judge(task, rollout)


def run_case(marker: str, task: Task, pair: tuple[Path, Path], **options: Any
             ) -> tuple[Judgement, LoopbackLLM]:
    with serving(load_script("agent_judge_verdicts")) as server:
        judge = AgentJudge(client(server), **options)
        judgement = judge.judge_worlds(task, case(marker), initial=pair[0], final=pair[1])
    return judgement, server


def test_an_invalid_verdict_gets_one_retry(task: Task, pair: tuple[Path, Path]) -> None:
    judgement, server = run_case("verdict-retry", task, pair)
    assert (judgement.status, judgement.verdict) == ("ran", "Agent Error")
    assert len(server.requests) == 2
    (retry,) = tool_results(server)
    assert retry.startswith("Error: That answer is invalid: Expected `str` of length >= 1")


def test_an_invalid_verdict_twice_is_an_error(task: Task, pair: tuple[Path, Path]) -> None:
    judgement, server = run_case("verdict-bad", task, pair)
    assert judgement.status == "error" and judgement.verdict is None
    assert judgement.reasoning.startswith("invalid verdict twice; last: not a JSON object")
    assert len(server.requests) == 2


def test_an_unknown_tool_is_an_error_the_judge_sees(task: Task, pair: tuple[Path, Path]
                                                   ) -> None:
    judgement, server = run_case("unknown-tool", task, pair)
    assert judgement.verdict == "Agent Error"
    assert tool_results(server)[0].startswith("Error: no tool 'drop_table'; the tools are "
                                              "list_tables, query, list_files, read_file")


def test_no_verdict_within_the_turn_limit_is_an_error(task: Task, pair: tuple[Path, Path]
                                                     ) -> None:
    judgement, server = run_case("no-verdict", task, pair, max_turns=3)
    assert judgement.status == "error" and judgement.verdict is None
    assert judgement.reasoning == "no valid verdict within 3 turns"
    assert len(server.requests) == 3
    assert server.requests[-1]["messages"][-1]["content"].endswith("call verdict now.")


# --- the read-only tools ------------------------------------------------------------------


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_queries_read_both_worlds(pair: tuple[Path, Path]) -> None:
    tools = WorldInspector({"initial": pair[0], "final": pair[1]})
    sql = "SELECT name FROM contacts WHERE id = 8"
    assert json.loads(tools.query("final", "calendar", sql))["rows"] == [["Sofie Nilsen"]]
    assert json.loads(tools.query("initial", "calendar", sql)) == {
        "columns": [], "rows": [], "truncated": False}
    assert "contacts:\nCREATE TABLE contacts" in tools.list_tables("final", "calendar")
    assert tools.services("final") == ["calendar", "chat", "notes", "shop"]


@pytest.mark.parametrize(("sql", "problem"), [
    ("DELETE FROM notes", "only SELECT"),
    ("  -- a comment\n UPDATE notes SET title = 'x'", "only SELECT"),
    ("PRAGMA writable_schema = 1", "only SELECT"),
    ("ATTACH DATABASE 'x.db' AS x", "only SELECT"),
    ("WITH gone AS (SELECT 1) DELETE FROM notes WHERE id = 1", "not authorized"),
    ("SELECT 1; DELETE FROM notes", "not authorized"),
    ("SELECT * FROM no_such_table", "no such table"),
])
def test_anything_but_reading_is_refused(pair: tuple[Path, Path], sql: str, problem: str
                                         ) -> None:
    db = pair[1] / "services" / "notes.sqlite"
    before = sha256(db)
    tools = WorldInspector({"final": pair[1]})
    with pytest.raises(InspectionRefused, match=problem):
        tools.query("final", "notes", sql)
    assert sha256(db) == before
    assert json.loads(tools.query("final", "notes", "SELECT count(*) FROM notes"))["rows"][0][0] > 0


def test_queries_are_bounded(pair: tuple[Path, Path]) -> None:
    tools = WorldInspector({"final": pair[1]})
    many = json.loads(tools.query("final", "notes", "WITH RECURSIVE n(i) AS (SELECT 1 "
                                  "UNION ALL SELECT i + 1 FROM n WHERE i < 80) SELECT i FROM n"))
    assert len(many["rows"]) == MAX_ROWS and many["truncated"] is True
    wide = tools.query("final", "notes", "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT "
                       "i + 1 FROM n WHERE i < 40) SELECT hex(zeroblob(250)) FROM n")
    assert wide.endswith("characters]") and "[... cut at 8000 of " in wide
    with pytest.raises(InspectionRefused, match="stopped after"):
        tools.query("final", "notes", "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL "
                                      "SELECT i + 1 FROM n) SELECT count(*) FROM n")


def test_unknown_worlds_and_services_are_named(pair: tuple[Path, Path]) -> None:
    tools = WorldInspector({"initial": pair[0], "final": pair[1]})
    with pytest.raises(InspectionRefused, match="no world 'middle'; the worlds are final, "
                                                "initial"):
        tools.list_files("middle")
    with pytest.raises(InspectionRefused, match=r"no service '\.\./x'; the services are "
                                                "calendar, chat, notes, shop"):
        tools.query("final", "../x", "SELECT 1")


def test_files_are_read_bounded_and_never_outside_the_workspace(pair: tuple[Path, Path]
                                                                ) -> None:
    final = pair[1]
    workspace = final / "workspace"
    (workspace / "big.txt").write_text("y" * (MAX_FILE_BYTES + 500))
    (workspace / "escape").symlink_to("/etc")
    tools = WorldInspector({"final": final})
    big = tools.read_file("final", "big.txt")
    assert big.startswith("y" * MAX_FILE_BYTES)
    assert big.endswith(f"[... cut at {MAX_FILE_BYTES} of {MAX_FILE_BYTES + 500} bytes]")
    assert tools.read_file("final", "img/rack-label.png").startswith("(binary file, ")
    assert tools.read_file("final", "jobs/fjord/brief.md") == (
        workspace / "jobs/fjord/brief.md").read_text()
    for path, problem in [("../services/notes.sqlite", "contains '..'"),
                          ("/etc/passwd", "is absolute"),
                          ("escape/passwd", "symlink"),
                          ("jobs", "no file 'jobs'")]:
        with pytest.raises(InspectionRefused, match=problem):
            tools.read_file("final", path)
