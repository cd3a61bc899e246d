"""Agents in other processes: the gateway as an HTTP-only agent or trainer uses it, on the
bundled demo world and its tasks. A real uvicorn server on a loopback port, plain httpx2
for REST and the real fastmcp client for MCP; the shipped apps, the real sandboxed shell
and the tasks' real verifiers; no mocks.

An agent solves a demo task by replaying its reference solution over HTTP, grades it
over REST (V = 1), and the episode stored when the instance closes grades the same from
the store (``worldctl task verify``'s grading); OpenEnv's reset/step/state drive a task to
done with the grade's reward; idle reaping and shutdown store episodes too.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastmcp import Client

from gates.contract import AnswerStep, ShellStep, Step, ToolStep
from gates.rollout import verify_episode_of_task
from gates.served import load_served_tasks
from gates.task import Task, load_task
from packs.registry import load_pack
from replay import Worlds
from tests.support.asgi_server import served
from tests.worldenv.test_gateway import assert_refused
from worldenv.core.episode import ShellCall, ToolCall
from worldenv.instances.episodes import load_episode, verify_episode
from worldenv.instances.instance import Environment
from worldenv.serving.gateway import Gateway, ServedTask
from worldstore.errors import ConfigError

PACK = load_pack("demo")
TASK_ID = "mats-work-order"  # lars@4; needs the tools and the shell
OTHER_WORLD = "lars@7"


@pytest.fixture(scope="module")
def store_dir(demo_store: Path) -> Path:
    return demo_store  # the shared demo store (tests/conftest.py): every world of the pack


@pytest.fixture(scope="module")
def worlds(demo_worlds: Worlds) -> Worlds:
    return demo_worlds


@pytest.fixture(scope="module")
def env(worlds: Worlds) -> Iterator[Environment]:
    with Environment(worlds) as environment:
        yield environment


@pytest.fixture(scope="module")
def tasks(env: Environment) -> dict[str, ServedTask]:
    return load_served_tasks(env, ["demo"])  # the pack by name, as `serve --tasks demo`


@pytest.fixture(scope="module")
def task() -> Task:
    return load_task(PACK.task_dir(TASK_ID))


@pytest.fixture(scope="module")
def gateway(env: Environment, tasks: dict[str, ServedTask]) -> Gateway:
    return Gateway(env, tasks=tasks, max_instances=16)


@pytest.fixture(scope="module")
def rest(gateway: Gateway) -> Iterator[httpx2.Client]:
    with served(gateway) as base, httpx2.Client(base_url=base, timeout=60) as client:
        yield client


def create(rest: httpx2.Client, **body: Any) -> dict[str, Any]:
    response = rest.post("/instances", json=body)
    assert response.status_code == 201, response.text
    made: dict[str, Any] = response.json()
    return made


def mcp_url(rest: httpx2.Client, made: dict[str, Any]) -> str:
    return f"{rest.base_url}".rstrip("/") + str(made["mcp_url"])


async def over_mcp(url: str, calls: list[tuple[str, dict[str, Any]]]
                   ) -> tuple[list[str], list[Any]]:
    async with Client(url, timeout=60) as client:
        names = sorted(t.name for t in await client.list_tools())
        results = [await client.call_tool(n, a, raise_on_error=False) for n, a in calls]
    return names, results


def mcp_call(step: Step) -> tuple[str, dict[str, Any]]:
    """A reference step as an MCP call: a service tool, or the shell / answer tool."""
    if isinstance(step, ToolStep):
        return step.tool, dict(step.arguments)
    if isinstance(step, ShellStep):
        return "shell", {"command": step.command}
    assert isinstance(step, AnswerStep)
    return "answer", {"text": step.text}


def openenv_action(step: Step) -> dict[str, Any]:
    if isinstance(step, ToolStep):
        return {"tool": step.tool, "arguments": dict(step.arguments)}
    if isinstance(step, ShellStep):
        return {"shell": step.command}
    assert isinstance(step, AnswerStep)
    return {"answer": step.text}


# --- an agent solves a task over HTTP -----------------------------------------------------


def test_an_http_agent_solves_a_demo_task(rest: httpx2.Client, worlds: Worlds,
                                          task: Task) -> None:
    made = create(rest, task=TASK_ID, agent="http:reference")
    assert (made["task"], made["agent"], made["shell"], made["answer"]) == (
        TASK_ID, "http:reference", True, True)
    assert made["world_hash"] == task.spec.world_hash  # the task's world, without "world"
    steps = task.solution.steps
    first_shell = next(i for i, s in enumerate(steps) if isinstance(s, ShellStep))
    # Everything over MCP except the first shell command, which goes over REST.
    before, after = steps[:first_shell], steps[first_shell + 1:]
    names, results = asyncio.run(over_mcp(mcp_url(rest, made), [mcp_call(s) for s in before]))
    assert {"shell", "answer", "calendar_list_events"} <= set(names)
    assert not any(r.is_error for r in results)
    step = steps[first_shell]
    assert isinstance(step, ShellStep)
    shell = rest.post(f"/instances/{made['id']}/shell", json={"command": step.command})
    assert shell.status_code == 200 and shell.json()["exit_code"] == 0, shell.text
    assert "NS-2026-03" in shell.json()["observation"]
    _, results = asyncio.run(over_mcp(mcp_url(rest, made), [mcp_call(s) for s in after]))
    assert not any(r.is_error for r in results), [r.content for r in results]
    assert "NOK 11,600.00" in results[0].content[0].text  # the second shell's `cat`
    assert results[-1].content[0].text == "answer recorded"

    graded = rest.post(f"/instances/{made['id']}/grade")
    assert graded.status_code == 200, graded.text
    grade = graded.json()
    assert (grade["V"], grade["reward"], grade["errors"], grade["task_id"]) == (
        1, 1.0, [], TASK_ID)
    assert grade["checks"] and all(c["passed"] for c in grade["checks"])
    assert grade["answer"] == steps[-1].text  # type: ignore[union-attr]

    closed = rest.delete(f"/instances/{made['id']}")
    assert closed.status_code == 200 and closed.json()["stored"], closed.text
    episode_id = closed.json()["episode_id"]
    episode = load_episode(worlds, episode_id)
    assert (episode.task, episode.agent, episode.answer) == (
        TASK_ID, "http:reference", grade["answer"])
    assert [type(c) for c in episode.calls] == [
        ShellCall if isinstance(s, ShellStep) else ToolCall for s in steps[:-1]]
    assert verify_episode(worlds, episode_id)[0]
    assert verify_episode_of_task(worlds, task, episode_id).passed  # as `task verify` does
    gone = rest.get(f"/instances/{made['id']}")
    assert gone.status_code == 404 and episode_id in gone.json()["error"]


def test_a_do_nothing_agent_gets_v_0(rest: httpx2.Client) -> None:
    made = create(rest, task=TASK_ID)
    grade = rest.post(f"/instances/{made['id']}/grade").json()
    assert grade["V"] == 0 and grade["reward"] < 0.1 and grade["answer"] is None
    assert not all(c["passed"] for c in grade["checks"])
    closed = rest.delete(f"/instances/{made['id']}").json()
    assert (closed["stored"], closed["episode_id"]) == (False, None)
    assert "no calls and no answer" in closed["reason"]


# --- the shell and the answer ------------------------------------------------------------


def test_shell_and_answer_over_rest_and_mcp(rest: httpx2.Client, worlds: Worlds) -> None:
    made = create(rest, world="lars@4", shell=True, answer=True, agent="me")
    iid = made["id"]
    shell = rest.post(f"/instances/{iid}/shell",
                      json={"command": "echo hi; echo oops >&2; exit 3"}).json()
    assert shell["observation"] == "hi\n\n[stderr]\noops\n\n[exit 3]"
    assert (shell["exit_code"], shell["is_error"], shell["stdout"]) == (3, True, "hi\n")
    names, (wrote, read) = asyncio.run(over_mcp(mcp_url(rest, made), [
        ("shell", {"command": "echo via-mcp > note.txt"}),
        ("shell", {"command": "cat note.txt"})]))
    assert {"shell", "answer"} <= set(names)
    assert not wrote.is_error and read.content[0].text == "via-mcp\n"

    answered = rest.post(f"/instances/{iid}/answer", json={"text": "done"})
    assert answered.status_code == 200 and answered.json()["answer"] == "done"
    again = rest.post(f"/instances/{iid}/answer", json={"text": "second"})
    assert_refused(again, 409)
    assert "already" in again.json()["error"]
    _, (mcp_again,) = asyncio.run(over_mcp(mcp_url(rest, made), [("answer", {"text": "x"})]))
    assert mcp_again.is_error and "already" in mcp_again.content[0].text
    info = rest.get(f"/instances/{iid}").json()
    assert info["answered"] and info["done"] and info["calls"] == 3

    closed = rest.delete(f"/instances/{iid}").json()
    episode = load_episode(worlds, closed["episode_id"])
    assert episode.answer == "done" and episode.agent == "me" and episode.task is None
    assert [c.command for c in episode.calls if isinstance(c, ShellCall)] == [
        "echo hi; echo oops >&2; exit 3", "echo via-mcp > note.txt", "cat note.txt"]


def test_meta_mode_serves_shell_and_answer_beside_the_meta_tools(rest: httpx2.Client) -> None:
    made = create(rest, world="lars@4", mode="meta", shell=True, answer=True)
    names, (listed, ran) = asyncio.run(over_mcp(mcp_url(rest, made), [
        ("list_tools", {}), ("shell", {"command": "ls jobs"})]))
    assert names == ["answer", "call_tool", "list_tools", "shell"]
    assert "shell" not in {t["name"] for t in listed.structured_content["result"]}
    assert not ran.is_error and "nordlys" in ran.content[0].text


def test_without_a_task_or_a_flag_there_is_no_shell_nor_answer(rest: httpx2.Client) -> None:
    made = create(rest, world="lars@4")
    assert (made["shell"], made["answer"], made["task"]) == (False, False, None)
    names, _ = asyncio.run(over_mcp(mcp_url(rest, made), []))
    assert "shell" not in names and "answer" not in names
    for action, body in (("shell", {"command": "ls"}), ("answer", {"text": "x"})):
        refused = rest.post(f"/instances/{made['id']}/{action}", json=body)
        assert_refused(refused, 409)
        assert f"without the {action} tool" in refused.json()["error"]
    only_answer = create(rest, task=TASK_ID, shell=False)
    assert (only_answer["shell"], only_answer["answer"]) == (False, True)


# --- grading -----------------------------------------------------------------------------


def test_grading_refuses_unknown_tasks_and_other_worlds(rest: httpx2.Client,
                                                        env: Environment) -> None:
    plain = create(rest, world=OTHER_WORLD)
    unknown = rest.post(f"/instances/{plain['id']}/grade", json={"task": "no-such-task"})
    assert_refused(unknown, 404)
    assert "no-such-task" in unknown.json()["error"] and TASK_ID in unknown.json()["error"]
    other = rest.post(f"/instances/{plain['id']}/grade", json={"task": TASK_ID})
    assert_refused(other, 409)
    assert "lars@4" in other.json()["error"] and TASK_ID in other.json()["error"]
    assert_refused(rest.post(f"/instances/{plain['id']}/grade"), 400)  # no task to grade
    assert_refused(rest.post(f"/instances/{plain['id']}/grade", json={"task": 7}), 400)
    assert_refused(rest.post("/instances", json={"task": "no-such-task"}), 404)
    wrong = rest.post("/instances", json={"task": TASK_ID, "world": OTHER_WORLD})
    assert_refused(wrong, 409)
    assert "leave out" in wrong.json()["error"]
    listed = rest.get("/tasks").json()["tasks"]
    assert {t["task_id"] for t in listed} == set(PACK.tasks)

    bare = Gateway(env)  # a gateway serving no tasks
    with served(bare) as base, httpx2.Client(base_url=base, timeout=30) as other_rest:
        none = other_rest.post("/instances", json={"task": TASK_ID})
        assert_refused(none, 404)
        assert "--tasks" in none.json()["error"]


def test_loading_tasks_refuses_what_cannot_be_served(env: Environment, tmp_path: Path) -> None:
    one = str(PACK.task_dir(TASK_ID))
    assert list(load_served_tasks(env, [one])) == [TASK_ID]
    with pytest.raises(ConfigError, match="in both"):
        load_served_tasks(env, [one, str(PACK.tasks_dir)])
    with pytest.raises(ConfigError, match="neither a task folder"):
        load_served_tasks(env, [str(tmp_path)])
    with pytest.raises(Exception, match="no pack named"):
        load_served_tasks(env, ["no-such-pack"])


# --- OpenEnv ------------------------------------------------------------------------------


def test_openenv_reset_step_state_reach_done_with_the_grade(rest: httpx2.Client,
                                                            task: Task, worlds: Worlds) -> None:
    made = create(rest, task=TASK_ID, agent="openenv:reference")
    at = f"/instances/{made['id']}/openenv"
    reset = rest.post(f"{at}/reset", json={"seed": 3}).json()
    assert (reset["reward"], reset["done"]) == (None, False)
    assert reset["observation"]["instruction"] == task.spec.instruction
    assert "chat_send_message" in reset["observation"]["tools"]
    listed = rest.post(f"{at}/step", json={"action": {"type": "list_tools"}}).json()
    assert (listed["reward"], listed["done"]) == (0.0, False)
    assert any(t["name"] == "calendar_list_events" for t in listed["observation"]["tools"])
    steps = task.solution.steps
    for i, step in enumerate(steps):
        action = openenv_action(step)
        if i == 0:  # OpenEnv's own MCP action works as well
            action = {"type": "call_tool", "tool_name": action["tool"],
                      "arguments": action["arguments"]}
        answered = rest.post(f"{at}/step", json={"action": action})
        assert answered.status_code == 200, answered.text
        result = answered.json()
        assert not result["observation"].get("is_error"), result
        assert result["done"] == (i == len(steps) - 1)
    assert result["reward"] == 1.0 and result["metadata"]["grade"]["V"] == 1
    state = rest.get(f"{at}/state").json()
    assert (state["step_count"], state["done"], state["task"]) == (len(steps) + 1, True,
                                                                   TASK_ID)
    assert_refused(rest.post(f"{at}/step", json={"action": {"tool": "x"}}), 409)

    again = rest.post(f"{at}/reset").json()  # the solved episode is stored first
    stored = again["metadata"]["stored_episode_id"]
    assert verify_episode_of_task(worlds, task, stored).passed
    assert load_episode(worlds, stored).agent == "openenv:reference"
    assert rest.get(f"{at}/state").json()["step_count"] == 0


def test_the_episode_id_handed_out_is_the_stored_episodes(rest: httpx2.Client,
                                                          worlds: Worlds) -> None:
    """From create on, info, /episode and every OpenEnv answer name the episode by the id
    it is stored under: a reset stores it under the id its steps reported, a DELETE the
    next one under the id info gave before any call; every episode gets its own."""
    made = create(rest, task=TASK_ID, agent="ids")
    other = create(rest, task=TASK_ID, agent="ids")
    at = f"/instances/{made['id']}/openenv"
    assert made["episode_id"] != other["episode_id"]
    first = rest.post(f"{at}/reset").json()["metadata"]
    assert first["stored_episode_id"] is None  # nothing happened: nothing stored
    step = rest.post(f"{at}/step", json={"action": {"shell": "ls"}}).json()["metadata"]
    state = rest.get(f"{at}/state").json()
    assert step["episode_id"] == state["episode_id"] == first["episode_id"]
    reset = rest.post(f"{at}/reset").json()["metadata"]
    assert reset["stored_episode_id"] == first["episode_id"] != reset["episode_id"]
    stored = load_episode(worlds, first["episode_id"])
    assert stored.episode_id == first["episode_id"] and stored.agent == "ids"
    assert verify_episode(worlds, first["episode_id"])[0]  # the columns agree with it
    announced = rest.get(f"/instances/{made['id']}").json()["episode_id"]
    assert announced == reset["episode_id"]
    rest.post(f"/instances/{made['id']}/shell", json={"command": "ls"})
    live = rest.get(f"/instances/{made['id']}/episode").json()["episode_id"]
    closed = rest.delete(f"/instances/{made['id']}").json()
    assert closed["episode_id"] == announced == live
    assert closed["stored_episodes"] == [first["episode_id"], announced]
    assert len(load_episode(worlds, announced).calls) == 1
    rest.delete(f"/instances/{other['id']}")


def test_openenv_step_limit_ends_and_grades_the_episode(rest: httpx2.Client) -> None:
    made = create(rest, task=TASK_ID, max_steps=2)
    at = f"/instances/{made['id']}/openenv"
    rest.post(f"{at}/reset")
    first = rest.post(f"{at}/step", json={"action": {"shell": "ls"}}).json()
    assert first["done"] is False and first["observation"]["exit_code"] == 0
    last = rest.post(f"{at}/step", json={"action": {"tool": "calendar_list_events",
                                                    "arguments": {}}}).json()
    assert last["done"] and last["metadata"]["truncated"]
    assert last["metadata"]["grade"]["V"] == 0 and last["reward"] < 0.1


def test_malformed_agent_requests_are_clear_4xx(rest: httpx2.Client) -> None:
    made = create(rest, task=TASK_ID)
    iid = made["id"]
    for body, names in (({"task": TASK_ID, "shell": "yes"}, "shell"),
                        ({"task": TASK_ID, "agent": 5}, "agent"),
                        ({"task": TASK_ID, "agent": "a" * 300}, "agent"),
                        ({"task": TASK_ID, "max_steps": 0}, "max_steps"),
                        ({"task": TASK_ID, "colour": "red"}, "colour")):
        refused = rest.post("/instances", json=body)
        assert_refused(refused, 400)
        assert names in refused.json()["error"]
    requests: list[tuple[str, dict[str, Any], str]] = [
        ("shell", {}, "command"), ("shell", {"command": ""}, "command"),
        ("shell", {"cmd": "ls"}, "cmd"), ("answer", {"text": 1}, "text"),
        ("grade", {"task": TASK_ID, "answer": 3}, "answer"),
        ("openenv/step", {}, "action"), ("openenv/step", {"action": []}, "action"),
        ("openenv/step", {"action": {"tool": "a", "shell": "b"}}, "exactly one"),
        ("openenv/step", {"action": {"tool": "a", "arguments": []}}, "arguments"),
        ("openenv/step", {"action": {"tool": "a", "colour": 1}}, "colour"),
        ("openenv/step", {"action": {"type": "dance"}}, "exactly one"),
        ("openenv/reset", {"seed": "x"}, "seed"),
        ("openenv/reset", {"colour": 1}, "colour")]
    for path, request, names in requests:
        refused = rest.post(f"/instances/{iid}/{path}", json=request)
        assert_refused(refused, 400)
        assert names in refused.json()["error"], (path, request, refused.text)
    assert_refused(rest.get(f"/instances/{iid}/openenv/nope"), 404)
    assert_refused(rest.get(f"/instances/{iid}/openenv/step"), 405)


# --- episodes stored on reaping and shutdown ---------------------------------------------


def test_reaped_and_shut_down_instances_store_their_episodes(
        env: Environment, tasks: dict[str, ServedTask], worlds: Worlds) -> None:
    gateway = Gateway(env, tasks=tasks, idle_timeout=1.5, reap_interval=0.1)
    with served(gateway) as base, httpx2.Client(base_url=base, timeout=30) as rest:
        reaped = create(rest, task=TASK_ID)["id"]
        rest.post(f"/instances/{reaped}/shell", json={"command": "ls"})
        deadline = time.monotonic() + 10
        while reaped not in gateway.closed:
            assert time.monotonic() < deadline, "the idle instance was not reaped"
            time.sleep(0.05)
        gone = rest.get(f"/instances/{reaped}")
        assert gone.status_code == 404 and gone.json()["closed"]["stored"]
        kept = create(rest, world="lars@4", answer=True)["id"]
        rest.post(f"/instances/{kept}/answer", json={"text": "bye"})
    # Leaving `served` shut the gateway down: the live instance was closed and stored.
    reaped_episode = load_episode(worlds, gateway.closed[reaped]["episode_id"])
    assert reaped_episode.task == TASK_ID and len(reaped_episode.calls) == 1
    assert load_episode(worlds, gateway.closed[kept]["episode_id"]).answer == "bye"


def test_worldctl_serve_tasks_serves_a_pack_and_stores_on_shutdown(
        store_dir: Path, worlds: Worlds) -> None:
    """`worldctl serve --tasks demo` as a user runs it: the pack's tasks are served, and
    stopping the server (SIGINT, as Ctrl-C) stores the live instance's episode."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    worldctl = Path(sys.executable).parent / "worldctl"
    server = subprocess.Popen([str(worldctl), "--store", str(store_dir), "serve", "--port",
                               str(port), "--tasks", "demo"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        with httpx2.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as rest:
            deadline = time.monotonic() + 30
            while True:
                try:
                    health = rest.get("/healthz").json()
                    break
                except httpx2.TransportError:
                    assert server.poll() is None and time.monotonic() < deadline
                    time.sleep(0.1)
            assert health["tasks"] == len(PACK.tasks)
            made = create(rest, task=TASK_ID, agent="cli")
            answered = rest.post(f"/instances/{made['id']}/answer", json={"text": "x"})
            assert answered.status_code == 200
    finally:
        server.send_signal(signal.SIGINT)
        output, _ = server.communicate(timeout=30)
    # The CLI's answer to Ctrl-C (exit 2, "error: interrupted"), after a clean shutdown.
    assert "Application shutdown complete" in output and "Traceback" not in output, output
    stored = [e for e in worlds.store.episodes()
              if load_episode(worlds, e.episode_id).agent == "cli"]
    assert len(stored) == 1 and load_episode(worlds, stored[0].episode_id).answer == "x"
