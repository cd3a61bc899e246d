"""The early departure is noted on install day 1 (event 9, Thursday 12 March) with its
old text kept, not on day 2; neither event moved; Mats is sent the dates and the total."""

import re
from pathlib import Path
from typing import Any

import awsdk

DAY_1, DAY_2 = 9, 10
MATS_CONVERSATION = 2
LARS = 1

ws = awsdk.worlds()


def event(world: Path, event_id: int) -> dict[str, Any]:
    found = awsdk.rows(world, "calendar", "SELECT description, start_at, end_at, status "
                                          "FROM events WHERE id = ?", (event_id,))
    return found[0] if found else {}


def phrases(text: str | None) -> list[str]:
    return [p.strip() for p in re.split(r"[.,]", text or "") if p.strip()]


day1_before, day1 = event(ws.w0, DAY_1), event(ws.w, DAY_1)
day2_before, day2 = event(ws.w0, DAY_2), event(ws.w, DAY_2)
note = day1.get("description") or ""
when = ("start_at", "end_at", "status")
sent = [row["body"] for row in awsdk.row_diff(ws.w0, ws.w, "chat", "messages").added
        if row["conversation_id"] == MATS_CONVERSATION and row["sender_id"] == LARS]
awsdk.result(
    day_1_notes_mats_leaves_at_1600=awsdk.contains(note, "Mats") and "16:00" in note,
    day_1_keeps_its_description=all(awsdk.contains(note, p)
                                    for p in phrases(day1_before.get("description"))),
    day_2_not_given_the_note=("16:00" in (day2_before.get("description") or ""))
    == ("16:00" in (day2.get("description") or "")),
    install_days_not_moved=bool(day1) and bool(day2)
    and all(day1[k] == day1_before[k] and day2[k] == day2_before[k] for k in when),
    mats_told_total=any(awsdk.has_amount(body, "11600.00") for body in sent),
    mats_told_dates=any(re.search(r"\b12\b", body) and re.search(r"\b13\b", body)
                        for body in sent),
)
