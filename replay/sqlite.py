"""SQLite connections for worlds: a frozen clock, seeded randomness, and guards.

Every database of a world is opened through apsw, whose bundled SQLite is pinned with the
project, so replay and hashing run the same SQL engine on every machine.

* Clock: every SQL function that can read the current time (the date functions,
  ``timediff`` and the ``CURRENT_DATE`` / ``CURRENT_TIME`` / ``CURRENT_TIMESTAMP``
  keywords, column defaults included) is replaced on event connections by one that runs
  SQLite's own on a private in-memory connection on the ``agentworlds-frozen`` VFS, whose
  current time is whatever the caller froze for this thread (the event's ``ts``). So no
  event reads the clock of its own connection's VFS: the replay builder opens world
  databases on SQLite's default VFS, whose file I/O does not pass through Python.
* Randomness: ``random()`` and ``randomblob(n)`` are replaced by functions drawing from
  xxh3 in counter mode, seeded with the applying event's id.
* Guards: an authorizer refuses ATTACH/DETACH, transaction control, and pragmas other
  than ``user_version`` / ``application_id`` (reading schema pragmas is allowed); the
  reason is kept so the error can say why.
* Determinism: an event must give the same world whatever the host's time zone, however
  the log was split into imports, whether its day was rebuilt from a cached snapshot,
  and on any machine. So SQL functions are allow-listed (no connection counters, build
  facts, file offsets, pointers or libm-dependent math); the TEMP schema is refused (it
  would outlive a day inside one import only); virtual table modules are allow-listed
  (the eponymous ``dbstat`` and ``carray`` are dropped); and no row may take rowid
  2^63-1, beyond which SQLite picks rowids at random. The builder resets
  ``last_insert_rowid()`` every day.
* Time zone: the date function wrappers refuse every modifier that would make SQLite
  convert with the host's time zone (``localtime`` and ``utc`` however spelt: any case,
  a NUL after them, a blob, a value built at run time or read from a table). They parse
  no modifier themselves: SQLite decides, on the value exactly as its date functions
  read it, by evaluating it where SQLite refuses what depends on the environment (a
  CHECK constraint; see ``reads_time_zone``). Judges' read-only connections get the same
  refusal (``refuse_host_time_zone``); sandboxes run with ``TZ=UTC``.
"""

from __future__ import annotations

import contextlib
import functools
import math
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import apsw
import xxhash

from worldstore.names import ts_millis

FROZEN_VFS = "agentworlds-frozen"
_JULIAN_EPOCH_MS = 210866760000000  # Unix epoch as Julian-day milliseconds
_DEFAULT_MS = 946684800000  # 2000-01-01T00:00:00Z, used when nothing was frozen
_ALLOWED_PRAGMAS = frozenset({"user_version", "application_id"})
# Pragmas an event may read (statement or table-valued function): each answers from the
# world's own schema. Not database_list (the host path of the scratch file), nor the
# function, collation, module or compile-option lists (what this build and connection
# registered). page_size is pinned by the builder, and rtree reads it to size its nodes.
_READ_PRAGMAS = frozenset({
    "table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
    "foreign_key_list",
})
# Readable, never set. fts5 reads data_version on every query; it moves only when another
# connection commits, and nothing else writes a world while it is built.
_READ_ONLY_PRAGMAS = frozenset({"page_size", "data_version"})

# SQL functions an event may call: an allow-list, so that a function this project has not
# looked at is refused rather than trusted. Each result depends only on its arguments,
# the world, the frozen clock or the event's seed (random/randomblob are replaced below;
# the date functions are wrapped to refuse the host's time zone).
_ALLOWED_FUNCTIONS = frozenset({
    # core scalars
    "abs", "char", "coalesce", "concat", "concat_ws", "format", "glob", "hex", "if", "ifnull",
    "iif", "instr", "length", "like", "likelihood", "likely", "lower", "ltrim", "max", "min",
    "nullif", "octet_length", "printf", "quote", "random", "randomblob", "replace", "round",
    "rtrim", "sign", "substr", "substring", "trim", "typeof", "unhex", "unicode", "unistr",
    "unistr_quote", "unlikely", "upper", "zeroblob", "subtype",
    # the builder resets it at the start of every day, so it names only that day's rows
    "last_insert_rowid",
    # exact math (IEEE-exact or integer; see _REFUSED_FUNCTIONS for the rest)
    "ceil", "ceiling", "floor", "trunc", "mod", "pi", "sqrt", "degrees", "radians",
    # date and time (frozen clock)
    "date", "time", "datetime", "julianday", "unixepoch", "strftime", "timediff",
    "current_date", "current_time", "current_timestamp",
    # aggregates and window functions
    "avg", "count", "group_concat", "string_agg", "sum", "total", "median", "percentile",
    "percentile_cont", "percentile_disc", "row_number", "rank", "dense_rank", "percent_rank",
    "cume_dist", "ntile", "lag", "lead", "first_value", "last_value", "nth_value",
    # JSON
    "json", "jsonb", "json_array", "jsonb_array", "json_array_insert", "jsonb_array_insert",
    "json_array_length", "json_error_position", "json_extract", "jsonb_extract",
    "json_group_array", "jsonb_group_array", "json_group_object", "jsonb_group_object",
    "json_insert", "jsonb_insert", "json_object", "jsonb_object", "json_patch", "jsonb_patch",
    "json_pretty", "json_quote", "json_remove", "jsonb_remove", "json_replace",
    "jsonb_replace", "json_set", "jsonb_set", "json_type", "json_valid", "->", "->>",
    # full-text search and r-tree helpers (answers from the index's content)
    "match", "snippet", "highlight", "offsets", "matchinfo", "fts5", "fts5_locale",
    "fts5_get_locale", "fts5_insttoken", "optimize",
    "geopoly_area", "geopoly_bbox", "geopoly_blob", "geopoly_ccw", "geopoly_contains_point",
    "geopoly_group_bbox", "geopoly_json", "geopoly_overlap", "geopoly_svg", "geopoly_within",
    "geopoly_xform",
    # SQLite's own helpers for ALTER TABLE (internal: user SQL cannot call them, the schema
    # rewrite they do is a pure function of the schema text)
    "sqlite_rename_table", "sqlite_rename_column", "sqlite_rename_test",
    "sqlite_rename_quotefix", "sqlite_drop_column",
})
_LIBM = "its last bits depend on the machine's C math library"
_BUILD = "it reports how this SQLite was built, not the world"
_COUNTER = ("it counts rows changed by earlier statements on the connection, which depends "
            "on how the log was split into imports")
_REFUSED_FUNCTIONS = {
    **dict.fromkeys(("acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "cos", "cosh",
                     "exp", "ln", "log", "log10", "log2", "pow", "power", "sin", "sinh", "tan",
                     "tanh", "geopoly_regular", "bm25"), _LIBM),
    **dict.fromkeys(("sqlite_version", "sqlite_source_id", "sqlite_compileoption_get",
                     "sqlite_compileoption_used", "fts5_source_id"), _BUILD),
    "changes": _COUNTER,
    "total_changes": _COUNTER,
    "sqlite_offset": "it reports where a row lies in the file, not what the row holds",
    "fts3_tokenizer": "it reads and writes tokenizer pointers (host memory addresses)",
    "load_extension": "it loads host code",
}
# Virtual table modules an event may create; the rest are dropped from event connections
# or refused with the reason given.
_ALLOWED_MODULES = frozenset({"fts3", "fts4", "fts5", "fts5vocab", "fts4aux", "fts3tokenize",
                              "rtree", "rtree_i32", "geopoly", "json_each", "json_tree"})
_REFUSED_MODULES = {
    "dbstat": "it reports the file's page layout, which depends on how the file was written",
    "carray": "it reads host memory through a bound pointer",
    "sqlite_dbpage": "it exposes the file's raw pages",
}
MAX_ROWID = (1 << 63) - 1
_TEMP = ("the TEMP schema is not allowed: it lives only as long as one import's connection, "
         "so a day rebuilt from a cached snapshot would not have it")


class _Clock:
    """One thread's frozen clock and the state of its current event's statement."""

    __slots__ = ("_millis", "altering", "counter", "denied", "host", "seed", "ticks", "ts")

    def __init__(self) -> None:
        self._millis = _DEFAULT_MS
        # The event's timestamp, when the clock was frozen at one and has not been read
        # since: it is turned into milliseconds only when a statement reads the clock
        # (few do, and replay freezes the clock once per event).
        self.ts: str | None = None
        self.seed = ""  # the event's id; encoded only when randomness is drawn
        self.counter = 0
        self.denied: str | None = None
        self.ticks = 0  # progress-handler calls since freeze: the event's VM instructions / 1000
        self.altering = False  # the event's statement is an ALTER TABLE
        self.host = False  # the host's own statement is compiling (``unguarded``)

    @property
    def millis(self) -> int:
        """The frozen time, in milliseconds since the Unix epoch. (Read by SQLite, through
        the date functions, while an event's statement runs.)"""
        ts = self.ts
        if ts is not None:
            try:
                self._millis = ts_millis(ts)
            except (KeyError, ValueError, TypeError, IndexError):
                # Only an edited store holds one (every ts is checked on import): the
                # statement fails, naming it.
                reason = f"the event's ts {ts!r} is not a timestamp"
                self.denied = self.denied or reason
                raise apsw.SQLError(reason) from None
            self.ts = None
        return self._millis

    def freeze(self, millis: int, seed: str) -> None:
        self._millis = millis
        self.ts = None
        self._start(seed)

    def freeze_at(self, ts: str, seed: str) -> None:
        """Freeze the clock at a validated event timestamp (read lazily)."""
        # (WorldBuilder.apply_rows runs these steps inline: keep the two alike)
        self.ts = ts
        self._start(seed)

    def _start(self, seed: str) -> None:
        self.seed = seed
        self.counter = 0
        self.denied = None
        self.ticks = 0
        self.altering = False


class _PerThread(threading.local):
    # One attribute holding a plain object: replay freezes the clock once per event, and
    # setting a slot costs a tenth of setting an attribute of a thread-local.
    def __init__(self) -> None:
        self.clock = _Clock()


_THREAD = _PerThread()


class _FrozenVFS(apsw.VFS):
    def __init__(self) -> None:
        super().__init__(FROZEN_VFS, "")

    def xCurrentTimeInt64(self) -> int:
        return _THREAD.clock.millis + _JULIAN_EPOCH_MS

    def xCurrentTime(self) -> float:
        return (_THREAD.clock.millis + _JULIAN_EPOCH_MS) / 86400000.0


_VFS: _FrozenVFS | None = None
_VFS_LOCK = threading.Lock()


def _ensure_vfs() -> None:
    global _VFS
    with _VFS_LOCK:
        if _VFS is None:
            _VFS = _FrozenVFS()


def freeze(millis: int, seed: str) -> None:
    """Freeze this thread's SQLite clock and seed its randomness (one event's worth)."""
    _THREAD.clock.freeze(millis, seed)


def freeze_at(ts: str, seed: str) -> None:
    """``freeze`` at an event's validated timestamp (``worldstore.names.TS_RE``)."""
    _THREAD.clock.freeze_at(ts, seed)


def event_clock() -> _Clock:
    """This thread's clock: a loop over many events calls its ``freeze`` (as ``freeze``
    does) and reads its ``denied`` (as ``take_denial`` does) without the thread-local
    lookup each time."""
    return _THREAD.clock


def _next_block() -> bytes:
    state = _THREAD.clock
    state.counter += 1
    return xxhash.xxh3_128_digest(state.seed.encode() + state.counter.to_bytes(8, "little"))


def _random() -> int:
    return int.from_bytes(_next_block()[:8], "little", signed=True)


def _randomblob(n: object) -> bytes:
    size = _blob_size(n)
    if size > MAX_VALUE_BYTES:
        reason = (f"randomblob({n}) asks for more than {MAX_VALUE_BYTES} bytes, the length "
                  "limit of a value in an event")
        _THREAD.clock.denied = _THREAD.clock.denied or reason
        raise apsw.TooBigError(reason)
    # The same bytes as drawing block after block (xxh3-128 of seed + counter, 16 bytes
    # each, joined, cut to size), hashed a chunk of counters at a time in C-level loops.
    first = _THREAD.clock.counter + 1
    last = _THREAD.clock.counter + -(-size // _BLOCK)
    _THREAD.clock.counter = last
    seed = _THREAD.clock.seed.encode()
    block = functools.partial(struct.Struct(f"<{len(seed)}sQ").pack, seed)
    out = bytearray()
    for start in range(first, last + 1, _CHUNK_BLOCKS):
        stop = min(start + _CHUNK_BLOCKS, last + 1)
        out += b"".join(map(xxhash.xxh3_128_digest, map(block, range(start, stop))))
    del out[size:]
    return bytes(out)


def _blob_size(n: object) -> int:
    """randomblob's length as this project has always read its argument: an integer, or
    a real cut toward zero, at least 1; any other value asks for 1 byte."""
    if isinstance(n, float):
        if math.isnan(n):
            return 1
        return MAX_VALUE_BYTES + 1 if math.isinf(n) and n > 0 else max(1, int(max(n, 0.0)))
    return max(1, n) if isinstance(n, int) else 1


_BLOCK = 16  # bytes of one xxh3-128 digest
_CHUNK_BLOCKS = 4096  # 64 KiB of output per join: large enough for speed, small for memory

# --- bounds: what one event's statement may cost ------------------------------------
#
# * Work: a budget of SQLite VM instructions, counted by the progress handler (SQLite
#   calls it every PROGRESS_INTERVAL instructions of the statement running). Counting
#   instructions, not seconds, refuses the same statement on every machine, loaded or
#   not; the budget starts afresh with each event (``freeze``).
# * Size of a value: SQLITE_LIMIT_LENGTH (strings, blobs, rows), randomblob included.
# * Memory: SQLite's heap (the whole process's apsw SQLite): above the soft limit SQLite
#   recycles cache pages rather than grow; past the hard limit allocations fail. A last
#   resort against a statement that holds many large values at once; it depends on what
#   else the process holds, the two limits above do not.
MAX_VM_STEPS = 100_000_000
PROGRESS_INTERVAL = 1000
MAX_VALUE_BYTES = 64 * 1024 * 1024
SOFT_HEAP_BYTES = 1024 * 1024 * 1024
HARD_HEAP_BYTES = 2 * 1024 * 1024 * 1024
_MAX_TICKS = MAX_VM_STEPS // PROGRESS_INTERVAL
_OVER_BUDGET = (f"the statement ran past its budget of {MAX_VM_STEPS:,} SQLite VM "
                "instructions (a runaway query: an endless recursive CTE, a huge join?)")
_HEAP_LOCK = threading.Lock()
_heap_limited = False


def _progress() -> bool:
    state = _THREAD.clock
    state.ticks += 1
    if state.ticks < _MAX_TICKS:
        return False
    state.denied = state.denied or _OVER_BUDGET
    return True  # SQLite stops the statement: SQLITE_INTERRUPT


def _install_bounds(conn: apsw.Connection) -> None:
    global _heap_limited
    with _HEAP_LOCK:
        if not _heap_limited:
            apsw.soft_heap_limit(SOFT_HEAP_BYTES)
            apsw.hard_heap_limit(HARD_HEAP_BYTES)
            _heap_limited = True
    conn.limit(apsw.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
    conn.set_progress_handler(_progress, PROGRESS_INTERVAL)


def take_denial() -> str | None:
    reason, _THREAD.clock.denied = _THREAD.clock.denied, None
    return reason


_HOST_AWARE: set[Callable[..., int]] = set()


def _authorizer(op: int, p1: str | None, p2: str | None, db: str | None,
                trigger: str | None) -> int:
    if _THREAD.clock.host:
        return apsw.SQLITE_OK
    reason = _refusal(op, p1, p2, db)
    if reason is None:
        return apsw.SQLITE_OK
    _THREAD.clock.denied = reason
    return apsw.SQLITE_DENY


_HOST_AWARE.add(_authorizer)


def _refusal(op: int, p1: str | None, p2: str | None, db: str | None) -> str | None:
    """Why an event may not do this, or None. Called by SQLite while it compiles."""
    if op == apsw.SQLITE_ALTER_TABLE:
        _THREAD.clock.altering = True  # an event is one statement: this one, until the next freeze
    elif _THREAD.clock.altering and db == "temp" and (p1 or "").lower() in _TEMP_SCHEMA_TABLES \
            and op in (apsw.SQLITE_READ, apsw.SQLITE_UPDATE):
        # ALTER TABLE ... RENAME rewrites the TEMP schema as well as the main one; nothing
        # can be in it (every CREATE TEMP is refused), so that rewrite changes nothing.
        return None
    if db == "temp" or op in _TEMP_OPS:
        return _TEMP
    if op in (apsw.SQLITE_ATTACH, apsw.SQLITE_DETACH):
        return "ATTACH/DETACH is not allowed: an event writes only its own service"
    if op in (apsw.SQLITE_TRANSACTION, apsw.SQLITE_SAVEPOINT):
        return "transaction control is not allowed: a persona-day is one transaction"
    if op == apsw.SQLITE_PRAGMA:
        return _pragma_refusal((p1 or "").lower(), p2)
    if op == apsw.SQLITE_FUNCTION:
        return _function_refusal((p2 or "").lower())
    if op in (apsw.SQLITE_CREATE_VTABLE, apsw.SQLITE_DROP_VTABLE):
        return module_refusal((p2 or "").lower())
    if op == apsw.SQLITE_READ and (p1 or "").lower() in _REFUSED_MODULES:
        # Eponymous modules (used as table-valued functions) that drop_modules cannot
        # remove; a table of the same name is unreadable to events too.
        return module_refusal((p1 or "").lower())
    return None


_TEMP_SCHEMA_TABLES = frozenset({"sqlite_master", "sqlite_temp_master", "sqlite_schema",
                                 "sqlite_temp_schema"})
_TEMP_OPS = frozenset({
    apsw.SQLITE_CREATE_TEMP_TABLE, apsw.SQLITE_CREATE_TEMP_INDEX,
    apsw.SQLITE_CREATE_TEMP_TRIGGER, apsw.SQLITE_CREATE_TEMP_VIEW,
    apsw.SQLITE_DROP_TEMP_TABLE, apsw.SQLITE_DROP_TEMP_INDEX, apsw.SQLITE_DROP_TEMP_TRIGGER,
    apsw.SQLITE_DROP_TEMP_VIEW,
})


def _pragma_refusal(name: str, value: str | None) -> str | None:
    if name in _ALLOWED_PRAGMAS or name in _READ_PRAGMAS:
        return None
    if name in _READ_ONLY_PRAGMAS and value is None:
        return None
    return (f"PRAGMA {name} is not allowed (only user_version and application_id, and "
            "reading the schema): pragmas and pragma_* functions report or change the "
            "connection and the host, not the world")


def _function_refusal(name: str) -> str | None:
    if name in _ALLOWED_FUNCTIONS:
        return None
    why = _REFUSED_FUNCTIONS.get(name)
    if why is None:
        why = "it is not on the list of functions whose result depends only on the world"
    return f"{name}() is not allowed in events: {why}"


def module_refusal(name: str) -> str | None:
    """Why an event may not use virtual table module `name`, or None."""
    if name in _ALLOWED_MODULES:
        return None
    why = _REFUSED_MODULES.get(name, "it is not on the list of modules known to be "
                                     "deterministic")
    return f"virtual table module {name} is not allowed in events: {why}"


def describe_failure(exc: apsw.Error) -> str:
    """The reason an event's SQL failed: a guard's refusal if one was recorded, or
    SQLite's error (naming why, for the modules dropped from event connections)."""
    denied = take_denial()
    if denied is not None:
        return denied
    text = str(exc)
    missing = text.removeprefix("no such table: ").rsplit(".", 1)[-1].lower()
    if text.startswith("no such table: ") and missing in _REFUSED_MODULES:
        return f"{missing} is not available to events: {_REFUSED_MODULES[missing]}"
    return f"{type(exc).__name__}: {text}"


def watch_rowids(op: int, db: str, table: str, rowid: int) -> None:
    """The update hook every event connection starts with: refuses rowid 2^63-1."""
    if rowid == MAX_ROWID:
        refuse_max_rowid(table)


def refuse_max_rowid(table: str) -> None:
    """Refuse the statement that wrote rowid 2^63-1 into `table` (reported after its rows
    are written; the event fails). A connection given its own update hook calls this."""
    # A rowid table whose largest rowid is 2^63-1 gets the rowids of later inserts that
    # name none from SQLite's process-wide random generator; no row may ever take it.
    if _THREAD.clock.denied is None:
        _THREAD.clock.denied = (
            f"rowid 9223372036854775807 (2^63-1) in table {table} is not allowed: once a "
            "table holds it, SQLite picks the rowid of every insert that names none at random")


_MODIFIED_DATE_FUNCTIONS = ("date", "time", "datetime", "julianday", "unixepoch", "strftime",
                            "timediff")
# CURRENT_DATE, CURRENT_TIME and CURRENT_TIMESTAMP are calls of these 0-argument functions,
# which an application-defined function of the same name replaces (column defaults too).
_CLOCK_KEYWORDS = ("current_date", "current_time", "current_timestamp")

# --- the host's time zone ----------------------------------------------------------------
#
# SQLite's date functions read the host's time zone (TZ, /etc/localtime) for exactly the
# modifiers whose parser asks sqlite3NotPureFunc first ('localtime' and 'utc' in this
# SQLite): that is how SQLite itself refuses them where a result must not depend on the
# environment (CHECK constraints, index expressions, generated columns). So the wrappers
# parse no modifier: SQLite decides, on the value exactly as its date functions read it (a
# text cut at its first NUL, any letter case, a blob's bytes as text), by evaluating it as
# a modifier in a CHECK constraint on the private connection (``_PROBE``). Such a modifier
# with spaces around it is refused too: SQLite would give NULL; the error says why instead.
# Numbers and NULL are never asked: a number reads as digits, and NULL ends the function.
_PROBE_TABLE = ("CREATE TABLE tz_probe(modifier, "
                "CHECK (datetime('2000-01-01', modifier) IS NOT 0))")
_PROBE = "REPLACE INTO tz_probe(rowid, modifier) VALUES (1, ?)"
_TZ_DECISIONS: dict[str | bytes, bool] = {}  # a value -> whether SQLite reads a time zone
_MAX_TZ_DECISIONS = 1 << 16  # (forgotten all at once when full: a decision is cheap to redo)
_MAX_REMEMBERED = 64  # characters (or bytes) of a value whose decision is kept


class _PrivateDates(threading.local):
    """This thread's plain in-memory connections whose date functions are SQLite's own:
    the wrappers below hand every call they accept to one (a cursor each, kept: a call
    is one run of a cached statement)."""

    frozen: apsw.Cursor | None = None  # on the frozen VFS
    probe: apsw.Cursor | None = None  # the same connection, for ``_PROBE``
    host: apsw.Cursor | None = None  # on SQLite's default VFS: the host's clock


_PRIVATE = _PrivateDates()


def _frozen_dates() -> apsw.Cursor:
    cursor = _PRIVATE.frozen
    if cursor is None:
        _ensure_vfs()  # (a judge's connection may be the process's first)
        conn = apsw.Connection(":memory:", vfs=FROZEN_VFS)
        conn.execute(_PROBE_TABLE)
        conn.execute("BEGIN")  # never committed: a probe writes one row and nothing commits
        _PRIVATE.probe = conn.cursor()
        cursor = _PRIVATE.frozen = conn.cursor()
    return cursor


def _host_clock_dates() -> apsw.Cursor:
    cursor = _PRIVATE.host
    if cursor is None:
        cursor = _PRIVATE.host = apsw.Connection(":memory:").cursor()
    return cursor


def reads_time_zone(modifier: object) -> bool:
    """Whether SQLite's date functions, given `modifier` as a modifier, would convert with
    the host's time zone (or it is such a modifier with spaces around it)."""
    known: bool | None = _TZ_DECISIONS.get(modifier)  # type: ignore[call-overload]
    if known is None:
        if type(modifier) is not str and type(modifier) is not bytes:
            return False
        bare = modifier.strip()
        known = _sqlite_reads_time_zone(modifier) or (
            bare != modifier and _sqlite_reads_time_zone(bare))
        if len(modifier) <= _MAX_REMEMBERED:
            if len(_TZ_DECISIONS) >= _MAX_TZ_DECISIONS:
                _TZ_DECISIONS.clear()
            _TZ_DECISIONS[modifier] = known
    return known


def _sqlite_reads_time_zone(modifier: str | bytes) -> bool:
    probe = _PRIVATE.probe
    if probe is None:
        _frozen_dates()
        probe = _PRIVATE.probe
        assert probe is not None
    try:
        probe.execute(_PROBE, (modifier,))
    except apsw.SQLError:  # "non-deterministic use of datetime() in a CHECK constraint"
        return True
    return False


def _date_function(name: str, private: Callable[[], apsw.Cursor]) -> Callable[..., Any]:
    queries = {n: f"SELECT {name}({', '.join('?' * n)})" for n in range(8)}

    def call(*args: Any) -> Any:
        for arg in args[1:]:  # (strftime's time value too: no value is both)
            if reads_time_zone(arg):
                reason = (f"{name}() with the {arg!r} modifier is not allowed: it converts "
                          "with the host's time zone (TZ), so the result would depend on "
                          "where it runs; the frozen clock is UTC")
                _THREAD.clock.denied = reason
                raise apsw.SQLError(reason)
        query = queries.get(len(args)) or f"SELECT {name}({', '.join('?' * len(args))})"
        # (run to its end: the statement is reset, and reads the clock afresh next time)
        rows = private().execute(query, args).fetchall()
        return rows[0][0] if rows else None

    return call


def _clock_keyword(name: str) -> Callable[[], Any]:
    query = f"SELECT {name}"

    def call() -> Any:
        rows = _frozen_dates().execute(query).fetchall()
        return rows[0][0] if rows else None

    return call


_DATE_WRAPPERS = {name: _date_function(name, _frozen_dates)
                  for name in _MODIFIED_DATE_FUNCTIONS}
_HOST_CLOCK_DATE_WRAPPERS = {name: _date_function(name, _host_clock_dates)
                             for name in _MODIFIED_DATE_FUNCTIONS}
_CLOCK_WRAPPERS = {name: _clock_keyword(name) for name in _CLOCK_KEYWORDS}


def _install_event_guards(conn: apsw.Connection) -> None:
    """What every event connection has besides the authorizer: date functions that refuse
    the host's time zone, no virtual table modules beyond the allowed ones, and the
    watch on rowid 2^63-1."""
    for name, wrapper in _DATE_WRAPPERS.items():
        conn.create_scalar_function(name, wrapper, -1, deterministic=True)
    for name, keyword in _CLOCK_WRAPPERS.items():
        # (deterministic, as SQLite's own: a column DEFAULT may use it; like SQLite's own,
        # it is evaluated once per statement run, on the clock frozen for that event)
        conn.create_scalar_function(name, keyword, 0,  # type: ignore[arg-type]
                                    deterministic=True)
    conn.drop_modules(sorted(_ALLOWED_MODULES))
    conn.set_update_hook(watch_rowids)


def refuse_host_time_zone(conn: apsw.Connection) -> None:
    """Give a connection that is not an event's (one that reads worlds for a judge) date
    functions that refuse the host's time zone as event connections do; 'now' stays the
    host's clock there."""
    for name, wrapper in _HOST_CLOCK_DATE_WRAPPERS.items():
        conn.create_scalar_function(name, wrapper, -1, deterministic=True)


def frozen_vfs() -> str:
    """The frozen-clock VFS's name, registering it first: another VFS built on it (its
    `base`) keeps the frozen clock."""
    _ensure_vfs()
    return FROZEN_VFS


def open_event_db(path: Path, *, vfs: str | None = FROZEN_VFS,
                  statement_cache: int = 100) -> apsw.Connection:
    """Open (creating) a service database for applying events, with every guard on. The
    clock is frozen whatever `vfs` is (FROZEN_VFS, one built on it with ``frozen_vfs()``,
    or None: SQLite's default). `statement_cache`: how many compiled statements apsw
    keeps (each run takes the next slot of a ring, so a statement not run again within
    that many runs is compiled again)."""
    _ensure_vfs()
    conn = apsw.Connection(
        str(path), flags=apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE, vfs=vfs,
        statementcachesize=statement_cache,
    )
    conn.create_scalar_function("random", _random, 0)  # type: ignore[arg-type]
    conn.create_scalar_function("randomblob", _randomblob, 1)  # type: ignore[arg-type]
    conn.authorizer = _authorizer
    _install_event_guards(conn)
    _install_bounds(conn)
    conn.setbusytimeout(5000)
    return conn


def open_event_db_snapshot(path: Path) -> apsw.Connection:
    """Open a read-only, immutable snapshot database with the same frozen clock and seeded
    randomness as ``open_event_db`` (for tools that only read a world nobody changes)."""
    _ensure_vfs()
    uri = f"file:{path.resolve().as_posix()}?mode=ro&immutable=1"
    conn = apsw.Connection(
        uri, flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI, vfs=FROZEN_VFS)
    conn.create_scalar_function("random", _random, 0)  # type: ignore[arg-type]
    conn.create_scalar_function("randomblob", _randomblob, 1)  # type: ignore[arg-type]
    conn.authorizer = _authorizer
    _install_event_guards(conn)
    _install_bounds(conn)
    return conn


@contextlib.contextmanager
def open_readonly(path: Path) -> Iterator[apsw.Connection]:
    uri = f"file:{path.resolve().as_posix()}?mode=ro"
    conn = apsw.Connection(uri, flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
    try:
        yield conn
    finally:
        conn.close()


@contextlib.contextmanager
def guarded(conn: apsw.Connection) -> Iterator[apsw.Connection]:
    """`conn` under the gate events pass (``_authorizer``) for the block: SQL that is
    not app code (an implementer's statement) may do only what an event may."""
    before = conn.authorizer
    conn.authorizer = _authorizer
    take_denial()  # a stale reason must not be blamed on this statement
    try:
        yield conn
    finally:
        conn.authorizer = before


def unguarded(conn: apsw.Connection, sql: str) -> list[Any]:
    """Run `sql` on an event connection past its guard, and return its rows: the host's
    own statements (transaction control, settings, header pragmas), never an event's SQL.

    The guard lets everything through while this thread compiles it, and the statement
    is compiled afresh and never cached: a later event with the same text must meet the
    guard. (Swapping the authorizer out instead would expire every prepared statement of
    the connection, so each event statement would be compiled again after each day.)"""
    guard = conn.authorizer
    if guard is not None and getattr(guard, "__func__", guard) not in _HOST_AWARE:
        conn.authorizer = None  # an authorizer that does not know the host's statements
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.authorizer = guard
    clock = _THREAD.clock
    clock.host = True
    try:
        return conn.execute(sql, can_cache=False).fetchall()
    finally:
        clock.host = False


def host_compiling() -> bool:
    """Whether this thread is compiling the host's own statement (``unguarded``)."""
    return _THREAD.clock.host


def host_aware(authorizer: Callable[..., int]) -> Callable[..., int]:
    """Mark `authorizer` as one that lets the host's own statements through (it returns
    SQLITE_OK while ``host_compiling()``), so ``unguarded`` need not swap it out."""
    _HOST_AWARE.add(authorizer)
    return authorizer


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
