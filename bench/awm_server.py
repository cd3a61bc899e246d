"""The peer baseline of `bench_envs.py`: one server process per environment instance, as
AWM (Agent World Model) runs its environments: a FastMCP server over streamable HTTP
(uvicorn) on its own copy of a service database.

    .venv/bin/python bench/awm_server.py DB_PATH PORT

Serves the demo notes app's ``get_note`` and ``update_note`` over the SQLite file given,
with no recording: each tool calls the shipped app's function on one connection opened at
start. The same tool functions (built the same way) are the "FastMCP direct" baseline of
the latency table, and this server is its streamable-HTTP counterpart. It runs until
SIGTERM or SIGINT (uvicorn shuts down cleanly on either).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR.parent) not in sys.path:  # run as `python bench/awm_server.py`
    sys.path.insert(0, str(BENCH_DIR.parent))

import apsw  # noqa: E402
from fastmcp import FastMCP  # noqa: E402
from fastmcp.tools import Tool  # noqa: E402
from mcp.types import ToolAnnotations  # noqa: E402

from worldenv.core.app import ToolContext, ToolSpec, bind  # noqa: E402

# The frozen "now" every baseline call writes (an instance advances its clock per call).
NOW = "2026-03-09T18:00:00Z"
TOOLS = ("get_note", "update_note")


def plain_server(db_path: Path, *, name: str = "awm-notes") -> tuple[FastMCP, apsw.Connection]:
    """A FastMCP server whose tools run the notes app's functions on one plain apsw
    connection to `db_path` (opened here, once; synchronous=OFF like an instance's): the
    same functions, schemas and argument validation as an instance's tools, and nothing
    else (no clock, no seeding, no savepoint, no changeset, no episode)."""
    from worldenv.apps import notes

    conn = apsw.Connection(str(db_path))
    conn.setbusytimeout(5000)
    conn.execute("PRAGMA synchronous=OFF")

    def runner(spec: ToolSpec, kwargs: dict[str, Any]) -> Any:
        return spec.fn(ToolContext(conn, NOW, 0), **kwargs)

    server = FastMCP(name)
    for tool_name in TOOLS:
        spec = notes.app.tools[tool_name]
        server.add_tool(Tool.from_function(
            bind(spec, runner), name=spec.full_name, description=spec.description,
            run_in_thread=False, annotations=ToolAnnotations(read_only_hint=not spec.writes)))
    return server, conn


def main(argv: list[str]) -> int:
    import uvicorn

    db_path, port = Path(argv[0]), int(argv[1])
    server, conn = plain_server(db_path)
    config = uvicorn.Config(server.http_app(), host="127.0.0.1", port=port,
                            log_level="warning", access_log=False)
    try:
        uvicorn.Server(config).run()
    finally:
        conn.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
