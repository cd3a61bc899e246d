"""GUI actions in a real headless Chromium (Debian's package, in the bubblewrap sandbox):
the instance's pages, recorded GUI calls, forms captured like tool calls, isolation,
determinism, recovery. The pages themselves are tested in test_site.py."""

from __future__ import annotations

import http.server
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from replay.engine import Worlds
from worldenv.core.episode import DbChange, GuiCall
from worldenv.gui.browser import Browser
from worldenv.gui.site import Page, PageContext, Site
from worldenv.instances.episodes import load_episode, save_episode, verify_episode
from worldenv.instances.instance import Environment, Instance
from worldenv.sites import SHIPPED_SITES

DEMO = Path(__file__).resolve().parents[2] / "packs" / "demo" / "world" / "lars.jsonl"
pytestmark = pytest.mark.skipif(
    not Path("/usr/bin/chromium").exists() and os.environ.get("CI") != "true",
    reason="Debian's chromium is not installed (apt-get install chromium)")


@pytest.fixture(scope="module")
def worlds(demo_worlds: Worlds) -> Worlds:
    return demo_worlds


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    b = Browser(idle_s=0)
    b.start()
    yield b
    b.close()


@pytest.fixture
def env(worlds: Worlds, browser: Browser) -> Environment:
    return Environment(worlds, browser=lambda: browser)


@pytest.fixture
def inst(env: Environment) -> Iterator[Instance]:
    with env.open("lars@7") as instance:
        yield instance


def _product_id(inst: Instance, sku: str) -> int:
    found = inst.call_tool("shop_search_products", {"query": sku})
    assert not found.is_error, found.text
    return int(found.structured["items"][0]["id"])


def test_open_read_click_by_name_and_element(inst: Instance) -> None:
    opened = inst.gui("open", {"url": "/shop/products"})
    assert not opened.is_error, opened.text
    assert opened.url == "/shop/products" and "Products" in opened.text
    assert opened.image is not None and opened.image.startswith(b"\x89PNG")
    read = inst.gui("read")
    assert '[3] link "Products"' in read.text and "74 products" in read.text
    number = next(line.split("]")[0][1:] for line in read.text.splitlines()
                  if line.endswith('link "1U blank panel"'))
    clicked = inst.gui("click", {"element": int(number)})
    assert not clicked.is_error, clicked.text
    assert clicked.url is not None and clicked.url.startswith("/shop/products/")
    assert "1U blank panel" in clicked.text
    back = inst.gui("click", {"name": "cart", "role": "link"})
    assert back.url == "/shop/cart", back.text
    calls = [e for e in inst.episode.events if isinstance(e, GuiCall)]
    assert [c.action for c in calls] == ["open", "read", "click", "click"]
    assert all(c.screenshot in inst.episode.screenshots for c in calls)
    assert inst.hash() == inst.record.world_hash  # reading and navigating write nothing


def test_type_and_key_submit_the_search_form(inst: Instance) -> None:
    inst.gui("open", {"url": "/shop/products"})
    typed = inst.gui("type", {"name": "Search products", "role": "searchbox",
                                "text": "HDMI"})
    assert not typed.is_error, typed.text
    submitted = inst.gui("key", {"key": "Enter"})
    assert submitted.url is not None and submitted.url.startswith("/shop/products?q=HDMI&"), \
        submitted.text
    assert "HDMI" in inst.gui("read").text


def test_a_form_click_is_the_tool_call_and_replays(inst: Instance, env: Environment,
                                                   worlds: Worlds) -> None:
    product = _product_id(inst, "RCK-BLANK-1U")
    inst.gui("open", {"url": f"/shop/products/{product}"})
    added = inst.gui("click", {"name": "Add to cart", "role": "button"})
    assert not added.is_error and added.url == "/shop/cart", added.text
    click = [e for e in inst.episode.events if isinstance(e, GuiCall)][-1]
    assert [f.tool for f in click.forms] == ["shop_add_to_cart"]
    assert click.forms[0].arguments == {"product_id": product, "quantity": 1}
    changes = [e for e in inst.episode.events if isinstance(e, DbChange)]
    assert [(c.index, c.service) for c in changes] == [(click.index, "shop")]
    with env.open("lars@7") as direct:  # the same write through MCP gives the same world
        for _ in range(click.index - 1):  # the same call index: the same clock
            direct.call_tool("shop_get_cart")
        direct.call_tool("shop_add_to_cart", {"product_id": product, "quantity": 1})
        assert direct.hash() == inst.hash()
    episode_id = save_episode(worlds, inst)
    stored = load_episode(worlds, episode_id)
    assert stored.screenshots and all(d in stored.screenshots for d in (
        e.screenshot for e in stored.events if isinstance(e, GuiCall)))
    ok, message = verify_episode(worlds, episode_id)
    assert ok, message


def test_a_refused_form_changes_nothing(inst: Instance) -> None:
    product = _product_id(inst, "RCK-BLANK-1U")
    stock = inst.call_tool("shop_get_product", {"product_id": product}).structured["stock"]
    inst.gui("open", {"url": f"/shop/products/{product}"})
    typed = inst.gui("type", {"name": "Quantity", "text": str(stock + 1), "clear": True})
    assert not typed.is_error, typed.text
    refused = inst.gui("click", {"name": "Add to cart", "role": "button"})
    assert "the form was refused" in refused.text and str(stock) in refused.text, refused.text
    click = [e for e in inst.episode.events if isinstance(e, GuiCall)][-1]
    assert click.forms and click.forms[0].is_error
    assert not any(isinstance(e, DbChange) for e in inst.episode.events)
    assert inst.hash() == inst.record.world_hash


def test_bad_actions_are_error_results(inst: Instance) -> None:
    cases = [("fly", {}, "unknown GUI action"),
             ("open", {"url": "https://example.com/"}, "only this computer's web apps"),
             ("open", {"url": "file:///etc/passwd"}, "only this computer's web apps"),
             ("open", {}, "needs the argument 'url'"),
             ("click", {"element": 99}, "gui_read"),
             ("click", {"name": "No such button"}, "no element named"),
             ("click", {"x": 5}, "both x and y"),
             ("key", {"key": "F13"}, "must be one of"),
             ("scroll", {"dy": "down"}, "must be an integer"),
             ("scroll", {"dy": 99999}, "from -10000 to 10000"),
             ("type", {"text": "x", "clear": "yes"}, "true or false"),
             ("type", {"text": "x", "colour": "red"}, "no argument 'colour'")]
    for action, arguments, expected in cases:
        result = inst.gui(action, arguments)
        assert result.is_error and expected in result.text, (action, result.text)
    assert all(isinstance(e, GuiCall) and e.is_error for e in inst.episode.events)


def test_elements_are_read_again_after_the_page_changes(inst: Instance) -> None:
    inst.gui("open", {"url": "/shop/products"})
    inst.gui("read")
    inst.gui("click", {"name": "Orders", "role": "link"})
    stale = inst.gui("click", {"element": 1})
    assert stale.is_error and "read it again" in stale.text


def test_the_same_actions_give_the_same_screenshots(env: Environment) -> None:
    def run() -> list[str | None]:
        with env.open("lars@7") as instance:
            for action, arguments in [("open", {"url": "/shop/products?q=cable"}),
                                      ("scroll", {"dy": 300}),
                                      ("click", {"name": "Cart", "role": "link"}),
                                      ("open", {"url": "/chat/"})]:
                result = instance.gui(action, arguments)
                assert not result.is_error, result.text
            return [e.screenshot for e in instance.episode.events if isinstance(e, GuiCall)]

    first, second = run(), run()
    assert first == second and len(set(first)) == 4


def test_pages_reach_only_their_instance(worlds: Worlds, browser: Browser) -> None:
    hits: list[str] = []

    class Counter(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Counter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    probe = Site(service="notes", title="Probe")

    @probe.page("/")
    def leaky(ctx: PageContext) -> Page:
        outside = f"http://127.0.0.1:{port}"
        return Page("Probe", f'<img src="{outside}/img" alt="x">'
                             f'<link rel="stylesheet" href="{outside}/css">'
                             f'<a href="{outside}/page">loopback</a> '
                             f'<a href="file:///etc/passwd">passwd</a>')

    env = Environment(worlds, sites={**SHIPPED_SITES, "notes": probe},
                      browser=lambda: browser)
    try:
        with env.open("lars@7") as instance:
            assert not instance.gui("open", {"url": "/notes/"}).is_error
            clicked = instance.gui("click", {"name": "loopback"})
            assert clicked.is_error and "blocked" in clicked.text, clicked.text
            assert clicked.url == "/notes/"
            clicked = instance.gui("click", {"name": "passwd"})  # the browser refuses it
            assert clicked.url == "/notes/", clicked.text
    finally:
        server.shutdown()
    assert hits == []


def test_one_browser_serves_the_pages_of_many_instances(env: Environment) -> None:
    """Each open page costs Chromium a renderer of ~27 threads, all counted against the
    browser sandbox's process limit: under a limit of 512 the 16th instance's page never
    answered. Twenty instances, each with its own page open at once, all work."""
    instances = [env.open("lars@7") for _ in range(20)]
    try:
        for n, inst in enumerate(instances):
            opened = inst.gui("open", {"url": "/shop/"})
            assert not opened.is_error, (n, opened.text)
        last = instances[-1].gui("read")
        assert not last.is_error and "/shop/" in last.text
    finally:
        for inst in instances:
            inst.close()


def test_instances_do_not_share_pages_or_state(env: Environment) -> None:
    with env.open("lars@7") as a, env.open("lars@7") as b:
        product = _product_id(a, "RCK-BLANK-1U")
        a.gui("open", {"url": f"/shop/products/{product}"})
        a.gui("click", {"name": "Add to cart", "role": "button"})
        b.gui("open", {"url": "/shop/cart"})
        assert "1U blank panel" not in b.gui("read").text
        assert "1U blank panel" in a.gui("read").text


def test_reset_gives_a_fresh_page(inst: Instance) -> None:
    product = _product_id(inst, "RCK-BLANK-1U")
    inst.gui("open", {"url": f"/shop/products/{product}"})
    inst.gui("click", {"name": "Add to cart", "role": "button"})
    inst.reset()
    again = inst.gui("read")  # a fresh page starts at the app list
    assert again.url == "/" and not again.is_error
    inst.gui("open", {"url": "/shop/cart"})
    assert "1U blank panel" not in inst.gui("read").text
    assert inst.hash() == inst.record.world_hash


def test_a_browser_that_dies_is_replaced(worlds: Worlds) -> None:
    browsers: list[Browser] = []

    def current() -> Browser:
        if not browsers or not browsers[-1].alive:
            fresh = Browser(idle_s=0)
            fresh.start()
            browsers.append(fresh)
        return browsers[-1]

    env = Environment(worlds, browser=current)
    try:
        with env.open("lars@7") as instance:
            assert not instance.gui("open", {"url": "/chat/"}).is_error
            pid = browsers[0].pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while browsers[0].alive and time.monotonic() < deadline:
                time.sleep(0.05)
            failed = instance.gui("read")
            assert failed.is_error and "browser" in failed.text
            recovered = instance.gui("open", {"url": "/chat/"})
            assert not recovered.is_error, recovered.text
            assert len(browsers) == 2
    finally:
        for b in browsers:
            b.close()


def test_an_idle_browser_stops(worlds: Worlds) -> None:
    browser = Browser(idle_s=0.2)
    browser.start()
    env = Environment(worlds, browser=lambda: browser)
    with env.open("lars@7") as instance:
        assert not instance.gui("open", {"url": "/"}).is_error
        assert browser.pages == 1
    deadline = time.monotonic() + 10
    while browser.alive and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not browser.alive


def test_screenshots_can_be_left_out_of_episodes(worlds: Worlds, browser: Browser) -> None:
    env = Environment(worlds, browser=lambda: browser, keep_screenshots=False)
    with env.open("lars@7") as instance:
        shot = instance.gui("open", {"url": "/"})
        assert shot.image is not None and shot.screenshot is not None
        assert instance.episode.screenshots == {}
        assert [e.screenshot for e in instance.episode.events
                if isinstance(e, GuiCall)] == [shot.screenshot]


def test_the_gym_wrapper_takes_gui_actions(env: Environment) -> None:
    from worldenv.serving.gym import WorldEnv

    world = WorldEnv(env, "lars@7")
    try:
        world.reset()
        observation, reward, done, truncated, _info = world.step(
            {"gui": {"action": "open", "arguments": {"url": "/chat/"}}})
        assert not observation["is_error"] and observation["url"] == "/chat/"
        assert observation["screenshot"].startswith(b"\x89PNG")
        assert (reward, done, truncated) == (0.0, False, False)
        with pytest.raises(ValueError, match="gui action"):
            world.step({"gui": "click"})
    finally:
        world.close()
