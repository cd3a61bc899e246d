"""The shipped apps (worldenv/apps) against the real demo world `lars@7`.

Every test gets a fresh mount of the demo's last day. Tools are called directly with a
``ToolContext`` on a plain apsw connection (writes in a transaction that a ToolError rolls
back, as the instance's savepoint does), and every tool is also built into a FastMCP tool.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest
from fastmcp.tools import Tool
from pydantic import BaseModel

from replay import Mount, Worlds
from worldenv.apps import SHIPPED, calendar, chat, notes, shipped_app, shop
from worldenv.apps import _common as apps_common
from worldenv.core.app import ToolContext, ToolError, ToolSpec, bind
from worldstore.sqlcheck import like_escape

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "packs" / "demo" / "world" / "lars.jsonl"
NOW = "2026-03-09T18:00:00Z"
INJECTION = "'); DROP TABLE products;--"
ALL_SPECS = [spec for app in SHIPPED.values() for spec in app.tools.values()]
WRITE_TOOLS = {
    "chat_send_message", "chat_mark_read", "chat_mark_unread", "chat_create_conversation",
    "shop_add_to_cart", "shop_update_cart_item", "shop_remove_from_cart", "shop_add_address",
    "shop_place_order", "shop_cancel_order",
    "calendar_create_event", "calendar_update_event", "calendar_cancel_event",
    "calendar_add_attendee", "calendar_remove_attendee", "calendar_add_contact",
    "notes_create_note", "notes_update_note", "notes_tag_note", "notes_delete_note",
}
TABLES = {
    "chat": {"users", "conversations", "conversation_members", "messages"},
    "shop": {"categories", "products", "users", "addresses", "cart_items", "orders",
             "order_items", "order_status_history"},
    "calendar": {"contacts", "calendars", "events", "attendees", "reminders"},
    "notes": {"notebooks", "notes", "tags", "note_tags"},
}


class World:
    """A mounted demo world with one plain connection per service and a call helper."""

    def __init__(self, mount: Mount) -> None:
        self.mount = mount
        self.conns: dict[str, apsw.Connection] = {}
        self.calls = 0

    def db(self, service: str) -> apsw.Connection:
        if service not in self.conns:
            self.conns[service] = apsw.Connection(str(self.mount.db_path(service)))
        return self.conns[service]

    def run(self, spec: ToolSpec, kwargs: dict[str, Any]) -> Any:
        conn = self.db(spec.service)
        ctx = ToolContext(conn, NOW, self.calls)
        self.calls += 1
        if not spec.writes:
            return spec.fn(ctx, **kwargs)
        conn.execute("BEGIN")
        try:
            result = spec.fn(ctx, **kwargs)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return result

    def __call__(self, service: str, tool: str, **kwargs: Any) -> Any:
        return self.run(shipped_app(service).tools[tool], kwargs)

    def rows(self, service: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return list(self.db(service).execute(sql, params))

    def value(self, service: str, sql: str, params: tuple[Any, ...] = ()) -> Any:
        row = self.db(service).execute(sql, params).fetchone()
        return None if row is None else row[0]

    def tables(self, service: str) -> set[str]:
        return {r[0] for r in self.rows(service, "SELECT name FROM sqlite_schema "
                                                  "WHERE type = 'table'")}

    def close(self) -> None:
        for conn in self.conns.values():
            conn.close()
        self.conns.clear()


@pytest.fixture(scope="module")
def worlds(demo_worlds: Worlds) -> Worlds:
    return demo_worlds


def _mount(worlds: Worlds, dest: Path) -> World:
    return World(worlds.mount("lars@7", dest))


@pytest.fixture
def w(worlds: Worlds, tmp_path: Path) -> Iterator[World]:
    world = _mount(worlds, tmp_path / "mount")
    yield world
    world.close()
    world.mount.close()


def fails(world: World, service: str, tool: str, message: str, **kwargs: Any) -> None:
    with pytest.raises(ToolError, match=re.escape(message)):
        world(service, tool, **kwargs)


def ids(page: Any) -> list[int]:
    return [item.id for item in page.items]


# --- registry and schemas ---------------------------------------------------------------


def test_registry_pins_each_module_source() -> None:
    assert sorted(SHIPPED) == ["calendar", "chat", "notes", "shop"]
    modules = {"chat": chat, "shop": shop, "calendar": calendar, "notes": notes}
    for service, module in modules.items():
        app = shipped_app(service)
        assert app is module.app and app.service == service
        # the module's own code and the shared helpers it runs
        assert app.source == (inspect.getsource(module) + inspect.getsource(apps_common)
                              + inspect.getsource(like_escape))
        assert len(app.digest) > 16
    assert len({app.digest for app in SHIPPED.values()}) == 4
    with pytest.raises(KeyError, match="calendar, chat, notes, shop"):
        shipped_app("mail")


def test_tool_count_names_and_write_flags() -> None:
    names = [spec.full_name for spec in ALL_SPECS]
    assert len(names) >= 25
    assert len(set(names)) == len(names)
    for spec in ALL_SPECS:
        assert re.fullmatch(r"[a-z]+(_[a-z]+)+", spec.name), spec.name
        assert spec.full_name.startswith(spec.service + "_")
        assert spec.writes == (spec.full_name in WRITE_TOOLS), spec.full_name
    assert set(names) >= WRITE_TOOLS
    for app in SHIPPED.values():
        assert 7 <= len(app.tools) <= 14, app.service


@pytest.mark.parametrize("spec", ALL_SPECS, ids=lambda s: s.full_name)
def test_every_tool_builds_into_a_fastmcp_tool(spec: ToolSpec) -> None:
    tool = Tool.from_function(bind(spec, lambda s, k: None), name=spec.full_name,
                              description=spec.description)
    assert tool.name == spec.full_name and tool.description == spec.description
    expected = list(inspect.signature(spec.fn).parameters)[1:]
    props = tool.parameters.get("properties", {})
    assert list(props) == expected
    for name, schema in props.items():
        assert schema.get("description"), f"{spec.full_name}.{name} has no description"
    assert tool.output_schema is not None
    assert tool.output_schema.get("type") == "object"
    if "limit" in props:
        assert props["limit"]["minimum"] == 1 and props["limit"]["maximum"] == 100
        assert props["limit"]["default"] == 20
        assert props["offset"]["minimum"] == 0 and props["offset"]["default"] == 0
        for key in ("items", "total"):
            assert key in tool.output_schema["properties"], spec.full_name


def test_list_and_search_tools_page() -> None:
    for spec in ALL_SPECS:
        if spec.name.startswith(("list_", "search_")):
            assert {"limit", "offset"} <= set(inspect.signature(spec.fn).parameters), spec.name


def test_fastmcp_tools_run_against_the_world(w: World) -> None:
    tools = {spec.full_name: Tool.from_function(bind(spec, w.run), name=spec.full_name,
                                                description=spec.description)
             for spec in ALL_SPECS}

    async def go() -> None:
        found = await tools["chat_search_messages"].run({"query": "approved", "limit": 5})
        assert found.structured_content is not None
        assert 29 in [m["id"] for m in found.structured_content["items"]]
        order = await tools["shop_get_order"].run({"order_number": "AVL-2026-10533"})
        assert order.structured_content is not None
        assert order.structured_content["total_cents"] == 14970625
        with pytest.raises(Exception, match="limit"):
            await tools["notes_list_notes"].run({"limit": 0})
        with pytest.raises(Exception, match="sent_from"):
            await tools["chat_search_messages"].run({"query": "x", "sent_from": "March 4"})

    asyncio.run(go())


# --- chat --------------------------------------------------------------------------------


def test_chat_list_conversations(w: World) -> None:
    page = w("chat", "list_conversations")
    assert page.total == 7 and len(page.items) == 7
    assert ids(page)[:3] == [7, 4, 6]  # latest activity first (17:05, 16:30, 15:47)
    first = page.items[0]
    assert first.title == "Sofie Nilsen" and first.kind == "direct"
    assert first.last_message.id == 67 and first.unread_count == 1
    unread = w("chat", "list_conversations", unread_only=True)
    assert ids(unread) == [7, 4, 6] and unread.total == 3
    group = w("chat", "list_conversations", kind="group")
    assert ids(group) == [6] and group.items[0].title == "Nordlys - Fjellrommet AV"
    assert {m.user_id for m in group.items[0].members} == {1, 2, 3, 6}
    assert ids(w("chat", "list_conversations", with_user_id=6)) == [6]
    paged = w("chat", "list_conversations", limit=2, offset=2)
    assert paged.total == 7 and ids(paged) == ids(page)[2:4]


def test_chat_read_conversation(w: World) -> None:
    thread = w("chat", "read_conversation", conversation_id=1)
    total = w.value("chat", "SELECT COUNT(*) FROM messages WHERE conversation_id = 1")
    assert thread.total == total and len(thread.items) == min(20, total)
    assert thread.items[-1].id == 63 and thread.items[-1].is_own
    assert [m.sent_at for m in thread.items] == sorted(m.sent_at for m in thread.items)
    older = w("chat", "read_conversation", conversation_id=1, limit=5, offset=total - 5)
    assert older.items[0].id == 1 and older.items[0].sender_name == "Ingrid Solberg"
    assert thread.conversation.title == "Ingrid Solberg"
    # reading changes nothing
    assert w.value("chat", "SELECT COUNT(*) FROM messages WHERE is_read = 0") == 3


def test_chat_search_messages_finds_the_approval(w: World) -> None:
    found = w("chat", "search_messages", query="approved")
    assert 29 in ids(found)
    approval = next(m for m in found.items if m.id == 29)
    assert approval.conversation_id == 1 and approval.sender_id == 2
    assert approval.sent_at == "2026-03-04T08:47:00Z" and "NS-PO-2026-031" in approval.body
    narrow = w("chat", "search_messages", query="APPROVED q-2026-014", conversation_id=1,
               sender_id=2, sent_from="2026-03-04", sent_to="2026-03-04")
    assert ids(narrow) == [29] and narrow.total == 1
    assert ids(w("chat", "search_messages", query="Q-2026-014", sent_to="2026-03-03")) == [23]
    unread = w("chat", "search_messages", query="Spotify", unread_only=True)
    assert ids(unread) == [67]
    assert w("chat", "search_messages", query="%").total == 0  # wildcards are literal
    assert w("chat", "search_messages", query="tracking", limit=1).total >= 2


def test_chat_send_message(w: World) -> None:
    sent = w("chat", "send_message", conversation_id=4, body="Saturday 28 March works!")
    assert sent.id == 68 and sent.is_own and sent.is_read and sent.sent_at == NOW
    assert w.rows("chat", "SELECT conversation_id, sender_id, body, sent_at, is_read, "
                          "created_at, updated_at FROM messages WHERE id = 68") == [
        (4, 1, "Saturday 28 March works!", NOW, 1, NOW, NOW)]
    assert w.value("chat", "SELECT updated_at FROM conversations WHERE id = 4") == NOW
    assert ids(w("chat", "list_conversations", limit=1)) == [4]
    fails(w, "chat", "send_message", "body must not be empty", conversation_id=4, body="  ")


def test_chat_mark_read_and_unread(w: World) -> None:
    result = w("chat", "mark_read", conversation_id=4)
    assert (result.marked_read, result.unread_count) == (1, 0)
    assert w.rows("chat", "SELECT is_read, updated_at FROM messages WHERE id = 66") == [(1, NOW)]
    assert w("chat", "mark_read", conversation_id=4).marked_read == 0
    again = w("chat", "mark_unread", message_id=29)
    assert again.id == 29 and not again.is_read
    assert w.value("chat", "SELECT is_read FROM messages WHERE id = 29") == 0
    partial = w("chat", "mark_read", conversation_id=1, up_to_message_id=24)
    assert partial.marked_read == 0 and partial.unread_count == 1
    assert w("chat", "mark_read", conversation_id=1, up_to_message_id=29).marked_read == 1
    fails(w, "chat", "mark_unread", "Message 63 is your own", message_id=63)
    fails(w, "chat", "mark_read", "No message with id 66 in conversation 1",
          conversation_id=1, up_to_message_id=66)


def test_chat_list_users(w: World) -> None:
    everyone = w("chat", "list_users")
    assert everyone.total == 8 and ids(everyone)[0] == 1
    assert ids(w("chat", "list_users", query="nordlys")) == [2, 6]
    assert ids(w("chat", "list_users", query="electrician")) == [7]
    assert ids(w("chat", "list_users", query="bakeriet sofie")) == [8]


def test_chat_create_conversation(w: World) -> None:
    group = w("chat", "create_conversation", member_ids=[8, 4], title="Easter concert",
              first_message="Hi both!")
    assert group.id == 8 and group.kind == "group" and group.title == "Easter concert"
    assert [(m.user_id, m.role) for m in group.members] == [(1, "owner"), (4, "member"),
                                                             (8, "member")]
    assert group.last_message is not None and group.last_message.body == "Hi both!"
    assert group.created_at == NOW
    direct = w("chat", "create_conversation", member_ids=[1, 7, 7], title="Strand")
    assert direct.kind == "group"
    fails(w, "chat", "create_conversation",
          "You already have a direct conversation with Ingrid Solberg (conversation 1)",
          member_ids=[2])
    fails(w, "chat", "create_conversation", "A group conversation needs a title",
          member_ids=[2, 3])
    fails(w, "chat", "create_conversation", "at least one other user", member_ids=[1])
    assert w.value("chat", "SELECT COUNT(*) FROM conversations") == 9


def test_chat_scoping_hides_other_peoples_conversations(w: World) -> None:
    db = w.db("chat")
    db.execute("INSERT INTO conversations VALUES (8, 'direct', NULL, 2, ?, ?)", (NOW, NOW))
    db.execute("INSERT INTO conversation_members VALUES (8, 2, 'owner', ?), (8, 3, 'member', ?)",
               (NOW, NOW))
    db.execute("INSERT INTO messages VALUES (68, 8, 2, 'secret budget for Mats', ?, 0, ?, ?)",
               (NOW, NOW, NOW))
    assert w("chat", "list_conversations").total == 7
    assert w("chat", "list_conversations", with_user_id=3).total == 2
    assert w("chat", "search_messages", query="secret budget").total == 0
    hidden: list[tuple[str, dict[str, Any]]] = [
        ("read_conversation", {"conversation_id": 8}),
        ("send_message", {"conversation_id": 8, "body": "hi"}),
        ("mark_read", {"conversation_id": 8}),
        ("search_messages", {"query": "secret", "conversation_id": 8})]
    for tool, kwargs in hidden:
        fails(w, "chat", tool, "No conversation with id 8", **kwargs)
    fails(w, "chat", "mark_unread", "No message with id 68", message_id=68)
    assert w.value("chat", "SELECT is_read FROM messages WHERE id = 68") == 0
    assert w.value("chat", "SELECT COUNT(*) FROM messages") == 68


# --- shop ---------------------------------------------------------------------------------


def test_shop_categories_and_products(w: World) -> None:
    cats = w("shop", "list_categories")
    assert cats.total == 14 and sum(c.product_count for c in cats.items) == 74
    found = w("shop", "search_products", query="QM75C")
    assert found.total == 1
    display = found.items[0]
    assert (display.sku, display.price_cents, display.category_slug) == (
        "DIS-SAM-QM75C", 2199000, "displays")
    assert display.stock == 5  # 6 at day 0, one ordered on day 5
    assert w("shop", "search_products", category="displays").total == 4
    assert ids(w("shop", "search_products", query="ceiling speaker")) == [42]
    shure = w("shop", "search_products", brand="shure", sort="price_desc")
    assert [p.price_cents for p in shure.items] == sorted(
        (p.price_cents for p in shure.items), reverse=True) and shure.total == 4
    cheap = w("shop", "search_products", max_price_cents=10000, sort="price_asc")
    assert cheap.items[0].sku == "CBL-CAT6-P3"
    assert all(p.price_cents <= 10000 for p in cheap.items)
    assert w("shop", "search_products", min_price_cents=3000000).total == 2
    in_stock = w("shop", "search_products", category="conferencing", in_stock_only=True)
    assert "CAM-YEA-UVC86" not in {p.sku for p in in_stock.items}  # sold out after day 5
    page = w("shop", "search_products", limit=10, offset=70)
    assert page.total == 74 and len(page.items) == 4
    fails(w, "shop", "search_products", "No category 'tvs'; known categories: cables",
          category="tvs")


def test_shop_get_product(w: World) -> None:
    by_id = w("shop", "get_product", product_id=55)
    by_sku = w("shop", "get_product", sku="wps-bar-cx30")
    assert by_id == by_sku and by_id.sku == "WPS-BAR-CX30" and by_id.stock == 2
    fails(w, "shop", "get_product", "Give exactly one of product_id and sku")
    fails(w, "shop", "get_product", "Give exactly one", product_id=1, sku="CBL-HDMI-2M")


def test_shop_cart(w: World) -> None:
    cart = w("shop", "get_cart")
    assert [(line.sku, line.quantity) for line in cart.items] == [
        ("SPK-BOS-DM3SE", 2), ("AMP-QSC-SPA2-60", 1)]
    assert cart.subtotal_cents == 2 * 329000 + 429000 and cart.shipping_cents == 0
    assert cart.vat_cents == cart.subtotal_cents // 4
    assert cart.total_cents == cart.subtotal_cents + cart.vat_cents
    cart = w("shop", "add_to_cart", product_id=35, quantity=1)  # MIC-SHU-BLX24
    assert cart.items[-1].sku == "MIC-SHU-BLX24" and cart.items[-1].cart_item_id == 22
    assert cart.items[-1].added_at == NOW
    cart = w("shop", "add_to_cart", product_id=35, quantity=2)
    assert cart.items[-1].quantity == 3 and len(cart.items) == 3
    cart = w("shop", "update_cart_item", product_id=46, quantity=3)
    assert cart.items[0].quantity == 3 and cart.items[0].updated_at == NOW
    cart = w("shop", "remove_from_cart", product_id=50)
    assert [line.sku for line in cart.items] == ["SPK-BOS-DM3SE", "MIC-SHU-BLX24"]
    fails(w, "shop", "add_to_cart", "Product 61 has only 0 in stock", product_id=61)
    fails(w, "shop", "update_cart_item", "Product 46 has only 9 in stock",
          product_id=46, quantity=10)
    fails(w, "shop", "update_cart_item", "Product 50 is not in your cart",
          product_id=50, quantity=1)
    fails(w, "shop", "remove_from_cart", "Product 50 is not in your cart", product_id=50)
    fails(w, "shop", "add_to_cart", "quantity must be between 1 and 999",
          product_id=1, quantity=0)
    assert w.value("shop", "SELECT quantity FROM cart_items WHERE product_id = 46") == 3


def test_shop_small_cart_pays_shipping(w: World) -> None:
    w("shop", "remove_from_cart", product_id=46)
    cart = w("shop", "update_cart_item", product_id=50, quantity=1)
    assert cart.subtotal_cents == 429000 and cart.shipping_cents == 14900
    assert cart.vat_cents == (429000 + 14900) // 4


def test_shop_place_order_from_the_cart(w: World) -> None:
    stock_before = dict(w.rows("shop", "SELECT id, stock FROM products"))
    order = w("shop", "place_order", shipping_address_id=2)
    assert order.id == 3 and order.order_number == "AVL-2026-10534"
    assert order.status == "placed" and order.placed_at == NOW
    assert order.shipping_address.label == "Nordlys Studio"
    assert [(i.id, i.sku, i.quantity, i.line_total_cents) for i in order.items] == [
        (19, "SPK-BOS-DM3SE", 2, 658000), (20, "AMP-QSC-SPA2-60", 1, 429000)]
    assert (order.subtotal_cents, order.shipping_cents, order.vat_cents, order.total_cents) == (
        1087000, 0, 271750, 1358750)
    assert [(h.status, h.note, h.changed_at) for h in order.history] == [
        ("placed", "Order received", NOW)]
    stock_after = dict(w.rows("shop", "SELECT id, stock FROM products"))
    assert stock_after[46] == stock_before[46] - 2 and stock_after[50] == stock_before[50] - 1
    assert {k for k in stock_after if stock_after[k] != stock_before[k]} == {46, 50}
    assert w.value("shop", "SELECT updated_at FROM products WHERE id = 46") == NOW
    assert w("shop", "get_cart").items == []
    assert w.rows("shop", "SELECT id, order_id, status, changed_at FROM order_status_history "
                          "WHERE id = 7") == [(7, 3, "placed", NOW)]
    assert w.rows("shop", "SELECT created_at, updated_at, carrier FROM orders WHERE id = 3") == [
        (NOW, NOW, None)]
    fails(w, "shop", "place_order", "Your cart is empty")
    w("shop", "add_to_cart", product_id=1, quantity=1)
    second = w("shop", "place_order")  # default address: the workshop
    assert second.order_number == "AVL-2026-10535" and second.shipping_address.id == 1
    assert second.shipping_cents == 14900


def test_shop_place_order_refuses_without_stock(w: World) -> None:
    w.db("shop").execute("UPDATE products SET stock = 1 WHERE id = 46")
    fails(w, "shop", "place_order", "Product 46 has only 1 in stock")
    assert w.value("shop", "SELECT COUNT(*) FROM orders") == 2
    assert w.value("shop", "SELECT COUNT(*) FROM cart_items") == 2
    assert w.value("shop", "SELECT stock FROM products WHERE id = 50") == 7
    fails(w, "shop", "place_order", "No address with id 9", shipping_address_id=9)


def test_shop_list_and_get_orders(w: World) -> None:
    orders = w("shop", "list_orders")
    assert orders.total == 2 and ids(orders) == [2, 1]
    latest = orders.items[0]
    assert latest.order_number == "AVL-2026-10533" and latest.status == "delivered"
    assert latest.line_count == 15 and latest.total_cents == 14970625
    assert latest.tracking_number == "70730259304981756" and latest.carrier == "Bring"
    assert ids(w("shop", "list_orders", status="delivered")) == [2, 1]
    assert w("shop", "list_orders", status="placed").total == 0
    assert ids(w("shop", "list_orders", placed_from="2026-03-05")) == [2]
    assert ids(w("shop", "list_orders", placed_to="2026-03-02")) == [1]
    assert ids(w("shop", "list_orders", contains_product_id=70)) == [1]  # gaffer tape
    order = w("shop", "get_order", order_id=2)
    assert [i.id for i in order.items] == list(range(4, 19))
    assert (order.subtotal_cents, order.shipping_cents, order.vat_cents) == (11976500, 0, 2994125)
    assert [h.status for h in order.history] == ["placed", "shipped", "delivered"]
    assert order.shipping_address.id == 2
    assert w("shop", "get_order", order_number="AVL-2026-10417").id == 1
    fails(w, "shop", "get_order", "Give exactly one of order_id and order_number")


def test_shop_cancel_order(w: World) -> None:
    fails(w, "shop", "cancel_order", "Order 2 is already delivered and can't be cancelled",
          order_id=2)
    stock_before = dict(w.rows("shop", "SELECT id, stock FROM products"))
    placed = w("shop", "place_order", shipping_address_id=2)
    cancelled = w("shop", "cancel_order", order_id=placed.id, reason="Client changed plans")
    assert cancelled.status == "cancelled" and cancelled.updated_at == NOW
    assert [(h.status, h.note) for h in cancelled.history] == [
        ("placed", "Order received"), ("cancelled", "Client changed plans")]
    assert dict(w.rows("shop", "SELECT id, stock FROM products")) == stock_before
    fails(w, "shop", "cancel_order", f"Order {placed.id} is already cancelled",
          order_id=placed.id)
    assert ids(w("shop", "list_orders", status="cancelled")) == [placed.id]


def test_shop_addresses(w: World) -> None:
    book = w("shop", "list_addresses")
    assert book.total == 2 and ids(book) == [1, 2] and book.items[0].is_default
    added = w("shop", "add_address", label="Bakeriet Fjord", recipient="Sofie Nilsen",
              street="Thorvald Meyers gate 40", postal_code="0555", city="Oslo",
              company="Bakeriet Fjord", phone="+47 915 67 208", make_default=True)
    assert added.id == 3 and added.is_default and added.country == "NO"
    assert ids(w("shop", "list_addresses")) == [3, 1, 2]
    assert w.value("shop", "SELECT COUNT(*) FROM addresses WHERE is_default = 1") == 1
    fails(w, "shop", "add_address", "country must be a 2-letter code", label="x",
          recipient="x", street="x", postal_code="1", city="x", country="N1")
    fails(w, "shop", "add_address", "label must not be empty", label=" ", recipient="x",
          street="x", postal_code="1", city="x")


def test_shop_scoping_hides_other_users(w: World) -> None:
    db = w.db("shop")
    db.execute("INSERT INTO users VALUES (2, 'Other Buyer', 'other@example.no', NULL, NULL, "
               "NULL, ?, ?)", (NOW, NOW))
    db.execute("INSERT INTO addresses VALUES (3, 2, 'Home', 'Other Buyer', NULL, 'Gate 1', "
               "'0150', 'Oslo', 'NO', NULL, 1, ?, ?)", (NOW, NOW))
    db.execute("INSERT INTO orders VALUES (3, 2, 'AVL-2026-10600', 'placed', 3, 100, 0, 25, "
               "125, NULL, NULL, ?, NULL, NULL, ?, ?)", (NOW, NOW, NOW))
    db.execute("INSERT INTO cart_items VALUES (22, 2, 1, 5, ?, ?)", (NOW, NOW))
    assert w("shop", "list_orders").total == 2
    assert w("shop", "list_addresses").total == 2
    assert len(w("shop", "get_cart").items) == 2
    fails(w, "shop", "get_order", "No order with id 3", order_id=3)
    fails(w, "shop", "get_order", "No order with number 'AVL-2026-10600'",
          order_number="AVL-2026-10600")
    fails(w, "shop", "cancel_order", "No order with id 3", order_id=3)
    fails(w, "shop", "place_order", "No address with id 3", shipping_address_id=3)
    order = w("shop", "place_order")
    assert order.order_number == "AVL-2026-10601"  # numbers are unique shop-wide
    assert w.value("shop", "SELECT COUNT(*) FROM cart_items WHERE user_id = 2") == 1


# --- calendar ----------------------------------------------------------------------------


def test_calendar_list_calendars_and_events(w: World) -> None:
    cals = w("calendar", "list_calendars")
    assert [c.name for c in cals.items] == ["Jobs", "Admin & invoicing", "Personal"]
    events = w("calendar", "list_events", limit=100)
    assert events.total == 11 and 7 not in ids(events)
    assert ids(events)[:3] == [1, 3, 2]
    assert w("calendar", "list_events", include_cancelled=True).total == 12
    assert ids(w("calendar", "list_events", status="cancelled")) == [7]
    install = w("calendar", "list_events", date_from="2026-03-12", date_to="2026-03-13")
    assert ids(install) == [9, 10]
    assert install.items[0].start_at == "2026-03-12T08:00:00+01:00"
    assert ids(w("calendar", "list_events", calendar_id=3)) == [2, 6, 5]
    assert ids(w("calendar", "list_events", attendee_id=3)) == [9, 10]
    assert ids(w("calendar", "list_events", query="fjord")) == [12]
    assert ids(w("calendar", "list_events", date_from="2026-03-10", limit=2, offset=1)) == [12, 9]


def test_calendar_get_event(w: World) -> None:
    event = w("calendar", "get_event", event_id=9)
    assert event.title == "Nordlys install - day 1" and event.calendar_name == "Jobs"
    assert (event.start_at, event.end_at) == ("2026-03-12T08:00:00+01:00",
                                              "2026-03-12T16:00:00+01:00")
    assert [(a.contact_id, a.response) for a in event.attendees] == [
        (1, "accepted"), (3, "accepted"), (2, "accepted"), (6, "accepted")]
    assert [r.minutes_before for r in event.reminders] == [1440, 60]
    cancelled = w("calendar", "get_event", event_id=7)
    assert cancelled.status == "cancelled"
    assert cancelled.description == "Not needed - quote approved 2026-03-04."


def test_calendar_create_event(w: World) -> None:
    event = w("calendar", "create_event", calendar_id=1, title="Sagene Scene - Easter concert",
              start_at="2026-03-28T17:00", end_at="2026-03-28T22:30:00Z",
              location="Sagene Scene", attendee_ids=[4, 3, 4], reminder_minutes=[60, 1440],
              status="tentative")
    assert event.id == 13 and event.status == "tentative" and event.created_at == NOW
    assert (event.start_at, event.end_at) == ("2026-03-28T17:00:00+01:00",
                                              "2026-03-28T23:30:00+01:00")
    assert [(a.contact_id, a.response) for a in event.attendees] == [
        (1, "accepted"), (4, "needs_action"), (3, "needs_action")]
    assert [r.minutes_before for r in event.reminders] == [1440, 60]
    summer = w("calendar", "create_event", calendar_id=3, title="Holiday",
               start_at="2026-07-01", end_at="2026-07-14", all_day=True)
    assert summer.all_day and not summer.attendees
    assert (summer.start_at, summer.end_at) == ("2026-07-01T00:00:00+02:00",
                                                "2026-07-14T23:59:59+02:00")
    fails(w, "calendar", "create_event", "end_at 2026-03-28T16:00:00+01:00 is before start_at",
          calendar_id=1, title="x", start_at="2026-03-28T17:00", end_at="2026-03-28T16:00")
    fails(w, "calendar", "create_event", "start_at must be an ISO 8601 date-time",
          calendar_id=1, title="x", start_at="next friday", end_at="2026-03-28T16:00")
    fails(w, "calendar", "create_event", "reminder minutes must be between 0 and 40320",
          calendar_id=1, title="x", start_at="2026-03-28T17:00", end_at="2026-03-28T18:00",
          reminder_minutes=[-5])
    assert w.value("calendar", "SELECT COUNT(*) FROM events") == 14


def test_calendar_update_event(w: World) -> None:
    moved = w("calendar", "update_event", event_id=12, start_at="2026-03-10T14:30",
              reminder_minutes=[30], title="Site visit - Bakeriet Fjord (café)")
    assert (moved.start_at, moved.end_at) == ("2026-03-10T14:30:00+01:00",
                                              "2026-03-10T15:30:00+01:00")
    assert moved.title.endswith("(café)") and moved.updated_at == NOW
    assert [r.minutes_before for r in moved.reminders] == [30]
    assert w.value("calendar", "SELECT COUNT(*) FROM reminders WHERE event_id = 12") == 1
    moved = w("calendar", "update_event", event_id=12, calendar_id=2, location="",
              status="tentative")
    assert moved.calendar_id == 2 and moved.location is None and moved.status == "tentative"
    fails(w, "calendar", "update_event", "Event 7 is cancelled and can't be changed",
          event_id=7, title="x")
    fails(w, "calendar", "update_event", "Nothing to update", event_id=12)
    fails(w, "calendar", "update_event", "is before start_at", event_id=12,
          end_at="2026-03-10T09:00")
    fails(w, "calendar", "update_event", "No calendar with id 9", event_id=12, calendar_id=9)


def test_calendar_cancel_event(w: World) -> None:
    event = w("calendar", "cancel_event", event_id=12, reason="Sofie postponed")
    assert event.status == "cancelled" and event.description == "Sofie postponed"
    assert event.updated_at == NOW
    assert 12 not in ids(w("calendar", "list_events"))
    fails(w, "calendar", "cancel_event", "Event 12 is already cancelled", event_id=12)
    kept = w("calendar", "cancel_event", event_id=11)
    assert kept.description and kept.description.startswith("Count the 9 parcels")


def test_calendar_attendees(w: World) -> None:
    event = w("calendar", "add_attendee", event_id=12, contact_id=4)
    assert [(a.contact_id, a.response) for a in event.attendees][-1] == (4, "needs_action")
    event = w("calendar", "add_attendee", event_id=12, contact_id=4, response="accepted")
    assert [(a.contact_id, a.response) for a in event.attendees][-1] == (4, "accepted")
    fails(w, "calendar", "add_attendee", "Contact 4 is already an attendee of event 12",
          event_id=12, contact_id=4, response="accepted")
    solo = w("calendar", "add_attendee", event_id=2, contact_id=3)
    assert [a.contact_id for a in solo.attendees] == [1, 3]  # you join as organiser
    event = w("calendar", "remove_attendee", event_id=12, contact_id=4)
    assert [a.contact_id for a in event.attendees] == [1, 8]
    fails(w, "calendar", "remove_attendee", "Contact 4 is not an attendee of event 12",
          event_id=12, contact_id=4)
    fails(w, "calendar", "remove_attendee", "You can't remove yourself", event_id=12,
          contact_id=1)
    fails(w, "calendar", "add_attendee", "Event 7 is cancelled", event_id=7, contact_id=2)


def test_calendar_contacts(w: World) -> None:
    assert w("calendar", "list_contacts").total == 8
    assert ids(w("calendar", "list_contacts", query="nordlysstudio")) == [2, 6]
    added = w("calendar", "add_contact", name="Ola Nordmann", email="ola@example.no",
              company="Kulturnatt")
    assert added.id == 9 and added.email == "ola@example.no"
    assert w.value("calendar", "SELECT created_at FROM contacts WHERE id = 9") == NOW
    fails(w, "calendar", "add_contact", "Contact 2 already has the email",
          name="Ingrid 2", email="INGRID@nordlysstudio.no")
    fails(w, "calendar", "add_contact", "is not an email address", name="x", email="nope")


def test_calendar_scoping_hides_other_calendars(w: World) -> None:
    db = w.db("calendar")
    db.execute("INSERT INTO calendars VALUES (4, 2, 'Ingrid private', '#000', 'Europe/Oslo', "
               "?, ?)", (NOW, NOW))
    db.execute("INSERT INTO events VALUES (13, 4, 'Ingrid: job interview', NULL, NULL, "
               "'2026-03-12T09:00:00+01:00', '2026-03-12T10:00:00+01:00', 0, 'confirmed', "
               "?, ?)", (NOW, NOW))
    assert w("calendar", "list_calendars").total == 3
    assert 13 not in ids(w("calendar", "list_events", include_cancelled=True, limit=100))
    hidden: list[tuple[str, dict[str, Any]]] = [
        ("get_event", {"event_id": 13}),
        ("update_event", {"event_id": 13, "title": "x"}),
        ("cancel_event", {"event_id": 13}),
        ("add_attendee", {"event_id": 13, "contact_id": 1}),
        ("remove_attendee", {"event_id": 13, "contact_id": 2})]
    for tool, kwargs in hidden:
        fails(w, "calendar", tool, "No event with id 13", **kwargs)
    fails(w, "calendar", "create_event", "No calendar with id 4", calendar_id=4, title="x",
          start_at="2026-03-12T09:00", end_at="2026-03-12T10:00")
    fails(w, "calendar", "list_events", "No calendar with id 4", calendar_id=4)


# --- notes -------------------------------------------------------------------------------


def test_notes_notebooks_and_tags(w: World) -> None:
    books = w("notes", "list_notebooks")
    assert [(b.name, b.note_count) for b in books.items] == [
        ("Jobs", 7), ("Admin", 1), ("Gear & van", 1), ("Ideas", 0)]
    tags = w("notes", "list_tags", limit=100)
    assert tags.total == 10
    counts = {t.name: t.note_count for t in tags.items}
    assert counts["nordlys"] == 5 and counts["ideas"] == 0


def test_notes_list_and_search(w: World) -> None:
    page = w("notes", "list_notes")
    assert page.total == 9 and ids(page)[:3] == [10, 4, 1]  # pinned first, newest first
    assert 3 not in ids(page)  # deleted on day 6
    assert ids(w("notes", "list_notes", tag="nordlys")) == [10, 4, 7, 8, 5]
    assert ids(w("notes", "list_notes", notebook_id=1, pinned_only=True)) == [10, 4]
    assert ids(w("notes", "list_notes", tag="Checklist", notebook_id=3)) == [1]
    assert page.items[0].tags == ["checklist", "nordlys"]
    assert len(page.items[0].snippet) <= 160
    assert ids(w("notes", "search_notes", query="vlan 40")) == [10, 8]
    assert ids(w("notes", "search_notes", query="VLAN", tag="network")) == [8]
    assert ids(w("notes", "search_notes", query="PFW 6852")) == [7]
    assert w("notes", "search_notes", query="_").total == 0
    note = w("notes", "get_note", note_id=8)
    assert note.title == "Nordlys - network details (from Erik)"
    assert "10.40.0.11 Shure P300" in note.body and note.tags == ["network", "nordlys"]


def test_notes_create_update_tag_delete(w: World) -> None:
    note = w("notes", "create_note", notebook_id=1, title="Sagene - Easter concert",
             body="- [ ] Confirm date with Kari", tags=["sagene", " Easter  Gig ", "sagene"])
    assert note.id == 11 and note.tags == ["easter gig", "sagene"] and note.created_at == NOW
    assert w.value("notes", "SELECT id FROM tags WHERE name = 'easter gig'") == 11
    note = w("notes", "update_note", note_id=11, append="- [ ] Book Mats")
    assert note.body == "- [ ] Confirm date with Kari\n- [ ] Book Mats"
    note = w("notes", "update_note", note_id=11, title="Easter concert", pinned=True,
             notebook_id=2)
    assert (note.title, note.is_pinned, note.notebook_name) == ("Easter concert", True, "Admin")
    note = w("notes", "tag_note", note_id=11, add=["todo"], remove=["easter gig"])
    assert note.tags == ["sagene", "todo"]
    archived = w("notes", "update_note", note_id=2, archived=True)
    assert archived.is_archived and archived.updated_at == NOW
    assert 2 not in ids(w("notes", "list_notes"))
    assert 2 in ids(w("notes", "list_notes", include_archived=True))
    fails(w, "notes", "update_note", "Nothing to update", note_id=11)
    fails(w, "notes", "update_note", "Give body or append, not both", note_id=11, body="a",
          append="b")
    fails(w, "notes", "tag_note", "Note 11 has no tag 'gear'", note_id=11, remove=["gear"])
    fails(w, "notes", "tag_note", "Give at least one tag", note_id=11)
    gone = w("notes", "delete_note", note_id=7)
    assert gone.deleted and gone.title == "Nordlys - ordering checklist"
    assert w.value("notes", "SELECT COUNT(*) FROM note_tags WHERE note_id = 7") == 0
    assert w.value("notes", "SELECT COUNT(*) FROM notes WHERE id = 7") == 0
    fails(w, "notes", "delete_note", "No note with id 7", note_id=7)


# --- errors, injection, determinism --------------------------------------------------------

MISSING = [
    ("chat", "read_conversation", {"conversation_id": 99}, "No conversation with id 99"),
    ("chat", "send_message", {"conversation_id": 99, "body": "x"}, "No conversation with id 99"),
    ("chat", "mark_read", {"conversation_id": 99}, "No conversation with id 99"),
    ("chat", "mark_unread", {"message_id": 999}, "No message with id 999"),
    ("chat", "search_messages", {"query": "x", "conversation_id": 99},
     "No conversation with id 99"),
    ("chat", "create_conversation", {"member_ids": [42]}, "No user with id 42"),
    ("shop", "get_product", {"product_id": 999}, "No product with id 999"),
    ("shop", "get_product", {"sku": "NOPE-1"}, "No product with SKU 'NOPE-1'"),
    ("shop", "add_to_cart", {"product_id": 999}, "No product with id 999"),
    ("shop", "update_cart_item", {"product_id": 999, "quantity": 1}, "No product with id 999"),
    ("shop", "remove_from_cart", {"product_id": 999}, "No product with id 999"),
    ("shop", "get_order", {"order_id": 99}, "No order with id 99"),
    ("shop", "get_order", {"order_number": "AVL-1"}, "No order with number 'AVL-1'"),
    ("shop", "cancel_order", {"order_id": 99}, "No order with id 99"),
    ("shop", "place_order", {"shipping_address_id": 99}, "No address with id 99"),
    ("calendar", "get_event", {"event_id": 99}, "No event with id 99"),
    ("calendar", "update_event", {"event_id": 99, "title": "x"}, "No event with id 99"),
    ("calendar", "cancel_event", {"event_id": 99}, "No event with id 99"),
    ("calendar", "add_attendee", {"event_id": 99, "contact_id": 2}, "No event with id 99"),
    ("calendar", "add_attendee", {"event_id": 12, "contact_id": 99}, "No contact with id 99"),
    ("calendar", "remove_attendee", {"event_id": 99, "contact_id": 2}, "No event with id 99"),
    ("calendar", "remove_attendee", {"event_id": 12, "contact_id": 99},
     "No contact with id 99"),
    ("calendar", "create_event", {"calendar_id": 99, "title": "x", "start_at": "2026-03-12",
                                  "end_at": "2026-03-12"}, "No calendar with id 99"),
    ("calendar", "create_event", {"calendar_id": 1, "title": "x", "start_at": "2026-03-12",
                                  "end_at": "2026-03-12", "attendee_ids": [99]},
     "No contact with id 99"),
    ("calendar", "list_events", {"calendar_id": 99}, "No calendar with id 99"),
    ("notes", "get_note", {"note_id": 3}, "No note with id 3"),
    ("notes", "update_note", {"note_id": 99, "title": "x"}, "No note with id 99"),
    ("notes", "update_note", {"note_id": 1, "notebook_id": 99}, "No notebook with id 99"),
    ("notes", "tag_note", {"note_id": 99, "add": ["x"]}, "No note with id 99"),
    ("notes", "delete_note", {"note_id": 99}, "No note with id 99"),
    ("notes", "create_note", {"notebook_id": 99, "title": "x"}, "No notebook with id 99"),
    ("notes", "list_notes", {"notebook_id": 99}, "No notebook with id 99"),
    ("notes", "list_notes", {"tag": "nosuchtag"}, "No tag named 'nosuchtag'"),
    ("notes", "search_notes", {"query": "x", "tag": "nosuchtag"}, "No tag named 'nosuchtag'"),
]


@pytest.mark.parametrize(("service", "tool", "kwargs", "message"), MISSING,
                         ids=[f"{m[1]}-{i}" for i, m in enumerate(MISSING)])
def test_missing_rows_are_tool_errors(w: World, service: str, tool: str,
                                      kwargs: dict[str, Any], message: str) -> None:
    before = w.mount.hash()
    fails(w, service, tool, message, **kwargs)
    w.close()
    assert w.mount.hash() == before


def test_bad_arguments_are_tool_errors(w: World) -> None:
    fails(w, "chat", "search_messages", "sent_from must be a date", query="x",
          sent_from="2026-13-01")
    fails(w, "chat", "list_conversations", "limit must be between 1 and 100", limit=0)
    fails(w, "shop", "list_orders", "offset must be 0 or more", offset=-1)
    fails(w, "notes", "search_notes", "query must contain at least one word", query="   ")
    fails(w, "calendar", "list_events", "date_to must be a date", date_to="tomorrow")


def test_sql_injection_is_stored_and_searched_literally(w: World) -> None:
    note = w("notes", "create_note", notebook_id=1, title=INJECTION, body=INJECTION,
             tags=[INJECTION[:30]])
    assert w.value("notes", "SELECT title FROM notes WHERE id = ?", (note.id,)) == INJECTION
    assert ids(w("notes", "search_notes", query=INJECTION)) == [note.id]
    message = w("chat", "send_message", conversation_id=1, body=INJECTION)
    assert w.value("chat", "SELECT body FROM messages WHERE id = ?", (message.id,)) == INJECTION
    assert ids(w("chat", "search_messages", query=INJECTION)) == [message.id]
    assert w("shop", "search_products", query=INJECTION).total == 0
    fails(w, "shop", "get_product", "No product with SKU", sku=INJECTION)
    fails(w, "shop", "search_products", "No category", category=INJECTION)
    event = w("calendar", "create_event", calendar_id=1, title=INJECTION,
              start_at="2026-03-20T10:00", end_at="2026-03-20T11:00", location=INJECTION)
    assert w.value("calendar", "SELECT location FROM events WHERE id = ?",
                   (event.id,)) == INJECTION
    for service, tables in TABLES.items():
        assert tables <= w.tables(service), service
    assert w.value("shop", "SELECT COUNT(*) FROM products") == 74


SCRIPT: list[tuple[str, str, dict[str, Any]]] = [
    ("chat", "mark_read", {"conversation_id": 7}),
    ("chat", "send_message", {"conversation_id": 7, "body": "Yes, Spotify Connect works."}),
    ("chat", "search_messages", {"query": "Spotify"}),
    ("shop", "add_to_cart", {"product_id": 35, "quantity": 1}),
    ("shop", "update_cart_item", {"product_id": 46, "quantity": 1}),
    ("shop", "place_order", {"shipping_address_id": 1}),
    ("shop", "list_orders", {}),
    ("calendar", "create_event", {"calendar_id": 1, "title": "Easter concert",
                                  "start_at": "2026-03-28T17:00", "end_at": "2026-03-28T23:00",
                                  "attendee_ids": [4], "reminder_minutes": [60]}),
    ("calendar", "update_event", {"event_id": 12, "start_at": "2026-03-10T13:30"}),
    ("notes", "create_note", {"notebook_id": 1, "title": "Easter concert",
                              "tags": ["sagene", "new-tag"]}),
    ("notes", "tag_note", {"note_id": 9, "add": ["quote"]}),
    ("notes", "delete_note", {"note_id": 6}),
    ("notes", "list_notes", {"limit": 100}),
]


def _run_script(worlds: Worlds, dest: Path) -> tuple[list[Any], str, str]:
    world = _mount(worlds, dest)
    try:
        before = world.mount.hash()
        out = []
        for service, tool, kwargs in SCRIPT:
            result = world(service, tool, **kwargs)
            out.append(result.model_dump() if isinstance(result, BaseModel) else result)
        world.close()
        return out, before, world.mount.hash()
    finally:
        world.close()
        world.mount.close()


def test_same_calls_same_responses_and_world(worlds: Worlds, tmp_path: Path) -> None:
    first, start_a, end_a = _run_script(worlds, tmp_path / "a")
    second, start_b, end_b = _run_script(worlds, tmp_path / "b")
    assert first == second
    assert start_a == start_b and end_a == end_b and end_a != start_a


def test_apps_use_no_clock_or_randomness() -> None:
    for app in SHIPPED.values():
        for banned in ("datetime.now", "date.today", "time.time", "import random", "uuid",
                       "utcnow", "CURRENT_TIMESTAMP", "random()"):
            assert banned not in app.source, (app.service, banned)


def test_every_tool_is_exercised_here() -> None:
    source = Path(__file__).read_text(encoding="utf-8")
    for spec in ALL_SPECS:
        assert f'"{spec.name}"' in source, f"{spec.full_name} is not called in this file"
