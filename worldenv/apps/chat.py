"""Chat: Lars's messenger (direct and group conversations with clients and partners).

Schema (see packs/demo/world/build_lars.py): ``users``, ``conversations`` (kind
'direct' | 'group'), ``conversation_members`` (role 'owner' | 'member') and ``messages``
(``is_read`` means read by the logged-in user; his own messages are stored read).

Every conversation tool is scoped to conversations the logged-in user is a member of:
any other conversation answers "No conversation with id N", exactly as if it did not
exist. The user directory (names, handles, work contact details) is shared by everyone.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from worldenv.apps._common import check_page, iso_day, like
from worldenv.core.app import App, ToolContext, ToolError

app = App(service="chat", name="messenger", version="1.0.0")

Limit = Annotated[int, Field(description="Maximum number of items to return (1-100).",
                             ge=1, le=100)]
Offset = Annotated[int, Field(description="Number of items to skip, for paging.", ge=0)]
Day = Annotated[str | None, Field(description="A date, YYYY-MM-DD (UTC).",
                                  pattern=r"^\d{4}-\d{2}-\d{2}$")]
MAX_BODY = 4000


# --- models ----------------------------------------------------------------------------


class User(BaseModel):
    id: int
    name: str
    handle: str
    email: str | None
    phone: str | None
    company: str | None
    title: str | None


class UserPage(BaseModel):
    items: list[User]
    total: int = Field(description="Number of matching users over all pages.")
    limit: int
    offset: int


class Member(BaseModel):
    user_id: int
    name: str
    role: Literal["owner", "member"]


class Message(BaseModel):
    id: int
    conversation_id: int
    sender_id: int
    sender_name: str
    body: str
    sent_at: str
    is_read: bool = Field(description="Read by you (your own messages are always read).")
    is_own: bool = Field(description="True when you sent it.")


class MessagePage(BaseModel):
    items: list[Message]
    total: int = Field(description="Number of matching messages over all pages.")
    limit: int
    offset: int


class Conversation(BaseModel):
    id: int
    kind: Literal["direct", "group"]
    title: str = Field(description="The group's title, or the other person's name.")
    members: list[Member]
    message_count: int
    unread_count: int
    last_message: Message | None
    created_at: str
    updated_at: str


class ConversationPage(BaseModel):
    items: list[Conversation]
    total: int = Field(description="Number of matching conversations over all pages.")
    limit: int
    offset: int


class Thread(BaseModel):
    conversation: Conversation
    items: list[Message] = Field(description="Messages, oldest first.")
    total: int = Field(description="Number of messages in the conversation.")
    limit: int
    offset: int


class MarkReadResult(BaseModel):
    conversation_id: int
    marked_read: int = Field(description="How many messages changed from unread to read.")
    unread_count: int = Field(description="Unread messages left in the conversation.")


# --- helpers ---------------------------------------------------------------------------




def _words(query: str) -> list[str]:
    words = query.split()
    if not words:
        raise ToolError("query must contain at least one word")
    if len(words) > 10:
        raise ToolError("query may contain at most 10 words")
    return words



_MESSAGE_SQL = """
    SELECT m.id, m.conversation_id, m.sender_id, u.name AS sender_name, m.body, m.sent_at,
           m.is_read
    FROM messages m JOIN users u ON u.id = m.sender_id
"""


def _message(row: dict[str, Any], user_id: int) -> Message:
    return Message(
        id=row["id"], conversation_id=row["conversation_id"], sender_id=row["sender_id"],
        sender_name=row["sender_name"], body=row["body"], sent_at=row["sent_at"],
        is_read=bool(row["is_read"]), is_own=row["sender_id"] == user_id)


def _member_conversation(ctx: ToolContext, conversation_id: int) -> dict[str, Any]:
    row = ctx.row(
        """SELECT c.* FROM conversations c
           JOIN conversation_members cm ON cm.conversation_id = c.id AND cm.user_id = ?
           WHERE c.id = ?""", (ctx.user_id, conversation_id))
    if row is None:
        raise ToolError(f"No conversation with id {conversation_id}")
    return row


def _conversation(ctx: ToolContext, row: dict[str, Any]) -> Conversation:
    cid = row["id"]
    members = [Member(**m) for m in ctx.rows(
        """SELECT cm.user_id, u.name, cm.role FROM conversation_members cm
           JOIN users u ON u.id = cm.user_id
           WHERE cm.conversation_id = ? ORDER BY cm.role DESC, cm.user_id""", (cid,))]
    counts = ctx.row(
        """SELECT COUNT(*) AS n,
                  COALESCE(SUM(CASE WHEN is_read = 0 AND sender_id <> ? THEN 1 ELSE 0 END), 0)
                      AS unread
           FROM messages WHERE conversation_id = ?""", (ctx.user_id, cid)) or {}
    last = ctx.row(_MESSAGE_SQL + " WHERE m.conversation_id = ? ORDER BY m.sent_at DESC, m.id DESC"
                   " LIMIT 1", (cid,))
    title = row["title"]
    if not title:
        others = [m.name for m in members if m.user_id != ctx.user_id]
        title = ", ".join(others) if others else "(just you)"
    return Conversation(
        id=cid, kind=row["kind"], title=title, members=members,
        message_count=int(counts.get("n", 0)), unread_count=int(counts.get("unread", 0)),
        last_message=None if last is None else _message(last, ctx.user_id),
        created_at=row["created_at"], updated_at=row["updated_at"])


def _unread(ctx: ToolContext, conversation_id: int) -> int:
    return int(ctx.value(
        "SELECT COUNT(*) FROM messages WHERE conversation_id = ? AND sender_id <> ? "
        "AND is_read = 0", (conversation_id, ctx.user_id)))


# --- tools -----------------------------------------------------------------------------


@app.tool(writes=False)
def list_conversations(
    ctx: ToolContext,
    unread_only: Annotated[bool, Field(
        description="Only conversations with unread messages.")] = False,
    kind: Annotated[Literal["direct", "group"] | None, Field(
        description="Only direct (one-to-one) or only group conversations.")] = None,
    with_user_id: Annotated[int | None, Field(
        description="Only conversations this user is a member of.", ge=1)] = None,
    limit: Limit = 20,
    offset: Offset = 0,
) -> ConversationPage:
    """List your conversations, most recent activity first, with members, unread count and
    the last message. Use read_conversation to see the messages of one."""
    check_page(limit, offset)
    where = ["c.id IN (SELECT conversation_id FROM conversation_members WHERE user_id = :me)"]
    params: dict[str, Any] = {"me": ctx.user_id}
    if kind is not None:
        where.append("c.kind = :kind")
        params["kind"] = kind
    if with_user_id is not None:
        where.append("c.id IN (SELECT conversation_id FROM conversation_members "
                     "WHERE user_id = :other)")
        params["other"] = with_user_id
    if unread_only:
        where.append("EXISTS (SELECT 1 FROM messages m WHERE m.conversation_id = c.id "
                     "AND m.is_read = 0 AND m.sender_id <> :me)")
    clause = " AND ".join(where)
    total = int(ctx.value(f"SELECT COUNT(*) FROM conversations c WHERE {clause}", params))
    rows = ctx.rows(
        f"""SELECT c.* FROM conversations c WHERE {clause}
            ORDER BY COALESCE((SELECT MAX(m.sent_at) FROM messages m
                               WHERE m.conversation_id = c.id), c.updated_at) DESC, c.id DESC
            LIMIT :limit OFFSET :offset""", {**params, "limit": limit, "offset": offset})
    return ConversationPage(items=[_conversation(ctx, r) for r in rows], total=total,
                            limit=limit, offset=offset)


@app.tool(writes=False)
def read_conversation(
    ctx: ToolContext,
    conversation_id: Annotated[int, Field(description="Conversation id.", ge=1)],
    limit: Limit = 20,
    offset: Annotated[int, Field(
        description="Messages to skip counting back from the newest (0 = the latest page).",
        ge=0)] = 0,
) -> Thread:
    """Read the messages of one of your conversations: the latest `limit` messages (page
    back with `offset`), oldest first. Reading does not change read state; use mark_read."""
    check_page(limit, offset)
    row = _member_conversation(ctx, conversation_id)
    total = int(ctx.value("SELECT COUNT(*) FROM messages WHERE conversation_id = ?",
                          (conversation_id,)))
    rows = ctx.rows(_MESSAGE_SQL + " WHERE m.conversation_id = ?"
                    " ORDER BY m.sent_at DESC, m.id DESC LIMIT ? OFFSET ?",
                    (conversation_id, limit, offset))
    messages = [_message(r, ctx.user_id) for r in reversed(rows)]
    return Thread(conversation=_conversation(ctx, row), items=messages, total=total,
                  limit=limit, offset=offset)


@app.tool(writes=False)
def search_messages(
    ctx: ToolContext,
    query: Annotated[str, Field(
        description="Words to find in message text (all must occur; case-insensitive).",
        min_length=1, max_length=200)],
    conversation_id: Annotated[int | None, Field(
        description="Only this conversation.", ge=1)] = None,
    sender_id: Annotated[int | None, Field(description="Only messages from this user.",
                                           ge=1)] = None,
    unread_only: Annotated[bool, Field(description="Only unread messages.")] = False,
    sent_from: Annotated[Day, Field(description="Sent on or after this date (YYYY-MM-DD).")]
    = None,
    sent_to: Annotated[Day, Field(description="Sent on or before this date (YYYY-MM-DD).")]
    = None,
    limit: Limit = 20,
    offset: Offset = 0,
) -> MessagePage:
    """Search the messages of your conversations, newest first."""
    check_page(limit, offset)
    where = ["m.conversation_id IN (SELECT conversation_id FROM conversation_members "
             "WHERE user_id = ?)"]
    params: list[Any] = [ctx.user_id]
    for word in _words(query):
        where.append("m.body LIKE ? ESCAPE '\\'")
        params.append(like(word))
    if conversation_id is not None:
        _member_conversation(ctx, conversation_id)
        where.append("m.conversation_id = ?")
        params.append(conversation_id)
    if sender_id is not None:
        where.append("m.sender_id = ?")
        params.append(sender_id)
    if unread_only:
        where.append("m.is_read = 0 AND m.sender_id <> ?")
        params.append(ctx.user_id)
    start, end = iso_day(sent_from, "sent_from"), iso_day(sent_to, "sent_to")
    if start is not None:
        where.append("substr(m.sent_at, 1, 10) >= ?")
        params.append(start)
    if end is not None:
        where.append("substr(m.sent_at, 1, 10) <= ?")
        params.append(end)
    clause = " AND ".join(where)
    total = int(ctx.value(f"SELECT COUNT(*) FROM messages m WHERE {clause}", params))
    rows = ctx.rows(_MESSAGE_SQL + f" WHERE {clause} ORDER BY m.sent_at DESC, m.id DESC"
                    " LIMIT ? OFFSET ?", [*params, limit, offset])
    return MessagePage(items=[_message(r, ctx.user_id) for r in rows], total=total,
                       limit=limit, offset=offset)


@app.tool(writes=True)
def send_message(
    ctx: ToolContext,
    conversation_id: Annotated[int, Field(description="Conversation to post in.", ge=1)],
    body: Annotated[str, Field(description="Message text.", min_length=1,
                               max_length=MAX_BODY)],
) -> Message:
    """Send a message to one of your conversations."""
    _member_conversation(ctx, conversation_id)
    if not body.strip():
        raise ToolError("body must not be empty")
    if len(body) > MAX_BODY:
        raise ToolError(f"body is too long ({len(body)} characters, at most {MAX_BODY})")
    message_id = ctx.next_id("messages")
    ctx.insert("messages", {
        "id": message_id, "conversation_id": conversation_id, "sender_id": ctx.user_id,
        "body": body, "sent_at": ctx.now, "is_read": 1, "created_at": ctx.now,
        "updated_at": ctx.now})
    ctx.execute("UPDATE conversations SET updated_at = ? WHERE id = ?",
                (ctx.now, conversation_id))
    row = ctx.require(ctx.row(_MESSAGE_SQL + " WHERE m.id = ?", (message_id,)), "message",
                      message_id)
    return _message(row, ctx.user_id)


@app.tool(writes=True)
def mark_read(
    ctx: ToolContext,
    conversation_id: Annotated[int, Field(description="Conversation id.", ge=1)],
    up_to_message_id: Annotated[int | None, Field(
        description="Only mark messages up to and including this id (default: all).",
        ge=1)] = None,
) -> MarkReadResult:
    """Mark the messages others sent in one of your conversations as read."""
    _member_conversation(ctx, conversation_id)
    sql = ("UPDATE messages SET is_read = 1, updated_at = ? "
           "WHERE conversation_id = ? AND sender_id <> ? AND is_read = 0")
    params: list[Any] = [ctx.now, conversation_id, ctx.user_id]
    if up_to_message_id is not None:
        if ctx.value("SELECT 1 FROM messages WHERE id = ? AND conversation_id = ?",
                     (up_to_message_id, conversation_id)) is None:
            raise ToolError(f"No message with id {up_to_message_id} in conversation "
                            f"{conversation_id}")
        sql += " AND id <= ?"
        params.append(up_to_message_id)
    changed = ctx.execute(sql, params)
    return MarkReadResult(conversation_id=conversation_id, marked_read=changed,
                          unread_count=_unread(ctx, conversation_id))


@app.tool(writes=True)
def mark_unread(
    ctx: ToolContext,
    message_id: Annotated[int, Field(description="Message id.", ge=1)],
) -> Message:
    """Mark a message someone else sent you as unread again (to come back to it later)."""
    row = ctx.row(_MESSAGE_SQL + """ WHERE m.id = ? AND m.conversation_id IN
                  (SELECT conversation_id FROM conversation_members WHERE user_id = ?)""",
                  (message_id, ctx.user_id))
    if row is None:
        raise ToolError(f"No message with id {message_id}")
    if row["sender_id"] == ctx.user_id:
        raise ToolError(f"Message {message_id} is your own; only messages from others can be "
                        "marked unread")
    if row["is_read"]:
        ctx.execute("UPDATE messages SET is_read = 0, updated_at = ? WHERE id = ?",
                    (ctx.now, message_id))
        row["is_read"] = 0
    return _message(row, ctx.user_id)


@app.tool(writes=False)
def list_users(
    ctx: ToolContext,
    query: Annotated[str | None, Field(
        description="Match name, handle, company, title or email (case-insensitive).",
        max_length=100)] = None,
    limit: Limit = 20,
    offset: Offset = 0,
) -> UserPage:
    """List people in the chat directory (use their ids to start conversations)."""
    check_page(limit, offset)
    where: list[str] = ["1 = 1"]
    params: list[Any] = []
    for word in _words(query) if query and query.strip() else []:
        where.append("(name LIKE ? ESCAPE '\\' OR handle LIKE ? ESCAPE '\\' OR "
                     "COALESCE(company, '') LIKE ? ESCAPE '\\' OR "
                     "COALESCE(title, '') LIKE ? ESCAPE '\\' OR "
                     "COALESCE(email, '') LIKE ? ESCAPE '\\')")
        params += [like(word)] * 5
    clause = " AND ".join(where)
    total = int(ctx.value(f"SELECT COUNT(*) FROM users WHERE {clause}", params))
    rows = ctx.rows(f"SELECT id, name, handle, email, phone, company, title FROM users "
                    f"WHERE {clause} ORDER BY id LIMIT ? OFFSET ?", [*params, limit, offset])
    return UserPage(items=[User(**r) for r in rows], total=total, limit=limit, offset=offset)


@app.tool(writes=True)
def create_conversation(
    ctx: ToolContext,
    member_ids: Annotated[list[int], Field(
        description="User ids of the other people (you are added as owner).",
        min_length=1, max_length=20)],
    title: Annotated[str | None, Field(
        description="Group title; required for more than one other member. Leave it out "
                    "for a direct conversation with one person.",
        min_length=1, max_length=100)] = None,
    first_message: Annotated[str | None, Field(
        description="Optional first message to post.", min_length=1,
        max_length=MAX_BODY)] = None,
) -> Conversation:
    """Start a direct conversation with one person, or a titled group conversation."""
    others = sorted({m for m in member_ids if m != ctx.user_id})
    if not others:
        raise ToolError("member_ids must name at least one other user")
    for uid in others:
        if ctx.value("SELECT 1 FROM users WHERE id = ?", (uid,)) is None:
            raise ToolError(f"No user with id {uid}")
    if title is not None and not title.strip():
        raise ToolError("title must not be empty")
    if first_message is not None and not first_message.strip():
        raise ToolError("first_message must not be empty")
    kind = "direct" if len(others) == 1 and title is None else "group"
    if kind == "group" and title is None:
        raise ToolError("A group conversation needs a title")
    if kind == "direct":
        existing = ctx.value(
            """SELECT c.id FROM conversations c WHERE c.kind = 'direct'
               AND EXISTS (SELECT 1 FROM conversation_members WHERE conversation_id = c.id
                           AND user_id = ?)
               AND EXISTS (SELECT 1 FROM conversation_members WHERE conversation_id = c.id
                           AND user_id = ?)
               ORDER BY c.id LIMIT 1""", (ctx.user_id, others[0]))
        if existing is not None:
            name = ctx.value("SELECT name FROM users WHERE id = ?", (others[0],))
            raise ToolError(f"You already have a direct conversation with {name} "
                            f"(conversation {existing})")
    cid = ctx.next_id("conversations")
    ctx.insert("conversations", {"id": cid, "kind": kind, "title": title,
                                 "created_by": ctx.user_id, "created_at": ctx.now,
                                 "updated_at": ctx.now})
    for uid in [ctx.user_id, *others]:
        ctx.insert("conversation_members", {
            "conversation_id": cid, "user_id": uid,
            "role": "owner" if uid == ctx.user_id else "member", "joined_at": ctx.now})
    if first_message is not None:
        send_message(ctx, cid, first_message)
    return _conversation(ctx, _member_conversation(ctx, cid))
