"""The sandboxed verifier runtime and its SDK, against real bubblewrap and real worlds.

W0 is the bundled demo world's ``lars@7`` snapshot (the read-only cache entry) and W a
checkout of it in which note 9 was renamed and a report file was written, as an agent
might have done. Hostile scripts run against world-writable copies, so that only the
sandbox's read-only binds stand between them and the worlds; every such test checks that
both worlds hash the same afterwards.

The tests' sandboxes run as uids of their own (not the shared sandbox user), so the
process limit that a fork bomb exhausts is not shared with any other sandbox on the host.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.util
import json
import os
import socket
import sqlite3
import stat
import sys
import textwrap
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType

import pytest

from gates.contract import Check, Verdict
from gates.errors import TaskError
from gates.verifier import (
    SDK_DIR,
    VERIFIER_LIMITS,
    read_driver_output,
    run_awm_verify,
    run_verifier,
    script_names,
    verifier_digests,
)
from gates.verifier_server import close_servers, jobs_served
from replay.engine import Worlds
from replay.errors import WorldDirError
from replay.files import chmod_tree
from replay.hashing import world_manifest
from tests.support.sandbox_uids import free_uid, uid_processes
from worldenv.errors import SandboxError
from worldenv.sandbox.bubblewrap import BubblewrapSandbox
from worldenv.sandbox.choice import default_sandbox
from worldenv.sandbox.contract import Bind, Limits
from worldenv.sandbox.policy import Rlimits, SandboxPolicy, Tmpfs

DEMO = Path(__file__).resolve().parents[2] / "packs" / "demo" / "world" / "lars.jsonl"
RENAMED_NOTE, NEW_TITLE = 9, "Fjord kickoff"
REPORT = "reports/summary.md"
REPORT_TEXT = "Fjord kickoff moved to Thursday.\nNordlys install on track.\n"
ANSWER = "Renamed the Fjord note and wrote the summary. Ærlig talt: ferdig."
# Short enough to keep the hostile corpus fast; the CPU limit is well under the timeout
# so that a spinning script meets it even when it gets half a core of a loaded machine.
TIMEOUT_S = 5
FAST = Limits(timeout_s=TIMEOUT_S, cpu_s=1, memory_mib=512, max_procs=32,
              max_output_bytes=16 * 1024, max_file_mib=4, tmp_mib=8)
TIMED_OUT = f"timed out after {TIMEOUT_S} s"


# --- worlds and sandboxes ------------------------------------------------------------------


# Per session, so that two test sessions on one host do not share a uid either.
UID = free_uid(60_000 + 2 * (os.getpid() % 2_000))
BOMB_UID = free_uid(UID)


@pytest.fixture(scope="module")
def box() -> BubblewrapSandbox:
    if not isinstance(default_sandbox(), BubblewrapSandbox):
        pytest.fail("these tests need bubblewrap (apt-get install bubblewrap util-linux)")
    return BubblewrapSandbox(uid=UID, gid=UID)


@pytest.fixture(scope="module")
def worlds(demo_worlds: Worlds) -> Worlds:
    return demo_worlds


@pytest.fixture(scope="module")
def w0(worlds: Worlds) -> Path:
    return worlds.snapshot("lars", 7)


class Mode:
    """How a test's runs are made: each in a sandbox of its own ("alone"), or on a
    verifier server staging in the store's scratch area ("served"), which must give the
    same verdicts; `check` says the server did take them."""

    def __init__(self, name: str, scratch: Path | None) -> None:
        self.name = name
        self.scratch = scratch
        self.served_before = jobs_served()

    def check(self) -> None:
        taken = jobs_served() - self.served_before
        assert (taken > 0) == (self.scratch is not None), (self.name, taken)


@pytest.fixture(params=["alone", "served"])
def mode(request: pytest.FixtureRequest, worlds: Worlds) -> Iterator[Mode]:
    chosen = Mode(request.param, worlds.cache.tmp if request.param == "served" else None)
    yield chosen
    chosen.check()


def _agent_was_here(world: Path) -> None:
    """What the agent of these tests did: renamed note 9 and wrote a report."""
    conn = sqlite3.connect(world / "services" / "notes.sqlite")
    with conn:
        conn.execute("UPDATE notes SET title = ?, updated_at = '2026-03-10T09:00:00Z' "
                     "WHERE id = ?", (NEW_TITLE, RENAMED_NOTE))
    conn.close()
    (world / "workspace" / "reports").mkdir()
    (world / "workspace" / REPORT).write_text(REPORT_TEXT)


@pytest.fixture(scope="module")
def w(worlds: Worlds, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("w") / "world"
    worlds.checkout("lars@7", dest)
    _agent_was_here(dest)
    return dest


def _open_to_all(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root):
        os.chmod(dirpath, 0o777)
        for name in files:
            os.chmod(Path(dirpath, name), 0o666)


@pytest.fixture(scope="module")
def open_worlds(worlds: Worlds, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """W0 and W that anyone may write: only the read-only binds protect them."""
    base = tmp_path_factory.mktemp("open")
    pair = base / "w0", base / "w"
    for dest in pair:
        worlds.checkout("lars@7", dest)
    _agent_was_here(pair[1])
    for dest in pair:
        _open_to_all(dest)
    return pair


def _hash(world: Path) -> str:
    return world_manifest(world).world_hash()


def _verifier(root: Path, scripts: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, source in scripts.items():
        (root / name).write_text(textwrap.dedent(source))
    return root


def _assert_no_processes(uid: int) -> None:
    close_servers()  # an idle verifier server is a driver of that uid, waiting by design
    give_up = time.monotonic() + 3.0
    while uid_processes(uid) and time.monotonic() < give_up:
        time.sleep(0.05)
    assert uid_processes(uid) == []


@functools.cache
def _sdk() -> ModuleType:
    """The SDK loaded on the host, as a script would import it (not left in sys.modules)."""
    spec = importlib.util.spec_from_file_location("awsdk", SDK_DIR / "awsdk.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["awsdk"] = module  # dataclasses look their module up while it loads
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["awsdk"]
    return module


# --- verdicts -----------------------------------------------------------------------------

CHECKLIST = {
    "b_records.py": f"""
        import awsdk
        ws = awsdk.worlds()
        diff = awsdk.row_diff(ws.w0, ws.w, "notes", "notes")
        awsdk.result(
            one_note_changed=len(diff.changed) == 1 and not diff.added and not diff.removed,
            renamed=awsdk.value(ws.w, "notes", "SELECT title FROM notes WHERE id = ?",
                                ({RENAMED_NOTE},)) == {NEW_TITLE!r},
            nothing_else_in_chat=awsdk.row_diff(ws.w0, ws.w, "chat", "messages").unchanged,
        )
    """,
    "a_files.py": """
        import json
        import awsdk
        from _expect import REPORT
        ws = awsdk.worlds()
        text = awsdk.file_text(ws.w, REPORT)
        checks = [
            {"name": "report_written", "passed": text is not None},
            {"name": "report_is_new", "passed": awsdk.file_text(ws.w0, REPORT) is None},
            {"name": "answer_mentions_fjord", "passed": awsdk.contains(ws.answer, "FJORD")},
        ]
        print("some log line first")
        print("RESULT_JSON=" + json.dumps({"checks": checks}))
    """,
    "_expect.py": f"REPORT = {REPORT!r}\n",
}


def _names(verdict: Verdict) -> list[tuple[str, str, bool]]:
    return [(c.script, c.name, c.passed) for c in verdict.checks]


def test_a_met_checklist_passes_in_script_then_text_order(
        box: BubblewrapSandbox, w0: Path, w: Path, tmp_path: Path, mode: Mode) -> None:
    verifier = _verifier(tmp_path / "verifier", CHECKLIST)
    verdict = run_verifier(verifier, w0, w, ANSWER, sandbox=box, scratch=mode.scratch)
    assert verdict.errors == []
    assert [s.script for s in verdict.scripts] == ["a_files.py", "b_records.py"]
    assert _names(verdict) == [
        ("a_files.py", "report_written", True), ("a_files.py", "report_is_new", True),
        ("a_files.py", "answer_mentions_fjord", True),
        ("b_records.py", "one_note_changed", True), ("b_records.py", "renamed", True),
        ("b_records.py", "nothing_else_in_chat", True)]
    assert verdict.passed and verdict.n == 6
    assert all(s.exit_code == 0 and s.error is None for s in verdict.scripts)
    assert "some log line first" in verdict.scripts[0].stdout_tail


def test_one_failed_check_fails_the_verdict_without_an_error(
        box: BubblewrapSandbox, w0: Path, w: Path, tmp_path: Path, mode: Mode) -> None:
    verifier = _verifier(tmp_path / "verifier", CHECKLIST)
    verdict = run_verifier(verifier, w0, w, "I did nothing about it.", sandbox=box,
                           scratch=mode.scratch)
    assert not verdict.passed and not verdict.is_error
    assert verdict.satisfied == 5
    assert [c.name for c in verdict.checks if not c.passed] == ["answer_mentions_fjord"]


def test_the_initial_world_does_not_satisfy_the_task(box: BubblewrapSandbox, w0: Path,
                                                     tmp_path: Path, mode: Mode) -> None:
    """Gate 2's question, V(W0, W0, no answer): the runner answers it like any other."""
    verifier = _verifier(tmp_path / "verifier", CHECKLIST)
    verdict = run_verifier(verifier, w0, w0, None, sandbox=box, scratch=mode.scratch)
    assert not verdict.passed and not verdict.is_error
    assert [c.name for c in verdict.checks if c.passed] == ["report_is_new",
                                                          "nothing_else_in_chat"]


def test_results_keep_name_order_whatever_finishes_first(box: BubblewrapSandbox, w0: Path,
                                                         tmp_path: Path, mode: Mode) -> None:
    slow_first = {f"{i}_s.py": f"import time, awsdk\ntime.sleep({0.4 - 0.1 * i})\n"
                               f"awsdk.result(script_{i}=True)\n" for i in range(4)}
    slow_first["4_s.py"] = "import awsdk\nawsdk.result(script_4=True)\n"
    verdict = run_verifier(_verifier(tmp_path / "v", slow_first), w0, w0, None, sandbox=box,
                           scratch=mode.scratch)
    assert [c.name for c in verdict.checks] == [f"script_{i}" for i in range(5)]
    assert verdict.passed


def test_scripts_see_the_answer_the_sdk_and_nothing_else(
        box: BubblewrapSandbox, w0: Path, w: Path, tmp_path: Path, mode: Mode) -> None:
    system = {Path(path).name for path in box.system_paths if os.path.lexists(path)}
    root = sorted(system | {"answer.txt", "dev", "opt", "proc", "sdk", "tmp", "var",
                            "verifier", "w", "w0", "workspace"})
    probe = f"""
        import dataclasses, os, sys
        import awsdk

        @dataclasses.dataclass
        class Seen:  # needs sys.modules[__name__]: the script must really be __main__
            answer: str

        ws = awsdk.worlds()
        awsdk.result(
            runs_as_main=__name__ == "__main__" and __file__ == "/verifier/probe.py"
                         and sys.argv == ["/verifier/probe.py"],
            dataclass_works=Seen(ws.answer).answer == ws.answer,
            answer_given=ws.answer == {ANSWER!r},
            answer_empty=ws.answer == "",
            env_names_paths=(os.environ["AW_W0"], os.environ["AW_W"]) == ("/w0", "/w"),
            isolated_mode=sys.flags.isolated == 1 and sys.flags.no_site == 1,
            sdk_from_sdk=awsdk.__file__ == "/sdk/awsdk.py",
            no_site_packages=all("site-packages" not in p for p in sys.path),
            cwd_is_scratch=os.getcwd() == "/workspace" and os.listdir(".") == [],
            host_hidden=not any(os.path.exists(p) for p in ("/root", "/work", "/home")),
            root_listing=sorted(os.listdir("/")) == {root!r},
            unprivileged=os.getuid() != 0,
        )
    """
    verifier = _verifier(tmp_path / "verifier", {"probe.py": probe})
    for answer, fails in ((ANSWER, ["answer_empty"]), (None, ["answer_given"])):
        verdict = run_verifier(verifier, w0, w, answer, sandbox=box, scratch=mode.scratch)
        assert verdict.errors == [], verdict.scripts[0].stderr_tail
        assert [c.name for c in verdict.checks if not c.passed] == fails


def test_worlds_under_directories_closed_to_the_sandbox_user_are_reachable(
        box: BubblewrapSandbox, w0: Path, tmp_path: Path, mode: Mode) -> None:
    """pytest's tmp root is 0700 root; the privileged bwrap binds through it, and the
    world inside is 0755 / 0644, so the sandbox uid reads it."""
    if os.geteuid() != 0:
        pytest.skip("only root runs scripts as another uid")
    closed = [p for p in tmp_path.parents if os.stat(p).st_mode & 0o077 == 0]
    assert closed, "expected a 0700 directory above pytest's tmp_path"
    script = "import awsdk\nws = awsdk.worlds()\nawsdk.result(reads=bool(awsdk.files(ws.w)))\n"
    verdict = run_verifier(_verifier(tmp_path / "v", {"x.py": script}), w0, w0, None,
                           sandbox=box, scratch=mode.scratch)
    assert verdict.passed, verdict.errors


def test_a_world_closed_to_the_sandbox_user_is_refused_by_name(
        box: BubblewrapSandbox, w0: Path, worlds: Worlds, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root runs scripts as another uid")
    closed = tmp_path / "closed"
    worlds.checkout("lars@7", closed)
    os.chmod(closed / "services" / "notes.sqlite", 0o600)
    verifier = _verifier(tmp_path / "v", CHECKLIST)
    with pytest.raises(SandboxError, match=r"closed/services/notes\.sqlite: mode 600"):
        run_verifier(verifier, w0, closed, None, sandbox=box)


# --- the hostile corpus -------------------------------------------------------------------

WRITE_DB = """
    import awsdk
    with open("/WORLD/services/notes.sqlite", "r+b") as f:
        f.write(b"garbage")
    awsdk.result(wrote=True)
"""
WRITE_SELF = """
    import awsdk
    with open("/verifier/write_verifier.py", "a") as f:
        f.write("# edited\\n")
    awsdk.result(wrote=True)
"""
SQL_WRITE = """
    import sqlite3, awsdk
    conn = sqlite3.connect("/w/services/notes.sqlite")
    conn.execute("UPDATE notes SET title = 'pwned'")
    conn.commit()
    awsdk.result(wrote=True)
"""
NEW_FILE = """
    import awsdk
    open("/w/workspace/planted.txt", "w").write("x")
    awsdk.result(wrote=True)
"""
NET_INTERNET = """
    import socket, awsdk
    socket.create_connection(("1.1.1.1", 53), timeout=2).close()
    awsdk.result(connected=True)
"""
NET_LOOPBACK = """
    import socket, awsdk
    socket.create_connection(("127.0.0.1", PORT), timeout=2).close()
    awsdk.result(connected=True)
"""
HOSTILE: dict[str, tuple[str, str]] = {
    # name: (source, what the error must say)
    "hang.py": ("import time\ntime.sleep(60)\n", TIMED_OUT),
    "spin.py": ("while True:\n    pass\n", "stopped by the cpu limit"),
    "crash.py": ("raise RuntimeError('boom')\n", "exited with status 1: RuntimeError: boom"),
    "garbage.py": ("import sys\nsys.stdout.buffer.write(bytes(range(256)) * 8)\n",
                   "printed no RESULT_JSON= line"),
    "silent.py": ("print('all good, trust me')\n", "printed no RESULT_JSON= line"),
    "stderr_only.py": ("import sys\nprint('RESULT_JSON={\"checks\": {\"a\": true}}', "
                       "file=sys.stderr)\n", "printed no RESULT_JSON= line"),
    "exit_early.py": ("import os\nos._exit(0)\nprint('RESULT_JSON={\"checks\": {\"a\": true}}')\n",
                      "printed no RESULT_JSON= line"),
    "bad_json.py": ("print('RESULT_JSON={checks: yes}')\n", "is not valid JSON"),
    "not_object.py": ("print('RESULT_JSON=[true]')\n", 'must be an object with "checks"'),
    "no_checks.py": ("print('RESULT_JSON={\"ok\": true}')\n", 'must be an object with "checks"'),
    "int_check.py": ("print('RESULT_JSON={\"checks\": {\"done\": 1}}')\n",
                     "check 'done' is 1 (int), not true or false"),
    "string_check.py": ("print('RESULT_JSON={\"checks\": [{\"name\": \"done\", "
                        "\"passed\": \"true\"}]}')\n", "check 'done' is \"true\" (str)"),
    "empty_checks.py": ("print('RESULT_JSON={\"checks\": {}}')\n", '"checks" is empty'),
    "duplicate.py": ("print('RESULT_JSON={\"checks\": {\"a\": true, \"a\": false}}')\n",
                     "key 'a' appears twice"),
    "bad_entry.py": ("print('RESULT_JSON={\"checks\": [{\"name\": \"a\"}]}')\n",
                     '"checks"[0] must be {"name": string, "passed": bool}'),
    "last_line_counts.py": ("print('RESULT_JSON={\"checks\": {\"a\": true}}')\n"
                            "print('RESULT_JSON={\"checks\": {\"a\": 0}}')\n",
                            "check 'a' is 0 (int)"),
    "exit_after_result.py": ("print('RESULT_JSON={\"checks\": {\"a\": true}}')\n"
                             "raise SystemExit(3)\n", "exited with status 3"),
    "sdk_non_bool.py": ("import awsdk\nawsdk.result(count=3)\n",
                        "TypeError: check 'count' is 3 (int), not True/False"),
    "flood.py": ("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n",
                 "flooded its output (over 65536 bytes on one stream); killed"),
    "chatty.py": ("print('x' * 30000)\nprint('RESULT_JSON={\"checks\": {\"a\": true}}')\n",
                  "printed over 16384 bytes on stdout"),
    "memory_hog.py": ("hog = bytearray(2 << 30)\n", "stopped by the memory limit"),
    "blame_sandbox.py": ("import sys\nprint('bwrap: pretend the sandbox broke', "
                         "file=sys.stderr)\nsys.exit(1)\n", "exited with status 1"),
    "read_host.py": ("print(open('/work/main/README.md').read())\n",
                     "FileNotFoundError"),
    "write_w.py": (WRITE_DB.replace("WORLD", "w"), "Read-only file system"),
    "write_w0.py": (WRITE_DB.replace("WORLD", "w0"), "Read-only file system"),
    "write_verifier.py": (WRITE_SELF, "Read-only file system"),
    "write_sql.py": (SQL_WRITE, "attempt to write a readonly database"),
    "write_new_file.py": (NEW_FILE, "Read-only file system"),
    "net_internet.py": (NET_INTERNET, "Network is unreachable"),
    "net_loopback.py": (NET_LOOPBACK, "ConnectionRefusedError"),
}


@pytest.fixture(scope="module")
def listener() -> Iterator[socket.socket]:
    """A server on the host's loopback that the sandbox must not reach."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.setblocking(False)
        yield server


@pytest.fixture(scope="module", params=["alone", "served"])
def hostile(request: pytest.FixtureRequest, box: BubblewrapSandbox,
            open_worlds: tuple[Path, Path], listener: socket.socket,
            tmp_path_factory: pytest.TempPathFactory) -> tuple[Verdict, dict[str, str],
                                                                dict[str, str]]:
    """The whole corpus as one verifier folder, run once (four at a time), in a sandbox
    of its own and on a verifier server."""
    w0, w = open_worlds
    port = listener.getsockname()[1]
    verifier = _verifier(tmp_path_factory.mktemp("hostile") / "verifier", {
        name: source.replace("PORT", str(port)) for name, (source, _) in HOSTILE.items()})
    _open_to_all(verifier)
    before = {"w0": _hash(w0), "w": _hash(w), **verifier_digests(verifier)}
    scratch = tmp_path_factory.mktemp("scratch") if request.param == "served" else None
    served = jobs_served()
    verdict = run_verifier(verifier, w0, w, ANSWER, limits=FAST, sandbox=box,
                           scratch=scratch)
    assert (jobs_served() > served) == (scratch is not None)
    after = {"w0": _hash(w0), "w": _hash(w), **verifier_digests(verifier)}
    return verdict, before, after


def test_the_hostile_corpus_gives_an_error_verdict_and_changes_nothing(
        hostile: tuple[Verdict, dict[str, str], dict[str, str]],
        listener: socket.socket) -> None:
    verdict, before, after = hostile
    assert verdict.is_error and not verdict.passed
    assert len(verdict.errors) == len(HOSTILE) == len(verdict.scripts)
    assert verdict.checks == []
    assert after == before  # both worlds and every verifier file
    with pytest.raises(BlockingIOError):
        listener.accept()  # nothing inside the sandbox ever connected
    _assert_no_processes(UID)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_each_hostile_script_is_an_error_that_says_why(
        hostile: tuple[Verdict, dict[str, str], dict[str, str]], name: str) -> None:
    verdict, _, _ = hostile
    result = next(r for r in verdict.scripts if r.script == name)
    expected = HOSTILE[name][1]
    assert result.error is not None
    assert result.error.startswith(f"verifier script {name}: ")
    assert result.checks == []
    assert expected in result.error + "\n" + result.stderr_tail, (result.error,
                                                                   result.stderr_tail)
    assert result.error in verdict.errors


def test_a_fork_bomb_is_stopped_and_leaves_nothing(w0: Path, w: Path, tmp_path: Path) -> None:
    bomb_box = BubblewrapSandbox(uid=BOMB_UID, gid=BOMB_UID)
    bomb = """
        import os, time
        while True:
            try:
                os.fork()
            except OSError:
                time.sleep(0.01)
    """
    before = _hash(w0), _hash(w)
    verdict = run_verifier(_verifier(tmp_path / "v", {"bomb.py": bomb}), w0, w, None,
                           limits=FAST, sandbox=bomb_box)
    assert verdict.errors == [f"verifier script bomb.py: {TIMED_OUT} (limit timeout_s); "
                              "killed"]
    assert (_hash(w0), _hash(w)) == before
    _assert_no_processes(BOMB_UID)


# --- one sandbox for all scripts: what one script can do to the others --------------------

BOMB = """
    import os, time
    while True:
        try:
            os.fork()
        except OSError:
            time.sleep(0.01)
"""
OK_SCRIPT = "import awsdk\nawsdk.result(judged=True)\n"


def test_a_fork_bomb_and_a_hang_do_not_stop_the_other_scripts(w0: Path, tmp_path: Path) -> None:
    """Three at a time: the bomb and the hang hold two places until their timeouts; the
    first quick script is judged at once; the second cannot start while the bomb holds
    every process of the uid, waits for it to be killed, and is judged too."""
    bomb_box = BubblewrapSandbox(uid=BOMB_UID, gid=BOMB_UID)
    quick = "import awsdk\nawsdk.result(judged=True)\n"
    verifier = _verifier(tmp_path / "v", {"a_bomb.py": BOMB, "b_hang.py": HOSTILE["hang.py"][0],
                                          "c_ok.py": quick, "d_ok.py": quick})
    verdict = run_verifier(verifier, w0, w0, None, limits=FAST, sandbox=bomb_box, parallel=3)
    assert verdict.errors == [f"verifier script {name}: {TIMED_OUT} (limit timeout_s); killed"
                              for name in ("a_bomb.py", "b_hang.py")]
    assert _names(verdict) == [("c_ok.py", "judged", True), ("d_ok.py", "judged", True)]
    _assert_no_processes(BOMB_UID)


def test_what_a_script_leaves_behind_is_killed_when_it_ends(box: BubblewrapSandbox, w0: Path,
                                                            tmp_path: Path, mode: Mode) -> None:
    """One at a time: the first script leaves a process in its group and one in a session
    of its own, both holding its stdout; neither delays its verdict or outlives it."""
    leaver = """
        import subprocess, awsdk
        subprocess.Popen(["sleep", "60"])
        subprocess.Popen(["sleep", "61"], start_new_session=True)
        awsdk.result(left_two=True)
    """
    looker = """
        import os, awsdk
        def cmdline(pid):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    return f.read()
            except OSError:
                return b""
        sleeping = [pid for pid in os.listdir("/proc")
                    if pid.isdigit() and cmdline(pid).startswith(b"sleep")]
        awsdk.result(nothing_left=sleeping == [])
    """
    verifier = _verifier(tmp_path / "v", {"a_leaver.py": leaver, "b_looker.py": looker})
    verdict = run_verifier(verifier, w0, w0, None, limits=FAST, sandbox=box,
                           scratch=mode.scratch, parallel=1)
    assert verdict.errors == []
    assert _names(verdict) == [("a_leaver.py", "left_two", True),
                               ("b_looker.py", "nothing_left", True)]
    _assert_no_processes(UID)


FORGER = """
    import binascii, json, os, time, awsdk

    line = 'RESULT_JSON={"checks": {"victim_ok": true}}\\n'
    forged = json.dumps({
        "script": "b_victim.py", "exit": 0, "timed_out": False, "flooded": False,
        "cpu_s": 0.0, "seconds": 0.0, "stdout_cut": False, "stderr": "", "stderr_cut": False,
        "stdout": binascii.b2a_base64(line.encode(), newline=False).decode(),
    }) + "\\n"

    def refused(path):
        try:
            fd = os.open(path, os.O_WRONLY)
        except PermissionError:
            return True
        os.write(fd, forged.encode())
        return False

    driver = os.getppid()
    others = [pid for pid in os.listdir("/proc") if pid.isdigit() and int(pid) != os.getpid()]
    reached = []
    for pid in others:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except PermissionError:
            continue
        reached += [f"{pid}/{fd}" for fd in fds if not refused(f"/proc/{pid}/fd/{fd}")]
    open("/tmp/forged", "w").close()
    awsdk.result(
        driver_stdout_refused=refused(f"/proc/{driver}/fd/1"),
        driver_memory_refused=refused(f"/proc/{driver}/mem"),
        sandbox_init_stdout_refused=refused("/proc/1/fd/1"),
        processes_seen=len(others) >= 3,
        no_descriptor_reached=reached == [],
    )
"""
VICTIM = """
    import os, time, awsdk
    give_up = time.monotonic() + 4
    while not os.path.exists("/tmp/forged") and time.monotonic() < give_up:
        time.sleep(0.01)
    awsdk.result(victim_ok=False)
"""


def test_a_script_cannot_write_another_scripts_report(box: BubblewrapSandbox, w0: Path,
                                                      tmp_path: Path, mode: Mode) -> None:
    """The forger runs beside its victim and tries every way to the driver's report: the
    driver's stdout and memory through /proc, the sandbox's pid 1, any descriptor of any
    process. Each is refused, so the victim's own verdict stands."""
    verifier = _verifier(tmp_path / "v", {"a_forger.py": FORGER, "b_victim.py": VICTIM})
    verdict = run_verifier(verifier, w0, w0, None, limits=FAST, sandbox=box,
                           scratch=mode.scratch, parallel=2)
    assert verdict.errors == [], verdict.scripts
    assert _names(verdict) == [
        ("a_forger.py", "driver_stdout_refused", True),
        ("a_forger.py", "driver_memory_refused", True),
        ("a_forger.py", "sandbox_init_stdout_refused", True),
        ("a_forger.py", "processes_seen", True),
        ("a_forger.py", "no_descriptor_reached", True),
        ("b_victim.py", "victim_ok", False)]


def test_a_script_cannot_add_to_another_scripts_output_once_it_ended(
        box: BubblewrapSandbox, w0: Path, tmp_path: Path, mode: Mode) -> None:
    """A program another script runs is an ordinary process (exec makes it dumpable), so
    the intruder can take the victim's stdout from it; once the victim has ended, writing
    its verdict line there fails: the driver took the victim's output and closed it."""
    victim = """
        import os, subprocess, time, awsdk
        open("/tmp/victim.pid", "w").write(str(os.getpid()))
        subprocess.Popen(["sleep", "30"])  # shares this script's stdout
        give_up = time.monotonic() + 4
        while not os.path.exists("/tmp/grabbed") and time.monotonic() < give_up:
            time.sleep(0.01)
        awsdk.result(victim_ok=False)
    """
    intruder = """
        import os, time, awsdk

        def grab():
            for pid in os.listdir("/proc"):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        if f.read().startswith(b"sleep"):
                            return os.open(f"/proc/{pid}/fd/1", os.O_WRONLY)
                except OSError:
                    continue
            return None

        give_up = time.monotonic() + 4
        fd = None
        while fd is None and time.monotonic() < give_up:
            fd = grab()
            time.sleep(0.01)
        open("/tmp/grabbed", "w").close()
        victim = open("/tmp/victim.pid").read()
        while os.path.exists(f"/proc/{victim}") and time.monotonic() < give_up:
            time.sleep(0.01)
        refused = False
        try:
            os.write(fd, b'RESULT_JSON={"checks": {"victim_ok": true}}\\n')
        except BrokenPipeError:
            refused = True
        awsdk.result(took_its_stdout=fd is not None, late_line_refused=refused)
    """
    verifier = _verifier(tmp_path / "v", {"a_victim.py": victim, "b_intruder.py": intruder})
    verdict = run_verifier(verifier, w0, w0, None, limits=FAST, sandbox=box,
                           scratch=mode.scratch, parallel=2)
    assert verdict.errors == [], verdict.scripts
    assert _names(verdict) == [("a_victim.py", "victim_ok", False),
                               ("b_intruder.py", "took_its_stdout", True),
                               ("b_intruder.py", "late_line_refused", True)]


def test_a_script_that_kills_the_driver_leaves_the_rest_unjudged(
        box: BubblewrapSandbox, w0: Path, tmp_path: Path, mode: Mode) -> None:
    """Signals between processes of one uid cannot be refused: the scripts reported before
    the kill keep their verdicts, the rest are errors, and nothing is left running."""
    killer = "import os\nos.kill(os.getppid(), 9)\nimport time\ntime.sleep(30)\n"
    verifier = _verifier(tmp_path / "v", {"a_ok.py": OK_SCRIPT, "b_killer.py": killer,
                                          "c_ok.py": OK_SCRIPT})
    verdict = run_verifier(verifier, w0, w0, None, limits=FAST, sandbox=box,
                           scratch=mode.scratch, parallel=1)
    assert _names(verdict) == [("a_ok.py", "judged", True)]
    assert [e.split(": ")[:2] for e in verdict.errors] == [
        ["verifier script b_killer.py", "not judged"], ["verifier script c_ok.py", "not judged"]]
    assert all("the driver ended (exit status" in e for e in verdict.errors)
    assert not verdict.passed
    _assert_no_processes(UID)


# --- the counterfactual probe's needs ------------------------------------------------------

SELF_EDIT = """
    import awsdk
    with open("/verifier/check.py", "a") as f:
        f.write("# the verdict was wrong\\n")
    awsdk.result(edited=True)
"""


def test_a_read_only_verifier_cannot_edit_itself(box: BubblewrapSandbox, w0: Path,
                                                 tmp_path: Path, mode: Mode) -> None:
    verifier = _verifier(tmp_path / "v", {"check.py": SELF_EDIT})
    _open_to_all(verifier)
    before = verifier_digests(verifier)
    verdict = run_verifier(verifier, w0, w0, None, sandbox=box, scratch=mode.scratch)
    assert verdict.is_error and "Read-only file system" in verdict.scripts[0].stderr_tail
    assert verifier_digests(verifier) == before


def test_a_writable_verifier_edit_shows_in_the_digests(box: BubblewrapSandbox, w0: Path,
                                                       tmp_path: Path) -> None:
    verifier = _verifier(tmp_path / "v", {"check.py": SELF_EDIT, "_helper.py": "X = 1\n"})
    _open_to_all(verifier)  # the sandbox uid may write only what others may write
    before = verifier_digests(verifier)
    verdict = run_verifier(verifier, w0, w0, None, sandbox=box, writable_verifier=True)
    assert verdict.passed, verdict.errors
    after = verifier_digests(verifier)
    assert set(after) == set(before) == {"_helper.py", "check.py"}
    assert after["check.py"] != before["check.py"]
    assert after["_helper.py"] == before["_helper.py"]


def test_digests_cover_every_file_and_change_with_any_edit(tmp_path: Path) -> None:
    verifier = _verifier(tmp_path / "v", {"a.py": "print(1)\n", "_h.py": "X = 1\n"})
    (verifier / "data").mkdir()
    (verifier / "data" / "expected.txt").write_text("42\n")
    first = verifier_digests(verifier)
    assert list(first) == ["_h.py", "a.py", "data/expected.txt"]
    assert first["a.py"] == hashlib.sha256(b"print(1)\n").hexdigest()
    assert verifier_digests(verifier) == first  # no clock, no order: same folder, same map

    (verifier / "a.py").write_text("print(2)\n")
    edited = verifier_digests(verifier)
    assert {k for k in first if first[k] != edited[k]} == {"a.py"}

    (verifier / "data" / "link").symlink_to("expected.txt")
    linked = verifier_digests(verifier)
    (verifier / "data" / "link").unlink()
    (verifier / "data" / "link").symlink_to("../a.py")
    assert verifier_digests(verifier)["data/link"] != linked["data/link"]
    assert "data/link" not in edited


def test_helpers_and_non_python_files_are_not_scripts(tmp_path: Path) -> None:
    verifier = _verifier(tmp_path / "v", {"b.py": "", "a.py": "", "_h.py": "", "n.txt": ""})
    (verifier / "sub").mkdir()
    (verifier / "sub" / "c.py").write_text("")
    assert script_names(verifier) == ["a.py", "b.py"]


# --- AWM verify_task -----------------------------------------------------------------------

AWM_CODE = f"""
import sqlite3

def verify_task(initial_db_path, final_db_path):
    before = sqlite3.connect(initial_db_path)
    after = sqlite3.connect(final_db_path)
    title = after.execute("SELECT title FROM notes WHERE id = ?", ({RENAMED_NOTE},)).fetchone()[0]
    count = after.execute("SELECT count(*) FROM notes").fetchone()[0]
    return {{
        "note_renamed": title == {NEW_TITLE!r},
        "no_note_lost": count == before.execute("SELECT count(*) FROM notes").fetchone()[0],
        "note_count": count,
        "final_title": title,
    }}

if __name__ == "__main__":
    raise SystemExit("must not run as a script")
"""


def _notes(world: Path) -> Path:
    return world / "services" / "notes.sqlite"


def _file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_awm_verify_task_passing(box: BubblewrapSandbox, w0: Path, w: Path) -> None:
    result = run_awm_verify(AWM_CODE, _notes(w0), _notes(w), sandbox=box)
    assert result.error is None and result.passed
    assert result.checks == [Check("verify_task", "note_renamed", True),
                             Check("verify_task", "no_note_lost", True)]
    assert result.evidence == {"note_count": 9, "final_title": NEW_TITLE}
    verdict = result.as_verdict()
    assert verdict.passed and verdict.scripts[0].script == "verify_task"


def test_awm_verify_task_failing(box: BubblewrapSandbox, w0: Path, tmp_path: Path) -> None:
    code = tmp_path / "verify.py"
    code.write_text(AWM_CODE)
    result = run_awm_verify(code, _notes(w0), _notes(w0), sandbox=box)
    assert result.error is None and not result.passed
    assert [(c.name, c.passed) for c in result.checks] == [("note_renamed", False),
                                                            ("no_note_lost", True)]


@pytest.mark.parametrize(("code", "expected"), [
    ("def verify_task(a, b):\n    raise KeyError('table gone')\n", "KeyError: 'table gone'"),
    ("def verify_task(a, b):\n    return [True]\n", "verify_task returned list, not a dict"),
    ("def verify(a, b):\n    return {}\n", "defines no function verify_task"),
    ("import time\ndef verify_task(a, b):\n    time.sleep(60)\n", TIMED_OUT),
    ("import sqlite3\ndef verify_task(a, b):\n    c = sqlite3.connect(b)\n"
     "    c.execute('DELETE FROM notes')\n    c.commit()\n    return {'deleted': True}\n",
     "attempt to write a readonly database"),
    ("def verify_task(a, b):\n    open(b, 'wb').write(b'')\n    return {'wiped': True}\n",
     "Read-only file system"),
])
def test_awm_verify_task_errors_are_results(box: BubblewrapSandbox, open_worlds: tuple[Path, Path],
                                            code: str, expected: str) -> None:
    w0, w = open_worlds
    before = _file_hash(_notes(w0)), _file_hash(_notes(w))
    result = run_awm_verify(code, _notes(w0), _notes(w), limits=FAST, sandbox=box)
    assert result.error is not None and result.error.startswith("AWM verify_task: ")
    assert expected in result.error + "\n" + result.stderr_tail, result
    assert not result.passed and result.checks == [] and result.as_verdict().is_error
    assert (_file_hash(_notes(w0)), _file_hash(_notes(w))) == before


def test_awm_missing_database_raises(box: BubblewrapSandbox, w0: Path, tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="no such database file"):
        run_awm_verify(AWM_CODE, _notes(w0), tmp_path / "absent.sqlite", sandbox=box)


# --- misuse raises; an empty folder is an error verdict ----------------------------------


def test_misuse_raises(box: BubblewrapSandbox, w0: Path, tmp_path: Path) -> None:
    verifier = _verifier(tmp_path / "v", {"a.py": "import awsdk\nawsdk.result(a=True)\n"})
    with pytest.raises(TaskError, match="the verifier folder does not exist"):
        run_verifier(tmp_path / "absent", w0, w0, None, sandbox=box)
    not_a_world = tmp_path / "nope"
    (not_a_world / "stuff").mkdir(parents=True)
    with pytest.raises(WorldDirError, match="unexpected entry"):
        run_verifier(verifier, w0, not_a_world, None, sandbox=box)


def test_an_empty_verifier_folder_is_an_error_verdict(box: BubblewrapSandbox, w0: Path,
                                                      tmp_path: Path) -> None:
    verifier = _verifier(tmp_path / "v", {"_helper.py": "X = 1\n"})
    verdict = run_verifier(verifier, w0, w0, None, sandbox=box)
    assert verdict.is_error and not verdict.passed
    assert verdict.errors == [f"{verifier}: no verifier scripts (*.py files not starting "
                              "with '_')"]


def test_a_sandbox_that_cannot_start_python_raises(box: BubblewrapSandbox, w0: Path,
                                                   tmp_path: Path) -> None:
    """Too little memory for the interpreter itself: no script ran, so no verdict."""
    verifier = _verifier(tmp_path / "v", {"a.py": "import awsdk\nawsdk.result(a=True)\n"})
    with pytest.raises(SandboxError, match=r"the sandbox failed before a\.py started"):
        run_verifier(verifier, w0, w0, None, limits=Limits(memory_mib=8), sandbox=box)


def test_the_verdict_does_not_depend_on_parallelism(box: BubblewrapSandbox, w0: Path, w: Path,
                                                    tmp_path: Path, mode: Mode) -> None:
    verifier = _verifier(tmp_path / "verifier", {**CHECKLIST, "c_broken.py": "print('hi')\n"})
    one = run_verifier(verifier, w0, w, ANSWER, sandbox=box, scratch=mode.scratch, parallel=1)
    four = run_verifier(verifier, w0, w, ANSWER, sandbox=box, scratch=mode.scratch, parallel=4)
    assert (one.checks, one.errors) == (four.checks, four.errors)
    assert one.errors == ["verifier script c_broken.py: printed no RESULT_JSON= line on stdout"]
    assert one.n == 6 and one.satisfied == 6 and not one.passed  # an error is never a pass
    with pytest.raises(ValueError, match="parallel must be >= 1"):
        run_verifier(verifier, w0, w, ANSWER, sandbox=box, scratch=mode.scratch, parallel=0)


def _record(name: str, stdout: str) -> str:
    """A line as the driver writes it for a script that exited 0 with `stdout`."""
    return json.dumps({"script": name, "exit": 0, "timed_out": False, "flooded": False,
                       "cpu_s": 0.01, "seconds": 0.02, "stdout_cut": False, "stderr": "",
                       "stderr_cut": False,
                       "stdout": base64.b64encode(stdout.encode()).decode()}) + "\n"


def test_the_driver_report_is_read_strictly() -> None:
    passing = _record("a.py", 'RESULT_JSON={"checks": {"x": true}}\n')
    names = ["a.py", "b.py"]
    cut_off = read_driver_output(names, passing + '{"script": "b.py", "ex', FAST)
    assert list(cut_off.runs) == ["a.py"] and cut_off.damage == []  # killed mid-write
    assert cut_off.runs["a.py"].exit_code == 0
    assert cut_off.runs["a.py"].stdout == 'RESULT_JSON={"checks": {"x": true}}\n'
    damaged = {
        passing + passing: "line 2: a second or unknown record for 'a.py'",
        _record("c.py", ""): "line 1: a second or unknown record for 'c.py'",
        "hello\n" + passing: "line 1: Expecting value",
        passing.replace('"exit": 0', '"exit": "0"'): "line 1: exit status '0'",
        passing.replace('"stderr": ""', '"stderr": "%%"'): "line 1: Only base64 data",
    }
    for stdout, why in damaged.items():
        assert read_driver_output(names, stdout, FAST).damage[0].startswith(why), stdout


# --- sandbox binds --------------------------------------------------------------------------


@pytest.mark.parametrize(("target", "message"), [
    ("relative", "normalised absolute path"),
    ("/", "normalised absolute path"),
    ("/a/../b", "normalised absolute path"),
    ("/a:b", "normalised absolute path"),
    ("/usr/lib/x", "collides with '/usr'"),
    ("/workspace", "collides with '/workspace'"),
    ("/tmp/x", "collides with '/tmp'"),
    ("/dev", "collides with '/dev'"),
])
def test_bad_bind_targets_are_refused(box: BubblewrapSandbox, tmp_path: Path, target: str,
                                      message: str) -> None:
    with pytest.raises(SandboxError, match=message):
        box.run("true", tmp_path, binds=[Bind(tmp_path, target)])


def test_bind_sources_must_exist_and_targets_be_distinct(box: BubblewrapSandbox,
                                                         tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    with pytest.raises(SandboxError, match="does not exist"):
        box.run("true", ws, binds=[Bind(tmp_path / "absent", "/data")])
    with pytest.raises(SandboxError, match="collides with '/data'"):
        box.run("true", ws, binds=[Bind(tmp_path, "/data"), Bind(tmp_path, "/data/sub")])


def test_binds_are_read_only_unless_writable(box: BubblewrapSandbox, tmp_path: Path) -> None:
    ws, shared = tmp_path / "ws", tmp_path / "shared"
    ws.mkdir()
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    (shared / "f.txt").write_text("host\n")
    (shared / "f.txt").chmod(0o666)
    ro = box.run("cat /in/deep/f.txt; echo x >> /in/deep/f.txt", ws,
                 binds=[Bind(shared, "/in/deep")])
    assert ro.stdout == "host\n" and "Read-only file system" in ro.stderr
    rw = box.run("echo sandbox >> /in/f.txt", ws, binds=[Bind(shared, "/in", writable=True)])
    assert rw.exit_code == 0, rw.stderr
    assert (shared / "f.txt").read_text() == "host\nsandbox\n"
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o777  # never chowned or chmodded
    assert os.stat(shared).st_uid == os.getuid()


class _PolicyRecorder(BubblewrapSandbox):
    """The tests' sandbox (a real one), keeping the policy of every run it makes."""

    def __init__(self) -> None:
        super().__init__(uid=UID, gid=UID)
        self.policies: list[SandboxPolicy] = []

    def policy(self, workspace: Path, limits: Limits, env: Mapping[str, str] | None = None,
               binds: Sequence[Bind] = ()) -> SandboxPolicy:
        made = super().policy(workspace, limits, env, binds)
        self.policies.append(made)
        return made


@pytest.mark.parametrize("writable", [False, True])
def test_the_verifier_sandbox_policy(w0: Path, w: Path, tmp_path: Path,
                                     writable: bool) -> None:
    """The worlds, the answer, the verifier, the SDK and Python read-only (the verifier
    writable only for the probe); a scratch workspace on a tmpfs of its own (never the
    host's disk); the tests' uid; nothing of the host's environment."""
    box = _PolicyRecorder()
    verifier = _verifier(tmp_path / "v", {"ok.py": "import awsdk\nawsdk.result(ok=True)\n"})
    verdict = run_verifier(verifier, w0, w, ANSWER, sandbox=box, writable_verifier=writable)
    assert verdict.passed, verdict.errors
    [policy] = box.policies
    binds = {b.target: b for b in policy.binds}
    assert set(binds) == {"/opt/python", "/sdk", "/w0", "/w", "/answer.txt", "/verifier"}
    assert {t for t, b in binds.items() if b.writable} == ({"/verifier"} if writable else set())
    assert (binds["/w0"].source, binds["/w"].source) == (w0.resolve(), w.resolve())
    assert binds["/verifier"].source == verifier.resolve()
    assert Tmpfs("/workspace", VERIFIER_LIMITS.tmp_mib) in policy.tmpfs
    assert (policy.user, policy.as_pid_1, policy.cwd) == ((UID, UID), True, "/workspace")
    assert set(dict(policy.env)) == {"PATH", "HOME", "LANG", "TMPDIR", "TZ", "LD_LIBRARY_PATH",
                                     "PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "AW_W0", "AW_W",
                                     "AW_ANSWER"}
    lim = VERIFIER_LIMITS
    assert policy.rlimits == Rlimits(cpu_s=lim.cpu_s, memory_mib=lim.memory_mib,
                                     max_file_mib=lim.max_file_mib, max_procs=lim.max_procs)


def test_the_awm_sandbox_policy(w0: Path, w: Path) -> None:
    box = _PolicyRecorder()
    assert run_awm_verify(AWM_CODE, _notes(w0), _notes(w), sandbox=box).passed
    [policy] = box.policies
    binds = {b.target: b for b in policy.binds}
    assert set(binds) == {"/opt/python", "/sdk", "/awm/verify.py",
                          "/awm/initial.sqlite", "/awm/final.sqlite"}
    assert [t for t, b in binds.items() if b.writable] == []
    assert Tmpfs("/workspace", VERIFIER_LIMITS.tmp_mib) in policy.tmpfs
    assert binds["/awm/final.sqlite"].source == _notes(w).resolve()


def test_chmod_tree_sets_modes_and_never_follows_a_symlink(tmp_path: Path) -> None:
    """The helper behind the SDK copy's modes (and remove_tree's)."""
    top = tmp_path / "t"
    (top / "a" / "b").mkdir(parents=True)
    (top / "a" / "b" / "f.py").write_text("x")
    (top / "a" / "b" / "f.py").chmod(0o640)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("y")
    (outside / "secret").chmod(0o600)
    outside.chmod(0o700)
    (top / "file_link").symlink_to(outside / "secret")
    (top / "dir_link").symlink_to(outside)
    for closed in (top / "a" / "b", top / "a", top):  # innermost first
        closed.chmod(0o000)

    def modes() -> dict[str, int]:
        return {str(p.relative_to(tmp_path)): stat.S_IMODE(p.lstat().st_mode)
                for p in [top, top / "a", top / "a" / "b", top / "a" / "b" / "f.py",
                          outside, outside / "secret"]}

    chmod_tree(top, dirs=0o755)
    assert modes() == {"t": 0o755, "t/a": 0o755, "t/a/b": 0o755, "t/a/b/f.py": 0o640,
                       "outside": 0o700, "outside/secret": 0o600}
    chmod_tree(top, dirs=0o750, files=0o444)
    assert modes() == {"t": 0o750, "t/a": 0o750, "t/a/b": 0o750, "t/a/b/f.py": 0o444,
                       "outside": 0o700, "outside/secret": 0o600}


# --- the SDK, on the host -------------------------------------------------------------------


def test_row_diff_is_keyed_and_ordered(w0: Path, w: Path, tmp_path: Path) -> None:
    sdk = _sdk()
    diff = sdk.row_diff(w0, w, "notes", "notes")
    assert diff.key == ("id",) and not diff.added and not diff.removed
    [(old, new)] = diff.changed
    assert (old["id"], new["title"]) == (RENAMED_NOTE, NEW_TITLE)
    assert sdk.row_diff(w0, w, "notes", "note_tags").key == ("note_id", "tag_id")

    a, b = tmp_path / "a", tmp_path / "b"
    for world, rows in ((a, [(1, "x"), (2, "y"), (3, "z")]), (b, [(1, "x"), (3, "Z"), (4, "w")])):
        (world / "services").mkdir(parents=True)
        conn = sqlite3.connect(world / "services" / "log.sqlite")
        with conn:
            conn.execute("CREATE TABLE entries(n INTEGER, text TEXT)")  # no primary key
            conn.executemany("INSERT INTO entries(rowid, n, text) VALUES (?, ?, ?)",
                             [(r, r, t) for r, t in rows])
        conn.close()
    keyless = sdk.row_diff(a, b, "log", "entries")
    assert keyless.key == ("rowid",)
    assert keyless.added == [{"n": 4, "text": "w"}]
    assert keyless.removed == [{"n": 2, "text": "y"}]
    assert keyless.changed == [({"n": 3, "text": "z"}, {"n": 3, "text": "Z"})]
    by_text = sdk.row_diff(a, b, "log", "entries", key="text")
    assert [r["text"] for r in by_text.added] == ["Z", "w"]
    missing = sdk.row_diff(a, b, "log", "absent_table")
    assert missing.unchanged
    only_b = sdk.row_diff(tmp_path / "nowhere", b, "log", "entries")
    assert [r["n"] for r in only_b.added] == [1, 3, 4]


def test_sdk_reads_are_read_only(w: Path) -> None:
    sdk = _sdk()
    conn = sdk.db(w, "notes")
    assert conn.execute("SELECT title FROM notes WHERE id = 9").fetchone()["title"] == NEW_TITLE
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        conn.execute("DELETE FROM notes")
    with pytest.raises(FileNotFoundError, match="no service 'mail'"):
        sdk.db(w, "mail")
    assert sdk.rows(w, "notes", "SELECT id FROM notes WHERE id < ? ORDER BY id", (3,)) == [
        {"id": 1}, {"id": 2}]
    assert sdk.value(w, "notes", "SELECT id FROM notes WHERE id = -1") is None


def test_sdk_text_helpers(w0: Path, w: Path) -> None:
    sdk = _sdk()
    assert sdk.file_text(w, REPORT) == REPORT_TEXT
    assert sdk.file_text(w0, REPORT) is None
    assert REPORT in sdk.files(w) and REPORT not in sdk.files(w0)
    for bad in ("../x", "/etc/passwd", "a//b", "./a"):
        with pytest.raises(ValueError, match="not a plain relative"):
            sdk.file_text(w, bad)
    assert sdk.text_diff("a\nb\n", "a\nc\n") == ["--- before", "+++ after", "@@ -1,2 +1,2 @@",
                                                 " a", "-b", "+c"]
    assert sdk.text_diff("same", "same") == []
    assert sdk.similar("kitten", "kitten") == 1.0
    assert 0.0 < sdk.similar("kitten", "sitting") < 1.0
    assert sdk.contains("Fjord Kickoff", "fjord") and not sdk.contains("x", "y")
    assert not sdk.contains("Fjord", "fjord", casefold=False)
    assert not sdk.contains(None, "x")


def test_sdk_result_lines(capsys: pytest.CaptureFixture[str]) -> None:
    sdk = _sdk()
    with pytest.raises(SystemExit) as done:
        sdk.result(b=True, a=False)
    assert done.value.code == 0
    assert capsys.readouterr().out == ('RESULT_JSON={"checks": [{"name": "b", "passed": true}, '
                                       '{"name": "a", "passed": false}]}\n')
    with pytest.raises(TypeError, match="check 'n' is 1 \\(int\\)"):
        sdk.result(n=1)
    with pytest.raises(ValueError, match="reported twice"):
        sdk.result_list([("a", True), {"name": "a", "passed": True}])
    checklist = sdk.Checklist()
    assert checklist.check("x", True) is True
    with pytest.raises(SystemExit):
        checklist.done()
    assert capsys.readouterr().out == 'RESULT_JSON={"checks": [{"name": "x", "passed": true}]}\n'


def test_sdk_worlds_needs_the_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AW_W0", "AW_W", "AW_ANSWER"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError, match="AW_W0, AW_W, AW_ANSWER not set"):
        _sdk().worlds()


def _docstring_example() -> str:
    """The first literal block of the SDK's docstring (the example script)."""
    doc = _sdk().__doc__ or ""
    block = doc.split("::\n\n", 1)[1]
    lines = []
    for line in block.splitlines():
        if line and not line.startswith("    "):
            break
        lines.append(line)
    return textwrap.dedent("\n".join(lines)).strip() + "\n"


def test_the_sdk_docstring_example_runs(box: BubblewrapSandbox, w0: Path, w: Path,
                                        tmp_path: Path, mode: Mode) -> None:
    example = _docstring_example()
    assert example.startswith("import awsdk") and "awsdk.result(" in example
    verifier = _verifier(tmp_path / "verifier", {"10_note_renamed.py": example})
    verdict = run_verifier(verifier, w0, w, ANSWER, sandbox=box, scratch=mode.scratch)
    assert verdict.passed, (verdict.errors, verdict.checks)
    assert verdict.n == 4
    assert not run_verifier(verifier, w0, w0, None, sandbox=box, scratch=mode.scratch).passed


def test_the_sdk_is_standard_library_only() -> None:
    """Scripts run with -I -S: the SDK may import the standard library and itself only."""
    modules = sorted(SDK_DIR.glob("*.py"))
    assert SDK_DIR / "awsdk.py" in modules and SDK_DIR / "__init__.py" not in modules
    own = {path.stem for path in modules}
    for path in modules:
        imported = {line.split()[1].split(".")[0] for line in path.read_text().splitlines()
                    if line.startswith(("import ", "from "))}
        assert imported <= set(sys.stdlib_module_names) | {"__future__"} | own, (path, imported)
