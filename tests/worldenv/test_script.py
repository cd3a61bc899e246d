"""Scripted episodes (worldenv/serving/script.py): script files parsed strictly, played on real
instances through an in-memory MCP client and the sandboxed shell, stored and verified."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from packs.registry import load_pack
from replay.engine import Worlds
from worldenv.instances.episodes import verify_episode
from worldenv.instances.instance import Environment
from worldenv.serving.script import (
    ScriptedCall,
    as_checker_calls,
    load_script,
    play_script,
    run_scripted_episode,
)
from worldstore.errors import InputError

DEMO = load_pack("demo")
SCRIPT = DEMO.episode("demo")


@pytest.fixture(scope="module")
def worlds(demo_worlds: Worlds) -> Worlds:
    return demo_worlds  # the shared demo store (tests/conftest.py), this module's copy


def test_the_demo_script_loads() -> None:
    world, calls = load_script(SCRIPT)
    assert world == "lars@7"
    assert len(calls) == 7
    assert [c.shell is not None for c in calls] == [False, False, True, True, False, False,
                                                    False]
    assert calls[6] == ScriptedCall(tool=None, arguments={"url": "/chat/conversations/1"},
                                    shell=None, gui="open")
    assert calls[1] == ScriptedCall(tool="shop_get_order",
                                    arguments={"order_number": "AVL-2026-10533"}, shell=None)
    checked = as_checker_calls(calls)
    assert checked[2] == ("shell", {"command": calls[2].shell})
    assert checked[1] == ("shop_get_order", {"order_number": "AVL-2026-10533"})
    assert checked[6] == ("gui_open", {"url": "/chat/conversations/1"})


REFUSALS: list[tuple[str, Any, str, str]] = [
    ("unknown field", {"world": "lars@7", "calls": [{"tool": "x", "why": 1}]}, "calls[0].why",
     "unknown field `why`"),
    ("both", {"world": "lars@7", "calls": [{"tool": "x", "shell": "ls"}]}, "calls[0]",
     "exactly one of 'tool', 'shell' and 'gui'"),
    ("tool and gui", {"world": "lars@7", "calls": [{"tool": "x", "gui": "open"}]}, "calls[0]",
     "exactly one of 'tool', 'shell' and 'gui'"),
    ("unknown gui action", {"world": "lars@7", "calls": [{"gui": "fly"}]}, "calls[0].gui",
     "'fly' is not a GUI action"),
    ("neither", {"world": "lars@7", "calls": [{"arguments": {}}]}, "calls[0]",
     "exactly one of 'tool', 'shell' and 'gui'"),
    ("shell arguments", {"world": "lars@7", "calls": [{"shell": "ls", "arguments": {}}]},
     "calls[0].arguments", "takes no arguments"),
    ("empty shell", {"world": "lars@7", "calls": [{"shell": " "}]}, "calls[0].shell",
     "must not be empty"),
    ("empty tool", {"world": "lars@7", "calls": [{"tool": ""}]}, "calls[0].tool",
     "must not be empty"),
    ("moving world", {"world": "lars", "calls": [{"shell": "ls"}]}, "world",
     "is not persona@day or a world hash"),
    ("no calls", {"world": "lars@7", "calls": []}, "calls", "at least one call"),
    ("no world", {"calls": [{"shell": "ls"}]}, "world", "missing required field `world`"),
    ("arguments not an object", {"world": "lars@7", "calls": [{"tool": "x", "arguments": [1]}]},
     "calls[0].arguments", "Expected `object | null`, got `array`"),
]


@pytest.mark.parametrize(("what", "doc", "field", "message"), REFUSALS,
                         ids=[r[0] for r in REFUSALS])
def test_a_bad_script_is_refused_naming_file_and_field(tmp_path: Path, what: str, doc: Any,
                                                       field: str, message: str) -> None:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError) as refused:
        load_script(path)
    assert str(refused.value).startswith(f"{path}: ")
    assert message in str(refused.value)
    assert refused.value.field == field


def test_a_missing_or_broken_script_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such script file"):
        load_script(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(InputError, match="not valid JSON"):
        load_script(tmp_path / "bad.json")


def test_play_script_goes_through_mcp_and_the_shell(worlds: Worlds, tmp_path: Path) -> None:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"world": "lars@7", "calls": [
        {"tool": "shop_get_order", "arguments": {"order_number": "AVL-2026-10533"}},
        {"tool": "shop_get_order", "arguments": {"order_id": 999}},
        {"shell": "printf 'done\\n' > note.txt; cat note.txt"},
        {"shell": "echo \u0000"},  # a command the sandbox refuses: skipped, not fatal
    ]}))
    world, calls = load_script(path)
    with Environment(worlds) as env, env.open(world) as instance:
        lines = play_script(instance, calls)
        recorded = [type(e).__name__ for e in instance.episode.events]
        assert (instance.mount.workspace / "note.txt").read_text() == "done\n"
    assert len(lines) == 4
    assert lines[0].startswith("mcp shop_get_order {'order_number': 'AVL-2026-10533'} -> {")
    assert "-> ERROR " in lines[1]
    assert lines[2].endswith("-> exit 0: done")
    assert "SKIPPED: the command contains a NUL byte" in lines[3]
    assert recorded.count("ToolCall") == 2 and "ShellCall" in recorded


def test_the_demo_episode_is_stored_and_replays(worlds: Worlds) -> None:
    played = run_scripted_episode(worlds, SCRIPT)
    assert played.shell_skipped is None and played.gui_skipped is None
    assert played.replayed_ok
    assert played.final_hash != worlds.resolve("lars@7").world_hash
    assert worlds.store.episode(played.episode_id).final_hash == played.final_hash
    assert verify_episode(worlds, played.episode_id)[0]
    assert len(played.lines) == 8 and "replays to the recorded final hash" in played.lines[-1]
    assert played.lines[6].startswith("gui gui_open {'url': '/chat/conversations/1'} -> page: ")
    assert played.lines[6].endswith("[+ screenshot]")
    changed = {f.path for f in played.diff.files}
    assert "jobs/nordlys/install-checklist.md" in changed
    # The same script on the same world is the same episode.
    assert run_scripted_episode(worlds, SCRIPT).episode_id == played.episode_id
