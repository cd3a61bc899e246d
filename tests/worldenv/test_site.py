"""The shipped sites (worldenv.sites) on the demo world, served by ``Instance.page``.

Real store, real apps, no browser: every page renders with the world's values (escaped),
unknown pages and ids are 404s, a page cannot write, each form does exactly what its tool
does when called directly (same final hash, same changesets, the tool named in the
episode), a tool's refusal is a 422 page that changes nothing, and the same requests give
the same bytes, timed by the call's clock.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from replay import Worlds
from worldenv.core.episode import DbChange, FormSubmission, GuiCall
from worldenv.gui.site import CSP, Page, PageContext, PageResponse, Site, esc
from worldenv.instances.instance import Environment, Instance
from worldenv.sites.shop import nok

DEMO = Path(__file__).resolve().parents[2] / "packs" / "demo" / "world" / "lars.jsonl"
PNG = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000")


@pytest.fixture(scope="module")
def worlds(demo_worlds: Worlds) -> Worlds:
    return demo_worlds  # the shared demo store (tests/conftest.py), this module's copy


@pytest.fixture(scope="module")
def env(worlds: Worlds) -> Environment:
    return Environment(worlds)


@pytest.fixture
def inst(env: Environment) -> Iterator[Instance]:
    with env.open("lars@7") as instance:
        yield instance


@pytest.fixture
def other(env: Environment) -> Iterator[Instance]:
    """A second, fresh instance of the same world."""
    with env.open("lars@7") as instance:
        yield instance


def html(response: PageResponse) -> str:
    return response.body.decode("utf-8")


def form(**fields: object) -> bytes:
    pairs = [(k, str(v)) for k, values in fields.items()
             for v in (values if isinstance(values, list) else [values])]
    return urllib.parse.urlencode(pairs).encode()


def changes(instance: Instance) -> list[tuple[int, str, bytes, Any]]:
    return [(e.index, e.service, e.changeset, e.sequences) for e in instance.episode.events
            if isinstance(e, DbChange)]


def last_gui(instance: Instance) -> GuiCall:
    found = [e for e in instance.episode.events if isinstance(e, GuiCall)]
    assert found
    return found[-1]


# --- every page ---------------------------------------------------------------------------

PAGES = [
    ("/", ["AVLager", "Messenger"]),
    ("/shop/", ["Professional displays", "Your cart: 3 items", "NOK 13,587.50",
                "AVL-2026-10533"]),
    ("/shop/products", ["74 products", "page 1 of 7", 'aria-label="Page 7"']),
    ("/shop/products?page=7", ["page 7 of 7", "Previous"]),
    ("/shop/products?category=displays", ["Professional displays", "4 products", "QM75C"]),
    ("/shop/products?q=shure", ["Results for “shure”", "Shure"]),
    ("/shop/products?q=hdmi+2m", ["HDMI 2.1 cable 2 m", "2 products<"]),
    ("/shop/products?brand=Bose&sort=price_desc&in_stock=1", ["DM3SE", "selected"]),
    ("/shop/products?min_price=1000&max_price=2000", ["excl. MVA", 'value="1000"']),
    ("/shop/products/46", ["Bose DesignMax DM3SE", "In your cart: 2 pair", "No photo",
                           "Add to cart", "Speakers"]),
    ("/shop/products/1", ["HDMI 2.1 cable 2 m", "130 pcs in stock", "AVL-2026-10533"]),
    ("/shop/cart", ["NOK 6,580.00", "NOK 10,870.00", "NOK 2,717.50", "NOK 13,587.50",
                    "Remove QSC SPA2-60 2x60 W amplifier from cart", "Go to checkout"]),
    ("/shop/checkout", ["Place order", "Workshop", "Nordlys Studio", "Maridalsveien 87",
                        'value="1" checked', "NOK 13,587.50"]),
    ("/shop/orders", ["AVL-2026-10533", "AVL-2026-10417", "NOK 149,706.25", "delivered"]),
    ("/shop/orders?status=cancelled", ["No orders."]),
    ("/shop/orders/2", ["Order AVL-2026-10533", "Bring 70730259304981756",
                        "NOK 119,765.00", "NOK 29,941.25", "NOK 149,706.25",
                        "Order received", "signed I. Solberg", "Maridalsveien 87"]),
    ("/shop/addresses", ["Workshop", "(default)", "Add an address", "Postal code"]),
    ("/chat/", ["3 unread messages", "Sofie Nilsen", "Nordlys - Fjellrommet AV", "(group)",
                "You: Perfect"]),
    ("/chat/?show=unread", ["Sofie Nilsen", "Kari Haugen"]),
    ("/chat/?show=group", ["Nordlys - Fjellrommet AV"]),
    ("/chat/conversations/1", ["Ingrid Solberg", "NS-PO-2026-031", "Send",
                               "members: Lars Eriksen (you), Ingrid Solberg"]),
    ("/chat/conversations/6", ["1 unread", "Mark as read", "Unread",
                               "Mark message 19 from Erik Dahl as unread"]),
    ("/chat/people", ["Sofie Nilsen", "Start a conversation with Erik Dahl",
                      "Open conversation with Ingrid Solberg"]),
    ("/chat/people?q=nordlys", ["Erik Dahl", "Ingrid Solberg"]),
    ("/chat/search", ["Search messages"]),
    ("/chat/search?q=tracking", ["2 messages", "70730259304981756"]),
    ("/chat/new", ["New conversation", "Group title", "First message"]),
]


@pytest.mark.parametrize(("target", "expected"), PAGES, ids=[p[0] for p in PAGES])
def test_every_page_renders_with_the_worlds_values(inst: Instance, target: str,
                                                   expected: list[str]) -> None:
    response = inst.page("GET", target)
    assert response.status == 200, html(response)
    assert response.content_type == "text/html; charset=utf-8"
    text = html(response)
    for piece in expected:
        assert piece in text, piece
    assert "<script" not in text.lower()
    assert inst.hash() == inst.record.world_hash


CATALOGUE = [
    ("", {}), ("q=cable", {"query": "cable"}), ("q=hdmi+2m", {"query": "hdmi 2m"}),
    ("q=cable&page=2", {"query": "cable", "offset": 12}),
    ("category=speakers&sort=price_desc", {"category": "speakers", "sort": "price_desc"}),
    ("brand=shure&in_stock=1", {"brand": "shure", "in_stock_only": True}),
    ("min_price=1000&max_price=5000&sort=stock_desc",
     {"min_price_cents": 100000, "max_price_cents": 500000, "sort": "stock_desc"}),
    ("q=50%25", {"query": "50%"}), ("q=a_b", {"query": "a_b"}),
]


@pytest.mark.parametrize(("query", "arguments"), CATALOGUE, ids=[c[0] for c in CATALOGUE])
def test_the_catalogue_finds_what_search_products_finds(inst: Instance, query: str,
                                                        arguments: dict[str, Any]) -> None:
    found = inst.call_tool("shop_search_products", {**arguments, "limit": 12}).structured
    text = html(inst.page("GET", f"/shop/products?{query}"))
    shown = re.findall(r'<div><a href="/shop/products/(\d+)">', text)
    assert [int(i) for i in shown] == [p["id"] for p in found["items"]]
    assert f'role="status">{found["total"]} product' in text


def test_a_conversation_pages_back_through_its_messages(inst: Instance) -> None:
    for n in range(31):
        assert not inst.call_tool("chat_send_message", {"conversation_id": 7,
                                                        "body": f"note {n}"}).is_error
    latest = html(inst.page("GET", "/chat/conversations/7"))  # notes 1..30
    assert "note 1</div>" in latest and "note 30</div>" in latest
    assert "note 0</div>" not in latest and "Spotify" not in latest
    assert "Show earlier messages" in latest and "Show newer messages" not in latest
    earlier = html(inst.page("GET", "/chat/conversations/7?earlier=30"))  # the first five
    assert "Spotify" in earlier and "note 0</div>" in earlier and "note 1</div>" not in earlier
    assert "Show newer messages" in earlier and "Show earlier messages" not in earlier


def test_unread_filter_lists_only_unread_conversations(inst: Instance) -> None:
    text = html(inst.page("GET", "/chat/?show=unread"))
    assert "Ingrid Solberg" not in text and text.count("/chat/conversations/") == 3


# --- not found ----------------------------------------------------------------------------

MISSING = [("GET", "/nope/"), ("GET", "/shop/nope"), ("GET", "/shop/products/9999"),
           ("GET", "/shop/products/abc"), ("GET", "/shop/products/1/photo"),
           ("GET", "/shop/products?category=nope"), ("GET", "/shop/orders/9999"),
           ("GET", "/shop/orders?status=lost"), ("GET", "/chat/conversations/99"),
           ("GET", "/chat/?show=everything"), ("GET", "/shop/cart/add"),
           ("POST", "/shop/cart"), ("POST", "/chat/conversations/1")]


@pytest.mark.parametrize(("method", "target"), MISSING, ids=[f"{m} {t}" for m, t in MISSING])
def test_unknown_pages_and_ids_are_404(inst: Instance, method: str, target: str) -> None:
    response = inst.page(method, target)
    assert response.status == 404
    assert "Not found" in html(response)
    assert last_gui(inst).is_error and not changes(inst)


# --- escaping -----------------------------------------------------------------------------

NASTY = '<script>alert("x")</script> & \'q\''


def test_values_from_the_world_are_escaped(inst: Instance) -> None:
    assert not inst.call_tool("chat_send_message", {"conversation_id": 1,
                                                    "body": NASTY}).is_error
    assert not inst.call_tool("shop_add_address", {
        "label": '"><script>x()</script>', "recipient": NASTY, "street": "A & B",
        "postal_code": "0001", "city": "Oslo"}).is_error
    for target in ("/chat/conversations/1", "/chat/", "/chat/search?q=script",
                   "/shop/addresses", "/shop/checkout"):
        text = html(inst.page("GET", target))
        assert "<script" not in text, target
        assert "&lt;script&gt;" in text, target
    assert esc(NASTY) in html(inst.page("GET", "/chat/conversations/1"))
    assert 'value="' + esc('">') not in html(inst.page("GET", "/shop/checkout"))


def test_the_request_itself_is_escaped(inst: Instance) -> None:
    query = urllib.parse.quote('<script>"x"</script>')
    for target in (f"/shop/products?q={query}", f"/chat/search?q={query}",
                   f"/chat/people?q={query}", f"/shop/{query}"):
        text = html(inst.page("GET", target))
        assert "<script" not in text and "&lt;script&gt;" in text, target


# --- pages only read ------------------------------------------------------------------------

sneaky = Site(service="shop", title="Sneaky")


@sneaky.page("/insert")
def _insert(ctx: PageContext) -> Page:
    ctx.rows("INSERT INTO categories(id, slug, name, created_at, updated_at) "
             "VALUES (99, 'x', 'X', 'now', 'now')")
    return Page("Wrote", "<p>wrote</p>")


@sneaky.page("/update")
def _update(ctx: PageContext) -> Page:
    ctx.rows("UPDATE products SET price_cents = 0")
    return Page("Wrote", "<p>wrote</p>")


@sneaky.page("/call")
def _call(ctx: PageContext) -> Page:
    ctx.call("add_to_cart", {"product_id": 1})
    return Page("Wrote", "<p>wrote</p>")


@sneaky.page("/crash")
def _crash(ctx: PageContext) -> Page:
    ctx.rows("SELECT * FROM no_such_table")
    return Page("Never", "")


@pytest.mark.parametrize(("target", "status", "says"), [
    ("/shop/insert", 422, "a page only reads"), ("/shop/update", 422, "a page only reads"),
    ("/shop/call", 422, "tools are called by forms"), ("/shop/crash", 500, "failed")])
def test_a_page_cannot_write(worlds: Worlds, target: str, status: int, says: str) -> None:
    with Environment(worlds, sites={"shop": sneaky}).open("lars@7") as instance:
        response = instance.page("GET", target)
        assert response.status == status and says in html(response)
        assert not changes(instance) and last_gui(instance).forms == []
        assert instance.hash() == instance.record.world_hash


# --- forms do what their tools do -------------------------------------------------------------

Setup = list[tuple[str, dict[str, Any]]]
PLACE = ("shop_place_order", {"shipping_address_id": 2})  # order 3, status 'placed'
FORMS: list[tuple[str, bytes, str, dict[str, Any], str, Setup]] = [
    ("/shop/cart/add", form(product_id=1, quantity=2), "shop_add_to_cart",
     {"product_id": 1, "quantity": 2}, "/shop/cart", []),
    ("/shop/cart/add", form(product_id=46, quantity=1), "shop_add_to_cart",
     {"product_id": 46, "quantity": 1}, "/shop/cart", []),
    ("/shop/cart/update", form(product_id=46, quantity=3), "shop_update_cart_item",
     {"product_id": 46, "quantity": 3}, "/shop/cart", []),
    ("/shop/cart/remove", form(product_id=50), "shop_remove_from_cart",
     {"product_id": 50}, "/shop/cart", []),
    ("/shop/checkout", form(shipping_address_id=2), "shop_place_order",
     {"shipping_address_id": 2}, "/shop/orders/3?done=placed", []),
    ("/shop/checkout", b"", "shop_place_order", {}, "/shop/orders/3?done=placed", []),
    ("/shop/orders/3/cancel", form(reason="Wrong mount"), "shop_cancel_order",
     {"order_id": 3, "reason": "Wrong mount"}, "/shop/orders/3?done=cancelled", [PLACE]),
    ("/shop/orders/3/cancel", form(reason=""), "shop_cancel_order", {"order_id": 3},
     "/shop/orders/3?done=cancelled", [PLACE]),
    ("/shop/addresses", form(label="Fjord", recipient="Sofie Nilsen", company="",
                             street="Bryggen 1", postal_code="0150", city="Oslo",
                             country="NO", phone="", make_default="1", then=""),
     "shop_add_address", {"label": "Fjord", "recipient": "Sofie Nilsen",
                          "street": "Bryggen 1", "postal_code": "0150", "city": "Oslo",
                          "country": "NO", "make_default": True},
     "/shop/addresses?done=added", []),
    ("/shop/addresses", form(label="Fjord", recipient="Sofie", street="Bryggen 1",
                             postal_code="0150", city="Oslo", country="NO",
                             then="checkout"),
     "shop_add_address", {"label": "Fjord", "recipient": "Sofie", "street": "Bryggen 1",
                          "postal_code": "0150", "city": "Oslo", "country": "NO"},
     "/shop/checkout", []),
    ("/chat/conversations/1/send", form(body="On my way\nsee you"), "chat_send_message",
     {"conversation_id": 1, "body": "On my way\nsee you"}, "/chat/conversations/1", []),
    ("/chat/conversations/6/read", b"", "chat_mark_read", {"conversation_id": 6},
     "/chat/conversations/6?done=read", []),
    ("/chat/messages/19/unread", b"", "chat_mark_unread", {"message_id": 19},
     "/chat/conversations/6?done=unread", []),
    ("/chat/new", form(member_id=6), "chat_create_conversation", {"member_ids": [6]},
     "/chat/conversations/8", []),
    ("/chat/new", form(member_id=[8, 3], title="Fjord café", first_message="Hei!"),
     "chat_create_conversation", {"member_ids": [8, 3], "title": "Fjord café",
                                  "first_message": "Hei!"}, "/chat/conversations/8", []),
]


@pytest.mark.parametrize(("target", "body", "tool", "arguments", "location", "setup"), FORMS,
                         ids=[f"{f[0]} {f[2]}" for f in FORMS])
def test_a_form_does_what_its_tool_does(inst: Instance, other: Instance, target: str,
                                        body: bytes, tool: str, arguments: dict[str, Any],
                                        location: str, setup: Setup) -> None:
    for name, args in setup:
        assert not inst.call_tool(name, args).is_error
        assert not other.call_tool(name, args).is_error
    response = inst.page("POST", target, body)
    direct = other.call_tool(tool, arguments)
    assert not direct.is_error, direct.text
    assert (response.status, response.location) == (303, location), html(response)
    assert last_gui(inst).forms == [FormSubmission(tool=tool, arguments=arguments)]
    assert changes(inst) == changes(other) and changes(inst)
    assert inst.hash() == other.hash() != inst.record.world_hash
    assert inst.page("GET", location).status == 200


# --- refusals -----------------------------------------------------------------------------

REFUSED: list[tuple[str, bytes, str, dict[str, Any]]] = [
    ("/shop/cart/add", form(product_id=46, quantity=50), "shop_add_to_cart",
     {"product_id": 46, "quantity": 50}),
    ("/shop/cart/add", form(product_id=1, quantity=0), "shop_add_to_cart",
     {"product_id": 1, "quantity": 0}),
    ("/shop/cart/add", form(product_id=9999, quantity=1), "shop_add_to_cart",
     {"product_id": 9999, "quantity": 1}),
    ("/shop/cart/update", form(product_id=1, quantity=2), "shop_update_cart_item",
     {"product_id": 1, "quantity": 2}),
    ("/shop/cart/remove", form(product_id=1), "shop_remove_from_cart", {"product_id": 1}),
    ("/shop/checkout", form(shipping_address_id=99), "shop_place_order",
     {"shipping_address_id": 99}),
    ("/shop/orders/2/cancel", form(reason=""), "shop_cancel_order", {"order_id": 2}),
    ("/shop/orders/99/cancel", form(reason="x"), "shop_cancel_order",
     {"order_id": 99, "reason": "x"}),
    ("/shop/addresses", form(label="X", recipient="Y", street="Z", postal_code="1",
                             city="Oslo", country="Norway"), "shop_add_address",
     {"label": "X", "recipient": "Y", "street": "Z", "postal_code": "1", "city": "Oslo",
      "country": "Norway"}),
    ("/chat/conversations/1/send", form(body="   "), "chat_send_message",
     {"conversation_id": 1, "body": "   "}),
    ("/chat/conversations/1/send", form(body=""), "chat_send_message",
     {"conversation_id": 1, "body": ""}),
    ("/chat/conversations/99/send", form(body="hi"), "chat_send_message",
     {"conversation_id": 99, "body": "hi"}),
    ("/chat/conversations/99/read", b"", "chat_mark_read", {"conversation_id": 99}),
    ("/chat/messages/18/unread", b"", "chat_mark_unread", {"message_id": 18}),
    ("/chat/new", form(member_id=2), "chat_create_conversation", {"member_ids": [2]}),
    ("/chat/new", form(member_id=[2, 3]), "chat_create_conversation",
     {"member_ids": [2, 3]}),
]


@pytest.mark.parametrize(("target", "body", "tool", "arguments"), REFUSED,
                         ids=[f"{r[0]} {json.dumps(r[3])}" for r in REFUSED])
def test_a_refused_form_is_a_422_with_the_tools_words(
        inst: Instance, other: Instance, target: str, body: bytes, tool: str,
        arguments: dict[str, Any]) -> None:
    response = inst.page("POST", target, body)
    direct = other.call_tool(tool, arguments)
    assert direct.is_error
    assert response.status == 422
    assert esc(direct.text) in html(response)
    assert last_gui(inst).forms == [FormSubmission(tool=tool, arguments=arguments,
                                                   is_error=True, text=direct.text)]
    assert last_gui(inst).is_error
    assert not changes(inst) and inst.hash() == inst.record.world_hash


def test_an_empty_cart_cannot_be_checked_out(inst: Instance) -> None:
    for product_id in (46, 50):
        assert not inst.call_tool("shop_remove_from_cart", {"product_id": product_id}).is_error
    assert "Your cart is empty" in html(inst.page("GET", "/shop/checkout"))
    before = inst.hash()
    response = inst.page("POST", "/shop/checkout", form(shipping_address_id=1))
    assert response.status == 422 and "Your cart is empty" in html(response)
    assert inst.hash() == before


@pytest.mark.parametrize(("target", "body"), [
    ("/shop/cart/add", form(product_id="abc")), ("/shop/cart/update", form(product_id=46)),
    ("/chat/new", form(member_id="Ingrid"))])
def test_a_malformed_form_calls_no_tool(inst: Instance, target: str, body: bytes) -> None:
    response = inst.page("POST", target, body)
    assert response.status == 422 and "the field" in html(response)
    assert last_gui(inst).forms == [] and not changes(inst)


# --- the cart's arithmetic is the tool's ------------------------------------------------------

CARTS: list[Setup] = [
    [],  # the world's cart: NOK 10,870 -> free shipping
    [("shop_remove_from_cart", {"product_id": 46})],  # NOK 4,290 -> NOK 149 shipping
    [("shop_remove_from_cart", {"product_id": 46}),
     ("shop_add_to_cart", {"product_id": 1, "quantity": 2})],  # NOK 4,988: still shipping
    [("shop_update_cart_item", {"product_id": 46, "quantity": 9}),
     ("shop_add_to_cart", {"product_id": 1, "quantity": 7})],
]


@pytest.mark.parametrize("setup", CARTS, ids=["world", "shipping", "two-lines", "big"])
def test_the_cart_shows_what_get_cart_says(inst: Instance, setup: Setup) -> None:
    for name, args in setup:
        assert not inst.call_tool(name, args).is_error
    cart = inst.call_tool("shop_get_cart", {}).structured
    text = html(inst.page("GET", "/shop/cart"))
    for key in ("subtotal_cents", "shipping_cents", "vat_cents", "total_cents"):
        assert f'<td class="num">{esc(nok(cart[key]))}</td>' in text, key
    for line in cart["items"]:
        assert esc(nok(line["line_total_cents"])) in text
    assert ("Shipping is free from" in text) == (cart["shipping_cents"] > 0)
    checkout = html(inst.page("GET", "/shop/checkout"))
    assert esc(nok(cart["total_cents"])) in checkout


def test_a_placed_order_shows_what_was_charged(inst: Instance) -> None:
    cart = inst.call_tool("shop_get_cart", {}).structured
    response = inst.page("POST", "/shop/checkout", form(shipping_address_id=2))
    assert response.location is not None
    text = html(inst.page("GET", response.location))
    assert "Your order is placed" in text and "Cancel order" in text
    assert esc(nok(cart["total_cents"])) in text and "Nordlys Studio" in text
    assert "Your cart is empty" in html(inst.page("GET", "/shop/cart"))
    cancelled = inst.page("POST", "/shop/orders/3/cancel", form(reason="Oops"))
    text = html(inst.page("GET", cancelled.location or ""))
    assert "The order is cancelled" in text and "Oops" in text
    assert "Cancel order" not in text


# --- photos -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def photo_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Environment]:
    """The demo world with a day 8 that adds a photo of product 46 (the shop's
    ``product_images`` table, which the shipped pages show when a world has it)."""
    root = tmp_path_factory.mktemp("photos")
    events = [
        {"persona": "lars", "day": 8, "ts": "2026-03-10T07:00:00Z", "type": "sql",
         "service": "shop", "sql": "CREATE TABLE product_images(product_id INTEGER PRIMARY "
         "KEY REFERENCES products(id), content_type TEXT NOT NULL, data BLOB NOT NULL, "
         "alt TEXT)"},
        {"persona": "lars", "day": 8, "ts": "2026-03-10T07:00:01Z", "type": "sql",
         "service": "shop", "sql": f"INSERT INTO product_images VALUES (46, 'image/png', "
         f"X'{PNG.hex()}', 'White \"DM3SE\" <speaker>')"},
    ]
    source = root / "lars.jsonl"
    source.write_text(DEMO.read_text(encoding="utf-8")
                      + "".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    with Worlds.open(root / "store") as w:
        w.import_file(source)
        yield Environment(w)


def test_product_photos_show_where_present(photo_env: Environment) -> None:
    with photo_env.open("lars@8") as instance:
        photo = instance.page("GET", "/shop/products/46/photo")
        assert (photo.status, photo.content_type, photo.body) == (200, "image/png", PNG)
        page = html(instance.page("GET", "/shop/products/46"))
        assert ('<img class="photo" src="/shop/products/46/photo" '
                'alt="White &#34;DM3SE&#34; &lt;speaker&gt;">') in page
        assert "No photo" in html(instance.page("GET", "/shop/products/1"))
        assert instance.page("GET", "/shop/products/1/photo").status == 404
        assert 'class="thumb" src="/shop/products/46/photo"' in html(
            instance.page("GET", "/shop/products?brand=Bose"))


# --- headers, determinism and the clock ---------------------------------------------------------


def test_the_csp_forbids_script(inst: Instance) -> None:
    headers = dict(inst.page("GET", "/shop/cart").headers())
    assert headers["Content-Security-Policy"] == CSP
    policy = dict(part.strip().split(" ", 1) for part in CSP.split(";"))
    assert policy["default-src"] == "'none'" and "script-src" not in policy
    assert headers["X-Content-Type-Options"] == "nosniff"


SESSION: list[tuple[str, str, bytes]] = [
    ("GET", "/shop/", b""), ("GET", "/shop/products?q=cable&page=2", b""),
    ("POST", "/shop/cart/add", form(product_id=1, quantity=3)), ("GET", "/shop/cart", b""),
    ("POST", "/shop/checkout", form(shipping_address_id=2)), ("GET", "/shop/orders/3", b""),
    ("POST", "/shop/cart/add", form(product_id=46, quantity=999)),
    ("POST", "/chat/conversations/7/send", form(body="Yes, Spotify works.")),
    ("GET", "/chat/", b""), ("POST", "/chat/conversations/7/read", b""),
    ("GET", "/chat/conversations/7", b""), ("GET", "/nope", b""),
]


def test_the_same_requests_give_the_same_bytes(inst: Instance, other: Instance) -> None:
    for method, target, body in SESSION:
        a, b = inst.page(method, target, body), other.page(method, target, body)
        assert (a.status, a.headers(), a.body) == (b.status, b.headers(), b.body), target
    assert inst.hash() == other.hash()
    assert changes(inst) == changes(other)


def test_pages_tell_time_by_the_calls_clock(inst: Instance, other: Instance) -> None:
    other.set_clock("2026-03-20T12:00:00Z")
    now = html(inst.page("GET", "/chat/"))
    later = html(other.page("GET", "/chat/"))
    assert "(just now)" in now and "(35 min ago)" in now
    assert "(just now)" not in later and "(11 days ago)" in later
    assert last_gui(inst).ts == "2026-03-09T17:05:01Z"
    assert last_gui(other).ts == "2026-03-20T12:00:00Z"
    order = html(other.page("GET", "/shop/orders/2"))
    assert "Mon 9 Mar 2026, 13:05 UTC</time> <span class=\"muted\">(11 days ago)" in order


def test_a_sent_message_is_stamped_by_the_form_call(inst: Instance) -> None:
    inst.set_clock("2026-03-10T08:00:00Z")
    inst.page("POST", "/chat/conversations/7/send", form(body="Morning!"))
    text = html(inst.page("GET", "/chat/conversations/7"))
    assert '<time datetime="2026-03-10T08:00:00Z">Tue 10 Mar 2026, 08:00 UTC</time>' in text
    assert "Morning!" in text and "(just now)" in text
