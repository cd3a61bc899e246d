"""The synthesis commands: ``validate-day`` (the library is ``synth.worlds.validate_day``) and the
``synth`` group (environment and persona-world synthesis; the library is ``synth.runs``)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from synth.prompts import ENV_STAGES
from worldctl import render
from worldctl.session import worlds


@click.command("validate-day")
@click.argument("ref")
@click.option("--produces", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The day's produces.json (declared writes, files, accounts).")
@click.option("--plan", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The day's plan (text) for the reviewer agent of layer 5.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def validate_day_cmd(ctx: click.Context, ref: str, produces: Path | None, plan: Path | None,
                     as_json: bool) -> None:
    """Five-layer validation of a stored day REF.

    The layers: lint, replay determinism, declarations (produces.json), live health and
    the reviewer agent. Exit 1 if a layer failed.
    """
    from synth.worlds.reviewer import reviewer_from_env
    from synth.worlds.validate_day import render_day_report, validate_day
    from worldenv.instances.instance import Environment

    store = worlds(ctx)
    with Environment(store) as env:
        report = validate_day(store, ref, produces=produces, env=env,
                              reviewer=reviewer_from_env(),
                              plan=plan.read_text(encoding="utf-8") if plan else None)
    if as_json:
        render.emit_json(report)
    else:
        click.echo(render_day_report(report), nl=False)
    if not report.ok:
        sys.exit(1)


# --- synth: environment synthesis (the library is synth.runs) -------------------------


def _model_options(fn: Any) -> Any:
    options = [
        click.option("--run", "run_dir", required=True,
                     type=click.Path(file_okay=False, path_type=Path),
                     help="The run folder: recordings, outputs, worlds, pack (resumes "
                          "when it exists)."),
        click.option("--model", default=None, envvar="WORLDCTL_LLM_MODEL",
                     help="litellm model name (env WORLDCTL_LLM_MODEL; openai/<name> with "
                          "--api-base for a vLLM server)."),
        click.option("--judge-model", default=None,
                     help="Model of the judges of gates 1 and 5 (not run without one)."),
        click.option("--embedding-model", default=None,
                     envvar="WORLDCTL_LLM_EMBEDDING_MODEL",
                     help="Embedding model of the scenarios' duplicate filter (env "
                          "WORLDCTL_LLM_EMBEDDING_MODEL; default: --model)."),
        click.option("--api-base", default=None, envvar="WORLDCTL_LLM_API_BASE",
                     help="An OpenAI-compatible server (env WORLDCTL_LLM_API_BASE)."),
        click.option("--concurrency", default=4, show_default=True,
                     type=click.IntRange(min=1), help="Scenarios synthesized at once."),
        click.option("--budget-tokens", default=None, type=click.IntRange(min=1),
                     help="Stop once this many tokens are spent (resumable)."),
        click.option("--budget-cost", default=None, type=click.FloatRange(min=0),
                     help="Stop once this many US dollars are spent (resumable)."),
        click.option("--json", "as_json", is_flag=True, help="Machine-readable output."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _settings(model: str | None, judge_model: str | None, embedding_model: str | None,
              api_base: str | None, concurrency: int, budget_tokens: int | None,
              budget_cost: float | None) -> Any:
    import os

    from synth.runs import Settings

    return Settings(model=model or None, judge_model=judge_model,
                    embedding_model=embedding_model or None, api_base=api_base or None,
                    api_key=os.environ.get("WORLDCTL_LLM_API_KEY") or None,
                    concurrency=concurrency, budget_tokens=budget_tokens,
                    budget_cost=budget_cost, progress=sys.stderr)


# The run folder's configuration file (synth.runs.RUN_FILE), named here so that the
# commands that read a run can refuse a folder that is none before synth.runs, seconds of
# imports, is loaded.
RUN_FILE = "run.json"


def _require_model(model: str | None, command: str) -> None:
    """Refuse a synthesis command that has no model to make anything with."""
    from synth.errors import SynthError

    if not model:
        raise SynthError(f"synth {command}: no model to synthesize with: give --model or set "
                         "WORLDCTL_LLM_MODEL")


def _require_run(run_dir: Path) -> None:
    """Refuse a folder that is not a synthesis run, quickly. A folder with a run.json (a
    link too) is left to synth.runs, which checks it in full."""
    import os

    from synth.errors import SynthError

    if not os.path.lexists(run_dir / RUN_FILE):
        raise SynthError(f"{run_dir}: not a synthesis run (no {RUN_FILE})")


@click.group("synth")
def synth_group() -> None:
    """Synthesize tool-use environments with an LLM (the AWM pipeline)."""


@synth_group.command("scenarios")
@click.option("--seeds", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Seed scenarios, AWM's format (JSON Lines: name, description); "
                   "synth/seeds/seed_scenario.jsonl ships 100.")
@click.option("-n", "n", required=True, type=click.IntRange(min=1),
              help="Scenarios to keep.")
@click.option("--category-cap", default=None, type=click.IntRange(min=1),
              help="At most this many scenarios per category (default: n/5, at least 2).")
@_model_options
def synth_scenarios_cmd(seeds: Path, n: int, category_cap: int | None, run_dir: Path,
                        model: str | None, judge_model: str | None,
                        embedding_model: str | None, api_base: str | None,
                        concurrency: int, budget_tokens: int | None,
                        budget_cost: float | None, as_json: bool) -> None:
    """Expand seed names into N scenarios (classifier, embedding de-duplication, category
    caps) written to RUN/scenarios.jsonl."""
    _require_model(model, "scenarios")
    from synth.runs import NOT_RUN_NO_MODEL, synth_scenarios

    settings = _settings(model, judge_model, embedding_model, api_base, concurrency,
                         budget_tokens, budget_cost)
    report = synth_scenarios(run_dir, settings, seeds, n, category_cap)
    if as_json:
        render.emit_json(report)
    elif report["status"] == NOT_RUN_NO_MODEL:
        click.echo(f"scenarios: {NOT_RUN_NO_MODEL} (--model or WORLDCTL_LLM_MODEL)")
    else:
        click.echo(_scenarios_text(report, run_dir))
    if report["status"] != "done" or len(report["kept"]) < n:
        sys.exit(1)


def _scenarios_text(report: dict[str, Any], run_dir: Path) -> str:
    by_filter: dict[str, int] = {}
    for rejected in report["rejected"]:
        by_filter[rejected["filter"]] = by_filter.get(rejected["filter"], 0) + 1
    rows = [[s["name"], s["category"], render.clip(s["description"], 60)]
            for s in report["kept"]]
    out = render.table(["scenario", "category", "description"], rows,
                       title=f"{len(report['kept'])} scenarios kept in {report['rounds']} "
                             f"rounds -> {run_dir / 'scenarios.jsonl'}")
    if by_filter:
        out += "\nrejected: " + ", ".join(f"{k} {v}" for k, v in sorted(by_filter.items()))
    return out


@synth_group.command("envs")
@click.option("--scenarios", "scenarios", default=None,
              type=click.Path(dir_okay=False, path_type=Path),
              help="Scenarios (JSON Lines: name, description, category); default "
                   "RUN/scenarios.jsonl.")
@click.option("--only", default=None,
              type=click.Choice(ENV_STAGES),
              help="Run this stage alone (the stages before it must be done).")
@click.option("--tasks-per-scenario", default=10, show_default=True,
              type=click.IntRange(min=1, max=50), help="Tasks per scenario (AWM: 10).")
@click.option("--code-format", default="app", show_default=True,
              type=click.Choice(["app", "awm"]),
              help="What each world serves: the model's code in the project's app contract "
                   "(app), or that code rendered as AWM's FastAPI server, served by the AWM "
                   "adapter (awm).")
@_model_options
@click.pass_context
def synth_envs_cmd(ctx: click.Context, scenarios: Path | None, only: str | None,
                   tasks_per_scenario: int, code_format: str, run_dir: Path,
                   model: str | None,
                   judge_model: str | None, embedding_model: str | None,
                   api_base: str | None, concurrency: int,
                   budget_tokens: int | None, budget_cost: float | None,
                   as_json: bool) -> None:
    """Synthesize an environment per scenario: tasks, schema, data, API spec, app code,
    verifiers and reference solutions, each executed and self-corrected; the worlds go
    into the store and RUN/pack. Exit 1 unless every scenario was built."""
    _require_model(model, "envs")
    from replay.engine import Worlds
    from synth.runs import synth_envs
    from worldctl.session import session

    where = session(ctx)
    settings = _settings(model, judge_model, embedding_model, api_base, concurrency,
                         budget_tokens, budget_cost)

    def open_worlds() -> Worlds:
        return Worlds.open(where.store, where.cache)

    report = synth_envs(run_dir, settings, scenarios or run_dir / "scenarios.jsonl",
                        open_worlds, only=only, tasks_per_scenario=tasks_per_scenario,
                        code_format=code_format)
    if as_json:
        render.emit_json({"results": report.results, "stopped": report.stopped,
                          "summary": report.summary})
    else:
        click.echo(_envs_text(report))
    if report.stopped or any(r.stopped_at is not None or r.reason for r in report.results):
        sys.exit(1)


def _envs_text(report: Any) -> str:
    lines = []
    for result in report.results:
        if result.built:
            verified = sum(t.verified for t in result.tasks)
            accepted = sum(t.accepted for t in result.tasks)
            lines.append(f"{result.scenario}: world {result.persona}@0 {result.world_hash}, "
                         f"{result.tools} tools, {verified}/{len(result.tasks)} tasks "
                         f"verified, {accepted} accepted by the gates")
        else:
            lines.append(f"{result.scenario}: " + (f"stopped at {result.stopped_at}: "
                                                    if result.stopped_at else "")
                         + result.reason)
        for stage in result.stages:
            if stage.status == "not_run":
                lines.append(f"  {stage.stage}: {stage.reason}")
    if report.stopped:
        lines.append(f"stopped: {report.stopped}")
    lines.append("")
    lines.append(summary_table(report.summary))
    return "\n".join(lines)


def summary_table(summary: dict[str, Any]) -> str:
    """AWM's Table 1 for a run."""
    rows = []
    for row in summary["stages"]:
        rows.append([row["stage"], str(row["ran"]), _pct(row["success_rate"]),
                     "-" if row["mean_corrections"] is None else f"{row['mean_corrections']:.2f}",
                     f"{row['tokens']:,}", _usd(row["cost"])])
    out = render.table(["stage", "ran", "success", "mean corrections", "tokens", "cost"], rows)
    per_100 = summary["cost_per_100_envs"]
    out += (f"\n{summary['envs_built']} of {summary['scenarios']} environments built, "
            f"{summary['tools']} tools, {summary['tasks_verified']} tasks verified, "
            f"{summary['tasks_accepted']} accepted; cost per 100 environments: "
            f"{_usd(per_100) if per_100 is not None else 'unpriced model'}"
            + (f" ({summary['tokens_per_100_envs']:,.0f} tokens)"
               if summary["tokens_per_100_envs"] is not None else ""))
    return out


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _usd(value: float | None) -> str:
    return "-" if value is None else f"${value:.4f}"


@synth_group.command("persona")
@click.option("--name", "hint", default=None,
              help="The persona's name or an idea for it (default: the model's choice).")
@_model_options
def synth_persona_cmd(hint: str | None, run_dir: Path, model: str | None,
                      judge_model: str | None, embedding_model: str | None,
                      api_base: str | None, concurrency: int, budget_tokens: int | None,
                      budget_cost: float | None, as_json: bool) -> None:
    """Write one persona bible (occupation, contacts, services, story arcs, accounts),
    checked against the app library and judged for diversity against the run's accepted
    personas (at most 2 revisions); an accepted one goes to RUN/personas/<name>/. Exit 1
    unless accepted."""
    _require_model(model, "persona")
    from synth.runs import synth_persona

    settings = _settings(model, judge_model, embedding_model, api_base, concurrency,
                         budget_tokens, budget_cost)
    report = synth_persona(run_dir, settings, hint)

    def accepted() -> str:
        revised = report["revisions"]
        return (f"persona {report['name']}: accepted"
                + (f" after {revised} revision{'s' * (revised > 1)}" if revised else "")
                + f"\n  {report['signature']}\n  {run_dir / 'personas' / report['name']}")

    _stage_report("persona", report, as_json, accepted,
                  lambda: f"persona: {report['status']}: {report['reason']}")


@synth_group.command("day")
@click.argument("persona")
@click.option("--day", "day", required=True, type=int, help="The day to make (from 1).")
@click.option("--plan-only", is_flag=True,
              help="Write the day's plan alone.")
@click.option("--from-episode", "episode_id", default=None,
              help="Make the day from this stored episode on PERSONA@N-1 (its effects "
                   "become the day's events) and append it to the store.")
@_model_options
@click.pass_context
def synth_day_cmd(ctx: click.Context, persona: str, day: int, plan_only: bool,
                  episode_id: str | None, run_dir: Path, model: str | None,
                  judge_model: str | None, embedding_model: str | None,
                  api_base: str | None, concurrency: int, budget_tokens: int | None,
                  budget_cost: float | None, as_json: bool) -> None:
    """Make day N of an accepted persona of the run and append it to the store: planned
    (timed activities through its services' tools and its workspace, from its bible, its
    earlier plans and what the store holds of its world, with coverage pressure from
    earlier days' events; RUN/personas/<persona>/plans/day-<N>.json), then implemented
    by a coding agent in a live instance of PERSONA@N-1 (services' tools, SQL, the
    shell, the plan's clock), validated (re-execution, the five layers) with failures fed
    back, at most 3 attempts (RUN/personas/<persona>/days/day-<N>.json). Day 0, the
    world's set-up, comes first when the store has none. --plan-only writes the plan
    alone; --from-episode ID makes the day from a stored episode on PERSONA@N-1 instead.
    Exit 1 unless the plan was accepted (--plan-only) or the day stored."""
    if episode_id is not None:
        _day_from_episode(ctx, persona, day, episode_id, as_json)
        return
    _require_model(model, "day")
    from synth.runs import synth_day, synth_plan

    settings = _settings(model, judge_model, embedding_model, api_base, concurrency,
                         budget_tokens, budget_cost)
    open_worlds = _store_opener(ctx)
    if plan_only:
        report = synth_plan(run_dir, settings, persona, day, open_worlds)

        def accepted() -> str:
            plan = report["plan"]
            return (f"{persona} day {day} ({plan['date']}): {len(plan['activities'])} "
                    f"activities: {plan['summary']}\n  "
                    f"{run_dir / 'personas' / persona / 'plans' / f'day-{day}.json'}")

        _stage_report("day", report, as_json, accepted,
                      lambda: f"day: no plan accepted after {report['attempts']} attempts: "
                              + "; ".join(report["errors"][:3]))
        return
    made = synth_day(run_dir, settings, persona, day, open_worlds)
    _days_report([{"persona": persona, "day": day, **made}], as_json, made)


@synth_group.command("world")
@click.argument("persona")
@click.option("--to-day", "to_day", required=True, type=int,
              help="Make every day up to this one the store lacks.")
@_model_options
@click.pass_context
def synth_world_cmd(ctx: click.Context, persona: str, to_day: int, run_dir: Path,
                    model: str | None, judge_model: str | None, embedding_model: str | None,
                    api_base: str | None, concurrency: int, budget_tokens: int | None,
                    budget_cost: float | None, as_json: bool) -> None:
    """Make an accepted persona's world day by day up to day N (each day as `synth day`
    makes it), resuming after the last stored day; stops at the first day not stored.
    Exit 1 unless every day is stored."""
    _require_model(model, "world")
    from synth.runs import synth_world

    settings = _settings(model, judge_model, embedding_model, api_base, concurrency,
                         budget_tokens, budget_cost)
    report = synth_world(run_dir, settings, persona, to_day, _store_opener(ctx))
    _days_report(report.get("days", []), as_json, report)


@synth_group.command("tasks")
@click.argument("persona")
@click.option("--days", "days_text", required=True,
              help="The days to synthesize tasks on, comma-separated (e.g. 3,5,7): one slot "
                   "per day.")
@click.option("--difficulty", "difficulty_text", default="hard", show_default=True,
              help="hard or medium, one for every slot or one per day (e.g. hard,hard,medium).")
@click.option("--count", default=1, show_default=True, type=click.IntRange(min=1),
              help="Tasks per slot (one per round).")
@click.option("--parallel", default=1, show_default=True, type=click.IntRange(min=1),
              help="Slots of a round worked at once.")
@click.option("--agent-models", "agent_models", default=None,
              help="The rollout ensemble's models, comma-separated (default: --model); each "
                   "runs with every agent variant.")
@_model_options
@click.pass_context
def synth_tasks_cmd(ctx: click.Context, persona: str, days_text: str, difficulty_text: str,
                    count: int, parallel: int, agent_models: str | None, run_dir: Path,
                    model: str | None, judge_model: str | None, embedding_model: str | None,
                    api_base: str | None, concurrency: int, budget_tokens: int | None,
                    budget_cost: float | None, as_json: bool) -> None:
    """Synthesize tasks on an accepted persona's stored days: per slot and round, tasks
    proposed from the booted world (each needs mcp and shell; spec, verifier, rubric, hint,
    subtasks, reference solution), a diversity gate against accepted tasks and those other
    workers claimed (coordinated through the store), six ensemble rollouts (half hinted),
    the five gates with up to two LLM revisions; accepted tasks into the run's pack.
    Without --judge-model gates 1 and 5's judged part are not run."""
    from synth.errors import SynthError

    _require_model(model, "tasks")
    from synth.runs import NOT_RUN_NO_MODEL, synth_tasks

    try:
        days = [int(d) for d in days_text.split(",") if d.strip()]
    except ValueError:
        raise SynthError(f"--days {days_text}: not a comma-separated list of day numbers"
                         ) from None
    settings = _settings(model, judge_model, embedding_model, api_base, concurrency,
                         budget_tokens, budget_cost)
    report = synth_tasks(run_dir, settings, persona, days,
                         [d.strip() for d in difficulty_text.split(",") if d.strip()], count,
                         parallel, _store_opener(ctx),
                         [m.strip() for m in agent_models.split(",") if m.strip()]
                         if agent_models else None)
    if as_json:
        render.emit_json(report)
    elif report["status"] == NOT_RUN_NO_MODEL:
        click.echo(f"tasks: {NOT_RUN_NO_MODEL} (--model or WORLDCTL_LLM_MODEL)")
    else:
        for task in report["tasks"]:
            fate = ("accepted" + (f" ({task['difficulty']})" if task["difficulty"] else "")
                    if task["accepted"] else "held back by the diversity gate"
                    if task["diversity"] == "held_back" else "rejected"
                    if task["diversity"] == "claimed" else "no executable candidate")
            n = task["revisions"]
            revised = f", {n} revision{'s' * (n != 1)}" if n else ""
            click.echo(f"{task['task_id']} (day {task['day']}, rank {task['rank']}): {fate}"
                       f"{revised}")
        click.echo(funnel_table(report["funnel"]))
    if report["status"] != "done":
        sys.exit(1)


@synth_group.command("funnel")
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def synth_funnel_cmd(run_dir: Path, as_json: bool) -> None:
    """The run's task funnel (WildAWM's): candidates, held back by the diversity gate,
    per gate the tasks that reached it, passed directly and after feedback, revisions;
    tokens per task, acceptance rate, hard and medium counts. An environment run (`synth
    envs`), which has no such tasks, shows its stages instead (as `synth envs` ends)."""
    _require_run(run_dir)
    from synth.runs import read_config, summarize, task_funnel

    report = task_funnel(run_dir)
    kinds = {c.kind for c in read_config(run_dir).commands}
    if report["candidates"] == 0 and "envs" in kinds and "tasks" not in kinds:
        # The task funnel counts `synth tasks`' candidates: all zeros here would say
        # nothing. What an environment run has is its pipeline's stage counts.
        summary = summarize(run_dir)
        if as_json:
            render.emit_json({"run": str(run_dir), "kind": "envs", "summary": summary})
        else:
            click.echo(f"{run_dir} is an environment run (synth envs): its stages; the task "
                       "funnel is for the tasks of `synth tasks` on a persona run")
            click.echo(summary_table(summary))
        return
    if as_json:
        render.emit_json(report)
    else:
        click.echo(funnel_table(report))


def funnel_table(report: dict[str, Any]) -> str:
    lines = [f"candidates {report['candidates']}, held back by the diversity gate "
             f"{report['held_back']}, without an executable candidate "
             f"{report['no_candidate']}, gated {report['gated']}",
             f"  {'gate':<22} {'reached':>7} {'directly':>8} {'after fb':>8} {'revised':>7} "
             f"{'not run':>7}"]
    for row in report["gates"]:
        lines.append(f"  {row['gate']:<22} {row['reached']:>7} {row['passed_directly']:>8} "
                     f"{row['passed_after_feedback']:>8} {row['revisions']:>7} "
                     f"{row['not_run']:>7}")
    rate = report["acceptance_rate"]
    lines.append(f"accepted {report['accepted']} ({_pct(rate)} of gated): hard "
                 f"{report['hard']}, medium {report['medium']}; revisions "
                 f"{report['revisions']}; tokens {report['tokens']:,} "
                 f"({report['tokens_per_task'] or 0:,.0f} per task)")
    return "\n".join(lines)


def _store_opener(ctx: click.Context) -> Callable[..., Any]:
    from replay.engine import Worlds
    from worldctl.session import session

    where = session(ctx)

    def open_worlds(*, create: bool = True) -> Worlds:
        return Worlds.open(where.store, where.cache, create=create)

    return open_worlds


def _days_report(days: list[dict[str, Any]], as_json: bool, report: dict[str, Any]) -> None:
    """Print what became of each day; exit 1 unless all were stored."""
    from synth.runs import NOT_RUN_NO_MODEL

    if as_json:
        render.emit_json(report)
    elif report["status"] == NOT_RUN_NO_MODEL:
        click.echo(f"day: {NOT_RUN_NO_MODEL} (--model or WORLDCTL_LLM_MODEL)")
    for day in [] if as_json else days:
        click.echo(_day_line(day))
    if report["status"] != "stored":
        sys.exit(1)


def _day_line(day: dict[str, Any]) -> str:
    where = f"{day.get('persona')}@{day.get('day')}"
    if day.get("stage") == "plan":
        return f"{where}: no plan accepted after {day['attempts']} attempts: " + "; ".join(
            day.get("errors", [])[:3])
    attempts = day.get("attempts") or []
    if day["status"] == "stored":
        if day.get("already"):
            return f"{where}: in the store already"
        refused_layers = [a["problem"].split(":", 1)[0] for a in attempts[:-1]]
        why = f" ({len(refused_layers)} refused: {', '.join(refused_layers)})" \
            if refused_layers else ""
        return (f"{where} {day['world_hash']}: stored after {len(attempts)} attempt"
                f"{'s' * (len(attempts) != 1)}{why}, {attempts[-1]['events']} events")
    problems = "; ".join(f"attempt {a['number']}: {a['problem']}" for a in attempts)
    return f"{where}: not stored after {len(attempts)} attempts: {problems}"


def _stage_report(what: str, report: dict[str, Any], as_json: bool,
                  accepted: Callable[[], str], refused: Callable[[], str]) -> None:
    """Print a persona's or a plan's report; exit 1 unless it was accepted."""
    from synth.runs import NOT_RUN_NO_MODEL

    if as_json:
        render.emit_json(report)
    elif report["status"] == NOT_RUN_NO_MODEL:
        click.echo(f"{what}: {NOT_RUN_NO_MODEL} (--model or WORLDCTL_LLM_MODEL)")
    else:
        click.echo(accepted() if report["status"] == "accepted" else refused())
    if report["status"] != "accepted":
        sys.exit(1)


def _day_from_episode(ctx: click.Context, persona: str, day: int, episode_id: str,
                      as_json: bool) -> None:
    from synth.errors import SynthError
    from synth.worlds.days import day_from_episode, store_day
    from worldenv.instances.episodes import load_episode

    store = worlds(ctx)
    episode = load_episode(store, episode_id)
    if (episode.persona, episode.day + 1) != (persona, day):
        raise SynthError(f"episode {episode_id} starts from {episode.persona}@{episode.day}, "
                         f"so it makes day {episode.day + 1} of {episode.persona}, not day "
                         f"{day} of {persona}")
    made = day_from_episode(store, episode)
    record = store_day(store, made, source=f"<episode {episode_id}>")
    if as_json:
        render.emit_json({"persona": persona, "day": day, "events": made.events,
                          "world_hash": record.world_hash, "episode": episode_id})
    else:
        click.echo(f"{persona}@{day} {record.world_hash}: {made.events} events from episode "
                   f"{episode_id}")


@synth_group.command("status")
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def synth_status_cmd(run_dir: Path, as_json: bool) -> None:
    """Per stage of the run RUN_DIR: done, failed, attempts, tokens, cost (from the stored
    outcomes, so a killed run too)."""
    _require_run(run_dir)
    from synth.runs import status

    found = status(run_dir)
    if as_json:
        render.emit_json(found)
        return
    rows = [[s["stage"], str(s["accepted"] + s["kept_best"]),
             f"{s['accepted']} accepted, {s['kept_best']} kept best", str(s["failed"]),
             str(s["attempts"]), f"{s['tokens']:,}", _usd(s["cost"])]
            for s in found["stages"]]
    click.echo(render.table(["stage", "done", "of which", "failed", "attempts", "tokens",
                             "cost"], rows,
                            title=f"run {run_dir}: model {found['model']}, "
                                  f"{found['commands']} commands, {found['recordings']} "
                                  "recorded calls"))


@synth_group.command("export-awm")
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Write the gen_*.jsonl files here (made if missing; files of the same "
                   "name are replaced).")
@click.option("--scenario", "scenarios", multiple=True, metavar="NAME",
              help="Export only this built scenario (repeatable; default: every one).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def synth_export_awm_cmd(run_dir: Path, out: Path, scenarios: tuple[str, ...],
                         as_json: bool) -> None:
    """Write the environments the run RUN_DIR built as AWM-1K files (gen_scenario, gen_tasks,
    gen_db, gen_sample, gen_envs, gen_verifier): AWM's own `awm env reset_db` and `awm env
    start` load them, and `worldctl import-awm` reads them back. The app is rendered as
    AWM's server code (FastAPI, SQLAlchemy, Pydantic v2); each task the gates accepted
    gets AWM's code-mode and sql-mode verifier. Needs no model."""
    _require_run(run_dir)
    from synth.environments.export import export_run
    from synth.runs import pack_dir, read_config

    report = export_run(run_dir, out, pack_dir(run_dir, read_config(run_dir)) / "tasks",
                        list(scenarios))
    if as_json:
        render.emit_json(report)
        return
    for s in report["scenarios"]:
        verified = ", ".join(str(i + 1) for i in s["verified_tasks"]) or "none"
        click.echo(f"{s['scenario']}: {s['tables']} tables, {s['tasks']} tasks (verifiers "
                   f"for tasks {verified})")
    click.echo(f"wrote {', '.join(report['files'])} to {report['out']}")


@synth_group.command("replay")
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--out", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="Replay into this (new) folder and keep it (default: a temporary one).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def synth_replay_cmd(run_dir: Path, out: Path | None, as_json: bool) -> None:
    """Re-run the run RUN_DIR offline from its recordings into a fresh folder and store,
    and compare every output byte for byte and every world hash. Exit 1 if any differs."""
    _require_run(run_dir)
    from synth.runs import replay_run

    report = replay_run(run_dir, out)
    if as_json:
        render.emit_json(report.as_dict())
    elif report.identical:
        hashes = ", ".join(f"{p}@0 {h}" for p, h in report.world_hashes.items()) or "none"
        click.echo(f"replayed offline: {report.compared} files compared, all identical; "
                   f"world hashes: {hashes}")
    else:
        click.echo(f"replayed offline: {len(report.differences)} of {report.compared} "
                   "files differ:")
        for line in report.differences[:50]:
            click.echo(f"  {line}")
        for line in report.stopped:
            click.echo(f"  the replay stopped at {line}")
    if not report.identical:
        sys.exit(1)
