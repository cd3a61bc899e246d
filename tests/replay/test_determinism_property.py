"""Every accepted log gives one world, however it is built.

Logs come from a grammar of accepted statements: tables of every column affinity,
inserts of literals and expressions (date and time functions reading 'now', seeded
random()/randomblob(), JSON, text and exact math), upserts, updates, deletes, triggers,
views, indexes, last_insert_rowid(), user_version and workspace file writes, over a few
days. Each log is built as one file, as a file per day and from a cold snapshot cache in
this process, then all of them again in fresh processes under TZ=UTC (one file) and
TZ=Asia/Kolkata (a file per day); every build must give the same hash for every day.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay.engine import Worlds

REPO = Path(__file__).resolve().parents[2]
TYPES = ["INTEGER", "TEXT", "REAL", "BLOB", "NUMERIC", ""]

LITERALS = st.one_of(
    st.integers(-(2**63), 2**63 - 2).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.text(alphabet="ab 'é\u20ac", max_size=6).map(lambda t: "'" + t.replace("'", "''") + "'"),
    st.just("NULL"),
    st.binary(max_size=4).map(lambda b: f"x'{b.hex()}'"),
)
FUNCTION_CALLS = st.sampled_from([
    "random()", "hex(randomblob(6))", "randomblob(3)", "abs(random()) % 100",
    "datetime('now')", "datetime('now', '+1 day', 'start of month')", "date('now', '-3 hours')",
    "time('now', 'subsec')", "unixepoch('now')", "julianday('now')", "CURRENT_TIMESTAMP",
    "strftime('%Y-%m-%d %H:%M:%f', 'now')", "timediff('now', '2026-01-01')",
    "json_object('k', random() % 7)", "json_array(1, 'two', NULL)", "printf('%08.3f', 3.14159)",
    "upper('abc') || lower('DEF')", "length('hello')", "coalesce(NULL, 'x')", "round(2.675, 2)",
    "sqrt(2.0)", "floor(-2.5)", "last_insert_rowid()", "unixepoch('now', 'subsec')",
])
EXPRESSIONS = st.one_of(
    LITERALS, FUNCTION_CALLS,
    st.tuples(FUNCTION_CALLS, LITERALS).map(lambda p: f"coalesce({p[0]}, {p[1]})"))


@st.composite
def logs(draw: st.DrawFn) -> list[dict[str, Any]]:
    tables = [f"t{i}" for i in range(draw(st.integers(1, 3)))]
    columns = {t: [(f"c{j}", draw(st.sampled_from(TYPES))) for j in range(draw(st.integers(1, 3)))]
               for t in tables}
    events: list[tuple[int, str, Any]] = []
    for t in tables:
        cols = ", ".join(f"{c} {kind}".strip() for c, kind in columns[t])
        events.append((0, "sql", f"CREATE TABLE {t}(id INTEGER PRIMARY KEY, {cols}, "
                                 "at TEXT DEFAULT CURRENT_TIMESTAMP, r DEFAULT (random()))"))
    events.append((0, "sql", "CREATE TABLE audit(tbl, at, r)"))
    first = tables[0]
    if draw(st.booleans()):
        events.append((0, "sql", f"CREATE TRIGGER tr AFTER INSERT ON {first} BEGIN INSERT INTO "
                                 f"audit VALUES ('{first}', datetime('now'), random()); END"))
    if draw(st.booleans()):
        events.append((0, "sql", f"CREATE VIEW v AS SELECT id, c0 FROM {first} WHERE id % 2 = 0"))
    if draw(st.booleans()):
        events.append((0, "sql", f"CREATE INDEX i ON {first}(c0)"))
    for day in range(draw(st.integers(1, 3))):
        for _ in range(draw(st.integers(1, 6))):
            events.append((day, *draw(_event(tables, columns))))
    return _lines(events)


def _event(tables: list[str], columns: dict[str, list[tuple[str, str]]]
           ) -> st.SearchStrategy[tuple[str, Any]]:
    def insert(t: str, values: list[str]) -> tuple[str, Any]:
        values = values[:len(columns[t])]
        names = ", ".join(c for c, _ in columns[t][:len(values)])
        return ("sql", f"INSERT INTO {t}({names}) VALUES ({', '.join(values)})")

    def upsert(t: str, key: int, value: str) -> tuple[str, Any]:
        return ("sql", f"INSERT INTO {t}(id, c0) VALUES ({key}, {value}) "
                       "ON CONFLICT(id) DO UPDATE SET c0 = excluded.c0")

    table = st.sampled_from(tables)
    return st.one_of(
        st.builds(insert, table, st.lists(EXPRESSIONS, min_size=1, max_size=3)),
        st.builds(upsert, table, st.integers(1, 5), EXPRESSIONS),
        st.builds(lambda t, e, m: ("sql", f"UPDATE {t} SET c0 = {e} WHERE id % 3 = {m}"),
                  table, EXPRESSIONS, st.integers(0, 2)),
        st.builds(lambda t, k: ("sql", f"DELETE FROM {t} WHERE id = {k}"), table,
                  st.integers(1, 6)),
        st.builds(lambda t: ("sql", f"INSERT INTO audit SELECT '{t}', max(at), count(*) FROM {t}"),
                  table),
        st.builds(lambda n: ("sql", f"PRAGMA user_version = {n}"), st.integers(0, 9)),
        st.builds(lambda p, text: ("file", (p, text)),
                  st.sampled_from(["a.txt", "notes/b.md", "notes/deep/c.csv"]),
                  st.text(st.characters(exclude_categories=("Cs",)), max_size=20)),
    )


def _lines(events: list[tuple[int, str, Any]]) -> list[dict[str, Any]]:
    lines = []
    for n, (day, kind, body) in enumerate(events):
        base = {"persona": "eva", "day": day,
                "ts": f"2026-03-{2 + day:02d}T08:{n // 60:02d}:{n % 60:02d}.{n * 37 % 1000:03d}Z"}
        if kind == "sql":
            lines.append({**base, "type": "sql", "service": "app", "sql": body})
        else:
            lines.append({**base, "type": "file_write", "path": body[0], "text": body[1]})
    return lines


def _write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(json.dumps(x).encode() + b"\n" for x in lines))
    return path


def _files(where: Path, lines: list[dict[str, Any]]) -> tuple[Path, list[Path]]:
    where.mkdir(parents=True)
    days = sorted({x["day"] for x in lines})
    whole = _write(where / "whole.jsonl", lines)
    return whole, [_write(where / f"day-{d}.jsonl", [x for x in lines if x["day"] == d])
                   for d in days]


def _build(store: Path, files: list[Path]) -> list[tuple[int, str]]:
    with Worlds.open(store, store.with_name(store.name + "-cache")) as worlds:
        for path in files:
            worlds.import_file(path)
        return [(d.day, d.world_hash) for d in worlds.store.days("eva")]


def _cold(store: Path) -> list[tuple[int, str]]:
    """Rebuild every day from the log into an empty cache; return the rebuilt hashes."""
    with Worlds.open(store, store.with_name("cold-cache")) as worlds:
        rebuilt = []
        for record in worlds.store.days("eva"):
            snapshot = worlds.snapshot("eva", record.day)  # raises on a divergent hash
            rebuilt.append((record.day, record.world_hash))
            assert snapshot.exists()
        assert worlds.verify().ok
        return rebuilt


_SUBPROCESS = r"""
import json, sys
from pathlib import Path
from replay.engine import Worlds
out = []
for n, files in enumerate(json.loads(sys.argv[2])):
    store = Path(sys.argv[1]) / f"s{n}"
    with Worlds.open(store, store.with_name(f"s{n}-cache")) as worlds:
        for path in files:
            worlds.import_file(Path(path))
        out.append([(d.day, d.world_hash) for d in worlds.store.days("eva")])
print(json.dumps(out))
"""


def _in_fresh_process(where: Path, builds: list[list[Path]], tz: str) -> list[Any]:
    where.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", _SUBPROCESS, str(where),
         json.dumps([[str(p) for p in files] for files in builds])],
        env={**os.environ, "TZ": tz}, cwd=REPO, capture_output=True, text=True, timeout=300,
        check=True)
    return [[tuple(day) for day in hashes] for hashes in json.loads(done.stdout)]


def test_every_accepted_log_gives_one_world_however_it_is_built() -> None:
    with tempfile.TemporaryDirectory(prefix="determinism-") as tmp:
        root = Path(tmp)
        seen: list[tuple[Path, list[Path], list[tuple[int, str]]]] = []
        tries = itertools.count()

        @settings(max_examples=25, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(logs())
        def check(lines: list[dict[str, Any]]) -> None:
            where = root / f"log-{next(tries)}"
            whole, per_day = _files(where, lines)
            expected = _build(where / "one-file", [whole])
            assert [d for d, _ in expected] == sorted({x["day"] for x in lines})
            assert _build(where / "per-day", per_day) == expected
            assert _cold(where / "one-file") == expected
            seen.append((whole, per_day, expected))

        check()
        assert len(seen) >= 10
        utc = _in_fresh_process(root / "utc", [[whole] for whole, _, _ in seen], "UTC")
        kolkata = _in_fresh_process(root / "kolkata", [per_day for _, per_day, _ in seen],
                                    "Asia/Kolkata")
        for (whole, _, expected), a, b in zip(seen, utc, kolkata, strict=True):
            assert a == expected, whole
            assert b == expected, whole
