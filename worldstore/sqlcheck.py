"""Static checks on one event's SQL text, before anything is applied."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import NamedTuple

_COMMENTS = re.compile(r"--[^\n]*|/\*.*?(\*/|$)", re.S)
_FIRST_WORD = re.compile(r"\s*([A-Za-z]+)")
_REFUSED = {
    "VACUUM": "VACUUM is not allowed in an event: it cannot run inside the day's "
              "transaction, and the world hash ignores page layout anyway",
}


def _without_comments(text: str, replacement: str) -> str:
    # (most statements hold no comment: no substitution pass over them then)
    if "--" not in text and "/*" not in text:
        return text
    return _COMMENTS.sub(replacement, text)


def like_escape(text: str) -> str:
    """`text` with LIKE's wildcards escaped, for a pattern written ``... LIKE ? ESCAPE '\\'``.

    The backslash itself is escaped first, so a search for ``50%_off\\`` matches exactly
    those characters; the caller adds the ``%`` around it that "anywhere" needs.
    """
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def only_comments(text: str) -> bool:
    return _without_comments(text, "").strip(" \t\r\n;") == ""


def refused_statement_problem(sql: str) -> str | None:
    """Why a statement kind is refused before it is ever applied, or None."""
    m = _FIRST_WORD.match(_without_comments(sql, " "))
    return _REFUSED.get(m.group(1).upper()) if m else None


def statement_count_problem(sql: str) -> str | None:
    """Why `sql` is not exactly one statement, or None.

    The first statement ends at the first ``;`` after which SQLite's sqlite3_complete
    would call the text so far complete (quotes, comments, trigger bodies); anything but
    comments and whitespace after it is a second one. ``first_statement_end`` finds that
    ``;`` in one pass (asking sqlite3_complete of every prefix ending in ``;`` took time
    quadratic in the length).
    """
    if only_comments(sql):
        return "empty SQL: an sql event holds exactly one statement"
    end = first_statement_end(sql)
    if end is not None and not only_comments(sql[end + 1 :]):
        return (
            "more than one SQL statement; an sql event holds exactly one "
            f"(second statement starts at character {end + 1})"
        )
    return None


# --- sqlite3_complete, in one pass ---------------------------------------------------
#
# A port of the state machine of SQLite's complete.c (sqlite3_complete). sqlite3_complete
# of a prefix ending in ``;`` is true exactly when that ``;`` is a token of the whole text
# (not inside a quote or comment, which the prefix would leave unterminated) and the
# machine is in state START after it, so the first such ``;`` of one left-to-right pass is
# the first prefix sqlite3_complete accepts. tests/worldstore/test_importer_bounds.py compares this
# with sqlite3_complete itself on generated SQL.

_SEMI, _WS, _OTHER, _EXPLAIN, _CREATE, _TEMP, _TRIGGER, _END = range(8)
_START = 1
_TRANS = (
    # SEMI WS OTHER EXPLAIN CREATE TEMP TRIGGER END
    (1, 0, 2, 3, 4, 2, 2, 2),  # 0 INVALID
    (1, 1, 2, 3, 4, 2, 2, 2),  # 1 START
    (1, 2, 2, 2, 2, 2, 2, 2),  # 2 NORMAL
    (1, 3, 3, 2, 4, 2, 2, 2),  # 3 EXPLAIN
    (1, 4, 2, 2, 2, 4, 5, 2),  # 4 CREATE
    (6, 5, 5, 5, 5, 5, 5, 5),  # 5 TRIGGER
    (6, 6, 5, 5, 5, 5, 5, 7),  # 6 SEMI
    (1, 7, 5, 5, 5, 5, 5, 5),  # 7 END
)
_KEYWORDS = {"create": _CREATE, "temp": _TEMP, "temporary": _TEMP, "trigger": _TRIGGER,
             "explain": _EXPLAIN, "end": _END}
# complete.c cuts an identifier as a run of alphanumerics, '_', '$' and anything not
# ASCII (every byte of a UTF-8 sequence is >= 0x80 there); every other character of code
# is a token of its own.
_COMPLETE_RUN = re.compile(r"[0-9A-Za-z_$\u0080-\U0010ffff]+|.", re.S)
_CODE = frozenset({"blob", "num", "param", "word", "op"})


def first_statement_end(sql: str) -> int | None:
    """The index of the ``;`` ending the first complete statement of `sql`, or None: the
    first ``i`` with ``sql[i] == ';'`` and sqlite3_complete(sql[:i + 1]) true.

    It reads ``sql_tokens``: whitespace and comments are complete.c's whitespace, quotes
    and bracketed names its other tokens, a quote or comment left open the end of any
    statement; the code between them is cut again into complete.c's identifiers, whose
    keywords move the machine."""
    if ";" not in sql:  # (most statements: no token of the pass below could end one)
        return None
    state = 0
    code_from: int | None = None  # where the code not yet cut started
    for token in sql_tokens(sql):
        kind = token.kind
        if kind in _CODE:
            if code_from is None:
                code_from = token.start
            continue
        if code_from is not None:
            state = _after_code(sql[code_from:token.start], state)
            code_from = None
        if kind == "semi":
            state = _TRANS[state][_SEMI]
            if state == _START:
                return token.start
        elif kind in ("ws", "comment"):
            state = _TRANS[state][_WS]
        elif kind == "open":
            return None  # no later prefix ends outside this comment or quote
        else:
            state = _TRANS[state][_OTHER]
    return None


def _after_code(code: str, state: int) -> int:
    for m in _COMPLETE_RUN.finditer(code):
        word = m.group()
        # complete.c compares keywords byte by byte, ASCII case folded only
        token = _KEYWORDS.get(word.lower(), _OTHER) if len(word) <= 9 and word.isascii() \
            else _OTHER
        state = _TRANS[state][token]
    return state


# --- one lexer for SQL text ---------------------------------------------------------------
#
# The project's one cut of SQL into tokens: the statement count above reads it, and so do
# the checks of a day's SQL (clock and randomness reads, the values an INSERT writes).
# Whitespace is SQLite's complete.c's (space, tab, newline, form feed, carriage return);
# "open" is a comment, quote or bracketed name that runs to the end of the text.
_LEX = re.compile(r"""
    (?P<ws>[ \t\n\f\r]+)
  | (?P<comment>--[^\n]*|/\*.*?\*/)
  | (?P<open>/\*.*|\[[^\]]*\Z|`[^`]*\Z|"[^"]*\Z|'[^']*\Z)
  | (?P<blob>[xX]'[0-9a-fA-F]*')
  | (?P<str>'(?:[^']|'')*')
  | (?P<ident>"(?:[^"]|"")*"|`(?:[^`]|``)*`|\[[^\]]*\])
  | (?P<num>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<param>\?\d*|[:@$][A-Za-z_][A-Za-z0-9_]*)
  | (?P<word>[A-Za-z_][A-Za-z0-9_$]*)
  | (?P<semi>;)
  | (?P<op>.)
""", re.S | re.X)


class SqlToken(NamedTuple):
    """One token: its kind (``ws``, ``comment``, ``open``, ``blob``, ``str``, ``ident``
    (a quoted or bracketed name), ``num``, ``param``, ``word``, ``semi`` or ``op``), its
    text, and where it starts in the SQL."""

    kind: str
    text: str
    start: int


def sql_tokens(sql: str) -> Iterator[SqlToken]:
    """Every token of `sql`, in order; together they are the whole text."""
    for m in _LEX.finditer(sql):
        yield SqlToken(m.lastgroup or "op", m.group(), m.start())
