"""jobs/nordlys/delivery-check.csv: header sku,item,qty,received and exactly one row per
line of the job's AVLager order (as it stood in W0), named, with `received` empty."""

import csv
import io

import awsdk

CHECKLIST = "jobs/nordlys/delivery-check.csv"
ORDER = "AVL-2026-10533"
HEADER = ["sku", "item", "qty", "received"]

ws = awsdk.worlds()
ordered = sorted((row["sku"], row["quantity"]) for row in awsdk.rows(
    ws.w0, "shop", "SELECT p.sku, i.quantity FROM order_items i "
                   "JOIN orders o ON o.id = i.order_id JOIN products p ON p.id = i.product_id "
                   "WHERE o.order_number = ?", (ORDER,)))
text = awsdk.file_text(ws.w, CHECKLIST)
header, *rows = list(csv.reader(io.StringIO(text))) if text else [[]]
rows = [[cell.strip() for cell in row] for row in rows if any(cell.strip() for cell in row)]
complete = all(len(row) == len(HEADER) for row in rows)
listed = sorted((row[0], int(row[2]) if row[2].isdigit() else -1) for row in rows) \
    if complete else []
awsdk.result(
    checklist_created=text is not None and awsdk.file_text(ws.w0, CHECKLIST) is None,
    checklist_header=[cell.strip() for cell in header] == HEADER,
    one_row_per_order_line=bool(ordered) and complete and listed == ordered,
    items_named=bool(rows) and complete and all(row[1] for row in rows),
    received_left_empty=bool(rows) and complete and not any(row[3] for row in rows),
)
