"""The shop's web pages: AVLager, as Lars sees it logged in.

Pages: the catalogue (search, category, brand, price and stock filters, sorting, paging),
a product with its photo (from a ``product_images(product_id, content_type, data, alt)``
table when a world has one), the cart with its totals, the checkout with the choice of
shipping address, the orders with their lines, totals and status history, and the saved
addresses. Forms call the shop's own tools: ``add_to_cart``, ``update_cart_item``,
``remove_from_cart``, ``place_order``, ``cancel_order`` and ``add_address``.

The pages read the same tables with the same arithmetic as the tools (``envs.apps.shop``):
the cart's shipping and MVA are what ``get_cart`` says and what ``place_order`` will
charge; the catalogue's search is ``search_products``'s; an order's totals are the
order's own, as it was charged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from envs.app import CURRENT_USER
from envs.apps._common import like
from envs.apps.shop import FREE_SHIPPING_FROM_CENTS, SHIPPING_CENTS
from envs.site import Blob, Fields, Page, PageContext, Redirect, Site, esc, link
from envs.sites._html import (
    button,
    checkbox,
    count,
    day,
    hidden,
    labelled,
    new_id,
    notice,
    post_form,
    query_int,
    select,
    stamp,
    text_input,
)

site = Site(service="shop", title="AVLager",
            nav=(("Products", "/products"), ("Cart", "/cart"), ("Checkout", "/checkout"),
                 ("Orders", "/orders"), ("Addresses", "/addresses")))

ME = CURRENT_USER  # the logged-in user, as the tools have it
PER_PAGE = 12
MAX_WORDS = 10  # search_products reads at most ten words of a query
SORTS = (("name", "Name"), ("price_asc", "Price, low to high"),
         ("price_desc", "Price, high to low"), ("stock_desc", "Most in stock"))
SORT_SQL = {"name": "p.name, p.id", "price_asc": "p.price_cents, p.id",
            "price_desc": "p.price_cents DESC, p.id", "stock_desc": "p.stock DESC, p.id"}
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


def _not_found(what: str) -> Page:
    return Page("Not found", f"<h1>Not found</h1><p>{esc(what)}</p>"
                             f'<p><a href="/shop/products">All products</a></p>', 404)


def _order_link(ctx: PageContext, o: dict[str, Any]) -> str:
    return link(ctx.url(f"/orders/{o['id']}"), o["order_number"])


def _product_link(ctx: PageContext, product_id: int, name: str) -> str:
    return link(ctx.url(f"/products/{product_id}"), name)


def _table(head: tuple[str, ...], rows: str, numeric: frozenset[int] = frozenset()) -> str:
    num = ' class="num"'
    cells = "".join(f"<th{num if i in numeric else ''}>{esc(h)}</th>"
                    for i, h in enumerate(head))
    return f"<table><tr>{cells}</tr>{rows}</table>"


# --- photos ---------------------------------------------------------------------------------


def _photo_alt(ctx: PageContext, product: dict[str, Any]) -> str | None:
    """The photo's alt text, None when the product has no photo (or the world no table)."""
    if not ctx.has_table("product_images"):
        return None
    found = ctx.row("SELECT alt FROM product_images WHERE product_id = ?", (product["id"],))
    if found is None:
        return None
    return str(found["alt"] or f"Photo of {product['name']}")


def _photo(ctx: PageContext, product: dict[str, Any], css: str) -> str:
    alt = _photo_alt(ctx, product)
    if alt is None:
        return f'<div class="{css} muted">No photo</div>'
    src = ctx.url(f"/products/{product['id']}/photo")
    return f'<img class="{css}" src="{esc(src)}" alt="{esc(alt)}">'


@site.page("/products/{product_id:int}/photo")
def photo(ctx: PageContext, product_id: int) -> Page | Blob:
    found = ctx.row("SELECT content_type, data FROM product_images WHERE product_id = ?",
                    (product_id,)) if ctx.has_table("product_images") else None
    if found is None:
        return _not_found(f"No photo of product {product_id}.")
    return Blob(str(found["content_type"]), bytes(found["data"]))


# --- the cart's arithmetic (envs.apps.shop: _cart_rows, _shipping, _cart) -------------------


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


def _problem(line: dict[str, Any]) -> str:
    """Why ``place_order`` would refuse this line ("" when it would not)."""
    if not line["is_active"]:
        return "No longer sold: remove it to order."
    if line["quantity"] > line["stock"]:
        return f"Only {line['stock']} in stock."
    return ""


def _warning(line: dict[str, Any]) -> str:
    problem = _problem(line)
    return f'<div class="error">{esc(problem)}</div>' if problem else ""


def _totals_table(totals: Totals) -> str:
    rows = (("Subtotal (excl. MVA)", totals.subtotal), ("Shipping", totals.shipping),
            ("MVA 25 %", totals.vat), ("Total incl. MVA", totals.total))
    body = "".join(f'<tr><th>{esc(k)}</th><td class="num">{esc(nok(v))}</td></tr>'
                   for k, v in rows)
    return f'<table class="totals" aria-label="Totals">{body}</table>'


def _shipping_hint(totals: Totals) -> str:
    if totals.shipping == 0:
        return "" if totals.subtotal == 0 else '<p class="muted">Free shipping.</p>'
    missing = FREE_SHIPPING_FROM_CENTS - totals.subtotal
    return (f'<p class="muted">Shipping is free from {esc(nok(FREE_SHIPPING_FROM_CENTS))}: '
            f"add {esc(nok(missing))} more.</p>")


# --- home and catalogue ---------------------------------------------------------------------


@site.page("/")
def home(ctx: PageContext) -> Page:
    categories = ctx.rows(
        "SELECT c.slug, c.name, (SELECT count(*) FROM products p WHERE p.category_id = c.id "
        "AND p.is_active = 1) AS n FROM categories c ORDER BY c.name, c.id")
    items = "".join(f'<li><a href="{esc(ctx.url("/products", category=c["slug"]))}">'
                    f'{esc(c["name"])}</a> <span class="muted">({c["n"]})</span></li>'
                    for c in categories)
    return Page("Shop", f"<h1>AVLager</h1>{_search_box(ctx)}{_cart_summary(ctx)}"
                        f"<h2>Categories</h2><ul>{items}</ul>{_recent_orders(ctx)}")


def _search_box(ctx: PageContext) -> str:
    return (f'<form method="get" action="{esc(ctx.url("/products"))}" role="search">'
            f'{labelled("Search products", text_input("q", kind="search"))} '
            f"{button('Search')}</form>")


def _cart_summary(ctx: PageContext) -> str:
    lines = _cart_lines(ctx)
    if not lines:
        return "<p>Your cart is empty.</p>"
    units = sum(int(line["quantity"]) for line in lines)
    return (f"<p>{link(ctx.url('/cart'), 'Your cart: ' + count(units, 'item'))} · "
            f"{esc(nok(Totals.of(lines).total))} incl. MVA</p>")


def _recent_orders(ctx: PageContext) -> str:
    rows = ctx.rows("SELECT id, order_number, status, placed_at FROM orders WHERE "
                    "user_id = ? ORDER BY placed_at DESC, id DESC LIMIT 3", (ME,))
    items = "".join(f"<li>{_order_link(ctx, o)} "
                    f"{esc(o['status'])} · {esc(day(o['placed_at']))}</li>" for o in rows)
    return f"<h2>Recent orders</h2><ul>{items}</ul>" if rows else ""


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
                   sort=sort if sort in SORT_SQL else "name",
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


def _where(f: Filters) -> tuple[str, list[Any]]:
    """The WHERE clause of ``search_products`` for these filters."""
    where = ["p.is_active = 1"]
    params: list[Any] = []
    for word in f.q.split()[:MAX_WORDS]:
        where.append("(p.name LIKE ? ESCAPE '\\' OR p.sku LIKE ? ESCAPE '\\' OR "
                     "COALESCE(p.brand, '') LIKE ? ESCAPE '\\')")
        params += [like(word)] * 3
    if f.category:
        where.append("p.category_id = (SELECT id FROM categories WHERE slug = ?)")
        params.append(f.category)
    if f.brand:
        where.append("p.brand = ? COLLATE NOCASE")
        params.append(f.brand)
    if f.min_nok is not None:
        where.append("p.price_cents >= ?")
        params.append(f.min_nok * 100)
    if f.max_nok is not None:
        where.append("p.price_cents <= ?")
        params.append(f.max_nok * 100)
    if f.in_stock:
        where.append("p.stock > 0")
    return " AND ".join(where), params


@site.page("/products")
def products(ctx: PageContext) -> Page:
    f = Filters.of(ctx)
    category = ctx.row("SELECT name FROM categories WHERE slug = ?", (f.category,))
    if f.category and category is None:
        return _not_found(f"No category {f.category!r}.")
    clause, params = _where(f)
    total = int(ctx.value(f"SELECT count(*) FROM products p WHERE {clause}", params))
    rows = ctx.rows(f"SELECT p.* FROM products p WHERE {clause} ORDER BY {SORT_SQL[f.sort]} "
                    f"LIMIT {PER_PAGE} OFFSET {(f.page - 1) * PER_PAGE}", params)
    heading = (f"Results for “{f.q}”" if f.q else
               str(category["name"]) if category else "Products")
    cards = "".join(_card(ctx, p) for p in rows) or "<p>No products match.</p>"
    shown = count(total, "product") + (
        "" if total <= PER_PAGE else f" · page {f.page} of {_pages(total)}")
    return Page(heading, f"<h1>{esc(heading)}</h1>{_filter_form(ctx, f)}"
                          f'<p class="muted" role="status">{esc(shown)}</p>'
                          f'<div class="grid">{cards}</div>{_pager(ctx, f, total)}')


def _pages(total: int) -> int:
    return max(1, (total + PER_PAGE - 1) // PER_PAGE)


def _filter_form(ctx: PageContext, f: Filters) -> str:
    categories = [("", "All categories"), *((str(c["slug"]), str(c["name"])) for c in ctx.rows(
        "SELECT slug, name FROM categories ORDER BY name, id"))]
    brands = [("", "All brands"), *((str(b["brand"]), str(b["brand"])) for b in ctx.rows(
        "SELECT DISTINCT brand FROM products WHERE is_active = 1 AND brand IS NOT NULL "
        "ORDER BY brand"))]
    # The tool matches a brand in any case: so does the drop-down's choice.
    brand = next((b for b, _ in brands if b.lower() == f.brand.lower()), f.brand)
    fields = (labelled("Search products", text_input("q", f.q, kind="search")),
              labelled("Category", select("category", categories, f.category)),
              labelled("Brand", select("brand", brands, brand)),
              labelled("Min price (NOK)", text_input("min_price", f.min_nok or "",
                                                     kind="number", size=8, maxlength=9)),
              labelled("Max price (NOK)", text_input("max_price", f.max_nok or "",
                                                     kind="number", size=8, maxlength=9)),
              checkbox("in_stock", "1", "In stock only", checked=f.in_stock),
              labelled("Sort by", select("sort", SORTS, f.sort)), button("Apply"))
    return (f'<form method="get" action="{esc(ctx.url("/products"))}" role="search" '
            f'class="card">{" ".join(fields)}</form>')


def _pager(ctx: PageContext, f: Filters, total: int) -> str:
    pages = _pages(total)
    if pages == 1:
        return ""
    links = []
    if f.page > 1:
        links.append(link(ctx.url("/products", **f.query(page=f.page - 1)), "Previous"))
    for n in range(1, pages + 1):
        href = esc(ctx.url("/products", **f.query(page=n)))
        current = ' aria-current="page"' if n == f.page else ""
        links.append(f'<a href="{href}" aria-label="Page {n}"{current}>{n}</a>')
    if f.page < pages:
        links.append(link(ctx.url("/products", **f.query(page=f.page + 1)), "Next"))
    return f'<nav aria-label="Pages"><p>{" ".join(links)}</p></nav>'


def _card(ctx: PageContext, p: dict[str, Any]) -> str:
    href = ctx.url(f"/products/{p['id']}")
    return (f'<div class="card">{_photo(ctx, p, "thumb")}<div>{link(href, p["name"])}</div>'
            f'<div class="muted">{esc(p["sku"])} · {esc(p["brand"] or "")}</div>'
            f"<div>{esc(nok(p['price_cents']))} excl. MVA / {esc(p['unit'])}</div>"
            f"<div>{esc(_stock_text(p))}</div>{_quick_add(ctx, p)}</div>")


def _stock_text(p: dict[str, Any]) -> str:
    return f"{p['stock']} {p['unit']} in stock" if p["stock"] > 0 else "Out of stock"


def _quick_add(ctx: PageContext, p: dict[str, Any]) -> str:
    if not p["is_active"] or p["stock"] <= 0:
        return ""
    inner = (hidden("product_id", p["id"]) + hidden("quantity", 1)
             + button("Add to cart", f"Add {p['name']} to cart"))
    return post_form(ctx.url("/cart/add"), inner)


# --- a product --------------------------------------------------------------------------------


@site.page("/products/{product_id:int}")
def product(ctx: PageContext, product_id: int) -> Page:
    p = ctx.row("SELECT p.*, c.name AS category, c.slug AS category_slug FROM products p "
                "JOIN categories c ON c.id = p.category_id WHERE p.id = ?", (product_id,))
    if p is None:
        return _not_found(f"No product {product_id}.")
    crumbs = (f'<p class="muted">{link(ctx.url("/products"), "Products")} › '
              f'{link(ctx.url("/products", category=p["category_slug"]), p["category"])}</p>')
    specs = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in (
        ("SKU", p["sku"]), ("Brand", p["brand"] or ""), ("Category", p["category"]),
        ("Unit", p["unit"]), ("Price", f"{nok(p['price_cents'])} excl. MVA"),
        ("Stock", _stock_text(p))))
    return Page(p["name"], f"{crumbs}<h1>{esc(p['name'])}</h1>{_photo(ctx, p, 'photo')}"
                           f'<table class="specs">{specs}</table>{_in_cart(ctx, p)}'
                           f"{_add_form(ctx, p)}{_ordered_in(ctx, p)}")


def _in_cart(ctx: PageContext, p: dict[str, Any]) -> str:
    quantity = ctx.value("SELECT quantity FROM cart_items WHERE user_id = ? AND "
                         "product_id = ?", (ME, p["id"]))
    if quantity is None:
        return ""
    text = f"In your cart: {quantity} {p['unit']}"
    return f"<p>{link(ctx.url('/cart'), text)}</p>"


def _add_form(ctx: PageContext, p: dict[str, Any]) -> str:
    if not p["is_active"]:
        return "<p><b>No longer sold.</b></p>"
    if p["stock"] <= 0:
        return "<p><b>Out of stock</b>: it can't be added to the cart now.</p>"
    quantity = text_input("quantity", 1, kind="number", size=5, maxlength=3)
    inner = (hidden("product_id", p["id"]) + labelled("Quantity", quantity) + " "
             + button("Add to cart"))
    return post_form(ctx.url("/cart/add"), inner)


def _ordered_in(ctx: PageContext, p: dict[str, Any]) -> str:
    rows = ctx.rows("SELECT DISTINCT o.id, o.order_number, o.placed_at FROM orders o JOIN "
                    "order_items i ON i.order_id = o.id WHERE o.user_id = ? AND "
                    "i.product_id = ? ORDER BY o.placed_at DESC, o.id DESC", (ME, p["id"]))
    items = "".join(f"<li>{_order_link(ctx, o)} · "
                    f"{esc(day(o['placed_at']))}</li>" for o in rows)
    return f"<h2>You ordered it in</h2><ul>{items}</ul>" if rows else ""


# --- the cart --------------------------------------------------------------------------------


@site.page("/cart")
def cart(ctx: PageContext) -> Page:
    lines = _cart_lines(ctx)
    if not lines:
        return Page("Cart", f"<h1>Cart</h1><p>Your cart is empty.</p>"
                            f"<p>{link(ctx.url('/products'), 'Browse the products')}</p>")
    rows = "".join(_cart_row(ctx, line) for line in lines)
    totals = Totals.of(lines)
    table = _table(("Product", "Unit price", "Quantity", "Total", ""), rows,
                   frozenset({1, 3}))
    return Page("Cart", f"<h1>Cart</h1>{table}<h2>Totals</h2>{_totals_table(totals)}"
                        f"{_shipping_hint(totals)}"
                        f"<p>{link(ctx.url('/checkout'), 'Go to checkout')}</p>")


def _cart_row(ctx: PageContext, line: dict[str, Any]) -> str:
    name, pid = line["name"], line["product_id"]
    quantity = text_input("quantity", line["quantity"], kind="number", size=5, maxlength=3)
    update = post_form(ctx.url("/cart/update"), hidden("product_id", pid)
                       + labelled(f"Quantity of {name}", quantity) + " "
                       + button("Update", f"Update quantity of {name}"), inline=True)
    remove = post_form(ctx.url("/cart/remove"), hidden("product_id", pid)
                       + button("Remove", f"Remove {name} from cart"), inline=True)
    return (f"<tr><td>{link(ctx.url(f'/products/{pid}'), name)}"
            f'<div class="muted">{esc(line["sku"])}</div>{_warning(line)}</td>'
            f'<td class="num">{esc(nok(line["unit_price_cents"]))} / {esc(line["unit"])}</td>'
            f"<td>{update}</td>"
            f'<td class="num">{esc(nok(line["line_total_cents"]))}</td><td>{remove}</td></tr>')


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
    lines = _cart_lines(ctx)
    if not lines:
        return Page("Checkout", f"<h1>Checkout</h1><p>Your cart is empty.</p>"
                                f"<p>{link(ctx.url('/products'), 'Browse the products')}</p>")
    rows = "".join(f"<tr><td>{esc(li['name'])}<div class=\"muted\">{esc(li['sku'])}</div>"
                   f"{_warning(li)}</td>"
                   f'<td class="num">{li["quantity"]}</td>'
                   f'<td class="num">{esc(nok(li["line_total_cents"]))}</td></tr>'
                   for li in lines)
    table = _table(("Product", "Quantity", "Total"), rows, frozenset({1, 2}))
    totals = Totals.of(lines)
    return Page("Checkout", f"<h1>Checkout</h1>{table}<h2>Totals</h2>{_totals_table(totals)}"
                            f"{_shipping_hint(totals)}{_place_form(ctx)}")


def _place_form(ctx: PageContext) -> str:
    addresses = _addresses(ctx)
    add = link(ctx.url("/addresses", then="checkout"), "Add a new address")
    if not addresses:
        return f"<h2>Shipping address</h2><p>You have no address yet. {add}.</p>"
    choices = "".join(
        f'<div><label><input type="radio" name="shipping_address_id" value="{a["id"]}"'
        f'{" checked" if i == 0 else ""}> <b>{esc(a["label"])}</b>: '
        f'{esc(_address_text(a))}</label></div>' for i, a in enumerate(addresses))
    inner = (f"<fieldset><legend>Shipping address</legend>{choices}<p>{add}</p></fieldset>"
             f"<p>{button('Place order')}</p>")
    return post_form(ctx.url("/checkout"), inner)


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
        return _not_found(f"No order status {status!r}.")
    where, params = ("user_id = ? AND status = ?", (ME, status)) if status else (
        "user_id = ?", (ME,))
    rows = ctx.rows(
        f"SELECT o.*, (SELECT count(*) FROM order_items i WHERE i.order_id = o.id) AS lines, "
        f"(SELECT coalesce(sum(quantity), 0) FROM order_items i WHERE i.order_id = o.id) AS "
        f"units FROM orders o WHERE {where} ORDER BY placed_at DESC, id DESC", params)
    body = "".join(
        f"<tr><td>{_order_link(ctx, o)}</td>"
        f"<td>{stamp(o['placed_at'], ctx.now)}</td><td>{esc(o['status'])}</td>"
        f'<td class="num">{count(o["lines"], "line")}, {count(o["units"], "unit")}</td>'
        f'<td class="num">{esc(nok(o["total_cents"]))}</td></tr>' for o in rows)
    table = (_table(("Order", "Placed", "Status", "Items", "Total incl. MVA"), body,
                    frozenset({3, 4})) if rows else "<p>No orders.</p>")
    return Page("Orders", f"<h1>Orders</h1>{_status_filter(ctx, status)}{table}")


def _status_filter(ctx: PageContext, status: str) -> str:
    options = [("", "All orders"), *((s, s.capitalize()) for s in STATUSES)]
    return (f'<form method="get" action="{esc(ctx.url("/orders"))}">'
            f'{labelled("Status", select("status", options, status))} {button("Show")}</form>')


@site.page("/orders/{order_id:int}")
def order(ctx: PageContext, order_id: int) -> Page:
    o = ctx.row("SELECT * FROM orders WHERE id = ? AND user_id = ?", (order_id, ME))
    if o is None:
        return _not_found(f"No order {order_id}.")
    title = f"Order {o['order_number']}"
    return Page(title, f"{notice(ctx, DONE)}<h1>{esc(title)}</h1>{_order_facts(ctx, o)}"
                       f"<h2>Items</h2>{_order_lines(ctx, o)}"
                       f"<h2>Totals</h2>{_totals_table(_order_totals(o))}"
                       f"<h2>Status history</h2>{_history(ctx, o)}{_cancel_form(ctx, o)}")


def _order_totals(o: dict[str, Any]) -> Totals:
    return Totals(o["subtotal_cents"], o["shipping_cents"], o["vat_cents"], o["total_cents"])


def _order_facts(ctx: PageContext, o: dict[str, Any]) -> str:
    address = ctx.row("SELECT * FROM addresses WHERE id = ?", (o["shipping_address_id"],))
    facts = [("Status", esc(o["status"])), ("Placed", stamp(o["placed_at"], ctx.now))]
    if o["shipped_at"]:
        facts.append(("Shipped", stamp(o["shipped_at"], ctx.now)))
    if o["delivered_at"]:
        facts.append(("Delivered", stamp(o["delivered_at"], ctx.now)))
    if o["carrier"] or o["tracking_number"]:
        facts.append(("Carrier", esc(" ".join(str(v) for v in (
            o["carrier"], o["tracking_number"]) if v))))
    if address is not None:
        facts.append(("Ship to", f"<b>{esc(address['label'])}</b>: "
                                 f"{esc(_address_text(address))}"))
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in facts)
    return f'<table class="specs">{rows}</table>'


def _order_lines(ctx: PageContext, o: dict[str, Any]) -> str:
    items = ctx.rows("SELECT i.product_id, i.quantity, i.unit_price_cents, i.line_total_cents, "
                     "p.sku, p.name FROM order_items i JOIN products p ON p.id = i.product_id "
                     "WHERE i.order_id = ? ORDER BY i.id", (o["id"],))
    body = "".join(f"<tr>{_line_cells(ctx, i)}</tr>" for i in items)
    return _table(("SKU", "Product", "Quantity", "Unit price", "Total"), body,
                  frozenset({2, 3, 4}))


def _line_cells(ctx: PageContext, i: dict[str, Any]) -> str:
    return (f"<td>{esc(i['sku'])}</td>"
            f"<td>{_product_link(ctx, i['product_id'], i['name'])}</td>"
            f'<td class="num">{i["quantity"]}</td>'
            f'<td class="num">{esc(nok(i["unit_price_cents"]))}</td>'
            f'<td class="num">{esc(nok(i["line_total_cents"]))}</td>')


def _history(ctx: PageContext, o: dict[str, Any]) -> str:
    rows = ctx.rows("SELECT status, note, changed_at FROM order_status_history WHERE "
                    "order_id = ? ORDER BY changed_at, id", (o["id"],))
    body = "".join(f"<tr><td>{stamp(h['changed_at'], ctx.now)}</td><td>{esc(h['status'])}"
                   f"</td><td>{esc(h['note'] or '')}</td></tr>" for h in rows)
    return _table(("When", "Status", "Note"), body) if rows else "<p>No changes yet.</p>"


def _cancel_form(ctx: PageContext, o: dict[str, Any]) -> str:
    """Only an order that has not shipped can be cancelled (``cancel_order``)."""
    if o["status"] != "placed":
        return ""
    reason = text_input("reason", size=50, maxlength=500)
    inner = (labelled("Reason for cancelling (optional)", reason) + " "
             + button("Cancel order"))
    return "<h2>Cancel</h2>" + post_form(ctx.url(f"/orders/{o['id']}/cancel"), inner)


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
    cards = "".join(
        f'<div class="card"><b>{esc(a["label"])}</b>'
        f'{" <span class=muted>(default)</span>" if a["is_default"] else ""}'
        f"<div>{esc(_address_text(a))}</div></div>" for a in _addresses(ctx))
    return Page("Addresses", f"{notice(ctx, DONE)}<h1>Addresses</h1>"
                             f"{cards or '<p>No addresses yet.</p>'}"
                             f"<h2>Add an address</h2>{_address_form(ctx)}")


def _address_form(ctx: PageContext) -> str:
    rows = "".join(f"<p>{_address_field(*spec)}</p>" for spec in ADDRESS_FIELDS)
    then = "checkout" if ctx.request.arg("then") == "checkout" else ""
    inner = (rows + f"<p>{checkbox('make_default', '1', 'Make this my default address')}</p>"
             + hidden("then", then) + button("Save address"))
    return post_form(ctx.url("/addresses"), inner, name="Add an address")


def _address_field(name: str, label: str, required: bool, size: int) -> str:
    control = text_input(name, "NO" if name == "country" else "", maxlength=size,
                         required=required)
    return labelled(label if required else f"{label} (optional)", control)


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
