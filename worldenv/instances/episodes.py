"""Episodes in the world store: save, load, replay and verify.

The store keeps an episode as opaque bytes (the ``Episode`` as JSON) next to a few columns
to find it by (world hash, persona, day, final hash, number of calls); this module is the
one place that turns one into the other. An episode is write-once: saving the same episode
again is a no-op, saving a different one under a stored id is a ConflictError.

``verify_episode`` is the check that an episode is what it claims: its body decodes and
agrees with its columns, it starts from a stored persona-day, and its effects, replayed
onto a fresh mount of that snapshot, give the recorded final hash.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import apsw
import msgspec

from replay.errors import IntegrityError
from worldenv.core.episode import (
    Call,
    DbChange,
    Episode,
    FileChange,
    GuiCall,
    ShellCall,
    ToolCall,
    apply_effects,
)
from worldstore.canonical import digest_of
from worldstore.errors import WorldError
from worldstore.store import EpisodeRecord

if TYPE_CHECKING:
    from replay.engine import Worlds
    from worldenv.instances.instance import Instance


def episode_record(episode: Episode) -> EpisodeRecord:
    """The store's record of `episode` (its body is the Episode's JSON)."""
    return EpisodeRecord(
        episode_id=episode.episode_id, world_hash=episode.world_hash,
        persona=episode.persona, day=episode.day, final_hash=episode.final_hash,
        n_calls=len(episode.calls), body=episode.to_json(),
    )


def save_episode(worlds: Worlds, item: Instance | Episode) -> str:
    """Store an instance's current episode (or an Episode); returns its episode_id.

    The final hash recorded is the instance's world hash now; for a bare Episode its own
    ``final_hash``, or, when it has none, the hash its effects replay to. An instance's
    episode is stored under its content id (``content_id``), which it then takes; a bare
    Episode keeps the id it has.
    """
    if isinstance(item, Episode):
        episode = item
        if episode.final_hash is None:
            episode = msgspec.structs.replace(episode,
                                              final_hash=replay_episode(worlds, episode))
    else:
        episode = msgspec.structs.replace(item.episode, final_hash=item.settle())
        episode = msgspec.structs.replace(episode, episode_id=content_id(episode))
        item.episode = msgspec.structs.replace(item.episode, episode_id=episode.episode_id)
    worlds.store.put_episode(episode_record(episode))
    return episode.episode_id


def content_id(episode: Episode) -> str:
    """A stored episode is named by what it holds (its start, calls, effects and answer),
    so ids never collide across processes and saving the same episode twice is a no-op."""
    parts: list[object] = ["episode", episode.world_hash, episode.persona, episode.day,
                           msgspec.json.encode(episode.events), episode.answer]
    if episode.task is not None or episode.agent is not None:
        # Who ran it for which task is part of what it holds: two agents that happen to
        # make the same calls leave two episodes (ids of untagged episodes are unchanged).
        parts += [episode.task, episode.agent]
    return digest_of(parts)


def load_episode(worlds: Worlds, episode_id: str) -> Episode:
    """The stored episode; NotFoundError if absent, IntegrityError if its body is bad."""
    return decode_episode(worlds.store.episode(episode_id))


def decode_episode(record: EpisodeRecord) -> Episode:
    try:
        return Episode.from_json(record.body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise IntegrityError(
            f"episode {record.episode_id}: the stored body is not a valid episode: {exc}"
        ) from None


def replay_episode(worlds: Worlds, episode: Episode) -> str:
    """Apply the episode's effects, in order, to a fresh mount of its snapshot; return the
    world hash they give. The mount is removed afterwards."""
    with worlds.mount(episode.world_hash) as mount:
        try:
            apply_effects(mount, episode.events)
        except apsw.Error as exc:
            raise IntegrityError(
                f"episode {episode.episode_id}: its effects do not apply to world "
                f"{episode.world_hash}: {type(exc).__name__}: {exc}"
            ) from None
        return mount.hash()


def verify_episode(worlds: Worlds, episode_id: str) -> tuple[bool, str]:
    """Check a stored episode; (ok, a one-line message that names the episode).

    NotFoundError (not a failed check) if no episode has that id.
    """
    record = worlds.store.episode(episode_id)
    where = f"episode {episode_id} ({record.persona}@{record.day}, {record.n_calls} calls)"
    try:
        episode = decode_episode(record)
    except IntegrityError as exc:
        return False, str(exc)
    disagree = _disagreements(record, episode)
    if disagree:
        return False, f"{where}: the stored record disagrees with its body: {disagree}"
    starts = worlds.store.days_with_hash(record.world_hash)
    if not starts:
        return False, (f"{where}: starts from world {record.world_hash}, which is not a "
                       "stored persona-day")
    if (record.persona, record.day) not in {(r.persona, r.day) for r in starts}:
        names = ", ".join(f"{r.persona}@{r.day}" for r in starts)
        return False, (f"{where}: world {record.world_hash} is the hash of {names}, not of "
                       f"{record.persona}@{record.day}")
    if record.final_hash is None:
        return False, f"{where}: no final hash was recorded; nothing to verify against"
    try:
        replayed = replay_episode(worlds, episode)
    except WorldError as exc:
        reason = str(exc).removeprefix(f"episode {episode_id}: ")
        return False, f"{where}: replay failed: {reason}"
    if replayed != record.final_hash:
        return False, (f"{where}: replays to {replayed}, but the recorded final hash is "
                       f"{record.final_hash}")
    return True, f"{where}: replays to the recorded final hash {replayed}"


def verify_episodes(worlds: Worlds, episode_ids: list[str] | None = None
                    ) -> list[tuple[bool, str]]:
    """``verify_episode`` of each named episode, or of every stored one (by id)."""
    ids = episode_ids if episode_ids is not None else [
        r.episode_id for r in worlds.store.episodes()]
    return [verify_episode(worlds, episode_id) for episode_id in ids]


def _disagreements(record: EpisodeRecord, episode: Episode) -> str:
    body = episode_record(episode)
    wrong = [
        f"{name} {getattr(record, name)!r} (body: {getattr(body, name)!r})"
        for name in ("episode_id", "world_hash", "persona", "day", "final_hash", "n_calls")
        if getattr(record, name) != getattr(body, name)
    ]
    return "; ".join(wrong)


# --- summaries (what `worldctl episode show|list` print) ------------------------------------


def call_failed(call: Call) -> bool:
    """What counts as a failed call: a tool call or GUI action whose result is an error; a
    shell command that timed out or exited non-zero."""
    if isinstance(call, ToolCall | GuiCall):
        return call.is_error
    return call.timed_out or call.exit_code != 0


def call_name(call: Call) -> str:
    """How a call is shown: the tool's name, ``$ COMMAND``, or ``gui_ACTION ARGUMENTS``."""
    if isinstance(call, ToolCall):
        return call.tool
    if isinstance(call, ShellCall):
        return f"$ {call.command}"
    shown = " ".join(f"{k}={v!r}" for k, v in call.arguments.items())
    return f"gui_{call.action}" + (f" {shown}" if shown else "")


def call_response(call: Call) -> str:
    """What the call answered: a tool's or GUI action's text, a command's output."""
    if isinstance(call, ShellCall):
        return call.stdout or call.stderr
    return call.text


@dataclass(frozen=True)
class CallSummary:
    """One call of an episode: what was called, whether it failed, its effects (``db
    SERVICE`` / ``file PATH``) and its response (a tool's text, a command's output)."""

    index: int
    ts: str
    call: str  # the tool's name, "$ COMMAND" or "gui_ACTION ARGUMENTS"
    failed: bool
    effects: tuple[str, ...]
    response: str


@dataclass(frozen=True)
class EpisodeSummary:
    """A stored episode at a glance: where it started and ended, who ran it for which task,
    its calls and how many failed, and how many effects it had."""

    episode_id: str
    persona: str
    day: int
    world_hash: str
    final_hash: str | None  # the stored record's
    task: str | None
    agent: str | None
    calls: tuple[CallSummary, ...]
    n_errors: int
    n_db_changes: int
    n_file_changes: int

    @property
    def n_calls(self) -> int:
        return len(self.calls)


def summarize_episode(record: EpisodeRecord) -> EpisodeSummary:
    """The summary of a stored episode; IntegrityError if its body is bad."""
    episode = decode_episode(record)
    effects: dict[int, list[str]] = {}
    for event in episode.events:
        if isinstance(event, DbChange):
            effects.setdefault(event.index, []).append(f"db {event.service}")
        elif isinstance(event, FileChange):
            effects.setdefault(event.index, []).append(f"file {event.path}")
    calls = tuple(
        CallSummary(index=c.index, ts=c.ts, call=call_name(c), failed=call_failed(c),
                    effects=tuple(effects.get(c.index, [])), response=call_response(c))
        for c in episode.calls)
    return EpisodeSummary(
        episode_id=record.episode_id, persona=episode.persona, day=episode.day,
        world_hash=episode.world_hash, final_hash=record.final_hash, task=episode.task,
        agent=episode.agent, calls=calls, n_errors=sum(c.failed for c in calls),
        n_db_changes=sum(isinstance(e, DbChange) for e in episode.events),
        n_file_changes=sum(isinstance(e, FileChange) for e in episode.events))


def list_episodes(worlds: Worlds, *, task: str | None = None, agent: str | None = None
                  ) -> list[EpisodeSummary]:
    """Every stored episode (sorted by id), or those of `task` and/or `agent` (as recorded
    by the rollout that ran them: a task id, an agent name such as
    ``scripted:reference``)."""
    summaries = [summarize_episode(record) for record in worlds.store.episodes()]
    return [s for s in summaries
            if (task is None or s.task == task) and (agent is None or s.agent == agent)]


__all__ = ["CallSummary", "EpisodeSummary", "call_failed", "decode_episode",
           "episode_record", "list_episodes", "load_episode", "replay_episode",
           "save_episode", "summarize_episode", "verify_episode", "verify_episodes"]
