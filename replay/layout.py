"""The on-disk layout of a world: ``services/<name>.sqlite`` and ``workspace/``.

A checkout, a cached snapshot and a mounted instance all use it, so plain ``sqlite3``
and ordinary file tools can open any of them.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from replay.errors import WorldDirError
from replay.files import DIR, MAX_DEPTH, walk
from worldstore.errors import PathError
from worldstore.names import check_relpath, is_service

SERVICES = "services"
WORKSPACE = "workspace"
APPS = "apps"  # app pins: apps/<service>.json, and apps/<service>.py for carried code
DB_SUFFIX = ".sqlite"
# Sidecar files SQLite may leave next to a database; they belong to that database.
SIDECARS = ("-journal", "-wal", "-shm")


def service_db(root: Path, service: str) -> Path:
    return root / SERVICES / f"{service}{DB_SUFFIX}"


def list_services(root: Path) -> list[str]:
    """Service names of a world directory, sorted; refuses anything unexpected."""
    check_world_dir(root)
    folder = root / SERVICES
    if not folder.is_dir():
        return []
    names = []
    for entry in sorted(os.listdir(folder)):
        if entry.endswith(SIDECARS):
            if not stat.S_ISREG(os.lstat(folder / entry).st_mode):  # SQLite would open it
                raise WorldDirError(f"{folder / entry}: a database's journal that is not "
                                    "a regular file (a link is never followed)")
            continue
        name = entry[: -len(DB_SUFFIX)] if entry.endswith(DB_SUFFIX) else ""
        # lstat: a symlink or a FIFO named like a database is refused, never opened.
        if not is_service(name) or not stat.S_ISREG(os.lstat(folder / entry).st_mode):
            raise WorldDirError(f"{folder / entry}: not a service database (<service>.sqlite)")
        names.append(name)
    return names


def check_world_dir(root: Path) -> None:
    if not root.is_dir():
        raise WorldDirError(f"{root}: not a directory")
    for entry in sorted(os.listdir(root)):
        if entry not in (SERVICES, WORKSPACE, APPS):
            raise WorldDirError(
                f"{root / entry}: unexpected entry; a world holds only {SERVICES}/, "
                f"{WORKSPACE}/ and {APPS}/"
            )
        # lstat: services/ as a symlink into another folder would show that folder's
        # databases as this world's (a checkout is data; nothing in it is followed).
        if not stat.S_ISDIR(os.lstat(root / entry).st_mode):
            raise WorldDirError(f"{root / entry}: not a folder (a symlink or a file); a "
                                "world's parts are folders, never followed")


def workspace_path(root: Path, relpath: str) -> Path:
    """The absolute path of `relpath` in the workspace, refusing any way out of it.

    Every existing component is checked with lstat: a symlink anywhere on the way could
    point outside the workspace, so it is refused.
    """
    check_relpath(relpath)
    base = root / WORKSPACE
    if base.is_symlink():  # the workspace itself must not lead elsewhere either
        raise PathError(f"the workspace {base} is a symlink; refused")
    # Joined as text: a Path per component costs more than its lstat, and replay checks
    # the path of every file event.
    current = os.fspath(base)
    for part in relpath.split("/"):
        current = f"{current}/{part}"
        try:
            mode = os.lstat(current).st_mode
        except (FileNotFoundError, NotADirectoryError):
            break  # nothing further exists, so nothing further can be a symlink
        if stat.S_ISLNK(mode):
            raise PathError(f"path {relpath!r} goes through a symlink ({current}); refused")
    return base / relpath


def iter_apps(root: Path) -> list[tuple[str, Path]]:
    """(file name, path) of the app pin files of a world, sorted."""
    folder = root / APPS
    found = []
    for entry in walk(folder, max_depth=1):  # lstat-only, like the workspace
        if entry.kind == DIR:
            raise WorldDirError(f"{entry.path}: a directory; {APPS}/ holds only pin files")
        found.append((entry.rel, entry.path))
    return found


def iter_workspace(root: Path, *, max_depth: int = MAX_DEPTH) -> list[tuple[str, Path]]:
    """(relative path, absolute path) of every entry of the workspace but a directory
    (files, symlinks and special files), sorted by relative path. Never follows a symlink;
    a tree deeper than `max_depth` raises WorldDirError."""
    found = [(e.rel, e.path) for e in walk(root / WORKSPACE, max_depth=max_depth)
             if e.kind != DIR]
    found.sort(key=lambda item: item[0].encode("utf-8", "surrogateescape"))
    return found
