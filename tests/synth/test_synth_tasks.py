"""Task synthesis (synth.worlds.tasks) through litellm's real path against the loopback server, on
a persona world made by ``synth world`` (the rules of tests/synth/test_synth_implement.py):
``worldctl synth tasks astrid --days 2,2 --difficulty hard --parallel 2 --judge-model J``
(gate 1's three tiers: the verifier, the code-augmented judge, the agent judge querying
the final world; and gate 5's probe). Both workers
propose the same task: the store's claims let the lower rank have it and hold the other
back. The claimed task's first verifier already holds before anything is done, so gate 2
rejects it; the LLM reviser's version passes every gate that runs with six ensemble
rollouts (two agent variants, the last three hinted: the unhinted ones fail, so it is
hard) and goes into the pack. Then the funnel report, the run's offline replay (the same
task digests), the diversity gate's order against the store, and the refusals."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gates.task import load_task
from replay.engine import Worlds
from synth.runs import replay_run
from synth.worlds.skills import read_skills
from synth.worlds.tasks import DraftOut, TaskRecord, cosine, draft_problems
from tests.support.cli_harness import invoke, refused
from tests.support.llm_server import serving
from tests.synth.test_synth_implement import _rules as world_rules
from tests.synth.test_synth_plans import FINDINGS
from worldctl.synth import funnel_table

MODEL = "openai/loopback"
PROPOSE, REVISE = "synth prompt propose@v1", "synth prompt revise@v1"
AGENT = "You are an agent working on a user's personal computer"
INSTRUCTION = ("Write the first chat message I sent Ingrid into order.txt in my workspace, "
               "and send her 'Photo saved.' in our chat.")
SOLUTION = [{"kind": "tool", "tool": "chat_send_message",
             "arguments": {"conversation_id": 1, "body": "Photo saved."}},
            {"kind": "shell", "command": "printf 'Where is my order?\\n' > order.txt"},
            {"kind": "answer", "text": "Wrote 'Where is my order?' to order.txt and told "
                                       "Ingrid the photo is saved."}]
HOLDS_AT_W0 = """import awsdk

ws = awsdk.worlds()
sent = awsdk.rows(ws.w, "chat", "SELECT body FROM messages WHERE sender_id = 1")
awsdk.result(a_message_sent=len(sent) > 0)
"""
CHECKS_THE_CHANGE = """import awsdk

ws = awsdk.worlds()


def bodies(world):
    return [r["body"] for r in awsdk.rows(
        world, "chat", "SELECT body FROM messages WHERE sender_id = 1 ORDER BY id")]


new = bodies(ws.w)[len(bodies(ws.w0)):]
awsdk.result(photo_message_sent=new == ["Photo saved."],
             order_file_written=(awsdk.file_text(ws.w, "order.txt") or "").strip()
             == "Where is my order?")
"""


def draft(verifier: str) -> dict[str, Any]:
    return {"instruction": INSTRUCTION, "difficulty": "hard",
            "subtasks": [{"description": "Find the first message to Ingrid", "interface": "mcp"},
                         {"description": "Write order.txt", "interface": "shell"},
                         {"description": "Send 'Photo saved.'", "interface": "mcp"}],
            "hint": "The chat's conversation 1 is with Ingrid; the workspace is the cwd.",
            "rubric": "order.txt holds the first message; Ingrid got 'Photo saved.'.",
            "verifier": verifier, "solution": SOLUTION}


def agent_calls() -> list[dict[str, Any]]:
    calls = [{"name": "chat_send_message",
              "arguments": {"conversation_id": 1, "body": "Photo saved."}},
             {"name": "shell", "arguments": {"command": SOLUTION[1]["command"]}}]
    return [*calls, {"name": "answer", "arguments": {"text": "Done."}}]


CODE_JUDGE = "You judge an agent's attempt at a task on a simulated personal computer. "
AGENT_JUDGE = "by inspecting the computer itself"
PHOTO_SAVED = "SELECT body FROM messages WHERE body = 'Photo saved.'"


def _judge(verdict: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "verdict",
                            "arguments": {"verdict": verdict, "reasoning": "scripted"}}]}


def _code(when: dict[str, Any], verdict: str) -> dict[str, Any]:
    return {"when": {"has_tools": False, "any_contains": CODE_JUDGE, **when},
            "reply": {"content": json.dumps({"verdict": verdict, "reasoning": "scripted"})}}


# The three tiers: the verifier's V, the code-augmented judge deciding from V (and holding
# to it when the counterfactual probe says the opposite), the agent judge from a query of
# the final world.
JUDGES = [
    _code({"last_contains": "NOT completed", "any_contains": "V = 1 ("}, "Completed"),
    _code({"last_contains": "actually completed", "any_contains": "V = 0 ("}, "Agent Error"),
    {"when": {"has_tools": False, "any_contains": "V = 1 ("},
     "reply": {"content": json.dumps({"verdict": "Completed", "reasoning": "scripted"})}},
    {"when": {"has_tools": False, "any_contains": "## Verifier"},
     "reply": {"content": json.dumps({"verdict": "Agent Error", "reasoning": "scripted"})}},
    {"when": {"has_tools": True, "any_contains": AGENT_JUDGE, "last_role": "tool",
              "last_contains": '"rows": [["Photo saved."]]'}, "reply": _judge("Completed")},
    {"when": {"has_tools": True, "any_contains": AGENT_JUDGE, "last_role": "tool"},
     "reply": _judge("Agent Error")},
    {"when": {"has_tools": True, "any_contains": AGENT_JUDGE},
     "reply": {"tool_calls": [{"name": "query", "arguments": {
         "world": "final", "service": "chat", "sql": PHOTO_SAVED}}]}},
]


def _rules() -> list[dict[str, Any]]:
    return [
        *JUDGES,
        {"when": {"any_contains": PROPOSE},
         "reply": {"content": json.dumps({"tasks": [draft(HOLDS_AT_W0)]})}},
        {"when": {"any_contains": REVISE},
         "reply": {"content": json.dumps(draft(CHECKS_THE_CHANGE))}},
        {"when": {"any_contains": AGENT, "last_contains": "Hint:"},
         "reply": {"tool_calls": agent_calls()}},
        {"when": {"any_contains": AGENT},
         "reply": {"tool_calls": [{"name": "answer",
                                   "arguments": {"text": "I could not find it."}}]}},
        *world_rules(),
    ]


pytestmark = pytest.mark.usefixtures("loopback_env")


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[tuple[Path, Path, dict[str, Any]]]:
    base = tmp_path_factory.mktemp("tasks")
    run, store = base / "run", base / "store"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WORLDCTL_LLM_API_KEY", "x")
        with serving(_rules()) as server:
            common = ["--run", str(run), "--model", MODEL, "--api-base", server.url]
            assert invoke("synth", "persona", "--name", "astrid", *common).exit_code == 0
            world = invoke("--store", str(store), "synth", "world", "astrid", "--to-day", "2",
                           *common)
            assert world.exit_code == 0, world.output
            made = invoke("--store", str(store), "synth", "tasks", "astrid", "--days", "2,2",
                          "--difficulty", "hard", "--parallel", "2", "--judge-model",
                          "openai/judge", *common, "--json")
            assert made.exit_code == 0, made.output
    yield run, store, json.loads(made.stdout)


def test_two_workers_with_the_same_task_one_is_held_back(
        synthesized: tuple[Path, Path, dict[str, Any]]) -> None:
    run, store, report = synthesized
    first, second = report["tasks"]
    assert (first["rank"], first["diversity"], first["accepted"]) == (0, "claimed", True)
    assert (second["rank"], second["diversity"], second["accepted"]) == (1, "held_back",
                                                                        False)
    held = msgspec.json.decode(next((run / "tasks" / "astrid").glob("*rank1.json")
                                    ).read_bytes(), type=TaskRecord)
    assert (held.nearest, held.cosine) == (INSTRUCTION, 1.0)
    with Worlds.open(store) as worlds:
        scopes = [c for n in range(3) for c in worlds.store.claims(
            f"synth-tasks:run:{_scope_digest(run)}:{n}")]
    assert [(c.key, c.state) for c in scopes] == [("00000000", "kept"),
                                                  ("00000001", "dropped")]


def _scope_digest(run: Path) -> str:
    from synth.runs import read_config
    from synth.stage import canonical_digest

    command = next(c for c in read_config(run).commands if c.kind == "tasks")
    return canonical_digest(msgspec.to_builtins(command))[:16]


def test_a_task_rejected_at_gate_2_is_revised_and_accepted(
        synthesized: tuple[Path, Path, dict[str, Any]]) -> None:
    run, _, report = synthesized
    accepted = report["tasks"][0]
    assert (accepted["revisions"], accepted["difficulty"]) == (1, "hard")
    record = msgspec.json.decode((run / "tasks" / "astrid" / f"{accepted['task_id']}.json"
                                  ).read_bytes(), type=TaskRecord)
    first, second = ({g["gate"]: (g["status"], g["reason"]) for g in r} for r in record.rounds)
    assert first["initially_unsatisfied"] == ("failed", "satisfied_at_W0")
    assert second["initially_unsatisfied"][0] == "passed"
    assert second["solvability"][0] == second["difficulty"][0] == "passed"
    # the three tiers agree on all six rollouts, and the probe did not move the judges
    assert second["judge_consistency"] == ("passed", "V = V_LLM = V_agent on all 6 rollouts")
    assert second["counterfactual_probe"][0] == "passed"
    assert record.tokens > 0
    folder = run / "pack" / "run" / "tasks" / accepted["task_id"]
    task = load_task(folder)
    assert (task.spec.world, task.spec.interfaces) == ("astrid@2", ["mcp", "shell"])
    assert "photo_message_sent" in (folder / "verifier" / "check.py").read_text()
    splits = json.loads((run / "pack" / "run" / "splits.json").read_text())
    assert sum(accepted["task_id"] in ids for ids in splits.values()) == 1
    chats = [json.loads(p.read_text())["request"].get("messages")
             for p in (run / "recordings").iterdir()]
    revisions = [m for m in chats if m and REVISE in str(m[0]["content"])]
    assert len(revisions) == 1  # the reviser was asked once, with the gate's reason
    assert "initially_unsatisfied failed (satisfied_at_W0)" in revisions[0][-1]["content"]
    lessons = [s for s in read_skills(run) if s.source == f"task {accepted['task_id']}"]
    assert [s.text for s in lessons] == [
        "a task was rejected: gate initially_unsatisfied failed (satisfied_at_W0); the "
        "checks hold before anything was done"]


def test_proposals_read_what_exploring_the_booted_world_found(
        synthesized: tuple[Path, Path, dict[str, Any]]) -> None:
    run, _, _ = synthesized
    subjects = sorted(json.loads(p.read_text())["subject"]
                      for p in (run / "outputs" / "explore").iterdir())
    assert subjects == ["astrid@0", "astrid@1", "astrid@2"]  # two plans, one task day
    proposals = [ms for ms in (json.loads(p.read_text())["request"].get("messages", [])
                               for p in (run / "recordings").iterdir())
                 if ms and PROPOSE in str(ms[0]["content"])]
    assert len(proposals) == 2  # one per worker
    assert all("What exploring the world found:\n" + FINDINGS in ms[1]["content"]
               for ms in proposals)


def test_the_funnel_reports_each_gate(synthesized: tuple[Path, Path, dict[str, Any]]) -> None:
    run, _, _ = synthesized
    result = invoke("synth", "funnel", str(run), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["candidates"], report["held_back"], report["gated"]) == (2, 1, 1)
    gates = {g["gate"]: g for g in report["gates"]}
    assert gates["initially_unsatisfied"] == {
        "gate": "initially_unsatisfied", "reached": 1, "passed_directly": 0,
        "passed_after_feedback": 1, "revisions": 1, "not_run": 0}
    assert gates["difficulty"]["passed_directly"] == 0  # not reached in round 1
    assert gates["difficulty"]["passed_after_feedback"] == 1
    assert (report["accepted"], report["acceptance_rate"], report["hard"]) == (1, 1.0, 1)
    text = invoke("synth", "funnel", str(run)).stdout
    assert text.startswith("candidates 2, held back by the diversity gate 1")
    assert text == funnel_table(report) + "\n"


def test_the_run_replays_offline_to_the_same_tasks(
        synthesized: tuple[Path, Path, dict[str, Any]], tmp_path: Path) -> None:
    run, _, _ = synthesized
    again = replay_run(run, tmp_path / "again")
    assert again.identical, again.differences
    mine = sorted(p.name for p in (run / "pack" / "run" / "tasks").iterdir())
    theirs = sorted(p.name for p in (tmp_path / "again" / "pack" / "run" / "tasks").iterdir())
    assert mine == theirs and len(mine) == 1


def test_cosine_and_the_candidates_checks(synthesized: tuple[Path, Path, dict[str, Any]]
                                          ) -> None:
    _, store, _ = synthesized
    assert cosine([1.0, 0.0], [1.0, 0.0]) == 1.0 and cosine([1.0, 0.0], [0.0, 2.0]) == 0.0
    assert cosine([0.0, 0.0], [1.0, 0.0]) == 0.0
    from worldenv.instances.instance import Environment

    with Worlds.open(store) as worlds, Environment(worlds) as env:
        world_hash = worlds.record("astrid@2").world_hash
        good = msgspec.convert(draft(CHECKS_THE_CHANGE), DraftOut)
        assert draft_problems(env, "astrid", 2, world_hash, good) == []
        mcp_only = msgspec.convert({**draft(CHECKS_THE_CHANGE), "solution": [
            SOLUTION[0], SOLUTION[2]], "subtasks": [draft(HOLDS_AT_W0)["subtasks"][0]]},
            DraftOut)
        assert draft_problems(env, "astrid", 2, world_hash, mcp_only) == [
            "the subtasks use no shell step", "the reference solution has no shell step"]
        wrong = msgspec.convert({**draft(CHECKS_THE_CHANGE), "solution": [
            SOLUTION[0], {"kind": "shell", "command": "echo nope > order.txt"}, SOLUTION[2]]},
            DraftOut)
        assert draft_problems(env, "astrid", 2, world_hash, wrong) == [
            "checks fail after the reference solution: order_file_written"]


def test_refusals(synthesized: tuple[Path, Path, dict[str, Any]]) -> None:
    run, store, _ = synthesized
    common = ["--store", str(store), "synth", "tasks", "astrid", "--run", str(run),
              "--model", MODEL, "--api-base", "http://127.0.0.1:9/v1"]
    assert "astrid@5 is not in the store" in refused(invoke(*common, "--days", "5"))
    assert "--days has 2 days and --difficulty 3 labels" in refused(invoke(
        *common, "--days", "1,2", "--difficulty", "hard,medium,hard"))
    assert "--difficulty easy" in refused(invoke(*common, "--days", "1", "--difficulty",
                                                 "easy"))
    assert "not a comma-separated list" in refused(invoke(*common, "--days", "one"))
    no_model = invoke("--store", str(store), "synth", "tasks", "astrid", "--days", "1",
                      "--run", str(run.parent / "fresh-run"))
    assert "no model to synthesize with" in refused(no_model)
