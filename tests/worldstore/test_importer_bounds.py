"""The importer is bounded: what a log can make it do costs a bounded amount of work,
memory and time, and every input it refuses is one `error:` line naming the file, the line
and the field (or the event), with nothing stored.

Refusals go through the real command line (`worldctl import`, `worldctl checkout`) into a
store that already holds a day of persona `ana`; each bad file starts with a good new day,
so "nothing stored" means that day is missing too.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw
import pytest
import xxhash
from click.testing import CliRunner, Result
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.engine import Worlds
from replay.sqlite import MAX_VALUE_BYTES, MAX_VM_STEPS, freeze, open_event_db
from worldctl.main import cli
from worldstore.errors import InputError
from worldstore.interchange import MAX_JSON_DEPTH, _check_depth
from worldstore.sqlcheck import first_statement_end, only_comments, statement_count_problem

TS = "2026-03-02T08:00:00Z"


def sql(day: int, text: str, **extra: Any) -> dict[str, Any]:
    return {"persona": "ana", "day": day, "ts": TS, "type": "sql", "service": "app",
            "sql": text, **extra}


def write(day: int, path: str, **content: Any) -> dict[str, Any]:
    return {"persona": "ana", "day": day, "ts": TS, "type": "file_write", "path": path,
            **content}


BASELINE = [
    sql(0, "CREATE TABLE t(x)"),
    sql(0, "CREATE TABLE n(i INTEGER PRIMARY KEY)"),
    sql(0, "INSERT INTO n WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c "
           "WHERE i < 1000) SELECT i FROM c"),
]
GOOD_DAY = [sql(1, "INSERT INTO t VALUES (1)"), write(1, "docs/new.txt", text="new\n")]
BAD_LINE = len(GOOD_DAY) + 1  # the bad line comes right after the good day


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="worldctl")


def one_error_line(result: Result, *words: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


@pytest.fixture
def store(tmp_path: Path) -> str:
    location = str(tmp_path / "store")
    baseline = tmp_path / "baseline.jsonl"
    baseline.write_text("".join(json.dumps(line) + "\n" for line in BASELINE))
    assert invoke("--store", location, "import", str(baseline)).exit_code == 0
    return location


def stored_days(location: str) -> list[tuple[str, int, str]]:
    with Worlds.open(location) as worlds:
        return [(r.persona, r.day, r.world_hash) for r in worlds.store.days("ana")]


def refused_import(store: str, tmp_path: Path, bad: dict[str, Any] | str,
                   *words: str) -> str:
    """Import the good day then `bad`; one error line naming the file and the bad line,
    and the store as it was."""
    path = tmp_path / "bad.jsonl"
    lines = [json.dumps(line) for line in GOOD_DAY]
    lines.append(bad if isinstance(bad, str) else json.dumps(bad))
    path.write_text("".join(line + "\n" for line in lines))
    before = stored_days(store)
    line = one_error_line(invoke("--store", store, "import", str(path)),
                          f"{path}:{BAD_LINE}:", *words)
    assert stored_days(store) == before == [("ana", 0, before[0][2])]
    return line


# --- a deadline in VM instructions --------------------------------------------------

RUNAWAYS = {
    "endless-recursive-cte": sql(2, "INSERT INTO t SELECT * FROM (WITH RECURSIVE c(x) AS "
                                    "(SELECT 1 UNION ALL SELECT x + 1 FROM c) "
                                    "SELECT count(*) FROM c)"),
    "huge-cross-join": sql(2, "INSERT INTO t SELECT count(*) FROM n a, n b, n c"),
    "endless-select": sql(2, "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c)"
                             " SELECT max(x) FROM c"),
}


@pytest.mark.parametrize("name", RUNAWAYS)
def test_a_runaway_statement_is_refused_by_its_budget(store: str, tmp_path: Path,
                                                      name: str) -> None:
    refused_import(store, tmp_path, RUNAWAYS[name], "ana@2 event #0 refused",
                   f"budget of {MAX_VM_STEPS:,} SQLite VM instructions")


def test_triggers_that_fan_out_are_refused_by_the_budget_of_the_event_firing_them(
        store: str, tmp_path: Path) -> None:
    # Each level inserts a row per row of n (1,000) for every row inserted above it.
    path = tmp_path / "trigger.jsonl"
    lines: list[dict[str, Any]] = [*GOOD_DAY]
    for level in range(1, 5):
        lines.append(sql(2, f"CREATE TABLE fan{level}(x)"))
    for level in range(1, 4):
        lines.append(sql(2, f"CREATE TRIGGER grow{level} AFTER INSERT ON fan{level} BEGIN "
                            f"INSERT INTO fan{level + 1} SELECT i FROM n; END"))
    lines.append(sql(2, "INSERT INTO fan1 VALUES (0)"))
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    before = stored_days(store)
    one_error_line(invoke("--store", store, "import", str(path)),
                   f"{path}:{len(lines)}:", f"ana@2 event #{len(lines) - 3} refused", "budget")
    assert stored_days(store) == before


def test_the_budget_counts_instructions_the_same_way_on_every_run(tmp_path: Path) -> None:
    """Accepted or refused is a property of the statement: the same statement is refused
    the first time and again from the statement cache, and one just under the budget
    passes both times."""
    conn = open_event_db(tmp_path / "x.sqlite")
    endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT max(x) FROM c"
    bounded = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 10000)"
               " SELECT max(x) FROM c")
    for _ in range(2):
        freeze(0, "seed")
        with pytest.raises(apsw.InterruptError):
            conn.execute(endless).fetchall()
        freeze(0, "seed")
        assert conn.execute(bounded).fetchall() == [(10000,)]
    conn.close()


# --- the size of values ---------------------------------------------------------------

TOO_BIG = {
    "randomblob": (f"SELECT randomblob({MAX_VALUE_BYTES + 1})", "randomblob"),
    "randomblob-2gb": ("INSERT INTO t VALUES (randomblob(2000000000))", "length limit"),
    "zeroblob": ("INSERT INTO t VALUES (zeroblob(2000000000))", "too big"),
    "printf-width": ("INSERT INTO t VALUES (printf('%.*c', 2000000000, 'x'))", "too big"),
    "replace-doubling": ("INSERT INTO t WITH RECURSIVE r(s, i) AS (SELECT 'x', 0 UNION ALL "
                         "SELECT replace(s, 'x', 'xx'), i + 1 FROM r WHERE i < 40) "
                         "SELECT max(length(s)) FROM r", "too big"),
    "concat-doubling": ("INSERT INTO t WITH RECURSIVE r(s, i) AS (SELECT 'x', 0 UNION ALL "
                        "SELECT s || s, i + 1 FROM r WHERE i < 40) "
                        "SELECT max(length(s)) FROM r", "too big"),
}


@pytest.mark.parametrize("name", TOO_BIG)
def test_a_value_past_the_length_limit_is_refused(store: str, tmp_path: Path,
                                                  name: str) -> None:
    text, words = TOO_BIG[name]
    refused_import(store, tmp_path, sql(2, text), "ana@2 event #0 refused", words)


# --- inputs that used to raise tracebacks -----------------------------------------------


def _deep(n: int) -> str:
    return "[" * n + "]" * n


BASE = '{"persona":"ana","day":2,"ts":"' + TS + '","type":"sql","service":"app",'
MALFORMED = {
    "nul-in-sql": (sql(2, "SELECT 1\x00; DROP TABLE t"), "(field 'sql')", "NUL byte"),
    "deep-params": (BASE + '"sql":"SELECT ?","params":' + _deep(100_000) + "}",
                    "(field 'params')", "nested deeper"),
    "deep-params-object": (BASE + '"sql":"SELECT :a","params":{"a":'
                           + '{"a":' * 100_000 + "1" + "}" * 100_000 + "}}",
                           "(field 'params')", "nested deeper"),
    "deep-unknown-field-first": ('{"zz":' + _deep(100_000) + ',"persona":"ana"}',
                                 "(field 'zz')", "nested deeper"),
    "deep-object-line": ('{"a":' * 100_000 + "1" + "}" * 100_000, "(field 'a')",
                         "nested deeper"),
    "deep-text": ('{"persona":"ana","day":2,"ts":"' + TS + '","type":"file_write",'
                  '"path":"a.txt","text":' + _deep(50_000) + "}", "(field 'text')",
                  "nested deeper"),
    "day-1e20": (BASE.replace('"day":2', '"day":100000000000000000000') + '"sql":"SELECT 1"}',
                 "(field 'day')", "does not fit"),
    "day-2^63": (BASE.replace('"day":2', f'"day":{2**63}') + '"sql":"SELECT 1"}',
                 "(field 'day')", "does not fit"),
    "segment-300-bytes": (write(2, "docs/" + "a" * 300, text="x"), "(field 'path')",
                          "255 bytes"),
    "segment-256-bytes-of-utf8": (write(2, "é" * 128, text="x"), "(field 'path')",
                                  "255 bytes"),
    "path-past-path-max": (write(2, "/".join(["d" * 200] * 25), text="x"),
                           "(field 'path')", "1024 bytes"),
    "path-of-multibyte-characters": (write(2, "/".join(["é" * 100] * 6), text="x"),
                                     "(field 'path')", "1024 bytes"),
}


def test_nesting_is_measured_not_guessed_from_the_brackets() -> None:
    def check(line: str) -> None:
        _check_depth(line.encode(), source="t.jsonl", line=1)

    check('{"a":' + _deep(MAX_JSON_DEPTH - 1) + "}")  # the object and 15 arrays: 16 levels
    with pytest.raises(InputError, match="nested deeper than 16 levels"):
        check('{"a":' + _deep(MAX_JSON_DEPTH) + "}")
    # Brackets in strings are no nesting, however many there are.
    check('{"text":"' + "[{" * 1000 + '","params":[1,[2]]}')
    with pytest.raises(InputError, match="nested deeper"):
        check('{"text":"' + "[{" * 10 + '","params":' + _deep(MAX_JSON_DEPTH) + "}")


@pytest.mark.parametrize("name", MALFORMED)
def test_a_malformed_line_is_one_error_line_naming_the_field(store: str, tmp_path: Path,
                                                              name: str) -> None:
    bad, *words = MALFORMED[name]
    refused_import(store, tmp_path, bad, *words)


@pytest.mark.parametrize("day", ["100000000000000000000", "-100000000000000000000",
                                 str(2**63), "9" * 5000])
def test_a_reference_day_past_64_bits_is_one_error_line(store: str, tmp_path: Path,
                                                         day: str) -> None:
    before = stored_days(store)
    commands = [["checkout", f"ana@{day}", str(tmp_path / "out")], ["export", f"ana@{day}"]]
    if len(day) < 200:  # (a longer one is first refused as a path too long to look up)
        commands.append(["diff", f"ana@{day}", "ana@0"])
    for command in commands:
        one_error_line(invoke("--store", store, *command), "does not fit 64 bits")
    assert not (tmp_path / "out").exists()
    assert stored_days(store) == before


@pytest.mark.parametrize("where", ["store", "cache", "dest", "diff-side"])
@pytest.mark.parametrize("length", ["segment", "path"])
def test_a_path_argument_too_long_for_the_file_system_is_one_error_line(
        store: str, tmp_path: Path, where: str, length: str) -> None:
    long = str(tmp_path / ("x" * 300 if length == "segment" else "/".join(["y" * 200] * 21)))
    before = stored_days(store)
    args = {"store": ["--store", long, "personas"],
            "cache": ["--store", store, "--cache", long, "checkout", "ana@0",
                      str(tmp_path / "out")],
            "dest": ["--store", store, "checkout", "ana@0", long + "/out"],
            "diff-side": ["--store", store, "diff", long, "ana@0"]}[where]
    one_error_line(invoke(*args), "File name too long")
    assert stored_days(store) == before


def test_the_largest_64_bit_day_is_merely_not_there(store: str, tmp_path: Path) -> None:
    one_error_line(invoke("--store", store, "checkout", f"ana@{2**63 - 1}",
                          str(tmp_path / "out")), "no such persona-day")


# --- randomblob: fast, bounded, and the bytes it always gave ------------------------------


def reference_randomblob(seed: bytes, counter: int, n: int) -> tuple[bytes, int]:
    """The algorithm every stored world was built with: xxh3-128 of seed + counter (8 bytes,
    little-endian), counter from 1 within an event, one block after another, cut to n."""
    size = max(1, n)
    out = bytearray()
    while len(out) < size:
        counter += 1
        out += xxhash.xxh3_128_digest(seed + counter.to_bytes(8, "little"))
    return bytes(out[:size]), counter


def reference_random(seed: bytes, counter: int) -> tuple[int, int]:
    counter += 1
    block = xxhash.xxh3_128_digest(seed + counter.to_bytes(8, "little"))
    return int.from_bytes(block[:8], "little", signed=True), counter


@pytest.mark.parametrize("seed", ["0" * 32, "3f2a", "an event id of another length!"])
def test_randomblob_gives_the_bytes_it_always_gave(tmp_path: Path, seed: str) -> None:
    conn = open_event_db(tmp_path / "r.sqlite")
    sizes = [0, 1, 15, 16, 17, 100, 4096 * 16, 4096 * 16 + 1, 1_000_003, -5]
    freeze(0, seed)
    got = [conn.execute(f"SELECT randomblob({n}), random()").fetchall()[0] for n in sizes]
    got.append(conn.execute("SELECT randomblob(2.9)").fetchall()[0])
    counter, expected = 0, []
    for n in sizes:
        blob, counter = reference_randomblob(seed.encode(), counter, n)
        number, counter = reference_random(seed.encode(), counter)
        expected.append((blob, number))
    expected.append((reference_randomblob(seed.encode(), counter, 2)[0],))
    assert got == expected
    conn.close()


def test_randomblob_of_50_mb_is_fast(tmp_path: Path) -> None:
    """A figure, not a timing test: printed with -s (the old loop took several seconds)."""
    conn = open_event_db(tmp_path / "r.sqlite")
    freeze(0, "0" * 32)
    started = time.perf_counter()
    assert conn.execute("SELECT length(randomblob(50000000))").fetchall() == [(50_000_000,)]
    print(f"randomblob(50 MB): {time.perf_counter() - started:.2f} s")
    conn.close()


# --- statement boundaries in linear time, with sqlite3_complete's decisions --------------


_REFERENCE_COMMENTS = re.compile(r"--[^\n]*|/\*.*?(\*/|$)", re.S)


def reference_only_comments(text: str) -> bool:
    """The comment check as it was: every comment removed, whatever the text."""
    return _REFERENCE_COMMENTS.sub("", text).strip(" \t\r\n;") == ""


def reference_statement_count_problem(text: str) -> str | None:
    """The check as it was: sqlite3_complete of every prefix ending in ';' (quadratic)."""
    if reference_only_comments(text):
        return "empty SQL: an sql event holds exactly one statement"
    for i, ch in enumerate(text):
        if ch == ";" and apsw.complete(text[: i + 1]):
            if not reference_only_comments(text[i + 1 :]):
                return ("more than one SQL statement; an sql event holds exactly one "
                        f"(second statement starts at character {i + 1})")
            return None
    return None


_ATOMS = [";", " ", "\n", "\t", "\f", "\r", "\v", "'", '"', "`", "[", "]", "/*", "*/", "--",
          "-", "/", "*", "create", "CREATE", "temp", "TEMPORARY", "trigger", "TrIgGeR", "end",
          "END", "explain", "begin", "select 1", "x", "é", "$", "_", "endx", "tempo", "(",
          ")", "ΕΝΔ", "\u212a", "1e3", "insert into t values ('a;b')", "ON", "BEGIN"]


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.sampled_from(_ATOMS), max_size=24), st.lists(st.booleans(), max_size=24))
def test_statement_boundaries_decide_as_sqlite3_complete_does(atoms: list[str],
                                                             spaces: list[bool]) -> None:
    text = "".join(a + (" " if s else "") for a, s in zip(atoms, spaces + [False] * 24,
                                                          strict=False))
    assert statement_count_problem(text) == reference_statement_count_problem(text)
    assert only_comments(text) == reference_only_comments(text)
    brute = next((i for i, ch in enumerate(text) if ch == ";" and apsw.complete(text[: i + 1])),
                 None)
    assert first_statement_end(text) == brute


@dataclass(frozen=True)
class Long:
    text: str
    problem: str | None


LONG = [
    Long("SELECT '" + ";" * 320_000 + "'", None),
    Long("/*" + ";" * 320_000 + "*/ SELECT 1", None),
    Long("CREATE TRIGGER g AFTER INSERT ON t BEGIN " + "SELECT 1;" * 40_000 + " END",
         None),
    Long("SELECT 1;" + " SELECT 2;" * 30_000, "second statement starts at character 9"),
]


@pytest.mark.parametrize("case", LONG, ids=["quoted", "commented", "trigger", "many"])
def test_long_statements_are_checked_in_one_pass(case: Long) -> None:
    problem = statement_count_problem(case.text)  # the quoted case took 91 s before
    assert (problem is None) == (case.problem is None)
    if case.problem is not None:
        assert problem is not None and case.problem in problem
