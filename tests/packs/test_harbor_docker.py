"""Exported Harbor tasks' environments, built with Docker on the project image: the build
imports the pack and checks the task's world out at /world by its pinned hash; the MCP
server task.toml declares (stdio, `worldctl pack mcp`) serves the world's tools from
inside the container, acting on /world; and what Harbor's two reference agents do, with
plain `docker run` where Harbor would use `docker compose` (absent here): nop runs
`tests/test.sh` in a fresh container (reward 0), oracle runs `solution/solve.sh` then
`tests/test.sh` in one container (reward 1), the container being the sandbox
(WORLDCTL_SANDBOX=container, which the Dockerfile sets).

Three of the six tasks without the GUI are run (each task's image is a build and two
containers, ~10 s): mats-work-order (the shell and the services), nordlys-deposit-invoice
and sagene-easter-quote, on three different days of the world. The GUI task's solution
needs a browser, which the image lacks (and bubblewrap, which the container refuses):
`worldctl pack solve` says so before its first step, and nop still gives 0."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fastmcp import Client
from fastmcp.client.transports import StdioTransport

from packs.harbor import export_harbor
from packs.registry import load_pack
from replay.engine import Worlds
from tests.support import docker_images

pytestmark = [pytest.mark.slow, pytest.mark.docker_image("gateway")]

TASK = "mats-work-order"
WORLD = "f972525fce52ed3e0fa7a5cdf8080e66"
RUN = (TASK, "nordlys-deposit-invoice", "sagene-easter-quote")
GUI_TASK = "sjoboden-bar-surge-protectors"


class Tasks:
    """The demo pack exported as Harbor tasks, and each built task's image tag."""

    def __init__(self, folder: Path, images: dict[str, str]) -> None:
        self.folder = folder
        self.images = images

    def run(self, task: str, script: str, logs: Path) -> subprocess.CompletedProcess[str]:
        """`script` (bash) in a fresh container of `task`'s image, the task's tests and
        solution at /tests and /solution and `logs` at /logs, as Harbor mounts them."""
        here = self.folder / task
        logs.mkdir(parents=True)
        return subprocess.run(
            ["docker", "run", "--rm", "-v", f"{here / 'tests'}:/tests:ro",
             "-v", f"{here / 'solution'}:/solution:ro", "-v", f"{logs}:/logs",
             self.images[task], "bash", "-c", script],
            capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tasks]:
    base = docker_images.project_image()
    root = tmp_path_factory.mktemp("harbor")
    with Worlds.open(root / "store") as worlds:
        export_harbor(worlds, load_pack("demo"), root / "tasks", base_image=base)
    images: dict[str, str] = {}
    try:
        for task in (*RUN, GUI_TASK):
            tag = f"agent-worlds-harbor-test:{task}"
            built = subprocess.run(["docker", "build", "-q", "-t", tag,
                                    str(root / "tasks" / task / "environment")],
                                   capture_output=True, text=True, timeout=600)
            assert built.returncode == 0, built.stderr[-4000:]
            images[task] = tag
        yield Tasks(root / "tasks", images)
    finally:
        if images:
            subprocess.run(["docker", "rmi", "-f", *images.values()], capture_output=True,
                           timeout=120)


def test_the_environment_builds_the_pinned_world_and_serves_its_tools(tasks: Tasks) -> None:
    tag = tasks.images[TASK]
    hashed = subprocess.run(["docker", "run", "--rm", tag, "worldctl", "hash", "/world"],
                            capture_output=True, text=True, timeout=120)
    assert hashed.stdout.splitlines()[-1] == WORLD, hashed.stderr

    async def session() -> tuple[list[str], str]:
        # As an agent in the container starts it: the command and args of task.toml.
        server = StdioTransport(command="docker", args=[
            "run", "-i", "--rm", tag, "worldctl", "pack", "mcp", "demo", TASK, "/world"])
        async with Client(server) as client:
            names = sorted(t.name for t in await client.list_tools())
            found = await client.call_tool("calendar_list_events", {
                "date_from": "2026-03-09", "date_to": "2026-03-15", "query": "install"})
        return names, found.content[0].text  # type: ignore[union-attr]

    names, found = asyncio.run(session())
    assert "answer" in names and "calendar_update_event" in names
    assert {e["id"] for e in json.loads(found)["items"]} >= {9, 10}


def test_nop_gets_0_and_oracle_gets_1(tasks: Tasks, tmp_path: Path) -> None:
    """Harbor's nop agent does nothing before the verifier; its oracle runs the solution
    first, in the same container. The containers run two at a time."""
    jobs = [(task, agent, script) for task in RUN for agent, script in (
        ("nop", "bash /tests/test.sh"),
        ("oracle", "bash /solution/solve.sh && bash /tests/test.sh"))]
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda job: tasks.run(job[0], job[2],
                                                   tmp_path / f"{job[0]}-{job[1]}"), jobs))
    for (task, agent, _), ran in zip(jobs, done, strict=True):
        assert ran.returncode == 0, (task, agent, ran.stdout[-2000:], ran.stderr[-4000:])
        reward = (tmp_path / f"{task}-{agent}" / "verifier" / "reward.txt").read_text()
        assert reward == ("0\n" if agent == "nop" else "1\n"), (task, agent, ran.stdout)
        if agent == "oracle":
            assert "reference solution replayed" in ran.stdout
            assert (tmp_path / f"{task}-oracle" / "agent" / "answer.txt").read_text()


def test_the_gui_task_says_it_needs_a_browser(tasks: Tasks, tmp_path: Path) -> None:
    solved = tasks.run(GUI_TASK, "bash /solution/solve.sh", tmp_path / "oracle")
    assert solved.returncode != 0
    assert solved.stderr.strip().splitlines()[-1] == (
        "error: WORLDCTL_SANDBOX=container: this container is the sandbox and bubblewrap "
        "cannot make namespaces in it, but carried-app workers and the browser (a task's "
        "GUI) need bubblewrap")
    graded = tasks.run(GUI_TASK, "bash /tests/test.sh", tmp_path / "nop")
    assert graded.returncode == 0, graded.stderr[-4000:]
    assert (tmp_path / "nop" / "verifier" / "reward.txt").read_text() == "0\n"
