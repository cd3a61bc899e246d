"""AWM environments served natively (the AWM adapter) against AWM's own way of serving them.

    .venv/bin/python bench/bench_awm.py [--quick] [--rounds R] [--starts S] [--calls N]

On content_platform_1 (AWM's generated FastAPI + SQLAlchemy server, 34 routes, from
``tests/fixtures/awm-1k-samples`` or ``--samples DIR``), imported with
``awmbridge.importer.import_awm``:

1. **open + reset + first tool call.** Ours: ``Environment.open`` of the imported world,
   one tool call (``get_channel_by_id``, through the carried app's sandboxed worker, which
   is already running: a worker serves every instance of the same code), ``reset()``; the
   lazy instance's first-call copy of the database is inside the call. AWM's way, as
   OpenEnv runs it on every reset: rebuild the database from the DDL, indexes and INSERTs
   with the standard library's sqlite3, start a server process running the generated app
   (FastAPI wrapped as MCP tools by ``FastMCP.from_fastapi``, streamable HTTP under
   uvicorn: the project's equivalent of fastapi-mcp) and wait until ``list_tools``
   answers (its first tool call is timed on top, separately). Target >= 1,000x.
2. **a tool call.** ``Instance.call_tool`` of an AWM route (read ``get_channel_by_id``,
   write ``set_default_playback_quality``) against a shipped app's call on the demo world
   (``notes_get_note`` / ``notes_update_note`` on ``lars@7``), both sync on an open
   instance, interleaved round by round. Target <= 3x. Also: both through an in-memory MCP
   client (``Client(instance_server(inst))``), and AWM's own server's call over HTTP.

The baseline server runs the generated code in a process of its own, as AWM does (not in
this process, and not sandboxed: that is AWM's way). It is an emulation of AWM's start, not
AWM's package. AWM's own start is measured beside it when a venv with AWM's package is
found (``--awm-venv``, else the tests' built ``awm`` peer venv): ``awm env reset_db`` then
``awm env start`` until its MCP endpoint lists the tools; without one a note says it was
not measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import (
    REPO,
    Report,
    Row,
    bench_parser,
    emit,
    fmt_s,
    interleave,
    median,
    remove,
    scratch_dir,
    setup_run,
    spread,
)

B = "awm"
SCENARIO = "content_platform_1"
REF = f"{SCENARIO}@0"
DEMO_REF = "lars@7"
DEFAULT_SAMPLES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "awm-1k-samples"
TARGET_X_START = 1_000
TARGET_X_CALL = 3.0
READ = ("get_channel_by_id", {"channel_id": 1})
WRITE = ("set_default_playback_quality", {"default_playback_quality": "720p"})
DEMO_READ = ("notes_get_note", {"note_id": 1})
DEMO_WRITE = "notes_update_note"


def _scenario_line(samples: Path, file: str) -> dict[str, Any]:
    for line in (samples / file).read_text(encoding="utf-8").splitlines():
        data = json.loads(line)
        if data.get("scenario") == SCENARIO:
            return dict(data)
    raise SystemExit(f"{samples / file}: no line for {SCENARIO}")


def awm_statements(samples: Path) -> list[str]:
    """DDL, indexes, INSERTs in AWM's order (what AWM's environment setup runs)."""
    db = _scenario_line(samples, "gen_db.jsonl")["db_schema"]["tables"]
    sample = _scenario_line(samples, "gen_sample.jsonl")["sample_data"]["tables"]
    return ([t["ddl"] for t in db] + [ix for t in db for ix in t["indexes"]]
            + [s for t in sample for s in t["insert_statements"]])


# --- AWM's way: rebuild + server process ---------------------------------------------------


def serve_awm(code_file: Path, db: Path, port: int) -> int:
    """`--serve-awm`: the generated app on `db`, as MCP tools over streamable HTTP."""
    import uvicorn
    from fastmcp import FastMCP

    os.environ["DATABASE_PATH"] = f"sqlite:///{db}"
    scope: dict[str, Any] = {"__name__": "awm_generated"}
    sys.modules["awm_generated"] = type(sys)("awm_generated")
    sys.modules["awm_generated"].__dict__.update(scope)
    scope = sys.modules["awm_generated"].__dict__
    exec(compile(code_file.read_text(encoding="utf-8"), str(code_file), "exec"), scope)
    server = FastMCP.from_fastapi(scope["app"], name=SCENARIO)
    config = uvicorn.Config(server.http_app(), host="127.0.0.1", port=port,
                            log_level="warning", access_log=False)
    uvicorn.Server(config).run()
    return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rebuild(statements: list[str], db: Path) -> None:
    db.unlink(missing_ok=True)
    conn = sqlite3.connect(db)
    try:
        for sql in statements:
            conn.execute(sql)
        conn.commit()
    finally:
        conn.close()


async def _until_listed(url: str, proc: subprocess.Popen[bytes], first_call: bool
                        ) -> tuple[float, float]:
    """Seconds until list_tools answered (then until a first call answered)."""
    from fastmcp import Client

    t0 = time.perf_counter()
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the AWM server exited with {proc.returncode}")
        try:
            async with Client(url, timeout=60) as client:
                tools = await client.list_tools()
                listed = time.perf_counter()
                assert len(tools) == 34, len(tools)
                if first_call:
                    got = await client.call_tool(READ[0], READ[1])
                    assert not got.is_error, got
                return listed - t0, time.perf_counter() - t0
        except (OSError, RuntimeError) as exc:
            if proc.poll() is not None:
                raise RuntimeError(f"the AWM server exited with {proc.returncode}") from exc
            await asyncio.sleep(0.005)
        except Exception:  # the server is not listening yet (httpx's connect errors)
            await asyncio.sleep(0.005)


def awm_start(statements: list[str], code_file: Path, scratch: Path
              ) -> tuple[float, float, float]:
    """Rebuild the database, start the server, wait for list_tools, call once: seconds
    (rebuild, rebuild + start + list_tools, ... + first call)."""
    scratch.mkdir(parents=True, exist_ok=True)
    db = scratch / f"{SCENARIO}.db"
    port = free_port()
    t0 = time.perf_counter()
    rebuild(statements, db)
    rebuilt = time.perf_counter() - t0
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve-awm", str(code_file), "--db", str(db),
         "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        listed, called = asyncio.run(_until_listed(f"http://127.0.0.1:{port}/mcp", proc,
                                                   True))
        started = time.perf_counter() - t0
        return rebuilt, started - (called - listed), started
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def awm_calls(code_file: Path, statements: list[str], scratch: Path, n: int
                    ) -> dict[str, float]:
    """Per-call medians of AWM's own server over streamable HTTP (one session)."""
    from fastmcp import Client

    scratch.mkdir(parents=True, exist_ok=True)
    db = scratch / f"{SCENARIO}-calls.db"
    rebuild(statements, db)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve-awm", str(code_file), "--db", str(db),
         "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await _until_listed(f"http://127.0.0.1:{port}/mcp", proc, False)
        out: dict[str, float] = {}
        async with Client(f"http://127.0.0.1:{port}/mcp", timeout=60) as client:
            for name, args in (READ, WRITE):
                times = []
                for _ in range(n + 1):
                    t0 = time.perf_counter()
                    got = await client.call_tool(name, args)
                    times.append(time.perf_counter() - t0)
                    assert not got.is_error
                out[name] = median(times[1:])
        return out
    finally:
        proc.terminate()
        proc.wait(15)


# --- AWM's own package: `awm env reset_db` + `awm env start` -----------------------------

# Where the tests' peer venvs are kept (tests/support/peer_venv.py builds the `awm` one).
PEER_VENVS = Path(os.environ.get("WORLDCTL_TEST_PEER_CACHE",
                                 Path.home() / ".cache" / "agent-worlds" / "peer-venvs"))


def find_awm(given: Path | None) -> Path | None:
    """The `awm` console script of a venv with AWM's package (``agent-world-model``):
    `given` (--awm-venv), else a built peer venv of the tests; None when there is none."""
    if given is not None:
        script = given / "bin" / "awm"
        if not script.is_file():
            raise SystemExit(f"error: --awm-venv {given}: no bin/awm (pip install "
                             "agent-world-model==0.1.0 'mcp>=1.20,<2' into it)")
        return script
    for folder in sorted(PEER_VENVS.glob("awm-*"), key=lambda f: f.stat().st_mtime,
                         reverse=True):
        if (folder / "ready").is_file() and (folder / "venv" / "bin" / "awm").is_file():
            return folder / "venv" / "bin" / "awm"
    return None


def _awm_env() -> dict[str, str]:
    # AWM's imports take seconds more each run compiled from source: let them be cached.
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE")}


def awm_own_start(awm: Path, samples: Path, scratch: Path) -> tuple[float, float]:
    """AWM's own reset and start of content_platform_1: `awm env reset_db` (its database
    from gen_db + gen_sample), then `awm env start` until its MCP endpoint lists the 34
    tools. Seconds (reset_db, reset_db + start + list_tools)."""
    scratch.mkdir(parents=True, exist_ok=True)
    dbs = scratch / "databases"
    remove(dbs)
    port = free_port()
    t0 = time.perf_counter()
    subprocess.run([str(awm), "env", "reset_db", "--input_db", str(samples / "gen_db.jsonl"),
                    "--input_sample", str(samples / "gen_sample.jsonl"), "--database_dir",
                    str(dbs), "--scenarios", SCENARIO], env=_awm_env(), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    reset = time.perf_counter() - t0
    # start_new_session: `awm env start` runs the server as a child of its own (os.system)
    proc = subprocess.Popen(
        [str(awm), "env", "start", "--scenario", SCENARIO, "--envs_load_path",
         str(samples / "gen_envs.jsonl"), "--db_path", str(dbs / f"{SCENARIO}.db"),
         "--port", str(port), "--temp_server_path", str(scratch / "temp_server.py")],
        env=_awm_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    try:
        asyncio.run(_until_listed(f"http://127.0.0.1:{port}/mcp", proc, False))
        return reset, time.perf_counter() - t0
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# --- ours --------------------------------------------------------------------------------


def make_store(work: Path, samples: Path) -> Path:
    from awmbridge.importer import import_awm
    from packs.registry import load_pack
    from replay.engine import Worlds

    store = work / "store"
    with Worlds.open(store) as worlds:
        report = import_awm(worlds, samples, scenarios=[SCENARIO])
        if not report.ok or not report.imported:
            raise SystemExit(f"import of {SCENARIO} failed: {report.as_dict()}")
        for log in load_pack("demo").worlds:
            worlds.import_file(log)
    return store


def open_reset(store: Path, statements: list[str], code_file: Path, rounds: int,
               starts: int, *, warm: bool = True) -> tuple[list[Row], dict[str, Any]]:
    from replay.engine import Worlds
    from worldenv.instances.instance import Environment

    worlds = Worlds.open(store)
    env = Environment(worlds)
    record = worlds.record(REF)
    t0 = time.perf_counter()
    with env.open(REF) as cold:  # the first open starts the app's worker and loads the code
        cold_open = time.perf_counter() - t0
        assert not cold.call_tool(f"awm_{READ[0]}", READ[1]).is_error
    steps: dict[str, list[float]] = {"open": [], "reset": [], "first_call": [],
                                     "episode_reset": [], "episode_first_call": []}
    checked: list[bool] = []
    reused = env.open(REF)

    def ours() -> float:
        """A new instance: open, reset, first call (closing it is not timed, as stopping
        AWM's previous server is not)."""
        t0 = time.perf_counter()
        inst = env.open(REF)
        t1 = time.perf_counter()
        inst.reset()
        t2 = time.perf_counter()
        result = inst.call_tool(f"awm_{READ[0]}", READ[1])
        t3 = time.perf_counter()
        inst.close()
        assert not result.is_error, result.text
        for name, dt in (("open", t1 - t0), ("reset", t2 - t1), ("first_call", t3 - t2)):
            steps[name].append(dt)
        return t3 - t0

    def episode() -> float:
        """An RL episode boundary on a kept instance: the last episode wrote; reset()
        and the next episode's first call."""
        assert not reused.call_tool(f"awm_{WRITE[0]}", WRITE[1]).is_error
        t0 = time.perf_counter()
        reused.reset()
        t1 = time.perf_counter()
        result = reused.call_tool(f"awm_{READ[0]}", READ[1])
        t2 = time.perf_counter()
        if not checked:
            checked.append(not result.is_error and reused.hash() == record.world_hash)
            reused.reset()
        steps["episode_reset"].append(t1 - t0)
        steps["episode_first_call"].append(t2 - t1)
        return t2 - t0

    ours()
    episode()
    for v in steps.values():
        v.clear()
    scratch = worlds.cache.scratch()
    if warm:  # imports in the page cache
        awm_start(statements, code_file, scratch)
    every = max(1, rounds // max(1, starts))
    times: list[float] = []
    episodes: list[float] = []
    awm: list[tuple[float, float, float]] = []
    for r in range(rounds):
        got = interleave({"ours": ours, "episode": episode}, 1)
        times += got["ours"]
        episodes += got["episode"]
        if r % every == 0 and len(awm) < starts:
            awm.append(awm_start(statements, code_file, scratch))
    remove(scratch)
    reused.close()
    env.close()
    worlds.close()
    ours_s = median(times)
    episode_s = median(episodes)
    rebuild_s = median([a[0] for a in awm])
    listed_s = median([a[1] for a in awm])
    called_s = median([a[2] for a in awm])
    med = {k: median(v) for k, v in steps.items()}
    rows = [
        Row(B, f"open + reset() + first tool call, a new instance of `{REF}` (34 tools; the "
               f"carried app's sandboxed worker already running), median of {len(times)}",
            fmt_s(ours_s)),
        Row(B, "  of which Environment.open / reset() / the first call (the lazy copy of "
               "the database and its handover to the worker included)",
            " / ".join(fmt_s(med[k]) for k in ("open", "reset", "first_call"))),
        Row(B, "  an episode boundary on a kept instance: reset() after a write + the first "
               "call", fmt_s(episode_s), "",
            f"{median([a[1] for a in awm]) / episode_s:,.0f}x faster than AWM's way"),
        Row(B, f"AWM's way, emulated: rebuild the db from DDL + INSERTs (stdlib sqlite3) + "
               f"start the generated server (FastMCP.from_fastapi, uvicorn) + list_tools "
               f"answered, "
               f"median of {len(awm)}", fmt_s(listed_s), fmt_s(ours_s) + " ours",
            f"{listed_s / ours_s:,.0f}x ours", f">= {TARGET_X_START:,}x ours",
            listed_s >= TARGET_X_START * ours_s),
        Row(B, "  AWM's way with its first tool call too / the rebuild alone",
            f"{fmt_s(called_s)} / {fmt_s(rebuild_s)}", fmt_s(ours_s) + " ours",
            f"{called_s / ours_s:,.0f}x / {rebuild_s / ours_s:,.1f}x ours"),
        Row(B, "  the first open of the world in a process (starts the app's sandboxed "
               "worker, loads the code: once per code, not per instance)", fmt_s(cold_open)),
    ]
    data = {"ours_s": times, "episode_s": episodes, "steps_s": steps, "awm_starts": [
        {"rebuild_s": a, "list_tools_s": b, "first_call_s": c} for a, b, c in awm],
        "cold_open_s": cold_open, "reset_restores_hash": all(checked)}
    return rows, data


def call_latency(store: Path, n: int, rounds: int) -> tuple[list[Row], dict[str, Any]]:
    from fastmcp import Client

    from replay.engine import Worlds
    from worldenv.instances.instance import Environment
    from worldenv.serving.mcp import instance_server

    worlds = Worlds.open(store)
    env = Environment(worlds)
    awm = env.open(REF)
    demo = env.open(DEMO_REF)
    counter = iter(range(10**9))

    def demo_write() -> tuple[str, dict[str, Any]]:
        return DEMO_WRITE, {"note_id": 1, "title": f"Title {next(counter)}"}

    calls = {
        "awm read": (awm, lambda: (f"awm_{READ[0]}", READ[1])),
        "shipped read": (demo, lambda: DEMO_READ),
        "awm write": (awm, lambda: (f"awm_{WRITE[0]}", WRITE[1])),
        "shipped write": (demo, demo_write),
    }
    errors = 0

    def batch(label: str) -> float:
        nonlocal errors
        inst, make = calls[label]
        times = []
        for _ in range(n):
            name, args = make()
            t0 = time.perf_counter()
            result = inst.call_tool(name, args)
            times.append(time.perf_counter() - t0)
            errors += result.is_error
        return median(times)

    interleave({k: (lambda k=k: batch(k)) for k in calls}, 1)  # warm-up
    per = interleave({k: (lambda k=k: batch(k)) for k in calls}, rounds)

    async def mcp(label: str, m: int) -> float:
        inst, make = calls[label]
        async with Client(instance_server(inst)) as client:
            times = []
            for _ in range(m + 1):
                name, args = make()
                t0 = time.perf_counter()
                await client.call_tool(name, args, raise_on_error=False)
                times.append(time.perf_counter() - t0)
        return median(times[1:])

    mcp_med = {k: asyncio.run(mcp(k, n)) for k in ("awm read", "shipped read")}
    awm.close()
    demo.close()
    env.close()
    worlds.close()
    med = {k: median(v) for k, v in per.items()}
    rows = []
    for kind in ("read", "write"):
        ours, base = med[f"awm {kind}"], med[f"shipped {kind}"]
        tool = READ[0] if kind == "read" else WRITE[0]
        shipped = DEMO_READ[0] if kind == "read" else DEMO_WRITE
        rows.append(Row(B, f"{kind}: Instance.call_tool `awm_{tool}` (AWM adapter, sandboxed "
                           f"worker) vs a shipped app's `{shipped}` on `{DEMO_REF}`, median of "
                           f"{rounds} x {n}", fmt_s(ours), fmt_s(base) + " shipped",
                        f"{ours / base:.2f}x shipped", f"<= {TARGET_X_CALL:g}x shipped",
                        ours <= TARGET_X_CALL * base))
    a, s = mcp_med["awm read"], mcp_med["shipped read"]
    rows.append(Row(B, "  read, both through an in-memory MCP client "
                       "(Client(instance_server(inst)))", fmt_s(a), fmt_s(s) + " shipped",
                    f"{a / s:.2f}x shipped"))
    data = {"per_round_medians_s": per, "mcp_s": mcp_med, "errors": errors}
    return rows, data


def run(a: argparse.Namespace) -> Report:
    work = scratch_dir("awm")
    report = Report("awm", {"rounds": a.rounds, "starts": a.starts, "calls": a.calls,
                            "scenario": SCENARIO, "samples": str(a.samples)})
    statements = awm_statements(a.samples)
    code_file = work / f"{SCENARIO}.py"
    code_file.write_text(_scenario_line(a.samples, "gen_envs.jsonl")["full_code"],
                         encoding="utf-8")
    store = make_store(work, a.samples)
    rows1, data1 = open_reset(store, statements, code_file, a.rounds, a.starts,
                              warm=not a.quick)
    rows2, data2 = call_latency(store, a.calls, 1 if a.quick else max(3, a.rounds // 3))
    awm_http: dict[str, float] = {}
    if a.quick:  # AWM's server start costs seconds of CPU: one, in open_reset, is enough
        report.notes.append("quick run: no warm-up start of AWM's server and no HTTP calls "
                            "to it")
    else:
        awm_http = asyncio.run(awm_calls(code_file, statements, work / "http", a.calls))
        rows2.append(Row(B, "  the emulated AWM server, the same routes over streamable HTTP "
                            "(FastMCP.from_fastapi; no recording): read / write",
                         f"{fmt_s(awm_http[READ[0]])} / {fmt_s(awm_http[WRITE[0]])}"))
    awm = find_awm(a.awm_venv)
    own: list[tuple[float, float]] = []
    if awm is None:
        report.notes.append(
            "AWM's own package was not found (no --awm-venv, no built `awm` peer venv of the "
            "tests): its own start was not measured; the baseline above is the emulation.")
    else:
        for _ in range(1 if a.quick else min(a.starts, 3)):
            own.append(awm_own_start(awm, a.samples, work / "awm-own"))
        reset_s, started_s = median([o[0] for o in own]), median([o[1] for o in own])
        ours_s = median(data1["ours_s"])
        rows1.append(Row(B, f"AWM's own package (agent-world-model 0.1.0): `awm env reset_db` "
                            f"+ `awm env start` until list_tools answered, median of {len(own)}",
                         fmt_s(started_s), fmt_s(ours_s) + " ours",
                         f"{started_s / ours_s:,.0f}x ours", f">= {TARGET_X_START:,}x ours",
                         started_s >= TARGET_X_START * ours_s))
        rows1.append(Row(B, "  of which `awm env reset_db` (the database from gen_db + "
                            "gen_sample, its command's start included)", fmt_s(reset_s)))
    data1["awm_own_starts"] = [{"reset_db_s": r, "list_tools_s": t} for r, t in own]
    report.rows += rows1 + rows2
    report.data = {"open_reset": data1, "calls": data2, "awm_http_s": awm_http}
    report.notes.append(
        f"Open + reset: ours spread {spread(data1['ours_s'])} s; AWM starts "
        f"{spread([s['list_tools_s'] for s in data1['awm_starts']])} s. Calls: per-round "
        "medians, interleaved, order rotated; an AWM route's call runs the generated code "
        "(SQLAlchemy ORM, pydantic) under FastAPI in the worker, which is most of its time.")
    if not data1["reset_restores_hash"]:
        report.notes.append("WARNING: after reset the instance hashed differently")
    if data2["errors"]:
        report.notes.append(f"WARNING: {data2['errors']} error results in the call runs")
    remove(work)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("AWM adapter vs AWM's way")
    ap.add_argument("--rounds", type=int, help="rounds of open + call + reset")
    ap.add_argument("--starts", type=int, help="AWM server starts")
    ap.add_argument("--calls", type=int, help="calls per contender and round")
    ap.add_argument("--samples", type=Path, default=DEFAULT_SAMPLES)
    ap.add_argument("--awm-venv", type=Path, help="a venv with AWM's package (default: the "
                    "tests' `awm` peer venv, when built)")
    ap.add_argument("--serve-awm", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--db", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.serve_awm:
        return serve_awm(a.serve_awm, a.db, a.port)
    setup_run(a)
    a.rounds = a.rounds or (2 if a.quick else 30)
    a.starts = a.starts or (1 if a.quick else 8)
    a.calls = a.calls or (5 if a.quick else 300)
    emit(run(a))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    raise SystemExit(main())
