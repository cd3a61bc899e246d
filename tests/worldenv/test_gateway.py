"""The gateway: a real uvicorn server on a loopback port, real clients (fastmcp and the
official MCP SDK over streamable HTTP, httpx2 for REST), no mocks.

A small app of its own over the demo world's `notes` service, with a slow tool for the
per-call timeout.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import httpx2
import pytest
from click.testing import CliRunner
from fastmcp import Client
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from pydantic import BaseModel, Field

from replay import Worlds
from tests.support.asgi_server import served
from worldctl.main import cli
from worldenv.core.app import App, ToolContext, ToolError
from worldenv.core.episode import Episode, ToolCall, apply_effects
from worldenv.errors import GatewayError
from worldenv.instances.instance import Environment
from worldenv.serving.gateway import Gateway, check_bind, serve

TOKEN = "s3cret-token"
NOTE_TOOLS = ["notes_get_note", "notes_rename_note", "notes_slow"]

notes = App(service="notes", name="gateway-notes", version="1", source=Path(__file__).read_text())


class Note(BaseModel):
    id: int
    title: str


@notes.tool(writes=False)
def get_note(ctx: ToolContext, note_id: Annotated[int, Field(ge=1)]) -> Note:
    """Get one note by id."""
    return Note(**ctx.require(ctx.row("SELECT id, title FROM notes WHERE id = ?", (note_id,)),
                              "note", note_id))


@notes.tool(writes=True)
def rename_note(ctx: ToolContext, note_id: int,
                title: Annotated[str, Field(min_length=1)]) -> Note:
    """Rename a note."""
    if not ctx.execute("UPDATE notes SET title = ?, updated_at = ? WHERE id = ?",
                       (title, ctx.now, note_id)):
        raise ToolError(f"No note with id {note_id}")
    return get_note(ctx, note_id)


@notes.tool(writes=False)
def slow(ctx: ToolContext, seconds: float) -> str:
    """Take `seconds` seconds (a blocking tool)."""
    time.sleep(seconds)
    return "finally"


# --- fixtures ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def worlds(demo_worlds: Worlds) -> Worlds:
    return demo_worlds  # the shared demo store (tests/conftest.py), this module's copy


@pytest.fixture(scope="module")
def env(worlds: Worlds) -> Environment:
    return Environment(worlds, apps={"notes": notes}, check_pins=False)


@pytest.fixture(scope="module")
def gateway(env: Environment) -> Gateway:
    return Gateway(env, token=TOKEN, max_instances=16)


@pytest.fixture(scope="module")
def base(gateway: Gateway) -> Iterator[str]:
    with served(gateway) as url:
        yield url


@pytest.fixture(scope="module")
def rest(base: str) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"},
                       timeout=30) as client:
        yield client


def create(rest: httpx2.Client, world: str = "lars@7", **extra: Any) -> dict[str, Any]:
    response = rest.post("/instances", json={"world": world, **extra})
    assert response.status_code == 201, response.text
    data: dict[str, Any] = response.json()
    return data


async def with_fastmcp(url: str, calls: list[tuple[str, dict[str, Any]]],
                       token: str = TOKEN) -> tuple[list[str], list[Any]]:
    async with Client(url, auth=token, timeout=30) as client:
        names = sorted(t.name for t in await client.list_tools())
        results = [await client.call_tool(n, a, raise_on_error=False) for n, a in calls]
    return names, results


async def with_sdk(url: str, calls: list[tuple[str, dict[str, Any]]]
                   ) -> tuple[list[str], list[Any]]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"},
                                  timeout=30) as http, \
            streamable_http_client(url, http_client=http) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        names = sorted(t.name for t in (await session.list_tools()).tools)
        results = [await session.call_tool(n, a) for n, a in calls]
    return names, results


def rename(note: int, title: str) -> tuple[str, dict[str, Any]]:
    return ("notes_rename_note", {"note_id": note, "title": title})


def get(note: int) -> tuple[str, dict[str, Any]]:
    return ("notes_get_note", {"note_id": note})


# --- tests -------------------------------------------------------------------------------


def test_one_instance_through_both_clients(rest: httpx2.Client, base: str, gateway: Gateway,
                                           worlds: Worlds) -> None:
    made = create(rest)
    iid = made["id"]
    world_hash = worlds.resolve("lars@7").world_hash
    assert made["mcp_url"] == f"/instances/{iid}/mcp" and made["tools"] == 3
    assert (made["world_hash"], made["persona"], made["day"]) == (world_hash, "lars", 7)
    url = base + made["mcp_url"]
    path = gateway.instances[iid].instance.mount.path

    names, (renamed, read) = asyncio.run(with_fastmcp(url, [rename(4, "via fastmcp"),
                                                            get(4)]))
    assert names == NOTE_TOOLS
    assert renamed.structured_content["title"] == "via fastmcp"
    assert read.structured_content == {"id": 4, "title": "via fastmcp"}
    names, (renamed, read) = asyncio.run(with_sdk(url, [rename(2, "via sdk"), get(2)]))
    assert names == NOTE_TOOLS
    assert not renamed.is_error and renamed.structured_content["title"] == "via sdk"
    assert read.structured_content == {"id": 2, "title": "via sdk"}

    info = rest.get(f"/instances/{iid}").json()
    assert info["calls"] == 4 and info["idle_s"] < 5 and not info["busy"]
    episode = Episode.from_json(rest.get(f"/instances/{iid}/episode").content)
    calls = [e for e in episode.events if isinstance(e, ToolCall)]
    assert [(c.tool, c.arguments.get("note_id")) for c in calls] == [
        ("notes_rename_note", 4), ("notes_get_note", 4), ("notes_rename_note", 2),
        ("notes_get_note", 2)]
    now = rest.get(f"/instances/{iid}/hash").json()
    assert now["changed"] and now["world_hash"] == world_hash != now["hash"]
    with worlds.mount(world_hash) as fresh:
        apply_effects(fresh, episode.events)
        assert fresh.hash() == now["hash"]
    diff = rest.get(f"/instances/{iid}/diff").json()
    assert [(t["table"], t["changed"]) for t in diff["tables"]] == [("notes", 2)]

    reset = rest.post(f"/instances/{iid}/reset")
    assert reset.status_code == 200 and reset.json()["calls"] == 0
    stored = reset.json()["stored_episode_id"]  # the four calls, stored before the reset
    assert worlds.store.episode(stored).n_calls == 4
    assert rest.get(f"/instances/{iid}/hash").json()["hash"] == world_hash
    assert Episode.from_json(rest.get(f"/instances/{iid}/episode").content).events == []

    closed = rest.delete(f"/instances/{iid}")
    assert closed.status_code == 200, closed.text
    assert closed.json() == {
        "id": iid, "closed": True, "calls": 0, "episode_id": None, "stored": False,
        "reason": "the episode has no calls and no answer: not stored",
        "stored_episodes": [stored]}
    assert not path.exists()
    gone = rest.get(f"/instances/{iid}")
    assert gone.status_code == 404 and "its episode was not stored" in gone.json()["error"]
    assert rest.delete(f"/instances/{iid}").status_code == 404
    assert httpx2.post(url, json={}, headers={"Authorization": f"Bearer {TOKEN}"}
                       ).status_code == 404


def test_instances_do_not_see_each_others_writes(rest: httpx2.Client, base: str) -> None:
    a = create(rest)
    b = create(rest, world=a["world_hash"])  # a world hash works as well
    listed = {i["id"] for i in rest.get("/instances").json()["instances"]}
    assert {a["id"], b["id"]} <= listed
    _, (wrote,) = asyncio.run(with_fastmcp(base + a["mcp_url"], [rename(4, "only in a")]))
    assert not wrote.is_error
    _, (seen,) = asyncio.run(with_sdk(base + b["mcp_url"], [get(4)]))
    assert seen.structured_content["title"] != "only in a"
    assert rest.get(f"/instances/{a['id']}/hash").json()["changed"]
    assert not rest.get(f"/instances/{b['id']}/hash").json()["changed"]


def test_meta_mode_has_exactly_two_tools(rest: httpx2.Client, base: str) -> None:
    made = create(rest, mode="meta")
    assert made["mode"] == "meta"
    url = base + made["mcp_url"]
    names, (listed, called) = asyncio.run(with_fastmcp(url, [
        ("list_tools", {}),
        ("call_tool", {"tool_name": "notes_rename_note",
                       "arguments": {"note_id": 1, "title": "meta"}})]))
    assert names == ["call_tool", "list_tools"]
    assert sorted(t["name"] for t in listed.structured_content["result"]) == NOTE_TOOLS
    assert not called.is_error and '"title":"meta"' in called.content[0].text
    names, (sdk_called,) = asyncio.run(with_sdk(url, [
        ("call_tool", {"tool_name": "notes_get_note", "arguments": '{"note_id": 1}'})]))
    assert names == ["call_tool", "list_tools"] and '"title":"meta"' in \
        sdk_called.content[0].text
    assert rest.get(f"/instances/{made['id']}").json()["calls"] == 2


def test_every_request_needs_the_token(rest: httpx2.Client, base: str) -> None:
    made = create(rest)
    mcp = base + made["mcp_url"]
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN},
                    {"Authorization": f"Basic {TOKEN}"}):
        for response in (httpx2.get(base + "/healthz", headers=headers),
                         httpx2.get(base + "/instances", headers=headers),
                         httpx2.post(base + "/instances", json={"world": "lars@7"},
                                     headers=headers),
                         httpx2.post(mcp, json={}, headers=headers)):
            assert response.status_code == 401, (headers, response.request.url)
            assert response.headers["www-authenticate"].startswith("Bearer")
    with pytest.raises(Exception):  # noqa: B017 - the client's error type is not public
        asyncio.run(with_fastmcp(mcp, [], token="wrong"))
    assert rest.get("/healthz").json()["ok"]


def test_bad_requests_get_clear_errors(rest: httpx2.Client) -> None:
    unknown = rest.post("/instances", json={"world": "nobody@1"})
    assert unknown.status_code == 404 and "nobody" in unknown.json()["error"]
    no_day = rest.post("/instances", json={"world": "lars@99"})
    assert no_day.status_code == 404
    bad_ref = rest.post("/instances", json={"world": "lars@@7"})
    assert bad_ref.status_code == 400 and "persona@day" in bad_ref.json()["error"]
    for body in ({}, {"world": 7}, {"world": "lars@7", "mode": "all"},
                 {"world": "lars@7", "colour": "red"}):
        assert rest.post("/instances", json=body).status_code == 400, body
    assert rest.post("/instances", content=b"{nope").status_code == 400
    assert rest.get("/instances/nope").status_code == 404
    assert rest.put("/instances").status_code == 405
    assert rest.get("/elsewhere").status_code == 404


def test_a_malformed_body_names_its_field_and_what_the_body_is(rest: httpx2.Client) -> None:
    """Bodies are decoded into Structs: a refusal names the field and the body's shape."""
    for body, words in (({"world": "lars@7", "agent": 5}, ("agent must be a string",)),
                        ({"world": "lars@7", "shell": "yes"}, ("shell must be true or false",)),
                        ({"world": "lars@7", "max_steps": 0}, ("max_steps", ">= 1")),
                        ({"world": "lars@7", "colour": "red"}, ("unknown field", "colour")),
                        ([1], ("the body must be an object",))):
        refused = rest.post("/instances", json=body)
        assert_refused(refused, 400)
        message = refused.json()["error"]
        assert '"max_steps": int' in message and "\n" not in message, message
        for word in words:
            assert word in message, (body, message)
    made = create(rest)
    missing = rest.post(f"/instances/{made['id']}/shell", json={})
    assert_refused(missing, 400)
    assert "missing field 'command'" in missing.json()["error"]
    # Methods a route does not take: 405 naming them in order, HEAD included (not implied).
    for method, path, allowed in (("HEAD", "/healthz", "GET"), ("PUT", "/instances", "GET, POST"),
                                  ("GET", f"/instances/{made['id']}/reset", "POST")):
        response = rest.request(method, path)
        assert response.status_code == 405 and response.headers["allow"] == allowed, method
    assert rest.delete(f"/instances/{made['id']}").status_code == 200


def test_slashes_around_a_path_name_the_same_endpoint(rest: httpx2.Client) -> None:
    """Answered, not redirected; an instance's page keeps its slash (its ``/``)."""
    made = create(rest)
    assert rest.get("/healthz/").json()["ok"]
    listed = rest.get("/instances/")
    assert listed.status_code == 200 and made["id"] in listed.text
    assert rest.get(f"/instances/{made['id']}/hash/").json()["changed"] is False
    page = rest.get(f"/instances/{made['id']}/gui/")  # a page, of an instance without GUI
    assert page.status_code == 409 and "without the GUI" in page.json()["error"]
    assert rest.delete(f"/instances/{made['id']}/").status_code == 200


def test_the_http_reference_shows_every_route_and_body_field() -> None:
    from starlette.routing import Route, WebSocketRoute

    from worldenv.serving.gateway import ROUTES
    from worldenv.serving.http import fields_of, methods_of
    from worldenv.serving.reference import http_reference_markdown

    text = http_reference_markdown()
    routes = [r for r in ROUTES if isinstance(r, Route | WebSocketRoute)]
    assert len(routes) == len(ROUTES) >= 20
    for route in routes:
        methods = methods_of(route) if isinstance(route, Route) else ("WEBSOCKET",)
        title = ", ".join(methods) if methods != ("*",) else "any method"
        assert f"### `{title} {route.path_format}`" in text, route.path
        for body in getattr(route, "bodies", ()):
            assert f"`{body.__name__}`" in text
            for field in fields_of(body):
                assert f"| `{field.encode_name}` |" in text, (body, field.name)
    for path in ("/instances", "/instances/{iid}/openenv/step", "/instances/{iid}/gui/{target}",
                 "/instances/{iid}/mcp", "/ws", "/reset"):
        assert f" {path}`" in text
    # Rendered from the routes it is given, not from a text kept beside them.
    assert "/healthz" in http_reference_markdown(routes[:1])
    assert "/tasks" not in http_reference_markdown(routes[:1])


def test_open_binds_need_a_token(env: Environment) -> None:
    with pytest.raises(GatewayError, match="without a bearer token"):
        serve(env, host="0.0.0.0")
    with pytest.raises(GatewayError):
        check_bind("192.168.1.5", "  ")
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        check_bind(host, None)
    check_bind("0.0.0.0", "tok")
    result = CliRunner().invoke(cli, ["--store", "/nonexistent", "serve", "--host", "0.0.0.0"],
                                env={"WORLDCTL_TOKEN": ""})
    assert result.exit_code == 2 and "without a bearer token" in result.output


def test_serve_help_lists_the_options() -> None:
    result = CliRunner().invoke(cli, ["serve", "--help"])
    assert result.exit_code == 0
    for option in ("--host", "--port", "--token", "WORLDCTL_TOKEN", "--max-instances",
                   "--idle-timeout", "--call-timeout", "--mode", "--tasks", "--max-steps"):
        assert option in result.output


def test_limits_and_idle_reaping(env: Environment) -> None:
    gateway = Gateway(env, max_instances=2, idle_timeout=1.0, reap_interval=0.1)
    with served(gateway) as base, httpx2.Client(base_url=base, timeout=30) as rest:
        for headers in ({"Host": "evil.example"}, {"Origin": "http://evil.example"}):
            assert rest.get("/healthz", headers=headers).status_code == 403  # no token
        assert rest.get("/healthz", headers={"Origin": "http://localhost:3000"}).is_success
        kept, dropped = create(rest)["id"], create(rest)["id"]
        full = rest.post("/instances", json={"world": "lars@7"})
        assert full.status_code == 429 and "maximum of 2" in full.json()["error"]
        paths = {i: h.instance.mount.path for i, h in gateway.instances.items()}
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:  # REST calls on `kept` keep it alive
            assert rest.get(f"/instances/{kept}").status_code == 200
            time.sleep(0.2)
        assert rest.get(f"/instances/{dropped}").status_code == 404
        assert not paths[dropped].exists() and paths[kept].exists()
        deadline = time.monotonic() + 5
        while kept in gateway.instances and time.monotonic() < deadline:
            time.sleep(0.1)
        assert rest.get("/instances").json()["instances"] == []
        time.sleep(0.2)
        assert not paths[kept].exists()
        create(rest)


def test_a_slow_tool_times_out_without_stalling_others(env: Environment) -> None:
    gateway = Gateway(env, call_timeout=0.5)
    with served(gateway) as base, httpx2.Client(base_url=base, timeout=30) as rest:
        slow_one, other = create(rest), create(rest)

        async def race() -> tuple[Any, float, float, Any]:
            start = time.monotonic()
            slow_call = asyncio.create_task(with_fastmcp(
                base + slow_one["mcp_url"], [("notes_slow", {"seconds": 2.0})]))
            _, (fast,) = await with_sdk(base + other["mcp_url"], [get(4)])
            fast_s = time.monotonic() - start
            _, (timed_out,) = await slow_call
            return timed_out, time.monotonic() - start, fast_s, fast

        timed_out, slow_s, fast_s, fast = asyncio.run(race())
        assert timed_out.is_error
        assert timed_out.content[0].text == "tool call timed out after 0.5 s"
        assert slow_s < 1.9 and fast_s < 1.5 and not fast.is_error
        # The call runs on: a call made meanwhile waits for it, times out and never runs.
        _, (busy,) = asyncio.run(with_fastmcp(base + slow_one["mcp_url"], [get(4)]))
        assert busy.is_error and "not run: the instance was still busy" in busy.content[0].text
        deadline = time.monotonic() + 5
        while rest.get(f"/instances/{slow_one['id']}").json()["busy"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        _, (after,) = asyncio.run(with_fastmcp(base + slow_one["mcp_url"], [get(4)]))
        assert not after.is_error
        episode = Episode.from_json(rest.get(f"/instances/{slow_one['id']}/episode").content)
        calls = [(e.tool, e.is_error) for e in episode.events if isinstance(e, ToolCall)]
        assert calls == [("notes_slow", False), ("notes_get_note", False)]
        assert rest.get(f"/instances/{slow_one['id']}").json()["timeouts"] == 2


# --- malformed requests: every one a 4xx that says what was wrong -------------------------


def assert_refused(response: httpx2.Response, *statuses: int) -> None:
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    assert not statuses or response.status_code in statuses, response.text
    assert "Traceback" not in response.text
    assert response.json()["error"]


def test_a_day_beyond_64_bits_and_deep_json_are_4xx(rest: httpx2.Client) -> None:
    for world in ("lars@100000000000000000000000", "lars@-100000000000000000000000",
                  "lars@" + "\u0663" * 30, "lars@9223372036854775808"):
        response = rest.post("/instances", json={"world": world})
        assert_refused(response, 422)
        assert "64 bits" in response.json()["error"]
    assert_refused(rest.post("/instances", json={"world": "lars@9223372036854775807"}), 404)
    made = create(rest)
    for body in (b"[" * 30_000 + b"]" * 30_000, b'{"world": ' + b"[" * 30_000,
                 b'{"a":' * 30_000 + b"1" + b"}" * 30_000):
        deep = rest.post("/instances", content=body)
        assert_refused(deep, 400, 413)
        mcp = rest.post(made["mcp_url"], content=body[:60_000],
                        headers={"content-type": "application/json",
                                 "accept": "application/json, text/event-stream"})
        assert_refused(mcp, 400)
        assert "deeper than" in mcp.json()["error"]
    # Finding the strings is linear: an unterminated string of escaped quotes is no work.
    started = time.monotonic()
    assert_refused(rest.post("/instances", content=b'"' + b'\\"' * 30_000), 400)
    assert time.monotonic() - started < 2
    # Brackets inside strings are data, not nesting.
    assert_refused(rest.post("/instances", json={"world": "[" * 5_000}), 400)
    assert_refused(rest.post("/instances", content=b"x" * 70_000), 413)


def test_fuzzed_rest_requests_never_get_a_5xx(rest: httpx2.Client) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    made = create(rest)
    json_values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5),
                                                                    inner, max_size=3),
        max_leaves=10)
    refs = st.one_of(st.text(max_size=40), st.from_regex(r"[a-z]{1,6}@-?[0-9]{1,40}"),
                     st.from_regex(r"[0-9a-f]{30,34}"), st.just("lars@7"))
    bodies = st.one_of(
        st.binary(max_size=200),
        st.builds(lambda w, m: {"world": w, "mode": m}, refs | json_values,
                  st.sampled_from(["tools", "meta"]) | json_values).map(
            lambda d: json.dumps(d).encode()),
        json_values.map(lambda v: json.dumps(v).encode()),
        st.integers(1, 200).map(lambda n: b'{"world": ' + b"[" * n + b"]" * n + b"}"))
    ids = st.one_of(st.just(made["id"]), st.text(min_size=1, max_size=30).filter(
        lambda s: s not in (".", "..")).map(lambda s: quote(s, safe="")))
    actions = st.sampled_from(["", "/reset", "/hash", "/diff", "/episode", "/nope",
                               "/mcp/x", "/hash/x", "/shell", "/answer", "/grade",
                               "/openenv/reset", "/openenv/step", "/openenv/state",
                               "/openenv/nope"])
    methods = st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE"])

    @settings(max_examples=150, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(method=methods, iid=ids, action=actions, body=bodies, create_one=st.booleans())
    def probe(method: str, iid: str, action: str, body: bytes, create_one: bool) -> None:
        if create_one:
            response = rest.post("/instances", content=body)
        else:
            if method == "DELETE" and iid == made["id"]:
                method = "GET"  # keep the instance for the other examples
            response = rest.request(method, f"/instances/{iid}{action}", content=body)
        assert response.status_code < 500, (response.status_code, response.text)
        assert "Traceback" not in response.text
        if response.status_code >= 400 and response.headers.get(
                "content-type", "").startswith("application/json"):
            assert response.json().get("error") or response.json().get("jsonrpc")
        if response.status_code == 201:
            assert rest.delete(f"/instances/{response.json()['id']}").status_code == 200

    probe()


def test_a_runaway_carried_call_costs_only_its_own_instance(tmp_path: Path) -> None:
    """Two instances of worlds carrying the same app code: while one's call loops forever
    in its worker, the other's calls answer in normal time (they run in another worker)."""
    from tests.worldenv.test_worker_isolation import RUNAWAY_TIMEOUT, carried_world
    from worldenv.sandbox.workers import WorkerLimits, WorkerPool

    with carried_world(tmp_path / "store") as carried, \
            Environment(carried, apps={}) as environment:
        environment._pool = WorkerPool(WorkerLimits(timeout_s=RUNAWAY_TIMEOUT))
        gateway = Gateway(environment, call_timeout=30)
        with served(gateway) as base, httpx2.Client(base_url=base, timeout=30) as rest:
            runaway, other = create(rest, world="p@0"), create(rest, world="q@0")
            title = ("notes_title", {"note_id": 1})

            async def race() -> tuple[Any, float, list[float], list[Any]]:
                start = time.monotonic()
                spinning = asyncio.create_task(with_fastmcp(
                    base + runaway["mcp_url"], [title, ("notes_spin", {})]))
                await asyncio.sleep(1.0)
                latencies, results = [], []
                async with Client(base + other["mcp_url"], timeout=30) as client:
                    for _ in range(4):
                        began = time.monotonic()
                        results.append(await client.call_tool(*title, raise_on_error=False))
                        latencies.append(time.monotonic() - began)
                _, (_, spun) = await spinning
                return spun, time.monotonic() - start, latencies, results

            spun, spin_s, latencies, results = asyncio.run(race())
            assert spun.is_error and f"longer than {RUNAWAY_TIMEOUT:g} s" in spun.content[0].text
            assert spin_s >= RUNAWAY_TIMEOUT and 1.0 + sum(latencies) < spin_s  # meanwhile
            assert [r.structured_content for r in results] == [{"result": "note of q"}] * 4
            # The first call started a second worker; the others answered at once.
            assert latencies[0] < RUNAWAY_TIMEOUT - 2 and max(latencies[1:]) < 1, latencies
