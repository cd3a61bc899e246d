"""The store's commands: import, personas, replay, verify, checkout, hash, diff, export.

Each parses its arguments, makes one call of ``replay.engine.Worlds`` (or of
``replay.hashing`` for a directory) and renders the result with ``worldctl.render``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from worldctl import render
from worldctl.session import event_store, worlds


@click.command("import")
@click.argument("files", nargs=-1, required=True,
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.pass_context
def import_cmd(ctx: click.Context, files: tuple[Path, ...]) -> None:
    """Append the persona-days of interchange FILES (JSON Lines).

    Every line of every file is validated first: a bad line in any file stores nothing
    of any file. Then each file is imported as a whole (a day that fails to apply stores
    nothing of its file, and the refusal names the files already imported). Days already
    stored with identical events are skipped.
    """
    from worldstore.errors import WorldError
    from worldstore.interchange import read_days

    for path in files:  # before the store is opened: a refusal writes nothing
        with open(path, "rb") as fh:
            read_days(fh, source=str(path))
    store = worlds(ctx, create=True)
    done: list[str] = []
    for path in files:
        try:
            with render.progress(f"import {path.name}", None) as bar:
                results = store.import_file(path, progress=bar.advance, planned=bar.total)
        except WorldError as exc:
            if not done:
                raise
            raise WorldError(f"{exc} (nothing of {path} was imported; already imported: "
                            f"{', '.join(done)})") from None
        render.day_results(f"{path}", results, show_recorded=False)
        done.append(str(path))


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def personas(ctx: click.Context, as_json: bool) -> None:
    """Personas with their days, events and latest world hash."""
    rows = event_store(ctx).personas()
    if as_json:
        render.emit_json(render.persona_rows(rows))
    else:
        render.personas(rows)


@click.command()
@click.argument("persona")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def replay(ctx: click.Context, persona: str, as_json: bool) -> None:
    """Re-apply PERSONA's whole log from nothing; show each day's hash and time.

    Exits 1 if any day's hash differs from the recorded one.
    """
    store = worlds(ctx)
    n_days = len(store.store.days(persona))
    with render.progress(f"replay {persona}", n_days) as bar:
        results = store.replay(persona, progress=bar.advance)
    if as_json:
        render.emit_json([render.day_result_dict(r) for r in results])
    else:
        render.day_results(f"replay {persona}", results, show_recorded=True)
    if any(r.status == "mismatch" for r in results):
        sys.exit(1)


@click.command()
@click.argument("names", nargs=-1, metavar="[PERSONA]...")
@click.option("--all", "all_", is_flag=True, help="Verify every persona (the default).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def verify(ctx: click.Context, names: tuple[str, ...], all_: bool, as_json: bool) -> None:
    """Re-derive every day from the log and check chain, blobs, hashes and cache.

    Exits 1 and names the first divergent persona, day, event and table or file on any
    mismatch; an unknown PERSONA is refused (exit 2).
    """
    store = worlds(ctx)
    chosen = [] if all_ else list(names)
    summaries = store.store.personas()
    total = sum(s.n_days for s in summaries if not chosen or s.persona in chosen)
    with render.progress("verify", total) as bar:
        report = store.verify(chosen or None, progress=bar.advance)
    if as_json:
        render.emit_json(render.verify_dict(report))
    else:
        render.verify_report(report)
    if not report.ok:
        sys.exit(1)


@click.command()
@click.argument("ref")
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
@click.pass_context
def checkout(ctx: click.Context, ref: str, dest: Path) -> None:
    """Write the world REF into DEST as plain SQLite and workspace files.

    REF is persona@day, persona (its last day), persona@-N (counting from the end) or a
    world hash.
    """
    from worldstore.folders import refuse_unless_new

    refuse_unless_new(dest, "checkout target")  # a link (even a dangling one) is refused
    render.checkout(worlds(ctx).checkout(ref, dest), dest)


@click.command("hash")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def hash_cmd(directory: Path, as_json: bool) -> None:
    """Print the world hash of a checked-out DIRECTORY (last line of output)."""
    from replay.hashing import world_manifest

    manifest = world_manifest(directory)
    if as_json:
        render.emit_json({"world_hash": manifest.world_hash(), "manifest": manifest})
    else:
        render.manifest(manifest)


def world_side(argument: str) -> str | Path:
    """A diff side: an existing directory is a world directory (a checkout, say);
    anything else is a reference for the store to resolve."""
    path = Path(argument)
    return path if path.is_dir() else argument


@click.command()
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--max-rows", default=20, show_default=True, type=click.IntRange(min=0),
              help="Rows shown per table in plain output.")
@click.pass_context
def diff(ctx: click.Context, a: str, b: str, as_json: bool, max_rows: int) -> None:
    """Row-level and file-level changes from world A to world B.

    Each of A and B is a REF of the store or a world directory (a checkout, edited by
    hand or not): an argument naming an existing directory is a directory. Two
    directories need no store.
    """
    side_a, side_b = world_side(a), world_side(b)
    if isinstance(side_a, Path) and isinstance(side_b, Path):
        from replay.diff import diff_worlds
        from replay.hashing import world_manifest

        result = diff_worlds(side_a, world_manifest(side_a), side_b, world_manifest(side_b))
    else:
        result = worlds(ctx).diff(side_a, side_b)
    if as_json:
        render.emit_json(result)
    else:
        render.diff(result, max_rows)


@click.command()
@click.argument("ref")
@click.option("--through-day", type=int, default=None,
              help="Stop after this day (negative: counting from the end, as persona@-N).")
@click.pass_context
def export(ctx: click.Context, ref: str, through_day: int | None) -> None:
    """Write a persona's log as interchange JSON Lines to stdout.

    REF is the persona (its whole log), persona@N or persona@-N (the log through that
    day) or a world hash.
    """
    worlds(ctx).export(ref, sys.stdout.buffer, through_day=through_day)
    sys.stdout.flush()
