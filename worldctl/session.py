"""What the global options name: the store (opened on first use) and its directories."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from replay.engine import Worlds
    from worldstore.store import EventStore

PACKS_ENV = "WORLDCTL_PACKS"
_PACKS_KEY = "worldctl.packs_dir"

# The --packs option of the command groups that read packs (pack, rl, eval): a group
# passes its value to remember_packs; its commands read installed_packs.
packs_option = click.option(
    "--packs", "packs_dir", default=None, metavar="DIR",
    help=f"Directory of installed packs (env {PACKS_ENV}; default <store>/packs, or "
         "./.worldctl-packs for a PostgreSQL store).")


def remember_packs(ctx: click.Context, packs_dir: str | None) -> None:
    ctx.meta[_PACKS_KEY] = session(ctx).packs_dir(packs_dir)


def installed_packs(ctx: click.Context) -> Path:
    """Where installed packs are: the group's --packs, else the environment's default."""
    found = ctx.meta.get(_PACKS_KEY)
    return Path(found) if found is not None else session(ctx).packs_dir()


@dataclass
class Session:
    """The store named by ``--store``/``--cache``; a command opens it only if it needs it,
    and only commands that write may create it."""

    store: str
    cache: str | None
    cache_max: str | None = None  # --cache-max as given; parsed when the cache is opened
    _worlds: Worlds | None = field(default=None, repr=False)
    _events: EventStore | None = field(default=None, repr=False)

    def worlds(self, *, create: bool = False) -> Worlds:
        if self._worlds is None:
            from replay.cache import parse_size
            from replay.engine import Worlds

            cap = None if self.cache_max is None else parse_size(self.cache_max,
                                                                 what="--cache-max")
            self._worlds = Worlds.open(self.store, self.cache, create=create,
                                       cache_max_bytes=cap)
        return self._worlds

    def event_store(self) -> EventStore:
        """The event store alone, for commands that only read it: without the replay
        engine and the snapshot cache, a quick look starts quicker."""
        if self._worlds is not None:
            return self._worlds.store
        if self._events is None:
            from worldstore.open import open_event_store

            self._events = open_event_store(self.store, create=False)
        return self._events

    def packs_dir(self, given: str | None = None) -> Path:
        """Where installed packs live: `given` (``--packs``), env WORLDCTL_PACKS, or the
        default for the store."""
        from worldstore.open import default_packs_dir

        chosen = given or os.environ.get(PACKS_ENV)
        return Path(chosen) if chosen else default_packs_dir(self.store)

    def close(self) -> None:
        if self._worlds is not None:
            self._worlds.close()
            self._worlds = None
        if self._events is not None:
            self._events.close()
            self._events = None


def session(ctx: click.Context) -> Session:
    found = ctx.find_object(Session)
    if found is None:  # a command invoked without the worldctl group (a programming error)
        raise RuntimeError("worldctl commands run inside the worldctl group")
    return found


def worlds(ctx: click.Context, *, create: bool = False) -> Worlds:
    """The store of this invocation (opened once)."""
    return session(ctx).worlds(create=create)


def event_store(ctx: click.Context) -> EventStore:
    """The event store of this invocation, without the replay engine (opened once)."""
    return session(ctx).event_store()
