"""A pack as Harbor tasks, and back.

Harbor's task format is one folder per task::

    task.toml              Harbor's TaskConfig: [task] name, [metadata], [verifier],
                           [agent], [environment] with its MCP servers
    instruction.md         what the agent is told
    environment/Dockerfile the image the agent works in
    tests/test.sh          run after the agent: writes /logs/verifier/reward.txt
    solution/solve.sh      run by Harbor's oracle agent

``export_harbor`` writes one such folder per task of a pack. Every task's environment holds
the pack's own archive (``packs.archive``, the same bytes in every task): the image imports
it (replaying the logs, refusing any world whose hash is not the manifest's), checks the
task's world out at ``/world`` by its pinned hash and works there. The agent gets a
terminal in ``/world/workspace`` and, declared in task.toml the way Harbor declares MCP
servers, the world's tools over stdio (``worldctl pack mcp``); ``tests/test.sh`` grades
``/world`` with the task's verifier (``worldctl pack grade``) and ``solution/solve.sh``
replays the reference solution on it (``worldctl pack solve``). Only ``worldctl`` runs in
the image: these files name the commands, the code is the project's.

Every file is a function of the pack, its archive and the base image's name (sorted, no
time, no path of this machine), so the same pack always gives the same bytes, and
``import_harbor`` can tell an exported pack from anything else: it writes every file
again from the archive the folder holds, and the archive itself from the pack it holds,
and refuses the folder unless each one is byte-identical. It reads the folder as
untrusted data: symlinks and special files are refused, never followed or opened,
nothing in it runs, and a refused folder leaves the store and the packs directory
untouched (the archive's own import verifies before it writes anything).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import tarfile
import tomllib
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from packs.archive import MANIFEST_FILE, ImportedPack, export_pack, import_pack
from packs.errors import PackError
from packs.registry import TASK_FILE, Pack, load_pack_dir
from replay.engine import Worlds
from replay.files import kind_of, open_regular, read_regular, remove_tree
from worldstore.errors import WorldError

DEFAULT_BASE_IMAGE = "agent-worlds:latest"
ARCHIVE = "environment/pack.tar.gz"
WORLD_DIR = "/world"
ANSWER_FILE = "/logs/agent/answer.txt"
REWARD_FILE = "/logs/verifier/reward.txt"
STORE_DIR = "/opt/agent-worlds/store"
EXPORTER = "agent-worlds"
FORMAT = 1
TASK_FILES = ("environment/Dockerfile", ARCHIVE, "instruction.md", "solution/solve.sh",
              "task.toml", "tests/test.sh")
_EXECUTABLE = frozenset({"solution/solve.sh", "tests/test.sh"})
_PACK_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*\Z")
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]*\Z")
_MAX_TEXT = 1 << 20
_MAX_ARCHIVE = 1 << 30


class _TaskJson(msgspec.Struct):
    """The fields of a task's task.json the Harbor task carries (gates.task validates the
    whole file; a pack loads here without the grading code)."""

    task_id: str
    instruction: str
    world: str
    world_hash: str
    interfaces: list[str] = msgspec.field(default_factory=list)
    difficulty: str | None = None


@dataclass(frozen=True)
class HarborExport:
    pack: str
    tasks: tuple[str, ...]
    files: int


# --- export -------------------------------------------------------------------------------


def export_harbor(worlds: Worlds, pack: Pack, dest: Path, *,
                  base_image: str = DEFAULT_BASE_IMAGE) -> HarborExport:
    """Write `pack` as Harbor task folders in `dest` (a new folder, or an empty one). The
    folders are written beside `dest` and renamed into place at the end: a refusal or a
    crash leaves `dest` as it was."""
    _check_image(base_image, "--base-image")
    if os.path.lexists(dest) and not (dest.is_dir() and not dest.is_symlink()
                                      and not any(dest.iterdir())):
        raise PackError("exists and is not an empty folder; give a new folder to write the "
                        "Harbor tasks in", file=str(dest))
    if not dest.parent.is_dir():
        raise PackError("no such folder to write the Harbor tasks in", file=str(dest.parent))
    partial = dest.parent / f".{dest.name}.exporting-{os.getpid()}"
    remove_tree(partial)
    try:
        partial.mkdir()
        archive = partial / ".pack.tar.gz"
        export_pack(worlds, pack, archive)
        data = archive.read_bytes()
        archive.unlink()
        count = 0
        for task in pack.tasks:
            files = task_files(pack, task, base_image)
            files[ARCHIVE] = data
            for rel in sorted(files):
                _write(partial / task / rel, files[rel], executable=rel in _EXECUTABLE)
                count += 1
        if dest.is_dir():
            dest.rmdir()
        os.rename(partial, dest)
    finally:
        remove_tree(partial)
    return HarborExport(pack.name, pack.tasks, count)


def task_files(pack: Pack, task: str, base_image: str) -> dict[str, bytes]:
    """The files of one Harbor task but its archive, as export writes them."""
    spec = _task_json(pack, task)
    return {
        "task.toml": _task_toml(pack, spec, base_image).encode(),
        "instruction.md": _instruction(spec).encode(),
        "environment/Dockerfile": _dockerfile(pack, spec, base_image).encode(),
        "tests/test.sh": _script(
            "Harbor's verifier step: grade /world with the task's verifier; the reward "
            f"(1 or 0) goes to {REWARD_FILE} (a failed grade exits 1 after writing 0).",
            f"mkdir -p {os.path.dirname(REWARD_FILE)}",
            f"worldctl pack grade {pack.name} {spec.task_id} {WORLD_DIR} --answer-file "
            f"{ANSWER_FILE} --reward-file {REWARD_FILE} || test -s {REWARD_FILE}").encode(),
        "solution/solve.sh": _script(
            "Harbor's oracle: replay the task's reference solution on /world (its final "
            f"answer goes to {ANSWER_FILE}).",
            f"mkdir -p {os.path.dirname(ANSWER_FILE)}",
            f"worldctl pack solve {pack.name} {spec.task_id} {WORLD_DIR} --answer-file "
            f"{ANSWER_FILE}").encode(),
    }


def _task_json(pack: Pack, task: str) -> _TaskJson:
    file = pack.task_dir(task) / TASK_FILE
    data = _read_text(file)
    try:
        spec = msgspec.json.decode(data, type=_TaskJson)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise PackError(f"not a task.json: {exc}", file=str(file)) from None
    if spec.task_id != task:
        raise PackError(f"task_id {spec.task_id!r} is not the folder's name {task!r}",
                        file=str(file), field="task_id")
    return spec


def _task_toml(pack: Pack, spec: _TaskJson, base_image: str) -> str:
    keywords = sorted({*spec.interfaces, *([spec.difficulty] if spec.difficulty else [])})
    lines = [
        "# Written by `worldctl pack export --format harbor`; "
        "`worldctl pack import --format harbor` reads it back.",
        'schema_version = "1.4"',
        "",
        "[task]",
        f"name = {_q(f'{pack.name}/{spec.task_id}')}",
        f"description = {_q(pack.title)}",
        f"keywords = {_list(keywords)}",
        "",
        "[metadata]",
        f"exported_by = {_q(EXPORTER)}",
        f"format = {FORMAT}",
        f"pack = {_q(pack.name)}",
        f"task = {_q(spec.task_id)}",
        f"world = {_q(spec.world)}",
        f"world_hash = {_q(spec.world_hash)}",
        f"interfaces = {_list(spec.interfaces)}",
        f"difficulty = {_q(spec.difficulty or '')}",
        f"base_image = {_q(base_image)}",
        f"answer_file = {_q(ANSWER_FILE)}",
        "",
        "[verifier]",
        "timeout_sec = 600.0",
        "",
        "[agent]",
        "timeout_sec = 1800.0",
        "",
        "[environment]",
        "build_timeout_sec = 1800.0",
        f"workdir = {_q(f'{WORLD_DIR}/workspace')}",
        "",
        "# The world's tools (its services' MCP tools, `answer`, and the GUI's where the",
        "# task uses it), served over stdio inside the environment.",
        "[[environment.mcp_servers]]",
        'name = "world"',
        'transport = "stdio"',
        'command = "worldctl"',
        "args = " + _list(["pack", "mcp", pack.name, spec.task_id, WORLD_DIR,
                           "--answer-file", ANSWER_FILE]),
    ]
    return "\n".join(lines) + "\n"


def _instruction(spec: _TaskJson) -> str:
    return (f"{spec.instruction.rstrip()}\n\n"
            f"Your world is in `{WORLD_DIR}`: its files in `{WORLD_DIR}/workspace` (your "
            "working directory), its services through the MCP tools of the `world` "
            "server. When you are done, give your final answer with the `answer` tool "
            f"(or write it to `{ANSWER_FILE}`).\n")


def _dockerfile(pack: Pack, spec: _TaskJson, base_image: str) -> str:
    return "\n".join([
        f"# Written by `worldctl pack export --format harbor`: pack {pack.name}, task "
        f"{spec.task_id}.",
        "# BASE_IMAGE: an image with agent-worlds installed (`worldctl` on PATH).",
        f"ARG BASE_IMAGE={base_image}",
        "FROM ${BASE_IMAGE}",
        "# Harbor starts the container with its own command and runs the agent, the tests",
        "# and the solution with `docker exec`; the world is set up as root.",
        "USER root",
        "ENTRYPOINT []",
        'CMD ["bash"]',
        "# bubblewrap cannot make namespaces in a container Harbor starts: the container",
        "# is the sandbox of the solution's commands and the verifier.",
        f"ENV WORLDCTL_STORE={STORE_DIR} WORLDCTL_SANDBOX=container",
        "COPY pack.tar.gz /opt/agent-worlds/pack.tar.gz",
        "# Import replays the pack's logs and refuses any persona-day whose world hash is",
        "# not the archive manifest's; checkout re-hashes what it writes.",
        "RUN worldctl pack import /opt/agent-worlds/pack.tar.gz \\",
        f" && worldctl checkout {spec.world_hash} {WORLD_DIR} \\",
        f' && test "$(worldctl hash {WORLD_DIR} | tail -n 1)" = {spec.world_hash}',
        f"WORKDIR {WORLD_DIR}/workspace",
    ]) + "\n"


def _script(why: str, *commands: str) -> str:
    return "\n".join(["#!/bin/bash", "# Written by `worldctl pack export --format harbor`.",
                      f"# {why}", "set -euo pipefail", *commands]) + "\n"


def _q(text: str) -> str:
    # A TOML basic string is a JSON string (the escapes JSON writes are TOML's too).
    return json.dumps(text, ensure_ascii=False)


def _list(items: list[str]) -> str:
    return "[" + ", ".join(_q(i) for i in items) + "]"


def _check_image(image: str, where: str, file: str | None = None) -> None:
    if not _IMAGE.match(image):
        raise PackError(f"{image!r} is not an image name", file=file or where,
                        field="metadata.base_image" if file else None)


def _write(path: Path, data: bytes, *, executable: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o755 if executable else 0o644)
    with open(fd, "wb") as out:
        out.write(data)


# --- import -------------------------------------------------------------------------------


def import_harbor(worlds: Worlds, src: Path, installed: Path) -> ImportedPack:
    """Read back a folder of Harbor tasks written by ``export_harbor``: each file must be
    what export writes for the pack its archive holds; then the archive is imported as
    ``import_pack`` does. A refusal (PackError naming the file and field) writes nothing."""
    files = _folder_files(src)
    tasks = sorted({rel.split("/", 1)[0] for rel in files})
    if not tasks:
        raise PackError("holds no task folders", file=str(src))
    base_image = _base_image(src, tasks[0], files)
    archive = _one_archive(src, tasks, files)
    scratch = worlds.cache.scratch()
    try:
        copy = scratch / "pack.tar.gz"
        fd = open_regular(src / tasks[0] / ARCHIVE, files[f"{tasks[0]}/{ARCHIVE}"])
        with open(fd, "rb") as fh, open(copy, "xb") as out:
            out.write(fh.read(_MAX_ARCHIVE + 1))
        if hashlib.sha256(copy.read_bytes()).hexdigest() != archive:
            raise PackError("changed while it was read", file=str(src / tasks[0] / ARCHIVE))
        where = src / tasks[0] / ARCHIVE
        pack = _unpacked_pack(where, copy, scratch / "unpacked")
        _compare(src, pack, tasks, files, base_image)
        _check_archive(worlds, where, copy, pack)
        return import_pack(worlds, copy, installed)
    finally:
        remove_tree(scratch)


def _folder_files(src: Path) -> dict[str, os.stat_result]:
    """Every file under `src` (relative path -> lstat), refusing anything but folders and
    regular files, never following a link; only the files a Harbor task of ours has."""
    try:
        top = os.lstat(src)
    except FileNotFoundError:
        raise PackError("no such folder", file=str(src)) from None
    if not stat.S_ISDIR(top.st_mode):
        raise PackError(f"is {_kind(top)}, not a folder of Harbor tasks", file=str(src))
    found: dict[str, os.stat_result] = {}
    pending = [""]
    while pending:
        rel_dir = pending.pop(0)  # breadth first, in name order: the first fault is named
        here = src / rel_dir if rel_dir else src
        for name in sorted(os.listdir(here)):
            rel = f"{rel_dir}/{name}" if rel_dir else name
            st = os.lstat(here / name)
            if stat.S_ISDIR(st.st_mode):
                if rel.count("/") >= 2:
                    raise PackError("is a folder no exported Harbor task has",
                                    file=str(src / rel))
                pending.append(rel)
            elif stat.S_ISREG(st.st_mode):
                found[rel] = st
            else:
                raise PackError(f"is {_kind(st)}; a Harbor task folder of ours holds only "
                                "folders and regular files", file=str(src / rel))
    for rel in sorted(found):
        inner = rel.partition("/")[2]
        if not inner:
            raise PackError("is a file beside the task folders; a folder exported by "
                            "`worldctl pack export --format harbor` holds only task folders",
                            file=str(src / rel))
        if inner not in TASK_FILES:
            raise PackError("is not a file of a Harbor task exported by agent-worlds",
                            file=str(src / rel))
    return found


def _kind(st: os.stat_result) -> str:
    kind = kind_of(st.st_mode)
    return {"symlink": "a symlink", "dir": "a folder", "file": "a file"}.get(kind, f"a {kind}")


def _task_config(src: Path, task: str, files: Mapping[str, os.stat_result]
                 ) -> dict[str, Any]:
    rel = f"{task}/task.toml"
    where = str(src / rel)
    if rel not in files:
        raise PackError("missing: not a Harbor task folder", file=where)
    try:
        config = tomllib.loads(_read_text(src / rel, files[rel]))
    except tomllib.TOMLDecodeError as exc:
        raise PackError(f"not valid TOML: {exc}", file=where) from None
    metadata = config.get("metadata")
    if not isinstance(metadata, dict) or metadata.get("exported_by") != EXPORTER:
        raise PackError("not a task exported by agent-worlds: its environment is not one of "
                        "our worlds, so it cannot be imported (only folders written by "
                        "`worldctl pack export --format harbor` can)", file=where,
                        field="metadata.exported_by")
    if metadata.get("format") != FORMAT:
        raise PackError(f"Harbor export format {metadata.get('format')!r} is not supported "
                        f"(this code reads format {FORMAT})", file=where,
                        field="metadata.format")
    return config


def _base_image(src: Path, first: str, files: Mapping[str, os.stat_result]) -> str:
    metadata = _task_config(src, first, files)["metadata"]
    image = metadata.get("base_image")
    where = str(src / first / "task.toml")
    if not isinstance(image, str):
        raise PackError("needs the base image's name (a string)", file=where,
                        field="metadata.base_image")
    _check_image(image, where, where)
    return image


def _one_archive(src: Path, tasks: list[str], files: Mapping[str, os.stat_result]) -> str:
    """The sha256 of the pack archive every task holds (the same in each)."""
    digests: dict[str, str] = {}
    for task in tasks:
        _task_config(src, task, files)
        rel = f"{task}/{ARCHIVE}"
        if rel not in files:
            raise PackError("missing: the environment holds no pack archive, so it is not "
                            "one of our worlds", file=str(src / rel))
        if files[rel].st_size > _MAX_ARCHIVE:
            raise PackError(f"is too large ({files[rel].st_size} bytes)", file=str(src / rel))
        digest = hashlib.sha256()
        fd = open_regular(src / rel, files[rel])
        with open(fd, "rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
        digests[task] = digest.hexdigest()
    first = tasks[0]
    for task in tasks[1:]:
        if digests[task] != digests[first]:
            raise PackError(f"differs from {first}/{ARCHIVE}: the tasks of one export hold "
                            "the same pack archive", file=str(src / task / ARCHIVE))
    return digests[first]


def _unpacked_pack(where: Path, archive: Path, dest: Path) -> Pack:
    """The pack folder the archive holds, unpacked into `dest` (regular files under safe
    names only) and loaded. Its digests and world hashes need no check of their own here:
    the archive must be byte-identical to what export writes for this folder
    (``_check_archive``), and the import checks them again."""
    try:
        with tarfile.open(archive, mode="r|gz") as tar:
            name = _unpack_members(where, tar, dest)
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise PackError(f"not a pack archive (a .tar.gz written by `worldctl pack export`): "
                        f"{exc}", file=str(where)) from None
    try:
        return load_pack_dir(dest / name, shipped=False)
    except PackError as exc:
        raise PackError(f"the pack it holds does not load: {exc.reason}", file=str(where),
                        field=exc.field) from None


def _unpack_members(where: Path, tar: tarfile.TarFile, dest: Path) -> str:
    name = ""
    total = 0
    for member in tar:
        parts = member.name.split("/")
        if not member.isreg() or member.name.startswith("/") or "\\" in member.name or any(
                part in ("", ".", "..") for part in parts):
            raise PackError(f"member {member.name!r} is not a regular file under a safe name",
                            file=str(where))
        if member.name == MANIFEST_FILE:
            continue
        if not name:
            name = parts[0]
        if parts[0] != name or len(parts) < 2 or not _PACK_NAME.match(name):
            raise PackError(f"member {member.name!r} is outside the pack folder",
                            file=str(where))
        total += member.size
        if total > _MAX_ARCHIVE:
            raise PackError("holds more than 1 GiB", file=str(where))
        fh = tar.extractfile(member)
        assert fh is not None  # a regular file always has contents
        target = dest.joinpath(*parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o644)
        with open(fd, "wb") as out:
            shutil.copyfileobj(fh, out)
    if not name:
        raise PackError("holds no pack folder", file=str(where))
    return name


def _check_archive(worlds: Worlds, where: Path, archive: Path, pack: Pack) -> None:
    """The archive must be the very bytes export writes for the pack it holds (the same
    files and, replayed from them, the same world hashes)."""
    scratch = worlds.cache.scratch()
    try:
        with Worlds.open(scratch / "store", scratch / "cache") as staging:
            export_pack(staging, pack, scratch / "again.tar.gz")
        if (scratch / "again.tar.gz").read_bytes() != archive.read_bytes():
            raise PackError("differs from what `worldctl pack export` writes for the pack it "
                            f"holds ({pack.name!r})", file=str(where))
    finally:
        remove_tree(scratch)


def _compare(src: Path, pack: Pack, tasks: list[str], files: Mapping[str, os.stat_result],
             base_image: str) -> None:
    if tasks != list(pack.tasks):
        missing = sorted(set(pack.tasks) - set(tasks))
        extra = sorted(set(tasks) - set(pack.tasks))
        what = (f"lacks the task folder(s) {', '.join(missing)}" if missing
                else f"has task folder(s) the pack does not: {', '.join(extra)}")
        raise PackError(f"{what} (pack {pack.name!r} in its archive)", file=str(src))
    for task in tasks:
        expected = task_files(pack, task, base_image)
        for rel in sorted(expected):
            path = src / task / rel
            key = f"{task}/{rel}"
            if key not in files:
                raise PackError("missing from the exported task", file=str(path))
            data = _read_text(path, files[key]).encode()
            if data != expected[rel]:
                field = _differing_field(rel, data, expected[rel])
                raise PackError("differs from what `worldctl pack export --format harbor` "
                                f"writes for pack {pack.name!r}{field}", file=str(path))


def _differing_field(rel: str, data: bytes, expected: bytes) -> str:
    """For task.toml, the first table.field that differs, to name in the refusal."""
    if rel != "task.toml":
        return ""
    try:
        ours, theirs = tomllib.loads(expected.decode()), tomllib.loads(data.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return ""
    for key in sorted(_keys(ours) | _keys(theirs)):
        if _at(ours, key) != _at(theirs, key):
            return f" (field '{key}')"
    return ""


def _keys(table: dict[str, Any], prefix: str = "") -> set[str]:
    found: set[str] = set()
    for key, value in table.items():
        name = f"{prefix}{key}"
        found |= _keys(value, f"{name}.") if isinstance(value, dict) else {name}
    return found


def _at(table: Any, key: str) -> Any:
    for part in key.split("."):
        table = table.get(part) if isinstance(table, dict) else None
    return table


def _read_text(path: Path, expected: os.stat_result | None = None) -> str:
    try:
        data = read_regular(path, limit=_MAX_TEXT, expected=expected)
    except WorldError as exc:
        raise PackError(str(exc), file=str(path)) from None
    if data is None:
        raise PackError(f"is larger than {_MAX_TEXT} bytes", file=str(path))
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise PackError("is not UTF-8 text", file=str(path)) from None


__all__ = ["ANSWER_FILE", "DEFAULT_BASE_IMAGE", "REWARD_FILE", "WORLD_DIR", "HarborExport",
           "export_harbor", "import_harbor", "task_files"]
