"""Mounted instances: isolated, writable, resettable copies of a snapshot.

An instance is a private directory with the world layout, copied (reflinked where the
file system allows) from a read-only cached snapshot. ``reset()`` puts it back exactly:
files the instance did not touch are kept, everything else is removed or re-copied.
"Untouched" is decided by stat: after copying, each file's mtime is pinned to a sentinel
and its inode, size and ctime are recorded; any write moves mtime and ctime (ctime cannot
be set back from user space). ``reset(full=True)`` re-copies every file regardless.
"""

from __future__ import annotations

import os
from pathlib import Path

import apsw

from replay.cache import Pin
from replay.diff import WorldDiff, diff_worlds
from replay.files import DIR, Entry, copy_file, remove_tree, walk
from replay.hashing import Manifest, world_manifest
from replay.layout import DB_SUFFIX, SERVICES, WORKSPACE, service_db

_SENTINEL_NS = 1_000_000_000  # mtime pinned on every copied file (1970-01-01T00:00:01Z)


class Mount:
    """A writable instance of one snapshot. Close it (or use ``with``) to delete it."""

    def __init__(self, snapshot: Path, world_hash: str, manifest: Manifest, path: Path,
                 files: list[tuple[str, Path]] | None = None, *, lazy: bool = False,
                 pin: Pin | None = None) -> None:
        """`files` is the snapshot's file list (``snapshot_files``), when the caller has it.
        `pin` holds the snapshot in the cache (no eviction while the instance is open); the
        mount releases it on close.

        A `lazy` mount copies nothing up front: each part of the world — one service
        database, or the rest (workspace, apps) — is copied on first use through
        ``db_path``, ``workspace`` or ``ensure_all``; until then readers use the snapshot's
        own read-only file (``read_db_path``), and ``reset()`` drops a changed part instead
        of copying it back.
        """
        self.snapshot = snapshot
        self.world_hash = world_hash
        self.manifest = manifest
        self.path = path
        self.lazy = lazy
        self._stamps: dict[str, tuple[int, int, int]] = {}
        self._files = files
        self._parts: dict[str, list[tuple[str, Path]]] | None = None
        self._present: set[str] = set()
        self._closed = False
        self._pin = pin
        self._copy_all()

    # --- layout ---------------------------------------------------------------------

    @property
    def workspace(self) -> Path:
        """The instance's writable workspace (copied first, for a lazy mount)."""
        self._ensure(_REST)
        return self.path / WORKSPACE

    def db_path(self, service: str) -> Path:
        """The instance's writable copy of a service database (copied first, if lazy)."""
        self._ensure(_service_part(service))
        return service_db(self.path, service)

    def read_db_path(self, service: str) -> Path:
        """Where to read a service database: the instance's copy once it has one, else the
        snapshot's read-only file (open it read-only and immutable)."""
        if self.lazy and _service_part(service) not in self._present:
            return service_db(self.snapshot, service)
        return service_db(self.path, service)

    def ensure_all(self) -> None:
        """Copy every part a lazy mount has not copied yet."""
        for part in self._snapshot_parts():
            self._ensure(part)
        (self.path / SERVICES).mkdir(exist_ok=True)

    @property
    def services(self) -> list[str]:
        return sorted(self.manifest.services)

    # --- operations -----------------------------------------------------------------

    def reset(self, *, full: bool = False) -> None:
        """Restore the snapshot exactly (same hash)."""
        self._check_open()
        if full:
            remove_tree(self.path)
            self._copy_all()
            return
        parts = self._snapshot_parts()
        wanted = {rel: src for part in sorted(self._present) for rel, src in parts[part]}
        self._drop_changed(wanted)
        for part in sorted(self._present):
            missing = [(rel, src) for rel, src in parts[part]
                       if not os.path.lexists(self.path / rel)
                       or ((self.path / rel).is_dir() and not (self.path / rel).is_symlink())]
            if missing and self.lazy:
                self._drop_part(part)  # copied again on its next use
                continue
            for rel, src in missing:
                dst = self.path / rel
                if dst.is_dir() and not dst.is_symlink():
                    remove_tree(dst)  # a directory now stands where the file was
                self._copy_one(rel, src, dst)

    def _drop_changed(self, wanted: dict[str, Path]) -> None:
        """One walk: remove every file that is not an untouched snapshot copy, every
        directory no wanted file lies in (whole, without entering it: the agent may have
        made it any depth), then every directory left empty (but the world's own)."""
        keep = {"", SERVICES, WORKSPACE}
        wanted_dirs = keep | {rel.rsplit("/", i)[0] for rel in wanted
                              for i in range(1, rel.count("/") + 1)}
        entered: list[Entry] = []

        def enter(entry: Entry) -> bool:
            if entry.rel in wanted_dirs:
                entered.append(entry)
                return True
            remove_tree(entry.path)
            return False

        for entry in walk(self.path, descend=enter):
            if entry.kind == DIR:
                continue
            stamp = self._stamps.get(entry.rel)
            if stamp is None or entry.rel not in wanted or _stamp_of(entry.stat) != stamp:
                os.unlink(entry.path)
        for entry in reversed(entered):  # deepest first
            if entry.rel not in keep and not os.listdir(entry.path):
                os.rmdir(entry.path)

    def hash(self) -> str:
        self._check_open()
        self.ensure_all()
        _recover_journals(self.path)
        return world_manifest(self.path).world_hash()

    def diff(self) -> WorldDiff:
        """What changed in this instance since the snapshot (row- and file-level)."""
        self._check_open()
        self.ensure_all()
        _recover_journals(self.path)
        return diff_worlds(self.snapshot, self.manifest, self.path, world_manifest(self.path))

    def close(self) -> None:
        """Delete the instance. Safe to call twice."""
        if not self._closed:
            self._closed = True
            try:
                remove_tree(self.path)
            finally:
                if self._pin is not None:
                    self._pin.release()  # the snapshot may be evicted from now on

    def __enter__(self) -> Mount:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals ------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"instance {self.path} is closed")

    def _snapshot_files(self) -> list[tuple[str, Path]]:
        # A snapshot is a read-only cache entry named by its hash: walk it once, not on
        # every reset.
        if self._files is None:
            self._files = snapshot_files(self.snapshot)
        return self._files

    def _snapshot_parts(self) -> dict[str, list[tuple[str, Path]]]:
        if self._parts is None:
            parts: dict[str, list[tuple[str, Path]]] = {_REST: []}
            for rel, src in self._snapshot_files():
                parts.setdefault(_part_of(rel), []).append((rel, src))
            self._parts = parts
        return self._parts

    def _copy_all(self) -> None:
        self._stamps.clear()
        self._present.clear()
        if self.lazy:  # even the two folders wait for their first use
            self.path.mkdir(parents=True, exist_ok=True)
            return
        made = {self.path / SERVICES, self.path / WORKSPACE}
        for folder in made:
            folder.mkdir(parents=True, exist_ok=True)
        for rel, src in self._snapshot_files():
            dst = self.path / rel
            if dst.parent not in made:
                dst.parent.mkdir(parents=True, exist_ok=True)
                made.add(dst.parent)
            self._copy_one(rel, src, dst)
        self._present.update(self._snapshot_parts())

    def _ensure(self, part: str) -> None:
        if part in self._present or not self.lazy:
            return
        self._check_open()
        for rel, src in self._snapshot_parts().get(part, []):
            dst = self.path / rel
            if os.path.lexists(dst):
                # Something the instance made itself stands there (a file the shell wrote
                # before the part was copied cannot exist: the workspace is a part).
                remove_tree(dst)
            self._copy_one(rel, src, dst)
        if part == _REST:
            (self.path / WORKSPACE).mkdir(exist_ok=True)  # a world may have no files
        self._present.add(part)

    def _drop_part(self, part: str) -> None:
        for rel, _src in self._snapshot_parts()[part]:
            dst = self.path / rel
            if os.path.lexists(dst) or dst.is_dir():
                remove_tree(dst)
            self._stamps.pop(rel, None)
        self._present.discard(part)

    def _copy_one(self, rel: str, src: Path, dst: Path) -> None:
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
            return
        copy_file(src, dst)  # a new file: writable, whatever the read-only source's mode
        os.utime(dst, ns=(_SENTINEL_NS, _SENTINEL_NS))
        self._stamps[rel] = _stamp(dst)


_REST = "rest"  # the part holding everything but the service databases


def _service_part(service: str) -> str:
    return f"{SERVICES}/{service}{DB_SUFFIX}"


def _part_of(rel: str) -> str:
    """A service database is a part of its own; every other file belongs to the rest."""
    if rel.startswith(f"{SERVICES}/") and rel.endswith(DB_SUFFIX) and rel.count("/") == 1:
        return rel
    return _REST


def _recover_journals(root: Path) -> None:
    """Roll back what a writer killed mid-transaction left in a hot journal, as any SQLite
    client opening the database would; hashing opens read-only and cannot."""
    for journal in (root / SERVICES).glob(f"*{DB_SUFFIX}-journal"):
        db = journal.with_name(journal.name[: -len("-journal")])
        if db.is_file():
            conn = apsw.Connection(str(db))
            try:
                conn.execute("SELECT count(*) FROM sqlite_schema").fetchall()
            except apsw.BusyError:
                pass  # a live writer holds it: not hot; hashing reports what it can read
            finally:
                conn.close()


def _stamp(path: Path) -> tuple[int, int, int]:
    return _stamp_of(os.lstat(path))


def _stamp_of(st: os.stat_result) -> tuple[int, int, int]:
    if st.st_mtime_ns != _SENTINEL_NS:
        return (-1, -1, -1)
    return (st.st_ino, st.st_size, st.st_ctime_ns)


def snapshot_files(root: Path) -> list[tuple[str, Path]]:
    """(relative path, path) of every file and symlink under a snapshot's world dir."""
    return _walk(root)


def _walk(root: Path) -> list[tuple[str, Path]]:
    return [(e.rel, e.path) for e in walk(root) if e.kind != DIR]
