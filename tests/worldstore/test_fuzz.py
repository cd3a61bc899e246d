"""Bounded fuzzing of what anyone can hand the importer.

The interchange reader gets random bytes and mutated valid lines; the SQL gate (the
authorizer, the wrapped functions and the rowid watch, through a real import) gets random
SQL text and statements assembled from the parts that once slipped through. The only
acceptable outcomes are acceptance or a project error (``WorldError``): never another
exception, a crash or a hang. A log the gate accepts must also verify. Each run is
bounded (about 20 s in all).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay.engine import Worlds
from worldstore.errors import WorldError
from worldstore.interchange import read_days, to_payload

SECONDS_PER_EXAMPLE = 10


class Hang(Exception):
    """An example ran past SECONDS_PER_EXAMPLE."""


@contextlib.contextmanager
def bounded() -> Iterator[None]:
    def hang(signum: int, frame: object) -> None:
        raise Hang(f"no answer within {SECONDS_PER_EXAMPLE} s")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.setitimer(signal.ITIMER_REAL, SECONDS_PER_EXAMPLE)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# --- the interchange reader ---------------------------------------------------------------

VALID = [
    {"persona": "eva", "day": 0, "ts": "2026-03-02T08:00:00Z", "type": "sql", "service": "app",
     "sql": "CREATE TABLE t(a, b)"},
    {"persona": "eva", "day": 0, "ts": "2026-03-02T08:00:01.250Z", "type": "sql",
     "service": "app", "sql": "INSERT INTO t VALUES (:a, ?2)",
     "params": {"a": 1, "b": {"$base64": "AAE="}}},
    {"persona": "eva", "day": 1, "ts": "2026-03-03T08:00:00Z", "type": "file_write",
     "path": "notes/a.txt", "text": "hello\n"},
    {"persona": "eva", "day": 1, "ts": "2026-03-03T08:00:01Z", "type": "file_write",
     "path": "b.bin", "base64": "AAECAw=="},
    {"persona": "eva", "day": 2, "ts": "2026-03-04T08:00:00Z", "type": "file_delete",
     "path": "b.bin"},
    {"persona": "finn", "day": 0, "ts": "2026-03-02T09:00:00Z", "type": "app", "service": "app",
     "app": "notes", "version": "1"},
]
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=3),
    max_leaves=6)


@st.composite
def mutated_lines(draw: st.DrawFn) -> bytes:
    lines = [dict(line) for line in draw(st.lists(st.sampled_from(VALID), min_size=1,
                                                  max_size=6))]
    for _ in range(draw(st.integers(0, 3))):
        line = draw(st.sampled_from(lines))
        key = draw(st.sampled_from([*line, "extra", "params", "day", "ts"]))
        if draw(st.booleans()):
            line[key] = draw(JSON_VALUES)
        else:
            line.pop(key, None)
    data = bytearray(b"".join(json.dumps(x).encode() + b"\n" for x in lines))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(data)))
        how = draw(st.integers(0, 2))
        if how == 0:
            data[at:at] = draw(st.binary(min_size=1, max_size=4))
        elif how == 1:
            del data[at:at + draw(st.integers(1, 8))]
        else:
            data[at:at] = draw(st.sampled_from([b"\x00", b"\xff", b"[" * 50, b'"', b"\n",
                                                b"1e400", b"\\ud800", b"99999999999999999999"]))
    return bytes(data)


@settings(max_examples=1500, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.one_of(st.binary(max_size=200), mutated_lines()))
def test_the_reader_accepts_or_refuses_in_its_own_terms(data: bytes) -> None:
    with bounded():
        try:
            for batch in read_days(io.BytesIO(data), source="fuzz.jsonl"):
                for line in batch.lines:
                    to_payload(line.event)
        except WorldError as exc:
            assert str(exc)
            assert "\n" not in str(exc)


# --- the SQL gate -------------------------------------------------------------------------

NAMES = ["t", "u", "temp.t", "main.t", "sqlite_master", "dbstat", "carray(1, 2)",
         "pragma_database_list", "pragma_table_info('t')", "json_each('[1]')"]
FUNCTIONS = ["datetime", "date", "strftime", "julianday", "unixepoch", "changes",
             "total_changes", "last_insert_rowid", "random", "randomblob", "fts3_tokenizer",
             "sqlite_version", "sin", "abs", "hex", "printf", "json_object", "zeroblob",
             "load_extension", "geopoly_regular", "sqrt"]
ARGS = ["'now'", "'localtime'", "'utc'", "'+1 day'", "?", "1", "-1", "9223372036854775807",
        "x'00'", "NULL", "a", "'%s'", "'simple'"]
STATEMENTS = [
    "SELECT {e}", "INSERT INTO t VALUES ({e}, {e})", "INSERT INTO t(rowid, a) VALUES ({e}, 1)",
    "UPDATE t SET a = {e}", "DELETE FROM t WHERE a = {e}", "INSERT INTO t SELECT {e}, 1 FROM {n}",
    "CREATE {temp} TABLE x(a DEFAULT ({e}))", "CREATE {temp} VIEW w AS SELECT {e}",
    "CREATE {temp} TRIGGER tr AFTER INSERT ON t BEGIN INSERT INTO t VALUES ({e}, 2); END",
    "PRAGMA {p}", "PRAGMA {p} = {e}", "CREATE VIRTUAL TABLE v USING {m}(a, b, c)",
    "CREATE INDEX i ON t({e})", "ATTACH {e} AS other", "WITH c(n) AS (SELECT 1) SELECT {e} FROM c",
]
PRAGMAS = ["user_version", "database_list", "temp.user_version", "page_size", "data_version",
           "function_list", "foreign_keys", "table_info(t)", "journal_mode", "compile_options"]
MODULES = ["fts5", "fts3", "fts4", "rtree", "geopoly", "dbstat", "carray", "nope"]


@st.composite
def expressions(draw: st.DrawFn, depth: int = 0) -> str:
    if depth > 2 or draw(st.booleans()):
        return draw(st.sampled_from(ARGS))
    args = draw(st.lists(expressions(depth + 1), max_size=3))
    return f"{draw(st.sampled_from(FUNCTIONS))}({', '.join(args)})"


@st.composite
def statements(draw: st.DrawFn) -> str:
    template = draw(st.sampled_from(STATEMENTS))
    return template.format_map(_Fill(draw))


class _Fill(dict[str, str]):
    def __init__(self, draw: st.DrawFn) -> None:
        super().__init__()
        self.draw = draw

    def __missing__(self, key: str) -> str:
        choices: dict[str, st.SearchStrategy[str]] = {
            "e": expressions(), "n": st.sampled_from(NAMES), "p": st.sampled_from(PRAGMAS),
            "m": st.sampled_from(MODULES), "temp": st.sampled_from(["", "TEMP"])}
        return self.draw(choices[key])


SQL_TEXT = st.one_of(statements(), st.text(max_size=60),
                     st.lists(st.sampled_from(["SELECT", "INSERT", "INTO", "t", "VALUES", "(", ")",
                                               ",", "1", "'x'", "a", "FROM", "WHERE", "=", ";",
                                               "PRAGMA", "TEMP", "CREATE", "TABLE", "--", "/*"]),
                              max_size=12).map(" ".join))


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Worlds, Iterator[int]]]:
    where = tmp_path_factory.mktemp("gate")
    with Worlds.open(where / "store", where / "cache") as worlds:
        yield worlds, itertools.count()


def test_the_sql_gate_accepts_or_refuses_in_its_own_terms(
        gate: tuple[Worlds, Iterator[int]]) -> None:
    worlds, numbers = gate

    @settings(max_examples=500, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(SQL_TEXT, st.lists(st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=5),
                                        st.none()), max_size=2))
    def check(text: str, params: list[Any]) -> None:
        persona = f"p{next(numbers)}"
        line = {"persona": persona, "day": 0, "type": "sql", "service": "app"}
        log = [{**line, "ts": "2026-03-02T08:00:00Z", "sql": "CREATE TABLE t(a, b)"},
               {**line, "ts": "2026-03-02T08:00:01Z", "sql": text, "params": params}]
        data = b"".join(json.dumps(x).encode() + b"\n" for x in log)
        with bounded():
            try:
                worlds.import_stream(io.BytesIO(data), source="fuzz.jsonl")
            except WorldError as exc:
                assert str(exc) and "\n" not in str(exc)
                assert worlds.store.persona(persona) is None  # refused: nothing stored
                return
            assert worlds.verify([persona]).ok  # accepted: it replays to the same world

    check()


def test_the_gate_is_fed_real_refusals(tmp_path: Path) -> None:
    """The grammar reaches the guards: a sample of its statements is refused by them."""
    samples = ["SELECT datetime('now', 'localtime')", "PRAGMA database_list",
               "CREATE TEMP TABLE x(a)", "INSERT INTO t SELECT 1, 1 FROM dbstat"]
    with Worlds.open(tmp_path / "store", tmp_path / "cache") as worlds:
        for n, text in enumerate(samples):
            line = {"persona": f"q{n}", "day": 0, "type": "sql", "service": "app"}
            log = [{**line, "ts": "2026-03-02T08:00:00Z", "sql": "CREATE TABLE t(a, b)"},
                   {**line, "ts": "2026-03-02T08:00:01Z", "sql": text}]
            data = b"".join(json.dumps(x).encode() + b"\n" for x in log)
            with pytest.raises(WorldError, match=r"not allowed|not available"):
                worlds.import_stream(io.BytesIO(data), source="fuzz.jsonl")
