"""The training commands through the real CLI: `rl dataset` and `rl sft` write the files
the library writes, `rl config` writes a run folder whose launch starts in verl, and
every refusal is one `error:` line with exit status 2 (and writes nothing)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import polars as pl
import pytest

from packs.registry import load_pack
from replay.engine import Worlds
from rl.config import LOGGERS
from rl.dataset import rl_rows
from rl.sft import sft_rows
from tests.support.cli_harness import invoke, refused
from tests.support.launch_harness import (
    LONG,
    SHORT,
    composed,
    model_checks,
    run_script,
    sft_file,
    trainer_words,
    verl_checks,
)
from worldctl.rl import rl_config

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "packs" / "demo" / "world" / "lars.jsonl"
SFT_TASK = ROOT / "packs" / "demo" / "tasks" / "nordlys-deposit-invoice"
EVAL_TASK = ROOT / "packs" / "demo" / "tasks" / "nordlys-delivery-checklist"  # eval split




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
    table = invoke("--store", store, "rl", "dataset", "demo", "--split", "sft", "--reward",
                   "awm", "--out", str(out))
    assert table.exit_code == 0, table.stderr
    assert table.stdout.startswith(f"{out}: 1 rows, pack demo split sft (mode tools, reward awm)")
    assert pl.read_parquet(out).to_dicts() == rl_rows(load_pack("demo"), "sft", reward="awm")


def test_rl_dataset_refuses_a_mode_without_the_tasks_interfaces(store: str,
                                                                 tmp_path: Path) -> None:
    """Every demo task needs the shell, which meta mode does not offer: one error line
    naming the task and its interfaces, and no file."""
    meta = tmp_path / "meta.parquet"
    shell = refused(invoke("--store", store, "rl", "dataset", "demo", "--split", "sft",
                           "--mode", "meta", "--reward", "awm", "--out", str(meta)))
    assert "task nordlys-deposit-invoice (mcp, shell) needs" in shell
    assert "meta mode" in shell and "offers no shell" in shell and "--mode tools" in shell
    gui = refused(invoke("--store", store, "rl", "dataset", "demo", "--split", "eval",
                         "--mode", "meta", "--out", str(meta)))
    assert "sjoboden-bar-surge-protectors (mcp, shell, gui)" in gui
    assert "offers no GUI tools and no shell" in gui
    assert not meta.exists()


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


def test_rl_sft_refuses_episodes_of_eval_split_tasks(tmp_path: Path) -> None:
    """After an eval run the store holds passing episodes of the eval split's tasks: the
    default (the sft split) leaves them out; every task, or the eval split, is refused
    naming the episode unless --allow-eval-split; a refusal writes nothing."""
    store = str(tmp_path / "store")
    assert invoke("--store", store, "import", *map(str, load_pack("demo").worlds)
                  ).exit_code == 0
    episode_id = ""
    for task in (SFT_TASK, EVAL_TASK):
        ran = invoke("--store", store, "rollout", str(task), "--agent", "scripted:reference",
                     "--json")
        assert ran.exit_code == 0, ran.stderr
        episode_id = json.loads(ran.stdout)[0]["rollout"]["episode_id"]  # the eval task's
    out = tmp_path / "sft.parquet"
    default = invoke("--store", store, "rl", "sft", "demo", "--out", str(out), "--json")
    assert default.exit_code == 0, default.stderr
    summary = json.loads(default.stdout)
    assert summary["split"] == "sft"
    assert [e["task_id"] for e in summary["episodes"]] == [SFT_TASK.name]
    out.unlink()
    for split in ("all", "eval"):
        line = refused(invoke("--store", store, "rl", "sft", "demo", "--split", split,
                              "--out", str(out)))
        assert f"episode {episode_id} of task '{EVAL_TASK.name}'" in line
        assert "eval split of pack 'demo'" in line and "--allow-eval-split" in line
        assert not out.exists()
    allowed = invoke("--store", store, "rl", "sft", "demo", "--split", "eval",
                     "--allow-eval-split", "--out", str(out), "--json")
    assert allowed.exit_code == 0, allowed.stderr
    assert [e["episode_id"] for e in json.loads(allowed.stdout)["episodes"]] == [episode_id]


def _datasets(store: str, folder: Path, *extra: str) -> tuple[Path, Path]:
    train, val = folder / "train.parquet", folder / "val.parquet"
    for split, out in (("rl", train), ("eval", val)):
        result = invoke("--store", store, "rl", "dataset", "demo", "--split", split, *extra,
                        "--out", str(out))
        assert result.exit_code == 0, result.stderr
    return train, val


def test_rl_config_writes_a_run_folder_that_starts(store: str, tmp_path: Path) -> None:
    """rl dataset's files and a local model folder (4,096 positions, an 8,192-token
    context): the run folder's launch, run by bash, passes verl's checks and the model's."""
    train, val = _datasets(store, tmp_path)
    run = tmp_path / "run"
    result = invoke("--store", store, "rl", "config", "demo", "--gpus", "1", "--model",
                    str(SHORT), "--context", "8192", "--train", str(train), "--val", str(val),
                    "--no-sft", "--logger", "console", "--logger", "wandb", "--save-every", "4",
                    "--test-every", "2", "--out", str(run), "--json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["yarn"] == {"factor": 2.0, "original": 4096, "context": 8192}
    assert summary["files"] == ["agent_loop.yaml", "launch.sh", "model_config/config.json",
                                "run.env", "train.parquet", "val.parquet"]
    assert (summary["preset"], summary["gpus"], summary["warm_start"]) == ("wildawm", 1, False)
    env = (run / "run.env").read_text()
    assert f"WORLDCTL_STORE={Path(store).resolve()}\n" in env
    assert f"PYTHON={sys.executable}\n" in env and f"MODEL={SHORT}\n" in env
    assert "WORLDCTL_PACKS" not in env  # a shipped pack
    assert os.access(run / "launch.sh", os.X_OK)
    (call,) = run_script(run)
    cfg = composed(trainer_words(call))
    verl_checks(cfg)
    model_checks(cfg, SHORT, run)
    assert (cfg.trainer.save_freq, cfg.trainer.test_freq) == (4, 2)
    assert list(cfg.trainer.logger) == ["console", "wandb"]
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 1
    assert cfg.actor_rollout_ref.rollout.agent.num_workers == 3  # the demo's 3 tasks
    assert cfg.data.train_batch_size == 3
    text = invoke("--store", store, "rl", "config", "demo", "--gpus", "1", "--model", str(LONG),
                  "--train", str(train), "--val", str(val), "--sft",
                  str(sft_file(tmp_path, rows=1)), "--out", str(tmp_path / "warm"))
    assert text.exit_code == 0, text.stderr
    assert text.stdout.startswith(f"{tmp_path / 'warm'}: run folder for pack demo, preset "
                                  f"wildawm, 1 GPU(s), model {LONG};")
    assert "(the SFT warm start, sft.sh, runs first)" in text.stdout
    assert (tmp_path / "warm" / "sft.sh").is_file()
    (logger,) = [o for o in rl_config.params if o.name == "loggers"]
    assert set(logger.type.choices) == set(LOGGERS)  # type: ignore[attr-defined]


def test_rl_config_refusals_write_nothing(store: str, tmp_path: Path) -> None:
    train, val = _datasets(store, tmp_path)
    awm_train, _ = _datasets(store, tmp_path / "awm", "--reward", "awm")
    run = tmp_path / "run"
    base = ("--store", store, "rl", "config", "demo", "--model", str(LONG), "--train",
            str(train), "--val", str(val), "--out", str(run))
    cases: list[tuple[tuple[str, ...], str, dict[str, str] | None]] = [
        (("--no-sft", "--train", str(tmp_path / "none.parquet")), "no such file", None),
        (("--no-sft", "--train", str(awm_train)), "rows have reward 'awm', the wildawm "
                                                  "preset needs 'wildawm'", None),
        (("--no-sft", "--model", "tiny/not-cached"), "not in the Hugging Face cache", {
            "HF_HUB_CACHE": str(tmp_path / "empty-cache")}),
        (("--no-sft", "--model", str(SHORT), "--context", "8192", "--no-rope-scaling"),
         "longer than model", None),
        ((), "give --sft FILE", None),
        (("--no-sft", "--tp", "2", "--gpus", "1"), "does not divide the 1 GPUs", None),
        (("--preset", "ppo"), "'ppo'", None),
        (("--gpus", "0"), "0", None),
        (("--no-sft", "--logger", "neptune"), "'neptune'", None),
    ]
    for extra, says, env in cases:
        line = refused(invoke(*base, *extra, env=env))
        assert says in line, (extra, line)
        assert not run.exists() and not list(tmp_path.glob(".run.*")), extra


def test_rl_help_lists_the_commands() -> None:
    result = invoke("rl", "--help")
    assert result.exit_code == 0
    for name in ("dataset", "sft", "config"):
        assert name in result.stdout


def test_a_pack_outside_the_package_is_found_by_the_loop(store: str, tmp_path: Path) -> None:
    """A pack named by path: rows name it, and run.env tells the loop its folder."""
    import shutil

    shutil.copytree(ROOT / "packs" / "demo", tmp_path / "packs" / "demo",
                    ignore=shutil.ignore_patterns("__pycache__"))
    folder = str(tmp_path / "packs" / "demo")
    out, val = tmp_path / "train.parquet", tmp_path / "val.parquet"
    assert invoke("--store", store, "rl", "dataset", folder, "--out", str(out)).exit_code == 0
    assert invoke("--store", store, "rl", "dataset", folder, "--split", "eval", "--out",
                  str(val)).exit_code == 0
    assert pl.read_parquet(out)["extra_info"][0]["pack"] == "demo"
    result = invoke("--store", store, "rl", "config", folder, "--model", str(LONG), "--no-sft",
                    "--train", str(out), "--val", str(val), "--out", str(tmp_path / "run"))
    assert result.exit_code == 0, result.stderr
    env = (tmp_path / "run" / "run.env").read_text()
    assert f"WORLDCTL_PACKS={tmp_path / 'packs'}\n" in env
    assert "packs_dir" not in (tmp_path / "run" / "launch.sh").read_text()
