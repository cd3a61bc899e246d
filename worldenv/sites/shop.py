"""The shop's web pages: AVLager, as Lars sees it logged in.

Pages: the catalogue (search, category, brand, price and stock filters, sorting, paging),
a product with its photo (from a ``product_images(product_id, content_type, data, alt)``
table when a world has one), the cart with its totals, the checkout with the choice of
shipping address, the orders with their lines, totals and status history, and the saved
addresses. Forms call the shop's own tools: ``add_to_cart``, ``update_cart_item``,
``remove_from_cart``, ``place_order``, ``cancel_order`` and ``add_address``.

The pages read the same tables with the same arithmetic as the tools (``worldenv.apps.shop``):
the cart's shipping and MVA are what ``get_cart`` says and what ``place_order`` will
charge; the catalogue's search is ``search_products``'s; an order's totals are the
order's own, as it was charged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worldenv.apps.shop import (
    FREE_SHIPPING_FROM_CENTS,
    SHIPPING_CENTS,
    SORT_ORDER,
    find_products,
)
from worldenv.core.app import CURRENT_USER
from worldenv.gui.site import Blob, Fields, Page, PageContext, Redirect, Site
from worldenv.sites._html import SITE_TEMPLATES, done_message, new_id, query_int

site = Site(service="shop", title="AVLager",
            nav=(("Products", "/products"), ("Cart", "/cart"), ("Checkout", "/checkout"),
                 ("Orders", "/orders"), ("Addresses", "/addresses")), templates=__name__)

ME = CURRENT_USER  # the logged-in user, as the tools have it
PER_PAGE = 12
SORTS = (("name", "Name"), ("price_asc", "Price, low to high"),
         ("price_desc", "Price, high to low"), ("stock_desc", "Most in stock"))
STATUSES = ("placed", "shipped", "delivered", "cancelled")
DONE = {"placed": "Thank you! Your order is placed.",
        "cancelled": "The order is cancelled; its items went back into stock.",
        "added": "The address is saved."}


def nok(cents: int | None) -> str:
    """NOK 1,234.50: øre as the shop writes kroner."""
    if cents is None:
        return ""
    kroner, ore = divmod(int(cents), 100)
    return f"NOK {kroner:,}.{ore:02d}"


def _not_found(ctx: PageContext, what: str) -> Page:
    return Page("Not found", ctx.render("shop/not_found.html", what=what), 404)


SITE_TEMPLATES.globals.update(nok=nok, free_from=FREE_SHIPPING_FROM_CENTS)


# --- photos ---------------------------------------------------------------------------------


def _photo_alt(ctx: PageContext, product: dict[str, Any]) -> str | None:
    """The photo's alt text, None when the product has no photo (or the world no table)."""
    if not ctx.has_table("product_images"):
        return None
    found = ctx.row("SELECT alt FROM product_images WHERE product_id = ?", (product["id"],))
    if found is None:
        return None
    return str(found["alt"] or f"Photo of {product['name']}")


def _shown(ctx: PageContext, product: dict[str, Any]) -> dict[str, Any]:
    """A product as its card and page show it: with its photo (``photo_alt`` None when it
    has none) and its stock in words."""
    return {**product, "photo_alt": _photo_alt(ctx, product),
            "photo_src": ctx.url(f"/products/{product['id']}/photo"),
            "stock_text": _stock_text(product)}


@site.page("/products/{product_id:int}/photo")
def photo(ctx: PageContext, product_id: int) -> Page | Blob:
    found = ctx.row("SELECT content_type, data FROM product_images WHERE product_id = ?",
                    (product_id,)) if ctx.has_table("product_images") else None
    if found is None:
        return _not_found(ctx, f"No photo of product {product_id}.")
    data = found["data"]
    return Blob(str(found["content_type"]), data if isinstance(data, bytes)
                else str(data).encode("utf-8"))


# --- the cart's arithmetic (worldenv.apps.shop: _cart_rows, _shipping, _cart) -------------------


@dataclass(frozen=True, slots=True)
class Totals:
    subtotal: int
    shipping: int
    vat: int
    total: int

    @classmethod
    def of(cls, lines: list[dict[str, Any]]) -> Totals:
        """What ``get_cart`` reports and ``place_order`` charges: shipping NOK 149 below
        NOK 5,000 (none for an empty cart), MVA 25 % of subtotal plus shipping, rounded
        down to whole øre."""
        subtotal = sum(int(line["line_total_cents"]) for line in lines)
        shipping = (0 if subtotal == 0 or subtotal >= FREE_SHIPPING_FROM_CENTS
                    else SHIPPING_CENTS)
        vat = (subtotal + shipping) // 4
        return cls(subtotal, shipping, vat, subtotal + shipping + vat)


def _cart_lines(ctx: PageContext) -> list[dict[str, Any]]:
    return ctx.rows(
        "SELECT ci.product_id, p.sku, p.name, p.unit, ci.quantity, p.price_cents AS "
        "unit_price_cents, p.price_cents * ci.quantity AS line_total_cents, p.stock, "
        "p.is_active FROM cart_items ci JOIN products p ON p.id = ci.product_id "
        "WHERE ci.user_id = ? ORDER BY ci.id", (ME,))


def _lines(ctx: PageContext) -> list[dict[str, Any]]:
    """The cart's lines, each with why ``place_order`` would refuse it (``problem``)."""
    return [{**line, "problem": _problem(line)} for line in _cart_lines(ctx)]


def _problem(line: dict[str, Any]) -> str:
    """Why ``place_order`` would refuse this line ("" when it would not)."""
    if not line["is_active"]:
        return "No longer sold: remove it to order."
    if line["quantity"] > line["stock"]:
        return f"Only {line['stock']} in stock."
    return ""


# --- home and catalogue ---------------------------------------------------------------------


@site.page("/")
def home(ctx: PageContext) -> Page:
    categories = ctx.rows(
        "SELECT c.slug, c.name, (SELECT count(*) FROM products p WHERE p.category_id = c.id "
        "AND p.is_active = 1) AS n FROM categories c ORDER BY c.name, c.id")
    lines = _cart_lines(ctx)
    cart = {"units": sum(int(line["quantity"]) for line in lines),
            "total": Totals.of(lines).total} if lines else None
    orders = ctx.rows("SELECT id, order_number, status, placed_at FROM orders WHERE "
                      "user_id = ? ORDER BY placed_at DESC, id DESC LIMIT 3", (ME,))
    return Page("Shop", ctx.render("shop/home.html", categories=categories, cart=cart,
                                   orders=orders))


@dataclass(frozen=True, slots=True)
class Filters:
    """The catalogue's query: what ``search_products`` takes, prices in whole kroner."""

    q: str
    category: str
    brand: str
    in_stock: bool
    sort: str
    min_nok: int | None
    max_nok: int | None
    page: int

    @classmethod
    def of(cls, ctx: PageContext) -> Filters:
        arg = ctx.request.arg
        sort = arg("sort", "name")
        return cls(q=arg("q").strip(), category=arg("category"), brand=arg("brand"),
                   in_stock=arg("in_stock") == "1",
                   sort=sort if sort in SORT_ORDER else "name",
                   min_nok=_kroner(arg("min_price")), max_nok=_kroner(arg("max_price")),
                   page=query_int(ctx, "page", 1, least=1))

    def query(self, **changed: object) -> dict[str, object]:
        """The query of this search (with `changed`), for links to its other pages."""
        found: dict[str, object] = {
            "q": self.q, "category": self.category, "brand": self.brand,
            "in_stock": "1" if self.in_stock else "",
            "sort": "" if self.sort == "name" else self.sort,
            "min_price": self.min_nok, "max_price": self.max_nok}
        return found | changed


def _kroner(value: str) -> int | None:
    value = value.strip()
    return int(value) if value.isdigit() and len(value) <= 9 else None


def _cents(nok: int | None) -> int | None:
    return None if nok is None else nok * 100


@site.page("/products")
def products(ctx: PageContext) -> Page:
    f = Filters.of(ctx)
    category = ctx.row("SELECT name FROM categories WHERE slug = ?", (f.category,))
    if f.category and category is None:
        return _not_found(ctx, f"No category {f.category!r}.")
    # search_products's own query, so the page lists exactly what the tool finds
    total, rows = find_products(ctx, query=f.q, category=f.category or None,
                                brand=f.brand or None, min_price_cents=_cents(f.min_nok),
                                max_price_cents=_cents(f.max_nok), in_stock_only=f.in_stock,
                                sort=f.sort, limit=PER_PAGE, offset=(f.page - 1) * PER_PAGE)
    heading = (f"Results for “{f.q}”" if f.q else
               str(category["name"]) if category else "Products")
    categories = [("", "All categories"), *((str(c["slug"]), str(c["name"])) for c in ctx.rows(
        "SELECT slug, name FROM categories ORDER BY name, id"))]
    brands = [("", "All brands"), *((str(b["brand"]), str(b["brand"])) for b in ctx.rows(
        "SELECT DISTINCT brand FROM products WHERE is_active = 1 AND brand IS NOT NULL "
        "ORDER BY brand"))]
    # The tool matches a brand in any case: so does the drop-down's choice.
    brand = next((b for b, _ in brands if b.lower() == f.brand.lower()), f.brand)
    return Page(heading, ctx.render(
        "shop/products.html", heading=heading, f=f, categories=categories, brands=brands,
        brand=brand, sorts=SORTS, total=total, pages=_pages(total),
        rows=[_shown(ctx, p) for p in rows]))


def _pages(total: int) -> int:
    return max(1, (total + PER_PAGE - 1) // PER_PAGE)


def _stock_text(p: dict[str, Any]) -> str:
    return f"{p['stock']} {p['unit']} in stock" if p["stock"] > 0 else "Out of stock"


# --- a product --------------------------------------------------------------------------------


@site.page("/products/{product_id:int}")
def product(ctx: PageContext, product_id: int) -> Page:
    p = ctx.row("SELECT p.*, c.name AS category, c.slug AS category_slug FROM products p "
                "JOIN categories c ON c.id = p.category_id WHERE p.id = ?", (product_id,))
    if p is None:
        return _not_found(ctx, f"No product {product_id}.")
    in_cart = ctx.value("SELECT quantity FROM cart_items WHERE user_id = ? AND "
                        "product_id = ?", (ME, p["id"]))
    orders = ctx.rows("SELECT DISTINCT o.id, o.order_number, o.placed_at FROM orders o JOIN "
                      "order_items i ON i.order_id = o.id WHERE o.user_id = ? AND "
                      "i.product_id = ? ORDER BY o.placed_at DESC, o.id DESC", (ME, p["id"]))
    return Page(p["name"], ctx.render("shop/product.html", p=_shown(ctx, p), in_cart=in_cart,
                                      orders=orders))


# --- the cart --------------------------------------------------------------------------------


@site.page("/cart")
def cart(ctx: PageContext) -> Page:
    lines = _lines(ctx)
    return Page("Cart", ctx.render("shop/cart.html", lines=lines, totals=Totals.of(lines)))


@site.form("/cart/add")
def cart_add(ctx: PageContext, fields: Fields) -> Page | Redirect:
    result = ctx.call("add_to_cart", {"product_id": fields.integer("product_id"),
                                      "quantity": fields.integer("quantity", default=1)})
    return ctx.refused(result) or Redirect("/cart")


@site.form("/cart/update")
def cart_update(ctx: PageContext, fields: Fields) -> Page | Redirect:
    result = ctx.call("update_cart_item", {"product_id": fields.integer("product_id"),
                                           "quantity": fields.integer("quantity")})
    return ctx.refused(result) or Redirect("/cart")


@site.form("/cart/remove")
def cart_remove(ctx: PageContext, fields: Fields) -> Page | Redirect:
    result = ctx.call("remove_from_cart", {"product_id": fields.integer("product_id")})
    return ctx.refused(result) or Redirect("/cart")


# --- checkout --------------------------------------------------------------------------------


def _addresses(ctx: PageContext) -> list[dict[str, Any]]:
    """The user's addresses as ``list_addresses`` orders them (the default one first)."""
    return ctx.rows("SELECT * FROM addresses WHERE user_id = ? ORDER BY is_default DESC, id",
                    (ME,))


def _address_text(a: dict[str, Any]) -> str:
    parts = (a["recipient"], a["company"], a["street"], f"{a['postal_code']} {a['city']}",
             a["country"], a["phone"])
    return ", ".join(str(p) for p in parts if p)


@site.page("/checkout")
def checkout(ctx: PageContext) -> Page:
    lines = _lines(ctx)
    addresses = [{**a, "text": _address_text(a)} for a in _addresses(ctx)]
    return Page("Checkout", ctx.render("shop/checkout.html", lines=lines,
                                       totals=Totals.of(lines), addresses=addresses))


@site.form("/checkout")
def place(ctx: PageContext, fields: Fields) -> Page | Redirect:
    chosen = fields.optional("shipping_address_id")
    arguments = {} if chosen is None else {
        "shipping_address_id": fields.integer("shipping_address_id")}
    result = ctx.call("place_order", arguments)
    return ctx.refused(result, "Order not placed") or Redirect(
        f"/orders/{new_id(result)}?done=placed")


# --- orders ----------------------------------------------------------------------------------


@site.page("/orders")
def orders(ctx: PageContext) -> Page:
    status = ctx.request.arg("status")
    if status and status not in STATUSES:
        return _not_found(ctx, f"No order status {status!r}.")
    where, params = ("user_id = ? AND status = ?", (ME, status)) if status else (
        "user_id = ?", (ME,))
    rows = ctx.rows(
        f"SELECT o.*, (SELECT count(*) FROM order_items i WHERE i.order_id = o.id) AS lines, "
        f"(SELECT coalesce(sum(quantity), 0) FROM order_items i WHERE i.order_id = o.id) AS "
        f"units FROM orders o WHERE {where} ORDER BY placed_at DESC, id DESC", params)
    statuses = [("", "All orders"), *((s, s.capitalize()) for s in STATUSES)]
    return Page("Orders", ctx.render("shop/orders.html", orders=rows, status=status,
                                     statuses=statuses))


@site.page("/orders/{order_id:int}")
def order(ctx: PageContext, order_id: int) -> Page:
    o = ctx.row("SELECT * FROM orders WHERE id = ? AND user_id = ?", (order_id, ME))
    if o is None:
        return _not_found(ctx, f"No order {order_id}.")
    address = ctx.row("SELECT * FROM addresses WHERE id = ?", (o["shipping_address_id"],))
    carrier = " ".join(str(v) for v in (o["carrier"], o["tracking_number"]) if v) \
        if o["carrier"] or o["tracking_number"] else None
    items = ctx.rows("SELECT i.product_id, i.quantity, i.unit_price_cents, i.line_total_cents, "
                     "p.sku, p.name FROM order_items i JOIN products p ON p.id = i.product_id "
                     "WHERE i.order_id = ? ORDER BY i.id", (o["id"],))
    history = ctx.rows("SELECT status, note, changed_at FROM order_status_history WHERE "
                       "order_id = ? ORDER BY changed_at, id", (o["id"],))
    return Page(f"Order {o['order_number']}", ctx.render(
        "shop/order.html", done=done_message(ctx, DONE), title=f"Order {o['order_number']}",
        o=o, carrier=carrier, items=items, history=history, totals=_order_totals(o),
        address=None if address is None else {**address, "text": _address_text(address)}))


def _order_totals(o: dict[str, Any]) -> Totals:
    return Totals(o["subtotal_cents"], o["shipping_cents"], o["vat_cents"], o["total_cents"])


@site.form("/orders/{order_id:int}/cancel")
def cancel(ctx: PageContext, fields: Fields, order_id: int) -> Page | Redirect:
    reason = fields.optional("reason")
    arguments: dict[str, Any] = {"order_id": order_id}
    if reason is not None and reason.strip():
        arguments["reason"] = reason
    result = ctx.call("cancel_order", arguments)
    return ctx.refused(result, "Order not cancelled") or Redirect(
        f"/orders/{order_id}?done=cancelled")


# --- addresses -------------------------------------------------------------------------------

ADDRESS_FIELDS = (("label", "Label", True, 60), ("recipient", "Recipient", True, 100),
                  ("company", "Company", False, 100), ("street", "Street", True, 200),
                  ("postal_code", "Postal code", True, 12), ("city", "City", True, 100),
                  ("country", "Country code", True, 2), ("phone", "Phone", False, 30))


@site.page("/addresses")
def addresses(ctx: PageContext) -> Page:
    return Page("Addresses", ctx.render(
        "shop/addresses.html", done=done_message(ctx, DONE), fields=ADDRESS_FIELDS,
        addresses=[{**a, "text": _address_text(a)} for a in _addresses(ctx)],
        then="checkout" if ctx.request.arg("then") == "checkout" else ""))


@site.form("/addresses")
def add_address(ctx: PageContext, fields: Fields) -> Page | Redirect:
    arguments: dict[str, Any] = {}
    for name, _label, required, _size in ADDRESS_FIELDS:
        value = fields.text(name) if required else fields.optional(name)
        if value is not None and value.strip():
            arguments[name] = value
    if fields.optional("make_default") == "1":
        arguments["make_default"] = True
    result = ctx.call("add_address", arguments)
    refused = ctx.refused(result, "Address not saved")
    if refused is not None:
        return refused
    return Redirect("/checkout" if fields.optional("then") == "checkout"
                    else "/addresses?done=added")
