"""The world engine: one store plus one snapshot cache, and everything users do with them.

import (validate -> apply -> hash -> commit, per persona-day, all-or-nothing per file),
snapshot/checkout/mount of ``persona@day``, replay, verify, diff and export. The CLI and
later the environment server are thin adapters over this class.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from replay.cache import CacheStats, Pin, PruneReport, SnapshotCache, days_to_keep
from replay.diff import WorldDiff, diff_worlds
from replay.errors import IntegrityError
from replay.files import chmod_tree, copy_tree, remove_tree
from replay.fold import BuiltDay, build_days, build_days_from_pages
from replay.hashing import Manifest, decode_manifest, encode_manifest, world_manifest
from replay.mount import Mount, snapshot_files
from replay.report import DayResult, Problem, Progress, VerifyReport
from replay.verify import verify_persona
from worldstore.errors import ConflictError, DayOrderError, InputError, NotFoundError, WorldError
from worldstore.events import GENESIS, StoredEvent, blob_of, make_event
from worldstore.interchange import MAX_INT, DayBatch, export_line, read_days, to_payload
from worldstore.names import ts_key
from worldstore.open import default_cache_dir, open_event_store
from worldstore.store import DayRecord, EventStore, NewDay, WorldStore

REF_RE = re.compile(r"(?P<persona>[a-z0-9][a-z0-9_-]*)(@(?P<day>-?\d+))?")
HASH_RE = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True, slots=True)
class _Planned:
    batch: DayBatch
    events: list[StoredEvent]
    blobs: dict[str, bytes]
    lines: dict[int, int]
    existing: DayRecord | None


class Worlds:
    """A store of persona-day logs with its snapshot cache."""

    def __init__(self, store: WorldStore, cache: SnapshotCache) -> None:
        self.store = store
        self.cache = cache
        # Lookups behind mount(), made once per Worlds (see _mountable).
        self._records: dict[str, DayRecord] = {}
        self._mounts: dict[str, tuple[Manifest, list[tuple[str, Path]]]] = {}

    @classmethod
    def open(cls, location: str | os.PathLike[str], cache: str | os.PathLike[str] | None = None,
             *, create: bool = True, cache_max_bytes: int | None = None) -> Worlds:
        """`cache_max_bytes` caps the snapshot cache (None: env ``WORLDCTL_CACHE_MAX``, else
        10 GiB or a quarter of its file system, see ``replay.cache``)."""
        store = open_event_store(location, create=create)
        cache_root = Path(cache) if cache is not None else default_cache_dir(location)
        snapshot_cache = SnapshotCache(cache_root, cache_max_bytes)
        snapshot_cache.clean_tmp()
        return cls(store, snapshot_cache)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Worlds:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- import ---------------------------------------------------------------------

    def import_file(self, path: Path, *, progress: Progress | None = None,
                    planned: Callable[[int], None] | None = None) -> list[DayResult]:
        with open(path, "rb") as fh:
            return self.import_stream(fh, source=str(path), progress=progress,
                                      planned=planned)

    def import_stream(self, stream: IO[bytes], *, source: str,
                      progress: Progress | None = None,
                      planned: Callable[[int], None] | None = None) -> list[DayResult]:
        """Append the persona-days of an interchange stream.

        Three phases, so that a bad file stores nothing: (1) read and validate every line;
        (2) apply every new day to scratch worlds and hash it; (3) commit each day
        atomically. A day already in the store with identical events is skipped, so
        re-importing a file (say after a crash) completes what is missing. `planned` is
        told how many new days will be applied (the total of `progress`) before the first.
        """
        batches = read_days(stream, source=source)
        plans = self._plan(batches)
        if planned is not None:
            planned(sum(1 for plan in plans if plan.existing is None))
        built = self._apply_plans(plans, progress)
        results = []
        for plan in plans:
            if plan.existing is not None:
                results.append(DayResult(plan.batch.persona, plan.batch.day, len(plan.events),
                                         plan.existing.world_hash, 0.0, "unchanged"))
                continue
            day = built[(plan.batch.persona, plan.batch.day)]
            record = DayRecord(
                persona=day.persona, day=day.day, first_seq=plan.events[0].seq,
                last_seq=plan.events[-1].seq, first_ts=plan.events[0].ts,
                last_ts=plan.events[-1].ts, head=plan.events[-1].event_id,
                world_hash=day.world_hash, manifest=encode_manifest(day.manifest),
            )
            try:
                self.store.append_day(
                    NewDay(record=record, events=plan.events, blobs=plan.blobs),
                    expected_last_seq=record.first_seq - 1)
            except (ConflictError, DayOrderError):
                if not self._stored_identically(record):
                    raise
                # Another writer stored exactly this day first (the same file imported
                # twice at once): the store already holds what we wanted.
                results.append(DayResult(day.persona, day.day, day.n_events, day.world_hash,
                                         day.seconds, "unchanged"))
                continue
            results.append(DayResult(day.persona, day.day, day.n_events, day.world_hash,
                                     day.seconds, "imported"))
        return results

    def _stored_identically(self, record: DayRecord) -> bool:
        try:
            stored = self.store.day(record.persona, record.day)
        except NotFoundError:
            return False
        return (stored.head, stored.last_seq) == (record.head, record.last_seq)

    def _plan(self, batches: list[DayBatch]) -> list[_Planned]:
        """Turn batches into stored events, chained onto the store (or onto identical
        stored days, which will be skipped)."""
        plans: list[_Planned] = []
        stored: dict[str, dict[int, DayRecord]] = {}
        tail: dict[str, tuple[int, str, str | None]] = {}  # where the next new day goes
        for batch in batches:
            persona = batch.persona
            if persona not in stored:
                records = self.store.days(persona)
                stored[persona] = {r.day: r for r in records}
                last = records[-1] if records else None
                tail[persona] = (last.last_seq + 1, last.head, last.last_ts) if last else (
                    0, GENESIS, None)
            records_by_day = stored[persona]
            existing = records_by_day.get(batch.day)
            if existing is not None:
                earlier = [r for d, r in records_by_day.items() if d < batch.day]
                base = max(earlier, key=lambda r: r.day) if earlier else None
                next_seq, prev, last_ts = (
                    (base.last_seq + 1, base.head, base.last_ts) if base else (0, GENESIS, None))
            else:
                if records_by_day and batch.day < max(records_by_day):
                    raise DayOrderError(
                        f"{batch.source}:{batch.lines[0].line}: {persona}@{batch.day} is not "
                        f"after the persona's last stored day {max(records_by_day)}; days are "
                        "append-only"
                    )
                next_seq, prev, last_ts = tail[persona]
            if last_ts is not None and ts_key(batch.first_ts) < ts_key(last_ts):
                raise InputError(
                    f"timestamp {batch.first_ts} of {persona}@{batch.day} is before the "
                    f"persona's stored last timestamp {last_ts}",
                    file=batch.source, line=batch.lines[0].line, field="ts",
                )
            events, blobs, lines = _stored_events(batch, next_seq, prev)
            if existing is not None:
                if (existing.head, existing.last_seq) != (events[-1].event_id, events[-1].seq):
                    raise DayOrderError(
                        f"{batch.source}:{batch.lines[0].line}: {persona}@{batch.day} already "
                        "exists with different events; days are append-only"
                    )
            else:
                tail[persona] = (events[-1].seq + 1, events[-1].event_id, events[-1].ts)
            plans.append(_Planned(batch, events, blobs, lines, existing))
        return plans

    def _apply_plans(self, plans: list[_Planned], progress: Progress | None
                     ) -> dict[tuple[str, int], BuiltDay]:
        built: dict[tuple[str, int], BuiltDay] = {}
        scratch = self.cache.scratch()
        try:
            by_persona: dict[str, list[_Planned]] = {}
            for plan in plans:
                if plan.existing is None:
                    by_persona.setdefault(plan.batch.persona, []).append(plan)
            for persona, todo in by_persona.items():
                root = scratch / persona
                self._start_world(persona, todo[0].events[0].seq, root)
                blobs: dict[str, bytes] = {}
                lines: dict[int, int] = {}
                for plan in todo:
                    blobs.update(plan.blobs)
                    lines.update(plan.lines)
                events = (e for plan in todo for e in plan.events)
                # Not every day: the recent ones and checkpoints (the rest rebuild from them).
                keep = days_to_keep([(p.batch.day, len(p.events)) for p in todo], set())
                for day in build_days(root, events, _blob_source(blobs, self.store),
                                      lines=lines, source=todo[0].batch.source):
                    if day.day in keep:
                        self.cache.put(root, day.world_hash, day.manifest)
                    built[(persona, day.day)] = day
                    if progress:
                        progress(DayResult(persona, day.day, day.n_events, day.world_hash,
                                           day.seconds, "applied"))
        finally:
            remove_tree(scratch)
        return built

    def _start_world(self, persona: str, first_seq: int, root: Path) -> None:
        """Put the persona's world as of just before `first_seq` at `root`."""
        if first_seq == 0:
            root.mkdir(parents=True)
            return
        last = self.store.persona(persona)
        if last is None or last.last_seq != first_seq - 1:
            # Another writer appended to the persona after this import read it: the new
            # days were planned on an older end of the stream. Refuse before writing.
            raise ConflictError(
                f"persona {persona!r} changed while this import was being prepared (another "
                "writer appended to it); nothing was written; run the import again"
            )
        with self.pinned(persona, last.last_day) as world:
            copy_tree(world, root)

    # --- resolving and materializing -----------------------------------------------

    def resolve(self, ref: str) -> DayRecord:
        """``persona@day``, ``persona`` (its last day), ``persona@-1`` or a world hash."""
        if HASH_RE.fullmatch(ref):
            found = self.store.days_with_hash(ref)
            if not found:
                raise NotFoundError(f"no persona-day in the store has world hash {ref}")
            return found[0]
        m = REF_RE.fullmatch(ref)
        if not m:
            raise InputError(f"bad world reference {ref!r}: use persona@day, persona, or a hash")
        persona, day_text = m.group("persona"), m.group("day")
        if day_text is not None and not _fits_64_bits(day_text):
            raise InputError(f"bad world reference {ref[:60]!r}: day {day_text[:40]} does not "
                             f"fit 64 bits (days go up to {MAX_INT})")
        records = self.store.days(persona)
        if not records:
            raise NotFoundError(f"no persona {persona!r} in the store {self.store.url}")
        if day_text is None:
            return records[-1]
        day = int(day_text)
        if day < 0:
            if -day > len(records):
                raise NotFoundError(f"{ref}: persona {persona!r} has only {len(records)} days")
            return records[day]
        return self.store.day(persona, day)

    def record(self, ref: str) -> DayRecord:
        """``resolve``, remembered for references that always name the same persona-day
        (``persona@N``, a world hash): mounts and instances look them up on every open."""
        record = self._records.get(ref) or self.resolve(ref)
        if ref_is_stable(ref):
            self._records[ref] = record
        return record

    def snapshot(self, persona: str, day: int) -> Path:
        """The cached, read-only world of persona@day, rebuilt from the log if missing.

        Not pinned: a cache over its cap may evict it once it is the least recently used.
        To read it for a while, hold ``pinned``."""
        with self.pinned(persona, day) as world:
            return world

    @contextmanager
    def pinned(self, persona: str, day: int) -> Iterator[Path]:
        """The cached world of persona@day (rebuilt if missing), never evicted while the
        ``with`` block runs, by this process or any other."""
        pin = self._pin_record(self.store.day(persona, day))
        try:
            yield pin.world
        finally:
            pin.release()

    def _pin_record(self, record: DayRecord) -> Pin:
        pin = self.cache.pin(record.world_hash)
        return pin if pin is not None else self._rebuild(record)

    def _rebuild(self, record: DayRecord) -> Pin:
        """Replay persona@day from the nearest cached day before it (or from nothing),
        keep it and the checkpoints on the way (``days_to_keep``), and return it pinned."""
        persona, day = record.persona, record.day
        records = [r for r in self.store.days(persona) if r.day <= day]
        scratch = self.cache.scratch()
        try:
            root = scratch / "world"
            base = self._copy_nearest_cached(records[:-1], root)
            first = base.last_seq + 1 if base else 0
            expected = {r.day: r for r in records}
            keep = days_to_keep([(r.day, r.last_seq - r.first_seq + 1) for r in records
                                 if r.last_seq >= first], {day}, recent=0)
            pages = self.store.event_pages(persona, first, record.last_seq)
            pin: Pin | None = None
            for built in build_days_from_pages(root, persona, pages, self.store.blob):
                want = expected[built.day]
                if built.world_hash != want.world_hash:
                    raise IntegrityError(
                        f"replaying {persona}@{built.day} gives world hash {built.world_hash}, "
                        f"the store recorded {want.world_hash}; run `worldctl verify` to "
                        "find the first divergent event"
                    )
                if built.day == day:
                    pin = self.cache.put_pinned(root, built.world_hash, built.manifest)
                elif built.day in keep:
                    self.cache.put(root, built.world_hash, built.manifest)
        finally:
            remove_tree(scratch)
        assert pin is not None
        return pin

    def _copy_nearest_cached(self, earlier: list[DayRecord], root: Path) -> DayRecord | None:
        """Copy the latest of `earlier` days that is cached to `root` (pinned while it is
        copied); an empty world if none is. Returns the day copied."""
        for candidate in reversed(earlier):
            if self.cache.get(candidate.world_hash) is None:
                continue
            pin = self.cache.pin(candidate.world_hash)
            if pin is None:
                continue  # evicted since we looked
            with pin:
                copy_tree(pin.world, root)
            return candidate
        root.mkdir()
        return None

    def manifest(self, record: DayRecord) -> Manifest:
        return decode_manifest(record.manifest)

    def checkout(self, ref: str, dest: Path) -> DayRecord:
        """Copy persona@day into `dest` as plain SQLite files and workspace files.

        The copy is re-hashed; a cache entry that no longer matches is dropped and the
        world rebuilt from the log, so a checkout is always what the log says.
        """
        record = self.resolve(ref)
        if dest.exists() and any(dest.iterdir()):
            raise WorldError(f"{dest}: checkout target exists and is not empty")
        for attempt in range(2):
            with self.pinned(record.persona, record.day) as world:
                copy_tree(world, dest)
            chmod_tree(dest, files=0o644)
            if world_manifest(dest).world_hash() == record.world_hash:
                return record
            remove_tree(dest)
            self.cache.evict(record.world_hash)
            if attempt:
                break
        raise IntegrityError(f"{ref}: could not produce a world with hash {record.world_hash}")

    def mount(self, ref: str, dest: Path | None = None, *, lazy: bool = False) -> Mount:
        """A writable, isolated, resettable instance of persona@day (or of a world hash).
        A `lazy` mount copies each part of the world on first use (see ``Mount``)."""
        if dest is None:
            dest = self.cache.scratch()
        elif dest.exists() and any(dest.iterdir()):
            raise WorldError(f"{dest}: mount target exists and is not empty")
        record, pin, manifest, files = self._mountable(ref)
        try:
            try:
                return Mount(pin.world, record.world_hash, manifest, dest, files, lazy=lazy,
                             pin=pin)
            except FileNotFoundError:
                # The cache entry was dropped as damaged (by verify, say), pinned or not,
                # since we looked it up: look again.
                pin.release()
                self._mounts.pop(record.world_hash, None)
                remove_tree(dest)
                record, pin, manifest, files = self._mountable(ref)
                return Mount(pin.world, record.world_hash, manifest, dest, files, lazy=lazy,
                             pin=pin)
        except BaseException:
            pin.release()
            raise

    def _mountable(self, ref: str) -> tuple[DayRecord, Pin, Manifest, list[tuple[str, Path]]]:
        """The pinned snapshot a mount of `ref` copies from (the mount releases the pin on
        close), with what is looked up once per Worlds: persona-days never change once
        stored, mounts are frequent, and an entry rebuilt after eviction has the same
        files at the same paths."""
        record = self.record(ref)
        pin = self._pin_record(record)
        found = self._mounts.get(record.world_hash)
        if found is None:
            # Like checkout, never hand out a cache entry modified on disk: re-hash it once
            # and rebuild it from the log if it is bad.
            if self.cache.check(record.world_hash):
                pin.release()
                self.cache.evict(record.world_hash)
                pin = self._pin_record(record)
            found = (self.manifest(record), snapshot_files(pin.world))
            self._mounts[record.world_hash] = found
        return (record, pin, *found)

    # --- replay, verify, diff, export -----------------------------------------------

    def replay(self, persona: str, *, progress: Progress | None = None) -> list[DayResult]:
        """Re-apply the persona's whole log from nothing; compare every day's hash."""
        records = {r.day: r for r in self.store.days(persona)}
        if not records:
            raise NotFoundError(f"no persona {persona!r} in the store {self.store.url}")
        results = []
        scratch = self.cache.scratch()
        try:
            root = scratch / "world"
            root.mkdir()
            keep = days_to_keep([(r.day, r.last_seq - r.first_seq + 1)
                                 for r in records.values()], set())
            pages = self.store.event_pages(persona)
            for built in build_days_from_pages(root, persona, pages, self.store.blob):
                recorded = records[built.day].world_hash
                status = "replayed" if built.world_hash == recorded else "mismatch"
                if status == "replayed" and built.day in keep:
                    self.cache.put(root, built.world_hash, built.manifest)
                result = DayResult(persona, built.day, built.n_events, built.world_hash,
                                   built.seconds, status, recorded)
                results.append(result)
                if progress:
                    progress(result)
        finally:
            remove_tree(scratch)
        return results

    def verify(self, personas: list[str] | None = None, *,
               progress: Progress | None = None) -> VerifyReport:
        """Re-derive every day of `personas` (default: all) from the log and check every
        hash the store and the cache hold (see replay/verify.py)."""
        report = VerifyReport()
        names = personas if personas else [p.persona for p in self.store.personas()]
        unknown = [p for p in names if self.store.persona(p) is None]
        if unknown:  # a name that is not in the store is a wrong argument, not a finding
            raise NotFoundError(f"no persona {', '.join(map(repr, unknown))} in the store "
                                f"{self.store.url}; nothing was verified")
        for persona in names:
            verify_persona(self.store, self.cache, persona, report, progress)
        return report

    def diff(self, a: str | Path, b: str | Path) -> WorldDiff:
        """Changes from world `a` to world `b`; each is a reference or (a Path) a world
        directory, such as a checkout edited by hand."""
        with ExitStack() as pins:
            return diff_worlds(*self._world_at(a, pins), *self._world_at(b, pins))

    def _world_at(self, side: str | Path, pins: ExitStack) -> tuple[Path, Manifest]:
        if isinstance(side, Path):
            return side, world_manifest(side)
        record = self.resolve(side)
        return pins.enter_context(self.pinned(record.persona, record.day)), self.manifest(record)

    # --- the snapshot cache ---------------------------------------------------------

    def cache_stats(self) -> tuple[CacheStats, dict[str, list[str]]]:
        """The cache's entries, and the persona-days (``persona@day``) each entry's world
        hash is, by hash (a world no stored day has, say a pack's scratch, names none)."""
        return self.cache.stats(), self._days_by_hash()

    def cache_prune(self, max_bytes: int | None = None) -> PruneReport:
        """Evict least recently used snapshots until the cache holds at most `max_bytes`
        (default: its cap); snapshots an open instance uses stay."""
        return self.cache.prune(max_bytes)

    def _days_by_hash(self) -> dict[str, list[str]]:
        days: dict[str, list[str]] = {}
        for summary in self.store.personas():
            for r in self.store.days(summary.persona):
                days.setdefault(r.world_hash, []).append(f"{r.persona}@{r.day}")
        return days

    def export(self, ref: str, out: IO[bytes], *, through_day: int | None = None) -> int:
        """Write the log of `ref`'s persona through `ref`'s day (a bare persona: its last
        day) as interchange lines; `through_day` names the day instead, negative counting
        from the end as in ``persona@-N``. Returns the number of events written."""
        last = self.resolve(ref)
        if through_day is not None:
            if "@" in ref or HASH_RE.fullmatch(ref):
                raise InputError(f"{ref!r} names a day already; give the day once "
                                 "(persona@N, or persona with --through-day N)")
            last = self.resolve(f"{last.persona}@{through_day}")
        persona = last.persona
        count = 0
        for event in self.store.events(persona, 0, last.last_seq):
            payload = event.payload
            blob = blob_of(payload)
            data = self.store.blob(blob) if blob is not None else None
            out.write(export_line(persona, event.day, event.ts, payload, data))
            count += 1
        return count


def _fits_64_bits(digits: str) -> bool:
    # (length first: int() refuses a text of more than 4,300 digits with a ValueError)
    return len(digits) <= 20 and -MAX_INT - 1 <= int(digits) <= MAX_INT


def ref_is_stable(ref: str) -> bool:
    """A reference that always names the same persona-day: ``persona@N`` or a hash."""
    m = REF_RE.fullmatch(ref)
    return HASH_RE.fullmatch(ref) is not None or (
        m is not None and m.group("day") is not None and not m.group("day").startswith("-"))


def _stored_events(batch: DayBatch, first_seq: int, prev: str
                   ) -> tuple[list[StoredEvent], dict[str, bytes], dict[int, int]]:
    stored: list[StoredEvent] = []
    blobs: dict[str, bytes] = {}
    lines: dict[int, int] = {}
    for offset, sl in enumerate(batch.lines):
        payload, data = to_payload(sl.event)
        if data is not None:
            blobs[blob_of(payload) or ""] = data
        event = make_event(persona=batch.persona, seq=first_seq + offset, day=batch.day,
                           ts=sl.event.ts, prev=prev, payload=payload)
        stored.append(event)
        lines[event.seq] = sl.line
        prev = event.event_id
    return stored, blobs, lines


def _blob_source(local: dict[str, bytes], store: EventStore) -> Callable[[str], bytes]:
    def get(digest: str) -> bytes:
        found = local.get(digest)
        return found if found is not None else store.blob(digest)
    return get


__all__ = ["DayResult", "Problem", "Progress", "VerifyReport", "Worlds", "ref_is_stable"]
