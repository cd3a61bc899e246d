"""One rendering of what the model sees (``worldenv.protocol``): the same actions through
every surface, the same bytes.

The surfaces, each on its real path: the LLM agent (litellm's real call path to the
loopback OpenAI-compatible server, whose requests are what the model was sent), the verl
agent loop (verl's own worker over ``rl.world``, a scripted token server, the tiny local
tokenizer: the prompts it generated from, decoded), the gateway (a real uvicorn server:
MCP through the real fastmcp client, REST's ``/shell`` and OpenEnv's ``step``), a lone
instance's MCP server (``worldenv.serving.mcp``, in memory), the Gym wrapper
(``worldenv.serving.gym``) and the SFT rows (the conversation of the LLM agent's
episode). The actions: tool calls that succeed and that fail (refused by the tool, and
against its schema), shell commands (UTF-8 output, a failure, an output past the limit),
an unknown tool, bad arguments, arguments that are not JSON; in meta mode ``list_tools``
and ``call_tool`` (succeeding, failing, its arguments as text, an unknown tool, arguments
that are not JSON).

Where a surface cannot take an action the test says so: the RL loop stops a rollout at its
first call that cannot be executed (WildAWM's format failure; AWM's format rules in meta
mode), so the model is never shown one; an MCP client sends arguments as a JSON object;
the SFT rows hold what reached the instance; Gym, REST and OpenEnv take actions a program
wrote (a malformed one is the program's error, not an observation), so they take the
actions that reach the instance, and ``call_tool``'s arguments as an object.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import msgspec
import pytest
from fastmcp import Client
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

from gates.contract import AnswerStep, Step, ToolStep
from gates.llm_agent import LLMAgent
from gates.task import Task, load_task
from packs.registry import load_pack
from replay import Worlds
from rl.dataset import prompt_messages, rl_rows
from rl.sft import episode_messages, offered_tools
from tests.support.asgi_server import served
from tests.support.llm_server import serving
from tests.support.rl_harness import (
    ScriptedServer,
    batch_of,
    call_text,
    demo_store,
    tiny_model,
    tokenizer_of,
)
from tests.support.rl_harness import verl_config as verl_config_of
from worldenv.instances.instance import Environment
from worldenv.protocol.observation import (
    OBSERVATION_LIMIT,
    catalogue,
    not_executed,
    shown,
    tool_schemas,
    unknown_tool,
)
from worldenv.serving.gateway import Gateway
from worldenv.serving.gym import WorldEnv
from worldenv.serving.mcp import instance_server
from worldllm.client import LLMClient

PACK = load_pack("demo")
TASK_ID = "nordlys-cart-vs-bom"  # lars@3, mcp and shell, in the rl split (the loop's rows)
LONG = OBSERVATION_LIMIT + 1000


@dataclass(frozen=True)
class Action:
    """One call as a model writes it. `executed`: it reaches the instance (and so the
    episode, and the SFT rows); `over_mcp`: an MCP client can make it."""

    name: str
    arguments: dict[str, Any] | str
    executed: bool = True
    over_mcp: bool = True


TOOLS_ACTIONS = [
    Action("shop_get_cart", {}),                                  # succeeds
    Action("delete_everything", {}, executed=False),              # an unknown tool
    Action("notes_get_note", {"note_id": 999}),                   # the tool refuses it
    Action("shell", {"cmd": "ls"}, executed=False),               # bad arguments
    Action("notes_get_note", {"note_id": "x"}),                   # against its schema
    Action("notes_get_note", "{nope", executed=False, over_mcp=False),  # not JSON
    Action("shell", {"command": "ls; printf 'Smørbrød ✓\\n'"}),   # UTF-8 output
    Action("shell", {"command": "echo oops >&2; exit 3"}),        # fails
    Action("shell", {"command": f"head -c {LONG} /dev/zero | tr '\\0' a"}),  # cut
]
META_ACTIONS = [
    Action("list_tools", {}),
    Action("call_tool", {"tool_name": "shop_get_cart", "arguments": {}}),
    Action("call_tool", {"tool_name": "notes_get_note", "arguments": {"note_id": 999}}),
    Action("call_tool", {"tool_name": "notes_get_note", "arguments": '{"note_id": 1}'}),
    Action("call_tool", {"tool_name": "no_such_tool", "arguments": {}}),
    Action("call_tool", {"tool_name": "notes_get_note", "arguments": "{nope"},
           executed=False),
]
ANSWER = Action("answer", {"text": "done"})


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The demo pack's worlds in a store the RL loop's runtime opens too."""
    with demo_store(tmp_path_factory.mktemp("observation")) as location:
        yield location


@pytest.fixture(scope="module")
def env(store: Path) -> Iterator[Environment]:
    with Worlds.open(store) as worlds, Environment(worlds) as environment:
        yield environment


@pytest.fixture(scope="module")
def task() -> Task:
    return load_task(PACK.task_dir(TASK_ID))


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="module")
def gateway_url(env: Environment) -> Iterator[str]:
    with served(Gateway(env)) as url:
        yield url


# --- the LLM agent ---------------------------------------------------------------------


def model_rules(actions: list[Action]) -> list[dict[str, Any]]:
    """A loopback model that makes `actions` one per request, then answers (each reply
    carries a marker the next rule keys on)."""
    steps = [*actions, ANSWER]
    rules: list[dict[str, Any]] = []
    for i, action in reversed(list(enumerate(steps))):
        when: dict[str, Any] = {"any_contains": f"[step {i - 1}]"} if i else {
            "last_role": "user"}
        rules.append({"when": when, "reply": {
            "content": f"<thinking>Step {i}.</thinking>[step {i}]",
            "tool_calls": [{"name": action.name, "arguments": action.arguments}]}})
    return rules


@dataclass
class AgentRun:
    first: dict[str, Any]  # the first request: system prompt, task, tools
    tool_messages: list[str]  # every tool message's content, in order
    episode: Any


def run_agent(env: Environment, task: Task, actions: list[Action], mode: str
              ) -> AgentRun:
    with serving(model_rules(actions)) as server, env.open(task.spec.world_hash) as inst:
        client = LLMClient("openai/scripted", api_base=server.url, api_key="sk-loopback",
                           num_retries=0, timeout=60)
        agent = LLMAgent(client, window=None, max_steps=len(actions) + 1,
                         mode=mode)  # type: ignore[arg-type]
        trajectory = agent.run(inst, task, hinted=False)
        assert trajectory.stopped == "answer", trajectory.format_error
        last = server.requests[-1]["messages"]
        return AgentRun(server.requests[0], [m["content"] for m in last
                                             if m["role"] == "tool"], inst.episode)


# --- the gateway -----------------------------------------------------------------------


async def over_mcp(server: Any, actions: list[Action]
                   ) -> tuple[list[dict[str, Any]], list[str]]:
    """The tools an MCP server offers (as function schemas) and, per action, the result as
    the agents show it (``shown`` of its text and error flag); `server` is the gateway's
    URL or a server object, which fastmcp's client reaches in memory."""
    async with Client(server, timeout=60) as client:
        offered = [{"type": "function", "function": {
            "name": t.name, "description": t.description, "parameters": t.input_schema}}
            for t in await client.list_tools()]
        seen = []
        for action in actions:
            assert isinstance(action.arguments, dict)
            result = await client.call_tool(action.name, action.arguments,
                                             raise_on_error=False)
            text = result.content[0].text
            seen.append(shown(text, result.is_error, whole=action.name == "list_tools"))
    return offered, seen


def create(url: str, **body: Any) -> str:
    made = httpx2.post(f"{url}/instances", json=body, timeout=60)
    assert made.status_code == 201, made.text
    return f"{url}{made.json()['mcp_url']}"


def over_json(url: str, actions: list[Action]) -> tuple[list[str], list[str]]:
    """Per action, OpenEnv's step observation as the agents show it; and per shell
    command, REST's ``/shell`` answer the same way (a second instance of the world)."""
    stepped = []
    for action in actions:
        answer = httpx2.post(f"{url}/openenv/step", json={"action": json_action(action)},
                             timeout=60)
        assert answer.status_code == 200, answer.text
        seen = answer.json()["observation"]
        stepped.append(shown(seen["text"], seen["is_error"],
                             whole=action.name == "list_tools"))
    rest = []
    other = create(url.rsplit("/instances/", 1)[0], world="lars@3", shell=True)
    base = other.removesuffix("/mcp")
    for action in actions:
        if action.name == "shell":
            assert isinstance(action.arguments, dict)
            answer = httpx2.post(f"{base}/shell", json=action.arguments, timeout=60)
            assert answer.status_code == 200, answer.text
            rest.append(shown(answer.json()["observation"], answer.json()["is_error"]))
    return stepped, rest


def json_action(action: Action) -> dict[str, Any]:
    """An action as a program writes it for Gym and OpenEnv."""
    assert isinstance(action.arguments, dict)
    if action.name == "shell":
        return {"shell": action.arguments["command"]}
    if action.name == "list_tools":
        return {"type": "list_tools"}
    if action.name == "call_tool":
        return {"type": "call_tool", **action.arguments}
    return {"tool": action.name, "arguments": action.arguments}


def over_gym(env: Environment, world: str, actions: list[Action]) -> list[str]:
    """Per action, the Gym wrapper's observation as the agents show it."""
    gym = WorldEnv(env, world, max_steps=len(actions) + 1)
    try:
        gym.reset()
        seen = []
        for action in actions:
            observation, _reward, done, _truncated, _info = gym.step(json_action(action))
            assert not done
            seen.append(shown(observation["text"], observation["is_error"],
                              whole=action.name == "list_tools"))
        return seen
    finally:
        gym.close()


def over_lone_mcp(env: Environment, world: str, actions: list[Action], mode: str
                  ) -> tuple[list[dict[str, Any]], list[str]]:
    """A lone instance's MCP server (in memory) offering what the agents offer."""
    with env.open(world) as instance:
        return asyncio.run(over_mcp(instance_server(
            instance, mode, shell=mode == "tools", answer=True), actions))  # type: ignore[arg-type]


# --- the verl loop ---------------------------------------------------------------------


def loop_step(action: Action) -> Step:
    assert isinstance(action.arguments, dict)  # the loop's model writes JSON objects here
    if action.name == "answer":
        return AnswerStep(text=str(action.arguments["text"]))
    return ToolStep(tool=action.name, arguments=action.arguments)


def run_loop(model: Path, row: dict[str, Any], actions: list[Action]
             ) -> tuple[str, list[str], Any]:
    """verl's worker on one row whose model writes `actions` then answers: the text of
    its first prompt, the tool responses in its last prompt, and the output batch."""
    steps = [*actions, ANSWER]

    def text(n: int, _prompt: str) -> str:
        written = call_text(loop_step(steps[min(n, len(steps) - 1)]), thought="")
        # AWM's format rule 1 (meta mode) reads <thinking>; it costs tools mode nothing
        return written.replace("<think></think>", "<thinking>Next.</thinking>")

    tokenizer = tokenizer_of(model)
    server = ScriptedServer(tokenizer, lambda _k, _p: text)
    worker = AgentLoopWorker(verl_config_of(model), server)  # type: ignore[arg-type]
    output = asyncio.run(worker.generate_sequences(batch_of([row])))
    [prompts] = server.prompts.values()
    first, last = str(tokenizer.decode(prompts[0])), str(tokenizer.decode(prompts[-1]))
    responses = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", last, re.DOTALL)
    return first, responses, output


def row_of(mode: str) -> dict[str, Any]:
    """The RL row of the task in `mode` (the dataset would refuse meta mode for a task
    that needs the shell: this one only shows the meta-tools their results)."""
    row = msgspec.json.decode(msgspec.json.encode(
        next(r for r in rl_rows(PACK, "rl") if r["extra_info"]["task_id"] == TASK_ID)))
    row["extra_info"]["mode"] = mode
    row["prompt"] = prompt_messages(load_task(PACK.task_dir(TASK_ID)), mode)  # type: ignore[arg-type]
    return dict(row)


# --- the tests ---------------------------------------------------------------------------


def test_tools_mode_shows_the_same_bytes_on_every_surface(
        env: Environment, task: Task, model: Path, gateway_url: str) -> None:
    agent = run_agent(env, task, TOOLS_ACTIONS, "tools")
    shown_by_agent = agent.tool_messages
    assert len(shown_by_agent) == len(TOOLS_ACTIONS)
    with env.open(task.spec.world_hash) as inst:
        expected_tools = tool_schemas(inst.list_tools())
    assert agent.first["tools"] == expected_tools
    # what the agent was shown, spot-checked against the rendering functions
    assert shown_by_agent[1] == "[error] " + not_executed(unknown_tool(
        "delete_everything", [t["function"]["name"] for t in expected_tools]))
    assert "Smørbrød ✓" in shown_by_agent[6] and shown_by_agent[7].startswith("[error] ")
    assert shown_by_agent[8] == "a" * OBSERVATION_LIMIT + "\n[... 1000 more characters cut]"

    # the gateway: MCP's tools and results, rendered by the same functions
    url = create(gateway_url, world="lars@3", shell=True, answer=True)
    mcp_actions = [a for a in TOOLS_ACTIONS if a.over_mcp]
    offered, over_gateway = asyncio.run(over_mcp(url, mcp_actions))
    assert offered == expected_tools
    assert over_gateway == [s for a, s in zip(TOOLS_ACTIONS, shown_by_agent, strict=True)
                            if a.over_mcp]

    # the gateway's OpenEnv and REST, Gym and a lone MCP server: what reaches the instance
    executed_shown = [s for a, s in zip(TOOLS_ACTIONS, shown_by_agent, strict=True)
                      if a.executed]
    executed_actions = [a for a in TOOLS_ACTIONS if a.executed]
    stepped, rest = over_json(url.removesuffix("/mcp"), executed_actions)
    assert stepped == executed_shown
    assert rest == [s for a, s in zip(executed_actions, executed_shown, strict=True)
                    if a.name == "shell"]
    assert over_gym(env, task.spec.world_hash, executed_actions) == executed_shown
    lone_offered, lone = over_lone_mcp(env, task.spec.world_hash, mcp_actions, "tools")
    assert lone_offered == expected_tools
    assert lone == [s for a, s in zip(TOOLS_ACTIONS, shown_by_agent, strict=True)
                    if a.over_mcp]

    # the SFT rows: the conversation of the agent's episode, and the tools column
    sft = [m["content"] for m in episode_messages(task, agent.episode) if m["role"] == "tool"]
    assert sft == [s for a, s in zip(TOOLS_ACTIONS, shown_by_agent, strict=True)
                   if a.executed]
    assert offered_tools(env, task.spec.world_hash) == expected_tools

    # the RL loop: the same first prompt (template of the agent's system prompt, task and
    # tools), the same tool responses, and a stop at the first call it cannot execute
    executed = [a for a in TOOLS_ACTIONS if a.executed]
    refused = next(a for a in TOOLS_ACTIONS if not a.executed)
    first, responses, output = run_loop(model, row_of("tools"), [*executed, refused])
    tokenizer = tokenizer_of(model)
    assert first == tokenizer.apply_chat_template(
        agent.first["messages"], tools=agent.first["tools"], tokenize=False,
        add_generation_prompt=True)
    assert responses == [s for a, s in zip(TOOLS_ACTIONS, shown_by_agent, strict=True)
                         if a.executed]
    assert list(output.non_tensor_batch["format_error"]) == [1]


def test_meta_mode_shows_the_same_catalogue_and_results_on_every_surface(
        env: Environment, task: Task, model: Path, gateway_url: str) -> None:
    agent = run_agent(env, task, META_ACTIONS, "meta")
    shown_by_agent = agent.tool_messages
    with env.open(task.spec.world_hash) as inst:
        infos = inst.list_tools()
    assert shown_by_agent[0] == catalogue(infos)  # whole (never cut), compact
    assert not shown_by_agent[0].isascii()  # UTF-8 as it is, no ASCII escapes
    assert shown_by_agent[5].startswith("[error] Not executed: arguments are not valid JSON")
    assert agent.first["tools"] == tool_schemas([], mode="meta")

    url = create(gateway_url, world="lars@3", mode="meta", answer=True)
    offered, over_gateway = asyncio.run(over_mcp(url, META_ACTIONS))
    assert offered == agent.first["tools"]
    assert over_gateway == shown_by_agent

    # OpenEnv's list_tools carries the same catalogue's text, and its call_tool (and
    # Gym's) the same results; a lone MCP server the same tools and results
    base = url.removesuffix("/mcp")
    assert httpx2.post(f"{base}/openenv/reset", json={}, timeout=60).status_code == 200
    as_objects = [a for a in META_ACTIONS if a.executed and not isinstance(
        a.arguments.get("arguments"), str)]  # type: ignore[union-attr]
    expected = [s for a, s in zip(META_ACTIONS, shown_by_agent, strict=True)
                if a in as_objects]
    assert len(as_objects) == 4
    stepped, _ = over_json(base, as_objects)
    assert stepped == expected
    assert over_gym(env, task.spec.world_hash, as_objects) == expected
    lone_offered, lone = over_lone_mcp(env, task.spec.world_hash, META_ACTIONS, "meta")
    assert lone_offered == offered
    assert lone == shown_by_agent

    # the RL loop: AWM's format rules stop it at the call_tool of a tool list_tools did
    # not list; up to there, the same bytes
    first, responses, _ = run_loop(model, row_of("meta"), META_ACTIONS[:5])
    tokenizer = tokenizer_of(model)
    assert first == tokenizer.apply_chat_template(
        agent.first["messages"], tools=agent.first["tools"], tokenize=False,
        add_generation_prompt=True)
    assert len(responses) >= 4
    assert responses == shown_by_agent[:len(responses)]
