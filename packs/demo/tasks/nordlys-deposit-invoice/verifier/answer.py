"""The final answer gives the invoice number and the total incl. MVA."""

import awsdk

ws = awsdk.worlds()
awsdk.result(
    answer_names_invoice=awsdk.contains(ws.answer, "2026-020"),
    answer_gives_total=awsdk.has_amount(ws.answer, "59829.00"),
)
