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
from worldenv.gui.site import Fields, Markup, Page, PageContext, Redirect, Site, link, markup
from worldenv.sites._html import (
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
    return Page("Not found", markup('<h1>Not found</h1><p>{}</p><p><a href="/chat/">All '
                                    "conversations</a></p>", what), 404)


def _conversation_link(ctx: PageContext, conversation_id: int, text: str) -> Markup:
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
    body = Markup().join(_listed_row(ctx, c) for c in rows)
    table = (markup('<table><tr><th>Conversation</th><th>Last message</th><th>When</th>'
                    '<th class="num">Unread</th></tr>{}</table>', body)
             if rows else Markup("<p>No conversations.</p>"))
    return Page("Conversations", markup('<h1>Conversations</h1><p role="status">{}</p>{}{}',
                                        count(total_unread, "unread message"),
                                        _filter_links(ctx, show), table))


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


def _listed_row(ctx: PageContext, c: dict[str, Any]) -> Markup:
    last = ctx.row("SELECT m.body, m.sent_at, m.sender_id, u.name FROM messages m JOIN users u "
                   "ON u.id = m.sender_id WHERE m.conversation_id = ? ORDER BY m.sent_at DESC, "
                   "m.id DESC LIMIT 1", (c["id"],))
    unread = _unread(ctx, c["id"])
    title = _title(ctx, c)
    kind = Markup(' <span class="muted">(group)</span>' if c["kind"] == "group" else "")
    said = "" if last is None else (
        ("You" if last["sender_id"] == ME else str(last["name"])) + ": "
        + _preview(str(last["body"])))
    when = Markup() if last is None else stamp(last["sent_at"], ctx.now)
    badge = markup("<b>{}</b>", unread) if unread else Markup()
    return markup('<tr><td>{}{}</td><td>{}</td><td>{}</td><td class="num">{}</td></tr>',
                  _conversation_link(ctx, c["id"], title), kind, said, when, badge)


def _filter_links(ctx: PageContext, show: str) -> Markup:
    links = []
    for value, text in FILTERS:
        current = Markup(' aria-current="page"' if value == show else "")
        links.append(markup('<a href="{}"{}>{}</a>', ctx.url("/", show=value), current, text))
    return markup('<nav aria-label="Show"><p>{}</p></nav>', Markup(" · ").join(links))


# --- a conversation ---------------------------------------------------------------------------


@site.page("/conversations/{conversation_id:int}")
def conversation(ctx: PageContext, conversation_id: int) -> Page:
    found = ctx.row("SELECT c.* FROM conversations c JOIN conversation_members m ON "
                    "m.conversation_id = c.id AND m.user_id = ? WHERE c.id = ?",
                    (ME, conversation_id))
    if found is None:
        return _not_found(f"No conversation {conversation_id}.")
    title = _title(ctx, found)
    return Page(title, markup("{}<h1>{}</h1>{}{}{}{}", notice(ctx, DONE), title,
                              _member_line(ctx, found), _unread_bar(ctx, conversation_id),
                              _thread(ctx, conversation_id),
                              _send_form(ctx, conversation_id)))


def _member_line(ctx: PageContext, c: dict[str, Any]) -> Markup:
    names = ", ".join(f"{m['name']} (you)" if m["user_id"] == ME else str(m["name"])
                      for m in _members(ctx, c["id"]))
    kind = "Group" if c["kind"] == "group" else "Direct conversation"
    return markup('<p class="muted">{} · members: {}</p>', kind, names)


def _unread_bar(ctx: PageContext, conversation_id: int) -> Markup:
    unread = _unread(ctx, conversation_id)
    if not unread:
        return Markup()
    form = post_form(ctx.url(f"/conversations/{conversation_id}/read"),
                     button("Mark as read"), inline=True)
    return markup('<div role="status"><b>{} unread</b> {}</div>', unread, form)


def _thread(ctx: PageContext, conversation_id: int) -> Markup:
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
    earlier = (markup("<p>{}</p>", link(ctx.url(path, earlier=skip + PER_PAGE),
                                        "Show earlier messages"))
               if skip + PER_PAGE < total else Markup())
    later = ctx.url(path, earlier=max(0, skip - PER_PAGE) or None)
    newer = markup("<p>{}</p>", link(later, "Show newer messages")) if skip else Markup()
    shown = (Markup().join(_message(ctx, m) for m in reversed(rows))
             or Markup("<p>No messages.</p>"))
    return earlier + shown + newer


def _message(ctx: PageContext, m: dict[str, Any]) -> Markup:
    mine = m["sender_id"] == ME
    unread = not mine and not m["is_read"]
    badge = Markup(" <b>Unread</b>" if unread else "")
    return markup('<div class="msg{}" id="m{}"><span class="who">{}</span> '
                  '<span class="muted">{}</span>{}<div>{}</div>{}</div>',
                  Markup(" mine" if mine else ""), m["id"], "You" if mine else m["name"],
                  stamp(m["sent_at"], ctx.now), badge, multiline(m["body"]),
                  _unread_form(ctx, m, mine or unread))


def _unread_form(ctx: PageContext, m: dict[str, Any], hide: bool) -> Markup:
    """The "Mark unread" button of a read message someone else sent (``mark_unread``)."""
    if hide:
        return Markup()
    name = f"Mark message {m['id']} from {m['name']} as unread"
    return post_form(ctx.url(f"/messages/{m['id']}/unread"), button("Mark unread", name))


def _send_form(ctx: PageContext, conversation_id: int) -> Markup:
    box = Markup('<textarea name="body" rows="3" cols="60" maxlength="4000"></textarea>')
    inner = markup("<p>{}</p><p>{}</p>", labelled("Message", box), button("Send"))
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
    body = Markup().join(_person_row(ctx, p) for p in rows)
    table = (markup("<table><tr><th>Name</th><th>Work</th><th>Contact</th><th></th></tr>{}"
                    "</table>", body) if rows else Markup("<p>Nobody matches.</p>"))
    return Page("People", markup("<h1>People</h1>{}{}",
                                 _get_form(ctx, "/people", "Find people", q), table))


def _get_form(ctx: PageContext, path: str, label: str, q: str) -> Markup:
    return markup('<form method="get" action="{}" role="search">{} {}</form>', ctx.url(path),
                  labelled(label, text_input("q", q, kind="search")), button("Search"))


def _person_row(ctx: PageContext, p: dict[str, Any]) -> Markup:
    work = ", ".join(str(v) for v in (p["title"], p["company"]) if v)
    contact = " · ".join(str(v) for v in (p["email"], p["phone"]) if v)
    return markup('<tr><td>{} <span class="muted">@{}</span></td><td>{}</td><td>{}</td>'
                  "<td>{}</td></tr>", p["name"], p["handle"], work, contact, _talk(ctx, p))


def _talk(ctx: PageContext, p: dict[str, Any]) -> Markup:
    """A link to the direct conversation with `p`, or a button that starts one."""
    if p["id"] == ME:
        return Markup('<span class="muted">(you)</span>')
    existing = ctx.value(
        "SELECT c.id FROM conversations c WHERE c.kind = 'direct' AND EXISTS (SELECT 1 FROM "
        "conversation_members WHERE conversation_id = c.id AND user_id = ?) AND EXISTS "
        "(SELECT 1 FROM conversation_members WHERE conversation_id = c.id AND user_id = ?) "
        "ORDER BY c.id LIMIT 1", (ME, p["id"]))
    if existing is not None:
        return markup('<a href="{}" aria-label="Open conversation with {}">Open</a>',
                      ctx.url(f"/conversations/{existing}"), p["name"])
    return post_form(ctx.url("/new"), hidden("member_id", p["id"])
                     + button("Message", f"Start a conversation with {p['name']}"))


@site.page("/search")
def search(ctx: PageContext) -> Page:
    q = ctx.request.arg("q").strip()
    form = _get_form(ctx, "/search", "Search messages", q)
    if not q:
        return Page("Search", markup("<h1>Search messages</h1>{}", form))
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
    hits = Markup().join(_hit(ctx, m) for m in rows)
    shown = count(total, "message") + (f", the newest {MAX_RESULTS} shown" if total > len(rows)
                                   else "")
    return Page("Search", markup('<h1>Search messages</h1>{}<p class="muted" role="status">{}'
                                 "</p>{}", form, shown, hits))


def _hit(ctx: PageContext, m: dict[str, Any]) -> Markup:
    conversation = ctx.row("SELECT * FROM conversations WHERE id = ?", (m["conversation_id"],))
    title = _title(ctx, conversation) if conversation else ""
    who = "You" if m["sender_id"] == ME else m["name"]
    return markup('<div class="msg"><span class="who">{}</span> in {} '
                  '<span class="muted">{}</span><div>{}</div></div>', who,
                  _conversation_link(ctx, m["conversation_id"], title),
                  stamp(m["sent_at"], ctx.now), multiline(m["body"]))


@site.page("/new")
def new(ctx: PageContext) -> Page:
    others = ctx.rows("SELECT id, name FROM users WHERE id <> ? ORDER BY name, id", (ME,))
    people_boxes = Markup().join(markup("<div>{}</div>", checkbox("member_id", p["id"],
                                                                  p["name"]))
                                 for p in others)
    box = Markup('<textarea name="first_message" rows="3" cols="60" maxlength="4000">'
                 "</textarea>")
    title = labelled("Group title (for more than one person)",
                     text_input("title", maxlength=100))
    inner = markup("<fieldset><legend>With</legend>{}</fieldset><p>{}</p><p>{}</p><p>{}</p>",
                   people_boxes, title, labelled("First message (optional)", box),
                   button("Start"))
    return Page("New conversation", markup("<h1>New conversation</h1>{}",
                                           post_form(ctx.url("/new"), inner)))


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
