"""The final answer gives Mats's total for the job."""

import awsdk
from _money import has_amount

ws = awsdk.worlds()
awsdk.result(answer_gives_total=has_amount(ws.answer, "11600.00"))
