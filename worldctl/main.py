"""worldctl: the command group, its global options, the error boundary and lazy loading.

Each command lives in the module of its group (``worldctl.store``, ``.envs``, ``.tasks``,
``.synth``, ``.packs``, ``.demo``) and is imported only when it is invoked: ``--help`` and
``--version`` need only the names and one-line help in ``COMMANDS`` below, so they start
with click alone (no rich, msgspec or SQLAlchemy). A test checks the table against the
commands' own help.

The error boundary: every refusal is one ``error: ...`` line on stderr and exit status 2,
whether it is a library error (``WorldError``) or a usage error of click's. Text from the
library or the user is written as it is, never through a markup language. A command that
fails leaves no store behind that it made and wrote nothing into (``Session.discard_if_new``).
"""

from __future__ import annotations

import errno
import importlib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from worldstore.errors import WorldError
from worldstore.open import DEFAULT_STORE

EXIT_REFUSED = 2
# The package's version (pyproject.toml; a test keeps the two equal). Asking
# importlib.metadata instead would cost --version more start-up than click itself.
VERSION = "0.1.0"

# name -> (module, attribute, the one-line help --help shows), in the order of
# docs/reference/cli.md.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "import": ("worldctl.store", "import_cmd",
               "Append the persona-days of interchange FILES (JSON Lines)."),
    "personas": ("worldctl.store", "personas",
                 "Personas with their days, events and latest world hash."),
    "replay": ("worldctl.store", "replay",
               "Re-apply PERSONA's whole log from nothing; show each day's hash and time."),
    "verify": ("worldctl.store", "verify",
               "Re-derive every day from the log and check chain, blobs, hashes and cache."),
    "checkout": ("worldctl.store", "checkout",
                 "Write the world REF into DEST as plain SQLite and workspace files."),
    "hash": ("worldctl.store", "hash_cmd",
             "Print the world hash of a checked-out DIRECTORY (last line of output)."),
    "diff": ("worldctl.store", "diff",
             "Row-level and file-level changes from world A to world B."),
    "export": ("worldctl.store", "export",
               "Write a persona's log as interchange JSON Lines to stdout."),
    "import-awm": ("worldctl.awm", "import_awm_cmd",
                   "Import AWM environments from DIRECTORY (gen_*.jsonl): one world per "
                   "scenario."),
    "check-awm": ("worldctl.awm", "check_awm_cmd",
                  "Call every tool of REF's generated code on fresh instances; name those "
                  "that differ."),
    "cache": ("worldctl.cache", "cache",
              "The snapshot cache: what it holds, and pruning it."),
    "episode": ("worldctl.envs", "episode",
                "Stored agent episodes: list, show, replay and verify them."),
    "serve": ("worldctl.envs", "serve",
              "Serve instances of the stored worlds to agents over HTTP."),
    "ui": ("worldctl.ui", "ui_cmd",
           "A read-only web view of the store: worlds, days, tables, files, diffs, episodes."),
    "task": ("worldctl.tasks", "task",
             "Task folders: run the quality gates, grade an episode."),
    "rollout": ("worldctl.tasks", "rollout",
                "Run N rollouts of an agent on TASK_DIR; each episode is stored and graded."),
    "validate-day": ("worldctl.synth", "validate_day_cmd",
                     "Five-layer validation of a stored day REF."),
    "synth": ("worldctl.synth", "synth_group",
              "Synthesize tool-use environments with an LLM (the AWM pipeline)."),
    "pack": ("worldctl.packs", "pack",
             "Domain packs: list, show, export and import them."),
    "rl": ("worldctl.rl", "rl",
           "Training with verl: datasets, the SFT warm start, a launch config."),
    "eval": ("worldctl.eval", "eval_group",
             "Measure agents on tasks: runs, reports, comparisons."),
    "demo": ("worldctl.demo", "demo",
             "The main job on the bundled demo world."),
}


# Optional dependencies by top-level module, with the extra that installs each.
EXTRAS = {"fastmcp": "envs", "uvicorn": "envs", "docker": "envs", "litellm": "llm",
          "psycopg": "postgres", "polars": "data"}


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The refusal for an optional dependency that is not installed, else None."""
    top = (exc.name or "").split(".")[0]
    extra = EXTRAS.get(top)
    if extra is None:
        return None
    return (f"this command needs {top}, which is not installed: "
            f"pip install 'agent-worlds[{extra}]'")


def refuse(message: str) -> NoReturn:
    """One line on stderr, exit status 2: how every refusal ends. A message that spans
    lines (a driver's, say) is joined into one; nothing else in it is changed."""
    one_line = " ".join(line.strip() for line in message.splitlines() if line.strip())
    click.echo(f"error: {one_line}", err=True)
    sys.exit(EXIT_REFUSED)


def _usage_message(exc: click.UsageError) -> str:
    """Click's message in one line, with where to read the usage instead of the usage."""
    message = " ".join(exc.format_message().split())
    ctx = exc.ctx
    if ctx is not None:
        message += f" (see `{ctx.command_path} --help`)"
    return message


class LazyGroup(click.Group):
    """The worldctl group: commands from ``COMMANDS``, imported when invoked, and the
    error boundary around all of them."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        module, attribute, _help = entry
        command: click.Command = getattr(importlib.import_module(module), attribute)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # From the table: listing the commands must not import every command module.
        with formatter.section("Commands"):
            formatter.write_dl([(name, entry[2]) for name, entry in COMMANDS.items()])

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SystemExit as exc:
            if exc.code not in (0, None):
                _discard_new_store(ctx)
            raise
        except BaseException:
            _discard_new_store(ctx)
            raise

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False,
                                  **extra)
        except click.exceptions.NoArgsIsHelpError as exc:
            click.echo(exc.format_message())  # `worldctl` alone asks for the help
            sys.exit(0)
        except click.UsageError as exc:
            refuse(_usage_message(exc))
        except click.ClickException as exc:  # e.g. a file click could not open
            refuse(" ".join(exc.format_message().split()))
        except click.Abort:
            refuse("interrupted")
        except WorldError as exc:
            refuse(str(exc))
        except OSError as exc:
            # A path the user gave that the file system cannot even look up (a name past
            # 255 bytes, a path past PATH_MAX); other host errors stay tracebacks.
            if exc.errno != errno.ENAMETOOLONG:
                raise
            name = str(exc.filename or "")
            refuse(f"{name[:60]!r}...: {exc.strerror} (a file name has at most 255 bytes, "
                   "a path at most 4096)")
        except ModuleNotFoundError as exc:
            message = missing_extra(exc)
            if message is None:
                raise
            refuse(message)
        if not standalone_mode:
            return result
        sys.exit(result if isinstance(result, int) else 0)


def _discard_new_store(ctx: click.Context) -> None:
    """A command that fails leaves no store it made and wrote nothing into."""
    from worldctl.session import Session

    if isinstance(ctx.obj, Session):
        ctx.obj.discard_if_new()


@click.group(cls=LazyGroup)
@click.option("--store", envvar="WORLDCTL_STORE", default=DEFAULT_STORE, show_default=True,
              help="Store directory (embedded SQLite) or postgresql:// URL "
                   "(env WORLDCTL_STORE).")
@click.option("--cache", envvar="WORLDCTL_CACHE", default=None,
              help="Snapshot cache directory (default: <store>/cache, or ./.worldctl-cache "
                   "for a PostgreSQL store; env WORLDCTL_CACHE).")
@click.option("--cache-max", "cache_max", default=None, metavar="SIZE",
              help="Cap on the snapshot cache, e.g. 20G or 512M (default: env "
                   "WORLDCTL_CACHE_MAX, else 10G or a quarter of its file system).")
@click.version_option(VERSION, prog_name="worldctl")
@click.pass_context
def cli(ctx: click.Context, store: str, cache: str | None, cache_max: str | None) -> None:
    """Build, store, replay, verify, serve and grade persona worlds."""
    from worldctl.session import Session

    session = Session(store=store, cache=cache, cache_max=cache_max)
    ctx.obj = session
    ctx.call_on_close(session.close)


def main() -> None:
    cli(prog_name="worldctl")


if __name__ == "__main__":
    main()
