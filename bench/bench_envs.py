"""Environments: tool-call latency by path, instance open + reset, many instances at once.

On the bundled demo world (``packs/demo/world/lars.jsonl``, instances of ``lars@7``,
four services, ~270 kB), with the shipped apps:

1. **Tool-call latency** of a read (``notes_get_note``) and a write (``notes_update_note``,
   a new title every call, so every call really writes), median of N sequential calls per
   path, the paths interleaved round by round (order rotated, a warm-up round discarded):

   * raw SQL (baseline floor): the SELECTs / UPDATE the tool runs, through apsw on an
     instance's notes database (same pragmas: ``synchronous=OFF``, autocommit);
   * **FastMCP direct** (the baseline of the ratios): ``await server.call_tool(name, args)``
     on a FastMCP server holding the same tool functions (same schemas and validation),
     built with ``Tool.from_function`` over a plain function on one apsw connection, with
     no recording (``bench/awm_server.py: plain_server``);
   * ``Instance.call_tool`` (sync, in the caller's thread) and ``await Instance.acall_tool``
     (async, in the caller's loop): the instance's one dispatch, no FastMCP server in it;
   * the in-memory MCP client: ``fastmcp.Client(instance_server(inst))``, and the same
     client on the plain server of (b) (what the MCP client path costs without us);
   * streamable HTTP on loopback (server in its own process, uvicorn, access log off):
     the plain FastMCP server of (b) (AWM-style), ``instance_server(inst).http_app()``,
     and the gateway (``worldenv.serving.gateway.Gateway``: REST-created instance, per-instance
     lock,
     tool calls in worker threads under a timeout).

   Target: ``await Instance.acall_tool`` <= 2x FastMCP direct.

2. **Instance open + reset** (``Environment.open("lars@7")``, two write calls, ``reset()``;
   the calls are not counted, except that a lazy instance — the default, which copies a
   service database on its first write — is charged what its first write costs beyond an
   eager instance's first write; the eager instance is measured too) against a plain copy (a
   fresh directory plus ``shutil.copyfile`` of every snapshot file; deleted right after,
   untimed, as an instance is closed), and against the peer baseline "one fresh server
   process per instance" as AWM does it: copy the database, start ``bench/awm_server.py``
   (FastMCP over streamable HTTP under uvicorn) on the copy, wait until ``list_tools``
   answers from a fastmcp client. Targets: open + reset <= 1.5x the copy, and >= 1000x
   faster than the process-per-instance start. The RSS of one such server process is read
   from ``/proc/<pid>/status``.

3. **Many instances** (child process, so its memory is its own): 1,024 instances of
   ``lars@7`` each making 20 calls (12 reads, 8 writes over all four services) through the
   async API in one event loop (``asyncio.gather``; each agent yields to the loop between
   calls): total time, calls/s, p50/p99 per-call latency, errors (must be 0), peak RSS,
   disk used; then every 32nd instance's episode is replayed (``apply_effects`` on a fresh
   ``worlds.mount(world_hash)``) and must give the instance's final hash; then all close.

4. **OpenEnv episodes**: one short episode (reset to ``lars@7``, one read step, the state,
   close) over the gateway's WebSocket session (``/ws``, one connection per episode, as
   OpenEnv's ``EnvClient`` makes it) against the per-instance HTTP form as its baseline
   (``POST /instances``, ``openenv/reset``, ``openenv/step``, ``GET openenv/state``,
   ``DELETE``, one kept-alive connection), sequential, interleaved round by round, the
   gateway in its own process: episodes per second of each.

    .venv/bin/python bench/bench_envs.py [--quick] [--calls N] [--http-calls N]
                                         [--rounds R] [--starts S] [--many N]
                                         [--episodes E]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from _common import (
    REPO,
    Report,
    Row,
    bench_parser,
    emit,
    fmt_bytes,
    fmt_rate,
    fmt_s,
    interleave,
    median,
    remove,
    scratch_dir,
    setup_run,
    snapshot_files,
    spread,
    time_plain_copy,
    tree_blocks,
)
from awm_server import NOW, plain_server

DEMO = REPO / "packs" / "demo" / "world" / "lars.jsonl"
REF = "lars@7"
NOTE = 4  # the note read and written in the latency rows
READ, WRITE = "notes_get_note", "notes_update_note"
TARGET_X_DIRECT = 2.0
TARGET_X_COPY = 1.5
TARGET_X_PROCESS = 1000.0
AWM_SERVER = Path(__file__).resolve().parent / "awm_server.py"
B = "envs"

# The SQL get_note / update_note run (worldenv/apps/notes.py: _note_row, _tags_of, update_note).
NOTE_ROW_SQL = """SELECT n.*, b.name AS notebook_name FROM notes n
                     JOIN notebooks b ON b.id = n.notebook_id WHERE n.id = ?"""
TAGS_SQL = ("SELECT t.name FROM note_tags nt JOIN tags t ON t.id = nt.tag_id "
            "WHERE nt.note_id = ? ORDER BY t.name")
UPDATE_SQL = "UPDATE notes SET title = ?, updated_at = ? WHERE id = ?"


# --- small helpers -------------------------------------------------------------------------


def proc_status(pid: int | str, field: str) -> int:
    """VmRSS / VmHWM of a process from /proc/<pid>/status, in bytes (0 where missing)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    """Until something accepts on the port (uvicorn binds after its startup is done)."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server process exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on port {port} after {timeout} s") from None
            time.sleep(0.005)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def percentile(sorted_xs: list[float], q: float) -> float:
    return sorted_xs[min(len(sorted_xs) - 1, int(len(sorted_xs) * q))]


def make_store(work: Path) -> Path:
    from replay.engine import Worlds

    store = work / "store"
    with Worlds.open(store) as worlds:
        worlds.import_file(DEMO)
    return store


# --- servers in child processes ------------------------------------------------------------


def serve_child(kind: str, port: int, store: Path) -> int:
    """`--serve instance|gateway`: one HTTP server until SIGTERM (the parent's client
    runs in another process, as an agent's would)."""
    import uvicorn

    from replay.engine import Worlds
    from worldenv.instances.instance import Environment
    from worldenv.serving.mcp import instance_server

    worlds = Worlds.open(store)
    env = Environment(worlds)
    inst = None
    if kind == "instance":
        inst = env.open(REF)
        app: Any = instance_server(inst).http_app()
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                access_log=False)
    else:
        from worldenv.serving.gateway import Gateway

        app = Gateway(env, max_instances=8, call_timeout=120.0, idle_timeout=3600.0)
        config = uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="on",
                                log_level="warning", access_log=False)
    try:
        uvicorn.Server(config).run()
    finally:
        if inst is not None:
            inst.close()
        worlds.close()
    return 0


def start_server(args: list[str], port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.DEVNULL)
    try:
        wait_port(port, proc)
    except BaseException:
        stop(proc)
        raise
    return proc


def gateway_instance(port: int) -> str:
    """Create an instance on the gateway over its REST API; its MCP URL."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/instances", method="POST",
        data=json.dumps({"world": REF, "mode": "tools"}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        info = json.loads(resp.read())
    return f"http://127.0.0.1:{port}{info['mcp_url']}"


# --- 1. tool-call latency ------------------------------------------------------------------

Batch = Callable[[str, int], Awaitable[tuple[list[float], int]]]


class Contender:
    """One call path: runs `n` sequential calls of the read or the write tool, timing
    each; counts error results."""

    def __init__(self, label: str, batch: Batch, per_round: int) -> None:
        self.label = label
        self.batch = batch
        self.per_round = per_round
        self.lat: dict[str, list[float]] = {READ: [], WRITE: []}
        self.round_medians: dict[str, list[float]] = {READ: [], WRITE: []}
        self.errors = 0


def _titles() -> Callable[[], str]:
    counter = iter(range(1, 1 << 62))
    return lambda: f"Bench title {next(counter)}"


def _args(tool: str, title: Callable[[], str]) -> dict[str, Any]:
    return {"note_id": NOTE} if tool == READ else {"note_id": NOTE, "title": title()}


async def latency(store: Path, n_inproc: int, n_http: int, rounds: int, *, http: bool = True
                  ) -> tuple[list[Row], dict[str, Any]]:
    """`http`: with the paths over HTTP (three servers, each a process of its own)."""
    import apsw
    from fastmcp import Client

    from replay.engine import Worlds
    from worldenv.instances.instance import Environment
    from worldenv.serving.mcp import instance_server

    worlds = Worlds.open(store)
    env = Environment(worlds)
    insts = {k: env.open(REF) for k in ("raw", "direct", "sync", "async", "memory", "awm")}
    procs: list[subprocess.Popen[bytes]] = []
    pc = time.perf_counter

    raw = apsw.Connection(str(insts["raw"].mount.db_path("notes")))
    raw.setbusytimeout(5000)
    raw.execute("PRAGMA synchronous=OFF")
    raw_title = _titles()

    def raw_sync(tool: str, n: int) -> tuple[list[float], int]:
        lat = []
        for _ in range(n):
            if tool == READ:
                t0 = pc()
                raw.execute(NOTE_ROW_SQL, (NOTE,)).fetchall()
                raw.execute(TAGS_SQL, (NOTE,)).fetchall()
            else:
                title = raw_title()
                t0 = pc()
                raw.execute(NOTE_ROW_SQL, (NOTE,)).fetchall()
                raw.execute(UPDATE_SQL, (title, NOW, NOTE))
                raw.execute(NOTE_ROW_SQL, (NOTE,)).fetchall()
                raw.execute(TAGS_SQL, (NOTE,)).fetchall()
            lat.append(pc() - t0)
        return lat, 0

    direct, direct_conn = plain_server(insts["direct"].mount.db_path("notes"), name="direct")
    direct_title = _titles()

    async def direct_batch(tool: str, n: int) -> tuple[list[float], int]:
        lat, errors = [], 0
        for _ in range(n):
            args = _args(tool, direct_title)
            t0 = pc()
            result = await direct.call_tool(tool, args)
            lat.append(pc() - t0)
            errors += bool(getattr(result, "is_error", False))
        return lat, errors

    sync_inst, sync_title = insts["sync"], _titles()

    def sync_calls(tool: str, n: int) -> tuple[list[float], int]:
        lat, errors = [], 0
        for _ in range(n):
            args = _args(tool, sync_title)
            t0 = pc()
            result = sync_inst.call_tool(tool, args)
            lat.append(pc() - t0)
            errors += result.is_error
        return lat, errors

    async_inst, async_title = insts["async"], _titles()

    async def async_batch(tool: str, n: int) -> tuple[list[float], int]:
        lat, errors = [], 0
        for _ in range(n):
            args = _args(tool, async_title)
            t0 = pc()
            result = await async_inst.acall_tool(tool, args)
            lat.append(pc() - t0)
            errors += result.is_error
        return lat, errors

    def client_batch(client: Client, title: Callable[[], str]) -> Batch:
        async def batch(tool: str, n: int) -> tuple[list[float], int]:
            lat, errors = [], 0
            for _ in range(n):
                args = _args(tool, title)
                t0 = pc()
                result = await client.call_tool(tool, args, raise_on_error=False)
                lat.append(pc() - t0)
                errors += bool(result.is_error)
            return lat, errors
        return batch

    def in_thread(fn: Callable[[str, int], tuple[list[float], int]]) -> Batch:
        async def batch(tool: str, n: int) -> tuple[list[float], int]:
            return await asyncio.to_thread(fn, tool, n)
        return batch

    try:
        ports = {k: free_port() for k in ("awm", "instance", "gateway")}
        if http:
            procs.append(start_server([str(AWM_SERVER),
                                       str(insts["awm"].mount.db_path("notes")),
                                       str(ports["awm"])], ports["awm"]))
            for kind in ("instance", "gateway"):
                procs.append(start_server([__file__, "--serve", kind, "--port",
                                           str(ports[kind]), "--store", str(store)],
                                          ports[kind]))
        async with AsyncExitStack() as stack:
            async def connect(target: Any) -> Client:
                return await stack.enter_async_context(Client(target, timeout=120))

            memory = await connect(instance_server(insts["memory"]))
            memory_plain = await connect(direct)
            per_in, per_http = max(1, n_inproc // rounds), max(1, n_http // rounds)
            contenders = {
                "raw": Contender("raw SQL (apsw, same statements)", in_thread(raw_sync),
                                 per_in),
                "direct": Contender("FastMCP direct: await server.call_tool (no recording)",
                                    direct_batch, per_in),
                "sync": Contender("Instance.call_tool (sync)", in_thread(sync_calls), per_in),
                "async": Contender("await Instance.acall_tool (async)", async_batch, per_in),
                "memory_plain": Contender("in-memory MCP client on the plain FastMCP "
                                          "server of FastMCP direct (no recording)",
                                          client_batch(memory_plain, _titles()), per_in),
                "memory": Contender("in-memory MCP client: Client(instance_server(inst))",
                                    client_batch(memory, _titles()), per_in),
            }
            if http:
                http_awm = await connect(f"http://127.0.0.1:{ports['awm']}/mcp")
                http_inst = await connect(f"http://127.0.0.1:{ports['instance']}/mcp")
                http_gw = await connect(gateway_instance(ports["gateway"]))
                contenders |= {
                    "http_awm": Contender("streamable HTTP: plain FastMCP server (AWM-style, "
                                          "no recording)", client_batch(http_awm, _titles()),
                                          per_http),
                    "http_inst": Contender("streamable HTTP: instance_server(inst)"
                                           ".http_app()", client_batch(http_inst, _titles()),
                                           per_http),
                    "http_gw": Contender("streamable HTTP: gateway (worldctl serve)",
                                         client_batch(http_gw, _titles()), per_http),
                }
            names = list(contenders)
            for r in range(rounds + 1):  # round 0: warm-up, discarded
                shift = r % len(names)
                for name in names[shift:] + names[:shift]:
                    c = contenders[name]
                    for tool in (READ, WRITE):
                        lat, errors = await c.batch(tool, c.per_round)
                        c.errors += errors
                        if r:
                            c.lat[tool] += lat
                            c.round_medians[tool].append(median(lat))
    finally:
        for proc in procs:
            stop(proc)
        raw.close()
        direct_conn.close()

    # Cross-checks: the instances recorded every write as a row change.
    recorded = {k: sum(type(e).__name__ == "DbChange" for e in insts[k].episode.events)
                for k in ("sync", "async", "memory")}
    expected_writes = (rounds + 1) * per_in
    for inst in insts.values():
        inst.close()
    worlds.close()

    base = {t: median(contenders["direct"].lat[t]) for t in (READ, WRITE)}
    rows: list[Row] = []
    for tool, kind in ((READ, "read"), (WRITE, "write")):
        for name, c in contenders.items():
            lat = sorted(c.lat[tool])
            med = median(lat)
            ratio = med / base[tool]
            is_target = name == "async"
            rows.append(Row(
                B, f"{kind} `{tool}`, {c.label}: median of {len(lat):,} calls (p99)",
                f"{fmt_s(med)} ({fmt_s(percentile(lat, 0.99))})",
                "" if name == "direct" else fmt_s(base[tool]) + " FastMCP direct",
                "" if name == "direct" else f"{ratio:.2f}x FastMCP direct",
                f"<= {TARGET_X_DIRECT:g}x FastMCP direct" if is_target else "",
                ratio <= TARGET_X_DIRECT if is_target else None))
    data = {
        name: {
            "label": c.label, "calls_per_round": c.per_round, "errors": c.errors,
            **{tool: {"median_s": median(c.lat[tool]),
                      "p99_s": percentile(sorted(c.lat[tool]), 0.99),
                      "mean_s": statistics.fmean(c.lat[tool]),
                      "round_medians_s": c.round_medians[tool],
                      "spread": spread(c.round_medians[tool])} for tool in (READ, WRITE)},
        } for name, c in contenders.items()
    }
    data["recorded_db_changes"] = recorded
    data["expected_db_changes"] = expected_writes
    data["errors_total"] = sum(c.errors for c in contenders.values())
    return rows, data


# --- 2. open + reset vs copy vs a process per instance ---------------------------------------


async def _list_tools(url: str) -> int:
    from fastmcp import Client

    async with Client(url, timeout=60) as client:
        return len(await client.list_tools())


def awm_start(db: Path, scratch: Path) -> tuple[float, int, int]:
    """Copy the database, start a server process on the copy, wait until list_tools
    answers. Returns (seconds, VmRSS, VmHWM of the server process)."""
    port = free_port()
    t0 = time.perf_counter()
    scratch.mkdir(parents=True, exist_ok=True)
    copy = scratch / "notes.sqlite"
    shutil.copyfile(db, copy)
    proc = subprocess.Popen([sys.executable, str(AWM_SERVER), str(copy), str(port)],
                            stdout=subprocess.DEVNULL)
    try:
        wait_port(port, proc)
        for attempt in range(100):
            try:
                tools = asyncio.run(_list_tools(f"http://127.0.0.1:{port}/mcp"))
                break
            except Exception:
                if attempt == 99 or proc.poll() is not None:
                    raise
                time.sleep(0.01)
        elapsed = time.perf_counter() - t0
        assert tools == 2, tools
        return elapsed, proc_status(proc.pid, "VmRSS"), proc_status(proc.pid, "VmHWM")
    finally:
        stop(proc)
        remove(scratch)


def open_reset(store: Path, rounds: int, starts: int, *, warm: bool = True
               ) -> tuple[list[Row], dict[str, Any]]:
    from replay.engine import Worlds
    from worldenv.instances.instance import Environment

    worlds = Worlds.open(store)
    envs = {"lazy": Environment(worlds), "eager": Environment(worlds, lazy=False)}
    record = worlds.resolve(REF)
    snapshot = worlds.snapshot(record.persona, record.day)
    files = snapshot_files(snapshot)
    n_bytes = sum(p.stat().st_size for _, p in files)
    steps: dict[str, dict[str, list[float]]] = {
        kind: {"open": [], "first_call": [], "second_call": [], "reset": [], "close": []}
        for kind in envs}
    checked: list[bool] = []
    titles = _titles()

    def t_copy() -> float:
        return time_plain_copy(worlds.cache.scratch, files)

    def t_open_reset(kind: str) -> float:
        """open + reset, plus what the first write costs beyond a second one: a lazy
        instance copies the service database on its first write, and that copy is part
        of making an instance, not of the call."""
        env = envs[kind]
        t0 = time.perf_counter()
        inst = env.open(REF)
        t1 = time.perf_counter()
        result = inst.call_tool(WRITE, {"note_id": NOTE, "title": titles()})
        t2 = time.perf_counter()
        inst.call_tool(WRITE, {"note_id": NOTE, "title": titles()})
        t3 = time.perf_counter()
        inst.reset()
        t4 = time.perf_counter()
        if len(checked) < len(envs):  # once each, untimed: the write happened, reset undid it
            checked.append(not result.is_error and inst.hash() == record.world_hash)
        inst.close()
        t5 = time.perf_counter()
        for name, dt in (("open", t1 - t0), ("first_call", t2 - t1), ("second_call", t3 - t2),
                         ("reset", t4 - t3), ("close", t5 - t4)):
            steps[kind][name].append(dt)
        return (t1 - t0) + (t4 - t3)

    contenders = {"copy": t_copy, "lazy": lambda: t_open_reset("lazy"),
                  "eager": lambda: t_open_reset("eager")}
    for fn in contenders.values():  # warm-up
        fn()
    for per_kind in steps.values():
        for v in per_kind.values():
            v.clear()
    every = max(1, rounds // max(1, starts))
    times: dict[str, list[float]] = {k: [] for k in contenders}
    awm: list[tuple[float, int, int]] = []
    db = snapshot / "services" / "notes.sqlite"
    if warm:  # imports in the page cache
        awm_start(db, worlds.cache.scratch())
    names = list(contenders)
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name, got in interleave({k: contenders[k] for k in order}, 1).items():
            times[name] += got
        if r % every == 0 and len(awm) < starts:
            awm.append(awm_start(db, worlds.cache.scratch()))
    for env in envs.values():
        env.close()
    worlds.close()

    med = {kind: {k: median(v) for k, v in per.items()} for kind, per in steps.items()}
    # What a lazy instance's first write costs beyond an eager one's first write (both
    # open their connection then; only the lazy one copies notes.sqlite): counted as ours.
    lazy_copy_s = max(0.0, (med["lazy"]["first_call"] - med["lazy"]["second_call"])
                      - (med["eager"]["first_call"] - med["eager"]["second_call"]))
    copy_s, eager_s = median(times["copy"]), median(times["eager"])
    ours_s = median(times["lazy"]) + lazy_copy_s
    awm_s = median([a[0] for a in awm])
    awm_rss = median([a[1] for a in awm])
    awm_hwm = median([a[2] for a in awm])
    size = f"{fmt_bytes(n_bytes)}, {len(files)} files"
    rows = [
        Row(B, f"open + reset() around one write call, `{REF}` ({size}); lazy instance, "
               "its first-write copy counted", fmt_s(ours_s), fmt_s(copy_s) + " copy",
            f"{ours_s / copy_s:.2f}x copy",
            f"<= {TARGET_X_COPY:g}x copy", ours_s <= TARGET_X_COPY * copy_s),
        Row(B, "  Environment.open alone / reset() after the write",
            f"{fmt_s(med['lazy']['open'])} / {fmt_s(med['lazy']['reset'])}",
            fmt_s(copy_s) + " copy",
            f"{med['lazy']['open'] / copy_s:.2f}x / {med['lazy']['reset'] / copy_s:.2f}x"),
        Row(B, "  the lazy copy on the first write (first minus second write call, beyond "
               "the same difference on an eager instance), counted above", fmt_s(lazy_copy_s)),
        Row(B, "  the write calls themselves (sync API; not counted): first / second, "
               "lazy and eager",
            f"{fmt_s(med['lazy']['first_call'])} / {fmt_s(med['lazy']['second_call'])}, "
            f"{fmt_s(med['eager']['first_call'])} / {fmt_s(med['eager']['second_call'])}"),
        Row(B, "open + reset(), eager instance (Environment(lazy=False): all copied at open)",
            fmt_s(eager_s), fmt_s(copy_s) + " copy", f"{eager_s / copy_s:.2f}x copy"),
        Row(B, f"process per instance (AWM-style): copy db + start FastMCP/uvicorn server "
               f"+ list_tools answered, median of {len(awm)}",
            fmt_s(awm_s), fmt_s(ours_s) + " open + reset",
            f"{awm_s / ours_s:,.0f}x ours (eager: {awm_s / eager_s:,.0f}x; the plain copy "
            f"alone: {awm_s / copy_s:,.0f}x)",
            f">= {TARGET_X_PROCESS:,.0f}x ours", awm_s >= TARGET_X_PROCESS * ours_s),
        Row(B, "  reset() alone vs a fresh process (AWM's reset: new copy, new server)",
            fmt_s(med["lazy"]["reset"]), fmt_s(awm_s) + " process",
            f"{awm_s / med['lazy']['reset']:,.0f}x ours"),
        Row(B, "  RSS of one baseline server process (VmRSS / VmHWM)",
            f"{fmt_bytes(awm_rss)} / {fmt_bytes(awm_hwm)}"),
    ]
    data = {
        "bytes": n_bytes, "files": len(files), "world_hash": record.world_hash,
        "seconds": times, "steps_s": steps, "spread": {k: spread(v) for k, v in times.items()},
        "reset_restores_hash": all(checked),
        "awm_starts": [{"s": s, "vmrss_bytes": rss, "vmhwm_bytes": hwm} for s, rss, hwm in awm],
        "awm_s": awm_s, "awm_vmrss_bytes": awm_rss, "awm_vmhwm_bytes": awm_hwm,
    }
    return rows, data


# --- 3. many instances (child process) -------------------------------------------------------

NOTES = (1, 2, 4, 5, 6, 7, 8, 9, 10)  # note 3 was deleted on day 6
PRODUCTS = tuple(p for p in range(1, 75) if p != 61)  # 61 is out of stock; others >= 2


def plan(i: int) -> list[tuple[str, dict[str, Any]]]:
    """Twenty calls (12 reads, 8 writes) over the four services, varied by agent."""
    note, conv, product = NOTES[i % len(NOTES)], 1 + i % 7, PRODUCTS[i % len(PRODUCTS)]
    event, notebook = 1 + i % 12, 1 + i % 4
    day = 10 + i % 18
    return [
        ("notes_get_note", {"note_id": note}),
        ("chat_read_conversation", {"conversation_id": conv, "limit": 20}),
        ("notes_update_note", {"note_id": note, "append": f"agent {i}: checked"}),
        ("shop_get_product", {"product_id": product}),
        ("chat_send_message", {"conversation_id": conv, "body": f"agent {i} checking in"}),
        ("calendar_get_event", {"event_id": event}),
        ("notes_search_notes", {"query": "nordlys"}),
        ("shop_add_to_cart", {"product_id": product, "quantity": 1}),
        ("calendar_list_events", {"date_from": "2026-03-09", "date_to": "2026-03-16"}),
        ("calendar_create_event", {
            "calendar_id": 1 + i % 3, "title": f"Agent {i} follow-up",
            "start_at": f"2026-03-{day:02d}T10:00:00+01:00",
            "end_at": f"2026-03-{day:02d}T11:00:00+01:00"}),
        ("notes_list_notes", {"limit": 5}),
        ("shop_update_cart_item", {"product_id": product, "quantity": 2}),
        ("chat_list_conversations", {}),
        ("notes_tag_note", {"note_id": note, "add": [f"agent-{i}"]}),
        ("shop_get_cart", {}),
        ("chat_mark_read", {"conversation_id": conv}),
        ("shop_search_products", {"query": "hdmi", "limit": 5}),
        ("notes_get_note", {"note_id": note}),
        ("notes_create_note", {"notebook_id": notebook, "title": f"Agent {i} log",
                               "body": f"Twenty calls by agent {i}."}),
        ("chat_read_conversation", {"conversation_id": conv}),
    ]


def many_child(store: Path, n: int, calls: int, verify_every: int) -> dict[str, Any]:
    from replay.engine import Worlds
    from worldenv.core.episode import Episode, apply_effects
    from worldenv.instances.instance import Environment, Instance

    worlds = Worlds.open(store)
    env = Environment(worlds)
    with env.open(REF) as warm:  # warm-up: imports, tool set, snapshot lookups
        for name, args in plan(0)[:calls]:
            warm.call_tool(name, args)
        writes = sum(warm.tools[name].writes for name, _ in plan(0)[:calls])
    rss_before = proc_status("self", "VmRSS")
    st0 = os.statvfs(store)

    t0 = time.perf_counter()
    insts: list[Instance] = [env.open(REF) for _ in range(n)]
    open_s = time.perf_counter() - t0
    rss_opened = proc_status("self", "VmRSS")

    latencies: list[float] = []
    errors: list[str] = []

    async def agent(i: int, inst: Instance) -> None:
        pc = time.perf_counter
        for name, args in plan(i)[:calls]:
            t = pc()
            result = await inst.acall_tool(name, args)
            latencies.append(pc() - t)
            if result.is_error:
                errors.append(f"instance {i}: {name}: {result.text[:200]}")
            await asyncio.sleep(0)  # an agent waits for its model between calls

    async def run_all() -> list[Any]:
        return await asyncio.gather(*(agent(i, inst) for i, inst in enumerate(insts)),
                                    return_exceptions=True)

    t0 = time.perf_counter()
    outcomes = asyncio.run(run_all())
    calls_s = time.perf_counter() - t0
    errors += [f"exception: {o!r}" for o in outcomes if isinstance(o, BaseException)]
    rss_after = proc_status("self", "VmRSS")
    st1 = os.statvfs(store)
    blocks = sum(tree_blocks(inst.mount.path) for inst in insts)

    t0 = time.perf_counter()
    checked, ok = 0, 0
    for inst in insts[::verify_every]:
        final = inst.hash()
        episode = Episode.from_json(inst.episode.to_json())
        with worlds.mount(inst.record.world_hash) as fresh:
            apply_effects(fresh, episode.events)
            ok += fresh.hash() == final and final != inst.record.world_hash
        checked += 1
    verify_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    for inst in insts:
        inst.close()
    close_s = time.perf_counter() - t0
    st2 = os.statvfs(store)
    worlds.close()
    latencies.sort()
    return {
        "n": n, "calls_per_instance": calls, "calls": len(latencies),
        "open_s": open_s, "calls_s": calls_s, "verify_s": verify_s, "close_s": close_s,
        "calls_per_s": len(latencies) / calls_s,
        "p50_s": statistics.median(latencies), "p99_s": percentile(latencies, 0.99),
        "max_s": latencies[-1], "errors": len(errors), "error_samples": errors[:5],
        "verified": checked, "verified_ok": ok,
        "vmhwm_bytes": proc_status("self", "VmHWM"), "rss_before_bytes": rss_before,
        "rss_opened_bytes": rss_opened, "rss_after_bytes": rss_after,
        "blocks_bytes": blocks, "df_delta_bytes": (st0.f_bavail - st1.f_bavail) * st0.f_frsize,
        "df_after_close_delta_bytes": (st0.f_bavail - st2.f_bavail) * st0.f_frsize,
        "writes_per_instance": writes, "verify_every": verify_every,
    }


def many_rows(d: dict[str, Any], awm_rss: float) -> list[Row]:
    n, c = d["n"], d["calls_per_instance"]
    writes = d["writes_per_instance"]
    per_inst_rss = (d["rss_after_bytes"] - d["rss_before_bytes"]) / n
    return [
        Row(B, f"{n:,} instances x {c} calls ({c - writes} reads, {writes} writes), async "
               "API, one event loop (asyncio.gather): time for all calls",
            fmt_s(d["calls_s"]), "", f"{fmt_rate(d['calls_per_s'], 'calls')} = "
            f"{fmt_s(d['calls_s'] / d['calls'])} of loop time per call"),
        Row(B, "  per-call latency p50 / p99 (max), queueing in the loop included",
            f"{fmt_s(d['p50_s'])} / {fmt_s(d['p99_s'])} ({fmt_s(d['max_s'])})"),
        Row(B, "  errors (error results + exceptions)", f"{d['errors']:,}", "", "", "0",
            d["errors"] == 0),
        Row(B, f"  opening the {n:,} instances (before the calls)", fmt_s(d["open_s"]), "",
            f"{fmt_s(d['open_s'] / n)}/instance"),
        Row(B, "  peak RSS of the process (VmHWM)", fmt_bytes(d["vmhwm_bytes"]),
            f"{fmt_bytes(d['rss_before_bytes'])} RSS before opening",
            f"+{fmt_bytes(per_inst_rss)}/instance vs {fmt_bytes(awm_rss)}/process AWM-style"),
        Row(B, "  disk used by the instances (sum st_blocks*512 / df delta)",
            f"{fmt_bytes(d['blocks_bytes'])} / {fmt_bytes(d['df_delta_bytes'])}", "",
            f"{fmt_bytes(d['blocks_bytes'] / n)}/instance"),
        Row(B, f"  1 in every {d['verify_every']} instances: its episode replayed "
               "onto a fresh mount gives its final hash",
            f"{d['verified_ok']}/{d['verified']}", "", f"in {fmt_s(d['verify_s'])}",
            "all", d["verified_ok"] == d["verified"]),
        Row(B, f"  close all {n:,}", fmt_s(d["close_s"]), "",
            f"df after close: {fmt_bytes(d['df_after_close_delta_bytes'])} vs start"),
    ]


# --- 4. OpenEnv episodes: the WebSocket session vs the per-instance HTTP form -------------


async def ws_episode(url: str) -> None:
    """One episode as OpenEnv's EnvClient plays it: a connection, reset, step, state,
    close."""
    from websockets.asyncio.client import connect

    async with connect(url) as ws:
        for message in ({"type": "reset", "data": {"world": REF}},
                        {"type": "step", "data": {"tool": READ, "arguments": {"note_id": NOTE}}},
                        {"type": "state"}):
            await ws.send(json.dumps(message))
            answer = json.loads(await ws.recv())
            if answer["type"] == "error":
                raise RuntimeError(answer["data"]["message"])
        await ws.send(json.dumps({"type": "close"}))


def http_episode(conn: http.client.HTTPConnection) -> None:
    """The same episode on an instance's OpenEnv HTTP form, over one kept-alive
    connection."""

    def ask(method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        conn.request(method, path, None if body is None else json.dumps(body),
                     {"Content-Type": "application/json"})
        answer = conn.getresponse()
        data = answer.read()
        if answer.status >= 400:
            raise RuntimeError(data.decode())
        return json.loads(data)

    iid = ask("POST", "/instances", {"world": REF})["id"]
    ask("POST", f"/instances/{iid}/openenv/reset", {})
    ask("POST", f"/instances/{iid}/openenv/step",
        {"action": {"tool": READ, "arguments": {"note_id": NOTE}}})
    ask("GET", f"/instances/{iid}/openenv/state")
    ask("DELETE", f"/instances/{iid}")


def openenv_episodes(store: Path, episodes: int, rounds: int) -> tuple[list[Row],
                                                                       dict[str, Any]]:
    port = free_port()
    proc = start_server([__file__, "--serve", "gateway", "--port", str(port), "--store",
                         str(store)], port)
    times: dict[str, list[float]] = {"ws": [], "http": []}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    per_round = max(1, episodes // rounds)

    async def ws_round() -> None:
        for _ in range(per_round):
            started = time.perf_counter()
            await ws_episode(f"ws://127.0.0.1:{port}/ws")
            times["ws"].append(time.perf_counter() - started)

    def http_round() -> None:
        for _ in range(per_round):
            started = time.perf_counter()
            http_episode(conn)
            times["http"].append(time.perf_counter() - started)

    def ws_round_run() -> None:
        asyncio.run(ws_round())

    try:
        ws_round_run()  # a warm-up round of each, discarded
        http_round()
        for kept in times.values():
            kept.clear()
        for r in range(rounds):
            for run_one in ((ws_round_run, http_round) if r % 2 == 0
                            else (http_round, ws_round_run)):
                run_one()
    finally:
        conn.close()
        stop(proc)
    ws, base = median(times["ws"]), median(times["http"])
    data = {"episodes": len(times["ws"]), "ws_median_s": ws, "http_median_s": base}
    rows = [Row(B, f"OpenEnv episode (reset `{REF}`, one read step, state, close), "
                   "WebSocket session /ws vs the per-instance HTTP form; median of "
                   f"{len(times['ws'])} each",
                f"{fmt_s(ws)} = {fmt_rate(1 / ws, 'episodes')}",
                f"{fmt_s(base)} = {fmt_rate(1 / base, 'episodes')}",
                f"HTTP/WebSocket = {base / ws:.2f}")]
    return rows, data


# --- main ----------------------------------------------------------------------------------


def run(a: argparse.Namespace) -> Report:
    work = scratch_dir("envs")
    report = Report("envs", {"calls": a.calls, "http_calls": a.http_calls, "rounds": a.rounds,
                             "open_rounds": a.open_rounds, "starts": a.starts, "many": a.many,
                             "many_calls": a.many_calls, "episodes": a.episodes,
                             "world": REF})
    store = make_store(work)
    rows1, data1 = asyncio.run(latency(store, a.calls, a.http_calls, a.rounds,
                                       http=not a.quick))
    if a.quick:
        report.notes.append("quick run: no HTTP paths (their three servers are processes "
                            "of their own)")
    rows2, data2 = open_reset(store, a.open_rounds, a.starts, warm=not a.quick)
    out = subprocess.run(
        [sys.executable, __file__, "--many-child", str(a.many), "--many-calls",
         str(a.many_calls), "--store", str(store)],
        capture_output=True, text=True, check=True)
    many = json.loads(out.stdout)
    rows4, data4 = openenv_episodes(store, a.episodes, 1 if a.quick else 5)
    report.rows += rows1 + rows2 + many_rows(many, data2["awm_vmrss_bytes"]) + rows4
    report.data = {"latency": data1, "open_reset": data2, "many": many, "openenv": data4}
    if data1["errors_total"]:
        report.notes.append(f"WARNING: {data1['errors_total']} error results in the latency "
                            "runs")
    bad = {k: v for k, v in data1["recorded_db_changes"].items()
           if v != data1["expected_db_changes"]}
    if bad:
        report.notes.append(f"WARNING: recorded row changes {bad}, expected "
                            f"{data1['expected_db_changes']} each")
    if not data2["reset_restores_hash"]:
        report.notes.append("WARNING: after reset the instance hashed differently")
    if many["error_samples"]:
        report.notes.append(f"errors in the many-instances run: {many['error_samples']}")
    lat = data1
    report.notes += [
        "Latency: per-call medians over all rounds (the warm-up round discarded); the paths "
        "interleave round by round, order rotated. Spread of the per-round medians (s): "
        + "; ".join(f"{k} read {v[READ]['spread']}, write {v[WRITE]['spread']}"
                    for k, v in lat.items() if isinstance(v, dict) and READ in v) + ".",
        "The HTTP servers run in their own processes on loopback (uvicorn, access log off), "
        "the client (fastmcp, one session, sequential calls) in this one; the machine's "
        "cores are shared by both.",
        f"Open + reset: spread (min..max s) {data2['spread']}; the process-per-instance "
        f"starts took {spread([s['s'] for s in data2['awm_starts']])} s.",
        "Many instances: a call of a shipped app's tool runs to its end without yielding to "
        "the event loop (no FastMCP server in the call), so a call's latency is mostly its own "
        "run (plus, for writes, the first-write copy); the loop time per call "
        "(total / calls) is the cost of a call under this load. The RSS an instance "
        "adds is mostly SQLite's, per connection (one per service used: prepared-statement "
        "cache, page cache, lookaside, schema).",
    ]
    remove(work)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("tool-call latency by path, instance open + reset, many concurrent "
                      "instances")
    ap.add_argument("--calls", type=int, help="in-process calls per path and tool")
    ap.add_argument("--http-calls", type=int, help="HTTP calls per path and tool")
    ap.add_argument("--rounds", type=int, help="rounds the latency calls are split into")
    ap.add_argument("--open-rounds", type=int, help="rounds of copy vs open + reset")
    ap.add_argument("--starts", type=int, help="process-per-instance starts")
    ap.add_argument("--many", type=int, help="concurrent instances")
    ap.add_argument("--many-calls", type=int, default=20, help="calls per instance")
    ap.add_argument("--episodes", type=int, help="OpenEnv episodes per form")
    ap.add_argument("--many-child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--serve", choices=("instance", "gateway"), help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--store", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.serve:
        return serve_child(a.serve, a.port, a.store)
    if a.many_child is not None:
        n = a.many_child
        print(json.dumps(many_child(a.store, n, a.many_calls, max(1, min(32, n // 8)))))
        return 0
    setup_run(a)
    a.calls = a.calls or (20 if a.quick else 2_000)
    a.http_calls = a.http_calls or (4 if a.quick else 300)
    a.rounds = a.rounds or (2 if a.quick else 10)
    a.open_rounds = a.open_rounds or (2 if a.quick else 30)
    a.starts = a.starts or (1 if a.quick else 10)
    a.many = a.many or (8 if a.quick else 1_024)
    a.episodes = a.episodes or (4 if a.quick else 200)
    emit(run(a))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
