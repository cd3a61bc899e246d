"""The ordering checklist (note 7) keeps its lines and gains the reconciliation: order
AVL-2026-10533's subtotal NOK 119,765.00 + the stock lines' list value NOK 3,879.00 =
NOK 123,644.00, the equipment total of quote Q-2026-014. The shop is left alone."""

from pathlib import Path

import awsdk

CHECKLIST_NOTE = 7
SHOP_TABLES = ("orders", "order_items", "order_status_history", "products", "cart_items")

ws = awsdk.worlds()


def note_lines(world: Path) -> list[str] | None:
    body = awsdk.value(world, "notes", "SELECT body FROM notes WHERE id = ?",
                       (CHECKLIST_NOTE,))
    return None if body is None else body.splitlines()


before, after = note_lines(ws.w0) or [], note_lines(ws.w)
added = "\n".join(line for line in after or [] if line not in before)
awsdk.result(
    note_keeps_its_lines=after is not None and all(line in after for line in before),
    note_names_order=awsdk.contains(added, "AVL-2026-10533"),
    note_gives_order_subtotal=awsdk.has_amount(added, "119765.00"),
    note_gives_stock_value=awsdk.has_amount(added, "3879.00"),
    note_gives_equipment_total=awsdk.has_amount(added, "123644.00"),
    no_note_deleted=not awsdk.row_diff(ws.w0, ws.w, "notes", "notes").removed,
    shop_unchanged=all(awsdk.row_diff(ws.w0, ws.w, "shop", t).unchanged for t in SHOP_TABLES),
)
