"""The frozen clock and entropy of an AWM worker: stand-in ``datetime``, ``time``,
``random``, ``secrets`` and ``uuid`` functions that read the call's clock and seed, the
process-wide freeze (``freeze_process``), the refused modules, and the event loop whose
timers move the call's clock instead of sleeping."""

from __future__ import annotations

import _random as _c_random
import asyncio
import datetime as _dt
import importlib
import importlib.abc
import importlib.util
import os
import random as _random
import selectors
import sys
import time as _time
import types
import uuid as _uuid
from collections.abc import Callable
from typing import Any

from worldenv.core.contract import CallClock

__all__ = [
    "CLOCK",
    "DATETIME",
    "FROZEN_TIME",
    "RANDOM_NAMES",
    "REFUSED_MODULES",
    "SeededRandom",
    "bound_rng",
    "freeze_process",
    "shim_module",
    "token_bytes",
    "uuid1",
    "uuid4",
    "virtual_time_loop",
]

_EPOCH_MS = 0  # the clock at module level, before any call: deterministic, never the machine's

# The real functions the frozen ones are made of, taken before ``freeze_process`` replaces
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


CLOCK = _Clock()


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
        utc = CLOCK.utc()
        return utc.replace(tzinfo=None) if tz is None else utc.astimezone(tz)

    @classmethod
    def utcnow(cls) -> _dt.datetime:  # type: ignore[override]
        return CLOCK.utc().replace(tzinfo=None)

    @classmethod
    def today(cls) -> _dt.datetime:  # type: ignore[override]
        return CLOCK.utc().replace(tzinfo=None)


class _FrozenDate(_dt.date, metaclass=_RealTypeMeta):
    _real = _dt.date
    __get_pydantic_core_schema__ = _pydantic_as(_dt.date)

    @classmethod
    def today(cls) -> _dt.date:  # type: ignore[override]
        return CLOCK.utc().date()


def shim_module(name: str, real: types.ModuleType, overrides: dict[str, Any]
                 ) -> types.ModuleType:
    module = types.ModuleType(name, real.__doc__)
    module.__dict__.update({k: v for k, v in vars(real).items() if not k.startswith("__")})
    module.__dict__.update(overrides)
    return module


# The datetime module generated code imports (``import``, ``__import__``, ``importlib``).
# The C type itself cannot be changed, and libraries subclass it (pydantic.v1 with a
# metaclass of its own), so the real module stays the process's.
DATETIME = shim_module("datetime", _dt, {"datetime": _FrozenDatetime, "date": _FrozenDate})


def _time_time() -> float:
    return CLOCK.seconds()


def _time_ns() -> int:
    return CLOCK.nanos()


def _clock_gettime(clk_id: int) -> float:
    return CLOCK.seconds()


def _clock_gettime_ns(clk_id: int) -> int:
    return CLOCK.nanos()


def _cpu_time() -> float:
    return CLOCK.advance


def _cpu_time_ns() -> int:
    return round(CLOCK.advance * 1e9)


def _sleep(seconds: float) -> None:
    """A sleep takes no time: the call's clocks move on by `seconds`."""
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    CLOCK.advance += float(seconds)


def _struct_now(t: float | None = None) -> _time.struct_time:
    return _GMTIME(_time_time() if t is None else t)


def _strftime(fmt: str, t: Any = None) -> str:
    return _STRFTIME(fmt, _struct_now() if t is None else t)


def _ctime(t: float | None = None) -> str:
    return _ASCTIME(_struct_now(t))


def _asctime(t: Any = None) -> str:
    return _ASCTIME(_struct_now() if t is None else t)


# The time module's readings of any clock, frozen (in the module itself: ``freeze_process``).
FROZEN_TIME: dict[str, Callable[..., Any]] = {
    "time": _time_time, "time_ns": _time_ns,
    "monotonic": _time_time, "monotonic_ns": _time_ns,
    "perf_counter": _time_time, "perf_counter_ns": _time_ns,
    "clock_gettime": _clock_gettime, "clock_gettime_ns": _clock_gettime_ns,
    "process_time": _cpu_time, "process_time_ns": _cpu_time_ns,
    "thread_time": _cpu_time, "thread_time_ns": _cpu_time_ns,
    "sleep": _sleep, "localtime": _struct_now, "gmtime": _struct_now,
    "strftime": _strftime, "ctime": _ctime, "asctime": _asctime,
}


def uuid4() -> _uuid.UUID:
    return _uuid.UUID(int=CLOCK.rng.getrandbits(128), version=4)


def uuid1(node: int | None = None, clock_seq: int | None = None) -> _uuid.UUID:
    return uuid4()


def _generate_time_safe() -> tuple[bytes, int]:
    return uuid1().bytes, 0  # (libuuid's answer: the bytes, and "safe")


def _getnode() -> int:
    return CLOCK.rng.getrandbits(48) | (1 << 40)  # a random node id has its multicast bit


RANDOM_NAMES = ("random", "randint", "randrange", "choice", "choices", "shuffle", "sample",
                 "uniform", "gauss", "normalvariate", "getrandbits", "randbytes",
                 "triangular", "betavariate", "expovariate", "seed")


class SeededRandom(_random.Random):
    """``random.Random()`` / ``SystemRandom()`` without a seed: seeded by the call."""

    def __init__(self, x: Any = None) -> None:
        super().__init__(CLOCK.seed if x is None else x)


def token_bytes(nbytes: int | None = None) -> bytes:
    return CLOCK.rng.randbytes(32 if nbytes is None else nbytes)


def _urandom(size: int) -> bytes:
    if size < 0:
        raise ValueError("negative argument not allowed")
    return CLOCK.rng.randbytes(size)


def _getrandom(size: int, flags: int = 0) -> bytes:
    return _urandom(size)


def _seed_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """A C-level generator seeded with nothing (the OS's entropy) takes the call's draw."""
    return (CLOCK.rng.getrandbits(128),) if not args or args[0] is None else args


def _c_random_init(self: Any, *args: Any) -> None:
    _C_RANDOM_INIT(self, *_seed_args(args))


def _c_random_seed(self: Any, *args: Any) -> None:
    _C_RANDOM_SEED(self, *_seed_args(args))


def bound_rng(name: str) -> Callable[..., Any]:
    def draw(*args: Any, **kwargs: Any) -> Any:
        return getattr(CLOCK.rng, name)(*args, **kwargs)
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


def freeze_process() -> None:
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

    for name, frozen in FROZEN_TIME.items():
        setattr(_time, name, frozen)
    for module in (os, posix):
        module.urandom = _urandom  # type: ignore[attr-defined]
        module.getrandom = _getrandom  # type: ignore[attr-defined]
    _random._urandom = _urandom  # type: ignore[attr-defined]  # SystemRandom, secrets
    # random.Random() and _random.Random() seeded with nothing (tempfile's names, say)
    _c_random.Random.__init__ = _c_random_init  # type: ignore[method-assign]
    _c_random.Random.seed = _c_random_seed  # type: ignore[method-assign]
    _uuid.uuid1, _uuid.uuid4, _uuid.getnode = uuid1, uuid4, _getnode
    _uuid._generate_time_safe = None  # type: ignore[attr-defined]  # libuuid's clock
    libuuid = sys.modules.get("_uuid")  # (where Python was built with it)
    if libuuid is not None:
        libuuid.generate_time_safe = _generate_time_safe  # type: ignore[attr-defined]
    for module in (ssl, _ssl):
        module.RAND_bytes = token_bytes  # type: ignore[attr-defined]
    # tempfile finds its directory once per process, by writing files of drawn names: now,
    # so that no call's draws depend on whether a call before it (another instance's) did.
    tempfile.gettempdir()
    sys.meta_path.insert(0, _RefusedImport())
    _reseed_process(CLOCK.seed)


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
        CLOCK.advance += timeout
        return ready


def virtual_time_loop() -> asyncio.AbstractEventLoop:
    """The event loop the routes run on: its time is the frozen ``time.monotonic``, moved
    on by ``_VirtualTimeSelector``. A timer counts as due within a millisecond of its
    time: the clock reads the epoch in seconds, whose float steps are coarser than the
    loop's nanosecond resolution, so a timer could otherwise stay a step short for ever."""
    loop = asyncio.SelectorEventLoop(_VirtualTimeSelector())
    loop._clock_resolution = 1e-3  # type: ignore[attr-defined]
    return loop
