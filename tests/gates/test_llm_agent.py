"""The LLM agent on the demo world: a scripted model behind a loopback server drives real
instances (MCP tools in-process, the shell in the bubblewrap sandbox) through litellm."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gates.contract import AnswerStep, ShellStep, ToolStep
from gates.llm_agent import MAX_INVALID_STEPS, OBSERVATION_LIMIT, LLMAgent
from gates.rollout import run_rollout
from gates.task import Task, load_task
from replay import Worlds
from tests.support.llm_server import FIXTURES, LoopbackLLM, load_script, serving
from worldenv.core.episode import FileChange, ShellCall, ToolCall
from worldenv.instances.instance import Environment, Instance
from worldllm.client import LLMClient
from worldllm.errors import NoModel
from worldstore.errors import ConfigError

DEMO = Path(__file__).resolve().parents[2] / "packs" / "demo" / "world" / "lars.jsonl"
TITLE = "Nordlys Studio - Fjellrommet brief"


@pytest.fixture(scope="module")
def worlds(demo_worlds: Worlds) -> Worlds:
    return demo_worlds


@pytest.fixture(scope="module")
def env(worlds: Worlds) -> Iterator[Environment]:
    with Environment(worlds) as environment:
        yield environment


@pytest.fixture
def inst(env: Environment) -> Iterator[Instance]:
    with env.open("lars@7") as instance:
        yield instance


@pytest.fixture(scope="module")
def task() -> Task:
    return load_task(FIXTURES / "fjellrommet-title")


def agent_for(server: LoopbackLLM, **options: Any) -> LLMAgent:
    client = LLMClient("openai/scripted", api_base=server.url, api_key="sk-loopback",
                       num_retries=0, timeout=30)
    return LLMAgent(client, **options)


def test_the_agent_solves_a_task_through_mcp_and_the_shell(inst: Instance, task: Task) -> None:
    with serving(load_script("agent_solves")) as server:
        trajectory = agent_for(server).run(inst, task, hinted=False)
    assert trajectory.stopped == "answer" and trajectory.format_error is None
    assert trajectory.answer is not None and TITLE in trajectory.answer
    assert [type(t.step) for t in trajectory.turns] == [ToolStep, ShellStep, AnswerStep]
    assert not any(t.is_error for t in trajectory.turns)
    assert trajectory.turns[0].reasoning == (
        "<thinking>Find the brief among the notes first.</thinking>")
    assert TITLE in trajectory.turns[0].observation

    calls = inst.episode.calls
    assert [type(c) for c in calls] == [ToolCall, ShellCall]
    search, shell = calls
    assert isinstance(search, ToolCall) and isinstance(shell, ShellCall)
    assert (search.tool, search.arguments, search.is_error) == (
        "notes_search_notes", {"query": "Fjellrommet"}, False)
    assert shell.exit_code == 0 and "summary.txt" in shell.command
    written = [e for e in inst.episode.events if isinstance(e, FileChange)]
    assert [(e.path, e.data) for e in written] == [("summary.txt", f"{TITLE}\n".encode())]

    first = server.requests[0]
    offered = {t["function"]["name"] for t in first["tools"]}
    assert {"shell", "answer", "notes_search_notes"} <= offered
    assert len(offered) == len(inst.list_tools()) + 2
    assert first["temperature"] == 0.0
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert first["messages"][1]["content"] == task.spec.instruction


def test_the_llm_agents_rollout_passes_the_tasks_verifier(env: Environment, task: Task
                                                          ) -> None:
    with serving(load_script("agent_solves")) as server:
        rollout = run_rollout(env, task, agent_for(server), hinted=False)
    assert rollout.verdict.passed, rollout.verdict
    assert rollout.agent == "llm:openai/scripted"
    assert sorted(rollout.interfaces_used) == ["mcp", "shell"]


def test_a_hinted_rollout_tells_the_model_the_hint(inst: Instance, task: Task) -> None:
    with serving(load_script("agent_solves")) as server:
        agent_for(server).run(inst, task, hinted=True)
    assert server.requests[0]["messages"][1]["content"] == task.instruction(hinted=True)
    assert task.hint.strip() in server.requests[0]["messages"][1]["content"]


def test_bad_calls_are_recorded_and_the_model_recovers(inst: Instance, task: Task) -> None:
    with serving(load_script("agent_recovers")) as server:
        trajectory = agent_for(server).run(inst, task, hinted=False)
    malformed, rejected, good, answer = trajectory.turns
    assert malformed.is_error and malformed.step == ToolStep(tool="notes_get_note")
    assert malformed.observation.startswith("Not executed: the arguments of 'notes_get_note' "
                                            "are not valid JSON")
    assert rejected.is_error and "note_id" in rejected.observation  # the instance's refusal
    assert not good.is_error and TITLE in good.observation
    assert answer.step == AnswerStep(text=TITLE)
    assert trajectory.stopped == "answer" and trajectory.format_error is None
    # The malformed call never reached the instance; the rejected one did.
    tools = [(c.arguments, c.is_error) for c in inst.episode.calls if isinstance(c, ToolCall)]
    assert tools == [({"note_id": "four"}, True), ({"note_id": 4}, False)]
    second = server.requests[1]["messages"]
    assert second[-1]["role"] == "tool" and second[-1]["content"].startswith("[error] ")


def test_steps_without_an_executable_call_end_in_a_format_error(inst: Instance, task: Task
                                                                ) -> None:
    with serving(load_script("agent_format_failure")) as server:
        trajectory = agent_for(server).run(inst, task, hinted=False)
    assert len(server.requests) == MAX_INVALID_STEPS == 3
    assert trajectory.stopped == "format_error"
    assert trajectory.format_error is not None
    assert trajectory.format_error.startswith("3 steps in a row without an executable")
    assert "'shell' takes exactly one argument 'command'" in trajectory.format_error
    unknown, bad_shell = trajectory.turns  # the step without any call made no turn
    assert unknown.step == ToolStep(tool="delete_everything") and unknown.is_error
    assert "there is no tool 'delete_everything'" in unknown.observation
    assert bad_shell.step == ToolStep(tool="shell") and bad_shell.is_error
    assert inst.episode.events == []
    nudge = server.requests[2]["messages"][-1]
    assert nudge["role"] == "user" and "did not call a tool" in nudge["content"]


def test_the_window_keeps_the_most_recent_steps_and_the_step_limit_stops(
        inst: Instance, task: Task) -> None:
    forever = [{"when": {}, "reply": {"content": "<thinking>Look again.</thinking>",
                                      "tool_calls": [{"name": "notes_list_notebooks"}]}}]
    with serving(forever) as server:
        trajectory = agent_for(server, window=2, max_steps=4).run(inst, task, hinted=False)
    assert trajectory.stopped == "step_limit" and trajectory.answer is None
    assert len(trajectory.turns) == 4 and len(inst.episode.calls) == 4
    sent = [r["messages"] for r in server.requests]
    assert [len(m) for m in sent] == [2, 4, 6, 6]  # system + task + 2 messages per kept step
    for messages in sent:
        assert [m["role"] for m in messages[:2]] == ["system", "user"]
    assert sent[3][2:4] == sent[2][4:6]  # the oldest kept step slid out, the rest kept
    assert sent[3][2] != sent[2][2]


def test_long_observations_are_cut_for_the_model_but_kept_whole(inst: Instance, task: Task
                                                                ) -> None:
    rules: list[dict[str, Any]] = [
        {"when": {"last_role": "tool"}, "reply": {"tool_calls": [
            {"name": "answer", "arguments": {"text": "done"}}]}},
        {"when": {}, "reply": {"tool_calls": [
            {"name": "shell", "arguments": {"command": "seq 1 3000"}}]}},
    ]
    with serving(rules) as server:
        trajectory = agent_for(server).run(inst, task, hinted=False)
    whole = trajectory.turns[0].observation
    assert whole.endswith("2999\n3000\n") and len(whole) > OBSERVATION_LIMIT
    shown = server.requests[1]["messages"][-1]["content"]
    assert shown.startswith("1\n2\n") and shown.endswith(
        f"[... {len(whole) - OBSERVATION_LIMIT} more characters cut]")


def test_no_model_propagates_and_leaves_the_world_alone(inst: Instance, task: Task) -> None:
    agent = LLMAgent(LLMClient(None))
    assert agent.name == "llm:none"
    with pytest.raises(NoModel):
        agent.run(inst, task, hinted=False)
    assert inst.episode.events == []


def test_the_window_and_step_limit_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="window"):
        LLMAgent(LLMClient(None), window=0)
    with pytest.raises(ConfigError, match="max_steps"):
        LLMAgent(LLMClient(None), max_steps=0)
