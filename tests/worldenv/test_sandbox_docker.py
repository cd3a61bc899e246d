"""The Docker sandbox against a real engine (no mocks): the shell sandbox's hostile corpus
(tests/worldenv/test_sandbox.py) case by case, in the local base image
(tests/support/docker_images.py), as a uid of this module's own so that its processes are
counted apart from any other sandbox's.

Where Docker cannot hold what bubblewrap holds, the case says so as an expected difference
(``DIFFERENCES``, also in docs/peers/docker.md), never as a skip. Without an engine the
tests skip; under CI=true they fail.
"""

from __future__ import annotations

import errno
import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import docker_images
from tests.support.sandbox_uids import free_uid, uid_processes
from worldenv.errors import SandboxError
from worldenv.sandbox.contract import Bind, Limits
from worldenv.sandbox.docker import LABEL, DockerSandbox
from worldenv.sandbox.policy import MOUNT_AT

pytestmark = pytest.mark.docker_image("base")

SECRET = "top-secret-of-instance-b"
MARKER = "[... output truncated at"
UID = free_uid(64_000 + 2 * (os.getpid() % 1_000))

# What a Docker sandbox shows or does otherwise than a bubblewrap one, and why (the same
# list is in docs/peers/docker.md).
DIFFERENCES = {
    "hostname variable": "the engine always sets HOSTNAME in a container's environment",
    "root listing": "the root is the image's own tree (boot, home, root, ...; nothing of "
                    "the host's), not only the host's system directories",
    "memory limit": "RLIMIT_DATA per process (Docker cannot set RLIMIT_AS) plus a cgroup "
                    "cap on the container: MemoryError the same, but mappings that are not "
                    "private data (file or PROT_NONE ones) are not counted per process",
    "process count": "the pids cgroup counts the container's init too",
}


@pytest.fixture(scope="module")
def box() -> DockerSandbox:
    return DockerSandbox(docker_images.base_image(), uid=UID, gid=UID)


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


def _containers(box: DockerSandbox) -> list[str]:
    return [c["Id"] for c in box.api().containers(all=True, filters={"label": LABEL})]


@pytest.fixture
def nothing_left(box: DockerSandbox) -> Iterator[None]:
    """After the test: no process of the sandbox uid, no sandbox container."""
    yield
    give_up = time.monotonic() + 3.0
    while (uid_processes(UID) or _containers(box)) and time.monotonic() < give_up:
        time.sleep(0.05)
    assert uid_processes(UID) == []
    assert _containers(box) == []


# --- normal use -------------------------------------------------------------------------


def test_command_writes_into_the_workspace(box: DockerSandbox, ws: Path,
                                           nothing_left: None) -> None:
    result = box.run("echo hi > out.txt; cat out.txt; pwd", ws)
    assert (result.exit_code, result.stdout, result.stderr) == (0, "hi\n/workspace\n", "")
    with open(ws / "out.txt", "a") as f:  # still ours to write after the run
        f.write("more\n")
    assert (ws / "out.txt").read_text() == "hi\nmore\n"


@pytest.mark.parametrize(("command", "code"), [
    ("exit 7", 7), ("sh -c 'kill -9 $$'", 137)])
def test_exit_code_propagates(box: DockerSandbox, ws: Path, command: str, code: int) -> None:
    result = box.run(command, ws)
    assert (result.exit_code, result.timed_out, result.killed_reason) == (code, False, None)


def test_runs_unprivileged_without_capabilities(box: DockerSandbox, ws: Path) -> None:
    result = box.run("id -u; grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status; touch f; "
                     "unshare -Ur true", ws)
    assert result.stdout.split() == [str(UID), "CapEff:", "0000000000000000",
                                     "CapBnd:", "0000000000000000", "NoNewPrivs:", "1"]
    assert (ws / "f").stat().st_uid == UID
    # Nested user namespaces: refused by the engine's seccomp profile.
    assert "unshare failed" in result.stderr and result.exit_code != 0


def test_environment_is_clean(box: DockerSandbox, ws: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AW_HOST_SECRET", "leak")
    result = box.run("env", ws, env={"GREETING": "hello"})
    found = dict(line.split("=", 1) for line in result.stdout.splitlines())
    assert "hostname variable" in DIFFERENCES
    assert set(found) == {"GREETING", "HOME", "LANG", "PATH", "PWD", "SHLVL", "TMPDIR", "TZ",
                          "_", "HOSTNAME"}
    assert (found["GREETING"], found["HOME"], found["PATH"], found["HOSTNAME"]) == (
        "hello", "/workspace", "/usr/local/bin:/usr/bin:/bin", "sandbox")


# --- network ----------------------------------------------------------------------------


def test_host_loopback_and_internet_are_unreachable(box: DockerSandbox, ws: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        probe = ("import socket\n"
                 "for where in (('127.0.0.1', PORT), ('1.1.1.1', 80), ('172.17.0.1', PORT)):\n"
                 "    try:\n"
                 "        socket.create_connection(where, timeout=3)\n"
                 "        print('connected')\n"
                 "    except OSError as e:\n"
                 "        print(e.errno)\n").replace("PORT", str(port))
        result = box.run(f"getent hosts example.com; echo dns=$?; python3 -c \"{probe}\"; "
                         "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '", ws)
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert result.stdout == (f"dns=2\n{errno.ECONNREFUSED}\n{errno.ENETUNREACH}\n"
                             f"{errno.ENETUNREACH}\nlo\n")


# --- filesystem isolation ---------------------------------------------------------------


@pytest.mark.parametrize(("command", "host_path"), [
    ("touch /etc/x", "/etc/x"),
    ("touch /usr/x", "/usr/x"),
    ("touch /tmp/../root/x", "/root/x"),
    ("echo x > ../escape", "INSTANCE/escape"),
    ("echo x > /escape", "/escape"),
    ("mkdir -p /work/x", "/work/x"),
])
def test_writes_outside_the_workspace_fail(box: DockerSandbox, ws: Path, command: str,
                                           host_path: str) -> None:
    target = Path(host_path.replace("INSTANCE", str(ws.parent)))
    assert not target.exists()
    result = box.run(command, ws)
    assert result.exit_code != 0
    assert not target.exists()


def test_other_instances_own_services_and_host_dirs_are_invisible(
        box: DockerSandbox, instances: Path, ws: Path) -> None:
    paths = [instances / "b" / "workspace" / "secret.txt", instances / "b" / "services" /
             "app.sqlite", "../../b/workspace/secret.txt", "../services/app.sqlite",
             instances / "a" / "services" / "app.sqlite", instances, "/work"]
    result = box.run("; ".join(f"cat {p} 2>&1 | grep -c 'No such file'" for p in paths)
                     + "; echo ---; ls -A /root /home 2>&1; echo ---; ls -A /", ws)
    counts, home, root = result.stdout.split("---\n")
    assert counts.split() == ["1"] * len(paths)
    assert SECRET not in result.stdout
    # The image's own, empty /root (closed to the sandbox uid) and /home.
    assert "root listing" in DIFFERENCES
    assert sorted(home.splitlines()) == [
        "/home:", "ls: cannot open directory '/root': Permission denied"]
    assert {"usr", "etc", "tmp", "workspace", "proc", "dev"} <= set(root.split())
    assert "work" not in root.split()


def test_root_is_read_only_and_tmp_private_and_capped(box: DockerSandbox, ws: Path) -> None:
    result = box.run("touch /x 2>/dev/null; echo root=$?; readlink /var/tmp; "
                     "head -c 20M /dev/zero > /tmp/big; echo tmp=$?; "
                     "head -c 20M /dev/zero > /dev/shm/big; echo shm=$?", ws, Limits(tmp_mib=8))
    assert result.stdout == "root=1\n../tmp\ntmp=1\nshm=1\n"
    assert result.stderr.count("No space left on device") == 2


def test_binds_are_read_only_unless_writable(box: DockerSandbox, ws: Path,
                                             tmp_path: Path) -> None:
    shown, given = tmp_path / "shown", tmp_path / "given"
    shown.mkdir()
    given.mkdir(mode=0o777)
    given.chmod(0o777)
    (shown / "f.txt").write_text("seen\n")
    result = box.run("cat /in/f.txt; touch /in/new; echo ro=$?; touch /out/new; echo rw=$?",
                     ws, binds=[Bind(shown, "/in"), Bind(given, "/out", writable=True)])
    assert result.stdout == "seen\nro=1\nrw=0\n"
    assert not (shown / "new").exists() and (given / "new").exists()


def test_a_scratch_workspace_never_reaches_the_host(box: DockerSandbox, ws: Path) -> None:
    result = box.run("echo x > kept; ls -A; df --output=size -m . | tail -1", ws,
                     Limits(workspace_mib=4))
    assert result.stdout.split() == ["kept", "4"]
    assert list(ws.iterdir()) == []


# --- resource limits --------------------------------------------------------------------


def test_fork_bomb_is_contained(box: DockerSandbox, ws: Path, nothing_left: None) -> None:
    started = time.monotonic()
    result = box.run("bomb() { bomb | bomb & }; bomb; sleep 1", ws,
                     Limits(timeout_s=5, max_procs=32))
    assert time.monotonic() - started < 10
    assert "fork: retry: Resource temporarily unavailable" in result.stderr


def test_process_limit_is_enforced(box: DockerSandbox, ws: Path, nothing_left: None) -> None:
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
    result = box.run(f"python3 -c '{spawn}'", ws, Limits(max_procs=16))
    assert result.exit_code == 0, result.stderr
    # Counted in the container alone: its init and python count (bash execs python).
    assert "process count" in DIFFERENCES
    assert 0 < int(result.stdout) <= 16 - 2


def test_wall_clock_timeout_kills_everything(box: DockerSandbox, ws: Path,
                                             nothing_left: None) -> None:
    result = box.run(f": aw-{uuid.uuid4().hex}; setsid sleep 100 & sleep 100", ws,
                     Limits(timeout_s=1))
    assert (result.timed_out, result.killed_reason, result.exit_code) == (True, "timeout", None)
    assert 1.0 <= result.seconds < 4.0


def test_timeout_applies_after_the_command_closes_its_output(box: DockerSandbox, ws: Path,
                                                             nothing_left: None) -> None:
    result = box.run("exec >&- 2>&-; sleep 100", ws, Limits(timeout_s=1))
    assert (result.timed_out, result.killed_reason) == (True, "timeout")
    assert result.seconds < 4.0


def test_output_flood_is_truncated_and_killed(box: DockerSandbox, ws: Path,
                                              nothing_left: None) -> None:
    result = box.run("yes", ws, Limits(max_output_bytes=1000))
    assert (result.truncated, result.killed_reason, result.exit_code) == (True, "output limit",
                                                                          None)
    assert result.stdout == "y\n" * 500 + "\n[... output truncated at 1000 bytes ...]"
    assert result.seconds < 5.0


def test_large_output_below_the_kill_cap_is_truncated(box: DockerSandbox, ws: Path) -> None:
    result = box.run("head -c 3000 /dev/zero | tr '\\0' a; echo done >&2", ws,
                     Limits(max_output_bytes=1000))
    assert (result.exit_code, result.truncated, result.killed_reason) == (0, True, None)
    assert result.stdout.startswith("a" * 1000 + "\n" + MARKER)
    assert result.stderr == "done\n"


def test_memory_hog_is_stopped_and_modest_use_works(box: DockerSandbox, ws: Path) -> None:
    assert "memory limit" in DIFFERENCES
    hog = box.run("python3 -c 'b = bytearray(2 << 30); print(len(b))'", ws)
    assert hog.exit_code == 1
    assert hog.stderr.rstrip().endswith("MemoryError")
    assert hog.killed_reason == "memory"
    modest = box.run("python3 -c 'b = bytearray(64 << 20); print(len(b))'", ws)
    assert (modest.exit_code, modest.stdout) == (0, f"{64 << 20}\n")


def test_cpu_spin_is_stopped_by_the_cpu_limit(box: DockerSandbox, ws: Path) -> None:
    result = box.run("python3 -c 'while True: pass'", ws, Limits(cpu_s=1, timeout_s=10))
    assert (result.exit_code, result.killed_reason, result.timed_out) == (152, "cpu", False)
    assert result.seconds < 5.0


def test_a_spin_that_ignores_sigxcpu_meets_the_hard_cpu_limit(box: DockerSandbox,
                                                                ws: Path) -> None:
    spin = "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True: pass\n"
    result = box.run(f"python3 -c '{spin}'", ws, Limits(cpu_s=1, timeout_s=10))
    assert (result.exit_code, result.killed_reason) == (137, "cpu")


def test_file_size_bomb_is_stopped(box: DockerSandbox, ws: Path) -> None:
    result = box.run("head -c 200M /dev/zero > big", ws)
    assert (result.exit_code, result.killed_reason) == (153, "file size")
    assert (ws / "big").stat().st_size == Limits().max_file_mib << 20


# --- refusals and errors ----------------------------------------------------------------


@pytest.mark.parametrize("workspace", ["/", "/tmp", "/nonexistent/workspace"])
def test_unsafe_or_missing_workspace_is_refused(box: DockerSandbox, workspace: str) -> None:
    with pytest.raises(SandboxError):
        box.run("true", Path(workspace))


def test_bad_command_and_bind_are_refused(box: DockerSandbox, ws: Path) -> None:
    with pytest.raises(SandboxError, match="NUL"):
        box.run("echo \0", ws)
    with pytest.raises(SandboxError, match="collides"):
        box.run("true", ws, binds=[Bind(ws, MOUNT_AT + "/x")])


def test_a_missing_image_is_named_with_how_to_build_it(ws: Path) -> None:
    with pytest.raises(SandboxError, match=r"agent-worlds-base:nonexistent .*build-base\.sh"):
        DockerSandbox("agent-worlds-base:nonexistent").run("true", ws)


# --- the container's configuration (no engine needed) -----------------------------------


def test_the_container_holds_every_limit(tmp_path: Path) -> None:
    container, host = DockerSandbox("img:1", cpus=0.5).container_config(
        "echo hi", tmp_path, Limits(memory_mib=256, max_procs=32, cpu_s=5, max_file_mib=8,
                                    tmp_mib=16), env={"A": "b"}, user=(999, 995),
        binds=[Bind(tmp_path, "/in")])
    assert (container["image"], container["entrypoint"], container["command"]) == (
        "img:1", ["/bin/bash", "-c"], ["echo hi"])
    assert (container["user"], container["working_dir"], container["network_disabled"]) == (
        "999:995", "/workspace", True)
    assert container["environment"]["A"] == "b"
    assert container["environment"]["HOME"] == "/workspace"
    assert {k: host[k] for k in ("network_mode", "read_only", "cap_drop", "security_opt",
                                 "init", "pids_limit", "nano_cpus", "ipc_mode")} == {
        "network_mode": "none", "read_only": True, "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"], "init": True, "pids_limit": 32,
        "nano_cpus": 500_000_000, "ipc_mode": "private"}
    assert host["tmpfs"] == {"/tmp": "rw,nosuid,nodev,exec,size=16m,mode=1777"}
    assert host["shm_size"] == 16 << 20
    assert {(u["Name"], u["Soft"], u["Hard"]) for u in host["ulimits"]} == {
        ("cpu", 5, 6), ("data", 256 << 20, 256 << 20), ("fsize", 8 << 20, 8 << 20),
        ("nofile", 256, 256), ("core", 0, 0)}
    assert [(m["Target"], m["Source"], m["ReadOnly"]) for m in host["mounts"]] == [
        ("/workspace", str(tmp_path), False), ("/in", str(tmp_path), True)]
    assert host["log_config"]["Type"] == "none"
