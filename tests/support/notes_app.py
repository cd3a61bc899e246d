"""A small app over the demo world's `notes` table, for tests of the instance machinery
that should not depend on the shipped apps' tool sets."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from worldenv.core.app import App, ToolContext, ToolError


class Note(BaseModel):
    id: int
    title: str
    updated_at: str


def notes_app(name: str) -> App:
    """A fresh app with `get_note` and `rename_note`; callers may register more tools."""
    app = App(service="notes", name=name, version="1")

    @app.tool(writes=False)
    def get_note(ctx: ToolContext,
                 note_id: Annotated[int, Field(description="The note's id", ge=1)]) -> Note:
        """Get one note by id."""
        row = ctx.require(ctx.row("SELECT id, title, updated_at FROM notes WHERE id = ?",
                                  (note_id,)), "note", note_id)
        return Note(**row)

    @app.tool(writes=True)
    def rename_note(ctx: ToolContext, note_id: int,
                    title: Annotated[str, Field(description="New title", min_length=1)]
                    ) -> Note:
        """Rename a note."""
        if not ctx.execute("UPDATE notes SET title = ?, updated_at = ? WHERE id = ?",
                           (title, ctx.now, note_id)):
            raise ToolError(f"No note with id {note_id}")
        return get_note(ctx, note_id)

    return app
