"""Bad interchange input is refused whole, named precisely, and leaves the store untouched.

Every refusal goes through a real import (`Worlds.import_file` on a real file, SQLite and
PostgreSQL stores) into a store that already holds two good days of persona `ana`, so
"nothing stored" is checked against a non-empty store. Each bad file starts with a good
new day (`PREFIX`, carrying a new file blob) before the bad line: all-or-nothing means that
good day must not be stored either.
"""

from __future__ import annotations

import base64
import io
import json
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from replay.apply import WorldBuilder
from replay.engine import Worlds
from replay.errors import ApplyError, EventFailed
from replay.fold import build_days
from replay.layout import WORKSPACE, workspace_path
from worldstore.canonical import digest
from worldstore.errors import DayOrderError, InputError, PathError, WorldError
from worldstore.events import (
    GENESIS,
    FileDeletePayload,
    FileWritePayload,
    Payload,
    StoredEvent,
    make_event,
)
from worldstore.store import DayRecord, PersonaSummary

FEATURES_LOG = Path(__file__).resolve().parents[1] / "fixtures" / "golden" / "v1" / "features.jsonl"


# --- building interchange lines ----------------------------------------------------------


def sql(day: int, ts: str, text: str, *, persona: str = "ana", service: str = "app",
        **extra: Any) -> dict[str, Any]:
    return {"persona": persona, "day": day, "ts": ts, "type": "sql", "service": service,
            "sql": text, **extra}


def write(day: int, ts: str, path: str, *, persona: str = "ana", **content: Any
          ) -> dict[str, Any]:
    return {"persona": persona, "day": day, "ts": ts, "type": "file_write", "path": path,
            **content}


def delete(day: int, ts: str, path: str, *, persona: str = "ana") -> dict[str, Any]:
    return {"persona": persona, "day": day, "ts": ts, "type": "file_delete", "path": path}


def jsonl(lines: list[dict[str, Any] | str]) -> bytes:
    """Lines as a file; a str is written verbatim (for malformed lines)."""
    return b"".join(
        (line if isinstance(line, str) else json.dumps(line)).encode() + b"\n" for line in lines
    )


BASELINE: list[dict[str, Any] | str] = [
    sql(0, "2026-03-02T08:00:00Z", "CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT)"),
    sql(0, "2026-03-02T08:00:01Z", "INSERT INTO notes VALUES (1, 'first')"),
    write(0, "2026-03-02T08:00:02Z", "docs/a.txt", text="alpha\n"),
    # day 1 is left out on purpose, so that a later day 1 is "not after the last day"
    sql(2, "2026-03-04T09:00:00Z", "INSERT INTO notes VALUES (2, 'second')"),
    write(2, "2026-03-04T09:00:01Z", "img/x.bin", base64="AAEC/w=="),
    sql(2, "2026-03-04T09:00:02Z", "UPDATE notes SET body = 'first!' WHERE id = 1"),
]
STORED_LAST_TS = "2026-03-04T09:00:02Z"

PREFIX_TEXT = "written by a good day that must not be stored\n"
PREFIX_BLOB = digest(PREFIX_TEXT.encode())
PREFIX: list[dict[str, Any] | str] = [
    sql(3, "2026-03-05T08:00:00Z", "INSERT INTO notes VALUES (3, 'third')"),
    write(3, "2026-03-05T08:00:01Z", "docs/new.txt", text=PREFIX_TEXT),
    sql(3, "2026-03-05T08:00:02Z", "DELETE FROM notes WHERE id = 2"),
]
BAD_TS = "2026-03-05T09:00:00Z"
BAD_LINE = len(PREFIX) + 1  # file line of the first line after PREFIX


# --- the store, and what "unchanged" means -------------------------------------------------


@dataclass(frozen=True)
class StoreState:
    personas: list[PersonaSummary]
    days: dict[str, list[DayRecord]]
    exports: dict[str, bytes]
    event_ids: dict[str, list[str]]


def state_of(worlds: Worlds) -> StoreState:
    personas = worlds.store.personas()
    names = [p.persona for p in personas] + ["ben"]  # ben: a persona some bad files add
    exports = {}
    for p in personas:
        out = io.BytesIO()
        worlds.export(p.persona, out)
        exports[p.persona] = out.getvalue()
    return StoreState(
        personas=personas,
        days={name: worlds.store.days(name) for name in names},
        exports=exports,
        event_ids={name: [e.event_id for e in worlds.store.events(name)] for name in names},
    )


def _with_baseline(location: str, cache: Path, tmp_path: Path) -> Iterator[Worlds]:
    w = Worlds.open(location, cache)
    baseline = tmp_path / "baseline.jsonl"
    baseline.write_bytes(jsonl(BASELINE))
    results = w.import_file(baseline)
    assert [(r.day, r.status) for r in results] == [(0, "imported"), (2, "imported")]
    try:
        yield w
    finally:
        w.close()


@pytest.fixture
def worlds(store_location: str, cache_dir: Path, tmp_path: Path) -> Iterator[Worlds]:
    """A store (SQLite and PostgreSQL) holding ana@0 and ana@2."""
    yield from _with_baseline(store_location, cache_dir, tmp_path)


@pytest.fixture
def sqlite_worlds(tmp_path: Path) -> Iterator[Worlds]:
    """The same on SQLite only: for lines refused while reading, before any store access."""
    yield from _with_baseline(str(tmp_path / "store"), tmp_path / "cache", tmp_path)


def refused(worlds: Worlds, path: Path, error: type[WorldError]) -> Any:
    """Import `path`, expect `error`, and check that the store did not change at all."""
    before = state_of(worlds)
    assert before.personas, "the baseline must make 'unchanged' mean something"
    with pytest.raises(error) as caught:
        worlds.import_file(path)
    assert type(caught.value) is error, f"{type(caught.value).__name__}: {caught.value}"
    assert state_of(worlds) == before
    assert worlds.store.missing_blobs({PREFIX_BLOB}) == {PREFIX_BLOB}
    assert str(path) in str(caught.value), "the message names the file"
    return caught.value


def bad_file(tmp_path: Path, lines: list[dict[str, Any] | str], name: str = "bad.jsonl"
             ) -> Path:
    path = tmp_path / name
    path.write_bytes(jsonl(lines))
    return path


def check_input_error(exc: InputError, path: Path, line: int, field: str | None,
                      words: str) -> None:
    assert exc.file == str(path)
    assert exc.line == line
    assert exc.field == field
    text = str(exc)
    assert text.startswith(f"{path}:{line}: "), text
    if field is not None:
        assert f"field '{field}'" in text, text
    assert words.lower() in text.lower(), text


# --- one bad line after a good day ----------------------------------------------------


@dataclass(frozen=True)
class Bad:
    id: str
    line: dict[str, Any] | str
    field: str | None
    words: str


_DROP = object()  # a value for _bad_sql that removes the key


def _bad_sql(**changes: Any) -> dict[str, Any]:
    line = sql(3, BAD_TS, "INSERT INTO notes VALUES (9, 'bad')")
    line.update(changes)
    return {k: v for k, v in line.items() if v is not _DROP}

BAD_LINES = [
    Bad("malformed-json-truncated", '{"persona": "ana", "day": 3,', None, "malformed JSON"),
    Bad("malformed-json-trailing-comma", json.dumps(_bad_sql())[:-1] + ",}", None,
        "malformed JSON"),
    Bad("malformed-json-trailing-text", json.dumps(_bad_sql()) + " and more", None,
        "malformed JSON"),
    Bad("not-an-object-array", "[1, 2]", None, "Expected `object`, got `array`"),
    Bad("not-an-object-string", '"sql"', None, "Expected `object`, got `str`"),
    Bad("not-an-object-number", "42", None, "Expected `object`, got `int`"),
    Bad("not-an-object-null", "null", None, "Expected `object`, got `null`"),
    Bad("unknown-event-type", _bad_sql(type="sql_query"), "type", "unknown event type"),
    Bad("missing-type", _bad_sql(type=_DROP), "type", "missing required field `type`"),
    Bad("missing-field-sql", _bad_sql(sql=_DROP), "sql", "missing required field `sql`"),
    Bad("missing-field-ts", _bad_sql(ts=_DROP), "ts", "missing required field `ts`"),
    Bad("missing-field-path", {k: v for k, v in write(3, BAD_TS, "x", text="x").items()
                               if k != "path"}, "path", "missing required field `path`"),
    Bad("unknown-extra-field", _bad_sql(colour="red"), "colour", "unknown field `colour`"),
    Bad("extra-field-on-file-delete", {**delete(3, BAD_TS, "docs/a.txt"), "text": "x"},
        "text", "unknown field `text`"),
    Bad("day-as-string", _bad_sql(day="3"), "day", "Expected `int`, got `str`"),
    Bad("day-as-float", _bad_sql(day=3.5), "day", "Expected `int`, got `float`"),
    Bad("sql-as-number", _bad_sql(sql=42), "sql", "Expected `str`, got `int`"),
    Bad("sql-vacuum", _bad_sql(sql="/* tidy */ vacuum"), "sql", "VACUUM is not allowed"),
    Bad("params-as-string", _bad_sql(params="9"), "params", "got `str`"),
    Bad("nested-array-param", _bad_sql(sql="SELECT ?", params=[[1]]), "params[0]",
        "got `array`"),
    Bad("negative-day", _bad_sql(day=-1), "day", "day -1 is negative"),
    Bad("persona-uppercase", _bad_sql(persona="Ana"), "persona", "bad persona name 'Ana'"),
    Bad("persona-space", _bad_sql(persona="an a"), "persona", "bad persona name"),
    Bad("persona-leading-dash", _bad_sql(persona="-ana"), "persona", "bad persona name"),
    Bad("persona-empty", _bad_sql(persona=""), "persona", "bad persona name"),
    Bad("persona-too-long", _bad_sql(persona="a" * 65), "persona", "bad persona name"),
    Bad("service-uppercase", _bad_sql(service="App"), "service", "bad service name 'App'"),
    Bad("service-leading-digit", _bad_sql(service="1app"), "service", "bad service name"),
    Bad("service-dash", _bad_sql(service="my-app"), "service", "bad service name"),
    Bad("service-path", _bad_sql(service="../app"), "service", "bad service name"),
    Bad("ts-without-z", _bad_sql(ts="2026-03-05T09:00:00"), "ts", "not ISO 8601 UTC"),
    Bad("ts-with-offset", _bad_sql(ts="2026-03-05T09:00:00+00:00"), "ts", "not ISO 8601 UTC"),
    Bad("ts-space", _bad_sql(ts="2026-03-05 09:00:00Z"), "ts", "not ISO 8601 UTC"),
    Bad("ts-not-a-date", _bad_sql(ts="tomorrow"), "ts", "not ISO 8601 UTC"),
    Bad("ts-feb-30", _bad_sql(ts="2026-02-30T09:00:00Z"), "ts", "not a real date and time"),
    Bad("ts-hour-25", _bad_sql(ts="2026-03-05T25:00:00Z"), "ts", "not a real date and time"),
    Bad("two-statements", _bad_sql(sql="INSERT INTO notes VALUES (9, 'a'); DELETE FROM notes"),
        "sql", "more than one SQL statement"),
    Bad("second-statement-after-block-comment",
        _bad_sql(sql="INSERT INTO notes VALUES (9, 'a'); /* harmless */ DROP TABLE notes"),
        "sql", "more than one SQL statement"),
    Bad("second-statement-after-line-comment",
        _bad_sql(sql="INSERT INTO notes VALUES (9, 'a'); -- just a comment\nDROP TABLE notes"),
        "sql", "more than one SQL statement"),
    Bad("semicolon-hidden-in-comment",
        _bad_sql(sql="INSERT INTO notes VALUES (9, 'a') -- ; looks ended\n; DROP TABLE notes"),
        "sql", "more than one SQL statement"),
    Bad("second-statement-after-trigger",
        _bad_sql(sql="CREATE TRIGGER t AFTER INSERT ON notes BEGIN DELETE FROM notes; END; "
                     "DROP TABLE notes"),
        "sql", "more than one SQL statement"),
    Bad("empty-sql", _bad_sql(sql=""), "sql", "empty SQL"),
    Bad("blank-sql", _bad_sql(sql="  \n\t "), "sql", "empty SQL"),
    Bad("comment-only-sql", _bad_sql(sql="-- nothing to do\n/* at all */"), "sql", "empty SQL"),
    Bad("semicolon-only-sql", _bad_sql(sql=";"), "sql", "empty SQL"),
    Bad("path-absolute", write(3, BAD_TS, "/etc/passwd", text="x"), "path", "is absolute"),
    Bad("path-dotdot", write(3, BAD_TS, "../outside.txt", text="x"), "path", "contains '..'"),
    Bad("path-dotdot-inside", write(3, BAD_TS, "docs/../../outside.txt", text="x"), "path",
        "contains '..'"),
    Bad("path-delete-dotdot", delete(3, BAD_TS, "docs/../docs/a.txt"), "path",
        "contains '..'"),
    Bad("path-delete-absolute", delete(3, BAD_TS, "/tmp/x"), "path", "is absolute"),
    Bad("path-dot-segment", write(3, BAD_TS, "docs/./a.txt", text="x"), "path", "'.' segment"),
    Bad("path-empty-segment", write(3, BAD_TS, "docs//a.txt", text="x"), "path",
        "empty or '.' segment"),
    Bad("path-backslash", write(3, BAD_TS, "docs\\..\\a.txt", text="x"), "path", "backslash"),
    Bad("path-nul", write(3, BAD_TS, "docs/a\u0000.txt", text="x"), "path", "NUL"),
    Bad("path-empty", write(3, BAD_TS, "", text="x"), "path", "empty path"),
    Bad("file-write-text-and-base64", write(3, BAD_TS, "a.txt", text="x", base64="eA=="),
        "text/base64", "exactly one of 'text' or 'base64'"),
    Bad("file-write-neither", write(3, BAD_TS, "a.txt"), "text",
        "exactly one of 'text' or 'base64'"),
    Bad("file-write-both-null", write(3, BAD_TS, "a.txt", text=None, base64=None), "text",
        "exactly one of 'text' or 'base64'"),
    Bad("invalid-base64-chars", write(3, BAD_TS, "a.bin", base64="not base64!"), "base64",
        "invalid base64"),
    Bad("invalid-base64-padding", write(3, BAD_TS, "a.bin", base64="AAA"), "base64",
        "invalid base64"),
    Bad("blob-param-bad-base64", _bad_sql(sql="SELECT ?", params=[{"$base64": "!!"}]),
        "params[0]", "invalid base64 in blob parameter"),
    Bad("blob-param-wrong-key", _bad_sql(sql="SELECT ?", params=[1, {"b64": "AA=="}]),
        "params[1]", '{"$base64": "..."}'),
    Bad("blob-param-extra-key",
        _bad_sql(sql="SELECT ?", params=[{"$base64": "AA==", "mime": "x"}]), "params[0]",
        '{"$base64": "..."}'),
    Bad("blob-param-named", _bad_sql(sql="SELECT :b", params={"b": {"$base64": "%%"}}),
        "params.b", "invalid base64 in blob parameter"),
    Bad("blob-param-not-a-string", _bad_sql(sql="SELECT ?", params=[{"$base64": 1}]),
        "params[0][...]", "Expected `str`, got `int`"),
    Bad("int-param-over-64-bits", _bad_sql(sql="SELECT ?", params=[2**63]), "params[0]",
        "does not fit SQLite's 64 bits"),
    Bad("float-param-overflow", '{"persona":"ana","day":3,"ts":"' + BAD_TS + '","type":"sql",'
        '"service":"app","sql":"SELECT ?","params":[1e400]}', "params[0]", "out of range"),
]


@pytest.mark.parametrize("bad", BAD_LINES, ids=[b.id for b in BAD_LINES])
def test_bad_line_is_refused_and_nothing_is_stored(sqlite_worlds: Worlds, tmp_path: Path,
                                                   bad: Bad) -> None:
    path = bad_file(tmp_path, [*PREFIX, bad.line])
    exc = refused(sqlite_worlds, path, InputError)
    check_input_error(exc, path, BAD_LINE, bad.field, bad.words)


def test_line_numbers_count_blank_lines(sqlite_worlds: Worlds, tmp_path: Path) -> None:
    path = bad_file(tmp_path, ["", *PREFIX, "   ", "", _bad_sql(day=-4)])
    exc = refused(sqlite_worlds, path, InputError)
    check_input_error(exc, path, len(PREFIX) + 4, "day", "negative")


def test_import_stream_names_its_source(worlds: Worlds) -> None:
    before = state_of(worlds)
    with pytest.raises(InputError) as caught:
        worlds.import_stream(io.BytesIO(jsonl([*PREFIX, _bad_sql(service="Bad")])),
                             source="<batch 7>")
    assert (caught.value.file, caught.value.line, caught.value.field) == (
        "<batch 7>", BAD_LINE, "service")
    assert str(caught.value).startswith(f"<batch 7>:{BAD_LINE}: bad service name 'Bad'")
    assert state_of(worlds) == before


# --- order within a file and against the store ------------------------------------------


def test_ts_decreasing_within_a_persona(worlds: Worlds, tmp_path: Path) -> None:
    path = bad_file(tmp_path, [*PREFIX, _bad_sql(ts="2026-03-05T07:59:59Z")])
    exc = refused(worlds, path, InputError)
    check_input_error(exc, path, BAD_LINE, "ts", "timestamps never decrease within a persona")
    assert "2026-03-05T08:00:02Z" in str(exc), "names the earlier timestamp"


def test_ts_decreasing_by_a_fraction_of_a_second(worlds: Worlds, tmp_path: Path) -> None:
    # As text '08:00:02.5Z' < '08:00:02Z'; in time it is later. The reverse goes back.
    later = sql(3, "2026-03-05T08:00:02.500Z", "INSERT INTO notes VALUES (8, 'frac')")
    back = sql(3, "2026-03-05T08:00:02Z", "INSERT INTO notes VALUES (9, 'back')")
    path = bad_file(tmp_path, [*PREFIX, later, back])
    exc = refused(worlds, path, InputError)
    check_input_error(exc, path, BAD_LINE + 1, "ts", "never decrease")


def test_fractional_ts_after_whole_second_is_accepted(worlds: Worlds, tmp_path: Path) -> None:
    later = sql(3, "2026-03-05T08:00:02.5Z", "INSERT INTO notes VALUES (8, 'frac')")
    path = bad_file(tmp_path, [*PREFIX, later], name="good.jsonl")
    assert [r.status for r in worlds.import_file(path)] == ["imported"]
    next_day = bad_file(tmp_path, [sql(4, "2026-03-05T08:00:02.75Z", "DELETE FROM notes")],
                        name="next.jsonl")
    assert [r.status for r in worlds.import_file(next_day)] == ["imported"]


def test_ts_decreasing_across_personas_is_fine(worlds: Worlds, tmp_path: Path) -> None:
    path = bad_file(tmp_path, [*PREFIX, sql(0, "2020-01-01T00:00:00Z", "SELECT 1",
                                            persona="ben")], name="good.jsonl")
    assert [(r.persona, r.status) for r in worlds.import_file(path)] == [
        ("ana", "imported"), ("ben", "imported")]


def test_ts_before_the_stores_last_ts(worlds: Worlds, tmp_path: Path) -> None:
    ben = [sql(0, "2026-03-01T00:00:00Z", "CREATE TABLE t(x)", persona="ben"),
           write(0, "2026-03-01T00:00:01Z", "ben.txt", persona="ben", text=PREFIX_TEXT)]
    early = sql(3, "2026-03-04T08:59:59Z", "INSERT INTO notes VALUES (9, 'early')")
    path = bad_file(tmp_path, [*ben, early])
    exc = refused(worlds, path, InputError)
    check_input_error(exc, path, 3, "ts", "before the persona's stored last timestamp")
    assert STORED_LAST_TS in str(exc)


def test_out_of_order_day_in_a_file(worlds: Worlds, tmp_path: Path) -> None:
    ben = [sql(2, "2026-03-01T00:00:00Z", "CREATE TABLE t(x)", persona="ben"),
           sql(1, "2026-03-01T00:00:01Z", "CREATE TABLE u(x)", persona="ben")]
    path = bad_file(tmp_path, [*PREFIX, *ben])
    exc = refused(worlds, path, InputError)
    check_input_error(exc, path, BAD_LINE + 1, "day", "day 1 of persona 'ben' comes after day 2")


def test_a_days_lines_must_stay_together(worlds: Worlds, tmp_path: Path) -> None:
    day4 = sql(4, "2026-03-06T08:00:00Z", "SELECT 1")
    back_to_3 = sql(3, "2026-03-06T08:00:01Z", "SELECT 2")
    path = bad_file(tmp_path, [*PREFIX, day4, back_to_3])
    exc = refused(worlds, path, InputError)
    check_input_error(exc, path, BAD_LINE + 1, "day", "a day's lines stay together")


def test_day_already_stored_with_different_content(worlds: Worlds, tmp_path: Path) -> None:
    changed = [line if line is not BASELINE[3] else sql(2, "2026-03-04T09:00:00Z",
                                                       "INSERT INTO notes VALUES (2, 'other')")
               for line in BASELINE]
    path = bad_file(tmp_path, [*changed, *PREFIX])
    exc = refused(worlds, path, DayOrderError)
    assert str(exc).startswith(f"{path}:4: ana@2 already exists with different events"), exc


def test_day_stored_with_different_timestamp(worlds: Worlds, tmp_path: Path) -> None:
    moved = dict(BASELINE[5])  # type: ignore[arg-type]
    moved["ts"] = "2026-03-04T09:00:03Z"
    path = bad_file(tmp_path, [*BASELINE[3:5], moved, *PREFIX])
    exc = refused(worlds, path, DayOrderError)
    assert str(exc).startswith(f"{path}:1: ana@2 already exists with different events"), exc


def test_day_not_after_the_stored_last_day(worlds: Worlds, tmp_path: Path) -> None:
    day1 = sql(1, "2026-03-05T07:00:00Z", "INSERT INTO notes VALUES (9, 'late day one')")
    path = bad_file(tmp_path, [day1, *PREFIX])
    exc = refused(worlds, path, DayOrderError)
    assert str(exc).startswith(f"{path}:1: ana@1 is not after the persona's last stored day 2")


# --- SQL that parses but does not apply ------------------------------------------------


def test_sql_failing_mid_day_stores_neither_day(worlds: Worlds, tmp_path: Path) -> None:
    day4 = [
        sql(4, "2026-03-06T08:00:00Z", "INSERT INTO notes VALUES (10, 'a')"),
        write(4, "2026-03-06T08:00:01Z", "docs/day4.txt", text="day four\n"),
        sql(4, "2026-03-06T08:00:02Z", "CREATE TABLE more(x)", service="other"),
        sql(4, "2026-03-06T08:00:03Z", "UPDATE notes SET body = 'b' WHERE id = 10"),
        sql(4, "2026-03-06T08:00:04Z", "INSERT INTO missing_table VALUES (1)"),
        sql(4, "2026-03-06T08:00:05Z", "INSERT INTO notes VALUES (11, 'never')"),
    ]
    path = bad_file(tmp_path, [*PREFIX, *day4])
    exc = refused(worlds, path, ApplyError)
    assert (exc.persona, exc.day, exc.index, exc.line) == ("ana", 4, 4, len(PREFIX) + 5)
    text = str(exc)
    assert text.startswith(f"{path}:{len(PREFIX) + 5}: ana@4 event #4 refused"), text
    assert "no such table: missing_table" in text
    assert worlds.store.missing_blobs({digest(b"day four\n")}) == {digest(b"day four\n")}


def test_failure_in_one_persona_stores_no_other_persona(worlds: Worlds, tmp_path: Path) -> None:
    ben = [sql(0, "2026-03-01T00:00:00Z", "CREATE TABLE t(x)", persona="ben"),
           sql(0, "2026-03-01T00:00:01Z", "INSERT INTO t VALUES (1)", persona="ben")]
    broken = sql(3, BAD_TS, "INSERT INTO notes VALUES (1, 'duplicate key')")
    path = bad_file(tmp_path, [*ben, *PREFIX, broken])
    exc = refused(worlds, path, ApplyError)
    assert (exc.persona, exc.day, exc.index, exc.line) == ("ana", 3, 3, len(PREFIX) + 3)
    assert "UNIQUE constraint failed: notes.id" in str(exc)


@dataclass(frozen=True)
class Refusal:
    id: str
    line: dict[str, Any]
    words: str


REFUSALS = [
    Refusal("attach", _bad_sql(sql="ATTACH DATABASE 'other.sqlite' AS other"),
            "ATTACH/DETACH is not allowed"),
    Refusal("attach-memory", _bad_sql(sql="ATTACH ':memory:' AS m"),
            "ATTACH/DETACH is not allowed"),
    Refusal("detach", _bad_sql(sql="DETACH DATABASE other"), "ATTACH/DETACH is not allowed"),
    Refusal("begin", _bad_sql(sql="BEGIN"), "transaction control is not allowed"),
    Refusal("begin-immediate", _bad_sql(sql="BEGIN IMMEDIATE TRANSACTION"),
            "transaction control is not allowed"),
    Refusal("commit", _bad_sql(sql="COMMIT"), "transaction control is not allowed"),
    Refusal("end", _bad_sql(sql="END TRANSACTION"), "transaction control is not allowed"),
    Refusal("rollback", _bad_sql(sql="ROLLBACK"), "transaction control is not allowed"),
    Refusal("savepoint", _bad_sql(sql="SAVEPOINT sp"), "transaction control is not allowed"),
    Refusal("release", _bad_sql(sql="RELEASE sp"), "transaction control is not allowed"),
    Refusal("pragma-journal-mode", _bad_sql(sql="PRAGMA journal_mode = WAL"),
            "PRAGMA journal_mode is not allowed"),
    Refusal("pragma-journal-mode-read", _bad_sql(sql="PRAGMA journal_mode"),
            "PRAGMA journal_mode is not allowed"),
    Refusal("pragma-foreign-keys", _bad_sql(sql="PRAGMA foreign_keys = OFF"),
            "PRAGMA foreign_keys is not allowed"),
    Refusal("pragma-writable-schema", _bad_sql(sql="PRAGMA writable_schema = 1"),
            "PRAGMA writable_schema is not allowed"),
    Refusal("pragma-schema-version", _bad_sql(sql="PRAGMA schema_version = 99"),
            "PRAGMA schema_version is not allowed"),
    Refusal("load-extension", _bad_sql(sql="SELECT load_extension('libevil')"),
            "load_extension() is not allowed"),
    Refusal("file-delete-missing", delete(3, BAD_TS, "docs/never-written.txt"),
            "file_delete 'docs/never-written.txt': no such file in the workspace"),
    Refusal("file-delete-directory", delete(3, BAD_TS, "docs"), "not a file"),
    Refusal("file-write-under-a-file", write(3, BAD_TS, "docs/a.txt/inner.txt", text="x"),
            "a parent of this path is a file"),
    Refusal("file-write-over-a-directory", write(3, BAD_TS, "docs", text="x"),
            "a directory is in the way"),
    Refusal("syntax-error", _bad_sql(sql="INSERT INTO notes VALUS (9)"), "syntax error"),
    Refusal("missing-named-param", _bad_sql(sql="INSERT INTO notes VALUES (:id, :body)",
                                            params={"id": 9}),
            "no value for named parameter 'body'"),
    Refusal("too-few-positional-params", _bad_sql(sql="INSERT INTO notes VALUES (?, ?)",
                                                  params=[9]), "bindings"),
    Refusal("too-many-positional-params", _bad_sql(sql="INSERT INTO notes VALUES (?, ?)",
                                                   params=[9, "a", "b"]), "bindings"),
    Refusal("dict-params-for-positional", _bad_sql(sql="INSERT INTO notes VALUES (?, ?)",
                                                   params={"a": 9}), "no name"),
]


@pytest.mark.parametrize("case", REFUSALS, ids=[r.id for r in REFUSALS])
def test_refused_statement_names_why(sqlite_worlds: Worlds, tmp_path: Path,
                                     case: Refusal) -> None:
    # SQLite only: every day of a file is applied before the first commit, so these fail
    # before the store is written; test_sql_failing_mid_day covers that on both backends.
    path = bad_file(tmp_path, [*PREFIX, case.line])
    exc = refused(sqlite_worlds, path, ApplyError)
    assert (exc.persona, exc.day, exc.index, exc.line) == ("ana", 3, len(PREFIX), BAD_LINE)
    text = str(exc)
    assert text.startswith(f"{path}:{BAD_LINE}: ana@3 event #{len(PREFIX)} refused"), text
    assert case.words in text, text


# --- accepted edge cases ---------------------------------------------------------------


TRIGGER = ("CREATE TRIGGER notes_audit AFTER INSERT ON notes BEGIN "
           "INSERT INTO audit VALUES (new.id, 'one; two'); "
           "UPDATE audit SET what = what || ';' WHERE id = new.id; END")


def test_trigger_with_inner_semicolons_is_one_statement(worlds: Worlds, tmp_path: Path) -> None:
    lines = [
        sql(3, "2026-03-05T08:00:00Z", "CREATE TABLE audit(id INTEGER, what TEXT)"),
        sql(3, "2026-03-05T08:00:01Z", TRIGGER),
        sql(3, "2026-03-05T08:00:02Z", "INSERT INTO notes VALUES (7, 'x'); -- trailing ; ok"),
        sql(3, "2026-03-05T08:00:03Z", "/* lead */ INSERT INTO notes VALUES (8, 'y') ;  "),
    ]
    path = bad_file(tmp_path, lines, name="trigger.jsonl")
    assert [r.status for r in worlds.import_file(path)] == ["imported"]
    dest = tmp_path / "out"
    worlds.checkout("ana@3", dest)
    with sqlite3.connect(dest / "services" / "app.sqlite") as conn:
        rows = conn.execute("SELECT id, what FROM audit ORDER BY id").fetchall()
    assert rows == [(7, "one; two;"), (8, "one; two;")]


def test_reimporting_the_same_file_is_a_no_op(worlds: Worlds, tmp_path: Path) -> None:
    path = bad_file(tmp_path, BASELINE, name="baseline-again.jsonl")
    before = state_of(worlds)
    results = worlds.import_file(path)
    assert [(r.day, r.status) for r in results] == [(0, "unchanged"), (2, "unchanged")]
    assert [r.world_hash for r in results] == [d.world_hash for d in before.days["ana"]]
    assert state_of(worlds) == before


def test_reimport_with_one_new_day_appends_only_that_day(worlds: Worlds, tmp_path: Path
                                                         ) -> None:
    before = state_of(worlds)
    path = bad_file(tmp_path, [*BASELINE, *PREFIX], name="more.jsonl")
    results = worlds.import_file(path)
    assert [(r.day, r.status) for r in results] == [
        (0, "unchanged"), (2, "unchanged"), (3, "imported")]
    after = state_of(worlds)
    assert after.days["ana"][:2] == before.days["ana"]
    assert after.event_ids["ana"][: len(before.event_ids["ana"])] == before.event_ids["ana"]
    assert worlds.store.missing_blobs({PREFIX_BLOB}) == set()


def test_export_then_import_into_a_fresh_store_is_identical(
        worlds: Worlds, tmp_path: Path) -> None:
    worlds.import_file(FEATURES_LOG)
    worlds.import_file(bad_file(tmp_path, PREFIX, name="prefix.jsonl"))
    original = state_of(worlds)
    assert set(original.exports) == {"ana", "ida", "jon"}
    with Worlds.open(tmp_path / "fresh", tmp_path / "fresh-cache") as fresh:
        for persona, data in original.exports.items():
            dump = tmp_path / f"{persona}.export.jsonl"
            dump.write_bytes(data)
            assert all(r.status == "imported" for r in fresh.import_file(dump))
        copy = state_of(fresh)
        assert copy.days == original.days  # world hashes, heads, manifests, timestamps
        assert copy.event_ids == original.event_ids
        assert copy.exports == original.exports
        assert copy.personas == original.personas
        assert fresh.verify().ok


def test_export_says_what_the_input_said(sqlite_worlds: Worlds) -> None:
    # Export writes named parameters sorted by name, so it need not repeat the input's
    # bytes (the test above shows it is a fixed point); every line means the same.
    sqlite_worlds.import_file(FEATURES_LOG)
    source = [json.loads(line) for line in FEATURES_LOG.read_bytes().splitlines()]
    for persona in ("ida", "jon"):
        out = io.BytesIO()
        sqlite_worlds.export(persona, out)
        lines = [json.loads(line) for line in out.getvalue().splitlines()]
        assert lines == [line for line in source if line["persona"] == persona]
    by_path = {line["path"]: line for line in source if line["type"] == "file_write"}
    assert by_path["bin/nul.txt"]["text"] == "a\u0000b\u0000c"


# --- symlinks: events cannot make one, so worlds are prepared by hand -------------------


def _world_with_link(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "world"
    (root / WORKSPACE / "docs").mkdir(parents=True)
    (root / WORKSPACE / "docs" / "inside.txt").write_text("inside")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("keep me")
    os.symlink(outside, root / WORKSPACE / "docs" / "out")
    os.symlink(root / WORKSPACE / "docs" / "inside.txt", root / WORKSPACE / "alias.txt")
    os.symlink(root / WORKSPACE / "docs", root / WORKSPACE / "docs-alias")
    return root, outside


@pytest.mark.parametrize("rel", [
    "docs/out/victim.txt",  # a directory link leading outside
    "docs/out/new/deeper.txt",  # ... even to a path that does not exist yet
    "docs/out",  # the link itself
    "alias.txt",  # a file link, even one pointing inside
    "docs-alias/inside.txt",  # a directory link pointing inside
])
def test_workspace_path_refuses_symlinks(tmp_path: Path, rel: str) -> None:
    root, _outside = _world_with_link(tmp_path)
    with pytest.raises(PathError, match="goes through a symlink"):
        workspace_path(root, rel)


def test_workspace_path_refuses_a_symlinked_workspace(tmp_path: Path) -> None:
    root = tmp_path / "world"
    root.mkdir()
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", root / WORKSPACE)
    with pytest.raises(PathError, match="is a symlink"):
        workspace_path(root, "a.txt")


@pytest.mark.parametrize(("rel", "words"), [
    ("/etc/passwd", "is absolute"), ("../x", "contains '..'"), ("a/../../x", "contains '..'"),
])
def test_workspace_path_refuses_escapes(tmp_path: Path, rel: str, words: str) -> None:
    root, _ = _world_with_link(tmp_path)
    with pytest.raises(PathError, match=words):
        workspace_path(root, rel)


def test_workspace_path_accepts_plain_paths(tmp_path: Path) -> None:
    root, _ = _world_with_link(tmp_path)
    assert workspace_path(root, "docs/inside.txt") == root / WORKSPACE / "docs" / "inside.txt"
    assert workspace_path(root, "docs/new/file.txt") == root / WORKSPACE / "docs/new/file.txt"
    assert workspace_path(root, "docs/inside.txt/x") == root / WORKSPACE / "docs/inside.txt/x"


def _event(payload: Payload, seq: int = 0) -> StoredEvent:
    return make_event(persona="ana", seq=seq, day=5, ts="2026-03-07T08:00:00Z", prev=GENESIS,
                      payload=payload)


@pytest.mark.parametrize("rel", ["docs/out/victim.txt", "docs/out/new.txt", "alias.txt"])
def test_apply_refuses_to_write_through_a_symlink(tmp_path: Path, rel: str) -> None:
    root, outside = _world_with_link(tmp_path)
    data = b"overwritten"
    builder = WorldBuilder(root, {digest(data): data}.__getitem__)
    payload = FileWritePayload(path=rel, blob=digest(data), size=len(data), encoding="text")
    try:
        with pytest.raises(EventFailed, match="goes through a symlink") as caught:
            builder.apply(_event(payload))
    finally:
        builder.abort()
    assert isinstance(caught.value, WorldError)
    assert (outside / "victim.txt").read_text() == "keep me"
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]
    assert (root / WORKSPACE / "docs" / "inside.txt").read_text() == "inside"


@pytest.mark.parametrize("rel", ["docs/out/victim.txt", "alias.txt"])
def test_apply_refuses_to_delete_through_a_symlink(tmp_path: Path, rel: str) -> None:
    root, outside = _world_with_link(tmp_path)
    builder = WorldBuilder(root, {}.__getitem__)
    try:
        with pytest.raises(EventFailed, match="goes through a symlink"):
            builder.apply(_event(FileDeletePayload(path=rel)))
    finally:
        builder.abort()
    assert (outside / "victim.txt").read_text() == "keep me"
    assert (root / WORKSPACE / "alias.txt").is_symlink()


def test_building_days_through_a_symlink_names_the_event(tmp_path: Path) -> None:
    root, outside = _world_with_link(tmp_path)
    data = b"x"
    blobs = {digest(data): data}
    fine = FileWritePayload(path="docs/ok.txt", blob=digest(data), size=1, encoding="text")
    evil = FileWritePayload(path="docs/out/evil.txt", blob=digest(data), size=1,
                            encoding="base64")
    first = _event(fine, seq=0)
    second = make_event(persona="ana", seq=1, day=5, ts="2026-03-07T08:00:01Z",
                        prev=first.event_id, payload=evil)
    with pytest.raises(ApplyError) as caught:
        list(build_days(root, [first, second], blobs.__getitem__, lines={0: 11, 1: 12},
                        source="hand.jsonl"))
    assert (caught.value.persona, caught.value.day, caught.value.index, caught.value.line) == (
        "ana", 5, 1, 12)
    assert str(caught.value).startswith("hand.jsonl:12: ana@5 event #1 refused")
    assert "goes through a symlink" in str(caught.value)
    assert not (outside / "evil.txt").exists()


def test_a_file_written_again_is_a_new_file(tmp_path: Path) -> None:
    # A world built on a copy that shares its files' inodes (a hard link, a snapshot) must
    # not write through them: the old bytes stay where else they are.
    root = tmp_path / "world"
    (root / WORKSPACE / "docs").mkdir(parents=True)
    target = root / WORKSPACE / "docs" / "a.txt"
    target.write_bytes(b"old bytes")
    shared = tmp_path / "shared.txt"
    os.link(target, shared)
    data = b"new"
    builder = WorldBuilder(root, {digest(data): data}.__getitem__)
    try:
        builder.apply(_event(FileWritePayload(path="docs/a.txt", blob=digest(data),
                                              size=len(data), encoding="text")))
    finally:
        builder.abort()
    assert target.read_bytes() == b"new"
    assert shared.read_bytes() == b"old bytes"
    assert os.stat(shared).st_nlink == 1


def test_base64_and_text_round_trip_exact_bytes(worlds: Worlds, tmp_path: Path) -> None:
    raw = bytes(range(256))
    lines = [write(3, "2026-03-05T08:00:00Z", "bin/all.bin",
                   base64=base64.b64encode(raw).decode()),
             write(3, "2026-03-05T08:00:01Z", "txt/nul.txt", text="a\u0000b\r\nc")]
    worlds.import_file(bad_file(tmp_path, lines, name="bytes.jsonl"))
    dest = tmp_path / "out"
    worlds.checkout("ana@3", dest)
    assert (dest / WORKSPACE / "bin" / "all.bin").read_bytes() == raw
    assert (dest / WORKSPACE / "txt" / "nul.txt").read_bytes() == b"a\x00b\r\nc"
