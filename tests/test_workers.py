"""Carried app code runs only in a sandboxed worker process (real bubblewrap), never here:
tools, calls, episodes, replay and reset work as for shipped apps; the code sees no
network, cannot write outside its instances, cannot see the host, and is killed when a
call outlives its timeout."""

from __future__ import annotations

import io
import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from envs.episodes_store import replay_episode
from envs.instance import AppPinError, Environment
from envs.workers import WorkerLimits, WorkerPool
from replay import Worlds

MARKER = "AGENTWORLDS_CARRIED_CODE_RAN"
CODE = f'''
import os, socket, subprocess, sys
from typing import Annotated
from pydantic import BaseModel, Field
from envs.app import App, ToolContext, ToolError

os.environ["{MARKER}"] = "1"  # proves where the code ran
app = App(service="notes", name="carried-notes", version="0.1")


class Note(BaseModel):
    id: int
    title: str


@app.tool(writes=False)
def get_note(ctx: ToolContext, note_id: Annotated[int, Field(description="Note id")]) -> Note:
    """Get one note."""
    row = ctx.require(ctx.row("SELECT * FROM notes WHERE id = ?", (note_id,)), "note", note_id)
    return Note(**row)


@app.tool(writes=True)
def add_note(ctx: ToolContext, title: Annotated[str, Field(description="Title")]) -> Note:
    """Add a note."""
    return Note(id=ctx.insert("notes", {{"title": title}}), title=title)


@app.tool(writes=False)
def connect(ctx: ToolContext, port: int) -> str:
    """Try the network."""
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    return "connected"


@app.tool(writes=False)
def write_file(ctx: ToolContext, path: str) -> str:
    """Try to write a file."""
    with open(path, "w") as f:
        f.write("escaped")
    return "wrote"


@app.tool(writes=False)
def shell(ctx: ToolContext, command: str) -> str:
    """Run a shell command."""
    os.system("(" + command + ") > /tmp/out 2>&1")
    done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True)
    return open("/tmp/out").read() + "\\n---\\n" + done.stdout + done.stderr


@app.tool(writes=False)
def spin(ctx: ToolContext) -> str:
    """Loop forever."""
    while True:
        pass
'''
BASE = [
    {"persona": "p", "day": 0, "ts": "2026-01-01T00:00:00Z", "type": "sql", "service": "notes",
     "sql": "CREATE TABLE notes(id INTEGER PRIMARY KEY, title TEXT)"},
    {"persona": "p", "day": 0, "ts": "2026-01-01T00:00:01Z", "type": "sql", "service": "notes",
     "sql": "INSERT INTO notes VALUES (1, 'first')"},
]


def _world(root: Path, code: str) -> Worlds:
    pin = {"persona": "p", "day": 0, "ts": "2026-01-01T00:00:02Z", "type": "app",
           "service": "notes", "app": "carried-notes", "version": "0.1", "code": code}
    worlds = Worlds.open(root)
    worlds.import_stream(io.BytesIO(b"".join(json.dumps(line).encode() + b"\n"
                                             for line in [*BASE, pin])), source="w.jsonl")
    return worlds


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Environment]:
    worlds = _world(tmp_path_factory.mktemp("workers") / "store", CODE)
    environment = Environment(worlds, apps={})
    environment._pool = WorkerPool(WorkerLimits(timeout_s=3))
    yield environment
    environment.close()
    worlds.close()


def test_a_carried_app_serves_tools_episodes_replay_and_reset(env: Environment) -> None:
    with env.open("p@0") as instance:
        tools = {t.name: t for t in instance.list_tools()}
        assert tools["notes_get_note"].input_schema["properties"]["note_id"] == {
            "description": "Note id", "type": "integer"}
        assert tools["notes_add_note"].writes and not tools["notes_get_note"].writes
        assert tools["notes_get_note"].output_schema is not None
        read = instance.call_tool("notes_get_note", {"note_id": 1})
        assert (read.is_error, read.structured) == (False, {"id": 1, "title": "first"})
        wrote = instance.call_tool("notes_add_note", {"title": "second"})
        assert (wrote.is_error, wrote.structured) == (False, {"id": 2, "title": "second"})
        refused = instance.call_tool("notes_get_note", {"note_id": 9})
        assert refused.is_error and refused.text == "No note with id 9"
        bad = instance.call_tool("notes_get_note", {"note_id": "x"})
        assert bad.is_error
        final = instance.hash()
        assert final != instance.record.world_hash
        assert replay_episode(env.worlds, instance.episode) == final
        instance.reset()
        assert instance.hash() == instance.record.world_hash
        assert instance.call_tool("notes_get_note", {"note_id": 2}).is_error
        assert not instance.call_tool("notes_add_note", {"title": "again"}).is_error
        assert replay_episode(env.worlds, instance.episode) == instance.hash()
    assert MARKER not in os.environ
    assert not [m for m in sys.modules if m.startswith("agentworlds_carried")]


def test_instances_share_one_worker_and_stay_isolated(env: Environment) -> None:
    with env.open("p@0") as one, env.open("p@0") as two:
        assert not one.call_tool("notes_add_note", {"title": "only in one"}).is_error
        pids = {w.pid for w in env._pool.workers()} if env._pool else set()
        assert two.call_tool("notes_get_note", {"note_id": 2}).is_error
        assert not two.call_tool("notes_get_note", {"note_id": 1}).is_error
        assert env._pool is not None
        assert len(env._pool.workers()) == 1
        assert {w.pid for w in env._pool.workers()} == pids and None not in pids


def test_carried_code_has_no_network(env: Environment) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.3)
    try:
        with env.open("p@0") as instance:
            result = instance.call_tool("notes_connect", {"port": listener.getsockname()[1]})
        assert result.is_error
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()


def test_carried_code_cannot_write_outside_its_instances(env: Environment) -> None:
    store = Path(env.worlds.cache.root).parent
    with env.open("p@0") as instance:
        for target in ["/etc/agentworlds-x", "/opt/python/x", "/opt/src/envs/x", "/usr/x",
                       "/x"]:
            result = instance.call_tool("notes_write_file", {"path": target})
            assert result.is_error, target
            assert "Read-only file system" in result.text or "No such file" in result.text
            assert not os.path.exists(target)
        # The store is not there: only the (empty) path down to the instances directory,
        # on the sandbox's private /tmp. A write there never reaches the host.
        listing = instance.call_tool("notes_shell", {"command": f"ls -A {store} {store}/*"})
        assert sorted(os.listdir(store)) != ["cache"]
        assert "cache" in listing.text and not any(
            name in listing.text for name in os.listdir(store) if name != "cache")
        instance.call_tool("notes_write_file", {"path": str(store / "escaped")})
        assert not (store / "escaped").exists()


def test_carried_code_cannot_see_the_host(env: Environment) -> None:
    with env.open("p@0") as instance:
        result = instance.call_tool("notes_shell", {
            "command": "ls /work /root; id -u; grep -E '^Cap(Eff|Prm|Bnd)|NoNewPrivs' "
                       "/proc/self/status"})
    assert not result.is_error
    out = result.text
    for seen in out.split("---"):  # os.system, then subprocess
        assert "cannot access '/work'" in seen and "cannot access '/root'" in seen
        assert "CapEff:\t0000000000000000" in seen and "CapBnd:\t0000000000000000" in seen
        assert "NoNewPrivs:\t1" in seen


def test_a_call_that_loops_forever_is_killed_and_the_worker_restarts(env: Environment) -> None:
    with env.open("p@0") as instance:
        assert env._pool is not None
        before = {w.pid for w in env._pool.workers()}
        result = instance.call_tool("notes_spin", {})
        assert result.is_error and "longer than" in result.text
        again = instance.call_tool("notes_get_note", {"note_id": 1})
        assert not again.is_error
        assert {w.pid for w in env._pool.workers()} != before


def test_carried_code_that_does_not_load_is_refused(tmp_path: Path) -> None:
    worlds = _world(tmp_path / "store", "def broken(:\n    pass\n")
    with Environment(worlds, apps={}) as env, pytest.raises(AppPinError, match="SyntaxError"):
        env.open("p@0")
    worlds.close()
