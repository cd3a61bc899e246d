"""What the store contract cannot see of the SQL store, checked in its tables, on SQLite
and PostgreSQL (the contract itself runs in test_store_sqlite.py / test_store_postgres.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from worldstore.canonical import digest
from worldstore.open import open_event_store
from worldstore.schema import blobs
from worldstore.sqlstore import SqlEventStore
from worldstore.testing import append, next_day


@pytest.fixture
def store(store_location: str) -> Iterator[SqlEventStore]:
    opened = open_event_store(store_location)
    try:
        yield opened
    finally:
        opened.close()


def rows_holding(store: SqlEventStore, blob: str) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(
            sa.select(sa.func.count()).select_from(blobs).where(blobs.c.digest == blob)
        ).scalar_one())


def test_same_bytes_are_one_row(store: SqlEventStore) -> None:
    shared = b"the same photo" * 100
    append(store, next_day(store, "lars", 0, files={"img/p.png": shared}))
    # Another persona, then a later day of the first, store the same bytes again.
    append(store, next_day(store, "mia", 0, files={"pics/same.png": shared}))
    append(store, next_day(store, "lars", 1, files={"copy.png": shared}))
    assert rows_holding(store, digest(shared)) == 1
    assert store.blob(digest(shared)) == shared
