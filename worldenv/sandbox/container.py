"""The container backend: the container this process runs in is the sandbox's boundary,
for a Harbor task's environment, where bubblewrap cannot make namespaces (Docker's default
seccomp profile refuses them) and no engine of its own is reachable.

Chosen only by ``WORLDCTL_SANDBOX=container`` (``policy.chosen_backend``), never by
``default_sandbox``'s probe, and it refuses to start outside a container
(``inside_container``). Each command runs as a plain subprocess under the same limits as
elsewhere: the rlimits by ``prlimit`` (CPU, address space, file size, open files, no core;
not the process limit, see ``build_argv``), the wall clock and the output caps by ``supervise``, the
scrubbed environment of ``sandbox_env``; as root, as the unprivileged sandbox user
(``setpriv``: no capability, no new privileges), given the workspace tree first.

What it does not give, since it makes no namespace: no network isolation (the command
has the container's network), no private ``/tmp``, ``/dev/shm``, ``/proc`` or ``/dev``, no
size cap on a scratch workspace (``Limits.workspace_mib``: the workspace is a directory,
its files bounded by the file-size limit only), and binds that are read-only only as far
as the files' permissions make them so. ``/workspace`` and each bind's target are
symbolic links, made as root for one run and removed after it; so runs take turns (a file
lock across processes), and without root a run with binds is refused. As root, every
process of the sandbox user left when a run ends is killed (runs take turns, so they are
all that run's): what a pid namespace's end does under bubblewrap.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from worldenv.errors import SandboxError
from worldenv.sandbox.contract import Bind, Limits, Sandbox, ShellResult
from worldenv.sandbox.policy import (
    BACKEND_SETTING,
    HOST_ENV,
    MAX_OPEN_FILES,
    MOUNT_AT,
    check_binds,
    check_command,
    check_workspace,
    give_tree,
    sandbox_env,
    sandbox_ids,
)
from worldenv.sandbox.supervise import shell_result, supervise

__all__ = ["LOCK_FILE", "ContainerSandbox", "inside_container"]

# Where runs take turns: /run is the container's own (never a volume Harbor mounts).
LOCK_FILE = "/run/agentworlds-container-sandbox.lock"
_KTHREADD = "kthreadd"
_PR_SET_CHILD_SUBREAPER = 36


def inside_container(proc: Path = Path("/proc")) -> bool:
    """Whether this process is in a pid namespace other than the host's, as every
    container's process is. Told by the kernel's threads: they are visible only in the
    initial pid namespace, where pid 2 is always ``kthreadd``; in a container's namespace
    pid 2 is one of its own processes or none. Marker files (``/.dockerenv``) are not
    trusted: a virtual machine may carry one, and containerd's containers do not."""
    try:
        return (proc / "2" / "comm").read_text().strip() != _KTHREADD
    except FileNotFoundError:
        return True
    except OSError:  # a /proc we cannot read says nothing: refuse rather than guess
        return False


class ContainerSandbox(Sandbox):
    """``bash -c command`` as a subprocess of this container, under the sandbox's limits."""

    name = "container"

    def __init__(self, *, lock_file: str = LOCK_FILE) -> None:
        if not inside_container():
            raise SandboxError(
                f"{BACKEND_SETTING}=container is for a container's own processes (a Harbor "
                "task's environment), where the container is the sandbox; this process is "
                "in the host's pid namespace (pid 2 is kthreadd). Unset "
                f"{BACKEND_SETTING} to use bubblewrap or Docker.")
        found = {name: shutil.which(name, path=HOST_ENV["PATH"])
                 for name in ("prlimit", "setpriv")}
        missing = [name for name, path in found.items() if path is None]
        if missing:
            raise SandboxError(f"{', '.join(missing)} not found: the container sandbox "
                               "needs util-linux (apt-get install util-linux)")
        self.prlimit = str(found["prlimit"])
        self.setpriv = str(found["setpriv"])
        self.lock_file = lock_file
        if self.privileged:
            _adopt_orphans()

    @property
    def privileged(self) -> bool:
        return os.geteuid() == 0

    def build_argv(self, command: str, limits: Limits) -> list[str]:
        """prlimit, then (as root) setpriv to the sandbox user, then bash."""
        argv = [self.prlimit, f"--cpu={limits.cpu_s}:{limits.cpu_s + 1}",
                f"--as={limits.memory_mib << 20}", f"--fsize={limits.max_file_mib << 20}",
                f"--nofile={MAX_OPEN_FILES}", "--core=0"]
        # No process limit: with no user namespace of its own, Linux counts RLIMIT_NPROC
        # per uid across the whole machine, so every container's sandbox user (the same
        # uid in each, and maybe the host's own sandboxes') would share one count and
        # starve the others. The container's pids limit, where its runtime sets one, is
        # the bound.
        if self.privileged:
            uid, gid = sandbox_ids()
            argv += ["--", self.setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
                     "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]
        return [*argv, "--", "/bin/bash", "-c", command]

    def run(self, command: str, workspace: Path, limits: Limits | None = None,
            env: dict[str, str] | None = None, binds: Sequence[Bind] = ()) -> ShellResult:
        limits = limits or Limits()
        check_command(command, env)
        real = check_workspace(workspace, ())
        checked = check_binds(binds, ())
        if checked and not self.privileged:
            raise SandboxError(f"{BACKEND_SETTING}=container needs root for binds (it links "
                               "their targets in the container's root directory)")
        with self._turn(), contextlib.ExitStack() as undo:
            cwd = str(real)
            if self.privileged:
                give_tree(real, *sandbox_ids())
                staged = Path(tempfile.mkdtemp(prefix="agentworlds-container-"))
                undo.callback(shutil.rmtree, staged, ignore_errors=True)
                links = [Bind(real, MOUNT_AT, writable=True),
                         *(_staged(bind, staged) for bind in checked)]
                for bind in links:
                    undo.callback(_unlink, _link(bind))
                uid = sandbox_ids()[0]
                undo.callback(_end_user_processes, uid)
                cwd = MOUNT_AT
                kill: Callable[[subprocess.Popen[bytes]], None] = functools.partial(
                    _kill_all, uid)
            else:
                kill = _kill_group
            # HOME is the workspace as elsewhere, by the path the command sees it at.
            full_env = {**sandbox_env(None), "HOME": cwd, "PWD": cwd, **(env or {})}
            out = supervise(self.build_argv(command, limits), limits, kill, env=full_env,
                            cwd=cwd, ended=kill)
        return shell_result(out, limits)

    @contextlib.contextmanager
    def _turn(self) -> Iterator[None]:
        """One run at a time in this container (threads and processes alike): the links
        at fixed paths and the sandbox user's processes are one run's."""
        if not self.privileged:
            yield
            return
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def _staged(bind: Bind, staged: Path) -> Bind:
    """A read-only file is copied where the sandbox user can read it (its own folder may
    be closed to that user, as a caller's private temporary directory is); a folder or a
    writable file is linked as it is, its permissions its only guard."""
    if bind.writable or not bind.source.is_file():
        return bind
    staged.chmod(0o755)
    copy = staged / f"{len(list(staged.iterdir()))}-{bind.source.name}"
    shutil.copyfile(bind.source, copy)
    copy.chmod(0o444)
    return Bind(copy, bind.target)


def _link(bind: Bind) -> Path:
    """Link `bind.target` to its source. A link already there is a run's that did not end
    (runs take turns, so never a live one's); anything else there is refused."""
    for above in bind.source.parents:
        if not os.stat(above).st_mode & stat.S_IXOTH:
            raise SandboxError(f"{bind.source} (for {bind.target}) is under {above}, which "
                               "the sandbox user cannot enter (it links, not binds: make "
                               "the folder o+x)")
    target = Path(bind.target)
    for parent in reversed(target.parents[:-1]):
        if not parent.exists():
            parent.mkdir(mode=0o755)
    if target.is_symlink():
        target.unlink()
    elif target.exists():
        raise SandboxError(f"{target} exists in this container: the container sandbox "
                           "links a workspace or bind there and never replaces a file")
    target.symlink_to(bind.source)
    return target


def _unlink(target: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        target.unlink()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Without root: the run's process group (its session leader's pid), what it left in
    it included; a process that made a session of its own is out of reach."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _kill_all(uid: int, proc: subprocess.Popen[bytes]) -> None:
    """As root: every process of the sandbox user, the run's command and what it left."""
    _kill_group(proc)
    _end_user_processes(uid, spare=proc.pid)


def _end_user_processes(uid: int, spare: int | None = None) -> None:
    """SIGKILL every live process whose real uid is `uid` (the sandbox user's, as root)
    until none is left, and reap those that became this process's children: what a
    command started in a session of its own would otherwise outlive the run with, and a
    zombie would count against the sandbox user's process limit. Read from each process's
    status, not its /proc owner: one that made itself non-dumpable (the verifier's driver)
    shows root as the owner. `spare`: a child whose reaping is its supervisor's."""
    for _ in range(50):
        found = False
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            state = _state(entry)
            if state is None or state[0] != uid:
                continue
            if state[1]:  # a zombie: only its parent can remove it
                if state[2] == os.getpid() and pid != spare:
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, os.WNOHANG)
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                found = True
        if not found:
            return
        time.sleep(0.02)


def _state(entry: Path) -> tuple[int, bool, int] | None:
    """The real uid of the process at `entry`, whether it is a zombie, and its parent's
    pid; None once it is gone."""
    try:
        status = (entry / "status").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    try:
        return (int(fields["Uid"].split()[0]), fields["State"].strip().startswith(("Z", "X")),
                int(fields["PPid"]))
    except (KeyError, ValueError, IndexError):
        return None


def _adopt_orphans() -> None:
    """Make this process the subreaper of its descendants: what a command leaves is
    reparented here, not to the container's pid 1 (which may be ``sleep infinity``, reaping
    nothing), so ``_end_user_processes`` can remove it entirely."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SandboxError(f"prctl(PR_SET_CHILD_SUBREAPER) failed: "
                           f"{os.strerror(ctypes.get_errno())}")
