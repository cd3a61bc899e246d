"""`worldctl demo` prints what the real commands print, on the demo pack's data; it says
where it writes its store and leaves no temporary directory behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from packs.registry import load_pack
from replay.engine import Worlds

WORLDCTL = Path(sys.executable).parent / "worldctl"


class Demo:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.tmp = root / "tmp"
        self.tmp.mkdir()
        self.store = root / "work" / ".worldctl"
        self.store.parent.mkdir()
        self.env = {**os.environ, "TMPDIR": str(self.tmp)}
        self.env.pop("WORLDCTL_STORE", None)
        self.env.pop("WORLDCTL_CACHE", None)
        done = subprocess.run([str(WORLDCTL), "demo"], cwd=self.store.parent, env=self.env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        self.stdout = done.stdout

    def command(self, *args: str) -> str:
        done = subprocess.run([str(WORLDCTL), *args], cwd=self.store.parent, env=self.env,
                              capture_output=True, text=True, timeout=120, check=True)
        return done.stdout

    def step(self, command: str) -> str:
        """What the demo printed under `$ command`, up to the next step."""
        after = self.stdout.split(f"\n$ {command}", 1)[1].split("\n", 1)[1]
        return after.split("\n$ ", 1)[0]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    return Demo(tmp_path_factory.mktemp("demo"))


def test_the_demo_says_where_it_writes_its_store(demo: Demo) -> None:
    first = demo.stdout.splitlines()[0]
    assert f"writes its store to {demo.store.resolve()} " in first and "--store" in first
    with Worlds.open(demo.store, create=False) as worlds:
        assert len(worlds.store.days("lars")) == 8 and worlds.store.episodes()


def test_the_demo_uses_the_demo_packs_data(demo: Demo) -> None:
    pack = load_pack("demo")
    assert f"\n$ worldctl import {pack.worlds[0]}\n" in demo.stdout
    assert f"\n$ worldctl task check {pack.task_dir('mats-work-order')}" in demo.stdout
    assert str(pack.episode("demo")) in demo.stdout


@pytest.mark.parametrize("command", ["personas", "diff lars@4 lars@5 --max-rows 8"])
def test_each_step_prints_what_its_command_prints(demo: Demo, command: str) -> None:
    assert demo.step(f"worldctl {command}").strip() == demo.command(*command.split()).strip()


def test_the_checkout_and_hash_steps_print_what_their_commands_print(demo: Demo,
                                                                     tmp_path: Path) -> None:
    # The demo checked out into a temporary directory it removed since: check out again
    # elsewhere and compare with that path in place of the demo's.
    used = demo.stdout.split("\n$ worldctl checkout lars@5 ", 1)[1].split("\n", 1)[0]
    mine = str(tmp_path / "lars5")
    shown = demo.step(f"worldctl checkout lars@5 {used}").replace(used, mine)
    assert shown.strip() == demo.command("checkout", "lars@5", mine).strip()
    shown = demo.step(f"worldctl hash {used}")
    assert shown.startswith(demo.command("hash", mine))  # then the demo's note on it


def test_the_episode_steps_print_what_episode_show_and_verify_print(demo: Demo) -> None:
    episode_id = demo.stdout.split("\n$ worldctl episode show ", 1)[1].split("\n", 1)[0]
    with Worlds.open(demo.store, create=False) as worlds:
        assert worlds.store.episode(episode_id).persona == "lars"
    shown = demo.step(f"worldctl episode show {episode_id}")
    real = demo.command("episode", "show", episode_id)
    assert shown.startswith(real)  # then the instance's diff, which the demo adds
    verified = demo.step(f"worldctl episode verify {episode_id}")
    assert verified.strip() == demo.command("episode", "verify", episode_id).strip()


def test_the_demo_removes_its_temporary_directories(demo: Demo) -> None:
    assert list(demo.tmp.iterdir()) == []
    assert "(removed the temporary checkout " in demo.stdout
