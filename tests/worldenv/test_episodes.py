"""Episodes in the world store, on both backends: save/load round trip, replay to the
instance's final hash, verify (and its failures on tampered records), write-once storage,
`worldctl episode show|replay|verify`, and the 0001 -> 0002 migration on open.

The instance runs a small app of its own over the demo world's `notes` service (as
tests/worldenv/test_instance.py does), so nothing here depends on the shipped apps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
import sqlalchemy as sa

from replay import Worlds
from replay.errors import IntegrityError
from tests.support.notes_app import notes_app
from worldenv.core.episode import DbChange, Episode, FileChange, ShellCall, ToolCall
from worldenv.instances.episodes import (
    episode_record,
    load_episode,
    replay_episode,
    save_episode,
    verify_episode,
)
from worldenv.instances.instance import Environment
from worldstore.errors import ConflictError, NotFoundError
from worldstore.migrate import head_revision
from worldstore.open import open_event_store
from worldstore.sqlstore import SqlEventStore

DEMO = Path(__file__).resolve().parents[2] / "packs" / "demo" / "world" / "lars.jsonl"
WORLDCTL = Path(sys.executable).parent / "worldctl"
TITLE = "Episode-title"

notes = notes_app("episode-test-notes")


@dataclass
class Saved:
    worlds: Worlds
    location: str
    cache: Path
    episode_id: str
    episode: Episode  # the instance's episode when it was saved
    final_hash: str

    @property
    def store(self) -> SqlEventStore:
        assert isinstance(self.worlds.store, SqlEventStore)
        return self.worlds.store

    def sql(self, statement: str, **params: object) -> None:
        with self.store.engine.begin() as conn:
            conn.execute(sa.text(statement), params)


@pytest.fixture
def saved(store_location: str, cache_dir: Path) -> Iterator[Saved]:
    """The demo world, one instance of lars@7 with reads, writes and a refused call, and
    its episode saved in the store."""
    with Worlds.open(store_location, cache_dir) as worlds:
        worlds.import_file(DEMO)
        env = Environment(worlds, apps={"notes": notes}, check_pins=False)
        with env.open("lars@7") as inst:
            assert not inst.call_tool("notes_get_note", {"note_id": 4}).is_error
            assert not inst.call_tool("notes_rename_note",
                                      {"note_id": 4, "title": TITLE}).is_error
            refused = inst.call_tool("notes_rename_note", {"note_id": 999, "title": "x"})
            assert refused.is_error and refused.text == "No note with id 999"
            assert not inst.call_tool("notes_rename_note", {"note_id": 5, "title": "B"}).is_error
            final = inst.hash()
            assert final != inst.record.world_hash
            episode_id = save_episode(worlds, inst)
            assert episode_id == inst.episode.episode_id
            assert inst.episode.final_hash is None  # the instance's episode is left alone
            yield Saved(worlds, store_location, cache_dir, episode_id,
                        Episode.from_json(inst.episode.to_json()), final)


def worldctl(saved: Saved, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(WORLDCTL), "--store", saved.location, "--cache", str(saved.cache), *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "250"},
    )


def tampered_body(saved: Saved, old: bytes, new: bytes) -> bytes:
    """The stored body with `old` replaced by `new` inside the episode's first changeset."""
    episode = load_episode(saved.worlds, saved.episode_id)
    i, change = next((i, e) for i, e in enumerate(episode.events) if isinstance(e, DbChange))
    assert change.changeset.count(old) == 1
    events = list(episode.events)
    events[i] = msgspec.structs.replace(change,
                                        changeset=change.changeset.replace(old, new))
    return msgspec.structs.replace(episode, events=events).to_json()


# --- the library ------------------------------------------------------------------------


def test_saved_episode_loads_replays_and_verifies(saved: Saved) -> None:
    worlds = saved.worlds
    loaded = load_episode(worlds, saved.episode_id)
    assert loaded == msgspec.structs.replace(saved.episode, final_hash=saved.final_hash)
    assert [type(e) for e in loaded.events] == [ToolCall, ToolCall, DbChange, ToolCall,
                                                ToolCall, DbChange]
    assert replay_episode(worlds, loaded) == saved.final_hash
    ok, message = verify_episode(worlds, saved.episode_id)
    assert ok, message
    assert saved.episode_id in message and "lars@7" in message

    (record,) = worlds.store.episodes()
    assert record == worlds.store.episode(saved.episode_id)
    assert (record.world_hash, record.persona, record.day, record.final_hash,
            record.n_calls) == (worlds.resolve("lars@7").world_hash, "lars", 7,
                                saved.final_hash, 4)
    assert worlds.store.episodes(record.world_hash) == [record]
    assert worlds.store.episodes(worlds.resolve("lars@6").world_hash) == []
    # Replay and verify removed their mounts: only the instance's own remains under tmp/.
    assert len(list(worlds.cache.tmp.glob("*/services"))) == 1


def test_episodes_are_write_once(saved: Saved) -> None:
    store = saved.worlds.store
    record = store.episode(saved.episode_id)
    store.put_episode(record)  # the same again: a no-op
    assert save_episode(saved.worlds, load_episode(saved.worlds, saved.episode_id)) == \
        saved.episode_id
    assert store.episodes() == [record]
    with pytest.raises(ConflictError, match=saved.episode_id):
        store.put_episode(msgspec.structs.replace(record, body=record.body + b" "))
    with pytest.raises(ConflictError, match=saved.episode_id):
        store.put_episode(msgspec.structs.replace(record, final_hash=None))
    assert store.episodes() == [record]
    with pytest.raises(NotFoundError, match="nope"):
        store.episode("nope")
    with pytest.raises(NotFoundError):
        load_episode(saved.worlds, "nope")


def test_racing_writers_of_the_same_episode_both_succeed(saved: Saved) -> None:
    record = msgspec.structs.replace(saved.worlds.store.episode(saved.episode_id),
                                     episode_id="f" * 32)
    stores = [open_event_store(saved.location) for _ in range(4)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(stores))

    def put(store: SqlEventStore) -> None:
        barrier.wait()
        try:
            store.put_episode(record)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=put, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in stores:
        s.close()
    assert errors == []
    assert [r.episode_id for r in saved.worlds.store.episodes()] == sorted(
        [saved.episode_id, "f" * 32])


def test_an_episode_with_files_and_no_final_hash_gets_one_on_save(saved: Saved) -> None:
    """A bare Episode (shell call, workspace file written) records the hash it replays to."""
    start = saved.worlds.resolve("lars@7").world_hash
    episode = Episode(episode_id="e" * 32, world_hash=start, persona="lars", day=7, events=[
        ShellCall(index=1, ts="2026-03-09T17:05:01Z", command="echo hi > notes/hi.txt",
                  exit_code=0, stdout="", stderr="", truncated=False, timed_out=False),
        FileChange(index=1, path="notes/hi.txt", data=b"hi\n"),
    ])
    assert save_episode(saved.worlds, episode) == "e" * 32
    record = saved.worlds.store.episode("e" * 32)
    assert record.final_hash is not None and record.final_hash != start
    assert record.n_calls == 1
    assert verify_episode(saved.worlds, "e" * 32)[0]
    assert [r.episode_id for r in saved.worlds.store.episodes(start)] == sorted(
        ["e" * 32, saved.episode_id])


# --- tampering --------------------------------------------------------------------------


def test_a_changed_byte_in_a_changeset_fails_verify(saved: Saved) -> None:
    body = tampered_body(saved, TITLE.encode(), TITLE[:-1].encode() + b"X")
    saved.sql("UPDATE episodes SET body = :b WHERE episode_id = :e", b=body,
              e=saved.episode_id)
    ok, message = verify_episode(saved.worlds, saved.episode_id)
    assert not ok
    assert saved.episode_id in message
    assert f"recorded final hash is {saved.final_hash}" in message


def test_a_changed_final_hash_fails_verify(saved: Saved) -> None:
    bogus = "0" * 32
    saved.sql("UPDATE episodes SET final_hash = :h WHERE episode_id = :e", h=bogus,
              e=saved.episode_id)
    ok, message = verify_episode(saved.worlds, saved.episode_id)
    assert not ok and saved.episode_id in message
    assert "disagrees with its body" in message and bogus in message
    # Changed in the body too, consistently: replay itself gives the other hash.
    body = msgspec.structs.replace(load_episode(saved.worlds, saved.episode_id),
                                   final_hash=bogus).to_json()
    saved.sql("UPDATE episodes SET body = :b WHERE episode_id = :e", b=body,
              e=saved.episode_id)
    ok, message = verify_episode(saved.worlds, saved.episode_id)
    assert not ok and saved.episode_id in message
    assert f"replays to {saved.final_hash}, but the recorded final hash is {bogus}" in message


@pytest.mark.parametrize("change", ["garbage body", "unknown world", "bad changeset"])
def test_other_broken_records_fail_verify_without_crashing(saved: Saved, change: str) -> None:
    if change == "garbage body":
        saved.sql("UPDATE episodes SET body = :b WHERE episode_id = :e", b=b"{not json",
                  e=saved.episode_id)
    elif change == "unknown world":
        other = "1" * 32
        moved = msgspec.structs.replace(load_episode(saved.worlds, saved.episode_id),
                                        world_hash=other)
        saved.sql("UPDATE episodes SET body = :b, world_hash = :w WHERE episode_id = :e",
                  b=moved.to_json(), w=other, e=saved.episode_id)
    else:
        episode = load_episode(saved.worlds, saved.episode_id)
        events = [msgspec.structs.replace(e, changeset=b"\x01\x02\x03" + e.changeset[3:])
                  if isinstance(e, DbChange) else e for e in episode.events]
        saved.sql("UPDATE episodes SET body = :b WHERE episode_id = :e",
                  b=msgspec.structs.replace(episode, events=events).to_json(),
                  e=saved.episode_id)
    ok, message = verify_episode(saved.worlds, saved.episode_id)
    assert not ok and saved.episode_id in message
    if change == "garbage body":
        with pytest.raises(IntegrityError, match=saved.episode_id):
            load_episode(saved.worlds, saved.episode_id)
    elif change == "unknown world":
        assert "not a stored persona-day" in message
    else:
        assert "replay failed" in message


# --- the CLI ----------------------------------------------------------------------------


def test_cli_show_replay_verify(saved: Saved) -> None:
    shown = worldctl(saved, "episode", "show", saved.episode_id)
    assert shown.returncode == 0, shown.stderr
    for text in ("notes_rename_note", "ERROR", "No note with id 999", "db notes",
                 TITLE, f"-> {saved.final_hash}",
                 "4 calls, 1 errors; effects: 2 db changes, 0 file changes"):
        assert text in shown.stdout, (text, shown.stdout)

    as_json = worldctl(saved, "episode", "show", saved.episode_id, "--json")
    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    assert (data["n_calls"], data["effects"], data["final_hash"]) == (
        4, {"db_change": 2, "file_change": 0}, saved.final_hash)
    assert [e["type"] for e in data["events"]] == ["tool_call", "tool_call", "db_change",
                                                   "tool_call", "tool_call", "db_change"]

    replayed = worldctl(saved, "episode", "replay", saved.episode_id)
    assert replayed.returncode == 0, replayed.stderr
    assert replayed.stdout.splitlines()[-1] == saved.final_hash

    verified = worldctl(saved, "episode", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "episode verify OK: 1 episodes checked" in verified.stdout

    missing = worldctl(saved, "episode", "show", "nope")
    assert missing.returncode == 2 and "error:" in missing.stderr and "nope" in missing.stderr

    saved.sql("UPDATE episodes SET body = :b WHERE episode_id = :e",
              b=tampered_body(saved, TITLE.encode(), TITLE[:-1].encode() + b"X"),
              e=saved.episode_id)
    replayed = worldctl(saved, "episode", "replay", saved.episode_id)
    assert replayed.returncode == 1
    assert replayed.stdout.splitlines()[-1] != saved.final_hash
    assert "MISMATCH" in replayed.stderr and saved.episode_id in replayed.stderr
    for args in (["--all"], [saved.episode_id]):
        verified = worldctl(saved, "episode", "verify", *args)
        assert verified.returncode == 1
        assert f"FAILED episode {saved.episode_id}" in verified.stdout
        assert "1 failed" in verified.stdout


# --- the migration ----------------------------------------------------------------------


def test_a_store_at_0001_is_upgraded_on_open(store_location: str) -> None:
    store = open_event_store(store_location)
    with store.engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE episodes"))
        conn.execute(sa.text("DROP TABLE claims"))
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '0001_initial'"))
    store.close()
    store = open_event_store(store_location)
    try:
        with store.engine.connect() as conn:
            version = conn.execute(sa.text("SELECT version_num FROM alembic_version")).all()
        assert version == [(head_revision(),)]
        assert head_revision() == "0003_claims"
        inspector = sa.inspect(store.engine)
        assert {"episodes", "claims"} <= set(inspector.get_table_names())
        assert "ix_episodes_world_hash" in {i["name"] for i in inspector.get_indexes("episodes")}
        assert store.episodes() == []
        record = episode_record(Episode(episode_id="a" * 32, world_hash="b" * 32,
                                        persona="lars", day=0, final_hash="c" * 32))
        store.put_episode(record)
        assert store.episodes("b" * 32) == [record]
    finally:
        store.close()
