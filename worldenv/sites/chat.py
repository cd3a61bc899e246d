"""The chat's web pages: Lars's messenger.

Pages: the conversations (most recent first, with unread counts and the last message;
all, unread, direct or group ones), a conversation (its members and messages, newest
page first, unread ones marked), the people directory, a search of the messages, and a
page to start a conversation. Forms call the chat's own tools: ``send_message``,
``mark_read``, ``mark_unread`` and ``create_conversation``.

Opening a conversation does not mark it read (a page never writes): the "Mark as read"
button does, as ``read_conversation`` and ``mark_read`` are separate tools too. Pages see
only conversations Lars is a member of, as the tools do: any other one is not found.
"""

from __future__ import annotations

from typing import Any

from worldenv.apps._common import like
from worldenv.core.app import CURRENT_USER
from worldenv.gui.site import Fields, Page, PageContext, Redirect, Site
from worldenv.sites._html import done_message, integers, new_id, query_int

site = Site(service="chat", title="Messenger",
            nav=(("Conversations", "/"), ("New conversation", "/new"), ("People", "/people"),
                 ("Search", "/search")), templates=__name__)

ME = CURRENT_USER  # the logged-in user, as the tools have it
PER_PAGE = 30  # messages on a conversation's page
PREVIEW = 80  # characters of the last message in the list
MAX_WORDS = 10  # search_messages and list_users read at most ten words
MAX_RESULTS = 50
FILTERS = (("", "All"), ("unread", "Unread"), ("direct", "Direct"), ("group", "Groups"))
DONE = {"read": "Marked as read.", "unread": "Marked as unread.", "sent": "Sent."}


def _not_found(ctx: PageContext, what: str) -> Page:
    return Page("Not found", ctx.render("chat/not_found.html", what=what), 404)


def _members(ctx: PageContext, conversation_id: int) -> list[dict[str, Any]]:
    """Members in the tools' order (owner first, then by id)."""
    return ctx.rows("SELECT cm.user_id, u.name, cm.role FROM conversation_members cm JOIN "
                    "users u ON u.id = cm.user_id WHERE cm.conversation_id = ? "
                    "ORDER BY cm.role DESC, cm.user_id", (conversation_id,))


def _title(ctx: PageContext, conversation: dict[str, Any]) -> str:
    """The group's title, or the others' names (as ``list_conversations`` names it)."""
    if conversation["title"]:
        return str(conversation["title"])
    others = [str(m["name"]) for m in _members(ctx, conversation["id"]) if m["user_id"] != ME]
    return ", ".join(others) or "(just you)"


def _unread(ctx: PageContext, conversation_id: int) -> int:
    return int(ctx.value("SELECT count(*) FROM messages WHERE conversation_id = ? AND "
                         "sender_id <> ? AND is_read = 0", (conversation_id, ME)))


def _preview(body: str) -> str:
    line = " ".join(body.split())
    return line if len(line) <= PREVIEW else line[:PREVIEW - 1] + "…"


# --- the conversations ------------------------------------------------------------------------


@site.page("/")
def conversations(ctx: PageContext) -> Page:
    show = ctx.request.arg("show")
    if show not in dict(FILTERS):
        return _not_found(ctx, f"No such filter {show!r}.")
    total_unread = int(ctx.value(
        "SELECT count(*) FROM messages WHERE sender_id <> :me AND is_read = 0 AND "
        "conversation_id IN (SELECT conversation_id FROM conversation_members WHERE "
        "user_id = :me)", {"me": ME}))
    rows = [_listed_row(ctx, c) for c in _listed(ctx, show)]
    return Page("Conversations", ctx.render("chat/conversations.html", rows=rows,
                                            total_unread=total_unread, filters=FILTERS,
                                            show=show))


def _listed(ctx: PageContext, show: str) -> list[dict[str, Any]]:
    """The conversations as ``list_conversations`` orders them: latest message first."""
    where = ["c.id IN (SELECT conversation_id FROM conversation_members WHERE user_id = :me)"]
    if show in ("direct", "group"):
        where.append("c.kind = :kind")
    if show == "unread":
        where.append("EXISTS (SELECT 1 FROM messages m WHERE m.conversation_id = c.id AND "
                     "m.is_read = 0 AND m.sender_id <> :me)")
    return ctx.rows(
        f"SELECT c.* FROM conversations c WHERE {' AND '.join(where)} ORDER BY "
        f"COALESCE((SELECT max(m.sent_at) FROM messages m WHERE m.conversation_id = c.id), "
        f"c.updated_at) DESC, c.id DESC", {"me": ME, "kind": show})


def _listed_row(ctx: PageContext, c: dict[str, Any]) -> dict[str, Any]:
    last = ctx.row("SELECT m.body, m.sent_at, m.sender_id, u.name FROM messages m JOIN users u "
                   "ON u.id = m.sender_id WHERE m.conversation_id = ? ORDER BY m.sent_at DESC, "
                   "m.id DESC LIMIT 1", (c["id"],))
    said = "" if last is None else (
        ("You" if last["sender_id"] == ME else str(last["name"])) + ": "
        + _preview(str(last["body"])))
    return {"id": c["id"], "title": _title(ctx, c), "group": c["kind"] == "group",
            "said": said, "sent_at": None if last is None else last["sent_at"],
            "unread": _unread(ctx, c["id"])}


# --- a conversation ---------------------------------------------------------------------------


@site.page("/conversations/{conversation_id:int}")
def conversation(ctx: PageContext, conversation_id: int) -> Page:
    found = ctx.row("SELECT c.* FROM conversations c JOIN conversation_members m ON "
                    "m.conversation_id = c.id AND m.user_id = ? WHERE c.id = ?",
                    (ME, conversation_id))
    if found is None:
        return _not_found(ctx, f"No conversation {conversation_id}.")
    title = _title(ctx, found)
    members = ", ".join(f"{m['name']} (you)" if m["user_id"] == ME else str(m["name"])
                        for m in _members(ctx, found["id"]))
    return Page(title, ctx.render(
        "chat/conversation.html", done=done_message(ctx, DONE), title=title,
        kind="Group" if found["kind"] == "group" else "Direct conversation", members=members,
        unread=_unread(ctx, conversation_id), conversation_id=conversation_id,
        **_thread(ctx, conversation_id)))


def _thread(ctx: PageContext, conversation_id: int) -> dict[str, Any]:
    """One page of messages, oldest first: the latest `PER_PAGE`, or earlier ones
    (``?earlier=N`` skips the N newest, as ``read_conversation``'s offset does), with the
    links to the pages before and after it (None where there is none)."""
    total = int(ctx.value("SELECT count(*) FROM messages WHERE conversation_id = ?",
                          (conversation_id,)))
    skip = query_int(ctx, "earlier", 0)
    rows = ctx.rows("SELECT m.id, m.body, m.sent_at, m.sender_id, m.is_read, u.name FROM "
                    "messages m JOIN users u ON u.id = m.sender_id WHERE m.conversation_id = ? "
                    "ORDER BY m.sent_at DESC, m.id DESC LIMIT ? OFFSET ?",
                    (conversation_id, PER_PAGE, skip))
    path = f"/conversations/{conversation_id}"
    messages = [{**m, "mine": m["sender_id"] == ME,
                 "unread": m["sender_id"] != ME and not m["is_read"]} for m in reversed(rows)]
    return {"messages": messages,
            "earlier": (ctx.url(path, earlier=skip + PER_PAGE) if skip + PER_PAGE < total
                        else None),
            "newer": ctx.url(path, earlier=max(0, skip - PER_PAGE) or None) if skip else None}


@site.form("/conversations/{conversation_id:int}/send")
def send(ctx: PageContext, fields: Fields, conversation_id: int) -> Page | Redirect:
    # An empty message goes to the tool too: its refusal is the one the agent should see.
    result = ctx.call("send_message", {"conversation_id": conversation_id,
                                       "body": fields.text("body", required=False)})
    return ctx.refused(result, "Not sent") or Redirect(f"/conversations/{conversation_id}")


@site.form("/conversations/{conversation_id:int}/read")
def mark_read(ctx: PageContext, fields: Fields, conversation_id: int) -> Page | Redirect:
    result = ctx.call("mark_read", {"conversation_id": conversation_id})
    return ctx.refused(result) or Redirect(f"/conversations/{conversation_id}?done=read")


@site.form("/messages/{message_id:int}/unread")
def mark_unread(ctx: PageContext, fields: Fields, message_id: int) -> Page | Redirect:
    result = ctx.call("mark_unread", {"message_id": message_id})
    refused = ctx.refused(result)
    if refused is not None:
        return refused
    conversation_id = ctx.value("SELECT conversation_id FROM messages WHERE id = ?",
                                (message_id,))
    return Redirect(f"/conversations/{conversation_id}?done=unread")


# --- people, search and new conversations -----------------------------------------------------


@site.page("/people")
def people(ctx: PageContext) -> Page:
    q = ctx.request.arg("q").strip()
    where = ["1 = 1"]
    params: list[Any] = []
    for word in q.split()[:MAX_WORDS]:
        where.append("(name LIKE ? ESCAPE '\\' OR handle LIKE ? ESCAPE '\\' OR "
                     "COALESCE(company, '') LIKE ? ESCAPE '\\' OR COALESCE(title, '') LIKE ? "
                     "ESCAPE '\\' OR COALESCE(email, '') LIKE ? ESCAPE '\\')")
        params += [like(word)] * 5
    rows = ctx.rows(f"SELECT * FROM users WHERE {' AND '.join(where)} ORDER BY id", params)
    return Page("People", ctx.render("chat/people.html", path="/people", label="Find people",
                                     q=q, people=[_person(ctx, p) for p in rows]))


def _person(ctx: PageContext, p: dict[str, Any]) -> dict[str, Any]:
    """A person of the directory, and the direct conversation with them (None: the page
    offers a button that starts one)."""
    existing = None if p["id"] == ME else ctx.value(
        "SELECT c.id FROM conversations c WHERE c.kind = 'direct' AND EXISTS (SELECT 1 FROM "
        "conversation_members WHERE conversation_id = c.id AND user_id = ?) AND EXISTS "
        "(SELECT 1 FROM conversation_members WHERE conversation_id = c.id AND user_id = ?) "
        "ORDER BY c.id LIMIT 1", (ME, p["id"]))
    return {"id": p["id"], "name": p["name"], "handle": p["handle"], "me": p["id"] == ME,
            "work": ", ".join(str(v) for v in (p["title"], p["company"]) if v),
            "contact": " · ".join(str(v) for v in (p["email"], p["phone"]) if v),
            "conversation": existing}


@site.page("/search")
def search(ctx: PageContext) -> Page:
    q = ctx.request.arg("q").strip()
    form = {"path": "/search", "label": "Search messages", "q": q}
    if not q:
        return Page("Search", ctx.render("chat/search.html", **form))
    where = ["m.conversation_id IN (SELECT conversation_id FROM conversation_members "
             "WHERE user_id = ?)"]
    params: list[Any] = [ME]
    for word in q.split()[:MAX_WORDS]:
        where.append("m.body LIKE ? ESCAPE '\\'")
        params.append(like(word))
    clause = " AND ".join(where)
    total = int(ctx.value(f"SELECT count(*) FROM messages m WHERE {clause}", params))
    rows = ctx.rows(f"SELECT m.*, u.name FROM messages m JOIN users u ON u.id = m.sender_id "
                    f"WHERE {clause} ORDER BY m.sent_at DESC, m.id DESC LIMIT {MAX_RESULTS}",
                    params)
    return Page("Search", ctx.render("chat/search.html", **form, total=total,
                                     hits=[_hit(ctx, m) for m in rows]))


def _hit(ctx: PageContext, m: dict[str, Any]) -> dict[str, Any]:
    conversation = ctx.row("SELECT * FROM conversations WHERE id = ?", (m["conversation_id"],))
    return {**m, "title": _title(ctx, conversation) if conversation else "",
            "who": "You" if m["sender_id"] == ME else m["name"]}


@site.page("/new")
def new(ctx: PageContext) -> Page:
    others = ctx.rows("SELECT id, name FROM users WHERE id <> ? ORDER BY name, id", (ME,))
    return Page("New conversation", ctx.render("chat/new.html", others=others))


@site.form("/new")
def create(ctx: PageContext, fields: Fields) -> Page | Redirect:
    arguments: dict[str, Any] = {"member_ids": integers(fields, "member_id")}
    for name in ("title", "first_message"):
        value = fields.optional(name)
        if value is not None and value.strip():
            arguments[name] = value
    result = ctx.call("create_conversation", arguments)
    return ctx.refused(result, "Not started") or Redirect(
        f"/conversations/{new_id(result)}")
