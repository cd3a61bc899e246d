"""Notes: Lars's notebooks, notes and tags (job briefs, checklists, site-visit notes).

Schema (see packs/demo/world/build_lars.py): ``notebooks``, ``notes`` (``is_pinned``,
``is_archived``), ``tags`` (unique lower-case names) and ``note_tags``. The notes app is
single-user: every notebook and note belongs to the logged-in user.

Tags are given by name; naming a tag that does not exist yet creates it. Deleting a note
removes its tag links first, then the note, as the demo's day 6 does.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field

from worldenv.apps._common import check_page, like
from worldenv.core.app import App, ToolContext, ToolError

app = App(service="notes", name="notes", version="1.0.0")

Limit = Annotated[int, Field(description="Maximum number of items to return (1-100).",
                             ge=1, le=100)]
Offset = Annotated[int, Field(description="Number of items to skip, for paging.", ge=0)]
NoteId = Annotated[int, Field(description="Note id.", ge=1)]
TagNames = Annotated[list[str] | None, Field(
    description="Tag names, e.g. ['nordlys', 'checklist'] (new names are created).",
    max_length=10)]
MAX_TITLE = 200
MAX_BODY = 20000
MAX_TAG = 40
SNIPPET = 160


# --- models ----------------------------------------------------------------------------


class Notebook(BaseModel):
    id: int
    name: str
    note_count: int = Field(description="Notes in the notebook that are not archived.")


class NotebookPage(BaseModel):
    items: list[Notebook]
    total: int
    limit: int
    offset: int


class Tag(BaseModel):
    id: int
    name: str
    note_count: int


class TagPage(BaseModel):
    items: list[Tag]
    total: int
    limit: int
    offset: int


class NoteSummary(BaseModel):
    id: int
    notebook_id: int
    notebook_name: str
    title: str
    snippet: str = Field(description="The start of the body.")
    tags: list[str]
    is_pinned: bool
    is_archived: bool
    created_at: str
    updated_at: str


class NotePage(BaseModel):
    items: list[NoteSummary]
    total: int = Field(description="Number of matching notes over all pages.")
    limit: int
    offset: int


class Note(BaseModel):
    id: int
    notebook_id: int
    notebook_name: str
    title: str
    body: str
    tags: list[str]
    is_pinned: bool
    is_archived: bool
    created_at: str
    updated_at: str


class Deleted(BaseModel):
    id: int
    title: str
    deleted: bool


# --- helpers ---------------------------------------------------------------------------




def _title(value: str) -> str:
    if not value.strip():
        raise ToolError("title must not be empty")
    if len(value) > MAX_TITLE:
        raise ToolError(f"title is too long ({len(value)} characters, at most {MAX_TITLE})")
    return value.strip()


def _body(value: str) -> str:
    if len(value) > MAX_BODY:
        raise ToolError(f"body is too long ({len(value)} characters, at most {MAX_BODY})")
    return value


def _tag_names(names: list[str] | None) -> list[str]:
    """Normalised (trimmed, lower-case), de-duplicated tag names, in the order given."""
    out: list[str] = []
    for raw in names or []:
        name = " ".join(raw.split()).lower()
        if not name:
            raise ToolError("tag names must not be empty")
        if len(name) > MAX_TAG:
            raise ToolError(f"tag {name!r} is too long (at most {MAX_TAG} characters)")
        if name not in out:
            out.append(name)
    if len(out) > 10:
        raise ToolError("at most 10 tags at a time")
    return out


def _tag_id(ctx: ToolContext, name: str, *, create: bool) -> int:
    found = ctx.value("SELECT id FROM tags WHERE name = ?", (name,))
    if found is not None:
        return int(found)
    if not create:
        raise ToolError(f"No tag named {name!r}")
    tag_id = ctx.next_id("tags")
    ctx.insert("tags", {"id": tag_id, "name": name, "created_at": ctx.now})
    return tag_id


def _notebook(ctx: ToolContext, notebook_id: int) -> dict[str, Any]:
    row = ctx.row("SELECT * FROM notebooks WHERE id = ?", (notebook_id,))
    if row is None:
        raise ToolError(f"No notebook with id {notebook_id}")
    return row


def _note_row(ctx: ToolContext, note_id: int) -> dict[str, Any]:
    row = ctx.row("""SELECT n.*, b.name AS notebook_name FROM notes n
                     JOIN notebooks b ON b.id = n.notebook_id WHERE n.id = ?""", (note_id,))
    if row is None:
        raise ToolError(f"No note with id {note_id}")
    return row


def _tags_of(ctx: ToolContext, note_id: int) -> list[str]:
    return [str(r["name"]) for r in ctx.rows(
        "SELECT t.name FROM note_tags nt JOIN tags t ON t.id = nt.tag_id "
        "WHERE nt.note_id = ? ORDER BY t.name", (note_id,))]


def _note(ctx: ToolContext, row: dict[str, Any]) -> Note:
    return Note(id=row["id"], notebook_id=row["notebook_id"],
                notebook_name=row["notebook_name"], title=row["title"], body=row["body"],
                tags=_tags_of(ctx, row["id"]), is_pinned=bool(row["is_pinned"]),
                is_archived=bool(row["is_archived"]), created_at=row["created_at"],
                updated_at=row["updated_at"])


def _summary(ctx: ToolContext, row: dict[str, Any]) -> NoteSummary:
    body = str(row["body"])
    snippet = body if len(body) <= SNIPPET else body[:SNIPPET - 3].rstrip() + "..."
    return NoteSummary(id=row["id"], notebook_id=row["notebook_id"],
                       notebook_name=row["notebook_name"], title=row["title"], snippet=snippet,
                       tags=_tags_of(ctx, row["id"]), is_pinned=bool(row["is_pinned"]),
                       is_archived=bool(row["is_archived"]), created_at=row["created_at"],
                       updated_at=row["updated_at"])


def _note_page(ctx: ToolContext, where: list[str], params: list[Any], limit: int,
               offset: int) -> NotePage:
    clause = " AND ".join(where)
    total = int(ctx.value(f"SELECT COUNT(*) FROM notes n WHERE {clause}", params))
    rows = ctx.rows(
        f"""SELECT n.*, b.name AS notebook_name FROM notes n
            JOIN notebooks b ON b.id = n.notebook_id WHERE {clause}
            ORDER BY n.is_pinned DESC, n.updated_at DESC, n.id DESC LIMIT ? OFFSET ?""",
        [*params, limit, offset])
    return NotePage(items=[_summary(ctx, r) for r in rows], total=total, limit=limit,
                    offset=offset)


def _filters(ctx: ToolContext, notebook_id: int | None, tag: str | None,
             include_archived: bool) -> tuple[list[str], list[Any]]:
    where: list[str] = []
    params: list[Any] = []
    if notebook_id is not None:
        _notebook(ctx, notebook_id)
        where.append("n.notebook_id = ?")
        params.append(notebook_id)
    if tag is not None:
        names = _tag_names([tag])
        if not names:
            raise ToolError("tag must not be empty")
        where.append("n.id IN (SELECT note_id FROM note_tags WHERE tag_id = ?)")
        params.append(_tag_id(ctx, names[0], create=False))
    if not include_archived:
        where.append("n.is_archived = 0")
    return where or ["1 = 1"], params


# --- tools -----------------------------------------------------------------------------


@app.tool(writes=False)
def list_notebooks(ctx: ToolContext, limit: Limit = 20, offset: Offset = 0) -> NotebookPage:
    """List your notebooks with how many notes each holds."""
    check_page(limit, offset)
    total = int(ctx.value("SELECT COUNT(*) FROM notebooks"))
    rows = ctx.rows(
        """SELECT b.id, b.name, (SELECT COUNT(*) FROM notes n WHERE n.notebook_id = b.id
                                 AND n.is_archived = 0) AS note_count
           FROM notebooks b ORDER BY b.id LIMIT ? OFFSET ?""", (limit, offset))
    return NotebookPage(items=[Notebook(**r) for r in rows], total=total, limit=limit,
                        offset=offset)


@app.tool(writes=False)
def list_tags(ctx: ToolContext, limit: Limit = 20, offset: Offset = 0) -> TagPage:
    """List the tags in use, by name, with how many notes carry each."""
    check_page(limit, offset)
    total = int(ctx.value("SELECT COUNT(*) FROM tags"))
    rows = ctx.rows(
        """SELECT t.id, t.name, (SELECT COUNT(*) FROM note_tags nt WHERE nt.tag_id = t.id)
                  AS note_count
           FROM tags t ORDER BY t.name LIMIT ? OFFSET ?""", (limit, offset))
    return TagPage(items=[Tag(**r) for r in rows], total=total, limit=limit, offset=offset)


@app.tool(writes=False)
def list_notes(
    ctx: ToolContext,
    notebook_id: Annotated[int | None, Field(description="Only this notebook.", ge=1)] = None,
    tag: Annotated[str | None, Field(description="Only notes with this tag.",
                                     min_length=1, max_length=MAX_TAG)] = None,
    pinned_only: Annotated[bool, Field(description="Only pinned notes.")] = False,
    include_archived: Annotated[bool, Field(description="Also list archived notes.")]
    = False,
    limit: Limit = 20,
    offset: Offset = 0,
) -> NotePage:
    """List your notes: pinned first, then the most recently updated. Items carry a snippet
    of the body; use get_note for the full text."""
    check_page(limit, offset)
    where, params = _filters(ctx, notebook_id, tag, include_archived)
    if pinned_only:
        where.append("n.is_pinned = 1")
    return _note_page(ctx, where, params, limit, offset)


@app.tool(writes=False)
def search_notes(
    ctx: ToolContext,
    query: Annotated[str, Field(
        description="Words to find in title or body (all must occur; case-insensitive).",
        min_length=1, max_length=200)],
    notebook_id: Annotated[int | None, Field(description="Only this notebook.", ge=1)] = None,
    tag: Annotated[str | None, Field(description="Only notes with this tag.",
                                     min_length=1, max_length=MAX_TAG)] = None,
    include_archived: Annotated[bool, Field(description="Also search archived notes.")]
    = False,
    limit: Limit = 20,
    offset: Offset = 0,
) -> NotePage:
    """Search your notes by words in the title or body."""
    check_page(limit, offset)
    words = query.split()
    if not words:
        raise ToolError("query must contain at least one word")
    if len(words) > 10:
        raise ToolError("query may contain at most 10 words")
    where, params = _filters(ctx, notebook_id, tag, include_archived)
    for word in words:
        where.append("(n.title LIKE ? ESCAPE '\\' OR n.body LIKE ? ESCAPE '\\')")
        params += [like(word)] * 2
    return _note_page(ctx, where, params, limit, offset)


@app.tool(writes=False)
def get_note(ctx: ToolContext, note_id: NoteId) -> Note:
    """Get one note with its full body and tags."""
    return _note(ctx, _note_row(ctx, note_id))


@app.tool(writes=True)
def create_note(
    ctx: ToolContext,
    notebook_id: Annotated[int, Field(description="Notebook (see list_notebooks).", ge=1)],
    title: Annotated[str, Field(description="Title.", min_length=1, max_length=MAX_TITLE)],
    body: Annotated[str, Field(description="Text (Markdown; '- [ ]' for checklists).",
                               max_length=MAX_BODY)] = "",
    tags: TagNames = None,
    pinned: Annotated[bool, Field(description="Pin the note to the top.")] = False,
) -> Note:
    """Create a note in one of your notebooks."""
    _notebook(ctx, notebook_id)
    title_text, body_text, names = _title(title), _body(body), _tag_names(tags)
    note_id = ctx.next_id("notes")
    ctx.insert("notes", {"id": note_id, "notebook_id": notebook_id, "title": title_text,
                         "body": body_text, "is_pinned": 1 if pinned else 0, "is_archived": 0,
                         "created_at": ctx.now, "updated_at": ctx.now})
    for name in names:
        ctx.insert("note_tags", {"note_id": note_id, "tag_id": _tag_id(ctx, name, create=True),
                                 "created_at": ctx.now})
    return _note(ctx, _note_row(ctx, note_id))


@app.tool(writes=True)
def update_note(
    ctx: ToolContext,
    note_id: NoteId,
    title: Annotated[str | None, Field(description="New title.", min_length=1,
                                       max_length=MAX_TITLE)] = None,
    body: Annotated[str | None, Field(description="New body (replaces the old one).",
                                      max_length=MAX_BODY)] = None,
    append: Annotated[str | None, Field(
        description="Text to add at the end of the body, on a new line.",
        min_length=1, max_length=MAX_BODY)] = None,
    notebook_id: Annotated[int | None, Field(description="Move to this notebook.", ge=1)]
    = None,
    pinned: Annotated[bool | None, Field(description="Pin or unpin.")] = None,
    archived: Annotated[bool | None, Field(description="Archive or unarchive.")] = None,
) -> Note:
    """Edit a note: title, body (replace or append), notebook, pinned, archived. Only the
    fields you give change."""
    row = _note_row(ctx, note_id)
    if body is not None and append is not None:
        raise ToolError("Give body or append, not both")
    changes: dict[str, Any] = {}
    if title is not None:
        changes["title"] = _title(title)
    if body is not None:
        changes["body"] = _body(body)
    if append is not None:
        old = str(row["body"])
        changes["body"] = _body(f"{old}\n{append}" if old and not old.endswith("\n")
                                else old + append)
    if notebook_id is not None:
        _notebook(ctx, notebook_id)
        changes["notebook_id"] = notebook_id
    if pinned is not None:
        changes["is_pinned"] = 1 if pinned else 0
    if archived is not None:
        changes["is_archived"] = 1 if archived else 0
    if not changes:
        raise ToolError("Nothing to update: give at least one field to change")
    changes = {k: v for k, v in changes.items() if row[k] != v}
    if changes:
        changes["updated_at"] = ctx.now
        sets = ", ".join(f"{column} = ?" for column in changes)
        ctx.execute(f"UPDATE notes SET {sets} WHERE id = ?", [*changes.values(), note_id])
    return _note(ctx, _note_row(ctx, note_id))


@app.tool(writes=True)
def tag_note(
    ctx: ToolContext,
    note_id: NoteId,
    add: TagNames = None,
    remove: TagNames = None,
) -> Note:
    """Add tags to and/or remove tags from a note (tag names; new names are created)."""
    _note_row(ctx, note_id)
    to_add, to_remove = _tag_names(add), _tag_names(remove)
    if not to_add and not to_remove:
        raise ToolError("Give at least one tag to add or remove")
    both = set(to_add) & set(to_remove)
    if both:
        raise ToolError(f"Tag {sorted(both)[0]!r} is both added and removed")
    current = set(_tags_of(ctx, note_id))
    for name in to_remove:
        if name not in current:
            raise ToolError(f"Note {note_id} has no tag {name!r}")
    for name in to_remove:
        ctx.execute("DELETE FROM note_tags WHERE note_id = ? AND tag_id = ?",
                    (note_id, _tag_id(ctx, name, create=False)))
    for name in to_add:
        if name not in current:
            ctx.insert("note_tags", {"note_id": note_id,
                                     "tag_id": _tag_id(ctx, name, create=True),
                                     "created_at": ctx.now})
    return _note(ctx, _note_row(ctx, note_id))


@app.tool(writes=True)
def delete_note(ctx: ToolContext, note_id: NoteId) -> Deleted:
    """Delete a note for good (with its tag links). To keep it out of sight, archive it
    with update_note instead."""
    row = _note_row(ctx, note_id)
    ctx.execute("DELETE FROM note_tags WHERE note_id = ?", (note_id,))
    ctx.execute("DELETE FROM notes WHERE id = ?", (note_id,))
    return Deleted(id=note_id, title=row["title"], deleted=True)
