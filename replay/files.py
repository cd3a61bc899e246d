"""Host-side access to world trees: walking, reading, copying, removing.

Everything under a workspace may have been made by an agent, so nothing here trusts what
it finds: no walk, read, copy, chmod or removal follows a symlink (entries are examined
with ``lstat``, files are opened with ``O_NOFOLLOW`` and checked with ``fstat``), nothing
but a regular file is ever opened (a FIFO, socket or device is reported by its kind), and
walks are iterative with a bound on depth, so a deep tree costs no recursion.

Copies use ``os.copy_file_range``, which clones extents on reflink-capable file systems
(XFS, Btrfs) and copies in the kernel elsewhere. A writable database is never hardlinked:
a write through one link would change every world sharing it.
"""

from __future__ import annotations

import errno
import itertools
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from replay.errors import WorldDirError
from worldstore.names import MAX_PATH

_CHUNK = 1 << 30
# No world replayed from a log is deeper: a log's path has at most MAX_PATH characters,
# so at most this many segments. Walks refuse anything deeper instead of recursing on.
MAX_DEPTH = (MAX_PATH + 1) // 2
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OWNER_RWX = stat.S_IRWXU

FILE, DIR, SYMLINK = "file", "dir", "symlink"
_KINDS = ((stat.S_ISREG, FILE), (stat.S_ISDIR, DIR), (stat.S_ISLNK, SYMLINK),
          (stat.S_ISFIFO, "fifo"), (stat.S_ISSOCK, "socket"),
          (stat.S_ISCHR, "char-device"), (stat.S_ISBLK, "block-device"))
# What a special file is called; a world records one by this name only, never opened.
SPECIAL_KINDS = frozenset(name for _test, name in _KINDS[3:]) | {"unknown"}


def kind_of(mode: int) -> str:
    """'file', 'dir', 'symlink', 'fifo', 'socket', 'char-device', 'block-device' or
    'unknown', from an (l)stat mode."""
    return next((name for test, name in _KINDS if test(mode)), "unknown")


class Entry(NamedTuple):
    """One entry found by ``walk``: never followed, its own ``lstat``."""

    rel: str  # path relative to the walked top, '/'-separated
    path: Path
    kind: str  # see kind_of
    stat: os.stat_result
    depth: int  # number of segments of rel


def walk(top: Path, *, max_depth: int = MAX_DEPTH,
         before_listing: Callable[[Path, os.stat_result], None] | None = None,
         descend: Callable[[Entry], bool] | None = None,
         max_entries: int | None = None) -> Iterator[Entry]:
    """Every entry under `top` (not `top` itself), depth first, each directory's entries
    in name order. Symlinks are reported, never followed; each directory is opened with
    ``O_NOFOLLOW`` and must be the very inode its parent listed. An entry deeper than
    `max_depth` segments raises WorldDirError (nothing is recursed: the pending
    directories are a list). `before_listing(path, stat)` runs on each directory (`top`
    included) before it is opened, e.g. to give it a mode its owner can list; a directory
    for which `descend(entry)` is false (asked after it was yielded, so the caller may
    have removed it) is not entered. With `max_entries`, the walk stops after listing that
    many entries in all (a caller counting them sees the overflow without this walk
    reading a million names into memory first)."""
    try:
        top_stat = os.lstat(top)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(top_stat.st_mode):
        raise WorldDirError(f"{top}: not a directory ({kind_of(top_stat.st_mode)})")
    pending: list[tuple[str, Path, os.stat_result, int]] = [("", top, top_stat, 0)]
    budget = max_entries
    while pending and (budget is None or budget > 0):
        rel_dir, here, expected, depth = pending.pop()
        if before_listing is not None:
            before_listing(here, expected)
        entries = _list_dir(here, expected, budget)
        if budget is not None:
            budget -= len(entries)
        children = []
        for name, st in entries:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if depth + 1 > max_depth:
                raise WorldDirError(f"{top}: {_shorten(rel)} is deeper than {max_depth} "
                                    "levels")
            entry = Entry(rel, here / name, kind_of(st.st_mode), st, depth + 1)
            yield entry
            if entry.kind == DIR and (descend is None or descend(entry)):
                children.append((rel, entry.path, st, depth + 1))
        pending.extend(reversed(children))  # popped in name order


def _list_dir(path: Path, expected: os.stat_result, most: int | None = None
              ) -> list[tuple[str, os.stat_result]]:
    """(name, lstat) of a directory's entries (at most `most` of them), sorted by name,
    read through one ``O_NOFOLLOW`` descriptor that must be the directory the walk saw."""
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError as exc:
        raise WorldDirError(f"{_shorten(str(path))}: cannot be listed ({exc.strerror})"
                            ) from None
    try:
        _check_same(fd, expected, path)
        with os.scandir(fd) as it:
            found = [(e.name, e.stat(follow_symlinks=False))
                     for e in itertools.islice(it, most)]
    finally:
        os.close(fd)
    found.sort(key=lambda item: os.fsencode(item[0]))
    return found


def _check_same(fd: int, expected: os.stat_result, path: Path) -> None:
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (expected.st_dev, expected.st_ino):
        raise WorldDirError(f"{_shorten(str(path))}: changed while it was being read")


def _shorten(text: str) -> str:
    return text if len(text) <= 200 else f"{text[:120]}...{text[-60:]}"


def open_regular(path: Path, expected: os.stat_result | None = None) -> int:
    """A read-only descriptor of the regular file at `path`, never following a symlink
    and never opening anything else (a FIFO would block, a device could act): refused
    with WorldDirError. With `expected`, the file must be that inode."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise WorldDirError(f"{_shorten(str(path))}: not a regular file "
                            f"({kind_of(st.st_mode)}); refused")
    fd = os.open(path, _READ_FLAGS)
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (
                st.st_dev, st.st_ino):
            raise WorldDirError(f"{_shorten(str(path))}: changed while it was being read")
        if expected is not None:
            _check_same(fd, expected, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_chunks(path: Path, chunk: int, expected: os.stat_result | None = None
                ) -> Iterator[bytes]:
    """The bytes of the regular file at `path`, `chunk` at a time (see open_regular):
    a large file is streamed, never held whole."""
    fd = open_regular(path, expected)
    with open(fd, "rb", buffering=0, closefd=True) as fh:
        while block := fh.read(chunk):
            yield block


def read_regular(path: Path, *, limit: int, expected: os.stat_result | None = None
                 ) -> bytes | None:
    """The whole regular file at `path`, or None if it holds more than `limit` bytes."""
    fd = open_regular(path, expected)
    with open(fd, "rb", closefd=True) as fh:
        if os.fstat(fh.fileno()).st_size > limit:
            return None
        data = fh.read(limit + 1)
    return None if len(data) > limit else data


def copy_file(src: Path, dst: Path) -> None:
    """Copy the regular file `src` to a new file `dst` (never following a symlink at
    either end)."""
    fin = open_regular(src)
    fout = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                   0o644)
    with open(fin, "rb", closefd=True) as src_fh, open(fout, "wb", closefd=True) as dst_fh:
        remaining = os.fstat(fin).st_size
        try:
            while remaining > 0:
                copied = os.copy_file_range(fin, fout, min(remaining, _CHUNK))
                if copied == 0:
                    break
                remaining -= copied
        except OSError:
            src_fh.seek(0)
            dst_fh.seek(0)
            dst_fh.truncate()
            shutil.copyfileobj(src_fh, dst_fh, 1 << 20)


def copy_tree(src: Path, dst: Path) -> None:
    """Copy a world tree (regular files, directories, symlinks as links) into `dst`; a
    special file is refused with WorldDirError (a world never holds one)."""
    dst.mkdir(parents=True, exist_ok=True)
    for entry in walk(src):
        target = dst / entry.rel
        if entry.kind == DIR:
            target.mkdir(exist_ok=True)
        elif entry.kind == SYMLINK:
            os.symlink(os.readlink(entry.path), target)
        elif entry.kind == FILE:
            copy_file(entry.path, target)
        else:
            raise WorldDirError(f"{entry.path}: a {entry.kind}; a world holds only regular "
                                "files, directories and symlinks")


def link_tree(src: Path, dst: Path, *, max_entries: int) -> bool:
    """Fill the empty directory `dst` with a hardlinked view of the tree at `src`, for a
    reader that sees `dst` through a read-only bind (a verifier server): directories are
    made anew with their source's mode and, as root, its owner; every other entry (a
    file, a symlink, a FIFO...) is linked, never followed nor opened. `dst` itself gets
    `src`'s mode and owner. A write through a link would change `src`: never for a view
    anyone may write.

    False, `dst` partly filled, when the tree holds more than `max_entries` entries or an
    entry cannot be linked here (another file system, a file the caller may not link);
    a tree deeper than the walks allow raises WorldDirError."""
    made: list[tuple[Path, os.stat_result]] = [(dst, os.lstat(src))]
    count = 0
    for entry in walk(src, max_entries=max_entries + 1):
        count += 1
        if count > max_entries:
            return False
        target = dst / entry.rel
        if entry.kind == DIR:
            os.mkdir(target, 0o700)
            made.append((target, entry.stat))
            continue
        try:
            os.link(entry.path, target, follow_symlinks=False)
        except OSError as exc:
            if exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                return False
            raise
    for path, st in reversed(made):  # modes last: a closed directory was filled first
        if os.geteuid() == 0:
            os.chown(path, st.st_uid, st.st_gid, follow_symlinks=False)
        os.chmod(path, stat.S_IMODE(st.st_mode))
    return True


def chmod_tree(top: Path, *, dirs: int | None = None, files: int | None = None) -> None:
    """Give every directory of the tree at `top` (itself included) the mode `dirs`, and
    every other entry but a symlink the mode `files`; None leaves that kind as it is.
    Symlinks are never followed nor changed. Each directory gets its mode before it is
    listed, so a tree closed to its owner (say 0o000) is opened too."""

    def open_up(path: Path, st: os.stat_result) -> None:
        if dirs is not None and stat.S_IMODE(st.st_mode) != dirs:
            os.chmod(path, dirs)  # walk checked it is a directory, not a link

    for entry in walk(top, before_listing=open_up):
        if files is not None and entry.kind not in (DIR, SYMLINK):
            os.chmod(entry.path, files)


_HOLD_NAMES = itertools.count()


def remove_tree(path: Path) -> None:
    """Remove `path` (a file, a symlink — not what it points to — or a whole tree).

    Iterative and depth-independent: every subdirectory is first moved into one holding
    directory at the top, so no directory is more than two levels down when it is emptied
    and at most three descriptors are open, whatever the depth of the tree. Directories
    closed to their owner are opened first (read-only snapshot trees)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    _open_to_owner(str(path), st, None)
    top = os.open(path, _DIR_FLAGS)
    try:
        _check_same(top, st, path)
        hold_name = _make_hold(top)
        hold = os.open(hold_name, _DIR_FLAGS, dir_fd=top)
        try:
            pending: list[str] = []
            _empty_into(top, hold, pending, skip=hold_name)
            while pending:
                name = pending.pop()
                fd = os.open(name, _DIR_FLAGS, dir_fd=hold)
                try:
                    _empty_into(fd, hold, pending)
                finally:
                    os.close(fd)
                os.rmdir(name, dir_fd=hold)
        finally:
            os.close(hold)
        os.rmdir(hold_name, dir_fd=top)
    finally:
        os.close(top)
    os.rmdir(path)


def _make_hold(top: int) -> str:
    while True:
        name = f".remove-{os.getpid()}-{next(_HOLD_NAMES)}"
        try:
            os.mkdir(name, 0o700, dir_fd=top)
            return name
        except FileExistsError:
            continue


def _empty_into(dir_fd: int, hold: int, pending: list[str], skip: str | None = None) -> None:
    """Unlink every non-directory in `dir_fd`; move every subdirectory into `hold` under a
    fresh name (appended to `pending`). Entries are handled as they are read, so a
    directory of millions of files is never listed into memory; passes repeat until one
    finds nothing (removing entries while reading may hide others from that pass)."""
    found = True
    while found:
        found = False
        with os.scandir(dir_fd) as it:
            for entry in it:
                if entry.name == skip:
                    continue
                found = True
                st = entry.stat(follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode):
                    os.unlink(entry.name, dir_fd=dir_fd)
                    continue
                _open_to_owner(entry.name, st, dir_fd)  # a move writes the dir's '..'
                moved = str(next(_HOLD_NAMES))
                os.rename(entry.name, moved, src_dir_fd=dir_fd, dst_dir_fd=hold)
                pending.append(moved)


def _open_to_owner(name: str, st: os.stat_result, dir_fd: int | None) -> None:
    if st.st_mode & _OWNER_RWX != _OWNER_RWX and os.geteuid() != 0:
        # lstat said directory: chmod cannot be asked not to follow here, nor needs to.
        os.chmod(name, stat.S_IMODE(st.st_mode) | _OWNER_RWX, dir_fd=dir_fd)
