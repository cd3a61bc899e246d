"""The store kit: conformance suites for the two store contracts of worldstore/store.py.

An implementation of a store proves itself by subclassing a suite and saying how to open
a store (eventsourcing's persistence tests style)::

    class TestMyEventStore(testing.EventStoreContract):
        def create_store(self) -> EventStore:
            return MyStore(self.location)   # a new connection to this test's store

    class TestMyEpisodeStore(testing.EpisodeStoreContract):
        def create_store(self) -> EpisodeStore:
            return MyStore(self.location)

The suites are ``unittest.TestCase`` classes, so they run under pytest and under plain
unittest and importing this module needs no test runner. ``create_store()`` is called in
``setUp`` (``self.store``) and again wherever a test needs a second connection; every call
must return a connection to the same, initially empty store (under pytest, an autouse
fixture of the subclass can set its location; it runs before ``setUp``). Every store
opened through ``open_store()`` is closed after the test.

The suites use the contract and nothing else: no SQL, no backend internals. What only a
backend can show (one row per blob, say) is tested beside that backend. The builders
below (``build_day``, ``next_day``, ...) make real StoredEvents, blobs and DayRecords; the
world hashes are stand-ins because nothing here replays.
"""

from __future__ import annotations

import abc
import functools
import operator
import threading
import time
import unittest
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Generic, TypeVar

import msgspec

from worldstore.canonical import canonical_bytes, digest
from worldstore.errors import ConflictError, DayOrderError, NotFoundError, StoreError
from worldstore.events import (
    GENESIS,
    FileDeletePayload,
    FileWritePayload,
    Payload,
    SqlPayload,
    StoredEvent,
    event_row,
    make_event,
)
from worldstore.store import (
    ClaimRecord,
    ClaimState,
    ClaimStore,
    DayRecord,
    EpisodeRecord,
    EpisodeStore,
    EventStore,
    NewDay,
    PersonaSummary,
    StoreConnection,
)

_START = datetime(2026, 3, 2, 8, 0, 0, tzinfo=UTC)

S = TypeVar("S", bound=StoreConnection)


# --- building records ---------------------------------------------------------------------


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
    """The day record of `events` (all of one persona-day), with its blobs."""
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


def episode_record(episode_id: str, *, world_hash: str | None = None, persona: str = "lars",
                   day: int = 0, final_hash: str | None = None, n_calls: int = 1,
                   body: bytes | None = None) -> EpisodeRecord:
    """An episode record; the body is opaque to the store, so any bytes will do."""
    return EpisodeRecord(
        episode_id=episode_id, world_hash=world_hash or digest(b"start of " + persona.encode()),
        persona=persona, day=day, final_hash=final_hash, n_calls=n_calls,
        body=body if body is not None else canonical_bytes({"episode": episode_id}),
    )


# --- the suites ---------------------------------------------------------------------------


class StoreContract(unittest.TestCase, abc.ABC, Generic[S]):
    """What both suites share: opening stores through the subclass's `create_store()`."""

    # pytest collects every TestCase subclass it finds in a test module, so the abstract
    # suites would run (and fail) wherever a test module imports them: only a class that
    # says how to create a store is a test.
    __test__: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__test__ = not getattr(cls.create_store, "__isabstractmethod__", False)

    @abc.abstractmethod
    def create_store(self) -> S:
        """A new connection to this test's store (the same store on every call)."""

    def setUp(self) -> None:
        super().setUp()
        self.store = self.open_store()

    def open_store(self) -> S:
        """Another connection to this test's store, closed when the test ends."""
        store = self.create_store()
        self.addCleanup(store.close)
        return store

    def run_concurrently(self, works: list[Callable[[S], object]]
                         ) -> list[BaseException | None]:
        """Start every work at once, each in its own thread on its own connection; what
        each one raised (None: it succeeded), in the order of `works`."""
        stores = [self.open_store() for _ in works]
        barrier = threading.Barrier(len(works))
        raised: list[BaseException | None] = [None] * len(works)

        def run(i: int) -> None:
            try:
                barrier.wait(timeout=60)
                works[i](stores[i])
            except BaseException as exc:  # handed to the test, which checks it
                raised[i] = exc

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(works))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        self.assertFalse(any(t.is_alive() for t in threads), "a writer hung")
        return raised


class EventStoreContract(StoreContract[EventStore]):
    """Guarantees every EventStore keeps (see worldstore/store.py)."""

    # A backend that reads events() in pages sets its page size here, so that the paging
    # test puts its windows on the page boundaries.
    event_page: ClassVar[int] = 100

    def assert_unchanged_after(self, new: NewDay, *, expected_last_seq: int,
                               error: type[StoreError]) -> None:
        """Appending `new` raises `error` and leaves personas, days, events and the day's
        new blobs exactly as they were, seen from this and from a fresh connection."""
        store = self.store
        before = contents(store)
        absent_before = store.missing_blobs(new.blobs)
        with self.assertRaises(error):
            store.append_day(new, expected_last_seq=expected_last_seq)
        self.assertEqual(contents(store), before)
        self.assertEqual(store.missing_blobs(new.blobs), absent_before)
        other = self.open_store()
        self.assertEqual(contents(other), before)
        self.assertEqual(other.missing_blobs(new.blobs), absent_before)

    def summary(self, persona: str) -> PersonaSummary:
        found = self.store.persona(persona)
        if found is None:
            self.fail(f"persona {persona!r} is not in the store")
        return found

    # --- empty store and lookups --------------------------------------------------

    def test_empty_store(self) -> None:
        store = self.store
        self.assertEqual(store.personas(), [])
        self.assertIsNone(store.persona("lars"))
        self.assertEqual(store.days("lars"), [])
        self.assertEqual(list(store.events("lars")), [])
        self.assertEqual(store.days_with_hash("0" * 32), [])
        self.assertEqual(store.missing_blobs([]), set())
        with self.assertRaises(NotFoundError):
            store.day("lars", 0)
        with self.assertRaises(NotFoundError):
            store.blob(digest(b"nothing"))

    def test_unknown_names_are_not_found(self) -> None:
        store = self.store
        append(store, build_day("lars", 0, first_seq=0, prev=GENESIS, files={"a": b"A"}))
        self.assertIsNone(store.persona("lars2"))
        self.assertIsNone(store.persona("lar"))
        self.assertEqual(store.days("mia"), [])
        self.assertEqual(list(store.events("mia")), [])
        with self.assertRaisesRegex(NotFoundError, r"lars@1"):
            store.day("lars", 1)
        with self.assertRaisesRegex(NotFoundError, r"mia@0"):
            store.day("mia", 0)
        missing = digest(b"B")
        with self.assertRaisesRegex(NotFoundError, missing):
            store.blob(missing)

    # --- append and read back -----------------------------------------------------

    def test_append_reads_back_exactly(self) -> None:
        store = self.store
        data = bytes(range(256)) * 3  # every byte value survives the round trip
        new = append(store, build_day("lars", 0, first_seq=0, prev=GENESIS,
                                      files={"img/all.bin": data, "empty.txt": b""}))
        rec = new.record
        self.assertEqual(store.days("lars"), [rec])
        self.assertEqual(store.day("lars", 0), rec)
        self.assertEqual(list(store.events("lars")), new.events)
        self.assertEqual([e.payload for e in store.events("lars")],
                         [e.payload for e in new.events])
        self.assertEqual(store.blob(digest(data)), data)
        self.assertEqual(store.blob(digest(b"")), b"")
        self.assertEqual(store.persona("lars"), PersonaSummary(
            persona="lars", n_days=1, first_day=0, last_day=0, last_seq=rec.last_seq,
            last_ts=rec.last_ts, head=rec.head, world_hash=rec.world_hash,
        ))
        self.assertEqual(store.day("lars", 0).n_events, len(new.events))
        self.assertEqual(len(new.events), 5)

    def test_appended_days_survive_reopening(self) -> None:
        store = self.store
        new = append(store, build_day("lars", 0, first_seq=0, prev=GENESIS, files={"f": b"x"}))
        before = contents(store)
        store.close()
        again = self.open_store()
        self.assertEqual(contents(again), before)
        self.assertEqual(again.blob(digest(b"x")), b"x")
        self.assertEqual(again.day("lars", 0), new.record)

    def test_seq_is_dense_across_days(self) -> None:
        store = self.store
        sizes = {0: 1, 1: 4, 2: 2, 3: 7}
        for day, n_sql in sizes.items():
            append(store, next_day(store, "lars", day, n_sql=n_sql, files={f"d{day}": b"%d" % day}))
        stored = list(store.events("lars"))
        self.assertEqual([e.seq for e in stored], list(range(len(stored))))
        self.assertEqual(len(stored), sum(n + 2 for n in sizes.values()))
        records = store.days("lars")
        self.assertEqual([r.day for r in records], list(sizes))
        expected_first = 0
        prev = GENESIS
        for rec in records:
            self.assertEqual(rec.first_seq, expected_first)
            span = stored[rec.first_seq: rec.last_seq + 1]
            self.assertEqual({e.day for e in span}, {rec.day})
            self.assertEqual(span[0].prev, prev)
            self.assertEqual(span[-1].event_id, rec.head)
            expected_first, prev = rec.last_seq + 1, rec.head
        summary = self.summary("lars")
        self.assertEqual((summary.n_days, summary.first_day, summary.last_day), (4, 0, 3))
        self.assertEqual((summary.last_seq, summary.head), (len(stored) - 1, records[-1].head))

    def test_days_need_not_be_consecutive(self) -> None:
        store = self.store
        append(store, next_day(store, "lars", 3))
        append(store, next_day(store, "lars", 10))
        self.assertEqual([r.day for r in store.days("lars")], [3, 10])
        summary = self.summary("lars")
        self.assertEqual((summary.n_days, summary.first_day, summary.last_day), (2, 3, 10))
        with self.assertRaises(NotFoundError):
            store.day("lars", 5)

    # --- order and concurrency guarantees -----------------------------------------

    def test_existing_day_is_refused(self) -> None:
        store = self.store
        append(store, next_day(store, "lars", 0))
        append(store, next_day(store, "lars", 1))
        # Correctly chained onto the stream's end, but day 1 is taken.
        again = next_day(store, "lars", 1, files={"new": b"never stored"})
        self.assert_unchanged_after(again, expected_last_seq=again.record.first_seq - 1,
                                    error=DayOrderError)
        with self.assertRaisesRegex(DayOrderError, r"lars@1 already exists"):
            append(store, again)

    def test_day_before_the_last_is_refused(self) -> None:
        store = self.store
        append(store, next_day(store, "lars", 0))
        append(store, next_day(store, "lars", 2))
        late = next_day(store, "lars", 1, files={"late": b"never stored"})
        self.assert_unchanged_after(late, expected_last_seq=late.record.first_seq - 1,
                                    error=DayOrderError)
        with self.assertRaisesRegex(DayOrderError, r"lars@1 is not after the last day 2"):
            append(store, late)

    def test_stale_expected_seq_is_a_conflict(self) -> None:
        store = self.store
        day0 = append(store, next_day(store, "lars", 0))
        # A writer read the stream after day 0; meanwhile others appended days 1 and 2.
        append(store, next_day(store, "lars", 1))
        append(store, next_day(store, "lars", 2))
        stale = build_day("lars", 3, first_seq=day0.record.last_seq + 1, prev=day0.record.head,
                          files={"mine": b"stale writer"})
        self.assert_unchanged_after(stale, expected_last_seq=day0.record.last_seq,
                                    error=ConflictError)
        with self.assertRaisesRegex(ConflictError, r"lars@3"):
            append(store, stale)

    def test_new_persona_expected_but_stream_exists_is_a_conflict(self) -> None:
        store = self.store
        append(store, next_day(store, "lars", 0))
        fresh = build_day("lars", 1, first_seq=0, prev=GENESIS, files={"f": b"fresh"})
        self.assert_unchanged_after(fresh, expected_last_seq=-1, error=ConflictError)

    def test_existing_stream_expected_but_persona_unknown_is_a_conflict(self) -> None:
        ghost = build_day("ghost", 1, first_seq=3, prev=digest(b"gone"), files={"g": b"ghost"})
        self.assert_unchanged_after(ghost, expected_last_seq=2, error=ConflictError)
        self.assertIsNone(self.store.persona("ghost"))

    def test_first_seq_must_follow_expected_seq(self) -> None:
        store = self.store
        append(store, next_day(store, "lars", 0))
        end = self.summary("lars").last_seq
        gap = build_day("lars", 1, first_seq=end + 2, prev=GENESIS, files={"gap": b"gap"})
        self.assert_unchanged_after(gap, expected_last_seq=end, error=StoreError)

    def test_racing_appends_of_one_day_store_it_once(self) -> None:
        store = self.store
        append(store, next_day(store, "lars", 0))
        # Several writers built the same next day on the same end of the stream: one wins,
        # every other is refused with a ConflictError or DayOrderError and writes nothing.
        candidates = [next_day(store, "lars", 1, files={f"w{i}": b"writer %d" % i})
                      for i in range(4)]
        raised = self.run_concurrently([functools.partial(append, new=new)
                                        for new in candidates])
        winners = [new for new, exc in zip(candidates, raised, strict=True) if exc is None]
        self.assertEqual(len(winners), 1, raised)
        for exc in raised:
            if exc is not None:
                self.assertIsInstance(exc, ConflictError | DayOrderError)
        (winner,) = winners
        self.assertEqual(store.day("lars", 1), winner.record)
        self.assertEqual(list(store.events("lars", winner.record.first_seq)), winner.events)
        losers = {d for new in candidates if new is not winner for d in new.blobs}
        self.assertEqual(store.missing_blobs(losers), losers)

    # --- atomicity: a failure after the day was claimed writes nothing ------------

    def test_duplicate_seq_within_a_new_persona_writes_nothing(self) -> None:
        store = self.store
        good = build_day("lars", 0, first_seq=0, prev=GENESIS, n_sql=3,
                         files={"a.bin": b"blob of a failed day"})
        # Two events claim seq 1: the events insert fails after the persona row and the
        # blobs went in, and all of it must roll back.
        events = list(good.events)
        events[2] = make_event(persona="lars", seq=1, day=0, ts=ts_of(0, 2),
                               prev=events[1].event_id, payload=sql_payload("lars", 0, 9))
        broken = new_day(events, good.blobs)
        self.assert_unchanged_after(broken, expected_last_seq=-1, error=StoreError)
        self.assertIsNone(store.persona("lars"))
        self.assertEqual(store.missing_blobs(good.blobs), set(good.blobs))
        # The store is not wedged: the correct day goes in afterwards.
        append(store, good)
        self.assertEqual(list(store.events("lars")), good.events)

    def test_seq_colliding_with_stored_events_writes_nothing(self) -> None:
        store = self.store
        day0 = append(store, next_day(store, "lars", 0, files={"shared": b"kept"}))
        end = day0.record.last_seq
        # The record follows the stream, but the events restart one seq too early.
        overlap = build_day("lars", 1, first_seq=end, prev=day0.record.head,
                            files={"shared": b"kept", "new": b"must not stay"})
        record = msgspec.structs.replace(overlap.record, first_seq=end + 1)
        broken = NewDay(record=record, events=overlap.events, blobs=overlap.blobs)
        self.assert_unchanged_after(broken, expected_last_seq=end, error=StoreError)
        self.assertEqual(store.blob(digest(b"kept")), b"kept")
        self.assertEqual(store.missing_blobs([digest(b"must not stay")]),
                         {digest(b"must not stay")})
        append(store, next_day(store, "lars", 1))
        self.assertEqual(self.summary("lars").n_days, 2)

    # --- blobs --------------------------------------------------------------------

    def test_same_bytes_stored_again_read_back_once(self) -> None:
        store = self.store
        shared = b"the same photo" * 100
        only_mia = b"mia only"
        append(store, next_day(store, "lars", 0, files={"img/p.png": shared}))
        # Another persona, then a later day of the first, store the same bytes again.
        append(store, next_day(store, "mia", 0, files={"pics/same.png": shared,
                                                      "own.txt": only_mia}))
        append(store, next_day(store, "lars", 1, files={"copy.png": shared}))
        self.assertEqual(store.blob(digest(shared)), shared)
        absent = digest(b"never written")
        asked = iter([digest(shared), absent, digest(only_mia), absent])
        self.assertEqual(store.missing_blobs(asked), {absent})
        self.assertEqual(store.missing_blobs([digest(shared)]), set())

    # --- events() ranges ----------------------------------------------------------

    def test_events_ranges_across_pages(self) -> None:
        store = self.store
        page = self.event_page
        # Two days whose events together span more than two pages.
        first = append(store, next_day(store, "big", 0, n_sql=page + 3))
        second = append(store, next_day(store, "big", 1, n_sql=page - 1))
        append(store, next_day(store, "small", 0))  # events of another persona interleave
        everything = first.events + second.events
        total = len(everything)
        self.assertGreater(total, 2 * page)
        self.assertEqual(list(store.events("big")), everything)
        windows: list[tuple[int, int | None]] = [
            (0, page - 1),  # exactly one full page
            (0, 2 * page - 1),  # exactly two full pages
            (page - 2, page + 1),  # across the first page boundary
            (page, None),  # from a page boundary to the end
            (17, 2 * page + 3),
            (total - 1, None),
            (total, None),  # past the end
            (5, 4),  # empty range
            (7, 7),
        ]
        for first_seq, last_seq in windows:
            got = [e.seq for e in store.events("big", first_seq, last_seq)]
            end = total - 1 if last_seq is None else min(last_seq, total - 1)
            self.assertEqual(got, list(range(first_seq, end + 1)), (first_seq, last_seq))
        self.assertEqual([e.seq for e in store.events("small")], [0, 1])
        day1 = store.day("big", 1)
        self.assertEqual(list(store.events("big", day1.first_seq, day1.last_seq)),
                         second.events)

    def test_event_pages_are_the_events_as_rows(self) -> None:
        store = self.store
        page = self.event_page
        append(store, next_day(store, "big", 0, n_sql=page + 3))
        append(store, next_day(store, "big", 1, n_sql=page - 1))
        append(store, next_day(store, "small", 0))  # events of another persona interleave
        total = 2 * page + 2
        for first_seq, last_seq in [(0, None), (0, page - 1), (page - 2, page + 1),
                                    (page, None), (total - 1, None), (total, None), (5, 4)]:
            want = [event_row(e) for e in store.events("big", first_seq, last_seq)]
            pages = list(store.event_pages("big", first_seq, last_seq))
            self.assertTrue(all(pages), (first_seq, last_seq))  # no empty page
            got = [row for rows in pages for row in rows]
            self.assertEqual(got, want, (first_seq, last_seq))
            self.assertTrue(all(type(row[5]) is bytes for row in got))

    def test_two_reads_of_a_stream_can_interleave(self) -> None:
        store = self.store
        new = append(store, next_day(store, "lars", 0, n_sql=self.event_page * 2 + 1))
        outer: Iterator[StoredEvent] = store.events("lars")
        inner = store.events("lars")
        pairs = list(zip(outer, inner, strict=True))
        self.assertEqual([a for a, _ in pairs], new.events)
        self.assertEqual([b for _, b in pairs], new.events)

    # --- queries across personas ------------------------------------------------------

    def test_days_with_hash(self) -> None:
        store = self.store
        same = digest(b"an identical world")
        append(store, next_day(store, "zed", 0, world_hash=same))
        append(store, next_day(store, "amy", 0))
        append(store, next_day(store, "amy", 1, world_hash=same))
        append(store, next_day(store, "amy", 4, world_hash=same))
        append(store, next_day(store, "bob", 2, world_hash=same))
        found = store.days_with_hash(same)
        self.assertEqual([(r.persona, r.day) for r in found],
                         [("amy", 1), ("amy", 4), ("bob", 2), ("zed", 0)])
        self.assertEqual(found[0], store.day("amy", 1))
        amy0 = store.day("amy", 0)
        self.assertEqual(store.days_with_hash(amy0.world_hash), [amy0])
        self.assertEqual(store.days_with_hash(digest(b"no such world")), [])

    def test_personas_are_sorted_by_name(self) -> None:
        store = self.store
        # Code-point order, whatever the database's collation: '-' < '0' < '_' < 'a'.
        names = ["zed", "ab", "a_b", "a-c", "a0", "a", "b-2", "b_1", "b1", "b"]
        for name in names:
            append(store, next_day(store, name, 0))
        self.assertEqual([p.persona for p in store.personas()], sorted(names))
        self.assertEqual([p.persona for p in store.personas()],
                         ["a", "a-c", "a0", "a_b", "ab", "b", "b-2", "b1", "b_1", "zed"])
        same = digest(b"shared")
        for name in names:
            append(store, next_day(store, name, 1, world_hash=same))
        self.assertEqual([r.persona for r in store.days_with_hash(same)], sorted(names))

    def test_personas_summaries_track_their_own_stream(self) -> None:
        store = self.store
        append(store, next_day(store, "lars", 0))
        append(store, next_day(store, "mia", 5, n_sql=6))
        append(store, next_day(store, "lars", 1))
        summaries = {p.persona: p for p in store.personas()}
        self.assertEqual(summaries, {"lars": store.persona("lars"), "mia": store.persona("mia")})
        lars, mia = summaries["lars"], summaries["mia"]
        self.assertEqual((lars.n_days, lars.last_day, lars.last_seq), (2, 1, 3))
        self.assertEqual((mia.n_days, mia.first_day, mia.last_day, mia.last_seq), (1, 5, 5, 5))
        self.assertEqual(mia.head, store.day("mia", 5).head)
        self.assertEqual(lars.last_ts, store.day("lars", 1).last_ts)


class EpisodeStoreContract(StoreContract[EpisodeStore]):
    """Guarantees every EpisodeStore keeps (see worldstore/store.py)."""

    def test_empty_store(self) -> None:
        self.assertEqual(self.store.episodes(), [])
        self.assertEqual(self.store.episodes(digest(b"any world")), [])
        with self.assertRaisesRegex(NotFoundError, "e" * 32):
            self.store.episode("e" * 32)

    def test_put_reads_back_exactly(self) -> None:
        body = bytes(range(256)) * 3  # every byte value survives the round trip
        finished = episode_record("a" * 32, final_hash=digest(b"end"), n_calls=7, body=body)
        bare = episode_record("b" * 32, final_hash=None, n_calls=0, body=b"")
        self.store.put_episode(finished)
        self.store.put_episode(bare)
        self.assertEqual(self.store.episode("a" * 32), finished)
        self.assertEqual(self.store.episode("b" * 32), bare)
        self.assertEqual(self.store.episode("a" * 32).body, body)
        self.assertEqual(self.store.episodes(), [finished, bare])

    def test_episodes_survive_reopening_and_show_on_other_connections(self) -> None:
        record = episode_record("c" * 32)
        other = self.open_store()
        self.store.put_episode(record)
        self.assertEqual(other.episode(record.episode_id), record)
        self.store.close()
        again = self.open_store()
        self.assertEqual(again.episodes(), [record])

    def test_storing_the_same_episode_again_is_a_no_op(self) -> None:
        record = episode_record("d" * 32, final_hash=digest(b"end"))
        self.store.put_episode(record)
        self.store.put_episode(record)
        self.open_store().put_episode(msgspec.structs.replace(record))  # an equal copy
        self.assertEqual(self.store.episodes(), [record])

    def test_a_different_episode_under_a_stored_id_is_a_conflict(self) -> None:
        record = episode_record("e" * 32, final_hash=digest(b"end"), n_calls=3)
        self.store.put_episode(record)
        changes: dict[str, Any] = {
            "body": record.body + b" ", "final_hash": None, "n_calls": 4, "day": 1,
            "persona": "mia", "world_hash": digest(b"another start"),
        }
        for name, value in changes.items():
            with self.subTest(changed=name):
                changed = msgspec.structs.replace(record, **{name: value})
                with self.assertRaisesRegex(ConflictError, record.episode_id):
                    self.store.put_episode(changed)
                self.assertEqual(self.store.episodes(), [record])
                self.assertEqual(self.open_store().episode(record.episode_id), record)

    def test_episodes_are_sorted_by_id_and_found_by_start_world(self) -> None:
        start, other_start = digest(b"lars@7"), digest(b"lars@6")
        # Code-point order, whatever the database's collation: '-' < '0' < '_' < 'a'.
        ids = ["f" * 32, "a_b", "a-c", "a0", "ab", "0" * 32]
        for i, episode_id in enumerate(ids):
            self.store.put_episode(episode_record(
                episode_id, world_hash=start if i % 2 else other_start))
        self.assertEqual([r.episode_id for r in self.store.episodes()], sorted(ids))
        self.assertEqual([r.episode_id for r in self.store.episodes(start)],
                         sorted(ids[1::2]))
        self.assertEqual([r.episode_id for r in self.store.episodes(other_start)],
                         sorted(ids[0::2]))
        self.assertEqual(self.store.episodes(digest(b"no such world")), [])

    def test_racing_writers_of_the_same_episode_all_succeed(self) -> None:
        record = episode_record("f" * 32, final_hash=digest(b"end"))
        raised = self.run_concurrently([operator.methodcaller("put_episode", record)] * 4)
        self.assertEqual(raised, [None] * 4)
        self.assertEqual(self.store.episodes(), [record])

    def test_racing_writers_of_different_episodes_under_one_id_store_one(self) -> None:
        records = [episode_record("9" * 32, n_calls=n) for n in range(4)]
        raised = self.run_concurrently([operator.methodcaller("put_episode", r)
                                        for r in records])
        winners = [r for r, exc in zip(records, raised, strict=True) if exc is None]
        self.assertEqual(len(winners), 1, raised)
        for exc in raised:
            if exc is not None:
                self.assertIsInstance(exc, ConflictError)
        self.assertEqual(self.store.episodes(), winners)


class ClaimStoreContract(StoreContract[ClaimStore]):
    """Guarantees every ClaimStore keeps (see worldstore/store.py)."""

    @staticmethod
    def no_twin(word: str, pause: float = 0.0
                ) -> Callable[[list[ClaimRecord]], tuple[ClaimState, bytes] | None]:
        """The decision of a claimant of `word`: nothing if another claim holds the same
        word (deciding `pause` seconds, so that racing claimants overlap)."""
        def decide(found: list[ClaimRecord]) -> tuple[ClaimState, bytes] | None:
            time.sleep(pause)
            return None if any(c.body == word.encode() for c in found) else (
                "open", word.encode())
        return decide

    def test_a_claim_reads_back_and_settles_once(self) -> None:
        self.assertEqual(self.store.claims("tasks"), [])
        made = self.store.claim("tasks", "b", "w1", self.no_twin("x"))
        self.assertEqual(made, ClaimRecord(scope="tasks", key="b", owner="w1", state="open",
                                           body=b"x"))
        self.assertIsNotNone(self.store.claim("tasks", "a", "w2", self.no_twin("y")))
        self.assertEqual([(c.key, c.state, c.body) for c in self.open_store().claims("tasks")],
                         [("a", "open", b"y"), ("b", "open", b"x")])
        self.store.settle("tasks", "b", "kept")
        with self.assertRaises(NotFoundError):
            self.store.settle("tasks", "b", "dropped")  # settled already
        with self.assertRaises(NotFoundError):
            self.store.settle("tasks", "zz", "kept")
        with self.assertRaises(StoreError):
            self.store.settle("tasks", "a", "open")
        self.assertEqual([c.state for c in self.store.claims("tasks")], ["open", "kept"])
        self.assertEqual(self.store.claims("other"), [])

    def test_a_decision_sees_the_claims_and_none_writes_nothing(self) -> None:
        self.assertIsNotNone(self.store.claim("tasks", "a", "w", self.no_twin("x")))
        self.assertIsNone(self.store.claim("tasks", "b", "w", self.no_twin("x")))
        self.assertEqual([c.key for c in self.store.claims("tasks")], ["a"])
        with self.assertRaises(ConflictError):
            self.store.claim("tasks", "a", "w", self.no_twin("z"))
        marker = self.store.claim("tasks", "c", "w", lambda _found: ("dropped", b"held"))
        self.assertEqual(marker.state if marker else None, "dropped")
        seen: list[list[str]] = []

        def look(found: list[ClaimRecord]) -> None:
            seen.append([c.key for c in found])

        self.store.claim("tasks", "d", "w", look)
        self.assertEqual(seen, [["a"]])  # dropped claims are not shown to a decision
        with self.assertRaises(StoreError):
            self.store.claim("tasks", "e", "w", lambda _found: ("kept", b""))
        self.store.settle("tasks", "a", "dropped")
        self.assertIsNotNone(self.store.claim("tasks", "b", "w", self.no_twin("x")))
        self.assertIsNotNone(self.store.claim("elsewhere", "a", "w", self.no_twin("x")))
        self.assertEqual([c.key for c in self.store.claims("tasks")], ["a", "b", "c"])

    def test_of_racing_claimants_of_one_thing_exactly_one_gets_it(self) -> None:
        for round_no in range(3):
            scope = f"race-{round_no}"
            raised = self.run_concurrently([
                functools.partial(lambda store, key, scope: store.claim(
                    scope, key, "w", self.no_twin("same", 0.05)), key=k, scope=scope)
                for k in ("a", "b", "c", "d")])
            self.assertEqual(raised, [None] * 4)
            self.assertEqual(len(self.store.claims(scope)), 1)


__all__ = [
    "ClaimStoreContract",
    "EpisodeStoreContract",
    "EventStoreContract",
    "StoreContract",
    "append",
    "build_day",
    "contents",
    "episode_record",
    "new_day",
    "next_day",
    "sql_payload",
    "ts_of",
]
