"""Helpers shared by the shipped apps. Their source is part of every shipped app's digest
(see ``worldenv.apps._ship``), so a world's pin still covers all the code its tools run."""

from __future__ import annotations

from datetime import date

from worldenv.core.app import ToolError
from worldstore.sqlcheck import like_escape


def check_page(limit: int, offset: int) -> None:
    if not 1 <= limit <= 100:
        raise ToolError(f"limit must be between 1 and 100, got {limit}")
    if offset < 0:
        raise ToolError(f"offset must be 0 or more, got {offset}")


def like(word: str) -> str:
    """A LIKE pattern (ESCAPE '\\') matching `word` literally anywhere."""
    return f"%{like_escape(word)}%"


def iso_day(value: str | None, name: str) -> str | None:
    if value is None:
        return None
    try:
        return date.fromisoformat(value).isoformat()
    except ValueError:
        raise ToolError(f"{name} must be a date in the form YYYY-MM-DD, got {value!r}") from None
