"""A recorded episode turned into a day (synth.worlds.days) on the bundled demo world: tool calls
(a note created with tags, a note updated and one deleted, a chat message) and shell
commands (a text file, a binary file, a removed file) on a real instance of ``lars@7``
become ``lars@8``, whose hash is the episode's final hash, which the store then replays;
and the refusals: not the last day, a symlink, a final hash the effects do not reach."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from packs.registry import load_pack
from replay.engine import Worlds
from synth.errors import SynthError
from synth.worlds.days import day_from_episode, store_day
from tests.support.cli_harness import invoke, refused
from worldenv.instances.episodes import load_episode, save_episode
from worldenv.instances.instance import Environment

DEMO = load_pack("demo").worlds[0]


@pytest.fixture
def worlds(tmp_path: Path) -> Iterator[Worlds]:
    with Worlds.open(tmp_path / "store") as opened:
        opened.import_file(DEMO)
        yield opened


def _act(worlds: Worlds, ref: str = "lars@7", *, link: bool = False) -> tuple[str, str]:
    """An agent's day on `ref`; (episode id, final hash)."""
    with Environment(worlds) as env, env.open(ref) as instance:
        made = instance.call_tool("notes_create_note", {
            "notebook_id": 1, "title": "Day 8 plan", "body": "- [ ] call Sofie",
            "tags": ["plan", "day8"]})
        assert not made.is_error, made.text
        conversations = instance.call_tool("chat_list_conversations", {})
        assert isinstance(conversations.structured, dict), conversations.text
        talk = conversations.structured["items"][0]["id"]
        for name, arguments in (("notes_update_note", {"note_id": 9, "append": "Done."}),
                                ("notes_delete_note", {"note_id": 2}),
                                ("chat_send_message", {"conversation_id": talk,
                                                       "body": "See you Thursday!"})):
            result = instance.call_tool(name, arguments)
            assert not result.is_error, (name, result.text)
        listing = instance.shell("mkdir -p reports && printf 'week 8\\n' > reports/w8.md && "
                                 "printf '\\377\\000\\001' > reports/raw.bin && ls")
        assert listing.exit_code == 0, listing.stderr
        first = sorted(listing.stdout.split())[0]
        assert instance.shell(f"rm -rf -- {first}").exit_code == 0
        if link:
            assert instance.shell("ln -s /etc/passwd reports/passwd").exit_code == 0
        final = instance.hash()
        return save_episode(worlds, instance), final


def test_an_episode_becomes_the_next_day_with_its_final_hash(worlds: Worlds) -> None:
    episode_id, final = _act(worlds)
    made = day_from_episode(worlds, load_episode(worlds, episode_id))
    assert (made.persona, made.day, made.world_hash) == ("lars", 8, final)
    lines = [msgspec.json.decode(line) for line in made.lines.splitlines()]
    kinds = {line["type"] for line in lines}
    assert kinds == {"sql", "file_write", "file_delete"}
    assert any(line["sql"].startswith("UPDATE") for line in lines if line["type"] == "sql")
    assert any("base64" in line for line in lines if line["type"] == "file_write")
    episode = load_episode(worlds, episode_id)
    stamps = {e.ts for e in episode.calls}
    assert {line["ts"] for line in lines} <= stamps  # the calls' frozen clock, nothing else
    record = store_day(worlds, made, source="<test episode>")
    assert record.world_hash == final
    assert [r.status for r in worlds.replay("lars")][-1] == "replayed"
    assert worlds.snapshot("lars", 8).is_dir()


def test_the_same_episode_gives_the_same_day(worlds: Worlds, tmp_path: Path) -> None:
    first_id, _ = _act(worlds)
    with Worlds.open(tmp_path / "other") as other:
        other.import_file(DEMO)
        second_id, _ = _act(other)
        assert first_id == second_id  # the episode is content-addressed
        assert day_from_episode(other, load_episode(other, second_id)).lines == \
            day_from_episode(worlds, load_episode(worlds, first_id)).lines


def test_refusals_leave_the_store_as_it_was(worlds: Worlds) -> None:
    early_id, _ = _act(worlds, "lars@6")
    with pytest.raises(SynthError, match="the log goes on to day 7"):
        day_from_episode(worlds, load_episode(worlds, early_id))
    linked_id, _ = _act(worlds, link=True)
    with pytest.raises(SynthError, match="'reports/passwd' is a symlink"):
        day_from_episode(worlds, load_episode(worlds, linked_id))
    good_id, _ = _act(worlds)
    forged = msgspec.structs.replace(load_episode(worlds, good_id), final_hash="f" * 32)
    with pytest.raises(SynthError, match=r"replay to .* not to the episode's final world"):
        day_from_episode(worlds, forged)
    assert max(r.day for r in worlds.store.days("lars")) == 7


def test_synth_day_from_an_episode_on_the_command_line(worlds: Worlds,
                                                       tmp_path: Path) -> None:
    episode_id, final = _act(worlds)
    store = str(tmp_path / "store")
    worlds.close()
    wrong = refused(invoke("--store", store, "synth", "day", "lars", "--day", "9",
                           "--from-episode", episode_id, "--run", str(tmp_path / "run")))
    assert "makes day 8 of lars, not day 9" in wrong
    result = invoke("--store", store, "synth", "day", "lars", "--day", "8",
                    "--from-episode", episode_id, "--run", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    assert f"lars@8 {final}" in result.output
    again = refused(invoke("--store", store, "synth", "day", "lars", "--day", "8",
                           "--from-episode", episode_id, "--run", str(tmp_path / "run")))
    assert "the log goes on to day 8" in again
