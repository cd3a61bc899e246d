"""The bubblewrap backend: ``bwrap_argv`` turns every ``SandboxPolicy`` of the project into
its command line (and holds what no policy can loosen), ``BubblewrapSandbox`` runs a shell
command with it, ``kill_sandbox`` ends one, ``popen_long_lived`` starts one that outlives
the calling thread."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worldenv.errors import SandboxError
from worldenv.sandbox.contract import Bind, Limits, Sandbox, ShellResult
from worldenv.sandbox.policy import (
    BACKEND_SETTING,
    HOST_ENV,
    MOUNT_AT,
    SYSTEM_PATHS,
    Rlimits,
    SandboxPolicy,
    Tmpfs,
    check_binds,
    check_command,
    check_workspace,
    chosen_backend,
    give_tree,
    sandbox_env,
    sandbox_ids,
)
from worldenv.sandbox.supervise import shell_result, supervise

__all__ = [
    "BubblewrapSandbox",
    "SandboxTools",
    "bwrap_argv",
    "find_sandbox_tools",
    "kill_sandbox",
    "popen_long_lived",
]


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
class SandboxTools:
    """The host programs a sandbox is made with (resolved absolute paths)."""

    bwrap: str
    prlimit: str
    setpriv: str | None = None  # needed only to drop from root to a policy's user


def find_sandbox_tools(*, setpriv: bool = True) -> SandboxTools:
    """bwrap and prlimit (and setpriv unless not wanted) on the host's system PATH;
    refused under ``WORLDCTL_SANDBOX=container``, where no namespace can be made (the app
    workers and the browser, which need bubblewrap itself, stop here with that reason;
    the verifier's servers are bubblewrap's only and are not started)."""
    if chosen_backend() == "container":
        raise SandboxError(f"{BACKEND_SETTING}=container: this container is the sandbox and "
                           "bubblewrap cannot make namespaces in it, but carried-app "
                           "workers and the browser (a task's GUI) need bubblewrap")
    names = ("bwrap", "prlimit", "setpriv") if setpriv else ("bwrap", "prlimit")
    found = {name: shutil.which(name, path=HOST_ENV["PATH"]) for name in names}
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
        uid, gid = sandbox_ids()
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
            env=tuple(sandbox_env(env).items()),
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
        return shell_result(supervise(argv, limits, kill_sandbox), limits)

    def _checked_argv(self, command: str, workspace: Path, limits: Limits,
                      env: dict[str, str] | None, binds: Sequence[Bind]) -> list[str]:
        """The command line of a run, its command, workspace and binds checked, and the
        workspace given to the sandbox user."""
        check_command(command, env)
        real = check_workspace(workspace, self.system_paths)
        checked = check_binds(binds, self.system_paths)
        if self.privileged:
            give_tree(real, *self.ids())
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
                                close_fds=True, env=dict(HOST_ENV))
