"""The demo's GUI task on the second persona, ``nora``: two surge protectors that are the
same product to every MCP tool and differ only in their photos (drawn by the world's build
script), decided in a real browser.

The world builds to the same bytes every time; its two photos are valid, different PNGs
(a black chassis; a white one with a lit 7-segment display); through the tools and the
pages' text the two products are identical but for SKU and id. The reference solution
uses MCP, the shell and the GUI, its episode records every GUI action with a screenshot,
and it passes the verifier; skipping the GUI (the scripted shortcut), guessing the
look-alike or taking both fails. ``worldctl task check`` accepts the task as hard on the
six scripted rollouts (the judges' gates 1 and 5 need a model and do not run).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gates.agents import ScriptedAgent, reference_agent, scripted
from gates.contract import GuiStep, Solution, Verdict
from gates.quality import GATES, GateRun, Judges, check_task
from gates.rollout import interfaces_used, scripted_rollouts
from gates.task import SOLUTION_FILE, Task, load_task
from gates.verifier import run_verifier
from packs.registry import load_pack
from replay.engine import Worlds
from replay.layout import service_db
from worldenv.core.episode import Episode, GuiCall
from worldenv.gui.browser import Browser
from worldenv.instances.instance import Environment

ROOT = Path(__file__).resolve().parents[2]
PACK = load_pack("demo")
WORLD_DIR = PACK.root / "world"
LOG = WORLD_DIR / "nora.jsonl"
BUILD = WORLD_DIR / "build_nora.py"
TASK_DIR = PACK.task_dir("sjoboden-bar-surge-protectors")
WORLDCTL = Path(sys.executable).parent / "worldctl"

TARGET, LOOKALIKE = "PWR-SVK-SP6-3112", "PWR-SVK-SP6-3107"  # white + display; black
TARGET_ID, LOOKALIKE_ID = 2, 1
WIDTH, HEIGHT = 320, 240
LIT_SEGMENT = (255, 72, 40)  # build_nora.seven_segment's lit colour

needs_chromium = pytest.mark.skipif(
    not Path("/usr/bin/chromium").exists() and os.environ.get("CI") != "true",
    reason="Debian's chromium is not installed (apt-get install chromium)")


@pytest.fixture(scope="module")
def worlds(demo_worlds: Worlds) -> Worlds:
    return demo_worlds  # the shared demo store (tests/conftest.py), this module's copy


@pytest.fixture(scope="module")
def task() -> Task:
    return load_task(TASK_DIR)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    b = Browser(idle_s=0)
    b.start()
    yield b
    b.close()


@pytest.fixture(scope="module")
def env(worlds: Worlds, browser: Browser) -> Iterator[Environment]:
    with Environment(worlds, browser=lambda: browser) as environment:
        yield environment


# --- the world --------------------------------------------------------------------------


def _built() -> bytes:
    """What build_nora.py writes, built in a fresh interpreter without touching the file."""
    code = ("import runpy, sys; m = runpy.run_path(sys.argv[1]); "
            "sys.stdout.buffer.write(m['build']().encode('utf-8'))")
    done = subprocess.run([sys.executable, "-B", "-c", code, str(BUILD)], cwd=ROOT,
                          capture_output=True, timeout=120, check=True)
    return done.stdout


def test_the_world_builds_to_the_same_bytes_as_the_shipped_log() -> None:
    first, second = _built(), _built()
    assert first == second == LOG.read_bytes()
    events = [json.loads(line) for line in first.decode().splitlines()]
    assert {e["persona"] for e in events} == {"nora"} and {e["day"] for e in events} == {0, 1}
    assert {e["service"] for e in events if e["type"] == "sql"} == {"chat", "shop"}
    pins = {e["service"]: e for e in events if e["type"] == "app"}
    from worldenv.apps import SHIPPED

    assert sorted(pins) == ["chat", "shop"]
    for service, pin in pins.items():
        app = SHIPPED[service]
        assert (pin["app"], pin["version"], pin["digest"]) == (app.name, app.version,
                                                               app.digest), (
            f"worldenv/apps/{service}.py changed: regenerate the world with "
            "`.venv/bin/python packs/demo/world/build_nora.py`")


def test_the_pack_registers_the_world_and_the_task(worlds: Worlds, task: Task) -> None:
    assert PACK.worlds[-1] == LOG
    assert task.task_id in PACK.split("eval")
    assert task.spec.world == "nora@1"
    assert task.spec.world_hash == worlds.resolve("nora@1").world_hash
    assert task.spec.interfaces == ["mcp", "shell", "gui"] and task.spec.difficulty == "hard"
    assert {sub.interface for sub in task.spec.subtasks} == {"mcp", "shell", "gui"}


def _png_pixels(data: bytes) -> list[list[tuple[int, int, int]]]:
    """Decode one of the world's photos (8-bit palette PNG), checking every chunk."""
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    pos, chunks = 8, []
    while pos < len(data):
        (size,) = struct.unpack(">I", data[pos:pos + 4])
        tag, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + size]
        (crc,) = struct.unpack(">I", data[pos + 8 + size:pos + 12 + size])
        assert crc == zlib.crc32(tag + body), tag
        chunks.append((tag, body))
        pos += 12 + size
    assert pos == len(data)
    assert [t for t, _ in chunks] == [b"IHDR", b"PLTE", b"IDAT", b"IEND"]
    assert struct.unpack(">IIBBBBB", chunks[0][1]) == (WIDTH, HEIGHT, 8, 3, 0, 0, 0)
    palette = chunks[1][1]
    raw = zlib.decompress(chunks[2][1])
    assert len(raw) == HEIGHT * (WIDTH + 1)
    rows = []
    for y in range(HEIGHT):
        line = raw[y * (WIDTH + 1):(y + 1) * (WIDTH + 1)]
        assert line[0] == 0  # filter: none
        assert max(line[1:]) * 3 < len(palette)
        rows.append([(palette[3 * i], palette[3 * i + 1], palette[3 * i + 2])
                     for i in line[1:]])
    return rows


def _photo(worlds: Worlds, product_id: int) -> bytes:
    db = service_db(worlds.snapshot("nora", 1), "shop")
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        row = conn.execute("SELECT data FROM product_images WHERE product_id = ?",
                           (product_id,)).fetchone()
    finally:
        conn.close()
    assert row is not None, product_id
    return bytes(row[0])


def _count(pixels: list[list[tuple[int, int, int]]], rgb: tuple[int, int, int]) -> int:
    return sum(row.count(rgb) for row in pixels)


def test_the_two_photos_are_valid_pngs_that_tell_the_products_apart(worlds: Worlds) -> None:
    target, lookalike = _photo(worlds, TARGET_ID), _photo(worlds, LOOKALIKE_ID)
    assert target != lookalike
    white, black = _png_pixels(target), _png_pixels(lookalike)
    # The chassis below the sockets: white on the one Jonas wants, black on the other.
    assert min(white[145][200]) > 230 and max(black[145][200]) < 50
    # The numeric display: lit 7-segment digits on the white one only.
    assert _count(white, LIT_SEGMENT) > 300 and _count(black, LIT_SEGMENT) == 0
    # Every other photo of the catalogue is a valid PNG too.
    others = [pid for (pid,) in _shop_rows(worlds, "SELECT product_id FROM product_images")
              if pid not in (TARGET_ID, LOOKALIKE_ID)]
    assert len(others) >= 3
    for pid in others:
        _png_pixels(_photo(worlds, pid))


def _shop_rows(worlds: Worlds, sql: str) -> list[tuple[Any, ...]]:
    db = service_db(worlds.snapshot("nora", 1), "shop")
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return list(conn.execute(sql).fetchall())
    finally:
        conn.close()


def test_through_mcp_the_two_products_differ_only_in_sku_and_id(worlds: Worlds) -> None:
    with Environment(worlds) as environment, environment.open("nora@1") as instance:
        found = instance.call_tool("shop_search_products", {"query": "SP-6"})
        assert not found.is_error, found.text
        items = found.structured["items"]
        assert [(p["id"], p["sku"]) for p in items] == [(LOOKALIKE_ID, LOOKALIKE),
                                                        (TARGET_ID, TARGET)]
        by_id = [instance.call_tool("shop_get_product", {"product_id": pid}).structured
                 for pid in (LOOKALIKE_ID, TARGET_ID)]
        by_sku = [instance.call_tool("shop_get_product", {"sku": sku}).structured
                  for sku in (LOOKALIKE, TARGET)]
    assert by_id == by_sku == items
    rest = [{k: v for k, v in p.items() if k not in ("id", "sku")} for p in items]
    assert rest[0] == rest[1]
    assert not any("photo" in json.dumps(p).lower() or "white" in json.dumps(p).lower()
                   for p in items)


def test_the_start_world_fails_the_verifier(worlds: Worlds, task: Task) -> None:
    w0 = worlds.snapshot("nora", 1)
    verdict = run_verifier(task.verifier_dir, w0, w0, "")
    assert not verdict.errors and verdict.checks and not verdict.passed


# --- the task in a browser --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Run:
    verdict: Verdict
    episode: Episode
    interfaces: list[str]
    errors: list[str]


def _run(env: Environment, task: Task, agent: ScriptedAgent) -> Run:
    w0 = env.worlds.snapshot("nora", 1)
    with env.open(task.spec.world) as instance:
        trajectory = agent.run(instance, task, hinted=False)
        instance.hash()  # closes the instance's connections: W is whole on disk
        verdict = run_verifier(task.verifier_dir, w0, instance.mount.path, trajectory.answer)
        errors = [f"step {t.index}: {t.observation[:300]}" for t in trajectory.turns
                  if t.is_error]
        return Run(verdict, instance.episode, list(interfaces_used(instance.episode)), errors)


def _failed(verdict: Verdict) -> list[str]:
    return [f"{c.script}:{c.name}" for c in verdict.checks if not c.passed]


@pytest.fixture(scope="module")
def reference(env: Environment, task: Task) -> Run:
    return _run(env, task, reference_agent())


@needs_chromium
def test_the_reference_passes_through_mcp_the_shell_and_the_gui(reference: Run) -> None:
    assert not reference.errors, reference.errors
    assert not reference.verdict.errors, reference.verdict.errors
    assert reference.verdict.passed, _failed(reference.verdict)
    assert reference.interfaces == ["gui", "mcp", "shell"]


@needs_chromium
def test_the_reference_episode_records_each_gui_action_with_its_screenshot(
        reference: Run, task: Task) -> None:
    episode = reference.episode
    calls = [e for e in episode.events if isinstance(e, GuiCall)]
    steps = [s for s in task.solution.steps if isinstance(s, GuiStep)]
    assert [c.action for c in calls] == [s.action for s in steps]
    digests = [c.screenshot for c in calls if not c.is_error and c.screenshot]
    assert len(digests) == len(calls)
    shots = episode.screenshots
    assert set(digests) <= set(shots)
    assert all(shots[d].startswith(b"\x89PNG") for d in digests)
    # The two product pages look different (the photos), though their text is the same.
    pages = {c.url: c.screenshot for c in calls if c.action == "screenshot"}
    assert set(pages) == {f"/shop/products/{LOOKALIKE_ID}", f"/shop/products/{TARGET_ID}"}
    assert len(set(pages.values())) == 2
    # The add-to-cart form was submitted from the GUI, its tool call captured.
    assert any(c.forms for c in calls)


@needs_chromium
def test_the_product_pages_read_the_same_but_for_sku_and_address(env: Environment) -> None:
    with env.open("nora@1") as instance:
        texts = []
        for pid, sku in ((LOOKALIKE_ID, LOOKALIKE), (TARGET_ID, TARGET)):
            assert not instance.gui("open", {"url": f"/shop/products/{pid}"}).is_error
            read = instance.gui("read", {})
            assert not read.is_error and sku in read.text, read.text
            path = f"/shop/products/{pid}"
            texts.append(read.text.replace(sku, "<sku>").replace(path, "<page>"))
    assert texts[0] == texts[1]


def _variant(task: Task, replacements: dict[str, str]) -> Task:
    text = (task.path / SOLUTION_FILE).read_text(encoding="utf-8")
    for old, new in replacements.items():
        assert old in text, old
        text = text.replace(old, new)
    return dataclasses.replace(task, solution=msgspec.json.decode(text.encode(),
                                                                  type=Solution))


ADD_BY_GUI = ('{"kind": "gui", "action": "click", "arguments": {"name": "Add to cart", '
              '"role": "button"}},')
TOOL_ADD = ('{{"kind": "tool", "tool": "shop_add_to_cart", "arguments": '
            '{{"product_id": {}, "quantity": 2}}}},')

# (what differs, replacements in the reference solution's JSON, should it pass)
VARIANTS: list[tuple[str, dict[str, str], bool]] = [
    ("the cart filled with shop_add_to_cart instead of the form",
     {ADD_BY_GUI: TOOL_ADD.format(TARGET_ID)}, True),
    ("the look-alike chosen (its page's form)",
     {'"/shop/products/2"}},\n    {"kind": "gui", "action": "screenshot"},':
      '"/shop/products/2"}},\n    {"kind": "gui", "action": "open", "arguments": '
      '{"url": "/shop/products/1"}},', "PWR-SVK-SP6-3112": "PWR-SVK-SP6-3107"}, False),
    ("the look-alike added by the tool", {ADD_BY_GUI: TOOL_ADD.format(LOOKALIKE_ID)}, False),
    ("both surge protectors in the cart",
     {ADD_BY_GUI: ADD_BY_GUI + TOOL_ADD.format(LOOKALIKE_ID)}, False),
    ("one unit instead of two", {'"key", "arguments": {"key": "ArrowUp"}}':
                                 '"key", "arguments": {"key": "Tab"}}'}, False),
]


@needs_chromium
@pytest.mark.parametrize(("what", "replacements", "passes"), VARIANTS,
                         ids=[v[0] for v in VARIANTS])
def test_other_solutions_are_judged_on_the_product_chosen(
        env: Environment, task: Task, what: str, replacements: dict[str, str],
        passes: bool) -> None:
    run = _run(env, _variant(task, replacements), reference_agent())
    assert not run.verdict.errors, run.verdict.errors
    assert run.verdict.passed is passes, (what, _failed(run.verdict))


@needs_chromium
@pytest.mark.parametrize("agent", ["shortcut", "first-half", "nothing", "answer-only"])
def test_degraded_agents_fail_on_the_cart(env: Environment, task: Task, agent: str) -> None:
    run = _run(env, task, scripted(agent))
    assert not run.verdict.errors, run.verdict.errors
    assert not run.verdict.passed
    assert "cart.py:target_in_cart_x2" in _failed(run.verdict)
    if agent == "shortcut":  # it skipped looking: no GUI, the rest of its work is credited
        assert "gui" not in run.interfaces
        assert _failed(run.verdict) == ["cart.py:target_in_cart_x2"]


# --- the gates --------------------------------------------------------------------------


@needs_chromium
def test_the_gates_accept_the_task_as_hard_on_the_scripted_rollouts(
        env: Environment, task: Task) -> None:
    report = check_task(GateRun(env=env, rollouts=lambda t: scripted_rollouts(env, t),
                                judges=Judges()), task)
    (results,) = report.rounds
    assert [(r.gate, r.status) for r in results] == [
        (GATES[0], "not_run"), (GATES[1], "passed"), (GATES[2], "passed"),
        (GATES[3], "passed"), (GATES[4], "not_run")]
    assert report.accepted and report.difficulty == "hard"
    solvability = {r["agent"] + (" (hinted)" if r["hinted"] else ""): (r["succeeded"],
                                                                        r["interfaces_used"])
                   for r in results[2].evidence["rollouts"]}
    assert solvability["scripted:reference"] == (True, ["gui", "mcp", "shell"])
    assert solvability["scripted:shortcut"] == (False, ["mcp", "shell"])
    assert results[3].evidence["k"] == 1


@needs_chromium
def test_worldctl_task_check_accepts_it(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORLDCTL_")}
    store = str(tmp_path / "store")
    subprocess.run([str(WORLDCTL), "--store", store, "import", str(LOG)], env=env,
                   capture_output=True, text=True, timeout=120, check=True)
    done = subprocess.run([str(WORLDCTL), "--store", store, "task", "check", str(TASK_DIR)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "accepted" in done.stdout.lower(), done.stdout
