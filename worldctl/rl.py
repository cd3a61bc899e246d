"""The training commands: ``rl dataset|sft|config`` (the library is ``rl``).

``rl dataset`` and ``rl sft`` write parquet files (polars: the ``data`` extra); ``rl
config`` writes the run folder that trains on a GPU node with them (rl.config.write_run).
Packs are found as ``pack`` finds them (``--packs``, env WORLDCTL_PACKS, default beside
the store).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from worldctl import render
from worldctl.session import installed_packs, packs_option, remember_packs, session, worlds

if TYPE_CHECKING:
    from packs.registry import Pack


@click.group()
@packs_option
@click.pass_context
def rl(ctx: click.Context, packs_dir: str | None) -> None:
    """Training with verl: datasets, the SFT warm start, a launch config."""
    remember_packs(ctx, packs_dir)


def _pack(ctx: click.Context, name: str) -> Pack:
    from packs.registry import load_pack

    installed = installed_packs(ctx)
    return load_pack(name, installed)


def _store_location(ctx: click.Context) -> str:
    """The store as a node can name it: a URL as given, a directory made absolute."""
    store = session(ctx).store
    return store if "://" in store else str(Path(store).expanduser().resolve())


@rl.command("dataset")
@click.argument("pack_name", metavar="PACK")
@click.option("--split", default="rl", show_default=True, help="The pack's split (sft, rl, eval).")
@click.option("--mode", type=click.Choice(["tools", "meta"]), default="tools",
              show_default=True, help="The interface the model is offered.")
@click.option("--reward", type=click.Choice(["wildawm", "awm"]), default="wildawm",
              show_default=True, help="The reward the agent loop computes.")
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The parquet file to write.")
@click.option("--no-store-check", "no_store_check", is_flag=True,
              help="Do not check that every task's world is in the store.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def rl_dataset(ctx: click.Context, pack_name: str, split: str, mode: str, reward: str,
               out: Path, no_store_check: bool, as_json: bool) -> None:
    """Write the RL dataset of PACK's split: one row per task (verl's RLHFDataset).

    Every task's start world must be in the store, as the task pins it.
    """
    from rl.dataset import write_rl_dataset
    from worldstore.folders import check_named_file

    check_named_file(out, "--out")  # before the rows are made (write_parquet checks again)
    found = _pack(ctx, pack_name)
    rows = write_rl_dataset(found, out, split, mode=mode,  # type: ignore[arg-type]
                            reward=reward,  # type: ignore[arg-type]
                            worlds=None if no_store_check else worlds(ctx))
    summary: dict[str, Any] = {
        "out": str(out), "pack": found.name, "split": split, "mode": mode, "reward": reward,
        "rows": len(rows), "tasks": [r["extra_info"]["task_id"] for r in rows]}
    if as_json:
        render.emit_json(summary)
        return
    render.echo(f"{out}: {len(rows)} rows, pack {found.name} split {split} "
                f"(mode {mode}, reward {reward}): {', '.join(summary['tasks'])}")


@rl.command("sft")
@click.argument("pack_name", metavar="PACK")
@click.option("--split", default="sft", show_default=True,
              help="The pack's split whose tasks' episodes are taken (sft, rl, eval), or "
                   "'all' for every task of the pack.")
@click.option("--allow-eval-split", "allow_eval_split", is_flag=True,
              help="Take episodes of eval-split tasks too (refused by default: training on "
                   "them leaks the evaluation).")
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The parquet file to write.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def rl_sft(ctx: click.Context, pack_name: str, split: str, allow_eval_split: bool, out: Path,
           as_json: bool) -> None:
    """Write the SFT warm start of PACK: its stored episodes that pass their verifier.

    Each becomes one conversation (system prompt, instruction, tool calls and results,
    the answer) in verl's multi-turn SFT format. An episode of an eval-split task is
    refused unless --allow-eval-split.
    """
    from rl.sft import write_sft_dataset
    from worldstore.folders import check_named_file

    check_named_file(out, "--out")  # before the episodes are graded
    found = _pack(ctx, pack_name)
    rows = write_sft_dataset(worlds(ctx), found, out, split=None if split == "all" else split,
                             allow_eval_split=allow_eval_split)
    summary: dict[str, Any] = {
        "out": str(out), "pack": found.name, "split": split, "rows": len(rows),
        "episodes": [{"task_id": r["task_id"], "episode_id": r["episode_id"],
                      "messages": len(r["messages"])} for r in rows]}
    if as_json:
        render.emit_json(summary)
        return
    render.echo(f"{out}: {len(rows)} conversations, pack {found.name} split {split}")
    for item in summary["episodes"]:
        render.echo(f"  {item['task_id']}  {item['episode_id']}  {item['messages']} messages")


@rl.command("config")
@click.argument("pack_name", metavar="PACK")
@click.option("--preset", type=click.Choice(["wildawm", "awm"]), default="wildawm",
              show_default=True, help="The training recipe (the paper's settings).")
@click.option("--model", default="Qwen/Qwen3-8B", show_default=True,
              help="The policy: a model folder, or a Hugging Face id whose config.json is in "
                   "the local Hugging Face cache (read to check the context; never downloaded).")
@click.option("--gpus", "n_gpus", type=click.IntRange(min=1), default=8, show_default=True,
              help="GPUs on the node.")
@click.option("--tp", "tensor_parallel", type=click.IntRange(min=1), default=None,
              help="vLLM's tensor-parallel size, dividing --gpus (default: 2 where it "
                   "divides them, else 1).")
@click.option("--train", "train_file", default="train.parquet", show_default=True,
              type=click.Path(dir_okay=False, path_type=Path),
              help="The training dataset (rl dataset --split rl, the preset's mode and reward).")
@click.option("--val", "val_file", default="val.parquet", show_default=True,
              type=click.Path(dir_okay=False, path_type=Path),
              help="The validation dataset (rl dataset --split eval).")
@click.option("--sft", "sft_file", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="The SFT warm start's conversations (rl sft): sft.sh fine-tunes on them "
                   "for the preset's epochs, then launch.sh trains RL from that model.")
@click.option("--no-sft", "no_sft", is_flag=True,
              help="Train without the preset's SFT warm start (WildAWM's ablation).")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="The run folder to write (new or empty).")
@click.option("--save-every", type=click.IntRange(min=1), default=8, show_default=True,
              help="Steps between checkpoints (a rerun of launch.sh resumes from the last).")
@click.option("--test-every", type=click.IntRange(min=1), default=8, show_default=True,
              help="Steps between validations on --val.")
@click.option("--logger", "loggers", multiple=True, default=("console",), show_default=True,
              type=click.Choice(["console", "file", "tensorboard", "wandb", "mlflow", "swanlab",
                                 "clearml", "trackio", "vemlp_wandb", "rl_insight"]),
              help="A verl tracker for the metrics (repeatable).")
@click.option("--context", type=click.IntRange(min=1), default=None,
              help="Tokens of one context (default: the preset's).")
@click.option("--prompt-tokens", type=click.IntRange(min=1), default=None,
              help="The prompt's share of the context (default: 16,384, or half of a "
                   "smaller context).")
@click.option("--no-rope-scaling", "no_rope_scaling", is_flag=True,
              help="Refuse a context longer than the model's instead of adding YaRN.")
@click.option("--no-format-penalty", "no_format_penalty", is_flag=True,
              help="A format failure scores 0, not -1 (ablation).")
@click.option("--no-partial-credit", "no_partial_credit", is_flag=True,
              help="WildAWM's reward is V alone, without 0.1/N sum v_i (ablation).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def rl_config(ctx: click.Context, pack_name: str, preset: str, model: str, n_gpus: int,
              tensor_parallel: int | None, train_file: Path, val_file: Path,
              sft_file: Path | None, no_sft: bool, out: Path, save_every: int,
              test_every: int, loggers: tuple[str, ...], context: int | None,
              prompt_tokens: int | None, no_rope_scaling: bool, no_format_penalty: bool,
              no_partial_credit: bool, as_json: bool) -> None:
    """Write a run folder that trains on PACK with verl on one GPU node: launch.sh (verl's
    V1 PPO trainer, checked against the model's config and verl's own), run.env (this
    machine's settings), the datasets, and sft.sh for the warm start.

    Nothing is written when a check fails.
    """
    from rl.config import write_run

    found = _pack(ctx, pack_name)
    # the loop finds the pack by name: an installed one (or one named by path) in its folder
    run = write_run(out, found, preset_name=preset, model=model, n_gpus=n_gpus,
                    store=_store_location(ctx), train_file=train_file, val_file=val_file,
                    sft_file=sft_file, no_sft=no_sft,
                    packs_dir=None if found.shipped else found.root.parent.resolve(),
                    context=context, prompt_tokens=prompt_tokens,
                    tensor_parallel=tensor_parallel, save_every=save_every,
                    test_every=test_every, loggers=loggers, rope_scaling=not no_rope_scaling,
                    format_penalty=not no_format_penalty, partial_credit=not no_partial_credit)
    yarn = run.yarn
    summary: dict[str, Any] = {
        "out": str(out), "pack": found.name, "preset": run.preset, "model": model,
        "gpus": n_gpus, "warm_start": run.warm_start, "files": list(run.files),
        "yarn": None if yarn is None else {"factor": yarn.factor, "original": yarn.original,
                                           "context": yarn.max_position_embeddings},
        "notes": list(run.notes)}
    if as_json:
        render.emit_json(summary)
        return
    render.echo(f"{out}: run folder for pack {found.name}, preset {run.preset}, {n_gpus} "
                f"GPU(s), model {model}; edit its run.env for the node, then run "
                f"{out / 'launch.sh'}"
                + (" (the SFT warm start, sft.sh, runs first)" if run.warm_start else ""))
    if yarn is not None:
        render.echo(f"  YaRN: factor {yarn.factor:g} ({yarn.original:,} -> "
                    f"{yarn.max_position_embeddings:,} tokens)")
    for note in run.notes:
        render.echo(f"  note: {note}")


from worldctl.rl_smoke import rl_smoke  # noqa: E402  (registered after the group exists)

rl.add_command(rl_smoke)
