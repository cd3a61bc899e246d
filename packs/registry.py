"""The pack registry: load a domain pack by name (shipped or installed) or by path.

A pack is one folder per domain::

    pack.json        the spec (PackSpec): name, title, description, world logs in import
                     order, optional build script, task folder, optional splits and episodes
    world/           interchange logs (+ the script that writes them)
    apps/            optional: apps the logs carry
    tasks/<task>/    task folders (the format of gates/task.py)
    splits.json      optional: {"sft": [...], "rl": [...], "eval": [...]} task names
    episodes/*.json  optional: scripted episodes (played by worldenv/serving/script.py)

Shipped packs are the folders of this package (``packs/demo/``); installed packs live in a
directory the caller passes (the CLI's packs directory). A name found in both is refused
rather than one shadowing the other, so a pack name always means one folder.

A pack folder is data, wherever it came from: every path pack.json names is checked step
by step with ``lstat`` and refused if any step is a symlink; pack.json, splits.json and
task.json must be regular files (a FIFO is never opened); a task folder may not be a link.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import TypeVar

import msgspec

from packs.errors import PackError
from replay.files import DIR, FILE, SYMLINK, kind_of, walk
from worldstore.jsonfile import decode_json_file

SHIPPED = Path(__file__).resolve().parent
FORMAT = 1
PACK_FILE = "pack.json"
TASK_FILE = "task.json"
SPLITS = ("sft", "rl", "eval")

T = TypeVar("T")

_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*\Z")
# Made by running Python in a pack (a build script, a verifier): not part of the pack.
_GENERATED_DIRS = frozenset({"__pycache__"})


class PackSpec(msgspec.Struct, forbid_unknown_fields=True):
    """pack.json, as written."""

    name: str
    title: str
    description: str
    worlds: list[str]
    format: int
    tasks: str = "tasks"
    build: str | None = None
    splits: str | None = None
    episodes: dict[str, str] = msgspec.field(default_factory=dict)


class SplitsSpec(msgspec.Struct, forbid_unknown_fields=True):
    """splits.json, as written: which tasks are for SFT, RL and evaluation."""

    sft: list[str] = msgspec.field(default_factory=list)
    rl: list[str] = msgspec.field(default_factory=list)
    eval: list[str] = msgspec.field(default_factory=list)


@dataclass(frozen=True)
class Pack:
    name: str
    root: Path
    title: str
    description: str
    worlds: tuple[Path, ...]  # absolute paths of the logs, in import order
    tasks: tuple[str, ...]  # task folder names, sorted
    splits: Mapping[str, tuple[str, ...]]  # sft | rl | eval -> task names
    episodes: Mapping[str, Path]  # name -> scripted episode file
    shipped: bool  # True for the packs of this package
    tasks_dir: Path  # the folder of the task folders
    build: Path | None = None  # the script that writes the logs, if the pack has one

    def task_dir(self, task: str) -> Path:
        if task not in self.tasks:
            raise PackError(f"pack {self.name!r} has no task {task!r} (tasks: "
                            f"{', '.join(self.tasks) or 'none'})")
        return self.tasks_dir / task

    def split(self, name: str) -> tuple[str, ...]:
        if name not in self.splits:
            raise PackError(f"pack {self.name!r} has no split {name!r} (splits: "
                            f"{', '.join(SPLITS)})")
        return self.splits[name]

    def episode(self, name: str) -> Path:
        if name not in self.episodes:
            raise PackError(f"pack {self.name!r} has no episode {name!r} (episodes: "
                            f"{', '.join(sorted(self.episodes)) or 'none'})")
        return self.episodes[name]


def list_packs(installed: Path | None = None) -> list[Pack]:
    """Every shipped pack and every pack in `installed`, sorted by name."""
    shipped = {p.name: p for p in _pack_folders(SHIPPED, strict=False)}
    found = {name: load_pack_dir(folder, shipped=True) for name, folder in shipped.items()}
    if installed is not None:
        for folder in _pack_folders(installed, strict=True):
            _refuse_clash(folder.name, installed)
            found[folder.name] = load_pack_dir(folder, shipped=False)
    return [found[name] for name in sorted(found)]


def load_pack(name: str, installed: Path | None = None) -> Pack:
    """A pack by name (shipped, or installed in `installed`), or by the path of its folder
    (anything with a '/' or starting with '.')."""
    if "/" in name or name.startswith("."):
        folder = Path(name)
        return load_pack_dir(folder, shipped=_is_shipped(folder))
    if not _NAME.match(name):
        raise PackError(f"{name!r} is not a pack name ([a-z0-9][a-z0-9_-]*) nor a path")
    in_shipped = (SHIPPED / name / PACK_FILE).is_file()
    if installed is not None and (installed / name / PACK_FILE).is_file():
        _refuse_clash(name, installed)
        return load_pack_dir(installed / name, shipped=False)
    if in_shipped:
        return load_pack_dir(SHIPPED / name, shipped=True)
    names = sorted(p.name for p in list_packs(installed))
    where = f"shipped or installed in {installed}" if installed is not None else "shipped"
    raise PackError(f"no pack named {name!r} ({where}: {', '.join(names) or 'none'})")


def load_pack_dir(folder: Path, *, shipped: bool) -> Pack:
    """Load and validate one pack folder; PackError names the file and field at fault."""
    root = folder.resolve()
    if not root.is_dir():
        raise PackError("not a pack folder (no such directory)", file=str(folder))
    spec_file = root / PACK_FILE
    _refuse_unless_regular(spec_file, PACK_FILE)
    spec = decode_json_file(spec_file, PackSpec, PackError)
    _check_spec(spec_file, spec, root)
    tasks_dir = _inside(root, spec.tasks, spec_file, "tasks", want="dir")
    tasks = _task_names(tasks_dir)
    splits = _load_splits(root, spec, tasks, spec_file)
    episodes = {name: _inside(root, path, spec_file, f"episodes.{name}", want="file")
                for name, path in sorted(spec.episodes.items())}
    return Pack(
        name=spec.name, root=root, title=spec.title, description=spec.description,
        worlds=tuple(_inside(root, w, spec_file, f"worlds[{i}]", want="file")
                     for i, w in enumerate(spec.worlds)),
        tasks=tasks, splits=MappingProxyType(splits), episodes=MappingProxyType(episodes),
        shipped=shipped, tasks_dir=tasks_dir,
        build=None if spec.build is None else _inside(root, spec.build, spec_file, "build",
                                                      want="file"),
    )


def pack_files(root: Path) -> list[str]:
    """The files of a pack folder, as sorted POSIX paths relative to it: what an export
    carries and what "the same pack" compares. Generated caches are not part of a pack; a
    symlink or anything but a regular file is refused, so a pack means the same bytes
    everywhere."""
    found: list[str] = []
    for entry in walk(root, descend=lambda e: e.path.name not in _GENERATED_DIRS):
        if entry.path.name in _GENERATED_DIRS or entry.path.suffix == ".pyc":
            continue
        if entry.kind == SYMLINK:
            raise PackError("a pack may not hold symlinks", file=str(entry.path))
        if entry.kind == DIR:
            continue
        if entry.kind != FILE:
            raise PackError("a pack may hold only regular files and folders",
                            file=str(entry.path))
        found.append(entry.rel)
    return sorted(found, key=lambda rel: rel.split("/"))  # path order, as before


# --- internals ----------------------------------------------------------------------------


def _pack_folders(parent: Path, *, strict: bool) -> list[Path]:
    """Sub-folders of `parent` that are packs. In the package folder other folders (code
    caches) are skipped; in an installed packs directory every visible folder must be a
    pack, so that a broken install is named instead of silently missing."""
    if not parent.is_dir():
        return []
    folders = []
    for child in sorted(parent.iterdir()):
        if not child.is_dir() or child.name.startswith(".") or child.name in _GENERATED_DIRS:
            continue
        if (child / PACK_FILE).is_file():
            folders.append(child)
        elif strict:
            raise PackError("not a pack (no pack.json) in the packs directory", file=str(child))
    return folders


def _refuse_clash(name: str, installed: Path) -> None:
    if (SHIPPED / name / PACK_FILE).is_file():
        raise PackError(f"pack {name!r} is installed in {installed} and also shipped with the "
                        "package; remove one of them", file=str(installed / name))


def _is_shipped(folder: Path) -> bool:
    return folder.resolve().parent == SHIPPED




def _check_spec(file: Path, spec: PackSpec, root: Path) -> None:
    def bad(message: str, field_name: str) -> PackError:
        return PackError(message, file=str(file), field=field_name)

    if not _NAME.match(spec.name):
        raise bad(f"{spec.name!r} is not a pack name ([a-z0-9][a-z0-9_-]*)", "name")
    if spec.name != root.name:
        raise bad(f"pack {spec.name!r} is in a folder named {root.name!r}; they must match",
                  "name")
    if spec.format != FORMAT:
        raise bad(f"pack format {spec.format} is not supported (this code reads format "
                  f"{FORMAT})", "format")
    if not spec.title.strip():
        raise bad("must not be empty", "title")
    if not spec.worlds:
        raise bad("must list at least one interchange log", "worlds")
    if len(set(spec.worlds)) != len(spec.worlds):
        raise bad("lists a log twice", "worlds")
    for name in spec.episodes:
        if not _NAME.match(name):
            raise bad(f"{name!r} is not an episode name ([a-z0-9][a-z0-9_-]*)",
                      f"episodes.{name}")


def _inside(root: Path, value: str, file: Path, field_name: str, *, want: str) -> Path:
    """`value` (a relative POSIX path in pack.json) as an absolute path inside the pack."""
    def bad(message: str) -> PackError:
        return PackError(f"{value!r} {message}", file=str(file), field=field_name)

    posix = PurePosixPath(value)
    if not value or "\\" in value or posix.is_absolute():
        raise bad("must be a relative path inside the pack (POSIX '/' separators)")
    if any(part in ("", ".", "..") for part in value.split("/")):
        raise bad("must not have empty, '.' or '..' segments")
    path = root
    for part in posix.parts:  # lstat every step: a pack is data, no link is followed
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except (FileNotFoundError, NotADirectoryError):
            raise bad(f"is not a {'file' if want == 'file' else 'folder'} in the pack"
                      ) from None
        if stat.S_ISLNK(mode):
            raise bad(f"leads through a symlink ({path}); a pack holds no links")
    if want == "file" and not stat.S_ISREG(mode):
        raise bad("is not a file in the pack")
    if want == "dir" and not stat.S_ISDIR(mode):
        raise bad("is not a folder in the pack")
    return path


def _refuse_unless_regular(path: Path, what: str) -> None:
    """PackError unless `path` is a regular file (a link or a FIFO is never opened)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return  # the reader says it is missing
    if not stat.S_ISREG(mode):
        raise PackError(f"{what} is a {kind_of(mode)}, not a regular file; a pack holds "
                        "no links or special files", file=str(path))


def _task_names(tasks_dir: Path) -> tuple[str, ...]:
    names = []
    for child in sorted(tasks_dir.iterdir()):
        mode = os.lstat(child).st_mode
        if stat.S_ISLNK(mode):
            raise PackError("a pack may not hold symlinks", file=str(child))
        if not stat.S_ISDIR(mode) or child.name.startswith(".") \
                or child.name in _GENERATED_DIRS:
            continue
        if not _NAME.match(child.name):
            raise PackError(f"{child.name!r} is not a task name ([a-z0-9][a-z0-9_-]*)",
                            file=str(child))
        _refuse_unless_regular(child / TASK_FILE, TASK_FILE)
        if not (child / TASK_FILE).is_file():
            raise PackError(f"not a task folder (no {TASK_FILE})", file=str(child))
        names.append(child.name)
    return tuple(names)


def _load_splits(root: Path, spec: PackSpec, tasks: tuple[str, ...],
                 spec_file: Path) -> dict[str, tuple[str, ...]]:
    if spec.splits is None:
        return {split: () for split in SPLITS}
    file = _inside(root, spec.splits, spec_file, "splits", want="file")  # a regular file
    splits = decode_json_file(file, SplitsSpec, PackError)
    known = set(tasks)
    seen: dict[str, str] = {}  # task -> the split that has it
    result: dict[str, tuple[str, ...]] = {}
    for split in SPLITS:
        names: list[str] = getattr(splits, split)
        for i, task in enumerate(names):
            where = f"{split}[{i}]"
            if task not in known:
                raise PackError(f"names task {task!r}, which the pack does not have (tasks: "
                                f"{', '.join(tasks) or 'none'})", file=str(file), field=where)
            if task in names[:i]:
                raise PackError(f"lists task {task!r} twice", file=str(file), field=where)
            if task in seen:
                # Training on an evaluation task (or one task in two splits) would make
                # evaluation measure memory, so every task has at most one split.
                other = seen[task]
                raise PackError(f"task {task!r} is in both {other!r} and {split!r}; a task "
                                "belongs to at most one split", file=str(file), field=where)
            seen[task] = split
        result[split] = tuple(names)
    return result




__all__ = [
    "FORMAT", "SHIPPED", "SPLITS", "Pack", "PackSpec", "SplitsSpec", "list_packs",
    "load_pack", "load_pack_dir", "pack_files",
]
