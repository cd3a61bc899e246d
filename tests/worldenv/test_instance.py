"""Instances: tool calls, refusals as data, episodes that replay to the final hash, exact
reset, determinism, isolation under concurrency, and both MCP surfaces in memory.

The tests use a small app of their own over the demo world's `notes` service, so they
exercise the instance machinery independently of the shipped apps' tool sets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastmcp import Client, FastMCP
from fastmcp.exceptions import ToolError as McpToolError
from fastmcp.exceptions import ValidationError as McpValidationError
from fastmcp.tools import Tool

from replay import Worlds
from tests.support.notes_app import notes_app
from worldenv.core.app import App, ToolContext, bind
from worldenv.core.contract import CallClock, CallContext, ToolResult
from worldenv.core.dispatch import execute_tool, open_tool_db
from worldenv.core.episode import DbChange, Episode, ToolCall, apply_effects
from worldenv.errors import InstanceClosed, ResetNeeded
from worldenv.instances.checker import check_determinism
from worldenv.instances.instance import Environment, Instance
from worldenv.serving.gym import WorldEnv
from worldenv.serving.mcp import instance_server

notes = notes_app("test-notes")


@notes.tool(writes=True)
def stamp(ctx: ToolContext) -> int:
    """Write a note whose title is drawn from SQLite's random() (seeded per call)."""
    ctx.execute("INSERT INTO notes(id, notebook_id, title, body, created_at, updated_at) "
                "SELECT MAX(id) + 1, 1, 'r' || random(), '', ?, ? FROM notes",
                (ctx.now, ctx.now))
    return int(ctx.value("SELECT MAX(id) FROM notes"))


@pytest.fixture(scope="module")
def worlds(demo_worlds: Worlds) -> Worlds:
    return demo_worlds  # the shared demo store (tests/conftest.py), this module's copy


@pytest.fixture
def env(worlds: Worlds) -> Environment:
    return Environment(worlds, apps={"notes": notes}, check_pins=False)


@pytest.fixture
def inst(env: Environment) -> Iterator[Instance]:
    with env.open("lars@7") as instance:
        yield instance


def test_tools_are_listed_with_schemas(inst: Instance) -> None:
    tools = {t.name: t for t in inst.list_tools()}
    assert sorted(tools) == ["notes_get_note", "notes_rename_note", "notes_stamp"]
    get = tools["notes_get_note"]
    assert get.input_schema["properties"]["note_id"]["description"] == "The note's id"
    assert get.output_schema is not None and not get.writes
    assert tools["notes_rename_note"].writes


def test_a_read_returns_structured_data_and_records_only_the_call(inst: Instance) -> None:
    result = inst.call_tool("notes_get_note", {"note_id": 4})
    assert not result.is_error and result.structured["title"].startswith("Nordlys")
    assert [type(e) for e in inst.episode.events] == [ToolCall]
    assert inst.hash() == inst.record.world_hash


def test_bad_calls_are_error_results_naming_the_problem(inst: Instance) -> None:
    unknown = inst.call_tool("notes_nope", {})
    assert unknown.is_error and "notes_get_note" in unknown.text and "notes_nope" in unknown.text
    bad_type = inst.call_tool("notes_get_note", {"note_id": "four"})
    assert bad_type.is_error and "note_id" in bad_type.text
    missing = inst.call_tool("notes_get_note", {})
    assert missing.is_error and "note_id" in missing.text
    extra = inst.call_tool("notes_get_note", {"note_id": 4, "color": "red"})
    assert extra.is_error and "color" in extra.text
    refused = inst.call_tool("notes_rename_note", {"note_id": 999, "title": "x"})
    assert refused.is_error and refused.text == "No note with id 999"
    assert all(isinstance(e, ToolCall) and e.is_error for e in inst.episode.events)
    assert inst.hash() == inst.record.world_hash  # a refused write changed nothing


def test_sql_injection_is_stored_literally(inst: Instance) -> None:
    evil = "'); DROP TABLE notes;--"
    assert not inst.call_tool("notes_rename_note", {"note_id": 4, "title": evil}).is_error
    assert inst.call_tool("notes_get_note", {"note_id": 4}).structured["title"] == evil
    assert "notes" in {t for s in inst.mount.manifest.services.values() for t in s.tables}
    diff = inst.diff()
    assert [(t.table, t.changed) for t in diff.tables] == [("notes", 1)]


def test_episode_effects_replay_to_the_final_hash(inst: Instance, worlds: Worlds) -> None:
    inst.call_tool("notes_rename_note", {"note_id": 4, "title": "A"})
    inst.call_tool("notes_get_note", {"note_id": 4})
    inst.call_tool("notes_stamp", {})
    inst.call_tool("notes_rename_note", {"note_id": 5, "title": "B"})
    kinds = [type(e).__name__ for e in inst.episode.events]
    assert kinds == ["ToolCall", "DbChange", "ToolCall", "ToolCall", "DbChange", "ToolCall",
                     "DbChange"]
    final = inst.hash()
    assert final != inst.record.world_hash
    copy = Episode.from_json(inst.episode.to_json())  # survives serialization
    with worlds.mount(inst.record.world_hash) as fresh:
        apply_effects(fresh, copy.events)
        assert fresh.hash() == final


def test_the_clock_is_frozen_per_call_and_reset_restores_everything(inst: Instance) -> None:
    first = inst.call_tool("notes_rename_note", {"note_id": 4, "title": "A"}).structured
    assert first["updated_at"] == "2026-03-09T17:05:01Z"  # last ts of lars@7 + 1 s
    second = inst.call_tool("notes_rename_note", {"note_id": 4, "title": "A"}).structured
    assert second["updated_at"] == "2026-03-09T17:05:02Z"
    inst.reset()
    assert inst.hash() == inst.record.world_hash and inst.episode.events == []
    again = inst.call_tool("notes_rename_note", {"note_id": 4, "title": "A"}).structured
    assert again == first


def test_random_is_seeded_by_the_snapshot_and_the_call(env: Environment) -> None:
    with env.open("lars@7") as a, env.open("lars@7") as b:
        a.call_tool("notes_get_note", {"note_id": 1})
        b.call_tool("notes_get_note", {"note_id": 1})
        ra, rb = a.call_tool("notes_stamp", {}), b.call_tool("notes_stamp", {})
        assert ra == rb and a.hash() == b.hash()
        assert a.call_tool("notes_stamp", {}).text != ra.text  # another call, another draw


def test_the_checker_passes_and_names_nothing(env: Environment) -> None:
    calls = [("notes_get_note", {"note_id": 4}), ("notes_rename_note",
             {"note_id": 4, "title": "checked"}), ("notes_stamp", {}),
             ("notes_get_note", {"note_id": 999})]
    report = check_determinism(env, "lars@7", calls)
    assert report.ok, report.problems
    assert report.calls == 4 and report.final_hash is not None


def test_close_is_safe_twice_and_later_calls_raise(env: Environment) -> None:
    instance = env.open("lars@7")
    path = instance.mount.path
    instance.close()
    instance.close()
    assert not path.exists()
    with pytest.raises(InstanceClosed):
        instance.call_tool("notes_get_note", {"note_id": 4})


NOTES = (1, 2, 4)  # notes of lars@7 (note 3 was deleted on day 6)


def test_hundreds_of_concurrent_instances_stay_isolated(env: Environment,
                                                        worlds: Worlds) -> None:
    instances = [env.open("lars@7") for _ in range(200)]

    async def work(i: int, instance: Instance) -> None:
        for step, note in enumerate(NOTES):
            await instance.acall_tool("notes_rename_note",
                                      {"note_id": note, "title": f"inst-{i}-{step}"})
            await asyncio.sleep(0)

    async def all_of_them() -> None:
        await asyncio.gather(*(work(i, x) for i, x in enumerate(instances)))

    try:
        asyncio.run(all_of_them())
        hashes = set()
        for i, instance in enumerate(instances):
            for step, note in enumerate(NOTES):
                title = instance.call_tool("notes_get_note", {"note_id": note})
                assert title.structured["title"] == f"inst-{i}-{step}"
            final = instance.hash()
            hashes.add(final)
            with worlds.mount(instance.record.world_hash) as fresh:
                apply_effects(fresh, instance.episode.events)
                assert fresh.hash() == final
        assert len(hashes) == 200
    finally:
        for instance in instances:
            instance.close()


shapes = notes_app("shapes-notes")


@shapes.tool(writes=False)
def titles(ctx: ToolContext, limit: int = 3) -> list[str]:
    """Note titles: a list result."""
    return [str(r["title"]) for r in ctx.rows("SELECT title FROM notes ORDER BY id LIMIT ?",
                                              (limit,))]


@shapes.tool(writes=False)
def counts(ctx: ToolContext) -> dict[str, int]:
    """A dict result."""
    return {"notes": int(ctx.value("SELECT count(*) FROM notes"))}


@shapes.tool(writes=False)
def nothing(ctx: ToolContext) -> None:
    """No result."""


@shapes.tool(writes=False)
def boom(ctx: ToolContext) -> int:
    """A tool that fails."""
    raise RuntimeError("kaboom")


SHAPE_CALLS: list[tuple[str, dict[str, object]]] = [
    ("notes_get_note", {"note_id": 4}), ("notes_get_note", {"note_id": "4"}),
    ("notes_get_note", {"note_id": 0}), ("notes_get_note", {"note_id": "four"}),
    ("notes_get_note", {}), ("notes_get_note", {"note_id": 4, "color": "red"}),
    ("notes_rename_note", {"note_id": 4, "title": "renamed"}),
    ("notes_rename_note", {"note_id": 999, "title": "x"}),
    ("notes_rename_note", {"note_id": 4, "title": ""}),
    ("notes_titles", {}), ("notes_titles", {"limit": 2.0}), ("notes_titles", {"limit": 2.5}),
    ("notes_counts", {}), ("notes_nothing", {}), ("notes_boom", {}),
    ("notes_get_note", {"note_id": 4}),
]


def test_the_dispatch_answers_as_a_fastmcp_server_would(worlds: Worlds) -> None:
    """Schemas, validation errors, refusals, failures and results are those of a FastMCP
    server serving the same tool functions: the MCP surface agents know, with no FastMCP
    server in the call."""
    env = Environment(worlds, apps={"notes": shapes}, check_pins=False)
    with env.open("lars@7") as inst, env.open("lars@7") as twin:
        conn = open_tool_db(twin.mount.db_path("notes"))
        contexts: list[CallContext] = []
        server = FastMCP("reference")
        for spec in shapes.tools.values():
            server.add_tool(Tool.from_function(
                bind(spec, lambda spec, kwargs: execute_tool(conn, spec, kwargs, contexts[-1])),
                name=spec.full_name, description=spec.description, run_in_thread=False))

        async def compare() -> None:
            listed = {t.name: t for t in await server.list_tools()}
            assert [(t.name, t.description, t.input_schema, t.output_schema)
                    for t in inst.list_tools()] == [
                (n, listed[n].description, listed[n].parameters, listed[n].output_schema)
                for n in sorted(listed)]
            for index, (name, arguments) in enumerate(SHAPE_CALLS, start=1):
                got = await inst.acall_tool(name, arguments)
                clock = CallClock.of_call(inst.record.last_ts, inst.record.world_hash, index)
                contexts.append(CallContext(clock))
                try:
                    raw = await server.call_tool(name, arguments)
                    want = ToolResult(bool(raw.is_error), "".join(
                        getattr(c, "text", "") for c in raw.content), raw.structured_content)
                except (McpToolError, McpValidationError) as exc:
                    want = ToolResult(True, str(exc))
                assert got == want, (name, arguments)

        asyncio.run(compare())
        conn.close()
        assert inst.hash() == twin.hash() != inst.record.world_hash
        assert [e.index for e in inst.episode.events if isinstance(e, DbChange)] == [7]


def test_mcp_tools_mode_in_memory(inst: Instance) -> None:
    async def session() -> None:
        async with Client(instance_server(inst)) as client:
            names = sorted(t.name for t in await client.list_tools())
            assert names == ["notes_get_note", "notes_rename_note", "notes_stamp"]
            ok = await client.call_tool("notes_rename_note", {"note_id": 4, "title": "M"})
            assert ok.structured_content["title"] == "M"
            bad = await client.call_tool("notes_get_note", {"note_id": 999},
                                         raise_on_error=False)
            assert bad.is_error and bad.content[0].text == "No note with id 999"

    asyncio.run(session())
    assert sum(isinstance(e, DbChange) for e in inst.episode.events) == 1


def test_mcp_meta_tools_mode_in_memory(inst: Instance) -> None:
    async def session() -> None:
        async with Client(instance_server(inst, "meta")) as client:
            assert sorted(t.name for t in await client.list_tools()) == ["call_tool",
                                                                        "list_tools"]
            listed = await client.call_tool("list_tools", {})
            assert {t["name"] for t in listed.structured_content["result"]} == {
                "notes_get_note", "notes_rename_note", "notes_stamp"}
            as_text = await client.call_tool("call_tool", {
                "tool_name": "notes_get_note", "arguments": '{"note_id": 4}'})
            assert '"id":4' in as_text.content[0].text
            unknown = await client.call_tool("call_tool", {"tool_name": "x", "arguments": {}},
                                             raise_on_error=False)
            assert unknown.is_error and "notes_get_note" in unknown.content[0].text
            bad_json = await client.call_tool("call_tool", {
                "tool_name": "notes_get_note", "arguments": "{nope"}, raise_on_error=False)
            assert bad_json.is_error and "not valid JSON" in bad_json.content[0].text

    asyncio.run(session())


def test_gym_wrapper(env: Environment) -> None:
    world = WorldEnv(env, "lars@7", max_steps=2,
                     reward_fn=lambda inst, answer: 1.0 if answer == "done" else 0.0)
    with pytest.raises(ResetNeeded):
        world.step({"tool": "notes_get_note", "arguments": {"note_id": 4}})
    observation, info = world.reset()
    assert "notes_get_note" in observation["tools"] and info["world_hash"]
    obs, reward, terminated, truncated, _ = world.step(
        {"tool": "notes_rename_note", "arguments": {"note_id": 4, "title": "G"}})
    assert not obs["is_error"] and (reward, terminated, truncated) == (0.0, False, False)
    _obs, reward, terminated, truncated, _ = world.step({"answer": "done"})
    assert (reward, terminated, truncated) == (1.0, True, False)
    with pytest.raises(ResetNeeded):
        world.step({"answer": "again"})
    world.reset()
    assert world.instance is not None and world.instance.hash() == info["world_hash"]
    world.close()


def test_instances_live_under_the_cache_and_vanish_on_close(env: Environment) -> None:
    instance = env.open("lars@7")
    assert Path(instance.mount.path).is_dir()
    instance.close()
    assert not Path(instance.mount.path).exists()


sneaky = App(service="notes", name="sneaky-notes", version="1", source="# sneaky\n")


@sneaky.tool(writes=False)
def sneaky_write(ctx: ToolContext) -> int:
    """Claims to only read, but writes."""
    return ctx.execute("UPDATE notes SET title = 'sneaky' WHERE id = 1")


def test_a_read_only_tool_cannot_write(worlds: Worlds) -> None:
    env = Environment(worlds, apps={"notes": sneaky}, check_pins=False)
    with env.open("lars@7") as instance:
        result = instance.call_tool("notes_sneaky_write", {})
        assert result.is_error and "readonly" in result.text.lower()
        assert instance.hash() == instance.record.world_hash


def test_lazy_and_eager_instances_answer_and_end_alike(worlds: Worlds) -> None:
    """A lazy instance (the default) reads the snapshot until a service is written; the
    responses, the episode and the final hash are those of an instance copied at open."""
    calls = [("notes_get_note", {"note_id": 4}),
             ("notes_rename_note", {"note_id": 4, "title": "A"}),
             ("notes_get_note", {"note_id": 4}), ("notes_stamp", {})]
    outcomes = []
    for lazy in (True, False):
        env = Environment(worlds, apps={"notes": notes}, check_pins=False, lazy=lazy)
        with env.open("lars@7") as instance:
            copied_at_open = sorted(p.name for p in instance.mount.path.rglob("*")
                                    if p.is_file())
            texts = [instance.call_tool(name, args).text for name, args in calls]
            shell = instance.shell("cat docs/rates.md | wc -c")
            outcomes.append((texts, shell.stdout, instance.episode.events, instance.hash(),
                             copied_at_open))
    lazy, eager = outcomes
    assert lazy[:4] == eager[:4]
    assert lazy[4] == []
    assert {"chat.sqlite", "shop.sqlite", "calendar.sqlite", "notes.sqlite"} <= set(eager[4])
