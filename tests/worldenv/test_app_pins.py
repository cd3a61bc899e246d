"""App pins: a world names the exact code that serves each service, and the world hash
covers that choice."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from replay import Worlds, hash_world
from worldenv.core.app import App
from worldenv.errors import AppPinError
from worldenv.instances.instance import Environment
from worldstore.errors import InputError

BASE = [
    {"persona": "p", "day": 0, "ts": "2026-01-01T00:00:00Z", "type": "sql", "service": "notes",
     "sql": "CREATE TABLE notes(id INTEGER PRIMARY KEY, title TEXT)"},
    {"persona": "p", "day": 0, "ts": "2026-01-01T00:00:01Z", "type": "sql", "service": "notes",
     "sql": "INSERT INTO notes VALUES (1, 'first')"},
]
APP = App(service="notes", name="pinned-notes", version="1.2.0", source="# the app's code\n")


def _log(*extra: dict[str, object]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in [*BASE, *extra])


def _pin(**fields: object) -> dict[str, object]:
    return {"persona": "p", "day": 0, "ts": "2026-01-01T00:00:02Z", "type": "app",
            "service": "notes", **fields}


def _import(tmp_path: Path, data: bytes, name: str = "store") -> Worlds:
    worlds = Worlds.open(tmp_path / name)
    worlds.import_stream(io.BytesIO(data), source="pins.jsonl")
    return worlds


def test_a_pin_is_part_of_the_world_and_its_hash(tmp_path: Path) -> None:
    unpinned = _import(tmp_path, _log(), "a")
    pinned = _import(tmp_path, _log(_pin(app=APP.name, version=APP.version,
                                         digest=APP.digest)), "b")
    other = _import(tmp_path, _log(_pin(app=APP.name, version="1.2.1", digest=APP.digest)),
                    "c")
    hashes = {w.resolve("p@0").world_hash for w in (unpinned, pinned, other)}
    assert len(hashes) == 3
    pinned.checkout("p@0", tmp_path / "co")
    pin = json.loads((tmp_path / "co" / "apps" / "notes.json").read_text())
    assert pin == {"service": "notes", "app": "pinned-notes", "version": "1.2.0",
                   "digest": APP.digest, "carried": False}
    assert hash_world(tmp_path / "co") == pinned.resolve("p@0").world_hash
    diff = unpinned.diff("p@0", "p@0")
    assert diff.empty
    for w in (unpinned, pinned, other):
        assert w.verify().ok
        w.close()


def test_carried_code_round_trips_through_export(tmp_path: Path) -> None:
    code = "def tool():\n    return 'carried'\n"
    worlds = _import(tmp_path, _log(_pin(app="mine", version="0.1", code=code)))
    worlds.checkout("p@0", tmp_path / "co")
    assert (tmp_path / "co" / "apps" / "notes.py").read_text() == code
    out = io.BytesIO()
    worlds.export("p", out)
    again = _import(tmp_path, out.getvalue(), "again")
    assert again.resolve("p@0").world_hash == worlds.resolve("p@0").world_hash
    assert again.verify().ok


@pytest.mark.parametrize(("fields", "field", "text"), [
    ({"app": "x", "version": "1", "digest": "0" * 32, "code": "x"}, "digest", "exactly one"),
    ({"app": "x", "version": "1"}, "digest", "exactly one"),
    ({"app": "x", "version": "1", "digest": "not-hex"}, "digest", "hex digest"),
    ({"app": "", "version": "1", "digest": "0" * 32}, "app", "names the app"),
    ({"app": "x", "version": "1", "digest": "0" * 32, "service": "Bad"}, "service",
     "bad service"),
])
def test_bad_app_lines_are_refused(tmp_path: Path, fields: dict[str, object], field: str,
                                   text: str) -> None:
    worlds = Worlds.open(tmp_path / "store")
    with pytest.raises(InputError) as caught:
        worlds.import_stream(io.BytesIO(_log(_pin(**fields))), source="pins.jsonl")
    assert caught.value.field == field and text in str(caught.value)
    assert caught.value.line == 3 and worlds.store.personas() == []


def test_an_instance_is_served_only_by_the_pinned_code(tmp_path: Path) -> None:
    worlds = _import(tmp_path, _log(_pin(app=APP.name, version=APP.version,
                                         digest=APP.digest)))
    with Environment(worlds, apps={"notes": APP}).open("p@0") as instance:
        assert instance.hash() == worlds.resolve("p@0").world_hash
    drifted = App(service="notes", name=APP.name, version=APP.version, source="# edited\n")
    with pytest.raises(AppPinError, match=r"pins app pinned-notes 1\.2\.0"):
        Environment(worlds, apps={"notes": drifted}).open("p@0")
    with pytest.raises(AppPinError, match="this install has no app"):
        Environment(worlds, apps={}).open("p@0")


def test_carried_code_is_served_by_a_sandboxed_worker(tmp_path: Path) -> None:
    code = ('from worldenv.core.app import App, ToolContext\n'
            'app = App(service="notes", name="mine", version="0.1")\n'
            '@app.tool(writes=False)\n'
            'def count(ctx: ToolContext) -> int:\n'
            '    """How many notes."""\n'
            '    return ctx.value("SELECT COUNT(*) FROM notes")\n')
    worlds = _import(tmp_path, _log(_pin(app="mine", version="0.1", code=code)))
    with Environment(worlds, apps={"notes": APP}) as env, env.open("p@0") as instance:
        assert [t.name for t in instance.list_tools()] == ["notes_count"]
        assert instance.call_tool("notes_count").text == "1"


def test_the_demo_world_pins_exactly_the_shipped_apps(demo_jsonl: Path) -> None:
    from worldenv.apps import SHIPPED

    pins = {line["service"]: line for line in map(json.loads, demo_jsonl.read_text().splitlines())
            if line["type"] == "app"}
    assert sorted(pins) == sorted(SHIPPED)
    for service, app in SHIPPED.items():
        assert (pins[service]["app"], pins[service]["version"], pins[service]["digest"]) == (
            app.name, app.version, app.digest), (
            f"worldenv/apps/{service}.py changed: regenerate the demo world with "
            "`.venv/bin/python packs/demo/world/build_lars.py`")
