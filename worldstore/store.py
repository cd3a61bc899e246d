"""The store contract: records, the two store interfaces and their guarantees. No SQL here.

Two interfaces, because they hold different things with different rules:

* ``EventStore``: persona-day event logs (personas, days, events) and their blobs;
* ``EpisodeStore``: recorded agent episodes, write-once records beside the logs.
* ``ClaimStore``: claims that parallel workers take before they make something others
  must not duplicate (task synthesis: a task in flight), decided under one lock.

``WorldStore`` is both at once, in one database: what ``worldstore.open.open_event_store``
returns and ``replay.Worlds`` holds. ``worldstore.testing`` checks each interface on any
implementation (tests/worldstore/test_store_sqlite.py and test_store_postgres.py run it).

Guarantees of an EventStore:

* ``append_day`` is atomic: the day's events, blobs and day record are all stored, or
  none of them is.
* Streams are append-only and dense: a persona's events have ``seq`` 0, 1, 2, ... and a
  day is only accepted after the persona's last day.
* Optimistic concurrency: ``append_day`` names the ``seq`` it expects the persona to end
  at; if another writer got there first it raises ConflictError and writes nothing.
* Blobs are content-addressed: storing the same bytes twice keeps one copy.

Guarantees of an EpisodeStore:

* Episodes are write-once: storing an episode again with the identical record is a no-op
  (also when two writers race); a different record under a stored episode_id is a
  ConflictError and changes nothing.
* An episode's body is opaque bytes, returned exactly as stored.

Guarantees of a ClaimStore:

* ``claim`` is serialised per store: its decision sees every claim of its scope committed
  before it, and no claim of the scope is taken while it decides, so of two claimants
  that would conflict, exactly one gets its claim (whatever the timing).
* A claim's state moves from "open" to "kept" or "dropped" only; its body is opaque.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Iterator
from typing import Literal, Self

import msgspec

from worldstore.events import EventRow, StoredEvent, event_row


class DayRecord(msgspec.Struct, frozen=True, kw_only=True):
    persona: str
    day: int
    first_seq: int
    last_seq: int
    first_ts: str
    last_ts: str
    head: str  # event_id of the day's last event: the chain's head after this day
    world_hash: str
    manifest: bytes  # replay.hashing.Manifest as JSON: per-table and per-file digests

    @property
    def n_events(self) -> int:
        return self.last_seq - self.first_seq + 1


class PersonaSummary(msgspec.Struct, frozen=True, kw_only=True):
    persona: str
    n_days: int
    first_day: int
    last_day: int
    last_seq: int
    last_ts: str
    head: str
    world_hash: str


class NewDay(msgspec.Struct, frozen=True, kw_only=True):
    record: DayRecord
    events: list[StoredEvent]
    blobs: dict[str, bytes]


class EpisodeRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One stored episode: a few columns to find it by, and its body, which the store keeps
    as opaque bytes (the environment layer's Episode as JSON; see worldenv.instances.episodes)."""

    episode_id: str
    world_hash: str  # the snapshot the episode started from
    persona: str
    day: int
    final_hash: str | None  # the world hash the instance ended at, if recorded
    n_calls: int
    body: bytes


class StoreConnection(abc.ABC):
    """An open connection to a store; closing it releases the connection, not the data."""

    url: str  # where the store lives, safe to print (no password)

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EventStore(StoreConnection):
    """Where persona-day event logs and their blobs live."""

    @abc.abstractmethod
    def append_day(self, new: NewDay, *, expected_last_seq: int) -> None:
        """Store one whole persona-day atomically.

        `expected_last_seq` is the persona's last seq the caller built on (-1 for a new
        persona). Raises ConflictError if the stream moved, DayOrderError if the day is
        not after the persona's last day.
        """

    @abc.abstractmethod
    def personas(self) -> list[PersonaSummary]:
        """Every persona, sorted by name (code-point order)."""

    @abc.abstractmethod
    def persona(self, persona: str) -> PersonaSummary | None: ...

    @abc.abstractmethod
    def days(self, persona: str) -> list[DayRecord]:
        """The persona's days in order (empty for an unknown persona)."""

    @abc.abstractmethod
    def day(self, persona: str, day: int) -> DayRecord:
        """One day's record; NotFoundError if absent."""

    @abc.abstractmethod
    def days_with_hash(self, world_hash: str) -> list[DayRecord]:
        """Every persona-day whose world has `world_hash`, sorted by (persona, day)."""

    @abc.abstractmethod
    def events(self, persona: str, first_seq: int = 0,
               last_seq: int | None = None) -> Iterator[StoredEvent]:
        """The persona's events with first_seq <= seq <= last_seq, in seq order."""

    def event_pages(self, persona: str, first_seq: int = 0,
                    last_seq: int | None = None) -> Iterator[list[EventRow]]:
        """The same events as ``events()``, as replay reads them: lists of ``EventRow``
        tuples, in seq order. A store may override this with a leaner scan."""
        page: list[EventRow] = []
        for event in self.events(persona, first_seq, last_seq):
            page.append(event_row(event))
            if len(page) >= 1024:
                yield page
                page = []
        if page:
            yield page

    @abc.abstractmethod
    def blob(self, digest: str) -> bytes:
        """Blob bytes; NotFoundError if absent. The bytes are returned as stored."""

    @abc.abstractmethod
    def missing_blobs(self, digests: Iterable[str]) -> set[str]:
        """Those of `digests` that the store does not hold."""


class EpisodeStore(StoreConnection):
    """Where recorded episodes live: write-once records, found by id or start world."""

    @abc.abstractmethod
    def put_episode(self, record: EpisodeRecord) -> None:
        """Store an episode. Storing the same episode_id again with an identical record is
        a no-op; with a different one (body or columns) it raises ConflictError and
        changes nothing."""

    @abc.abstractmethod
    def episode(self, episode_id: str) -> EpisodeRecord:
        """One episode; NotFoundError if absent. The body is returned as stored."""

    @abc.abstractmethod
    def episodes(self, world_hash: str | None = None) -> list[EpisodeRecord]:
        """Every episode (or those that started from `world_hash`), sorted by episode_id
        (code-point order)."""


ClaimState = Literal["open", "kept", "dropped"]


class ClaimRecord(msgspec.Struct, frozen=True):
    """One claim: `key` within `scope`, taken by `owner`, with an opaque `body` (what is
    claimed, as the claimant encodes it)."""

    scope: str
    key: str
    owner: str
    state: ClaimState
    body: bytes


class ClaimStore(StoreConnection):
    """Claims of parallel workers (see the module docstring)."""

    @abc.abstractmethod
    def claim(self, scope: str, key: str, owner: str,
              decide: Callable[[list[ClaimRecord]], tuple[ClaimState, bytes] | None]
              ) -> ClaimRecord | None:
        """Under the store's claim lock, call `decide` with every claim of `scope` that is
        not dropped (key order) and store what it returns: (state, body) becomes the claim
        `key` of `owner` ("open", or "dropped" for a decision that claims nothing); None
        writes nothing. Returns the stored claim, or None. A key already in the scope is a
        ConflictError (and `decide` is not called)."""

    @abc.abstractmethod
    def settle(self, scope: str, key: str, state: ClaimState) -> None:
        """Move an open claim to "kept" or "dropped"; NotFoundError if there is none."""

    @abc.abstractmethod
    def claims(self, scope: str) -> list[ClaimRecord]:
        """Every claim of `scope`, dropped ones included, in key order (code points)."""


class WorldStore(EventStore, EpisodeStore, ClaimStore):
    """The interfaces over one database: the logs, the episodes recorded on them and the
    claims of the workers that make things from them."""
