"""Nothing nondeterministic gets into an append-only log.

Each class of statement that once imported and then made the world depend on the host's
time zone, on how the log was split into imports, on the snapshot cache or on the machine
is either refused (one line naming the persona-day, the event and why) or proven to give
one world: the log is built as one file and as a file per day, in fresh processes under
``TZ=UTC`` and ``TZ=Asia/Kolkata``, from a cold cache, and ``verify`` passes.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import apsw
import pytest

from replay.engine import Worlds
from replay.errors import ApplyError
from replay.sqlite import open_event_db, take_denial, unguarded
from replay.touched import WriteLog

MAX_ROWID = 2**63 - 1
REPO = Path(__file__).resolve().parents[2]


def sql(day: int, text: str, *, params: list[Any] | None = None, second: int = 0
        ) -> dict[str, Any]:
    line: dict[str, Any] = {"persona": "eva", "day": day,
                            "ts": f"2026-03-{2 + day:02d}T08:00:{second:02d}Z",
                            "type": "sql", "service": "app", "sql": text}
    if params is not None:
        line["params"] = params
    return line


def numbered(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give the events of each day increasing seconds (their `ts` must not go back)."""
    seen: dict[int, int] = {}
    for line in lines:
        line["ts"] = line["ts"][:17] + f"{seen.setdefault(line['day'], 0):02d}Z"
        seen[line["day"]] += 1
    return lines


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def refusal(tmp_path: Path, lines: list[dict[str, Any]]) -> str:
    with Worlds.open(tmp_path / "refused", tmp_path / "refused-cache") as worlds:
        with pytest.raises(ApplyError) as caught:
            worlds.import_stream(io.BytesIO(jsonl(numbered(lines))), source="log.jsonl")
        assert worlds.store.personas() == []  # nothing of the file was stored
    message = str(caught.value)
    assert "\n" not in message
    assert "eva@" in message and "event #" in message
    return message


# --- one world however it is built ----------------------------------------------------

_BUILD = r"""
import io, json, sys
from pathlib import Path
from replay.engine import Worlds
where, files = Path(sys.argv[1]), json.loads(sys.argv[2])
with Worlds.open(where / "store", where / "cache") as worlds:
    for path in files:
        worlds.import_file(Path(path))
    print(json.dumps([(d.day, d.world_hash) for d in worlds.store.days("eva")]))
"""


def build_in_process(tmp_path: Path, name: str, files: list[Path]) -> list[tuple[int, str]]:
    with Worlds.open(tmp_path / name, tmp_path / f"{name}-cache") as worlds:
        for path in files:
            worlds.import_file(path)
        return [(d.day, d.world_hash) for d in worlds.store.days("eva")]


def build_in_subprocess(tmp_path: Path, name: str, files: list[Path], tz: str
                        ) -> list[tuple[int, str]]:
    where = tmp_path / name
    where.mkdir()
    env = {**os.environ, "TZ": tz}
    out = subprocess.run(
        [sys.executable, "-c", _BUILD, str(where), json.dumps([str(f) for f in files])],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=120, check=True)
    return [tuple(x) for x in json.loads(out.stdout)]  # type: ignore[misc]


def one_world(tmp_path: Path, lines: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """Build `lines` every way; every way must give the same hashes. Returns them."""
    lines = numbered(lines)
    whole = tmp_path / "whole.jsonl"
    whole.write_bytes(jsonl(lines))
    days = sorted({line["day"] for line in lines})
    per_day = []
    for day in days:
        part = tmp_path / f"day-{day}.jsonl"
        part.write_bytes(jsonl([x for x in lines if x["day"] == day]))
        per_day.append(part)
    expected = build_in_process(tmp_path, "one-file", [whole])
    assert [d for d, _ in expected] == days
    assert build_in_process(tmp_path, "per-day", per_day) == expected
    assert build_in_subprocess(tmp_path, "utc", [whole], "UTC") == expected
    assert build_in_subprocess(tmp_path, "kolkata", per_day, "Asia/Kolkata") == expected
    # Cold cache: every snapshot is rebuilt from the log, day by day from nothing.
    shutil.rmtree(tmp_path / "one-file-cache")
    with Worlds.open(tmp_path / "one-file", tmp_path / "cold-cache") as worlds:
        for day, world_hash in expected:
            worlds.checkout(f"eva@{day}", tmp_path / f"checkout-{day}")
            assert worlds.store.day("eva", day).world_hash == world_hash
        assert worlds.verify().ok
    return expected


# --- the time zone ----------------------------------------------------------------------

@pytest.mark.parametrize("modifier", [
    "'localtime'", "'utc'", "'LocalTime'", "' UTC '", "'local' || 'time'", "?", "x'757463'",
])
@pytest.mark.parametrize("function", [
    "datetime('now', {m})", "date('2026-03-02 10:00', {m})", "time({m2}, {m})",
    "julianday('now', '+1 day', {m})", "unixepoch('now', {m})",
    "strftime('%H:%M', 'now', {m})",
])
def test_time_zone_modifiers_are_refused(tmp_path: Path, function: str, modifier: str
                                         ) -> None:
    expr = function.format(m=modifier, m2="'12:00'")
    params = ["localtime"] if modifier == "?" else None
    message = refusal(tmp_path, [sql(0, "CREATE TABLE t(v)"),
                                 sql(0, f"INSERT INTO t VALUES ({expr})", params=params)])
    assert "event #1" in message and "modifier is not allowed" in message
    assert "time zone" in message


def test_time_zone_modifier_from_a_column_or_trigger_is_refused(tmp_path: Path) -> None:
    message = refusal(tmp_path, [
        sql(0, "CREATE TABLE m(name)"),
        sql(0, "INSERT INTO m VALUES ('localtime')"),
        sql(0, "CREATE TABLE t(v)"),
        sql(1, "INSERT INTO t SELECT datetime('now', name) FROM m"),
    ])
    assert "eva@1 event #0" in message and "'localtime' modifier" in message
    message = refusal(tmp_path, [
        sql(0, "CREATE TABLE t(v)"),
        sql(0, "CREATE TABLE log(at)"),
        sql(0, "CREATE TRIGGER tr AFTER INSERT ON t BEGIN "
               "INSERT INTO log VALUES (datetime('now', 'utc')); END"),
        sql(0, "INSERT INTO t VALUES (1)"),
    ])
    assert "event #3" in message and "'utc' modifier" in message


def test_the_frozen_clock_is_the_same_in_every_time_zone(tmp_path: Path) -> None:
    one_world(tmp_path, [
        sql(0, "CREATE TABLE t(a DEFAULT CURRENT_TIMESTAMP, b, c, d, e)"),
        sql(0, "INSERT INTO t(b, c, d, e) VALUES (datetime('now'), date('now', '+1 month'), "
               "strftime('%s %H', 'now', 'start of day'), unixepoch('2026-03-02T10:00+05:30'))"),
        sql(1, "INSERT INTO t(b, c, d, e) VALUES (julianday('now', 'subsec'), "
               "time('now', '-90 minutes'), timediff('now', '2026-01-01'), "
               "datetime(1772438400, 'unixepoch', 'auto'))"),
        sql(1, "CREATE INDEX t_day ON t(date(b))"),
    ])


def test_clock_keywords_and_timediff_read_the_events_frozen_clock(tmp_path: Path) -> None:
    # World databases are built on SQLite's default VFS: the clock reaches events only
    # through the functions the guards install, which must give the event's own `ts`.
    lines = numbered([
        sql(0, "CREATE TABLE t(at DEFAULT CURRENT_TIMESTAMP, d, tm, diff)"),
        sql(1, "INSERT INTO t(d, tm, diff) VALUES (CURRENT_DATE, CURRENT_TIME, "
               "timediff('now', '2026-03-03 08:00:00'))"),  # (day 1's first second)
    ])
    with Worlds.open(tmp_path / "store", tmp_path / "cache") as worlds:
        worlds.import_stream(io.BytesIO(jsonl(lines)), source="log.jsonl")
        with worlds.pinned("eva", 1) as world:
            rows = sqlite3.connect(world / "services" / "app.sqlite").execute(
                "SELECT * FROM t").fetchall()
    assert rows == [("2026-03-03 08:00:00", "2026-03-03", "08:00:00",
                     "+0000-00-00 00:00:00.000")]


@pytest.mark.parametrize("learning", [False, True])
def test_the_hosts_own_statements_leave_nothing_an_event_could_reuse(tmp_path: Path,
                                                                      learning: bool) -> None:
    # The host runs BEGIN, COMMIT and pragmas past the guard (``unguarded``); an event
    # with the very same text must still meet the guard, so those compiles are not cached.
    conn = open_event_db(tmp_path / "app.sqlite", vfs=None)
    if learning:
        WriteLog(conn)  # (the builder's authorizer in front of the guard)
    host = ("PRAGMA synchronous = OFF", "BEGIN", "COMMIT")
    for text in host:
        unguarded(conn, text)
    for text in host:
        with pytest.raises(apsw.AuthError):
            conn.execute(text)
        assert take_denial() is not None
    conn.close()


# --- rowid 2^63-1 -----------------------------------------------------------------------

@pytest.mark.parametrize("write", [
    f"INSERT INTO t(id, v) VALUES ({MAX_ROWID}, 'max')",
    "INSERT INTO t(id, v) VALUES (9223372036854775806 + 1, 'computed')",
    "INSERT INTO t(rowid, v) VALUES (?, 'bound')",
    f"UPDATE t SET id = {MAX_ROWID} WHERE id = 1",
    f"INSERT INTO t(id, v) VALUES ({MAX_ROWID}, 'max'), (NULL, 'random')",
    f"INSERT INTO t(id, v) VALUES ({MAX_ROWID}, 'gone'), (NULL, 'random')",  # see below
])
def test_rowid_max_is_refused(tmp_path: Path, write: str) -> None:
    params = [MAX_ROWID] if "?" in write else None
    message = refusal(tmp_path, [
        sql(0, "CREATE TABLE t(id INTEGER PRIMARY KEY, v)"),
        sql(0, "INSERT INTO t(id, v) VALUES (1, 'one')"),
        # The row at 2^63-1 is gone again by the end of the statement that used it.
        sql(0, "CREATE TRIGGER gone AFTER INSERT ON t WHEN new.v = 'random' BEGIN "
               f"DELETE FROM t WHERE id = {MAX_ROWID}; END"),
        sql(1, write, params=params)])
    assert "eva@1 event #0" in message
    assert "rowid 9223372036854775807 (2^63-1) in table t is not allowed" in message


def test_rowid_max_is_refused_in_tables_without_a_declared_key(tmp_path: Path) -> None:
    message = refusal(tmp_path, [
        sql(0, "CREATE TABLE plain(v)"),
        sql(0, "CREATE TABLE other(v)"),
        sql(0, "CREATE TRIGGER tr AFTER INSERT ON plain BEGIN "
               f"INSERT INTO other(rowid, v) VALUES ({MAX_ROWID}, new.v); END"),
        sql(0, "INSERT INTO plain VALUES (1)"),
    ])
    assert "event #3" in message and "in table other" in message


def test_rowids_below_the_maximum_and_without_rowid_tables_are_accepted(tmp_path: Path
                                                                        ) -> None:
    one_world(tmp_path, [
        sql(0, "CREATE TABLE t(id INTEGER PRIMARY KEY, v)"),
        sql(0, f"INSERT INTO t VALUES ({MAX_ROWID - 1}, 'high'), (-{MAX_ROWID}, 'low')"),
        sql(0, "CREATE TABLE k(id INTEGER PRIMARY KEY, v) WITHOUT ROWID"),
        sql(1, f"INSERT INTO k VALUES ({MAX_ROWID}, 'fine: no rowid')"),
    ])


# --- connection counters ----------------------------------------------------------------

@pytest.mark.parametrize("function", ["changes()", "total_changes()", "CHANGES()"])
def test_change_counters_are_refused(tmp_path: Path, function: str) -> None:
    message = refusal(tmp_path, [sql(0, "CREATE TABLE t(v)"),
                                 sql(0, "INSERT INTO t VALUES (1)"),
                                 sql(1, f"INSERT INTO t VALUES ({function})")])
    assert "eva@1 event #0" in message
    assert f"{function.lower()} is not allowed in events" in message
    assert "split into imports" in message


def test_change_counters_in_defaults_and_triggers_are_refused(tmp_path: Path) -> None:
    message = refusal(tmp_path, [sql(0, "CREATE TABLE t(v DEFAULT (total_changes()))"),
                                 sql(0, "INSERT INTO t DEFAULT VALUES")])
    assert "event #0" in message and "total_changes() is not allowed" in message
    message = refusal(tmp_path, [
        sql(0, "CREATE TABLE t(v)"), sql(0, "CREATE TABLE log(n)"),
        sql(0, "CREATE TRIGGER tr AFTER INSERT ON t BEGIN INSERT INTO log VALUES (changes()); "
               "END"),
        sql(1, "INSERT INTO t VALUES (1)")])
    assert "eva@1 event #0" in message and "changes() is not allowed" in message


def test_last_insert_rowid_starts_every_day_at_zero(tmp_path: Path) -> None:
    hashes = one_world(tmp_path, [
        sql(0, "CREATE TABLE t(id INTEGER PRIMARY KEY, v)"),
        sql(0, "CREATE TABLE seen(day, rowid_seen)"),
        sql(0, "INSERT INTO t(v) VALUES ('a')"),
        sql(0, "INSERT INTO seen VALUES (0, last_insert_rowid())"),  # the previous event's
        # The first statement of a day: without the reset this was 2 when both days were
        # imported from one file and 0 when day 1 came from a snapshot.
        sql(1, "INSERT INTO seen VALUES (1, last_insert_rowid())"),
        sql(2, "INSERT INTO t(v) VALUES ('b')"),
        sql(2, "INSERT INTO seen VALUES (2, last_insert_rowid())"),
    ])
    assert len(hashes) == 3
    with Worlds.open(tmp_path / "per-day", tmp_path / "per-day-cache") as worlds:
        worlds.checkout("eva@2", tmp_path / "look")
    conn = sqlite3.connect(tmp_path / "look" / "services" / "app.sqlite")
    assert conn.execute("SELECT day, rowid_seen FROM seen ORDER BY rowid").fetchall() == [
        (0, 1), (1, 0), (2, 2)]
    conn.close()


# --- the TEMP schema ----------------------------------------------------------------------

@pytest.mark.parametrize("statement", [
    "CREATE TEMP TABLE scratch(v)",
    "CREATE TEMPORARY TABLE scratch AS SELECT 1",
    "CREATE TABLE temp.scratch(v)",
    "CREATE TEMP VIEW v AS SELECT 1",
    "CREATE VIEW temp.v AS SELECT 1",
    "CREATE TEMP TRIGGER tr AFTER INSERT ON main.t BEGIN SELECT 1; END",
    "CREATE VIRTUAL TABLE temp.f USING fts5(v)",
    "PRAGMA temp.user_version = 3",
    "SELECT * FROM temp.sqlite_master",
])
def test_temp_schema_is_refused(tmp_path: Path, statement: str) -> None:
    message = refusal(tmp_path, [sql(0, "CREATE TABLE t(v)"), sql(0, statement)])
    assert "event #1" in message and "TEMP schema is not allowed" in message


# --- pragmas --------------------------------------------------------------------------------

@pytest.mark.parametrize("statement", [
    "INSERT INTO t SELECT file FROM pragma_database_list",
    "INSERT INTO t SELECT count(*) FROM pragma_database_list",
    "INSERT INTO t SELECT name FROM pragma_function_list",
    "INSERT INTO t SELECT name FROM pragma_collation_list",
    "INSERT INTO t SELECT name FROM pragma_module_list",
    "INSERT INTO t SELECT * FROM pragma_compile_options",
    "INSERT INTO t SELECT * FROM pragma_cache_size",
    "INSERT INTO t SELECT * FROM pragma_freelist_count",
    "INSERT INTO t SELECT * FROM pragma_page_count",
    "PRAGMA database_list",
    "PRAGMA page_size = 8192",
    "PRAGMA foreign_keys = ON",
    "PRAGMA recursive_triggers = 1",
    "PRAGMA main.case_sensitive_like = 1",
])
def test_pragmas_outside_the_allowed_ones_are_refused(tmp_path: Path, statement: str) -> None:
    message = refusal(tmp_path, [sql(0, "CREATE TABLE t(v)"), sql(0, statement)])
    assert "event #1" in message and "PRAGMA" in message and "is not allowed" in message


def test_schema_pragmas_stay_readable(tmp_path: Path) -> None:
    one_world(tmp_path, [
        sql(0, "CREATE TABLE t(a INTEGER PRIMARY KEY, b TEXT)"),
        sql(0, "CREATE INDEX t_b ON t(b)"),
        sql(0, "CREATE TABLE facts(v)"),
        sql(1, "INSERT INTO facts SELECT name FROM pragma_table_info('t')"),
        sql(1, "INSERT INTO facts SELECT name FROM pragma_index_list('t')"),
        sql(1, "INSERT INTO facts SELECT page_size FROM pragma_page_size"),
        sql(1, "PRAGMA user_version = 4"),
    ])


# --- functions and virtual table modules ----------------------------------------------------

@pytest.mark.parametrize(("function", "why"), [
    ("fts3_tokenizer('simple')", "pointers"),
    ("fts3_tokenizer('mine', x'0100000000000000')", "pointers"),  # once: a segfault
    ("sqlite_version()", "how this SQLite was built"),
    ("sqlite_source_id()", "how this SQLite was built"),
    ("sqlite_compileoption_used('ENABLE_FTS5')", "how this SQLite was built"),
    ("load_extension('x')", "host code"),
    ("sin(1.0)", "math library"),
    ("exp(2)", "math library"),
    ("power(1.05, 10)", "math library"),
])
def test_functions_outside_the_allow_list_are_refused(tmp_path: Path, function: str, why: str
                                                      ) -> None:
    message = refusal(tmp_path, [sql(0, "CREATE TABLE t(v)"),
                                 sql(0, "INSERT INTO t VALUES (1)"),
                                 sql(1, f"INSERT INTO t SELECT {function} FROM t")])
    name = function.split("(")[0]
    assert "eva@1 event #0" in message and f"{name}() is not allowed in events" in message
    assert why in message


@pytest.mark.parametrize(("statement", "why"), [
    ("INSERT INTO t SELECT pageno FROM dbstat", "page layout"),
    ("INSERT INTO t SELECT count(*) FROM dbstat", "page layout"),
    ("CREATE VIRTUAL TABLE d USING dbstat", "page layout"),
    ("INSERT INTO t SELECT value FROM carray(1, 2)", "pointer"),
    ("CREATE VIRTUAL TABLE x USING no_such_module(a)", "not on the list"),
])
def test_refused_modules_say_why(tmp_path: Path, statement: str, why: str) -> None:
    message = refusal(tmp_path, [sql(0, "CREATE TABLE t(v)"), sql(0, statement)])
    assert "event #1" in message and "not a" in message.replace("not allowed", "not a")
    assert why in message


def test_full_text_and_rtree_modules_give_one_world(tmp_path: Path) -> None:
    one_world(tmp_path, [
        sql(0, "CREATE VIRTUAL TABLE docs USING fts5(title, body)"),
        sql(0, "CREATE VIRTUAL TABLE old USING fts4(body)"),
        sql(0, "CREATE VIRTUAL TABLE boxes USING rtree(id, x0, x1, y0, y1)"),
        sql(0, "CREATE VIRTUAL TABLE shapes USING geopoly(label)"),
        sql(0, "CREATE TABLE hits(v)"),
        sql(0, "INSERT INTO docs VALUES ('one', 'the quick brown fox'), ('two', 'lazy dog')"),
        sql(0, "INSERT INTO old VALUES ('jumps over')"),
        sql(0, "INSERT INTO boxes VALUES (1, 0, 10, 0, 10), (2, 5, 15, 5, 15)"),
        sql(0, "INSERT INTO boxes(x0, x1, y0, y1) VALUES (1, 2, 3, 4)"),
        sql(0, "INSERT INTO shapes(_shape, label) VALUES ('[[0,0],[1,0],[1,1],[0,0]]', 'tri')"),
        sql(1, "INSERT INTO docs VALUES ('three', 'quick thinking')"),
        sql(1, "INSERT INTO hits SELECT rowid FROM docs WHERE docs MATCH 'quick' ORDER BY rowid"),
        sql(1, "INSERT INTO hits SELECT snippet(docs, 1, '[', ']', '...', 3) FROM docs "
               "WHERE docs MATCH 'fox'"),
        sql(1, "INSERT INTO hits SELECT offsets(old) FROM old WHERE old MATCH 'over'"),
        sql(1, "INSERT INTO hits SELECT id FROM boxes WHERE x0 <= 6 AND x1 >= 6 ORDER BY id"),
        sql(1, "INSERT INTO hits SELECT geopoly_area(_shape) FROM shapes"),
        sql(1, "INSERT INTO hits SELECT key FROM json_each('[1, 2]')"),
        sql(2, "DELETE FROM docs WHERE rowid = 1"),
        sql(2, "INSERT INTO boxes(x0, x1, y0, y1) VALUES (7, 8, 9, 10)"),
    ])


def test_alter_table_gives_one_world(tmp_path: Path) -> None:
    """ALTER TABLE runs through SQLite's own rename helpers and rewrites the (always empty)
    TEMP schema too: accepted, and the same world every way."""
    one_world(tmp_path, [
        sql(0, "CREATE TABLE t(id INTEGER PRIMARY KEY, x TEXT)"),
        sql(0, "CREATE TABLE log(what)"),
        sql(0, "CREATE TRIGGER t_log AFTER INSERT ON t BEGIN INSERT INTO log VALUES (new.x); "
               "END"),
        sql(0, "INSERT INTO t(x) VALUES ('a')"),
        sql(1, "ALTER TABLE t RENAME TO items"),
        sql(1, "ALTER TABLE items RENAME COLUMN x TO label"),
        sql(1, "ALTER TABLE items ADD COLUMN n INTEGER DEFAULT 3"),
        sql(1, "INSERT INTO items(label) VALUES ('b')"),
        sql(2, "ALTER TABLE items DROP COLUMN n"),
        sql(2, "INSERT INTO items(label) VALUES ('c')"),
    ])


def test_allowed_functions_give_one_world(tmp_path: Path) -> None:
    one_world(tmp_path, [
        sql(0, "CREATE TABLE t(id INTEGER PRIMARY KEY, a, b, c)"),
        sql(0, "INSERT INTO t(a, b, c) VALUES (random(), hex(randomblob(8)), sqrt(2.0))"),
        sql(0, "INSERT INTO t(a, b, c) SELECT json_object('n', count(*)), group_concat(id), "
               "printf('%.3f', avg(id)) FROM t"),
        sql(1, "INSERT INTO t(a, b, c) VALUES (upper('x') || format('%05d', 42), "
               "floor(2.5) + ceil(2.5) + mod(7, 3), round(pi(), 4))"),
        sql(1, "UPDATE t SET c = (SELECT median(id) FROM t) WHERE id = 1"),
    ])
