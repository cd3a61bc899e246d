"""Copying world trees: reflink where the file system can, a plain copy otherwise.

``os.copy_file_range`` clones extents on reflink-capable file systems (XFS, Btrfs) and
copies in the kernel elsewhere. A writable database is never hardlinked: a write through
one link would change every world sharing it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

_CHUNK = 1 << 30


def copy_file(src: Path, dst: Path) -> None:
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        remaining = os.fstat(fin.fileno()).st_size
        try:
            while remaining > 0:
                copied = os.copy_file_range(fin.fileno(), fout.fileno(), min(remaining, _CHUNK))
                if copied == 0:
                    break
                remaining -= copied
        except OSError:
            fin.seek(0)
            fout.seek(0)
            fout.truncate()
            shutil.copyfileobj(fin, fout, 1 << 20)


def copy_tree(src: Path, dst: Path) -> None:
    """Copy a world tree (regular files, directories, symlinks as links) into `dst`."""
    dst.mkdir(parents=True, exist_ok=True)
    for dirpath, dirnames, filenames in os.walk(src):
        here = Path(dirpath)
        target = dst / here.relative_to(src)
        for d in dirnames:
            s = here / d
            if s.is_symlink():
                os.symlink(os.readlink(s), target / d)
            else:
                (target / d).mkdir(exist_ok=True)
        for f in filenames:
            s = here / f
            if s.is_symlink():
                os.symlink(os.readlink(s), target / f)
            else:
                copy_file(s, target / f)


def chmod_tree(top: Path, *, dirs: int | None = None, files: int | None = None) -> None:
    """Give every directory of the tree at `top` (itself included) the mode `dirs`, and
    every other entry but a symlink the mode `files`; None leaves that kind as it is.
    Symlinks are never followed nor changed. Each directory gets its mode before it is
    listed, so a tree closed to its owner (say 0o000) is opened too."""
    if dirs is not None:
        os.chmod(top, dirs)
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames:  # os.walk lists each of these only after this loop body
            path = os.path.join(dirpath, name)
            if dirs is not None and not os.path.islink(path):
                os.chmod(path, dirs)
        for name in filenames:
            path = os.path.join(dirpath, name)
            if files is not None and not os.path.islink(path):
                os.chmod(path, files)


def remove_tree(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        chmod_tree(path, dirs=0o755)  # read-only snapshot dirs must be emptied too
        shutil.rmtree(path)
