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

from envs.app import CURRENT_USER
from envs.apps._common import like
from envs.site import Fields, Page, PageContext, Redirect, Site, esc, link
from envs.sites._html import (
    button,
    checkbox,
    count,
    hidden,
    integers,
    labelled,
    multiline,
    new_id,
    notice,
    post_form,
    query_int,
    stamp,
    text_input,
)

site = Site(service="chat", title="Messenger",
            nav=(("Conversations", "/"), ("New conversation", "/new"), ("People", "/people"),
                 ("Search", "/search")))

ME = CURRENT_USER  # the logged-in user, as the tools have it
PER_PAGE = 30  # messages on a conversation's page
PREVIEW = 80  # characters of the last message in the list
MAX_WORDS = 10  # search_messages and list_users read at most ten words
MAX_RESULTS = 50
FILTERS = (("", "All"), ("unread", "Unread"), ("direct", "Direct"), ("group", "Groups"))
DONE = {"read": "Marked as read.", "unread": "Marked as unread.", "sent": "Sent."}


def _not_found(what: str) -> Page:
    return Page("Not found", f"<h1>Not found</h1><p>{esc(what)}</p>"
                             f'<p><a href="/chat/">All conversations</a></p>', 404)


def _conversation_link(ctx: PageContext, conversation_id: int, text: str) -> str:
    return link(ctx.url(f"/conversations/{conversation_id}"), text)


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
        return _not_found(f"No such filter {show!r}.")
    rows = _listed(ctx, show)
    total_unread = int(ctx.value(
        "SELECT count(*) FROM messages WHERE sender_id <> :me AND is_read = 0 AND "
        "conversation_id IN (SELECT conversation_id FROM conversation_members WHERE "
        "user_id = :me)", {"me": ME}))
    body = "".join(_listed_row(ctx, c) for c in rows)
    table = (f"<table><tr><th>Conversation</th><th>Last message</th><th>When</th>"
             f'<th class="num">Unread</th></tr>{body}</table>'
             if rows else "<p>No conversations.</p>")
    return Page("Conversations", f"<h1>Conversations</h1>"
                                 f'<p role="status">{count(total_unread, "unread message")}</p>'
                                 f"{_filter_links(ctx, show)}{table}")


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


def _listed_row(ctx: PageContext, c: dict[str, Any]) -> str:
    last = ctx.row("SELECT m.body, m.sent_at, m.sender_id, u.name FROM messages m JOIN users u "
                   "ON u.id = m.sender_id WHERE m.conversation_id = ? ORDER BY m.sent_at DESC, "
                   "m.id DESC LIMIT 1", (c["id"],))
    unread = _unread(ctx, c["id"])
    title = _title(ctx, c)
    kind = " <span class=\"muted\">(group)</span>" if c["kind"] == "group" else ""
    said = "" if last is None else esc(
        ("You" if last["sender_id"] == ME else str(last["name"])) + ": "
        + _preview(str(last["body"])))
    when = "" if last is None else stamp(last["sent_at"], ctx.now)
    badge = f"<b>{unread}</b>" if unread else ""
    return (f"<tr><td>{_conversation_link(ctx, c['id'], title)}{kind}</td><td>{said}</td>"
            f'<td>{when}</td><td class="num">{badge}</td></tr>')


def _filter_links(ctx: PageContext, show: str) -> str:
    links = []
    for value, text in FILTERS:
        href = esc(ctx.url("/", show=value))
        current = ' aria-current="page"' if value == show else ""
        links.append(f'<a href="{href}"{current}>{esc(text)}</a>')
    return f'<nav aria-label="Show"><p>{" · ".join(links)}</p></nav>'


# --- a conversation ---------------------------------------------------------------------------


@site.page("/conversations/{conversation_id:int}")
def conversation(ctx: PageContext, conversation_id: int) -> Page:
    found = ctx.row("SELECT c.* FROM conversations c JOIN conversation_members m ON "
                    "m.conversation_id = c.id AND m.user_id = ? WHERE c.id = ?",
                    (ME, conversation_id))
    if found is None:
        return _not_found(f"No conversation {conversation_id}.")
    title = _title(ctx, found)
    return Page(title, f"{notice(ctx, DONE)}<h1>{esc(title)}</h1>"
                       f"{_member_line(ctx, found)}{_unread_bar(ctx, conversation_id)}"
                       f"{_thread(ctx, conversation_id)}{_send_form(ctx, conversation_id)}")


def _member_line(ctx: PageContext, c: dict[str, Any]) -> str:
    names = ", ".join(f"{m['name']} (you)" if m["user_id"] == ME else str(m["name"])
                      for m in _members(ctx, c["id"]))
    kind = "Group" if c["kind"] == "group" else "Direct conversation"
    return f'<p class="muted">{esc(kind)} · members: {esc(names)}</p>'


def _unread_bar(ctx: PageContext, conversation_id: int) -> str:
    unread = _unread(ctx, conversation_id)
    if not unread:
        return ""
    form = post_form(ctx.url(f"/conversations/{conversation_id}/read"),
                     button("Mark as read"), inline=True)
    return f'<div role="status"><b>{unread} unread</b> {form}</div>'


def _thread(ctx: PageContext, conversation_id: int) -> str:
    """One page of messages, oldest first: the latest `PER_PAGE`, or earlier ones
    (``?earlier=N`` skips the N newest, as ``read_conversation``'s offset does)."""
    total = int(ctx.value("SELECT count(*) FROM messages WHERE conversation_id = ?",
                          (conversation_id,)))
    skip = query_int(ctx, "earlier", 0)
    rows = ctx.rows("SELECT m.id, m.body, m.sent_at, m.sender_id, m.is_read, u.name FROM "
                    "messages m JOIN users u ON u.id = m.sender_id WHERE m.conversation_id = ? "
                    "ORDER BY m.sent_at DESC, m.id DESC LIMIT ? OFFSET ?",
                    (conversation_id, PER_PAGE, skip))
    path = f"/conversations/{conversation_id}"
    earlier = (f"<p>{link(ctx.url(path, earlier=skip + PER_PAGE), 'Show earlier messages')}"
               f"</p>" if skip + PER_PAGE < total else "")
    later = ctx.url(path, earlier=max(0, skip - PER_PAGE) or None)
    newer = f"<p>{link(later, 'Show newer messages')}</p>" if skip else ""
    shown = "".join(_message(ctx, m) for m in reversed(rows)) or "<p>No messages.</p>"
    return f"{earlier}{shown}{newer}"


def _message(ctx: PageContext, m: dict[str, Any]) -> str:
    mine = m["sender_id"] == ME
    unread = not mine and not m["is_read"]
    badge = " <b>Unread</b>" if unread else ""
    return (f'<div class="msg{" mine" if mine else ""}" id="m{m["id"]}">'
            f'<span class="who">{esc("You" if mine else m["name"])}</span> '
            f'<span class="muted">{stamp(m["sent_at"], ctx.now)}</span>{badge}'
            f"<div>{multiline(m['body'])}</div>{_unread_form(ctx, m, mine or unread)}</div>")


def _unread_form(ctx: PageContext, m: dict[str, Any], hide: bool) -> str:
    """The "Mark unread" button of a read message someone else sent (``mark_unread``)."""
    if hide:
        return ""
    name = f"Mark message {m['id']} from {m['name']} as unread"
    return post_form(ctx.url(f"/messages/{m['id']}/unread"), button("Mark unread", name))


def _send_form(ctx: PageContext, conversation_id: int) -> str:
    box = '<textarea name="body" rows="3" cols="60" maxlength="4000"></textarea>'
    inner = f"<p>{labelled('Message', box)}</p><p>{button('Send')}</p>"
    return post_form(ctx.url(f"/conversations/{conversation_id}/send"), inner)


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
    body = "".join(_person_row(ctx, p) for p in rows)
    table = (f"<table><tr><th>Name</th><th>Work</th><th>Contact</th><th></th></tr>{body}"
             f"</table>" if rows else "<p>Nobody matches.</p>")
    return Page("People", f"<h1>People</h1>{_get_form(ctx, '/people', 'Find people', q)}"
                          f"{table}")


def _get_form(ctx: PageContext, path: str, label: str, q: str) -> str:
    return (f'<form method="get" action="{esc(ctx.url(path))}" role="search">'
            f"{labelled(label, text_input('q', q, kind='search'))} {button('Search')}</form>")


def _person_row(ctx: PageContext, p: dict[str, Any]) -> str:
    work = ", ".join(str(v) for v in (p["title"], p["company"]) if v)
    contact = " · ".join(str(v) for v in (p["email"], p["phone"]) if v)
    return (f"<tr><td>{esc(p['name'])} <span class=\"muted\">@{esc(p['handle'])}</span></td>"
            f"<td>{esc(work)}</td><td>{esc(contact)}</td><td>{_talk(ctx, p)}</td></tr>")


def _talk(ctx: PageContext, p: dict[str, Any]) -> str:
    """A link to the direct conversation with `p`, or a button that starts one."""
    if p["id"] == ME:
        return '<span class="muted">(you)</span>'
    existing = ctx.value(
        "SELECT c.id FROM conversations c WHERE c.kind = 'direct' AND EXISTS (SELECT 1 FROM "
        "conversation_members WHERE conversation_id = c.id AND user_id = ?) AND EXISTS "
        "(SELECT 1 FROM conversation_members WHERE conversation_id = c.id AND user_id = ?) "
        "ORDER BY c.id LIMIT 1", (ME, p["id"]))
    if existing is not None:
        href = esc(ctx.url(f"/conversations/{existing}"))
        return f'<a href="{href}" aria-label="Open conversation with {esc(p["name"])}">Open</a>'
    return post_form(ctx.url("/new"), hidden("member_id", p["id"])
                     + button("Message", f"Start a conversation with {p['name']}"))


@site.page("/search")
def search(ctx: PageContext) -> Page:
    q = ctx.request.arg("q").strip()
    form = _get_form(ctx, "/search", "Search messages", q)
    if not q:
        return Page("Search", f"<h1>Search messages</h1>{form}")
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
    hits = "".join(_hit(ctx, m) for m in rows)
    shown = count(total, "message") + (f", the newest {MAX_RESULTS} shown" if total > len(rows)
                                   else "")
    return Page("Search", f"<h1>Search messages</h1>{form}"
                          f'<p class="muted" role="status">{esc(shown)}</p>{hits}')


def _hit(ctx: PageContext, m: dict[str, Any]) -> str:
    conversation = ctx.row("SELECT * FROM conversations WHERE id = ?", (m["conversation_id"],))
    title = _title(ctx, conversation) if conversation else ""
    who = "You" if m["sender_id"] == ME else m["name"]
    return (f'<div class="msg"><span class="who">{esc(who)}</span> in '
            f"{_conversation_link(ctx, m['conversation_id'], title)} "
            f'<span class="muted">{stamp(m["sent_at"], ctx.now)}</span>'
            f"<div>{multiline(m['body'])}</div></div>")


@site.page("/new")
def new(ctx: PageContext) -> Page:
    others = ctx.rows("SELECT id, name FROM users WHERE id <> ? ORDER BY name, id", (ME,))
    people_boxes = "".join(f"<div>{checkbox('member_id', p['id'], p['name'])}</div>"
                           for p in others)
    box = '<textarea name="first_message" rows="3" cols="60" maxlength="4000"></textarea>'
    title = labelled("Group title (for more than one person)",
                     text_input("title", maxlength=100))
    inner = (f"<fieldset><legend>With</legend>{people_boxes}</fieldset><p>{title}</p>"
             f"<p>{labelled('First message (optional)', box)}</p><p>{button('Start')}</p>")
    return Page("New conversation", f"<h1>New conversation</h1>"
                                    f"{post_form(ctx.url('/new'), inner)}")


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
