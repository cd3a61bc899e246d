"""The AWM adapter: serves an AWM scenario's generated FastAPI server as a carried app.

**Runs only inside the sandboxed app worker** (``worldenv.sandbox.app_worker``), where a carried
module
written by ``worldenv.awm.host.awm_app_source`` calls ``serve(...)``. The host never imports this
module (it pins it by the digest of its source, ``worldenv.awm.host.adapter_digest``).

``serve`` checks that it is the pinned adapter (name, version, digest of this file), then
runs the scenario's code as a module of its own, with these stand-ins visible to it only:

* ``create_engine(...)`` (from ``sqlalchemy``) returns one engine over a DBAPI-2 shim on
  apsw (``_Dbapi``): its one connection is the database the worker holds for the current
  call (the handed instance database, through the pinned SQLite and its frozen-clock VFS),
  so SQLAlchemy never opens a file by name and every write the code makes lands inside
  the call's session capture (``worldenv.core.dispatch.execute_tool``). Until a call hands a
  database (module level: ``Base.metadata.create_all``) it is a scratch in-memory one.
  The shim's transactions are savepoints inside the call's own, and what the code has not
  committed when the request ends is rolled back, as a server's session would be.
* ``datetime``, ``time``, ``random``, ``secrets`` and ``uuid`` modules whose ``now()``,
  ``utcnow()``, ``today()``, ``time()``, random draws, tokens and ``uuid4()`` read the
  call's frozen clock and seed (``worldenv.core.contract.CallClock``) instead of the machine's;
  ``_datetime``, ``builtins`` and ``importlib`` whose imports give the same stand-ins.

**Generated code is deterministic, or refused, or caught.** Stand-ins are not enough:
the code can reach the real modules (``sys.modules``, another module's reference to them).
So ``serve`` also freezes the worker process itself (``_freeze_process``; the worker
serves nothing else): every clock of the ``time`` module (``time``, ``monotonic``,
``perf_counter``, ``process_time``, ``thread_time``, ``clock_gettime``, their ``_ns``
forms, ``localtime``...) reads the call's instant; ``time.sleep`` and the event loop's
timers take no time but move the call's clock on by what they wait (``_Clock.advance``);
``os.urandom``/``getrandom``, ``SystemRandom``, ``secrets``, ``ssl.RAND_bytes``, ``uuid``
and every generator seeded with nothing (``random.Random()``, the C ``_random.Random()``,
tempfile's names) draw from the call's seed, and the ``random`` module's own generator is
reseeded by each call. ``ctypes`` and ``cffi`` cannot be imported at all (they reach the
C library's clock and entropy). The worker's sandbox (``worldenv.sandbox.workers``) masks the
kernel's entropy and clock files (``/dev/urandom``, ``/proc/sys/kernel/random/uuid``...)
and gives every worker one str hash seed. What is left (the C ``datetime`` type reached
through another module, ``id()``, addresses, CPU times, ``/proc/self``, a clock read in a
subprocess, module state kept between instances) is the determinism checker's:
``worldenv.instances.checker.check_carried_tools`` names each call that differs.

Each FastAPI route becomes one tool named ``<service>_<operation_id>``, with the input schema
fastapi-mcp (github.com/tadata-org/fastapi_mcp, MIT) derives from the app's OpenAPI
document: path, query and body parameters flattened into one object (a body model's fields
become top-level parameters), and its description (summary, description, the success
response with an example). A call is what fastapi-mcp does, without a network: the
arguments become one HTTP request (path parameters substituted, query parameters, the rest
as the JSON body) handled by the app in this process (ASGI, one event loop, no threads),
so FastAPI's own validation, dependencies, exception handlers and response models apply.
A 2xx response is the result (its JSON re-indented as fastapi-mcp does, and as structured
content when it is an object); a 4xx/5xx (an ``HTTPException``, a validation error, a bug
in the code: FastAPI answers 500) is an error result with fastapi-mcp's wording. Every
route may write (a GET that writes included): the session capture records whatever the
call changed.

Limits: FastAPI's startup/lifespan handlers are not run (AWM's code creates its tables at
import, on the scratch database); code that reaches a database other than through
``create_engine`` (``sqlite3.connect``) finds only the sandbox's private, empty ``/tmp``;
``uuid1()`` is a seeded ``uuid4()``; sync routes and dependencies run inline, not in a
thread pool (calls of one worker are serial anyway).
"""

from __future__ import annotations

import _random as _c_random
import asyncio
import base64
import builtins
import datetime as _dt
import decimal
import importlib
import importlib.abc
import importlib.util
import json
import logging
import os
import random as _random
import secrets
import selectors
import sys
import time as _time
import types
import urllib.parse
import uuid as _uuid
import warnings
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any

import anyio.to_thread
import apsw

from worldenv.core.app import App, ToolContext, ToolSpec
from worldenv.core.contract import CallClock, CallContext, ToolInfo, ToolResult
from worldenv.core.dispatch import Connect, execute_tool, tool_failure
from worldenv.errors import AppPinError
from worldstore.canonical import digest

__all__ = ["AwmApp", "AwmTool", "serve"]

NAME = "awm"
VERSION = "1.0.0"
METHODS = ("get", "post", "put", "patch", "delete")  # what fastapi-mcp turns into tools
log = logging.getLogger(__name__)


def own_digest() -> str:
    with open(__file__, "rb") as f:
        return digest(f.read())


def serve(service: str, code: str, *, adapter: str, version: str, digest: str) -> AwmApp:
    """The app for one scenario's generated server `code` (called by the carried module)."""
    have = (NAME, VERSION, own_digest())
    if (adapter, version, digest) != have:
        raise AppPinError(
            f"the world pins AWM adapter {adapter} {version} ({digest}); this install has "
            f"{have[0]} {have[1]} ({have[2]})")
    return AwmApp(service, code)


def _require_extra() -> None:
    """The generated code imports FastAPI and SQLAlchemy: say which extra brings them."""
    import importlib.util

    missing = [name for name in ("fastapi", "sqlalchemy", "pydantic")
               if importlib.util.find_spec(name) is None]
    if missing:
        raise AppPinError(f"serving an AWM environment needs {', '.join(missing)}: "
                          "pip install 'agent-worlds[awm]'")


# --- the frozen clock -------------------------------------------------------------------

_EPOCH_MS = 0  # the clock at module level, before any call: deterministic, never the machine's

# The real functions the frozen ones are made of, taken before ``_freeze_process`` replaces
# the time module's attributes with frozen ones.
_GMTIME, _STRFTIME, _ASCTIME = _time.gmtime, _time.strftime, _time.asctime
_C_RANDOM_INIT, _C_RANDOM_SEED = _c_random.Random.__init__, _c_random.Random.seed


class _Clock:
    """The current call's clock and its seeded draws (one call at a time per worker).

    Within a call, time stands still but for what the code sleeps (``time.sleep``, an
    asyncio timer): `advance` counts those seconds, so a sleep returns at once and every
    clock reads the call's instant plus what was slept, the same on every instance."""

    def __init__(self) -> None:
        self.millis = _EPOCH_MS
        self.seed = "awm:load"
        self.advance = 0.0
        self._rng: _random.Random | None = None

    def set(self, clock: CallClock) -> None:
        self.millis = clock.millis
        self.seed = f"awm:{clock.seed}"
        self.advance = 0.0
        self._rng = None  # seeded on the call's first draw
        _reseed_process(self.seed)

    @property
    def rng(self) -> _random.Random:
        if self._rng is None:
            self._rng = _random.Random(self.seed)
        return self._rng

    def seconds(self) -> float:
        return self.millis / 1000 + self.advance

    def nanos(self) -> int:
        return self.millis * 1_000_000 + round(self.advance * 1e9)

    def utc(self) -> _dt.datetime:
        return _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC) + _dt.timedelta(
            milliseconds=self.millis, seconds=self.advance)


_CLOCK = _Clock()


class _RealTypeMeta(type):
    """isinstance/issubclass of a stand-in class answer as for the real class."""

    _real: type

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, cls._real)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, cls._real)


def _pydantic_as(real: type) -> Callable[..., Any]:
    def schema(cls: type, source: Any, handler: Any) -> Any:
        return handler(real)
    return classmethod(schema)  # type: ignore[return-value]


class _FrozenDatetime(_dt.datetime, metaclass=_RealTypeMeta):
    _real = _dt.datetime
    __get_pydantic_core_schema__ = _pydantic_as(_dt.datetime)

    @classmethod
    def now(cls, tz: _dt.tzinfo | None = None) -> _dt.datetime:  # type: ignore[override]
        utc = _CLOCK.utc()
        return utc.replace(tzinfo=None) if tz is None else utc.astimezone(tz)

    @classmethod
    def utcnow(cls) -> _dt.datetime:  # type: ignore[override]
        return _CLOCK.utc().replace(tzinfo=None)

    @classmethod
    def today(cls) -> _dt.datetime:  # type: ignore[override]
        return _CLOCK.utc().replace(tzinfo=None)


class _FrozenDate(_dt.date, metaclass=_RealTypeMeta):
    _real = _dt.date
    __get_pydantic_core_schema__ = _pydantic_as(_dt.date)

    @classmethod
    def today(cls) -> _dt.date:  # type: ignore[override]
        return _CLOCK.utc().date()


def _shim_module(name: str, real: types.ModuleType, overrides: dict[str, Any]
                 ) -> types.ModuleType:
    module = types.ModuleType(name, real.__doc__)
    module.__dict__.update({k: v for k, v in vars(real).items() if not k.startswith("__")})
    module.__dict__.update(overrides)
    return module


# The datetime module generated code imports (``import``, ``__import__``, ``importlib``).
# The C type itself cannot be changed, and libraries subclass it (pydantic.v1 with a
# metaclass of its own), so the real module stays the process's.
_DATETIME = _shim_module("datetime", _dt, {"datetime": _FrozenDatetime, "date": _FrozenDate})


def _time_time() -> float:
    return _CLOCK.seconds()


def _time_ns() -> int:
    return _CLOCK.nanos()


def _clock_gettime(clk_id: int) -> float:
    return _CLOCK.seconds()


def _clock_gettime_ns(clk_id: int) -> int:
    return _CLOCK.nanos()


def _cpu_time() -> float:
    return _CLOCK.advance


def _cpu_time_ns() -> int:
    return round(_CLOCK.advance * 1e9)


def _sleep(seconds: float) -> None:
    """A sleep takes no time: the call's clocks move on by `seconds`."""
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    _CLOCK.advance += float(seconds)


def _struct_now(t: float | None = None) -> _time.struct_time:
    return _GMTIME(_time_time() if t is None else t)


def _strftime(fmt: str, t: Any = None) -> str:
    return _STRFTIME(fmt, _struct_now() if t is None else t)


def _ctime(t: float | None = None) -> str:
    return _ASCTIME(_struct_now(t))


def _asctime(t: Any = None) -> str:
    return _ASCTIME(_struct_now() if t is None else t)


# The time module's readings of any clock, frozen (in the module itself: ``_freeze_process``).
_FROZEN_TIME: dict[str, Callable[..., Any]] = {
    "time": _time_time, "time_ns": _time_ns,
    "monotonic": _time_time, "monotonic_ns": _time_ns,
    "perf_counter": _time_time, "perf_counter_ns": _time_ns,
    "clock_gettime": _clock_gettime, "clock_gettime_ns": _clock_gettime_ns,
    "process_time": _cpu_time, "process_time_ns": _cpu_time_ns,
    "thread_time": _cpu_time, "thread_time_ns": _cpu_time_ns,
    "sleep": _sleep, "localtime": _struct_now, "gmtime": _struct_now,
    "strftime": _strftime, "ctime": _ctime, "asctime": _asctime,
}


def _uuid4() -> _uuid.UUID:
    return _uuid.UUID(int=_CLOCK.rng.getrandbits(128), version=4)


def _uuid1(node: int | None = None, clock_seq: int | None = None) -> _uuid.UUID:
    return _uuid4()


def _generate_time_safe() -> tuple[bytes, int]:
    return _uuid1().bytes, 0  # (libuuid's answer: the bytes, and "safe")


def _getnode() -> int:
    return _CLOCK.rng.getrandbits(48) | (1 << 40)  # a random node id has its multicast bit


_RANDOM_NAMES = ("random", "randint", "randrange", "choice", "choices", "shuffle", "sample",
                 "uniform", "gauss", "normalvariate", "getrandbits", "randbytes",
                 "triangular", "betavariate", "expovariate", "seed")


class _SeededRandom(_random.Random):
    """``random.Random()`` / ``SystemRandom()`` without a seed: seeded by the call."""

    def __init__(self, x: Any = None) -> None:
        super().__init__(_CLOCK.seed if x is None else x)


def _token_bytes(nbytes: int | None = None) -> bytes:
    return _CLOCK.rng.randbytes(32 if nbytes is None else nbytes)


def _urandom(size: int) -> bytes:
    if size < 0:
        raise ValueError("negative argument not allowed")
    return _CLOCK.rng.randbytes(size)


def _getrandom(size: int, flags: int = 0) -> bytes:
    return _urandom(size)


def _seed_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """A C-level generator seeded with nothing (the OS's entropy) takes the call's draw."""
    return (_CLOCK.rng.getrandbits(128),) if not args or args[0] is None else args


def _c_random_init(self: Any, *args: Any) -> None:
    _C_RANDOM_INIT(self, *_seed_args(args))


def _c_random_seed(self: Any, *args: Any) -> None:
    _C_RANDOM_SEED(self, *_seed_args(args))


def _bound_rng(name: str) -> Callable[..., Any]:
    def draw(*args: Any, **kwargs: Any) -> Any:
        return getattr(_CLOCK.rng, name)(*args, **kwargs)
    draw.__name__ = name
    return draw


# Modules generated code may not import at all: they reach the C library (its clocks, the
# kernel's entropy) around every frozen function.
REFUSED_MODULES = frozenset({"ctypes", "_ctypes", "cffi", "_cffi_backend"})


class _RefusedImport(importlib.abc.MetaPathFinder):
    """Refuses ``REFUSED_MODULES`` to every import of the process, ``importlib`` included."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname.partition(".")[0] in REFUSED_MODULES:
            raise ImportError(f"{fullname}: generated AWM code may not use it (it reaches "
                              "the machine's clock and entropy around the frozen ones)",
                              name=fullname)
        return None


def _freeze_process() -> None:
    """Freeze, in the worker's own modules, every clock and entropy source Python code can
    reach: whatever name the code finds them by (``time.monotonic``, ``from os import
    urandom`` at import, ``sys.modules``, ``importlib``, another module's reference to the
    module), it calls the frozen function. The worker serves nothing but this app, and its
    own machinery reads no clock (timeouts are the host's). Done once per process."""
    if any(isinstance(finder, _RefusedImport) for finder in sys.meta_path):
        return
    import _ssl
    import posix
    import ssl
    import tempfile

    for name, frozen in _FROZEN_TIME.items():
        setattr(_time, name, frozen)
    for module in (os, posix):
        module.urandom = _urandom  # type: ignore[attr-defined]
        module.getrandom = _getrandom  # type: ignore[attr-defined]
    _random._urandom = _urandom  # type: ignore[attr-defined]  # SystemRandom, secrets
    # random.Random() and _random.Random() seeded with nothing (tempfile's names, say)
    _c_random.Random.__init__ = _c_random_init  # type: ignore[method-assign]
    _c_random.Random.seed = _c_random_seed  # type: ignore[method-assign]
    _uuid.uuid1, _uuid.uuid4, _uuid.getnode = _uuid1, _uuid4, _getnode
    _uuid._generate_time_safe = None  # type: ignore[attr-defined]  # libuuid's clock
    libuuid = sys.modules.get("_uuid")  # (where Python was built with it)
    if libuuid is not None:
        libuuid.generate_time_safe = _generate_time_safe  # type: ignore[attr-defined]
    for module in (ssl, _ssl):
        module.RAND_bytes = _token_bytes  # type: ignore[attr-defined]
    # tempfile finds its directory once per process, by writing files of drawn names: now,
    # so that no call's draws depend on whether a call before it (another instance's) did.
    tempfile.gettempdir()
    sys.meta_path.insert(0, _RefusedImport())
    _reseed_process(_CLOCK.seed)


def _reseed_process(seed: str) -> None:
    """What the process draws from besides the call's own generator starts each call
    afresh from its seed: the random module's hidden instance (``random.random``, bound
    methods taken at import), and tempfile's name sequence."""
    _random.seed(f"{seed}:module")
    tempfile = sys.modules.get("tempfile")
    if tempfile is not None:
        tempfile._name_sequence = None  # type: ignore[attr-defined]


class _VirtualTimeSelector(selectors.DefaultSelector):
    """The event loop's selector: a wait for a timer moves the call's clock to the timer
    instead of sleeping (the loop's time is ``time.monotonic``, frozen). Nothing outside
    the process can make a descriptor ready (the worker has no network), so waiting for one
    (no timer: `timeout` None) waits for ever, as it would anywhere."""

    def select(self, timeout: float | None = None) -> list[Any]:
        ready: list[Any] = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            return list(super().select(None))
        _CLOCK.advance += timeout
        return ready


def _virtual_time_loop() -> asyncio.AbstractEventLoop:
    """The event loop the routes run on: its time is the frozen ``time.monotonic``, moved
    on by ``_VirtualTimeSelector``. A timer counts as due within a millisecond of its
    time: the clock reads the epoch in seconds, whose float steps are coarser than the
    loop's nanosecond resolution, so a timer could otherwise stay a step short for ever."""
    loop = asyncio.SelectorEventLoop(_VirtualTimeSelector())
    loop._clock_resolution = 1e-3  # type: ignore[attr-defined]
    return loop


# --- SQLAlchemy on the held apsw connection: a DBAPI-2 shim ---------------------------


class _Binding:
    """The apsw connection the code's engine uses now: the call's, else a scratch one."""

    def __init__(self) -> None:
        self.scratch = apsw.Connection(":memory:")
        self.conn: apsw.Connection = self.scratch
        self.functions: list[tuple[str, int, Callable[..., Any], bool]] = []
        self._last: apsw.Connection | None = None  # the call connection functions are on

    def bind(self, conn: apsw.Connection) -> None:
        """Use `conn` (the call's) until ``unbind``; SQL functions the dialect registered
        (``regexp``, ``floor``) are registered on it when it is new."""
        self.conn = conn
        if conn is not self._last:
            for name, nargs, fn, deterministic in self.functions:
                conn.create_scalar_function(name, fn, nargs, deterministic=deterministic)
            self._last = conn

    def unbind(self) -> None:
        self.conn = self.scratch


_BINDING = _Binding()


class _Dbapi(types.ModuleType):
    """The module SQLAlchemy's sqlite dialect takes for ``sqlite3`` (``create_engine(...,
    module=...)``): the attributes it reads and the exception classes it wraps."""

    paramstyle = "qmark"
    apilevel = "2.0"
    threadsafety = 1
    sqlite_version_info = tuple(int(p) for p in apsw.sqlite_lib_version().split("."))
    sqlite_version = apsw.sqlite_lib_version()
    version_info = (2, 6, 0)
    version = "2.6.0"
    PARSE_DECLTYPES = 1
    PARSE_COLNAMES = 2
    Binary = bytes

    class Warning(Exception):
        pass

    class Error(Exception):
        pass

    class InterfaceError(Error):
        pass

    class DatabaseError(Error):
        pass

    class DataError(DatabaseError):
        pass

    class OperationalError(DatabaseError):
        pass

    class IntegrityError(DatabaseError):
        pass

    class InternalError(DatabaseError):
        pass

    class ProgrammingError(DatabaseError):
        pass

    class NotSupportedError(DatabaseError):
        pass

    @staticmethod
    def connect(*args: Any, **kwargs: Any) -> _Connection:
        return _Connection()


DBAPI = _Dbapi("awm_dbapi")


def _translate(exc: Exception) -> Exception:
    d = DBAPI
    if isinstance(exc, apsw.ConstraintError | apsw.MismatchError):
        kind: type[Exception] = d.IntegrityError
    elif isinstance(exc, apsw.TooBigError | apsw.RangeError):
        kind = d.DataError
    elif isinstance(exc, apsw.BindingsError | apsw.ExecutionCompleteError | TypeError):
        kind = d.ProgrammingError
    elif isinstance(exc, apsw.Error):
        kind = d.OperationalError
    else:
        kind = d.DatabaseError
    return kind(str(exc))


def _param(value: Any) -> Any:
    if value is None or isinstance(value, int | float | str | bytes):
        return value
    if isinstance(value, _dt.datetime):
        return value.isoformat(" ")
    if isinstance(value, _dt.date | _dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return value


def _params(params: Any) -> Any:
    if params is None:
        return ()
    if isinstance(params, dict):
        return {k: _param(v) for k, v in params.items()}
    return tuple(_param(v) for v in params)


_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE", "WITH")


class _Cursor:
    arraysize = 1

    def __init__(self, connection: _Connection) -> None:
        self.connection = connection
        self.description: tuple[tuple[Any, ...], ...] | None = None
        self.rowcount = -1
        self.lastrowid: int | None = None
        self._rows: list[tuple[Any, ...]] = []
        self._at = 0

    def execute(self, sql: str, params: Any = None) -> _Cursor:
        conn = _BINDING.conn
        self.connection.begin_if_needed(sql)
        described: list[tuple[tuple[str, str], ...]] = []

        outer = conn.exec_trace  # the worker's, on a read-first call: it still decides

        def trace(cursor: apsw.Cursor, statement: str, bindings: Any) -> bool:
            if outer is not None and not outer(cursor, statement, bindings):
                return False
            described.append(cursor.get_description())
            return True

        cursor = conn.cursor()
        cursor.exec_trace = trace
        try:
            self._rows = list(cursor.execute(sql, _params(params)))
        except Exception as exc:
            raise _translate(exc) from exc
        finally:
            cursor.close()
        self._at = 0
        columns = described[-1] if described else ()
        self.description = tuple((name, None, None, None, None, None, None)
                                 for name, _decl in columns) or None
        head = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
        self.rowcount = conn.changes() if head in _WRITES else -1
        self.lastrowid = conn.last_insert_rowid()
        return self

    def executemany(self, sql: str, seq: Sequence[Any]) -> _Cursor:
        total = 0
        for params in seq:
            self.execute(sql, params)
            total += max(self.rowcount, 0)
        self.rowcount = total
        return self

    def fetchone(self) -> tuple[Any, ...] | None:
        if self._at >= len(self._rows):
            return None
        self._at += 1
        return self._rows[self._at - 1]

    def fetchmany(self, size: int | None = None) -> list[tuple[Any, ...]]:
        size = self.arraysize if size is None else size
        rows = self._rows[self._at:self._at + size]
        self._at += len(rows)
        return rows

    def fetchall(self) -> list[tuple[Any, ...]]:
        rows = self._rows[self._at:]
        self._at = len(self._rows)
        return rows

    def close(self) -> None:
        self._rows = []

    def setinputsizes(self, *args: Any) -> None:
        pass

    def setoutputsize(self, *args: Any) -> None:
        pass

    def __iter__(self) -> Any:
        while (row := self.fetchone()) is not None:
            yield row


_TX = "awm_tx"
_BEGINS_BEFORE = ("INSERT", "UPDATE", "DELETE", "REPLACE", "WITH")


class _Connection:
    """The engine's one connection: statements go to the held database; a transaction is
    the savepoint ``awm_tx`` (inside the call's own savepoint)."""

    def __init__(self) -> None:
        self.isolation_level: str | None = ""
        self.autocommit = False
        self.row_factory = None
        self.text_factory = str
        self._tx: apsw.Connection | None = None  # the connection awm_tx is open on

    @property
    def in_transaction(self) -> bool:
        return self._tx is not None

    def begin_if_needed(self, sql: str) -> None:
        """Open the transaction before a statement that writes, as pysqlite's default
        (legacy) transaction control does: before INSERT, UPDATE, DELETE, REPLACE."""
        if self.isolation_level is None or self._tx is _BINDING.conn:
            return
        if not sql.lstrip()[:7].upper().startswith(_BEGINS_BEFORE):
            return
        self._tx = None
        _BINDING.conn.execute(f"SAVEPOINT {_TX}")
        self._tx = _BINDING.conn

    def cursor(self) -> _Cursor:
        return _Cursor(self)

    def execute(self, sql: str, params: Any = None) -> _Cursor:
        return self.cursor().execute(sql, params)

    def commit(self) -> None:
        tx, self._tx = self._tx, None
        if tx is not None and tx is _BINDING.conn:
            try:
                tx.execute(f"RELEASE {_TX}")
            except apsw.Error as exc:
                raise _translate(exc) from exc

    def rollback(self) -> None:
        tx, self._tx = self._tx, None
        if tx is not None and tx is _BINDING.conn:
            try:
                tx.execute(f"ROLLBACK TO {_TX}")
                tx.execute(f"RELEASE {_TX}")
            except apsw.Error as exc:
                raise _translate(exc) from exc

    def close(self) -> None:
        self.rollback()

    def create_function(self, name: str, nargs: int, fn: Callable[..., Any], *,
                        deterministic: bool = False) -> None:
        _BINDING.functions.append((name, nargs, fn, deterministic))
        _BINDING.conn.create_scalar_function(name, fn, nargs, deterministic=deterministic)

    def create_collation(self, name: str, fn: Callable[..., Any] | None) -> None:
        raise DBAPI.NotSupportedError("collations are not supported by the AWM adapter")


_ENGINE: Any = None
_CONNECTION = _Connection()


def _create_engine(*args: Any, **kwargs: Any) -> Any:
    """The code's ``create_engine``: whatever URL it names, the one engine on the held
    database (no file is ever opened by name)."""
    global _ENGINE
    if _ENGINE is None:
        import sqlalchemy
        from sqlalchemy.pool import StaticPool

        _ENGINE = sqlalchemy.create_engine(
            "sqlite://", module=DBAPI, creator=lambda: _CONNECTION, poolclass=StaticPool,
            echo=bool(kwargs.get("echo", False)))
    return _ENGINE


class _LazyProxy(types.ModuleType):
    """A stand-in package: our overrides, else the real module's attributes."""

    def __init__(self, real: types.ModuleType, overrides: dict[str, Any]) -> None:
        super().__init__(real.__name__, real.__doc__)
        self.__dict__["_real"] = real
        self.__dict__.update(overrides)
        self.__dict__["__path__"] = getattr(real, "__path__", [])
        self.__dict__["__file__"] = getattr(real, "__file__", None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_real"], name)


def _stand_ins() -> dict[str, types.ModuleType]:
    import sqlalchemy
    import sqlalchemy.engine

    return {
        "datetime": _DATETIME, "_datetime": _DATETIME,
        "time": _shim_module("time", _time, dict(_FROZEN_TIME)),
        "random": _shim_module("random", _random, {
            **{n: _bound_rng(n) for n in _RANDOM_NAMES},
            "Random": _SeededRandom, "SystemRandom": _SeededRandom}),
        "secrets": _shim_module("secrets", secrets, {
            "token_bytes": _token_bytes,
            "token_hex": lambda n=None: _token_bytes(n).hex(),
            "token_urlsafe": lambda n=None: base64.urlsafe_b64encode(
                _token_bytes(n)).rstrip(b"=").decode(),
            "randbelow": lambda n: _CLOCK.rng.randrange(n),
            "choice": lambda seq: _CLOCK.rng.choice(seq),
            "randbits": lambda k: _CLOCK.rng.getrandbits(k),
            "SystemRandom": _SeededRandom}),
        "uuid": _shim_module("uuid", _uuid, {"uuid4": _uuid4, "uuid1": _uuid1}),
        "sqlalchemy": _LazyProxy(sqlalchemy, {"create_engine": _create_engine}),
        "sqlalchemy.engine": _LazyProxy(sqlalchemy.engine, {"create_engine": _create_engine}),
    }


def _importer(stand_ins: dict[str, types.ModuleType]) -> Callable[..., Any]:
    real_import = builtins.__import__

    def _import(name: str, globals: Any = None, locals: Any = None,
                fromlist: Sequence[str] | None = (), level: int = 0) -> Any:
        if level == 0:
            if name.partition(".")[0] in REFUSED_MODULES:
                raise ImportError(f"{name}: generated AWM code may not use it (it reaches "
                                  "the machine's clock and entropy around the frozen ones)",
                                  name=name)
            if name in stand_ins and (fromlist or "." not in name):
                return stand_ins[name]
            top = name.partition(".")[0]
            if not fromlist and top in stand_ins:
                real_import(name, globals, locals, fromlist, level)
                return stand_ins[top]
        return real_import(name, globals, locals, fromlist, level)

    return _import


def _code_import() -> Callable[..., Any]:
    """The code's ``__import__``: the stand-ins, also by ``builtins.__import__``,
    ``importlib.import_module`` and ``importlib.__import__``."""
    stand_ins = _stand_ins()
    hook = _importer(stand_ins)

    def import_module(name: str, package: str | None = None) -> types.ModuleType:
        if name.startswith("."):
            name = importlib.util.resolve_name(name, package)
        module: types.ModuleType = hook(name, None, None, ("__name__",), 0)
        return module

    stand_ins["builtins"] = _shim_module("builtins", builtins, {"__import__": hook})
    stand_ins["importlib"] = _LazyProxy(importlib, {"import_module": import_module,
                                                    "__import__": hook})
    return hook


def _inline_threads() -> None:
    """FastAPI runs sync endpoints and dependencies in anyio's worker threads; here they
    run inline (a thread left running would retire the worker, and calls are serial)."""

    async def run_sync(func: Callable[..., Any], *args: Any, **_: Any) -> Any:
        return func(*args)

    anyio.to_thread.run_sync = run_sync  # type: ignore[assignment]


# --- the app ----------------------------------------------------------------------------


class AwmApp(App):
    """One scenario's routes as tools (``compile_tools``; built when the worker loads)."""

    def __init__(self, service: str, code: str) -> None:
        super().__init__(service=service, name=NAME, version=VERSION)
        self.code = code
        _require_extra()
        os.environ["DATABASE_PATH"] = "sqlite://"  # never a file, whatever the code reads
        _inline_threads()
        _freeze_process()
        self.loop = _virtual_time_loop()
        module = types.ModuleType(f"awm_scenario_{service}")
        module.__file__ = f"<awm scenario {service}>"
        scope = module.__dict__
        scope["__builtins__"] = {**vars(builtins), "__import__": _code_import()}
        sys.modules[module.__name__] = module  # pydantic resolves annotations through it
        with warnings.catch_warnings():  # FastAPI deprecates `example=`, which AWM uses
            warnings.simplefilter("ignore")
            exec(compile(code, module.__file__, "exec"), scope)
        fastapi_app = scope.get("app")
        from fastapi import FastAPI

        if not isinstance(fastapi_app, FastAPI):
            raise TypeError("the scenario's code does not define `app = FastAPI(...)`")
        self.fastapi = fastapi_app
        self._tools = {t.info.name: t for t in _tools_of(self)}
        for tool in self._tools.values():
            self.tools[tool.spec.name] = tool.spec

    def compile_tools(self) -> dict[str, AwmTool]:
        return dict(self._tools)

    def request(self, method: str, path: str, query: list[tuple[str, str]],
                body: bytes | None, extra_headers: Sequence[tuple[str, str]] = ()
                ) -> tuple[int, bytes]:
        """One HTTP request handled by the app in this process: its status and body."""
        headers = [(b"host", b"awm"), (b"accept", b"application/json"),
                   *((k.lower().encode("latin-1"), v.encode("latin-1"))
                     for k, v in extra_headers)]
        if body is not None:
            headers += [(b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())]
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1", "method": method.upper(), "scheme": "http",
            "path": path, "raw_path": path.encode(), "root_path": "",
            "query_string": urllib.parse.urlencode(query).encode(), "headers": headers,
            "client": ("127.0.0.1", 1), "server": ("awm", 80), "state": {},
        }
        sent = False
        status: list[int] = []
        chunks: list[bytes] = []

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body or b"", "more_body": False}
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status.append(int(message["status"]))
            elif message["type"] == "http.response.body":
                chunks.append(bytes(message.get("body", b"")))

        try:
            self.loop.run_until_complete(self.fastapi(scope, receive, send))
        except (Exception, SystemExit):  # the code's bug: starlette answered 500
            log.debug("AWM route %s %s failed", method, path, exc_info=True)
            if not status:
                return 500, b"Internal Server Error"
        return (status[0] if status else 500), b"".join(chunks)


class AwmTool:
    """One route as a tool: the worker calls it as it calls a compiled tool."""

    def __init__(self, spec: ToolSpec, info: ToolInfo) -> None:
        self.spec = spec
        self.info = info

    def call(self, connect: Connect, arguments: dict[str, Any], context: CallContext
             ) -> ToolResult:
        _CLOCK.set(context.clock)
        try:
            result = execute_tool(connect(), self.spec, {"arguments": arguments}, context)
        except Exception as exc:
            return tool_failure(self.info.name, exc)
        assert isinstance(result, ToolResult)
        return result


def _route_runner(app: AwmApp, operation_id: str, method: str, path: str,
                  parameters: list[dict[str, Any]]) -> Callable[..., ToolResult]:
    """The tool function of one route: fastapi-mcp's ``_execute_api_tool`` without HTTP."""

    def run(ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
        args = dict(arguments)
        url = path
        for param in parameters:
            name = param.get("name")
            if param.get("in") == "path" and name in args:
                url = url.replace(f"{{{name}}}", _wire(args.pop(name)))
        query: list[tuple[str, str]] = []
        headers: list[tuple[str, str]] = []
        for param in parameters:
            name = param.get("name")
            if param.get("in") in ("query", "header") and name in args:
                value = args.pop(name)
                if value is None:
                    continue
                if param.get("in") == "header":
                    headers.append((str(name), _wire(value)))
                    continue
                values = value if isinstance(value, list) else [value]
                query.extend((str(name), _wire(v)) for v in values)
        body = json.dumps(args).encode() if args else None
        _BINDING.bind(ctx.db)
        try:
            status, raw = app.request(method, url, query, body, headers)
        finally:
            _CONNECTION.rollback()  # what the code left uncommitted, as a server's session
            _BINDING.unbind()
        text = raw.decode("utf-8", "replace")
        try:
            parsed = json.loads(raw)
            shown = json.dumps(parsed, indent=2, ensure_ascii=False)
        except ValueError:
            parsed, shown = None, text
        if 400 <= status < 600:
            return ToolResult(True, f"Error calling {operation_id}. Status code: {status}. "
                                    f"Response: {text}")
        return ToolResult(False, shown, parsed if isinstance(parsed, dict) else None)

    run.__name__ = operation_id
    return run


def _wire(value: Any) -> str:
    """A parameter value in a URL as httpx writes it."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    return "" if value is None else str(value)


def _tools_of(app: AwmApp) -> list[AwmTool]:
    """fastapi-mcp's ``convert_openapi_to_mcp_tools`` on the app's OpenAPI document."""
    openapi = app.fastapi.openapi()
    resolved = _resolve(openapi, openapi)
    tools: list[AwmTool] = []
    seen: set[str] = set()
    for path, path_item in resolved.get("paths", {}).items():
        for method, operation in path_item.items():
            operation_id = operation.get("operationId") if method in METHODS else None
            if not operation_id:
                continue
            if operation_id in seen:
                raise ValueError(f"two routes have the operation_id {operation_id!r}")
            seen.add(operation_id)
            description = _describe(method, path, operation)
            schema = _input_schema(operation_id, operation)
            parameters = list(operation.get("parameters", []))
            spec = ToolSpec(app.service, operation_id,
                            _route_runner(app, operation_id, method, path, parameters),
                            description, True)
            # Every route may write; a GET usually does not, so it reads first.
            tools.append(AwmTool(spec, ToolInfo(spec.full_name, description, schema, None,
                                                True, reads_first=method == "get")))
    return sorted(tools, key=lambda t: t.info.name)


def _describe(method: str, path: str, operation: dict[str, Any]) -> str:
    summary = operation.get("summary", "")
    description = operation.get("description", "")
    text = f"{summary}" if summary else f"{method.upper()} {path}"
    if description:
        text += f"\n\n{description}"
    responses = operation.get("responses", {})
    if not responses:
        return text
    info = "\n\n### Responses:\n"
    success_code = next((c for c in range(200, 300) if str(c) in responses), None)
    success = responses[str(success_code)] if success_code is not None else None
    chosen = {str(success_code): success} if success is not None else responses
    for code, data in chosen.items():
        info += f"\n**{code}**: {data.get('description', '')}"
        if data == success:
            info += " (Success Response)"
        for content_type, content in data.get("content", {}).items():
            if "schema" not in content:
                continue
            info += f"\nContent-Type: {content_type}"
            display = _clean(content["schema"])
            example = None
            if "examples" in content:
                for item in content["examples"].values():
                    if "value" in item:
                        example = item["value"]
                        break
            elif "example" in content:
                example = content["example"]
            if not example:
                example = _example(display)
            if example:
                info += "\n\n**Example Response:**\n```json\n"
                info += json.dumps(example, indent=2)
                info += "\n```"
    return text + info


def _input_schema(operation_id: str, operation: dict[str, Any]) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    required: list[str] = []
    params = operation.get("parameters", [])
    groups: list[tuple[str, dict[str, Any], bool]] = []
    for where, default_required in (("path", True), ("query", False)):
        for param in params:
            if param.get("in") == where:
                groups.append((param.get("name"), param,
                               param.get("required", default_required)))
    body = operation.get("requestBody", {})
    if body and "content" in body:
        content_type = next(iter(body["content"]), None)
        if content_type and "schema" in body["content"][content_type]:
            schema = body["content"][content_type]["schema"]
            for name, prop in schema.get("properties", {}).items():
                groups.append((name, {"name": name, "schema": prop},
                               name in schema.get("required", [])))
    for name, param, is_required in groups:
        prop_schema = param.get("schema", {})
        prop = dict(prop_schema)
        prop["title"] = name
        if param.get("description", ""):
            prop["description"] = param["description"]
        if "type" not in prop:
            prop["type"] = (prop_schema.get("type", "string") if param.get("in") == "path"
                            else _single_type(prop_schema))
        if "default" in prop_schema:
            prop["default"] = prop_schema["default"]
        properties[name] = prop
        if is_required:
            required.append(name)
    schema_out: dict[str, Any] = {"type": "object", "properties": properties,
                                  "title": f"{operation_id}Arguments"}
    if required:
        schema_out["required"] = required
    return schema_out


def _single_type(schema: dict[str, Any]) -> str:
    if "anyOf" in schema:
        found = [s.get("type") for s in schema["anyOf"] if s.get("type")]
        kinds = [k for k in dict.fromkeys(found) if k != "null"]
        return str(kinds[0]) if kinds else "string"
    return str(schema.get("type", "string"))


def _resolve(part: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    part = dict(part)
    ref = part.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
        found = reference.get("components", {}).get("schemas", {}).get(ref.split("/")[-1])
        if found is not None:
            part.pop("$ref")
            part.update(dict(found))
    for key, value in part.items():
        if isinstance(value, dict):
            part[key] = _resolve(value, reference)
        elif isinstance(value, list):
            part[key] = [_resolve(v, reference) if isinstance(v, dict) else v for v in value]
    return part


def _clean(schema: dict[str, Any]) -> dict[str, Any]:
    schema = dict(schema)
    for name in ("allOf", "anyOf", "oneOf", "nullable", "discriminator", "readOnly",
                 "writeOnly", "xml", "externalDocs"):
        schema.pop(name, None)
    if "properties" in schema:
        schema["properties"] = {k: _clean(v) if isinstance(v, dict) else v
                                for k, v in schema["properties"].items()}
    if schema.get("type") == "array" and isinstance(schema.get("items"), dict):
        schema["items"] = _clean(schema["items"])
    return schema


def _example(schema: Any) -> Any:
    if not schema or not isinstance(schema, dict):
        return None
    kind = schema.get("type")
    if kind == "object":
        out = {}
        for name, prop in schema.get("properties", {}).items():
            value = _example(prop)
            if value is not None:
                out[name] = value
        return out
    if kind == "array":
        if "items" in schema:
            item = _example(schema["items"])
            if item is not None:
                return [item]
        return []
    if kind == "string":
        return {"date-time": "2023-01-01T00:00:00Z", "date": "2023-01-01",
                "email": "user@example.com", "uri": "https://example.com"}.get(
            schema.get("format", ""), schema.get("title", "string"))
    return {"integer": 1, "number": 1.0, "boolean": True}.get(str(kind))

