"""The on-disk layout of a world: ``services/<name>.sqlite`` and ``workspace/``.

A checkout, a cached snapshot and a mounted instance all use it, so plain ``sqlite3``
and ordinary file tools can open any of them.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from replay.errors import WorldDirError
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
            continue
        name = entry[: -len(DB_SUFFIX)] if entry.endswith(DB_SUFFIX) else ""
        if not is_service(name) or not (folder / entry).is_file():
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


def workspace_path(root: Path, relpath: str) -> Path:
    """The absolute path of `relpath` in the workspace, refusing any way out of it.

    Every existing component is checked with lstat: a symlink anywhere on the way could
    point outside the workspace, so it is refused.
    """
    check_relpath(relpath)
    base = root / WORKSPACE
    if base.is_symlink():  # the workspace itself must not lead elsewhere either
        raise PathError(f"the workspace {base} is a symlink; refused")
    current = base
    for part in relpath.split("/"):
        current = current / part
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
    if not folder.is_dir():
        return []
    return [(name, folder / name) for name in sorted(os.listdir(folder))]


def iter_workspace(root: Path) -> list[tuple[str, Path]]:
    """(relative path, absolute path) of every file and symlink, sorted by relative path."""
    base = root / WORKSPACE
    found: list[tuple[str, Path]] = []
    if not base.is_dir():
        return found
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames.sort()
        here = Path(dirpath)
        rel_dir = here.relative_to(base).as_posix()
        for name in filenames + [d for d in dirnames if (here / d).is_symlink()]:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            found.append((rel, here / name))
    found.sort(key=lambda item: item[0].encode("utf-8", "surrogateescape"))
    return found
