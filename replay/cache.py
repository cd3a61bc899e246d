"""The snapshot cache: materialized worlds keyed by world hash, bounded in size.

Layout: ``<root>/snapshots/<hash>/{world/, manifest.json, lock, size}``. An entry is built
in ``<root>/tmp/<pid>-<n>/`` and published with one atomic ``rename``; if another process
published the same hash first, ours is dropped. Readers therefore see a whole entry or
none, even with many processes filling the cache at once. Entries are read-only
reference copies: instances and checkouts copy out of them.

The cache is a cache: any entry can be rebuilt from the log (from the nearest cached day
at or before it plus the later events), so evicting one costs only time. It is bounded:

* **Size.** ``size`` holds the entry's bytes on disk, written before it is published;
  ``<root>/usage`` holds the total of all entries (read and written under a flock, with
  every publish and eviction, so that a put costs O(1) and not a walk of the cache). A
  process killed between the two steps leaves the total too high, never too low, and
  every eviction pass recounts it from the entries' ``size`` files.
* **Use.** The mtime of ``lock`` is the entry's last use (touched on each pin and put):
  eviction takes the least recently used first.
* **Pins.** Whoever reads an entry for a while (a mount, a checkout, a rebuild copying
  its base) holds a shared ``flock`` on ``lock``; eviction takes it exclusively without
  waiting and skips the entry when it cannot. flock belongs to the open file, so pins
  conflict across processes and between threads alike, and the kernel drops a dead
  process's pins with its files: a crash never pins an entry forever.
* **Cap.** After a publish takes the total over the cap (``max_bytes``), the least
  recently used unpinned entries are evicted until the total is at most 90% of it (one
  pass frees a tenth of the cap, instead of one pass per put). The default cap is
  ``DEFAULT_MAX_BYTES`` (10 GiB) or a quarter of the cache's file system if that is less;
  env ``WORLDCTL_CACHE_MAX`` or ``Worlds.open(..., cache_max_bytes=)`` set another.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import logging
import os
import re
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from replay.errors import WorldDirError
from replay.files import chmod_tree, copy_tree, remove_tree, walk
from replay.hashing import Manifest, decode_manifest, encode_manifest, world_manifest
from worldstore.errors import ConfigError

_COUNTER = itertools.count()
_log = logging.getLogger(__name__)

CACHE_MAX_ENV = "WORLDCTL_CACHE_MAX"
# 10 GiB holds the day snapshots of the tasks an RL node trains on many times over (a
# demo day is ~100 kB, a 200k-event world's day ~65 MB) and every checkpoint of thousands
# of small days; a quarter of the file system keeps a small disk (CI, a laptop) usable.
DEFAULT_MAX_BYTES = 10 * 1024**3
DISK_SHARE = 4
LOW_WATER = 0.9

# Which days a replay keeps when it passes through them (see ``days_to_keep``).
RECENT_DAYS = 8
CHECKPOINT_DAYS = 16
CHECKPOINT_EVENTS = 10_000

_LOCK = "lock"  # in an entry: pins flock it shared; its mtime is the entry's last use
_SIZE = "size"  # in an entry: its bytes on disk
_USAGE = "usage"  # in the root: the total of every entry's size
_EVICTING = "evicting.lock"  # in the root: one eviction pass at a time
_SIZE_WIDTH = 20  # the size files and the total are written fixed-width, in one write
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", re.IGNORECASE)


def parse_size(text: str, *, what: str) -> int:
    """Bytes from ``10G``, ``512M``, ``1.5GiB``, ``0`` (K, M, G, T are powers of 1024)."""
    m = _SIZE_RE.fullmatch(text)
    if m is None:
        raise ConfigError(f"{what}: {text!r} is not a size (bytes, or a number with K, M, G "
                          "or T, e.g. 10G)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def format_size(n: int) -> str:
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= factor:
            return f"{n / factor:.1f} {unit}"
    return f"{n} B"


def default_max_bytes(root: Path) -> int:
    """The cap when none is given: 10 GiB, or a quarter of the file system if smaller."""
    st = os.statvfs(root)
    return min(DEFAULT_MAX_BYTES, st.f_blocks * st.f_frsize // DISK_SHARE)


def days_to_keep(days: Sequence[tuple[int, int]], wanted: set[int], *,
                 recent: int = RECENT_DAYS) -> set[int]:
    """Of the (day, events) a replay builds in order, the days worth caching.

    The days asked for; the last `recent` (an import's and a full replay's: the next
    import starts from the last one, validate-day and diffs read the day before; a
    rebuild of one day passes 0); and a checkpoint once
    ``CHECKPOINT_DAYS`` days or ``CHECKPOINT_EVENTS`` events were built since the last
    day kept, so that rebuilding any day replays at most that much. 5,000 small days keep
    ~320 snapshots instead of 5,000.
    """
    keep = set(wanted) | ({day for day, _ in days[-recent:]} if recent else set())
    since_days = since_events = 0
    for day, n_events in days:
        since_days += 1
        since_events += n_events
        if day in keep or since_days >= CHECKPOINT_DAYS or since_events >= CHECKPOINT_EVENTS:
            keep.add(day)
            since_days = since_events = 0
    return keep


class Pin:
    """A shared flock on a cache entry: while it is held no process evicts the entry.

    Release it (or leave the ``with`` block); one that is garbage-collected, or whose
    process dies, is released too."""

    def __init__(self, world_hash: str, world: Path, fd: int) -> None:
        self.world_hash = world_hash
        self.world = world
        self._release = weakref.finalize(self, os.close, fd)

    def release(self) -> None:
        self._release()

    @property
    def held(self) -> bool:
        return self._release.alive

    def __enter__(self) -> Pin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass(frozen=True, slots=True)
class CachedEntry:
    world_hash: str
    bytes: int
    last_used_ns: int
    pinned: bool = False


@dataclass(frozen=True, slots=True)
class CacheStats:
    root: Path
    max_bytes: int
    entries: tuple[CachedEntry, ...]  # least recently used first

    @property
    def total_bytes(self) -> int:
        return sum(e.bytes for e in self.entries)

    @property
    def pinned(self) -> tuple[CachedEntry, ...]:
        return tuple(e for e in self.entries if e.pinned)


@dataclass(frozen=True, slots=True)
class PruneReport:
    max_bytes: int
    evicted: tuple[CachedEntry, ...]  # in the order they went: least recently used first
    pinned: tuple[CachedEntry, ...]  # would have gone, but an open instance uses them
    total_bytes: int  # what the cache holds afterwards

    @property
    def freed_bytes(self) -> int:
        return sum(e.bytes for e in self.evicted)


class SnapshotCache:
    def __init__(self, root: Path, max_bytes: int | None = None) -> None:
        """`max_bytes`: the cap; None reads env ``WORLDCTL_CACHE_MAX``, else the default."""
        self.root = Path(root)
        self.snapshots = self.root / "snapshots"
        self.tmp = self.root / "tmp"
        self.snapshots.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.max_bytes = self._cap(max_bytes)

    def _cap(self, given: int | None) -> int:
        if given is not None:
            if given < 0:
                raise ConfigError(f"cache_max_bytes {given}: a cache cap cannot be negative")
            return given
        text = os.environ.get(CACHE_MAX_ENV, "").strip()
        if text:
            return parse_size(text, what=f"env {CACHE_MAX_ENV}")
        return default_max_bytes(self.root)

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
        """Publish a copy of `world` under `world_hash` (atomically); return its world dir.
        The entry is not pinned: hold ``put_pinned`` to read it for a while."""
        with self.put_pinned(world, world_hash, manifest) as pin:
            return pin.world

    def put_pinned(self, world: Path, world_hash: str, manifest: Manifest) -> Pin:
        """Publish a copy of `world` under `world_hash` (atomically), pinned for the caller:
        the pin is taken before the rename, so no eviction can come between."""
        while True:
            existing = self.pin(world_hash)
            if existing is not None:
                return existing
            staging = self.scratch()
            copy_tree(world, staging / "world")
            (staging / "manifest.json").write_bytes(encode_manifest(manifest))
            (staging / _LOCK).touch()
            size = _record_size(staging)
            chmod_tree(staging, files=0o444)
            fd = os.open(staging / _LOCK, os.O_RDONLY | os.O_CLOEXEC)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)
                published, total = self._publish(staging, world_hash, size)
            except BaseException:
                os.close(fd)
                raise
            if not published:  # someone published the same hash first: pin theirs
                os.close(fd)
                remove_tree(staging)
                continue
            pin = Pin(world_hash, self.entry(world_hash) / "world", fd)
            if total is None or total > self.max_bytes:  # (None: no total yet; count)
                self._shrink(self.max_bytes, int(self.max_bytes * LOW_WATER), wait=False)
            return pin

    def _publish(self, staging: Path, world_hash: str, size: int) -> tuple[bool, int | None]:
        """Rename `staging` into place; return whether it was ours, and the new total.

        Counted before the rename and under the same lock as a recount: a crash in
        between leaves the total too high (and the next pass recounts), never too low."""
        with self._usage() as fd:
            total = _read_total(fd)
            if total is not None:
                _write_total(fd, total + size)
            try:
                os.rename(staging, self.entry(world_hash))
            except OSError:  # the target exists and is not empty
                if total is not None:
                    _write_total(fd, total)
                return False, total
        return True, None if total is None else total + size

    def pin(self, world_hash: str) -> Pin | None:
        """Hold the entry of `world_hash` against eviction (and record a use), or None if
        it is not cached."""
        lock = self.entry(world_hash) / _LOCK
        for _attempt in range(3):
            try:
                # O_CREAT: an entry published before entries had locks gets one now.
                fd = os.open(lock, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o444)
            except (FileNotFoundError, NotADirectoryError):
                return None
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)
                # An eviction may have renamed the entry away while we waited for the lock
                # (and another process may have published it again): ours must be it.
                if _same_file(fd, lock) and (lock.parent / "world").is_dir():
                    pin = Pin(world_hash, lock.parent / "world", fd)
                    _touch(lock)
                    return pin
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
        return None

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
        """Drop an entry whether or not it is pinned: for an entry found damaged."""
        entry = self.entry(world_hash)
        if entry.exists():
            self._drop(world_hash, _entry_bytes(entry))

    def _drop(self, world_hash: str, size: int) -> None:
        doomed = self.scratch()
        with self._usage() as fd:
            try:
                os.rename(self.entry(world_hash), doomed / "entry")
            except FileNotFoundError:
                size = 0  # another process dropped it first
            total = _read_total(fd)
            if total is not None:
                _write_total(fd, max(0, total - size))
        remove_tree(doomed)

    def _evict_unpinned(self, world_hash: str, size: int) -> bool | None:
        """Evict the entry unless it is pinned: True if evicted (or already gone), False if
        pinned, None if it was replaced meanwhile (a new, fresh entry: kept)."""
        lock = self.entry(world_hash) / _LOCK
        try:
            fd = os.open(lock, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o444)
        except (FileNotFoundError, NotADirectoryError):
            return True
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            if not _same_file(fd, lock):
                return None
            self._drop(world_hash, size)  # renamed away while we hold it exclusively
            return True
        finally:
            os.close(fd)

    def _is_pinned(self, world_hash: str) -> bool:
        lock = self.entry(world_hash) / _LOCK
        try:
            fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing drops our probe
        return False

    # --- size, use and eviction -------------------------------------------------------

    def entries(self) -> list[CachedEntry]:
        """Every entry with its size and last use; recounts the cache's total."""
        with self._usage() as fd:
            found = []
            for item in os.scandir(self.snapshots):
                info = _entry_info(Path(item.path))
                if info is not None:
                    found.append(info)
            _write_total(fd, sum(e.bytes for e in found))
        return found

    def stats(self) -> CacheStats:
        entries = [replace(e, pinned=self._is_pinned(e.world_hash)) for e in self.entries()]
        entries.sort(key=lambda e: (e.last_used_ns, e.world_hash))
        return CacheStats(self.root, self.max_bytes, tuple(entries))

    def prune(self, max_bytes: int | None = None) -> PruneReport:
        """Evict least recently used entries until the cache holds at most `max_bytes`
        (default: the cap); pinned entries stay, whatever the total."""
        limit = self.max_bytes if max_bytes is None else max_bytes
        if limit < 0:
            raise ConfigError(f"max size {limit}: a cache size cannot be negative")
        report = self._shrink(limit, limit, wait=True)
        assert report is not None
        return report

    def _shrink(self, limit: int, target: int, *, wait: bool) -> PruneReport | None:
        """If the cache holds more than `limit`, evict down to `target`. Without `wait`,
        return None at once when another pass is under way (it frees what we would)."""
        with self._evicting(wait=wait) as ours:
            if not ours:
                return None
            entries = self.entries()
            total = sum(e.bytes for e in entries)
            evicted: list[CachedEntry] = []
            pinned: list[CachedEntry] = []
            if total > limit:
                for entry in sorted(entries, key=lambda e: (e.last_used_ns, e.world_hash)):
                    if total <= target:
                        break
                    outcome = self._evict_unpinned(entry.world_hash, entry.bytes)
                    if outcome:
                        evicted.append(entry)
                        total -= entry.bytes
                    elif outcome is False:
                        pinned.append(replace(entry, pinned=True))
            return PruneReport(limit, tuple(evicted), tuple(pinned), total)

    @contextmanager
    def _usage(self) -> Iterator[int]:
        """The total's file, locked exclusively: publishes, evictions and recounts."""
        fd = os.open(self.root / _USAGE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)

    @contextmanager
    def _evicting(self, *, wait: bool) -> Iterator[bool]:
        fd = os.open(self.root / _EVICTING, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

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
                except OSError as exc:
                    _log.warning("cannot claim the leftover %s (%s); skipped", entry, exc)
                    continue
                try:
                    remove_tree(claimed)  # iterative: any depth, any modes
                except (OSError, WorldDirError) as exc:
                    # Opening a store never fails over scratch: what this process cannot
                    # remove stays, under a dead pid once we exit, for a later try.
                    _log.warning("cannot remove the leftover %s (%s); skipped", claimed, exc)


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


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (st.st_dev, st.st_ino)


def _touch(lock: Path) -> None:
    # An entry of another user's cannot be touched: its use goes unrecorded, that is all.
    with contextlib.suppress(OSError):
        os.utime(lock)


def _disk_bytes(top: Path) -> int:
    """Bytes allocated on disk under `top` (itself included), as du counts them."""
    return os.lstat(top).st_blocks * 512 + sum(e.stat.st_blocks * 512 for e in walk(top))


def _record_size(staging: Path) -> int:
    """Write the entry's size into it (the size file included: written fixed-width once
    as a placeholder, then measured, then overwritten with the same length)."""
    path = staging / _SIZE
    path.write_text("0" * _SIZE_WIDTH + "\n")
    size = _disk_bytes(staging)
    path.write_text(f"{size:0{_SIZE_WIDTH}d}\n")
    return size


def _entry_bytes(entry: Path) -> int:
    try:
        return int((entry / _SIZE).read_text())
    except (OSError, ValueError):  # an entry from before sizes were recorded
        try:
            return _disk_bytes(entry)
        except FileNotFoundError:
            return 0


def _entry_info(entry: Path) -> CachedEntry | None:
    try:
        used = os.stat(entry / _LOCK).st_mtime_ns
    except FileNotFoundError:
        try:
            used = os.stat(entry).st_mtime_ns  # an entry from before locks
        except FileNotFoundError:
            return None  # evicted while we listed
    if not entry.is_dir():
        return None
    return CachedEntry(entry.name, _entry_bytes(entry), used)


def _read_total(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 64, 0).decode())
    except (UnicodeDecodeError, ValueError):  # no total yet (or garbage): count again
        return None


def _write_total(fd: int, total: int) -> None:
    os.pwrite(fd, f"{total:0{_SIZE_WIDTH}d}\n".encode(), 0)
    os.ftruncate(fd, _SIZE_WIDTH + 1)
