"""Applying events is a pure function of the log.

The clock SQL sees is the event's `ts`, randomness is seeded by the event's id, parameters
bind with their JSON types, and a world's hash does not depend on how the log was cut into
files or imports. Values are read back from real checkouts with the standard sqlite3 module.
"""

from __future__ import annotations

import base64
import calendar
import io
import json
import sqlite3
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from replay.engine import Worlds


def sql(day: int, ts: str, text: str, *, persona: str = "eva", service: str = "app",
        **extra: Any) -> dict[str, Any]:
    return {"persona": persona, "day": day, "ts": ts, "type": "sql", "service": service,
            "sql": text, **extra}


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def import_lines(worlds: Worlds, lines: list[dict[str, Any]], source: str = "test.jsonl"
                 ) -> list[str]:
    return [r.status for r in worlds.import_stream(io.BytesIO(jsonl(lines)), source=source)]


@pytest.fixture
def worlds(store_location: str, cache_dir: Path) -> Iterator[Worlds]:
    with Worlds.open(store_location, cache_dir) as w:
        yield w


def fresh(tmp_path: Path, name: str) -> Worlds:
    """Another, independent SQLite store."""
    return Worlds.open(tmp_path / name, tmp_path / f"{name}-cache")


def rows(worlds: Worlds, ref: str, query: str, tmp_path: Path, service: str = "app"
         ) -> list[tuple[Any, ...]]:
    dest = tmp_path / f"checkout-{ref.replace('@', '-')}-{len(list(tmp_path.iterdir()))}"
    worlds.checkout(ref, dest)
    conn = sqlite3.connect(dest / "services" / f"{service}.sqlite")
    try:
        return conn.execute(query).fetchall()
    finally:
        conn.close()


def unix(ts: str) -> int:
    """Seconds since the epoch, computed without the product's code."""
    return calendar.timegm(datetime.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S").timetuple())


def julian(ts: str) -> float:
    """julianday('now') as SQLite computes it from a clock in milliseconds."""
    millis = unix(ts) * 1000 + (round(float("0" + ts[19:-1]) * 1000) if ts[19] == "." else 0)
    return (millis + 210866760000000) / 86400000.0  # 210866760000000: the epoch in JD ms


# --- the frozen clock -------------------------------------------------------------------

CLOCK_TABLE = ("CREATE TABLE clock(id INTEGER PRIMARY KEY, ts TEXT, date TEXT, time TEXT, "
               "now TEXT, epoch INTEGER, subsec REAL, frac TEXT, jd REAL, "
               "dflt TEXT DEFAULT CURRENT_TIMESTAMP, dflt_epoch INTEGER DEFAULT (unixepoch()))")
CLOCK_INSERT = ("INSERT INTO clock(id, ts, date, time, now, epoch, subsec, frac, jd) VALUES "
                "(?, CURRENT_TIMESTAMP, CURRENT_DATE, CURRENT_TIME, datetime('now'), "
                "unixepoch(), unixepoch('now', 'subsec'), strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), "
                "julianday('now'))")


def test_clock_functions_read_the_events_ts(worlds: Worlds, tmp_path: Path) -> None:
    stamps = ["2026-03-02T08:15:30Z", "2026-03-02T23:59:59.250Z", "2026-03-04T00:00:00.001Z"]
    lines = [sql(0, "2026-03-02T08:00:00Z", CLOCK_TABLE)]
    lines += [sql(0 if i < 2 else 1, ts, CLOCK_INSERT, params=[i]) for i, ts in enumerate(stamps)]
    lines.append(sql(1, "2026-03-04T00:00:01Z",
                     "INSERT INTO clock(id) VALUES (3)"))  # only the defaults
    assert import_lines(worlds, lines) == ["imported", "imported"]
    got = rows(worlds, "eva@1", "SELECT * FROM clock ORDER BY id", tmp_path)
    assert got == [
        (0, "2026-03-02 08:15:30", "2026-03-02", "08:15:30", "2026-03-02 08:15:30",
         unix(stamps[0]), float(unix(stamps[0])), "2026-03-02T08:15:30.000Z",
         julian(stamps[0]), "2026-03-02 08:15:30", unix(stamps[0])),
        (1, "2026-03-02 23:59:59", "2026-03-02", "23:59:59", "2026-03-02 23:59:59",
         unix(stamps[1]), unix(stamps[1]) + 0.25, "2026-03-02T23:59:59.250Z",
         julian(stamps[1]), "2026-03-02 23:59:59", unix(stamps[1])),
        (2, "2026-03-04 00:00:00", "2026-03-04", "00:00:00", "2026-03-04 00:00:00",
         unix(stamps[2]), unix(stamps[2]) + 0.001, "2026-03-04T00:00:00.001Z",
         julian(stamps[2]), "2026-03-04 00:00:00", unix(stamps[2])),
        (3, None, None, None, None, None, None, None, None, "2026-03-04 00:00:01",
         unix("2026-03-04T00:00:01Z")),
    ]


def test_triggers_see_the_clock_of_the_event_that_fired_them(worlds: Worlds, tmp_path: Path
                                                             ) -> None:
    lines = [
        sql(0, "2026-03-02T08:00:00Z", "CREATE TABLE item(id INTEGER PRIMARY KEY, name TEXT)"),
        sql(0, "2026-03-02T08:00:01Z", "CREATE TABLE audit(item INTEGER, at TEXT)"),
        sql(0, "2026-03-02T08:00:02Z", "CREATE TRIGGER stamp AFTER INSERT ON item BEGIN "
                                       "INSERT INTO audit VALUES (new.id, CURRENT_TIMESTAMP); END"),
        sql(0, "2026-03-02T09:10:11Z", "INSERT INTO item VALUES (1, 'a')"),
        sql(1, "2026-03-05T10:20:30Z", "INSERT INTO item VALUES (2, 'b')"),
    ]
    import_lines(worlds, lines)
    assert rows(worlds, "eva@1", "SELECT * FROM audit ORDER BY item", tmp_path) == [
        (1, "2026-03-02 09:10:11"), (2, "2026-03-05 10:20:30")]


# --- seeded randomness ------------------------------------------------------------------

RANDOM_LOG = [
    sql(0, "2026-03-02T08:00:00Z", "CREATE TABLE r(id INTEGER PRIMARY KEY, a INTEGER, "
                                   "b INTEGER, blob BLOB, dflt INTEGER DEFAULT (random()))"),
    sql(0, "2026-03-02T08:00:01Z", "INSERT INTO r(id, a, b, blob) VALUES "
                                   "(1, random(), random(), randomblob(16))"),
    # the same statement again, even at the same ts: a different event, other values
    sql(0, "2026-03-02T08:00:01Z", "INSERT INTO r(id, a, b, blob) VALUES "
                                   "(2, random(), random(), randomblob(16))"),
    sql(1, "2026-03-03T08:00:00Z", "INSERT INTO r(id, a, b, blob) VALUES "
                                   "(3, random(), abs(random()) % 6, randomblob(3))"),
    sql(1, "2026-03-03T08:00:01Z", "INSERT INTO r(id, blob) VALUES (4, randomblob(0))"),
]


def test_random_is_the_same_in_every_store(worlds: Worlds, tmp_path: Path) -> None:
    assert import_lines(worlds, RANDOM_LOG) == ["imported", "imported"]
    with fresh(tmp_path, "other") as other:
        import_lines(other, RANDOM_LOG, source="elsewhere.jsonl")
        assert [d.world_hash for d in other.store.days("eva")] == [
            d.world_hash for d in worlds.store.days("eva")]
        query = "SELECT * FROM r ORDER BY id"
        assert rows(other, "eva@1", query, tmp_path) == rows(worlds, "eva@1", query, tmp_path)
    assert [r.status for r in worlds.replay("eva")] == ["replayed", "replayed"]
    assert worlds.verify().ok


def test_random_differs_between_events_and_calls(worlds: Worlds, tmp_path: Path) -> None:
    import_lines(worlds, RANDOM_LOG)
    got = rows(worlds, "eva@1", "SELECT id, a, b, blob, dflt FROM r ORDER BY id", tmp_path)
    (_, a1, b1, blob1, d1), (_, a2, b2, blob2, d2), (_, a3, b3, blob3, d3), (_, _, _, blob4,
                                                                              d4) = got
    assert len({a1, b1, a2, b2, a3}) == 5, "every random() call gives another value"
    assert len({d1, d2, d3, d4}) == 4, "DEFAULT (random()) too"
    assert blob1 != blob2
    assert (len(blob1), len(blob2), len(blob3), len(blob4)) == (16, 16, 3, 1)  # as SQLite
    assert 0 <= b3 < 6
    assert all(isinstance(v, int) for v in (a1, b1, a2, b2, a3, d1, d2, d3, d4))


def test_random_depends_on_the_event_not_on_the_call_site(worlds: Worlds, tmp_path: Path
                                                          ) -> None:
    # A different history before the same statement gives other values: the seed is the
    # event id (which chains every earlier event), not the statement text.
    other_log = [RANDOM_LOG[0], sql(0, "2026-03-02T08:00:00Z", "SELECT 1"), *RANDOM_LOG[1:]]
    import_lines(worlds, RANDOM_LOG)
    with fresh(tmp_path, "other") as other:
        import_lines(other, other_log)
        query = "SELECT a, b, blob FROM r WHERE id = 1"
        assert rows(other, "eva@0", query, tmp_path) != rows(worlds, "eva@0", query, tmp_path)


# --- parameters -------------------------------------------------------------------------

PARAM_TABLE = "CREATE TABLE p(id INTEGER PRIMARY KEY, x, y, z)"


def test_named_and_positional_params(worlds: Worlds, tmp_path: Path) -> None:
    lines = [
        sql(0, "2026-03-02T08:00:00Z", PARAM_TABLE),
        sql(0, "2026-03-02T08:00:01Z", "INSERT INTO p VALUES (?, ?, ?, ?)",
            params=[1, "one", 1.5, None]),
        sql(0, "2026-03-02T08:00:02Z", "INSERT INTO p VALUES (?4, ?3, ?2, ?1)",
            params=["z", "y", "x", 2]),
        sql(0, "2026-03-02T08:00:03Z", "INSERT INTO p VALUES (:id, :x, $y, @z)",
            params={"z": -7, "y": "dollar", "x": "colon", "id": 3}),
        sql(0, "2026-03-02T08:00:04Z", "INSERT INTO p VALUES (:id, :v, :v || :v, :v)",
            params={"id": 4, "v": "rep"}),
        sql(0, "2026-03-02T08:00:05Z", "INSERT INTO p VALUES (?1, ?2, ?2, ?1)", params=[5, "r"]),
        sql(0, "2026-03-02T08:00:06Z", "UPDATE p SET z = :z WHERE id = :id",
            params={"id": 1, "z": "unicode ✓ \u0000 nul"}),
    ]
    import_lines(worlds, lines)
    assert rows(worlds, "eva@0", "SELECT *, typeof(y) FROM p ORDER BY id", tmp_path) == [
        (1, "one", 1.5, "unicode ✓ \x00 nul", "real"),
        (2, "x", "y", "z", "text"),
        (3, "colon", "dollar", -7, "text"),
        (4, "rep", "reprep", "rep", "text"),
        (5, "r", "r", 5, "text"),
    ]


def test_blob_params_are_stored_as_blobs(worlds: Worlds, tmp_path: Path) -> None:
    raw = bytes(range(256))
    lines = [
        sql(0, "2026-03-02T08:00:00Z", PARAM_TABLE),
        sql(0, "2026-03-02T08:00:01Z", "INSERT INTO p VALUES (?, ?, ?, ?)",
            params=[1, {"$base64": base64.b64encode(raw).decode()}, {"$base64": ""},
                    "AAEC/w=="]),  # the last is only a string that looks like base64
        sql(0, "2026-03-02T08:00:02Z", "INSERT INTO p VALUES (:id, :b, length(:b), hex(:b))",
            params={"id": 2, "b": {"$base64": "3q2+7w=="}}),
    ]
    import_lines(worlds, lines)
    got = rows(worlds, "eva@0", "SELECT id, x, typeof(x), y, typeof(y), z, typeof(z) "
                                "FROM p ORDER BY id", tmp_path)
    assert got == [(1, raw, "blob", b"", "blob", "AAEC/w==", "text"),
                   (2, b"\xde\xad\xbe\xef", "blob", 4, "integer", "DEADBEEF", "text")]
    out = io.BytesIO()
    worlds.export("eva", out)
    exported = [json.loads(line) for line in out.getvalue().splitlines()]
    assert exported[1]["params"] == lines[1]["params"]
    assert exported[2]["params"] == {"b": {"$base64": "3q2+7w=="}, "id": 2}


def test_bool_null_and_number_params(worlds: Worlds, tmp_path: Path) -> None:
    lines = [
        sql(0, "2026-03-02T08:00:00Z", PARAM_TABLE),
        sql(0, "2026-03-02T08:00:01Z", "INSERT INTO p VALUES (1, ?, ?, ?)",
            params=[True, False, None]),
        sql(0, "2026-03-02T08:00:02Z", "INSERT INTO p VALUES (2, :t, :f, :n)",
            params={"t": True, "f": False, "n": None}),
        sql(0, "2026-03-02T08:00:03Z", "INSERT INTO p VALUES (3, ?, ?, ?)",
            params=[1.0, 2**63 - 1, -(2**63) + 1]),
        sql(0, "2026-03-02T08:00:04Z", "INSERT INTO p VALUES (4, ?, ?, ?)",
            params=[0.1, 1e-300, -0.5]),
    ]
    import_lines(worlds, lines)
    got = rows(worlds, "eva@0", "SELECT id, x, typeof(x), y, typeof(y), z, typeof(z) FROM p "
                                "ORDER BY id", tmp_path)
    assert got == [
        (1, 1, "integer", 0, "integer", None, "null"),
        (2, 1, "integer", 0, "integer", None, "null"),
        (3, 1.0, "real", 2**63 - 1, "integer", -(2**63) + 1, "integer"),
        (4, 0.1, "real", 1e-300, "real", -0.5, "real"),
    ]
    # a bool stays a bool in the log (the export repeats it), it binds as an integer
    out = io.BytesIO()
    worlds.export("eva", out)
    assert json.loads(out.getvalue().splitlines()[1])["params"] == [True, False, None]


def test_reading_schema_pragmas_is_allowed(worlds: Worlds, tmp_path: Path) -> None:
    lines = [
        sql(0, "2026-03-02T08:00:00Z", "CREATE TABLE t(a INTEGER, b TEXT)"),
        sql(0, "2026-03-02T08:00:01Z", "CREATE TABLE cols(name TEXT)"),
        sql(0, "2026-03-02T08:00:02Z",
            "INSERT INTO cols SELECT name FROM pragma_table_info('t') ORDER BY cid"),
        sql(0, "2026-03-02T08:00:03Z", "PRAGMA table_info(t)"),
        sql(0, "2026-03-02T08:00:04Z", "PRAGMA user_version = 12"),
    ]
    assert import_lines(worlds, lines) == ["imported"]
    assert rows(worlds, "eva@0", "SELECT name FROM cols", tmp_path) == [("a",), ("b",)]
    assert rows(worlds, "eva@0", "PRAGMA user_version", tmp_path) == [(12,)]


# --- the hash does not depend on how the log was cut -------------------------------------

SPLIT_LOG = [
    sql(0, "2026-03-02T08:00:00Z", "CREATE TABLE t(id INTEGER PRIMARY KEY, v, at TEXT "
                                   "DEFAULT CURRENT_TIMESTAMP, r INTEGER DEFAULT (random()))"),
    sql(0, "2026-03-02T08:00:01Z", "INSERT INTO t(id, v) VALUES (1, randomblob(8))"),
    sql(0, "2026-03-02T08:00:00Z", "CREATE TABLE u(x)", persona="finn", service="other"),
    {"persona": "eva", "day": 0, "ts": "2026-03-02T08:00:02Z", "type": "file_write",
     "path": "a/b.txt", "text": "hello\n"},
    sql(1, "2026-03-03T08:00:00Z", "INSERT INTO t(id, v) VALUES (2, ?)",
        params=[{"$base64": "AAE="}]),
    sql(1, "2026-03-03T08:00:00Z", "INSERT INTO u VALUES (random())", persona="finn",
        service="other"),
    {"persona": "eva", "day": 1, "ts": "2026-03-03T08:00:01Z", "type": "file_write",
     "path": "c.bin", "base64": "AAECAw=="},
    sql(3, "2026-03-05T08:00:00Z", "UPDATE t SET v = random() WHERE id = 1"),
    {"persona": "eva", "day": 3, "ts": "2026-03-05T08:00:01Z", "type": "file_delete",
     "path": "a/b.txt"},
    sql(4, "2026-03-06T08:00:00Z", "DELETE FROM t WHERE id = 2"),
]


def _days_of(lines: list[dict[str, Any]], *days: int) -> list[dict[str, Any]]:
    return [line for line in lines if line["day"] in days]


def _fingerprint(worlds: Worlds) -> dict[str, Any]:
    """Everything the import produced: day records, event ids, exports."""
    found: dict[str, Any] = {}
    for summary in worlds.store.personas():
        out = io.BytesIO()
        worlds.export(summary.persona, out)
        found[summary.persona] = (
            [(d.day, d.world_hash, d.head, d.first_seq, d.last_seq, d.manifest)
             for d in worlds.store.days(summary.persona)],
            [e.event_id for e in worlds.store.events(summary.persona)],
            out.getvalue(),
        )
    return found


def test_hash_does_not_depend_on_how_the_log_is_cut(worlds: Worlds, tmp_path: Path) -> None:
    import_lines(worlds, SPLIT_LOG, source="whole.jsonl")
    whole = _fingerprint(worlds)
    assert set(whole) == {"eva", "finn"}
    assert len(whole["eva"][0]) == 4 and len(whole["finn"][0]) == 2
    cuts: dict[str, list[list[dict[str, Any]]]] = {
        "one file per day": [_days_of(SPLIT_LOG, d) for d in (0, 1, 3, 4)],
        "one file per persona": [[x for x in SPLIT_LOG if x["persona"] == p]
                                 for p in ("finn", "eva")],
        "overlapping files": [_days_of(SPLIT_LOG, 0, 1), _days_of(SPLIT_LOG, 0, 1, 3),
                              SPLIT_LOG],
        "a persona-day at a time": [[x for x in SPLIT_LOG if (x["persona"], x["day"]) == key]
                                    for key in [("eva", 0), ("finn", 0), ("finn", 1),
                                                ("eva", 1), ("eva", 3), ("eva", 4)]],
    }
    for name, files in cuts.items():
        with fresh(tmp_path, name.replace(" ", "-")) as other:
            for i, part in enumerate(files):
                path = tmp_path / f"{name.replace(' ', '-')}-{i}.jsonl"
                path.write_bytes(jsonl(part))
                other.import_file(path)
            assert _fingerprint(other) == whole, name
            assert other.verify().ok, name


def test_reimporting_overlaps_reports_unchanged_days(worlds: Worlds) -> None:
    assert import_lines(worlds, _days_of(SPLIT_LOG, 0, 1)) == ["imported"] * 4
    assert import_lines(worlds, SPLIT_LOG) == [
        "unchanged", "unchanged", "unchanged", "unchanged", "imported", "imported"]


@pytest.mark.parametrize(("ts_a", "ts_b", "same"), [
    ("2026-03-02T08:00:01Z", "2026-03-02T08:00:02Z", False),  # the clock reaches the data
    ("2026-03-02T08:00:01Z", "2026-03-02T08:00:01.400Z", True),  # CURRENT_TIMESTAMP: seconds
])
def test_the_hash_is_of_the_world_the_clock_wrote(tmp_path: Path, ts_a: str, ts_b: str,
                                                   same: bool) -> None:
    # Other timestamps make other event ids; without random() only what the clock wrote
    # into the world can move the world hash.
    hashes = []
    for name, ts in (("a", ts_a), ("b", ts_b)):
        with fresh(tmp_path, name) as w:
            import_lines(w, [sql(0, "2026-03-02T08:00:00Z", "CREATE TABLE t(at TEXT DEFAULT "
                                                            "CURRENT_TIMESTAMP)"),
                             sql(0, ts, "INSERT INTO t DEFAULT VALUES")])
            hashes.append(w.store.day("eva", 0).world_hash)
    assert (hashes[0] == hashes[1]) is same
