"""The training commands: ``rl dataset|sft|config`` (the library is ``rl``).

``rl dataset`` and ``rl sft`` write parquet files (polars: the ``data`` extra); ``rl
config`` prints the command that starts verl's PPO trainer on a GPU node with them.
Packs are found as ``pack`` finds them (``--packs``, env WORLDCTL_PACKS, default beside
the store).
"""

from __future__ import annotations

import stat
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
@click.option("--split", default=None, help="Only this split's tasks (default: every task).")
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The parquet file to write.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def rl_sft(ctx: click.Context, pack_name: str, split: str | None, out: Path,
           as_json: bool) -> None:
    """Write the SFT warm start of PACK: its stored episodes that pass their verifier.

    Each becomes one conversation (system prompt, instruction, tool calls and results,
    the answer) in verl's multi-turn SFT format.
    """
    from rl.sft import write_sft_dataset

    found = _pack(ctx, pack_name)
    rows = write_sft_dataset(worlds(ctx), found, out, split=split)
    summary: dict[str, Any] = {
        "out": str(out), "pack": found.name, "split": split, "rows": len(rows),
        "episodes": [{"task_id": r["task_id"], "episode_id": r["episode_id"],
                      "messages": len(r["messages"])} for r in rows]}
    if as_json:
        render.emit_json(summary)
        return
    render.echo(f"{out}: {len(rows)} conversations, pack {found.name}"
                + (f" split {split}" if split else ""))
    for item in summary["episodes"]:
        render.echo(f"  {item['task_id']}  {item['episode_id']}  {item['messages']} messages")


@rl.command("config")
@click.argument("pack_name", metavar="PACK")
@click.option("--preset", type=click.Choice(["wildawm", "awm"]), default="wildawm",
              show_default=True, help="The training recipe.")
@click.option("--model", default="Qwen/Qwen3-8B", show_default=True,
              help="The policy: a Hugging Face model name or path.")
@click.option("--gpus", "n_gpus", type=click.IntRange(min=1), default=8, show_default=True,
              help="GPUs on the node.")
@click.option("--train", "train_file", default="train.parquet", show_default=True,
              type=click.Path(dir_okay=False, path_type=Path),
              help="The training dataset (rl dataset --split rl).")
@click.option("--val", "val_file", default="val.parquet", show_default=True,
              type=click.Path(dir_okay=False, path_type=Path),
              help="The validation dataset (rl dataset --split eval).")
@click.option("--out", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="Write the launch command as an executable script instead of printing it.")
@click.pass_context
def rl_config(ctx: click.Context, pack_name: str, preset: str, model: str, n_gpus: int,
              train_file: Path, val_file: Path, out: Path | None) -> None:
    """The command that trains on PACK with verl on one GPU node (Hydra overrides of
    verl's ppo_trainer)."""
    from rl.config import launch_command

    found = _pack(ctx, pack_name)
    # the loop finds the pack by name: an installed one (or one named by path) in its folder
    command = launch_command(found, preset=preset, model=model, n_gpus=n_gpus,
                             store=_store_location(ctx), train_files=train_file,
                             val_files=val_file,
                             packs_dir=None if found.shipped else found.root.parent)
    if out is None:
        render.echo(command.rstrip("\n"))
        return
    out.write_text("#!/usr/bin/env bash\nset -euo pipefail\n" + command, encoding="utf-8")
    out.chmod(out.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    render.echo(f"{out}: the launch command ({preset}, {model}, {n_gpus} GPUs)")
