"""The packs' commands: ``pack list|show|export|import`` (the library is ``packs``).

Installed packs live in the packs directory: ``--packs``, env WORLDCTL_PACKS, or by
default beside the store (``<store>/packs``; ``./.worldctl-packs`` for PostgreSQL).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from worldctl import render
from worldctl.session import installed_packs, packs_option, remember_packs, worlds

if TYPE_CHECKING:
    from gates.contract import TaskSpec
    from packs.registry import Pack
    from replay.engine import Worlds
    from replay.mount import Mount
    from worldenv.instances.instance import Instance


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
@click.argument("dest", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["archive", "harbor"]), default="archive",
              show_default=True,
              help="archive: one .tar.gz file; harbor: a folder of Harbor tasks (one per task).")
@click.option("--base-image", default=None, metavar="IMAGE",
              help="Harbor: the default of the Dockerfiles' BASE_IMAGE build argument, an "
                   "image with agent-worlds installed  [default: agent-worlds:latest]")
@click.pass_context
def pack_export(ctx: click.Context, name: str, dest: Path, fmt: str,
                base_image: str | None) -> None:
    """Write pack NAME to DEST: an archive with a manifest of digests and world hashes, or
    (--format harbor) a folder of Harbor tasks whose environments hold that archive.

    The logs are replayed in scratch to record every persona-day's world hash; the
    store is not written.
    """
    from packs.archive import export_pack
    from packs.harbor import DEFAULT_BASE_IMAGE, export_harbor
    from packs.registry import load_pack
    from replay.engine import Worlds
    from worldstore.errors import NotFoundError

    if base_image is not None and fmt != "harbor":
        raise click.UsageError("--base-image is for --format harbor")
    found = load_pack(name, installed_packs(ctx))
    try:
        store = worlds(ctx)
    except NotFoundError:
        store = None
    with contextlib.ExitStack() as stack:
        if store is None:
            # No store here: the export only needs scratch room, which a temporary store
            # gives without leaving one behind.
            scratch = stack.enter_context(
                tempfile.TemporaryDirectory(prefix="worldctl-pack-export-"))
            store = stack.enter_context(Worlds.open(Path(scratch) / "store"))
        if fmt == "harbor":
            done = export_harbor(store, found, dest,
                                 base_image=base_image or DEFAULT_BASE_IMAGE)
            render.echo(f"{dest}: pack {done.pack} as {len(done.tasks)} Harbor tasks "
                        f"({done.files} files)")
            return
        manifest = export_pack(store, found, dest)
    render.echo(f"{dest}: pack {manifest.name} (format {manifest.format}), "
                f"{len(manifest.files)} files, {len(manifest.worlds)} persona-days")


@pack.command("import")
@click.argument("archive", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["archive", "harbor"]), default="archive",
              show_default=True,
              help="archive: a .tar.gz file; harbor: a folder of Harbor tasks written by "
                   "`pack export --format harbor`.")
@click.pass_context
def pack_import(ctx: click.Context, archive: Path, fmt: str) -> None:
    """Verify the pack ARCHIVE (or, --format harbor, the folder of Harbor tasks), import
    its logs and install it.

    Every file's digest and every persona-day's world hash must match the manifest (and
    every file of a Harbor task what export writes for that pack); on any mismatch
    nothing is written.
    """
    from packs.archive import import_pack
    from packs.harbor import import_harbor

    installed = installed_packs(ctx)
    if fmt == "harbor":
        done = import_harbor(worlds(ctx, create=True), archive, installed)
    else:
        done = import_pack(worlds(ctx, create=True), archive, installed)
    where = ("is the pack shipped with agent-worlds (identical; nothing to unpack)"
             if done.pack.shipped else f"installed into {done.pack.root}")
    render.echo(f"pack {done.pack.name} {where}: {done.days_imported} persona-days "
                f"imported, {done.days_skipped} already stored")


# --- inside a Harbor task's environment ---------------------------------------------------
# The commands the files of an exported Harbor task run (packs/harbor.py): the task's world
# is a plain checkout (WORLD_DIR) the agent's terminal works in directly, so the tools,
# the reference solution and the verifier act on that folder, not on a mount of their own.

_world_dir = click.argument("world_dir", type=click.Path(file_okay=False, path_type=Path))
_answer_file = click.option("--answer-file", type=click.Path(dir_okay=False, path_type=Path),
                            default=Path("/logs/agent/answer.txt"), show_default=True,
                            help="Where the agent's final answer is (or goes).")


@pack.command("mcp")
@click.argument("name")
@click.argument("task")
@_world_dir
@_answer_file
@click.pass_context
def pack_mcp(ctx: click.Context, name: str, task: str, world_dir: Path,
             answer_file: Path) -> None:
    """Serve the tools of pack NAME's TASK on stdio (MCP), acting on the checked-out world
    WORLD_DIR: the services' tools, `answer` (written to --answer-file) and, for a task
    that uses the GUI, the GUI tools."""
    from worldenv.core.contract import ToolResult
    from worldenv.serving.mcp import gui_caller, instance_server

    with _world_instance(ctx, name, task, world_dir) as (instance, spec):
        async def answer(text: str) -> ToolResult:
            _write_answer(answer_file, text)
            return ToolResult(False, "Answer recorded.")

        gui = gui_caller(instance) if "gui" in spec.interfaces else None
        instance_server(instance, answer=answer, gui=gui).run(transport="stdio",
                                                             show_banner=False)


@pack.command("solve")
@click.argument("name")
@click.argument("task")
@_world_dir
@_answer_file
@click.pass_context
def pack_solve(ctx: click.Context, name: str, task: str, world_dir: Path,
               answer_file: Path) -> None:
    """Replay pack NAME's TASK's reference solution on the checked-out world WORLD_DIR;
    its final answer goes to --answer-file."""
    from gates.agents import reference_agent
    from gates.task import load_task

    found = load_task(_pack_of(ctx, name).task_dir(task))
    if "gui" in found.spec.interfaces:
        _require_browser()
    with _world_instance(ctx, name, task, world_dir) as (instance, _spec):
        trajectory = reference_agent().run(instance, found, hinted=False)
        instance.settle()
    if trajectory.answer is not None:
        _write_answer(answer_file, trajectory.answer)
    render.echo(f"{name}/{task}: reference solution replayed ({len(trajectory.turns)} steps)")


@pack.command("grade")
@click.argument("name")
@click.argument("task")
@_world_dir
@_answer_file
@click.option("--reward-file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Write the reward (1 or 0) here.")
@click.pass_context
def pack_grade(ctx: click.Context, name: str, task: str, world_dir: Path, answer_file: Path,
               reward_file: Path | None) -> None:
    """Grade the checked-out world WORLD_DIR with pack NAME's TASK's verifier, against the
    task's start world, with the answer in --answer-file (none if it is missing). Exit 1
    unless V = 1."""
    from gates.rollout import task_w0
    from gates.task import load_task
    from gates.verifier import run_verifier

    store = worlds(ctx)
    found = load_task(_pack_of(ctx, name).task_dir(task))
    w0 = task_w0(store, found)
    with _in_place(store, found.spec.world_hash, w0, world_dir) as mount:
        mount.hash()  # journals settled: W whole on disk, as a rollout's is
        answer = (answer_file.read_text(encoding="utf-8")
                  if answer_file.is_file() and not answer_file.is_symlink() else None)
        verdict = run_verifier(found.verifier_dir, w0, world_dir, answer,
                               scratch=store.cache.tmp)
    if reward_file is not None:
        reward_file.parent.mkdir(parents=True, exist_ok=True)
        reward_file.write_text("1\n" if verdict.passed else "0\n")
    render.echo(f"{name}/{task}: V = {int(verdict.passed)} ({verdict.satisfied}/{verdict.n} "
                "checks)")
    for check in verdict.checks:
        render.echo(f"  [{'x' if check.passed else ' '}] {check.name}")
    for error in verdict.errors:
        render.echo(f"  error: {error}")
    if not verdict.passed:
        ctx.exit(1)


def _require_browser() -> None:
    """The reference solution of a task that uses the GUI drives a browser, in a
    bubblewrap sandbox: where either is missing, refuse before the first step rather than
    replay its GUI steps as failed tool calls."""
    from worldenv.gui.browser import find_chromium
    from worldenv.sandbox.bubblewrap import find_sandbox_tools

    find_sandbox_tools()
    find_chromium()


def _pack_of(ctx: click.Context, name: str) -> Pack:
    from packs.registry import load_pack

    return load_pack(name, installed_packs(ctx))


def _write_answer(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


@contextlib.contextmanager
def _world_instance(ctx: click.Context, name: str, task: str, world_dir: Path
                    ) -> Iterator[tuple[Instance, TaskSpec]]:
    """An instance of TASK's world whose mount is WORLD_DIR itself (kept when it closes)."""
    from gates.rollout import task_w0
    from gates.task import load_task
    from worldenv.instances.instance import Environment

    store = worlds(ctx)
    found = load_task(_pack_of(ctx, name).task_dir(task))
    w0 = task_w0(store, found)
    with Environment(store) as env:
        instance = env.open(found.spec.world_hash)
        instance.mount.close()  # lazy: it copied nothing; the instance works in WORLD_DIR
        with _in_place(store, found.spec.world_hash, w0, world_dir) as mount:
            instance.mount = mount
            try:
                yield instance, found.spec
            finally:
                instance.close()


@contextlib.contextmanager
def _in_place(store: Worlds, world_hash: str, w0: Path, world_dir: Path) -> Iterator[Mount]:
    from replay.mount import Mount

    class InPlace(Mount):
        """A world folder that is already there: nothing copied in, nothing removed."""

        def _copy_all(self) -> None:
            self._stamps.clear()
            self._present = set(self._snapshot_parts())

        def close(self) -> None:
            self._closed = True

    if not (world_dir / "services").is_dir() and not (world_dir / "workspace").is_dir():
        raise click.UsageError(f"{world_dir} is not a checked-out world (`worldctl checkout`)")
    record = store.record(world_hash)
    mount = InPlace(w0, world_hash, store.manifest(record), world_dir)
    try:
        yield mount
    finally:
        mount.close()
