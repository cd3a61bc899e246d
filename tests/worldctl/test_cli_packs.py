"""`worldctl pack list|show|export|import` on the shipped demo pack, checked through the
library (the registry and the store)."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

from click.testing import CliRunner, Result

from packs.registry import load_pack
from replay.engine import Worlds
from worldctl.main import cli


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="worldctl")


def test_list_and_show_describe_the_registrys_packs(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    listed = json.loads(invoke("--store", store, "pack", "list", "--json").stdout)
    demo = load_pack("demo")
    (entry,) = [p for p in listed if p["name"] == "demo"]
    assert entry["tasks"] == list(demo.tasks) and entry["shipped"] is True
    assert entry["worlds"] == [str(p) for p in demo.worlds]
    shown = json.loads(invoke("--store", store, "pack", "show", "demo", "--json").stdout)
    assert shown == entry
    plain = invoke("--store", store, "pack", "show", "demo").stdout
    assert f"tasks ({len(demo.tasks)}): {', '.join(demo.tasks)}" in plain
    missing = invoke("--store", store, "pack", "show", "nosuch")
    assert missing.exit_code == 2 and missing.stderr.startswith("error: ")
    assert "'nosuch'" in missing.stderr and len(missing.stderr.splitlines()) == 1


def test_export_then_import_into_a_fresh_store(tmp_path: Path) -> None:
    archive = tmp_path / "demo.tar.gz"
    exported = invoke("--store", str(tmp_path / "a"), "pack", "export", "demo", str(archive))
    assert exported.exit_code == 0, exported.stderr
    assert "10 persona-days" in exported.stdout  # lars@0..7, nora@0..1
    fresh = str(tmp_path / "b")
    imported = invoke("--store", fresh, "--cache", str(tmp_path / "b-cache"), "pack",
                      "--packs", str(tmp_path / "installed"), "import", str(archive))
    assert imported.exit_code == 0, imported.stderr
    assert "10 persona-days imported" in imported.stdout
    with Worlds.open(fresh, tmp_path / "b-cache", create=False) as worlds:
        days = worlds.store.days("lars")
    assert len(days) == 8


def test_a_tampered_archive_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    archive = tmp_path / "demo.tar.gz"
    assert invoke("--store", str(tmp_path / "a"), "pack", "export", "demo",
                  str(archive)).exit_code == 0
    tampered = tmp_path / "tampered.tar.gz"
    with tarfile.open(archive) as source, tarfile.open(tampered, "w:gz") as out:
        for member in source.getmembers():
            data = source.extractfile(member)
            content = data.read() if data is not None else b""
            if member.name.endswith("lars.jsonl"):
                content = content.replace(b"Nordlys", b"Nordlyz", 1)
                member.size = len(content)
            out.addfile(member, io.BytesIO(content))
    assert gzip.decompress(tampered.read_bytes())  # a well-formed archive, wrong contents
    store = tmp_path / "b"
    refused = invoke("--store", str(store), "pack", "--packs", str(tmp_path / "installed"),
                     "import", str(tampered))
    assert refused.exit_code == 2 and refused.stderr.startswith("error: "), refused.output
    assert len(refused.stderr.splitlines()) == 1 and "lars.jsonl" in refused.stderr
    assert not (tmp_path / "installed").exists() or not any((tmp_path / "installed").iterdir())
    with Worlds.open(store, create=True) as worlds:
        assert worlds.store.personas() == []
