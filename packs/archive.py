"""Moving a pack between machines: one archive file with a manifest of digests and world
hashes, verified in full before anything is written.

The archive is a gzip-compressed tar: ``manifest.json`` first, then the pack's files under
``<name>/``, in sorted order, each with mtime 0, uid/gid 0, no owner names and mode 0644,
and a gzip header without name or time, so the same pack always gives the same bytes
(whatever the folder's location, mtimes or owner). The manifest holds the sha256 and size
of every file and the world hash of every persona-day its logs produce, computed by
replaying the logs into a scratch store: the logs of a pack are self-contained (they
replay from nothing), so the hashes say what the pack *is*, not what some store held.

Import reads the archive member by member (regular files only, no absolute or '..'
paths, no name listed both as a file and as a folder, nothing the manifest does not list),
checks sizes and digests, replays the logs in scratch and compares every persona-day with
the manifest, checks that the store and the packs directory can take the pack as it is,
and only then imports the logs and moves the folder into place. A refused archive leaves
both exactly as they were. Every file of a pack folder is opened as a regular file only,
never through a link; the archive is written as a new file renamed over its name.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import re
import tarfile
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import BinaryIO

import msgspec

from packs.errors import PackError
from packs.registry import FORMAT, SHIPPED, Pack, load_pack_dir, pack_files
from replay.engine import DayResult, Worlds
from replay.files import copy_tree, open_regular, read_chunks, remove_tree
from worldstore.errors import WorldError
from worldstore.folders import writing_file
from worldstore.store import DayRecord

MANIFEST_FILE = "manifest.json"

_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*\Z")
_DAY_KEY = re.compile(r"(?P<persona>[a-z0-9][a-z0-9_-]*)@(?P<day>[0-9]+)\Z")
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")
_WORLD_HASH = re.compile(r"[0-9a-f]{32}\Z")
_CHUNK = 1 << 20


class FileEntry(msgspec.Struct, forbid_unknown_fields=True):
    sha256: str
    size: int


class ManifestSpec(msgspec.Struct, forbid_unknown_fields=True):
    """manifest.json, as written into an archive."""

    name: str
    format: int
    files: dict[str, FileEntry]
    worlds: dict[str, str]  # "persona@day" -> world hash


@dataclass(frozen=True)
class PackManifest:
    name: str
    format: int
    files: Mapping[str, str]  # path in the pack -> sha256 (hex)
    worlds: Mapping[str, str]  # "persona@day" -> world hash, in (persona, day) order
    sizes: Mapping[str, int]  # path in the pack -> size in bytes


@dataclass(frozen=True)
class ImportedPack:
    pack: Pack
    manifest: PackManifest
    days_imported: int
    days_skipped: int


# --- export -------------------------------------------------------------------------------


def export_pack(worlds: Worlds, pack: Pack, dest: Path) -> PackManifest:
    """Write `pack` as one deterministic archive at `dest`. The logs are replayed in a
    scratch store beside `worlds`' cache; `worlds`' own store is not touched."""
    if dest.is_dir():
        raise PackError("is a folder; give the path of the archive file to write",
                        file=str(dest))
    if not dest.parent.is_dir():
        raise PackError("no such folder to write the archive in", file=str(dest.parent))
    files = pack_files(pack.root)
    entries = {rel: _digest_file(pack.root / rel) for rel in files}
    replayed = _replay_logs(worlds, pack, source_prefix=str(pack.root))
    spec = ManifestSpec(name=pack.name, format=FORMAT, files=entries,
                        worlds={key: h for key, (h, _) in replayed.hashes.items()})
    # A new file renamed over `dest`: a link planted there is replaced, never written
    # through.
    with writing_file(dest) as raw:
        _write_archive(raw, spec, pack.root, files)
    return _manifest(spec)


def _write_archive(raw: BinaryIO, spec: ManifestSpec, root: Path,
                   files: list[str]) -> None:
    # GzipFile(filename="", mtime=0): the gzip header would otherwise hold both.
    with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        manifest = msgspec.json.encode(spec, order="deterministic") + b"\n"
        tar.addfile(_member(MANIFEST_FILE, len(manifest)), io.BytesIO(manifest))
        for rel in files:
            with open(open_regular(root / rel), "rb") as fh:  # never through a link
                tar.addfile(_member(f"{spec.name}/{rel}", spec.files[rel].size), fh)


def _member(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info


# --- import -------------------------------------------------------------------------------


def import_pack(worlds: Worlds, archive: Path, installed: Path) -> ImportedPack:
    """Verify `archive` in full, then import its logs into `worlds` and unpack the pack to
    ``installed/<name>``. A refusal (PackError naming the file or persona-day) writes
    nothing: neither the store nor the packs directory."""
    scratch = worlds.cache.scratch()
    try:
        spec = _unpack_verified(archive, scratch / "pack")
        staged = _load_staged(archive, scratch / "pack" / spec.name)
        replayed = _replay_logs(worlds, staged, source_prefix=f"{archive}:{spec.name}")
        _check_world_hashes(archive, spec, replayed)
        existing = _existing_copy(archive, spec, installed)
        _check_store_takes(worlds, archive, spec.name, replayed)
        imported, skipped = _commit(worlds, archive, staged, installed, existing)
        folder = existing or installed / spec.name
        pack = load_pack_dir(folder, shipped=folder.parent == SHIPPED)
        return ImportedPack(pack, _manifest(spec), imported, skipped)
    finally:
        remove_tree(scratch)


def _unpack_verified(archive: Path, dest: Path) -> ManifestSpec:
    """Stream the archive into `dest/<name>/`, checking every member against the manifest
    (which must come first). Returns the manifest."""
    if not archive.is_file():
        raise PackError("no such archive file", file=str(archive))
    try:
        with tarfile.open(archive, mode="r|gz") as tar:
            return _unpack_members(archive, tar, dest)
    except (tarfile.TarError, gzip.BadGzipFile, zlib.error, EOFError) as exc:
        raise PackError(f"not a pack archive (a .tar.gz written by `worldctl pack export`): "
                        f"{exc}", file=str(archive)) from None


def _unpack_members(archive: Path, tar: tarfile.TarFile, dest: Path) -> ManifestSpec:
    members = iter(tar)
    first = next(members, None)
    if first is None or first.name != MANIFEST_FILE:
        raise PackError(f"not a pack archive: its first member must be {MANIFEST_FILE}, not "
                        f"{first.name if first else 'nothing'!r}", file=str(archive))
    _check_member_kind(archive, first)
    spec = _decode_manifest(archive, _read_member(archive, tar, first, limit=16 << 20))
    seen: set[str] = set()
    for member in members:
        _check_member_kind(archive, member)
        rel = _pack_path(archive, spec.name, member.name)
        entry = spec.files.get(rel)
        if entry is None:
            raise PackError(f"member {member.name!r} is not listed in the manifest",
                            file=str(archive))
        if rel in seen:
            raise PackError(f"member {member.name!r} appears twice", file=str(archive))
        seen.add(rel)
        if member.size != entry.size:
            raise PackError(f"member {member.name!r} has {member.size} bytes, the manifest "
                            f"says {entry.size}", file=str(archive))
        _extract_checked(archive, tar, member, entry, dest / spec.name / rel)
    missing = sorted(set(spec.files) - seen)
    if missing:
        raise PackError(f"the manifest lists {len(missing)} file(s) the archive does not "
                        f"hold: {', '.join(missing[:5])}", file=str(archive))
    return spec


def _check_member_kind(archive: Path, member: tarfile.TarInfo) -> None:
    name = member.name
    if name.startswith("/") or "\\" in name:
        raise PackError(f"member {name!r} has an absolute or non-POSIX path",
                        file=str(archive))
    if any(part in ("", ".", "..") for part in name.split("/")):
        raise PackError(f"member {name!r} has an empty, '.' or '..' path segment",
                        file=str(archive))
    if not member.isreg():
        kind = ("a symlink" if member.issym() else "a hard link" if member.islnk()
                else "a device" if member.isdev() and not member.isfifo()
                else "a FIFO" if member.isfifo() else "a folder" if member.isdir()
                else f"of tar type {member.type!r}")
        raise PackError(f"member {name!r} is {kind}; a pack archive holds only regular files",
                        file=str(archive))


def _pack_path(archive: Path, name: str, member_name: str) -> str:
    prefix = f"{name}/"
    if not member_name.startswith(prefix):
        raise PackError(f"member {member_name!r} is outside the pack folder {prefix!r}",
                        file=str(archive))
    return member_name[len(prefix):]


def _read_member(archive: Path, tar: tarfile.TarFile, member: tarfile.TarInfo, *,
                 limit: int) -> bytes:
    if member.size > limit:
        raise PackError(f"member {member.name!r} is too large ({member.size} bytes)",
                        file=str(archive))
    fh = tar.extractfile(member)
    assert fh is not None  # a regular file always has contents
    return fh.read()


def _extract_checked(archive: Path, tar: tarfile.TarFile, member: tarfile.TarInfo,
                     entry: FileEntry, target: Path) -> None:
    fh = tar.extractfile(member)
    assert fh is not None
    digest = hashlib.sha256()
    target.parent.mkdir(parents=True, exist_ok=True)
    # The scratch folder is the project's own, and a name is unpacked once (checked above):
    # a new file, never through anything already there.
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644)
    with open(fd, "wb") as out:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != entry.sha256:
        raise PackError(f"member {member.name!r} has sha256 {digest.hexdigest()}, the manifest "
                        f"says {entry.sha256} (tampered or corrupt)", file=str(archive))


def _decode_manifest(archive: Path, data: bytes) -> ManifestSpec:
    where = f"{archive}:{MANIFEST_FILE}"
    try:
        spec = msgspec.json.decode(data, type=ManifestSpec)
    except msgspec.ValidationError as exc:
        raise PackError(f"invalid manifest: {exc}", file=where) from None
    except msgspec.DecodeError as exc:
        raise PackError(f"manifest is not valid JSON: {exc}", file=where) from None
    if not _NAME.match(spec.name):
        raise PackError(f"{spec.name!r} is not a pack name", file=where, field="name")
    if spec.format != FORMAT:
        raise PackError(f"pack format {spec.format} is not supported (this code reads format "
                        f"{FORMAT})", file=where, field="format")
    for rel, entry in spec.files.items():
        if rel.startswith("/") or "\\" in rel or any(
                part in ("", ".", "..") for part in rel.split("/")):
            raise PackError(f"{rel!r} is not a safe relative path", file=where,
                            field=f"files.{rel}")
        if not _SHA256.match(entry.sha256) or entry.size < 0:
            raise PackError("needs a sha256 (64 hex digits) and a size >= 0", file=where,
                            field=f"files.{rel}")
    _refuse_file_and_folder(spec, where)
    for key, world_hash in spec.worlds.items():
        if not _DAY_KEY.match(key) or not _WORLD_HASH.match(world_hash):
            raise PackError(f"{key!r}: {world_hash!r} is not persona@day: world hash",
                            file=where, field=f"worlds.{key}")
    return spec


def _refuse_file_and_folder(spec: ManifestSpec, where: str) -> None:
    """A name listed both as a file and as a folder of another file (``world`` and
    ``world/a.jsonl``) can be unpacked as neither: refused before anything is written."""
    folders = {"/".join(rel.split("/")[:i]) for rel in spec.files
               for i in range(1, rel.count("/") + 1)}
    for rel in sorted(set(spec.files) & folders):
        inside = next(other for other in sorted(spec.files) if other.startswith(f"{rel}/"))
        raise PackError(f"{rel!r} is listed as a file and as the folder of {inside!r}",
                        file=where, field=f"files.{rel}")


def _load_staged(archive: Path, folder: Path) -> Pack:
    """The unpacked pack, loaded as the registry loads any; a refusal names the file as a
    member of the archive, not as the scratch copy that is about to disappear."""
    try:
        return load_pack_dir(folder, shipped=False)
    except PackError as exc:
        root = str(folder.resolve())
        file = exc.file or ""
        if file.startswith(root):
            file = f"{archive}:{folder.name}{file[len(root):]}"
        raise PackError(exc.reason, file=file or str(archive), field=exc.field) from None


def _check_world_hashes(archive: Path, spec: ManifestSpec, replayed: _Replayed) -> None:
    for key in _day_order(set(spec.worlds) | set(replayed.hashes)):
        recorded = spec.worlds.get(key)
        found = replayed.hashes.get(key)
        if found is None:
            raise PackError(f"the manifest lists {key}, which the pack's logs do not have",
                            file=str(archive))
        world_hash, log = found
        if recorded is None:
            raise PackError(f"{key} is not listed in the manifest", file=log)
        if world_hash != recorded:
            raise PackError(f"{key} replays to world hash {world_hash}, the manifest "
                            f"records {recorded}", file=log)


def _existing_copy(archive: Path, spec: ManifestSpec, installed: Path) -> Path | None:
    """The pack folder already holding this pack (shipped or installed), if any; a folder
    of the same name with other content is refused (one name, one pack)."""
    for folder in (SHIPPED / spec.name, installed / spec.name):
        if not folder.exists():
            continue
        ours = {rel: _digest_file(folder / rel).sha256 for rel in pack_files(folder)}
        theirs = {rel: entry.sha256 for rel, entry in spec.files.items()}
        if ours == theirs:
            return folder
        differ = sorted(rel for rel in set(ours) | set(theirs) if ours.get(rel) != theirs.get(rel))
        where = "ships with the package" if folder.parent == SHIPPED else \
            f"is already installed in {installed}"
        raise PackError(f"a pack named {spec.name!r} {where} with different content "
                        f"({len(differ)} file(s) differ: {', '.join(differ[:5])}); remove it "
                        "or rename this pack", file=str(archive))
    return None


def _check_store_takes(worlds: Worlds, archive: Path, name: str, replayed: _Replayed) -> None:
    """The store can take the logs only where its days of each persona are the pack's
    (identical events, so import skips them) up to where one of them ends: a store day
    that differs, or store days the pack's next day would be chained after, would make
    the import fail halfway or build other worlds than the manifest's."""
    for persona, ours in replayed.records.items():
        stored = worlds.store.days(persona)
        for mine, theirs in zip(ours, stored, strict=False):
            if (mine.day, mine.head, mine.last_seq) != (theirs.day, theirs.head,
                                                        theirs.last_seq):
                raise PackError(
                    f"the store already holds {persona}@{theirs.day} with other events than "
                    f"pack {name!r} ({persona}@{mine.day}); the pack's logs cannot be "
                    "imported into this store", file=str(archive))


def _commit(worlds: Worlds, archive: Path, staged: Pack, installed: Path,
            existing: Path | None) -> tuple[int, int]:
    """Import the logs, then move the pack folder into place. The folder is copied next
    to its final place first, so that the last step is one rename."""
    created = not installed.exists()
    partial: Path | None = None
    try:
        if existing is None:
            installed.mkdir(parents=True, exist_ok=True)
            partial = installed / f".{staged.name}.importing-{os.getpid()}"
            remove_tree(partial)
            copy_tree(staged.root, partial)
        results = _import_logs(worlds, staged, source_prefix=f"{archive}:{staged.name}")
        if partial is not None:
            os.rename(partial, installed / staged.name)
            partial = None
    finally:
        if partial is not None:
            remove_tree(partial)
            if created and not any(installed.iterdir()):
                installed.rmdir()
    imported = sum(r.status == "imported" for r, _ in results)
    return imported, len(results) - imported


# --- replaying logs in scratch ------------------------------------------------------------


@dataclass(frozen=True)
class _Replayed:
    hashes: dict[str, tuple[str, str]]  # "persona@day" -> (world hash, log it comes from)
    records: dict[str, list[DayRecord]]  # persona -> its days, as the scratch store holds them


def _replay_logs(worlds: Worlds, pack: Pack, *, source_prefix: str) -> _Replayed:
    """Import the pack's logs, in order, into a fresh scratch store (in `worlds`' cache
    folder, removed afterwards): the same validation and fold as a real import."""
    with _scratch_worlds(worlds) as scratch:
        results = _import_logs(scratch, pack, source_prefix=source_prefix)
        hashes = {f"{r.persona}@{r.day}": (r.world_hash, source) for r, source in results}
        personas = sorted({r.persona for r, _ in results})
        records = {p: scratch.store.days(p) for p in personas}
    return _Replayed({key: hashes[key] for key in _day_order(set(hashes))}, records)


def _import_logs(worlds: Worlds, pack: Pack, *, source_prefix: str
                 ) -> list[tuple[DayResult, str]]:
    """Import the pack's logs in order; each day's result with the log it comes from."""
    results: list[tuple[DayResult, str]] = []
    for log in pack.worlds:
        source = f"{source_prefix}/{log.relative_to(pack.root).as_posix()}"
        try:
            with open(open_regular(log), "rb") as fh:  # never through a link, never a FIFO
                results.extend((r, source) for r in worlds.import_stream(fh, source=source))
        except WorldError as exc:
            raise PackError(f"pack {pack.name!r}: {exc}") from None
    return results


@contextmanager
def _scratch_worlds(worlds: Worlds) -> Iterator[Worlds]:
    scratch = worlds.cache.scratch()
    try:
        with Worlds.open(scratch / "store", scratch / "cache") as scratch_worlds:
            yield scratch_worlds
    finally:
        remove_tree(scratch)


# --- small helpers ------------------------------------------------------------------------


def _digest_file(path: Path) -> FileEntry:
    digest = hashlib.sha256()
    size = 0
    for chunk in read_chunks(path, _CHUNK):  # a regular file, never through a link
        digest.update(chunk)
        size += len(chunk)
    return FileEntry(sha256=digest.hexdigest(), size=size)


def _day_order(keys: set[str]) -> list[str]:
    def key(text: str) -> tuple[str, int]:
        persona, _, day = text.rpartition("@")
        return persona, int(day) if day.isdigit() else -1
    return sorted(keys, key=key)


def _manifest(spec: ManifestSpec) -> PackManifest:
    return PackManifest(
        name=spec.name, format=spec.format,
        files=MappingProxyType({rel: spec.files[rel].sha256 for rel in sorted(spec.files)}),
        worlds=MappingProxyType({key: spec.worlds[key] for key in _day_order(set(spec.worlds))}),
        sizes=MappingProxyType({rel: spec.files[rel].size for rel in sorted(spec.files)}),
    )


__all__ = ["MANIFEST_FILE", "ImportedPack", "PackManifest", "export_pack", "import_pack"]
