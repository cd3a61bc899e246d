"""The final answer gives Mats's total for the job."""

import awsdk

ws = awsdk.worlds()
awsdk.result(answer_gives_total=awsdk.has_amount(ws.answer, "11600.00"))
