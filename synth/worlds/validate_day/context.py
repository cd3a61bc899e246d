"""What every layer reads: the day, the day before, its events, and the materialized world."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from replay.engine import Worlds
from replay.hashing import Manifest
from worldstore.events import StoredEvent
from worldstore.store import DayRecord

__all__ = ["DayContext", "DayWorld"]


@dataclass(frozen=True)
class DayContext:
    worlds: Worlds
    record: DayRecord
    previous: DayRecord | None
    events: list[StoredEvent]

    @classmethod
    def load(cls, worlds: Worlds, record: DayRecord) -> DayContext:
        earlier = [r for r in worlds.store.days(record.persona) if r.day < record.day]
        events = list(worlds.store.events(record.persona, record.first_seq, record.last_seq))
        return cls(worlds, record, earlier[-1] if earlier else None, events)

    @property
    def name(self) -> str:
        return f"{self.record.persona}@{self.record.day}"

    def where(self, index: int) -> str:
        return f"event seq {self.events[index].seq} (#{index} of {self.name})"


@dataclass(frozen=True)
class DayWorld:
    """The day's materialized world and the day before, with their manifests."""

    root: Path
    manifest: Manifest
    before_root: Path | None
    before: Manifest
