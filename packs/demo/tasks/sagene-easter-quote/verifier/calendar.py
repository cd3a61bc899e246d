"""One new tentative event for the Easter concert: Saturday 2026-03-28, 16:00-23:00 Oslo
time (+01:00: summer time starts the next day), in the Jobs calendar, at Sagene Scene's
address from the day-2 monitor check (event 4), with Kari invited; nothing else moved."""

from datetime import datetime, timedelta, timezone

import awsdk

JOBS_CALENDAR = 1
KARI = 4
OSLO_WINTER = timezone(timedelta(hours=1))
START = datetime(2026, 3, 28, 16, 0, tzinfo=OSLO_WINTER)
END = datetime(2026, 3, 28, 23, 0, tzinfo=OSLO_WINTER)
ADDRESS = "Kristiansands gate 2"

ws = awsdk.worlds()


def moment(text: str | None) -> datetime | None:
    try:
        return None if text is None else datetime.fromisoformat(text)
    except ValueError:
        return None


events = awsdk.row_diff(ws.w0, ws.w, "calendar", "events")
new = events.added
concert = new[0] if len(new) == 1 else {}
invited = {row["contact_id"] for row in awsdk.rows(
    ws.w, "calendar", "SELECT contact_id FROM attendees WHERE event_id = ?",
    (concert.get("id"),))}
awsdk.result(
    one_new_event=len(new) == 1,
    in_jobs_calendar=concert.get("calendar_id") == JOBS_CALENDAR,
    tentative=concert.get("status") == "tentative",
    from_1600_to_2300_on_28_march=moment(concert.get("start_at")) == START
    and moment(concert.get("end_at")) == END,
    at_sagene_scene_address=awsdk.contains(concert.get("location"), ADDRESS),
    kari_invited=KARI in invited,
    existing_events_unchanged=not events.removed and not events.changed,
)
