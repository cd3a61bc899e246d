"""``worldctl demo``: the main job on the demo pack, printed as the real commands print it.

Each step names the command it stands for and renders its result with that command's
renderer (``worldctl.render``), so what the demo shows is what the command shows. The
data are the demo pack's (``packs/demo``): its world log, its scripted episode and one of
its tasks. The demo writes the store named by ``--store`` (it says where, first) and
removes the temporary directories it makes.

A step that needs what this machine lacks (bubblewrap for the shell and the task's
rollouts, Chromium for the browser) is skipped, not failed: the demo runs every other
step, ends by naming what it skipped and the one command that installs the rest, and
exits 0 if every step it ran passed.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import click

from worldctl import render
from worldctl.session import session, worlds
from worldstore.open import is_database_url

TASK = "mats-work-order"
EPISODE = "demo"
PERSONA = "lars"
# What the skipped steps need, as Debian and Ubuntu name the packages: bubblewrap, and
# util-linux for prlimit and setpriv (the sandbox's tools); Chromium for the browser.
SANDBOX_PACKAGES = ("bubblewrap", "util-linux")
BROWSER_PACKAGES = ("chromium",)


@click.command()
@click.option("--day", default=5, show_default=True, type=click.IntRange(min=1),
              help="Day to check out and diff against the day before.")
@click.option("--checkout-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where to check the day out (default: a temporary directory, removed "
                   "at the end).")
@click.pass_context
def demo(ctx: click.Context, day: int, checkout_dir: Path | None) -> None:
    """The main job on the bundled demo world.

    Import the demo pack's log, replay, verify, check out a day, hash and diff it; open an
    instance, play the pack's scripted episode through MCP, the shell and the browser, show
    it and verify it by replay; put one task through the quality gates. Steps that need
    bubblewrap or Chromium are skipped where they are missing, and the end says which and
    how to install them. Exit 1 if a step fails.
    """
    from packs.registry import load_pack
    from worldstore.folders import refuse_unless_new

    if checkout_dir is not None:  # as checkout: a link (even a dangling one) is refused
        refuse_unless_new(checkout_dir, "--checkout-dir")
    pack = load_pack("demo")
    _check_day(pack.worlds, day)  # before the store is opened: a refusal writes nothing
    store = worlds(ctx, create=True)
    where = session(ctx).store
    shown = store.store.url if is_database_url(where) else Path(where).resolve()
    render.echo(f"The demo writes its store to {shown} (snapshots in "
                f"{store.cache.root.resolve()}); choose another with --store.")
    with tempfile.TemporaryDirectory(prefix="worldctl-demo-") as scratch:
        target = checkout_dir or Path(scratch) / f"lars{day}"
        skipped: list[tuple[str, tuple[str, ...]]] = []  # (what, the packages it needs)
        ok = _store_steps(ctx, pack.worlds, day, target)
        ok = _episode_steps(ctx, pack.episode(EPISODE), skipped) and ok
        ok = ok and _task_steps(ctx, pack.task_dir(TASK), skipped)
    if checkout_dir is None:
        render.echo(f"\n(removed the temporary checkout {target})")
    if skipped:
        render.echo("\nskipped, for want of what this machine lacks:")
        for what, _ in skipped:
            render.echo(f"  - {what}")
        packages = dict.fromkeys(name for _, needs in skipped for name in needs)
        render.echo("to run every step, install them and run the demo again: "
                    f"apt-get install {' '.join(packages)}")
    if not ok:
        sys.exit(1)


def _check_day(logs: tuple[Path, ...], day: int) -> None:
    """Refuse a --day the demo persona's log does not have (a diff needs the day before)."""
    from worldstore.interchange import read_days

    days: set[int] = set()
    for log in logs:
        with open(log, "rb") as fh:
            days.update(b.day for b in read_days(fh, source=str(log)) if b.persona == PERSONA)
    if day not in days or day - 1 not in days:
        first, last = min(days) + 1, max(days)
        raise click.BadParameter(f"{day}: the demo diffs {PERSONA}@DAY against the day before, "
                                 f"so DAY is between {first} and {last}", param_hint="'--day'")


def _store_steps(ctx: click.Context, logs: tuple[Path, ...], day: int, target: Path) -> bool:
    """import, personas, replay, verify, checkout, hash, diff — as the commands print them."""
    from replay.hashing import world_manifest

    store = worlds(ctx)
    for log in logs:
        render.step(f"worldctl import {log}")
        render.day_results(f"{log}", store.import_file(log), show_recorded=False)
    render.step("worldctl personas")
    render.personas(store.store.personas())
    render.step("worldctl replay lars")
    results = store.replay("lars")
    render.day_results("replay lars", results, show_recorded=True)
    render.step("worldctl verify --all")
    report = store.verify()
    render.verify_report(report)
    render.step(f"worldctl checkout lars@{day} {target}")
    record = store.checkout(f"lars@{day}", target)
    render.checkout(record, target)
    render.step(f"worldctl hash {target}")
    manifest = world_manifest(target)
    render.manifest(manifest)
    same = manifest.world_hash() == record.world_hash
    render.echo(f"# {'equals' if same else 'DIFFERS FROM'} the recorded hash of "
                f"lars@{day}: {record.world_hash}")
    render.step(f"worldctl diff lars@{day - 1} lars@{day} --max-rows 8")
    render.diff(store.diff(f"lars@{day - 1}", f"lars@{day}"), 8)
    return report.ok and same and all(r.status == "replayed" for r in results)


def _episode_steps(ctx: click.Context, script: Path,
                   skipped: list[tuple[str, tuple[str, ...]]]) -> bool:
    """An instance, the pack's scripted episode through MCP and the shell, the episode as
    `episode show` prints it, the instance's diff, and `episode verify`. Shell and browser
    steps that cannot run here are added to `skipped`."""
    try:
        from worldenv.serving.script import run_scripted_episode
    except ModuleNotFoundError as exc:
        render.echo(f"\nskipped the episode demo: {exc.name} is not installed: "
                    "pip install 'agent-worlds[envs]'")
        return True
    from worldenv.instances.episodes import summarize_episode

    store = worlds(ctx)
    render.step("python: worldenv.serving.script.run_scripted_episode("
                f"worlds, {script})   (an instance, "
                "an in-memory MCP client, the sandboxed shell and browser)")
    played = run_scripted_episode(store, script)
    for line in played.lines[:-1]:
        render.echo(f"  {line}")
    for note, what, needs in (
            (played.shell_skipped, "the episode's shell steps (needs bubblewrap)",
             SANDBOX_PACKAGES),
            (played.gui_skipped, "the episode's browser steps (needs Chromium)",
             BROWSER_PACKAGES)):
        if note:
            render.echo(f"  NOTE: {note}")
            skipped.append((what, needs))
    render.step(f"worldctl episode show {played.episode_id}")
    render.episode(summarize_episode(store.store.episode(played.episode_id)))
    render.echo("diff of the instance against its snapshot:")
    render.diff(played.diff, 6)
    render.step(f"worldctl episode verify {played.episode_id}")
    render.episode_check(played.replayed_ok, played.lines[-1])
    render.episode_verify_summary(1, 0 if played.replayed_ok else 1)
    return played.replayed_ok


def _task_steps(ctx: click.Context, folder: Path,
                skipped: list[tuple[str, tuple[str, ...]]]) -> bool:
    """One task of the pack through the five gates on the six default scripted rollouts;
    skipped (and added to `skipped`) without a sandbox, which its shell steps and its
    verifier need."""
    from gates.judges import judges_from_env
    from gates.quality import GateRun, check_task, render_report
    from gates.rollout import rollout_source
    from gates.task import load_task
    from worldenv.errors import SandboxError
    from worldenv.instances.instance import Environment
    from worldenv.sandbox.choice import default_sandbox

    store = worlds(ctx)
    render.step(f"worldctl task check {folder}   (six scripted rollouts; the judges' gates "
                "need a model: WORLDCTL_LLM_MODEL)")
    try:
        default_sandbox()
    except SandboxError as exc:
        render.echo(f"  SKIPPED: {exc}")
        skipped.append(("worldctl task check (its rollouts and verifier run in the sandbox: "
                        "needs bubblewrap)", SANDBOX_PACKAGES))
        return True
    with Environment(store) as env:
        report = check_task(GateRun(env=env, rollouts=rollout_source(env),
                                    judges=judges_from_env(store)), load_task(folder))
    render.echo(render_report(report))
    return report.accepted
