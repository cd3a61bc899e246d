"""The store kit (worldstore.testing) on the embedded SQLite store."""

import contextlib
import os
import sqlite3
import threading
from pathlib import Path

import pytest

from worldstore import sqlstore, testing
from worldstore.errors import StoreError
from worldstore.open import open_event_store
from worldstore.sqlstore import EVENT_PAGE, SqlEventStore


class SqliteStore:
    @pytest.fixture(autouse=True)
    def _location(self, tmp_path: Path) -> None:
        self.location = tmp_path / "store"

    def create_store(self) -> SqlEventStore:
        return open_event_store(self.location)


class TestSqliteEventStore(SqliteStore, testing.EventStoreContract):
    event_page = EVENT_PAGE


class TestSqliteEpisodeStore(SqliteStore, testing.EpisodeStoreContract):
    pass


class TestSqliteClaimStore(SqliteStore, testing.ClaimStoreContract):
    pass


# The embedded store reads the event log and blobs through connections of its own, one
# per thread (worldstore.sqlstore._SqliteReader); the contract above covers what they
# read. These cover the connections themselves, counted as open files of the database.


def _open_files(store_db: Path) -> int:
    target = str(store_db.resolve())
    found = 0
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):  # (gone meanwhile: the listing's own descriptor)
            found += os.readlink(fd) == target
    return found


def test_each_thread_reads_through_its_own_connection_and_close_closes_them(
        tmp_path: Path) -> None:
    store = open_event_store(tmp_path / "store")
    day = testing.append(store, testing.next_day(store, "lars", 0, n_sql=30,
                                                 files={"a.txt": b"A"}))
    store_db = tmp_path / "store" / "events.sqlite"
    before = _open_files(store_db)
    expected = [e.event_id for e in day.events]
    blob = next(iter(day.blobs))
    barrier = threading.Barrier(4)
    seen: list[tuple[list[str], bytes]] = []

    def read() -> None:
        barrier.wait()  # all four at once: one shared connection would be used concurrently
        for _ in range(20):
            seen.append(([e.event_id for e in store.events("lars")], store.blob(blob)))

    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [(expected, b"A")] * 80
    assert _open_files(store_db) == before + 4
    store.close()
    assert _open_files(store_db) == 0


def test_a_reads_connection_sees_what_was_appended_after_its_last_read(tmp_path: Path) -> None:
    store = open_event_store(tmp_path / "store")
    testing.append(store, testing.next_day(store, "lars", 0))
    assert len(list(store.events("lars"))) == 2
    other = open_event_store(tmp_path / "store")  # another writer, after the first read
    testing.append(other, testing.next_day(other, "lars", 1, n_sql=3))
    other.close()
    assert [e.day for e in store.events("lars")] == [0, 0, 1, 1, 1]
    store.close()


def test_a_forked_child_reads_through_a_connection_of_its_own(tmp_path: Path) -> None:
    store = open_event_store(tmp_path / "store")
    testing.append(store, testing.next_day(store, "lars", 0, n_sql=5))
    expected = [e.event_id for e in store.events("lars")]  # the parent's connection is open
    store_db = tmp_path / "store" / "events.sqlite"
    inherited = _open_files(store_db)
    pid = os.fork()
    if pid == 0:  # the child: SQLite connections must not cross a fork
        ok = False
        try:
            ok = ([e.event_id for e in store.events("lars")] == expected
                  and _open_files(store_db) == inherited + 1)
            # Closing closes its own connection, not the parent's: closing that file would
            # drop the child's own POSIX locks on it.
            store.close()
            ok = ok and len(sqlstore._FORKED_AWAY) == 1
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert [e.event_id for e in store.events("lars")] == expected
    assert _open_files(store_db) == inherited
    store.close()


def test_a_store_that_cannot_be_read_is_a_store_error(tmp_path: Path) -> None:
    store = open_event_store(tmp_path / "store")
    testing.append(store, testing.next_day(store, "lars", 0))
    store.close()
    with sqlite3.connect(tmp_path / "store" / "events.sqlite") as raw:
        raw.execute("ALTER TABLE events RENAME TO moved")
    store = open_event_store(tmp_path / "store")
    with pytest.raises(StoreError, match=r"events\.sqlite: the store could not be read .*"
                                         r"no such table: events"):
        list(store.events("lars"))
    store.close()
