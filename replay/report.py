"""What import, replay and verify report: one result per persona-day, and verify's problems.

Its own module so that the engine (which produces these) and verify (which fills a report)
both import it and neither imports the other's types back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class DayResult:
    """One persona-day as import or replay saw it."""

    persona: str
    day: int
    n_events: int
    world_hash: str
    seconds: float
    status: str  # imported | unchanged | applied | replayed | verified | mismatch
    recorded_hash: str | None = None


Progress = Callable[[DayResult], None]


@dataclass(slots=True)
class Problem:
    """One thing verify found wrong, and where: persona, day, event, table or file."""

    persona: str
    kind: str  # chain | blob | day | hash | cache | order
    message: str
    day: int | None = None
    seq: int | None = None
    event: int | None = None  # index of the event within its day
    table: str | None = None
    file: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__ if getattr(self, k) is not None}


@dataclass(slots=True)
class VerifyReport:
    """What verify checked, and every problem it found (none: the store is sound)."""

    personas: int = 0
    days: int = 0
    events: int = 0
    cache_entries: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems
