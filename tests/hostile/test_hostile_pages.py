"""Hostile pages (hardening, class 6): world values never become HTML, screenshots are a
function of the world, a page served for one gateway instance cannot act on another, and
one client cannot fill the host with GUI instances.

Real components only: the demo world in a real store, the shipped sites, the gateway under
uvicorn, the instances' sandboxed Chromium (``worldenv.gui.browser``) and a person's headless
Chromium (tests/support/cdp.py). The corpus:

* escaping: every column of every table of every site's world (text columns at once, each
  numeric column on its own, keys aside) holds markup that closes the contexts a value can
  sit in (title, textarea, attributes) and brings an element with an attribute, a style
  sheet with an animation and a script; the request's own query and path carry it too;
  every page is crawled (every route, every link, every form) and each page that shows a
  value is checked in the parsed HTML and in Chromium's DOM; a photo row cannot serve a
  document; and the site modules build no HTML but through ``markup``;
* still screenshots: pages that animate by keyframes (with ``!important``, on
  ``::before``, inline), by a transition, by an animated GIF, by SVG animation and by
  ``requestAnimationFrame`` give one screenshot digest over three runs taken at different
  moments;
* cross-instance: a hostile page served for instance A, in a person's browser, submits
  forms (page forms, ``text/plain`` JSON, no-referrer), loads images, navigates and
  fetches to instance B's pages and JSON API (and to guessed sequential ids): B's world
  and episode stay as they were;
* caps: GUI instances per client (the peer address) and in all, each a 429 naming its cap.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import re
import shutil
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx2
import pytest

from replay import Worlds
from tests.support.asgi_server import served
from tests.support.cdp import Browser as PersonBrowser
from worldctl.ui import WorldsUI
from worldenv.gui.browser import Browser, Intercepted, Served
from worldenv.gui.site import Page, PageContext, Site, esc
from worldenv.instances.episodes import save_episode
from worldenv.instances.instance import Environment, Instance
from worldenv.serving.gateway import Gateway
from worldenv.sites import SHIPPED_SITES

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "packs" / "demo" / "world" / "lars.jsonl"
WORLD = "lars@7"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install chromium)")

KEYS = re.compile(r"(^id$|_id$|^created_by$)")  # keys: markup there only hides the rows
MAX_PAGES = 400  # pages of one crawl
PER_KIND = 3  # pages of one kind in a crawl (/shop/orders/N: three orders)


# Columns no page shows as text: bookkeeping times and flags, the logged-in user, a photo's
# bytes and type, and sums of money (text there fails the page that formats it: a 500).
NOT_SHOWN = {
    *(f"{s}.{t}.{c}" for s, t in (
        ("chat", "conversations"), ("chat", "messages"), ("chat", "users"),
        ("shop", "addresses"), ("shop", "cart_items"), ("shop", "categories"),
        ("shop", "orders"), ("shop", "products"), ("shop", "users"))
      for c in ("created_at", "updated_at")),
    "chat.conversation_members.joined_at", "shop.cart_items.added_at",
    "shop.addresses.is_default", "shop.products.is_active", "shop.products.currency",
    "shop.products.price_cents", "shop.products.stock", "shop.order_items.unit_price_cents",
    "shop.order_items.line_total_cents", *(f"shop.orders.{c}_cents" for c in (
        "subtotal", "shipping", "vat", "total")),
    *(f"shop.users.{c}" for c in ("name", "email", "phone", "company", "org_number")),
    "shop.product_images.content_type", "shop.product_images.data"}


def payload(marker: str) -> str:
    """Markup for one column: it leaves a title, a textarea and an attribute value, then
    brings an element with attributes, a style sheet with an animation and a script."""
    return (f'<b data-pwn="{marker}" x="1">\'"&</b>"\'></title></textarea>'
            f'<b data-pwn="{marker}"></b><style>@keyframes pwn{{to{{opacity:0}}}}'
            f"*{{animation:pwn 1s infinite!important}}</style><script>window.pwned=1"
            f"</script>")


def shown(marker: str) -> str:
    return f"data-pwn=&#34;{marker}&#34;"


@pytest.fixture(scope="module")
def worlds(demo_worlds: Worlds) -> Worlds:
    return demo_worlds  # the shared demo store (tests/conftest.py), this module's copy


# --- (A) every value from a world is escaped on every page -------------------------------


class _Dom(HTMLParser):
    """What a page's HTML holds that no shipped page writes: an element with a data-pwn
    or x attribute, a script, a second style sheet."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.injected: list[str] = []
        self.styles = 0
        self.links: list[str] = []
        self.forms: list[tuple[str, list[tuple[str, str]]]] = []
        self._form: list[tuple[str, str]] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {k: v or "" for k, v in attrs}
        if "data-pwn" in found or "x" in found or tag == "script":
            self.injected.append(f"<{tag} {found}>")
        self.styles += tag == "style"
        if tag == "a" and "href" in found:
            self.links.append(found["href"])
        elif tag == "img" and "src" in found:
            self.links.append(found["src"])
        elif tag == "form":
            self._form = []
            action = found.get("action", "")
            if found.get("method", "get").lower() == "post":
                self.forms.append((action, self._form))
        elif tag == "input" and self._form is not None and "name" in found:
            kind = found.get("type", "text")
            if kind not in ("checkbox", "radio") or "checked" in found:
                self._form.append((found["name"], found.get("value", "")))

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._form = None


class Crawl:
    """Every page reachable from the sites' roots and the seeds, on one instance: its
    pages by target, and what each showed."""

    def __init__(self, inst: Instance, seeds: list[str]) -> None:
        self.inst = inst
        self.pages: dict[str, tuple[int, bytes]] = {}
        self.forms: dict[str, list[tuple[str, str]]] = {}
        self.kinds: dict[str, int] = {}
        self.crawl(["/", *(f"/{s}/" for s in inst.sites), *seeds])

    def crawl(self, todo: list[str]) -> None:
        """Visit `todo` and what it links to, at most PER_KIND pages of one kind (a path
        with its numbers taken out and its query's names): enough to show every value."""
        while todo and len(self.pages) < MAX_PAGES:
            target = todo.pop(0)
            parts = urllib.parse.urlsplit(target)
            kind = re.sub(r"\d+", "N", parts.path) + "?" + ",".join(sorted(
                k for k, _ in urllib.parse.parse_qsl(parts.query)))
            if target in self.pages or self.kinds.get(kind, 0) >= PER_KIND:
                continue
            self.kinds[kind] = self.kinds.get(kind, 0) + 1
            todo += self.visit("GET", target)

    def visit(self, method: str, target: str, body: bytes = b"") -> list[str]:
        response = self.inst.page(method, target, body)
        self.pages[target if method == "GET" else f"POST {target}"] = (response.status,
                                                                       response.body)
        if response.status == 303 and response.location:
            return [response.location]
        if not response.content_type.startswith("text/html"):
            return []
        dom = _Dom()
        dom.feed(response.body.decode("utf-8"))
        for action, fields in dom.forms:
            self.forms.setdefault(action, fields)
        return [urllib.parse.urljoin(target, link) for link in dom.links
                if link.startswith("/") and not link.startswith("//")]

    def submit_forms(self) -> None:
        """Post every form once with the values it shows, and every form the pages it
        leads to show (an order placed has a cancel form): the world changes, so last."""
        posted: set[str] = set()
        while new := sorted(set(self.forms) - posted):
            for action in new:
                posted.add(action)
                fields = urllib.parse.urlencode(self.forms[action]).encode()
                self.crawl(self.visit("POST", action, fields))


def _poison(inst: Instance, columns: list[tuple[str, str, str]]) -> list[str]:
    """Put each column's payload in every row; the markers of those the world took."""
    taken = []
    for service, table, column in columns:
        marker = f"{service}.{table}.{column}"
        result = inst.sql(service, f'UPDATE "{table}" SET "{column}" = ?', [payload(marker)])
        if not result.is_error:
            taken.append(marker)
    return taken


def _columns(inst: Instance) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """The non-key columns of every site's tables: (text ones, numeric ones), by the type
    their values have in the world."""
    text: list[tuple[str, str, str]] = []
    numeric: list[tuple[str, str, str]] = []
    for service in sorted(inst.sites):
        for t in inst.site_rows(service, "SELECT name FROM sqlite_master WHERE type = "
                                         "'table' AND name NOT LIKE 'sqlite_%' ORDER BY name",
                                ()):
            table = str(t["name"])
            rows = inst.site_rows(service, f'SELECT * FROM "{table}" LIMIT 1', ())
            for column, value in (rows[0] if rows else {}).items():
                if KEYS.search(column):
                    continue
                kind = numeric if isinstance(value, (int, float)) else text
                kind.append((service, table, column))
    return text, numeric


def _prepare(inst: Instance) -> None:
    """A cart with lines, and a photo table whose row claims to be a web page."""
    for product in (1, 2):
        assert not inst.call_tool("shop_add_to_cart", {"product_id": product,
                                                       "quantity": 1}).is_error
    assert not inst.sql("shop", "CREATE TABLE product_images (product_id INTEGER, "
                                "content_type TEXT, data BLOB, alt TEXT)").is_error
    for product, data in ((1, payload("shop.product_images.data").encode()),
                          (2, b"<svg xmlns='http://www.w3.org/2000/svg'><script>1</script>"
                              b"</svg>")):
        assert not inst.sql("shop", "INSERT INTO product_images VALUES (?, 'text/html', ?, ?)",
                            [product, data, payload("shop.product_images.alt")]).is_error


def _seeds() -> list[str]:
    """Requests whose query or path carries markup: the request is hostile too."""
    bad = urllib.parse.quote(payload("request"))
    return [f"/shop/products?q={bad}", f"/shop/products?category={bad}",
            f"/shop/products?brand={bad}&sort={bad}&page={bad}", f"/shop/orders?status={bad}",
            f"/shop/addresses?then={bad}&done={bad}", f"/chat/?show={bad}",
            f"/chat/search?q={bad}", f"/chat/people?q={bad}", f"/shop/{bad}", f"/{bad}",
            f"/chat/conversations/1?earlier={bad}&done={bad}", "/shop/products/1",
            "/shop/products/2", "/shop/products/1/photo", "/shop/products/2/photo"]


@pytest.fixture(scope="module")
def crawls(worlds: Worlds) -> list[tuple[list[str], Crawl]]:
    """One crawl with every text column poisoned, one per numeric column (arithmetic on
    markup fails a page: each number must show on the pages that survive it)."""
    found = []
    with Environment(worlds).open(WORLD) as inst:
        _prepare(inst)
        text, numeric = _columns(inst)
        for columns in [text, *([c] for c in numeric)]:
            inst.reset()
            _prepare(inst)
            taken = _poison(inst, columns)
            crawl = Crawl(inst, _seeds())
            crawl.submit_forms()
            found.append((taken, crawl))
    return found


def test_every_page_route_of_every_site_is_crawled(crawls: list[tuple[list[str], Crawl]]
                                                   ) -> None:
    visited = {t.partition("?")[0] for _, crawl in crawls for t in crawl.pages}
    for service, site in SHIPPED_SITES.items():
        for route in site.routes:
            pattern = re.sub(r"\{[^}]+\}", "[^/]+", route.pattern)
            prefix = "POST " if route.method == "POST" else ""
            wanted = re.compile(f"{prefix}/{service}{pattern}/?")
            assert any(wanted.fullmatch(v) for v in visited), (route.method, service,
                                                               route.pattern)


def test_no_value_of_the_world_becomes_html(crawls: list[tuple[list[str], Crawl]]) -> None:
    shown_markers: set[str] = set()
    taken_markers: set[str] = set()
    broken = []  # (page, what of a value became HTML)
    for taken, crawl in crawls:
        taken_markers.update(taken)
        for target, (status, body) in crawl.pages.items():
            text = body.decode("utf-8", "replace")
            if status == 303:
                continue
            if not text.lstrip().startswith("<!doctype html>"):
                # Not a page: only a still image the bytes are, never the row's markup.
                if status != 200 or body[:4] not in (b"\x89PNG", b"\xff\xd8\xff\xe0"):
                    broken.append((target, "a document that is not a page"))
                continue
            dom = _Dom()
            dom.feed(text)
            if dom.injected or dom.styles != 1:
                broken.append((target, str(dom.injected[:1])))
            shown_markers.update(m for m in [*taken, "request", "shop.product_images.alt"]
                                 if shown(m) in text)
    assert broken == [], f"{len(broken)} pages: {broken[:5]}"
    # The world's values did reach the pages: the quantity of an order line among them.
    assert {"shop.order_items.quantity", "shop.cart_items.quantity", "shop.products.name",
            "chat.messages.body", "shop.product_images.alt", "request"} <= shown_markers
    missing = taken_markers - shown_markers - NOT_SHOWN
    assert not missing, " ".join(sorted(missing))


def test_chromium_builds_no_injected_element(crawls: list[tuple[list[str], Crawl]],
                                             tmp_path: Path) -> None:
    """The same pages parsed by Chromium (each distinct page that holds a value of the
    corpus, shown or not): no element, script or style sheet of a value."""
    pages: dict[str, str] = {}
    for taken, crawl in crawls:
        for _status, body in crawl.pages.values():
            text = body.decode("utf-8", "replace")
            if text.startswith("<!doctype html>") and any(
                    f'"{m}"' in text or shown(m) in text for m in [*taken, "request"]):
                pages.setdefault(hashlib.sha256(body).hexdigest(), text)
    assert len(pages) >= 20
    broken = _chromium_problems(pages.values(), tmp_path / "profile")
    assert broken == [], f"{len(broken)} of {len(pages)} pages: {broken[:3]}"


def _chromium_problems(pages: Iterable[str], profile: Path) -> list[Any]:
    """Each page's HTML parsed by Chromium: what of a value became an element, a style
    sheet or a script that ran ([elements, style sheets, ran, title] where any did)."""
    assert CHROMIUM is not None
    broken = []
    with PersonBrowser(CHROMIUM, profile) as browser:
        target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.call("Target.attachToTarget",
                               {"targetId": target, "flatten": True})["sessionId"]
        browser.call("Page.enable", session=session)
        frame = browser.call("Page.getFrameTree", session=session)["frameTree"]["frame"]["id"]
        for text in pages:
            # The frame's window outlives a document set into it: clear what a script of
            # an earlier one could have left.
            browser.call("Runtime.evaluate", {"expression": "window.pwned = false"},
                         session=session)
            browser.call("Page.setDocumentContent", {"frameId": frame, "html": text},
                         session=session)
            found = browser.call("Runtime.evaluate", {"returnByValue": True, "expression": (
                "[document.querySelectorAll('[data-pwn],[x],script').length,"
                " document.querySelectorAll('style').length, !!window.pwned, document.title]")},
                session=session)["result"]["value"]
            if found[:3] != [0, 1, False]:
                broken.append(found)
    return broken


# --- the web UI (worldctl ui) shows world values too ---------------------------------------


def _hostile_log(worlds: Worlds, tmp: Path) -> Path:
    """The demo persona's log, then a day that puts markup in every column it can, and a
    table whose name and column are markup: a world imported from a hostile log."""
    columns: list[tuple[str, str, str]] = []
    with Environment(worlds).open(WORLD) as inst:
        text, numeric = _columns(inst)
        for service, table, column in [*text, *numeric]:
            if table != "product_images" and not inst.sql(
                    service, f'UPDATE "{table}" SET "{column}" = ?',
                    [payload(f"{service}.{table}.{column}")]).is_error:
                columns.append((service, table, column))
    sql = [(service, f'UPDATE "{table}" SET "{column}" = ?',
            [payload(f"{service}.{table}.{column}")]) for service, table, column in columns]
    # A name with no slash (the UI's paths are split at one) and no double quote.
    name = ("<b data-pwn='ui.table' x=1>'&<style>@keyframes pwn{to{opacity:0}}"
            "*{animation:pwn 1s infinite}<script>window.pwned=1")
    sql += [("shop", f'CREATE TABLE "{name}" ("{name}" TEXT)', []),
            ("shop", f'INSERT INTO "{name}" VALUES (?)', [payload("ui.row")])]
    events = [json.dumps({"persona": "lars", "day": 8, "ts": f"2026-03-10T07:{n // 60:02d}:"
                          f"{n % 60:02d}Z", "type": "sql", "service": service, "sql": statement,
                          "params": params}) for n, (service, statement, params)
              in enumerate(sql)]
    log = tmp / "lars.jsonl"
    log.write_text(DEMO.read_text(encoding="utf-8") + "\n".join(events) + "\n",
                   encoding="utf-8")
    return log


def test_the_web_ui_shows_hostile_values_as_text(worlds: Worlds, tmp_path: Path) -> None:
    log = _hostile_log(worlds, tmp_path)
    with Worlds.open(tmp_path / "hostile") as worlds:
        worlds.import_file(log)
        with Environment(worlds).open("lars@8") as inst:  # an episode of its values
            for tool, arguments in (("shop_search_products", {"query": "b"}),
                                    ("chat_list_conversations", {})):
                inst.call_tool(tool, arguments)
            save_episode(worlds, inst)
        with served(WorldsUI(worlds)) as base, httpx2.Client(base_url=base) as ui:
            pages = _crawl_ui(ui)
    broken = []
    for target, text in pages.items():
        dom = _Dom()
        dom.feed(text)
        if dom.injected or dom.styles != 1:
            broken.append((target, dom.injected[:1]))
    assert broken == []
    assert _chromium_problems(pages.values(), tmp_path / "person") == []
    seen = {m for m in ("ui.table", "ui.row", "shop.order_items.quantity",
                        "chat.messages.body") for text in pages.values() if m in text}
    assert seen == {"ui.table", "ui.row", "shop.order_items.quantity", "chat.messages.body"}


def _crawl_ui(ui: httpx2.Client) -> dict[str, str]:
    """Every page of the UI reachable from its home, at most PER_KIND of a kind."""
    pages: dict[str, str] = {}
    kinds: dict[str, int] = {}
    todo = ["/", "/p/lars/8", "/diff?a=lars@7&b=lars@8"]
    while todo and len(pages) < MAX_PAGES:
        target = todo.pop(0)
        kind = re.sub(r"/[^/?]*[<>&\d][^/?]*", "/N", target.partition("?")[0])
        if target in pages or kinds.get(kind, 0) >= PER_KIND or target.startswith("/raw/") \
                or "/screenshots/" in target:  # bytes, not pages
            continue
        kinds[kind] = kinds.get(kind, 0) + 1
        response = ui.get(target)
        if not response.headers.get("content-type", "").startswith("text/html"):
            continue
        pages[target] = response.text
        dom = _Dom()
        dom.feed(response.text)
        todo += [urllib.parse.urljoin(target, link) for link in dom.links
                 if link.startswith("/")]
    return pages


MARKUP_MAKERS = {"render", "_page"}  # worldenv/gui/site.py: Markup of what Jinja2 escaped
SITE_SOURCES = sorted([ROOT / "worldenv" / "gui" / "site.py",
                       *(ROOT / "worldenv" / "sites").glob("*.py")])
SITE_TEMPLATES = sorted([*(ROOT / "worldenv" / "gui" / "templates").glob("*.html"),
                         *(ROOT / "worldenv" / "sites" / "templates").rglob("*.html")])


@pytest.mark.parametrize("source", SITE_SOURCES, ids=lambda p: p.name)
def test_the_sites_build_html_only_through_markup(source: Path) -> None:
    """No f-string or %-format writes HTML, and ``Markup(...)`` (HTML as it is) takes only
    a literal: every value reaches a page through a template, which escapes it."""
    tree = ast.parse(source.read_text(encoding="utf-8"))
    # The escaping layer itself makes Markup of what it escaped, and the page of a body.
    trusted = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
               and f.name in MARKUP_MAKERS for n in ast.walk(f)}
    for node in (n for n in ast.walk(tree) if id(n) not in trusted):
        if isinstance(node, ast.JoinedStr):
            literal = "".join(v.value for v in node.values
                              if isinstance(v, ast.Constant) and isinstance(v.value, str))
            assert "<" not in literal, (source.name, node.lineno)
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Markup":
            for arg in node.args:
                is_literal = isinstance(arg, ast.Constant) or (
                    isinstance(arg, ast.IfExp) and isinstance(arg.body, ast.Constant)
                    and isinstance(arg.orelse, ast.Constant))
                assert is_literal, (source.name, node.lineno, ast.unparse(arg))


def test_the_templates_never_turn_autoescape_off() -> None:
    """Every page is a template rendered with autoescape: none says a value is safe HTML
    or switches escaping off."""
    assert len(SITE_TEMPLATES) > 10
    for template in SITE_TEMPLATES:
        text = template.read_text(encoding="utf-8")
        for banned in ("|safe", "| safe", "autoescape", "Markup"):
            assert banned not in text, (template.name, banned)


# --- (B) a screenshot is a function of the page --------------------------------------------


def _gif() -> bytes:
    """An animated GIF: three frames of three colours, 100 ms each, looping."""
    from PIL import Image

    frames = [Image.new("RGB", (4, 4), colour) for colour in ("red", "blue", "green")]
    out = io.BytesIO()
    frames[0].save(out, "GIF", save_all=True, append_images=frames[1:], duration=100,
                   loop=0)
    return out.getvalue()


SPIN = ("@keyframes spin{from{transform:rotate(0);background:red}"
        "to{transform:rotate(360deg);background:blue}}")
ANIMATED = {
    "keyframes-important": f"<style>{SPIN}#a{{width:200px;height:200px;"
                           "animation:spin .7s linear infinite!important}</style><div id=a>",
    "before": f"<style>{SPIN}#a::before{{content:'x';display:block;width:99px;height:99px;"
              "animation:spin .5s infinite}</style><div id=a></div>",
    "inline": f"<style>{SPIN}</style><div style='width:90px;height:90px;"
              "animation:spin .3s infinite alternate'>s</div>",
    "transition": "<style>#a{width:100px;height:300px;background:green;transition:width 3s,"
                  "background 3s}#a:hover{width:900px;background:red}</style><div id=a></div>",
    "gif": "<img src=/anim.gif style='width:300px;height:300px;image-rendering:pixelated'>",
    "svg": "<svg width=300 height=300><rect width=300 height=300 fill=red><animate "
           "attributeName=fill values='red;blue;green' dur='.4s' repeatCount=indefinite>"
           "</animate></rect></svg>",
    "script": "<div id=a style='width:300px;height:300px'></div><script>let n=0;function f(){"
              "document.getElementById('a').style.background='rgb('+(n++%255)+',0,0)';"
              "requestAnimationFrame(f)}requestAnimationFrame(f)</script>",
}


@pytest.fixture(scope="module")
def sandboxed_browser() -> Iterator[Browser]:
    browser = Browser(idle_s=0)
    browser.start()
    yield browser
    browser.close()


def _handler() -> Callable[[Intercepted], Served]:
    """Serves ANIMATED's pages at /<name> and the GIF they load."""
    gif = _gif()

    def handle(request: Intercepted) -> Served:
        if request.url.endswith("/anim.gif"):
            return Served(200, [("Content-Type", "image/gif")], gif)
        body = ANIMATED.get(request.url.rsplit("/", 1)[-1])
        if body is None:  # the favicon
            return Served(404, [], b"")
        return Served(200, [("Content-Type", "text/html")],
                      f"<!doctype html><body style='margin:0'>{body}".encode())
    return handle


def test_an_animated_page_gives_one_screenshot(sandboxed_browser: Browser) -> None:
    """Each page, in three fresh browser pages, shot at three different moments after
    loading and after a hover: one digest per page."""
    digests: dict[str, set[str]] = {name: set() for name in ANIMATED}
    for run in range(3):
        page = sandboxed_browser.new_page(_handler())
        try:
            for name in sorted(ANIMATED):
                page.navigate(f"http://world.local/{name}")
                time.sleep(0.05 * run)
                page.click(50, 150)  # a hover starts the transition
                time.sleep(0.05 * run)
                digests[name].add(hashlib.sha256(page.screenshot()).hexdigest())
        finally:
            page.close()
    moving = [name for name, found in digests.items() if len(found) != 1]
    assert moving == [], moving


# --- (C) a page served for one instance cannot act on another -------------------------------


def hostile_site(targets: dict[str, str]) -> Site:
    """A shop whose page at /evil/N is hostile: it acts on `targets["b"]` (the victim's id,
    leaked) or on guessed sequential ids. Its HTML is the test's own (raw)."""
    evil = Site(service="shop", title="Evil")
    b = targets["b"]
    actions = [
        f'<form method=post action="/instances/{b}/gui/shop/cart/add"><input type=hidden '
        f'name=product_id value=1><button>go</button></form>',
        f'<form method=post action="/instances/{b}/gui/shop/cart/add" '
        f'referrerpolicy=no-referrer><input type=hidden name=product_id value=1>'
        f"<button>go</button></form><meta name=referrer content=no-referrer>",
        f'<form method=post enctype=text/plain action="/instances/{b}/shell"><input '
        f"type=hidden name='{{\"command\": \"touch pwned #' value='\"}}'>"
        f"<button>go</button></form>",
        f'<form method=post action="/instances/{b}/reset"><button>go</button></form>',
        f'<form method=post enctype=text/plain action="/instances/{b}/answer"><input '
        f"type=hidden name='{{\"text\": \"pwned' value='\"}}'>"
        f"<button>go</button></form>",
        '<form method=post enctype=text/plain action="/instances"><input type=hidden '
        'name=\'{"world": "lars@7", "gui": true, "agent": "\' value=\'"}\'><button>go</button>'
        "</form>",
        '<form method=post action="/instances/i2/gui/shop/cart/add"><input type=hidden '
        "name=product_id value=1><button>go</button></form>",
        f'<a href="/instances/{b}/gui/shop/products/1">go</a>'
        f'<img src="/instances/{b}/gui/shop/cart">',
        '<form method=post action="/shop/cart/add"><input type=hidden name=product_id '
        f'value=1><button>go</button></form><img src="/instances/{b}/gui/shop/">',
    ]

    @evil.page("/evil/{n:int}")
    def hostile(ctx: PageContext, n: int) -> Page:
        return Page("Evil", actions[n])

    targets["count"] = str(len(actions))
    return evil


FETCHES = [  # what a page's script would do, run in the hostile page's context
    "fetch('/instances/{b}/gui/shop/cart/add', {{method: 'POST', body: 'product_id=1', "
    "headers: {{'content-type': 'application/x-www-form-urlencoded'}}}})",
    "fetch('/instances/{b}/gui/shop/cart/add', {{method: 'POST', body: 'product_id=1', "
    "mode: 'no-cors', referrerPolicy: 'no-referrer', headers: {{'content-type': "
    "'application/x-www-form-urlencoded'}}}})",
    "fetch('/instances/{b}/reset', {{method: 'POST', mode: 'no-cors'}})",
    "fetch('/instances/{b}/openenv/step', {{method: 'POST', mode: 'no-cors', body: "
    "JSON.stringify({{action: {{shell: 'touch pwned'}}}})}})",
    "location.href = '/instances/{b}/gui/shop/cart'",
    "fetch('/instances/{b}', {{method: 'DELETE'}})",
]


def test_a_hostile_page_of_one_instance_cannot_touch_another(
        worlds: Worlds, tmp_path: Path) -> None:
    targets: dict[str, str] = {"b": ""}
    sites = dict(SHIPPED_SITES)
    env = Environment(worlds, sites=sites)
    gateway = Gateway(env, max_instances=8, call_timeout=60)
    assert CHROMIUM is not None
    with served(gateway) as base, httpx2.Client(base_url=base, timeout=60) as rest:
        b = rest.post("/instances", json={"world": WORLD, "gui": True, "shell": True,
                                          "answer": True}).json()
        assert re.fullmatch(r"i\d+-[0-9a-f]{32}", b["id"]), b["id"]
        targets["b"] = b["id"]
        sites["shop"] = hostile_site(targets)
        env.sites = sites
        a = rest.post("/instances", json={"world": WORLD, "gui": True}).json()
        state = _state(rest, b["id"])
        touched = []
        with PersonBrowser(CHROMIUM, tmp_path / "person") as person:
            for n in range(int(targets["count"])):
                _click_first(person, f"{base}{a['gui_url']}shop/evil/{n}")
                if (now := _state(rest, b["id"])) != state:
                    touched.append(f"page {n}")
                    state = now
            for script in FETCHES:  # the DELETE last: after it, B would be gone
                _run_in_page(person, f"{base}{a['gui_url']}shop/evil/0",
                             script.format(b=b["id"]))
                if (now := _state(rest, b["id"])) != state:
                    touched.append(script)
                    state = now
        assert touched == [], touched
        assert _state(rest, b["id"])[1:3] == (b["episode_id"], b["world_hash"])


def _state(rest: httpx2.Client, iid: str) -> tuple[Any, ...]:
    """What a hostile page could change of instance `iid`, and of the gateway."""
    info = rest.get(f"/instances/{iid}")
    if info.status_code != 200:
        return ("closed",)
    found = info.json()
    return (len(rest.get("/instances").json()["instances"]), found["episode_id"],
            rest.get(f"/instances/{iid}/hash").json()["hash"], found["calls"],
            found["answered"], found["stored_episodes"])


def _open(person: PersonBrowser, url: str, *, bypass_csp: bool = False) -> tuple[str, str]:
    target = person.call("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = person.call("Target.attachToTarget", {"targetId": target,
                                                    "flatten": True})["sessionId"]
    person.call("Page.enable", session=session)
    person.call("Page.setBypassCSP", {"enabled": bypass_csp}, session=session)
    person.call("Page.navigate", {"url": url}, session=session)
    _wait(person, session, lambda state: state == ["complete", url])
    return target, session


def _wait(person: PersonBrowser, session: str, done: Callable[[Any], bool]) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        state = person.call("Runtime.evaluate", {
            "expression": "[document.readyState, location.href]", "returnByValue": True},
            session=session)["result"].get("value")
        if done(state):
            return
        time.sleep(0.05)


def _click_first(person: PersonBrowser, url: str) -> None:
    """A person's one click on the page's first button or link."""
    target, session = _open(person, url)
    try:
        person.call("Runtime.evaluate", {"expression":
                                         "(document.querySelector('button') || "
                                         "document.querySelector('a')).click()"},
                    session=session)
        _wait(person, session, lambda state: state is not None and state[1] != url
              and state[0] == "complete")
        time.sleep(0.1)
    finally:
        person.call("Target.closeTarget", {"targetId": target})


def _run_in_page(person: PersonBrowser, url: str, script: str) -> None:
    """`script` in the page, as if the page ran it: past its Content-Security-Policy too,
    which forbids it any script, so that what holds is the gateway's own refusal."""
    target, session = _open(person, url, bypass_csp=True)
    try:
        person.call("Runtime.evaluate", {"expression": f"Promise.resolve({script})"
                                                       ".catch(() => 0).then(() => 0)",
                                         "awaitPromise": True}, session=session)
        time.sleep(0.1)
    finally:
        person.call("Target.closeTarget", {"targetId": target})


def test_the_json_api_refuses_what_a_page_sends(worlds: Worlds) -> None:
    gateway = Gateway(Environment(worlds), max_instances=4)
    with served(gateway) as base, httpx2.Client(base_url=base, timeout=60) as rest:
        made = rest.post("/instances", json={"world": WORLD}).json()
        for headers in ({"sec-fetch-site": "same-origin"}, {"sec-fetch-site": "same-site"},
                        {"sec-fetch-site": "cross-site"}, {"origin": base}):
            for method, path in (("POST", "/instances"), ("POST", f"/instances/{made['id']}"
                                                                  "/reset"),
                                 ("DELETE", f"/instances/{made['id']}")):
                response = rest.request(method, path, headers=headers,
                                        content=b'{"world": "lars@7"}')
                assert response.status_code == 403, (method, path, headers)
                assert "web page" in response.json()["error"]
                assert response.headers["x-content-type-options"] == "nosniff"
        # A person's own navigation and a program are served as before.
        assert rest.get("/instances", headers={"sec-fetch-site": "none"}).is_success
        assert rest.delete(f"/instances/{made['id']}").is_success


# --- (D) GUI instances are capped per client and in all --------------------------------------


def test_gui_instances_are_capped_per_client_and_in_all(worlds: Worlds) -> None:
    gateway = Gateway(Environment(worlds), max_instances=16, max_gui_instances=3,
                      max_gui_per_client=2)
    with served(gateway) as base:
        clients = [httpx2.Client(base_url=base, timeout=60, transport=httpx2.HTTPTransport(
            local_address=f"127.0.0.{n}")) for n in (1, 2, 3)]
        try:
            one, two, three = clients
            made = [one.post("/instances", json={"world": WORLD, "gui": True})
                    for _ in range(2)]
            assert all(r.status_code == 201 for r in made)
            capped = one.post("/instances", json={"world": WORLD, "gui": True})
            assert capped.status_code == 429
            assert capped.json()["cap"] == "max_gui_per_client" and \
                "max_gui_per_client" in capped.json()["error"]
            assert capped.json()["limit"] == 2
            assert one.post("/instances", json={"world": WORLD}).status_code == 201  # no GUI
            assert two.post("/instances", json={"world": WORLD, "gui": True}
                            ).status_code == 201
            full = three.post("/instances", json={"world": WORLD, "gui": True})
            assert full.status_code == 429 and full.json()["cap"] == "max_gui_instances"
            assert full.json()["limit"] == 3 and "retry-after" in full.headers
            # Closing one gives its place back, to its client and to everyone.
            assert one.delete(f"/instances/{made[0].json()['id']}").is_success
            assert three.post("/instances", json={"world": WORLD, "gui": True}
                              ).status_code == 201
            assert one.post("/instances", json={"world": WORLD, "gui": True}
                            ).status_code == 429
        finally:
            for client in clients:
                client.close()


def test_gui_caps_are_checked_when_the_gateway_is_made(worlds: Worlds) -> None:
    from worldenv.errors import GatewayError

    with pytest.raises(GatewayError, match="max_gui"):
        Gateway(Environment(worlds), max_gui_instances=0)
    with pytest.raises(GatewayError, match="max_gui"):
        Gateway(Environment(worlds), max_gui_per_client=0)


def test_html_escape_is_what_pages_use() -> None:
    assert shown("x") == esc('data-pwn="x"')
