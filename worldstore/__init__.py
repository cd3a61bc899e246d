"""agent-worlds world store: persona-day event logs, their interchange format, and the
event-store contract with its SQLAlchemy implementation (SQLite and PostgreSQL)."""

from worldstore.errors import (
    ApplyError,
    ConflictError,
    DayOrderError,
    InputError,
    IntegrityError,
    NotFoundError,
    PathError,
    StoreError,
    StoreVersionError,
    WorldDirError,
    WorldError,
)
from worldstore.open import open_event_store
from worldstore.store import DayRecord, EventStore, NewDay, PersonaSummary

__all__ = [
    "ApplyError",
    "ConflictError",
    "DayOrderError",
    "DayRecord",
    "EventStore",
    "InputError",
    "IntegrityError",
    "NewDay",
    "NotFoundError",
    "PathError",
    "PersonaSummary",
    "StoreError",
    "StoreVersionError",
    "WorldDirError",
    "WorldError",
    "open_event_store",
]
