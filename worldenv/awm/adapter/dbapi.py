"""SQLAlchemy on the held apsw connection: a DBAPI-2 shim (``DBAPI``) whose one connection
is the database the worker holds for the current call, and the code's ``create_engine``."""

from __future__ import annotations

import datetime as _dt
import decimal
import types
from collections.abc import Callable, Sequence
from typing import Any

import apsw

__all__ = ["BINDING", "CONNECTION", "DBAPI", "create_engine"]


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


BINDING = _Binding()


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
        conn = BINDING.conn
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
        if self.isolation_level is None or self._tx is BINDING.conn:
            return
        if not sql.lstrip()[:7].upper().startswith(_BEGINS_BEFORE):
            return
        self._tx = None
        BINDING.conn.execute(f"SAVEPOINT {_TX}")
        self._tx = BINDING.conn

    def cursor(self) -> _Cursor:
        return _Cursor(self)

    def execute(self, sql: str, params: Any = None) -> _Cursor:
        return self.cursor().execute(sql, params)

    def commit(self) -> None:
        tx, self._tx = self._tx, None
        if tx is not None and tx is BINDING.conn:
            try:
                tx.execute(f"RELEASE {_TX}")
            except apsw.Error as exc:
                raise _translate(exc) from exc

    def rollback(self) -> None:
        tx, self._tx = self._tx, None
        if tx is not None and tx is BINDING.conn:
            try:
                tx.execute(f"ROLLBACK TO {_TX}")
                tx.execute(f"RELEASE {_TX}")
            except apsw.Error as exc:
                raise _translate(exc) from exc

    def close(self) -> None:
        self.rollback()

    def create_function(self, name: str, nargs: int, fn: Callable[..., Any], *,
                        deterministic: bool = False) -> None:
        BINDING.functions.append((name, nargs, fn, deterministic))
        BINDING.conn.create_scalar_function(name, fn, nargs, deterministic=deterministic)

    def create_collation(self, name: str, fn: Callable[..., Any] | None) -> None:
        raise DBAPI.NotSupportedError("collations are not supported by the AWM adapter")


_ENGINE: Any = None
CONNECTION = _Connection()


def create_engine(*args: Any, **kwargs: Any) -> Any:
    """The code's ``create_engine``: whatever URL it names, the one engine on the held
    database (no file is ever opened by name)."""
    global _ENGINE
    if _ENGINE is None:
        import sqlalchemy
        from sqlalchemy.pool import StaticPool

        _ENGINE = sqlalchemy.create_engine(
            "sqlite://", module=DBAPI, creator=lambda: CONNECTION, poolclass=StaticPool,
            echo=bool(kwargs.get("echo", False)))
    return _ENGINE
