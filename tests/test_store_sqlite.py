"""The EventStore contract on the embedded SQLite store."""

from pathlib import Path

import pytest
from store_contract import EventStoreContract

from worldstore.open import open_event_store
from worldstore.store import EventStore


class TestSqliteEventStore(EventStoreContract):
    @pytest.fixture(autouse=True)
    def _location(self, tmp_path: Path) -> None:
        self.location = tmp_path / "store"

    def make_store(self) -> EventStore:
        return open_event_store(self.location)
