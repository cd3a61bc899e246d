"""What the launch tests share: datasets written for a preset, a run folder's launch run
by bash with a stand-in interpreter (its arguments recorded, the SFT's output faked), and
verl's own checks of what it would have started: hydra's composition of verl's trainer
config, verl's ``validate_config``, its config dataclasses, and its model config read
from the tiny model folders of ``tests/fixtures/models`` (config.json only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import verl
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from packs.registry import load_pack
from rl.config import PRESETS
from rl.dataset import rl_rows, write_parquet

VERL_CONFIG = str(Path(verl.__file__).parent / "trainer" / "config")
MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "models"
SHORT = MODELS / "short-context"  # max_position_embeddings 4,096, no rope scaling
LONG = MODELS / "long-context"  # 262,144
ROPE_SCALED = MODELS / "rope-scaled"  # llama3 rope scaling already, 8,192
MOE_VISION = MODELS / "moe-vision"  # 8 experts and a vision_config

_STAND_IN = """#!{python}
# Stands in for the interpreter of run.env: records its arguments (one JSON line per
# call, in the folder it runs in) and, as verl's SFT would, leaves checkpoints.
import json, os, sys
with open("calls.jsonl", "a", encoding="utf-8") as out:
    out.write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[1:3] == ["-m", "torch.distributed.run"]:
    for step in (2, 10):
        os.makedirs(f"sft/checkpoints/global_step_{{step}}/huggingface", exist_ok=True)
"""


def datasets(folder: Path, preset: str, *, reward: str | None = None,
             mode: str | None = None, train_split: str = "rl") -> tuple[Path, Path]:
    """train.parquet and val.parquet of the demo pack for `preset` (its reward and mode
    unless told). The demo pack has no MCP-only task, so meta-mode rows are its tools
    rows relabelled: the launch's checks read ``extra_info`` alone."""
    chosen = PRESETS[preset]
    files = []
    for name, split in (("train", train_split), ("val", "eval")):
        rows = rl_rows(load_pack("demo"), split, mode="tools",
                       reward=reward or chosen.reward)  # type: ignore[arg-type]
        for row in rows:
            row["extra_info"] = {**row["extra_info"], "mode": mode or chosen.mode}
        files.append(folder / f"{preset}-{name}-{reward}-{mode}-{train_split}.parquet")
        write_parquet(rows, files[-1])
    return files[0], files[1]


def sft_file(folder: Path, rows: int = 8) -> Path:
    """A file shaped as `worldctl rl sft` writes it (the launch counts its rows)."""
    out = folder / f"sft-{rows}.parquet"
    pl.DataFrame({"messages": [[{"role": "user", "content": "hi"}]] * rows,
                  "tools": ["[]"] * rows, "task_id": ["t"] * rows,
                  "episode_id": ["e"] * rows}).write_parquet(out)
    return out


def run_script(run: Path, script: str = "launch.sh", cwd: Path | None = None
               ) -> list[list[str]]:
    """Run `script` of the run folder with bash, from elsewhere, with run.env's PYTHON
    edited (as a user edits it) to the stand-in; the argument lists it was called with."""
    stand_in = run.parent / f"{run.name}-python"
    stand_in.write_text(_STAND_IN.format(python=sys.executable), encoding="utf-8")
    stand_in.chmod(0o755)
    env_file = run / "run.env"
    lines = [f"PYTHON={stand_in}" if line.startswith("PYTHON=") else line
             for line in env_file.read_text(encoding="utf-8").splitlines()]
    env_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHON", "MODEL", "WORLDCTL_STORE", "WORLDCTL_PACKS")}
    done = subprocess.run(["bash", str(run / script)], cwd=cwd or run.parent, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    calls = run / "calls.jsonl"
    return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() \
        else []


def trainer_words(call: list[str]) -> list[str]:
    """The Hydra overrides of a recorded ``-m verl.trainer.main_ppo`` call."""
    assert call[:2] == ["-m", "verl.trainer.main_ppo"], call
    return call[2:]


def composed(items: list[str], name: str = "ppo_trainer") -> DictConfig:
    """verl's own config with `items` applied, as its entry point composes it."""
    with initialize_config_dir(config_dir=VERL_CONFIG, version_base=None):
        return compose(config_name=name, overrides=items)


def verl_checks(cfg: DictConfig) -> None:
    """What verl's main_ppo checks before it starts anything, and its config dataclasses."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    import rl.loss  # noqa: F401  (registers WildAWM's estimator and loss, as verl's plugins do)

    validate_config(cfg, use_reference_policy=need_reference_policy(cfg),
                    use_critic=need_critic(cfg))
    omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    omega_conf_to_dataclass(cfg.algorithm)


def model_checks(cfg: DictConfig, model: Path, run: Path) -> Any:
    """The model config verl's workers build (the actor's, with the run's YaRN config
    when it has one), and the two length checks a vLLM rollout server makes: verl's
    (max_model_len <= the config's max_position_embeddings) and vLLM's own (with YaRN:
    original_max_position_embeddings x factor, after ``hf_overrides``)."""
    from omegaconf import OmegaConf
    from verl.workers.config import HFModelConfig
    from verl.workers.rollout.utils import get_max_position_embeddings

    config_path = cfg.actor_rollout_ref.model.hf_config_path
    hf = HFModelConfig(path=str(model), load_tokenizer=False,
                       hf_config_path=None if config_path is None else str(run / config_path),
                       override_config=OmegaConf.to_container(
                           cfg.actor_rollout_ref.model.override_config))
    max_model_len = cfg.actor_rollout_ref.rollout.max_model_len
    assert max_model_len <= get_max_position_embeddings(hf.hf_config)
    raw = json.loads((model / "config.json").read_text())
    overrides = cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.get("hf_overrides")
    vllm_config = {**raw, **(OmegaConf.to_container(overrides) if overrides else {})}
    rope = vllm_config.get("rope_parameters") or vllm_config.get("rope_scaling") or {}
    if rope.get("rope_type") == "yarn":
        derived = int(rope["original_max_position_embeddings"] * rope["factor"])
    else:
        derived = int(vllm_config["max_position_embeddings"])
    assert max_model_len <= derived
    return hf.hf_config


__all__ = ["LONG", "MODELS", "MOE_VISION", "ROPE_SCALED", "SHORT", "composed", "datasets",
           "model_checks", "run_script", "sft_file", "trainer_words", "verl_checks"]
