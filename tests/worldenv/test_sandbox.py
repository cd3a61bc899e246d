"""The shell sandbox, against real bubblewrap (no mocks).

Every command that could outlive its run carries a unique marker, and the test then checks
that no process on the host still has that marker in its command line and that no orphaned
zombie of the sandbox uid was left behind.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import time
import uuid
from pathlib import Path

import pytest

from worldenv.errors import SandboxError
from worldenv.sandbox.bubblewrap import (
    BubblewrapSandbox,
    SandboxTools,
    bwrap_argv,
    find_sandbox_tools,
)
from worldenv.sandbox.choice import default_sandbox, run_sandboxed
from worldenv.sandbox.contract import LIMIT_REASONS, Bind, Limits, ShellResult, classify_limit
from worldenv.sandbox.policy import Rlimits, SandboxPolicy, sandbox_ids
from worldenv.sandbox.workers import MASKED, AppWorker, WorkerLimits

SECRET = "top-secret-of-instance-b"
MARKER = "[... output truncated at"


@pytest.fixture(scope="module")
def box() -> BubblewrapSandbox:
    sandbox = default_sandbox()
    assert isinstance(sandbox, BubblewrapSandbox)
    return sandbox


@pytest.fixture
def instances(tmp_path: Path) -> Path:
    """tmp_path/instances/{a,b}, each with services/app.sqlite and a workspace/."""
    root = tmp_path / "instances"
    for name in ("a", "b"):
        (root / name / "services").mkdir(parents=True)
        (root / name / "workspace").mkdir()
        (root / name / "services" / "app.sqlite").write_text(f"{SECRET}-{name}-db")
    (root / "b" / "workspace" / "secret.txt").write_text(SECRET)
    return root


@pytest.fixture
def ws(instances: Path) -> Path:
    return instances / "a" / "workspace"


def _marker() -> str:
    return f"aw-test-{uuid.uuid4().hex}"


def _with_marker(marker: str) -> list[int]:
    """Host pids whose command line mentions `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _orphan_zombies(uid: int) -> list[int]:
    """Zombies of the sandbox uid that were reparented to the host's pid 1."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            owner = os.stat(f"/proc/{entry}").st_uid
        except (OSError, IndexError):
            continue
        if fields[0] == "Z" and fields[1] == "1" and owner == uid:
            found.append(int(entry))
    return found


def _assert_nothing_left(box: BubblewrapSandbox, marker: str) -> None:
    give_up = time.monotonic() + 2.0
    while (_with_marker(marker) or _orphan_zombies(box.ids()[0])) and time.monotonic() < give_up:
        time.sleep(0.05)
    assert _with_marker(marker) == []
    assert _orphan_zombies(box.ids()[0]) == []


# --- normal use -------------------------------------------------------------------------


def test_command_writes_into_the_workspace(box: BubblewrapSandbox, ws: Path) -> None:
    result = box.run("echo hi > out.txt; cat out.txt; pwd", ws)
    assert (result.exit_code, result.stdout, result.stderr) == (0, "hi\n/workspace\n", "")
    assert (ws / "out.txt").read_text() == "hi\n"
    with open(ws / "out.txt", "a") as f:  # still ours to write after the run
        f.write("more\n")
    assert (ws / "out.txt").read_text() == "hi\nmore\n"


def test_workspace_files_from_the_host_are_editable(box: BubblewrapSandbox, ws: Path) -> None:
    (ws / "sub").mkdir()
    (ws / "sub" / "seed.txt").write_text("seed\n")
    result = box.run("echo edited >> sub/seed.txt && touch sub/new", ws)
    assert result.exit_code == 0, result.stderr
    assert (ws / "sub" / "seed.txt").read_text() == "seed\nedited\n"
    assert (ws / "sub" / "new").exists()


@pytest.mark.parametrize(("command", "code"), [
    ("true", 0), ("exit 7", 7), ("false", 1), ("sh -c 'kill -9 $$'", 137)])
def test_exit_code_propagates(box: BubblewrapSandbox, ws: Path, command: str, code: int) -> None:
    result = box.run(command, ws)
    assert (result.exit_code, result.timed_out, result.killed_reason) == (code, False, None)


def test_runs_unprivileged_without_capabilities(box: BubblewrapSandbox, ws: Path) -> None:
    result = box.run("id -u; grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status; touch f", ws)
    uid = box.ids()[0]
    assert uid != 0
    assert result.stdout.split() == [str(uid), "CapEff:", "0000000000000000",
                                     "CapBnd:", "0000000000000000", "NoNewPrivs:", "1"]
    assert (ws / "f").stat().st_uid == uid


def test_nested_user_namespaces_are_refused(box: BubblewrapSandbox, ws: Path) -> None:
    result = box.run("unshare -Ur true", ws)
    assert result.exit_code != 0
    assert "unshare failed" in result.stderr


def test_environment_is_clean(box: BubblewrapSandbox, ws: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AW_HOST_SECRET", "leak")
    result = box.run("env", ws, env={"GREETING": "hello"})
    found = dict(line.split("=", 1) for line in result.stdout.splitlines())
    assert set(found) == {"GREETING", "HOME", "LANG", "PATH", "PWD", "SHLVL", "TMPDIR", "TZ",
                          "_"}
    assert (found["GREETING"], found["HOME"], found["PATH"]) == (
        "hello", "/workspace", "/usr/local/bin:/usr/bin:/bin")


# --- network ----------------------------------------------------------------------------


def test_host_loopback_listener_is_unreachable(box: BubblewrapSandbox, ws: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        socket.create_connection(("127.0.0.1", port), timeout=2).close()  # reachable from here
        listener.accept()[0].close()
        probe = ("import socket\n"
                 "try:\n"
                 f"    socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
                 "    print('connected')\n"
                 "except OSError as e:\n"
                 "    print(type(e).__name__)\n")
        result = box.run(f"python3 -c \"{probe}\"", ws)
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert result.stdout == "ConnectionRefusedError\n"


def test_internet_is_unreachable(box: BubblewrapSandbox, ws: Path) -> None:
    probe = ("import socket\n"
             "try:\n"
             "    socket.create_connection(('1.1.1.1', 80), timeout=3)\n"
             "    print('connected')\n"
             "except OSError as e:\n"
             "    print(e.errno)\n")
    result = box.run(f"getent hosts example.com; echo dns=$?; python3 -c \"{probe}\"; "
                     "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '", ws)
    assert result.stdout == f"dns=2\n{errno.ENETUNREACH}\nlo\n"


# --- filesystem isolation ---------------------------------------------------------------


@pytest.mark.parametrize(("command", "host_path"), [
    ("touch /etc/x", "/etc/x"),
    ("touch /usr/x", "/usr/x"),
    ("touch /tmp/../root/x", "/root/x"),
    ("echo x > ../escape", "INSTANCE/escape"),
    ("echo x > /escape", "/escape"),
    ("mkdir -p /work/x", "/work/x"),
])
def test_writes_outside_the_workspace_fail(box: BubblewrapSandbox, ws: Path, command: str,
                                           host_path: str) -> None:
    target = Path(host_path.replace("INSTANCE", str(ws.parent)))
    assert not target.exists()
    result = box.run(command, ws)
    assert result.exit_code != 0
    assert not target.exists()


@pytest.mark.parametrize("path", [
    "{b}/workspace/secret.txt",
    "{b}/services/app.sqlite",
    "../../b/workspace/secret.txt",
    "../../b/services/app.sqlite",
    "../services/app.sqlite",
    "{a}/services/app.sqlite",
])
def test_other_instances_and_own_services_are_invisible(
        box: BubblewrapSandbox, instances: Path, ws: Path, path: str) -> None:
    where = path.format(a=instances / "a", b=instances / "b")
    result = box.run(f"cat {where}", ws)
    assert result.exit_code == 1
    assert "No such file or directory" in result.stderr
    assert SECRET not in result.stdout


def test_parents_and_host_dirs_are_hidden(box: BubblewrapSandbox, instances: Path,
                                          ws: Path) -> None:
    result = box.run(f"ls -A / /tmp; ls {instances} ../services /root /work /home /var/lib 2>&1 |"
                     " grep -c 'No such file'", ws)
    listing, _, missing = result.stdout.partition("\n/tmp:\n")
    system = {Path(path).name for path in box.system_paths if os.path.lexists(path)}
    expected = sorted(system | {"dev", "proc", "tmp", "var", "workspace"})
    assert listing.split() == ["/:", *expected]
    assert missing == "6\n"


def test_tmp_is_private_and_capped(box: BubblewrapSandbox, ws: Path) -> None:
    result = box.run("head -c 20M /dev/zero > /tmp/big; echo tmp=$?; "
                     "head -c 20M /dev/zero > /dev/shm/big; echo shm=$?", ws, Limits(tmp_mib=8))
    assert result.stdout == "tmp=1\nshm=1\n"
    assert result.stderr.count("No space left on device") == 2


# --- resource limits --------------------------------------------------------------------


def test_fork_bomb_is_contained(box: BubblewrapSandbox, ws: Path) -> None:
    marker = _marker()
    started = time.monotonic()
    result = box.run(f": {marker}; bomb() {{ bomb | bomb & }}; bomb; sleep 1", ws,
                     Limits(timeout_s=5, max_procs=32))
    assert time.monotonic() - started < 8
    assert "fork: retry: Resource temporarily unavailable" in result.stderr
    _assert_nothing_left(box, marker)


def test_process_limit_is_enforced(box: BubblewrapSandbox, ws: Path) -> None:
    marker = _marker()
    spawn = ("import os, time\n"
             "kids = []\n"
             "try:\n"
             "    for _ in range(100):\n"
             "        pid = os.fork()\n"
             "        if pid == 0:\n"
             "            time.sleep(30)\n"
             "            os._exit(0)\n"
             "        kids.append(pid)\n"
             "except BlockingIOError:\n"
             "    print(len(kids))\n")
    result = box.run(f": {marker}; python3 -c '{spawn}'", ws, Limits(max_procs=16))
    assert result.exit_code == 0, result.stderr
    # Counted in the sandbox alone: python itself counts (bash execs it as pid 1).
    assert 0 < int(result.stdout) <= 16 - 1
    _assert_nothing_left(box, marker)


def test_wall_clock_timeout_kills_everything(box: BubblewrapSandbox, ws: Path) -> None:
    marker = _marker()
    result = box.run(f": {marker}; setsid sleep 100 & sleep 100", ws, Limits(timeout_s=1))
    assert (result.timed_out, result.killed_reason, result.exit_code) == (True, "timeout", None)
    assert 1.0 <= result.seconds < 3.0
    _assert_nothing_left(box, marker)


def test_timeout_applies_after_the_command_closes_its_output(box: BubblewrapSandbox,
                                                             ws: Path) -> None:
    marker = _marker()
    result = box.run(f": {marker}; exec >&- 2>&-; sleep 100", ws, Limits(timeout_s=1))
    assert (result.timed_out, result.killed_reason) == (True, "timeout")
    assert result.seconds < 3.0
    _assert_nothing_left(box, marker)


def test_output_flood_is_truncated_and_killed(box: BubblewrapSandbox, ws: Path) -> None:
    marker = _marker()
    limits = Limits(max_output_bytes=1000)
    result = box.run(f": {marker}; yes", ws, limits)
    assert (result.truncated, result.killed_reason, result.exit_code) == (True, "output limit",
                                                                          None)
    assert result.stdout == "y\n" * 500 + "\n[... output truncated at 1000 bytes ...]"
    assert result.seconds < 5.0
    _assert_nothing_left(box, marker)


def test_large_output_below_the_kill_cap_is_truncated(box: BubblewrapSandbox, ws: Path) -> None:
    result = box.run("head -c 3000 /dev/zero | tr '\\0' a; echo done >&2", ws,
                     Limits(max_output_bytes=1000))
    assert (result.exit_code, result.truncated, result.killed_reason) == (0, True, None)
    assert result.stdout.startswith("a" * 1000 + "\n" + MARKER)
    assert result.stderr == "done\n"


def test_memory_hog_is_stopped(box: BubblewrapSandbox, ws: Path) -> None:
    result = box.run("python3 -c 'b = bytearray(2 << 30); print(len(b))'", ws)
    assert result.exit_code == 1
    assert result.stderr.rstrip().endswith("MemoryError")
    assert result.killed_reason == "memory"


def test_modest_memory_use_works(box: BubblewrapSandbox, ws: Path) -> None:
    result = box.run("python3 -c 'b = bytearray(64 << 20); print(len(b))'", ws)
    assert (result.exit_code, result.stdout) == (0, f"{64 << 20}\n")


def test_cpu_spin_is_stopped_by_the_cpu_limit(box: BubblewrapSandbox, ws: Path) -> None:
    result = box.run("python3 -c 'while True: pass'", ws, Limits(cpu_s=1, timeout_s=10))
    assert (result.exit_code, result.killed_reason, result.timed_out) == (152, "cpu", False)
    assert result.seconds < 4.0


def test_file_size_bomb_is_stopped(box: BubblewrapSandbox, ws: Path) -> None:
    result = box.run("head -c 200M /dev/zero > big", ws)
    assert (result.exit_code, result.killed_reason) == (153, "file size")
    assert (ws / "big").stat().st_size == Limits().max_file_mib << 20


# --- choice, errors -------------------------------------------------------------------


def test_default_sandbox_is_bubblewrap_and_cached() -> None:
    assert isinstance(default_sandbox(), BubblewrapSandbox)
    assert default_sandbox() is default_sandbox()


def test_run_sandboxed_uses_the_default_sandbox(ws: Path) -> None:
    result = run_sandboxed("echo $HOME", ws, Limits(timeout_s=5))
    assert result == ShellResult(exit_code=0, stdout="/workspace\n", stderr="", truncated=False,
                                 timed_out=False, killed_reason=None, seconds=result.seconds)


@pytest.mark.parametrize("workspace", ["/", "/tmp", "/usr/share", "/nonexistent/workspace"])
def test_unsafe_or_missing_workspace_is_refused(box: BubblewrapSandbox, workspace: str) -> None:
    with pytest.raises(SandboxError):
        box.run("true", Path(workspace))


def test_bad_command_is_refused(box: BubblewrapSandbox, ws: Path) -> None:
    with pytest.raises(SandboxError, match="NUL"):
        box.run("echo \0", ws)


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="max_procs"):
        Limits(max_procs=0)


# --- the one policy builder: what every command line holds ------------------------------


# Namespaces every sandbox must leave, whichever bwrap stage unshares them.
NAMESPACES = {"--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
              "--unshare-cgroup-try", "--unshare-user"}
# bwrap options that open the sandbox up; no policy may produce any of them.
LOOSENERS = {"--share-net", "--unshare-user-try", "--bind-try", "--dev-bind-try", "--exec-label",
             "--userns", "--userns2", "--pidns", "--seccomp", "--add-seccomp-fd", "--block-fd",
             "--sync-fd", "--info-fd", "--json-status-fd", "--lock-file"}
# bwrap's options with the number of values each takes (those the builder may emit).
ARITY = {"--unshare-all": 0, "--unshare-user": 0, "--unshare-pid": 0, "--unshare-net": 0,
         "--unshare-ipc": 0, "--unshare-uts": 0, "--unshare-cgroup-try": 0, "--uid": 1,
         "--gid": 1, "--disable-userns": 0, "--cap-drop": 1, "--cap-add": 1,
         "--die-with-parent": 0, "--as-pid-1": 0, "--new-session": 0, "--hostname": 1,
         "--ro-bind": 2, "--bind": 2, "--dev-bind": 2, "--symlink": 2, "--proc": 1, "--dev": 1,
         "--perms": 1, "--size": 1, "--tmpfs": 1, "--dir": 1, "--clearenv": 0, "--chdir": 1,
         "--setenv": 2, "--remount-ro": 1}


def _stages(argv: list[str], tools: SandboxTools) -> tuple[list[str], list[list[tuple[str, ...]]],
                                                            list[str]]:
    """prlimit's options, each bwrap stage as (option, values...) tuples, and whatever
    runs between stages (setpriv) or at the end (the command)."""
    assert argv[0] == tools.prlimit
    end = argv.index("--")
    limits, rest = argv[1:end], argv[end + 1:]
    stages: list[list[tuple[str, ...]]] = []
    between: list[str] = []
    while rest and rest[0] == tools.bwrap:
        i, ops = 1, []
        while rest[i] != "--":
            option = rest[i]
            assert option in ARITY, f"unexpected bwrap option {option}"
            ops.append(tuple(rest[i:i + 1 + ARITY[option]]))
            i += 1 + ARITY[option]
        stages.append(ops)
        rest = rest[i + 1:]
        if tools.setpriv is not None and rest and rest[0] == tools.setpriv:
            cut = rest.index("--")
            between += rest[:cut]
            rest = rest[cut + 1:]
    return limits, stages, between + rest


def _assert_isolated(policy: SandboxPolicy, argv: list[str], tools: SandboxTools) -> None:
    """What any policy's command line must hold, and that it binds what the policy says."""
    limits, stages, tail = _stages(argv, tools)
    assert limits[-1] == "--core=0" and any(o.startswith("--nofile=") for o in limits)
    assert f"--cpu={policy.rlimits.cpu_s}:{policy.rlimits.cpu_s + 1}" in limits
    assert f"--as={policy.rlimits.memory_mib << 20}" in limits
    assert f"--fsize={policy.rlimits.max_file_mib << 20}" in limits
    flags = {op[0] for stage in stages for op in stage}
    assert not flags & LOOSENERS
    assert flags >= NAMESPACES or flags >= {"--unshare-all", "--unshare-user"}
    for stage in stages:  # every stage drops every capability and dies with its parent
        assert ("--cap-drop", "ALL") in stage and ("--die-with-parent",) in stage
        if any(op[0] == "--unshare-user" for op in stage):
            assert ("--disable-userns",) in stage
    outer = stages[0]
    assert ("--new-session",) in outer and ("--hostname", "sandbox") in outer
    if len(stages) == 1:
        assert not any(op[0] == "--cap-add" for op in outer)
    else:  # the privileged outer stage keeps only what setpriv needs, which then drops all
        assert {op[1] for op in outer if op[0] == "--cap-add"} == {
            "CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP"}
        assert policy.user is not None
        assert tail[:7] == [tools.setpriv, f"--reuid={policy.user[0]}",
                            f"--regid={policy.user[1]}", "--clear-groups", "--inh-caps=-all",
                            "--bounding-set=-all", "--no-new-privs"]
        assert ("--dev-bind", "/", "/") in stages[1] and len(stages) == 2
        assert ("--chdir", policy.cwd) in stages[1]
    assert outer[-1] == ("--remount-ro", "/")  # after every mount: the root stays read-only
    assert outer.index(("--clearenv",)) < min(
        [i for i, op in enumerate(outer) if op[0] == "--setenv"], default=len(outer))
    assert [op[1:] for op in outer if op[0] == "--setenv"] == [tuple(e) for e in policy.env]
    # Every mount of the host: system paths and read-only binds read-only, and only the
    # writable binds writable. No host device nodes in the outer stage.
    mounts = {op[2]: op for op in outer if op[0] in ("--ro-bind", "--bind", "--dev-bind")}
    assert not any(op[0] == "--dev-bind" for op in outer)
    wanted = {path: ("--ro-bind", path, path) for path in policy.system_paths
              if os.path.isdir(path) and not os.path.islink(path)}
    wanted |= {b.target: ("--bind" if b.writable else "--ro-bind", str(b.source), b.target)
               for b in policy.binds}
    assert mounts == wanted
    assert {op[1] for op in outer if op[0] == "--tmpfs"} == {t.target for t in policy.tmpfs}
    assert tail[-len(COMMAND):] == COMMAND


COMMAND = ["/bin/true", "--", "x"]


def _policies(tmp_path: Path) -> dict[str, SandboxPolicy]:
    shell = BubblewrapSandbox()
    extra = [Bind(tmp_path, "/in/ro"), Bind(tmp_path, "/in/rw", writable=True)]
    return {
        "shell": shell.policy(tmp_path, Limits()),
        "shell with binds": shell.policy(tmp_path, Limits(max_procs=7), {"A": "b"}, extra),
        "own uid": SandboxPolicy(cwd="/", rlimits=Rlimits(cpu_s=1, memory_mib=64,
                                                          max_file_mib=1, max_procs=3),
                                 binds=tuple(extra)),
        "app worker": AppWorker("notes", "", tmp_path).policy(),
    }


@pytest.mark.parametrize("name", ["shell", "shell with binds", "own uid", "app worker"])
def test_every_policy_builds_an_isolated_command_line(tmp_path: Path, name: str) -> None:
    tools = find_sandbox_tools()
    policy = _policies(tmp_path)[name]
    _assert_isolated(policy, bwrap_argv(policy, COMMAND, tools), tools)


def test_the_shell_policy(box: BubblewrapSandbox, ws: Path) -> None:
    policy = box.policy(ws, Limits(max_procs=9, tmp_mib=3), {"GREETING": "hi"},
                        [Bind(ws.parent, "/data")])
    assert policy.binds == (Bind(ws, "/workspace", writable=True), Bind(ws.parent, "/data"))
    assert (policy.cwd, policy.user, policy.as_pid_1) == ("/workspace", box.ids(), True)
    assert policy.rlimits.max_procs == 9 and {t.size_mib for t in policy.tmpfs} == {3}
    assert dict(policy.env)["GREETING"] == "hi" and dict(policy.env)["HOME"] == "/workspace"
    argv = box.build_argv("echo hi", ws, Limits(), binds=[Bind(ws.parent, "/data")])
    assert argv == bwrap_argv(box.policy(ws, Limits(), binds=[Bind(ws.parent, "/data")]),
                              ["/bin/bash", "-c", "echo hi"], box.tools)
    # The process limit is set inside the sandbox (counted for it alone), never before bwrap.
    assert not any(a.startswith("--nproc") for a in argv[:argv.index("--")])
    assert argv[-6:-3] == [box.tools.prlimit, "--nproc=64:64", "--"]


def test_the_app_worker_policy_binds_only_python_and_the_project_read_only(
        tmp_path: Path) -> None:
    worker = AppWorker("notes", "", tmp_path)
    policy = worker.policy()
    assert not any(b.writable for b in policy.binds)
    assert [b.target for b in policy.binds][:2] == ["/opt/python", "/opt/site"]
    # besides python and the project, only /dev/null over the kernel's entropy and clocks
    others = [b for b in policy.binds if not b.target.startswith("/opt/")]
    assert sorted(b.target for b in others) == sorted(MASKED)
    assert all(b.source == Path("/dev/null") for b in others)
    assert "/etc" not in policy.system_paths
    assert (policy.user, policy.as_pid_1, policy.cwd) == (sandbox_ids(), False, "/tmp")
    assert policy.user is not None and policy.user[0] != 0
    assert policy.rlimits.max_procs == WorkerLimits().max_procs
    assert worker.argv(5)[-5:] == [f"/opt/python/bin/python{sys.version_info[0]}."
                                   f"{sys.version_info[1]}", "-s", "-m",
                                   "worldenv.sandbox.app_worker", "5"]


def test_rlimits_are_validated() -> None:
    with pytest.raises(ValueError, match="open_files"):
        Rlimits(cpu_s=1, memory_mib=1, max_file_mib=1, max_procs=1, open_files=0)
    with pytest.raises(ValueError, match="max_procs"):
        Rlimits(cpu_s=1, memory_mib=1, max_file_mib=1, max_procs=0)
    limits = Rlimits(cpu_s=1, memory_mib=1, max_file_mib=1, max_procs=5)
    assert "--nproc" not in " ".join(limits.prlimit_args())
    assert limits.nproc_args() == ["--nproc=5:5"]


# --- the one limit classifier ------------------------------------------------------------


L = Limits(cpu_s=5)
# (exit code, stderr, cpu seconds, timed out, flooded) -> the limit named
CLASSIFIED: list[tuple[int | None, str, float, bool, bool, str | None]] = [
    (0, "", 0.0, False, False, None),
    (1, "Traceback ...\nValueError: nope", 0.1, False, False, None),
    (None, "", 0.0, True, False, "timeout"),
    (None, "", 9.0, True, True, "timeout"),  # the wall clock first: it is certain
    (None, "", 0.0, False, True, "output limit"),
    (0, "", 0.0, True, False, "timeout"),  # killed however it ended
    (152, "", 5.0, False, False, "cpu"),  # SIGXCPU
    (1, "bash: line 1: 12 CPU time limit exceeded (core dumped)", 5.0, False, False, "cpu"),
    (137, "", 5.2, False, False, "cpu"),  # SIGXCPU ignored, the hard limit's SIGKILL
    (137, "", 0.3, False, False, None),  # a SIGKILL from elsewhere
    (153, "", 0.1, False, False, "file size"),  # SIGXFSZ
    (1, "head: error writing 'big': File size limit exceeded", 0.1, False, False, "file size"),
    (1, "Traceback ...\nMemoryError", 0.1, False, False, "memory"),
    (1, "bash: fork: Cannot allocate memory", 0.1, False, False, "memory"),
    (134, "terminate called after throwing an instance of 'std::bad_alloc'", 0.1, False, False,
     "memory"),
    (254, "bash: fork: retry: Resource temporarily unavailable", 0.1, False, False, "processes"),
    (1, "bash: fork: Resource temporarily unavailable", 0.1, False, False, "processes"),
    (1, "BlockingIOError: [Errno 11] Resource temporarily unavailable", 0.1, False, False, None),
    (0, "MemoryError", 0.0, False, False, None),  # a clean exit stopped at no limit
]


@pytest.mark.parametrize(("code", "stderr", "cpu_s", "timed_out", "flooded", "expected"),
                         CLASSIFIED)
def test_classify_limit(code: int | None, stderr: str, cpu_s: float, timed_out: bool,
                        flooded: bool, expected: str | None) -> None:
    assert classify_limit(code, stderr, L, cpu_s=cpu_s, timed_out=timed_out,
                          flooded=flooded) == expected
    assert expected is None or expected in LIMIT_REASONS
