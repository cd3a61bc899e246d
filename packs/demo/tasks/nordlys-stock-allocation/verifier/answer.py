"""The final answer gives the stock lines' value and that the sum meets the quote."""

import awsdk

ws = awsdk.worlds()
awsdk.result(
    answer_gives_stock_value=awsdk.has_amount(ws.answer, "3879.00"),
    answer_gives_equipment_total=awsdk.has_amount(ws.answer, "123644.00"),
)
