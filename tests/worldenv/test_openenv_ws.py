"""OpenEnv's own client against the gateway: ``openenv-core`` from the package index, in a
venv of its own (tests/support/peer_venv.py), driven by tests/support/openenv_driver.py in
one process for the module, talks to a real gateway over real uvicorn on a loopback port
holding the demo world and its tasks, graded by the tasks' real verifiers.

It solves a demo task over ``/ws`` (reward 1, the episode stored under the id its state
gave), gets nothing for a wrong answer, holds 256 sessions at once in one process with
none lost, and a killed client frees its instance. The protocol's refusals (capacity, an
idle session, malformed messages, a page's or a tokenless handshake) are checked with the
``websockets`` client itself, the stateless top-level endpoints with plain HTTP.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from gates.rollout import verify_episode_of_task
from gates.served import load_served_tasks
from gates.task import Task, load_task
from packs.registry import load_pack
from replay import Worlds
from tests.support import peer_venv
from tests.support.asgi_server import served
from tests.worldenv.test_gateway import assert_refused
from tests.worldenv.test_gateway_agents import openenv_action
from worldenv.instances.episodes import load_episode
from worldenv.instances.instance import Environment
from worldenv.serving.gateway import Gateway, ServedTask

pytestmark = pytest.mark.peer("openenv")

TASK_ID = "mats-work-order"  # lars@4; needs the tools and the shell
ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "tests" / "support" / "openenv_driver.py"
PAGE = ROOT / "docs" / "peers" / "openenv.md"
SESSIONS = 256


@pytest.fixture(scope="module")
def env(demo_worlds: Worlds) -> Iterator[Environment]:
    with Environment(demo_worlds) as environment:
        yield environment


@pytest.fixture(scope="module")
def tasks(env: Environment) -> dict[str, ServedTask]:
    return load_served_tasks(env, ["demo"])


@pytest.fixture(scope="module")
def task() -> Task:
    return load_task(load_pack("demo").task_dir(TASK_ID))


@pytest.fixture(scope="module")
def gateway(env: Environment, tasks: dict[str, ServedTask]) -> Gateway:
    return Gateway(env, tasks=tasks, max_instances=SESSIONS)


@pytest.fixture(scope="module")
def base(gateway: Gateway) -> Iterator[str]:
    with served(gateway) as url:
        yield url


class Driver:
    """The client process: one JSON command a line in, one JSON answer a line out."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [str(peer_venv.python("openenv")), str(DRIVER)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=peer_venv.environment())
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        assert self.answer(60) == {"ready": True}

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def answer(self, timeout: float) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            assert self.proc.stderr is not None
            raise AssertionError("the OpenEnv client did not answer" + (
                f": {self.proc.stderr.read()}" if self.proc.poll() is not None else "")
                ) from None
        found: dict[str, Any] = json.loads(line)
        return found

    def ask(self, timeout: float = 120, **command: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return self.answer(timeout)


@pytest.fixture(scope="module")
def client() -> Iterator[Driver]:
    driver = Driver()
    try:
        yield driver
    finally:
        driver.proc.kill()
        driver.proc.wait()


def until(condition: Callable[[], bool], what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def ws_url(base: str) -> str:
    return base.replace("http://", "ws://") + "/ws"


def exchange(ws: ClientConnection, message: Any) -> dict[str, Any]:
    ws.send(message if isinstance(message, str) else json.dumps(message))
    answer: dict[str, Any] = json.loads(ws.recv(timeout=60))
    return answer


# --- the official client ------------------------------------------------------------------


def test_the_official_client_solves_a_demo_task(client: Driver, base: str, task: Task,
                                                gateway: Gateway,
                                                demo_worlds: Worlds) -> None:
    actions = [openenv_action(step) for step in task.solution.steps]
    played = client.ask(op="play", base=base, actions=actions,
                        reset={"task": TASK_ID, "agent": "openenv-client", "seed": 7})
    assert "error" not in played, played["error"]
    first = played["reset"]
    assert (first["reward"], first["done"]) == (None, False)
    assert first["observation"]["instruction"] == task.spec.instruction
    assert "calendar_list_events" in first["observation"]["tools"]
    steps = played["steps"]
    assert [s["done"] for s in steps] == [False] * (len(steps) - 1) + [True]
    assert not any(s["observation"].get("is_error") for s in steps)
    assert steps[-1]["reward"] == 1.0
    state = played["state"]
    assert (state["task"], state["step_count"], state["done"]) == (TASK_ID, len(steps), True)
    # The client closed its session: the instance is gone, its episode stored under the
    # id the client was given, and it grades as solved from the store.
    until(lambda: state["instance"] in gateway.closed, "the instance was not closed")
    assert state["instance"] not in gateway.instances and not gateway.sessions.open
    stored = gateway.closed[state["instance"]]["episode_id"]
    assert stored == state["episode_id"]
    assert load_episode(demo_worlds, stored).agent == "openenv-client"
    assert verify_episode_of_task(demo_worlds, task, stored).passed


def test_a_wrong_answer_gets_no_reward_and_ends_the_episode(client: Driver,
                                                            base: str) -> None:
    played = client.ask(op="play", base=base, reset={"task": TASK_ID},
                        actions=[{"type": "list_tools"}, {"answer": "no idea"},
                                 {"shell": "ls"}])
    listed, answered = played["steps"]
    assert any(t["name"] == "calendar_list_events" for t in listed["observation"]["tools"])
    # Graded by the verifier: WildAWM's partial credit for the checks a wrong answer passes.
    assert answered["done"] is True and answered["reward"] < 0.1
    # A step after the end is refused, in OpenEnv's words, with what to do instead.
    assert "EXECUTION_ERROR" in played["error"] and "send a reset" in played["error"]


def test_256_sessions_at_once_lose_none(client: Driver, base: str,
                                        gateway: Gateway) -> None:
    done = client.ask(op="many", base=base, n=SESSIONS, timeout=600,
                      reset={"task": TASK_ID},
                      action={"tool": "calendar_list_events", "arguments": {}})
    assert done["failed"] == []
    sessions = done["sessions"]
    assert len(sessions) == SESSIONS
    assert len({s["episode_id"] for s in sessions}) == SESSIONS
    assert len({s["instance"] for s in sessions}) == SESSIONS
    assert all(s["step_count"] == 1 and not s["done"] for s in sessions)
    until(lambda: not gateway.instances and not gateway.sessions.open,
          "sessions or instances outlived their sockets")
    assert all(gateway.closed[s["instance"]]["episode_id"] == s["episode_id"]
               for s in sessions)  # each one's tool call stored under its id
    print(f"{SESSIONS} OpenEnv sessions (reset, step, state, close) in {done['seconds']} s")


def test_a_killed_client_frees_its_instance(client: Driver, base: str,
                                            gateway: Gateway) -> None:
    held = client.ask(op="hold", base=base, reset={"task": TASK_ID},
                      actions=[{"shell": "ls"}])
    assert "error" not in held, held
    assert held["instance"] in gateway.instances and len(gateway.sessions.open) == 1
    os.kill(held["pid"], signal.SIGKILL)  # no close message, no closing handshake
    until(lambda: held["instance"] not in gateway.instances and not gateway.sessions.open,
          "the dropped socket's instance was not freed")
    until(lambda: held["instance"] in gateway.closed, "the instance was not closed")
    assert gateway.closed[held["instance"]]["episode_id"] == held["episode_id"]


# --- the protocol's refusals ---------------------------------------------------------------


def test_malformed_messages_get_openenv_errors_and_the_session_goes_on(base: str) -> None:
    with connect(ws_url(base)) as ws:
        for message, code, names in (
                ("{not json", "INVALID_JSON", "not valid JSON"),
                ({"type": "dance"}, "UNKNOWN_TYPE", "'dance'"),
                ({"type": "reset", "colour": 1}, "VALIDATION_ERROR", "colour"),
                ({"type": "reset", "data": {"colour": 1}}, "VALIDATION_ERROR", "colour"),
                ({"type": "reset", "data": {"seed": "x"}}, "VALIDATION_ERROR", "seed"),
                ({"type": "reset"}, "VALIDATION_ERROR", 'reset(task="<task id>")'),
                ({"type": "reset", "data": {"task": "nope"}}, "VALIDATION_ERROR", "no task"),
                ({"type": "step", "data": {"shell": "ls"}}, "EXECUTION_ERROR",
                 "send a reset first"),
                ("[" * 100 + "]" * 100, "VALIDATION_ERROR", "deeper than")):
            error = exchange(ws, message)
            assert error["type"] == "error", (message, error)
            assert error["data"]["code"] == code and names in error["data"]["message"], error
            assert "Traceback" not in error["data"]["message"]
        reset = exchange(ws, {"type": "reset", "data": {"task": TASK_ID}})
        assert reset["type"] == "observation" and reset["data"]["done"] is False
        for action, names in (({"tool": "a", "shell": "b"}, "exactly one"),
                              ({"tool": "a", "colour": 1}, "colour"),
                              ({"gui": {"action": "fly"}}, "fly")):
            error = exchange(ws, {"type": "step", "data": action})
            assert error["data"]["code"] == "VALIDATION_ERROR", error
            assert names in error["data"]["message"], error
        step = exchange(ws, {"type": "step", "data": {"shell": "echo hi"}})
        assert step["data"]["observation"]["stdout"] == "hi\n"
        state = exchange(ws, {"type": "state"})
        assert state["type"] == "state" and state["data"]["step_count"] == 1
        ws.send(json.dumps({"type": "close"}))
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=30)


def test_capacity_idle_sessions_and_refused_handshakes(
        env: Environment, tasks: dict[str, ServedTask], client: Driver) -> None:
    capped = Gateway(env, tasks=tasks, max_sessions=2)
    with served(capped) as base, connect(ws_url(base)) as first, connect(ws_url(base)):
        # A session beyond the cap is told so, as OpenEnv's server does, and closed.
        refused = client.ask(op="play", base=base, reset={"task": TASK_ID}, actions=[])
        assert refused["error"].startswith("RuntimeError: Server error"), refused
        assert "CAPACITY_REACHED" in refused["error"]
        assert "maximum of 2 OpenEnv sessions" in refused["error"]
        assert exchange(first, {"type": "state"})["type"] == "state"  # the others go on
    timed = Gateway(env, tasks=tasks, session_timeout=1.0)
    with served(timed) as base:
        with connect(ws_url(base)) as first:
            exchange(first, {"type": "reset", "data": {"world": "lars@4"}})
            assert len(timed.instances) == 1
            # Sent nothing for a second: closed, its instance with it, the reason given.
            with pytest.raises(ConnectionClosed) as closed:
                first.recv(timeout=30)
            assert "no message for 1 s" in str(closed.value)
        until(lambda: not timed.instances and not timed.sessions.open,
              "the idle session's instance was not closed")
        idle = client.ask(op="play", base=base, reset={"task": TASK_ID},
                          actions=[{"sleep": 1.6}, {"shell": "ls"}])
        assert "no message for 1 s" in idle["error"], idle
        # A web page's handshake (browsers send an Origin) is refused before it opens.
        with pytest.raises(InvalidStatus) as page:
            connect(ws_url(base), origin="http://127.0.0.1:1")
        assert page.value.response.status_code == 403
        assert b"web page" in page.value.response.body
    tokened = Gateway(env, token="s3cret")
    with served(tokened) as base:
        with pytest.raises(InvalidStatus) as anonymous:
            connect(ws_url(base))
        assert anonymous.value.response.status_code == 401
        with connect(ws_url(base), additional_headers={"Authorization": "Bearer s3cret"}) \
                as ws:
            assert exchange(ws, {"type": "state"})["data"]["episode_id"] is None


def test_the_stateless_endpoints_answer_as_openenvs(base: str, gateway: Gateway,
                                                    task: Task) -> None:
    with httpx2.Client(base_url=base, timeout=60) as rest:
        assert rest.get("/health").json() == {"status": "healthy"}
        reset = rest.post("/reset", json={"task": TASK_ID, "seed": 1})
        assert reset.status_code == 200, reset.text
        answer = reset.json()
        assert set(answer) == {"observation", "reward", "done"}
        assert answer["observation"]["instruction"] == task.spec.instruction
        assert_refused(rest.post("/reset", json={}), 400)
        assert_refused(rest.post("/reset", json={"task": "nope"}), 404)
        step = rest.post("/step", json={"action": {"shell": "ls"}})
        assert_refused(step, 409)
        assert "/ws" in step.json()["error"]
        assert not gateway.instances  # the stateless reset's instance was closed


def test_the_docs_pages_client_blocks_run(client: Driver, base: str, gateway: Gateway) -> None:
    """The OpenEnv page's Python blocks (``py``: the docs suite's Python has no OpenEnv)
    run as written in the client's venv, against this gateway."""
    blocks = re.findall(r"```py\n(.*?)```", PAGE.read_text(), re.S)
    assert len(blocks) == 2
    for block in blocks:
        ran = client.ask(op="exec", code=block.replace("127.0.0.1:8765",
                                                       base.removeprefix("http://")))
        assert "error" not in ran, ran
        if "mats-work-order" in block:
            assert "mats-work-order - " in ran["stdout"] and "Job:" in ran["stdout"]
            assert "done: True reward: 0.0" in ran["stdout"], ran["stdout"]
    until(lambda: not gateway.sessions.open, "the example's session stayed open")
