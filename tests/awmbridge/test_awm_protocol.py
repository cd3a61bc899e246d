"""The AWM protocol end to end on an imported AWM environment.

content_platform_1 (the AWM-1K sample with server code) is imported with AWM-style
verifiers written for its task 0 (`tests/fixtures/awm_tasks/content_platform_1/`: a
code-mode and a sql-mode verifier in AWM's gen_verifier formats, since the samples ship
none for it), its generated FastAPI server served through the AWM adapter under the bare
operation_id names AWM-trained agents expect. An LLM agent (the project's client,
recording; the model is a loopback OpenAI-compatible server with scripted answers, so every
request takes litellm's real path) works it in meta-tool mode: `list_tools` once and first,
then `call_tool`. Its steps are checked by AWM's six-condition format validator, the
episode is judged by the code-augmented judge (the code-mode check and the sql-mode
evidence), and the outcome reward is 1.0 / 0.1 / 0.0, or -1 on a format error.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from awmbridge.importer import import_awm
from awmbridge.tasks import CODE_SCRIPT, SQL_SCRIPT, AwmOutcome, awm_rollout_outcome
from gates.contract import AnswerStep, Rollout, ToolStep
from gates.judges import CodeJudge
from gates.llm_agent import LLMAgent
from gates.quality import DifficultyConfig, GateRun, check_task, render_report
from gates.rollout import agent_rollouts, run_rollout, scripted_rollouts
from gates.task import Task, load_task
from replay import Worlds
from tests.support.llm_server import LoopbackLLM, serving
from worldenv.core.episode import ToolCall
from worldenv.instances.instance import Environment
from worldllm.client import LLMClient
from worldstore.errors import ConfigError

HERE = Path(__file__).resolve().parents[1]
SAMPLES = HERE / "fixtures" / "awm-1k-samples"  # AWM-1K's own files
VERIFIERS = HERE / "fixtures" / "awm_tasks" / "content_platform_1"
SCENARIO = "content_platform_1"
AGENT_MODEL, JUDGE_MODEL = "openai/awm-agent", "openai/awm-judge"



@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worlds]:
    with Worlds.open(tmp_path_factory.mktemp("awm-protocol") / "store") as opened:
        yield opened


@pytest.fixture(scope="module")
def task(worlds: Worlds, tmp_path_factory: pytest.TempPathFactory) -> Task:
    """content_platform_1 imported with its fixture verifiers; its task 0's folder."""
    files = tmp_path_factory.mktemp("awm-files")
    for name in ("gen_tasks.jsonl", "gen_db.jsonl", "gen_sample.jsonl", "gen_envs.jsonl"):
        shutil.copy(SAMPLES / name, files / name)
    for verifier in VERIFIERS.glob("*.jsonl"):
        shutil.copy(verifier, files / verifier.name)
    report = import_awm(worlds, files, scenarios=[SCENARIO],
                        tasks_out=tmp_path_factory.mktemp("awm-protocol-tasks"))
    assert report.ok, report.as_dict()
    (imported,) = report.imported
    assert imported.tools == 34 and imported.tasks is not None
    (folder,) = imported.tasks
    loaded = load_task(folder)
    assert loaded.task_id == f"{SCENARIO}-task-0" and loaded.scripts == (CODE_SCRIPT,
                                                                          SQL_SCRIPT)
    return loaded


@pytest.fixture(scope="module")
def env(worlds: Worlds) -> Iterator[Environment]:
    with Environment(worlds, bare_names=True) as environment:
        yield environment


# --- the scripted model -------------------------------------------------------------------

Call = tuple[str, str, dict[str, Any] | str]  # thought, tool, arguments


def list_tools(thought: str = "List the environment's tools first.") -> Call:
    return (thought, "list_tools", {})


def call(tool: str, arguments: dict[str, Any] | str, thought: str = "") -> Call:
    return (thought or f"Call {tool}.", "call_tool", {"tool_name": tool,
                                                       "arguments": arguments})


def answer(text: str) -> Call:
    return ("The task is done; report it.", "answer", {"text": text})


SEARCH = call("search_channels", {"query": "Kurzgesagt"}, "Find the channel by name.")
SUBSCRIBE = call("subscribe_to_channel", {"channel_id": 1},
                 "Channel 1 is Kurzgesagt – In a Nutshell: subscribe to it.")


def rules(steps: list[Call], verdict: str, *, no_thinking: tuple[int, ...] = ()
          ) -> list[dict[str, Any]]:
    """A model that makes `steps` one per request, in order (each reply carries a marker
    the next rule keys on), and a judge that answers `verdict`."""
    found: list[dict[str, Any]] = [{
        "when": {"has_tools": False},
        "reply": {"content": json.dumps({"verdict": verdict,
                                         "reasoning": f"Scripted judgement: {verdict}."})}}]
    for i, (thought, tool, arguments) in reversed(list(enumerate(steps))):
        when: dict[str, Any] = {"has_tools": True}
        when.update({"any_contains": f"[step {i - 1}]"} if i else {"last_role": "user"})
        text = f"[step {i}]" if i in no_thinking else f"<thinking>{thought}</thinking>[step {i}]"
        found.append({"when": when, "reply": {
            "content": text, "tool_calls": [{"name": tool, "arguments": arguments}]}})
    return found


def client(server: LoopbackLLM | None, model: str, recordings: Path | None = None,
           ) -> LLMClient:
    return LLMClient(model, api_base=server.url if server else None, api_key="sk-loopback",
                     recordings=recordings, mode="record" if server and recordings
                     else "replay" if recordings else None, num_retries=0, timeout=30)


def play(env: Environment, task: Task, steps: list[Call], verdict: str, tmp_path: Path, *,
         no_thinking: tuple[int, ...] = ()) -> tuple[Rollout, AwmOutcome, LoopbackLLM]:
    with serving(rules(steps, verdict, no_thinking=no_thinking)) as server:
        agent = LLMAgent(client(server, AGENT_MODEL, tmp_path / "recordings"), mode="meta",
                         max_steps=len(steps))
        rollout = run_rollout(env, task, agent, hinted=False)
        outcome = awm_rollout_outcome(task, rollout, CodeJudge(client(server, JUDGE_MODEL)))
    return rollout, outcome, server


def judge_requests(server: LoopbackLLM) -> list[dict[str, Any]]:
    return [r for r in server.requests if r["model"] == JUDGE_MODEL.split("/", 1)[1]]


# --- the cases ------------------------------------------------------------------------------


def test_completed_rollout_gets_reward_one(env: Environment, task: Task,
                                          tmp_path: Path) -> None:
    steps = [list_tools(), SEARCH, SUBSCRIBE,
             answer("You are now subscribed to Kurzgesagt – In a Nutshell.")]
    rollout, outcome, server = play(env, task, steps, "Completed", tmp_path)

    # Meta-tool mode: the model is offered AWM's two meta-tools and `answer`, nothing else.
    agent_requests = [r for r in server.requests if r.get("tools")]
    assert len(agent_requests) == 4
    assert {t["function"]["name"] for t in agent_requests[0]["tools"]} == {
        "list_tools", "call_tool", "answer"}
    listed = json.loads(agent_requests[1]["messages"][-1]["content"])
    assert len(listed) == 34 and "subscribe_to_channel" in {t["name"] for t in listed}

    turns = rollout.trajectory.turns
    assert [t.step.tool if isinstance(t.step, ToolStep) else "answer" for t in turns] == [
        "list_tools", "call_tool", "call_tool", "answer"]
    assert isinstance(turns[-1].step, AnswerStep) and not any(t.is_error for t in turns)
    assert turns[0].reasoning.startswith("<thinking>List the environment")
    # The instance's episode holds the real calls under their bare operation_id names.
    calls = [e for e in (rollout_episode(env, rollout)) if isinstance(e, ToolCall)]
    assert [(c.tool, c.arguments) for c in calls] == [
        ("search_channels", {"query": "Kurzgesagt"}), ("subscribe_to_channel",
                                                       {"channel_id": 1})]
    # The code-mode check holds; the sql-mode evidence shows the new subscription.
    assert rollout.verdict.passed and [c.name for c in rollout.verdict.checks] == [
        "complete"]
    evidence = next(s.evidence for s in rollout.verdict.scripts if s.script == SQL_SCRIPT)
    assert evidence["verify_task"]["added_channel_ids"] == [1]

    assert outcome.check.ok and outcome.check.reason == "all six format conditions hold"
    assert outcome.judgement is not None and outcome.judgement.verdict == "Completed"
    assert outcome.rewards == [1.0] * 4 and outcome.reward == 1.0
    (judged,) = judge_requests(server)
    shown = judged["messages"][1]["content"]
    assert "- [x] awm_complete.py: complete" in shown
    assert f"Evidence from {SQL_SCRIPT}:" in shown and "target_subscribed_finally" in shown
    assert "call_tool" in shown and "subscribe_to_channel" in shown

    # Recorded: the same rollout replays offline, with no server, to the same world.
    replayed = run_rollout(env, task, LLMAgent(client(None, AGENT_MODEL, tmp_path /
                                                      "recordings"), mode="meta",
                                               max_steps=4), hinted=False)
    assert replayed.final_hash == rollout.final_hash
    assert replayed.trajectory.turns == rollout.trajectory.turns


def rollout_episode(env: Environment, rollout: Rollout) -> list[Any]:
    from worldenv.instances.episodes import load_episode

    return list(load_episode(env.worlds, rollout.episode_id).events)


def test_partially_completed_rollout_gets_a_tenth(env: Environment, task: Task,
                                                  tmp_path: Path) -> None:
    steps = [list_tools(), SEARCH, SUBSCRIBE,
             call("unsubscribe_from_channel", {"channel_id": 2},
                  "Also tidy up: drop Marques Brownlee."),
             answer("Subscribed to Kurzgesagt; I also unsubscribed you from Marques.")]
    rollout, outcome, server = play(env, task, steps, "Partially Completed", tmp_path)
    assert not rollout.verdict.passed  # another subscription changed: "others"
    evidence = next(s.evidence for s in rollout.verdict.scripts if s.script == SQL_SCRIPT)
    assert evidence["verify_task"]["removed_channel_ids"] == [2]
    assert evidence["verify_task"]["judgment_summary"]["other_subscriptions_changed"]
    assert outcome.check.ok and outcome.judgement is not None
    assert outcome.judgement.verdict == "Partially Completed"
    assert outcome.rewards == [0.1] * 5 and outcome.reward == 0.1
    assert "- [ ] awm_complete.py: complete" in judge_requests(server)[0]["messages"][1][
        "content"]


def test_agent_error_rollout_gets_zero(env: Environment, task: Task, tmp_path: Path) -> None:
    steps = [list_tools(), SEARCH,
             call("subscribe_to_channel", {"channel_id": 3}, "Subscribe to channel 3."),
             answer("Subscribed.")]
    rollout, outcome, _server = play(env, task, steps, "Agent Error", tmp_path)
    assert not rollout.verdict.passed and not rollout.verdict.errors
    assert outcome.check.ok and outcome.judgement is not None
    assert outcome.judgement.verdict == "Agent Error"
    assert outcome.rewards == [0.0] * 4 and outcome.reward == 0.0


def test_environment_error_gets_zero_without_a_judgement(env: Environment, task: Task,
                                                         tmp_path: Path) -> None:
    # A well-formed call the server answers with an error (no channel 999): condition 6.
    steps = [list_tools(), call("get_channel_by_id", {"channel_id": 999}), SEARCH,
             SUBSCRIBE, answer("Subscribed.")]
    rollout, outcome, server = play(env, task, steps, "Completed", tmp_path)
    assert rollout.trajectory.turns[1].is_error
    assert (outcome.check.kind, outcome.check.condition, outcome.check.step) == (
        "environment_error", 6, 1)
    assert outcome.judgement is None and outcome.rewards == [0.0, 0.0]
    assert outcome.reward == 0.0 and judge_requests(server) == []


FORMAT_ERRORS: dict[str, tuple[list[Call], tuple[int, ...], int, int]] = {
    # name: steps, steps without <thinking>, violated condition, at step
    "no_reasoning": ([list_tools(), SEARCH, SUBSCRIBE, answer("Done.")], (1,), 1, 1),
    "a_call_before_list_tools": ([SEARCH, SUBSCRIBE, answer("Done.")], (), 4, 0),
    "list_tools_twice": ([list_tools(), list_tools("List them again."), SUBSCRIBE,
                          answer("Done.")], (), 4, 1),
    "a_tool_list_tools_did_not_return": (
        [list_tools(), call("delete_my_account", {}), SUBSCRIBE, answer("Done.")], (), 2, 1),
    "arguments_off_the_schema": (
        [list_tools(), call("subscribe_to_channel", {"body": {"channel_id": 1}}),
         SUBSCRIBE, answer("Done.")], (), 3, 1),
    "arguments_that_are_not_json": (
        [list_tools(), call("subscribe_to_channel", '{"channel_id": 1'), SUBSCRIBE,
         answer("Done.")], (), 3, 1),
}


@pytest.mark.parametrize("case", sorted(FORMAT_ERRORS))
def test_a_format_error_gets_minus_one_and_stops_the_rewards(env: Environment, task: Task,
                                                             tmp_path: Path,
                                                             case: str) -> None:
    steps, bare, condition, at = FORMAT_ERRORS[case]
    rollout, outcome, server = play(env, task, steps, "Completed", tmp_path,
                                    no_thinking=bare)
    assert (outcome.check.kind, outcome.check.condition, outcome.check.step) == (
        "format_error", condition, at), outcome.check
    assert outcome.rewards == [0.0] * at + [-1.0] and outcome.reward == -1.0
    assert outcome.judgement is None and judge_requests(server) == []
    assert rollout.trajectory.stopped == "answer"  # the agent went on; AWM's reward stops


def test_without_a_model_the_judge_does_not_run_and_there_is_no_reward(
        env: Environment, task: Task, tmp_path: Path) -> None:
    steps = [list_tools(), SEARCH, SUBSCRIBE, answer("Subscribed.")]
    with serving(rules(steps, "Completed")) as server:
        agent = LLMAgent(client(server, AGENT_MODEL), mode="meta", max_steps=4)
        rollout = run_rollout(env, task, agent, hinted=False)
    outcome = awm_rollout_outcome(task, rollout, CodeJudge(LLMClient(None)))
    assert outcome.check.ok and outcome.judgement is not None
    assert outcome.judgement.status == "not_run" and outcome.rewards is None
    assert outcome.reward is None


def test_model_rollouts_run_the_gates_a_task_without_a_solution_needs(
        env: Environment, task: Task) -> None:
    """AWM ships no reference solution: scripted rollouts cannot attempt the task, so
    gates 3-4 stay not_run (undecided); a model's rollouts let them run."""
    scripted = check_task(GateRun(env=env, rollouts=lambda t: scripted_rollouts(env, t)),
                          task)
    assert not scripted.accepted and render_report(scripted).startswith(
        f"task {SCENARIO}-task-0: UNDECIDED")
    steps = [list_tools(), SEARCH, SUBSCRIBE, answer("Subscribed.")]
    config = DifficultyConfig(intervals=(("hard", 0, 1), ("medium", 2, 2), ("easy", 3, 3)),
                              live_test_n=3)
    with serving(rules(steps, "Completed")) as server:
        agent = LLMAgent(client(server, AGENT_MODEL), mode="meta", max_steps=4)
        report = check_task(GateRun(env=env, config=config, rollouts=lambda t: agent_rollouts(
            env, t, agent, n=3, hinted=0)), task)
    got = {r.gate: (r.status, r.reason) for r in report.rounds[-1]}
    assert got["initially_unsatisfied"][0] == "passed"
    assert got["solvability"][0] == "passed" and got["difficulty"] == (
        "passed", "k = 3 of 3: easy")
    assert got["judge_consistency"][0] == got["counterfactual_probe"][0] == "not_run"
    assert report.accepted and report.difficulty == "easy"


def test_the_agent_refuses_an_unknown_mode() -> None:
    with pytest.raises(ConfigError, match="mode must be 'tools' or 'meta'"):
        LLMAgent(LLMClient(None), mode="gui")  # type: ignore[arg-type]
    assert LLMAgent(LLMClient(None), mode="meta").system_prompt.count("list_tools") == 1
