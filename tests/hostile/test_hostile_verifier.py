"""Hostile verifier jobs against verifier servers (hardening, class 1): nothing a job does
changes the verdict of a later job, nor the driver itself.

A server (``gates.verifier_server``) runs job after job in one sandbox. Each case of the
corpus below is a hostile verifier folder; it runs on a server, then an honest probe runs
on the same server (or on the fresh one that replaced it), and the probe's verdict and
evidence must be what a sandbox of its own gives the probe. The probe reports, as
evidence, everything of its sandbox a job could have left or changed: the modules it
imports and where from, its rlimits, scheduling, signal state, the files and free space of
every writable place, System V IPC objects, processes, keyrings, sockets and a port, its
environment and descriptors. Its one check is whether the answer is right, so a forged
pass shows as a changed check. The hostile job's own verdict must also be what a sandbox of
its own gives it.

Families (several variants each): modules that shadow the standard library or the SDK
(a module, a package, a sourceless .pyc; names the driver imports late, names scripts
import), the driver's rlimits and scheduling changed from outside (prlimit, renice,
taskset, chrt, ionice, and the same through Python), kernel keyrings (user, user-session,
session pushed to the parent, persistent, permissions), System V and POSIX IPC, processes
left behind (daemons, stopped, many, exec'd), files (deep, closed, special, many, full
disks), sockets (TIME_WAIT, listeners, abstract), signals to the driver, and a script's
own process state (umask, cwd, environment, signal dispositions, sys.modules, timers).

A property test (hypothesis) draws sequences of hostile jobs, then the probe. A last test
bounds a job's disk: /workspace is a tmpfs of its own, in a server and in a one-run
sandbox alike.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import py_compile
import shutil
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gates.verifier_server as servers
from gates.agents import scripted
from gates.contract import Verdict
from gates.rollout import run_rollout
from gates.task import load_task
from gates.verifier import run_verifier
from packs.registry import load_pack
from replay.engine import Worlds
from replay.files import chmod_tree
from tests.support.cli_harness import invoke
from tests.support.sandbox_uids import free_uid
from worldenv.instances.instance import Environment
from worldenv.sandbox.bubblewrap import BubblewrapSandbox
from worldenv.sandbox.choice import default_sandbox
from worldenv.sandbox.contract import Limits

LIMITS = Limits(timeout_s=5, cpu_s=3, memory_mib=512, max_procs=48,
                max_output_bytes=64 * 1024, max_file_mib=4, tmp_mib=8)
RIGHT, WRONG = "42", "41"
UID = free_uid(66_000 + 2 * (os.getpid() % 1_000))
PORT = 47_013
# add_key, keyctl by machine (the probe and the keyring cases call them directly).
KEY_CALLS = {"x86_64": (248, 250), "aarch64": (217, 219)}.get(os.uname().machine, (-1, -1))


# --- the honest probe ------------------------------------------------------------------

PROBE = r'''
import ctypes, json, os, socket, sys
import binascii, csv, difflib, resource, select
import awsdk

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
ADD_KEY, KEYCTL = @CALLS@

def listing(top):
    found = []
    for dirpath, dirnames, filenames in os.walk(top):
        found += [os.path.join(dirpath, n) for n in dirnames + filenames]
    return sorted(found)

def keyctl(*args):
    ctypes.set_errno(0)
    got = libc.syscall(KEYCTL, *[ctypes.c_long(a) for a in args])
    return [got, ctypes.get_errno()]

def port():
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", @PORT@))
        return "bound"
    except OSError as exc:
        return exc.errno
    finally:
        s.close()

def lines(path):
    try:
        with open(path) as f:
            return f.read().splitlines()[1:]
    except OSError as exc:
        return exc.errno

ws = awsdk.worlds()
status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines()
              if ":\t" in line)
tops = ("/tmp", "/dev/shm", "/workspace")
evidence = {
    "modules": sorted(sys.modules),
    "path": sys.path,
    "module_files": [getattr(m, "__file__", "built-in") for m in
                     (binascii, csv, difflib, resource, select, awsdk)],
    "limits": open("/proc/self/limits").read(),
    "nice": os.getpriority(os.PRIO_PROCESS, 0),
    "affinity": sorted(os.sched_getaffinity(0)),
    "scheduler": os.sched_getscheduler(0),
    "status": {k: status.get(k) for k in ("Umask", "SigBlk", "SigIgn", "SigCgt", "SigPnd",
                                          "ShdPnd", "NoNewPrivs", "Seccomp", "CapEff")},
    "files": {top: listing(top) for top in tops},
    "free": {top: [os.statvfs(top).f_bfree, os.statvfs(top).f_ffree] for top in tops},
    "ipc": {kind: lines(f"/proc/sysvipc/{kind}") for kind in ("shm", "sem", "msg")},
    "processes": sorted(open(f"/proc/{p}/comm").read().strip()
                        for p in os.listdir("/proc") if p.isdigit()),
    "keyrings": [keyctl(11, ring, 0, 0) for ring in (-4, -5, -3)],
    "sockets": {kind: len(lines(f"/proc/net/{kind}")) for kind in ("tcp", "tcp6", "udp",
                                                                  "unix")},
    "port": port(),
    "env": dict(os.environ),
    "cwd": os.getcwd(),
    "fds": sorted(os.listdir("/proc/self/fd")),
}
print("RESULT_JSON=" + json.dumps({"checks": {"answer_right": ws.answer == "42"},
                                   "evidence": evidence}))
'''.replace("@CALLS@", repr(KEY_CALLS)).replace("@PORT@", str(PORT))


# --- the hostile corpus ----------------------------------------------------------------

OK = "import awsdk\nawsdk.result(ran=True)\n"

# A module that, imported anywhere, replaces itself with the real one and, when that is
# the driver, forges a pass for every script reported from then on.
_FORGED_LINE = "RESULT_JSON=" + json.dumps({"checks": {"answer_right": True}}) + "\n"
SHADOW = '''
import sys
if __name__ == "__main__":  # a verifier folder's .py files are its scripts, too
    import awsdk
    awsdk.result(shadow_ran_as_a_script=True)
_name = __name__
del sys.modules[_name]
_saved = sys.path[:]
sys.path[:] = [p for p in sys.path if not p.startswith("/verifier")]
try:
    import importlib
    _real = importlib.import_module(_name)
finally:
    sys.path[:] = _saved
sys.modules[_name] = _real
globals().update({k: v for k, v in vars(_real).items() if not k.startswith("__")})
_aw = sys.modules.get("awdriver")
if _aw is not None and hasattr(_aw, "_Driver"):
    _record = _aw._Driver._record
    def _forge(self, child, _record=_record):
        record = _record(self, child)
        record.update(exit=0, timed_out=False, flooded=False, stdout=@FORGED@, stdout_cut=False)
        return record
    _aw._Driver._record = _forge
'''.replace("@FORGED@", repr(base64.b64encode(_FORGED_LINE.encode()).decode()))


def _script(body: str) -> str:
    """A hostile script: `body`, then a plain verdict of its own."""
    return ("import ctypes, os, signal, socket, subprocess, sys, time\nimport awsdk\n"
            + textwrap.dedent(body) + "\nawsdk.result(ran=True)\n")


def _daemon(body: str) -> str:
    """A script that leaves a detached process running `body` (double fork, new session)."""
    return _script(f"""
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
{textwrap.indent(textwrap.dedent(body), " " * 16)}
                os._exit(0)
            os._exit(0)
        os.wait()
        time.sleep(0.05)
    """)


KEYS = f"""
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
ADD_KEY, KEYCTL = {KEY_CALLS!r}
def add_key(ring, text=b"answer"):
    return libc.syscall(ADD_KEY, b"user", b"answer", text, len(text), ctypes.c_long(ring))
def keyctl(*args):
    return libc.syscall(KEYCTL, *[ctypes.c_long(a) for a in args])
"""

SYSV = """
libc = ctypes.CDLL(None, use_errno=True)
"""


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    files: dict[str, str | bytes]
    # Whether the server must be retired after it (it changed what no scrub restores),
    # None where either is right (the driver may or may not survive it).
    retires: bool | None = False


def _shadow(name: str, *, form: str = "module") -> Case:
    if form == "module":
        files: dict[str, str | bytes] = {f"{name}.py": SHADOW}
    elif form == "package":
        files = {f"{name}/__init__.py": SHADOW}
    else:  # a sourceless .pyc beside the scripts: importable as such
        files = {f"{name}.pyc": _compiled(SHADOW)}
    uses = "import select, binascii, difflib\nawsdk.similar('a', 'b')\n"
    return Case(f"shadow_{name}_{form}", {**files, "check.py": "import awsdk\n" + uses + OK})


def _compiled(source: str) -> bytes:
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"shadow-{os.getpid()}"
    scratch.mkdir(exist_ok=True)
    (scratch / "m.py").write_text(source)
    target = scratch / "m.pyc"
    py_compile.compile(str(scratch / "m.py"), cfile=str(target), doraise=True)
    data = target.read_bytes()
    shutil.rmtree(scratch)
    return data


CORPUS = [
    # modules: names the driver imported late (select, binascii, and resource, which
    # os.wait4 imports), names scripts import late (difflib), ones already loaded (csv,
    # json) and the SDK and its driver themselves; a module, a package, a sourceless .pyc
    *[_shadow(name) for name in ("select", "binascii", "resource", "difflib", "csv",
                                 "awsdk", "awdriver", "atexit", "types")],
    _shadow("select", form="package"),
    _shadow("json", form="package"),
    _shadow("binascii", form="pyc"),
    _shadow("resource", form="pyc"),
    Case("shadow_by_own_path", {"select.py": SHADOW, "check.py": _script(
        "sys.path.insert(0, '/verifier'); sys.modules.pop('select', None); import select")}),
    # the driver's limits and scheduling, changed from outside (it is the scripts' parent)
    Case("prlimit_nofile", {"a.py": _script(
        "import resource\nresource.prlimit(os.getppid(), resource.RLIMIT_NOFILE, (40, 40))")},
        retires=True),
    Case("prlimit_nproc_cli", {"a.py": _script(
        "subprocess.run(['prlimit', f'--pid={os.getppid()}', '--nproc=3:3'], check=True)")},
        retires=True),
    Case("prlimit_as", {"a.py": _script(
        "import resource\nresource.prlimit(os.getppid(), resource.RLIMIT_AS, "
        "(400 << 20, 400 << 20))")}, retires=True),
    Case("prlimit_cpu_soft", {"a.py": _script(
        "import resource\nhard = resource.prlimit(os.getppid(), resource.RLIMIT_CPU)[1]\n"
        "resource.prlimit(os.getppid(), resource.RLIMIT_CPU, (2, hard))")}, retires=True),
    Case("prlimit_fsize_stack", {"a.py": _script(
        "subprocess.run(['prlimit', f'--pid={os.getppid()}', '--fsize=1024:1024', "
        "'--stack=1048576:1048576'], check=True)")}, retires=True),
    Case("renice_driver", {"a.py": _script(
        "os.setpriority(os.PRIO_PROCESS, os.getppid(), 7)")}, retires=True),
    Case("renice_driver_cli", {"a.py": _script(
        "subprocess.run(['renice', '-n', '12', '-p', str(os.getppid())], check=True, "
        "capture_output=True)")}, retires=True),
    Case("chrt_idle_driver", {"a.py": _script(
        "os.sched_setscheduler(os.getppid(), os.SCHED_IDLE, os.sched_param(0))")},
        retires=True),
    Case("ionice_idle_driver", {"a.py": _script(
        "subprocess.run(['ionice', '-c', '3', '-p', str(os.getppid())], check=True)")},
        retires=True),
    Case("taskset_driver", {"a.py": _script(
        "cpus = sorted(os.sched_getaffinity(0))\n"
        "os.sched_setaffinity(os.getppid(), cpus[:1] if len(cpus) > 1 else cpus)")},
        retires=len(os.sched_getaffinity(0)) > 1),
    # kernel keyrings: the answer kept for the next job
    Case("key_user_keyring", {"a.py": _script(KEYS + "add_key(-4)")}),
    Case("key_user_session_keyring", {"a.py": _script(KEYS + "add_key(-5)")}),
    Case("key_session_to_parent", {"a.py": _script(
        KEYS + "add_key(-3)\nkeyctl(18)")}),  # KEYCTL_SESSION_TO_PARENT
    Case("key_persistent", {"a.py": _script(
        KEYS + "ring = keyctl(22, -1, -4)\nadd_key(ring)")}),  # KEYCTL_GET_PERSISTENT
    Case("key_locked_user_keyring", {"a.py": _script(
        KEYS + "add_key(-4)\nkeyctl(5, -4, 0)")}),  # KEYCTL_SETPERM: nobody may clear it
    # IPC
    Case("sysv_shm_closed", {"a.py": _script(
        SYSV + "libc.shmget(0x5151, 4096, 0o1000)")}),  # IPC_CREAT, mode 0
    Case("sysv_sem_and_msg", {"a.py": _script(
        SYSV + "libc.semget(0x5152, 3, 0o1600)\nq = libc.msgget(0x5153, 0o1666)\n"
        "msg = ctypes.create_string_buffer(b'\\x01\\0\\0\\0\\0\\0\\0\\0answer')\n"
        "libc.msgsnd(q, msg, 6, 0)")}),
    Case("sysv_shm_held_by_daemon", {"a.py": _daemon(
        "libc = ctypes.CDLL(None)\nseg = libc.shmget(0, 4096, 0o1600)\n"
        "libc.shmat.restype = ctypes.c_void_p\nlibc.shmat(seg, None, 0)\ntime.sleep(30)")}),
    Case("posix_mqueue_and_shm", {"a.py": _script(
        "rt = ctypes.CDLL(None, use_errno=True)\n"
        "rt.mq_open(b'/answer', os.O_CREAT | os.O_RDWR, 0o600, None)\n"
        "fd = os.open('/dev/shm/answer', os.O_CREAT | os.O_WRONLY, 0)\n"
        "os.write(fd, b'42')\nos.fchmod(fd, 0)")}),
    # processes left behind
    Case("daemon_sleeps", {"a.py": _daemon("time.sleep(30)")}),
    Case("daemon_attacks_next_job", {"a.py": _daemon(
        "time.sleep(0.3)\nimport resource\n"
        "for pid in range(1, 64):\n"
        "    try:\n"
        "        resource.prlimit(pid, resource.RLIMIT_NOFILE, (8, 8))\n"
        "    except OSError:\n"
        "        pass")}),
    Case("stopped_process", {"a.py": _script(
        "pid = os.fork()\nif pid == 0:\n    time.sleep(30)\n    os._exit(0)\n"
        "os.kill(pid, signal.SIGSTOP)")}),
    Case("many_processes", {"a.py": _script(
        "for _ in range(20):\n    if os.fork() == 0:\n        os.setpgid(0, 0)\n"
        "        time.sleep(30)\n        os._exit(0)")}),
    Case("exec_new_session", {"a.py": _script(
        "subprocess.Popen(['setsid', 'sleep', '30'], start_new_session=True)\n"
        "time.sleep(0.05)")}),
    Case("fork_chain_ignoring_signals", {"a.py": _daemon(
        "for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):\n"
        "    signal.signal(s, signal.SIG_IGN)\n"
        "while True:\n    if os.fork():\n        os._exit(0)\n    time.sleep(0.01)")}),
    # files
    Case("deep_closed_tree", {"a.py": _script(
        "os.makedirs('/tmp/d/' + '/'.join(['d'] * 50))\nopen('/tmp/d/f', 'w').write('42')\n"
        "os.chmod('/tmp/d', 0)\nos.makedirs('/workspace/.hidden/x')\n"
        "os.chmod('/workspace/.hidden', 0)")}),
    Case("special_files", {"a.py": _script(
        "os.mkfifo('/workspace/fifo')\ns = socket.socket(socket.AF_UNIX)\n"
        "s.bind('/tmp/sock')\nos.symlink('/w0', '/dev/shm/w0')\n"
        "os.link('/workspace/fifo', '/workspace/fifo2')\nos.mkdir('/var/tmp/v', 0)")}),
    Case("many_files", {"a.py": _script(
        "for i in range(3000):\n    open(f'/workspace/{i}', 'w').close()")}),
    Case("full_disks", {"a.py": _script(
        "for top in ('/workspace', '/tmp', '/dev/shm'):\n"
        "    for i in range(12):\n"
        "        try:\n"
        "            with open(f'{top}/big{i}', 'wb') as f:\n"
        "                f.write(b'x' * (1 << 20))\n"
        "        except OSError:\n"
        "            break")}),
    # sockets
    Case("tcp_time_wait", {"a.py": _script(f"""
        server = socket.socket()
        server.bind(("127.0.0.1", {PORT}))
        server.listen()
        client = socket.create_connection(("127.0.0.1", {PORT}))
        conn, _ = server.accept()
        conn.close()  # the port's side closes first: it is the one left in TIME_WAIT
        client.close()
        server.close()
        time.sleep(0.05)
    """)}, retires=True),
    Case("listener_in_daemon", {"a.py": _daemon(
        f"s = socket.socket()\ns.bind(('127.0.0.1', {PORT}))\ns.listen()\n"
        "u = socket.socket(socket.AF_UNIX)\nu.bind('\\0answer')\nu.listen()\n"
        "d = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\nd.bind(('127.0.0.1', 0))\n"
        "time.sleep(30)")}),
    # the driver, signalled
    Case("sigint_to_driver", {"a.py": _script(
        "os.kill(os.getppid(), signal.SIGINT)\ntime.sleep(0.5)")}, retires=None),
    Case("signals_the_driver_ignores", {"a.py": _script(
        "os.kill(os.getppid(), signal.SIGCONT)\nos.kill(os.getppid(), signal.SIGWINCH)")}),
    # a script's own process state: its own, never the driver's nor the next job's
    Case("own_state", {"a.py": _script(
        "os.umask(0o777)\nos.chdir('/tmp')\nos.environ['AW_ANSWER'] = '/tmp/forged'\n"
        "os.putenv('AW_ANSWER', '/tmp/forged')\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})\n"
        "saved = awsdk.result\nsys.modules['awsdk'].result = None\n"
        "sys.path.insert(0, '/tmp')\nopen('/tmp/awsdk.py', 'w').write('raise SystemExit')\n"
        "signal.setitimer(signal.ITIMER_REAL, 0.2)\nsignal.signal(signal.SIGALRM, "
        "signal.SIG_IGN)\nimport awsdk as again\nassert again.result is None\n"
        "awsdk.result = saved")}),
    Case("descriptors_in_daemon", {"a.py": _daemon(
        "fds = [os.open('/w0', os.O_RDONLY) for _ in range(50)]\n"
        "r, w = os.pipe()\nos.set_inheritable(w, True)\ntime.sleep(30)")}),
]
BY_NAME = {case.name: case for case in CORPUS}
assert len(BY_NAME) == len(CORPUS)


# --- fixtures and helpers ----------------------------------------------------------------


@pytest.fixture(scope="module")
def box() -> BubblewrapSandbox:
    if not isinstance(default_sandbox(), BubblewrapSandbox):
        pytest.fail("these tests need bubblewrap (apt-get install bubblewrap util-linux)")
    return BubblewrapSandbox(uid=UID, gid=UID)


@pytest.fixture(scope="module")
def worlds(demo_worlds: Worlds) -> Iterator[Worlds]:
    servers.close_servers()
    yield demo_worlds
    servers.close_servers()


@pytest.fixture(scope="module")
def w0(worlds: Worlds) -> Path:
    return worlds.snapshot("lars", 7)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every case's verifier folder, and the probe's, made once."""
    root = tmp_path_factory.mktemp("verifiers")
    made = {case.name: _folder(root / case.name, case.files) for case in CORPUS}
    made["probe"] = _folder(root / "probe", {"probe.py": PROBE})
    return made


def _folder(root: Path, files: Mapping[str, str | bytes]) -> Path:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    chmod_tree(root, dirs=0o755, files=0o644)
    return root


class Runner:
    """Runs verifier folders on servers (``served``) or each in a sandbox of its own
    (``alone``); the probe's lone verdict is computed once per answer."""

    def __init__(self, box: BubblewrapSandbox, worlds: Worlds, w0: Path,
                 folders: dict[str, Path]) -> None:
        self.box, self.w0, self.folders = box, w0, folders
        self.scratch = worlds.cache.tmp
        self._probe_alone: dict[str, Verdict] = {}

    def served(self, name: str, answer: str = RIGHT) -> Verdict:
        return run_verifier(self.folders[name], self.w0, self.w0, answer, sandbox=self.box,
                            limits=LIMITS, scratch=self.scratch)

    def alone(self, name: str, answer: str = RIGHT) -> Verdict:
        return run_verifier(self.folders[name], self.w0, self.w0, answer, sandbox=self.box,
                            limits=LIMITS)

    def probe_alone(self, answer: str) -> Verdict:
        if answer not in self._probe_alone:
            self._probe_alone[answer] = self.alone("probe", answer)
        return self._probe_alone[answer]


@pytest.fixture(scope="module")
def runner(box: BubblewrapSandbox, worlds: Worlds, w0: Path,
           folders: dict[str, Path]) -> Runner:
    return Runner(box, worlds, w0, folders)


def _seen(verdict: Verdict) -> list[object]:
    """What of a verdict must not depend on where it ran: checks, errors, and each
    script's status, error and evidence (timings and output tails aside)."""
    return [[(c.script, c.name, c.passed) for c in verdict.checks], verdict.errors,
            [(s.script, s.exit_code, s.error, s.evidence) for s in verdict.scripts]]


def _same(served: Verdict, alone: Verdict) -> None:
    got, want = _seen(served), _seen(alone)
    if got != want:  # name the first piece of evidence that differs
        for a, b in zip(served.scripts, alone.scripts, strict=False):
            for key in sorted(set(a.evidence) | set(b.evidence)):
                assert a.evidence.get(key) == b.evidence.get(key), key
    assert got == want


# --- the tests ---------------------------------------------------------------------------


def test_the_probe_sees_the_same_in_a_server_and_alone(runner: Runner) -> None:
    """The baseline: on a fresh server, and after honest jobs, the probe's verdict and
    evidence are those of a sandbox of its own; a wrong answer fails."""
    servers.close_servers()
    for answer in (RIGHT, WRONG, RIGHT):
        served = runner.served("probe", answer)
        assert served.errors == [], served.scripts[0].stderr_tail
        _same(served, runner.probe_alone(answer))
    assert [c.passed for c in runner.probe_alone(WRONG).checks] == [False]
    evidence = runner.probe_alone(RIGHT).scripts[0].evidence
    assert evidence["keyrings"] == [[-1, 1]] * 3  # EPERM: no keyring is reachable
    assert evidence["port"] == "bound"
    assert not any(f.startswith("/verifier") for f in evidence["module_files"])


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_a_hostile_job_leaves_nothing_to_the_next(runner: Runner, name: str) -> None:
    """Each case on a server, then the probe (with a wrong answer, so that a forged pass
    shows): both verdicts are what a sandbox of their own gives them, and the server was
    retired exactly when the case changed what no scrub restores."""
    case = BY_NAME[name]
    servers.close_servers()  # each case on a server of its own: one's harm is not another's
    served = servers.jobs_served()
    hostile = runner.served(name)
    between = servers.servers_started()
    probe = runner.served("probe", WRONG)
    assert servers.jobs_served() == served + 2  # neither ran in a sandbox of its own
    _same(probe, runner.probe_alone(WRONG))
    _same(hostile, runner.alone(name))
    retired = servers.servers_started() > between
    if case.retires is not None:
        assert retired == case.retires, (hostile.errors, hostile.scripts[0].stderr_tail)


@settings(max_examples=8, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(hostile=st.lists(st.sampled_from(sorted(BY_NAME)), min_size=1, max_size=3),
       answer=st.sampled_from([RIGHT, WRONG]))
def test_any_hostile_jobs_before_an_honest_one_leave_its_verdict_alone(
        runner: Runner, hostile: list[str], answer: str) -> None:
    for name in hostile:
        runner.served(name)
    _same(runner.served("probe", answer), runner.probe_alone(answer))


def test_the_driver_imports_nothing_once_it_serves(runner: Runner, tmp_path: Path) -> None:
    """The driver imports all it will use before its first job: jobs that take every
    path through it (a crash, a timeout, a flood, a signal, a refused start, non-UTF-8
    output) leave its modules as they were, which it checks itself after every job (a
    change retires the server), so one server takes them all."""
    scripts = {
        "crash.py": "raise ValueError('no')\n",
        "exit3.py": "raise SystemExit(3)\n",
        "killed.py": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
        "flood.py": "import sys\nsys.stdout.write('x' * (1 << 20))\n",
        "slow.py": "import time\ntime.sleep(30)\n",
        "bytes.py": "import sys\nsys.stdout.buffer.write(b'\\xff\\xfe RESULT_JSON={}')\n",
        "broken.py": "def (:\n",
        "thread.py": "import threading, awsdk\nthreading.Thread(target=print).start()\n"
                     "awsdk.result(ok=True)\n",
    }
    folder = _folder(tmp_path / "paths", scripts)
    quick = dataclasses.replace(LIMITS, timeout_s=1)
    servers.close_servers()
    started = servers.servers_started()
    for _ in range(2):
        verdict = run_verifier(folder, runner.w0, runner.w0, RIGHT, sandbox=runner.box,
                               limits=quick, scratch=runner.scratch)
        assert len(verdict.errors) == 7, verdict.errors
    assert servers.servers_started() == started + 1


def test_a_jobs_disk_is_a_bounded_tmpfs_never_the_hosts(runner: Runner,
                                                        tmp_path: Path) -> None:
    """/workspace of a verifier run is a tmpfs of ``tmp_mib`` (as /tmp and /dev/shm are),
    in a server and in a sandbox of its own: writing past it fails with ENOSPC, and it
    is no directory of the host's disk."""
    writer = _folder(tmp_path / "writer", {"fill.py": _script("""
        import errno, json
        written, failed = 0, None
        try:
            for i in range(64):
                with open(f"/workspace/f{i}", "wb") as f:
                    f.write(b"x" * (1 << 20))
                written += 1
        except OSError as exc:
            failed = exc.errno
        for i in range(2000):
            open(f"/workspace/n{i}", "w").close()
        st = os.statvfs("/workspace")
        mounts = [line.split() for line in open("/proc/self/mountinfo")]
        kind = [m[m.index("-") + 1] for m in mounts if m[4] == "/workspace"]
        print("RESULT_JSON=" + json.dumps({"checks": {
            "full_at_its_size": failed == errno.ENOSPC and written <= 8,
            "sized": st.f_blocks * st.f_frsize == 8 << 20,
            "a_tmpfs": kind == ["tmpfs"]}}))
        raise SystemExit(0)
    """)})
    for scratch in (runner.scratch, None):
        verdict = run_verifier(writer, runner.w0, runner.w0, RIGHT, sandbox=runner.box,
                               limits=LIMITS, scratch=scratch)
        assert verdict.passed, (verdict.errors, [(c.name, c.passed) for c in verdict.checks])


def test_the_corpus_is_several_variants_of_every_family() -> None:
    families = {name.split("_")[0] for name in BY_NAME}
    assert len(CORPUS) >= 40
    assert {"shadow", "prlimit", "key", "sysv", "daemon", "tcp"} <= families



def test_rl_sft_keeps_no_failing_episode_after_a_hostile_pack(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Through the command line: a pack whose first rl task's verifier folder holds
    modules named like those the driver imported late (select, binascii, resource)
    made ``worldctl rl sft`` keep another task's failing episode as SFT data (the
    poisoned server forged its pass). Only the passing episode is kept."""
    root = tmp_path_factory.mktemp("hostile-pack")
    pack_dir = root / "demo"  # a pack's folder bears its name
    shutil.copytree(load_pack("demo").root, pack_dir)
    hostile, victim = "nordlys-cart-vs-bom", "mats-work-order"  # the rl split's first two
    for name in ("select", "binascii", "resource"):
        (pack_dir / "tasks" / hostile / "verifier" / f"{name}.py").write_text(SHADOW)
    chmod_tree(pack_dir, dirs=0o755, files=0o644)
    pack = load_pack(str(pack_dir))
    store = root / "store"
    episodes = {}
    with Worlds.open(str(store), create=True) as opened:
        for log in pack.worlds:
            opened.import_file(log)
        with Environment(opened) as env:
            for task_id, agent in ((hostile, "reference"), (victim, "answer-only")):
                servers.close_servers()  # each graded on a server of its own
                task = load_task(pack.task_dir(task_id))
                episodes[task_id] = run_rollout(env, task, scripted(agent), hinted=False)
    assert episodes[hostile].succeeded and not episodes[victim].succeeded
    servers.close_servers()  # the command's verdicts come from servers it starts itself
    out = root / "sft.parquet"
    result = invoke("--store", str(store), "rl", "sft", str(pack_dir), "--split", "rl",
                    "--out", str(out), "--json")
    assert result.exit_code == 0, result.output
    kept = [(e["task_id"], e["episode_id"]) for e in json.loads(result.stdout)["episodes"]]
    assert kept == [(hostile, episodes[hostile].episode_id)]
