"""The shop's web pages: AVLager's catalogue with product photos, the cart and the orders.

Photos come from the ``product_images`` table when a world has it (a PNG per product);
the pages read, and the forms call the shop's tools (``add_to_cart``,
``update_cart_item``, ``remove_from_cart``, ``place_order``).
"""

from __future__ import annotations

from typing import Any

from envs.site import Blob, Fields, Page, PageContext, Redirect, Site, esc, link

site = Site(service="shop", title="AVLager",
            nav=(("Products", "/products"), ("Cart", "/cart"), ("Orders", "/orders")))

PER_PAGE = 12


def nok(cents: int | None) -> str:
    """NOK 1 234,50 as the shop shows prices (øre to kroner, excl. MVA)."""
    if cents is None:
        return ""
    kroner, ore = divmod(int(cents), 100)
    return f"NOK {kroner:,}.{ore:02d}".replace(",", " ")


def _has_photo(ctx: PageContext, product_id: int) -> bool:
    return ctx.has_table("product_images") and ctx.value(
        "SELECT count(*) FROM product_images WHERE product_id = ?", (product_id,)) > 0


def _photo(ctx: PageContext, product: dict[str, Any], css: str) -> str:
    if not _has_photo(ctx, int(product["id"])):
        return f'<div class="{css} muted">No photo</div>'
    src = ctx.url(f"/products/{product['id']}/photo")
    return (f'<img class="{css}" src="{esc(src)}" '
            f'alt="Photo of {esc(product["name"])}">')


@site.page("/")
def home(ctx: PageContext) -> Page:
    categories = ctx.rows(
        "SELECT c.slug, c.name, count(p.id) AS n FROM categories c LEFT JOIN products p "
        "ON p.category_id = c.id AND p.is_active = 1 GROUP BY c.id ORDER BY c.name")
    items = "".join(f'<li><a href="{esc(ctx.url("/products", category=c["slug"]))}">'
                    f'{esc(c["name"])}</a> <span class="muted">({c["n"]})</span></li>'
                    for c in categories)
    return Page("Shop", f"<h1>AVLager</h1>{_search_form(ctx, '')}"
                        f"<h2>Categories</h2><ul>{items}</ul>")


def _search_form(ctx: PageContext, query: str) -> str:
    return (f'<form method="get" action="{esc(ctx.url("/products"))}" role="search">'
            f'<label>Search <input type="search" name="q" value="{esc(query)}"></label> '
            f"<button>Search</button></form>")


@site.page("/products")
def products(ctx: PageContext) -> Page:
    query, category = ctx.request.arg("q").strip(), ctx.request.arg("category")
    page = max(1, int(ctx.request.arg("page", "1"))) if ctx.request.arg(
        "page", "1").isdigit() else 1
    where, params = ["p.is_active = 1"], []
    if query:
        where.append("(p.name LIKE ? ESCAPE '\\' OR p.sku LIKE ? ESCAPE '\\' "
                     "OR p.brand LIKE ? ESCAPE '\\')")
        pattern = "%" + query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        params += [pattern, pattern, pattern]
    if category:
        where.append("c.slug = ?")
        params.append(category)
    sql = (f"FROM products p JOIN categories c ON c.id = p.category_id "
           f"WHERE {' AND '.join(where)}")
    total = int(ctx.value(f"SELECT count(*) {sql}", params))
    rows = ctx.rows(f"SELECT p.*, c.name AS category {sql} ORDER BY p.name, p.id "
                    f"LIMIT {PER_PAGE} OFFSET {(page - 1) * PER_PAGE}", params)
    cards = "".join(
        f'<div class="card">{_photo(ctx, p, "thumb")}'
        f"<div>{link(ctx.url('/products/' + str(p['id'])), p['name'])}</div>"
        f'<div class="muted">{esc(p["sku"])} · {esc(p["category"])}</div>'
        f"<div>{esc(nok(p['price_cents']))} excl. MVA</div></div>" for p in rows)
    pages = (total + PER_PAGE - 1) // PER_PAGE
    more = "".join(
        f' <a href="{esc(ctx.url("/products", q=query, category=category, page=n))}">'
        f"{'<b>' + str(n) + '</b>' if n == page else n}</a>" for n in range(1, pages + 1)
    ) if pages > 1 else ""
    heading = f"Results for “{esc(query)}”" if query else "Products"
    return Page("Products", f"<h1>{heading}</h1>{_search_form(ctx, query)}"
                            f'<p class="muted">{total} products</p>'
                            f'<div class="grid">{cards}</div><p>{more}</p>')


@site.page("/products/{product_id:int}")
def product(ctx: PageContext, product_id: int) -> Page:
    p = ctx.row("SELECT p.*, c.name AS category FROM products p JOIN categories c "
                "ON c.id = p.category_id WHERE p.id = ?", (product_id,))
    if p is None:
        return Page("Not found", f"<p>No product {product_id}.</p>", 404)
    stock = f"{p['stock']} {esc(p['unit'])} in stock" if p["stock"] > 0 else "Out of stock"
    form = (f'<form method="post" action="{esc(ctx.url("/cart/add"))}">'
            f'<input type="hidden" name="product_id" value="{p["id"]}">'
            f'<label>Quantity <input type="number" name="quantity" value="1" min="1" '
            f'max="999"></label> <button>Add to cart</button></form>'
            if p["is_active"] else "<p>No longer sold.</p>")
    specs = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in (
        ("SKU", p["sku"]), ("Brand", p["brand"] or ""), ("Category", p["category"]),
        ("Unit", p["unit"]), ("Price", nok(p["price_cents"]) + " excl. MVA"),
        ("Stock", stock)))
    return Page(p["name"], f"<h1>{esc(p['name'])}</h1>{_photo(ctx, p, 'photo')}"
                           f'<table class="specs">{specs}</table><p></p>{form}')


@site.page("/products/{product_id:int}/photo")
def photo(ctx: PageContext, product_id: int) -> Page | Blob:
    found = ctx.row("SELECT content_type, data FROM product_images WHERE product_id = ?",
                    (product_id,)) if ctx.has_table("product_images") else None
    if found is None:
        return Page("Not found", f"<p>No photo of product {product_id}.</p>", 404)
    return Blob(str(found["content_type"]), bytes(found["data"]))


@site.page("/cart")
def cart(ctx: PageContext) -> Page:
    lines = ctx.rows(
        "SELECT ci.quantity, ci.product_id, p.sku, p.name, p.unit, p.price_cents FROM "
        "cart_items ci JOIN products p ON p.id = ci.product_id WHERE ci.user_id = 1 "
        "ORDER BY ci.id")
    if not lines:
        return Page("Cart", "<h1>Cart</h1><p>Your cart is empty.</p>")
    rows = "".join(
        f"<tr><td>{esc(li['sku'])}</td>"
        f"<td>{link(ctx.url('/products/' + str(li['product_id'])), li['name'])}</td>"
        f'<td><form class="inline" method="post" action="{esc(ctx.url("/cart/update"))}">'
        f'<input type="hidden" name="product_id" value="{li["product_id"]}">'
        f'<input type="number" name="quantity" value="{li["quantity"]}" min="1" max="999" '
        f'aria-label="Quantity of {esc(li["sku"])}"> <button>Update</button></form></td>'
        f'<td class="num">{esc(nok(li["price_cents"] * li["quantity"]))}</td>'
        f'<td><form class="inline" method="post" action="{esc(ctx.url("/cart/remove"))}">'
        f'<input type="hidden" name="product_id" value="{li["product_id"]}">'
        f'<button aria-label="Remove {esc(li["sku"])}">Remove</button></form></td></tr>'
        for li in lines)
    subtotal = sum(li["price_cents"] * li["quantity"] for li in lines)
    return Page("Cart", f"<h1>Cart</h1><table><tr><th>SKU</th><th>Product</th>"
                        f'<th>Quantity</th><th class="num">Total</th><th></th></tr>{rows}'
                        f"</table><p>Subtotal: <b>{esc(nok(subtotal))}</b> excl. MVA</p>")


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


@site.page("/orders")
def orders(ctx: PageContext) -> Page:
    rows = ctx.rows("SELECT id, order_number, status, total_cents, placed_at FROM orders "
                    "WHERE user_id = 1 ORDER BY placed_at DESC, id DESC")
    body = "".join(
        f"<tr><td>{link(ctx.url('/orders/' + str(o['id'])), o['order_number'])}</td>"
        f"<td>{esc(o['status'])}</td><td>{esc(o['placed_at'])}</td>"
        f'<td class="num">{esc(nok(o["total_cents"]))}</td></tr>' for o in rows)
    table = (f"<table><tr><th>Order</th><th>Status</th><th>Placed</th>"
             f'<th class="num">Total incl. MVA</th></tr>{body}</table>'
             if rows else "<p>No orders yet.</p>")
    return Page("Orders", f"<h1>Orders</h1>{table}")


@site.page("/orders/{order_id:int}")
def order(ctx: PageContext, order_id: int) -> Page:
    o = ctx.row("SELECT * FROM orders WHERE id = ? AND user_id = 1", (order_id,))
    if o is None:
        return Page("Not found", f"<p>No order {order_id}.</p>", 404)
    items = ctx.rows("SELECT oi.quantity, oi.line_total_cents, p.sku, p.name FROM "
                     "order_items oi JOIN products p ON p.id = oi.product_id "
                     "WHERE oi.order_id = ? ORDER BY oi.id", (order_id,))
    rows = "".join(f"<tr><td>{esc(i['sku'])}</td><td>{esc(i['name'])}</td>"
                   f"<td class=\"num\">{i['quantity']}</td>"
                   f'<td class="num">{esc(nok(i["line_total_cents"]))}</td></tr>'
                   for i in items)
    return Page(o["order_number"], f"<h1>Order {esc(o['order_number'])}</h1>"
                f"<p>Status: <b>{esc(o['status'])}</b> · placed {esc(o['placed_at'])}</p>"
                f'<table><tr><th>SKU</th><th>Product</th><th class="num">Qty</th>'
                f'<th class="num">Total</th></tr>{rows}</table>'
                f"<p>Total incl. MVA: <b>{esc(nok(o['total_cents']))}</b></p>")
