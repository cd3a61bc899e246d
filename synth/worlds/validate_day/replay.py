"""Layer 2, replay: the day applied twice from the previous day's snapshot gives the
recorded hash both times."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from replay.errors import ApplyError
from replay.fold import BuiltDay, build_day_on
from replay.hashing import Manifest, decode_manifest
from replay.verify import first_difference, touched_by
from synth.worlds.validate_day.context import DayContext, DayWorld
from synth.worlds.validate_day.report import LayerResult
from worldstore.errors import WorldError

__all__ = ["replay_layer"]


def replay_layer(context: DayContext, scratch: Path) -> tuple[LayerResult, DayWorld | None]:
    """Apply the day twice to copies of the previous day's snapshot; compare the hashes
    with each other and with the recorded one. Returns the first run's world if sound."""
    try:
        base = _previous_world(context)
        runs = [_replay_once(context, base, scratch / f"run{number}") for number in (1, 2)]
    except ApplyError as exc:
        return LayerResult("replay", "failed", f"{context.where(exc.index)} does not apply: "
                           f"{exc.reason}", {"seq": context.events[exc.index].seq,
                                             "index": exc.index}), None
    except WorldError as exc:  # the previous day or a blob cannot be read back
        return LayerResult("replay", "failed", f"{context.name} cannot be replayed: {exc}"), None
    first, second = runs
    evidence: dict[str, Any] = {"runs": [first.world_hash, second.world_hash],
                                "recorded": context.record.world_hash}
    if first.world_hash != second.world_hash:
        where = _difference(context, first.manifest, second.manifest)
        return LayerResult("replay", "failed", f"two replays of {context.name} from the same "
                           f"state differ ({first.world_hash} vs {second.world_hash}): "
                           f"{where}", evidence), None
    if first.world_hash != context.record.world_hash:
        where = _difference(context, decode_manifest(context.record.manifest), first.manifest)
        return LayerResult("replay", "failed", f"replaying {context.name} gives "
                           f"{first.world_hash}, the store recorded "
                           f"{context.record.world_hash}: {where}", evidence), None
    before = (decode_manifest(context.previous.manifest) if context.previous
              else Manifest(format=first.manifest.format, services={}, files={}))
    world = DayWorld(scratch / "run1", first.manifest, base, before)
    return LayerResult("replay", "passed", f"two replays of {context.name} both give the "
                       f"recorded hash {first.world_hash}", evidence), world


def _replay_once(context: DayContext, base: Path | None, root: Path) -> BuiltDay:
    return build_day_on(base, root, context.events, context.worlds.store.blob)


def _previous_world(context: DayContext) -> Path | None:
    """The previous day's snapshot, re-hashed first: a cache entry modified on disk would
    make a sound day look nondeterministic, so a bad entry is rebuilt from the log."""
    previous = context.previous
    if previous is None:
        return None
    worlds = context.worlds
    snapshot = worlds.snapshot(previous.persona, previous.day)
    if worlds.cache.check(previous.world_hash):
        worlds.cache.evict(previous.world_hash)
        snapshot = worlds.snapshot(previous.persona, previous.day)
    return snapshot


def _difference(context: DayContext, a: Manifest, b: Manifest) -> str:
    service, table, file = first_difference(a, b)
    if file:
        thing = f"file {file!r}"
    elif table:
        thing = f"table {service}.{table}"
    else:
        thing = f"service {service!r}" if service else "the manifest"
    writer = next((i for i, e in enumerate(context.events)
                   if touched_by(e.payload, table, file, service)), None)
    return f"first difference in {thing}" + (
        f", first written by {context.where(writer)}" if writer is not None else "")
