"""Episodes: everything an instance did, as events on top of its snapshot.

An episode starts at a snapshot (its world hash). Every tool call appends a ``ToolCall``
record (tool, arguments, response); every shell command a ``ShellCall``; every GUI action
in the instance's browser a ``GuiCall`` (with its screenshot's digest). Calls that change
state are followed by their effects: ``DbChange`` (the SQLite session extension's
changeset of one service, plus its ``sqlite_sequence`` rows when they moved) and
``FileChange`` (a workspace file written or deleted). Replaying the effects, in order, onto
a fresh mount of the snapshot reproduces the instance's final world, hash for hash: a
changeset already holds what the world's triggers wrote during the call, so it is applied
with triggers off (they would write it twice, and on the host's clock and time zone).
"""

from __future__ import annotations

import os
from pathlib import Path

import apsw
import msgspec

from replay.files import remove_tree
from replay.layout import workspace_path
from replay.mount import Mount


class _Event(msgspec.Struct, kw_only=True, frozen=True, tag_field="type"):
    index: int  # the call this event belongs to (0, 1, 2, ...)


class ToolCall(_Event, tag="tool_call", frozen=True):
    ts: str
    tool: str
    arguments: dict[str, object]
    is_error: bool
    text: str
    structured: object = None
    writes: bool = False


class ShellCall(_Event, tag="shell_call", frozen=True, omit_defaults=True):
    ts: str
    command: str
    exit_code: int | None  # None: killed for a limit, or refused
    stdout: str
    stderr: str
    truncated: bool
    timed_out: bool
    # Why what the command left in the workspace was refused (a special file, a quota):
    # its changes were rolled back and no FileChange follows. None: accepted.
    refused: str | None = None


class FormSubmission(msgspec.Struct, frozen=True, omit_defaults=True):
    """A form a GUI action submitted: the tool it ran, with which arguments, and whether
    the tool refused (its error text then)."""

    tool: str
    arguments: dict[str, object]
    is_error: bool = False
    text: str = ""


class GuiCall(_Event, tag="gui_call", frozen=True, omit_defaults=True):
    """One GUI action in the instance's browser (``worldenv.gui.tools``): what the agent did, what
    it
    was told, the page it ended on and the digest of the screenshot taken after it. A form
    the action submitted ran its service's tool under this call's clock: its writes follow
    as ``DbChange`` events of this call's index, and ``forms`` names the tools they ran."""

    ts: str
    action: str  # open, click, type, key, scroll, screenshot, read, request
    arguments: dict[str, object]
    is_error: bool
    text: str
    url: str | None = None
    screenshot: str | None = None  # digest of the PNG (kept in Episode.screenshots)
    forms: list[FormSubmission] = []


class DbChange(_Event, tag="db_change", frozen=True):
    service: str
    changeset: bytes
    sequences: list[tuple[str, int]] | None = None  # sqlite_sequence after the call


class FileChange(_Event, tag="file_change", frozen=True):
    path: str
    data: bytes | None  # None: the file was deleted
    link: str | None = None  # symlink target, for symlinks


EpisodeEvent = ToolCall | ShellCall | GuiCall | DbChange | FileChange
Call = ToolCall | ShellCall | GuiCall


class Episode(msgspec.Struct, kw_only=True):
    episode_id: str
    world_hash: str
    persona: str
    day: int
    events: list[EpisodeEvent] = msgspec.field(default_factory=list)
    final_hash: str | None = None
    answer: str | None = None  # the agent's final answer, when it gave one (for verifiers)
    task: str | None = None  # the task a rollout ran it for (its task_id), if any
    agent: str | None = None  # the agent that ran it (e.g. "scripted:reference"), if known
    # The PNG screenshots of GUI calls by digest (GuiCall.screenshot); not part of the
    # episode's content id: a screenshot is what the agent saw, its digest is recorded.
    screenshots: dict[str, bytes] = msgspec.field(default_factory=dict)

    @property
    def calls(self) -> list[Call]:
        return [e for e in self.events if isinstance(e, ToolCall | ShellCall | GuiCall)]

    def to_json(self) -> bytes:
        return msgspec.json.encode(self)

    @classmethod
    def from_json(cls, data: bytes) -> Episode:
        return msgspec.json.decode(data, type=cls)


def apply_effects(mount: Mount, events: list[EpisodeEvent]) -> None:
    """Replay an episode's effects onto a mount of its snapshot (in order)."""
    for event in events:
        if isinstance(event, DbChange):
            _apply_db_change(mount.db_path(event.service), event)
        elif isinstance(event, FileChange):
            _apply_file_change(mount.path, event)


def _apply_db_change(path: Path, change: DbChange) -> None:
    conn = apsw.Connection(str(path))
    # The changeset holds every row the call's triggers wrote: firing them again would
    # write those twice, and run the world's SQL here, on the host's clock and time zone.
    conn.config(apsw.SQLITE_DBCONFIG_ENABLE_TRIGGER, 0)
    try:
        conn.execute("BEGIN")
        apsw.Changeset.apply(change.changeset, conn)
        if change.sequences is not None:
            conn.execute("DELETE FROM sqlite_sequence")
            for name, seq in change.sequences:
                conn.execute("INSERT INTO sqlite_sequence(name, seq) VALUES (?, ?)", (name, seq))
        conn.execute("COMMIT")
    finally:
        conn.close()


def _apply_file_change(root: Path, change: FileChange) -> None:
    target = workspace_path(root, change.path)  # refuses a path through a symlink
    remove_tree(target)  # whatever stands there: a file, a link (never its target), a tree
    if change.data is None and change.link is None:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    if change.link is not None:
        target.symlink_to(change.link)
        return
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644)
    with open(fd, "wb", closefd=True) as fh:
        fh.write(change.data or b"")
