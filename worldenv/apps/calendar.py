"""Calendar: Lars's calendars (jobs, admin, personal), events, attendees and contacts.

Schema (see packs/demo/world/build_lars.py): ``contacts`` (Lars's address book; id 1
is Lars), ``calendars`` (``owner_id`` is a contact, ``timezone``), ``events`` (status
'confirmed' | 'tentative' | 'cancelled'; ``start_at``/``end_at`` are local wall-clock
times with an explicit offset, e.g. ``2026-03-12T08:00:00+01:00``), ``attendees``
(response 'needs_action' | 'accepted' | 'declined' | 'tentative') and ``reminders``.

Only calendars the logged-in user owns, and their events, are visible: any other event
answers "No event with id N". Times given without an offset are read as local time in the
calendar's timezone; times with one are converted to it, so stored values always carry
the calendar's own offset (as the demo's do). Cancelling keeps the event with status
'cancelled', as the demo does.
"""

from __future__ import annotations

from datetime import date, datetime, time
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, Field

from worldenv.apps._common import check_page, iso_day, like
from worldenv.core.app import App, ToolContext, ToolError

app = App(service="calendar", name="calendar", version="1.0.0")

Limit = Annotated[int, Field(description="Maximum number of items to return (1-100).",
                             ge=1, le=100)]
Offset = Annotated[int, Field(description="Number of items to skip, for paging.", ge=0)]
Day = Annotated[str | None, Field(description="A local date, YYYY-MM-DD.",
                                  pattern=r"^\d{4}-\d{2}-\d{2}$")]
When = Annotated[str, Field(
    description="ISO 8601 date-time, e.g. '2026-03-12T08:00' (calendar's local time) or "
                "'2026-03-12T08:00:00+01:00'.", min_length=10, max_length=40)]
EventId = Annotated[int, Field(description="Event id.", ge=1)]
ContactId = Annotated[int, Field(description="Contact id (see list_contacts).", ge=1)]
Minutes = Annotated[list[int] | None, Field(
    description="Popup reminders, in minutes before the start (0-40320 each).",
    max_length=5)]
EventStatus = Literal["confirmed", "tentative", "cancelled"]
Response = Literal["needs_action", "accepted", "declined", "tentative"]
MAX_REMINDER = 40320  # four weeks


# --- models ----------------------------------------------------------------------------


class Calendar(BaseModel):
    id: int
    name: str
    color: str
    timezone: str
    event_count: int = Field(description="Events in the calendar that are not cancelled.")


class CalendarPage(BaseModel):
    items: list[Calendar]
    total: int
    limit: int
    offset: int


class Contact(BaseModel):
    id: int
    name: str
    email: str | None
    phone: str | None
    company: str | None


class ContactPage(BaseModel):
    items: list[Contact]
    total: int = Field(description="Number of matching contacts over all pages.")
    limit: int
    offset: int


class Attendee(BaseModel):
    contact_id: int
    name: str
    email: str | None
    response: Response


class Reminder(BaseModel):
    id: int
    minutes_before: int
    method: Literal["popup", "email"]


class Event(BaseModel):
    id: int
    calendar_id: int
    calendar_name: str
    title: str
    description: str | None
    location: str | None
    start_at: str = Field(description="Local start time with offset.")
    end_at: str = Field(description="Local end time with offset.")
    all_day: bool
    status: EventStatus
    attendees: list[Attendee]
    reminders: list[Reminder]
    created_at: str
    updated_at: str


class EventPage(BaseModel):
    items: list[Event]
    total: int = Field(description="Number of matching events over all pages.")
    limit: int
    offset: int


# --- helpers ---------------------------------------------------------------------------





def _text(value: str | None, name: str, *, required: bool) -> str | None:
    if value is None or not value.strip():
        if required:
            raise ToolError(f"{name} must not be empty")
        return None
    return value.strip()


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ToolError(f"Unknown timezone {name!r} on this calendar") from None


def _local(value: str, name: str, zone: str, *, all_day: bool = False, end: bool = False
           ) -> str:
    """`value` as local time in `zone`, ISO 8601 with offset, seconds precision."""
    try:
        if all_day:
            day = date.fromisoformat(value[:10])
            moment = datetime.combine(day, time(23, 59, 59) if end else time(0, 0))
        else:
            moment = datetime.fromisoformat(value)
    except ValueError:
        raise ToolError(f"{name} must be an ISO 8601 date-time like 2026-03-12T08:00 or "
                        f"2026-03-12T08:00:00+01:00, got {value!r}") from None
    tz = _zone(zone)
    moment = moment.replace(tzinfo=tz) if moment.tzinfo is None else moment.astimezone(tz)
    return moment.replace(microsecond=0).isoformat()


def _check_span(start_at: str, end_at: str) -> None:
    if datetime.fromisoformat(end_at) < datetime.fromisoformat(start_at) or end_at < start_at:
        raise ToolError(f"end_at {end_at} is before start_at {start_at}")


def _reminders(minutes: list[int]) -> list[int]:
    if len(minutes) > 5:
        raise ToolError("at most 5 reminders")
    for m in minutes:
        if not 0 <= m <= MAX_REMINDER:
            raise ToolError(f"reminder minutes must be between 0 and {MAX_REMINDER}, got {m}")
    return sorted(set(minutes), reverse=True)


_EVENT_SQL = """
    SELECT e.*, c.name AS calendar_name, c.timezone
    FROM events e JOIN calendars c ON c.id = e.calendar_id
"""


def _own_calendar(ctx: ToolContext, calendar_id: int) -> dict[str, Any]:
    row = ctx.row("SELECT * FROM calendars WHERE id = ? AND owner_id = ?",
                  (calendar_id, ctx.user_id))
    if row is None:
        raise ToolError(f"No calendar with id {calendar_id}")
    return row


def _own_event(ctx: ToolContext, event_id: int) -> dict[str, Any]:
    row = ctx.row(_EVENT_SQL + " WHERE e.id = ? AND c.owner_id = ?", (event_id, ctx.user_id))
    if row is None:
        raise ToolError(f"No event with id {event_id}")
    return row


def _open_event(ctx: ToolContext, event_id: int) -> dict[str, Any]:
    row = _own_event(ctx, event_id)
    if row["status"] == "cancelled":
        raise ToolError(f"Event {event_id} is cancelled and can't be changed")
    return row


def _contact(ctx: ToolContext, contact_id: int) -> dict[str, Any]:
    row = ctx.row("SELECT * FROM contacts WHERE id = ?", (contact_id,))
    if row is None:
        raise ToolError(f"No contact with id {contact_id}")
    return row


def _event(ctx: ToolContext, row: dict[str, Any]) -> Event:
    eid = row["id"]
    attendees = [Attendee(**r) for r in ctx.rows(
        """SELECT a.contact_id, c.name, c.email, a.response FROM attendees a
           JOIN contacts c ON c.id = a.contact_id WHERE a.event_id = ? ORDER BY a.id""",
        (eid,))]
    reminders = [Reminder(**r) for r in ctx.rows(
        "SELECT id, minutes_before, method FROM reminders WHERE event_id = ? "
        "ORDER BY minutes_before DESC, id", (eid,))]
    return Event(
        id=eid, calendar_id=row["calendar_id"], calendar_name=row["calendar_name"],
        title=row["title"], description=row["description"], location=row["location"],
        start_at=row["start_at"], end_at=row["end_at"], all_day=bool(row["all_day"]),
        status=row["status"], attendees=attendees, reminders=reminders,
        created_at=row["created_at"], updated_at=row["updated_at"])


def _add_attendee(ctx: ToolContext, event_id: int, contact_id: int, response: str) -> None:
    ctx.insert("attendees", {"id": ctx.next_id("attendees"), "event_id": event_id,
                             "contact_id": contact_id, "response": response,
                             "created_at": ctx.now, "updated_at": ctx.now})


def _set_reminders(ctx: ToolContext, event_id: int, minutes: list[int]) -> None:
    ctx.execute("DELETE FROM reminders WHERE event_id = ?", (event_id,))
    for m in minutes:
        ctx.insert("reminders", {"id": ctx.next_id("reminders"), "event_id": event_id,
                                 "minutes_before": m, "method": "popup",
                                 "created_at": ctx.now})


def _touch(ctx: ToolContext, event_id: int) -> None:
    ctx.execute("UPDATE events SET updated_at = ? WHERE id = ?", (ctx.now, event_id))


# --- tools -----------------------------------------------------------------------------


@app.tool(writes=False)
def list_calendars(ctx: ToolContext, limit: Limit = 20, offset: Offset = 0) -> CalendarPage:
    """List your calendars."""
    check_page(limit, offset)
    total = int(ctx.value("SELECT COUNT(*) FROM calendars WHERE owner_id = ?", (ctx.user_id,)))
    rows = ctx.rows(
        """SELECT c.id, c.name, c.color, c.timezone,
                  (SELECT COUNT(*) FROM events e WHERE e.calendar_id = c.id
                   AND e.status <> 'cancelled') AS event_count
           FROM calendars c WHERE c.owner_id = ? ORDER BY c.id LIMIT ? OFFSET ?""",
        (ctx.user_id, limit, offset))
    return CalendarPage(items=[Calendar(**r) for r in rows], total=total, limit=limit,
                        offset=offset)


@app.tool(writes=False)
def list_events(
    ctx: ToolContext,
    date_from: Annotated[Day, Field(
        description="Only events ending on or after this local date (YYYY-MM-DD).")] = None,
    date_to: Annotated[Day, Field(
        description="Only events starting on or before this local date (YYYY-MM-DD).")]
    = None,
    calendar_id: Annotated[int | None, Field(description="Only this calendar.", ge=1)]
    = None,
    status: Annotated[EventStatus | None, Field(
        description="Only this status (default: all but cancelled).")] = None,
    include_cancelled: Annotated[bool, Field(
        description="Also list cancelled events (when no status is given).")] = False,
    attendee_id: Annotated[int | None, Field(
        description="Only events this contact attends.", ge=1)] = None,
    query: Annotated[str | None, Field(
        description="Words to find in title, description or location (case-insensitive).",
        max_length=200)] = None,
    limit: Limit = 20,
    offset: Offset = 0,
) -> EventPage:
    """List events in your calendars by start time, with attendees and reminders."""
    check_page(limit, offset)
    where = ["c.owner_id = ?"]
    params: list[Any] = [ctx.user_id]
    start, end = iso_day(date_from, "date_from"), iso_day(date_to, "date_to")
    if start is not None:
        where.append("substr(e.end_at, 1, 10) >= ?")
        params.append(start)
    if end is not None:
        where.append("substr(e.start_at, 1, 10) <= ?")
        params.append(end)
    if calendar_id is not None:
        _own_calendar(ctx, calendar_id)
        where.append("e.calendar_id = ?")
        params.append(calendar_id)
    if status is not None:
        where.append("e.status = ?")
        params.append(status)
    elif not include_cancelled:
        where.append("e.status <> 'cancelled'")
    if attendee_id is not None:
        where.append("EXISTS (SELECT 1 FROM attendees a WHERE a.event_id = e.id "
                     "AND a.contact_id = ?)")
        params.append(attendee_id)
    for word in (query or "").split()[:10]:
        where.append("(e.title LIKE ? ESCAPE '\\' OR COALESCE(e.description, '') LIKE ? "
                     "ESCAPE '\\' OR COALESCE(e.location, '') LIKE ? ESCAPE '\\')")
        params += [like(word)] * 3
    clause = " AND ".join(where)
    total = int(ctx.value(
        f"SELECT COUNT(*) FROM events e JOIN calendars c ON c.id = e.calendar_id "
        f"WHERE {clause}", params))
    rows = ctx.rows(_EVENT_SQL + f" WHERE {clause} ORDER BY datetime(e.start_at), e.id "
                    "LIMIT ? OFFSET ?", [*params, limit, offset])
    return EventPage(items=[_event(ctx, r) for r in rows], total=total, limit=limit,
                     offset=offset)


@app.tool(writes=False)
def get_event(ctx: ToolContext, event_id: EventId) -> Event:
    """Get one event of your calendars with its attendees and reminders."""
    return _event(ctx, _own_event(ctx, event_id))


@app.tool(writes=True)
def create_event(
    ctx: ToolContext,
    calendar_id: Annotated[int, Field(description="One of your calendars (list_calendars).",
                                      ge=1)],
    title: Annotated[str, Field(description="Event title.", min_length=1, max_length=200)],
    start_at: When,
    end_at: When,
    location: Annotated[str | None, Field(description="Where.", max_length=300)] = None,
    description: Annotated[str | None, Field(description="Notes for the event.",
                                             max_length=4000)] = None,
    status: Annotated[Literal["confirmed", "tentative"], Field(
        description="'tentative' for pencilled-in events.")] = "confirmed",
    all_day: Annotated[bool, Field(
        description="All-day event: only the dates of start_at/end_at count.")] = False,
    attendee_ids: Annotated[list[int] | None, Field(
        description="Contacts to invite (they start as 'needs_action'; you are added as "
                    "'accepted').", max_length=50)] = None,
    reminder_minutes: Minutes = None,
) -> Event:
    """Create an event in one of your calendars, optionally with attendees and reminders."""
    calendar = _own_calendar(ctx, calendar_id)
    title_text = _text(title, "title", required=True)
    zone = calendar["timezone"]
    start = _local(start_at, "start_at", zone, all_day=all_day)
    end = _local(end_at, "end_at", zone, all_day=all_day, end=True)
    _check_span(start, end)
    minutes = _reminders(reminder_minutes or [])
    invited = list(dict.fromkeys(a for a in attendee_ids or [] if a != ctx.user_id))
    for contact_id in invited:
        _contact(ctx, contact_id)
    if status not in ("confirmed", "tentative"):
        raise ToolError(f"status must be 'confirmed' or 'tentative', got {status!r}")
    event_id = ctx.next_id("events")
    ctx.insert("events", {
        "id": event_id, "calendar_id": calendar_id, "title": title_text,
        "description": _text(description, "description", required=False),
        "location": _text(location, "location", required=False), "start_at": start,
        "end_at": end, "all_day": 1 if all_day else 0, "status": status,
        "created_at": ctx.now, "updated_at": ctx.now})
    if invited:
        _add_attendee(ctx, event_id, ctx.user_id, "accepted")
        for contact_id in invited:
            _add_attendee(ctx, event_id, contact_id, "needs_action")
    _set_reminders(ctx, event_id, minutes)
    return _event(ctx, _own_event(ctx, event_id))


@app.tool(writes=True)
def update_event(
    ctx: ToolContext,
    event_id: EventId,
    title: Annotated[str | None, Field(description="New title.", min_length=1,
                                       max_length=200)] = None,
    start_at: Annotated[str | None, Field(
        description="New start (ISO 8601; local time of the calendar if no offset).",
        min_length=10, max_length=40)] = None,
    end_at: Annotated[str | None, Field(
        description="New end (ISO 8601; local time of the calendar if no offset).",
        min_length=10, max_length=40)] = None,
    location: Annotated[str | None, Field(description="New location ('' clears it).",
                                          max_length=300)] = None,
    description: Annotated[str | None, Field(description="New description ('' clears it).",
                                             max_length=4000)] = None,
    status: Annotated[Literal["confirmed", "tentative"] | None, Field(
        description="Confirm or mark tentative (use cancel_event to cancel).")] = None,
    calendar_id: Annotated[int | None, Field(description="Move to another of your calendars.",
                                             ge=1)] = None,
    reminder_minutes: Annotated[list[int] | None, Field(
        description="Replace the reminders: minutes before the start, 0-40320 each; "
                    "[] removes all.", max_length=5)] = None,
) -> Event:
    """Change an event: reschedule, rename, move, or edit details. Only the fields you give
    change; moving keeps the length unless you give end_at too."""
    row = _open_event(ctx, event_id)
    changes: dict[str, Any] = {}
    zone = row["timezone"]
    if calendar_id is not None and calendar_id != row["calendar_id"]:
        zone = _own_calendar(ctx, calendar_id)["timezone"]
        changes["calendar_id"] = calendar_id
    if title is not None:
        changes["title"] = _text(title, "title", required=True)
    if location is not None:
        changes["location"] = _text(location, "location", required=False)
    if description is not None:
        changes["description"] = _text(description, "description", required=False)
    if status is not None:
        if status not in ("confirmed", "tentative"):
            raise ToolError(f"status must be 'confirmed' or 'tentative', got {status!r}")
        changes["status"] = status
    all_day = bool(row["all_day"])
    if start_at is not None or end_at is not None or "calendar_id" in changes:
        old_start = datetime.fromisoformat(row["start_at"])
        old_end = datetime.fromisoformat(row["end_at"])
        start = (_local(start_at, "start_at", zone, all_day=all_day) if start_at is not None
                 else _local(row["start_at"], "start_at", zone))
        if end_at is not None:
            end = _local(end_at, "end_at", zone, all_day=all_day, end=True)
        else:
            end = (datetime.fromisoformat(start) + (old_end - old_start)).isoformat()
            end = _local(end, "end_at", zone)
        _check_span(start, end)
        if start != row["start_at"]:
            changes["start_at"] = start
        if end != row["end_at"]:
            changes["end_at"] = end
    minutes = None if reminder_minutes is None else _reminders(reminder_minutes)
    if not changes and minutes is None:
        raise ToolError("Nothing to update: give at least one field to change")
    if changes:
        changes["updated_at"] = ctx.now
        sets = ", ".join(f"{column} = ?" for column in changes)
        ctx.execute(f"UPDATE events SET {sets} WHERE id = ?", [*changes.values(), event_id])
    if minutes is not None:
        _set_reminders(ctx, event_id, minutes)
        _touch(ctx, event_id)
    return _event(ctx, _own_event(ctx, event_id))


@app.tool(writes=True)
def cancel_event(
    ctx: ToolContext,
    event_id: EventId,
    reason: Annotated[str | None, Field(
        description="Why; replaces the description (as in 'Not needed - quote approved').",
        max_length=1000)] = None,
) -> Event:
    """Cancel an event: it stays in the calendar with status 'cancelled'."""
    row = _own_event(ctx, event_id)
    if row["status"] == "cancelled":
        raise ToolError(f"Event {event_id} is already cancelled")
    note = _text(reason, "reason", required=False)
    if note is None:
        ctx.execute("UPDATE events SET status = 'cancelled', updated_at = ? WHERE id = ?",
                    (ctx.now, event_id))
    else:
        ctx.execute("UPDATE events SET status = 'cancelled', description = ?, updated_at = ? "
                    "WHERE id = ?", (note, ctx.now, event_id))
    return _event(ctx, _own_event(ctx, event_id))


@app.tool(writes=True)
def add_attendee(
    ctx: ToolContext,
    event_id: EventId,
    contact_id: ContactId,
    response: Annotated[Response, Field(
        description="Their response so far (e.g. 'accepted' if they already said yes).")]
    = "needs_action",
) -> Event:
    """Invite a contact to an event, or record their response if they are invited already."""
    _open_event(ctx, event_id)
    _contact(ctx, contact_id)
    if response not in ("needs_action", "accepted", "declined", "tentative"):
        raise ToolError(f"Unknown response {response!r}")
    existing = ctx.row("SELECT id, response FROM attendees WHERE event_id = ? AND contact_id = ?",
                       (event_id, contact_id))
    if existing is None:
        if contact_id != ctx.user_id and ctx.value(
                "SELECT 1 FROM attendees WHERE event_id = ? AND contact_id = ?",
                (event_id, ctx.user_id)) is None:
            _add_attendee(ctx, event_id, ctx.user_id, "accepted")
        _add_attendee(ctx, event_id, contact_id, response)
        _touch(ctx, event_id)
    elif existing["response"] != response:
        ctx.execute("UPDATE attendees SET response = ?, updated_at = ? WHERE id = ?",
                    (response, ctx.now, existing["id"]))
    else:
        raise ToolError(f"Contact {contact_id} is already an attendee of event {event_id} "
                        f"with response '{response}'")
    return _event(ctx, _own_event(ctx, event_id))


@app.tool(writes=True)
def remove_attendee(ctx: ToolContext, event_id: EventId, contact_id: ContactId) -> Event:
    """Uninvite a contact from an event."""
    _open_event(ctx, event_id)
    if contact_id == ctx.user_id:
        raise ToolError("You can't remove yourself from your own event; cancel it instead")
    changed = ctx.execute("DELETE FROM attendees WHERE event_id = ? AND contact_id = ?",
                          (event_id, contact_id))
    if not changed:
        _contact(ctx, contact_id)
        raise ToolError(f"Contact {contact_id} is not an attendee of event {event_id}")
    _touch(ctx, event_id)
    return _event(ctx, _own_event(ctx, event_id))


@app.tool(writes=False)
def list_contacts(
    ctx: ToolContext,
    query: Annotated[str | None, Field(
        description="Words to find in name, email, phone or company (case-insensitive).",
        max_length=100)] = None,
    limit: Limit = 20,
    offset: Offset = 0,
) -> ContactPage:
    """List your contacts (to invite them to events)."""
    check_page(limit, offset)
    where = ["1 = 1"]
    params: list[Any] = []
    for word in (query or "").split()[:10]:
        where.append("(name LIKE ? ESCAPE '\\' OR COALESCE(email, '') LIKE ? ESCAPE '\\' OR "
                     "COALESCE(phone, '') LIKE ? ESCAPE '\\' OR "
                     "COALESCE(company, '') LIKE ? ESCAPE '\\')")
        params += [like(word)] * 4
    clause = " AND ".join(where)
    total = int(ctx.value(f"SELECT COUNT(*) FROM contacts WHERE {clause}", params))
    rows = ctx.rows(f"SELECT id, name, email, phone, company FROM contacts WHERE {clause} "
                    "ORDER BY id LIMIT ? OFFSET ?", [*params, limit, offset])
    return ContactPage(items=[Contact(**r) for r in rows], total=total, limit=limit,
                       offset=offset)


@app.tool(writes=True)
def add_contact(
    ctx: ToolContext,
    name: Annotated[str, Field(description="Full name.", min_length=1, max_length=100)],
    email: Annotated[str | None, Field(description="Email (unique among contacts).",
                                       max_length=200)] = None,
    phone: Annotated[str | None, Field(description="Phone number.", max_length=30)] = None,
    company: Annotated[str | None, Field(description="Company.", max_length=100)] = None,
) -> Contact:
    """Add a contact to your address book."""
    name_text = _text(name, "name", required=True)
    email_text = _text(email, "email", required=False)
    if email_text is not None:
        if "@" not in email_text:
            raise ToolError(f"email {email_text!r} is not an email address")
        other = ctx.value("SELECT id FROM contacts WHERE email = ? COLLATE NOCASE",
                          (email_text,))
        if other is not None:
            raise ToolError(f"Contact {other} already has the email {email_text}")
    contact_id = ctx.next_id("contacts")
    ctx.insert("contacts", {"id": contact_id, "name": name_text, "email": email_text,
                            "phone": _text(phone, "phone", required=False),
                            "company": _text(company, "company", required=False),
                            "created_at": ctx.now, "updated_at": ctx.now})
    return Contact(**_contact(ctx, contact_id))
