"""The gateway's GUI surface: an instance's web pages served per instance over HTTP, and
the GUI tools (a shared sandboxed Chromium) over MCP, REST and OpenEnv. A real uvicorn
server on a loopback port, the demo world with the shipped apps and sites, the real
fastmcp client over streamable HTTP, plain httpx2 for REST and pages, and a person's
browser (headless Chromium over the DevTools pipe, tests/support/cdp.py) following the pages'
own links and forms through the gateway; no mocks.
"""

from __future__ import annotations

import asyncio
import base64
import re
import shutil
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from fastmcp import Client
from mcp.types import ImageContent, TextContent

from replay import Worlds
from tests.support.asgi_server import served
from tests.support.cdp import Browser
from worldenv.core.episode import DbChange, GuiCall
from worldenv.gui.tools import GUI_TOOLS
from worldenv.instances.episodes import load_episode
from worldenv.instances.instance import Environment, Instance
from worldenv.serving.gateway import Gateway, ServedTask
from worldenv.serving.mcp import gui_caller, instance_server
from worldstore.canonical import digest

WORLD = "lars@7"
GUI_NAMES = sorted(t.name for t in GUI_TOOLS)
PNG = b"\x89PNG\r\n\x1a\n"
PRODUCT = "HDMI 2.1 cable 2 m"  # product 1 of the demo shop
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None,
                                    reason="no Chromium (apt-get install chromium)")
pytestmark = needs_chromium  # the GUI actions run in the shared sandboxed browser too


def _graded(instance: Instance, answer: str | None) -> dict[str, Any]:
    return {"V": 1, "checks": [], "reward": 1.0, "errors": []}


@pytest.fixture(scope="module")
def worlds(demo_worlds: Worlds) -> Worlds:
    return demo_worlds  # the shared demo store (tests/conftest.py), this module's copy


@pytest.fixture(scope="module")
def env(worlds: Worlds) -> Iterator[Environment]:
    with Environment(worlds) as environment:
        yield environment


@pytest.fixture(scope="module")
def tasks(worlds: Worlds) -> dict[str, ServedTask]:
    world_hash = worlds.resolve(WORLD).world_hash
    return {name: ServedTask(task_id=name, instruction="Put a cable in the cart.",
                             world=WORLD, world_hash=world_hash, interfaces=interfaces,
                             grade=_graded)
            for name, interfaces in (("cart-by-gui", ("mcp", "gui")),
                                     ("cart-by-tools", ("mcp",)))}


@pytest.fixture(scope="module")
def gateway(env: Environment, tasks: dict[str, ServedTask]) -> Gateway:
    return Gateway(env, tasks=tasks, max_instances=16, call_timeout=60)


@pytest.fixture(scope="module")
def base(gateway: Gateway) -> Iterator[str]:
    with served(gateway) as url:
        yield url


@pytest.fixture(scope="module")
def rest(base: str) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=base, timeout=60) as client:
        yield client


def create(rest: httpx2.Client, **body: Any) -> dict[str, Any]:
    if "task" not in body:
        body.setdefault("world", WORLD)
    response = rest.post("/instances", json=body)
    assert response.status_code == 201, response.text
    made: dict[str, Any] = response.json()
    return made


def refused(response: httpx2.Response, status: int, *words: str) -> str:
    """A 4xx/5xx with one line of JSON naming what was wrong."""
    assert response.status_code == status, (response.status_code, response.text)
    message = response.json()["error"]
    assert isinstance(message, str) and "\n" not in message and "Traceback" not in message
    for word in words:
        assert word in message, message
    return message


def post_form(rest: httpx2.Client, url: str, fields: str, **headers: str) -> httpx2.Response:
    return rest.post(url, content=fields.encode(), headers={
        "content-type": "application/x-www-form-urlencoded", **headers})


def close(rest: httpx2.Client, iid: str) -> dict[str, Any]:
    response = rest.delete(f"/instances/{iid}")
    assert response.status_code == 200, response.text
    closing: dict[str, Any] = response.json()
    return closing


# --- pages over HTTP -------------------------------------------------------------------------


def test_pages_are_served_per_instance_and_a_form_changes_only_its_own(
        rest: httpx2.Client, worlds: Worlds) -> None:
    a, b = create(rest, gui=True), create(rest, gui=True)
    assert a["gui"] and a["gui_url"] == f"/instances/{a['id']}/gui/"
    page = rest.get(f"{a['gui_url']}shop/products/1")
    assert page.status_code == 200, page.text
    assert page.headers["content-type"].startswith("text/html")
    assert PRODUCT in page.text and 'action="/shop/cart/add"' in page.text  # not rewritten
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert page.headers["referrer-policy"] == "same-origin"
    # The same world's page is the same bytes in every instance: nothing is rewritten.
    assert rest.get(f"{b['gui_url']}shop/products/1").content == page.content
    index = rest.get(a["gui_url"])
    assert index.status_code == 200 and 'href="/shop/"' in index.text
    assert rest.get(f"{a['gui_url']}_static/DejaVuSans.ttf").headers["content-type"] == \
        "font/ttf"
    b_cart = rest.get(f"{b['gui_url']}shop/cart").content
    assert PRODUCT not in rest.get(f"{a['gui_url']}shop/cart").text

    added = post_form(rest, f"{a['gui_url']}shop/cart/add", "product_id=1&quantity=2")
    assert added.status_code == 303, added.text
    assert added.headers["location"] == f"/instances/{a['id']}/gui/shop/cart"
    cart = rest.get(added.headers["location"])
    assert cart.status_code == 200 and PRODUCT in cart.text
    assert rest.get(f"{b['gui_url']}shop/cart").content == b_cart  # b is untouched
    world = worlds.resolve(WORLD).world_hash
    assert rest.get(f"/instances/{a['id']}/hash").json()["hash"] != world
    assert rest.get(f"/instances/{b['id']}/hash").json()["hash"] == world

    # A form the tool refuses is the site's page saying why (422), and writes nothing.
    bad = post_form(rest, f"{a['gui_url']}shop/cart/add", "product_id=99999")
    assert bad.status_code == 422 and 'role="alert"' in bad.text
    # A page the site does not have is the site's own 404 page.
    missing = rest.get(f"{a['gui_url']}shop/no-such-page")
    assert missing.status_code == 404 and "No page /shop/no-such-page" in missing.text

    events = rest.get(f"/instances/{a['id']}/episode").json()["events"]
    requests = [e for e in events if e["type"] == "gui_call"]
    assert all(e["action"] == "request" for e in requests)
    form = next(e for e in requests if e["arguments"]["method"] == "POST")
    assert form["arguments"]["target"] == "/shop/cart/add"
    assert form["forms"][0]["tool"] == "shop_add_to_cart" and not form["forms"][0].get(
        "is_error")
    assert any(e["type"] == "db_change" and e["index"] == form["index"] for e in events)
    stored = close(rest, a["id"])
    assert stored["stored"]
    episode = load_episode(worlds, stored["episode_id"])
    assert [c.action for c in episode.calls if isinstance(c, GuiCall)].count("request") == \
        len(requests)
    close(rest, b["id"])


def test_a_pages_own_links_lead_back_into_its_instance(rest: httpx2.Client, base: str
                                                       ) -> None:
    made = create(rest, gui=True)
    iid, prefix = made["id"], made["gui_url"]
    page = f"{base}{prefix}shop/products/1"
    for method, path, query in (("GET", "/shop/cart", ""), ("GET", "/", ""),
                                ("GET", "/_static/DejaVuSans.ttf", ""),
                                ("GET", "/shop/products", "q=hdmi&page=1"),
                                ("POST", "/shop/cart/add", "")):
        url = path + (f"?{query}" if query else "")
        moved = rest.request(method, url, headers={"referer": page})
        assert moved.status_code == 307, (url, moved.text)
        assert moved.headers["location"] == f"/instances/{iid}/gui{url}"
    # Without a Referer, or with one from elsewhere, the path is the gateway's own.
    refused(rest.get("/shop/cart"), 404, "no such endpoint")
    refused(rest.get("/shop/cart", headers={"referer": f"http://example.com{prefix}x"}),
            404, "no such endpoint")
    refused(rest.get("/shop/cart", headers={"referer": f"{base}/instances/{iid}/mcp"}),
            404, "no such endpoint")
    close(rest, iid)


def test_a_persons_browser_follows_links_and_posts_forms_through_the_gateway(
        rest: httpx2.Client, base: str, worlds: Worlds,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    made = create(rest, gui=True)
    prefix = made["gui_url"]
    assert CHROMIUM is not None
    with Browser(CHROMIUM, tmp_path_factory.mktemp("person")) as browser:
        loaded = browser.load(f"{base}{prefix}shop/products/1")
        # The bundled fonts load through the redirect: nothing failed to load.
        assert loaded.problems == [], loaded.problems
        assert PRODUCT in loaded.dom and loaded.screenshot.startswith(PNG)
        dom = _submit_first_form(browser, f"{base}{prefix}shop/products/1")
    assert "<h1>Cart</h1>" in dom and PRODUCT in dom
    assert rest.get(f"/instances/{made['id']}/hash").json()["hash"] != \
        worlds.resolve(WORLD).world_hash
    episode = rest.get(f"/instances/{made['id']}/episode").json()
    posted = [e for e in episode["events"] if e["type"] == "gui_call"
              and e["arguments"]["method"] == "POST"]
    assert [p["arguments"]["target"] for p in posted] == ["/shop/cart/add"]
    assert posted[0]["arguments"]["form"] == {"product_id": "1", "quantity": "1"}
    targets = {e["arguments"]["target"] for e in episode["events"] if e["type"] == "gui_call"}
    assert "/_static/DejaVuSans.ttf" in targets and "/shop/cart" in targets
    assert not any("favicon" in t for t in targets)  # the gateway answers that one itself
    close(rest, made["id"])


def _submit_first_form(browser: Browser, url: str) -> str:
    """Open `url`, press the first form's button as a person would, and return the DOM of
    the page the browser ends on."""
    target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = browser.call("Target.attachToTarget", {"targetId": target,
                                                     "flatten": True})["sessionId"]
    try:
        browser.call("Page.enable", session=session)
        browser.call("Page.navigate", {"url": url}, session=session)
        _wait_for_url(browser, session, url)
        browser.call("Runtime.evaluate", {"expression":
                                          "document.querySelector('form button').click()"},
                     session=session)
        _wait_for_url(browser, session, url.rsplit("/products/", 1)[0] + "/cart")
        root = browser.call("DOM.getDocument", {"depth": 0}, session=session)["root"]
        html: str = browser.call("DOM.getOuterHTML", {"nodeId": root["nodeId"]},
                                 session=session)["outerHTML"]
        return html
    finally:
        browser.call("Target.closeTarget", {"targetId": target})


def _wait_for_url(browser: Browser, session: str, url: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = browser.call("Runtime.evaluate", {
            "expression": "[document.readyState, location.href]", "returnByValue": True},
            session=session)["result"]["value"]
        if found == ["complete", url]:
            return
        time.sleep(0.05)
    raise AssertionError(f"the browser never finished loading {url}")


def test_malformed_page_requests_are_4xx_with_one_line(rest: httpx2.Client) -> None:
    made, plain = create(rest, gui=True), create(rest)
    page = f"{made['gui_url']}shop/cart/add"
    refused(rest.put(page, content=b"x"), 405, "PUT", "GET, POST")
    refused(rest.post(page, json={"product_id": 1}), 415, "x-www-form-urlencoded", "/gui")
    refused(rest.post(page, content=b"product_id=1"), 415, "no content type")
    refused(post_form(rest, page, "product_id=%FF"), 400, "not UTF-8")
    refused(rest.post(page, content=b"product_id=\xff", headers={
        "content-type": "application/x-www-form-urlencoded"}), 400, "not UTF-8")
    refused(post_form(rest, page, "x=" + "a" * 70_000), 413, "over")
    refused(rest.request("GET", f"{made['gui_url']}shop/cart", content=b"q=1"), 400,
            "no body")
    refused(rest.get(f"{made['gui_url']}shop/products?q=" + "a" * 9000), 414, "over")
    refused(rest.get(f"{made['gui_url']}shop/products?q=%C3"), 400, "the query")
    refused(rest.get(f"{made['gui_url']}shop/cart", headers={"sec-fetch-site": "cross-site"}),
            403, "another site")
    assert plain["gui_url"] is None
    refused(rest.get(f"/instances/{plain['id']}/gui/shop/"), 409, "without the GUI",
            '"gui": true')
    refused(rest.get("/instances/nope/gui/shop/"), 404, "no instance")
    close(rest, made["id"])
    refused(rest.get(f"{made['gui_url']}shop/"), 404, "was closed")
    # Nothing malformed reached the instance: the episode holds no request.
    close(rest, plain["id"])


def test_a_token_guards_the_pages_too(env: Environment) -> None:
    with served(Gateway(env, token="t0ken")) as url, httpx2.Client(base_url=url,
                                                                   timeout=60) as client:
        made = client.post("/instances", json={"world": WORLD, "gui": True},
                           headers={"authorization": "Bearer t0ken"}).json()
        refused(client.get(f"{made['gui_url']}shop/"), 401, "bearer token")
        ok = client.get(f"{made['gui_url']}shop/", headers={"authorization": "Bearer t0ken"})
        assert ok.status_code == 200 and "AVLager" in ok.text


# --- GUI tools over MCP ---------------------------------------------------------------------


async def over_mcp(url: str, calls: list[tuple[str, dict[str, Any]]]
                   ) -> tuple[list[str], list[Any]]:
    async with Client(url, timeout=60) as client:
        names = sorted(t.name for t in await client.list_tools())
        results = [await client.call_tool(n, a, raise_on_error=False) for n, a in calls]
    return names, results


def test_mcp_lists_the_gui_tools_only_when_enabled_and_answers_with_screenshots(
        rest: httpx2.Client, base: str, worlds: Worlds) -> None:
    plain = create(rest)
    names, _ = asyncio.run(over_mcp(base + plain["mcp_url"], []))
    assert not set(GUI_NAMES) & set(names) and "shop_add_to_cart" in names
    close(rest, plain["id"])

    made = create(rest, gui=True, agent="gui-test")
    # No action here navigates (a click that submits a form is worldenv.gui.tools's to test): what
    # each answers does not hang on when the browser gets round to a navigation.
    names, results = asyncio.run(over_mcp(base + made["mcp_url"], [
        ("gui_open", {"url": "/shop/products/1"}),
        ("gui_click", {"name": "Quantity", "role": "spinbutton"}),
        ("gui_type", {"text": "4"}),
        ("gui_screenshot", {}),
        ("gui_read", {}),
        ("gui_click", {"name": "No such button"}),
        ("gui_open", {"url": "https://example.com/"}),
    ]))
    assert set(GUI_NAMES) <= set(names) and "shop_add_to_cart" in names
    opened, clicked, typed, shot, read, missing, elsewhere = results
    shots = []
    for result in (opened, clicked, typed, shot, read):
        assert not result.is_error, result.content
        text, image = result.content
        assert isinstance(text, TextContent) and isinstance(image, ImageContent)
        assert image.mime_type == "image/png"
        png = base64.b64decode(image.data)
        assert png.startswith(PNG)
        shots.append(digest(png))
    assert PRODUCT in opened.content[0].text and "/shop/products/1" in opened.content[0].text
    assert 'clicked spinbutton "Quantity"' in clicked.content[0].text
    assert "typed 1 characters" in typed.content[0].text
    assert "/shop/products/1" in shot.content[0].text and shots[3] == shots[2] != shots[0]
    assert re.search(r'\[\d+\] spinbutton "Quantity" value="14"', read.content[0].text)
    assert missing.is_error and "No such button" in missing.content[0].text
    assert elsewhere.is_error and "only this computer's web apps" in elsewhere.content[0].text

    # The service tools stay beside the GUI tools: this call is the one write.
    _, (added,) = asyncio.run(over_mcp(base + made["mcp_url"], [
        ("shop_add_to_cart", {"product_id": 1, "quantity": 2})]))
    assert not added.is_error

    stored = close(rest, made["id"])
    assert stored["stored"] and stored["calls"] == 8
    episode = load_episode(worlds, stored["episode_id"])
    assert episode.agent == "gui-test"
    calls = [c for c in episode.calls if isinstance(c, GuiCall)]
    assert [c.action for c in calls] == ["open", "click", "type", "screenshot", "read",
                                         "click", "open"]
    assert [c.screenshot for c in calls[:5]] == shots
    assert all(c.screenshot for c in calls) and calls[5].is_error and calls[6].is_error
    assert calls[2].arguments == {"text": "4"} and calls[0].url == "/shop/products/1"
    assert not any(c.forms for c in calls)  # nothing was submitted: no write
    assert [e.index for e in episode.events if isinstance(e, DbChange)] == [
        episode.calls[-1].index]


def test_the_python_api_serves_the_gui_tools_of_a_lone_instance(env: Environment) -> None:
    async def run(instance: Instance) -> tuple[list[str], Any, list[str]]:
        async with Client(instance_server(instance, "meta", gui=gui_caller(instance))) as c:
            names = sorted(t.name for t in await c.list_tools())
            result = await c.call_tool("gui_open", {"url": "/shop/"}, raise_on_error=False)
        async with Client(instance_server(instance)) as c:
            plain = sorted(t.name for t in await c.list_tools())
        return names, result, plain

    instance = env.open(WORLD)
    try:
        names, result, plain = asyncio.run(run(instance))
    finally:
        instance.close()
    assert names == sorted([*GUI_NAMES, "call_tool", "list_tools"])
    assert not set(GUI_NAMES) & set(plain)
    assert not result.is_error and "AVLager" in result.content[0].text
    assert base64.b64decode(result.content[1].data).startswith(PNG)
    call = instance.episode.calls[0]
    assert isinstance(call, GuiCall) and call.action == "open" and call.screenshot


def test_a_task_that_declares_gui_gets_the_gui_tools_by_default(rest: httpx2.Client,
                                                                base: str) -> None:
    by_gui, by_tools = create(rest, task="cart-by-gui"), create(rest, task="cart-by-tools")
    off = create(rest, task="cart-by-gui", gui=False)
    assert (by_gui["gui"], by_tools["gui"], off["gui"]) == (True, False, False)
    assert by_tools["gui_url"] is None
    for made, has in ((by_gui, True), (by_tools, False), (off, False)):
        names, _ = asyncio.run(over_mcp(base + made["mcp_url"], []))
        assert (set(GUI_NAMES) <= set(names)) is has and "answer" in names
        close(rest, made["id"])
    refused(rest.post("/instances", json={"world": WORLD, "gui": "yes"}), 400, "gui")


# --- REST and OpenEnv -----------------------------------------------------------------------


def test_rest_gui_actions_and_their_refusals(rest: httpx2.Client) -> None:
    made = create(rest, gui=True)
    url = f"/instances/{made['id']}/gui"
    opened = rest.post(url, json={"action": "open", "arguments": {"url": "/chat/"}})
    assert opened.status_code == 200, opened.text
    body = opened.json()
    assert body["action"] == "open" and not body["is_error"] and body["url"] == "/chat/"
    png = base64.b64decode(body["image"])
    assert png.startswith(PNG) and body["screenshot"] == digest(png)
    assert body["mime_type"] == "image/png" and "/chat/" in body["observation"]
    shot = rest.post(url, json={"action": "screenshot"}).json()
    assert shot["screenshot"] == body["screenshot"] and shot["url"] == "/chat/"
    # An action the page cannot do is an error result, not a refused request.
    missing = rest.post(url, json={"action": "click", "arguments": {"element": 999}})
    assert missing.status_code == 200 and missing.json()["is_error"]
    # A boolean argument is taken as the tool's schema says (type's clear).
    typed = rest.post(url, json={"action": "type", "arguments": {"text": "x", "clear": True}})
    assert typed.status_code == 200, typed.text

    for request, status, words in (
            ({"action": "dance"}, 400, ("unknown GUI action", "click")),
            ({"action": 3}, 400, ("unknown GUI action",)),
            ({}, 400, ("unknown GUI action",)),
            ({"action": "open"}, 400, ("needs the argument 'url'",)),
            ({"action": "open", "arguments": []}, 400, ("must be an object",)),
            ({"action": "open", "arguments": {"url": 7}}, 400, ("url must be a string",)),
            ({"action": "open", "arguments": {"url": "/" * 3000}}, 400, ("at most 2000",)),
            ({"action": "click", "arguments": {"x": True, "y": 2}}, 400, ("an integer",)),
            ({"action": "click", "arguments": {"x": 1, "y": 99999}}, 400, ("0 to 4096",)),
            ({"action": "key", "arguments": {"key": "F13"}}, 400, ("must be one of",)),
            ({"action": "screenshot", "arguments": {"full": True}}, 400, ("no argument",)),
            ({"action": "type", "arguments": {"text": "x", "clear": 1}}, 400,
             ("true or false",)),
            ({"action": "read", "extra": 1}, 400, ("unknown field",))):
        refused(rest.post(url, json=request), status, *words)
    refused(rest.get(url), 405, "POST", made["gui_url"])
    refused(rest.post(url, content=b"{nope"), 400, "not valid JSON")
    plain = create(rest)
    refused(rest.post(f"/instances/{plain['id']}/gui", json={"action": "screenshot"}), 409,
            "without the GUI")
    # The refused requests did not reach the instance: four actions were recorded.
    assert rest.get(f"/instances/{made['id']}").json()["calls"] == 4

    # A reset closes the instance's page: the next action starts a fresh one at /.
    reset = rest.post(f"/instances/{made['id']}/reset").json()
    assert reset["stored_episode_id"]
    fresh = rest.post(url, json={"action": "screenshot"}).json()
    assert fresh["url"] == "/" and not fresh["is_error"]
    close(rest, made["id"])
    close(rest, plain["id"])


def test_openenv_steps_take_gui_actions(rest: httpx2.Client, worlds: Worlds) -> None:
    made = create(rest, task="cart-by-gui", max_steps=10)
    base = f"/instances/{made['id']}/openenv"
    first = rest.post(f"{base}/reset", json={}).json()
    assert first["observation"]["gui"] is True

    def step(action: dict[str, Any]) -> httpx2.Response:
        return rest.post(f"{base}/step", json={"action": action})

    opened = step({"gui": {"action": "open", "arguments": {"url": "/shop/products/1"}}})
    assert opened.status_code == 200, opened.text
    observation = opened.json()["observation"]
    assert not observation["is_error"] and observation["url"] == "/shop/products/1"
    assert base64.b64decode(observation["image"]).startswith(PNG)
    assert PRODUCT in observation["text"] and opened.json()["reward"] == 0.0
    read = step({"gui": {"action": "read"}}).json()["observation"]
    assert '"Add to cart"' in read["text"] and read["url"] == "/shop/products/1"
    refused(step({"gui": {"action": "fly"}}), 400, "unknown GUI action")
    refused(step({"gui": "open"}), 400, "a gui action is")
    refused(step({"gui": {"action": "open", "url": "/"}}), 400, "unknown field")
    refused(step({"gui": {"action": "read"}, "shell": "ls"}), 400, "exactly one")
    assert rest.get(f"{base}/state").json()["step_count"] == 2
    done = step({"answer": "added"}).json()
    assert done["done"] and done["reward"] == 1.0
    stored = close(rest, made["id"])
    episode = load_episode(worlds, stored["episode_id"])
    assert [c.action for c in episode.calls if isinstance(c, GuiCall)] == ["open", "read"]
    assert episode.answer == "added"

    plain = create(rest, world=WORLD)
    refused(rest.post(f"/instances/{plain['id']}/openenv/step",
                      json={"action": {"gui": {"action": "screenshot"}}}), 409,
            "without the GUI")
    close(rest, plain["id"])
