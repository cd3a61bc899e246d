"""The packs' commands: ``pack list|show|export|import`` (the library is ``packs``).

Installed packs live in the packs directory: ``--packs``, env WORLDCTL_PACKS, or by
default beside the store (``<store>/packs``; ``./.worldctl-packs`` for PostgreSQL).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from worldctl import render
from worldctl.session import installed_packs, packs_option, remember_packs, worlds

if TYPE_CHECKING:
    from packs.registry import Pack


@click.group()
@packs_option
@click.pass_context
def pack(ctx: click.Context, packs_dir: str | None) -> None:
    """Domain packs: list, show, export and import them."""
    remember_packs(ctx, packs_dir)


def pack_dict(found: Pack) -> dict[str, Any]:
    return {"name": found.name, "title": found.title, "description": found.description,
            "root": str(found.root), "shipped": found.shipped,
            "worlds": [str(p) for p in found.worlds], "tasks": list(found.tasks),
            "splits": {k: list(v) for k, v in found.splits.items()},
            "episodes": {k: str(v) for k, v in found.episodes.items()}}


@pack.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def pack_list(ctx: click.Context, as_json: bool) -> None:
    """Shipped and installed packs."""
    from packs.registry import list_packs

    found = list_packs(installed_packs(ctx))
    if as_json:
        render.emit_json([pack_dict(p) for p in found])
        return
    render.echo(render.table(
        ["pack", "title", "tasks", "worlds", "where"],
        [[p.name, p.title, str(len(p.tasks)), str(len(p.worlds)),
          "shipped" if p.shipped else str(p.root)] for p in found]))


@pack.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def pack_show(ctx: click.Context, name: str, as_json: bool) -> None:
    """A pack (by NAME or folder): its worlds, tasks, splits and scripted episodes."""
    from packs.registry import load_pack

    found = load_pack(name, installed_packs(ctx))
    if as_json:
        render.emit_json(pack_dict(found))
        return
    render.echo(f"pack {found.name}: {found.title}")
    if found.description:
        render.echo(f"  {found.description}")
    render.echo(f"  root: {found.root}{' (shipped)' if found.shipped else ''}")
    render.echo("  worlds: " + (", ".join(str(p) for p in found.worlds) or "(none)"))
    render.echo(f"  tasks ({len(found.tasks)}): " + (", ".join(found.tasks) or "(none)"))
    for split, tasks in found.splits.items():
        render.echo(f"  split {split} ({len(tasks)}): {', '.join(tasks)}")
    for episode, path in found.episodes.items():
        render.echo(f"  episode {episode}: {path}")


@pack.command("export")
@click.argument("name")
@click.argument("dest", type=click.Path(dir_okay=False, path_type=Path))
@click.pass_context
def pack_export(ctx: click.Context, name: str, dest: Path) -> None:
    """Write pack NAME to the archive DEST with a manifest of digests and world hashes.

    The logs are replayed in scratch to record every persona-day's world hash; the
    store is not written.
    """
    from packs.archive import export_pack
    from packs.registry import load_pack
    from replay.engine import Worlds
    from worldstore.errors import NotFoundError

    found = load_pack(name, installed_packs(ctx))
    try:
        store = worlds(ctx)
    except NotFoundError:
        store = None
    if store is not None:
        manifest = export_pack(store, found, dest)
    else:
        # No store here: the export only needs scratch room, which a temporary store gives
        # without leaving one behind.
        with tempfile.TemporaryDirectory(prefix="worldctl-pack-export-") as scratch, \
                Worlds.open(Path(scratch) / "store") as scratch_worlds:
            manifest = export_pack(scratch_worlds, found, dest)
    render.echo(f"{dest}: pack {manifest.name} (format {manifest.format}), "
                f"{len(manifest.files)} files, {len(manifest.worlds)} persona-days")


@pack.command("import")
@click.argument("archive", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.pass_context
def pack_import(ctx: click.Context, archive: Path) -> None:
    """Verify the pack ARCHIVE, import its logs and install it.

    Every file's digest and every persona-day's world hash must match the manifest;
    on any mismatch nothing is written.
    """
    from packs.archive import import_pack

    installed = installed_packs(ctx)
    done = import_pack(worlds(ctx, create=True), archive, installed)
    where = ("is the pack shipped with agent-worlds (identical; nothing to unpack)"
             if done.pack.shipped else f"installed into {done.pack.root}")
    render.echo(f"pack {done.pack.name} {where}: {done.days_imported} persona-days "
                f"imported, {done.days_skipped} already stored")
