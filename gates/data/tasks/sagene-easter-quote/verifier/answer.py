"""The final answer gives the total incl. MVA."""

import awsdk
from _money import has_amount

ws = awsdk.worlds()
awsdk.result(answer_gives_total=has_amount(ws.answer, "14062.50"))
