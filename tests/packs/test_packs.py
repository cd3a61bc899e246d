"""Domain packs: the registry (shipped and installed packs, pack.json and splits refused
field by field), and archives (deterministic export; import verified in full, onto SQLite
and PostgreSQL stores, every refusal leaving the store and the packs directory as they
were)."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from packs.archive import MANIFEST_FILE, export_pack, import_pack
from packs.errors import PackError
from packs.registry import SHIPPED, SPLITS, list_packs, load_pack, pack_files
from replay.engine import Worlds

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "packs" / "demo"
COPY = "lars-copy"  # the demo pack under another name: a pack that is not shipped
LOG = "world/lars.jsonl"
LOGS = (LOG, "world/nora.jsonl")  # the demo's two personas, in import order
DAYS = 8 + 2  # lars@0..7, nora@0..1

State = tuple[list[tuple[str, list[tuple[int, str, str]]]], list[tuple[str, str]] | None]


def _copy_pack(dest_parent: Path, name: str, edit: Callable[[dict[str, Any]], None]
               | None = None) -> Path:
    """A copy of the demo pack named `name` (fresh mtimes), pack.json edited by `edit`."""
    dest = dest_parent / name
    shutil.copytree(DEMO, dest, copy_function=shutil.copy,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    spec = json.loads((dest / "pack.json").read_text())
    spec["name"] = name
    if edit is not None:
        edit(spec)
    (dest / "pack.json").write_text(json.dumps(spec, indent=2))
    return dest


def _tree(path: Path) -> list[tuple[str, str]] | None:
    """Every entry under `path` with the sha256 of files: None if `path` does not exist."""
    if not path.exists():
        return None
    return sorted((p.relative_to(path).as_posix(),
                   "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest())
                  for p in path.rglob("*"))


def _state(worlds: Worlds, installed: Path) -> State:
    store = [(p.persona, [(d.day, d.world_hash, d.head) for d in worlds.store.days(p.persona)])
             for p in worlds.store.personas()]
    return store, _tree(installed)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("packs")


@pytest.fixture(scope="module")
def exporter(work: Path) -> Worlds:
    """An empty store: export needs one only for its scratch space."""
    return Worlds.open(work / "exporter")


@pytest.fixture(scope="module")
def copy_archive(work: Path, exporter: Worlds) -> Path:
    """The archive of the pack `lars-copy` (the demo under another name)."""
    archive = work / f"{COPY}.tar.gz"
    export_pack(exporter, load_pack(str(_copy_pack(work / "src", COPY))), archive)
    return archive


@pytest.fixture
def target(tmp_path: Path) -> Iterator[Worlds]:
    with Worlds.open(tmp_path / "store") as worlds:
        yield worlds


# --- the registry -------------------------------------------------------------------------


def test_the_demo_is_a_shipped_pack_found_by_name() -> None:
    pack = load_pack("demo")
    assert pack.shipped and pack.root == SHIPPED / "demo" == DEMO
    assert pack.worlds == tuple(DEMO / log for log in LOGS)
    assert pack.build == DEMO / "world" / "build_lars.py"
    assert pack.tasks == tuple(sorted(p.name for p in (DEMO / "tasks").iterdir() if p.is_dir()))
    assert len(pack.tasks) == 7
    assert pack.task_dir("mats-work-order") == DEMO / "tasks" / "mats-work-order"
    assert pack.episodes == {"demo": DEMO / "episodes" / "demo.json"}
    assert pack.episode("demo").is_file()
    assert [p.name for p in list_packs()] == ["demo"]


def test_the_demo_splits_use_every_task_once_and_keep_rl_and_eval_apart() -> None:
    pack = load_pack("demo")
    assert set(pack.splits) == set(SPLITS)
    assigned = [task for split in SPLITS for task in pack.split(split)]
    assert sorted(assigned) == sorted(pack.tasks)  # every task, none twice
    assert not set(pack.split("rl")) & set(pack.split("eval"))
    assert all(pack.split(split) for split in SPLITS)


def test_unknown_task_split_and_episode_are_refused_naming_the_pack() -> None:
    pack = load_pack("demo")
    with pytest.raises(PackError, match="pack 'demo' has no task 'nope'"):
        pack.task_dir("nope")
    with pytest.raises(PackError, match="pack 'demo' has no split 'test'"):
        pack.split("test")
    with pytest.raises(PackError, match="pack 'demo' has no episode 'x'"):
        pack.episode("x")


def test_a_pack_loads_by_path_and_installed_packs_are_listed(tmp_path: Path) -> None:
    installed = tmp_path / "installed"
    folder = _copy_pack(installed, COPY)
    by_path = load_pack(str(folder))
    by_name = load_pack(COPY, installed)
    assert by_path == by_name
    assert not by_name.shipped and by_name.root == folder.resolve()
    assert by_name.worlds == tuple(folder.resolve() / log for log in LOGS)
    assert load_pack(str(DEMO)).shipped
    assert [(p.name, p.shipped) for p in list_packs(installed)] == [("demo", True),
                                                                    (COPY, False)]
    assert [p.name for p in list_packs(tmp_path / "absent")] == ["demo"]


def test_an_unknown_or_malformed_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PackError, match=r"no pack named 'nope' \(shipped or installed in .*: "
                                        r"demo\)"):
        load_pack("nope", tmp_path)
    with pytest.raises(PackError, match="'Demo' is not a pack name"):
        load_pack("Demo")
    with pytest.raises(PackError, match="not a pack folder"):
        load_pack(str(tmp_path / "missing"))


def test_an_installed_pack_named_like_a_shipped_one_is_refused(tmp_path: Path) -> None:
    installed = tmp_path / "installed"
    _copy_pack(installed, "demo")
    for call in (lambda: load_pack("demo", installed), lambda: list_packs(installed)):
        with pytest.raises(PackError, match=r"'demo' is installed in .* and also shipped"):
            call()


def test_a_folder_that_is_not_a_pack_in_the_packs_directory_is_named(tmp_path: Path) -> None:
    (tmp_path / "stray").mkdir()
    (tmp_path / ".partial").mkdir()  # hidden: an import in progress, not listed
    with pytest.raises(PackError, match=r"stray: not a pack \(no pack.json\)"):
        list_packs(tmp_path)


def _set(field: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(spec: dict[str, Any]) -> None:
        spec[field] = value
    return edit


def _drop(field: str) -> Callable[[dict[str, Any]], None]:
    def edit(spec: dict[str, Any]) -> None:
        del spec[field]
    return edit


PACK_JSON_REFUSALS: list[tuple[str, Callable[[dict[str, Any]], None], str, str]] = [
    ("unknown field", _set("owner", "me"), "owner", "unknown field"),
    ("missing title", _drop("title"), "title", "missing required field `title`"),
    ("wrong type", _set("worlds", "world/lars.jsonl"), "worlds", "Expected `array`"),
    ("bad name", _set("name", "Lars Copy"), "name", "is not a pack name"),
    ("format", _set("format", 2), "format", "pack format 2 is not supported"),
    ("empty title", _set("title", " "), "title", "must not be empty"),
    ("no logs", _set("worlds", []), "worlds", "at least one interchange log"),
    ("a log twice", _set("worlds", [LOG, LOG]), "worlds", "lists a log twice"),
    ("absolute log", _set("worlds", ["/etc/passwd"]), "worlds[0]", "relative path"),
    ("log outside", _set("worlds", ["../demo/world/lars.jsonl"]), "worlds[0]", "'..'"),
    ("missing log", _set("worlds", ["world/none.jsonl"]), "worlds[0]", "is not a file"),
    ("missing build", _set("build", "world/none.py"), "build", "is not a file"),
    ("tasks not a folder", _set("tasks", "splits.json"), "tasks", "is not a folder"),
    ("missing splits", _set("splits", "none.json"), "splits", "is not a file"),
    ("missing episode", _set("episodes", {"demo": "episodes/none.json"}), "episodes.demo",
     "is not a file"),
    ("bad episode name", _set("episodes", {"Demo": "episodes/demo.json"}), "episodes.Demo",
     "is not an episode name"),
]


@pytest.mark.parametrize(("what", "edit", "field", "message"), PACK_JSON_REFUSALS,
                         ids=[r[0] for r in PACK_JSON_REFUSALS])
def test_pack_json_is_parsed_strictly_naming_file_and_field(
        tmp_path: Path, what: str, edit: Callable[[dict[str, Any]], None], field: str,
        message: str) -> None:
    folder = _copy_pack(tmp_path, COPY, edit)
    with pytest.raises(PackError) as refused:
        load_pack(str(folder))
    text = str(refused.value)
    assert text.startswith(f"{folder.resolve() / 'pack.json'}: "), text
    assert message in text, text
    assert refused.value.field == (field or None), text
    assert "\n" not in text


def test_pack_json_that_is_not_json_or_missing_or_in_another_folder(tmp_path: Path) -> None:
    folder = _copy_pack(tmp_path, COPY)
    renamed = folder.rename(tmp_path / "elsewhere")
    with pytest.raises(PackError, match="pack 'lars-copy' is in a folder named 'elsewhere'"):
        load_pack(str(renamed))
    (renamed / "pack.json").write_text("{not json")
    with pytest.raises(PackError, match=r"pack\.json: not valid JSON"):
        load_pack(str(renamed))
    (renamed / "pack.json").unlink()
    with pytest.raises(PackError, match=r"pack\.json: missing"):
        load_pack(str(renamed))


SPLIT_REFUSALS: list[tuple[str, dict[str, Any], str, str]] = [
    ("unknown task", {"sft": ["nope"]}, "sft[0]", "names task 'nope', which the pack does"),
    ("rl and eval", {"rl": ["mats-work-order"], "eval": ["mats-work-order"]}, "eval[0]",
     "task 'mats-work-order' is in both 'rl' and 'eval'"),
    ("sft and rl", {"sft": ["mats-work-order"], "rl": ["mats-work-order"]}, "rl[0]",
     "is in both 'sft' and 'rl'"),
    ("twice in one", {"rl": ["mats-work-order", "mats-work-order"]}, "rl[1]",
     "lists task 'mats-work-order' twice"),
    ("unknown split", {"test": ["mats-work-order"]}, "test", "unknown field `test`"),
    ("not a list", {"rl": "mats-work-order"}, "rl", "Expected `array`"),
]


@pytest.mark.parametrize(("what", "splits", "field", "message"), SPLIT_REFUSALS,
                         ids=[r[0] for r in SPLIT_REFUSALS])
def test_splits_name_existing_tasks_each_in_at_most_one_split(
        tmp_path: Path, what: str, splits: dict[str, Any], field: str, message: str) -> None:
    folder = _copy_pack(tmp_path, COPY)
    (folder / "splits.json").write_text(json.dumps(splits))
    with pytest.raises(PackError) as refused:
        load_pack(str(folder))
    assert str(refused.value).startswith(f"{folder.resolve() / 'splits.json'}: ")
    assert message in str(refused.value)
    assert refused.value.field == (field or None)


def test_a_pack_without_splits_has_three_empty_splits(tmp_path: Path) -> None:
    folder = _copy_pack(tmp_path, COPY, _drop("splits"))
    assert load_pack(str(folder)).splits == {"sft": (), "rl": (), "eval": ()}


def test_task_folders_must_be_task_folders(tmp_path: Path) -> None:
    folder = _copy_pack(tmp_path, COPY)
    (folder / "tasks" / "draft").mkdir()
    with pytest.raises(PackError, match=r"tasks/draft: not a task folder \(no task.json\)"):
        load_pack(str(folder))
    (folder / "tasks" / "draft").rmdir()
    shutil.copytree(folder / "tasks" / "mats-work-order", folder / "tasks" / "Mats")
    with pytest.raises(PackError, match="'Mats' is not a task name"):
        load_pack(str(folder))


# --- export ---------------------------------------------------------------------------------


def test_export_is_deterministic_whatever_the_folder(tmp_path: Path, exporter: Worlds,
                                                     copy_archive: Path) -> None:
    again = tmp_path / "again.tar.gz"
    export_pack(exporter, load_pack(str(_copy_pack(tmp_path / "elsewhere", COPY))), again)
    assert again.read_bytes() == copy_archive.read_bytes()
    first, second = tmp_path / "a.tar.gz", tmp_path / "b.tar.gz"
    export_pack(exporter, load_pack("demo"), first)
    export_pack(exporter, load_pack("demo"), second)
    assert first.read_bytes() == second.read_bytes()
    with tarfile.open(first) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names[0] == MANIFEST_FILE
    assert names[1:] == sorted(names[1:]) == [f"demo/{rel}" for rel in pack_files(DEMO)]
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode, m.type) for m in members} == {
        (0, 0, 0, "", "", 0o644, tarfile.REGTYPE)}


def test_the_manifest_holds_every_file_and_the_hash_of_every_day(
        tmp_path: Path, exporter: Worlds) -> None:
    manifest = export_pack(exporter, load_pack("demo"), tmp_path / "demo.tar.gz")
    assert manifest.name == "demo" and manifest.format == 1
    assert list(manifest.files) == pack_files(DEMO)
    for rel, digest in manifest.files.items():
        data = (DEMO / rel).read_bytes()
        assert digest == hashlib.sha256(data).hexdigest()
        assert manifest.sizes[rel] == len(data)
    with Worlds.open(tmp_path / "store") as worlds:
        results = [r for log in LOGS for r in worlds.import_file(DEMO / log)]
    assert dict(manifest.worlds) == {f"{r.persona}@{r.day}": r.world_hash for r in results}
    assert list(manifest.worlds) == ([f"lars@{day}" for day in range(8)]
                                     + [f"nora@{day}" for day in range(2)])
    # The tasks were written for the worlds the pack's log builds.
    for task in load_pack("demo").tasks:
        spec = json.loads((DEMO / "tasks" / task / "task.json").read_text())
        assert manifest.worlds[spec["world"]] == spec["world_hash"]


def test_export_writes_nothing_to_the_store(tmp_path: Path) -> None:
    with Worlds.open(tmp_path / "store") as worlds:
        export_pack(worlds, load_pack("demo"), tmp_path / "demo.tar.gz")
        assert worlds.store.personas() == []
        assert list(worlds.cache.tmp.iterdir()) == []
        assert worlds.cache.hashes() == []


def test_export_refuses_a_symlink_in_the_pack_and_a_folder_as_destination(
        tmp_path: Path, exporter: Worlds) -> None:
    folder = _copy_pack(tmp_path, COPY)
    with pytest.raises(PackError, match="is a folder"):
        export_pack(exporter, load_pack(str(folder)), tmp_path)
    (folder / "tasks" / "link.md").symlink_to("/etc/passwd")
    with pytest.raises(PackError, match=r"link\.md: a pack may not hold symlinks"):
        export_pack(exporter, load_pack(str(folder)), tmp_path / "x.tar.gz")
    assert not (tmp_path / "x.tar.gz").exists()


# --- import: the round trip ---------------------------------------------------------------


def test_round_trip_onto_a_fresh_store(store_location: str, cache_dir: Path, tmp_path: Path,
                                       copy_archive: Path) -> None:
    installed = tmp_path / "installed"
    with Worlds.open(store_location, cache_dir) as worlds:
        done = import_pack(worlds, copy_archive, installed)
        assert (done.days_imported, done.days_skipped) == (DAYS, 0)
        assert done.pack == load_pack(COPY, installed)
        assert not done.pack.shipped and done.pack.root == (installed / COPY).resolve()
        stored = {f"{persona}@{d.day}": d.world_hash for persona in ("lars", "nora")
                  for d in worlds.store.days(persona)}
        assert stored == dict(done.manifest.worlds)
        source = copy_archive.parent / "src" / COPY
        assert pack_files(installed / COPY) == pack_files(source) == list(done.manifest.files)
        for rel in pack_files(source):
            assert (installed / COPY / rel).read_bytes() == (source / rel).read_bytes()
        assert [p.name for p in list_packs(installed)] == ["demo", COPY]
        assert worlds.verify().ok
        # Importing it again is a no-op that says so.
        before = _state(worlds, installed)
        again = import_pack(worlds, copy_archive, installed)
        assert (again.days_imported, again.days_skipped) == (0, DAYS)
        assert _state(worlds, installed) == before


def test_importing_the_shipped_demo_imports_its_world_and_unpacks_nothing(
        store_location: str, cache_dir: Path, tmp_path: Path, exporter: Worlds) -> None:
    archive = tmp_path / "demo.tar.gz"
    export_pack(exporter, load_pack("demo"), archive)
    with Worlds.open(store_location, cache_dir) as worlds:
        done = import_pack(worlds, archive, tmp_path / "installed")
        assert (done.days_imported, done.days_skipped) == (DAYS, 0)
        assert done.pack.shipped and done.pack.root == DEMO
        assert not (tmp_path / "installed").exists()
        assert [d.day for d in worlds.store.days("lars")] == list(range(8))


# --- import: refusals, each leaving nothing behind ----------------------------------------


def _read_members(archive: Path) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    with tarfile.open(archive) as tar:
        return [(m, tar.extractfile(m).read() if m.isreg() else None)  # type: ignore[union-attr]
                for m in tar.getmembers()]


def _write_members(dest: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(dest, "w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return dest


def _info(name: str, kind: bytes = tarfile.REGTYPE, **fields: Any) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    for key, value in fields.items():
        setattr(info, key, value)
    return info


def _edit_file(rel: str, change: Callable[[bytes], bytes], *, forge: bool
               ) -> Callable[[Path, Path], Path]:
    """An archive with one pack file changed; with `forge`, its manifest entry (digest and
    size) rewritten to match, as a forger would."""
    def make(archive: Path, dest: Path) -> Path:
        members = _read_members(archive)
        out = []
        manifest: dict[str, Any] = json.loads(members[0][1] or b"")
        for info, data in members[1:]:
            if info.name == f"{COPY}/{rel}" and data is not None:
                data = change(data)
                manifest["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(),
                                          "size": len(data)}
            out.append((info, data))
        head = json.dumps(manifest).encode() if forge else members[0][1]
        return _write_members(dest, [(members[0][0], head), *out])
    return make


def _tamper_day_5(data: bytes) -> bytes:
    lines = data.split(b"\n")
    assert b'"day":5' in lines[375] and b"Nordlys" in lines[375]
    lines[375] = lines[375].replace(b"Nordlys", b"Nordlyz", 1)
    return b"\n".join(lines)


def _insert(member: tuple[tarfile.TarInfo, bytes | None], at: int = 1
            ) -> Callable[[Path, Path], Path]:
    def make(archive: Path, dest: Path) -> Path:
        members = _read_members(archive)
        members.insert(at, member)
        return _write_members(dest, members)
    return make


def _drop_member(rel: str) -> Callable[[Path, Path], Path]:
    def make(archive: Path, dest: Path) -> Path:
        return _write_members(dest, [m for m in _read_members(archive)
                                     if m[0].name != f"{COPY}/{rel}"])
    return make


def _manifest_not_first(archive: Path, dest: Path) -> Path:
    members = _read_members(archive)
    return _write_members(dest, [*members[1:], members[0]])


def _raw(data: bytes) -> Callable[[Path, Path], Path]:
    def make(archive: Path, dest: Path) -> Path:
        dest.write_bytes(data)
        return dest
    return make


def _truncated(archive: Path, dest: Path) -> Path:
    data = archive.read_bytes()
    dest.write_bytes(data[: len(data) // 2])
    return dest


def _plain_tar(archive: Path, dest: Path) -> Path:
    with tarfile.open(dest, "w") as tar:
        for info, data in _read_members(archive):
            tar.addfile(info, io.BytesIO(data or b""))
    return dest


def _missing_file(archive: Path, dest: Path) -> Path:
    return dest


REFUSALS: list[tuple[str, Callable[[Path, Path], Path], str]] = [
    ("tampered file", _edit_file("tasks/mats-work-order/hint.md", lambda b: b + b"x",
                                 forge=False), "has 488 bytes, the manifest says 487"),
    ("tampered file of the same size",
     _edit_file("tasks/mats-work-order/hint.md", lambda b: b[:-1] + b"?", forge=False),
     "hint.md' has sha256 "),
    ("tampered log, forged digest", _edit_file(LOG, _tamper_day_5, forge=True),
     f"bad.tar.gz:{COPY}/{LOG}: lars@5 replays to world hash "),
    ("forged pack.json", _edit_file("pack.json", lambda b: b.replace(b'"format": 1',
                                                                     b'"format": 7'),
                                    forge=True),
     f"bad.tar.gz:{COPY}/pack.json: pack format 7 is not supported"),
    ("absolute member", _insert((_info("/tmp/escaped-pack-file"), b"x")), "absolute"),
    ("dot-dot member", _insert((_info(f"{COPY}/../../escaped"), b"x")), "'..' path segment"),
    ("symlink", _insert((_info(f"{COPY}/evil", tarfile.SYMTYPE, linkname="/etc/passwd"), None)),
     "is a symlink"),
    ("hard link", _insert((_info(f"{COPY}/evil", tarfile.LNKTYPE, linkname=f"{COPY}/pack.json"),
                           None)), "is a hard link"),
    ("device", _insert((_info(f"{COPY}/null", tarfile.CHRTYPE, devmajor=1, devminor=3), None)),
     "is a device"),
    ("fifo", _insert((_info(f"{COPY}/pipe", tarfile.FIFOTYPE), None)), "is a FIFO"),
    ("folder", _insert((_info(f"{COPY}/world", tarfile.DIRTYPE), None)), "is a folder"),
    ("unlisted member", _insert((_info(f"{COPY}/extra.txt"), b"x")), "not listed in the manifest"),
    ("outside the pack folder", _insert((_info("other/pack.json"), b"{}")),
     "is outside the pack folder"),
    ("duplicate member", _insert((_info(f"{COPY}/pack.json"), b"{}"), at=-1), "appears twice"),
    ("missing member", _drop_member("splits.json"), "does not hold: splits.json"),
    ("manifest not first", _manifest_not_first, "first member must be manifest.json"),
    ("not an archive", _raw(b"this is not an archive\n"), "not a pack archive"),
    ("empty file", _raw(b""), "not a pack archive"),
    ("truncated", _truncated, "not a pack archive"),
    ("uncompressed tar", _plain_tar, "not a pack archive"),
    ("no such file", _missing_file, "no such archive file"),
]


@pytest.mark.parametrize(("what", "make", "message"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_a_bad_archive_is_refused_and_writes_nothing(
        tmp_path: Path, copy_archive: Path, target: Worlds, what: str,
        make: Callable[[Path, Path], Path], message: str) -> None:
    installed = tmp_path / "installed"
    _copy_pack(installed, "other")  # a pack already installed stays as it is
    bad = make(copy_archive, tmp_path / "bad.tar.gz")
    before = _state(target, installed)
    with pytest.raises(PackError) as refused:
        import_pack(target, bad, installed)
    text = str(refused.value)
    assert message in text, text
    assert str(bad) in text and "\n" not in text
    assert _state(target, installed) == before
    assert list(target.cache.tmp.iterdir()) == []
    assert not Path("/tmp/escaped-pack-file").exists()
    assert not (tmp_path / "escaped").exists()


def test_a_forged_log_is_refused_on_every_backend(store_location: str, cache_dir: Path,
                                                   tmp_path: Path, copy_archive: Path) -> None:
    bad = _edit_file(LOG, _tamper_day_5, forge=True)(copy_archive, tmp_path / "bad.tar.gz")
    installed = tmp_path / "installed"
    with Worlds.open(store_location, cache_dir) as worlds:
        with pytest.raises(PackError, match=r"lars@5 replays to world hash [0-9a-f]{32}, the "
                                            r"manifest records [0-9a-f]{32}"):
            import_pack(worlds, bad, installed)
        assert _state(worlds, installed) == ([], None)


def test_a_name_installed_with_other_content_is_refused(tmp_path: Path, copy_archive: Path,
                                                         target: Worlds) -> None:
    installed = tmp_path / "installed"
    folder = _copy_pack(installed, COPY)
    (folder / "tasks" / "README.md").write_text("another pack of the same name\n")
    before = _state(target, installed)
    with pytest.raises(PackError, match=r"a pack named 'lars-copy' is already installed in .* "
                                        r"with different content \(1 file\(s\) differ: "
                                        r"tasks/README.md\)"):
        import_pack(target, copy_archive, installed)
    assert _state(target, installed) == before


def test_a_shipped_name_with_other_content_is_refused(tmp_path: Path, exporter: Worlds,
                                                       target: Worlds) -> None:
    folder = _copy_pack(tmp_path / "src", "demo")
    (folder / "README.md").write_text("not the shipped demo\n")
    archive = tmp_path / "demo.tar.gz"
    export_pack(exporter, load_pack(str(folder)), archive)
    installed = tmp_path / "installed"
    with pytest.raises(PackError, match="a pack named 'demo' ships with the package with "
                                        "different content"):
        import_pack(target, archive, installed)
    assert _state(target, installed) == ([], None)


def test_a_store_with_another_history_of_the_persona_is_refused(
        tmp_path: Path, copy_archive: Path, target: Worlds) -> None:
    other = tmp_path / "other-lars.jsonl"
    other.write_bytes(msgspec.json.encode({
        "persona": "lars", "day": 0, "ts": "2026-03-02T08:00:00Z", "type": "file_write",
        "path": "hello.txt", "text": "another lars\n"}) + b"\n")
    target.import_file(other)
    installed = tmp_path / "installed"
    before = _state(target, installed)
    with pytest.raises(PackError, match="the store already holds lars@0 with other events "
                                        "than pack 'lars-copy'"):
        import_pack(target, copy_archive, installed)
    assert _state(target, installed) == before


def test_a_store_holding_the_first_days_gets_the_rest(tmp_path: Path, copy_archive: Path,
                                                      target: Worlds) -> None:
    part = tmp_path / "first-days.jsonl"
    with open(DEMO / LOG, "rb") as fh:
        part.write_bytes(b"".join(line for line in fh if b'"day":0' in line
                                  or b'"day":1,' in line))
    assert [r.day for r in target.import_file(part)] == [0, 1]
    done = import_pack(target, copy_archive, tmp_path / "installed")
    assert (done.days_imported, done.days_skipped) == (DAYS - 2, 2)
