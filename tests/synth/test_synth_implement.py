"""Day implementation (synth.worlds.implement) through litellm's real path against the loopback
server: ``worldctl synth world astrid --to-day 2`` stores day 0 (the set-up from the bible
and the app library), plans and implements days 1 and 2 in live instances. Day 1's first
implementation writes the machine's clock into a file (``date``), which re-execution
catches; the feedback names the call, and the second attempt writes the plan's time and is
stored. Then: the run's offline replay to the same world hashes; ``Instance.sql`` and
``Instance.set_clock``; the candidate's layers in a scratch store (a name another persona
reserves fails lint, and nothing is stored); and the refusals."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from packs.registry import load_pack
from replay.engine import Worlds
from synth.runs import replay_run
from synth.worlds.days import EpisodeDay
from synth.worlds.implement import DayOutcome, validate_candidate
from synth.worlds.personas import BibleOut
from synth.worlds.plans import PlanOut
from synth.worlds.setup import SETUP_TS, library_schemas, setup_lines
from synth.worlds.skills import Skill, lesson, read_skills, retrieve
from tests.support.cli_harness import invoke, refused
from tests.support.llm_server import serving
from tests.synth.test_synth_plans import BIBLE, EXPLORE_RULES, FINDINGS, PLAN1
from worldenv.instances.instance import Environment
from worldstore.errors import InputError

MODEL = "openai/loopback"
IMPLEMENT = "synth prompt implement@v1"
REFUSED_BEFORE = "Earlier attempts at this day were refused"
REVIEW = "You review one day of a simulated persona's computer"
SETUP_SQL = [
    ("INSERT INTO users (id, name, handle, email, created_at, updated_at) VALUES "
     "(1, 'Astrid Holm', 'astrid', 'astrid@example.test', ?, ?), "
     "(2, 'Ingrid Dahl', 'ingrid', 'ingrid@example.test', ?, ?)"),
    ("INSERT INTO conversations (id, kind, title, created_by, created_at, updated_at) "
     "VALUES (1, 'direct', NULL, 1, ?, ?)"),
    ("INSERT INTO conversation_members (conversation_id, user_id, role, joined_at) VALUES "
     "(1, 1, 'owner', ?), (1, 2, 'member', ?)"),
]
T1 = "2026-03-02T09:00:00Z"
PLAN2 = {"day": 2, "date": "2026-03-03", "summary": "A notes day.", "activities": [
    {"time": "08:15", "interface": "mcp", "what": "Start a notebook for the job",
     "tool": "notes_create_note", "file": None, "arc": "the planning notes"}]}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def day1_calls(shell: str) -> list[dict[str, Any]]:
    stamps = [T1] * 4
    return [call("begin", activity=1),
            call("sql", service="chat", sql=SETUP_SQL[0], params=stamps),
            call("sql", service="chat", sql=SETUP_SQL[1], params=stamps[:2]),
            call("sql", service="chat", sql=SETUP_SQL[2], params=stamps[:2]),
            call("chat_send_message", conversation_id=1, body="Where is my order?"),
            call("begin", activity=2),
            call("shell", command="mkdir -p photos && printf 'JPEG order photo' > "
                                  f"photos/order.jpg && {shell}"),
            call("done", summary="Asked about the order; kept its photo.",
                 produces={"files": ["photos/order.jpg"],
                           "db_writes": [{"service": "chat", "table": "messages",
                                          "where": {"sender_id": 1}}]})]


DAY1_WALL_CLOCK = day1_calls("date > log.txt")
DAY1_FIXED = day1_calls("printf '2026-03-02 11:30\\n' > log.txt")
DAY2 = [call("begin", activity=1),
        call("sql", service="notes", sql="INSERT INTO notebooks (id, name, created_at, "
             "updated_at) VALUES (1, 'Jobs', '2026-03-03T08:15:00Z', '2026-03-03T08:15:00Z')"),
        call("notes_create_note", notebook_id=1, title="Order follow-up", body="Call Ingrid."),
        call("done", summary="Started the jobs notebook.")]


def _rules() -> list[dict[str, Any]]:
    persona, plan = "synth prompt persona@v1", "synth prompt plan@v1"
    return [
        *EXPLORE_RULES,
        {"when": {"any_contains": REVIEW},
         "reply": {"content": json.dumps({"passed": True, "reason": "The day matches."})}},
        {"when": {"any_contains": persona}, "reply": {"content": json.dumps(BIBLE)}},
        {"when": {"any_contains": plan, "last_contains": "Plan day 2."},
         "reply": {"content": json.dumps(PLAN2)}},
        {"when": {"any_contains": plan}, "reply": {"content": json.dumps(PLAN1)}},
        {"when": {"any_contains": IMPLEMENT, "last_contains": "The plan of day 2"},
         "reply": {"tool_calls": DAY2}},
        {"when": {"any_contains": IMPLEMENT, "last_contains": REFUSED_BEFORE},
         "reply": {"tool_calls": DAY1_FIXED}},
        {"when": {"any_contains": IMPLEMENT}, "reply": {"tool_calls": DAY1_WALL_CLOCK}},
    ]


pytestmark = pytest.mark.usefixtures("loopback_env")


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, Any]]:
    base = tmp_path_factory.mktemp("implement")
    run, store = base / "run", base / "store"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WORLDCTL_LLM_API_KEY", "x")
        with serving(_rules()) as server:
            common = ["--run", str(run), "--model", MODEL, "--api-base", server.url]
            assert invoke("synth", "persona", "--name", "astrid", *common).exit_code == 0
            result = invoke("--store", str(store), "synth", "world", "astrid", "--to-day",
                            "2", *common, "--json")
            assert result.exit_code == 0, result.output
            again = invoke("--store", str(store), "synth", "day", "astrid", "--day", "2",
                           *common)
            assert again.exit_code == 0, again.output
            assert "astrid@2: in the store already" in again.stdout
    yield run, store, json.loads(result.stdout)


def test_a_wall_clock_write_is_caught_and_fixed_from_the_feedback(
        made: tuple[Path, Path, Any]) -> None:
    run, _, report = made
    assert report["status"] == "stored"
    day1, day2 = report["days"]
    first, second = day1["attempts"]
    assert first["problem"].startswith("replay: call #5 (shell `mkdir -p photos")
    assert "had other effects when run again" in first["problem"]
    assert "file 'log.txt'" in first["problem"]
    assert second["problem"] is None and day1["status"] == "stored"
    layers = {layer["layer"]: layer["status"] for layer in second["layers"]}
    assert layers == {"lint": "passed", "replay": "passed", "declarations": "passed",
                      "health": "passed", "review": "passed"}
    assert (day2["status"], len(day2["attempts"])) == ("stored", 1)
    # the feedback reached the second attempt's request, and nothing of the wall clock did
    asked = [m["content"] for p in (run / "recordings").iterdir()
             for m in json.loads(p.read_text())["request"]["messages"]
             if REFUSED_BEFORE in str(m.get("content"))]
    assert asked and "attempt 1: replay: call #5" in asked[0]
    outcome = msgspec.json.decode((run / "personas" / "astrid" / "days" / "day-1.json"
                                   ).read_bytes(), type=DayOutcome)
    assert outcome.world_hash == day1["world_hash"]


def test_the_implementers_episodes_are_stored_for_debugging(
        made: tuple[Path, Path, Any]) -> None:
    _, store, _ = made
    listed = invoke("--store", str(store), "episode", "list", "--agent", "synth:implement",
                    "--json")
    assert listed.exit_code == 0, listed.output
    episodes = json.loads(listed.stdout)
    assert len(episodes) == 3  # day 1 twice (the first refused), day 2 once
    assert sorted(e["day"] for e in episodes) == [0, 0, 1]
    verified = invoke("--store", str(store), "episode", "verify", "--all")
    assert verified.exit_code == 0, verified.output


def test_the_days_are_stamped_from_the_plans_clock(made: tuple[Path, Path, Any]) -> None:
    _, store, report = made
    with Worlds.open(store) as worlds:
        records = {r.day: r for r in worlds.store.days("astrid")}
        assert sorted(records) == [0, 1, 2]
        assert records[0].first_ts == SETUP_TS
        assert (records[1].first_ts, records[1].last_ts) == (T1, "2026-03-02T11:30:00Z")
        assert records[2].first_ts == "2026-03-03T08:15:00Z"
        assert records[2].world_hash == report["days"][1]["world_hash"]
        root = worlds.snapshot("astrid", 1)
        assert (root / "workspace" / "log.txt").read_text() == "2026-03-02 11:30\n"
        assert all(r.status == "replayed" for r in worlds.replay("astrid"))


def test_each_plan_reads_what_exploring_the_world_before_found(
        made: tuple[Path, Path, Any]) -> None:
    run, _, _ = made
    explorations = [json.loads(p.read_text()) for p in (run / "outputs" / "explore").iterdir()]
    assert sorted(e["subject"] for e in explorations) == ["astrid@0", "astrid@1"]
    assert all(e["findings"] == FINDINGS and e["calls"] == ["list_files {}"]
               for e in explorations)
    asked = [m["content"] for p in (run / "recordings").iterdir()
             for m in json.loads(p.read_text())["request"].get("messages", [])
             if "Plan day 2." in str(m.get("content"))]
    assert asked and asked[0].endswith(
        "What exploring the world through the day before found:\n" + FINDINGS)
    shown = [m["content"] for p in (run / "recordings").iterdir()
             for m in json.loads(p.read_text())["request"].get("messages", [])
             if m.get("role") == "tool" and "accounts.json" in str(m.get("content"))]
    assert shown  # the explorer was shown the workspace's real listing
    status = invoke("synth", "status", str(run), "--json")
    assert status.exit_code == 0, status.output
    rows = {r["stage"]: r for r in json.loads(status.stdout)["stages"]}
    assert (rows["explore"]["accepted"], rows["explore"]["attempts"]) == (2, 4)


def test_the_run_replays_offline_to_the_same_worlds(made: tuple[Path, Path, Any],
                                                    tmp_path: Path) -> None:
    run, _, report = made
    again = replay_run(run, tmp_path / "again")
    assert again.identical, again.differences
    assert again.world_hashes["astrid"] == report["days"][1]["world_hash"]
    kept = json.loads((run / "worlds" / "astrid.json").read_text())
    assert kept["days"]["2"] == report["days"][1]["world_hash"]


def test_day_zero_is_the_bibles_services_with_the_library_schemas() -> None:
    bible = msgspec.convert(BIBLE, BibleOut)
    lines = [json.loads(line) for line in setup_lines(bible).splitlines()]
    assert {line["ts"] for line in lines} == {SETUP_TS}
    pinned = [line["service"] for line in lines if line["type"] == "app"]
    assert pinned == ["chat", "notes"]
    creates = [line["sql"] for line in lines if line["type"] == "sql"]
    assert creates == [*library_schemas()["chat"], *library_schemas()["notes"]]
    assert [line["path"] for line in lines if line["type"] == "file_write"] == ["accounts.json"]
    unknown = msgspec.convert({**BIBLE, "services": ["chat", "bank"]}, BibleOut)
    with pytest.raises(Exception, match="service 'bank' is not in the app library"):
        setup_lines(unknown)


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Worlds]:
    with Worlds.open(tmp_path / "store") as worlds:
        worlds.import_file(load_pack("demo").worlds[0])
        yield worlds


def test_sql_runs_under_the_events_gate_and_joins_the_episode(demo: Worlds) -> None:
    with Environment(demo) as env, env.open("lars@7") as instance:
        assert instance.sql("notes", "SELECT count(*) FROM notes").structured == {
            "columns": ["count(*)"], "rows": [[9]], "more_rows": 0, "changed_rows": 0}
        for sql, why in (("ATTACH '/etc/passwd' AS x", "ATTACH/DETACH is not allowed"),
                         ("BEGIN", "transaction control is not allowed"),
                         ("PRAGMA writable_schema=1", "PRAGMA writable_schema"),
                         ("SELECT load_extension('x')", "load_extension() is not allowed"),
                         ("INSERT INTO nope VALUES (1)", "no such table")):
            result = instance.sql("notes", sql)
            assert result.is_error and why in result.text, (sql, result.text)
        assert "no service 'bank'" in instance.sql("bank", "SELECT 1").text
        instance.set_clock("2026-03-20T09:00:00Z")
        changed = instance.sql("notes", "UPDATE notes SET updated_at = datetime('now') "
                                        "WHERE id = ?", [1])
        assert changed.structured["changed_rows"] == 1
        assert instance.sql("notes", "SELECT updated_at FROM notes WHERE id = 1"
                            ).structured["rows"] == [["2026-03-20 09:00:00"]]
        calls = instance.episode.calls
        assert calls[-2].tool == "sql" and calls[-2].ts == "2026-03-20T09:00:00Z"
        assert all(c.writes for c in calls)  # `sql` may write, as a writing tool may
        changes = [e for e in instance.episode.events if type(e).__name__ == "DbChange"]
        assert [e.index for e in changes] == [calls[-2].index]  # refusals changed nothing
        with pytest.raises(InputError, match="the clock only goes forward"):
            instance.set_clock("2026-03-20T09:00:00Z")  # the next call is a second later
        with pytest.raises(InputError, match="not ISO 8601"):
            instance.set_clock("tomorrow")
        instance.reset()
        assert instance.episode.calls == []
        instance.set_clock("2026-03-10T00:00:00Z")  # a reset clock starts over


def test_a_candidate_with_a_name_another_persona_holds_fails_lint_and_stores_nothing(
        demo: Worlds) -> None:
    bible = msgspec.convert(BIBLE, BibleOut)
    demo.import_stream(io.BytesIO(setup_lines(bible)), source="<setup>")
    with Environment(demo) as env, env.open("astrid@0") as instance:
        # Ingrid Solberg is a contact in lars's world
        result = instance.sql("chat", "INSERT INTO users (id, name, handle, created_at, "
                              "updated_at) VALUES (1, 'Ingrid Solberg', 'ingrid', ?, ?)",
                              [T1, T1])
        assert not result.is_error, result.text
        from synth.worlds.days import day_from_episode

        episode = msgspec.structs.replace(instance.episode, final_hash=instance.hash())
    day: EpisodeDay = day_from_episode(demo, episode)
    report = validate_candidate(demo, day)
    assert report.layer("lint").status == "failed"
    assert "'Ingrid Solberg'" in report.layer("lint").reason
    assert "lars" in report.layer("lint").reason
    assert [r.day for r in demo.store.days("astrid")] == [0]


def test_refusals(made: tuple[Path, Path, Any]) -> None:
    run, store, _ = made
    common = ["--run", str(run), "--model", MODEL, "--api-base", "http://127.0.0.1:9/v1"]
    assert "last day of astrid is 2" in refused(invoke(
        "--store", str(store), "synth", "day", "astrid", "--day", "4", *common))
    assert "'nobody' is not an accepted persona" in refused(invoke(
        "--store", str(store), "synth", "world", "nobody", "--to-day", "1", *common))
    assert "--to-day 0" in refused(invoke("--store", str(store), "synth", "world", "astrid",
                                          "--to-day", "0", *common))
    no_model = invoke("--store", str(store), "synth", "world", "astrid", "--to-day", "3",
                      "--run", str(run.parent / "fresh-run"))
    assert "no model to synthesize with" in refused(no_model)
    fresh = run.parent / "refused-run"
    assert "'nobody' is not an accepted persona" in refused(invoke(
        "--store", str(store), "synth", "world", "nobody", "--to-day", "1", "--run",
        str(fresh), "--model", MODEL))
    assert not fresh.exists()  # a refusal writes no run folder


def test_the_skill_library_learns_from_day_1_and_day_2_is_given_it(
        made: tuple[Path, Path, Any]) -> None:
    run, _, _ = made
    skills = read_skills(run)
    by_kind: dict[str, list[str]] = {}
    for skill in skills:
        by_kind.setdefault(skill.kind, []).append(skill.text)
    assert by_kind["lesson"][0].startswith("a day was refused by replay: call #5 (shell")
    assert any(t.startswith("chat_send_message works with arguments {\"body\": \"Where is "
                            "my order?\"") for t in by_kind["interface"])
    assert any(t.startswith("chat: INSERT INTO users") for t in by_kind["state_change"])
    assert "chat.messages.conversation_id must name a row of chat.conversations (id)" in \
        by_kind["constraint"]
    assert any(t.startswith("notes: INSERT INTO notebooks") for t in by_kind["state_change"])
    day1 = msgspec.json.decode((run / "personas" / "astrid" / "days" / "day-1.json"
                                ).read_bytes(), type=DayOutcome)
    day2 = msgspec.json.decode((run / "personas" / "astrid" / "days" / "day-2.json"
                                ).read_bytes(), type=DayOutcome)
    assert day1.skills == []  # the library was empty
    learned_on_1 = {s.key for s in day1.learned}
    assert day2.skills and set(day2.skills) <= learned_on_1
    asked = [m["content"] for p in (run / "recordings").iterdir()
             for m in json.loads(p.read_text())["request"].get("messages", [])
             if "The plan of day 2" in str(m.get("content"))]
    assert asked and "Skills from earlier days" in asked[0]
    assert "[lesson] a day was refused by replay" in asked[0]


def test_retrieval_prefers_shared_tools_then_services_and_keeps_the_latest_lessons() -> None:
    plan = msgspec.convert({**PLAN2, "activities": [
        {**PLAN2["activities"][0], "tool": "notes_create_note"}]}, PlanOut)
    library = [Skill("interface", "chat one", ["chat"], ["chat_send_message"], "a@1"),
               Skill("interface", "notes one", ["notes"], ["notes_create_note"], "a@1"),
               Skill("state_change", "shop one", ["shop"], [], "a@1"),
               *(lesson(f"lesson {i}", "a@1") for i in range(6))]
    got = retrieve(library, plan, ["chat", "notes"])
    assert [s.text for s in got] == ["notes one", "chat one", "lesson 2", "lesson 3",
                                     "lesson 4", "lesson 5"]
    assert retrieve(library, plan, ["chat", "notes"]) == got  # a pure function
