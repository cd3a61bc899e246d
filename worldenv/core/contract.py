"""The contract of envs: what a tool is, what a call returns, and what one call runs under.

``ToolInfo`` describes a tool as agents see it (its MCP name, description and schemas);
``ToolResult`` is what a call returns to the agent. ``CallContext`` is one call's share of
the instance: its ``CallClock`` (the call's index, its frozen time as epoch milliseconds and
as ISO text, and the seed of its randomness) and the ``Effect`` records of what it changed.

The instance that takes a call owns its clock: an in-process tool runs under the context
the instance made, and the sandboxed worker of a carried app receives the same clock with
each request (``CallClock.to_wire``), so both run a call at exactly the same moment and
draw exactly the same "random" values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from worldstore.names import ts_millis


@dataclass(frozen=True, slots=True)
class ToolInfo:
    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None
    writes: bool
    # A tool that may write but usually only reads (an AWM GET route): on an instance
    # with no copy of its database yet, a call first runs on the snapshot read-only and is
    # run again on a copy only if it tries to write (``worldenv.sandbox.app_worker``).
    reads_first: bool = False


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What the agent sees: text (JSON for structured results), and an error flag."""

    is_error: bool
    text: str
    structured: Any = None


@dataclass(frozen=True, slots=True)
class CallClock:
    """The frozen clock of one call: SQLite's time and the tools' ``ctx.now`` read `now`
    (`millis` since the epoch), and SQLite's ``random()`` draws from `seed`."""

    index: int
    millis: int
    now: str
    seed: str

    @classmethod
    def of_call(cls, start_ts: str, world_hash: str, index: int) -> CallClock:
        """Call `index` of an episode on the snapshot `world_hash` whose last event was at
        `start_ts`: one second later per call, seeded by the snapshot and the call's
        position only, so the same calls on any instance of a snapshot give the same
        responses."""
        start = datetime.fromisoformat(start_ts.removesuffix("Z")).replace(tzinfo=UTC)
        now = (start + timedelta(seconds=index)).strftime("%Y-%m-%dT%H:%M:%SZ")
        return cls(index=index, millis=ts_millis(start_ts) + 1000 * index, now=now,
                   seed=f"{world_hash}:{index}")

    def to_wire(self) -> dict[str, Any]:
        return {"index": self.index, "millis": self.millis, "now": self.now,
                "seed": self.seed}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> CallClock:
        return cls(index=int(data["index"]), millis=int(data["millis"]),
                   now=str(data["now"]), seed=str(data["seed"]))


@dataclass(frozen=True, slots=True)
class Effect:
    """What a write call changed in one service's database: the SQLite session
    extension's changeset, and the ``sqlite_sequence`` rows when they moved (else None)."""

    service: str
    changeset: bytes
    sequences: list[tuple[str, int]] | None


@dataclass(slots=True)
class CallContext:
    """One tool call as the tool's runner sees it: its clock, and the effects it records."""

    clock: CallClock
    effects: list[Effect] = field(default_factory=list)

    def record(self, effect: Effect) -> None:
        self.effects.append(effect)
