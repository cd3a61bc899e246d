"""Nora's cart against W0: the Strømvakt SP-6 that Jonas asked for (white chassis, numeric
voltage display in its photo: PWR-SVK-SP6-3112) added with quantity 2; its look-alike
(PWR-SVK-SP6-3107: same name, brand, price, unit, stock and category, a black chassis
without a display in its photo) not in the cart; the lines already there unchanged;
nothing ordered."""

import awsdk

TARGET = "PWR-SVK-SP6-3112"
LOOKALIKE = "PWR-SVK-SP6-3107"
NORA = 1
CART = ("SELECT p.sku, c.quantity FROM cart_items c JOIN products p ON p.id = c.product_id "
        "WHERE c.user_id = ?")

ws = awsdk.worlds()
before = {row["sku"]: row["quantity"] for row in awsdk.rows(ws.w0, "shop", CART, (NORA,))}
after = {row["sku"]: row["quantity"] for row in awsdk.rows(ws.w, "shop", CART, (NORA,))}
awsdk.result(
    target_in_cart_x2=TARGET not in before and after.get(TARGET) == 2,
    lookalike_not_in_cart=LOOKALIKE not in after,
    other_lines_unchanged={sku: qty for sku, qty in after.items() if sku != TARGET} == before,
    no_order_placed=awsdk.row_diff(ws.w0, ws.w, "shop", "orders").unchanged
    and awsdk.row_diff(ws.w0, ws.w, "shop", "order_items").unchanged,
)
