"""Writers racing on one store, as real processes (spawn), on SQLite and PostgreSQL.

The workers are module-level functions so a spawned child can import them; each reports
what happened through a queue and never lets an exception escape unreported (a broken
barrier releases the others, so a failing worker cannot hang the test).
"""

from __future__ import annotations

import io
import itertools
import json
import multiprocessing as mp
import queue
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from replay.engine import Worlds
from replay.fold import build_days
from replay.hashing import encode_manifest
from worldstore.canonical import digest
from worldstore.errors import ConflictError, DayOrderError
from worldstore.events import GENESIS, FileWritePayload, Payload, SqlPayload, make_event
from worldstore.open import open_event_store
from worldstore.store import DayRecord, EventStore, NewDay
from worldstore.testing import ts_of

SPAWN = mp.get_context("spawn")
RACERS = 3
ROUNDS = 3
JOIN_TIMEOUT = 120  # generous: only a hung worker gets near it
LOSER_ERRORS = {"ConflictError", "DayOrderError"}


# --- helpers run in the workers --------------------------------------------------------


def world_day(store: EventStore, persona: str, day: int, author: str) -> NewDay:
    """`persona`'s next day as `author` writes it, built on what the store holds now and
    hashed for real (the stored events are replayed in a scratch world), so that verify
    can re-derive it later."""
    summary = store.persona(persona)
    first_seq, prev = (summary.last_seq + 1, summary.head) if summary else (0, GENESIS)
    text = f"day {day} written by {author}\n".encode()
    payloads: list[Payload] = []
    if first_seq == 0:
        payloads.append(SqlPayload(service="notes", sql="CREATE TABLE notes("
                                   "id INTEGER PRIMARY KEY, author TEXT NOT NULL, day INTEGER)"))
    payloads += [
        SqlPayload(service="notes", sql="INSERT INTO notes(author, day) VALUES (?, ?)",
                   params=[author, day]),
        FileWritePayload(path=f"days/{day}.txt", blob=digest(text), size=len(text),
                         encoding="text"),
    ]
    events = []
    for offset, payload in enumerate(payloads):
        event = make_event(persona=persona, seq=first_seq + offset, day=day,
                           ts=ts_of(day, offset), prev=prev, payload=payload)
        events.append(event)
        prev = event.event_id
    blobs = {digest(text): text}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "world"
        root.mkdir()
        stream = itertools.chain(store.events(persona), events)
        *_, built = build_days(root, stream, lambda d: blobs.get(d) or store.blob(d))
    record = DayRecord(
        persona=persona, day=day, first_seq=first_seq, last_seq=events[-1].seq,
        first_ts=events[0].ts, last_ts=events[-1].ts, head=events[-1].event_id,
        world_hash=built.world_hash, manifest=encode_manifest(built.manifest),
    )
    return NewDay(record=record, events=events, blobs=blobs)


def _reporting(results: Any, barrier: Any, work: Callable[[], None]) -> None:
    try:
        work()
    except BaseException as exc:
        results.put({"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"})
        barrier.abort()


def append_racer(location: str, worker: int, barrier: Any, results: Any) -> None:
    """Each round: read the stream, build the same day number, wait for the others, append."""
    def work() -> None:
        store = open_event_store(location)
        try:
            for day in range(ROUNDS):
                new = world_day(store, "racer", day, f"worker {worker}")
                barrier.wait()
                try:
                    store.append_day(new, expected_last_seq=new.record.first_seq - 1)
                    outcome = "won"
                except (ConflictError, DayOrderError) as exc:
                    outcome = type(exc).__name__
                results.put({"day": day, "worker": worker, "outcome": outcome,
                             "head": new.record.head,
                             "events": [e.event_id for e in new.events],
                             "blobs": sorted(new.blobs)})
                barrier.wait()  # nobody reads the next round's stream before all appended
        finally:
            store.close()
    _reporting(results, barrier, work)


def persona_appender(location: str, persona: str, days: int, barrier: Any,
                     results: Any) -> None:
    def work() -> None:
        store = open_event_store(location)
        try:
            barrier.wait()
            for day in range(days):
                new = world_day(store, persona, day, "shared author")
                store.append_day(new, expected_last_seq=new.record.first_seq - 1)
            results.put({"persona": persona, "outcome": "done"})
        finally:
            store.close()
    _reporting(results, barrier, work)


def importer(location: str, cache: str, path: str, barrier: Any, results: Any) -> None:
    def work() -> None:
        worlds = Worlds.open(location, cache=cache)
        try:
            barrier.wait()
            try:
                days = worlds.import_file(Path(path))
            except (ConflictError, DayOrderError) as exc:
                results.put({"path": path, "outcome": type(exc).__name__, "message": str(exc)})
                return
            results.put({"path": path, "outcome": "done",
                         "days": [(d.persona, d.day, d.status, d.world_hash) for d in days]})
        finally:
            worlds.close()
    _reporting(results, barrier, work)


# --- running workers from the test ------------------------------------------------------


def run_workers(target: Callable[..., None], arg_lists: list[tuple[Any, ...]],
                n_reports: int) -> list[dict[str, Any]]:
    """Start one spawned process per argument tuple (a barrier and a queue are appended),
    collect `n_reports` reports and fail on any worker error."""
    barrier = SPAWN.Barrier(len(arg_lists))
    results = SPAWN.Queue()
    procs = [SPAWN.Process(target=target, args=(*args, barrier, results)) for args in arg_lists]
    for p in procs:
        p.start()
    reports: list[dict[str, Any]] = []
    try:
        while len(reports) < n_reports:
            report = results.get(timeout=JOIN_TIMEOUT)
            assert "error" not in report, report["error"]
            reports.append(report)
    except queue.Empty:
        pytest.fail(f"workers went silent after {len(reports)} of {n_reports} reports")
    finally:
        for p in procs:
            p.join(timeout=JOIN_TIMEOUT)
            if p.is_alive():
                p.kill()
                p.join()
    assert [p.exitcode for p in procs] == [0] * len(procs)
    return reports


def assert_verifies(location: str, cache: Path) -> Worlds:
    worlds = Worlds.open(location, cache=cache)
    report = worlds.verify()
    assert report.ok, [p.message for p in report.problems]
    return worlds


# --- store API -----------------------------------------------------------------------


def test_racing_appends_one_winner_per_day(store_location: str, cache_dir: Path) -> None:
    # All racers open a brand-new store at once, so the schema migration races too.
    reports = run_workers(append_racer, [(store_location, w) for w in range(RACERS)],
                          RACERS * ROUNDS)
    store = open_event_store(store_location)
    try:
        winners = {}
        for day in range(ROUNDS):
            round_reports = [r for r in reports if r["day"] == day]
            outcomes = sorted(r["outcome"] for r in round_reports)
            assert len(round_reports) == RACERS
            assert outcomes.count("won") == 1, outcomes
            assert set(outcomes) - {"won"} <= LOSER_ERRORS, outcomes
            winner = next(r for r in round_reports if r["outcome"] == "won")
            winners[day] = winner
            # The stored day is exactly the winner's: its events, its head, its blobs.
            record = store.day("racer", day)
            stored_ids = [e.event_id for e in
                          store.events("racer", record.first_seq, record.last_seq)]
            assert stored_ids == winner["events"]
            assert record.head == winner["head"]
            assert store.missing_blobs(winner["blobs"]) == set()
            # No loser left anything behind (their file text names them, so their blobs
            # differ from the winner's).
            for loser in round_reports:
                if loser is not winner:
                    assert store.missing_blobs(loser["blobs"]) == set(loser["blobs"])
        summary = store.persona("racer")
        assert summary is not None
        assert (summary.n_days, summary.last_day) == (ROUNDS, ROUNDS - 1)
        n_events = sum(len(w["events"]) for w in winners.values())
        assert [e.seq for e in store.events("racer")] == list(range(n_events))
        assert summary.head == winners[ROUNDS - 1]["head"]
    finally:
        store.close()
    assert_verifies(store_location, cache_dir).close()


def test_appends_to_different_personas_do_not_conflict(store_location: str,
                                                       cache_dir: Path) -> None:
    # Same blob bytes in both streams ("shared author" writes identical day files), so
    # both writers also insert the same blob digests at the same time.
    names = ["ann", "bob", "cy"]
    reports = run_workers(persona_appender, [(store_location, n, 4) for n in names], len(names))
    assert sorted(r["persona"] for r in reports) == names
    worlds = assert_verifies(store_location, cache_dir)
    try:
        assert [(p.persona, p.n_days) for p in worlds.store.personas()] == [
            (n, 4) for n in names]
        ann, bob = worlds.store.days("ann"), worlds.store.days("bob")
        assert [r.world_hash for r in ann] == [r.world_hash for r in bob]
    finally:
        worlds.close()


# --- the engine's import ------------------------------------------------------------


def persona_file(tmp_path: Path, persona: str, days: int) -> Path:
    """An interchange file: a notes table, a note and a file per day (the same file bytes
    for every persona, so concurrent imports store the same blobs)."""
    lines: list[dict[str, Any]] = [{
        "persona": persona, "day": 0, "ts": ts_of(0, 0), "type": "sql", "service": "notes",
        "sql": "CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT NOT NULL)"}]
    for day in range(days):
        lines.append({"persona": persona, "day": day, "ts": ts_of(day, 1), "type": "sql",
                      "service": "notes", "sql": "INSERT INTO notes(body) VALUES (?)",
                      "params": [f"{persona} on day {day}"]})
        lines.append({"persona": persona, "day": day, "ts": ts_of(day, 2), "type": "file_write",
                      "path": f"log/{day}.txt", "text": f"entry of day {day}\n"})
    path = tmp_path / f"{persona}.jsonl"
    path.write_bytes(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    return path


def test_concurrent_imports_of_different_personas_both_succeed(
        store_location: str, cache_dir: Path, tmp_path: Path) -> None:
    files = [persona_file(tmp_path, name, 5) for name in ("ann", "bob")]
    reports = run_workers(importer, [(store_location, str(cache_dir), str(f)) for f in files],
                          len(files))
    for report in reports:
        assert report["outcome"] == "done", report
        assert [(d[1], d[2]) for d in report["days"]] == [(day, "imported") for day in range(5)]
    worlds = assert_verifies(store_location, cache_dir)
    try:
        assert [(p.persona, p.n_days) for p in worlds.store.personas()] == [("ann", 5),
                                                                            ("bob", 5)]
    finally:
        worlds.close()


def test_concurrent_imports_of_the_same_file(store_location: str, cache_dir: Path,
                                             demo_jsonl: Path) -> None:
    """Two processes import the demo file at once. The days are committed one by one, so
    the outcome depends on timing; what must hold either way:

    * each import either returns a result for all 8 days, each 'imported' or 'unchanged',
      or stops with ConflictError/DayOrderError (it lost a day to the other import);
    * at least one import completes; if both complete, each day was imported by one and
      found unchanged by the other;
    * the store holds exactly the file's 8 days and verifies.
    """
    reports = run_workers(importer, [(store_location, str(cache_dir), str(demo_jsonl))] * 2, 2)
    finished = [r for r in reports if r["outcome"] == "done"]
    stopped = [r for r in reports if r["outcome"] != "done"]
    assert finished, reports
    for report in stopped:
        assert report["outcome"] in LOSER_ERRORS, report
        assert "lars" in report["message"]
    for report in finished:
        assert [d[1] for d in report["days"]] == list(range(8))
        assert {d[2] for d in report["days"]} <= {"imported", "unchanged"}
    if len(finished) == 2:  # nobody stopped: a day imported by one was unchanged for the other
        statuses = list(zip(*(sorted(r["days"]) for r in finished), strict=True))
        assert all(sorted([a[2], b[2]]) == ["imported", "unchanged"] for a, b in statuses)
    worlds = assert_verifies(store_location, cache_dir)
    try:
        records = worlds.store.days("lars")
        assert [r.day for r in records] == list(range(8))
        for report in finished:
            assert [d[3] for d in report["days"]] == [r.world_hash for r in records]
        with demo_jsonl.open("rb") as fh:
            again = worlds.import_stream(fh, source=str(demo_jsonl))
        assert {d.status for d in again} == {"unchanged"}
        out = io.BytesIO()
        assert worlds.export("lars", out) == len(demo_jsonl.read_bytes().splitlines())
        exported = [json.loads(line) for line in out.getvalue().splitlines()]
        assert exported == [json.loads(line) for line in demo_jsonl.read_bytes().splitlines()]
    finally:
        worlds.close()


def test_import_refuses_a_persona_that_moved_while_it_was_prepared(tmp_path: Path) -> None:
    """Deterministic version of the race above: while an import is applying its days,
    another writer appends to one of its personas. The import must refuse with
    ConflictError before committing anything (it used to fail an internal assert)."""
    location = str(tmp_path / "store")
    first = Worlds.open(location)
    other = Worlds.open(location)
    try:
        bob = persona_file(tmp_path, "bob", 2)
        bob_lines = bob.read_bytes().splitlines(keepends=True)
        day0 = b"".join(line for line in bob_lines if b'"day": 0' in line)
        day1 = b"".join(line for line in bob_lines if b'"day": 1' in line)
        first.import_stream(io.BytesIO(day0), source="bob-day0")
        ann = persona_file(tmp_path, "ann", 1).read_bytes()

        def meanwhile(_: object) -> None:  # runs after ann@0 was applied, before bob starts
            if other.store.persona("bob").n_days == 1:  # type: ignore[union-attr]
                other.import_stream(io.BytesIO(day1), source="other writer")

        with pytest.raises(ConflictError, match="persona 'bob' changed"):
            first.import_stream(io.BytesIO(ann + day1), source="both", progress=meanwhile)
        assert [p.persona for p in first.store.personas()] == ["bob"]  # ann was not stored
        assert first.store.persona("bob").n_days == 2  # type: ignore[union-attr]
        again = first.import_stream(io.BytesIO(ann + day1), source="both")
        assert [(d.persona, d.day, d.status) for d in again] == [("ann", 0, "imported"),
                                                                ("bob", 1, "unchanged")]
        report = first.verify()
        assert report.ok, [p.message for p in report.problems]
    finally:
        first.close()
        other.close()
