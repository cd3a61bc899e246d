"""Errors of replay: applying events, reading world directories, checking stored hashes.

The whole tree is drawn in ``worldstore/errors.py``.
"""

from __future__ import annotations

from worldstore.errors import WorldError


class ApplyError(WorldError):
    """An event failed to apply; the whole persona-day is refused."""

    def __init__(
        self, message: str, *, persona: str, day: int, index: int, line: int | None = None,
        source: str | None = None,
    ) -> None:
        self.persona = persona
        self.day = day
        self.index = index
        self.line = line
        self.reason = message
        where = f"{source}:{line}: " if source and line else (f"line {line}: " if line else "")
        super().__init__(
            f"{where}{persona}@{day} event #{index} refused, the whole day is not stored: {message}"
        )


class IntegrityError(WorldError):
    """Stored data does not match its own hashes (tampering or corruption)."""


class WorldDirError(WorldError):
    """A directory that does not have the layout of a world."""


class EventFailed(WorldError):
    """An event could not be applied; the caller adds persona, day and event."""
