"""jobs/nordlys/cart-check.md: the removed draft mount, the missing CX-30 with when it is
expected (Anders, day 3: "tomorrow morning", Friday 6 March) and the new subtotal:
the BOM's order lines (NOK 119,765.00) less the CX-30 (NOK 17,490.00)."""

import awsdk

REPORT = "jobs/nordlys/cart-check.md"
BOM = "jobs/nordlys/bom.md"
WHEN = ("tomorrow", "friday", "2026-03-06", "6 march", "march 6")

ws = awsdk.worlds()
text = awsdk.file_text(ws.w, REPORT)
# SKUs and model names are written many ways: "PFW 6400", "PFW-6400", "CX-30", "CX30".
squashed = "".join(ch for ch in (text or "").upper() if ch.isalnum())
awsdk.result(
    report_created=text is not None and awsdk.file_text(ws.w0, REPORT) is None,
    report_names_removed_mount="PFW6400" in squashed,
    report_names_missing_cx30="CX30" in squashed,
    report_says_when_cx30_expected=any(awsdk.contains(text, word) for word in WHEN),
    report_gives_subtotal=awsdk.has_amount(text, "102275.00"),
    bom_untouched=awsdk.file_text(ws.w, BOM) == awsdk.file_text(ws.w0, BOM),
)
