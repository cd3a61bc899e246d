"""What a shell call left in a workspace, checked before the host trusts any of it.

After every shell call the instance scans its workspace (``check_workspace``). The scan
looks at nothing but ``lstat`` until every rule below holds, so a huge or hostile tree
costs neither memory nor a blocked read:

* **Only what replay can recreate.** Regular files, directories and symlinks (a symlink is
  kept as its target text, never followed); names that are valid workspace paths
  (``worldstore.names.check_relpath``, UTF-8). A FIFO, socket or device, a name with a
  backslash or invalid UTF-8, a path over ``MAX_PATH`` characters: refused. An episode
  therefore never holds something its replay could not write back.
* **Quotas** (``WorkspaceLimits``): total bytes of regular files, number of entries
  (files, symlinks, directories), largest file, depth. Sizes are apparent sizes
  (``st_size``): a sparse file counts at the size a reader of it would see.

A call that breaks a rule gets an error result naming the rule and the path, and its
changes are rolled back (``roll_back``): the workspace returns to the state before the
call, so the recorded episode stays what replay rebuilds. Only once a scan passes are
changed files read (each one bounded, through ``O_NOFOLLOW``, checked to be the very
inode the scan saw); unchanged files (same inode, size, mtime and ctime, which user space
cannot set back) are not read at all.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from replay.errors import WorldDirError
from replay.files import DIR, FILE, MAX_DEPTH, SYMLINK, Entry, read_regular, remove_tree, walk
from replay.hashing import Manifest, file_digest
from worldstore.canonical import digest
from worldstore.errors import ConfigError, PathError
from worldstore.names import check_relpath

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class WorkspaceLimits:
    """What one instance's workspace may hold after a shell call.

    The defaults fit an agent's working files with room to spare and keep a host that
    serves hundreds of instances safe: 256 MiB in all, 10,000 entries, 64 MiB for one
    file, 64 levels of directories. A snapshot that already holds more (a world log may)
    raises each limit to what it holds, for its instances (``covering``).
    """

    max_total_bytes: int = 256 * MiB  # the sum of st_size over regular files
    max_files: int = 10_000  # files, symlinks and directories
    max_file_bytes: int = 64 * MiB  # the largest regular file (st_size)
    max_depth: int = 64  # path segments of the deepest entry

    def __post_init__(self) -> None:
        for name in ("max_total_bytes", "max_files", "max_file_bytes", "max_depth"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"workspace limit {name}: must be a positive integer, "
                                  f"not {value!r}")
        if self.max_depth >= MAX_DEPTH:
            raise ConfigError(f"workspace limit max_depth: at most {MAX_DEPTH - 1} (the "
                              f"deepest path a world can hold), not {self.max_depth}")

    def covering(self, manifest: Manifest) -> WorkspaceLimits:
        """These limits, each raised to what the snapshot's own workspace holds (a world
        is never over quota before its agent has done anything)."""
        sizes = [f.size for f in manifest.files.values() if f.link is None]
        dirs = {rel.rsplit("/", i)[0] for rel in manifest.files
                for i in range(1, rel.count("/") + 1)}
        depth = max((rel.count("/") + 1 for rel in manifest.files), default=0)
        return WorkspaceLimits(
            max_total_bytes=max(self.max_total_bytes, sum(sizes)),
            max_files=max(self.max_files, len(manifest.files) + len(dirs)),
            max_file_bytes=max(self.max_file_bytes, max(sizes, default=0)),
            max_depth=min(max(self.max_depth, depth), MAX_DEPTH - 1),
        )


Stamp = tuple[int, int, int, int]  # inode, size, mtime, ctime: a write moves ctime


class Seen(NamedTuple):
    """A workspace file or symlink as a scan found it."""

    kind: str  # FILE or SYMLINK
    stamp: Stamp
    size: int
    digest: str
    link: str | None


@dataclass(slots=True)
class WorkspaceState:
    files: dict[str, Seen] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)


class Change(NamedTuple):
    """A path the call wrote (data or link) or deleted (both None)."""

    path: str
    data: bytes | None
    link: str | None


@dataclass(frozen=True, slots=True)
class Checked:
    state: WorkspaceState
    changes: list[Change]  # deletions first, then writes, each sorted by path


def check_workspace(workspace: Path, limits: WorkspaceLimits,
                    previous: WorkspaceState | None, *, changes: bool = True
                    ) -> Checked | str:
    """The workspace's state and what changed since `previous` (None: everything is new),
    or why it is refused (a sentence naming the rule and the path). With
    ``changes=False`` only the state is wanted: files are streamed, not kept."""
    listed = _listing(workspace, limits)
    if isinstance(listed, str):
        return listed
    entries, dirs = listed
    before = previous.files if previous is not None else {}
    state = WorkspaceState(dirs=dirs)
    written: list[Change] = []
    for entry in entries:
        old = before.get(entry.rel)
        stamp = _stamp(entry.stat)
        if old is not None and old.kind == entry.kind and old.stamp == stamp:
            state.files[entry.rel] = old  # untouched: not read again
            continue
        try:
            seen, change = _read(entry, stamp, limits, keep=changes)
        except (OSError, WorldDirError, UnicodeError):
            return f"{entry.rel} changed while the workspace was read"
        if isinstance(seen, str):
            return seen
        state.files[entry.rel] = seen
        if old is None or (old.kind, old.digest, old.link) != (seen.kind, seen.digest,
                                                                 seen.link):
            written.append(change)
    deleted = [Change(rel, None, None) for rel in sorted(before) if rel not in state.files]
    written.sort(key=lambda c: c.path)
    return Checked(state, deleted + written)


def _listing(workspace: Path, limits: WorkspaceLimits
             ) -> tuple[list[Entry], set[str]] | str:
    """The files and symlinks (and the set of directories) of the workspace, looking at
    nothing but lstat; or the first rule broken."""
    entries: list[Entry] = []
    dirs: set[str] = set()
    total = 0
    try:
        # One level deeper than allowed, and one entry more: enough to see the overflow.
        for entry in walk(workspace, max_depth=limits.max_depth + 1,
                          max_entries=limits.max_files + 1):
            if len(entries) + len(dirs) >= limits.max_files:
                return (f"the workspace holds more than {limits.max_files} files and "
                        "directories (the quota)")
            problem = _unreplayable(entry, limits)
            if problem is not None:
                return problem
            if entry.kind == DIR:
                dirs.add(entry.rel)
                continue
            if entry.kind == FILE:
                size = entry.stat.st_size  # apparent size: a sparse file counts in full
                if size > limits.max_file_bytes:
                    return (f"{entry.rel} is {size} bytes; a workspace file may hold at most "
                            f"{limits.max_file_bytes} bytes (the quota)")
                total += size
                if total > limits.max_total_bytes:
                    return (f"the workspace's files hold more than {limits.max_total_bytes} "
                            f"bytes in all (the quota; {entry.rel} went over)")
            entries.append(entry)
    except WorldDirError as exc:
        return f"the workspace cannot be read: {str(exc).replace(str(workspace) + '/', '')}"
    return entries, dirs


def _unreplayable(entry: Entry, limits: WorkspaceLimits) -> str | None:
    """Why replay could not recreate this entry (or it breaks the depth quota)."""
    if entry.kind not in (FILE, DIR, SYMLINK):
        return (f"{_shown(entry.rel)} is a {entry.kind}; a workspace holds only regular "
                "files, directories and symlinks")
    if entry.depth > limits.max_depth:
        return (f"{_shown(entry.rel)} is {entry.depth} levels deep; a workspace may be at "
                f"most {limits.max_depth} deep (the quota)")
    try:
        entry.rel.encode("utf-8")
        check_relpath(entry.rel)
    except UnicodeEncodeError:
        return f"{_shown(entry.rel)}: a file name that is not UTF-8"
    except PathError as exc:
        return f"{exc}; a workspace path must be one a world can hold"
    return None


def _shown(rel: str) -> str:
    text = os.fsencode(rel).decode("ascii", "backslashreplace")  # odd bytes as \xff
    return text if len(text) <= 200 else f"{text[:120]}...{text[-60:]}"


def _read(entry: Entry, stamp: Stamp, limits: WorkspaceLimits, *, keep: bool
          ) -> tuple[Seen | str, Change]:
    if entry.kind == SYMLINK:
        target = os.readlink(entry.path)  # the text only: never followed
        target.encode("utf-8")  # an episode stores it as JSON text
        return (Seen(SYMLINK, stamp, 0, digest(os.fsencode(target)), target),
                Change(entry.rel, None, target))
    if not keep:
        found = file_digest(entry.path)
        return Seen(FILE, stamp, found.size, found.digest, None), Change(entry.rel, None, None)
    data = read_regular(entry.path, limit=limits.max_file_bytes, expected=entry.stat)
    if data is None:
        return (f"{entry.rel} grew past the quota while it was read",
                Change(entry.rel, None, None))
    return Seen(FILE, stamp, len(data), digest(data), None), Change(entry.rel, data, None)


def _stamp(st: os.stat_result) -> Stamp:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


Content = tuple[bytes | None, str | None]  # (data, None) for a file, (None, target) a link


def roll_back(workspace: Path, before: WorkspaceState,
              content_of: Callable[[str], Content]) -> None:
    """Put the workspace back to `before`: remove every entry it did not hold (a whole
    new directory without entering it), then write back each file and symlink it held
    that is gone or changed (`content_of` gives its content, from the episode or the
    snapshot) and each directory."""

    def keep_dir(entry: Entry) -> bool:
        if entry.rel in before.dirs:
            return True
        remove_tree(entry.path)
        return False

    for entry in walk(workspace, descend=keep_dir):
        if entry.kind == DIR:
            continue
        old = before.files.get(entry.rel)
        if old is None or old.kind != entry.kind or old.stamp != _stamp(entry.stat):
            os.unlink(entry.path)
    for rel in sorted(before.dirs, key=lambda r: r.count("/")):  # parents first
        os.makedirs(workspace / rel, exist_ok=True)
    for rel in sorted(before.files):
        if not os.path.lexists(workspace / rel):
            _write_back(workspace / rel, content_of(rel))


def _write_back(target: Path, content: Content) -> None:
    data, link = content
    if link is not None:
        os.symlink(link, target)
        return
    assert data is not None
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644)
    with open(fd, "wb", closefd=True) as fh:
        fh.write(data)
