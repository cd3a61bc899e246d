"""The final answer gives the number of order lines (15) and of units (18) to check."""

import re

import awsdk

ws = awsdk.worlds()
awsdk.result(
    answer_gives_line_count=re.search(r"\b15\b", ws.answer) is not None,
    answer_gives_unit_count=re.search(r"\b18\b", ws.answer) is not None,
)
