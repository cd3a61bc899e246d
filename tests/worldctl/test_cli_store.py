"""The store's commands keep their promises: export takes every REF form, diff compares
refs and world directories in any mix, `personas --json` carries every column of the
table, and progress bars show their total. Stored data are checked through the library.
"""

from __future__ import annotations

import io
import json
import os
import pty
import select
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from replay.engine import Worlds
from replay.hashing import hash_world
from worldctl.main import cli

ROOT = Path(__file__).resolve().parents[2]
WORLDCTL = Path(sys.executable).parent / "worldctl"
DEMO = ROOT / "packs" / "demo" / "world" / "lars.jsonl"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="worldctl", catch_exceptions=False)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    location = str(tmp_path_factory.mktemp("store") / "store")
    assert invoke("--store", location, "import", str(DEMO)).exit_code == 0
    return location


def exported(store: str, *args: str) -> bytes:
    result = invoke("--store", store, "export", *args)
    assert result.exit_code == 0, result.stderr
    return result.stdout_bytes


def log_through(store: str, day: int) -> bytes:
    """The library's own export of lars through `day`."""
    with Worlds.open(store, create=False) as worlds:
        out = io.BytesIO()
        worlds.export(f"lars@{day}", out)
        return out.getvalue()


# --- export ----------------------------------------------------------------------------


def test_export_takes_every_ref_form(store: str) -> None:
    assert exported(store, "lars") == log_through(store, 7)
    assert exported(store, "lars").count(b"\n") == len(DEMO.read_bytes().splitlines())
    with Worlds.open(store, create=False) as worlds:
        day3 = worlds.resolve("lars@3")
        last = worlds.resolve("lars")
    through_3 = log_through(store, 3)
    assert through_3.count(b"\n") == day3.last_seq + 1
    for args in (["lars@3"], ["lars@-5"], ["lars", "--through-day", "3"],
                 ["lars", "--through-day", "-5"], [day3.world_hash]):
        assert exported(store, *args) == through_3, args
    for args in (["lars"], ["lars@-1"], ["lars", "--through-day", "-1"], ["lars@7"]):
        assert exported(store, *args).count(b"\n") == last.last_seq + 1, args


def test_an_exported_prefix_imports_into_a_fresh_store_with_the_same_hashes(
        store: str, tmp_path: Path) -> None:
    log = tmp_path / "lars-2.jsonl"
    log.write_bytes(exported(store, "lars@-6"))
    fresh = str(tmp_path / "fresh")
    assert invoke("--store", fresh, "import", str(log)).exit_code == 0
    with Worlds.open(fresh, create=False) as copy, Worlds.open(store, create=False) as orig:
        assert [r.world_hash for r in copy.store.days("lars")] == [
            r.world_hash for r in orig.store.days("lars")[:3]]


# --- diff ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def edited(store: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkout of lars@3 edited by hand: one row changed, one file added."""
    dest = tmp_path_factory.mktemp("edited") / "lars3"
    assert invoke("--store", store, "checkout", "lars@3", str(dest)).exit_code == 0
    with sqlite3.connect(dest / "services" / "shop.sqlite") as conn:
        conn.execute("UPDATE products SET stock = stock + 1 WHERE id = 1")
    conn.close()
    (dest / "workspace" / "notes-by-hand.txt").write_text("added by hand\n")
    return dest


def diff_json(*args: str) -> dict[str, object]:
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.stderr
    data: dict[str, object] = json.loads(result.stdout)
    return data


def test_diff_compares_a_stored_day_with_an_edited_checkout(store: str, edited: Path) -> None:
    with Worlds.open(store, create=False) as worlds:
        day3 = worlds.resolve("lars@3").world_hash
    edited_hash = hash_world(edited)
    forward = diff_json("--store", store, "diff", "lars@3", str(edited))
    assert (forward["before"], forward["after"]) == (day3, edited_hash)
    tables = forward["tables"]
    assert isinstance(tables, list)
    assert [(t["service"], t["table"], t["changed"]) for t in tables] == [
        ("shop", "products", 1)]
    files = forward["files"]
    assert isinstance(files, list)
    assert [(f["path"], f["change"]) for f in files] == [("notes-by-hand.txt", "added")]
    backward = diff_json("--store", store, "diff", str(edited), "lars@3")
    assert (backward["before"], backward["after"]) == (edited_hash, day3)
    plain = invoke("--store", store, "diff", "lars@3", str(edited)).stdout
    assert "table shop.products (changed): +0 -0 ~1" in plain
    assert "file notes-by-hand.txt (added" in plain


def test_diff_of_two_directories_needs_no_store(store: str, edited: Path,
                                                tmp_path: Path) -> None:
    clean = tmp_path / "clean"
    assert invoke("--store", store, "checkout", "lars@3", str(clean)).exit_code == 0
    result = diff_json("--store", str(tmp_path / "no-store-here"), "diff", str(clean),
                       str(edited))
    assert (result["before"], result["after"]) == (hash_world(clean), hash_world(edited))
    assert not (tmp_path / "no-store-here").exists()
    same = invoke("diff", str(clean), str(clean))
    assert same.exit_code == 0 and "no changes" in same.stdout


# --- personas --------------------------------------------------------------------------


def test_personas_json_carries_every_column_of_the_table(store: str) -> None:
    table = invoke("--store", store, "personas").stdout.splitlines()
    header, row = table[0].split(), table[2].split()
    assert header[:2] == ["persona", "days"] and len(row) == 6
    (data,) = json.loads(invoke("--store", store, "personas", "--json").stdout)
    with Worlds.open(store, create=False) as worlds:
        (summary,) = worlds.store.personas()
        days = worlds.store.days("lars")
    expected = {"persona": summary.persona, "n_days": len(days), "last_day": days[-1].day,
                "n_events": sum(d.n_events for d in days), "last_ts": days[-1].last_ts,
                "world_hash": days[-1].world_hash}
    assert {k: data[k] for k in expected} == expected
    # ... and they are the values the table shows, column by column.
    assert row == [data["persona"], str(data["n_days"]), str(data["last_day"]),
                   str(data["n_events"]), data["last_ts"], data["world_hash"]]


# --- progress --------------------------------------------------------------------------


def on_a_terminal(*args: str, cwd: Path) -> str:
    """Run worldctl with stderr on a pseudo-terminal; what it wrote there."""
    leader, follower = pty.openpty()
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "120"}
    proc = subprocess.Popen([str(WORLDCTL), *args], stdout=subprocess.DEVNULL,
                            stderr=follower, cwd=cwd, env=env)
    os.close(follower)
    chunks = []
    while True:
        ready, _, _ = select.select([leader], [], [], 60)
        if not ready:
            break
        try:
            data = os.read(leader, 65536)
        except OSError:  # the follower side closed: the process is done
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    assert proc.wait(timeout=60) == 0
    return b"".join(chunks).decode("utf-8", "replace")


def test_progress_bars_show_their_total(tmp_path: Path) -> None:
    shown = on_a_terminal("--store", "s", "import", str(DEMO), cwd=tmp_path)
    assert "import lars.jsonl" in shown and "8/8" in shown, shown
    shown = on_a_terminal("--store", "s", "verify", "--all", cwd=tmp_path)
    assert "verify" in shown and "8/8" in shown, shown


# --- the cache cap ---------------------------------------------------------------------


def test_cache_max_caps_the_cache_of_this_invocation(store: str, tmp_path: Path) -> None:
    capped = invoke("--store", store, "--cache-max", "1M", "cache", "stats", "--json")
    assert capped.exit_code == 0, capped.stderr
    assert json.loads(capped.stdout)["max_bytes"] == 1024 * 1024
    bad = invoke("--store", store, "--cache-max", "12Q", "cache", "stats")
    assert bad.exit_code == 2
    assert bad.stderr.splitlines() == [bad.stderr.strip()]
    assert bad.stderr.startswith("error: --cache-max: '12Q' is not a size")
