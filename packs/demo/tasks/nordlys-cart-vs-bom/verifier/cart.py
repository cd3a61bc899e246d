"""The cart against W0's approved BOM: every `order` line at its BOM quantity except the
ClickShare CX-30, which the shop has none of on day 3; no `stock` line; nothing ordered."""

import re

import awsdk

BOM = "jobs/nordlys/bom.md"
NO_STOCK_YET = "WPS-BAR-CX30"
DRAFT_MOUNT = "MNT-VOG-PFW6400"
LARS = 1
# A BOM table row: | # | SKU | Item | Qty | Unit NOK | Line NOK | Source |
BOM_ROW = re.compile(r"^\|\s*\d+\s*\|\s*(?P<sku>[A-Za-z0-9-]+)\s*\|.*\|\s*(?P<qty>\d+)\s*\|"
                     r"[^|]*\|[^|]*\|\s*(?P<source>order|stock)\s*\|\s*$")

ws = awsdk.worlds()


def bom_lines(source: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for line in (awsdk.file_text(ws.w0, BOM) or "").splitlines():
        match = BOM_ROW.match(line)
        if match and match["source"] == source:
            found[match["sku"]] = int(match["qty"])
    return found


to_order = bom_lines("order")
expected = {sku: qty for sku, qty in to_order.items() if sku != NO_STOCK_YET}
cart = {row["sku"]: row["quantity"] for row in awsdk.rows(
    ws.w, "shop", "SELECT p.sku, c.quantity FROM cart_items c "
                  "JOIN products p ON p.id = c.product_id WHERE c.user_id = ?", (LARS,))}
awsdk.result(
    cart_is_bom_order_lines_without_cx30=NO_STOCK_YET in to_order and cart == expected,
    draft_mount_removed=DRAFT_MOUNT not in cart,
    no_stock_line_in_cart=not set(bom_lines("stock")) & set(cart),
    no_order_placed=awsdk.row_diff(ws.w0, ws.w, "shop", "orders").unchanged
    and awsdk.row_diff(ws.w0, ws.w, "shop", "order_items").unchanged,
)
