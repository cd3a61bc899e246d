"""Static checks on one event's SQL text, before anything is applied."""

from __future__ import annotations

import re

import apsw

_COMMENTS = re.compile(r"--[^\n]*|/\*.*?(\*/|$)", re.S)
_FIRST_WORD = re.compile(r"\s*([A-Za-z]+)")
_REFUSED = {
    "VACUUM": "VACUUM is not allowed in an event: it cannot run inside the day's "
              "transaction, and the world hash ignores page layout anyway",
}


def only_comments(text: str) -> bool:
    return _COMMENTS.sub("", text).strip(" \t\r\n;") == ""


def refused_statement_problem(sql: str) -> str | None:
    """Why a statement kind is refused before it is ever applied, or None."""
    m = _FIRST_WORD.match(_COMMENTS.sub(" ", sql))
    return _REFUSED.get(m.group(1).upper()) if m else None


def statement_count_problem(sql: str) -> str | None:
    """Why `sql` is not exactly one statement, or None.

    SQLite's own sqlite3_complete (quotes, comments, trigger bodies) finds the end of the
    first statement; anything but comments and whitespace after it is a second one.
    """
    if only_comments(sql):
        return "empty SQL: an sql event holds exactly one statement"
    for i, ch in enumerate(sql):
        if ch == ";" and apsw.complete(sql[: i + 1]):
            if not only_comments(sql[i + 1 :]):
                return (
                    "more than one SQL statement; an sql event holds exactly one "
                    f"(second statement starts at character {i + 1})"
                )
            return None
    return None
