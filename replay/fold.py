"""Folding stored events into worlds, day by day.

Each day ends with its commit and its manifest. The manifest re-hashes only what the day
wrote (``replay.rehash``: the builder records the tables, files and app pins it touched),
and equals a full re-hash of the world, so the world hash does not depend on history.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from replay.apply import BlobSource, WorldBuilder
from replay.errors import ApplyError, EventFailed
from replay.files import copy_tree
from replay.hashing import Manifest
from replay.rehash import DayHasher
from worldstore.events import StoredEvent


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
    builder = WorldBuilder(root, blobs)
    hasher = DayHasher(root, builder.idle_connection)
    current: int | None = None
    count = index = 0
    persona = ""
    started = time.perf_counter()
    try:
        for event in events:
            if current is not None and event.day != current:
                yield _finish(builder, hasher, persona, current, count, started)
                count = index = 0
                started = time.perf_counter()
            current, persona = event.day, event.persona
            try:
                builder.apply(event)
            except EventFailed as exc:
                raise ApplyError(
                    str(exc), persona=event.persona, day=event.day, index=index,
                    line=(lines or {}).get(event.seq), source=source,
                ) from None
            count += 1
            index += 1
        if current is not None:
            yield _finish(builder, hasher, persona, current, count, started)
    finally:
        builder.abort()


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
