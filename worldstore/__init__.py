"""agent-worlds world store: persona-day event logs, their interchange format, and the
event-store contract with its SQLAlchemy implementation (SQLite and PostgreSQL).

Importing the package (which every ``worldstore.*`` import does first) loads only the
error tree; the other names load on first use, so that a command line that only prints
its help never pays for msgspec or SQLAlchemy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from worldstore.errors import (
    ConfigError,
    ConflictError,
    DayOrderError,
    InputError,
    NotFoundError,
    PathError,
    StoreError,
    StoreVersionError,
    WorldError,
)

if TYPE_CHECKING:
    from worldstore.open import open_event_store
    from worldstore.store import DayRecord, EventStore, NewDay, PersonaSummary

_LAZY = {
    "open_event_store": "worldstore.open",
    "DayRecord": "worldstore.store",
    "EventStore": "worldstore.store",
    "NewDay": "worldstore.store",
    "PersonaSummary": "worldstore.store",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'worldstore' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "ConfigError",
    "ConflictError",
    "DayOrderError",
    "DayRecord",
    "EventStore",
    "InputError",
    "NewDay",
    "NotFoundError",
    "PathError",
    "PersonaSummary",
    "StoreError",
    "StoreVersionError",
    "WorldError",
    "open_event_store",
]
