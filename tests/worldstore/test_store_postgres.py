"""The store kit (worldstore.testing) on PostgreSQL (a fresh database per test; see
conftest.pg_url), and what only PostgreSQL can get wrong."""

import pytest
import sqlalchemy as sa

from worldstore import testing
from worldstore.canonical import digest
from worldstore.open import open_event_store
from worldstore.sqlstore import EVENT_PAGE, SqlEventStore
from worldstore.testing import append, next_day


class PostgresStore:
    @pytest.fixture(autouse=True)
    def _location(self, pg_url: str) -> None:
        self.location = pg_url

    def create_store(self) -> SqlEventStore:
        return open_event_store(self.location)


class TestPostgresEventStore(PostgresStore, testing.EventStoreContract):
    event_page = EVENT_PAGE


class TestPostgresEpisodeStore(PostgresStore, testing.EpisodeStoreContract):
    pass


def test_persona_order_ignores_the_database_collation(pg_url: str) -> None:
    """A database created under a linguistic locale (say initdb with LANG=en_US.UTF-8)
    sorts 'a-c' after 'a_b'; the store must still list personas in code-point order, as
    SQLite does, so `persona@...` listings and hash lookups agree across backends."""
    store = open_event_store(pg_url)
    try:
        with store.engine.begin() as conn:
            if conn.execute(sa.text("SELECT 1 FROM pg_collation WHERE collname = 'en-US-x-icu'")
                            ).first() is None:
                pytest.skip("this PostgreSQL has no ICU collations")
            for table in ("personas", "days"):
                conn.execute(sa.text(f'ALTER TABLE {table} ALTER COLUMN persona '
                                     'TYPE varchar(64) COLLATE "en-US-x-icu"'))
        names = ["ab", "a_b", "a-c", "a0"]
        same = digest(b"one world")
        for name in names:
            append(store, next_day(store, name, 0, world_hash=same))
        assert [p.persona for p in store.personas()] == ["a-c", "a0", "a_b", "ab"]
        assert [r.persona for r in store.days_with_hash(same)] == ["a-c", "a0", "a_b", "ab"]
    finally:
        store.close()


class TestPostgresClaimStore(PostgresStore, testing.ClaimStoreContract):
    pass
