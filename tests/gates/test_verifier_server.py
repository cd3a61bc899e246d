"""Verifier servers (gates.verifier_server): one sandbox for run after run, with the
verdicts of a sandbox per run. tests/gates/test_verifier.py runs its corpus both ways; here is
what only a server can get wrong: what one job leaves must be gone for the next, the
runs a server must not take, and the server's own life (a killed driver, a timeout, a
short-lived starting thread, retirement, idling).

The sandboxes run as a uid of their own, so that the processes counted are this
module's alone.
"""

from __future__ import annotations

import os
import shutil
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import gates.verifier_server as servers
from gates.contract import Verdict
from gates.quality import initially_unsatisfied
from gates.task import load_task
from gates.verifier import run_verifier
from packs.registry import load_pack
from replay.engine import Worlds
from replay.files import chmod_tree
from tests.support.sandbox_uids import free_uid, uid_processes
from worldenv.instances.instance import Environment
from worldenv.sandbox.bubblewrap import BubblewrapSandbox
from worldenv.sandbox.choice import default_sandbox
from worldenv.sandbox.contract import Limits

FAST = Limits(timeout_s=5, cpu_s=2, memory_mib=512, max_procs=32,
              max_output_bytes=16 * 1024, max_file_mib=4, tmp_mib=8)
PACK = load_pack("demo")


UID = free_uid(64_000 + 2 * (os.getpid() % 1_000))


@pytest.fixture(scope="module")
def box() -> BubblewrapSandbox:
    if not isinstance(default_sandbox(), BubblewrapSandbox):
        pytest.fail("these tests need bubblewrap (apt-get install bubblewrap util-linux)")
    return BubblewrapSandbox(uid=UID, gid=UID)


@pytest.fixture(autouse=True)
def _fresh_servers() -> Iterator[None]:
    servers.close_servers()
    yield
    servers.close_servers()


@pytest.fixture(scope="module")
def worlds(demo_worlds: Worlds) -> Worlds:
    return demo_worlds  # the shared demo store (tests/conftest.py), this module's copy


@pytest.fixture(scope="module")
def w0(worlds: Worlds) -> Path:
    return worlds.snapshot("lars", 7)


@pytest.fixture
def scratch(worlds: Worlds) -> Path:
    return worlds.cache.tmp


def _verifier(root: Path, scripts: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, source in scripts.items():
        (root / name).write_text(textwrap.dedent(source))
    chmod_tree(root, dirs=0o755, files=0o644)
    return root


def _run(box: BubblewrapSandbox, verifier: Path, w0: Path, w: Path, scratch: Path | None,
         **kwargs: object) -> Verdict:
    return run_verifier(verifier, w0, w, "the answer", sandbox=box, limits=FAST,
                        scratch=scratch, **kwargs)  # type: ignore[arg-type]


def _same(a: Verdict, b: Verdict) -> None:
    """Equal verdicts, timings aside."""
    assert a.checks == b.checks
    assert a.errors == b.errors
    assert [(s.script, s.exit_code, s.error) for s in a.scripts] == [
        (s.script, s.exit_code, s.error) for s in b.scripts]


OK = "import awsdk\nawsdk.result(ok=True)\n"

LITTER = """
    import ctypes, os, time
    import awsdk

    libc = ctypes.CDLL(None, use_errno=True)
    segment = libc.shmget(0, 4096, 0o1600)       # IPC_PRIVATE | IPC_CREAT | 0600
    os.makedirs("/tmp/deep/" + "/".join(["d"] * 60))
    open("/tmp/deep/file", "w").write("x")
    os.chmod("/tmp/deep", 0)                     # closed to its owner, too
    open("/dev/shm/left", "w").write("x")
    open("/workspace/left", "w").write("x")
    os.symlink("/etc/passwd", "/tmp/link")
    if os.fork() == 0:                           # a daemon that outlives the script
        os.setsid()
        if os.fork() == 0:
            time.sleep(60)
        os._exit(0)
    time.sleep(0.2)
    awsdk.result(littered=segment >= 0, stdin_is_not_the_job_channel=os.read(0, 100) == b"")
"""

CHECK_CLEAN = """
    import os
    import awsdk

    def others():
        me = {os.getpid(), os.getppid()}
        return [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in me
                and int(p) != 1]

    with open("/proc/sysvipc/shm") as f:
        segments = f.read().splitlines()[1:]
    awsdk.result(
        tmp_empty=os.listdir("/tmp") == [],
        shm_empty=os.listdir("/dev/shm") == [],
        workspace_empty=os.listdir("/workspace") == [],
        no_ipc=segments == [],
        no_other_process=others() == [],
    )
"""


def test_nothing_a_job_leaves_reaches_the_next(box: BubblewrapSandbox, w0: Path,
                                               scratch: Path, tmp_path: Path) -> None:
    started = servers.servers_started()
    litter = _run(box, _verifier(tmp_path / "a", {"litter.py": LITTER}), w0, w0, scratch)
    assert litter.passed, (litter.errors, litter.scripts[0].stderr_tail)
    between = uid_processes(UID)
    clean = _run(box, _verifier(tmp_path / "b", {"clean.py": CHECK_CLEAN}), w0, w0, scratch)
    assert clean.passed, [(c.name, c.passed) for c in clean.checks]
    assert servers.servers_started() == started + 1  # one server took both
    assert uid_processes(UID) == between  # the daemon was gone before the next job
    alone = _run(box, _verifier(tmp_path / "b", {"clean.py": CHECK_CLEAN}), w0, w0, None)
    _same(clean, alone)


def test_runs_a_server_must_not_take_run_alone_with_the_same_verdict(
        box: BubblewrapSandbox, w0: Path, scratch: Path, tmp_path: Path) -> None:
    """A writable verifier is judged as in a sandbox of its own, by one. A verifier
    folder named like a standard module (csv) is served: neither driver imports it in
    place of the standard one (tests/hostile/test_hostile_verifier.py has the corpus)."""
    shadow = _verifier(tmp_path / "shadow", {
        "csv.py": "SHADOWED = True\n",
        "check.py": "import csv, awsdk\nawsdk.result(shadowed=hasattr(csv, 'SHADOWED'))\n"})
    served = servers.jobs_served()
    verdicts = [_run(box, shadow, w0, w0, scratch), _run(box, shadow, w0, w0, None)]
    _same(*verdicts)
    assert [c.passed for c in verdicts[0].checks] == [False]
    assert servers.jobs_served() == served + 1
    served += 1
    writable = _verifier(tmp_path / "writable", {"ok.py": OK})
    assert _run(box, writable, w0, w0, scratch, writable_verifier=True).passed
    assert servers.jobs_served() == served


def test_a_tree_on_another_file_system_runs_alone(box: BubblewrapSandbox, w0: Path,
                                                  tmp_path: Path) -> None:
    other = Path("/dev/shm")
    if not other.is_dir() or os.stat(other).st_dev == os.stat(w0).st_dev:
        pytest.skip("no second file system to stage on")
    elsewhere = Path(os.path.realpath(other)) / f"aw-test-{os.getpid()}"
    elsewhere.mkdir()
    try:
        served = servers.jobs_served()
        verdict = _run(box, _verifier(tmp_path / "v", {"ok.py": OK}), w0, w0, elsewhere)
        assert verdict.passed and servers.jobs_served() == served
    finally:
        for leftover in elsewhere.iterdir():
            servers.close_servers()
            assert not leftover.exists()  # a server's directory goes with it
        elsewhere.rmdir()


def test_staging_links_never_follow_nor_open_and_are_gone_after(
        box: BubblewrapSandbox, worlds: Worlds, w0: Path, scratch: Path,
        tmp_path: Path) -> None:
    w = tmp_path / "w"
    worlds.checkout("lars@7", w)
    workspace = w / "workspace"
    os.symlink("/etc/shadow", workspace / "shadow")
    os.mkfifo(workspace / "pipe")
    (workspace / "closed").mkdir()
    (workspace / "closed" / "inside.txt").write_text("x")
    chmod_tree(w, dirs=0o755, files=0o644)
    os.chmod(workspace / "closed", 0o705)
    probe = _verifier(tmp_path / "v", {"probe.py": """
        import os, stat
        import awsdk
        ws = "/w/workspace"
        awsdk.result(
            link_kept=os.readlink(ws + "/shadow") == "/etc/shadow",
            fifo_kept=stat.S_ISFIFO(os.lstat(ws + "/pipe").st_mode),
            modes_kept=stat.S_IMODE(os.lstat(ws + "/closed").st_mode) == 0o705,
        )
    """})
    verdicts = [_run(box, probe, w0, w, scratch), _run(box, probe, w0, w, None)]
    _same(*verdicts)
    assert verdicts[0].passed, [(c.name, c.passed) for c in verdicts[0].checks]
    staged = [p for p in scratch.glob(f"{os.getpid()}-verifier-*/*") if p.is_dir()]
    assert staged and all(not any(p.iterdir()) for p in staged if p.name != "workspace")


def test_a_killed_driver_or_a_timeout_ends_its_server_and_the_next_run_gets_a_new_one(
        box: BubblewrapSandbox, w0: Path, scratch: Path, tmp_path: Path) -> None:
    killer = _verifier(tmp_path / "killer", {"kill.py": "import os\nos.kill(1, 9)\n"
                                                        "os.kill(os.getppid(), 9)\n"})
    stopper = _verifier(tmp_path / "stop", {"stop.py": "import os, signal\n"
                                                       "os.kill(os.getppid(), signal.SIGSTOP)\n"})
    ok = _verifier(tmp_path / "ok", {"ok.py": OK})
    started = servers.servers_started()
    killed = _run(box, killer, w0, w0, scratch)
    assert killed.is_error and "not judged: the driver ended" in killed.errors[0]
    _same(killed, _run(box, killer, w0, w0, None))
    assert _run(box, ok, w0, w0, scratch).passed
    short = Limits(timeout_s=1, cpu_s=2, memory_mib=512, max_procs=32,
                   max_output_bytes=16 * 1024, max_file_mib=4, tmp_mib=8)
    late = run_verifier(stopper, w0, w0, None, sandbox=box, limits=short, scratch=scratch)
    assert late.is_error and "the run as a whole was stopped" in late.errors[0], late.errors
    assert run_verifier(ok, w0, w0, None, sandbox=box, limits=short, scratch=scratch).passed
    assert servers.servers_started() == started + 4


def test_a_server_outlives_the_thread_that_started_it(box: BubblewrapSandbox, w0: Path,
                                                      scratch: Path, tmp_path: Path) -> None:
    ok = _verifier(tmp_path / "ok", {"ok.py": OK})
    got: list[Verdict] = []
    thread = threading.Thread(target=lambda: got.append(_run(box, ok, w0, w0, scratch)))
    thread.start()
    thread.join()
    started = servers.servers_started()
    time.sleep(0.3)  # a parent-death signal would have arrived by now
    assert got[0].passed and _run(box, ok, w0, w0, scratch).passed
    assert servers.servers_started() == started


def test_servers_retire_after_their_jobs_and_their_idle_time(
        box: BubblewrapSandbox, w0: Path, scratch: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    ok = _verifier(tmp_path / "ok", {"ok.py": OK})
    monkeypatch.setattr(servers, "MAX_JOBS", 2)
    started = servers.servers_started()
    for _ in range(3):
        assert _run(box, ok, w0, w0, scratch).passed
    assert servers.servers_started() == started + 2
    monkeypatch.setattr(servers, "IDLE_S", 0.0)
    time.sleep(0.01)
    assert _run(box, ok, w0, w0, scratch).passed
    assert servers.servers_started() == started + 3


def test_a_server_whose_directory_went_is_replaced(box: BubblewrapSandbox, w0: Path,
                                                   scratch: Path, tmp_path: Path) -> None:
    """A snapshot cache removed (and made again) under an idle server takes the server's
    staging directory along: the next run gets a new server."""
    ok = _verifier(tmp_path / "ok", {"ok.py": OK})
    assert _run(box, ok, w0, w0, scratch).passed
    started = servers.servers_started()
    for folder in scratch.glob(f"{os.getpid()}-verifier-*"):
        shutil.rmtree(folder)
    assert _run(box, ok, w0, w0, scratch).passed
    assert servers.servers_started() == started + 1


def test_a_forked_child_uses_servers_of_its_own(box: BubblewrapSandbox, w0: Path,
                                                scratch: Path, tmp_path: Path) -> None:
    ok = _verifier(tmp_path / "ok", {"ok.py": OK})
    assert _run(box, ok, w0, w0, scratch).passed
    started = servers.servers_started()
    pid = os.fork()
    if pid == 0:  # the child: its parent's idle server is not its own
        status = 1
        try:
            served = servers.jobs_served()
            fine = _run(box, ok, w0, w0, scratch).passed and servers.jobs_served() == served + 1
            servers.close_servers()
            status = 0 if fine else 2
        finally:
            os._exit(status)
    _, wait_status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(wait_status) == 0
    assert _run(box, ok, w0, w0, scratch).passed  # the parent's server, untouched
    assert servers.servers_started() == started


def test_concurrent_runs_each_get_a_server(box: BubblewrapSandbox, w0: Path, scratch: Path,
                                           tmp_path: Path) -> None:
    slow = _verifier(tmp_path / "slow", {"slow.py": "import time, awsdk\ntime.sleep(0.3)\n"
                                                    "awsdk.result(ok=True)\n"})
    got: list[Verdict] = []
    threads = [threading.Thread(target=lambda: got.append(_run(box, slow, w0, w0, scratch)))
               for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(got) == 3 and all(v.passed for v in got)
    assert servers.servers_started() >= 3


def test_the_gates_grade_on_servers(worlds: Worlds) -> None:
    task = load_task(PACK.tasks_dir / PACK.tasks[0])
    with Environment(worlds) as env:
        served, started = servers.jobs_served(), servers.servers_started()
        results = [initially_unsatisfied(env, task) for _ in range(3)]
    assert [r.status for r in results] == ["passed"] * 3
    assert servers.jobs_served() == served + 3
    assert servers.servers_started() == started + 1
