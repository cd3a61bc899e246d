"""The chat's web pages: Lars's conversations and a form to write in one.

The pages read; the send form calls the chat's ``send_message`` tool.
"""

from __future__ import annotations

from envs.site import Fields, Page, PageContext, Redirect, Site, esc, link

site = Site(service="chat", title="Messenger", nav=(("Conversations", "/"),))


def _title(ctx: PageContext, conversation: dict[str, object]) -> str:
    if conversation["title"]:
        return str(conversation["title"])
    others = ctx.rows("SELECT u.name FROM conversation_members m JOIN users u ON u.id = "
                      "m.user_id WHERE m.conversation_id = ? AND m.user_id <> 1 ORDER BY u.name",
                      (conversation["id"],))
    return ", ".join(str(o["name"]) for o in others) or "(just you)"


@site.page("/")
def conversations(ctx: PageContext) -> Page:
    rows = ctx.rows(
        "SELECT c.id, c.title, c.kind, (SELECT max(sent_at) FROM messages WHERE "
        "conversation_id = c.id) AS last_at, (SELECT count(*) FROM messages WHERE "
        "conversation_id = c.id AND is_read = 0 AND sender_id <> 1) AS unread "
        "FROM conversations c JOIN conversation_members m ON m.conversation_id = c.id "
        "AND m.user_id = 1 ORDER BY last_at DESC, c.id")
    items = "".join(
        f"<tr><td>{link(ctx.url('/conversations/' + str(c['id'])), _title(ctx, c))}</td>"
        f"<td>{esc(c['kind'])}</td>"
        f"<td>{esc(c['last_at'] or '')}</td><td class=\"num\">{c['unread'] or ''}</td></tr>"
        for c in rows)
    return Page("Conversations", f"<h1>Conversations</h1><table><tr><th>With</th>"
                                 f"<th>Kind</th><th>Last message</th>"
                                 f'<th class="num">Unread</th></tr>{items}</table>')


@site.page("/conversations/{conversation_id:int}")
def conversation(ctx: PageContext, conversation_id: int) -> Page:
    found = ctx.row("SELECT c.* FROM conversations c JOIN conversation_members m ON "
                    "m.conversation_id = c.id AND m.user_id = 1 WHERE c.id = ?",
                    (conversation_id,))
    if found is None:
        return Page("Not found", f"<p>No conversation {conversation_id}.</p>", 404)
    messages = ctx.rows("SELECT m.body, m.sent_at, m.sender_id, u.name FROM messages m "
                        "JOIN users u ON u.id = m.sender_id WHERE m.conversation_id = ? "
                        "ORDER BY m.sent_at, m.id", (conversation_id,))
    shown = "".join(
        f'<div class="msg{" mine" if m["sender_id"] == 1 else ""}">'
        f'<span class="who">{esc(m["name"])}</span> <span class="muted">{esc(m["sent_at"])}'
        f"</span><div>{esc(m['body'])}</div></div>" for m in messages)
    action = ctx.url(f"/conversations/{conversation_id}/send")
    form = (f'<form method="post" action="{esc(action)}">'
            f'<label>Message <input type="text" name="body" size="60" maxlength="4000">'
            f"</label> <button>Send</button></form>")
    title = _title(ctx, found)
    return Page(title, f"<h1>{esc(title)}</h1>{shown or '<p>No messages yet.</p>'}{form}")


@site.form("/conversations/{conversation_id:int}/send")
def send(ctx: PageContext, fields: Fields, conversation_id: int) -> Page | Redirect:
    result = ctx.call("send_message", {"conversation_id": conversation_id,
                                       "body": fields.text("body")})
    return ctx.refused(result) or Redirect(f"/conversations/{conversation_id}")
