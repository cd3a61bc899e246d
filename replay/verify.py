"""verify: re-derive every day from the log and check everything the store holds.

Nothing is trusted: the hash chain is recomputed event by event, every blob is re-hashed,
every day is replayed from an empty world (never from the cache) and its hash compared
with the recorded one, and every cached snapshot of the persona is re-hashed. A mismatch
names the persona, the day, the event and the table or file.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from replay.cache import SnapshotCache
from replay.errors import ApplyError
from replay.files import remove_tree
from replay.fold import build_days
from replay.hashing import Manifest, decode_manifest, world_manifest
from replay.report import DayResult, Problem, Progress, VerifyReport
from worldstore.canonical import digest
from worldstore.errors import NotFoundError, WorldError
from worldstore.events import (
    GENESIS,
    AppPayload,
    FileDeletePayload,
    FileWritePayload,
    Payload,
    SqlPayload,
    StoredEvent,
    blob_of,
    recompute_id,
)
from worldstore.store import DayRecord, EventStore, PersonaSummary

# Where an event sits: its day and its index within that day (None when no day record
# covers its seq).
Locate = Callable[[StoredEvent], tuple[int | None, int | None]]


def verify_persona(store: EventStore, cache: SnapshotCache, persona: str,
                   report: VerifyReport, progress: Progress | None) -> None:
    """Check everything `store` and `cache` hold of `persona`; add what is wrong to
    `report.problems` and what was checked to its counts."""
    records = store.days(persona)
    if not records:
        report.problems.append(Problem(persona, "day", f"no persona {persona!r} in the store"))
        return
    events = list(store.events(persona))
    report.personas += 1
    report.days += len(records)
    report.events += len(events)
    problems = report.problems
    day_of_seq = _day_index(records)

    def where(event: StoredEvent) -> tuple[int | None, int | None]:
        rec = day_of_seq.get(event.seq)
        return (rec.day, event.seq - rec.first_seq) if rec else (event.day, None)

    chain_ok = _check_chain(persona, events, where, problems)
    _check_days(persona, records, events, store.persona(persona), problems)
    _check_blobs(store, persona, events, where, problems)
    if chain_ok:
        _rederive(store, cache, persona, records, events, problems, progress)
    report.cache_entries += _check_cache(cache, persona, records, problems)


def _check_chain(persona: str, events: list[StoredEvent], where: Locate,
                 problems: list[Problem]) -> bool:
    """Recompute the hash chain event by event; False if the stream cannot be replayed."""
    chain_ok = True
    prev = GENESIS
    for i, event in enumerate(events):
        day, index = where(event)
        if event.seq != i:
            problems.append(Problem(persona, "chain", f"event seq {event.seq} found where seq "
                                    f"{i} was expected: the stream has a gap", day, event.seq))
            chain_ok = False
            break
        if event.prev != prev:
            problems.append(Problem(persona, "chain", f"{persona}@{day} event #{index} (seq "
                                    f"{event.seq}) does not link to its predecessor",
                                    day, event.seq, index))
            chain_ok = False
        if recompute_id(event) != event.event_id:
            problems.append(Problem(persona, "chain", f"{persona}@{day} event #{index} (seq "
                                    f"{event.seq}) was modified: its content no longer matches "
                                    "its id", day, event.seq, index))
            chain_ok = False
        prev = event.event_id
    return chain_ok


def _check_cache(cache: SnapshotCache, persona: str, records: list[DayRecord],
                 problems: list[Problem]) -> int:
    """Re-hash every cached snapshot of the persona's days, dropping the bad ones; returns
    how many entries there were."""
    entries = 0
    for rec in records:
        if cache.get(rec.world_hash) is None:
            continue
        entries += 1
        problem = cache.check(rec.world_hash)
        if problem:
            table, file = _cache_difference(cache, rec)
            problems.append(Problem(persona, "cache", f"{persona}@{rec.day}: {problem}; "
                                    "the entry was dropped and will be rebuilt from the log",
                                    rec.day, table=table, file=file))
            cache.evict(rec.world_hash)
    return entries


def _manifest_hash(rec: DayRecord) -> str | None:
    try:
        return decode_manifest(rec.manifest).world_hash()
    except Exception:  # an unreadable manifest is as wrong as a modified one
        return None


def _cache_difference(cache: SnapshotCache, rec: DayRecord) -> tuple[str | None, str | None]:
    """The first table ('service.table') or file where a cached world differs from its day."""
    world = cache.get(rec.world_hash)
    try:
        assert world is not None
        service, table, file = first_difference(decode_manifest(rec.manifest),
                                                 world_manifest(world))
    except Exception:  # an entry too damaged to hash: the message says so
        return None, None
    return (f"{service}.{table}" if table else None), file


def _day_index(records: list[DayRecord]) -> dict[int, DayRecord]:
    return {seq: rec for rec in records for seq in range(rec.first_seq, rec.last_seq + 1)}


def _check_days(persona: str, records: list[DayRecord], events: list[StoredEvent],
                summary: PersonaSummary | None, problems: list[Problem]) -> None:
    expected_first = 0
    for rec in records:
        if rec.first_seq != expected_first or rec.last_seq >= len(events) \
                or rec.last_seq < rec.first_seq:
            problems.append(Problem(persona, "day", f"{persona}@{rec.day}: its record covers "
                                    f"seq {rec.first_seq}..{rec.last_seq}, which does not fit "
                                    "the stream", rec.day))
            return
        span = events[rec.first_seq: rec.last_seq + 1]
        if any(e.day != rec.day for e in span) or span[-1].event_id != rec.head:
            problems.append(Problem(persona, "day", f"{persona}@{rec.day}: the day record does "
                                    "not match its events (day or head id differs)", rec.day))
        if _manifest_hash(rec) != rec.world_hash:
            # diff and mounts read the stored manifest: it must be the one that was hashed
            problems.append(Problem(persona, "day", f"{persona}@{rec.day}: the stored manifest "
                                    "does not hash to the day's world hash (modified)", rec.day))
        expected_first = rec.last_seq + 1
    if expected_first != len(events):
        problems.append(Problem(persona, "day", f"{len(events) - expected_first} events after "
                                "the last day record belong to no day"))
    last = records[-1]
    if summary is None or (summary.head, summary.last_seq, summary.world_hash) != (
            last.head, last.last_seq, last.world_hash):
        problems.append(Problem(persona, "day", f"persona {persona!r}: its summary does not "
                                "match its last day record"))


def _check_blobs(store: EventStore, persona: str, events: list[StoredEvent], where: Locate,
                 problems: list[Problem]) -> None:
    checked: dict[str, str | None] = {}
    for event in events:
        try:
            payload = event.payload
        except Exception as exc:  # a damaged body: already reported by the chain check
            problems.append(Problem(persona, "chain", f"seq {event.seq}: body unreadable: {exc}",
                                    event.day, event.seq))
            continue
        blob = blob_of(payload)
        if blob is None:
            continue
        if blob not in checked:
            try:
                data = store.blob(blob)
                checked[blob] = None if digest(data) == blob else "was modified"
            except NotFoundError:
                checked[blob] = "is missing"
        what = checked[blob]
        if what:
            day, index = where(event)
            path = payload.path if isinstance(payload, FileWritePayload) else \
                f"apps/{getattr(payload, 'service', '?')}.py"
            problems.append(Problem(persona, "blob", f"blob {blob} (file {path!r} of "
                                    f"{persona}@{day} event #{index}) {what}",
                                    day, event.seq, index, file=path))
            checked[blob] = None  # report each blob once


def _rederive(store: EventStore, cache: SnapshotCache, persona: str, records: list[DayRecord],
              events: list[StoredEvent], problems: list[Problem],
              progress: Progress | None) -> None:
    """Replay the whole stream from an empty world (never from the cache) and compare each
    day's hash with the recorded one; stop at the first day that differs."""
    by_day = {r.day: r for r in records}
    scratch = cache.scratch()
    root = scratch / "world"
    root.mkdir()
    try:
        for built in build_days(root, iter(events), store.blob):
            rec = by_day[built.day]
            ok = built.world_hash == rec.world_hash
            if progress:
                progress(DayResult(persona, built.day, built.n_events, built.world_hash,
                                   built.seconds, "verified" if ok else "mismatch",
                                   rec.world_hash))
            if not ok:
                problems.append(_divergence(persona, rec, built.manifest, built.world_hash,
                                            events))
                return
    except ApplyError as exc:
        problems.append(Problem(persona, "hash", str(exc), exc.day, None, exc.index))
    except WorldError as exc:
        problems.append(Problem(persona, "hash", f"replay failed: {exc}"))
    finally:
        remove_tree(scratch)


def _divergence(persona: str, rec: DayRecord, got: Manifest, got_hash: str,
                events: list[StoredEvent]) -> Problem:
    recorded = decode_manifest(rec.manifest)
    service, table, file = first_difference(recorded, got)
    day_events = events[rec.first_seq: rec.last_seq + 1]
    index = next((i for i, e in enumerate(day_events)
                  if touched_by(e.payload, table, file, service)), None)
    thing = f"file {file!r}" if file else f"table {service}.{table}" if table else (
        f"service {service!r}" if service else "the manifest")
    at = f", first written by event #{index} (seq {rec.first_seq + index})" \
        if index is not None else ""
    return Problem(persona, "hash", f"{persona}@{rec.day}: replay gives world hash {got_hash}, "
                   f"the store recorded {rec.world_hash}; first difference in {thing}{at}",
                   rec.day, rec.first_seq + index if index is not None else None, index,
                   table=f"{service}.{table}" if table else None, file=file)


def first_difference(a: Manifest, b: Manifest) -> tuple[str | None, str | None, str | None]:
    for service in sorted(set(a.services) | set(b.services)):
        sa, sb = a.services.get(service), b.services.get(service)
        if sa == sb:
            continue
        if sa is None or sb is None:
            return service, None, None
        for table in sorted(set(sa.tables) | set(sb.tables)):
            if sa.tables.get(table) != sb.tables.get(table):
                return service, table, None
        return service, None, None
    for path in sorted(set(a.files) | set(b.files)):
        if a.files.get(path) != b.files.get(path):
            return None, None, path
    for name in sorted(set(a.apps) | set(b.apps)):
        if a.apps.get(name) != b.apps.get(name):
            return None, None, f"apps/{name}"
    return None, None, None


def touched_by(payload: Payload, table: str | None, file: str | None,
               service: str | None) -> bool:
    """Whether an event plausibly wrote `table` of `service`, or `file` (to name the first
    event of a day that writes what differs)."""
    if file is not None and file.startswith("apps/"):
        return isinstance(payload, AppPayload) and file.split("/")[1].split(".")[0] == \
            payload.service
    if file is not None:
        return isinstance(payload, FileWritePayload | FileDeletePayload) and payload.path == file
    if isinstance(payload, SqlPayload) and payload.service == service:
        if table is None:
            return True
        return re.search(rf"(?i)(^|[^\w]){re.escape(table)}([^\w]|$)", payload.sql) is not None
    return False
