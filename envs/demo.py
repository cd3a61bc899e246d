"""The demo's scripted episode: Lars, on the evening of day 7, prepares the Nordlys install
through the MCP tools (in-memory MCP client) and the shell, as an agent would."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from fastmcp import Client

from envs.episodes_store import save_episode
from envs.instance import Environment, Instance
from envs.mcp import instance_server
from replay.diff import WorldDiff
from replay.engine import Worlds
from worldstore.errors import SandboxError

# (tool, arguments) in story order; "shell" runs a command in the workspace sandbox.
SCRIPT: list[tuple[str, dict[str, Any]]] = [
    ("chat_search_messages", {"query": "approved"}),
    ("shop_get_order", {"order_number": "AVL-2026-10533"}),
    ("shell", {"command": "grep -n 'ClickShare' jobs/nordlys/bom.md | head -3; "
                          "wc -l < inventory/gear.csv"}),
    ("shell", {"command": "printf -- '- [ ] Bring the ClickShare CX-30 buttons (order "
                          "AVL-2026-10533, delivered)\\n' >> jobs/nordlys/install-checklist.md"}),
    ("notes_search_notes", {"query": "Nordlys"}),
    ("chat_send_message", {"conversation_id": 1, "body": "All equipment for Fjellrommet is on "
                                                         "site; see you Thursday at 08:00."}),
]


@dataclass
class DemoEpisode:
    episode_id: str
    instance_hash: str
    replayed_ok: bool
    diff: WorldDiff
    lines: list[str]
    shell_skipped: str | None


def run_demo_episode(worlds: Worlds, ref: str = "lars@7") -> DemoEpisode:
    from envs.episodes_store import verify_episode

    with Environment(worlds).open(ref) as instance:
        lines, skipped = asyncio.run(_play(instance))
        final = instance.hash()
        diff = instance.diff()
        episode_id = save_episode(worlds, instance)
    ok, message = verify_episode(worlds, episode_id)
    lines.append(message)
    return DemoEpisode(episode_id, final, ok, diff, lines, skipped)


async def _play(instance: Instance) -> tuple[list[str], str | None]:
    lines: list[str] = []
    skipped = None
    async with Client(instance_server(instance)) as client:
        for tool, arguments in SCRIPT:
            if tool == "shell":
                try:
                    call = await asyncio.to_thread(instance.shell, arguments["command"])
                except SandboxError as exc:
                    skipped = f"shell steps skipped: {exc}"
                    lines.append(f"$ {arguments['command']}  -> SKIPPED (no sandbox)")
                    continue
                lines.append(f"$ {arguments['command']}  -> exit {call.exit_code}: "
                             f"{call.stdout.strip()[:120]}")
                continue
            result = await client.call_tool(tool, arguments, raise_on_error=False)
            text = "".join(getattr(c, "text", "") for c in result.content)
            lines.append(f"mcp {tool} {arguments} -> {'ERROR ' if result.is_error else ''}"
                         f"{text[:120]}")
    return lines, skipped
