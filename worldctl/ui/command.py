"""The ``worldctl ui`` command: what it is given, its refusals, and the server it runs."""

from __future__ import annotations

from pathlib import Path

import click

from worldstore.errors import ConfigError

DEFAULT_PORT = 8790


@click.command("ui")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (beyond loopback only with --token).")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(1, 65535))
@click.option("--token", default=None, envvar="WORLDCTL_UI_TOKEN",
              help="Bearer token every request needs (env WORLDCTL_UI_TOKEN); required "
                   "beyond loopback.")
@click.option("--tasks", "task_sources", multiple=True, metavar="DIR|PACK",
              help="Tasks to show: a task folder, a folder of task folders, or a pack name "
                   "(repeatable, as for serve); default: every shipped and installed pack's.")
@click.option("--reports", "report_dirs", multiple=True, metavar="DIR",
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A folder of gate reports (JSON of `worldctl task check --report`), "
                   "itself and its subfolders; each task shows its latest (repeatable).")
@click.option("--runs", "run_dirs", multiple=True, metavar="DIR",
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="An eval run folder or a folder of them (repeatable; default: ./runs "
                   "when it exists).")
@click.pass_context
def ui_cmd(ctx: click.Context, host: str, port: int, token: str | None,
           task_sources: tuple[str, ...], report_dirs: tuple[Path, ...],
           run_dirs: tuple[Path, ...]) -> None:
    """A read-only web view of the store: worlds, days, tables, files, diffs, episodes.

    For people debugging worlds: personas and their days with hashes, a day's tables (rows
    paged and searchable) and workspace files (text, images), the diff of two days or of a
    day and a checkout, stored episodes as timelines, tasks with their artifacts and
    latest gate report, eval runs with their metrics and reports."""
    try:
        import uvicorn
    except ImportError:
        raise click.ClickException("worldctl ui needs uvicorn: pip install "
                                   "'agent-worlds[envs]'") from None
    from worldctl.envs import check_port_free
    from worldctl.session import installed_packs, worlds
    from worldctl.ui.app import WorldsUI
    from worldctl.ui.sources import synth_records, task_index
    from worldenv.serving.gateway import is_loopback

    if not is_loopback(host) and not (token and token.strip()):
        raise ConfigError(f"refusing to serve the UI on {host!r} without a token: anyone who "
                          "can reach it could read every world; set one (--token or "
                          "WORLDCTL_UI_TOKEN) or bind to 127.0.0.1")
    tasks = task_index(task_sources, installed_packs(ctx))
    reports = [*report_dirs, *synth_records(tasks.values())]
    runs = list(run_dirs) or [p for p in [Path("runs")] if p.is_dir()]
    check_port_free(host, port)
    app = WorldsUI(worlds(ctx), token=token, tasks=tasks, reports=reports, runs=runs)
    click.echo(f"worldctl ui: http://{host}:{port}/" + ("?token=..." if token else "")
               + f" ({len(tasks)} tasks, {len(reports)} report folders, {len(runs)} run "
                 "folders)")
    config = uvicorn.Config(app, host=host, port=port, lifespan="on", log_level="warning")
    uvicorn.Server(config).run()


__all__ = ["DEFAULT_PORT", "ui_cmd"]
