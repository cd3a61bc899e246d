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

from worldenv.apps._common import like
from worldenv.apps.shop import FREE_SHIPPING_FROM_CENTS, SHIPPING_CENTS
from worldenv.core.app import CURRENT_USER
from worldenv.gui.site import Blob, Fields, Markup, Page, PageContext, Redirect, Site, link, markup
from worldenv.sites._html import (
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
    return Page("Not found", markup('<h1>Not found</h1><p>{}</p><p><a href="/shop/products">'
                                    "All products</a></p>", what), 404)


def _order_link(ctx: PageContext, o: dict[str, Any]) -> Markup:
    return link(ctx.url(f"/orders/{o['id']}"), o["order_number"])


def _product_link(ctx: PageContext, product_id: int, name: str) -> Markup:
    return link(ctx.url(f"/products/{product_id}"), name)


def _table(head: tuple[str, ...], rows: Markup, numeric: frozenset[int] = frozenset()
           ) -> Markup:
    num = Markup(' class="num"')
    cells = Markup().join(markup("<th{}>{}</th>", num if i in numeric else Markup(), h)
                          for i, h in enumerate(head))
    return markup("<table><tr>{}</tr>{}</table>", cells, rows)


# --- photos ---------------------------------------------------------------------------------


def _photo_alt(ctx: PageContext, product: dict[str, Any]) -> str | None:
    """The photo's alt text, None when the product has no photo (or the world no table)."""
    if not ctx.has_table("product_images"):
        return None
    found = ctx.row("SELECT alt FROM product_images WHERE product_id = ?", (product["id"],))
    if found is None:
        return None
    return str(found["alt"] or f"Photo of {product['name']}")


def _photo(ctx: PageContext, product: dict[str, Any], css: str) -> Markup:
    alt = _photo_alt(ctx, product)
    if alt is None:
        return markup('<div class="{} muted">No photo</div>', css)
    src = ctx.url(f"/products/{product['id']}/photo")
    return markup('<img class="{}" src="{}" alt="{}">', css, src, alt)


@site.page("/products/{product_id:int}/photo")
def photo(ctx: PageContext, product_id: int) -> Page | Blob:
    found = ctx.row("SELECT content_type, data FROM product_images WHERE product_id = ?",
                    (product_id,)) if ctx.has_table("product_images") else None
    if found is None:
        return _not_found(f"No photo of product {product_id}.")
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


def _problem(line: dict[str, Any]) -> str:
    """Why ``place_order`` would refuse this line ("" when it would not)."""
    if not line["is_active"]:
        return "No longer sold: remove it to order."
    if line["quantity"] > line["stock"]:
        return f"Only {line['stock']} in stock."
    return ""


def _warning(line: dict[str, Any]) -> Markup:
    problem = _problem(line)
    return markup('<div class="error">{}</div>', problem) if problem else Markup()


def _totals_table(totals: Totals) -> Markup:
    rows = (("Subtotal (excl. MVA)", totals.subtotal), ("Shipping", totals.shipping),
            ("MVA 25 %", totals.vat), ("Total incl. MVA", totals.total))
    body = Markup().join(markup('<tr><th>{}</th><td class="num">{}</td></tr>', k, nok(v))
                         for k, v in rows)
    return markup('<table class="totals" aria-label="Totals">{}</table>', body)


def _shipping_hint(totals: Totals) -> Markup:
    if totals.shipping == 0:
        return Markup("" if totals.subtotal == 0 else '<p class="muted">Free shipping.</p>')
    missing = FREE_SHIPPING_FROM_CENTS - totals.subtotal
    return markup('<p class="muted">Shipping is free from {}: add {} more.</p>',
                  nok(FREE_SHIPPING_FROM_CENTS), nok(missing))


# --- home and catalogue ---------------------------------------------------------------------


@site.page("/")
def home(ctx: PageContext) -> Page:
    categories = ctx.rows(
        "SELECT c.slug, c.name, (SELECT count(*) FROM products p WHERE p.category_id = c.id "
        "AND p.is_active = 1) AS n FROM categories c ORDER BY c.name, c.id")
    items = Markup().join(markup('<li><a href="{}">{}</a> <span class="muted">({})</span>'
                                 "</li>", ctx.url("/products", category=c["slug"]),
                                 c["name"], c["n"]) for c in categories)
    return Page("Shop", markup("<h1>AVLager</h1>{}{}<h2>Categories</h2><ul>{}</ul>{}",
                               _search_box(ctx), _cart_summary(ctx), items,
                               _recent_orders(ctx)))


def _search_box(ctx: PageContext) -> Markup:
    return markup('<form method="get" action="{}" role="search">{} {}</form>',
                  ctx.url("/products"),
                  labelled("Search products", text_input("q", kind="search")),
                  button("Search"))


def _cart_summary(ctx: PageContext) -> Markup:
    lines = _cart_lines(ctx)
    if not lines:
        return Markup("<p>Your cart is empty.</p>")
    units = sum(int(line["quantity"]) for line in lines)
    return markup("<p>{} · {} incl. MVA</p>",
                  link(ctx.url("/cart"), "Your cart: " + count(units, "item")),
                  nok(Totals.of(lines).total))


def _recent_orders(ctx: PageContext) -> Markup:
    rows = ctx.rows("SELECT id, order_number, status, placed_at FROM orders WHERE "
                    "user_id = ? ORDER BY placed_at DESC, id DESC LIMIT 3", (ME,))
    items = Markup().join(markup("<li>{} {} · {}</li>", _order_link(ctx, o), o["status"],
                                 day(o["placed_at"])) for o in rows)
    return markup("<h2>Recent orders</h2><ul>{}</ul>", items) if rows else Markup()


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
    cards = Markup().join(_card(ctx, p) for p in rows) or Markup("<p>No products match.</p>")
    shown = count(total, "product") + (
        "" if total <= PER_PAGE else f" · page {f.page} of {_pages(total)}")
    return Page(heading, markup('<h1>{}</h1>{}<p class="muted" role="status">{}</p>'
                                '<div class="grid">{}</div>{}', heading, _filter_form(ctx, f),
                                shown, cards, _pager(ctx, f, total)))


def _pages(total: int) -> int:
    return max(1, (total + PER_PAGE - 1) // PER_PAGE)


def _filter_form(ctx: PageContext, f: Filters) -> Markup:
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
    return markup('<form method="get" action="{}" role="search" class="card">{}</form>',
                  ctx.url("/products"), Markup(" ").join(fields))


def _pager(ctx: PageContext, f: Filters, total: int) -> Markup:
    pages = _pages(total)
    if pages == 1:
        return Markup()
    links = []
    if f.page > 1:
        links.append(link(ctx.url("/products", **f.query(page=f.page - 1)), "Previous"))
    for n in range(1, pages + 1):
        current = Markup(' aria-current="page"' if n == f.page else "")
        links.append(markup('<a href="{}" aria-label="Page {}"{}>{}</a>',
                            ctx.url("/products", **f.query(page=n)), n, current, n))
    if f.page < pages:
        links.append(link(ctx.url("/products", **f.query(page=f.page + 1)), "Next"))
    return markup('<nav aria-label="Pages"><p>{}</p></nav>', Markup(" ").join(links))


def _card(ctx: PageContext, p: dict[str, Any]) -> Markup:
    href = ctx.url(f"/products/{p['id']}")
    return markup('<div class="card">{}<div>{}</div><div class="muted">{} · {}</div>'
                  "<div>{} excl. MVA / {}</div><div>{}</div>{}</div>",
                  _photo(ctx, p, "thumb"), link(href, p["name"]), p["sku"], p["brand"] or "",
                  nok(p["price_cents"]), p["unit"], _stock_text(p), _quick_add(ctx, p))


def _stock_text(p: dict[str, Any]) -> str:
    return f"{p['stock']} {p['unit']} in stock" if p["stock"] > 0 else "Out of stock"


def _quick_add(ctx: PageContext, p: dict[str, Any]) -> Markup:
    if not p["is_active"] or p["stock"] <= 0:
        return Markup()
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
    crumbs = markup('<p class="muted">{} › {}</p>', link(ctx.url("/products"), "Products"),
                    link(ctx.url("/products", category=p["category_slug"]), p["category"]))
    specs = Markup().join(markup("<tr><th>{}</th><td>{}</td></tr>", k, v) for k, v in (
        ("SKU", p["sku"]), ("Brand", p["brand"] or ""), ("Category", p["category"]),
        ("Unit", p["unit"]), ("Price", f"{nok(p['price_cents'])} excl. MVA"),
        ("Stock", _stock_text(p))))
    return Page(p["name"], markup('{}<h1>{}</h1>{}<table class="specs">{}</table>{}{}{}',
                                  crumbs, p["name"], _photo(ctx, p, "photo"), specs,
                                  _in_cart(ctx, p), _add_form(ctx, p), _ordered_in(ctx, p)))


def _in_cart(ctx: PageContext, p: dict[str, Any]) -> Markup:
    quantity = ctx.value("SELECT quantity FROM cart_items WHERE user_id = ? AND "
                         "product_id = ?", (ME, p["id"]))
    if quantity is None:
        return Markup()
    text = f"In your cart: {quantity} {p['unit']}"
    return markup("<p>{}</p>", link(ctx.url("/cart"), text))


def _add_form(ctx: PageContext, p: dict[str, Any]) -> Markup:
    if not p["is_active"]:
        return Markup("<p><b>No longer sold.</b></p>")
    if p["stock"] <= 0:
        return Markup("<p><b>Out of stock</b>: it can't be added to the cart now.</p>")
    quantity = text_input("quantity", 1, kind="number", size=5, maxlength=3)
    inner = (hidden("product_id", p["id"]) + labelled("Quantity", quantity) + " "
             + button("Add to cart"))
    return post_form(ctx.url("/cart/add"), inner)


def _ordered_in(ctx: PageContext, p: dict[str, Any]) -> Markup:
    rows = ctx.rows("SELECT DISTINCT o.id, o.order_number, o.placed_at FROM orders o JOIN "
                    "order_items i ON i.order_id = o.id WHERE o.user_id = ? AND "
                    "i.product_id = ? ORDER BY o.placed_at DESC, o.id DESC", (ME, p["id"]))
    items = Markup().join(markup("<li>{} · {}</li>", _order_link(ctx, o), day(o["placed_at"]))
                          for o in rows)
    return markup("<h2>You ordered it in</h2><ul>{}</ul>", items) if rows else Markup()


# --- the cart --------------------------------------------------------------------------------


@site.page("/cart")
def cart(ctx: PageContext) -> Page:
    lines = _cart_lines(ctx)
    if not lines:
        return Page("Cart", markup("<h1>Cart</h1><p>Your cart is empty.</p><p>{}</p>",
                                   link(ctx.url("/products"), "Browse the products")))
    rows = Markup().join(_cart_row(ctx, line) for line in lines)
    totals = Totals.of(lines)
    table = _table(("Product", "Unit price", "Quantity", "Total", ""), rows,
                   frozenset({1, 3}))
    return Page("Cart", markup("<h1>Cart</h1>{}<h2>Totals</h2>{}{}<p>{}</p>", table,
                               _totals_table(totals), _shipping_hint(totals),
                               link(ctx.url("/checkout"), "Go to checkout")))


def _cart_row(ctx: PageContext, line: dict[str, Any]) -> Markup:
    name, pid = line["name"], line["product_id"]
    quantity = text_input("quantity", line["quantity"], kind="number", size=5, maxlength=3)
    update = post_form(ctx.url("/cart/update"), hidden("product_id", pid)
                       + labelled(f"Quantity of {name}", quantity) + " "
                       + button("Update", f"Update quantity of {name}"), inline=True)
    remove = post_form(ctx.url("/cart/remove"), hidden("product_id", pid)
                       + button("Remove", f"Remove {name} from cart"), inline=True)
    return markup('<tr><td>{}<div class="muted">{}</div>{}</td><td class="num">{} / {}</td>'
                  '<td>{}</td><td class="num">{}</td><td>{}</td></tr>',
                  link(ctx.url(f"/products/{pid}"), name), line["sku"], _warning(line),
                  nok(line["unit_price_cents"]), line["unit"], update,
                  nok(line["line_total_cents"]), remove)


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
        return Page("Checkout", markup("<h1>Checkout</h1><p>Your cart is empty.</p><p>{}</p>",
                                       link(ctx.url("/products"), "Browse the products")))
    rows = Markup().join(markup('<tr><td>{}<div class="muted">{}</div>{}</td>'
                                '<td class="num">{}</td><td class="num">{}</td></tr>',
                                li["name"], li["sku"], _warning(li), li["quantity"],
                                nok(li["line_total_cents"])) for li in lines)
    table = _table(("Product", "Quantity", "Total"), rows, frozenset({1, 2}))
    totals = Totals.of(lines)
    return Page("Checkout", markup("<h1>Checkout</h1>{}<h2>Totals</h2>{}{}{}", table,
                                   _totals_table(totals), _shipping_hint(totals),
                                   _place_form(ctx)))


def _place_form(ctx: PageContext) -> Markup:
    addresses = _addresses(ctx)
    add = link(ctx.url("/addresses", then="checkout"), "Add a new address")
    if not addresses:
        return markup("<h2>Shipping address</h2><p>You have no address yet. {}.</p>", add)
    choices = Markup().join(
        markup('<div><label><input type="radio" name="shipping_address_id" value="{}"{}> '
               "<b>{}</b>: {}</label></div>", a["id"], Markup(" checked" if i == 0 else ""),
               a["label"], _address_text(a)) for i, a in enumerate(addresses))
    inner = markup("<fieldset><legend>Shipping address</legend>{}<p>{}</p></fieldset>"
                   "<p>{}</p>", choices, add, button("Place order"))
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
    body = Markup().join(
        markup('<tr><td>{}</td><td>{}</td><td>{}</td><td class="num">{}, {}</td>'
               '<td class="num">{}</td></tr>', _order_link(ctx, o),
               stamp(o["placed_at"], ctx.now), o["status"], count(o["lines"], "line"),
               count(o["units"], "unit"), nok(o["total_cents"])) for o in rows)
    table = (_table(("Order", "Placed", "Status", "Items", "Total incl. MVA"), body,
                    frozenset({3, 4})) if rows else Markup("<p>No orders.</p>"))
    return Page("Orders", markup("<h1>Orders</h1>{}{}", _status_filter(ctx, status), table))


def _status_filter(ctx: PageContext, status: str) -> Markup:
    options = [("", "All orders"), *((s, s.capitalize()) for s in STATUSES)]
    return markup('<form method="get" action="{}">{} {}</form>', ctx.url("/orders"),
                  labelled("Status", select("status", options, status)), button("Show"))


@site.page("/orders/{order_id:int}")
def order(ctx: PageContext, order_id: int) -> Page:
    o = ctx.row("SELECT * FROM orders WHERE id = ? AND user_id = ?", (order_id, ME))
    if o is None:
        return _not_found(f"No order {order_id}.")
    title = f"Order {o['order_number']}"
    return Page(title, markup("{}<h1>{}</h1>{}<h2>Items</h2>{}<h2>Totals</h2>{}"
                              "<h2>Status history</h2>{}{}", notice(ctx, DONE), title,
                              _order_facts(ctx, o), _order_lines(ctx, o),
                              _totals_table(_order_totals(o)), _history(ctx, o),
                              _cancel_form(ctx, o)))


def _order_totals(o: dict[str, Any]) -> Totals:
    return Totals(o["subtotal_cents"], o["shipping_cents"], o["vat_cents"], o["total_cents"])


def _order_facts(ctx: PageContext, o: dict[str, Any]) -> Markup:
    address = ctx.row("SELECT * FROM addresses WHERE id = ?", (o["shipping_address_id"],))
    facts: list[tuple[str, object]] = [("Status", o["status"]),
                                       ("Placed", stamp(o["placed_at"], ctx.now))]
    if o["shipped_at"]:
        facts.append(("Shipped", stamp(o["shipped_at"], ctx.now)))
    if o["delivered_at"]:
        facts.append(("Delivered", stamp(o["delivered_at"], ctx.now)))
    if o["carrier"] or o["tracking_number"]:
        facts.append(("Carrier", " ".join(str(v) for v in (
            o["carrier"], o["tracking_number"]) if v)))
    if address is not None:
        facts.append(("Ship to", markup("<b>{}</b>: {}", address["label"],
                                        _address_text(address))))
    rows = Markup().join(markup("<tr><th>{}</th><td>{}</td></tr>", k, v) for k, v in facts)
    return markup('<table class="specs">{}</table>', rows)


def _order_lines(ctx: PageContext, o: dict[str, Any]) -> Markup:
    items = ctx.rows("SELECT i.product_id, i.quantity, i.unit_price_cents, i.line_total_cents, "
                     "p.sku, p.name FROM order_items i JOIN products p ON p.id = i.product_id "
                     "WHERE i.order_id = ? ORDER BY i.id", (o["id"],))
    body = Markup().join(markup("<tr>{}</tr>", _line_cells(ctx, i)) for i in items)
    return _table(("SKU", "Product", "Quantity", "Unit price", "Total"), body,
                  frozenset({2, 3, 4}))


def _line_cells(ctx: PageContext, i: dict[str, Any]) -> Markup:
    return markup('<td>{}</td><td>{}</td><td class="num">{}</td><td class="num">{}</td>'
                  '<td class="num">{}</td>', i["sku"],
                  _product_link(ctx, i["product_id"], i["name"]), i["quantity"],
                  nok(i["unit_price_cents"]), nok(i["line_total_cents"]))


def _history(ctx: PageContext, o: dict[str, Any]) -> Markup:
    rows = ctx.rows("SELECT status, note, changed_at FROM order_status_history WHERE "
                    "order_id = ? ORDER BY changed_at, id", (o["id"],))
    body = Markup().join(markup("<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                                stamp(h["changed_at"], ctx.now), h["status"], h["note"])
                         for h in rows)
    return (_table(("When", "Status", "Note"), body) if rows
            else Markup("<p>No changes yet.</p>"))


def _cancel_form(ctx: PageContext, o: dict[str, Any]) -> Markup:
    """Only an order that has not shipped can be cancelled (``cancel_order``)."""
    if o["status"] != "placed":
        return Markup()
    reason = text_input("reason", size=50, maxlength=500)
    inner = (labelled("Reason for cancelling (optional)", reason) + " "
             + button("Cancel order"))
    return Markup("<h2>Cancel</h2>") + post_form(ctx.url(f"/orders/{o['id']}/cancel"), inner)


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
    default = Markup(" <span class=muted>(default)</span>")
    cards = Markup().join(
        markup('<div class="card"><b>{}</b>{}<div>{}</div></div>', a["label"],
               default if a["is_default"] else Markup(), _address_text(a))
        for a in _addresses(ctx))
    return Page("Addresses", markup("{}<h1>Addresses</h1>{}<h2>Add an address</h2>{}",
                                    notice(ctx, DONE),
                                    cards or Markup("<p>No addresses yet.</p>"),
                                    _address_form(ctx)))


def _address_form(ctx: PageContext) -> Markup:
    rows = Markup().join(markup("<p>{}</p>", _address_field(*spec)) for spec in ADDRESS_FIELDS)
    then = "checkout" if ctx.request.arg("then") == "checkout" else ""
    inner = (rows + markup("<p>{}</p>", checkbox("make_default", "1",
                                                 "Make this my default address"))
             + hidden("then", then) + button("Save address"))
    return post_form(ctx.url("/addresses"), inner, name="Add an address")


def _address_field(name: str, label: str, required: bool, size: int) -> Markup:
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
