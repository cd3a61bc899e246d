"""The launch: Hydra overrides of verl 0.9.1's ``ppo_trainer`` (and ``sft_trainer_engine``)
for one GPU node, and the run folder that holds them with everything they read.

Two presets, each the paper's recipe (methods.md sections 3 and 6):

* ``wildawm``: 8 tasks x G = 4 a step (adaptive: up to kappa_max x G), at most 256 model
  steps and 30 minutes a rollout, a 102,400-token context compacted at three quarters,
  one sample per segment, 64 RL steps after a 3-epoch SFT warm start; the WildAWM
  advantage over the completed pool and its GRPO loss (``rl.loss``), clip 0.2 / 0.28,
  entropy 0.001, no KL.
* ``awm``: AWM's GRPO: 64 tasks x 16 rollouts, at most 20 turns with the 3 most recent in
  context, one sample per turn, a 131,072-token context, 96 steps, learning rate 7e-7,
  clip 0.28 both sides, KL loss 0.001, sequence-level importance sampling between the
  rollout and the training engine; meta mode (list_tools / call_tool), the AWM reward.

Both run verl's V1 trainer (``trainer.use_v1``, sync mode) with our agent-loop manager
(``rl.verl_manager.WorldAgentLoopManager``, fixed G or adaptive by ``agent_worlds.adaptive``)
and our agent loop (``rl/agent_loop.yaml``), whose settings go under ``+agent_worlds.*``
(``rl.verl_loop.LoopSettings``, which refuses unknown keys). Every key without ``+``
exists in verl's composed config; tests/rl/test_rl_config.py composes every launch with it,
runs verl's own ``validate_config`` and checks it against model configs.

What differs from the papers, and why, is listed in docs/guides/training.md ("The launch config").

``write_run`` writes a run folder (new or empty; all checks first, then written beside
it and renamed into place, so a refusal leaves nothing): ``launch.sh`` (cds to its own
folder, reads ``run.env``, runs ``"$PYTHON" -m verl.trainer.main_ppo``), ``run.env``
(the machine's settings: the interpreter, the model, the store, the packs folder),
copies of the datasets and ``agent_loop.yaml`` (every path in the launch is relative to
the folder, where Ray's workers start too), ``model_config/`` when the model needs YaRN,
and ``sft.sh`` with its dataset for the warm start (``launch.sh`` runs it first, once).
"""

from __future__ import annotations

import re
import shlex
import shutil
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packs.registry import Pack
from rl.contract import AGENT_NAME
from rl.errors import RLError
from rl.model_config import GENERATION_CONFIG_FILE, ModelConfig, Yarn, read_model_config, yarn_for
from worldstore.folders import staged_folder

AGENT_LOOP_CONFIG = Path(__file__).resolve().parent / "agent_loop.yaml"
AGENT_LOOP_MANAGER = "rl.verl_manager.WorldAgentLoopManager"
ENTRYPOINT = "verl.trainer.main_ppo"
SFT_ENTRYPOINT = "verl.trainer.sft_trainer"
STORE_ENV = "WORLDCTL_STORE"  # rl.world.STORE_ENV: the store a training process opens
PACKS_ENV = "WORLDCTL_PACKS"  # rl.world.PACKS_ENV: where it finds an installed pack
DEFAULT_MODEL = "Qwen/Qwen3-8B"
PROMPT_TOKENS = 16_384  # system prompt + instruction + the tools' schemas
# WildAWM compacts "automatically" without saying when: at three quarters of the context a
# quarter stays free for the step that crosses the threshold and for the summary call.
COMPACT_FRACTION = 0.75
SAVE_EVERY = 8  # steps between checkpoints (and validations): the papers give none
TEST_EVERY = 8
# verl's trackers (verl.utils.tracking.Tracking.supported_backend; a test keeps them equal)
LOGGERS = ("console", "file", "tensorboard", "wandb", "mlflow", "swanlab", "clearml",
           "trackio", "vemlp_wandb", "rl_insight")
VERL_AGENT_WORKERS = 8  # verl's rollout.agent.num_workers: the most we use
VERL_ROLLOUT_TP = 2  # verl's rollout.tensor_model_parallel_size, where it divides the GPUs
SFT_BATCH = 16  # conversations per SFT step (not given by the paper)
SFT_LR = 1e-5  # the SFT learning rate (not given; verl's optimizer default is 1e-3)
CHECKPOINTS = "checkpoints"
SFT_DIR = "sft"
SFT_MODEL = "sft/model"  # sft.sh links the warm start's last Hugging Face model here
MODEL_VAR = "${MODEL}"  # run.env's model, expanded by the shell when launch.sh runs
TRAIN_FILE, VAL_FILE, SFT_FILE = "train.parquet", "val.parquet", "sft.parquet"
LOOP_FILE, ENV_FILE, LAUNCH_FILE, SFT_LAUNCH_FILE = ("agent_loop.yaml", "run.env",
                                                     "launch.sh", "sft.sh")
MODEL_CONFIG_DIR = "model_config"  # the model's config.json with YaRN (model.hf_config_path)


@dataclass(frozen=True)
class Preset:
    name: str
    tasks_per_step: int  # data.train_batch_size
    rollouts_per_task: int  # actor_rollout_ref.rollout.n (G)
    max_steps: int  # model steps a rollout may take
    context: int  # tokens of one context: prompt + the turns it holds
    training_steps: int
    lr: float
    clip_low: float
    clip_high: float
    entropy_coeff: float
    use_kl_loss: bool
    kl_coef: float
    adv_estimator: str
    loss_mode: str
    reward: str  # the dataset's reward (rl dataset --reward)
    mode: str  # the dataset's interface mode (rl dataset --mode)
    rollout_is: str | None  # algorithm.rollout_correction.rollout_is
    sft_epochs: int  # the SFT warm start's epochs; 0: the paper has none
    val_sampling: tuple[tuple[str, object], ...]  # rollout.val_kwargs (verl's: greedy)
    # the agent loop's settings (rl.verl_loop.LoopSettings) under +agent_worlds.*;
    # compact_at and the ablation switches are added by overrides()
    loop: tuple[tuple[str, object], ...]

    @property
    def compacts(self) -> bool:
        return ("history", "compaction") in self.loop


# Tool calls time out; a rollout lost to the infrastructure retries on a fresh instance
# (WildAWM: up to 3 times); the batch's instances are opened before its rollouts start.
LOOP_COMMON: tuple[tuple[str, object], ...] = (
    ("tool_timeout", 60), ("retries", 3), ("prefetch", 1), ("rollout_timeout", 1800))

PRESETS = {
    "wildawm": Preset(
        name="wildawm", tasks_per_step=8, rollouts_per_task=4, max_steps=256,
        context=102_400, training_steps=64, lr=1e-6, clip_low=0.2, clip_high=0.28,
        entropy_coeff=0.001, use_kl_loss=False, kl_coef=0.0, adv_estimator="wildawm",
        loss_mode="wildawm_grpo", reward="wildawm", mode="tools", rollout_is=None,
        sft_epochs=3, val_sampling=(),
        loop=(("adaptive", True), ("history", "compaction"), ("samples", "segments"),
              ("max_steps", 256), *LOOP_COMMON, ("block", 8), ("kappa_max", 3),
              ("kappa_state", "kappa.json"))),
    "awm": Preset(
        name="awm", tasks_per_step=64, rollouts_per_task=16, max_steps=20, context=131_072,
        training_steps=96, lr=7e-7, clip_low=0.28, clip_high=0.28, entropy_coeff=0.0,
        use_kl_loss=True, kl_coef=0.001, adv_estimator="grpo", loss_mode="vanilla",
        reward="awm", mode="meta", rollout_is="sequence", sft_epochs=0,
        # AWM's evaluation sampling, for verl's validation during training
        val_sampling=(("do_sample", True), ("temperature", 0.6), ("top_k", 20),
                      ("top_p", 0.95)),
        loop=(("adaptive", False), ("history", "window"), ("window", 3),
              ("samples", "history"), ("max_steps", 20), *LOOP_COMMON)),
}


def preset(name: str) -> Preset:
    if name not in PRESETS:
        raise RLError(f"no preset {name!r} (presets: {', '.join(PRESETS)})")
    return PRESETS[name]


def agent_workers(batch: int) -> int:
    """verl's agent-loop workers for a batch of `batch` tasks: the most, up to verl's 8,
    that divide it (verl's manager splits the batch evenly among them)."""
    return max(d for d in range(1, VERL_AGENT_WORKERS + 1) if batch % d == 0)


def rollout_tp(n_gpus: int, tensor_parallel: int | None = None) -> int:
    """vLLM's tensor-parallel size: it must divide the GPUs (verl's default 2 never starts
    on one GPU)."""
    tp = tensor_parallel or (VERL_ROLLOUT_TP if n_gpus % VERL_ROLLOUT_TP == 0 else 1)
    if tp < 1 or n_gpus % tp:
        raise RLError(f"a rollout tensor-parallel size of {tp} does not divide the "
                      f"{n_gpus} GPUs")
    return tp


def prompt_budget(context: int) -> int:
    """The prompt's share of a context: PROMPT_TOKENS, or half of a smaller context."""
    return min(PROMPT_TOKENS, context // 2)


def overrides(pack: Pack, *, preset_name: str = "wildawm", model: str = DEFAULT_MODEL,
              n_gpus: int = 8, store: str | None = None,
              train_files: Path | str = "train.parquet", val_files: Path | str = "val.parquet",
              split: str = "rl", packs_dir: Path | str | None = None,
              context: int | None = None, prompt_tokens: int | None = None,
              n_tasks: int | None = None, tensor_parallel: int | None = None,
              save_every: int = SAVE_EVERY, test_every: int = TEST_EVERY,
              loggers: Sequence[str] = ("console",), checkpoints: str = CHECKPOINTS,
              yarn: Yarn | None = None, hf_config_path: str | None = None,
              agent_loop_config: Path | str = AGENT_LOOP_CONFIG,
              format_penalty: bool = True, partial_credit: bool = True,
              experiment_name: str | None = None) -> list[str]:
    """The Hydra overrides (``key=value``, ``+key=value`` for added keys), in order.

    `context` and `prompt_tokens` replace the preset's sizes (a small model on a CPU;
    the prompt's default is ``prompt_budget``);
    `n_tasks` is the training file's row count (default: the split's tasks). Paths are
    written as given (``write_run`` gives them relative to its folder). With `yarn`, the
    actor reads `hf_config_path` (the model's config.json with it) and vLLM gets it as
    ``hf_overrides``."""
    chosen = preset(preset_name)
    if n_gpus < 1:
        raise RLError(f"the number of GPUs must be at least 1, not {n_gpus}")
    tp = rollout_tp(n_gpus, tensor_parallel)
    if n_tasks is None:
        n_tasks = len(pack.splits.get(split, ()))
        if n_tasks == 0:
            raise RLError(f"split {split!r} of pack {pack.name!r} has no tasks; nothing to "
                          f"train on")
    if n_tasks < 1:
        raise RLError(f"no training tasks for pack {pack.name!r}; nothing to train on")
    size = chosen.context if context is None else context
    prompt = prompt_budget(size) if prompt_tokens is None else prompt_tokens
    if prompt < 1 or size <= prompt:
        raise RLError(f"a {size:,}-token context leaves no room for the rollout after "
                      f"{prompt:,} prompt tokens")
    if yarn is not None and (hf_config_path is None or yarn.max_position_embeddings < size):
        raise RLError("YaRN needs the model config folder it is written to "
                      "(hf_config_path), for at least the context")
    if not partial_credit and chosen.reward != "wildawm":
        raise RLError(f"no partial credit is WildAWM's ablation (0.1/N sum v_i); the "
                      f"{chosen.name} reward has none")
    unknown = sorted(set(loggers) - set(LOGGERS))
    if unknown or not loggers:
        raise RLError(f"logger {', '.join(unknown) or 'none'}: verl's are {', '.join(LOGGERS)}")
    if save_every < 1 or test_every < 1:
        raise RLError("checkpoints and validation need a frequency of at least 1 step")
    # verl's dataloader drops an incomplete batch: a larger batch would train no step
    batch = min(chosen.tasks_per_step, n_tasks)
    items: list[tuple[str, object]] = [
        # data: the parquet files of `worldctl rl dataset`, one batch = tasks per step
        ("data.train_files", _path(train_files)),
        ("data.val_files", _path(val_files)),
        ("data.prompt_key", "prompt"),
        ("data.return_raw_chat", True),
        ("data.train_batch_size", batch),
        ("data.max_prompt_length", prompt),
        ("data.max_response_length", size - prompt),
        ("data.filter_overlong_prompts", False),
        ("data.truncation", "error"),
        # the policy
        ("actor_rollout_ref.model.path", model),
        *([("actor_rollout_ref.model.hf_config_path", hf_config_path)] if yarn else []),
        ("actor_rollout_ref.model.enable_gradient_checkpointing", True),
        ("actor_rollout_ref.model.use_remove_padding", True),
        ("actor_rollout_ref.actor.optim.lr", chosen.lr),
        ("actor_rollout_ref.actor.ppo_mini_batch_size", batch),  # one update per step
        ("actor_rollout_ref.actor.use_dynamic_bsz", True),
        ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", size),
        ("actor_rollout_ref.actor.clip_ratio_low", chosen.clip_low),
        ("actor_rollout_ref.actor.clip_ratio_high", chosen.clip_high),
        ("actor_rollout_ref.actor.entropy_coeff", chosen.entropy_coeff),
        ("actor_rollout_ref.actor.use_kl_loss", chosen.use_kl_loss),
        ("actor_rollout_ref.actor.kl_loss_coef", chosen.kl_coef),
        ("actor_rollout_ref.actor.loss_agg_mode", "token-mean"),
        ("actor_rollout_ref.actor.policy_loss.loss_mode", chosen.loss_mode),
        # the rollout: async vLLM, G per task, our multi-turn agent loop and manager
        ("actor_rollout_ref.rollout.name", "vllm"),
        ("actor_rollout_ref.rollout.mode", "async"),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size", tp),
        ("actor_rollout_ref.rollout.n", chosen.rollouts_per_task),
        ("actor_rollout_ref.rollout.max_model_len", size),
        ("actor_rollout_ref.rollout.calculate_log_probs", True),  # the rollout's, for IS
        *((f"actor_rollout_ref.rollout.val_kwargs.{k}", v) for k, v in chosen.val_sampling),
        ("actor_rollout_ref.rollout.multi_turn.enable", True),
        ("actor_rollout_ref.rollout.multi_turn.format", "hermes"),
        ("actor_rollout_ref.rollout.multi_turn.max_assistant_turns", chosen.max_steps),
        ("actor_rollout_ref.rollout.agent.num_workers", agent_workers(batch)),
        ("actor_rollout_ref.rollout.agent.default_agent_loop", AGENT_NAME),
        ("actor_rollout_ref.rollout.agent.agent_loop_config_path", str(agent_loop_config)),
        ("+actor_rollout_ref.rollout.agent.agent_loop_manager_class", AGENT_LOOP_MANAGER),
        *([("+actor_rollout_ref.rollout.engine_kwargs.vllm.hf_overrides", yarn.hf_overrides())]
          if yarn else []),
        # the advantage (and AWM's importance sampling between rollout and training engine)
        ("algorithm.adv_estimator", chosen.adv_estimator),
        ("critic.enable", False),  # GRPO-style: the group is the baseline
        ("algorithm.use_kl_in_reward", False),
        *([("algorithm.rollout_correction.rollout_is", chosen.rollout_is)]
          if chosen.rollout_is else []),
        # the trainer: verl's V1 (TransferQueue) trainer in its sync mode, on one node
        ("trainer.use_v1", True),
        ("trainer.v1.trainer_mode", "sync"),
        ("trainer.nnodes", 1),
        ("trainer.n_gpus_per_node", n_gpus),
        ("trainer.project_name", "agent_worlds"),
        ("trainer.experiment_name", experiment_name or f"{pack.name}-{chosen.name}"),
        ("trainer.logger", list(loggers)),
        ("trainer.total_training_steps", chosen.training_steps),
        # verl stops at whichever ends first: epochs never end it before the steps do
        ("trainer.total_epochs", chosen.training_steps),
        ("trainer.save_freq", save_every),
        ("trainer.test_freq", test_every),
        ("trainer.resume_mode", "auto"),
        ("trainer.default_local_dir", checkpoints),
    ]
    # ours (rl.verl_loop.LoopSettings): the preset's history, samples and rollouts, the
    # ablation switches, and where the loop finds the store and installed packs (else
    # from WORLDCTL_STORE / WORLDCTL_PACKS); the pack, task, mode and reward come
    # from each row
    loop: list[tuple[str, object]] = list(chosen.loop)
    if chosen.compacts:
        loop.append(("compact_at", int(size * COMPACT_FRACTION)))
    loop.append(("format_penalty", format_penalty))
    if chosen.reward == "wildawm":
        loop.append(("partial_credit", partial_credit))
    items += [(f"+agent_worlds.{key}", value) for key, value in loop]
    if store is not None:
        items.append(("+agent_worlds.store", store))
    if packs_dir is not None:
        items.append(("+agent_worlds.packs_dir", _path(packs_dir)))
    return [f"{key}={_value(value)}" for key, value in items]


def sft_overrides(sft_files: Path | str, *, model: str = DEFAULT_MODEL,
                  max_length: int = PRESETS["wildawm"].context, n_gpus: int = 8,
                  rows: int | None = None, epochs: int = PRESETS["wildawm"].sft_epochs,
                  loggers: Sequence[str] = ("console",),
                  checkpoints: str = f"{SFT_DIR}/{CHECKPOINTS}",
                  hf_config_path: str | None = None,
                  experiment_name: str = "sft") -> list[str]:
    """Hydra overrides of verl's ``sft_trainer_engine`` for the warm start on the file of
    ``worldctl rl sft`` (read through rl.sft's WorldSFTDataset: tools as JSON text).
    `rows`: the file's conversations, so that every GPU gets one and a step is whole."""
    if n_gpus < 1:
        raise RLError(f"the number of GPUs must be at least 1, not {n_gpus}")
    if rows is not None and rows < n_gpus:
        raise RLError(f"the SFT warm start has {rows} conversation(s) for {n_gpus} GPUs: "
                      f"each GPU needs at least one")
    # verl splits a step's conversations evenly over the GPUs and drops the remainder
    batch = max(n_gpus, min(SFT_BATCH, rows or SFT_BATCH) // n_gpus * n_gpus)
    items: list[tuple[str, object]] = [
        ("data.train_files", _path(sft_files)),
        ("data.messages_key", "messages"),
        ("data.tools_key", "tools"),
        ("data.custom_cls.path", "pkg://rl.sft"),
        ("data.custom_cls.name", "WorldSFTDataset"),
        ("data.max_length", max_length),
        ("data.truncation", "error"),
        ("data.train_batch_size", batch),
        ("data.use_dynamic_bsz", True),
        ("data.max_token_len_per_gpu", max_length),  # one whole conversation fits
        ("model.path", model),
        *([("model.hf_config_path", hf_config_path)] if hf_config_path else []),
        ("optim.lr", SFT_LR),
        ("trainer.total_epochs", epochs),
        ("trainer.nnodes", 1),
        ("trainer.n_gpus_per_node", n_gpus),
        ("trainer.project_name", "agent_worlds"),
        ("trainer.experiment_name", experiment_name),
        ("trainer.logger", list(loggers)),
        ("trainer.resume_mode", "auto"),
        ("trainer.default_local_dir", checkpoints),
        # the Hugging Face model too: the RL launch starts from it (sft/model)
        ("checkpoint.save_contents", ["model", "optimizer", "extra", "hf_model"]),
    ]
    return [f"{key}={_value(value)}" for key, value in items]


# --- the run folder ---------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """What ``write_run`` wrote."""

    folder: Path
    preset: str
    model: ModelConfig
    yarn: Yarn | None
    warm_start: bool
    n_gpus: int
    files: tuple[str, ...]
    notes: tuple[str, ...]  # what the launch cannot do for this model, said once
    overrides: tuple[str, ...]


def write_run(out: Path, pack: Pack, *, preset_name: str = "wildawm",
              model: str = DEFAULT_MODEL, n_gpus: int = 8, store: str,
              train_file: Path, val_file: Path, sft_file: Path | None = None,
              no_sft: bool = False, packs_dir: Path | None = None,
              context: int | None = None, prompt_tokens: int | None = None,
              tensor_parallel: int | None = None,
              save_every: int = SAVE_EVERY, test_every: int = TEST_EVERY,
              loggers: Sequence[str] = ("console",), rope_scaling: bool = True,
              format_penalty: bool = True, partial_credit: bool = True,
              python: str = sys.executable) -> Run:
    """Check everything, then write the run folder `out` (see the module docstring)."""
    chosen = preset(preset_name)
    warm_start = _warm_start(chosen, sft_file, no_sft)
    if out.is_symlink():  # a link is never followed, even to an empty folder
        raise RLError(f"run folder {out} is a symlink; choose a new folder")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise RLError(f"run folder {out} exists and is not empty: a run folder holds one "
                      f"run's checkpoints; choose a new one")
    train_rows = _dataset_rows(train_file, "--train", chosen, pack, training=True)
    _dataset_rows(val_file, "--val", chosen, pack, training=False)
    sft_rows = _sft_rows(sft_file) if warm_start and sft_file is not None else None
    found = read_model_config(model)
    size = chosen.context if context is None else context
    yarn = yarn_for(found, size, allow=rope_scaling)
    ablations = [name for name, off in (("no-sft", chosen.sft_epochs and not warm_start),
                                        ("no-format-penalty", not format_penalty),
                                        ("no-partial-credit", not partial_credit)) if off]
    experiment = "-".join([pack.name, chosen.name, *ablations])
    items = overrides(pack, preset_name=chosen.name, model=SFT_MODEL if warm_start else MODEL_VAR,
                      n_gpus=n_gpus, train_files=TRAIN_FILE, val_files=VAL_FILE,
                      context=context, prompt_tokens=prompt_tokens, n_tasks=train_rows,
                      tensor_parallel=tensor_parallel,
                      save_every=save_every, test_every=test_every, loggers=loggers,
                      yarn=yarn, hf_config_path=MODEL_CONFIG_DIR if yarn else None,
                      agent_loop_config=LOOP_FILE, format_penalty=format_penalty,
                      partial_credit=partial_credit, experiment_name=experiment)
    sft_items = sft_overrides(SFT_FILE, model=MODEL_VAR, max_length=size, n_gpus=n_gpus,
                              rows=sft_rows, epochs=chosen.sft_epochs, loggers=loggers,
                              hf_config_path=MODEL_CONFIG_DIR if yarn else None,
                              experiment_name=f"{experiment}-sft") if warm_start else None
    notes = _model_notes(found)
    head = [f"pack {pack.name}, preset {chosen.name}, {n_gpus} GPU(s)",
            "run.env's MODEL was checked" + (f" (YaRN factor {yarn.factor:g}: "
                                             f"{yarn.original:,} -> "
                                             f"{yarn.max_position_embeddings:,} tokens)"
                                             if yarn else "")]
    files: dict[str, str | Path] = {
        ENV_FILE: _env_file(python, model, store, None if pack.shipped else packs_dir),
        LAUNCH_FILE: _launch_script(head, notes, items, warm_start),
        TRAIN_FILE: train_file, VAL_FILE: val_file, LOOP_FILE: AGENT_LOOP_CONFIG}
    if sft_items is not None and sft_file is not None:
        files[SFT_LAUNCH_FILE] = _sft_script(head, sft_items, n_gpus)
        files[SFT_FILE] = sft_file
    if yarn is not None:
        files[f"{MODEL_CONFIG_DIR}/config.json"] = _json(yarn.config_json(found))
        generation = found.folder / GENERATION_CONFIG_FILE
        if generation.is_file():  # verl reads generation defaults from hf_config_path too
            files[f"{MODEL_CONFIG_DIR}/{GENERATION_CONFIG_FILE}"] = generation
    _write_atomically(out, files, executable=(LAUNCH_FILE, SFT_LAUNCH_FILE))
    return Run(folder=out, preset=chosen.name, model=found, yarn=yarn, warm_start=warm_start,
               n_gpus=n_gpus, files=tuple(sorted(files)), notes=notes,
               overrides=tuple(items))


def _warm_start(chosen: Preset, sft_file: Path | None, no_sft: bool) -> bool:
    if not chosen.sft_epochs:
        if sft_file is not None:
            raise RLError(f"the {chosen.name} preset has no SFT warm start (and `rl sft` "
                          f"writes tools-mode conversations, while it trains in "
                          f"{chosen.mode} mode): leave out --sft")
        return False
    if sft_file is not None and no_sft:
        raise RLError("--sft and --no-sft: choose one")
    if sft_file is None and not no_sft:
        raise RLError(f"the {chosen.name} preset warm-starts with {chosen.sft_epochs} epochs "
                      f"of SFT: give --sft FILE (worldctl rl sft), or --no-sft to train "
                      f"without it (the paper's ablation)")
    return sft_file is not None


def _read_parquet(path: Path, option: str) -> Any:
    if not path.is_file():
        raise RLError(f"{option} {path}: no such file")
    import polars as pl

    try:
        return pl.read_parquet(path)
    except Exception as exc:  # polars raises several kinds for a file that is not parquet
        raise RLError(f"{option} {path}: not a parquet file ({type(exc).__name__})") from None


def _dataset_rows(path: Path, option: str, chosen: Preset, pack: Pack, *,
                  training: bool) -> int:
    """The rows of a `worldctl rl dataset` file, refused unless written for this pack and
    the preset's reward and mode (the loop computes what each row says), and, to train
    on, unless free of eval-split tasks (a model trained on them is measured on them)."""
    frame = _read_parquet(path, option)
    if "extra_info" not in frame.columns or frame.height == 0:
        raise RLError(f"{option} {path}: not a dataset of `worldctl rl dataset` (no rows "
                      f"with extra_info)")
    fix = (f"write it with `worldctl rl dataset {pack.name} --split "
           f"{'rl' if training else 'eval'} --mode {chosen.mode} --reward {chosen.reward}`")
    for info in frame["extra_info"].to_list():
        info = info or {}
        for key, want in (("pack", pack.name), ("reward", chosen.reward),
                          ("mode", chosen.mode)):
            if info.get(key) != want:
                raise RLError(f"{option} {path}: its rows have {key} {info.get(key)!r}, the "
                              f"{chosen.name} preset needs {want!r}: {fix}")
        if training and info.get("split") == "eval":
            raise RLError(f"{option} {path}: task {info.get('task_id')!r} is of the eval "
                          f"split (training on it leaks the evaluation): {fix}")
    return int(frame.height)


def _sft_rows(path: Path) -> int:
    frame = _read_parquet(path, "--sft")
    if not {"messages", "tools"} <= set(frame.columns) or frame.height == 0:
        raise RLError(f"--sft {path}: not a file of `worldctl rl sft` (no rows with messages "
                      f"and tools)")
    return int(frame.height)


def _model_notes(model: ModelConfig) -> tuple[str, ...]:
    notes = []
    if model.experts:
        notes.append(f"the model has {model.experts} experts: WildAWM freezes the MoE router, "
                     f"verl 0.9.1's FSDP actor has no switch for it, so it trains")
    if model.vision:
        notes.append("the vision encoder gets no gradient: the agent loop shows the model "
                     "text only")
    return tuple(notes)


def _env_file(python: str, model: str, store: str, packs_dir: Path | None) -> str:
    lines = [
        "# This machine's settings of the run (launch.sh and sft.sh read them): edit them",
        "# for the node that trains. Tracker credentials (WANDB_API_KEY, ...) go here too.",
        "# The Python with agent-worlds[rl,vllm] installed (default: the one that wrote it).",
        f"PYTHON={shlex.quote(python)}",
        "# The policy, a Hugging Face id or a folder: the one `rl config` checked the context",
        "# and rope scaling against (another model needs a new `worldctl rl config`).",
        f"MODEL={shlex.quote(model)}",
        "# The world store the agent loop opens: a folder or a PostgreSQL URL.",
        f"{STORE_ENV}={shlex.quote(store)}"]
    if packs_dir is not None:
        lines += ["# The folder of installed packs, where the agent loop finds the pack.",
                  f"{PACKS_ENV}={shlex.quote(str(packs_dir))}"]
    return "\n".join(lines) + "\n"


_PROLOGUE = """\
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
set -a
. ./run.env
set +a
"""


def _launch_script(head: Sequence[str], notes: Sequence[str], items: Sequence[str],
                   warm_start: bool) -> str:
    lines = ["#!/usr/bin/env bash",
             "# RL training on verl's V1 trainer, written by `worldctl rl config`:",
             "# " + head[0] + ".",
             "# " + head[1] + ".",
             "# Runs from its own folder (datasets, checkpoints, kappa state and logs stay",
             "# here) with the settings of run.env; run it again to resume from the last",
             "# checkpoint.",
             *(f"# Note: {note}." for note in notes),
             _PROLOGUE.rstrip("\n")]
    if warm_start:
        lines += [f"if [ ! -e {SFT_MODEL} ]; then  # the SFT warm start first, once",
                  f"    ./{SFT_LAUNCH_FILE}", "fi"]
    command = ['exec "$PYTHON" -m ' + ENTRYPOINT, *(_shell_word(i) for i in items)]
    return "\n".join(lines) + "\n" + " \\\n    ".join(command) + "\n"


def _sft_script(head: Sequence[str], items: Sequence[str], n_gpus: int) -> str:
    command = [f'"$PYTHON" -m torch.distributed.run --standalone --nproc_per_node={n_gpus} '
               f"-m {SFT_ENTRYPOINT}", *(_shell_word(i) for i in items)]
    # verl saves the Hugging Face model of the last step under its global_step_N folder
    link = (f'last="$(ls -d {SFT_DIR}/{CHECKPOINTS}/global_step_* | sort -t_ -k3 -n | '
            f'tail -n 1)"\n'
            f'ln -sfn "${{last#{SFT_DIR}/}}/huggingface" {SFT_MODEL}\n')
    return ("#!/usr/bin/env bash\n"
            "# The SFT warm start written by `worldctl rl config`: " + head[0] + ".\n"
            "# Fine-tunes MODEL (run.env) on sft.parquet; its last model is linked as "
            f"{SFT_MODEL},\n# where launch.sh starts RL from.\n" + _PROLOGUE
            + " \\\n    ".join(command) + "\n" + link)


def _shell_word(item: str) -> str:
    """An override as one shell word: quoted as is, except run.env's model, which the
    shell expands (inside double quotes, where nothing else in an override is special)."""
    if MODEL_VAR not in item:
        return shlex.quote(item)
    rest = item.replace(MODEL_VAR, "")
    if any(c in rest for c in '"$`\\'):
        raise RLError(f"override {item!r} cannot be written with the model's variable")
    return f'"{item}"'


def _json(value: dict[str, Any]) -> str:
    import json

    return json.dumps(value, indent=2, sort_keys=True) + "\n"


def _write_atomically(out: Path, files: dict[str, str | Path],
                      executable: Sequence[str]) -> None:
    """Write `files` (text, or a file to copy) into a new folder beside `out`, then rename
    it to `out`: a failure leaves no half-written run folder."""
    with staged_folder(out, "run folder") as staging:
        for name, content in files.items():
            target = staging / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, Path):
                shutil.copyfile(content, target)
            else:
                target.write_text(content, encoding="utf-8")
            if name in executable:
                target.chmod(target.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP
                             | stat.S_IXOTH)
        staging.chmod(0o755)  # mkdtemp's 0700 would hide the run from the node's other users


def _path(value: Path | str) -> str:
    """A path as given when relative (a run folder's), else made absolute."""
    path = Path(value).expanduser()
    return str(path.resolve()) if path.is_absolute() else str(path)


_PLAIN = re.compile(r"[A-Za-z0-9_./-][A-Za-z0-9_./+-]*\Z")


def _value(value: object) -> str:
    """A value in Hydra's override grammar: bools lower case, lists in brackets, dicts in
    braces, a string that is not plain (a URL, a path with spaces) single-quoted."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ",".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str) and not _PLAIN.match(value):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return str(value)


__all__ = ["AGENT_LOOP_CONFIG", "AGENT_LOOP_MANAGER", "COMPACT_FRACTION", "DEFAULT_MODEL",
           "ENTRYPOINT", "LOGGERS", "MODEL_VAR", "PRESETS", "PROMPT_TOKENS", "SFT_ENTRYPOINT",
           "SFT_MODEL", "STORE_ENV", "Preset", "Run", "agent_workers", "overrides", "preset",
           "prompt_budget", "rollout_tp", "sft_overrides", "write_run"]
