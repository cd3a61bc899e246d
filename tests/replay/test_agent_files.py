"""Files an agent creates are data, never instructions to the host.

Real instances of the demo world, the real sandboxed shell: whatever a command leaves in
its workspace (deep trees, FIFOs, sockets, symlinks to host files or out of the
workspace, symlink loops, sparse or huge files, too many files, names no world can hold)
is either recorded as what it is (a symlink as its target text) or refused with an error
result whose changes are rolled back. Afterwards hash, diff, reset, close, episode replay
and reopening the store all work, nothing blocks, and no host file's content shows up.
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

from replay import Worlds
from replay.errors import WorldDirError
from replay.files import remove_tree
from worldctl.main import cli
from worldenv.core.episode import FileChange, ShellCall, apply_effects
from worldenv.core.workspace import WorkspaceLimits
from worldenv.instances.instance import Environment, Instance
from worldenv.sandbox.contract import Limits
from worldstore.errors import ConfigError

DEMO = Path(__file__).resolve().parents[2] / "packs" / "demo" / "world" / "lars.jsonl"
SECRET = "TOPSECRET-7f3a9c-host-only"
# Python is in the sandbox (/usr is bound); bash's `cd` gets slow thousands of levels down.
DEEP = ("python3 -c \"import os\nfor _ in range({n}): os.mkdir('d'); os.chdir('d')\n"
        "open('leaf', 'w').write('x')\"")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("store")
    with Worlds.open(root) as worlds:
        worlds.import_file(DEMO)
    return root


@pytest.fixture
def worlds(store: Path) -> Iterator[Worlds]:
    with Worlds.open(store) as w:
        yield w


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "secret.txt"
    path.write_text(f"{SECRET}\n")
    return path


@pytest.fixture
def inst(worlds: Worlds) -> Iterator[Instance]:
    with Environment(worlds).open("lars@7") as instance:
        yield instance


def _within(seconds: float, work: Callable[[], Any]) -> Any:
    """Run `work`, failing (instead of hanging the suite) if it blocks."""
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(work()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"blocked for more than {seconds} s"
    return box[0]


def _refused(call: ShellCall, *words: str) -> None:
    assert call.refused is not None and call.exit_code is None
    assert "rolled back" in call.stderr and call.stderr.rstrip().splitlines()[-1].startswith(
        "error: ")
    for word in words:
        assert word in call.refused


def _assert_intact(inst: Instance, worlds: Worlds, expected: str | None = None) -> None:
    """hash and diff work and agree with a replay of the episode; nothing secret leaks."""
    final = _within(60, inst.hash)
    assert final == (expected or final)
    diff = _within(60, inst.diff)
    assert diff.after == final
    episode = msgspec.json.encode(inst.episode).decode()
    for text in (episode, msgspec.json.encode(diff).decode()):
        assert SECRET not in text and "root:x:0:0" not in text
    with worlds.mount(inst.record.world_hash) as fresh:
        apply_effects(fresh, inst.episode.events)
        assert fresh.hash() == final


def _no_changes_of(inst: Instance, call: ShellCall) -> None:
    assert not [e for e in inst.episode.events
                if isinstance(e, FileChange) and e.index == call.index]


def _reopen(store: Path) -> None:
    with Worlds.open(store) as again:
        assert again.record("lars@7").world_hash


# --- deep trees ------------------------------------------------------------------------


def test_a_1100_deep_tree_is_refused_and_everything_still_works(
        inst: Instance, worlds: Worlds, store: Path) -> None:
    call = inst.shell(DEEP.format(n=1100))
    _refused(call, "levels deep", "at most 64")
    _no_changes_of(inst, call)
    assert not (inst.mount.workspace / "d").exists()
    _assert_intact(inst, worlds, inst.record.world_hash)
    assert inst.shell("echo ok > ok.txt").refused is None  # the instance goes on
    inst.reset()
    assert inst.hash() == inst.record.world_hash
    path = inst.mount.path
    inst.close()
    assert not path.exists()
    _reopen(store)


def test_a_tree_just_within_the_depth_quota_is_kept(worlds: Worlds) -> None:
    env = Environment(worlds, workspace_limits=WorkspaceLimits(max_depth=10))
    with env.open("lars@7") as inst:
        assert inst.shell(DEEP.format(n=9)).refused is None  # leaf at depth 10
        changes = [e for e in inst.episode.events if isinstance(e, FileChange)]
        assert [c.path for c in changes] == ["d/" * 9 + "leaf"]
        _assert_intact(inst, worlds)
        _refused(inst.shell("cd d/d/d/d/d/d/d/d/d && mkdir d && touch d/x"), "11 levels")


def test_a_deep_tree_placed_under_an_instance_by_anyone_is_cleared(
        inst: Instance, worlds: Worlds, store: Path) -> None:
    """The host's own walks bound depth too: a tree no shell call could leave (made here,
    3,000 deep) gives a clear refusal from hash, and reset and close remove it."""
    _make_deep(inst.mount.workspace / "deep", 3000)
    with pytest.raises(WorldDirError, match="deeper than"):
        inst.mount.hash()
    inst.reset()
    assert inst.hash() == inst.record.world_hash
    _make_deep(inst.mount.workspace / "deep", 3000)
    inst.close()
    assert not inst.mount.path.exists()
    _reopen(store)


def _make_deep(top: Path, levels: int, name: str = "d") -> None:
    top.mkdir()
    fd = os.open(top, os.O_RDONLY)
    try:
        for _ in range(levels):
            os.mkdir(name, dir_fd=fd)
            child = os.open(name, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = child
        os.mkfifo("p", dir_fd=fd)
    finally:
        os.close(fd)


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_the_store_opens_over_deep_and_closed_leftovers_in_its_scratch(
        tmp_path: Path) -> None:
    with Worlds.open(tmp_path / "s") as worlds:
        worlds.import_file(DEMO)
        scratch = worlds.cache.tmp
    pid = _dead_pid()
    _make_deep(scratch / f"{pid}-1", 1500)
    _make_deep(scratch / f"{pid}-2", 40, name="n" * 250)  # paths far over PATH_MAX
    closed = scratch / f"{pid}-3"
    (closed / "a" / "b").mkdir(parents=True)
    (closed / "a" / "b" / "f").write_text("x")
    os.symlink("/etc", closed / "a" / "etc")  # removed as a link, /etc untouched
    for folder in (closed / "a" / "b", closed / "a", closed):
        folder.chmod(0)
    with Worlds.open(tmp_path / "s") as worlds:
        assert worlds.record("lars@7")
        assert sorted(os.listdir(worlds.cache.tmp)) == []
    assert Path("/etc/passwd").exists()


def test_an_undeletable_leftover_is_skipped_and_the_store_still_opens(
        tmp_path: Path) -> None:
    with Worlds.open(tmp_path / "s") as worlds:
        worlds.import_file(DEMO)
        scratch = worlds.cache.tmp
    stuck = scratch / f"{_dead_pid()}-9"
    (stuck / "sub").mkdir(parents=True)
    (stuck / "sub" / "f").write_text("x")
    if subprocess.run(["chattr", "+i", str(stuck / "sub")], capture_output=True).returncode:
        pytest.skip("chattr +i is not available here (no undeletable files to test with)")
    try:
        with Worlds.open(tmp_path / "s") as worlds:
            assert worlds.record("lars@7")
            left = os.listdir(worlds.cache.tmp)
            assert len(left) == 1  # moved aside under this process's name, kept
    finally:
        for leftover in scratch.iterdir():
            for sub in leftover.rglob("sub"):
                subprocess.run(["chattr", "-i", str(sub)], check=False)
            remove_tree(leftover)


# --- special files -----------------------------------------------------------------------


def test_a_fifo_is_refused_without_blocking(inst: Instance, worlds: Worlds) -> None:
    call = _within(60, lambda: inst.shell("mkfifo p && echo made"))
    _refused(call, "p is a fifo")
    assert call.stdout == "made\n"
    assert not os.path.lexists(inst.mount.workspace / "p")
    _assert_intact(inst, worlds, inst.record.world_hash)


def test_a_unix_socket_is_refused_and_later_hashes_work(inst: Instance,
                                                        worlds: Worlds) -> None:
    call = inst.shell("python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('s')\"")
    _refused(call, "s is a socket")
    assert inst.shell("echo after > after.txt").refused is None
    _assert_intact(inst, worlds)
    assert inst.hash() == inst.hash()


def test_special_files_the_host_finds_are_recorded_by_kind_never_opened(
        inst: Instance, worlds: Worlds) -> None:
    """Whatever bypassed the shell's check, hash and diff record a FIFO or a socket by
    kind (the hash differs from the snapshot's) and never open it; reset removes them."""
    workspace = inst.mount.workspace
    os.mkfifo(workspace / "p")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(workspace / "s"))
    try:
        changed = _within(60, inst.hash)
        assert changed != inst.record.world_hash
        kinds = {f.path: f.kind_after for f in _within(60, inst.diff).files}
        assert kinds == {"p": "fifo", "s": "socket"}
        inst.reset()
        assert inst.hash() == inst.record.world_hash
    finally:
        sock.close()


# --- symlinks ----------------------------------------------------------------------------


def test_a_file_replaced_by_a_symlink_to_a_host_file_is_never_read(
        inst: Instance, worlds: Worlds, secret: Path) -> None:
    first = inst.shell("echo mine > note.txt")
    assert first.refused is None
    call = inst.shell(f"rm docs/rates.md note.txt && ln -s {secret} docs/rates.md && "
                      f"ln -s /etc/passwd note.txt && ln -s /etc/shadow shadow")
    assert call.refused is None
    links = {e.path: e.link for e in inst.episode.events if isinstance(e, FileChange)
             and e.index == call.index}
    assert links == {"docs/rates.md": str(secret), "note.txt": "/etc/passwd",
                     "shadow": "/etc/shadow"}
    diff = inst.diff()
    rates = next(f for f in diff.files if f.path == "docs/rates.md")
    assert (rates.kind_before, rates.kind_after, rates.link_after) == (
        None, "symlink", str(secret))
    assert rates.text_diff is None
    _assert_intact(inst, worlds)
    inst.reset()
    assert inst.hash() == inst.record.world_hash
    assert not (inst.mount.workspace / "docs" / "rates.md").is_symlink()


def test_symlinks_out_of_the_workspace_and_loops_are_kept_as_text(
        inst: Instance, worlds: Worlds) -> None:
    call = inst.shell("ln -s /etc etc && ln -s / root && ln -s .. up && ln -s a b && "
                      "ln -s b a && ln -s self self && mkdir -p x && ln -s ../x x/back")
    assert call.refused is None
    paths = {f.path for f in inst.diff().files}
    assert paths == {"etc", "root", "up", "a", "b", "self", "x/back"}
    _assert_intact(inst, worlds)
    # A later call going through them is the sandbox's business; the host still reads
    # only link text.
    assert inst.shell("cat etc/hostname >/dev/null; ls up/ >/dev/null; true").refused is None
    _assert_intact(inst, worlds)
    inst.reset()
    assert inst.hash() == inst.record.world_hash


def test_a_directory_replaced_by_a_symlink_is_rolled_back_whole(
        inst: Instance, worlds: Worlds) -> None:
    """A refused call that also swapped a directory for a link out of the workspace:
    the rollback removes the link (not what it points to) and restores the directory."""
    call = inst.shell("mv docs docs.old && ln -s /etc docs && mkfifo p")
    _refused(call, "fifo")
    assert (inst.mount.workspace / "docs").is_dir()
    assert not (inst.mount.workspace / "docs").is_symlink()
    assert Path("/etc/passwd").exists()
    _assert_intact(inst, worlds, inst.record.world_hash)


# --- quotas ------------------------------------------------------------------------------


def test_sparse_files_over_the_total_quota_are_refused_before_anything_reads_them(
        inst: Instance, worlds: Worlds) -> None:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    call = inst.shell("for i in $(seq 30); do truncate -s 63M s$i; done; du -sk .")
    _refused(call, "bytes in all", "quota")
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024
    assert grown_mib < 100
    assert not any(p.name.startswith("s") and p.name[1:].isdigit()
                   for p in inst.mount.workspace.iterdir())
    _assert_intact(inst, worlds, inst.record.world_hash)


def test_one_huge_file_is_refused(inst: Instance, worlds: Worlds) -> None:
    call = inst.shell("truncate -s 100M big", Limits(max_file_mib=200))
    _refused(call, "big is 104857600 bytes", str(64 * 1024 * 1024))
    _assert_intact(inst, worlds, inst.record.world_hash)


def test_many_small_files_over_the_count_quota_are_refused(inst: Instance,
                                                          worlds: Worlds) -> None:
    call = inst.shell("mkdir many && cd many && seq 10050 | xargs touch")
    _refused(call, "more than 10000 files")
    assert not (inst.mount.workspace / "many").exists()
    _assert_intact(inst, worlds, inst.record.world_hash)


def test_a_refused_call_restores_exactly_the_state_before_it(worlds: Worlds) -> None:
    """Files written by earlier calls come back with their content (from the episode),
    snapshot files with theirs; the episode keeps only the accepted calls' changes."""
    env = Environment(worlds, workspace_limits=WorkspaceLimits(max_total_bytes=2_000_000,
                                                               max_files=200,
                                                               max_file_bytes=1_000_000))
    with env.open("lars@7") as inst:
        assert inst.shell("echo one > mine.txt && mkdir -p keep/empty").refused is None
        after_first = inst.hash()
        call = inst.shell("echo two > mine.txt && rm docs/rates.md && rm -r keep && "
                          "head -c 1500000 /dev/zero > big")
        _refused(call, "big is 1500000 bytes")
        assert (inst.mount.workspace / "mine.txt").read_text() == "one\n"
        assert (inst.mount.workspace / "keep" / "empty").is_dir()
        assert inst.hash() == after_first
        _assert_intact(inst, worlds, after_first)
        _refused(inst.shell("for i in $(seq 210); do echo $i > f$i; done"), "more than 200")
        _refused(inst.shell("for i in 1 2 3; do head -c 900000 /dev/zero > g$i; done"),
                 "2000000 bytes in all")
        assert inst.hash() == after_first


def test_names_no_world_can_hold_are_refused(inst: Instance, worlds: Worlds) -> None:
    _refused(inst.shell("touch 'a\\b'"), "backslash")
    _refused(inst.shell("touch $'\\xff'"), "not UTF-8")
    _refused(inst.shell("mkdir -p x && cd x && touch $(printf 'n%.0s' $(seq 250))/ 2>/dev/null;"
                        " for i in 1 2 3 4 5; do mkdir $(printf 'n%.0s' $(seq 250)) && "
                        "cd $(printf 'n%.0s' $(seq 250)); done; touch f"), "longer than")
    _assert_intact(inst, worlds, inst.record.world_hash)


def test_limits_are_checked_and_a_snapshot_is_never_over_its_own_quota(
        worlds: Worlds) -> None:
    with pytest.raises(ConfigError, match="max_files"):
        WorkspaceLimits(max_files=0)
    with pytest.raises(ConfigError, match="max_depth"):
        WorkspaceLimits(max_depth=10_000)
    tiny = WorkspaceLimits(max_total_bytes=1, max_files=1, max_file_bytes=1, max_depth=1)
    with Environment(worlds, workspace_limits=tiny).open("lars@7") as inst:
        assert inst.shell("cat docs/rates.md > /dev/null").refused is None
        _refused(inst.shell("echo more > more.txt"), "quota")
        assert inst.hash() == inst.record.world_hash


# --- the CLI on a checkout ---------------------------------------------------------------


def test_worldctl_hash_and_diff_on_a_checkout_with_a_fifo_and_host_links(
        store: Path, tmp_path: Path, secret: Path) -> None:
    runner = CliRunner()
    base = ["--store", str(store)]
    out = tmp_path / "co"
    assert runner.invoke(cli, [*base, "checkout", "lars@3", str(out)]).exit_code == 0
    recorded = runner.invoke(cli, [*base, "hash", str(out)]).output.strip().splitlines()[-1]
    workspace = out / "workspace"
    os.mkfifo(workspace / "p")
    victim = next(p for p in sorted(workspace.rglob("*")) if p.is_file())
    victim.unlink()
    victim.symlink_to(secret)
    (workspace / "passwd").symlink_to("/etc/passwd")
    (workspace / "etc").symlink_to("/etc")
    hashed = _within(60, lambda: runner.invoke(cli, [*base, "hash", str(out)]))
    assert hashed.exit_code == 0, hashed.output
    assert hashed.output.strip().splitlines()[-1] != recorded
    for args in (["diff", "lars@3", str(out)], ["diff", "lars@3", str(out), "--json"]):
        shown = _within(60, lambda a=args: runner.invoke(cli, [*base, *a]))
        assert shown.exit_code == 0, shown.output
        assert SECRET not in shown.output and "root:x:0:0" not in shown.output
        assert str(secret) in shown.output and "fifo" in shown.output
    # A database replaced by a FIFO is refused with one error line, never opened.
    db = next((out / "services").iterdir())
    db.unlink()
    os.mkfifo(db)
    refused = _within(60, lambda: runner.invoke(cli, [*base, "hash", str(out)]))
    assert refused.exit_code == 2 and "not a service database" in refused.output


def test_worldctl_hash_of_a_checkout_1100_deep_is_one_error_line(
        store: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    base = ["--store", str(store)]
    out = tmp_path / "co"
    assert runner.invoke(cli, [*base, "checkout", "lars@3", str(out)]).exit_code == 0
    _make_deep(out / "workspace" / "deep", 1100)
    try:
        hashed = _within(60, lambda: runner.invoke(cli, [*base, "hash", str(out)]))
        assert hashed.exit_code == 2 and "deeper than" in hashed.output
        assert "Traceback" not in hashed.output and "RecursionError" not in hashed.output
        diffed = _within(60, lambda: runner.invoke(cli, [*base, "diff", "lars@3", str(out)]))
        assert diffed.exit_code == 2 and "deeper than" in diffed.output
    finally:
        remove_tree(out)  # pytest's own clean-up of old temporary dirs recurses


def test_a_refused_call_survives_the_episode_round_trip(inst: Instance) -> None:
    call = inst.shell("mkfifo p")
    stored = type(inst.episode).from_json(inst.episode.to_json())
    again = next(e for e in stored.events if isinstance(e, ShellCall))
    assert again == call and again.refused is not None
    accepted = inst.shell("true")
    assert b'"refused"' not in msgspec.json.encode(accepted)  # omitted when accepted
