"""What the global options name: the store (opened on first use) and its directories."""

from __future__ import annotations

import contextlib
import os
import shutil
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
    # What opening a new store made: (a path to remove, or a folder that existed with the
    # names it held then), for discard_if_new.
    _made: list[tuple[Path, frozenset[str] | None]] = field(default_factory=list, repr=False)

    def worlds(self, *, create: bool = False) -> Worlds:
        if self._worlds is None:
            from replay.cache import parse_size
            from replay.engine import Worlds

            cap = None if self.cache_max is None else parse_size(self.cache_max,
                                                                 what="--cache-max")
            if create:
                self._note_new_store()
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

    def _note_new_store(self) -> None:
        """Remember what a new embedded store will add to the file system. A PostgreSQL
        store's database exists before the store does: nothing to remember there."""
        from worldstore.open import STORE_DB, is_database_url

        if is_database_url(self.store):
            return
        root = Path(self.store)
        if os.path.lexists(root / STORE_DB):
            return
        places = [root] if self.cache is None else [root, Path(self.cache)]
        for place in places:
            if not os.path.lexists(place):
                self._made.append((_first_missing(place), None))
            elif place.is_dir() and not place.is_symlink():
                self._made.append((place, frozenset(os.listdir(place))))

    def discard_if_new(self) -> None:
        """Remove the store this invocation made if it still holds nothing (no persona-day,
        no episode): a command that fails leaves the file system as it found it."""
        if not self._made:
            return
        if self._worlds is not None:
            store = self._worlds.store
            if store.personas() or store.episodes():
                return
        self.close()
        for place, before in reversed(self._made):
            if before is not None and not place.is_dir():
                continue
            names = [place] if before is None else [
                place / name for name in os.listdir(place) if name not in before]
            for path in names:
                with contextlib.suppress(OSError):
                    if path.is_dir() and not path.is_symlink():
                        shutil.rmtree(path)
                    else:
                        path.unlink()
        self._made = []

    def close(self) -> None:
        if self._worlds is not None:
            self._worlds.close()
            self._worlds = None
        if self._events is not None:
            self._events.close()
            self._events = None


def _first_missing(path: Path) -> Path:
    """The outermost folder of `path` that does not exist yet (all of it is new)."""
    path = path.absolute()
    while not os.path.lexists(path.parent):
        path = path.parent
    return path


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
