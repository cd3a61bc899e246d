"""The agent protocol (``worldenv.protocol``): decoding a model's call and a JSON action into
the typed actions, the one catalogue's order, ``execute`` on a real instance, and
``Instance.settle``: one rollout hashes its world once, at the end.

Every surface's bytes are compared in ``tests/worldenv/test_observation.py``; here are the parts
each of them relies on, on the demo world (real store, real instances, real shell).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from gates.agents import reference_agent, step_of
from gates.contract import ToolStep, Trajectory
from gates.rollout import run_rollout
from gates.task import Task, load_task
from replay.engine import Worlds
from worldenv.gui.tools import GUI_TOOLS
from worldenv.instances.episodes import load_episode
from worldenv.instances.instance import Environment, Instance
from worldenv.protocol import (
    Action,
    ActionError,
    AnswerAction,
    GuiAction,
    ListToolsAction,
    MetaCallAction,
    ShellAction,
    ToolAction,
    Unexecutable,
    action_from_json,
    decode_call,
    execute,
    toolset,
    toolset_of,
)
from worldenv.protocol.observation import catalogue, not_executed, unknown_tool

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "packs" / "demo" / "world"
TASK = ROOT / "packs" / "demo" / "tasks" / "mats-work-order"
TOOLS = frozenset({"notes_get_note", "shell", "answer", "gui_click"})
META = frozenset({"list_tools", "call_tool", "answer"})


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Environment]:
    with Worlds.open(tmp_path_factory.mktemp("protocol") / "store") as worlds:
        for world in sorted(DEMO.glob("*.jsonl")):
            worlds.import_file(world)
        with Environment(worlds) as environment:
            yield environment


@pytest.fixture(scope="module")
def task() -> Task:
    return load_task(TASK)


# --- decoding -----------------------------------------------------------------------------


def test_a_models_call_decodes_into_one_action() -> None:
    assert decode_call("notes_get_note", '{"note_id": 3}', TOOLS) == ToolAction(
        "notes_get_note", {"note_id": 3})
    assert decode_call("notes_get_note", {"note_id": 3}, TOOLS) == ToolAction(
        "notes_get_note", {"note_id": 3})  # an MCP client's object
    assert decode_call("shell", '{"command": "ls"}', TOOLS) == ShellAction("ls")
    assert decode_call("answer", '{"text": "42"}', TOOLS) == AnswerAction("42")
    assert decode_call("gui_click", '{"element": 3}', TOOLS) == GuiAction("click",
                                                                          {"element": 3})
    assert decode_call("notes_get_note", " ", TOOLS) == ToolAction("notes_get_note", {})


def test_a_call_that_cannot_be_executed_says_why() -> None:
    unknown = decode_call("rm_rf", "{}", TOOLS)
    assert unknown == Unexecutable("rm_rf", unknown_tool("rm_rf", TOOLS))
    bad_json = decode_call("notes_get_note", "{nope", TOOLS)
    assert isinstance(bad_json, Unexecutable)
    assert bad_json.problem.startswith("the arguments of 'notes_get_note' are not valid JSON")
    listed = decode_call("notes_get_note", "[1]", TOOLS)
    assert isinstance(listed, Unexecutable) and "must be a JSON object" in listed.problem
    shell = decode_call("shell", '{"cmd": "ls"}', TOOLS)
    assert isinstance(shell, Unexecutable) and "exactly one argument 'command'" in shell.problem
    # the trajectory records the call as the model named it, without arguments
    assert step_of(shell) == ToolStep(tool="shell")


def test_meta_mode_decodes_the_meta_tools() -> None:
    assert decode_call("list_tools", "{}", META, mode="meta") == ListToolsAction({})
    as_text = decode_call("call_tool", '{"tool_name": "x", "arguments": "{\\"a\\": 1}"}',
                          META, mode="meta")
    assert as_text == MetaCallAction("x", {"a": 1}, {"tool_name": "x",
                                                     "arguments": '{"a": 1}'})
    # recorded as the meta-call the model wrote (AWM's steps are read from it)
    assert step_of(as_text) == ToolStep(tool="call_tool", arguments={
        "tool_name": "x", "arguments": '{"a": 1}'})
    bad = decode_call("call_tool", '{"tool_name": "x", "arguments": "{nope"}', META,
                      mode="meta")
    assert isinstance(bad, Unexecutable) and bad.written == {"tool_name": "x",
                                                             "arguments": "{nope"}
    assert step_of(bad) == ToolStep(tool="call_tool", arguments=bad.written)
    # in tools mode a tool called call_tool is a tool like any other
    assert decode_call("call_tool", "{}", {"call_tool"}) == ToolAction("call_tool", {})


def test_json_actions_decode_and_misuse_is_refused() -> None:
    assert action_from_json({"tool": "t", "arguments": {"a": 1}}) == ToolAction("t", {"a": 1})
    assert action_from_json({"shell": "ls", "metadata": {}}) == ShellAction("ls")
    assert action_from_json({"gui": {"action": "open", "arguments": {"url": "/"}}}) == \
        GuiAction("open", {"url": "/"})
    assert action_from_json({"answer": ""}) == AnswerAction("")
    assert action_from_json({"type": "list_tools"}) == ListToolsAction()
    called = action_from_json({"type": "call_tool", "tool_name": "t", "arguments": {}})
    assert isinstance(called, MetaCallAction) and called.tool_name == "t"
    for bad, says in [
        ([1], "an action is an object"),
        ({"tool": "t", "shell": "ls"}, "exactly one of tool, shell, gui or answer"),
        ({"type": "delete"}, "exactly one of"),
        ({"tool": "t", "arguments": [1]}, "arguments must be an object"),
        ({"shell": "ls", "cwd": "/"}, "no field 'cwd'"),
        ({"shell": ""}, "shell must be a non-empty string"),
        ({"gui": {"action": "fly"}}, None),  # left to the instance unless checked
    ]:
        if says is None:
            assert action_from_json(bad) == GuiAction("fly")
            with pytest.raises(ActionError, match="unknown GUI action"):
                action_from_json(bad, check_gui=True)
            continue
        with pytest.raises(ActionError, match=says):
            action_from_json(bad)


def test_actions_are_tagged_json() -> None:
    for action in [ToolAction("t", {"a": [1]}), ShellAction("ls"), GuiAction("key"),
                   AnswerAction("x"), ListToolsAction(), MetaCallAction("t", {}),
                   Unexecutable("t", "why")]:
        data = msgspec.json.encode(action)
        assert msgspec.json.decode(data, type=Action) == action
    assert msgspec.json.decode(b'{"type": "list_tools"}',
                               type=Action) == ListToolsAction()


# --- the catalogue --------------------------------------------------------------------------


def test_the_tools_are_offered_in_one_order(env: Environment) -> None:
    with env.open("lars@3") as instance:
        infos = instance.list_tools()
        names = [t.name for t in infos]
        gui = [t.name for t in GUI_TOOLS]
        assert [t.name for t in toolset_of(instance).tools] == [*names, "shell", "answer"]
        assert [t.name for t in toolset_of(instance, gui=True).tools] == [
            *names, *gui, "shell", "answer"]
        meta = toolset_of(instance, mode="meta")
        assert [t.name for t in meta.tools] == ["list_tools", "call_tool", "answer"]
        assert meta.service == tuple(infos)
        assert [t.name for t in toolset(infos, mode="meta", gui=True, shell=True).tools] == [
            "list_tools", "call_tool", *gui, "shell", "answer"]
        assert toolset_of(instance).names == frozenset([*names, "shell", "answer"])
        with pytest.raises(ValueError, match="unknown mode"):
            toolset(infos, mode="both")  # type: ignore[arg-type]


# --- one step ---------------------------------------------------------------------------


def test_execute_does_each_action_on_the_instance(env: Environment) -> None:
    with env.open("lars@3") as instance:
        got = execute(instance, ToolAction("shop_get_cart", {}))
        assert not got.is_error and got.executed and got.text
        refused = execute(instance, ToolAction("notes_get_note", {"note_id": 999}))
        assert refused.is_error and refused.executed
        shell = execute(instance, ShellAction("printf 'x'; echo oops >&2; exit 3"))
        assert shell.text == "x\n[stderr]\noops\n\n[exit 3]" and shell.is_error
        assert shell.structured["exit_code"] == 3
        listed = execute(instance, ListToolsAction())
        assert listed.text == catalogue(instance.list_tools()) and listed.whole
        meta = execute(instance, MetaCallAction("shop_get_cart", {}))
        assert meta.text == got.text
        answered = execute(instance, AnswerAction("done"))
        assert answered.done and answered.answer == "done"
        no = execute(instance, Unexecutable("x", "because"))
        assert no.text == not_executed("because") and no.is_error and not no.executed
        assert no.shown() == "[error] " + not_executed("because")
        # what reached the instance is its episode: the three calls and the command
        assert [c.index for c in instance.episode.calls] == [1, 2, 3, 4]
        assert instance.episode.answer is None  # the surface records the answer


# --- settle: one hash per rollout -----------------------------------------------------------


class Keeping:
    """The reference agent, keeping the instance it ran on (to read its hash count)."""

    def __init__(self) -> None:
        self.agent = reference_agent()
        self.name = self.agent.name
        self.instance: Instance | None = None

    def run(self, instance: Instance, task: Task, *, hinted: bool) -> Trajectory:
        self.instance = instance
        return self.agent.run(instance, task, hinted=hinted)


def test_one_rollout_hashes_its_world_once(env: Environment, task: Task) -> None:
    agent = Keeping()
    rollout = run_rollout(env, task, agent, hinted=False)
    assert agent.instance is not None
    assert agent.instance.hashes == 1  # stored episode, rollout and verifier share it
    assert rollout.verdict.passed, rollout.verdict
    assert load_episode(env.worlds, rollout.episode_id).final_hash == rollout.final_hash


def test_settle_keeps_the_hash_until_the_next_call(env: Environment) -> None:
    with env.open("lars@3") as instance:
        start = instance.settle()
        assert instance.settle() == start and instance.hashes == 1
        assert start == instance.record.world_hash
        instance.call_tool("shop_get_cart", {})  # a read: the hash is the same, recomputed
        assert instance.settle() == start and instance.hashes == 2
        instance.shell("echo x > new.txt")
        changed = instance.settle()
        assert changed != start and instance.hashes == 3
        assert instance.hash() == changed and instance.hashes == 4  # hash(): always anew
        instance.reset()
        assert instance.settle() == start and instance.hashes == 5
