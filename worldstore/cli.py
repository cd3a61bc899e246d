"""worldctl: the command line. Each command opens the store, makes one library call and
renders the result; library errors become one clear line on stderr and exit status 2."""

from __future__ import annotations

import functools
import os
import sys
import tempfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import click
import msgspec
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from replay.diff import WorldDiff
from replay.engine import DayResult, VerifyReport, Worlds
from replay.hashing import world_manifest
from worldstore.errors import WorldError
from worldstore.open import DEFAULT_STORE

F = TypeVar("F", bound=Callable[..., Any])
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)  # never break a path


def _fail_cleanly(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except WorldError as exc:
            err.print(f"[red]error:[/red] {exc}", markup=True, highlight=False)
            sys.exit(2)
    return wrapper  # type: ignore[return-value]


def _worlds(ctx: click.Context, *, create: bool = False) -> Worlds:
    """The store named by --store; only commands that write may create it."""
    obj = ctx.ensure_object(dict)
    if "worlds" not in obj:
        obj["worlds"] = Worlds.open(obj["store"], obj["cache"], create=create)
        ctx.call_on_close(obj["worlds"].close)
    worlds: Worlds = obj["worlds"]
    return worlds


def _json(data: Any) -> None:
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(data), indent=2).decode() + "\n")


def _progress(label: str, total: int | None) -> Progress:
    return Progress(TextColumn(label), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                    TimeElapsedColumn(), console=err, transient=True,
                    disable=not err.is_terminal)


@click.group()
@click.option("--store", envvar="WORLDCTL_STORE", default=DEFAULT_STORE, show_default=True,
              help="Store directory (embedded SQLite) or postgresql:// URL.")
@click.option("--cache", envvar="WORLDCTL_CACHE", default=None,
              help="Snapshot cache directory (default: <store>/cache, or ./.worldctl-cache "
                   "for a PostgreSQL store).")
@click.version_option(package_name="agent-worlds")
@click.pass_context
def cli(ctx: click.Context, store: str, cache: str | None) -> None:
    """Build, store, replay, verify and inspect persona worlds."""
    ctx.ensure_object(dict).update(store=store, cache=cache)


@cli.command("import")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False,
                                                                    path_type=Path))
@click.pass_context
@_fail_cleanly
def import_cmd(ctx: click.Context, files: tuple[Path, ...]) -> None:
    """Append the persona-days of interchange FILES (JSON Lines).

    Each file is validated as a whole first; a file with a bad line or a day that fails
    to apply stores nothing. Days already stored with identical events are skipped.
    """
    worlds = _worlds(ctx, create=True)
    for path in files:
        with _progress(f"import {path.name}", None) as bar:
            task = bar.add_task("days", total=None)
            results = worlds.import_file(path, progress=functools.partial(_advance, bar, task))
        _day_table(f"{path}", results, show_recorded=False)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
@_fail_cleanly
def personas(ctx: click.Context, as_json: bool) -> None:
    """Personas with their number of days and latest world hash."""
    rows = _worlds(ctx).store.personas()
    if as_json:
        _json([msgspec.structs.asdict(r) for r in rows])
        return
    table = Table("persona", "days", "last day", "events", "last ts", "latest world hash")
    for r in rows:
        table.add_row(r.persona, str(r.n_days), str(r.last_day), str(r.last_seq + 1),
                      r.last_ts, r.world_hash)
    out.print(table)


@cli.command()
@click.argument("persona")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@_fail_cleanly
def replay(ctx: click.Context, persona: str, as_json: bool) -> None:
    """Re-apply PERSONA's whole log from nothing; show each day's hash and time.

    Exits 1 if any day's hash differs from the recorded one.
    """
    worlds = _worlds(ctx)
    n_days = len(worlds.store.days(persona))
    with _progress(f"replay {persona}", n_days) as bar:
        task = bar.add_task("days", total=n_days)
        results = worlds.replay(persona, progress=lambda _r: bar.advance(task))
    if as_json:
        _json([_result_dict(r) for r in results])
    else:
        _day_table(f"replay {persona}", results, show_recorded=True)
    if any(r.status == "mismatch" for r in results):
        sys.exit(1)


@cli.command()
@click.argument("personas", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Verify every persona (the default).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@_fail_cleanly
def verify(ctx: click.Context, personas: tuple[str, ...], all_: bool, as_json: bool) -> None:
    """Re-derive every day from the log and check chain, blobs, hashes and cache.

    Exits 1 and names the first divergent persona, day, event and table or file on any
    mismatch.
    """
    worlds = _worlds(ctx)
    names = [] if all_ else list(personas)
    total = sum(len(worlds.store.days(p)) for p in names) if names else sum(
        s.n_days for s in worlds.store.personas())
    with _progress("verify", total) as bar:
        task = bar.add_task("days", total=total)
        report = worlds.verify(names or None, progress=lambda _r: bar.advance(task))
    if as_json:
        _json({"ok": report.ok, "personas": report.personas, "days": report.days,
               "events": report.events, "cache_entries": report.cache_entries,
               "problems": [p.as_dict() for p in report.problems]})
    else:
        _print_report(report)
    if not report.ok:
        sys.exit(1)


@cli.command()
@click.argument("ref")
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
@click.pass_context
@_fail_cleanly
def checkout(ctx: click.Context, ref: str, dest: Path) -> None:
    """Write the world REF (persona@day, persona, or a world hash) into DEST."""
    record = _worlds(ctx).checkout(ref, dest)
    out.print(f"{record.persona}@{record.day} -> {dest}  (world hash {record.world_hash})")
    out.print(f"  open with: sqlite3 {dest}/services/<service>.sqlite ; files in "
              f"{dest}/workspace/")


@cli.command("hash")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True)
@_fail_cleanly
def hash_cmd(directory: Path, as_json: bool) -> None:
    """Print the world hash of a checked-out DIRECTORY (last line of output)."""
    manifest = world_manifest(directory)
    if as_json:
        _json({"world_hash": manifest.world_hash(), "manifest": manifest})
        return
    for name, svc in manifest.services.items():
        rows = sum(t.rows for t in svc.tables.values())
        out.print(f"service {name}: {len(svc.tables)} tables, {rows} rows")
    out.print(f"workspace: {len(manifest.files)} files")
    out.print(manifest.world_hash())


@cli.command()
@click.argument("ref_a")
@click.argument("ref_b")
@click.option("--json", "as_json", is_flag=True)
@click.option("--max-rows", default=20, show_default=True,
              help="Rows shown per table in plain output.")
@click.pass_context
@_fail_cleanly
def diff(ctx: click.Context, ref_a: str, ref_b: str, as_json: bool, max_rows: int) -> None:
    """Row-level and file-level changes from world REF_A to world REF_B."""
    result = _worlds(ctx).diff(ref_a, ref_b)
    if as_json:
        _json(result)
    else:
        _print_diff(result, max_rows)


@cli.command()
@click.argument("persona")
@click.option("--through-day", type=int, default=None, help="Stop after this day.")
@click.pass_context
@_fail_cleanly
def export(ctx: click.Context, persona: str, through_day: int | None) -> None:
    """Write PERSONA's log as interchange JSON Lines to stdout."""
    _worlds(ctx).export(persona, sys.stdout.buffer, through_day=through_day)
    sys.stdout.flush()


@cli.group()
def episode() -> None:
    """Stored agent episodes: show, replay and verify them."""


@episode.command("show")
@click.argument("episode_id")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
@_fail_cleanly
def episode_show(ctx: click.Context, episode_id: str, as_json: bool) -> None:
    """The calls of episode EPISODE_ID (tool or command, error flag, response) and the
    number of effects each had."""
    from envs.episode import DbChange, FileChange, ToolCall
    from envs.episodes_store import decode_episode

    record = _worlds(ctx).store.episode(episode_id)
    ep = decode_episode(record)
    n_db = sum(isinstance(e, DbChange) for e in ep.events)
    n_files = sum(isinstance(e, FileChange) for e in ep.events)
    if as_json:
        _json({"episode_id": ep.episode_id, "persona": ep.persona, "day": ep.day,
               "world_hash": ep.world_hash, "final_hash": record.final_hash,
               "n_calls": len(ep.calls), "effects": {"db_change": n_db, "file_change": n_files},
               "events": ep.events})
        return
    effects: dict[int, list[str]] = {}
    for e in ep.events:
        if isinstance(e, DbChange | FileChange):
            effects.setdefault(e.index, []).append(
                f"db {e.service}" if isinstance(e, DbChange) else f"file {e.path}")
    table = Table("#", "ts", "call", "error", "effects", "response",
                  title=f"episode {ep.episode_id}")
    n_errors = 0
    for c in ep.calls:
        if isinstance(c, ToolCall):
            call, failed, response = c.tool, c.is_error, c.text
        else:
            call = f"$ {c.command}"
            failed = c.timed_out or c.exit_code != 0
            response = c.stdout or c.stderr
        n_errors += failed
        table.add_row(str(c.index), c.ts, Text(_clip(call, 40)), "ERROR" if failed else "",
                      Text(", ".join(effects.get(c.index, []))), Text(_clip(response, 60)))
    out.print(f"{ep.persona}@{ep.day}  {ep.world_hash} -> {record.final_hash or '(none)'}",
              markup=False)
    out.print(table)
    out.print(f"{len(ep.calls)} calls, {n_errors} errors; effects: {n_db} db changes, "
              f"{n_files} file changes")


@episode.command("replay")
@click.argument("episode_id")
@click.pass_context
@_fail_cleanly
def episode_replay(ctx: click.Context, episode_id: str) -> None:
    """Apply the effects of EPISODE_ID to a fresh mount of its snapshot; print the world
    hash. Exits 1 if it differs from the recorded final hash."""
    from envs.episodes_store import decode_episode, replay_episode

    worlds = _worlds(ctx)
    record = worlds.store.episode(episode_id)
    ep = decode_episode(record)
    replayed = replay_episode(worlds, ep)
    out.print(replayed)
    recorded = {record.final_hash, ep.final_hash}
    if recorded != {replayed}:
        err.print(f"[red]MISMATCH[/red]: episode {escape(episode_id)} replays to {replayed}, "
                  f"the recorded final hash is {record.final_hash} (in its body: "
                  f"{ep.final_hash})", markup=True, highlight=False)
        sys.exit(1)


@episode.command("verify")
@click.argument("episode_ids", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Verify every episode (the default).")
@click.pass_context
@_fail_cleanly
def episode_verify(ctx: click.Context, episode_ids: tuple[str, ...], all_: bool) -> None:
    """Replay stored episodes and check each against its recorded final hash.

    Exits 1 and names each episode that fails.
    """
    from envs.episodes_store import verify_episode

    worlds = _worlds(ctx)
    ids = list(episode_ids) if episode_ids and not all_ else [
        r.episode_id for r in worlds.store.episodes()]
    failed = 0
    for episode_id in ids:
        ok, message = verify_episode(worlds, episode_id)
        failed += not ok
        out.print(f"{'[green]ok[/green]' if ok else '[red]FAILED[/red]'} {escape(message)}",
                  markup=True, highlight=False)
    summary = f"{len(ids)} episodes checked"
    if failed:
        out.print(f"[red]episode verify FAILED[/red]: {summary}; {failed} failed", markup=True)
        sys.exit(1)
    out.print(f"[green]episode verify OK[/green]: {summary}", markup=True)


@cli.command()
@click.option("--day", default=5, show_default=True, help="Day to check out and diff.")
@click.option("--checkout-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where to check the day out (default: a temporary directory).")
@click.pass_context
@_fail_cleanly
def demo(ctx: click.Context, day: int, checkout_dir: Path | None) -> None:
    """The main job on the bundled demo world: import, replay, verify, checkout, diff; an
    instance and a recorded episode; one task through the quality gates."""
    worlds = _worlds(ctx, create=True)
    source = resources.files("worldstore") / "data" / "demo" / "lars.jsonl"
    with resources.as_file(source) as demo_file:
        _step(f"worldctl import {demo_file}")
        _day_table("import", worlds.import_file(demo_file), show_recorded=False)
    _step("worldctl personas")
    ctx.invoke(personas, as_json=False)
    _step("worldctl replay lars")
    results = worlds.replay("lars")
    _day_table("replay lars", results, show_recorded=True)
    _step("worldctl verify --all")
    report = worlds.verify()
    _print_report(report)
    target = checkout_dir or Path(tempfile.mkdtemp(prefix="lars-day")) / f"lars{day}"
    _step(f"worldctl checkout lars@{day} {target}")
    record = worlds.checkout(f"lars@{day}", target)
    out.print(f"checked out lars@{day} -> {target}")
    _step(f"worldctl hash {target}")
    out.print(f"{world_manifest(target).world_hash()}  (recorded: {record.world_hash})")
    _step(f"worldctl diff lars@{day - 1} lars@{day}")
    _print_diff(worlds.diff(f"lars@{day - 1}", f"lars@{day}"), 8)
    episode_ok = _demo_episode(ctx, worlds)
    task_ok = _demo_task(worlds) if episode_ok else False
    if not report.ok or any(r.status != "replayed" for r in results) or not episode_ok \
            or not task_ok:
        sys.exit(1)


def _demo_task(worlds: Worlds) -> bool:
    """The grading half of the demo: one shipped task through the five gates."""
    from envs.instance import Environment
    from gates.gates import GateRun, check_task, render_report
    from gates.judging import judges_from_env
    from gates.rollout import scripted_rollouts
    from gates.task import load_task

    source = resources.files("gates") / "data" / "tasks" / "mats-work-order"
    with resources.as_file(source) as folder, Environment(worlds) as env:
        _step(f"worldctl task check {folder}   (six scripted rollouts; the judges' gates "
              "need a model: WORLDCTL_LLM_MODEL)")
        task = load_task(folder)
        report = check_task(GateRun(env=env, rollouts=lambda t: scripted_rollouts(env, t),
                                    judges=judges_from_env(worlds)), task)
    out.print(render_report(report), markup=False)
    return report.accepted


def _demo_episode(ctx: click.Context, worlds: Worlds) -> bool:
    """The environment half of the demo: an instance, an MCP + shell episode, its diff,
    and its verification by replay."""
    try:
        from envs.demo import run_demo_episode
    except ImportError as exc:
        out.print(f"\nskipped the episode demo: the environment extra is not installed "
                  f"({exc}); pip install -e '.[envs]'", markup=False)
        return True
    _step("python: Environment(worlds).open('lars@7') + MCP client + shell (envs/demo.py)")
    result = run_demo_episode(worlds)
    for line in result.lines:
        out.print(f"  {line}", markup=False)
    if result.shell_skipped:
        out.print(f"  NOTE: {result.shell_skipped}", markup=False)
    _step(f"worldctl episode show {result.episode_id}")
    ctx.invoke(episode_show, episode_id=result.episode_id, as_json=False)
    out.print("diff of the instance against its snapshot:")
    _print_diff(result.diff, 6)
    _step(f"worldctl episode verify {result.episode_id}")
    out.print("episode verify OK" if result.replayed_ok else "episode verify FAILED")
    return result.replayed_ok


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; beyond loopback a token is required.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535))
@click.option("--token", envvar="WORLDCTL_TOKEN", default=None,
              help="Bearer token every request must carry (env WORLDCTL_TOKEN).")
@click.option("--max-instances", default=256, show_default=True, type=click.IntRange(min=1))
@click.option("--idle-timeout", default=600.0, show_default=True,
              type=click.FloatRange(min=0, min_open=True),
              help="Seconds without a request after which an instance is closed.")
@click.option("--call-timeout", default=30.0, show_default=True,
              type=click.FloatRange(min=0, min_open=True),
              help="Seconds a tool call may take before the agent gets a timeout error.")
@click.option("--mode", type=click.Choice(["tools", "meta"]), default="tools",
              show_default=True, help="MCP surface of new instances: every tool, or "
                                      "list_tools/call_tool.")
@click.pass_context
@_fail_cleanly
def serve(ctx: click.Context, host: str, port: int, token: str | None, max_instances: int,
          idle_timeout: float, call_timeout: float, mode: str) -> None:
    """Serve instances of the stored worlds to agents: REST at /instances, MCP
    (streamable HTTP) at /instances/<id>/mcp."""
    try:
        from envs.gateway import check_bind
        from envs.gateway import serve as run_gateway
        from envs.instance import Environment
    except ImportError as exc:
        err.print(f"[red]error:[/red] worldctl serve needs the envs extra "
                  f"(pip install 'agent-worlds[envs]'): {exc}", markup=True)
        sys.exit(2)
    check_bind(host, token)
    run_gateway(Environment(_worlds(ctx)), host=host, port=port, token=token,
                max_instances=max_instances, idle_timeout=idle_timeout,
                call_timeout=call_timeout, mode=mode)


# --- rendering ------------------------------------------------------------------------


def _advance(bar: Progress, task: TaskID, _result: DayResult) -> None:
    bar.advance(task)


def _step(command: str) -> None:
    out.print(f"\n[bold cyan]$ {command}[/bold cyan]", markup=True)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _result_dict(r: DayResult) -> dict[str, Any]:
    return {"persona": r.persona, "day": r.day, "events": r.n_events,
            "world_hash": r.world_hash, "recorded_hash": r.recorded_hash,
            "seconds": round(r.seconds, 6), "status": r.status}


def _day_table(title: str, results: list[DayResult], *, show_recorded: bool) -> None:
    table = Table("persona", "day", "events", "world hash", "time (ms)", "status", title=title)
    for r in results:
        status = r.status
        if show_recorded and r.status == "mismatch":
            status = f"[red]MISMATCH (recorded {r.recorded_hash})[/red]"
        table.add_row(r.persona, str(r.day), str(r.n_events), r.world_hash,
                      f"{r.seconds * 1000:.1f}", status)
    out.print(table)


def _print_report(report: VerifyReport) -> None:
    summary = (f"{report.personas} personas, {report.days} days, {report.events} events, "
               f"{report.cache_entries} cached snapshots checked")
    if report.ok:
        out.print(f"[green]verify OK[/green]: {summary}", markup=True)
        return
    out.print(f"[red]verify FAILED[/red]: {summary}; {len(report.problems)} problems",
              markup=True)
    for p in report.problems:
        out.print(f"  [{p.kind}] {p.message}", markup=False)


def _print_diff(d: WorldDiff, max_rows: int) -> None:
    out.print(f"{d.before} -> {d.after}")
    if d.empty:
        out.print("no changes")
    for s in d.services_added:
        out.print(f"+ service {s}")
    for s in d.services_removed:
        out.print(f"- service {s}")
    for t in d.tables:
        out.print(f"table {t.service}.{t.table} ({t.change}): +{t.added} -{t.removed} "
                  f"~{t.changed}", markup=False)
        for row in t.rows[:max_rows]:
            mark = {"added": "+", "removed": "-", "changed": "~"}[row.change]
            if row.change == "changed" and row.before is not None and row.after is not None:
                cols = ", ".join(f"{c}: {_short(row.before.get(c))} -> "
                                 f"{_short(row.after.get(c))}" for c in row.columns or [])
                out.print(f"  {mark} {row.key}  {cols}", markup=False)
            else:
                shown = row.after if row.change == "added" else row.before
                cells = ", ".join(f"{k}={_short(v, 40)}" for k, v in (shown or {}).items())
                out.print(f"  {mark} {cells}", markup=False)
        hidden = len(t.rows) - max_rows + (1 if t.truncated else 0)
        if hidden > 0:
            out.print("  ... more rows (use --json or --max-rows)")
    for f in d.files:
        sizes = f"{f.size_before if f.size_before is not None else '-'} -> " \
                f"{f.size_after if f.size_after is not None else '-'} bytes"
        out.print(f"file {f.path} ({f.change}, {sizes})", markup=False)
        for line in f.text_diff or []:
            out.print(f"    {line}", markup=False)


def _register_grading() -> None:
    from gates.cli import register

    register(cli)


_register_grading()


def main() -> None:
    os.environ.setdefault("COLUMNS", "200")
    cli(prog_name="worldctl")


if __name__ == "__main__":
    main()
