"""Scripted episodes: a fixed list of calls played on an instance as an agent would play
them, through a real (in-memory) MCP client for tools and the sandboxed shell for commands.

A script is a JSON file (packs ship them under ``episodes/``)::

    {"world": "lars@7",
     "calls": [{"tool": "shop_get_order", "arguments": {"order_number": "AVL-2026-10533"}},
               {"shell": "wc -l < inventory/gear.csv"},
               {"gui": "open", "arguments": {"url": "/shop/orders"}}]}

A ``gui`` step is a GUI action in the instance's browser (``worldenv.gui.tools``), called as its
``gui_`` tool through the same MCP client.

``run_scripted_episode`` is the demo's episode: open the world, play the script, store the
episode and verify it by replay.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import msgspec
from fastmcp import Client

from replay.diff import WorldDiff
from replay.engine import Worlds, ref_is_stable
from worldenv.errors import SandboxError
from worldenv.gui.tools import GUI_ACTIONS, gui_tool_action
from worldenv.instances.checker import Call
from worldenv.instances.episodes import save_episode, verify_episode
from worldenv.instances.instance import Environment, Instance
from worldenv.serving.mcp import gui_caller, instance_server
from worldstore.errors import InputError
from worldstore.jsonfile import decode_json_file

_CLIP = 120  # characters of a response shown per line


@dataclass(frozen=True)
class ScriptedCall:
    """One step: a tool call (`tool` with `arguments`), a shell command (`shell`) or a GUI
    action (`gui` with `arguments`)."""

    tool: str | None
    arguments: Mapping[str, Any]
    shell: str | None
    gui: str | None = None


@dataclass(frozen=True)
class ScriptedEpisode:
    """A played script: the stored episode, where it ended, and whether it replays."""

    episode_id: str
    final_hash: str
    replayed_ok: bool
    diff: WorldDiff  # the instance against its snapshot
    lines: list[str]  # one per call, then the verification's message
    shell_skipped: str | None  # why shell steps were skipped (no sandbox), if they were
    gui_skipped: str | None = None  # why GUI steps were skipped (no browser), if they were


class _CallSpec(msgspec.Struct, forbid_unknown_fields=True):
    tool: str | None = None
    arguments: dict[str, Any] | None = None
    shell: str | None = None
    gui: str | None = None


class _ScriptSpec(msgspec.Struct, forbid_unknown_fields=True):
    world: str
    calls: list[_CallSpec]


def load_script(path: Path) -> tuple[str, list[ScriptedCall]]:
    """(world reference, calls) of a script file; InputError names the file and field."""
    spec = decode_json_file(path, _ScriptSpec, InputError, missing="no such script file")
    if not ref_is_stable(spec.world):
        raise InputError(f"{spec.world!r} is not persona@day or a world hash", file=str(path),
                         field="world")
    if not spec.calls:
        raise InputError("a script needs at least one call", file=str(path), field="calls")
    return spec.world, [_call(path, i, c) for i, c in enumerate(spec.calls)]


def play_script(instance: Instance, calls: Sequence[ScriptedCall]) -> list[str]:
    """Play `calls` on `instance`; one line per call. Without a usable sandbox a shell
    step is skipped (its line says so and why) and the rest still run."""
    return asyncio.run(_play(instance, calls)).lines


async def aplay_script(instance: Instance, calls: Sequence[ScriptedCall]) -> list[str]:
    """play_script for callers already in an event loop."""
    return (await _play(instance, calls)).lines


def run_scripted_episode(worlds: Worlds, script: Path, *, ref: str | None = None
                         ) -> ScriptedEpisode:
    """Open the script's world (or `ref`), play it, store the episode and verify it by
    replaying its effects onto a fresh mount."""
    world, calls = load_script(script)
    with Environment(worlds) as environment, environment.open(ref or world) as instance:
        played = asyncio.run(_play(instance, calls))
        final = instance.hash()
        diff = instance.diff()
        episode_id = save_episode(worlds, instance)
    ok, message = verify_episode(worlds, episode_id)
    return ScriptedEpisode(episode_id, final, ok, diff, [*played.lines, message],
                           played.shell_skipped, played.gui_skipped)


def as_checker_calls(calls: Sequence[ScriptedCall]) -> list[Call]:
    """The calls in the determinism checker's form (tool "shell" runs a command,
    "gui_ACTION" a GUI action)."""
    return [("shell", {"command": c.shell}) if c.shell is not None
            else (f"gui_{c.gui}" if c.gui is not None else str(c.tool), dict(c.arguments))
            for c in calls]


# --- internals ----------------------------------------------------------------------------


@dataclass
class _Played:
    lines: list[str]
    shell_skipped: str | None = None
    gui_skipped: str | None = None


async def _play(instance: Instance, calls: Sequence[ScriptedCall]) -> _Played:
    played = _Played([])
    gui = gui_caller(instance) if any(c.gui is not None for c in calls) else None
    async with Client(instance_server(instance, gui=gui)) as client:
        for call in calls:
            if call.shell is not None:
                try:
                    ran = await asyncio.to_thread(instance.shell, call.shell)
                except SandboxError as exc:
                    # No sandbox here (or one that refuses the command): the tool steps
                    # still show what they would, and the caller is told why.
                    played.shell_skipped = f"shell steps skipped: {exc}"
                    played.lines.append(f"$ {call.shell}  -> SKIPPED: {exc}")
                    continue
                played.lines.append(f"$ {call.shell}  -> exit {ran.exit_code}: "
                                    f"{ran.stdout.strip()[:_CLIP]}")
                continue
            name = f"gui_{call.gui}" if call.gui is not None else str(call.tool)
            arguments = dict(call.arguments)
            result = await client.call_tool(name, arguments, raise_on_error=False)
            text = "".join(getattr(c, "text", "") for c in result.content)
            if call.gui is not None and result.is_error and "the browser failed" in text:
                played.gui_skipped = f"GUI steps skipped: {text.splitlines()[-1]}"
                played.lines.append(f"gui {call.gui} {arguments} -> SKIPPED: {text[:_CLIP]}")
                continue
            images = sum(1 for c in result.content if getattr(c, "type", "") == "image")
            shown = text.replace("\n", " | ")[:_CLIP] + (" [+ screenshot]" if images else "")
            kind = "gui" if call.gui is not None else "mcp"
            played.lines.append(f"{kind} {name} {arguments} -> "
                                f"{'ERROR ' if result.is_error else ''}{shown}")
    return played


def _call(path: Path, index: int, spec: _CallSpec) -> ScriptedCall:
    def bad(message: str, field: str) -> InputError:
        return InputError(message, file=str(path), field=f"calls[{index}]{field}")

    if sum(x is not None for x in (spec.tool, spec.shell, spec.gui)) != 1:
        raise bad("a call has exactly one of 'tool', 'shell' and 'gui'", "")
    if spec.gui is not None:
        if gui_tool_action(f"gui_{spec.gui}") is None:
            raise bad(f"{spec.gui!r} is not a GUI action (one of {', '.join(GUI_ACTIONS)})",
                      ".gui")
        return ScriptedCall(tool=None, arguments=MappingProxyType(dict(spec.arguments or {})),
                            shell=None, gui=spec.gui)
    if spec.shell is not None:
        if spec.arguments is not None:
            raise bad("a shell step takes no arguments", ".arguments")
        if not spec.shell.strip():
            raise bad("must not be empty", ".shell")
        return ScriptedCall(tool=None, arguments=MappingProxyType({}), shell=spec.shell)
    if not spec.tool:
        raise bad("must not be empty", ".tool")
    return ScriptedCall(tool=spec.tool, arguments=MappingProxyType(dict(spec.arguments or {})),
                        shell=None)

