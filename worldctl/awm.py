"""The AWM commands: ``worldctl import-awm DIR`` and ``worldctl check-awm REF``.

``import-awm`` parses its arguments, makes one call of ``awmbridge.importer.import_awm`` and
renders the report: one block per imported scenario, then one ``error:`` line per refusal
(exit 2). ``check-awm`` makes one call of ``worldenv.instances.checker.check_carried_tools`` (every
tool
of the world's carried code, on three fresh instances) and prints each call whose response
or effects differ (exit 1 if any); a world that carries no code is a refusal (exit 2).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from worldctl import render
from worldctl.main import EXIT_REFUSED
from worldctl.session import worlds

if TYPE_CHECKING:
    from awmbridge.importer import ImportReport, ScenarioReport


@click.command("import-awm")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--scenario", "scenarios", multiple=True, metavar="NAME",
              help="Import only this scenario (repeatable; a scenario or persona name).")
@click.option("--strict", is_flag=True,
              help="Refuse a scenario with any failing statement, and store nothing at all "
                   "if any scenario is refused.")
@click.option("--tasks-out", "tasks_out", default=None, metavar="DIR",
              type=click.Path(file_okay=False, path_type=Path),
              help="Write a task folder per verified task of each scenario under DIR.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def import_awm_cmd(ctx: click.Context, directory: Path, scenarios: tuple[str, ...],
                   strict: bool, tasks_out: Path | None, as_json: bool) -> None:
    """Import AWM environments from DIRECTORY (gen_*.jsonl): one world per scenario.

    Each scenario becomes persona <scenario name> with one service, awm, whose day 0 is
    AWM's DDL, indexes and INSERTs at one frozen instant (and its server code as the app,
    if it has any). Failing statements are dropped and listed (a scenario with 10 % or
    more failing is refused); --strict refuses any. Each refusal is an error line naming
    the file, line and scenario (exit 2); the other scenarios are imported.
    """
    from awmbridge.importer import import_awm

    report = import_awm(worlds(ctx, create=True), directory, scenarios=list(scenarios),
                        strict=strict, tasks_out=tasks_out)
    if as_json:
        render.emit_json(report.as_dict())
    else:
        _render(report)
    for refused in report.refused:
        for problem in refused.problems:
            _error(problem)
    if report.refused:
        sys.exit(EXIT_REFUSED)


def _render(report: ImportReport) -> None:
    for scenario in report.imported:
        _scenario_block(scenario)
    for skipped in report.skipped:
        render.echo(f"skipped {skipped.scenario} ({skipped.origin}): {skipped.reason}")
    if report.not_stored:
        render.echo(f"nothing stored (--strict, a scenario was refused): "
                    f"{', '.join(report.not_stored)} not imported")


def _scenario_block(r: ScenarioReport) -> None:
    render.echo(f"{r.scenario}: {r.status}")
    render.echo(f"  persona     {r.persona}")
    render.echo(f"  world hash  {r.world_hash}")
    render.echo(f"  tables      {len(r.tables)}: {', '.join(r.tables)}")
    render.echo(f"  rows        {sum(r.rows.values())}: "
                + ", ".join(f"{name} {count}" for name, count in r.rows.items()))
    render.echo(f"  dropped     {len(r.dropped)} of {r.statements} statements")
    for dropped in r.dropped:
        render.echo(f"    {dropped}")
    render.echo(f"  tools       {r.tools}" + ("" if r.tools else " (no server code)"))
    if r.tasks is None:
        render.echo("  tasks       not written (no --tasks-out)")
    else:
        render.echo(f"  tasks       {len(r.tasks)} written"
                    + (f" under {r.tasks[0].parent}" if r.tasks else ""))
    if r.unverified:
        render.echo(f"  unverified  {len(r.unverified)} task(s) without a verifier, no folder "
                    f"(nothing could grade them): {', '.join(map(str, r.unverified))}")


def _error(message: str) -> None:
    """One refusal: one line on stderr, as the CLI's error boundary writes them."""
    one_line = " ".join(line.strip() for line in message.splitlines() if line.strip())
    click.echo(f"error: {one_line}", err=True)


@click.command("check-awm")
@click.argument("ref")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def check_awm_cmd(ctx: click.Context, ref: str, as_json: bool) -> None:
    """Call every tool of REF's generated code on fresh instances; name those that differ.

    REF is a world whose code is carried in its log (an imported AWM scenario). Each tool
    of its carried apps is called once, in name order, with arguments from the tool's
    schema, on three instances: two in fresh sandboxed workers, one in the first one's
    worker after it. Each call whose response or effects differ is listed (exit 1).
    """
    from worldenv.instances.checker import check_carried_tools

    store = worlds(ctx)
    store.record(ref)  # an unknown REF is refused before any worker starts
    try:
        report = check_carried_tools(store, ref)
    except ValueError as exc:
        _error(str(exc))
        sys.exit(EXIT_REFUSED)
    if as_json:
        render.emit_json({"ref": ref, "ok": report.ok, "calls": report.calls,
                          "final_hash": report.final_hash, "problems": report.problems})
    else:
        render.echo(f"{ref}: {report.calls} tool(s), each called once on 3 instances")
        if report.ok:
            render.echo(f"  deterministic (final world hash {report.final_hash})")
        for problem in report.problems:
            render.echo(f"  {problem}")
    if not report.ok:
        sys.exit(1)
