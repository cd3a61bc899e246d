"""The synthesis commands: ``validate-day`` (the library is ``synth.validate_day``)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

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
    from envs.instance import Environment
    from synth.reviewer import reviewer_from_env
    from synth.validate_day import render_day_report, validate_day

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
