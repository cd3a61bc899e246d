"""A recorded episode turned into a day (methods.md section 4, "day implementation"): what
an agent did in a live instance of ``persona@N-1`` becomes day N of the persona's log.

An episode records its effects (``worldenv.core.episode``): each state-changing call's database
changes as the SQLite session extension's changeset, and each workspace change as a
``FileChange``. ``day_from_episode`` rewrites them as interchange events: a changeset's
rows as plain ``INSERT`` / ``UPDATE ... WHERE <key>`` / ``DELETE ... WHERE <key>``
statements with bound values (column names from the snapshot's own schema), a file change
as ``file_write`` or ``file_delete``. Every event takes its call's timestamp, which the
instance's clock froze (the snapshot's last instant, one second per call), so nothing of
the wall clock reaches the day, and row ids are the ones the tools derived.

Before anything is stored, the events are applied to a copy of the N-1 snapshot by the
replay engine itself, and the day's world hash must be the episode's final hash: a day
that would not replay to exactly the world the agent left (a symlink in the workspace, a
table without a primary key the session could not track) is refused, naming the first
difference, and the store is left as it was. ``store_day`` then appends the day.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import apsw

from replay.engine import Worlds
from replay.errors import ApplyError
from replay.files import remove_tree
from replay.fold import build_day_on
from replay.layout import service_db
from replay.sqlite import open_readonly, quote_ident
from synth.errors import SynthError
from worldenv.core.episode import DbChange, Episode, FileChange, ShellCall, ToolCall
from worldstore.canonical import digest
from worldstore.events import (
    GENESIS,
    FileDeletePayload,
    FileWritePayload,
    Payload,
    SqlPayload,
    make_event,
)
from worldstore.interchange import BLOB_PARAM_KEY, export_line
from worldstore.store import DayRecord


@dataclass(frozen=True)
class EpisodeDay:
    """Day `day` of `persona` as made from an episode: its interchange lines, and the world
    hash they replay to (the episode's final hash)."""

    persona: str
    day: int
    lines: bytes
    events: int
    world_hash: str


Event = tuple[str, Payload, bytes | None]  # (ts, payload, blob)


def day_from_episode(worlds: Worlds, episode: Episode, *, before: Sequence[Event] = ()
                     ) -> EpisodeDay:
    """The day after the episode's start world, made of the episode's effects; refuses an
    episode that does not start from the persona's last stored day, or whose effects do
    not replay to its final hash. `before`: events the day starts with, which the episode
    did not make (a new service's app and schema: ``synth.worlds.applib``); they must touch
    nothing the episode did."""
    record = _start_record(worlds, episode)
    day = record.day + 1
    snapshot = worlds.snapshot(record.persona, record.day)
    events = list(_events(episode, snapshot))
    if not events and not before:
        raise SynthError(f"episode {episode.episode_id} changed nothing: a day needs at "
                         "least one event")
    built = _replayed_hash(worlds, snapshot, record.persona, day, events)
    expected = episode.final_hash
    if built != expected:
        raise SynthError(f"episode {episode.episode_id}: its effects as day {day} replay to "
                         f"{built}, not to the episode's final world {expected}; nothing "
                         "was stored")
    if before:
        events = [*before, *events]
        built = _replayed_hash(worlds, snapshot, record.persona, day, events)
    lines = b"".join(export_line(record.persona, day, ts, payload, blob)
                     for ts, payload, blob in events)
    return EpisodeDay(record.persona, day, lines, len(events), built)


def store_day(worlds: Worlds, made: EpisodeDay, *, source: str) -> DayRecord:
    """Append the day to the store (the import's own checks run again)."""
    worlds.import_stream(io.BytesIO(made.lines), source=source)
    return worlds.record(f"{made.persona}@{made.day}")


def _start_record(worlds: Worlds, episode: Episode) -> DayRecord:
    if episode.final_hash is None:
        raise SynthError(f"episode {episode.episode_id} has no final world hash")
    record = worlds.record(f"{episode.persona}@{episode.day}")
    if record.world_hash != episode.world_hash:
        raise SynthError(f"episode {episode.episode_id} starts from {episode.world_hash}, "
                         f"not from {episode.persona}@{episode.day} ({record.world_hash})")
    last = max(r.day for r in worlds.store.days(episode.persona))
    if last != episode.day:
        raise SynthError(f"episode {episode.episode_id} starts from {episode.persona}@"
                         f"{episode.day}, but the log goes on to day {last}: a day can only "
                         "be added after the last one")
    return record


def _events(episode: Episode, snapshot: Path) -> Iterator[tuple[str, Payload, bytes | None]]:
    """(ts, payload, blob) of every effect, in the episode's order."""
    stamps = {e.index: e.ts for e in episode.events if isinstance(e, ToolCall | ShellCall)}
    columns = _Columns(snapshot)
    for effect in episode.events:
        if isinstance(effect, DbChange):
            ts = stamps[effect.index]
            for sql, params in changeset_statements(effect.changeset, effect.service,
                                                    columns):
                yield ts, SqlPayload(service=effect.service, sql=sql, params=params), None
        elif isinstance(effect, FileChange):
            yield (stamps[effect.index], *_file_payload(episode, effect))


def _file_payload(episode: Episode, change: FileChange) -> tuple[Payload, bytes | None]:
    if change.link is not None:
        raise SynthError(f"episode {episode.episode_id}: {change.path!r} is a symlink; a "
                         "day's workspace holds regular files only")
    if change.data is None:
        return FileDeletePayload(path=change.path), None
    encoding: Literal["text", "base64"] = "text"
    try:
        change.data.decode("utf-8")
    except UnicodeDecodeError:
        encoding = "base64"
    return FileWritePayload(path=change.path, blob=digest(change.data),
                            size=len(change.data), encoding=encoding), change.data


class _Columns:
    """Column names per service table, read from the snapshot's schema (once each)."""

    def __init__(self, snapshot: Path) -> None:
        self.snapshot = snapshot
        self._found: dict[tuple[str, str], list[str]] = {}

    def of(self, service: str, table: str) -> list[str]:
        key = (service, table)
        if key not in self._found:
            with open_readonly(service_db(self.snapshot, service)) as conn:
                rows = list(conn.execute(f"PRAGMA table_info({quote_ident(table)})"))
            if not rows:
                raise SynthError(f"service {service!r}: the episode changed table {table!r}, "
                                 "which the day before does not have")
            self._found[key] = [str(row[1]) for row in rows]
        return self._found[key]


def changeset_statements(changeset: bytes, service: str, columns: _Columns
                         ) -> Iterator[tuple[str, list[Any]]]:
    """A changeset's rows as (sql, params): every value bound, blobs as interchange blob
    parameters, each UPDATE setting only what changed."""
    for change in apsw.Changeset.iter(changeset):
        names = columns.of(service, change.name)
        if len(names) != change.column_count:
            raise SynthError(f"service {service!r}: table {change.name!r} has "
                             f"{len(names)} columns, the episode's change {change.column_count}")
        table = quote_ident(change.name)
        keys = sorted(change.pk_columns)
        if change.op == "INSERT":
            assert change.new is not None
            yield (f"INSERT INTO {table} ({', '.join(map(quote_ident, names))}) VALUES "
                   f"({', '.join('?' * len(names))})", [_value(v) for v in change.new])
            continue
        assert change.old is not None
        where = " AND ".join(f"{quote_ident(names[i])} = ?" for i in keys)
        key_values = [_value(change.old[i]) for i in keys]
        if change.op == "DELETE":
            yield f"DELETE FROM {table} WHERE {where}", key_values
            continue
        assert change.new is not None
        changed = [i for i, v in enumerate(change.new) if v is not apsw.no_change]
        if not changed:
            continue
        sets = ", ".join(f"{quote_ident(names[i])} = ?" for i in changed)
        yield (f"UPDATE {table} SET {sets} WHERE {where}",
               [_value(change.new[i]) for i in changed] + key_values)


def _value(value: Any) -> Any:
    if isinstance(value, bytes):
        return {BLOB_PARAM_KEY: base64.b64encode(value).decode("ascii")}
    return value


def _replayed_hash(worlds: Worlds, snapshot: Path, persona: str, day: int,
                   events: Sequence[tuple[str, Payload, bytes | None]]) -> str:
    """The world hash of the events applied to a copy of the snapshot by the replay
    engine, in the cache's scratch area (removed afterwards)."""
    blobs = {digest(blob): blob for _, _, blob in events if blob is not None}
    if not events:  # an episode that changed nothing: the day before's world
        return worlds.record(f"{persona}@{day - 1}").world_hash
    stored, prev = [], GENESIS  # a check's chain is its own
    for seq, (ts, payload, _) in enumerate(events):
        event = make_event(persona=persona, seq=seq, day=day, ts=ts, prev=prev,
                           payload=payload)
        stored.append(event)
        prev = event.event_id
    scratch = worlds.cache.scratch()
    try:
        try:
            built = build_day_on(snapshot, scratch / "world", stored, blobs.__getitem__)
        except ApplyError as exc:
            raise SynthError(f"the episode's effects do not apply as day {day}: "
                             f"{exc.reason}") from None
        return built.world_hash
    finally:
        remove_tree(scratch)


__all__ = ["EpisodeDay", "changeset_statements", "day_from_episode", "store_day"]
