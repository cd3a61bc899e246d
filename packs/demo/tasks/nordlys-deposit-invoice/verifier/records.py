"""The invoicing note gains an open item for the invoice without losing a line, and
Ingrid (conversation 1) is told the number, the total and her PO."""

from pathlib import Path

import awsdk

INVOICING_NOTE = 2
INGRID_CONVERSATION = 1
LARS = 1

ws = awsdk.worlds()


def note_lines(world: Path) -> list[str] | None:
    body = awsdk.value(world, "notes", "SELECT body FROM notes WHERE id = ?",
                       (INVOICING_NOTE,))
    return None if body is None else body.splitlines()


before, after = note_lines(ws.w0) or [], note_lines(ws.w)
new_items = [line for line in after or [] if line not in before
             and line.lstrip().startswith("- [ ]") and "2026-020" in line]
sent = [row["body"] for row in awsdk.row_diff(ws.w0, ws.w, "chat", "messages").added
        if row["conversation_id"] == INGRID_CONVERSATION and row["sender_id"] == LARS]
awsdk.result(
    note_keeps_earlier_lines=after is not None and all(line in after for line in before),
    note_has_open_item_for_invoice=bool(new_items),
    note_item_has_total=any(awsdk.has_amount(line, "59829.00") for line in new_items),
    no_note_deleted=not awsdk.row_diff(ws.w0, ws.w, "notes", "notes").removed,
    ingrid_told_invoice_number=any("2026-020" in body for body in sent),
    ingrid_told_total=any(awsdk.has_amount(body, "59829.00") for body in sent),
    ingrid_told_po=any("NS-PO-2026-031" in body for body in sent),
)
