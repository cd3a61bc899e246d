"""The launch config: every key it emits exists in verl 0.9.1's composed ppo_trainer config
(Hydra refuses an unknown key that is not added with '+'), the values land where verl
reads them, verl's own config dataclasses accept them, and the launch command carries them."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from packs.registry import Pack, load_pack
from rl.config import (
    AGENT_LOOP_CONFIG,
    AGENT_LOOP_MANAGER,
    PRESETS,
    PROMPT_TOKENS,
    STORE_ENV,
    launch_command,
    overrides,
    sft_launch_command,
    sft_overrides,
    verl_config,
)
from rl.contract import AGENT_NAME
from rl.errors import RLError


@pytest.fixture(scope="module")
def pack() -> Pack:
    return load_pack("demo")


@pytest.fixture(scope="module")
def compose() -> Iterator[Any]:
    """verl's own ppo_trainer (or another of its trainer configs) with overrides applied
    (hydra.compose)."""
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        yield lambda items, name="ppo_trainer": hydra_compose(config_name=name,
                                                              overrides=items)


def test_an_unknown_key_is_refused_so_the_check_means_something(compose: Any) -> None:
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="Could not override"):
        compose(["actor_rollout_ref.rollout.no_such_key=1"])


@pytest.mark.parametrize("preset", list(PRESETS))
def test_every_key_exists_in_verls_config_and_lands(pack: Pack, compose: Any, preset: str,
                                                    tmp_path: Path) -> None:
    from verl.utils.config import omega_conf_to_dataclass

    items = overrides(pack, preset_name=preset, model="Qwen/Qwen3-8B", n_gpus=8,
                      store="postgresql://u@db.example/worlds",
                      train_files=tmp_path / "train.parquet", val_files=tmp_path / "v.parquet")
    added = {i.split("=")[0] for i in items if i.startswith("+")}
    chosen = PRESETS[preset]
    assert added == {"+agent_worlds.store", *(f"+agent_worlds.{k}" for k, _ in chosen.loop),
                     *(["+actor_rollout_ref.rollout.agent.agent_loop_manager_class"]
                       if chosen.adaptive else [])}
    assert "trainer.use_v1=false" in items
    cfg = compose(items)
    chosen = PRESETS[preset]
    rollout, actor = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.actor
    assert cfg.data.train_files == str(tmp_path / "train.parquet")
    assert cfg.data.val_files == str(tmp_path / "v.parquet")
    assert cfg.data.train_batch_size == 3  # the demo's rl split: 3 tasks (< the preset's)
    assert actor.ppo_mini_batch_size == 3
    assert cfg.data.max_prompt_length + cfg.data.max_response_length == chosen.context
    assert cfg.data.max_prompt_length == PROMPT_TOKENS
    assert (rollout.mode, rollout.name) == ("async", "vllm")
    assert rollout.n == chosen.rollouts_per_task and rollout.max_model_len == chosen.context
    assert rollout.multi_turn.enable is True and rollout.multi_turn.format == "hermes"
    assert rollout.multi_turn.max_assistant_turns == chosen.max_turns
    assert rollout.agent.agent_loop_config_path == str(AGENT_LOOP_CONFIG)
    assert rollout.agent.get("agent_loop_manager_class") == (
        AGENT_LOOP_MANAGER if chosen.adaptive else None)
    assert rollout.agent.default_agent_loop == AGENT_NAME
    assert cfg.algorithm.adv_estimator == chosen.adv_estimator
    assert actor.policy_loss.loss_mode == chosen.loss_mode
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (chosen.clip_low, chosen.clip_high)
    assert actor.entropy_coeff == chosen.entropy_coeff
    assert actor.use_kl_loss is chosen.use_kl_loss and actor.optim.lr == chosen.lr
    assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen3-8B"
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (1, 8)
    assert cfg.trainer.total_training_steps == chosen.training_steps
    assert dict(cfg.agent_worlds) == {"store": "postgresql://u@db.example/worlds",
                                      **dict(chosen.loop)}
    assert cfg.trainer.use_v1 is False
    # verl's config dataclasses take them as they are
    omega_conf_to_dataclass(rollout)
    omega_conf_to_dataclass(actor)
    omega_conf_to_dataclass(cfg.algorithm)


def test_the_presets_are_the_papers(pack: Pack) -> None:
    wild, awm = PRESETS["wildawm"], PRESETS["awm"]
    assert (wild.tasks_per_step, wild.rollouts_per_task, wild.max_turns, wild.context,
            wild.training_steps) == (8, 4, 64, 102_400, 256)
    assert (wild.clip_low, wild.clip_high, wild.entropy_coeff, wild.use_kl_loss) == (
        0.2, 0.28, 0.001, False)
    assert (wild.adv_estimator, wild.loss_mode) == ("wildawm", "wildawm_grpo")
    assert (awm.tasks_per_step, awm.rollouts_per_task, awm.max_turns, awm.context) == (
        64, 16, 20, 131_072)
    assert (awm.lr, awm.clip_low, awm.clip_high, awm.use_kl_loss, awm.kl_coef) == (
        7e-7, 0.28, 0.28, True, 0.001)


def test_the_agent_loop_file_registers_our_loop() -> None:
    assert yaml.safe_load(AGENT_LOOP_CONFIG.read_text()) == [
        {"name": AGENT_NAME, "_target_": "rl.verl_loop.WorldAgentLoop"}]


def test_the_launch_command_carries_the_overrides(pack: Pack) -> None:
    command = launch_command(pack, preset="awm", n_gpus=4, store="/data/my store",
                             packs_dir="/data/packs")
    words = shlex.split(command.replace("\\\n", " "))  # as the shell joins the lines
    assert words[:4] == ["AGENT_WORLDS_STORE=/data/my store", "python", "-m",
                         "verl.trainer.main_ppo"]
    assert words[4:] == overrides(pack, preset_name="awm", n_gpus=4, store="/data/my store",
                                  packs_dir="/data/packs")
    assert "+agent_worlds.store='/data/my store'" in words
    assert "+agent_worlds.packs_dir=/data/packs" in words
    assert verl_config(pack).splitlines() == overrides(pack)


def test_bad_settings_are_refused(pack: Pack) -> None:
    with pytest.raises(RLError, match="no preset 'ppo'"):
        overrides(pack, preset_name="ppo")
    with pytest.raises(RLError, match="at least 1"):
        overrides(pack, n_gpus=0)
    with pytest.raises(RLError, match="split 'train' of pack 'demo' has no tasks"):
        overrides(pack, split="train")


def test_the_sft_overrides_exist_in_verls_sft_config(compose: Any, tmp_path: Path) -> None:
    items = sft_overrides(tmp_path / "sft.parquet", model="Qwen/Qwen3-4B")
    cfg = compose(items, "sft_trainer_engine")
    assert cfg.data.train_files == str(tmp_path / "sft.parquet")
    assert (cfg.data.custom_cls.path, cfg.data.custom_cls.name) == ("pkg://rl.sft",
                                                                    "WorldSFTDataset")
    assert (cfg.data.messages_key, cfg.data.tools_key) == ("messages", "tools")
    assert cfg.model.path == "Qwen/Qwen3-4B"
    words = shlex.split(sft_launch_command(tmp_path / "sft.parquet", model="Qwen/Qwen3-4B",
                                           n_gpus=2).replace("\\\n", " "))
    assert words[:5] == ["torchrun", "--standalone", "--nproc_per_node=2", "-m",
                         "verl.trainer.sft_trainer"]
    assert words[5:] == items


def test_the_loop_accepts_our_settings_and_store_variable(pack: Pack) -> None:
    """What we put under agent_worlds.* is what rl.verl_loop reads (it refuses the rest)."""
    loop = pytest.importorskip("rl.verl_loop")
    world = pytest.importorskip("rl.world")
    assert STORE_ENV == world.STORE_ENV
    ours = {i.split("=", 1)[0].removeprefix("+agent_worlds."): i.split("=", 1)[1]
            for i in overrides(pack, store="/s", packs_dir="/p") if "agent_worlds." in i}
    assert {k: ours[k] for k in ("store", "packs_dir")} == {"store": "/s", "packs_dir": "/p"}
    assert set(ours) == {"store", "packs_dir", *(k for k, _ in PRESETS["wildawm"].loop)}
    settings = loop.LoopSettings.read(ours)
    assert settings.store == "/s" and settings.kappa_state == "kappa.json"
