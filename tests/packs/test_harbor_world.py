"""What an exported Harbor task runs in its environment, run here on a checked-out world:
``worldctl pack grade`` (tests/test.sh) gives reward 0 to a world nobody worked on and 1
once ``worldctl pack solve`` (solution/solve.sh, Harbor's oracle) replayed the reference
solution; ``worldctl pack mcp`` serves the world's tools on stdio and acts on the folder
itself (the agent's terminal and the tools share one world)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
from pathlib import Path

from fastmcp import Client
from fastmcp.client.transports import StdioTransport

from packs.registry import load_pack
from tests.support.cli_harness import invoke

ROOT = Path(__file__).resolve().parents[2]
WORLDCTL = Path(sys.executable).parent / "worldctl"


def _world_of(task: str) -> str:
    spec = json.loads((ROOT / "packs" / "demo" / "tasks" / task / "task.json").read_text())
    return str(spec["world_hash"])


def _nop_then_oracle(store: Path, task: str, work: Path) -> tuple[str, str]:
    """The rewards test.sh writes for a world left as it was, then after solve.sh."""
    world, answer = work / "world", work / "logs" / "agent" / "answer.txt"
    assert invoke("--store", str(store), "checkout", _world_of(task), str(world)).exit_code == 0
    grade = ["--store", str(store), "pack", "grade", "demo", task, str(world),
             "--answer-file", str(answer)]
    nop = invoke(*grade, "--reward-file", str(work / "nop.txt"))
    assert nop.exit_code == 1 and f"demo/{task}: V = 0" in nop.output
    solved = invoke("--store", str(store), "pack", "solve", "demo", task, str(world),
                    "--answer-file", str(answer))
    assert solved.exit_code == 0, solved.output
    oracle = invoke(*grade, "--reward-file", str(work / "oracle.txt"))
    assert oracle.exit_code == 0, oracle.output
    return (work / "nop.txt").read_text(), (work / "oracle.txt").read_text()


def test_every_demo_task_gets_0_untouched_and_1_solved(demo_store: Path,
                                                       tmp_path: Path) -> None:
    for task in load_pack("demo").tasks:
        assert _nop_then_oracle(demo_store, task, tmp_path / task) == ("0\n", "1\n"), task


def test_the_stdio_mcp_server_acts_on_the_world_folder(demo_store: Path,
                                                       tmp_path: Path) -> None:
    world, answer = tmp_path / "world", tmp_path / "answer.txt"
    invoke("--store", str(demo_store), "checkout", _world_of("mats-work-order"), str(world))

    async def session() -> tuple[list[str], str, str]:
        server = StdioTransport(command=str(WORLDCTL), args=[
            "--store", str(demo_store), "pack", "mcp", "demo", "mats-work-order",
            str(world), "--answer-file", str(answer)])
        async with Client(server) as client:
            names = sorted(t.name for t in await client.list_tools())
            sent = await client.call_tool("chat_send_message",
                                          {"conversation_id": 2, "body": "from harbor"})
            said = await client.call_tool("answer", {"text": "NOK 11,600.00"})
        return names, sent.content[0].text, said.content[0].text  # type: ignore[union-attr]

    names, sent, said = asyncio.run(session())
    assert "answer" in names and "chat_send_message" in names and "shell" not in names
    assert json.loads(sent)["body"] == "from harbor" and said == "Answer recorded."
    assert answer.read_text() == "NOK 11,600.00"
    with sqlite3.connect(world / "services" / "chat.sqlite") as db:
        assert db.execute("SELECT body FROM messages ORDER BY id DESC LIMIT 1"
                          ).fetchone() == ("from harbor",)
