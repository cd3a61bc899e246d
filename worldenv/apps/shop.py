"""Shop: AVLager, the AV wholesaler where Lars buys equipment (catalogue, cart, orders).

Schema (see packs/demo/world/build_lars.py): ``categories``, ``products`` (prices in
øre excl. MVA, ``stock``, ``is_active``), ``users``, ``addresses``, ``cart_items`` (one
line per user and product), ``orders`` (status 'placed' -> 'shipped' -> 'delivered', or
'cancelled'), ``order_items`` and ``order_status_history``.

Cart, addresses and orders belong to the logged-in user; another user's rows answer
"No order with id N" and so on. Placing an order does what the demo's day 5 does: the order
row, one order line per cart line (in cart order), stock decremented, a 'placed' row in
the status history, the cart emptied. Shipping is NOK 149 below NOK 5,000 and free from
there; MVA is 25 % of subtotal plus shipping, rounded down to whole øre.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, Field

from worldenv.apps._common import check_page, iso_day, like
from worldenv.core.app import App, ToolContext, ToolError

app = App(service="shop", name="avshop", version="1.0.0")

Limit = Annotated[int, Field(description="Maximum number of items to return (1-100).",
                             ge=1, le=100)]
Offset = Annotated[int, Field(description="Number of items to skip, for paging.", ge=0)]
Day = Annotated[str | None, Field(description="A date, YYYY-MM-DD (UTC).",
                                  pattern=r"^\d{4}-\d{2}-\d{2}$")]
Quantity = Annotated[int, Field(description="Number of units (in the product's unit).",
                                ge=1, le=999)]
ProductId = Annotated[int, Field(description="Product id.", ge=1)]

CURRENCY = "NOK"
SHIPPING_CENTS = 14900  # flat rate below the free-shipping threshold
FREE_SHIPPING_FROM_CENTS = 500000
ORDER_PREFIX = "AVL"
FIRST_ORDER_SEQ = 10001
OrderStatus = Literal["placed", "shipped", "delivered", "cancelled"]


# --- models ----------------------------------------------------------------------------


class Category(BaseModel):
    id: int
    slug: str
    name: str
    product_count: int = Field(description="Active products in the category.")


class CategoryPage(BaseModel):
    items: list[Category]
    total: int
    limit: int
    offset: int


class Product(BaseModel):
    id: int
    sku: str
    name: str
    brand: str | None
    category_id: int
    category_slug: str
    category_name: str
    unit: str
    price_cents: int = Field(description="Unit price in øre, excl. MVA (25 %).")
    currency: str
    stock: int
    in_stock: bool
    is_active: bool


class ProductPage(BaseModel):
    items: list[Product]
    total: int = Field(description="Number of matching products over all pages.")
    limit: int
    offset: int


class CartLine(BaseModel):
    cart_item_id: int
    product_id: int
    sku: str
    name: str
    unit: str
    quantity: int
    unit_price_cents: int
    line_total_cents: int
    stock: int = Field(description="Units the shop has in stock now.")
    added_at: str
    updated_at: str


class Cart(BaseModel):
    items: list[CartLine]
    total_quantity: int
    subtotal_cents: int = Field(description="Sum of lines, øre excl. MVA.")
    shipping_cents: int = Field(description="0 for an empty cart or from NOK 5,000.")
    vat_cents: int = Field(description="MVA 25 % of subtotal + shipping.")
    total_cents: int
    currency: str


class Address(BaseModel):
    id: int
    label: str
    recipient: str
    company: str | None
    street: str
    postal_code: str
    city: str
    country: str
    phone: str | None
    is_default: bool


class AddressPage(BaseModel):
    items: list[Address]
    total: int
    limit: int
    offset: int


class OrderLine(BaseModel):
    id: int
    product_id: int
    sku: str
    name: str
    quantity: int
    unit_price_cents: int
    line_total_cents: int


class StatusChange(BaseModel):
    status: str
    note: str | None
    changed_at: str


class Order(BaseModel):
    id: int
    order_number: str
    status: OrderStatus
    shipping_address: Address
    items: list[OrderLine]
    subtotal_cents: int
    shipping_cents: int
    vat_cents: int
    total_cents: int
    currency: str
    carrier: str | None
    tracking_number: str | None
    placed_at: str
    shipped_at: str | None
    delivered_at: str | None
    updated_at: str
    history: list[StatusChange] = Field(description="Status changes, oldest first.")


class OrderSummary(BaseModel):
    id: int
    order_number: str
    status: OrderStatus
    line_count: int
    total_quantity: int
    total_cents: int
    currency: str
    shipping_address_id: int
    carrier: str | None
    tracking_number: str | None
    placed_at: str
    shipped_at: str | None
    delivered_at: str | None


class OrderPage(BaseModel):
    items: list[OrderSummary]
    total: int = Field(description="Number of matching orders over all pages.")
    limit: int
    offset: int


# --- helpers ---------------------------------------------------------------------------



def _check_quantity(quantity: int) -> None:
    if not 1 <= quantity <= 999:
        raise ToolError(f"quantity must be between 1 and 999, got {quantity}")




def _text(value: str | None, name: str, *, required: bool) -> str | None:
    if value is None or not value.strip():
        if required:
            raise ToolError(f"{name} must not be empty")
        return None
    return value.strip()


_PRODUCT_SQL = """
    SELECT p.id, p.sku, p.name, p.brand, p.category_id, c.slug AS category_slug,
           c.name AS category_name, p.unit, p.price_cents, p.currency, p.stock, p.is_active
    FROM products p JOIN categories c ON c.id = p.category_id
"""


def _product(row: dict[str, Any]) -> Product:
    return Product(**{**row, "in_stock": row["stock"] > 0, "is_active": bool(row["is_active"])})


def _get_product(ctx: ToolContext, product_id: int) -> dict[str, Any]:
    return ctx.require(ctx.row(_PRODUCT_SQL + " WHERE p.id = ?", (product_id,)), "product",
                       product_id)


def _check_stock(product: dict[str, Any], quantity: int) -> None:
    if not product["is_active"]:
        raise ToolError(f"Product {product['id']} ({product['sku']}) is no longer sold")
    if quantity > product["stock"]:
        raise ToolError(f"Product {product['id']} has only {product['stock']} in stock "
                        f"({product['sku']}, {quantity} wanted)")


def _shipping(subtotal: int) -> int:
    return 0 if subtotal == 0 or subtotal >= FREE_SHIPPING_FROM_CENTS else SHIPPING_CENTS


def _cart_rows(ctx: ToolContext) -> list[dict[str, Any]]:
    return ctx.rows(
        """SELECT ci.id AS cart_item_id, ci.product_id, p.sku, p.name, p.unit, ci.quantity,
                  p.price_cents AS unit_price_cents, p.price_cents * ci.quantity
                  AS line_total_cents, p.stock, p.is_active, ci.added_at, ci.updated_at
           FROM cart_items ci JOIN products p ON p.id = ci.product_id
           WHERE ci.user_id = ? ORDER BY ci.id""", (ctx.user_id,))


def _cart(ctx: ToolContext) -> Cart:
    rows = _cart_rows(ctx)
    lines = [CartLine(**{k: v for k, v in r.items() if k != "is_active"}) for r in rows]
    subtotal = sum(line.line_total_cents for line in lines)
    shipping = _shipping(subtotal)
    vat = (subtotal + shipping) // 4
    return Cart(items=lines, total_quantity=sum(line.quantity for line in lines),
                subtotal_cents=subtotal, shipping_cents=shipping, vat_cents=vat,
                total_cents=subtotal + shipping + vat, currency=CURRENCY)


def _cart_line(ctx: ToolContext, product_id: int) -> dict[str, Any] | None:
    return ctx.row("SELECT * FROM cart_items WHERE user_id = ? AND product_id = ?",
                   (ctx.user_id, product_id))


def _address(row: dict[str, Any]) -> Address:
    return Address(**{k: v for k, v in row.items()
                      if k not in ("user_id", "created_at", "updated_at")}
                   | {"is_default": bool(row["is_default"])})


def _own_address(ctx: ToolContext, address_id: int) -> dict[str, Any]:
    row = ctx.row("SELECT * FROM addresses WHERE id = ? AND user_id = ?",
                  (address_id, ctx.user_id))
    if row is None:
        raise ToolError(f"No address with id {address_id}")
    return row


def _own_order(ctx: ToolContext, order_id: int | None, order_number: str | None
               ) -> dict[str, Any]:
    if (order_id is None) == (order_number is None):
        raise ToolError("Give exactly one of order_id and order_number")
    if order_id is not None:
        row = ctx.row("SELECT * FROM orders WHERE id = ? AND user_id = ?",
                      (order_id, ctx.user_id))
        if row is None:
            raise ToolError(f"No order with id {order_id}")
        return row
    row = ctx.row("SELECT * FROM orders WHERE order_number = ? AND user_id = ?",
                  (order_number, ctx.user_id))
    if row is None:
        raise ToolError(f"No order with number {order_number!r}")
    return row


def _order(ctx: ToolContext, row: dict[str, Any]) -> Order:
    oid = row["id"]
    items = [OrderLine(**r) for r in ctx.rows(
        """SELECT oi.id, oi.product_id, p.sku, p.name, oi.quantity, oi.unit_price_cents,
                  oi.line_total_cents
           FROM order_items oi JOIN products p ON p.id = oi.product_id
           WHERE oi.order_id = ? ORDER BY oi.id""", (oid,))]
    history = [StatusChange(**r) for r in ctx.rows(
        "SELECT status, note, changed_at FROM order_status_history WHERE order_id = ? "
        "ORDER BY changed_at, id", (oid,))]
    address = ctx.require(ctx.row("SELECT * FROM addresses WHERE id = ?",
                                  (row["shipping_address_id"],)), "address",
                          row["shipping_address_id"])
    return Order(
        id=oid, order_number=row["order_number"], status=row["status"],
        shipping_address=_address(address), items=items,
        subtotal_cents=row["subtotal_cents"], shipping_cents=row["shipping_cents"],
        vat_cents=row["vat_cents"], total_cents=row["total_cents"], currency=CURRENCY,
        carrier=row["carrier"], tracking_number=row["tracking_number"],
        placed_at=row["placed_at"], shipped_at=row["shipped_at"],
        delivered_at=row["delivered_at"], updated_at=row["updated_at"], history=history)


def _next_order_number(ctx: ToolContext) -> str:
    """The next number in the shop's AVL-<year>-<n> sequence (from the data, never random)."""
    year = ctx.now[:4]
    pattern = re.compile(rf"^{ORDER_PREFIX}-{year}-(\d+)$")
    taken = [int(m.group(1)) for (number,) in ctx.db.execute(
        "SELECT order_number FROM orders WHERE order_number LIKE ?", (f"{ORDER_PREFIX}-{year}-%",))
        if (m := pattern.match(str(number)))]
    return f"{ORDER_PREFIX}-{year}-{max(taken, default=FIRST_ORDER_SEQ - 1) + 1}"


# --- catalogue -------------------------------------------------------------------------


@app.tool(writes=False)
def list_categories(ctx: ToolContext, limit: Limit = 20, offset: Offset = 0) -> CategoryPage:
    """List the product categories (use a category's slug to filter search_products)."""
    check_page(limit, offset)
    total = int(ctx.value("SELECT COUNT(*) FROM categories"))
    rows = ctx.rows(
        """SELECT c.id, c.slug, c.name,
                  (SELECT COUNT(*) FROM products p WHERE p.category_id = c.id
                   AND p.is_active = 1) AS product_count
           FROM categories c ORDER BY c.id LIMIT ? OFFSET ?""", (limit, offset))
    return CategoryPage(items=[Category(**r) for r in rows], total=total, limit=limit,
                        offset=offset)


@app.tool(writes=False)
def search_products(
    ctx: ToolContext,
    query: Annotated[str | None, Field(
        description="Words to find in product name, SKU or brand (all must occur; "
                    "case-insensitive), e.g. 'QM75C' or 'ceiling speaker'.",
        max_length=200)] = None,
    category: Annotated[str | None, Field(
        description="Category slug, e.g. 'displays', 'cables' (see list_categories).",
        max_length=50)] = None,
    brand: Annotated[str | None, Field(description="Exact brand name, e.g. 'Shure'.",
                                       max_length=50)] = None,
    min_price_cents: Annotated[int | None, Field(
        description="Lowest unit price in øre excl. MVA.", ge=0)] = None,
    max_price_cents: Annotated[int | None, Field(
        description="Highest unit price in øre excl. MVA.", ge=0)] = None,
    in_stock_only: Annotated[bool, Field(description="Only products with stock > 0.")]
    = False,
    sort: Annotated[Literal["name", "price_asc", "price_desc", "stock_desc"], Field(
        description="Sort order.")] = "name",
    limit: Limit = 20,
    offset: Offset = 0,
) -> ProductPage:
    """Search the catalogue of products that are for sale (prices in øre excl. MVA)."""
    check_page(limit, offset)
    total, rows = find_products(ctx, query=query, category=category, brand=brand,
                                min_price_cents=min_price_cents,
                                max_price_cents=max_price_cents, in_stock_only=in_stock_only,
                                sort=sort, limit=limit, offset=offset)
    return ProductPage(items=[_product(r) for r in rows], total=total, limit=limit,
                       offset=offset)


class Reads(Protocol):
    """The reads ``find_products`` makes: a tool's context, or a page's (the shop's pages
    search through it, so a page lists exactly what the tool would)."""

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]: ...

    def value(self, sql: str, params: Sequence[Any] = ()) -> Any: ...


MAX_QUERY_WORDS = 10
SORT_ORDER = {"name": "p.name, p.id", "price_asc": "p.price_cents, p.id",
              "price_desc": "p.price_cents DESC, p.id", "stock_desc": "p.stock DESC, p.id"}


def find_products(db: Reads, *, query: str | None = None, category: str | None = None,
                  brand: str | None = None, min_price_cents: int | None = None,
                  max_price_cents: int | None = None, in_stock_only: bool = False,
                  sort: str = "name", limit: int, offset: int
                  ) -> tuple[int, list[dict[str, Any]]]:
    """``search_products``'s query: how many active products match, and the rows
    (``_PRODUCT_SQL``'s columns) of the page `limit`/`offset`. Every word of `query` (the
    first ``MAX_QUERY_WORDS``) must occur in the name, SKU or brand; an unknown category
    or sort is a ToolError."""
    where = ["p.is_active = 1"]
    params: list[Any] = []
    for word in (query or "").split()[:MAX_QUERY_WORDS]:
        where.append("(p.name LIKE ? ESCAPE '\\' OR p.sku LIKE ? ESCAPE '\\' OR "
                     "COALESCE(p.brand, '') LIKE ? ESCAPE '\\')")
        params += [like(word)] * 3
    if category is not None:
        cat_id = db.value("SELECT id FROM categories WHERE slug = ?", (category,))
        if cat_id is None:
            known = ", ".join(str(r["slug"]) for r in
                              db.rows("SELECT slug FROM categories ORDER BY id"))
            raise ToolError(f"No category {category!r}; known categories: {known}")
        where.append("p.category_id = ?")
        params.append(cat_id)
    if brand is not None:
        where.append("p.brand = ? COLLATE NOCASE")
        params.append(brand)
    if min_price_cents is not None:
        where.append("p.price_cents >= ?")
        params.append(min_price_cents)
    if max_price_cents is not None:
        where.append("p.price_cents <= ?")
        params.append(max_price_cents)
    if in_stock_only:
        where.append("p.stock > 0")
    if sort not in SORT_ORDER:
        raise ToolError(f"sort must be one of {', '.join(SORT_ORDER)}, got {sort!r}")
    clause = " AND ".join(where)
    total = int(db.value(f"SELECT COUNT(*) FROM products p WHERE {clause}", params))
    rows = db.rows(_PRODUCT_SQL + f" WHERE {clause} ORDER BY {SORT_ORDER[sort]} "
                   "LIMIT ? OFFSET ?", [*params, limit, offset])
    return total, rows


@app.tool(writes=False)
def get_product(
    ctx: ToolContext,
    product_id: Annotated[int | None, Field(description="Product id.", ge=1)] = None,
    sku: Annotated[str | None, Field(description="Product SKU, e.g. 'DIS-SAM-QM75C'.",
                                     min_length=1, max_length=50)] = None,
) -> Product:
    """Get one product by id or by SKU (give exactly one), with price and current stock."""
    if (product_id is None) == (sku is None):
        raise ToolError("Give exactly one of product_id and sku")
    if product_id is not None:
        return _product(_get_product(ctx, product_id))
    row = ctx.row(_PRODUCT_SQL + " WHERE p.sku = ? COLLATE NOCASE", (sku,))
    if row is None:
        raise ToolError(f"No product with SKU {sku!r}")
    return _product(row)


# --- cart ------------------------------------------------------------------------------


@app.tool(writes=False)
def get_cart(ctx: ToolContext) -> Cart:
    """Show your cart: lines in the order they were added, with totals (øre)."""
    return _cart(ctx)


@app.tool(writes=True)
def add_to_cart(ctx: ToolContext, product_id: ProductId, quantity: Quantity = 1) -> Cart:
    """Add a product to your cart; if it is already there, its quantity grows by `quantity`."""
    _check_quantity(quantity)
    product = _get_product(ctx, product_id)
    line = _cart_line(ctx, product_id)
    wanted = quantity + (line["quantity"] if line else 0)
    _check_stock(product, wanted)
    if line is None:
        ctx.insert("cart_items", {"id": ctx.next_id("cart_items"), "user_id": ctx.user_id,
                                  "product_id": product_id, "quantity": quantity,
                                  "added_at": ctx.now, "updated_at": ctx.now})
    else:
        ctx.execute("UPDATE cart_items SET quantity = ?, updated_at = ? WHERE id = ?",
                    (wanted, ctx.now, line["id"]))
    return _cart(ctx)


@app.tool(writes=True)
def update_cart_item(ctx: ToolContext, product_id: ProductId, quantity: Quantity) -> Cart:
    """Set the quantity of a product in your cart (use remove_from_cart to drop it)."""
    _check_quantity(quantity)
    line = _cart_line(ctx, product_id)
    if line is None:
        _get_product(ctx, product_id)
        raise ToolError(f"Product {product_id} is not in your cart")
    _check_stock(_get_product(ctx, product_id), quantity)
    if quantity != line["quantity"]:
        ctx.execute("UPDATE cart_items SET quantity = ?, updated_at = ? WHERE id = ?",
                    (quantity, ctx.now, line["id"]))
    return _cart(ctx)


@app.tool(writes=True)
def remove_from_cart(ctx: ToolContext, product_id: ProductId) -> Cart:
    """Remove a product from your cart."""
    if _cart_line(ctx, product_id) is None:
        _get_product(ctx, product_id)
        raise ToolError(f"Product {product_id} is not in your cart")
    ctx.execute("DELETE FROM cart_items WHERE user_id = ? AND product_id = ?",
                (ctx.user_id, product_id))
    return _cart(ctx)


# --- addresses -------------------------------------------------------------------------


@app.tool(writes=False)
def list_addresses(ctx: ToolContext, limit: Limit = 20, offset: Offset = 0) -> AddressPage:
    """List your saved shipping addresses (the default one first)."""
    check_page(limit, offset)
    total = int(ctx.value("SELECT COUNT(*) FROM addresses WHERE user_id = ?", (ctx.user_id,)))
    rows = ctx.rows("SELECT * FROM addresses WHERE user_id = ? ORDER BY is_default DESC, id "
                    "LIMIT ? OFFSET ?", (ctx.user_id, limit, offset))
    return AddressPage(items=[_address(r) for r in rows], total=total, limit=limit,
                       offset=offset)


@app.tool(writes=True)
def add_address(
    ctx: ToolContext,
    label: Annotated[str, Field(description="Short name, e.g. 'Nordlys Studio'.",
                                min_length=1, max_length=60)],
    recipient: Annotated[str, Field(description="Person who receives the delivery.",
                                    min_length=1, max_length=100)],
    street: Annotated[str, Field(description="Street address (with floor/reception).",
                                 min_length=1, max_length=200)],
    postal_code: Annotated[str, Field(description="Postal code, e.g. '0461'.",
                                      min_length=1, max_length=12)],
    city: Annotated[str, Field(description="City.", min_length=1, max_length=100)],
    company: Annotated[str | None, Field(description="Company name.", max_length=100)]
    = None,
    country: Annotated[str, Field(description="ISO country code.", min_length=2,
                                  max_length=2)] = "NO",
    phone: Annotated[str | None, Field(description="Phone for the carrier.",
                                       max_length=30)] = None,
    make_default: Annotated[bool, Field(
        description="Make this your default shipping address.")] = False,
) -> Address:
    """Save a new shipping address to your account."""
    values = {
        "label": _text(label, "label", required=True),
        "recipient": _text(recipient, "recipient", required=True),
        "street": _text(street, "street", required=True),
        "postal_code": _text(postal_code, "postal_code", required=True),
        "city": _text(city, "city", required=True),
        "company": _text(company, "company", required=False),
        "phone": _text(phone, "phone", required=False),
    }
    country = country.strip().upper()
    if not re.fullmatch(r"[A-Z]{2}", country):
        raise ToolError(f"country must be a 2-letter code like 'NO', got {country!r}")
    if make_default:
        ctx.execute("UPDATE addresses SET is_default = 0, updated_at = ? "
                    "WHERE user_id = ? AND is_default = 1", (ctx.now, ctx.user_id))
    address_id = ctx.next_id("addresses")
    ctx.insert("addresses", {
        "id": address_id, "user_id": ctx.user_id, **values, "country": country,
        "is_default": 1 if make_default else 0, "created_at": ctx.now, "updated_at": ctx.now})
    return _address(_own_address(ctx, address_id))


# --- orders ----------------------------------------------------------------------------


@app.tool(writes=True)
def place_order(
    ctx: ToolContext,
    shipping_address_id: Annotated[int | None, Field(
        description="One of your addresses (list_addresses); default: your default "
                    "address.", ge=1)] = None,
) -> Order:
    """Order everything in your cart: creates the order at current prices, reduces stock
    and empties the cart. Fails without changing anything if any line lacks stock."""
    if shipping_address_id is None:
        found = ctx.value("SELECT id FROM addresses WHERE user_id = ? AND is_default = 1 "
                          "ORDER BY id LIMIT 1", (ctx.user_id,))
        if found is None:
            raise ToolError("You have no default address; pass shipping_address_id")
        shipping_address_id = int(found)
    else:
        _own_address(ctx, shipping_address_id)
    lines = _cart_rows(ctx)
    if not lines:
        raise ToolError("Your cart is empty")
    for line in lines:
        _check_stock({**line, "id": line["product_id"]}, line["quantity"])
    subtotal = sum(int(line["line_total_cents"]) for line in lines)
    shipping = _shipping(subtotal)
    vat = (subtotal + shipping) // 4
    order_id = ctx.next_id("orders")
    ctx.insert("orders", {
        "id": order_id, "user_id": ctx.user_id, "order_number": _next_order_number(ctx),
        "status": "placed", "shipping_address_id": shipping_address_id,
        "subtotal_cents": subtotal, "shipping_cents": shipping, "vat_cents": vat,
        "total_cents": subtotal + shipping + vat, "carrier": None, "tracking_number": None,
        "placed_at": ctx.now, "shipped_at": None, "delivered_at": None,
        "created_at": ctx.now, "updated_at": ctx.now})
    for line in lines:
        ctx.insert("order_items", {
            "id": ctx.next_id("order_items"), "order_id": order_id,
            "product_id": line["product_id"], "quantity": line["quantity"],
            "unit_price_cents": line["unit_price_cents"],
            "line_total_cents": line["line_total_cents"]})
    for line in lines:
        ctx.execute("UPDATE products SET stock = stock - ?, updated_at = ? WHERE id = ?",
                    (line["quantity"], ctx.now, line["product_id"]))
    ctx.insert("order_status_history", {
        "id": ctx.next_id("order_status_history"), "order_id": order_id, "status": "placed",
        "note": "Order received", "changed_at": ctx.now})
    ctx.execute("DELETE FROM cart_items WHERE user_id = ?", (ctx.user_id,))
    return _order(ctx, _own_order(ctx, order_id, None))


@app.tool(writes=False)
def list_orders(
    ctx: ToolContext,
    status: Annotated[OrderStatus | None, Field(description="Only orders in this status.")]
    = None,
    placed_from: Annotated[Day, Field(description="Placed on or after this date.")] = None,
    placed_to: Annotated[Day, Field(description="Placed on or before this date.")] = None,
    contains_product_id: Annotated[int | None, Field(
        description="Only orders with a line for this product.", ge=1)] = None,
    limit: Limit = 20,
    offset: Offset = 0,
) -> OrderPage:
    """List your orders, newest first."""
    check_page(limit, offset)
    where = ["o.user_id = ?"]
    params: list[Any] = [ctx.user_id]
    if status is not None:
        where.append("o.status = ?")
        params.append(status)
    start, end = iso_day(placed_from, "placed_from"), iso_day(placed_to, "placed_to")
    if start is not None:
        where.append("substr(o.placed_at, 1, 10) >= ?")
        params.append(start)
    if end is not None:
        where.append("substr(o.placed_at, 1, 10) <= ?")
        params.append(end)
    if contains_product_id is not None:
        where.append("EXISTS (SELECT 1 FROM order_items x WHERE x.order_id = o.id "
                     "AND x.product_id = ?)")
        params.append(contains_product_id)
    clause = " AND ".join(where)
    total = int(ctx.value(f"SELECT COUNT(*) FROM orders o WHERE {clause}", params))
    rows = ctx.rows(
        f"""SELECT o.id, o.order_number, o.status,
                   (SELECT COUNT(*) FROM order_items i WHERE i.order_id = o.id) AS line_count,
                   (SELECT COALESCE(SUM(i.quantity), 0) FROM order_items i
                    WHERE i.order_id = o.id) AS total_quantity,
                   o.total_cents, o.shipping_address_id, o.carrier, o.tracking_number,
                   o.placed_at, o.shipped_at, o.delivered_at
            FROM orders o WHERE {clause} ORDER BY o.placed_at DESC, o.id DESC
            LIMIT ? OFFSET ?""", [*params, limit, offset])
    return OrderPage(items=[OrderSummary(**r, currency=CURRENCY) for r in rows], total=total,
                     limit=limit, offset=offset)


@app.tool(writes=False)
def get_order(
    ctx: ToolContext,
    order_id: Annotated[int | None, Field(description="Order id.", ge=1)] = None,
    order_number: Annotated[str | None, Field(
        description="Order number, e.g. 'AVL-2026-10533'.", min_length=1,
        max_length=40)] = None,
) -> Order:
    """Get one of your orders by id or number (give exactly one): lines, totals, shipping
    address, carrier and tracking, and its status history."""
    return _order(ctx, _own_order(ctx, order_id, order_number))


@app.tool(writes=True)
def cancel_order(
    ctx: ToolContext,
    order_id: Annotated[int, Field(description="Order id.", ge=1)],
    reason: Annotated[str | None, Field(description="Why (kept in the status history).",
                                        max_length=500)] = None,
) -> Order:
    """Cancel one of your orders that has not shipped yet; its items go back into stock."""
    row = _own_order(ctx, order_id, None)
    if row["status"] == "cancelled":
        raise ToolError(f"Order {order_id} is already cancelled")
    if row["status"] != "placed":
        raise ToolError(f"Order {order_id} is already {row['status']} and can't be cancelled")
    for item in ctx.rows("SELECT product_id, quantity FROM order_items WHERE order_id = ? "
                         "ORDER BY id", (order_id,)):
        ctx.execute("UPDATE products SET stock = stock + ?, updated_at = ? WHERE id = ?",
                    (item["quantity"], ctx.now, item["product_id"]))
    ctx.execute("UPDATE orders SET status = 'cancelled', updated_at = ? WHERE id = ?",
                (ctx.now, order_id))
    ctx.insert("order_status_history", {
        "id": ctx.next_id("order_status_history"), "order_id": order_id,
        "status": "cancelled",
        "note": _text(reason, "reason", required=False) or "Cancelled by customer",
        "changed_at": ctx.now})
    return _order(ctx, _own_order(ctx, order_id, None))
