"""The snapshot cache: materialized worlds keyed by world hash.

Layout: ``<root>/snapshots/<hash>/{world/, manifest.json}``. An entry is built in
``<root>/tmp/<pid>-<n>/`` and published with one atomic ``rename``; if another process
published the same hash first, ours is dropped. Readers therefore see a whole entry or
none, even with many processes filling the cache at once. Entries are read-only
reference copies: instances and checkouts copy out of them.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

from replay.files import chmod_tree, copy_tree, remove_tree
from replay.hashing import Manifest, decode_manifest, encode_manifest, world_manifest

_COUNTER = itertools.count()


class SnapshotCache:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.snapshots = self.root / "snapshots"
        self.tmp = self.root / "tmp"
        self.snapshots.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)

    def entry(self, world_hash: str) -> Path:
        return self.snapshots / world_hash

    def get(self, world_hash: str) -> Path | None:
        """The world directory of a cached snapshot, or None."""
        world = self.entry(world_hash) / "world"
        return world if world.is_dir() else None

    def manifest(self, world_hash: str) -> Manifest | None:
        path = self.entry(world_hash) / "manifest.json"
        return decode_manifest(path.read_bytes()) if path.is_file() else None

    def scratch(self) -> Path:
        """A fresh private directory under tmp/ (same file system as the snapshots)."""
        path = self.tmp / f"{os.getpid()}-{next(_COUNTER)}"
        remove_tree(path)
        path.mkdir(parents=True)
        return path

    def put(self, world: Path, world_hash: str, manifest: Manifest) -> Path:
        """Publish a copy of `world` under `world_hash` (atomically); return its world dir."""
        existing = self.get(world_hash)
        if existing is not None:
            return existing
        staging = self.scratch()
        copy_tree(world, staging / "world")
        (staging / "manifest.json").write_bytes(encode_manifest(manifest))
        chmod_tree(staging, files=0o444)
        try:
            os.rename(staging, self.entry(world_hash))
        except OSError:
            # Someone published the same hash first (the target exists and is not empty).
            remove_tree(staging)
        published = self.get(world_hash)
        assert published is not None
        return published

    def check(self, world_hash: str) -> str | None:
        """Re-hash a cached entry; return what is wrong with it, or None if it is sound."""
        world = self.get(world_hash)
        if world is None:
            return None
        try:
            actual = world_manifest(world).world_hash()
        except Exception as exc:  # a damaged entry may fail to open at all
            return f"cached snapshot {world_hash} cannot be read: {exc}"
        if actual != world_hash:
            return f"cached snapshot {world_hash} now hashes to {actual} (modified on disk)"
        return None

    def evict(self, world_hash: str) -> None:
        entry = self.entry(world_hash)
        if entry.exists():
            doomed = self.scratch()
            os.rename(entry, doomed / "entry")
            remove_tree(doomed)

    def hashes(self) -> list[str]:
        return sorted(p.name for p in self.snapshots.iterdir() if p.is_dir())

    def clean_tmp(self) -> None:
        """Remove staging directories left behind by processes that died."""
        for entry in self.tmp.iterdir():
            pid_text = entry.name.split("-", 1)[0]
            if pid_text.isdigit() and not _alive(int(pid_text)):
                # Several processes may clean at once: claim the entry with one atomic
                # rename (under our own pid) first, so only one of them removes it.
                claimed = self.tmp / f"{os.getpid()}-{next(_COUNTER)}"
                try:
                    os.rename(entry, claimed)
                except FileNotFoundError:
                    continue  # another process claimed it
                remove_tree(claimed)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
