"""The EventStore contract, checked through the store API only.

Each backend's test module subclasses `EventStoreContract` and implements `make_store()`
(every call returns a new connection to the same store), in the style of eventsourcing's
tests/persistence.py. The records appended here are real StoredEvents (make_event), real
blobs and DayRecords; the world hashes are stand-ins because no test here replays.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
import sqlalchemy as sa

from worldstore.canonical import canonical_bytes, digest
from worldstore.errors import ConflictError, DayOrderError, NotFoundError, StoreError
from worldstore.events import (
    GENESIS,
    FileDeletePayload,
    FileWritePayload,
    Payload,
    SqlPayload,
    StoredEvent,
    make_event,
)
from worldstore.schema import blobs
from worldstore.sqlstore import EVENT_PAGE
from worldstore.store import DayRecord, EventStore, NewDay, PersonaSummary

_START = datetime(2026, 3, 2, 8, 0, 0, tzinfo=UTC)


def ts_of(day: int, index: int) -> str:
    """A timestamp on `day` (one day apart), `index` seconds after 08:00."""
    moment = _START + timedelta(days=day, seconds=index)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def sql_payload(persona: str, day: int, index: int) -> SqlPayload:
    return SqlPayload(service="notes", sql="INSERT INTO notes(body) VALUES (?)",
                      params=[f"{persona} day {day} note {index}"])


def build_day(
    persona: str, day: int, *, first_seq: int, prev: str, n_sql: int = 2,
    files: dict[str, bytes] | None = None, world_hash: str | None = None,
) -> NewDay:
    """A whole persona-day: `n_sql` sql events, then one file_write per entry of `files`
    and a file_delete, chained from `prev` starting at `first_seq`."""
    payloads: list[Payload] = [sql_payload(persona, day, i) for i in range(n_sql)]
    blobs: dict[str, bytes] = {}
    for path, data in (files or {}).items():
        blobs[digest(data)] = data
        payloads.append(FileWritePayload(path=path, blob=digest(data), size=len(data),
                                         encoding="base64"))
    if files:
        payloads.append(FileDeletePayload(path=next(iter(files))))
    events: list[StoredEvent] = []
    for offset, payload in enumerate(payloads):
        event = make_event(persona=persona, seq=first_seq + offset, day=day,
                           ts=ts_of(day, offset), prev=prev, payload=payload)
        events.append(event)
        prev = event.event_id
    return new_day(events, blobs, world_hash=world_hash)


def new_day(events: list[StoredEvent], blobs: dict[str, bytes], *,
            world_hash: str | None = None) -> NewDay:
    first, last = events[0], events[-1]
    record = DayRecord(
        persona=first.persona, day=first.day, first_seq=first.seq, last_seq=last.seq,
        first_ts=first.ts, last_ts=last.ts, head=last.event_id,
        world_hash=world_hash or digest(canonical_bytes(["world", first.persona, last.event_id])),
        manifest=canonical_bytes({"day": first.day, "head": last.event_id}),
    )
    return NewDay(record=record, events=events, blobs=blobs)


def next_day(store: EventStore, persona: str, day: int, **kw: Any) -> NewDay:
    """The persona's next day, chained onto what the store holds now."""
    summary = store.persona(persona)
    first_seq, prev = (summary.last_seq + 1, summary.head) if summary else (0, GENESIS)
    return build_day(persona, day, first_seq=first_seq, prev=prev, **kw)


def append(store: EventStore, new: NewDay) -> NewDay:
    store.append_day(new, expected_last_seq=new.record.first_seq - 1)
    return new


def contents(store: EventStore) -> dict[str, Any]:
    """Everything the API shows about a store's personas, days and events."""
    personas = store.personas()
    return {
        "personas": personas,
        "days": {p.persona: store.days(p.persona) for p in personas},
        "events": {p.persona: list(store.events(p.persona)) for p in personas},
    }


class EventStoreContract(abc.ABC):
    """Guarantees every EventStore keeps (see worldstore/store.py)."""

    @abc.abstractmethod
    def make_store(self) -> EventStore:
        """A new connection to this test's store (the same store on every call)."""

    @pytest.fixture
    def store(self) -> Iterator[EventStore]:
        store = self.make_store()
        try:
            yield store
        finally:
            store.close()

    def assert_unchanged_after(self, store: EventStore, new: NewDay, *,
                               expected_last_seq: int, error: type[StoreError]) -> None:
        """Appending `new` raises `error` and leaves personas, days, events and the day's
        new blobs exactly as they were, seen from this and from a fresh connection."""
        before = contents(store)
        absent_before = store.missing_blobs(new.blobs)
        with pytest.raises(error):
            store.append_day(new, expected_last_seq=expected_last_seq)
        assert contents(store) == before
        assert store.missing_blobs(new.blobs) == absent_before
        other = self.make_store()
        try:
            assert contents(other) == before
            assert other.missing_blobs(new.blobs) == absent_before
        finally:
            other.close()

    # --- empty store and lookups --------------------------------------------------

    def test_empty_store(self, store: EventStore) -> None:
        assert store.personas() == []
        assert store.persona("lars") is None
        assert store.days("lars") == []
        assert list(store.events("lars")) == []
        assert store.days_with_hash("0" * 32) == []
        assert store.missing_blobs([]) == set()
        with pytest.raises(NotFoundError):
            store.day("lars", 0)
        with pytest.raises(NotFoundError):
            store.blob(digest(b"nothing"))

    def test_unknown_names_are_not_found(self, store: EventStore) -> None:
        append(store, build_day("lars", 0, first_seq=0, prev=GENESIS, files={"a": b"A"}))
        assert store.persona("lars2") is None
        assert store.persona("lar") is None
        assert store.days("mia") == []
        assert list(store.events("mia")) == []
        with pytest.raises(NotFoundError, match=r"lars@1"):
            store.day("lars", 1)
        with pytest.raises(NotFoundError, match=r"mia@0"):
            store.day("mia", 0)
        missing = digest(b"B")
        with pytest.raises(NotFoundError, match=missing):
            store.blob(missing)

    # --- append and read back -----------------------------------------------------

    def test_append_reads_back_exactly(self, store: EventStore) -> None:
        data = bytes(range(256)) * 3  # every byte value survives the round trip
        new = append(store, build_day("lars", 0, first_seq=0, prev=GENESIS,
                                      files={"img/all.bin": data, "empty.txt": b""}))
        rec = new.record
        assert store.days("lars") == [rec]
        assert store.day("lars", 0) == rec
        assert list(store.events("lars")) == new.events
        assert [e.payload for e in store.events("lars")] == [e.payload for e in new.events]
        assert store.blob(digest(data)) == data
        assert store.blob(digest(b"")) == b""
        assert store.persona("lars") == PersonaSummary(
            persona="lars", n_days=1, first_day=0, last_day=0, last_seq=rec.last_seq,
            last_ts=rec.last_ts, head=rec.head, world_hash=rec.world_hash,
        )
        assert store.day("lars", 0).n_events == len(new.events) == 5

    def test_appended_days_survive_reopening(self, store: EventStore) -> None:
        new = append(store, build_day("lars", 0, first_seq=0, prev=GENESIS, files={"f": b"x"}))
        before = contents(store)
        store.close()
        again = self.make_store()
        try:
            assert contents(again) == before
            assert again.blob(digest(b"x")) == b"x"
            assert again.day("lars", 0) == new.record
        finally:
            again.close()

    def test_seq_is_dense_across_days(self, store: EventStore) -> None:
        sizes = {0: 1, 1: 4, 2: 2, 3: 7}
        for day, n_sql in sizes.items():
            append(store, next_day(store, "lars", day, n_sql=n_sql, files={f"d{day}": b"%d" % day}))
        stored = list(store.events("lars"))
        assert [e.seq for e in stored] == list(range(len(stored)))
        assert len(stored) == sum(n + 2 for n in sizes.values())
        records = store.days("lars")
        assert [r.day for r in records] == list(sizes)
        expected_first = 0
        prev = GENESIS
        for rec in records:
            assert rec.first_seq == expected_first
            span = stored[rec.first_seq: rec.last_seq + 1]
            assert {e.day for e in span} == {rec.day}
            assert span[0].prev == prev
            assert span[-1].event_id == rec.head
            expected_first, prev = rec.last_seq + 1, rec.head
        summary = store.persona("lars")
        assert summary is not None
        assert (summary.n_days, summary.first_day, summary.last_day) == (4, 0, 3)
        assert (summary.last_seq, summary.head) == (len(stored) - 1, records[-1].head)

    def test_days_need_not_be_consecutive(self, store: EventStore) -> None:
        append(store, next_day(store, "lars", 3))
        append(store, next_day(store, "lars", 10))
        assert [r.day for r in store.days("lars")] == [3, 10]
        summary = store.persona("lars")
        assert summary is not None
        assert (summary.n_days, summary.first_day, summary.last_day) == (2, 3, 10)
        with pytest.raises(NotFoundError):
            store.day("lars", 5)

    # --- order and concurrency guarantees -----------------------------------------

    def test_existing_day_is_refused(self, store: EventStore) -> None:
        append(store, next_day(store, "lars", 0))
        append(store, next_day(store, "lars", 1))
        # Correctly chained onto the stream's end, but day 1 is taken.
        again = next_day(store, "lars", 1, files={"new": b"never stored"})
        self.assert_unchanged_after(store, again, expected_last_seq=again.record.first_seq - 1,
                                    error=DayOrderError)
        with pytest.raises(DayOrderError, match=r"lars@1 already exists"):
            append(store, again)

    def test_day_before_the_last_is_refused(self, store: EventStore) -> None:
        append(store, next_day(store, "lars", 0))
        append(store, next_day(store, "lars", 2))
        late = next_day(store, "lars", 1, files={"late": b"never stored"})
        self.assert_unchanged_after(store, late, expected_last_seq=late.record.first_seq - 1,
                                    error=DayOrderError)
        with pytest.raises(DayOrderError, match=r"lars@1 is not after the last day 2"):
            append(store, late)

    def test_stale_expected_seq_is_a_conflict(self, store: EventStore) -> None:
        day0 = append(store, next_day(store, "lars", 0))
        # A writer read the stream after day 0; meanwhile others appended days 1 and 2.
        append(store, next_day(store, "lars", 1))
        append(store, next_day(store, "lars", 2))
        stale = build_day("lars", 3, first_seq=day0.record.last_seq + 1, prev=day0.record.head,
                          files={"mine": b"stale writer"})
        self.assert_unchanged_after(store, stale, expected_last_seq=day0.record.last_seq,
                                    error=ConflictError)
        with pytest.raises(ConflictError, match=r"lars@3"):
            append(store, stale)

    def test_new_persona_expected_but_stream_exists_is_a_conflict(self, store: EventStore
                                                                  ) -> None:
        append(store, next_day(store, "lars", 0))
        fresh = build_day("lars", 1, first_seq=0, prev=GENESIS, files={"f": b"fresh"})
        self.assert_unchanged_after(store, fresh, expected_last_seq=-1, error=ConflictError)

    def test_existing_stream_expected_but_persona_unknown_is_a_conflict(
            self, store: EventStore) -> None:
        ghost = build_day("ghost", 1, first_seq=3, prev=digest(b"gone"), files={"g": b"ghost"})
        self.assert_unchanged_after(store, ghost, expected_last_seq=2, error=ConflictError)
        assert store.persona("ghost") is None

    def test_first_seq_must_follow_expected_seq(self, store: EventStore) -> None:
        append(store, next_day(store, "lars", 0))
        end = store.persona("lars").last_seq  # type: ignore[union-attr]
        gap = build_day("lars", 1, first_seq=end + 2, prev=GENESIS, files={"gap": b"gap"})
        self.assert_unchanged_after(store, gap, expected_last_seq=end, error=StoreError)

    # --- atomicity: a failure after the day was claimed writes nothing ------------

    def test_duplicate_seq_within_a_new_persona_writes_nothing(self, store: EventStore) -> None:
        good = build_day("lars", 0, first_seq=0, prev=GENESIS, n_sql=3,
                         files={"a.bin": b"blob of a failed day"})
        # Two events claim seq 1: the events insert fails after the persona row and the
        # blobs went in, and all of it must roll back.
        events = list(good.events)
        events[2] = make_event(persona="lars", seq=1, day=0, ts=ts_of(0, 2),
                               prev=events[1].event_id, payload=sql_payload("lars", 0, 9))
        broken = new_day(events, good.blobs)
        self.assert_unchanged_after(store, broken, expected_last_seq=-1, error=StoreError)
        assert store.persona("lars") is None
        assert store.missing_blobs(good.blobs) == set(good.blobs)
        # The store is not wedged: the correct day goes in afterwards.
        append(store, good)
        assert list(store.events("lars")) == good.events

    def test_seq_colliding_with_stored_events_writes_nothing(self, store: EventStore) -> None:
        day0 = append(store, next_day(store, "lars", 0, files={"shared": b"kept"}))
        end = day0.record.last_seq
        # The record follows the stream, but the events restart one seq too early.
        overlap = build_day("lars", 1, first_seq=end, prev=day0.record.head,
                            files={"shared": b"kept", "new": b"must not stay"})
        record = msgspec.structs.replace(overlap.record, first_seq=end + 1)
        broken = NewDay(record=record, events=overlap.events, blobs=overlap.blobs)
        self.assert_unchanged_after(store, broken, expected_last_seq=end, error=StoreError)
        assert store.blob(digest(b"kept")) == b"kept"
        assert store.missing_blobs([digest(b"must not stay")]) == {digest(b"must not stay")}
        append(store, next_day(store, "lars", 1))
        assert store.persona("lars").n_days == 2  # type: ignore[union-attr]

    # --- blobs --------------------------------------------------------------------

    def test_same_bytes_are_stored_once(self, store: EventStore) -> None:
        shared = b"the same photo" * 100
        only_mia = b"mia only"
        append(store, next_day(store, "lars", 0, files={"img/p.png": shared}))
        # Another persona, then a later day of the first, store the same bytes again.
        append(store, next_day(store, "mia", 0, files={"pics/same.png": shared,
                                                      "own.txt": only_mia}))
        append(store, next_day(store, "lars", 1, files={"copy.png": shared}))
        assert store.blob(digest(shared)) == shared
        assert self.blob_copies(store, digest(shared)) in (None, 1)
        absent = digest(b"never written")
        asked = iter([digest(shared), absent, digest(only_mia), absent])
        assert store.missing_blobs(asked) == {absent}
        assert store.missing_blobs([digest(shared)]) == set()

    def blob_copies(self, store: EventStore, blob: str) -> int | None:
        """How many stored rows hold `blob`, where the backend can tell (None if not)."""
        engine = getattr(store, "engine", None)
        if engine is None:
            return None
        with engine.connect() as conn:
            return int(conn.execute(
                sa.select(sa.func.count()).select_from(blobs).where(blobs.c.digest == blob)
            ).scalar_one())

    # --- events() paging ------------------------------------------------------------

    def test_events_pages_past_event_page(self, store: EventStore) -> None:
        # Two days whose events together span more than two pages.
        first = append(store, next_day(store, "big", 0, n_sql=EVENT_PAGE + 3))
        second = append(store, next_day(store, "big", 1, n_sql=EVENT_PAGE - 1))
        append(store, next_day(store, "small", 0))  # events of another persona interleave
        everything = first.events + second.events
        total = len(everything)
        assert total > 2 * EVENT_PAGE
        assert list(store.events("big")) == everything
        windows = [
            (0, EVENT_PAGE - 1),  # exactly one full page
            (0, 2 * EVENT_PAGE - 1),  # exactly two full pages
            (EVENT_PAGE - 2, EVENT_PAGE + 1),  # across the first page boundary
            (EVENT_PAGE, None),  # from a page boundary to the end
            (17, 2 * EVENT_PAGE + 3),
            (total - 1, None),
            (total, None),  # past the end
            (5, 4),  # empty range
            (7, 7),
        ]
        for first_seq, last_seq in windows:
            got = [e.seq for e in store.events("big", first_seq, last_seq)]
            end = total - 1 if last_seq is None else min(last_seq, total - 1)
            assert got == list(range(first_seq, end + 1)), (first_seq, last_seq)
        assert [e.seq for e in store.events("small")] == [0, 1]
        day1 = store.day("big", 1)
        assert list(store.events("big", day1.first_seq, day1.last_seq)) == second.events

    # --- queries across personas ------------------------------------------------------

    def test_days_with_hash(self, store: EventStore) -> None:
        same = digest(b"an identical world")
        append(store, next_day(store, "zed", 0, world_hash=same))
        append(store, next_day(store, "amy", 0))
        append(store, next_day(store, "amy", 1, world_hash=same))
        append(store, next_day(store, "amy", 4, world_hash=same))
        append(store, next_day(store, "bob", 2, world_hash=same))
        found = store.days_with_hash(same)
        assert [(r.persona, r.day) for r in found] == [("amy", 1), ("amy", 4), ("bob", 2),
                                                       ("zed", 0)]
        assert found[0] == store.day("amy", 1)
        amy0 = store.day("amy", 0)
        assert store.days_with_hash(amy0.world_hash) == [amy0]
        assert store.days_with_hash(digest(b"no such world")) == []

    def test_personas_are_sorted_by_name(self, store: EventStore) -> None:
        # Code-point order, whatever the database's collation: '-' < '0' < '_' < 'a'.
        names = ["zed", "ab", "a_b", "a-c", "a0", "a", "b-2", "b_1", "b1", "b"]
        for name in names:
            append(store, next_day(store, name, 0))
        assert [p.persona for p in store.personas()] == sorted(names)
        assert [p.persona for p in store.personas()] == [
            "a", "a-c", "a0", "a_b", "ab", "b", "b-2", "b1", "b_1", "zed"]
        same = digest(b"shared")
        for name in names:
            append(store, next_day(store, name, 1, world_hash=same))
        assert [r.persona for r in store.days_with_hash(same)] == sorted(names)

    def test_personas_summaries_track_their_own_stream(self, store: EventStore) -> None:
        append(store, next_day(store, "lars", 0))
        append(store, next_day(store, "mia", 5, n_sql=6))
        append(store, next_day(store, "lars", 1))
        summaries = {p.persona: p for p in store.personas()}
        assert summaries == {"lars": store.persona("lars"), "mia": store.persona("mia")}
        lars, mia = summaries["lars"], summaries["mia"]
        assert (lars.n_days, lars.last_day, lars.last_seq) == (2, 1, 3)
        assert (mia.n_days, mia.first_day, mia.last_day, mia.last_seq) == (1, 5, 5, 5)
        assert mia.head == store.day("mia", 5).head
        assert lars.last_ts == store.day("lars", 1).last_ts

