"""The final answer gives the total incl. MVA."""

import awsdk

ws = awsdk.worlds()
awsdk.result(answer_gives_total=awsdk.has_amount(ws.answer, "14062.50"))
