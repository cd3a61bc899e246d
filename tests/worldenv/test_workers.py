"""Carried app code runs only in a sandboxed worker process (real bubblewrap), never here:
tools, calls, episodes, replay and reset work as for shipped apps; the code sees no
network, writes nothing of the host, cannot see the host, and is killed when a call
outlives its timeout. One worker serves the instances of every world carrying the same code,
yet a call reaches no database but its own instance's: not by path (no instance, snapshot
or store is in the sandbox), not through SQLite, not through the process's descriptors, and
not through a thread, process or timer left running by an earlier call."""

from __future__ import annotations

import io
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from replay import Worlds
from replay.layout import service_db
from worldenv.core.app import App
from worldenv.core.contract import CallClock
from worldenv.core.episode import DbChange
from worldenv.errors import AppPinError
from worldenv.instances.episodes import replay_episode
from worldenv.instances.instance import Environment
from worldenv.sandbox.workers import WorkerLimits, WorkerPool

MARKER = "AGENTWORLDS_CARRIED_CODE_RAN"
CODE = f'''
import os, signal, socket, stat, subprocess, sys, threading, time
from typing import Annotated
from pydantic import BaseModel, Field
from worldenv.core.app import App, ToolContext, ToolError

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


@app.tool(writes=True)
def fill(ctx: ToolContext, rows: int) -> int:
    """Add `rows` notes of 1000 characters."""
    ctx.db.execute("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n "
                   "WHERE i < ?) INSERT INTO notes(title) SELECT printf('%01000d', i) FROM n",
                   (rows,))
    return rows


@app.tool(writes=True)
def mark_all_then_spin(ctx: ToolContext) -> str:
    """Change every note (more than SQLite's page cache holds), then loop forever."""
    ctx.db.execute("UPDATE notes SET title = title || '!'")
    while True:
        pass


@app.tool(writes=False)
def read_path(ctx: ToolContext, path: str) -> str:
    """Read a file, or list a directory."""
    if os.path.isdir(path):
        return "listed: " + ", ".join(sorted(os.listdir(path)))
    with open(path, "rb") as f:
        return "read: " + f.read(64).decode("latin-1")


@app.tool(writes=True)
def attach(ctx: ToolContext, path: str) -> str:
    """Open another database through SQLite."""
    ctx.db.execute("ATTACH DATABASE ? AS other", (path,))
    return str(ctx.db.execute("SELECT group_concat(title) FROM other.notes").fetchall())


@app.tool(writes=False)
def scan_descriptors(ctx: ToolContext) -> str:
    """Read every file the process has open, as a thief would."""
    seen = []
    for fd in sorted(int(n) for n in os.listdir("/proc/self/fd")):
        try:
            seen.append(os.pread(fd, 1 << 20, 0).decode("latin-1"))
        except OSError:
            pass
    return "".join(seen)


@app.tool(writes=False)
def scribble_descriptors(ctx: ToolContext) -> int:
    """Write over every file the process has open (but its own stdio)."""
    written = 0
    for fd in sorted(int(n) for n in os.listdir("/proc/self/fd")):
        try:
            if fd > 2 and stat.S_ISREG(os.fstat(fd).st_mode):
                written += os.pwrite(fd, b"scribbled", 0)
        except OSError:
            pass
    return written


@app.tool(writes=False)
def leave_running(ctx: ToolContext, what: str) -> str:
    """Leave something running after the call."""
    if what == "thread":
        threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
    elif what == "process":
        subprocess.Popen(["sleep", "3600"])
    elif what == "timer":
        signal.signal(signal.SIGALRM, lambda *_: None)
        signal.setitimer(signal.ITIMER_REAL, 3600)
    return "left " + what
'''


def _log(persona: str, code: str, first: str) -> list[dict[str, object]]:
    def line(second: int, **fields: object) -> dict[str, object]:
        return {"persona": persona, "day": 0, "ts": f"2026-01-01T00:00:0{second}Z",
                "service": "notes", **fields}

    return [line(0, type="sql", sql="CREATE TABLE notes(id INTEGER PRIMARY KEY, title TEXT)"),
            line(1, type="sql", sql=f"INSERT INTO notes VALUES (1, '{first}')"),
            line(2, type="app", app="carried-notes", version="0.1", code=code)]


def _world(root: Path, code: str) -> Worlds:
    """Persona p's world, and persona q's (another world, carrying the same code)."""
    worlds = Worlds.open(root)
    lines = _log("p", code, "first") + _log("q", code, "first of q")
    worlds.import_stream(io.BytesIO(b"".join(json.dumps(line).encode() + b"\n"
                                             for line in lines)), source="w.jsonl")
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


def test_a_call_reaches_no_other_instance_by_path_or_through_sqlite(env: Environment
                                                                   ) -> None:
    cache = env.worlds.cache
    with env.open("p@0") as mine, env.open("p@0") as same_world, env.open("q@0") as other:
        for instance in (same_world, other):  # each now has its own copy, with a secret
            assert not instance.call_tool("notes_add_note", {"title": "secret"}).is_error
        snapshot_db = service_db(other.mount.snapshot, "notes")
        targets = [service_db(same_world.mount.path, "notes"),
                   service_db(other.mount.path, "notes"), snapshot_db,
                   mine.mount.db_path("notes"),  # by name, not even its own
                   other.mount.path, cache.tmp, cache.root]
        assert all(t.exists() for t in targets)
        for target in targets:
            read = mine.call_tool("notes_read_path", {"path": str(target)})
            assert read.is_error and "No such file or directory" in read.text, target
            attached = mine.call_tool("notes_attach", {"path": str(target)})
            assert attached.is_error and "opens only the database handed over" in attached.text
            assert "secret" not in read.text + attached.text
        got = mine.call_tool("notes_get_note", {"note_id": 1})
        assert (got.is_error, got.structured) == (False, {"id": 1, "title": "first"})
        assert mine.call_tool("notes_get_note", {"note_id": 2}).is_error
        assert not [e for e in mine.episode.events if isinstance(e, DbChange)]


def test_while_a_call_runs_the_worker_holds_no_other_instance_database(env: Environment
                                                                       ) -> None:
    with env.open("p@0") as one, env.open("q@0") as two:
        assert not one.call_tool("notes_add_note", {"title": "secret of one"}).is_error
        assert not two.call_tool("notes_add_note", {"title": "note of two"}).is_error
        seen = two.call_tool("notes_scan_descriptors", {}).text
        assert "note of two" in seen and "secret of one" not in seen
        seen = one.call_tool("notes_scan_descriptors", {}).text
        assert "secret of one" in seen and "note of two" not in seen
        # A read of an instance that never wrote reads its snapshot's file, handed read-only.
        with env.open("q@0") as fresh:
            seen = fresh.call_tool("notes_scan_descriptors", {}).text
            assert "first of q" in seen and "secret" not in seen and "note of" not in seen
            scribbled = fresh.call_tool("notes_scribble_descriptors", {})
            assert (scribbled.is_error, scribbled.structured) == (False, {"result": 0})
            assert fresh.hash() == fresh.record.world_hash
            assert env.worlds.cache.check(fresh.record.world_hash) is None


@pytest.mark.parametrize("what", ["thread", "process", "timer"])
def test_a_call_that_leaves_something_running_gets_its_worker_replaced(
        env: Environment, what: str) -> None:
    with env.open("p@0") as instance:
        assert not instance.call_tool("notes_add_note", {"title": "kept"}).is_error
        assert env._pool is not None
        before = {w.pid for w in env._pool.workers()}
        left = instance.call_tool("notes_leave_running", {"what": what})
        assert (left.is_error, left.text) == (False, f"left {what}")
        assert {w.pid for w in env._pool.workers()} == {None}
        got = instance.call_tool("notes_get_note", {"note_id": 2})
        assert (got.is_error, got.structured) == (False, {"id": 2, "title": "kept"})
        assert {w.pid for w in env._pool.workers()}.isdisjoint(before | {None})


def test_forget_drops_the_database_before_a_reset_replaces_it(tmp_path: Path) -> None:
    # A full mount re-copies a changed database at the same path: a worker still holding
    # the old descriptor would read the deleted file's rows.
    worlds = _world(tmp_path / "store", CODE)
    with Environment(worlds, apps={}, lazy=False) as environment, \
            environment.open("p@0") as instance:
        assert not instance.call_tool("notes_add_note", {"title": "gone"}).is_error
        instance.reset()
        assert instance.call_tool("notes_get_note", {"note_id": 2}).is_error
        assert not instance.call_tool("notes_get_note", {"note_id": 1}).is_error
        assert instance.hash() == instance.record.world_hash
    worlds.close()


def test_the_host_hands_over_only_regular_files_of_the_worker_instances(env: Environment
                                                                        ) -> None:
    with env.open("p@0") as instance:
        assert not instance.call_tool("notes_get_note", {"note_id": 1}).is_error
        assert env._pool is not None
        worker = env._pool.workers()[0]
        real = instance.mount.db_path("notes")
        link = real.with_name("link.sqlite")
        link.symlink_to(real)
        outside = Path(env.worlds.cache.root) / "x.sqlite"
        for db, why in [(outside, "not under the worker's instances directory"),
                        (link, "Too many levels of symbolic links")]:
            reply = worker.call("notes_get_note", {"note_id": 1}, db=db, clock=CallClock(
                index=1, millis=0, now="2026-01-01T00:00:00Z", seed="s"))
            assert not reply["ok"] and str(db) in reply["error"] and why in reply["error"]
        assert not outside.exists()
        link.unlink()


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
        # Nothing of the store is there, not even the instances directory: a write on that
        # path lands (if anywhere) on the sandbox's private /tmp and never reaches the host.
        listing = instance.call_tool("notes_shell", {"command": f"ls -A {store}"})
        assert "No such file or directory" in listing.text
        for escaped in [store / "escaped", instance.mount.path / "escaped"]:
            instance.call_tool("notes_write_file", {"path": str(escaped)})
            assert not escaped.exists()


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


def test_a_write_call_killed_midway_leaves_the_database_as_it_was(env: Environment) -> None:
    # The worker's journal is in memory: pages SQLite spilled to the file before the commit
    # could not be rolled back after the kill.
    with env.open("p@0") as instance:
        assert instance.call_tool("notes_fill", {"rows": 4000}).structured == {"result": 4000}
        killed = instance.call_tool("notes_mark_all_then_spin", {})
        assert killed.is_error and "longer than" in killed.text
        assert replay_episode(env.worlds, instance.episode) == instance.hash()
        got = instance.call_tool("notes_get_note", {"note_id": 4001})
        assert (got.is_error, got.structured) == (False, {"id": 4001, "title": "0" * 996 + "4000"})


def test_carried_code_that_does_not_load_is_refused(tmp_path: Path) -> None:
    worlds = _world(tmp_path / "store", "def broken(:\n    pass\n")
    with Environment(worlds, apps={}) as env, pytest.raises(AppPinError, match="SyntaxError"):
        env.open("p@0")
    worlds.close()


CLOCK_CODE = '''
from worldenv.core.app import App, ToolContext, ToolError

app = App(service="notes", name="clock-notes", version="0.1")


@app.tool(writes=False)
def when(ctx: ToolContext) -> list[str]:
    """The call's index and time as the tool and SQLite see them, and a random draw."""
    sql = ctx.row("SELECT datetime('now') AS now, random() AS draw")
    assert sql is not None
    return [str(ctx.call_index), ctx.now, str(sql["now"]), str(sql["draw"])]


@app.tool(writes=True)
def add_drawn(ctx: ToolContext, prefix: str) -> int:
    """Add a note titled by a random draw."""
    ctx.execute("INSERT INTO notes(title) SELECT ? || random() || datetime('now')", (prefix,))
    return int(ctx.value("SELECT MAX(id) FROM notes"))


@app.tool(writes=False)
def refuse(ctx: ToolContext) -> int:
    """Always refuses."""
    raise ToolError("refused")
'''


def test_a_carried_app_answers_as_the_same_code_in_process(tmp_path: Path) -> None:
    """The worker runs a call at the clock and seed the instance hands it: the same code,
    carried or in this process, gives the same responses, effects and final world."""
    namespace: dict[str, object] = {}
    exec(compile(CLOCK_CODE, "<clock app, in process>", "exec"), namespace)
    in_process = namespace["app"]
    assert isinstance(in_process, App)
    calls: list[tuple[str, dict[str, object]]] = [
        ("notes_when", {}), ("notes_add_drawn", {"prefix": "a"}), ("notes_when", {}),
        ("notes_add_drawn", {"prefix": 7}), ("notes_add_drawn", {}), ("notes_refuse", {}),
        ("notes_nope", {}), ("notes_add_drawn", {"prefix": "b"})]
    worlds = _world(tmp_path / "store", CLOCK_CODE)
    outcomes = []
    for apps, check_pins in (({}, True), ({"notes": in_process}, False)):
        with Environment(worlds, apps=apps, check_pins=check_pins) as environment, \
                environment.open("p@0") as instance:
            results = [instance.call_tool(name, args) for name, args in calls]
            outcomes.append((results, instance.episode.events, instance.hash()))
    worlds.close()
    carried, here = outcomes
    assert carried == here
    results = carried[0]
    assert results[0].structured == {"result": [
        "1", "2026-01-01T00:00:03Z", "2026-01-01 00:00:03", results[0].structured["result"][3]]}
    assert results[2].structured["result"][:2] == ["3", "2026-01-01T00:00:05Z"]
    assert results[0].text != results[2].text  # another call, another draw
    assert [r.is_error for r in results] == [False, False, False, True, True, True, True, False]
    assert "prefix" in results[4].text and results[5].text == "refused"
    assert sum(isinstance(e, DbChange) for e in carried[1]) == 2


def _spare_count(limits: WorkerLimits) -> int:
    from worldenv.sandbox import workers as worker_pool

    with worker_pool._SPARES._lock:
        return sum(1 for s in worker_pool._SPARES._ready.get(limits, [])
                   if s[0].poll() is None)


def _wait_for_spare(limits: WorkerLimits, timeout: float = 60.0) -> None:

    from worldenv.sandbox import workers as worker_pool

    deadline = time.monotonic() + timeout
    while _spare_count(limits) < 1:
        with worker_pool._SPARES._lock:
            state = [(s[0].pid, s[0].poll()) for s in worker_pool._SPARES._ready.get(
                limits, [])]
        assert time.monotonic() < deadline, f"no live spare (pid, exit): {state}"
        time.sleep(0.05)


def _spare_pids(limits: WorkerLimits) -> set[int]:
    from worldenv.sandbox import workers as worker_pool

    with worker_pool._SPARES._lock:
        return {s[0].pid for s in worker_pool._SPARES._ready.get(limits, [])
                if s[0].poll() is None}


def test_a_spare_worker_serves_other_code_in_a_sandbox_of_its_own(tmp_path: Path) -> None:
    """A spare (started ahead of need, no code loaded) becomes the worker of whichever code
    needs one next: it serves that code exactly, and it is a new process, never one that
    ran other carried code."""
    limits = WorkerLimits(timeout_s=3, spares=1, idle_s=301.0)  # a key of its own
    other = CODE + "\n# the same tools, another digest: another app's worker\n"
    first_store, second_store = _world(tmp_path / "a", CODE), _world(tmp_path / "b", other)
    pool = WorkerPool(limits)
    try:
        with Environment(first_store, apps={}, workers=pool) as env, env.open("p@0") as one:
            assert one.call_tool("notes_get_note", {"note_id": 1}).structured == {
                "id": 1, "title": "first"}
        first_pids = {w.pid for w in pool.workers()}
        _wait_for_spare(limits)
        # Spares are started by a thread that outlives them: bubblewrap's
        # --die-with-parent kills a sandbox whose starting thread ends (it once did here).
        time.sleep(1.0)
        spares = _spare_pids(limits)
        assert len(spares) == 1
        with Environment(second_store, apps={}, workers=pool) as env, env.open("q@0") as two:
            assert two.call_tool("notes_get_note", {"note_id": 1}).structured == {
                "id": 1, "title": "first of q"}
        pids = {w.pid for w in pool.workers()}
        assert len(pids) == 2 and None not in pids and first_pids < pids
        assert pids - first_pids == spares  # the other code's worker is the spare
        _wait_for_spare(limits)  # taking the spare started its replacement
        # A pool's worker survives the environments that used it (they do not own it);
        # releasing the code stops its workers.
        pool.release("notes", other)
        assert {w.pid for w in pool.workers()} == first_pids
    finally:
        pool.close()
        first_store.close()
        second_store.close()
    assert all(w.pid is None for w in pool.workers())


def test_a_shared_pool_serves_two_stores_on_one_cache_with_one_worker(tmp_path: Path) -> None:
    """Two stores whose snapshots share a cache (the synthesis smoke store and the user's
    store) are served by the same worker of the same code through a shared pool."""
    cache = tmp_path / "cache"
    stores = [Worlds.open(tmp_path / name, cache) for name in ("one", "two")]
    for store, persona in zip(stores, ("p", "q"), strict=True):
        lines = _log(persona, CODE, f"first of {persona}")
        store.import_stream(io.BytesIO(b"".join(json.dumps(line).encode() + b"\n"
                                                for line in lines)), source="w.jsonl")
    pool = WorkerPool(WorkerLimits(timeout_s=3))
    try:
        seen = []
        for store, persona in zip(stores, ("p", "q"), strict=True):
            with Environment(store, apps={}, workers=pool) as env, \
                    env.open(f"{persona}@0") as instance:
                seen.append(instance.call_tool("notes_get_note", {"note_id": 1}).structured)
        assert seen == [{"id": 1, "title": "first of p"}, {"id": 1, "title": "first of q"}]
        assert len(pool.workers()) == 1
    finally:
        pool.close()
        for store in stores:
            store.close()


def test_a_worker_started_by_a_thread_that_ended_keeps_serving(tmp_path: Path) -> None:
    """bubblewrap's --die-with-parent fires when the *thread* that started the sandbox
    ends: workers are started by a long-lived thread, so one first needed in a request's
    or a pool's thread is not killed when that thread ends (it was, and every call after
    paid a new worker's start)."""
    import threading

    worlds = _world(tmp_path / "store", CODE)
    pool = WorkerPool(WorkerLimits(timeout_s=3, idle_s=302.0))
    try:
        with Environment(worlds, apps={}, workers=pool) as env:
            seen: list[object] = []

            def first_call() -> None:
                with env.open("p@0") as instance:
                    seen.append(instance.call_tool("notes_get_note", {"note_id": 1}).structured)

            thread = threading.Thread(target=first_call)
            thread.start()
            thread.join()
            assert seen == [{"id": 1, "title": "first"}]
            (worker,) = pool.workers()
            pid = worker.pid
            time.sleep(1.5)
            assert worker.pid == pid is not None  # still running
            with env.open("p@0") as instance:
                assert not instance.call_tool("notes_get_note", {"note_id": 1}).is_error
            assert [w.pid for w in pool.workers()] == [pid]  # served by the same process
    finally:
        pool.close()
        worlds.close()
