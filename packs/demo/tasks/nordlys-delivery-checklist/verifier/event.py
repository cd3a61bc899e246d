"""The delivery-check event (event 11) keeps its text and adds the carrier and tracking
number of order AVL-2026-10533 (shipped on day 6), has one reminder 60 minutes before,
and nothing else in the calendar changed."""

import re
from pathlib import Path
from typing import Any

import awsdk

DELIVERY_CHECK = 11
CARRIER, TRACKING = "Bring", "70730259304981756"
KEPT = ("calendar_id", "title", "location", "start_at", "end_at", "all_day", "status")

ws = awsdk.worlds()


def event(world: Path) -> dict[str, Any]:
    found = awsdk.rows(world, "calendar", "SELECT * FROM events WHERE id = ?",
                       (DELIVERY_CHECK,))
    return found[0] if found else {}


def phrases(text: str | None) -> list[str]:
    return [p.strip() for p in re.split(r"[.,]", text or "") if p.strip()]


before, after = event(ws.w0), event(ws.w)
text = after.get("description") or ""
events = awsdk.row_diff(ws.w0, ws.w, "calendar", "events")
reminders = [row["minutes_before"] for row in awsdk.rows(
    ws.w, "calendar", "SELECT minutes_before FROM reminders WHERE event_id = ?",
    (DELIVERY_CHECK,))]
attendees = "SELECT contact_id, response FROM attendees WHERE event_id = ? ORDER BY contact_id"
awsdk.result(
    description_kept=bool(after) and all(awsdk.contains(text, p)
                                         for p in phrases(before.get("description"))),
    description_names_carrier=awsdk.contains(text, CARRIER),
    description_has_tracking_number=TRACKING in text,
    one_reminder_60_minutes_before=reminders == [60],
    event_not_moved=bool(after) and all(after[k] == before[k] for k in KEPT),
    attendees_unchanged=awsdk.rows(ws.w, "calendar", attendees, (DELIVERY_CHECK,))
    == awsdk.rows(ws.w0, "calendar", attendees, (DELIVERY_CHECK,)),
    no_other_event_changed=not events.added and not events.removed
    and all(old["id"] == DELIVERY_CHECK for old, _ in events.changed),
)
