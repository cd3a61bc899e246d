"""What the shipped sites' pages share besides their templates: reading a form's and a
query's numbers, and writing counts and times.

The HTML pieces (forms with labelled fields, a time with how long ago) are the macros of
``templates/forms.html``; the functions the templates call (``ago``, ``count``, ``day``,
``moment``, the ``multiline`` filter) are registered with the sites' templates at the end.
Times are the worlds' UTC timestamps (``2026-03-09T17:05:00Z``), shown in UTC with English
names written out here (never the process's locale or time-zone database, which differ
between machines), and "how long ago" is measured from the call's frozen clock
(``ctx.now``), never the wall clock: the same world and the same calls give the same
bytes.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from worldenv.core.contract import ToolResult
from worldenv.errors import ToolError
from worldenv.gui.site import Fields, Markup, PageContext, templates

DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov",
          "Dec")


# --- forms --------------------------------------------------------------------------------


def done_message(ctx: PageContext, messages: dict[str, str]) -> str:
    """The confirmation a form's redirect asks for (``?done=placed``, shown by the
    ``notice`` macro): one of the page's own fixed messages, so a link can never put its
    own words on a page."""
    return messages.get(ctx.request.arg("done"), "")


def integers(fields: Fields, name: str) -> list[int]:
    """Every value of a repeated field (checkboxes) as whole numbers."""
    found = []
    for value in fields.all(name):
        if not value.strip().isdigit():
            raise ToolError(f"the field {name!r} must be a whole number, not {value!r}")
        found.append(int(value))
    return found


def new_id(result: ToolResult) -> int:
    """The id of what a tool created (its structured result, else its JSON text)."""
    found: Any = result.structured
    if not isinstance(found, dict):
        found = json.loads(result.text)
    return int(found["id"])


def query_int(ctx: PageContext, name: str, default: int, *, least: int = 0) -> int:
    """A whole number from the page's query; anything else is the default."""
    value = ctx.request.arg(name).strip()
    return max(least, int(value)) if value.isdigit() and len(value) <= 9 else default


# --- text and times -------------------------------------------------------------------------


def count(n: int, thing: str) -> str:
    """``1 product``, ``3 products``."""
    return f"{n} {thing}" if n == 1 else f"{n} {thing}s"


def multiline(text: object) -> Markup:
    """Escaped text whose line breaks show."""
    lines = [] if text is None else str(text).replace("\r\n", "\n").split("\n")
    return Markup("<br>").join(lines)


def _parse(ts: str) -> datetime | None:
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except (TypeError, ValueError):
        return None


def day(ts: str | None) -> str:
    """``Mon 9 Mar 2026`` (or the value as it is, if it is not a timestamp)."""
    moment = _parse(ts or "")
    if moment is None:
        return ts or ""
    return f"{DAYS[moment.weekday()]} {moment.day} {MONTHS[moment.month - 1]} {moment.year}"


def moment(ts: str | None) -> str:
    """``Mon 9 Mar 2026, 17:05 UTC``."""
    found = _parse(ts or "")
    return day(ts) if found is None else f"{day(ts)}, {found:%H:%M} UTC"


def ago(ts: str | None, now: str) -> str:
    """How long before `now` (the call's clock) `ts` was: "5 min ago", "yesterday"; empty
    for a time after `now` or one that is not a timestamp."""
    then, current = _parse(ts or ""), _parse(now)
    if then is None or current is None or then > current:
        return ""
    seconds = int((current - then).total_seconds())
    days = (current.date() - then.date()).days
    if seconds < 60:
        return "just now"
    if seconds < 3600:
        return f"{seconds // 60} min ago"
    if days == 0:
        return f"{seconds // 3600} h ago"
    if days == 1:
        return "yesterday"
    return f"{days} days ago"


SITE_TEMPLATES = templates(__name__.rpartition(".")[0])
SITE_TEMPLATES.globals.update(ago=ago, count=count, day=day, moment=moment)
SITE_TEMPLATES.filters.update(multiline=multiline)
