"""The papers' evaluation protocols (``eval run --protocol awm|wildawm``): what the LLM
agent sends and keeps, seen by the loopback OpenAI-compatible server at the end of
litellm's real call path; the protocol in a run's identity; compaction as the RL loop
does it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from eval.protocols import AWM, PROTOCOLS, WILDAWM, WILDAWM_CONTEXT
from eval.runner import EvalConfig, configured_agent
from gates.compaction import COMPACT_PROMPT, compaction_prompt, summary_message
from gates.llm_agent import LLMAgent, Sampling
from gates.task import load_task
from packs.registry import load_pack
from replay import Worlds
from rl import config as rl_config
from tests.support.cli_harness import invoke, refused
from tests.support.llm_server import FIXTURES, serving
from worldctl.eval import eval_run
from worldenv.instances.instance import Environment
from worldllm.client import LLMClient, build_request

LLM_ENV = {"WORLDCTL_LLM_API_KEY": "sk-loopback", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
TITLE = "Nordlys Studio - Fjellrommet brief"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    location = str(tmp_path_factory.mktemp("protocols") / "store")
    assert invoke("--store", location, "import", *map(str, load_pack("demo").worlds)
                  ).exit_code == 0
    return location


@pytest.fixture(scope="module")
def mcp_task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fjellrommet-title asking for the services' tools only (AWM's tasks are MCP-only):
    the meta-tool mode can offer everything it needs."""
    folder = tmp_path_factory.mktemp("tasks") / "fjellrommet-title"
    shutil.copytree(FIXTURES / "fjellrommet-title", folder)
    spec = json.loads((folder / "task.json").read_text(encoding="utf-8"))
    spec["interfaces"] = ["mcp"]
    spec["subtasks"] = [s for s in spec["subtasks"] if s["interface"] == "mcp"]
    (folder / "task.json").write_text(json.dumps(spec), encoding="utf-8")
    solution = json.loads((folder / "solution.json").read_text(encoding="utf-8"))
    solution["steps"] = [s for s in solution["steps"] if s["kind"] != "shell"]
    (folder / "solution.json").write_text(json.dumps(solution), encoding="utf-8")
    return folder


def meta_rules(calls: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """A model that lists the tools, makes `calls` through call_tool, then answers; each
    reply carries a marker the next rule keys on."""
    steps = [("list_tools", {}), *(("call_tool", {"tool_name": n, "arguments": a})
                                   for n, a in calls), ("answer", {"text": TITLE})]
    rules: list[dict[str, Any]] = []
    for i, (tool, arguments) in reversed(list(enumerate(steps))):
        when: dict[str, Any] = {"any_contains": f"[step {i - 1}]"} if i else {
            "last_role": "user"}
        rules.append({"when": when, "reply": {
            "content": f"<thinking>Step {i}.</thinking>[step {i}]",
            "tool_calls": [{"name": tool, "arguments": arguments}]}})
    return rules


def test_the_awm_protocol_samples_as_the_paper_and_keeps_the_list_tools_exchange(
        store: str, mcp_task: Path, tmp_path: Path) -> None:
    calls: list[tuple[str, dict[str, Any]]] = [("notes_search_notes", {"query": "Fjellrommet"}),
             ("notes_get_note", {"note_id": 4}), ("notes_get_note", {"note_id": 1}),
             ("notes_list_notebooks", {})]
    out = tmp_path / "awm"
    with serving(meta_rules(calls)) as server:
        ran = invoke("--store", store, "eval", "run", str(mcp_task), "--agent",
                     "llm:openai/scripted", "--api-base", server.url, "-k", "1",
                     "--protocol", "awm", "--history", "2", "--out", str(out), "--json",
                     env=LLM_ENV)
    assert ran.exit_code == 0, ran.stderr
    run = json.loads(ran.stdout)["run"]
    # the protocol's step limit; the explicit --history wins over its window of 10
    assert (run["protocol"], run["max_steps"], run["history"]) == ("awm", 20, 2)
    requests = server.requests
    assert len(requests) == len(calls) + 2
    for body in requests:  # what reached the server, through litellm
        assert (body["temperature"], body["top_p"], body["top_k"]) == (0.6, 0.95, 20)
        assert [t["function"]["name"] for t in body["tools"]] == [
            "list_tools", "call_tool", "answer"]
    # the last request: system, task, the list_tools exchange, then the 2 latest steps
    last = requests[-1]["messages"]
    assert [m["role"] for m in last] == ["system", "user", *["assistant", "tool"] * 3]
    assert last[2]["tool_calls"][0]["function"]["name"] == "list_tools"
    assert [m["content"] for m in last if m["role"] == "assistant"] == [
        "[step 0]", f"[step {len(calls) - 1}]", f"[step {len(calls)}]"]

    # the protocol is part of the run's configuration: another one is refused on resume
    for other in ([], ["--protocol", "wildawm"]):
        line = refused(invoke("--store", store, "eval", "run", str(mcp_task), "--agent",
                              "llm:openai/scripted", "-k", "1", "--history", "2",
                              *other, "--out", str(out), env=LLM_ENV))
        assert "this folder holds run" in line


def test_a_protocol_is_refused_where_it_cannot_run(store: str) -> None:
    # AWM's meta-tool mode offers the services' tools only: the demo's tasks need the shell
    line = refused(invoke("--store", store, "eval", "run", "demo", "--agent",
                          "llm:openai/scripted", "--protocol", "awm", env=LLM_ENV))
    assert "needs" in line and "shell" in line and "--protocol awm" in line
    line = refused(invoke("--store", store, "eval", "run", "demo", "--agent",
                          "scripted:reference", "--protocol", "wildawm"))
    assert "scripted" in line and "--protocol wildawm" in line


def test_the_protocols_are_the_papers() -> None:
    assert (AWM.mode, AWM.sampling, AWM.max_steps, AWM.history, AWM.compact_at) == (
        "meta", Sampling(temperature=0.6, top_p=0.95, top_k=20), 20, 10, 0)
    assert (WILDAWM.mode, WILDAWM.max_steps, WILDAWM.history, WILDAWM.context) == (
        "tools", 256, 0, 102_400)
    # compacted where training compacts: a policy is evaluated on the contexts it learned
    assert WILDAWM.compact_at == int(WILDAWM_CONTEXT * rl_config.COMPACT_FRACTION) == 76_800
    # the command line offers exactly these (named there without importing the library)
    choice = next(p for p in eval_run.params if p.name == "protocol_name")
    assert sorted(choice.type.choices) == sorted(PROTOCOLS)  # type: ignore[attr-defined]
    # explicit limits win over the protocol's
    assert WILDAWM.limits(512, None) == (512, 0) and AWM.limits(None, None) == (20, 10)

    agent = configured_agent(EvalConfig(agent="llm:openai/scripted", protocol="wildawm",
                                  max_steps=512, history=0))
    assert isinstance(agent, LLMAgent)
    assert (agent.mode, agent.window, agent.max_steps, agent.compact_at) == (
        "tools", None, 512, WILDAWM.compact_at)
    awm = configured_agent(EvalConfig(agent="llm:openai/scripted", protocol="awm", history=10))
    assert isinstance(awm, LLMAgent)
    assert (awm.mode, awm.window, awm.sampling) == ("meta", 10, AWM.sampling)
    # without top_p and top_k a request is the one recorded before they existed
    plain = build_request("openai/x", [{"role": "user", "content": "hi"}], None, None, 0.0, 8)
    assert "top_p" not in plain and "top_k" not in plain


def test_compaction_summarises_the_context_and_goes_on_from_the_summary(
        store: str) -> None:
    """WildAWM's compaction in the LLM agent: past `compact_at` tokens (the provider's
    count: the loopback server counts words) a call without tools summarises the context
    with the RL loop's prompt, and the next step sees system prompt, task and summary."""
    summary = f"Note 4 is the brief; its title is {TITLE}."
    rules = [
        {"when": {"has_tools": False}, "reply": {"content": summary}},
        {"when": {"last_role": "user", "last_contains": "Summary of the work so far"},
         "reply": {"content": "<thinking>The summary has it.</thinking>",
                   "tool_calls": [{"name": "answer", "arguments": {"text": TITLE}}]}},
        {"when": {"last_role": "user", "last_contains": "Fjellrommet"},
         "reply": {"content": "<thinking>Search the notes.</thinking>",
                   "tool_calls": [{"name": "notes_search_notes",
                                   "arguments": {"query": "Fjellrommet"}}]}},
    ]
    task = load_task(FIXTURES / "fjellrommet-title")
    with Worlds.open(store) as worlds, Environment(worlds) as env, \
            env.open(task.spec.world_hash) as inst, serving(rules) as server:
        client = LLMClient("openai/scripted", api_base=server.url, api_key="sk-loopback",
                           num_retries=0, timeout=30)
        agent = LLMAgent(client, window=None, compact_at=50,
                         sampling=Sampling(temperature=0.6, top_p=0.95, top_k=20))
        trajectory = agent.run(inst, task, hinted=False)
    assert trajectory.stopped == "answer" and trajectory.answer == TITLE
    first, compaction, after = server.requests
    assert not compaction.get("tools")
    # the RL loop's request: its prompt, then everything after the system prompt (the
    # task, the step and its result) as the transcript
    transcript = json.loads(compaction["messages"][1]["content"])
    assert compaction["messages"] == compaction_prompt(transcript)
    assert compaction["messages"][0]["content"] == COMPACT_PROMPT
    assert [m["role"] for m in transcript] == ["user", "assistant", "tool"]
    assert transcript[0] == first["messages"][1] and TITLE in transcript[2]["content"]
    assert (compaction["temperature"], compaction["top_p"], compaction["top_k"]) == (
        0.6, 0.95, 20)
    assert after["messages"] == [*first["messages"][:2], summary_message(summary)]
