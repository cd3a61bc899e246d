"""The training commands through the real CLI: `rl dataset` and `rl sft` write the files
the library writes, `rl config` prints (or writes) the launch command, and every refusal
is one `error:` line with exit status 2."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import polars as pl
import pytest
from cli_harness import invoke, refused

from packs.registry import load_pack
from replay.engine import Worlds
from rl.config import overrides
from rl.dataset import rl_rows
from rl.sft import sft_rows

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "packs" / "demo" / "world" / "lars.jsonl"
SFT_TASK = ROOT / "packs" / "demo" / "tasks" / "nordlys-deposit-invoice"




@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    location = str(tmp_path_factory.mktemp("cli-rl") / "store")
    assert invoke("--store", location, "import", *map(str, load_pack("demo").worlds)
                  ).exit_code == 0
    return location


def test_rl_dataset_writes_the_rows(store: str, tmp_path: Path) -> None:
    out = tmp_path / "train.parquet"
    result = invoke("--store", store, "rl", "dataset", "demo", "--out", str(out), "--json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    rows = rl_rows(load_pack("demo"))
    assert summary == {"out": str(out), "pack": "demo", "split": "rl", "mode": "tools",
                       "reward": "wildawm", "rows": 3,
                       "tasks": [r["extra_info"]["task_id"] for r in rows]}
    assert pl.read_parquet(out).to_dicts() == rows
    meta = tmp_path / "meta.parquet"
    table = invoke("--store", store, "rl", "dataset", "demo", "--split", "sft", "--mode",
                   "meta", "--reward", "awm", "--out", str(meta))
    assert table.exit_code == 0, table.stderr
    assert table.stdout.startswith(f"{meta}: 1 rows, pack demo split sft (mode meta, reward awm)")
    assert pl.read_parquet(meta).to_dicts() == rl_rows(load_pack("demo"), "sft", mode="meta",
                                                       reward="awm")
    gui = refused(invoke("--store", store, "rl", "dataset", "demo", "--split", "eval",
                         "--mode", "meta", "--out", str(meta)))
    assert "sjoboden-bar-surge-protectors" in gui and "offers no GUI tools" in gui


def test_rl_dataset_refusals(store: str, tmp_path: Path) -> None:
    out = tmp_path / "x.parquet"
    line = refused(invoke("--store", store, "rl", "dataset", "demo", "--split", "train",
                          "--out", str(out)))
    assert "no split 'train'" in line
    assert "no pack named 'nope'" in refused(
        invoke("--store", store, "rl", "dataset", "nope", "--out", str(out)))
    assert "no store at" in refused(
        invoke("--store", str(tmp_path / "none"), "rl", "dataset", "demo", "--out", str(out)))
    assert "--out" in refused(invoke("--store", store, "rl", "dataset", "demo"))
    assert "'gui'" in refused(invoke("--store", store, "rl", "dataset", "demo", "--mode", "gui",
                                     "--out", str(out)))
    Worlds.open(str(tmp_path / "empty"), create=True).close()
    line = refused(invoke("--store", str(tmp_path / "empty"), "rl", "dataset", "demo", "--out",
                          str(out)))
    assert "task 'nordlys-cart-vs-bom' of pack 'demo'" in line and "not in the store" in line
    assert not out.exists()
    skipped = invoke("--store", str(tmp_path / "empty"), "rl", "dataset", "demo",
                     "--no-store-check", "--out", str(out))
    assert skipped.exit_code == 0 and out.is_file()


def test_rl_sft_writes_the_passing_episodes(store: str, tmp_path: Path) -> None:
    out = tmp_path / "sft.parquet"
    assert "passes its verifier" in refused(
        invoke("--store", store, "rl", "sft", "demo", "--out", str(out)))
    rollout = invoke("--store", store, "rollout", str(SFT_TASK), "--agent",
                     "scripted:reference", "--json")
    assert rollout.exit_code == 0, rollout.stderr
    (graded,) = json.loads(rollout.stdout)
    result = invoke("--store", store, "rl", "sft", "demo", "--out", str(out), "--json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    episode_id = graded["rollout"]["episode_id"]
    assert summary["rows"] == 1 and summary["episodes"][0]["episode_id"] == episode_id
    with Worlds.open(store, create=False) as worlds:
        assert pl.read_parquet(out).to_dicts() == sft_rows(worlds, load_pack("demo"))
    table = invoke("--store", store, "rl", "sft", "demo", "--split", "sft", "--out", str(out))
    assert table.exit_code == 0 and episode_id in table.stdout


def test_rl_config_prints_or_writes_the_launch_command(store: str, tmp_path: Path) -> None:
    result = invoke("--store", store, "rl", "config", "demo", "--preset", "awm", "--gpus", "2",
                    "--model", "Qwen/Qwen3-4B", "--train", str(tmp_path / "t.parquet"),
                    "--val", str(tmp_path / "v.parquet"))
    assert result.exit_code == 0, result.stderr
    words = shlex.split(result.stdout.replace("\\\n", " "))
    store_abs = str(Path(store).resolve())
    assert words[:4] == [f"AGENT_WORLDS_STORE={store_abs}", "python", "-m",
                         "verl.trainer.main_ppo"]
    assert words[4:] == overrides(load_pack("demo"), preset_name="awm", model="Qwen/Qwen3-4B",
                                  n_gpus=2, store=store_abs,
                                  train_files=tmp_path / "t.parquet",
                                  val_files=tmp_path / "v.parquet")
    script = tmp_path / "launch.sh"
    written = invoke("--store", store, "rl", "config", "demo", "--out", str(script))
    assert written.exit_code == 0, written.stderr
    assert os.access(script, os.X_OK)
    assert script.read_text().startswith("#!/usr/bin/env bash\n")
    assert "algorithm.adv_estimator=wildawm" in script.read_text()
    assert "'ppo'" in refused(invoke("--store", store, "rl", "config", "demo", "--preset", "ppo"))
    assert "0" in refused(invoke("--store", store, "rl", "config", "demo", "--gpus", "0"))


def test_rl_help_lists_the_commands() -> None:
    result = invoke("rl", "--help")
    assert result.exit_code == 0
    for name in ("dataset", "sft", "config"):
        assert name in result.stdout


def test_a_pack_outside_the_package_is_found_by_the_loop(store: str, tmp_path: Path) -> None:
    """A pack named by path: rows name it, and the config tells the loop its folder."""
    import shutil

    shutil.copytree(ROOT / "packs" / "demo", tmp_path / "packs" / "demo",
                    ignore=shutil.ignore_patterns("__pycache__"))
    folder = str(tmp_path / "packs" / "demo")
    out = tmp_path / "train.parquet"
    assert invoke("--store", store, "rl", "dataset", folder, "--out", str(out)).exit_code == 0
    assert pl.read_parquet(out)["extra_info"][0]["pack"] == "demo"
    result = invoke("--store", store, "rl", "config", folder)
    assert result.exit_code == 0, result.stderr
    words = shlex.split(result.stdout.replace("\\\n", " "))
    assert f"+agent_worlds.packs_dir={tmp_path / 'packs'}" in words
    shipped = invoke("--store", store, "rl", "config", "demo")
    assert "packs_dir" not in shipped.stdout
