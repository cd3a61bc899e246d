"""Runs in AWM's own venv (tests/support/peer_venv.py, ``awm``), never in the project's: AWM's
code on a directory written by ``worldctl synth export-awm``.

    python awm_export_driver.py EXPORT_DIR WORK_DIR SCENARIO PLAN_JSON

1. ``awm env reset_db`` makes the scenario's database from gen_db.jsonl and
   gen_sample.jsonl (AWM's ``create_sqlite_database`` and ``execute_sample_data``); a copy
   is kept as the initial database;
2. ``awm env start`` builds the server from gen_envs.jsonl (its create_engine and uvicorn
   rewrite, fastapi-mcp mounted) on a free port; AWM's ``check_mcp_server`` lists its tools;
3. the plan's calls go through MCP (the protocol client AWM's agent uses);
4. every verifier of gen_verifier.pure_code.jsonl is validated by AWM's
   ``execute_verification_code`` and then called as AWM's code mode defines it, on the
   initial and the final database, with the plan's answer.

Prints one JSON object (the tools, each call's result, each verifier's result, the final
rows of the plan's tables) as its last stdout line.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from awm.core.verifier import VerificationMode, execute_verification_code
from awm.tools import (
    check_mcp_server,
    get_random_available_port,
    normalize_scenario_name,
    tools_jsonl_load,
    wait_for_server,
)
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

AWM = str(Path(sys.executable).with_name("awm"))


async def _calls(url: str, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = []
    async with streamablehttp_client(url) as (read, write, _), \
            ClientSession(read, write) as session:
        await session.initialize()
        for call in calls:
            result = await session.call_tool(call["tool"], call["arguments"])
            found.append({"is_error": bool(result.isError),
                          "text": [c.text for c in result.content if c.type == "text"],
                          "structured": result.structuredContent})
    return found


def _rows(db: Path, tables: list[str]) -> dict[str, list[dict[str, Any]]]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return {t: [dict(r) for r in conn.execute(f'SELECT * FROM "{t}" ORDER BY rowid')]
                for t in tables}
    finally:
        conn.close()


def main() -> None:
    export, work, scenario, plan_path = (Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3],
                                         Path(sys.argv[4]))
    plan = json.loads(plan_path.read_text())
    databases = work / "databases"
    subprocess.run([AWM, "env", "reset_db", "--input_db", str(export / "gen_db.jsonl"),
                    "--input_sample", str(export / "gen_sample.jsonl"),
                    "--database_dir", str(databases)], check=True, capture_output=True)
    db = databases / f"{normalize_scenario_name(scenario)}.db"
    initial = work / "initial.db"
    shutil.copyfile(db, initial)
    port = get_random_available_port()
    with open(work / "server.log", "wb") as log:
        server = subprocess.Popen(
            [AWM, "env", "start", "--scenario", scenario, "--envs_load_path",
             str(export / "gen_envs.jsonl"), "--db_path", str(db), "--port", str(port),
             "--temp_server_path", str(work / "server.py")],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            if not wait_for_server(port, timeout=120):
                raise SystemExit("AWM's server did not start:\n"
                                 + (work / "server.log").read_text()[-3000:])
            url = f"http://127.0.0.1:{port}/mcp"
            running, _count, tools, error = asyncio.run(check_mcp_server(url, timeout=60))
            if not running:
                raise SystemExit(f"check_mcp_server: {error}")
            calls = asyncio.run(_calls(url, plan["calls"]))
        finally:
            # AWM's `env start` runs the server as a child of its own (os.system): the
            # whole session goes.
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
    verifiers = {}
    for line in tools_jsonl_load(str(export / "gen_verifier.pure_code.jsonl")):
        code = line["verification"]["code"]
        checked = execute_verification_code(code, "verify_task_completion", str(initial),
                                            VerificationMode.code)
        namespace: dict[str, Any] = {"sqlite3": sqlite3, "json": json}
        exec(code, namespace)
        verify = namespace["verify_task_completion"]
        verifiers[str(line["task_idx"])] = {
            "awm_check": checked.get("execution_status"),
            "at_start": verify(initial_db_path=str(initial), final_db_path=str(initial),
                               final_answer="")["result"],
            "at_end": verify(initial_db_path=str(initial), final_db_path=str(db),
                             final_answer=plan["answer"])["result"]}
    print(json.dumps({"tools": sorted(t["name"] for t in tools), "calls": calls,
                      "verifiers": verifiers, "rows": _rows(db, plan["tables"])},
                     sort_keys=True))


if __name__ == "__main__":
    main()
