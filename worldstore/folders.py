"""Folders someone hands over are data: reading and writing them without following a link.

A run folder, a pack, a checkout or a task folder may have been made by someone else, so
nothing under the folder named on the command line is trusted to be what its name says.
That folder itself is opened as named (the person chose it); below it every step is taken
from a directory descriptor (``openat``) with ``O_NOFOLLOW``, and each entry is looked at
with ``lstat`` before it is used:

* a **read** opens only a regular file (``O_NOFOLLOW | O_NONBLOCK``, checked again with
  ``fstat``), never a symlink, FIFO, socket or device, and never a path through a
  symlinked folder;
* a **write** creates a new file under a fresh name in its folder (``O_CREAT | O_EXCL |
  O_NOFOLLOW``) and renames it over the old name inside the same directory descriptor, so
  what was there (a symlink, a hardlink of a file elsewhere) is replaced, never written
  through; folders on the way are made with ``mkdirat``. It is the project's one atomic
  write: ``write_bytes``/``write_file`` for bytes in hand, ``writing_file`` for a file
  written in pieces (an archive, a generated log);
* ``check_writable`` looks at every target of a command before it writes any, so a
  command refused for a link where it would write has written nothing;
  ``check_named_file`` does the same for a file named whole on the command line
  (``--out FILE``), whose folder must not be a symlink either;
* ``staged_folder`` gives a command that fills a new folder a fresh temporary one beside
  it, renamed into place only when the command succeeds (or swapped for a folder the
  caller may replace).

A refusal is a ``FolderError`` naming the path, so the command line shows it as one
``error:`` line.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from worldstore.errors import FolderError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
DEFAULT_LIMIT = 256 << 20
_TEMP_NAMES = itertools.count()

FILE, DIR = "file", "dir"
_KINDS = ((stat.S_ISREG, FILE), (stat.S_ISDIR, DIR), (stat.S_ISLNK, "symlink"),
          (stat.S_ISFIFO, "fifo"), (stat.S_ISSOCK, "socket"),
          (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"))


def kind_of(mode: int) -> str:
    """'file', 'dir', 'symlink', 'fifo', 'socket', 'character device', 'block device'."""
    return next((name for test, name in _KINDS if test(mode)), "special file")


def parts_of(rel: str) -> list[str]:
    """The segments of a relative POSIX path inside a folder; FolderError for an absolute
    path, an empty, '.' or '..' segment, a backslash or a NUL (a name from a file someone
    handed over must not lead out of the folder)."""
    parts = rel.split("/")
    if (not rel or rel.startswith("/") or "\\" in rel or "\0" in rel
            or any(part in ("", ".", "..") for part in parts)):
        raise FolderError(f"{rel!r}: not a relative path inside the folder (an absolute "
                          "path, or an empty, '.' or '..' segment)")
    return parts


# --- directory descriptors -----------------------------------------------------------------


def _open_root(root: Path) -> int:
    try:
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise FolderError(f"{root}: not a folder that can be opened ({exc.strerror})"
                          ) from None


def _lstat_at(fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _open_dir_at(fd: int, name: str, where: Path) -> int:
    """The sub-folder `name` of `fd`, refused unless it is a real folder (not a link)."""
    st = _lstat_at(fd, name)
    if st is None:
        raise FileNotFoundError(errno.ENOENT, "no such folder", str(where))
    if not stat.S_ISDIR(st.st_mode):
        raise FolderError(f"{where}: a {kind_of(st.st_mode)} where a folder belongs; "
                          "refused (links are never followed)")
    try:
        sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
    except OSError as exc:
        raise FolderError(f"{where}: cannot be opened ({exc.strerror})") from None
    opened = os.fstat(sub)
    if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
        os.close(sub)
        raise FolderError(f"{where}: changed while it was being opened; refused")
    return sub


@contextlib.contextmanager
def _dir_fd(root: Path, parts: list[str], *, create: bool = False) -> Iterator[int]:
    """A descriptor of the folder root/parts..., every step below `root` without following
    a link; with `create`, missing folders are made (``mkdirat``)."""
    fd = _open_root(root)
    try:
        where = root
        for part in parts:
            where = where / part
            if create and _lstat_at(fd, part) is None:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            sub = _open_dir_at(fd, part, where)
            os.close(fd)
            fd = sub
        yield fd
    finally:
        os.close(fd)


# --- reading -------------------------------------------------------------------------------


def entry_kind(root: Path, rel: str) -> str | None:
    """What `rel` under `root` is (see kind_of), never following a link on the way; None
    when it (or a folder on the way) does not exist. A link on the way is refused."""
    parts = parts_of(rel)
    try:
        with _dir_fd(root, parts[:-1]) as fd:
            st = _lstat_at(fd, parts[-1])
    except FileNotFoundError:
        return None
    return None if st is None else kind_of(st.st_mode)


def read_bytes(root: Path, rel: str, *, limit: int = DEFAULT_LIMIT) -> bytes:
    """The regular file `rel` under `root`: FileNotFoundError when absent; FolderError for
    a link (there or on the way), a special file (never opened: a FIFO would block, a
    device could act) or more than `limit` bytes."""
    parts = parts_of(rel)
    with _dir_fd(root, parts[:-1]) as fd:
        return _read_at(fd, parts[-1], root / rel, limit)


def read_optional(root: Path, rel: str, *, limit: int = DEFAULT_LIMIT) -> bytes | None:
    """read_bytes, or None when the file (or a folder on its way) does not exist."""
    try:
        return read_bytes(root, rel, limit=limit)
    except FileNotFoundError:
        return None


def read_file(path: Path, *, limit: int = DEFAULT_LIMIT) -> bytes:
    """The regular file at `path`, its last step not followed if it is a link (the
    folders above it are as the caller named them)."""
    return read_bytes(path.parent, path.name, limit=limit)


def _read_at(fd: int, name: str, where: Path, limit: int) -> bytes:
    st = _lstat_at(fd, name)
    if st is None:
        raise FileNotFoundError(errno.ENOENT, "no such file", str(where))
    if not stat.S_ISREG(st.st_mode):
        raise FolderError(f"{where}: a {kind_of(st.st_mode)}, not a regular file; refused "
                          "(links and special files are never opened)")
    try:
        handle = os.open(name, _READ_FLAGS, dir_fd=fd)
    except OSError as exc:
        raise FolderError(f"{where}: cannot be read ({exc.strerror})") from None
    with open(handle, "rb", closefd=True) as fh:
        opened = os.fstat(handle)
        if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (
                st.st_dev, st.st_ino):
            raise FolderError(f"{where}: changed while it was being read; refused")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise FolderError(f"{where}: larger than {limit} bytes; refused")
    return data


def list_entries(root: Path, rel: str = "") -> list[tuple[str, str]]:
    """(name, kind) of the entries of the folder `rel` under `root` ('' for `root`), in
    name order, none followed; [] when it does not exist; FolderError when it is a link
    or not a folder."""
    try:
        with _dir_fd(root, parts_of(rel) if rel else []) as fd, os.scandir(fd) as it:
            found = [(e.name, kind_of(e.stat(follow_symlinks=False).st_mode)) for e in it]
    except FileNotFoundError:
        return []
    return sorted(found, key=lambda item: os.fsencode(item[0]))


def refuse_links(root: Path, *, max_entries: int = 1_000_000) -> None:
    """FolderError naming the first entry under `root` that is not a regular file or a
    folder (a symlink, FIFO, socket or device), for a folder that must hold only data; no
    link is followed on the way (each folder is opened from its parent's descriptor).
    A missing `root` holds nothing to refuse."""
    try:
        pending = [(_open_root(root), root)]
    except FileNotFoundError:
        return
    seen = 0
    try:
        while pending:
            fd, where = pending.pop()
            try:
                with os.scandir(fd) as it:
                    found = [(e.name, e.stat(follow_symlinks=False).st_mode) for e in it]
                seen += len(found)
                if seen > max_entries:
                    raise FolderError(f"{root}: more than {max_entries} entries; refused")
                for name, mode in sorted(found):
                    if stat.S_ISDIR(mode):
                        pending.append((_open_dir_at(fd, name, where / name), where / name))
                    elif not stat.S_ISREG(mode):
                        raise FolderError(f"{where / name}: a {kind_of(mode)}; this folder "
                                          "may hold only regular files and folders (links "
                                          "are never followed)")
            finally:
                os.close(fd)
    finally:
        for fd, _where in pending:
            os.close(fd)


def walk_files(root: Path, rel: str = "", *, max_entries: int = 1_000_000) -> list[str]:
    """Every regular file under the folder `rel` of `root`, as paths relative to `root`,
    sorted; folders are entered without following a link; links and special files are
    skipped (never read)."""
    found: list[str] = []
    pending = [rel]
    seen = 0
    while pending:
        here = pending.pop()
        for name, kind in list_entries(root, here):
            seen += 1
            if seen > max_entries:
                raise FolderError(f"{root / rel}: more than {max_entries} entries; refused")
            path = f"{here}/{name}" if here else name
            if kind == DIR:
                pending.append(path)
            elif kind == FILE:
                found.append(path)
    return sorted(found)


# --- writing -------------------------------------------------------------------------------


def check_writable(root: Path, rels: Iterable[str]) -> None:
    """Refuse (FolderError naming the path) before anything is written when a target
    `rel` under `root` could not be written as a file the project makes itself: a folder
    on the way that is a link or not a folder, or a target that is a folder, link or
    special file. A missing target (or folder on the way) is fine: it will be made."""
    for rel in rels:
        parts = parts_of(rel)
        where = root
        try:
            fd = _open_root(root)
        except FileNotFoundError:
            continue
        try:
            for i, part in enumerate(parts):
                where = where / part
                st = _lstat_at(fd, part)
                if st is None:
                    break
                last = i == len(parts) - 1
                if last and not stat.S_ISREG(st.st_mode):
                    raise FolderError(f"{where}: a {kind_of(st.st_mode)} where the file "
                                      "is to be written; refused (nothing written)")
                if not last:
                    sub = _open_dir_at(fd, part, where)
                    os.close(fd)
                    fd = sub
        finally:
            os.close(fd)


def check_named_file(path: Path, what: str) -> None:
    """Refuse (FolderError naming `path`) before anything is written when the file the
    caller names whole could not be written as a new file: its folder is a symlink (even a
    dangling one), or `path` is a link, folder or special file. Missing is fine."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISLNK(os.lstat(path.parent).st_mode):
            raise FolderError(f"{what} {path}: its folder {path.parent} is a symlink; "
                              "refused (nothing written)")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise FolderError(f"{what} {path}: a {kind_of(st.st_mode)} where the file is to be "
                          "written; refused (nothing written)")


def write_bytes(root: Path, rel: str, data: bytes, *, durable: bool = False,
                mode: int = 0o644) -> Path:
    """Write `data` as the file `rel` under `root` (folders on the way made as needed):
    a new file under a temporary name, renamed over `rel` in the same folder, so no link
    is followed and a file hardlinked from elsewhere is replaced, not changed, and a crash
    leaves the old file or the new one, never half of one. Returns root/rel."""
    parts = parts_of(rel)
    with _dir_fd(root, parts[:-1], create=True) as fd, \
            _replacing_at(fd, parts[-1], root / rel, durable=durable, mode=mode) as fh:
        fh.write(data)
    return root / rel


def write_file(path: Path, data: bytes, *, durable: bool = False) -> Path:
    """write_bytes for a file the caller names whole (its folder as named)."""
    return write_bytes(path.parent, path.name, data, durable=durable)


@contextlib.contextmanager
def writing_file(path: Path, *, durable: bool = False, mode: int = 0o644) -> Iterator[BinaryIO]:
    """write_file for content written in pieces: the block writes to the file handed to
    it, and `path` is replaced when the block ends without an exception; when it raises,
    the temporary file is removed and `path` is untouched."""
    with _dir_fd(path.parent, [], create=True) as fd, \
            _replacing_at(fd, path.name, path, durable=durable, mode=mode) as fh:
        yield fh


@contextlib.contextmanager
def _replacing_at(fd: int, name: str, where: Path, *, durable: bool,
                  mode: int) -> Iterator[BinaryIO]:
    st = _lstat_at(fd, name)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise FolderError(f"{where}: a folder where the file is to be written; refused")
    temp = f".{name[:64]}.{os.getpid()}-{next(_TEMP_NAMES)}.partial"
    handle = os.open(temp, _NEW_FILE_FLAGS, mode, dir_fd=fd)
    try:
        with open(handle, "wb", closefd=True) as fh:
            yield fh
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.rename(temp, name, src_dir_fd=fd, dst_dir_fd=fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=fd)
        raise


def make_dirs(root: Path, rel: str) -> Path:
    """Make the folder `rel` under `root` and every folder on its way, following no link."""
    with _dir_fd(root, parts_of(rel), create=True):
        return root / rel


# --- a new folder, whole or not at all ------------------------------------------------------


def refuse_unless_new(path: Path, what: str) -> None:
    """FolderError unless `path` is absent or an empty folder (not a link to one)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        raise FolderError(f"{what} {path}: a {kind_of(st.st_mode)}, not a new folder; "
                          "refused")
    if os.listdir(path):
        raise FolderError(f"{what} {path}: not empty; it must be a new folder")


@contextlib.contextmanager
def staged_folder(dest: Path, what: str, *, replacing: bool = False) -> Iterator[Path]:
    """A fresh temporary folder beside `dest` to fill; renamed to `dest` when the block
    ends without an exception, removed (and `dest` untouched) when it raises. `dest` must
    be absent or an empty folder; with `replacing`, a `dest` that is there (the caller has
    checked it is its own to replace) is moved aside, the new folder renamed in, and the
    old one removed."""
    if not replacing:
        refuse_unless_new(dest, what)
    parent = dest.parent
    parent.mkdir(parents=True, exist_ok=True)
    temp = Path(tempfile.mkdtemp(prefix=f".{dest.name[:64]}.", suffix=".partial", dir=parent))
    try:
        yield temp
        if replacing and os.path.lexists(dest):
            old = dest.with_name(f".{dest.name[:64]}.old")
            _remove(old)  # left by a crash between the two renames
            os.rename(dest, old)
            os.rename(temp, dest)
            _remove(old)
        else:
            refuse_unless_new(dest, what)  # made meanwhile by someone else: keep theirs
            os.rename(temp, dest)
    except BaseException:
        _remove(temp)
        raise


def _remove(path: Path) -> None:
    """Remove a tree the project made, never following a link in it."""
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(path)
            return
        fd = os.open(path, _DIR_FLAGS)
        try:
            _empty_at(fd)
        finally:
            os.close(fd)
        os.rmdir(path)


def _empty_at(fd: int) -> None:
    with os.scandir(fd) as it:
        entries = [(e.name, e.stat(follow_symlinks=False)) for e in it]
    for name, st in entries:
        if stat.S_ISDIR(st.st_mode):
            sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            try:
                _empty_at(sub)
            finally:
                os.close(sub)
            os.rmdir(name, dir_fd=fd)
        else:
            os.unlink(name, dir_fd=fd)


__all__ = ["DEFAULT_LIMIT", "DIR", "FILE", "check_named_file", "check_writable", "entry_kind",
           "kind_of", "list_entries", "make_dirs", "parts_of", "read_bytes", "read_file",
           "read_optional", "refuse_links", "refuse_unless_new", "staged_folder", "walk_files",
           "write_bytes", "write_file"]
