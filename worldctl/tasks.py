"""The grading commands: ``task check``, ``task verify`` and ``rollout``.

Thin adapters like the rest of the CLI: parse, make one library call (``gates``), render.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from worldctl import render
from worldctl.session import worlds
from worldstore.folders import write_file

TASK_DIR = click.Path(exists=True, file_okay=False, path_type=Path)


@click.group()
def task() -> None:
    """Task folders: run the quality gates, grade an episode."""


@task.command("check")
@click.argument("task_dir", type=TASK_DIR)
@click.option("--rollouts", "rollouts_file", type=click.Path(exists=True, dir_okay=False,
              path_type=Path), help="Use these rollouts (JSON from `worldctl rollout --out`) "
              "instead of running fresh ones.")
@click.option("--agent", default="scripted", show_default=True,
              help="Fresh rollouts: `scripted` (the six default scripted rollouts), or "
                   "scripted:NAME or llm:MODEL (-n rollouts, the last --hinted with the "
                   "hint).")
@click.option("-n", "n", default=6, show_default=True, type=click.IntRange(min=1),
              help="Rollouts of a named agent.")
@click.option("--hinted", default=3, show_default=True, type=click.IntRange(min=0),
              help="Of which hinted.")
@click.option("--live-test-n", default=3, show_default=True, type=click.IntRange(min=1),
              help="Unhinted rollouts the difficulty gate expects (its k counts their "
                   "successes).")
@click.option("--report", "report_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the gate report (JSON) here.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def task_check(ctx: click.Context, task_dir: Path, rollouts_file: Path | None, agent: str,
               n: int, hinted: int, live_test_n: int, report_file: Path | None,
               as_json: bool) -> None:
    """Load TASK_DIR, apply the five gates, report. Exit 1 if the task is rejected."""
    from gates.contract import to_json
    from gates.judges import judges_from_env
    from gates.quality import DifficultyConfig, GateRun, check_task, render_report
    from gates.rollout import load_rollouts, rollout_source
    from gates.task import load_task
    from worldenv.instances.instance import Environment

    loaded = load_task(task_dir)
    config = DifficultyConfig(live_test_n=live_test_n)
    given = load_rollouts(rollouts_file) if rollouts_file is not None else None
    with Environment(worlds(ctx)) as env:
        source = rollout_source(env, given=given, agent=agent, n=n, hinted=hinted)
        report = check_task(GateRun(env=env, rollouts=source,
                                    judges=judges_from_env(env.worlds), config=config,
                                    progress=None if as_json else _say), loaded)
    if report_file is not None:
        write_file(report_file, to_json(report) + b"\n")  # replaces a link, never follows
    if as_json:
        render.echo(to_json(report).decode())
    else:
        render.echo(render_report(report))
    if not report.accepted:
        sys.exit(1)


def _say(message: str) -> None:
    click.echo(message, err=True)


@task.command("verify")
@click.argument("task_dir", type=TASK_DIR)
@click.option("--episode", "episode_id", required=True, help="A stored episode id.")
@click.option("--answer", default=None, help="The final answer (default: the episode's).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def task_verify(ctx: click.Context, task_dir: Path, episode_id: str, answer: str | None,
                as_json: bool) -> None:
    """Run TASK_DIR's verifier on the world an episode ends in (re-derived from its effects)
    against the task's start world. Exit 1 unless V = 1."""
    from gates.contract import to_json
    from gates.rollout import verify_episode_of_task
    from gates.task import load_task

    verdict = verify_episode_of_task(worlds(ctx), load_task(task_dir), episode_id,
                                     answer=answer)
    if as_json:
        render.echo(to_json(verdict).decode())
    else:
        for c in verdict.checks:
            render.echo(f"  [{'x' if c.passed else ' '}] {c.script}: {c.name}")
        for e in verdict.errors:
            render.echo(f"  error: {e}")
        render.echo(f"V = {int(verdict.passed)} ({verdict.satisfied}/{verdict.n} checks)")
    if not verdict.passed:
        sys.exit(1)


@click.command("rollout")
@click.argument("task_dir", type=TASK_DIR)
@click.option("--agent", "agent_spec", default="scripted:reference", show_default=True,
              help="scripted:reference|nothing|first-half|first-K|shortcut|answer-only, or "
                   "llm:MODEL (through litellm; see WORLDCTL_LLM_* in docs/guides/grading.md).")
@click.option("-n", "n", default=1, show_default=True, type=click.IntRange(min=1),
              help="Number of rollouts.")
@click.option("--hinted", default=0, show_default=True, type=click.IntRange(min=0),
              help="How many of them get the hint (the last ones).")
@click.option("--out", "out_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the rollouts (JSON) here, for `task check --rollouts`.")
@click.option("--json", "as_json", is_flag=True,
              help="Machine-readable output: per rollout V, the checks, the reward and the "
                   "whole graded rollout.")
@click.pass_context
def rollout(ctx: click.Context, task_dir: Path, agent_spec: str, n: int, hinted: int,
            out_file: Path | None, as_json: bool) -> None:
    """Run N rollouts of an agent on TASK_DIR; each episode is stored and graded."""
    from gates.contract import to_json
    from gates.rewards import rollout_reward
    from gates.rollout import agent_rollouts, make_agent
    from gates.task import load_task
    from worldenv.instances.instance import Environment

    loaded = load_task(task_dir)
    agent = make_agent(agent_spec)
    with Environment(worlds(ctx)) as env, render.progress("rollouts", n) as bar:
        done = agent_rollouts(env, loaded, agent, n=n, hinted=hinted, done=bar.advance)
    if out_file is not None:
        write_file(out_file, to_json(done) + b"\n")  # replaces a link, never follows
    rewards = [rollout_reward(r) for r in done]
    if as_json:
        render.emit_json([render.rollout_dict(i, r, reward)
                          for i, (r, reward) in enumerate(zip(done, rewards, strict=True))])
    else:
        render.rollouts(loaded.task_id, done, rewards)
