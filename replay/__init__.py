"""agent-worlds replay engine: deterministic application of persona-day logs, the world
hash, the snapshot cache, mounted instances, verify and diff."""

from replay.diff import WorldDiff
from replay.engine import DayResult, Problem, VerifyReport, Worlds
from replay.hashing import Manifest, hash_world, world_manifest
from replay.mount import Mount

__all__ = [
    "DayResult",
    "Manifest",
    "Mount",
    "Problem",
    "VerifyReport",
    "WorldDiff",
    "Worlds",
    "hash_world",
    "world_manifest",
]
