"""The launch config: Hydra overrides of verl 0.9.1's ``ppo_trainer`` for one GPU node.

Two presets:

* ``wildawm``: 8 tasks x G = 4 rollouts a step, at most 64 model steps a rollout, a
  102,400-token context, 256 training steps; the WildAWM group advantage
  (``algorithm.adv_estimator=wildawm``) and policy loss (``loss_mode=wildawm_grpo``),
  asymmetric clipping 0.2 / 0.28, entropy bonus 0.001, no KL loss.
* ``awm``: AWM's GRPO: 64 tasks x 16 rollouts, at most 20 turns, a 131,072-token context,
  learning rate 7e-7, clipping 0.28 both sides, KL loss 0.001 (GRPO advantage, verl's
  vanilla loss).

Both run verl's async vLLM rollout with multi-turn tool calling in hermes format through
our agent loop (``rl/agent_loop.yaml`` registers ``agent_worlds`` =
``rl.verl_loop.WorldAgentLoop``; the manager is ``rl.verl_manager.AdaptiveAgentLoopManager``).
Every key emitted exists in verl's composed default config (tests/test_rl_config.py
applies them to it); the keys of our own namespace (``agent_worlds.*``: the loop's
settings, ``rl.verl_loop.LoopSettings``) and the keys verl reads but does not declare are
added with ``+``. The loop's history and sample settings are left at its defaults.

A preset's batch is cut to the split's size when the split has fewer tasks (verl's
dataloader drops an incomplete batch, so a larger batch would train no step).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from packs.registry import Pack
from rl.contract import AGENT_NAME
from rl.errors import RLError

AGENT_LOOP_CONFIG = Path(__file__).resolve().parent / "agent_loop.yaml"
AGENT_LOOP_MANAGER = "rl.verl_manager.AdaptiveAgentLoopManager"
ENTRYPOINT = "verl.trainer.main_ppo"
SFT_ENTRYPOINT = "verl.trainer.sft_trainer"
STORE_ENV = "AGENT_WORLDS_STORE"  # rl.world.STORE_ENV: the store a training process opens
DEFAULT_MODEL = "Qwen/Qwen3-8B"
PROMPT_TOKENS = 16_384  # system prompt + instruction + the tools' schemas


@dataclass(frozen=True)
class Preset:
    name: str
    tasks_per_step: int  # data.train_batch_size
    rollouts_per_task: int  # actor_rollout_ref.rollout.n (G)
    max_turns: int  # model steps a rollout may take
    context: int  # tokens: prompt + every turn of the rollout
    training_steps: int | None
    lr: float
    clip_low: float
    clip_high: float
    entropy_coeff: float
    use_kl_loss: bool
    kl_coef: float
    adv_estimator: str
    loss_mode: str
    reward: str  # the reward rows of this preset's dataset name (rl dataset --reward)
    # the agent loop's settings (rl.verl_loop.LoopSettings) under +agent_worlds.*
    loop: tuple[tuple[str, object], ...] = ()
    adaptive: bool = False  # WildAWM's adaptive rollouts (rl.verl_manager) or a fixed G


# Both presets train on verl's classic trainer, one sequence per rollout: the whole history
# stays in context (AWM's window and WildAWM's compaction cut it into several samples,
# which only verl's v1 TransferQueue trainer takes). Tool calls time out; lost rollouts
# retry on a fresh instance; the batch's instances are opened before its rollouts.
LOOP_COMMON: tuple[tuple[str, object], ...] = (
    ("tool_timeout", 60), ("retries", 3), ("prefetch", 1))


PRESETS = {
    "wildawm": Preset(name="wildawm", tasks_per_step=8, rollouts_per_task=4, max_turns=64,
                      context=102_400, training_steps=256, lr=1e-6, clip_low=0.2,
                      clip_high=0.28, entropy_coeff=0.001, use_kl_loss=False, kl_coef=0.0,
                      adv_estimator="wildawm", loss_mode="wildawm_grpo", reward="wildawm",
                      loop=(*LOOP_COMMON, ("rollout_timeout", 1800), ("block", 8),
                            ("kappa_max", 3), ("kappa_state", "kappa.json")),
                      adaptive=True),
    "awm": Preset(name="awm", tasks_per_step=64, rollouts_per_task=16, max_turns=20,
                  context=131_072, training_steps=None, lr=7e-7, clip_low=0.28,
                  clip_high=0.28, entropy_coeff=0.0, use_kl_loss=True, kl_coef=0.001,
                  adv_estimator="grpo", loss_mode="vanilla", reward="awm",
                  loop=(*LOOP_COMMON, ("rollout_timeout", 1800))),
}


def preset(name: str) -> Preset:
    if name not in PRESETS:
        raise RLError(f"no preset {name!r} (presets: {', '.join(PRESETS)})")
    return PRESETS[name]


def overrides(pack: Pack, *, preset_name: str = "wildawm", model: str = DEFAULT_MODEL,
              n_gpus: int = 8, store: str | None = None,
              train_files: Path | str = "train.parquet", val_files: Path | str = "val.parquet",
              split: str = "rl", packs_dir: Path | str | None = None) -> list[str]:
    """The Hydra overrides (``key=value``, ``+key=value`` for added keys), in order."""
    chosen = preset(preset_name)
    if n_gpus < 1:
        raise RLError(f"the number of GPUs must be at least 1, not {n_gpus}")
    n_tasks = len(pack.splits.get(split, ()))
    if n_tasks == 0:
        raise RLError(f"split {split!r} of pack {pack.name!r} has no tasks; nothing to train on")
    batch = min(chosen.tasks_per_step, n_tasks)
    response = chosen.context - PROMPT_TOKENS
    items: list[tuple[str, object]] = [
        # data: the parquet files of `worldctl rl dataset`, one batch = tasks per step
        ("data.train_files", _path(train_files)),
        ("data.val_files", _path(val_files)),
        ("data.prompt_key", "prompt"),
        ("data.return_raw_chat", True),
        ("data.train_batch_size", batch),
        ("data.max_prompt_length", PROMPT_TOKENS),
        ("data.max_response_length", response),
        ("data.filter_overlong_prompts", False),
        ("data.truncation", "error"),
        # the policy
        ("actor_rollout_ref.model.path", model),
        ("actor_rollout_ref.model.enable_gradient_checkpointing", True),
        ("actor_rollout_ref.model.use_remove_padding", True),
        ("actor_rollout_ref.actor.optim.lr", chosen.lr),
        ("actor_rollout_ref.actor.ppo_mini_batch_size", batch),
        ("actor_rollout_ref.actor.use_dynamic_bsz", True),
        ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", chosen.context),
        ("actor_rollout_ref.actor.clip_ratio_low", chosen.clip_low),
        ("actor_rollout_ref.actor.clip_ratio_high", chosen.clip_high),
        ("actor_rollout_ref.actor.entropy_coeff", chosen.entropy_coeff),
        ("actor_rollout_ref.actor.use_kl_loss", chosen.use_kl_loss),
        ("actor_rollout_ref.actor.kl_loss_coef", chosen.kl_coef),
        ("actor_rollout_ref.actor.loss_agg_mode", "token-mean"),
        ("actor_rollout_ref.actor.policy_loss.loss_mode", chosen.loss_mode),
        # the rollout: async vLLM, G per task, our multi-turn agent loop
        ("actor_rollout_ref.rollout.name", "vllm"),
        ("actor_rollout_ref.rollout.mode", "async"),
        ("actor_rollout_ref.rollout.n", chosen.rollouts_per_task),
        ("actor_rollout_ref.rollout.max_model_len", chosen.context),
        ("actor_rollout_ref.rollout.multi_turn.enable", True),
        ("actor_rollout_ref.rollout.multi_turn.format", "hermes"),
        ("actor_rollout_ref.rollout.multi_turn.max_assistant_turns", chosen.max_turns),
        ("actor_rollout_ref.rollout.agent.default_agent_loop", AGENT_NAME),
        ("actor_rollout_ref.rollout.agent.agent_loop_config_path", str(AGENT_LOOP_CONFIG)),
        *([("+actor_rollout_ref.rollout.agent.agent_loop_manager_class", AGENT_LOOP_MANAGER)]
          if chosen.adaptive else []),
        # the advantage
        ("algorithm.adv_estimator", chosen.adv_estimator),
        ("algorithm.use_kl_in_reward", False),
        # the trainer: verl's classic PPO trainer, whose agent-loop manager our adaptive
        # one replaces (verl's v1 trainer reads rollouts from its TransferQueue instead)
        ("trainer.use_v1", False),
        # one node
        ("trainer.nnodes", 1),
        ("trainer.n_gpus_per_node", n_gpus),
        ("trainer.project_name", "agent_worlds"),
        ("trainer.experiment_name", f"{pack.name}-{chosen.name}"),
        ("trainer.logger", ["console"]),
    ]
    if chosen.training_steps is not None:
        items.append(("trainer.total_training_steps", chosen.training_steps))
    # ours (rl.verl_loop.LoopSettings, which refuses unknown keys): the preset's adaptive
    # rollouts and history, the store the loop opens and where installed packs are; the
    # pack, task and reward come from each row
    items += [(f"+agent_worlds.{key}", value) for key, value in chosen.loop]
    if store is not None:
        items.append(("+agent_worlds.store", store))
    if packs_dir is not None:
        items.append(("+agent_worlds.packs_dir", _path(packs_dir)))
    return [f"{key}={_value(value)}" for key, value in items]


def verl_config(pack: Pack, *, preset: str = "wildawm", model: str = DEFAULT_MODEL,
                n_gpus: int = 8, store: str | None = None,
                train_files: Path | str = "train.parquet",
                val_files: Path | str = "val.parquet",
                packs_dir: Path | str | None = None) -> str:
    """The overrides as text, one a line (what ``launch_command`` passes)."""
    return "\n".join(overrides(pack, preset_name=preset, model=model, n_gpus=n_gpus,
                               store=store, train_files=train_files, val_files=val_files,
                               packs_dir=packs_dir)) + "\n"


def launch_command(pack: Pack, *, preset: str = "wildawm", model: str = DEFAULT_MODEL,
                   n_gpus: int = 8, store: str | None = None,
                   train_files: Path | str = "train.parquet",
                   val_files: Path | str = "val.parquet",
                   packs_dir: Path | str | None = None) -> str:
    """A shell command line (continued over lines) that starts training on this node."""
    items = overrides(pack, preset_name=preset, model=model, n_gpus=n_gpus, store=store,
                      train_files=train_files, val_files=val_files, packs_dir=packs_dir)
    head = (f"{STORE_ENV}={shlex.quote(store)} " if store is not None else "") + \
        f"python -m {ENTRYPOINT}"
    return " \\\n    ".join([head, *(shlex.quote(item) for item in items)]) + "\n"


def sft_overrides(sft_files: Path | str, *, model: str = DEFAULT_MODEL,
                  max_length: int = PRESETS["wildawm"].context) -> list[str]:
    """Hydra overrides of verl's ``sft_trainer_engine`` for the warm start on the file of
    ``worldctl rl sft`` (read through rl.sft's WorldSFTDataset: tools as JSON text)."""
    items: list[tuple[str, object]] = [
        ("data.train_files", _path(sft_files)),
        ("data.messages_key", "messages"),
        ("data.tools_key", "tools"),
        ("data.custom_cls.path", "pkg://rl.sft"),
        ("data.custom_cls.name", "WorldSFTDataset"),
        ("data.max_length", max_length),
        ("data.truncation", "error"),
        ("model.path", model),
        ("trainer.project_name", "agent_worlds"),
        ("trainer.experiment_name", "sft"),
    ]
    return [f"{key}={_value(value)}" for key, value in items]


def sft_launch_command(sft_files: Path | str, *, model: str = DEFAULT_MODEL,
                       n_gpus: int = 8) -> str:
    """A shell command line that runs the SFT warm start on this node."""
    if n_gpus < 1:
        raise RLError(f"the number of GPUs must be at least 1, not {n_gpus}")
    head = f"torchrun --standalone --nproc_per_node={n_gpus} -m {SFT_ENTRYPOINT}"
    items = sft_overrides(sft_files, model=model)
    return " \\\n    ".join([head, *(shlex.quote(item) for item in items)]) + "\n"


def _path(value: Path | str) -> str:
    return str(Path(value).expanduser().resolve())


_PLAIN = re.compile(r"[A-Za-z0-9_./-][A-Za-z0-9_./+-]*\Z")


def _value(value: object) -> str:
    """A value in Hydra's override grammar: bools lower case, lists in brackets, a string
    that is not plain (a URL, a path with spaces) single-quoted."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ",".join(_value(v) for v in value) + "]"
    if isinstance(value, str) and not _PLAIN.match(value):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return str(value)


__all__ = ["AGENT_LOOP_CONFIG", "AGENT_LOOP_MANAGER", "DEFAULT_MODEL", "ENTRYPOINT",
           "PRESETS", "PROMPT_TOKENS", "SFT_ENTRYPOINT", "STORE_ENV", "Preset", "launch_command",
           "overrides", "preset", "sft_launch_command", "sft_overrides", "verl_config"]
