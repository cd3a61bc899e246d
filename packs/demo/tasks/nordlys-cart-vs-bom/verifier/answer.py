"""The final answer names the missing CX-30 and the cart subtotal."""

import awsdk

ws = awsdk.worlds()
awsdk.result(
    answer_names_cx30="CX30" in "".join(ch for ch in ws.answer.upper() if ch.isalnum()),
    answer_gives_subtotal=awsdk.has_amount(ws.answer, "102275.00"),
)
