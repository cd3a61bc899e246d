"""SQLite connections for worlds: a frozen clock, seeded randomness, and guards.

Every database of a world is opened through apsw, whose bundled SQLite is pinned with the
project, so replay and hashing run the same SQL engine on every machine.

* Clock: databases that events write are opened on the ``agentworlds-frozen`` VFS, whose
  current time is whatever the caller froze for this thread (the event's ``ts``).
  ``CURRENT_TIMESTAMP``, ``datetime('now')``, ``unixepoch()``... all read it.
* Randomness: ``random()`` and ``randomblob(n)`` are replaced by functions drawing from
  xxh3 in counter mode, seeded with the applying event's id.
* Guards: an authorizer refuses ATTACH/DETACH, transaction control, and pragmas other
  than ``user_version`` / ``application_id`` (reading schema pragmas is allowed); the
  reason is kept so the error can say why.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import apsw
import xxhash

FROZEN_VFS = "agentworlds-frozen"
_JULIAN_EPOCH_MS = 210866760000000  # Unix epoch as Julian-day milliseconds
_DEFAULT_MS = 946684800000  # 2000-01-01T00:00:00Z, used when nothing was frozen
_ALLOWED_PRAGMAS = frozenset({"user_version", "application_id"})
_READ_PRAGMAS = frozenset({
    "table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
    "foreign_key_list", "database_list", "collation_list", "function_list",
})


class _ThreadClock(threading.local):
    millis: int = _DEFAULT_MS
    seed: bytes = b""
    counter: int = 0
    denied: str | None = None


_STATE = _ThreadClock()


class _FrozenVFS(apsw.VFS):
    def __init__(self) -> None:
        super().__init__(FROZEN_VFS, "")

    def xCurrentTimeInt64(self) -> int:
        return _STATE.millis + _JULIAN_EPOCH_MS

    def xCurrentTime(self) -> float:
        return (_STATE.millis + _JULIAN_EPOCH_MS) / 86400000.0


_VFS: _FrozenVFS | None = None
_VFS_LOCK = threading.Lock()


def _ensure_vfs() -> None:
    global _VFS
    with _VFS_LOCK:
        if _VFS is None:
            _VFS = _FrozenVFS()


def freeze(millis: int, seed: str) -> None:
    """Freeze this thread's SQLite clock and seed its randomness (one event's worth)."""
    _STATE.millis = millis
    _STATE.seed = seed.encode()
    _STATE.counter = 0
    _STATE.denied = None


def _next_block() -> bytes:
    _STATE.counter += 1
    return xxhash.xxh3_128_digest(_STATE.seed + _STATE.counter.to_bytes(8, "little"))


def _random() -> int:
    return int.from_bytes(_next_block()[:8], "little", signed=True)


def _randomblob(n: object) -> bytes:
    size = max(1, int(n)) if isinstance(n, int | float) else 1
    out = bytearray()
    while len(out) < size:
        out += _next_block()
    return bytes(out[:size])


def take_denial() -> str | None:
    reason, _STATE.denied = _STATE.denied, None
    return reason


def _authorizer(op: int, p1: str | None, p2: str | None, db: str | None,
                trigger: str | None) -> int:
    reason = None
    if op in (apsw.SQLITE_ATTACH, apsw.SQLITE_DETACH):
        reason = "ATTACH/DETACH is not allowed: an event writes only its own service"
    elif op in (apsw.SQLITE_TRANSACTION, apsw.SQLITE_SAVEPOINT):
        reason = "transaction control is not allowed: a persona-day is one transaction"
    elif op == apsw.SQLITE_PRAGMA:
        name = (p1 or "").lower()
        if name in _ALLOWED_PRAGMAS or name in _READ_PRAGMAS:  # the latter only read
            return apsw.SQLITE_OK
        reason = f"PRAGMA {p1} is not allowed (only user_version and application_id)"
    elif op == apsw.SQLITE_FUNCTION and (p2 or "").lower() == "load_extension":
        reason = "load_extension() is not allowed"
    if reason is None:
        return apsw.SQLITE_OK
    _STATE.denied = reason
    return apsw.SQLITE_DENY


def frozen_vfs() -> str:
    """The frozen-clock VFS's name, registering it first: another VFS built on it (its
    `base`) keeps the frozen clock."""
    _ensure_vfs()
    return FROZEN_VFS


def open_event_db(path: Path, *, vfs: str = FROZEN_VFS) -> apsw.Connection:
    """Open (creating) a service database for applying events, with every guard on. `vfs`
    is FROZEN_VFS or one built on it (``frozen_vfs()``), or the clock is not frozen."""
    _ensure_vfs()
    conn = apsw.Connection(
        str(path), flags=apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE, vfs=vfs
    )
    conn.create_scalar_function("random", _random, 0)  # type: ignore[arg-type]
    conn.create_scalar_function("randomblob", _randomblob, 1)  # type: ignore[arg-type]
    conn.authorizer = _authorizer
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
    return conn


@contextlib.contextmanager
def open_readonly(path: Path) -> Iterator[apsw.Connection]:
    uri = f"file:{path.resolve().as_posix()}?mode=ro"
    conn = apsw.Connection(uri, flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
    try:
        yield conn
    finally:
        conn.close()


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
