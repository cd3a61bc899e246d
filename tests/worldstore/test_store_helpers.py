"""The helpers every layer shares from the store: one atomic write (a file, a file written
in pieces, a folder), one LIKE escape and one SQL lexer."""

from __future__ import annotations

import os
from pathlib import Path

import apsw
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worldstore.folders import staged_folder, writing_file
from worldstore.sqlcheck import first_statement_end, like_escape, sql_tokens

# --- LIKE ----------------------------------------------------------------------------------

VALUES = ["50%_off\\", "50%_off\\ now", "50 off", "50%xoff\\", "50x_off\\", "a_b", "axb"]


@pytest.mark.parametrize(("text", "found"), [
    ("50%_off\\", {"50%_off\\", "50%_off\\ now"}),
    ("%", {"50%_off\\", "50%_off\\ now", "50%xoff\\"}),
    ("a_b", {"a_b"}),
    ("\\", {"50%_off\\", "50%_off\\ now", "50%xoff\\", "50x_off\\"}),
])
def test_like_escape_matches_the_text_literally(text: str, found: set[str]) -> None:
    db = apsw.Connection(":memory:")
    db.execute("CREATE TABLE t(v TEXT)")
    db.executemany("INSERT INTO t VALUES (?)", [(v,) for v in VALUES])
    rows = {v for (v,) in db.execute("SELECT v FROM t WHERE v LIKE ? ESCAPE '\\'",
                                     (f"%{like_escape(text)}%",))}
    assert rows == found


# --- atomic writes ------------------------------------------------------------------------


def test_a_file_written_in_pieces_replaces_the_old_one_whole(tmp_path: Path) -> None:
    target = tmp_path / "out.jsonl"
    target.write_bytes(b"old\n")
    with pytest.raises(RuntimeError), writing_file(target) as fh:
        fh.write(b"half")
        raise RuntimeError("stopped")
    assert target.read_bytes() == b"old\n" and os.listdir(tmp_path) == ["out.jsonl"]
    with writing_file(target) as fh:
        fh.write(b"new ")
        fh.write(b"text\n")
    assert target.read_bytes() == b"new text\n" and os.listdir(tmp_path) == ["out.jsonl"]


def test_a_file_written_in_pieces_replaces_a_link_never_writes_through_it(
        tmp_path: Path) -> None:
    elsewhere = tmp_path / "secret"
    elsewhere.write_bytes(b"secret")
    (tmp_path / "d").mkdir()
    link = tmp_path / "d" / "out"
    link.symlink_to(elsewhere)
    with writing_file(link) as fh:
        fh.write(b"mine")
    assert elsewhere.read_bytes() == b"secret"
    assert not link.is_symlink() and link.read_bytes() == b"mine"


def test_a_folder_replacing_another_is_whole_or_not_at_all(tmp_path: Path) -> None:
    dest = tmp_path / "task"
    dest.mkdir()
    (dest / "old.txt").write_text("old")
    with pytest.raises(RuntimeError), staged_folder(dest, "task", replacing=True) as staging:
        (staging / "new.txt").write_text("new")
        raise RuntimeError("stopped")
    assert sorted(os.listdir(tmp_path)) == ["task"] and os.listdir(dest) == ["old.txt"]
    with staged_folder(dest, "task", replacing=True) as staging:
        (staging / "new.txt").write_text("new")
    assert sorted(os.listdir(tmp_path)) == ["task"] and os.listdir(dest) == ["new.txt"]


# --- the SQL lexer ------------------------------------------------------------------------

SQL_PIECES = st.sampled_from(["CREATE", "temp", "TRIGGER", "END", "explain", "BEGIN", ";",
                              " ", "\n", "'", "''", '"', "`", "[", "]", "x'0f'", "--",
                              "/*", "*/", "1", ":end", "$x", "?2", "é", "(", ",", "a"])


@settings(max_examples=400, deadline=None)
@given(st.lists(SQL_PIECES, max_size=16).map("".join))
def test_the_tokens_are_the_whole_text_and_end_statements_as_sqlite_does(sql: str) -> None:
    tokens = list(sql_tokens(sql))
    assert "".join(t.text for t in tokens) == sql
    assert all(sql[t.start:t.start + len(t.text)] == t.text for t in tokens)
    end = first_statement_end(sql)
    ends = [i for i, ch in enumerate(sql) if ch == ";" and apsw.complete(sql[:i + 1])]
    assert end == (ends[0] if ends else None)
