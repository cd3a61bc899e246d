"""Money amounts in free text, however the writer grouped the thousands."""

from __future__ import annotations

import re

# A thousands separator: one space, comma, dot or thin/no-break space before a group of
# exactly three digits ("59,829.00", "59 829,00", "59.829,00").
_GROUPING = re.compile(r"(?<=\d)[ ,.\u00a0\u202f](?=\d{3}(?!\d))")


def has_amount(text: str | None, amount: str) -> bool:
    """Whether `amount` (kroner, a dot, two digits of øre: "59829.00") is written in
    `text` as "59,829.00", "59 829,00", "NOK 59829.00" or, for whole kroner, "59829".
    A longer number ("159,829.00") or other øre ("59,829.50") does not count."""
    if not text:
        return False
    flat = _GROUPING.sub("", text)
    kroner, ore = amount.split(".")
    decimals = r"(?:[.,]00)?" if ore == "00" else rf"[.,]{ore}"
    return re.search(rf"(?<![\d.,]){kroner}{decimals}(?![.,]?\d)", flat) is not None
