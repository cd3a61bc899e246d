"""Folding stored events into worlds, day by day.

Each day ends with its commit and its manifest. The manifest re-hashes only what the day
wrote (``replay.rehash``: the builder records the tables, files and app pins it touched),
and equals a full re-hash of the world, so the world hash does not depend on history.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from replay.apply import BlobSource, WorldBuilder
from replay.errors import ApplyError, EventFailed
from replay.files import copy_tree
from replay.hashing import Manifest
from replay.rehash import DayHasher
from worldstore.events import EventRow, StoredEvent, event_row


@dataclass(frozen=True, slots=True)
class BuiltDay:
    persona: str
    day: int
    n_events: int
    manifest: Manifest
    world_hash: str
    seconds: float


def build_days(
    root: Path, events: Iterable[StoredEvent], blobs: BlobSource,
    *, lines: dict[int, int] | None = None, source: str | None = None,
) -> Iterator[BuiltDay]:
    """Apply `events` (one persona, seq order) onto the world at `root`.

    After the last event of each day the day's transactions are committed and the world
    is hashed; one BuiltDay is yielded per day. `lines` maps seq -> source line, so that an
    import error can name the line of the file.
    """
    stream = iter(events)
    first = next(stream, None)
    if first is not None:
        yield from build_days_from_pages(
            root, first.persona, _pages(itertools.chain((first,), stream)), blobs,
            lines=lines, source=source)


def build_days_from_pages(
    root: Path, persona: str, pages: Iterable[Sequence[EventRow]], blobs: BlobSource,
    *, lines: dict[int, int] | None = None, source: str | None = None,
) -> Iterator[BuiltDay]:
    """``build_days`` over the events of `persona` as rows, page by page (the store's
    ``event_pages``: replay's scan, with no object built per event)."""
    builder = WorldBuilder(root, blobs)
    hasher = DayHasher(root, builder.idle_connection)
    current: int | None = None
    count = 0
    started = time.perf_counter()
    try:
        for rows in pages:
            at, end = 0, len(rows)
            while at < end:
                day = rows[at][1]
                if current is not None and day != current:
                    yield _finish(builder, hasher, persona, current, count, started)
                    count = 0
                    started = time.perf_counter()
                if day != current:
                    builder.track_rows(hasher.reads_rows)
                current = day
                try:
                    stop = builder.apply_rows(rows, at)
                except EventFailed as exc:
                    failed = rows[builder.failed_at]
                    raise ApplyError(
                        str(exc), persona=persona, day=day,
                        index=count + builder.failed_at - at,
                        line=(lines or {}).get(failed[0]), source=source,
                    ) from None
                count += stop - at
                at = stop
        if current is not None:
            yield _finish(builder, hasher, persona, current, count, started)
    finally:
        builder.abort()


def _pages(events: Iterable[StoredEvent], size: int = 1024) -> Iterator[list[EventRow]]:
    page: list[EventRow] = []
    for event in events:
        page.append(event_row(event))
        if len(page) >= size:
            yield page
            page = []
    if page:
        yield page


def build_day_on(base: Path | None, root: Path, events: Iterable[StoredEvent],
                 blobs: BlobSource) -> BuiltDay:
    """One day's `events` applied at `root` to a copy of the world `base` (None: from
    nothing): a day checked before, or without, being stored."""
    if base is None:
        root.mkdir()
    else:
        copy_tree(base, root)
    (built,) = build_days(root, events, blobs)
    return built


def _finish(builder: WorldBuilder, hasher: DayHasher, persona: str, day: int, count: int,
            started: float) -> BuiltDay:
    builder.commit()
    manifest = hasher.manifest(builder.take_changes())
    return BuiltDay(persona, day, count, manifest, manifest.world_hash(),
                    time.perf_counter() - started)
