"""The store kit (worldstore.testing) on the embedded SQLite store."""

from pathlib import Path

import pytest

from worldstore import testing
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
