"""Run agent shell commands in a sandbox, never in this process.

``run_sandboxed(command, workspace)`` runs ``bash -c command`` with the instance's workspace as
its writable working directory ``/workspace`` and returns a ``ShellResult``. The sandbox is
bubblewrap where it works (``BubblewrapSandbox``), else Docker where an engine answers
(``DockerSandbox``); ``default_sandbox()`` probes once and caches its choice.

Every bubblewrap sandbox of the project (this shell, the verifier's runs through it, the
carried-app workers of ``worldenv.sandbox.workers``) is declared as a ``SandboxPolicy`` and turned
into its command line by the one function ``bwrap_argv``, which also holds what no policy
can loosen. ``classify_limit`` names the limit that stopped a process, for the shell and
for the verifier's scripts alike; ``kill_sandbox`` ends a bubblewrap sandbox.

What a command sees under bubblewrap:

* a new root holding only the system directories (``/usr``, ``/etc`` and the ``/bin``,
  ``/lib*``, ``/sbin`` links), read-only; ``/workspace`` (the workspace, read-write;
  a private tmpfs instead with ``Limits.workspace_mib``, as a verifier's);
  fresh ``/proc``, ``/dev`` and size-capped ``/tmp`` and ``/dev/shm``. Everything else of the
  host is absent: the parent of the workspace (so its own ``../services``), every other
  instance, ``/tmp``, ``/root``, ``/home``, ``/work``, ``/var``;
* new pid, network (loopback only), ipc, uts and cgroup namespaces; no capabilities; no
  new privileges; no further user namespaces;
* extra ``binds`` where the caller asks for them (read-only unless marked writable), e.g.
  an interpreter or the worlds a verifier reads;
* an unprivileged uid: as root, the dedicated system user ``agentworlds-sandbox`` (created
  on first use; ``nobody`` if that fails), which is given the workspace tree before every
  run; otherwise the caller's own uid;
* rlimits set by ``prlimit`` before bwrap starts: CPU seconds, address space, file size,
  open files, no core dumps, each per process; and a process limit for the whole sandbox
  (below).

**Roles cannot starve each other.** Four roles run in these sandboxes: the agent shell
(``Limits.max_procs``, 64), the verifier's runs and servers (``gates.verifier``'s limits,
64), the carried-app workers (``WorkerLimits.max_procs``, 64) and the browser
(``worldenv.gui.browser``, a few hundred: Chromium's threads). Each sandbox gets its process limit
(RLIMIT_NPROC, which counts threads too) set by a ``prlimit`` that runs as the first
process *inside* the sandbox's own user namespace, after bwrap made it. Since Linux 5.14 the
kernel counts RLIMIT_NPROC per (user namespace, uid) and checks each level up to the host,
each against the limit the namespace's creator had: the sandbox's own level holds its
processes alone, so one sandbox that hoards processes or forks a bomb reaches only its own
limit, and every other sandbox (of its role or any other, of its uid or not) still starts
and runs. At the host level the total of one uid's sandboxes is bounded only by that uid's
own RLIMIT_NPROC as the host process had it (the process limit is never set before bwrap,
where it would count every sandbox of the uid together, the host's own processes
included). Per-sandbox accounting rather than a user per role: two instances of the same
role must not starve each other either, a host that does not run as root has one uid to
give, and cgroup pids controllers are writable only where cgroups are delegated (root, or
a systemd user slice); per-sandbox uids would need a reserved range and re-chowning a
workspace whenever its uid changes. The users stay as they were: as root,
``agentworlds-sandbox`` for the shell, the verifier and the app workers, and
``agentworlds-browser`` for the browser; otherwise the caller's uid for all. On a kernel
before 5.14, RLIMIT_NPROC is counted per uid and the limits of sandboxes of one uid are
shared.

As root, a policy with a ``user`` has its mounts made by a privileged bwrap (which can reach
a workspace under directories the sandbox uid cannot traverse, such as ``/root`` or
pytest's 0700 tmp dirs); ``setpriv`` then drops to that uid, clears every capability and
sets no-new-privs, and a second, unprivileged bwrap adds a user namespace with nested user
namespaces disabled. Otherwise one unprivileged bwrap does all of it.

The wall-clock timeout and an output flood (4x ``max_output_bytes`` on one stream) kill the
whole sandbox: its pid 1 first, which tears down the pid namespace, then bwrap's group.
Nothing here uses ``preexec_fn``, so ``run`` is safe to call from threads.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import logging
import os
import pwd
import re
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from replay.files import walk
from worldenv.errors import SandboxError

__all__ = [
    "LIMIT_REASONS",
    "Bind",
    "BubblewrapSandbox",
    "DockerSandbox",
    "Limits",
    "Rlimits",
    "Sandbox",
    "SandboxPolicy",
    "SandboxTools",
    "ShellResult",
    "Tmpfs",
    "bwrap_argv",
    "classify_limit",
    "default_sandbox",
    "find_sandbox_tools",
    "give_to_sandbox",
    "kill_sandbox",
    "popen_long_lived",
    "run_sandboxed",
    "sandbox_ids",
]

log = logging.getLogger(__name__)

SANDBOX_USER = "agentworlds-sandbox"
BROWSER_USER = "agentworlds-browser"
MOUNT_AT = "/workspace"
SYSTEM_PATHS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
MAX_COMMAND_BYTES = 100_000  # Linux refuses a single argv string over 128 KiB
OUTPUT_KILL_FACTOR = 4
MAX_OPEN_FILES = 256
_HOST_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Where the sandbox's own mounts live: a bind may sit neither on nor above nor under these.
_RESERVED_TARGETS = ("/proc", "/dev", "/tmp", "/var", MOUNT_AT)
# What classify_limit can answer, most certain first: the supervisor killed the process for
# the first two itself; the others are read from how the process ended.
LIMIT_REASONS = ("timeout", "output limit", "cpu", "file size", "memory", "processes")
# What a process's stderr says when an rlimit stopped it (bash, coreutils, Python, C++).
_CPU_MESSAGES = ("CPU time limit exceeded",)
_FILE_SIZE_MESSAGES = ("File size limit exceeded",)
_MEMORY_MESSAGES = ("MemoryError", "Cannot allocate memory", "out of memory",
                    "std::bad_alloc", "memory exhausted")
# bash's words for a fork refused with EAGAIN, which is RLIMIT_NPROC. Python's bare
# BlockingIOError is left out: it is just as much a non-blocking socket's.
_PROCESS_MESSAGES = ("fork: retry: Resource temporarily unavailable",
                     "fork: Resource temporarily unavailable")


@dataclass(frozen=True)
class Limits:
    """Bounds for one command. CPU, memory and file size are per process (rlimits)."""

    timeout_s: float = 10.0  # wall clock for the whole command
    cpu_s: int = 10  # CPU seconds per process (SIGXCPU, then SIGKILL one second later)
    memory_mib: int = 512  # address space per process (RLIMIT_AS)
    max_procs: int = 64  # processes and threads of this one sandbox (RLIMIT_NPROC)
    max_output_bytes: int = 64 * 1024  # kept per stream; 4x this on one stream kills
    max_file_mib: int = 64  # largest file a process may write (RLIMIT_FSIZE)
    tmp_mib: int = 64  # size of the private /tmp (and, separately, of /dev/shm)
    # A private tmpfs of this size at /workspace instead of the workspace directory (a
    # verifier's scratch: its writes then never reach the host's disk); None: the directory.
    workspace_mib: int | None = None

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, not {self.timeout_s!r}")
        if self.workspace_mib is not None and (
                not isinstance(self.workspace_mib, int) or self.workspace_mib < 1):
            raise ValueError(f"workspace_mib must be None or a positive int, "
                             f"not {self.workspace_mib!r}")
        for name in ("cpu_s", "memory_mib", "max_procs", "max_output_bytes", "max_file_mib",
                     "tmp_mib"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, not {value!r}")


@dataclass(frozen=True)
class ShellResult:
    """What a sandboxed command did.

    ``exit_code`` is the shell's status (128+N when killed by signal N) or None when the
    sandbox killed the command (timeout, output flood). ``killed_reason`` names the limit
    that stopped it (``classify_limit``): "timeout" and "output limit" for certain; "cpu",
    "file size", "memory" and "processes" inferred from the status and stderr (best effort).
    """

    exit_code: int | None
    stdout: str
    stderr: str
    truncated: bool
    timed_out: bool
    killed_reason: str | None
    seconds: float


@dataclass(frozen=True)
class Bind:
    """A host file or directory shown in the sandbox at `target` (an absolute path).

    Read-only unless `writable`; a writable bind still obeys the files' permissions for the
    sandbox uid (its tree is never chowned, unlike the workspace's).
    """

    source: Path
    target: str
    writable: bool = False


class Sandbox(abc.ABC):
    """Runs ``bash -c command`` in a workspace, isolated from this process and the host."""

    name: ClassVar[str]

    @abc.abstractmethod
    def run(self, command: str, workspace: Path, limits: Limits | None = None,
            env: dict[str, str] | None = None, binds: Sequence[Bind] = ()) -> ShellResult:
        """Run `command` with `workspace` as its writable cwd ``/workspace``, and `binds`."""


# ---------------------------------------------------------------------------------------
# Shared process supervision


@dataclass
class _Outcome:
    status: int | None  # shell-style: 128+N for a signal
    stdout: bytes
    stderr: bytes
    stdout_cut: bool
    stderr_cut: bool
    timed_out: bool
    flooded: bool
    cpu_s: float
    seconds: float


def _supervise(argv: list[str], limits: Limits, kill: Callable[[subprocess.Popen[bytes]], None],
               *, env: Mapping[str, str] | None = None) -> _Outcome:
    """Start argv in its own session, read both pipes until it ends or a limit is hit."""
    started = time.monotonic()
    deadline = started + limits.timeout_s
    keep = limits.max_output_bytes
    hard_cap = OUTPUT_KILL_FACTOR * keep
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
                            env=dict(env if env is not None else _HOST_ENV))
    assert proc.stdout is not None and proc.stderr is not None
    streams = {proc.stdout.fileno(): 0, proc.stderr.fileno(): 1}
    kept = (bytearray(), bytearray())
    seen = [0, 0]
    timed_out = flooded = False
    wait_status: int | None = None
    cpu = 0.0
    sel = selectors.DefaultSelector()
    pidfd: int | None = None
    try:
        pidfd = os.pidfd_open(proc.pid)
        sel.register(pidfd, selectors.EVENT_READ)
    except (AttributeError, OSError):
        pidfd = None  # old kernel: poll with WNOHANG below

    def reap(flags: int) -> None:
        nonlocal wait_status, cpu
        pid, status, usage = os.wait4(proc.pid, flags)
        if pid == proc.pid:
            wait_status = status
            cpu = usage.ru_utime + usage.ru_stime

    try:
        for fd in streams:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        while streams or wait_status is None:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            events = sel.select(left if pidfd is not None else min(left, 0.05))
            if pidfd is None and wait_status is None:
                reap(os.WNOHANG)
            for key, _ in events:
                fd = int(key.fd)
                if fd == pidfd:
                    sel.unregister(fd)
                    reap(0)
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    sel.unregister(fd)
                    del streams[fd]
                    continue
                which = streams[fd]
                seen[which] += len(chunk)
                room = keep - len(kept[which])
                if room > 0:
                    kept[which].extend(chunk[:room])
                if seen[which] > hard_cap:
                    flooded = True
            if flooded:
                break
        if wait_status is None:
            if timed_out or flooded:
                kill(proc)
            reap(0)
    finally:
        if wait_status is None:  # an exception above: never leave the sandbox running
            kill(proc)
            reap(0)
        sel.close()
        if pidfd is not None:
            os.close(pidfd)
        proc.stdout.close()
        proc.stderr.close()
    assert wait_status is not None
    code = os.waitstatus_to_exitcode(wait_status)
    proc.returncode = code
    status = None if (timed_out or flooded) else (128 - code if code < 0 else code)
    return _Outcome(status=status, stdout=bytes(kept[0]), stderr=bytes(kept[1]),
                    stdout_cut=seen[0] > keep, stderr_cut=seen[1] > keep,
                    timed_out=timed_out, flooded=flooded, cpu_s=cpu,
                    seconds=time.monotonic() - started)


def _text(data: bytes, cut: bool, limit: int) -> str:
    text = data.decode("utf-8", errors="replace")
    return text + f"\n[... output truncated at {limit} bytes ...]" if cut else text


def classify_limit(exit_code: int | None, stderr: str, limits: Limits, *, cpu_s: float = 0.0,
                   timed_out: bool = False, flooded: bool = False) -> str | None:
    """Which limit stopped a process (one of ``LIMIT_REASONS``), or None for none known.

    `exit_code` is shell-style (128+N for signal N; None when the supervisor killed it),
    `cpu_s` the CPU time it used, `timed_out` / `flooded` whether its supervisor killed it
    for the wall clock or for output over the kill cap: those two are certain. The rlimits
    are inferred from the status and stderr (best effort): a process that ignores SIGXCPU
    meets the hard CPU limit's SIGKILL, told apart from any other SIGKILL by its CPU time.
    """
    if timed_out:
        return "timeout"
    if flooded:
        return "output limit"
    if exit_code is None or exit_code == 0:
        return None
    if exit_code == 128 + signal.SIGXCPU or _says(stderr, _CPU_MESSAGES):
        return "cpu"
    if exit_code == 128 + signal.SIGKILL and cpu_s >= limits.cpu_s:
        return "cpu"
    if exit_code == 128 + signal.SIGXFSZ or _says(stderr, _FILE_SIZE_MESSAGES):
        return "file size"
    if _says(stderr, _MEMORY_MESSAGES):
        return "memory"
    if _says(stderr, _PROCESS_MESSAGES):
        return "processes"
    return None


def _says(stderr: str, messages: Sequence[str]) -> bool:
    return any(message in stderr for message in messages)


def _result(out: _Outcome, limits: Limits) -> ShellResult:
    stderr = _text(out.stderr, out.stderr_cut, limits.max_output_bytes)
    return ShellResult(
        exit_code=out.status,
        stdout=_text(out.stdout, out.stdout_cut, limits.max_output_bytes),
        stderr=stderr,
        truncated=out.stdout_cut or out.stderr_cut,
        timed_out=out.timed_out,
        killed_reason=classify_limit(out.status, stderr, limits, cpu_s=out.cpu_s,
                                     timed_out=out.timed_out, flooded=out.flooded),
        seconds=out.seconds,
    )


def _check_command(command: str, env: Mapping[str, str] | None) -> None:
    if "\0" in command:
        raise SandboxError("the command contains a NUL byte")
    if len(command.encode("utf-8", "surrogateescape")) > MAX_COMMAND_BYTES:
        raise SandboxError(f"the command is longer than {MAX_COMMAND_BYTES} bytes")
    for key, value in (env or {}).items():
        if not _ENV_NAME.match(key) or "\0" in value:
            raise SandboxError(f"bad environment variable {key!r}")


def _sandbox_env(env: Mapping[str, str] | None) -> dict[str, str]:
    # TZ: local time is UTC in every sandbox (a verifier's SQLite 'localtime', Python's
    # time.localtime), never the host's /etc/localtime, which the sandbox can read.
    return {"PATH": SANDBOX_PATH, "HOME": MOUNT_AT, "LANG": "C.UTF-8", "TMPDIR": "/tmp",
            "TZ": "UTC", **(env or {})}


def _check_workspace(workspace: Path, system_paths: Sequence[str]) -> Path:
    real = Path(os.path.realpath(workspace))
    if not real.is_dir():
        raise SandboxError(f"workspace {workspace} is not a directory")
    if len(real.parts) < 3:
        raise SandboxError(f"refusing {real} as a workspace: it is / or a top-level directory")
    for system in system_paths:
        top = os.path.realpath(system)
        if real == Path(top) or Path(top) in real.parents:
            raise SandboxError(f"refusing {real} as a workspace: it is inside {system}, "
                               "which every sandbox sees")
    return real


def _check_binds(binds: Sequence[Bind], system_paths: Sequence[str]) -> list[Bind]:
    """The binds with resolved sources; refuses a target that is not a plain absolute path,
    that two binds share, or that would sit on, above or under the sandbox's own mounts."""
    taken = [*system_paths, *_RESERVED_TARGETS]
    checked: list[Bind] = []
    for bind in binds:
        target = bind.target
        if (not target.startswith("/") or os.path.normpath(target) != target or target == "/"
                or any(c in target for c in ":,\0")):
            raise SandboxError(f"bind target {target!r} must be a normalised absolute path "
                               "other than / (no ':', ',' or NUL)")
        for other in taken:
            if target == other or target.startswith(other.rstrip("/") + "/") \
                    or other.startswith(target + "/"):
                raise SandboxError(f"bind target {target!r} collides with {other!r}")
        source = Path(os.path.realpath(bind.source))
        if not source.exists():
            raise SandboxError(f"bind source {bind.source} (for {target}) does not exist")
        if any(c in str(source) for c in ":,\0"):
            raise SandboxError(f"bind source {source} contains ':', ',' or NUL")
        taken.append(target)
        checked.append(Bind(source, target, bind.writable))
    return checked


def _give_tree(top: Path, uid: int, gid: int) -> None:
    """chown the workspace tree to the sandbox uid; never follows a symlink, and walks in
    a loop bounded in depth (``replay.files.walk``), however deep the agent made it."""
    st = os.lstat(top)
    if (st.st_uid, st.st_gid) != (uid, gid):
        os.chown(top, uid, gid, follow_symlinks=False)
    for entry in walk(top):
        if (entry.stat.st_uid, entry.stat.st_gid) != (uid, gid):
            with contextlib.suppress(FileNotFoundError):
                os.chown(entry.path, uid, gid, follow_symlinks=False)


# ---------------------------------------------------------------------------------------
# bubblewrap

_ids_lock = threading.Lock()


@functools.cache
def _sandbox_ids() -> tuple[int, int]:
    """The uid/gid commands run as: ours unless root; as root the dedicated system user."""
    return _system_user(SANDBOX_USER)


@functools.cache
def browser_ids() -> tuple[int, int]:
    """The uid/gid the instances' browser runs as: ours unless root; as root a system user
    of its own (its files and processes apart from the other roles'; the process limit
    is per sandbox whatever the user, see the module docstring)."""
    return _system_user(BROWSER_USER)


def _system_user(name: str) -> tuple[int, int]:
    if os.geteuid() != 0:
        return os.getuid(), os.getgid()
    with _ids_lock:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            useradd = shutil.which("useradd", path=_HOST_ENV["PATH"])
            if useradd:
                subprocess.run(
                    [useradd, "--system", "--user-group", "--no-create-home",
                     "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name],
                    capture_output=True, check=False, env=_HOST_ENV, timeout=60)
            try:
                entry = pwd.getpwnam(name)
            except KeyError:
                log.warning("could not create user %s; its sandboxes run as nobody "
                            "(uid 65534), which other host processes may share", name)
                return 65534, 65534
        return entry.pw_uid, entry.pw_gid


def sandbox_ids() -> tuple[int, int]:
    """The unprivileged uid/gid sandboxes run as (the shell's; the carried-app workers')."""
    return _sandbox_ids()


def popen_long_lived(argv: Sequence[str], **popen: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(argv, **popen)`` run by one long-lived thread of this process,
    for a sandbox meant to outlive the call that starts it (an app worker, a verifier
    server). bubblewrap's ``--die-with-parent`` is the parent-death signal, which Linux
    sends when the *thread* that started the process ends, so a sandbox started by a
    short-lived thread (a request's, a pool's) would be killed with it."""
    def start() -> subprocess.Popen[bytes]:
        proc: subprocess.Popen[bytes] = subprocess.Popen(list(argv), **popen)
        return proc

    return _spawner().submit(start).result()


_SPAWNERS: dict[int, ThreadPoolExecutor] = {}  # by pid: a forked child makes its own
_SPAWNERS_LOCK = threading.Lock()


def _spawner() -> ThreadPoolExecutor:
    with _SPAWNERS_LOCK:
        found = _SPAWNERS.get(os.getpid())
        if found is None:
            found = _SPAWNERS[os.getpid()] = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="sandbox-spawner")
        return found


def kill_sandbox(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a bubblewrap sandbox started in its own session (`proc` is its bwrap): its
    pid 1 first (the pid namespace dies with it, and bwrap reaps it, so no orphan is
    left), then bwrap's process group; --die-with-parent is the backstop."""
    try:
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
            children = [int(pid) for pid in f.read().split()]
    except OSError:
        children = []
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if children:  # let bwrap reap its pid 1, else that one is orphaned as a zombie
        give_up = time.monotonic() + 1.0
        while time.monotonic() < give_up:
            try:
                if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG):
                    return
            except ChildProcessError:
                return
            time.sleep(0.002)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


@dataclass(frozen=True)
class Rlimits:
    """The rlimits of one sandbox. The per-process ones (``prlimit_args``) are set before
    bwrap starts, so every process of the sandbox inherits them (and bwrap itself runs
    under them); core dumps are always off; CPU: SIGXCPU at `cpu_s`, SIGKILL one second
    later. The process limit (``nproc_args``) is set inside the sandbox's own user
    namespace instead, where the kernel counts it for this sandbox alone (see the module
    docstring); every sandbox has one."""

    cpu_s: int
    memory_mib: int  # address space (RLIMIT_AS)
    max_file_mib: int  # largest file a process may write (RLIMIT_FSIZE)
    max_procs: int  # processes and threads of this sandbox (RLIMIT_NPROC in its namespace)
    open_files: int = MAX_OPEN_FILES

    def __post_init__(self) -> None:
        for name in ("cpu_s", "memory_mib", "max_file_mib", "max_procs", "open_files"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, not {value!r}")

    def prlimit_args(self) -> list[str]:
        """prlimit's options before bwrap: every rlimit but the process limit."""
        return [f"--cpu={self.cpu_s}:{self.cpu_s + 1}", f"--as={self.memory_mib << 20}",
                f"--fsize={self.max_file_mib << 20}", f"--nofile={self.open_files}",
                "--core=0"]

    def nproc_args(self) -> list[str]:
        """prlimit's options inside the sandbox: the process limit, soft and hard."""
        return [f"--nproc={self.max_procs}:{self.max_procs}"]


@dataclass(frozen=True)
class Tmpfs:
    """A private, size-capped tmpfs at `target`, mode 1777."""

    target: str
    size_mib: int


@dataclass(frozen=True)
class SandboxPolicy:
    """What one bubblewrap sandbox shows and allows; ``bwrap_argv`` makes its command line.

    Only what differs between the project's sandboxes is declared here. What every sandbox
    gets, whatever its policy, is fixed in ``bwrap_argv`` so that no policy can loosen it:
    new pid, network (a private loopback only), ipc, uts, cgroup and user namespaces; no
    nested user namespaces; every capability dropped; no new privileges; its own session;
    death with its parent; hostname ``sandbox``; a fresh ``/proc`` and ``/dev``; an empty
    environment but `env`; a root that holds nothing but what is listed here and is
    remounted read-only (so only the writable `binds` and the tmpfs can be written).
    """

    cwd: str  # absolute, inside the sandbox
    rlimits: Rlimits
    # Host directories bound read-only at the same place; a symlink is recreated as a link.
    system_paths: tuple[str, ...] = SYSTEM_PATHS
    tmpfs: tuple[Tmpfs, ...] = ()
    dirs: tuple[str, ...] = ()  # empty directories, mode 0755
    symlinks: tuple[tuple[str, str], ...] = ()  # (what the link holds, where it is)
    # In order, after the above; read-only unless writable. Missing parents are made 0755.
    binds: tuple[Bind, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # the whole environment of the command
    # The host uid/gid the command runs as: as root, dropped to through setpriv; otherwise
    # mapped onto the caller's own. None: the caller's own uid, mapped to itself, with no
    # capability in the sandbox's user namespace.
    user: tuple[int, int] | None = None
    # The command is the namespace's pid 1 (killing it ends the sandbox), rather than a
    # child of bwrap's own init (which reaps whatever the command orphans).
    as_pid_1: bool = False


@dataclass(frozen=True)
class SandboxTools:
    """The host programs a sandbox is made with (resolved absolute paths)."""

    bwrap: str
    prlimit: str
    setpriv: str | None = None  # needed only to drop from root to a policy's user


def find_sandbox_tools(*, setpriv: bool = True) -> SandboxTools:
    """bwrap and prlimit (and setpriv unless not wanted) on the host's system PATH."""
    names = ("bwrap", "prlimit", "setpriv") if setpriv else ("bwrap", "prlimit")
    found = {name: shutil.which(name, path=_HOST_ENV["PATH"]) for name in names}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        raise SandboxError(f"{', '.join(missing)} not found: install bubblewrap and "
                           "util-linux (apt-get install bubblewrap util-linux)")
    real = {name: os.path.realpath(path or "") for name, path in found.items()}
    return SandboxTools(real["bwrap"], real["prlimit"], real.get("setpriv"))


def bwrap_argv(policy: SandboxPolicy, command: Sequence[str], tools: SandboxTools) -> list[str]:
    """The command line (prlimit, bwrap, ...) that runs `command` under `policy`."""
    drop = policy.user is not None and os.geteuid() == 0
    argv = [tools.prlimit, *policy.rlimits.prlimit_args(), "--", tools.bwrap,
            *_namespace_args(policy.user, drop),
            "--die-with-parent", *(["--as-pid-1"] if policy.as_pid_1 else []),
            "--new-session", "--hostname", "sandbox",
            *_system_args(policy.system_paths), "--proc", "/proc", "--dev", "/dev"]
    for tmpfs in policy.tmpfs:
        argv += ["--perms", "1777", "--size", str(tmpfs.size_mib << 20), "--tmpfs", tmpfs.target]
    for directory in policy.dirs:
        argv += ["--dir", directory]
    for held, link in policy.symlinks:
        argv += ["--symlink", held, link]
    argv += _bind_args(policy.binds)
    argv.append("--clearenv")
    if not drop:  # privileged bwrap holds no CAP_DAC_OVERRIDE: the inner one cds
        argv += ["--chdir", policy.cwd]
    for key, value in policy.env:
        argv += ["--setenv", key, value]
    argv += ["--remount-ro", "/", "--"]
    if drop:
        assert policy.user is not None
        argv += _drop_to(policy.user, policy.cwd, tools)
    # The process limit is set only here, by the first process of the sandbox's user
    # namespace, so that the kernel counts it against this sandbox's processes alone.
    inner = [_prlimit_inside(tools.prlimit, policy.system_paths),
             *policy.rlimits.nproc_args(), "--"]
    return [*argv, *inner, *command]


def _prlimit_inside(prlimit: str, system_paths: Sequence[str]) -> str:
    """`prlimit` (a resolved host path) as the sandbox sees it: under a system directory
    that it binds at the same place."""
    for path in system_paths:
        if os.path.isdir(path) and not os.path.islink(path) and (
                prlimit.startswith(path.rstrip("/") + "/")):
            return prlimit
    raise SandboxError(f"prlimit ({prlimit}) is under none of the sandbox's system "
                       f"directories {', '.join(system_paths)}: its process limit could "
                       "not be set inside it")


def _namespace_args(user: tuple[int, int] | None, drop: bool) -> list[str]:
    if drop:
        # bwrap as real root: it can bind a workspace the sandbox uid could not reach;
        # only setuid/setgid/setpcap survive, for setpriv, and the user namespace is the
        # inner bwrap's (_drop_to).
        return ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                "--unshare-cgroup-try", "--cap-drop", "ALL",
                "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
    ids = [] if user is None else ["--uid", str(user[0]), "--gid", str(user[1])]
    return ["--unshare-all", "--unshare-user", *ids, "--disable-userns", "--cap-drop", "ALL"]


def _drop_to(user: tuple[int, int], cwd: str, tools: SandboxTools) -> list[str]:
    """setpriv to `user` with no capability left in any set, then an unprivileged bwrap
    that adds the user namespace (nested ones disabled) and enters `cwd`."""
    if tools.setpriv is None:
        raise SandboxError("setpriv not found: install util-linux (apt-get install util-linux)")
    uid, gid = user
    return [tools.setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
            tools.bwrap, "--unshare-user", "--uid", str(uid), "--gid", str(gid),
            "--disable-userns", "--dev-bind", "/", "/", "--chdir", cwd,
            "--die-with-parent", "--cap-drop", "ALL", "--"]


def _system_args(system_paths: Sequence[str]) -> list[str]:
    argv: list[str] = []
    for path in system_paths:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    return argv


def _bind_args(binds: Sequence[Bind]) -> list[str]:
    """bwrap arguments for binds. Their missing parent directories are made first, 0755:
    privileged bwrap would make them 0700, closed to the sandbox uid."""
    argv: list[str] = []
    made: set[str] = set()
    for bind in binds:
        for parent in reversed(Path(bind.target).parents[:-1]):
            if str(parent) not in made:
                made.add(str(parent))
                argv += ["--perms", "0755", "--dir", str(parent)]
        argv += ["--bind" if bind.writable else "--ro-bind", str(bind.source), bind.target]
    return argv


class BubblewrapSandbox(Sandbox):
    """bubblewrap (Debian's ``bubblewrap`` package) plus util-linux's prlimit and setpriv."""

    name = "bubblewrap"

    def __init__(self, *, uid: int | None = None, gid: int | None = None,
                 system_paths: Sequence[str] = SYSTEM_PATHS) -> None:
        """`uid`/`gid` (root only) override the sandbox user, e.g. a uid of a test's own
        whose processes it can count."""
        self._uid = uid
        self._gid = gid
        self.system_paths = tuple(system_paths)
        self.tools = find_sandbox_tools()

    @property
    def privileged(self) -> bool:
        return os.geteuid() == 0

    def ids(self) -> tuple[int, int]:
        uid, gid = _sandbox_ids()
        if self._uid is not None:
            uid = self._uid
            gid = self._gid if self._gid is not None else self._uid
        return uid, gid

    def policy(self, workspace: Path, limits: Limits, env: Mapping[str, str] | None = None,
               binds: Sequence[Bind] = ()) -> SandboxPolicy:
        """The policy of one run: the workspace writable at ``/workspace`` (its cwd; a
        private tmpfs instead with ``limits.workspace_mib``), the binds after it, private
        /tmp and /dev/shm, the sandbox user, `limits`."""
        return SandboxPolicy(
            cwd=MOUNT_AT,
            rlimits=Rlimits(cpu_s=limits.cpu_s, memory_mib=limits.memory_mib,
                            max_file_mib=limits.max_file_mib, max_procs=limits.max_procs),
            system_paths=self.system_paths,
            tmpfs=(Tmpfs("/tmp", limits.tmp_mib), Tmpfs("/dev/shm", limits.tmp_mib),
                   *([] if limits.workspace_mib is None
                     else [Tmpfs(MOUNT_AT, limits.workspace_mib)])),
            dirs=("/var",), symlinks=(("../tmp", "/var/tmp"),),
            binds=(*([Bind(workspace, MOUNT_AT, writable=True)]
                     if limits.workspace_mib is None else []), *binds),
            env=tuple(_sandbox_env(env).items()),
            user=self.ids(), as_pid_1=True)

    def build_argv(self, command: str, workspace: Path, limits: Limits,
                   env: Mapping[str, str] | None = None, binds: Sequence[Bind] = (),
                   ) -> list[str]:
        """The full command line (prlimit, bwrap, ...) for one run; `workspace` and the
        binds' sources are resolved."""
        return bwrap_argv(self.policy(workspace, limits, env, binds),
                          ["/bin/bash", "-c", command], self.tools)

    def run(self, command: str, workspace: Path, limits: Limits | None = None,
            env: dict[str, str] | None = None, binds: Sequence[Bind] = ()) -> ShellResult:
        limits = limits or Limits()
        argv = self._checked_argv(command, workspace, limits, env, binds)
        return _result(_supervise(argv, limits, kill_sandbox), limits)

    def _checked_argv(self, command: str, workspace: Path, limits: Limits,
                      env: dict[str, str] | None, binds: Sequence[Bind]) -> list[str]:
        """The command line of a run, its command, workspace and binds checked, and the
        workspace given to the sandbox user."""
        _check_command(command, env)
        real = _check_workspace(workspace, self.system_paths)
        checked = _check_binds(binds, self.system_paths)
        if self.privileged:
            _give_tree(real, *self.ids())
        return self.build_argv(command, real, limits, env, checked)

    def start(self, command: str, workspace: Path, limits: Limits | None = None,
              env: dict[str, str] | None = None, binds: Sequence[Bind] = ()
              ) -> subprocess.Popen[bytes]:
        """Start `command` in the sandbox ``run`` would make for it and hand back the
        running sandbox, for a caller that keeps it (a verifier server): stdin, stdout and
        stderr are pipes, it runs in a session of its own (``kill_sandbox`` ends it), and
        the rlimits are its only limits; timeouts and output caps are the caller's. Started
        by ``popen_long_lived``, so it outlives the calling thread."""
        argv = self._checked_argv(command, workspace, limits or Limits(), env, binds)
        return popen_long_lived(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True,
                                close_fds=True, env=dict(_HOST_ENV))


# ---------------------------------------------------------------------------------------
# Docker


class DockerSandbox(Sandbox):
    """The ``docker`` CLI against a running engine; one throw-away container per command."""

    name = "docker"

    def __init__(self, image: str = "python:3.11-slim", *, docker: str = "docker",
                 cpus: float = 1.0) -> None:
        self.image = image
        self.docker = docker
        self.cpus = cpus

    def build_argv(self, command: str, workspace: Path, limits: Limits, container: str,
                   env: Mapping[str, str] | None = None, user: tuple[int, int] | None = None,
                   binds: Sequence[Bind] = ()) -> list[str]:
        argv = [
            self.docker, "run", "--rm", "--name", container,
            "--network", "none",
            "--memory", f"{limits.memory_mib}m", "--memory-swap", f"{limits.memory_mib}m",
            "--pids-limit", str(limits.max_procs),
            "--cpus", str(self.cpus),
            "--read-only",
            "--tmpfs", f"/tmp:rw,nosuid,nodev,size={limits.tmp_mib}m",
            "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges",
            "--init",
            "--ulimit", f"cpu={limits.cpu_s}:{limits.cpu_s + 1}",
            "--ulimit", f"fsize={limits.max_file_mib << 20}",
            "--ulimit", f"nofile={MAX_OPEN_FILES}:{MAX_OPEN_FILES}",
            "--ulimit", "core=0",
        ]
        if user is not None:
            argv += ["--user", f"{user[0]}:{user[1]}"]
        argv += (["-v", f"{workspace}:{MOUNT_AT}:rw"] if limits.workspace_mib is None else
                 ["--tmpfs", f"{MOUNT_AT}:rw,nosuid,nodev,size={limits.workspace_mib}m"])
        argv += ["-w", MOUNT_AT]
        for bind in binds:
            argv += ["-v", f"{bind.source}:{bind.target}:{'rw' if bind.writable else 'ro'}"]
        for key, value in _sandbox_env(env).items():
            argv += ["-e", f"{key}={value}"]
        return [*argv, self.image, "bash", "-c", command]

    def run(self, command: str, workspace: Path, limits: Limits | None = None,
            env: dict[str, str] | None = None, binds: Sequence[Bind] = ()) -> ShellResult:
        limits = limits or Limits()
        _check_command(command, env)
        real = _check_workspace(workspace, ())
        # The image's own /usr etc. are not host paths, so only the sandbox's mounts are taken.
        checked = _check_binds(binds, ())
        user = _sandbox_ids() if os.geteuid() == 0 else None
        if user is not None:
            _give_tree(real, *user)
        container = f"agentworlds-sbx-{uuid.uuid4().hex[:16]}"
        argv = self.build_argv(command, real, limits, container, env, user, checked)

        def kill(proc: subprocess.Popen[bytes]) -> None:
            subprocess.run([self.docker, "kill", container], capture_output=True,
                           check=False, timeout=30)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

        return _result(_supervise(argv, limits, kill, env=os.environ), limits)

    def engine_answers(self) -> bool:
        if shutil.which(self.docker) is None:
            return False
        try:
            done = subprocess.run([self.docker, "info"], capture_output=True, check=False,
                                  timeout=15)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return done.returncode == 0


# ---------------------------------------------------------------------------------------
# Choice


def _bwrap_works() -> tuple[BubblewrapSandbox | None, str]:
    try:
        box = BubblewrapSandbox()
    except SandboxError as exc:
        return None, str(exc)
    probe = Path(tempfile.mkdtemp(prefix="agentworlds-sandbox-probe-"))
    try:
        result = box.run("echo ok", probe, Limits(timeout_s=20))
    except (OSError, SandboxError) as exc:
        return None, f"bubblewrap failed: {exc}"
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    if result.exit_code == 0 and result.stdout.strip() == "ok":
        return box, ""
    return None, f"bubblewrap failed (exit {result.exit_code}): {result.stderr.strip()[:500]}"


@functools.cache
def default_sandbox() -> Sandbox:
    """bubblewrap if it works here, else Docker if an engine answers; probed once."""
    box, why = _bwrap_works()
    if box is not None:
        return box
    docker = DockerSandbox()
    if docker.engine_answers():
        log.warning("bubblewrap is unusable (%s); using Docker", why)
        return docker
    raise SandboxError(
        f"no sandbox for shell commands: {why}; and no Docker engine answers `docker info`. "
        "Install bubblewrap (apt-get install bubblewrap util-linux; unprivileged user "
        "namespaces must be enabled) or run a Docker engine.")


def run_sandboxed(command: str, workspace: Path, limits: Limits | None = None) -> ShellResult:
    """Run `command` with `default_sandbox()`."""
    return default_sandbox().run(command, workspace, limits)


def give_to_sandbox(path: Path) -> None:
    """Make a scratch tree writable by the sandbox user (as root, chown it to that uid;
    otherwise the sandbox runs as the caller, who owns it already). Only for trees this
    process made for one run, never for a user's own files."""
    if os.geteuid() == 0:
        _give_tree(Path(os.path.realpath(path)), *_sandbox_ids())
