"""The SQLAlchemy store: SQLite (embedded default) and PostgreSQL, one code path. It keeps
both contracts of worldstore/store.py (EventStore and EpisodeStore) in one database.

The database enforces append-only order: the primary key (persona, seq) of ``events`` and
(persona, day) of ``days`` turn a racing append into an integrity error, and the guarded
update of ``personas`` (WHERE last_seq = expected) turns it into a ConflictError before
that. Driver errors are translated here and nowhere else.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy import event as sa_event
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Connection, Engine

from worldstore.errors import ConflictError, DayOrderError, NotFoundError, StoreError
from worldstore.events import EventRow, StoredEvent
from worldstore.schema import blobs, claims, days, episodes, events, metadata, personas
from worldstore.store import (
    ClaimRecord,
    ClaimState,
    DayRecord,
    EpisodeRecord,
    NewDay,
    PersonaSummary,
    WorldStore,
)

WRITE_OPTION = "worldstore_write"
EVENT_PAGE = 5000
_WAL_ATTEMPTS = 600  # ~60 s in all, the same patience as the busy timeout
_EVENT_COLUMNS = (  # what events() reads (persona is the one asked for)
    events.c.seq, events.c.day, events.c.ts, events.c.prev,
    events.c.event_id, events.c.schema_version, events.c.body,
)
_EVENT_INSERT_COLUMNS = (  # what append_day writes: _event_values
    events.c.persona, events.c.seq, events.c.day, events.c.ts, events.c.prev,
    events.c.event_id, events.c.schema_version, events.c.body,
)
_EVENT_ROW_COLUMNS = (  # what event_pages() reads: an EventRow
    events.c.seq, events.c.day, events.c.ts, events.c.event_id, events.c.schema_version,
    events.c.body,
)


def _enter_wal(dbapi_conn: Any) -> None:
    # Switching a fresh database to WAL needs an exclusive lock, and SQLite returns BUSY for
    # it without consulting the busy handler when another process is switching it at the
    # same moment; so retry here (bounded) instead of failing a racing first open.
    for attempt in range(_WAL_ATTEMPTS):
        try:
            dbapi_conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            if attempt == _WAL_ATTEMPTS - 1:
                raise
            time.sleep(min(0.005 * (attempt + 1), 0.1))


def _sqlite_engine(path: Path) -> Engine:
    engine = sa.create_engine(f"sqlite:///{path}", connect_args={"timeout": 60})

    @sa_event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
        _enter_wal(dbapi_conn)
        dbapi_conn.execute("PRAGMA synchronous=NORMAL")
        dbapi_conn.execute("PRAGMA foreign_keys=ON")

    @sa_event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # Writers take the write lock up front (IMMEDIATE), so two appenders queue instead
        # of deadlocking on a lock upgrade; readers use WAL snapshots and never wait.
        write = conn.get_execution_options().get(WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


def create_engine_for(url: str) -> Engine:
    if url.startswith(("postgresql://", "postgresql+psycopg://", "postgres://")):
        if url.startswith("postgres://"):
            url = "postgresql://" + url[len("postgres://"):]
        if url.startswith("postgresql://"):
            url = "postgresql+psycopg://" + url[len("postgresql://"):]
        return sa.create_engine(url, pool_pre_ping=True)
    return _sqlite_engine(Path(url))


def _upsert(table: sa.Table, is_pg: bool) -> Any:
    """The dialect's INSERT (with ON CONFLICT). PostgreSQL's dialect is imported only for a
    PostgreSQL store: it costs a tenth of a second of start-up that SQLite stores skip."""
    if is_pg:
        from sqlalchemy.dialects import postgresql

        return postgresql.insert(table)
    return sqlite.insert(table)


class SqlEventStore(WorldStore):
    """The event store and the episode store of one SQLite or PostgreSQL database."""

    def __init__(self, engine: Engine, url: str) -> None:
        self.engine = engine
        self.writer = engine.execution_options(**{WRITE_OPTION: True})
        self.url = url
        self._is_pg = engine.dialect.name == "postgresql"
        self._reader = None if self._is_pg else _SqliteReader(str(engine.url.database))

    # --- writes ---------------------------------------------------------------------

    def append_day(self, new: NewDay, *, expected_last_seq: int) -> None:
        rec = new.record
        if rec.first_seq != expected_last_seq + 1:
            raise StoreError(
                f"{rec.persona}@{rec.day}: first_seq {rec.first_seq} does not follow "
                f"expected_last_seq {expected_last_seq}"
            )
        try:
            with self.writer.begin() as conn:
                self._claim_stream(conn, new, expected_last_seq)
                self._insert_blobs(conn, new.blobs)
                # Straight to the driver: SQLAlchemy's per-row parameter handling cost
                # more than the insert itself.
                conn.exec_driver_sql(self._events_insert_sql,
                                     [_event_values(e) for e in new.events])
                conn.execute(days.insert(), [_day_row(rec)])
        except sa.exc.IntegrityError as exc:
            raise ConflictError(
                f"{rec.persona}@{rec.day}: the append collides with stored events of persona "
                f"{rec.persona!r} (another writer appended at the same time, or the day "
                f"repeats a seq); nothing was written [{type(exc.orig).__name__}]"
            ) from None
        except sa.exc.OperationalError as exc:
            raise StoreError(f"{rec.persona}@{rec.day}: store error, nothing written: "
                             f"{exc.orig}") from None

    def _claim_stream(self, conn: Connection, new: NewDay, expected_last_seq: int) -> None:
        rec = new.record
        current = conn.execute(
            sa.select(personas).where(personas.c.persona == rec.persona)
            .with_for_update() if self._is_pg else
            sa.select(personas).where(personas.c.persona == rec.persona)
        ).mappings().first()
        if current is not None and rec.day <= current["last_day"]:
            exists = conn.execute(
                sa.select(days.c.day).where(days.c.persona == rec.persona, days.c.day == rec.day)
            ).first()
            last_day = current["last_day"]
            what = "already exists" if exists else f"is not after the last day {last_day}"
            raise DayOrderError(f"{rec.persona}@{rec.day} {what}; days are append-only")
        values = dict(
            last_day=rec.day, last_seq=rec.last_seq, last_ts=rec.last_ts, head=rec.head,
            world_hash=rec.world_hash,
        )
        if current is None:
            if expected_last_seq != -1:
                raise ConflictError(f"persona {rec.persona!r} does not exist any more")
            conn.execute(personas.insert().values(
                persona=rec.persona, first_day=rec.day, n_days=1, **values))
            return
        if current["last_seq"] != expected_last_seq:
            raise ConflictError(
                f"{rec.persona}@{rec.day}: persona {rec.persona!r} ends at seq "
                f"{current['last_seq']}, not {expected_last_seq}: another writer appended "
                "first; nothing was written"
            )
        result = conn.execute(
            personas.update()
            .where(personas.c.persona == rec.persona, personas.c.last_seq == expected_last_seq)
            .values(n_days=personas.c.n_days + 1, **values)
        )
        if result.rowcount != 1:
            raise ConflictError(f"{rec.persona}@{rec.day}: lost a race on persona "
                                f"{rec.persona!r}; nothing was written")

    def _insert_blobs(self, conn: Connection, items: dict[str, bytes]) -> None:
        if not items:
            return
        rows = [{"digest": d, "size": len(b), "data": b} for d, b in sorted(items.items())]
        insert = _upsert(blobs, self._is_pg)
        conn.execute(insert.on_conflict_do_nothing(index_elements=["digest"]), rows)

    # --- reads ----------------------------------------------------------------------

    def personas(self) -> list[PersonaSummary]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(personas).order_by(personas.c.persona)).mappings()
            # Sorted here too: ORDER BY follows the database's collation, which on a
            # PostgreSQL created under e.g. en_US puts 'a_b' before 'a-c'; code-point order
            # keeps listings and hash lookups the same on every backend.
            return sorted((_summary(r) for r in rows), key=lambda s: s.persona)

    def persona(self, persona: str) -> PersonaSummary | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(personas).where(personas.c.persona == persona)
            ).mappings().first()
            return _summary(row) if row else None

    def days(self, persona: str) -> list[DayRecord]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(days).where(days.c.persona == persona).order_by(days.c.day)
            ).mappings()
            return [_day_record(r) for r in rows]

    def day(self, persona: str, day: int) -> DayRecord:
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(days).where(days.c.persona == persona, days.c.day == day)
            ).mappings().first()
        if row is None:
            raise NotFoundError(f"{persona}@{day}: no such persona-day in {self.url}")
        return _day_record(row)

    def days_with_hash(self, world_hash: str) -> list[DayRecord]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(days).where(days.c.world_hash == world_hash)
                .order_by(days.c.persona, days.c.day)
            ).mappings()
            # Code-point order whatever the collation (see personas()).
            return sorted((_day_record(r) for r in rows), key=lambda r: (r.persona, r.day))

    def events(self, persona: str, first_seq: int = 0,
               last_seq: int | None = None) -> Iterator[StoredEvent]:
        # (persona is the one asked for: the query matches it exactly, so it is not read
        # back once per row)
        for rows in self._scan(self._events_sql, persona, first_seq, last_seq):
            for seq, day, ts, prev, event_id, schema_version, body in rows:
                yield StoredEvent(
                    persona=persona, seq=seq, day=day, ts=ts, prev=prev, event_id=event_id,
                    schema_version=schema_version, body=bytes(body),
                )

    def event_pages(self, persona: str, first_seq: int = 0,
                    last_seq: int | None = None) -> Iterator[list[EventRow]]:
        # Replay's scan: the driver's rows are the EventRow tuples themselves (no object
        # per event), without the columns replay does not read (persona, prev).
        for rows in self._scan(self._event_rows_sql, persona, first_seq, last_seq):
            if type(rows[0][5]) is not bytes:  # (a driver's buffer type)
                rows = [(*row[:5], bytes(row[5])) for row in rows]
            # (a list of tuples, from either driver: EventRows as they come)
            yield cast("list[EventRow]", rows)

    def _scan(self, sql: str, persona: str, first_seq: int, last_seq: int | None
              ) -> Iterator[list[Any]]:
        """The rows of `sql` (seq first) for `persona`, a page at a time: paged by seq so a
        long stream is never held in memory or in one transaction. The hot path of
        replay: rows come straight from the driver's cursor as tuples."""
        last = last_seq if last_seq is not None else 2**62
        next_seq = first_seq
        while True:
            bound = {"persona": persona, "first": next_seq, "last": last, "page": EVENT_PAGE}
            if self._reader is not None:
                rows = self._reader.rows(sql, bound)
            else:
                with self.engine.connect() as conn:
                    cursor = conn.connection.cursor()
                    try:
                        cursor.execute(sql, bound)
                        rows = cast("list[Any]", cursor.fetchall())
                    finally:
                        cursor.close()
            if rows:
                yield rows
            if len(rows) < EVENT_PAGE:
                return
            next_seq = rows[-1][0] + 1

    @functools.cached_property
    def _events_insert_sql(self) -> str:
        mark = "%s" if self._is_pg else "?"
        names = [c.name for c in _EVENT_INSERT_COLUMNS]
        return (f"INSERT INTO events ({', '.join(names)}) "
                f"VALUES ({', '.join([mark] * len(names))})")

    @functools.cached_property
    def _events_sql(self) -> str:
        return self._scan_sql(_EVENT_COLUMNS)

    @functools.cached_property
    def _event_rows_sql(self) -> str:
        return self._scan_sql(_EVENT_ROW_COLUMNS)

    def _scan_sql(self, columns: tuple[sa.Column[Any], ...]) -> str:
        def param(name: str) -> str:
            return f"%({name})s" if self._is_pg else f":{name}"

        names = ", ".join(c.name for c in columns)
        return (f"SELECT {names} FROM events WHERE persona = {param('persona')} "
                f"AND seq >= {param('first')} AND seq <= {param('last')} "
                f"ORDER BY seq LIMIT {param('page')}")

    def blob(self, digest: str) -> bytes:
        # Replay reads one blob per file event: straight through a driver's cursor, as
        # events() does, since building and compiling a query per blob cost more than it.
        if self._reader is not None:
            found = self._reader.rows(self._blob_sql, {"digest": digest})
            row = found[0] if found else None
        else:
            with self.engine.connect() as conn:
                cursor = conn.connection.cursor()
                try:
                    cursor.execute(self._blob_sql, {"digest": digest})
                    row = cursor.fetchone()
                finally:
                    cursor.close()
        if row is None:
            raise NotFoundError(f"blob {digest} is not in the store {self.url}")
        return bytes(row[0])

    @functools.cached_property
    def _blob_sql(self) -> str:
        digest = "%(digest)s" if self._is_pg else ":digest"
        return f"SELECT data FROM blobs WHERE digest = {digest}"

    def missing_blobs(self, digests: Iterable[str]) -> set[str]:
        wanted = set(digests)
        if not wanted:
            return set()
        with self.engine.connect() as conn:
            found = {
                r[0] for r in conn.execute(
                    sa.select(blobs.c.digest).where(blobs.c.digest.in_(sorted(wanted)))
                )
            }
        return wanted - found

    # --- episodes -------------------------------------------------------------------

    def put_episode(self, record: EpisodeRecord) -> None:
        insert = _upsert(episodes, self._is_pg)
        stmt = insert.on_conflict_do_nothing(index_elements=["episode_id"])
        try:
            with self.writer.begin() as conn:
                if conn.execute(stmt, _episode_row(record)).rowcount == 1:
                    return
                # Already stored (by us earlier, or by a racing writer that committed
                # first): fine if it is the same episode, a conflict otherwise.
                stored = conn.execute(
                    sa.select(episodes).where(episodes.c.episode_id == record.episode_id)
                ).mappings().first()
        except (sa.exc.IntegrityError, sa.exc.OperationalError, sa.exc.DataError) as exc:
            raise StoreError(f"episode {record.episode_id}: store error, nothing written: "
                             f"{exc.orig}") from None
        if stored is not None and _episode_record(stored) == record:
            return
        raise ConflictError(
            f"episode {record.episode_id} is already stored with different contents; "
            "episodes are write-once; nothing was written"
        )

    def episode(self, episode_id: str) -> EpisodeRecord:
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(episodes).where(episodes.c.episode_id == episode_id)
            ).mappings().first()
        if row is None:
            raise NotFoundError(f"episode {episode_id}: no such episode in {self.url}")
        return _episode_record(row)

    def episodes(self, world_hash: str | None = None) -> list[EpisodeRecord]:
        query = sa.select(episodes)
        if world_hash is not None:
            query = query.where(episodes.c.world_hash == world_hash)
        with self.engine.connect() as conn:
            rows = conn.execute(query.order_by(episodes.c.episode_id)).mappings()
            # Code-point order whatever the collation (see personas()).
            return sorted((_episode_record(r) for r in rows), key=lambda r: r.episode_id)

    # --- claims ---------------------------------------------------------------------

    def claim(self, scope: str, key: str, owner: str,
              decide: Callable[[list[ClaimRecord]], tuple[ClaimState, bytes] | None]
              ) -> ClaimRecord | None:
        try:
            with self.writer.begin() as conn:
                if self._is_pg:
                    # SQLite's writers already queue (BEGIN IMMEDIATE); PostgreSQL's take
                    # the table's claim lock, so one decision sees the claims before it.
                    conn.exec_driver_sql("LOCK TABLE claims IN EXCLUSIVE MODE")
                rows = conn.execute(sa.select(claims).where(
                    claims.c.scope == scope)).mappings().all()
                found = sorted((_claim_record(r) for r in rows), key=lambda c: c.key)
                if any(c.key == key for c in found):
                    raise ConflictError(f"claim {key!r} of {scope!r} is taken already; "
                                        "nothing was written")
                decided = decide([c for c in found if c.state != "dropped"])
                if decided is None:
                    return None
                state, body = decided
                if state not in ("open", "dropped"):
                    raise StoreError(f"claim {key!r}: a new claim is open or dropped, not "
                                     f"{state!r}")
                record = ClaimRecord(scope=scope, key=key, owner=owner, state=state,
                                     body=body)
                conn.execute(sa.insert(claims).values(scope=scope, key=key, owner=owner,
                                                      state=state, body=body))
        except (sa.exc.IntegrityError, sa.exc.OperationalError, sa.exc.DataError) as exc:
            raise StoreError(f"claim {key!r} of {scope!r}: store error, nothing written: "
                             f"{exc.orig}") from None
        return record

    def settle(self, scope: str, key: str, state: ClaimState) -> None:
        if state not in ("kept", "dropped"):
            raise StoreError(f"claim {key!r}: a claim is settled as kept or dropped, not "
                             f"{state!r}")
        with self.writer.begin() as conn:
            moved = conn.execute(sa.update(claims).where(
                claims.c.scope == scope, claims.c.key == key, claims.c.state == "open"
            ).values(state=state)).rowcount
        if moved != 1:
            raise NotFoundError(f"claim {key!r} of {scope!r}: no open claim to settle")

    def claims(self, scope: str) -> list[ClaimRecord]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(claims).where(claims.c.scope == scope)).mappings()
            return sorted((_claim_record(r) for r in rows), key=lambda c: c.key)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
        self.engine.dispose()


class _SqliteReader:
    """Read connections to an SQLite store's file, one per thread, for the scans of the
    event log and for blob reads: a pool checkout per blob cost more than reading the
    blob. They go through the standard library's driver, the SQLite library of the pool's
    connections: another SQLite library in the same process (apsw's) would keep POSIX
    locks of its own on the same files, and closing a file in one library drops the
    other's locks. Each query is its own read transaction (a WAL snapshot, as through the
    pool); the connections never write (``query_only``)."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: list[tuple[int, sqlite3.Connection]] = []  # (opening pid, connection)

    def rows(self, sql: str, bindings: dict[str, Any]) -> list[Any]:
        try:
            return self._connection().execute(sql, bindings).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"{self._path}: the store could not be read "
                             f"({type(exc).__name__}: {exc})") from None

    def _connection(self) -> sqlite3.Connection:
        held: tuple[int, sqlite3.Connection] | None = getattr(self._local, "held", None)
        if held is not None and held[0] == os.getpid():
            return held[1]
        # (none yet in this thread, or one a parent process opened: never used after fork)
        # Used by this thread only; closed by close(), from whichever thread calls it.
        conn = sqlite3.connect(self._path, timeout=60, isolation_level=None,
                               check_same_thread=False)
        conn.execute("PRAGMA query_only=1")
        self._local.held = (os.getpid(), conn)
        with self._lock:
            self._open.append(self._local.held)
        return conn

    def close(self) -> None:
        with self._lock:
            conns, self._open = self._open, []
        self._local = threading.local()
        pid = os.getpid()
        for opened_by, conn in conns:
            if opened_by == pid:
                conn.close()
            else:  # a parent's, seen in a forked child: see _FORKED_AWAY
                _FORKED_AWAY.append(conn)


# Connections a parent process opened, met in a forked child's close(): never closed nor
# freed there, since closing a file drops every POSIX lock the process holds on it, its own
# connections' included.
_FORKED_AWAY: list[sqlite3.Connection] = []


def _claim_record(row: Any) -> ClaimRecord:
    return ClaimRecord(scope=row["scope"], key=row["key"], owner=row["owner"],
                       state=row["state"], body=bytes(row["body"]))


def _event_values(e: StoredEvent) -> tuple[Any, ...]:
    """An event's values in the order of _EVENT_INSERT_COLUMNS."""
    return (e.persona, e.seq, e.day, e.ts, e.prev, e.event_id, e.schema_version, e.body)


def _day_row(r: DayRecord) -> dict[str, Any]:
    return {
        "persona": r.persona, "day": r.day, "first_seq": r.first_seq, "last_seq": r.last_seq,
        "first_ts": r.first_ts, "last_ts": r.last_ts, "head": r.head,
        "world_hash": r.world_hash, "manifest": r.manifest,
    }


def _day_record(row: Any) -> DayRecord:
    return DayRecord(
        persona=row["persona"], day=row["day"], first_seq=row["first_seq"],
        last_seq=row["last_seq"], first_ts=row["first_ts"], last_ts=row["last_ts"],
        head=row["head"], world_hash=row["world_hash"], manifest=bytes(row["manifest"]),
    )


def _episode_row(r: EpisodeRecord) -> dict[str, Any]:
    return {
        "episode_id": r.episode_id, "world_hash": r.world_hash, "persona": r.persona,
        "day": r.day, "final_hash": r.final_hash, "n_calls": r.n_calls, "body": r.body,
    }


def _episode_record(row: Any) -> EpisodeRecord:
    return EpisodeRecord(
        episode_id=row["episode_id"], world_hash=row["world_hash"], persona=row["persona"],
        day=row["day"], final_hash=row["final_hash"], n_calls=row["n_calls"],
        body=bytes(row["body"]),
    )


def _summary(row: Any) -> PersonaSummary:
    return PersonaSummary(
        persona=row["persona"], n_days=row["n_days"], first_day=row["first_day"],
        last_day=row["last_day"], last_seq=row["last_seq"], last_ts=row["last_ts"],
        head=row["head"], world_hash=row["world_hash"],
    )


__all__ = ["SqlEventStore", "create_engine_for", "metadata"]
