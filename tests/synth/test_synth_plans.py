"""Day plans (synth.worlds.plans): coverage pressure from real events and a real store, the
plan's checks, and ``worldctl synth day PERSONA --day N --plan-only`` through litellm's real
path against the loopback server (a plan that forgets an arc scheduled that day, corrected;
a second day after it), with the run's offline replay."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from packs.registry import load_pack
from replay.engine import Worlds
from synth.runs import replay_run
from synth.worlds.personas import BibleOut, library_tools
from synth.worlds.plans import (
    PlanOut,
    WorldFacts,
    area_of,
    coverage,
    plan_problems,
    pressure_block,
    world_facts,
)
from tests.support.cli_harness import invoke, refused
from tests.support.llm_server import serving
from worldenv.apps import SHIPPED
from worldstore.events import FileWritePayload, SqlPayload
from worldstore.testing import make_event

MODEL = "openai/loopback"
RETRY = "Earlier attempts at this failed"
LIBRARY = library_tools(SHIPPED)
BIBLE: dict[str, Any] = {
    "name": "astrid", "occupation": "carpenter", "life_domain": "home renovation",
    "contacts": [{"name": n, "relation": "client"} for n in ("Ingrid", "Per", "Sofie")],
    "services": ["chat", "notes"],
    "arcs": [{"title": "the delayed order", "days": [1, 3], "summary": "A late order.",
              "tools": ["chat_send_message"], "image": "photos/order.jpg"},
             {"title": "the planning notes", "days": [2, 4], "summary": "Notes kept.",
              "tools": ["notes_create_note"], "image": None}],
    "accounts": [{"service": "chat", "username": "astrid", "password": "pw"}]}


def act(time: str, interface: str, *, tool: str | None = None, file: str | None = None,
        arc: str | None = None) -> dict[str, Any]:
    return {"time": time, "interface": interface, "what": "something", "tool": tool,
            "file": file, "arc": arc}


PLAN1_FORGETS = {"day": 1, "date": "2026-03-02", "summary": "A first day.",
                 "activities": [act("09:00", "mcp", tool="notes_create_note")]}
PLAN1 = {**PLAN1_FORGETS, "activities": [
    act("09:00", "mcp", tool="chat_send_message", arc="the delayed order"),
    act("11:30", "shell", file="photos/order.jpg", arc="the delayed order")]}
PLAN2 = {"day": 2, "date": "2026-03-03", "summary": "Notes day.", "activities": [
    act("08:15", "mcp", tool="notes_create_note", arc="the planning notes")]}


EXPLORE = "synth prompt explore@v1"
FINDINGS = "- accounts.json in the workspace lists the persona's accounts."
# The explorer (synth.worlds.explore) looks at the workspace once, then reports.
EXPLORE_RULES: list[dict[str, Any]] = [
    {"when": {"any_contains": EXPLORE, "last_role": "tool"}, "reply": {"content": FINDINGS}},
    {"when": {"any_contains": EXPLORE},
     "reply": {"tool_calls": [{"name": "list_files", "arguments": {}}]}},
]


def _rules() -> list[dict[str, Any]]:
    persona = "synth prompt persona@v1"
    plan = "synth prompt plan@v1"
    return [
        {"when": {"any_contains": "synth prompt summarize@v1"},
         "reply": {"content": "Root cause: an arc of the day is missing. Fix: advance it."}},
        {"when": {"any_contains": persona}, "reply": {"content": json.dumps(BIBLE)}},
        {"when": {"any_contains": plan, "last_contains": "Plan day 2."},
         "reply": {"content": json.dumps(PLAN2)}},
        {"when": {"any_contains": plan, "last_contains": RETRY},
         "reply": {"content": json.dumps(PLAN1)}},
        {"when": {"any_contains": plan}, "reply": {"content": json.dumps(PLAN1_FORGETS)}},
    ]


pytestmark = pytest.mark.usefixtures("loopback_env")


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[Any]]]:
    base = tmp_path_factory.mktemp("plans")
    run, store = base / "run", base / "store"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WORLDCTL_LLM_API_KEY", "x")
        with serving(_rules()) as server:
            common = ["--run", str(run), "--model", MODEL, "--api-base", server.url]
            made = invoke("synth", "persona", "--name", "astrid", *common)
            assert made.exit_code == 0, made.output
            reports = []
            for day in (1, 2):
                result = invoke("--store", str(store), "synth", "day", "astrid", "--day",
                                str(day), "--plan-only", *common, "--json")
                assert result.exit_code == 0, result.output
                reports.append(json.loads(result.stdout))
    yield run, reports


def test_a_plan_that_forgets_the_days_arc_is_corrected(planned: tuple[Path, list[Any]]
                                                      ) -> None:
    run, (day1, day2) = planned
    assert (day1["status"], day1["attempts"]) == ("accepted", 2)
    assert day1["plan"] == msgspec.to_builtins(msgspec.convert(PLAN1, PlanOut))
    assert (day2["status"], day2["attempts"]) == ("accepted", 1)
    kept = sorted(p.name for p in (run / "personas" / "astrid" / "plans").iterdir())
    assert kept == ["day-1.json", "day-2.json"]


def test_the_second_day_is_planned_after_the_first(planned: tuple[Path, list[Any]]) -> None:
    run, _ = planned
    outcome = next(json.loads(p.read_text()) for p in (run / "outputs" / "plan").iterdir()
                   if json.loads(p.read_text())["subject"] == "astrid@2")
    assert outcome["status"] == "accepted"
    recordings = [json.loads(p.read_text()) for p in (run / "recordings").iterdir()]
    asked = [m["content"] for r in recordings for m in r["request"]["messages"]
             if "Plan day 2." in str(m["content"])]
    assert asked and "day 1 (2026-03-02): A first day." in asked[0]
    assert "Coverage so far: no earlier day." in asked[0]  # the store holds no astrid yet


def test_the_run_with_plans_replays_offline(planned: tuple[Path, list[Any]],
                                            tmp_path: Path) -> None:
    run, _ = planned
    report = replay_run(run, tmp_path / "again")
    assert report.identical, report.differences
    assert (tmp_path / "again" / "personas" / "astrid" / "plans" / "day-2.json").is_file()


def test_day_refusals(planned: tuple[Path, list[Any]], tmp_path: Path) -> None:
    run, _ = planned
    common = ["--run", str(run), "--model", MODEL, "--api-base", "http://127.0.0.1:9/v1"]
    assert "make day 1 first" in refused(invoke("synth", "day", "astrid", "--day", "3",
                                                *common))
    assert "'nobody' is not an accepted persona" in refused(invoke(
        "synth", "day", "nobody", "--day", "1", "--plan-only", *common))
    assert "days to plan start at 1" in refused(invoke(
        "synth", "day", "astrid", "--day", "0", "--plan-only", *common))


def test_coverage_counts_each_earlier_days_events_by_service_and_area() -> None:
    events, prev = [], "0" * 64
    spec = [(0, SqlPayload(service="chat", sql="SELECT 1")),  # day 0: the set-up, not counted
            (1, SqlPayload(service="chat", sql="SELECT 1")),
            (1, FileWritePayload(path="photos/a.jpg", blob="0" * 64, size=1,
                                 encoding="base64")),
            (2, SqlPayload(service="notes", sql="SELECT 1")),
            (2, SqlPayload(service="notes", sql="SELECT 2")),
            (2, FileWritePayload(path="top.txt", blob="0" * 64, size=1, encoding="base64")),
            (3, SqlPayload(service="chat", sql="SELECT 1"))]  # day 3 is not before day 3
    for seq, (day, payload) in enumerate(spec):
        event = make_event(persona="p", seq=seq, day=day, ts=f"2026-03-0{day + 1}T09:00:00Z",
                           prev=prev, payload=payload)
        events.append(event)
        prev = event.event_id
    days, services, areas = coverage(events, 3)
    assert days == [1, 2]
    assert services == {"chat": [1, 0], "notes": [0, 2]}
    assert areas == {"photos/": [1, 0], "(workspace root)": [0, 1]}
    assert (area_of("a/b/c.txt"), area_of("c.txt")) == ("a/", "(workspace root)")
    bible = msgspec.convert({**BIBLE, "services": ["chat", "notes", "calendar"]}, BibleOut)
    block = pressure_block(WorldFacts(days, services, areas, {}, []), bible)
    assert "- calendar: never used" in block and "- chat: 1 0 (total 1)" in block
    assert block.endswith("Least used of the persona's services: calendar. Prefer them today.")


def test_world_facts_come_from_the_store(tmp_path: Path) -> None:
    with Worlds.open(tmp_path / "store") as worlds:
        worlds.import_file(load_pack("demo").worlds[0])
        facts = world_facts(worlds, "lars", 4)
        record = worlds.resolve("lars@3")
        manifest = worlds.manifest(record)
        counted: dict[str, int] = {}
        for event in worlds.store.events("lars"):
            if 0 < event.day < 4 and isinstance(event.payload, SqlPayload):
                counted[event.payload.service] = counted.get(event.payload.service, 0) + 1
        assert facts.days == [1, 2, 3]
        assert {s: sum(c) for s, c in facts.services.items()} == counted
        assert facts.files == sorted(manifest.files)[:60]
        assert facts.tables["notes.notes"] == manifest.services["notes"].tables["notes"].rows
        assert world_facts(worlds, "nobody", 4) == WorldFacts([], {}, {}, {}, [])


@pytest.mark.parametrize(("change", "problem"), [
    ({"day": 2}, "the plan is for day 2, not day 1"),
    ({"date": "2026-02-30"}, "is not YYYY-MM-DD"),
    ({"date": "2026-03-01"}, "is not after the last plan's date 2026-03-01"),
    ({"activities": []}, "0 activities"),
    ({"activities": [act("10:00", "mcp", tool="chat_send_message", arc="the delayed order"),
                     act("09:00", "mcp", tool="chat_send_message")]},
     "comes before the activity above it"),
    ({"activities": [act("9:00", "mcp", tool="chat_send_message", arc="the delayed order")]},
     "the time must be HH:MM"),
    ({"activities": [act("09:00", "mcp", tool="shop_place_order", arc="the delayed order")]},
     "tool shop_place_order is not a tool of the persona's services"),
    ({"activities": [act("09:00", "shell", arc="the delayed order")]},
     "a shell activity names the workspace file"),
    ({"activities": [act("09:00", "shell", file="/etc/passwd", arc="the delayed order")]},
     "file '/etc/passwd'"),
    ({"activities": [act("09:00", "mcp", tool="chat_send_message", arc="a lost arc")]},
     "arc 'a lost arc' is not one of the bible's"),
    ({"activities": [act("09:00", "mcp", tool="chat_send_message")]},
     "arc 'the delayed order' is scheduled on day 1 but no activity advances it"),
])
def test_each_check_of_a_plan_names_what_is_wrong(change: dict[str, Any],
                                                 problem: str) -> None:
    bible = msgspec.convert(BIBLE, BibleOut)
    assert plan_problems(msgspec.convert(PLAN1, PlanOut), bible, LIBRARY, 1,
                         "2026-03-01") == []
    problems = plan_problems(msgspec.convert({**PLAN1, **change}, PlanOut), bible, LIBRARY,
                             1, "2026-03-01")
    assert any(problem in p for p in problems), problems


def test_a_day_starts_after_the_worlds_last_event() -> None:
    bible = msgspec.convert(BIBLE, BibleOut)
    plan = msgspec.convert(PLAN1, PlanOut)  # 2026-03-02, first activity at 09:00
    assert plan_problems(plan, bible, LIBRARY, 1, None, after="2026-03-02T08:59:59Z") == []
    for last in ("2026-03-02T09:00:00Z", "2026-03-05T10:00:00Z"):
        assert plan_problems(plan, bible, LIBRARY, 1, None, after=last) == [
            f"the day starts at 2026-03-02T09:00:00Z, not after the world's last event "
            f"({last}): date the day later"]
