"""worldctl commands of grading: ``task check``, ``task verify``, ``rollout``, ``validate-day``.

Thin adapters like the rest of the CLI: parse, make one library call, render. Registered
on the ``worldctl`` group by ``worldstore.cli``; heavy imports happen inside the commands.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from gates.agents import Agent
    from gates.contract import Rollout
    from gates.gates import Judges


@click.group()
def task() -> None:
    """Task folders: run the quality gates, grade an episode."""


@task.command("check")
@click.argument("task_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--rollouts", "rollouts_file", type=click.Path(exists=True, dir_okay=False,
              path_type=Path), help="Use these rollouts (JSON from `worldctl rollout --out`) "
              "instead of running fresh ones.")
@click.option("--agent", default="scripted", show_default=True,
              help="Fresh rollouts: `scripted` (the six default scripted rollouts) or "
                   "llm:MODEL (n rollouts, the last --hinted with the hint).")
@click.option("-n", "n", default=6, show_default=True, help="Rollouts for an LLM agent.")
@click.option("--hinted", default=3, show_default=True, help="Of which hinted.")
@click.option("--report", "report_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the gate report (JSON) here.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def task_check(ctx: click.Context, task_dir: Path, rollouts_file: Path | None, agent: str,
               n: int, hinted: int, report_file: Path | None, as_json: bool) -> None:
    """Load TASK_DIR, apply the five gates, report. Exit 1 if the task is rejected."""
    from worldstore import cli as base

    def run() -> None:
        import msgspec

        from envs.instance import Environment
        from gates.contract import Rollout, to_json
        from gates.gates import GateRun, check_task, render_report
        from gates.rollout import agent_rollouts, scripted_rollouts
        from gates.task import load_task

        loaded = load_task(task_dir)
        env = Environment(base._worlds(ctx))
        given: list[Rollout] | None = None
        if rollouts_file is not None:
            given = msgspec.json.decode(rollouts_file.read_bytes(), type=list[Rollout])

        def make(t: Any) -> list[Rollout]:
            if given is not None:
                return [r for r in given if r.task_id == t.task_id]
            if agent == "scripted":
                return scripted_rollouts(env, t)
            return agent_rollouts(env, t, _agent(agent), n=n, hinted=hinted)

        progress = (lambda msg: base.err.print(f"[dim]{msg}[/dim]", markup=True)) \
            if not as_json else None
        with env:
            report = check_task(GateRun(env=env, rollouts=make,
                                        judges=_judges(env.worlds), progress=progress),
                                loaded)
        if report_file is not None:
            report_file.write_bytes(to_json(report) + b"\n")
        if as_json:
            sys.stdout.write(to_json(report).decode() + "\n")
        else:
            base.out.print(render_report(report), markup=False)
        if not report.accepted:
            sys.exit(1)

    base._fail_cleanly(run)()


@task.command("verify")
@click.argument("task_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--episode", "episode_id", required=True, help="A stored episode id.")
@click.option("--answer", default=None, help="The final answer (default: the episode's).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def task_verify(ctx: click.Context, task_dir: Path, episode_id: str, answer: str | None,
                as_json: bool) -> None:
    """Run TASK_DIR's verifier on the world an episode ends in (re-derived from its effects)
    against the task's start world. Exit 1 unless V = 1."""
    from worldstore import cli as base

    def run() -> None:
        from envs.episodes_store import load_episode
        from gates.contract import to_json
        from gates.rollout import episode_worlds
        from gates.task import load_task
        from gates.verifier import run_verifier

        loaded = load_task(task_dir)
        worlds = base._worlds(ctx)
        episode = load_episode(worlds, episode_id)
        with episode_worlds(worlds, loaded, episode) as (w0, w):
            verdict = run_verifier(loaded.verifier_dir, w0, w,
                                   answer if answer is not None else episode.answer)
        if as_json:
            sys.stdout.write(to_json(verdict).decode() + "\n")
        else:
            for c in verdict.checks:
                base.out.print(f"  [{'x' if c.passed else ' '}] {c.script}: {c.name}",
                               markup=False)
            for e in verdict.errors:
                base.out.print(f"  error: {e}", markup=False)
            base.out.print(f"V = {int(verdict.passed)} ({verdict.satisfied}/{verdict.n} "
                           "checks)", markup=False)
        if not verdict.passed:
            sys.exit(1)

    base._fail_cleanly(run)()


@click.command("rollout")
@click.argument("task_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--agent", "agent_name", default="scripted:reference", show_default=True,
              help="scripted:reference|nothing|first-half|first-K|shortcut|answer-only, or "
                   "llm:MODEL (through litellm; see WORLDCTL_LLM_* in the README).")
@click.option("-n", "n", default=1, show_default=True, help="Number of rollouts.")
@click.option("--hinted", default=0, show_default=True, help="How many of them get the hint.")
@click.option("--out", "out_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the rollouts (JSON) here, for `task check --rollouts`.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def rollout(ctx: click.Context, task_dir: Path, agent_name: str, n: int, hinted: int,
            out_file: Path | None, as_json: bool) -> None:
    """Run N rollouts of an agent on TASK_DIR; each episode is stored and graded."""
    from worldstore import cli as base

    def run() -> None:
        from rich.table import Table

        from envs.instance import Environment
        from gates.contract import to_json
        from gates.rewards import wildawm_reward
        from gates.rollout import run_rollout
        from gates.task import load_task

        loaded = load_task(task_dir)
        agent = _agent(agent_name)
        if not 0 <= hinted <= n:
            raise click.BadParameter(f"--hinted {hinted} must be between 0 and -n {n}")
        done: list[Rollout] = []
        with Environment(base._worlds(ctx)) as env, base._progress("rollouts", n) as bar:
            job = bar.add_task("rollouts", total=n)
            for i in range(n):
                done.append(run_rollout(env, loaded, agent, hinted=i >= n - hinted, index=i))
                bar.advance(job)
        if out_file is not None:
            out_file.write_bytes(to_json(done) + b"\n")
        if as_json:
            sys.stdout.write(to_json(done).decode() + "\n")
            return
        table = Table("#", "agent", "hinted", "V", "checks", "reward", "interfaces", "episode",
                      title=f"rollouts of {loaded.task_id}")
        for i, r in enumerate(done):
            reward = ("error" if r.verdict.is_error else
                      f"{wildawm_reward(r.trajectory.format_error is not None, [c.passed for c in r.verdict.checks]):.3f}")  # noqa: E501
            table.add_row(str(i), r.agent, "yes" if r.hinted else "", str(int(r.succeeded)),
                          f"{r.verdict.satisfied}/{r.verdict.n}", reward,
                          ",".join(r.interfaces_used), r.episode_id)
        base.out.print(table)

    base._fail_cleanly(run)()


@click.command("validate-day")
@click.argument("ref")
@click.option("--produces", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The day's produces.json (declared writes, files, accounts).")
@click.option("--plan", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The day's plan (text) for the reviewer agent of layer 5.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def validate_day_cmd(ctx: click.Context, ref: str, produces: Path | None, plan: Path | None,
                     as_json: bool) -> None:
    """Five-layer validation of PERSONA@DAY. Exit 1 if a layer failed."""
    from worldstore import cli as base

    def run() -> None:
        from envs.instance import Environment
        from gates.validate_day import render_day_report, validate_day

        worlds = base._worlds(ctx)
        with Environment(worlds) as env:
            report = validate_day(worlds, ref, produces=produces, env=env,
                                  reviewer=_reviewer(),
                                  plan=plan.read_text(encoding="utf-8") if plan else None)
        if as_json:
            base._json(report)
        else:
            base.out.print(render_day_report(report), markup=False)
        if not report.ok:
            sys.exit(1)

    base._fail_cleanly(run)()


def _agent(name: str) -> Agent:
    from gates.agents import scripted

    kind, _, rest = name.partition(":")
    if kind == "scripted" and rest:
        try:
            return scripted(rest)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--agent") from None
    if kind == "llm" and rest:
        from gates.llm import client_from_env
        from gates.llm_agent import LLMAgent

        return LLMAgent(client_from_env(model=rest))
    raise click.BadParameter(f"{name!r}: use scripted:NAME or llm:MODEL", param_hint="--agent")


def _judges(worlds: Any) -> Judges:
    from gates.judging import judges_from_env

    return judges_from_env(worlds)


def _reviewer() -> Any:
    from gates.judging import reviewer_from_env

    return reviewer_from_env()


def register(group: click.Group) -> None:
    group.add_command(task)
    group.add_command(rollout)
    group.add_command(validate_day_cmd)
