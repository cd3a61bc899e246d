"""What a sandbox shows and allows, whatever its backend: the users sandboxes run as, the
system paths, the environment, the checks of a command, a workspace and its binds, and a
bubblewrap sandbox's declared ``SandboxPolicy`` with its ``Rlimits`` and ``Tmpfs``."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import pwd
import re
import shutil
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from replay.files import walk
from worldenv.errors import SandboxError
from worldenv.sandbox.contract import Bind

__all__ = [
    "BACKENDS",
    "BACKEND_SETTING",
    "BROWSER_USER",
    "HOST_ENV",
    "MAX_COMMAND_BYTES",
    "MAX_OPEN_FILES",
    "MOUNT_AT",
    "SANDBOX_PATH",
    "SANDBOX_USER",
    "SYSTEM_PATHS",
    "Rlimits",
    "SandboxPolicy",
    "Tmpfs",
    "browser_ids",
    "check_binds",
    "check_command",
    "check_workspace",
    "chosen_backend",
    "give_tree",
    "sandbox_env",
    "sandbox_ids",
]

log = logging.getLogger(__name__)

SANDBOX_USER = "agentworlds-sandbox"
BROWSER_USER = "agentworlds-browser"
MOUNT_AT = "/workspace"
SYSTEM_PATHS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
MAX_COMMAND_BYTES = 100_000  # Linux refuses a single argv string over 128 KiB
MAX_OPEN_FILES = 256
HOST_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
# The one setting that names a backend; unset, ``choice.default_sandbox`` probes.
BACKEND_SETTING = "WORLDCTL_SANDBOX"
BACKENDS = ("container",)  # what it may name: only what no probe would ever choose
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Where the sandbox's own mounts live: a bind may sit neither on nor above nor under these.
_RESERVED_TARGETS = ("/proc", "/dev", "/tmp", "/var", MOUNT_AT)


def chosen_backend() -> str | None:
    """The backend ``WORLDCTL_SANDBOX`` names, None when unset or empty; SandboxError for a
    name that is not one of ``BACKENDS``."""
    chosen = os.environ.get(BACKEND_SETTING, "").strip()
    if not chosen:
        return None
    if chosen not in BACKENDS:
        raise SandboxError(f"{BACKEND_SETTING}={chosen!r} names no sandbox backend: "
                           f"{', '.join(BACKENDS)}, or unset for bubblewrap or Docker")
    return chosen


def check_command(command: str, env: Mapping[str, str] | None) -> None:
    if "\0" in command:
        raise SandboxError("the command contains a NUL byte")
    if len(command.encode("utf-8", "surrogateescape")) > MAX_COMMAND_BYTES:
        raise SandboxError(f"the command is longer than {MAX_COMMAND_BYTES} bytes")
    for key, value in (env or {}).items():
        if not _ENV_NAME.match(key) or "\0" in value:
            raise SandboxError(f"bad environment variable {key!r}")


def sandbox_env(env: Mapping[str, str] | None) -> dict[str, str]:
    # TZ: local time is UTC in every sandbox (a verifier's SQLite 'localtime', Python's
    # time.localtime), never the host's /etc/localtime, which the sandbox can read.
    return {"PATH": SANDBOX_PATH, "HOME": MOUNT_AT, "LANG": "C.UTF-8", "TMPDIR": "/tmp",
            "TZ": "UTC", **(env or {})}


def check_workspace(workspace: Path, system_paths: Sequence[str]) -> Path:
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


def check_binds(binds: Sequence[Bind], system_paths: Sequence[str]) -> list[Bind]:
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


def give_tree(top: Path, uid: int, gid: int) -> None:
    """chown the workspace tree to the sandbox uid; never follows a symlink, and walks in
    a loop bounded in depth (``replay.files.walk``), however deep the agent made it."""
    st = os.lstat(top)
    if (st.st_uid, st.st_gid) != (uid, gid):
        os.chown(top, uid, gid, follow_symlinks=False)
    for entry in walk(top):
        if (entry.stat.st_uid, entry.stat.st_gid) != (uid, gid):
            with contextlib.suppress(FileNotFoundError):
                os.chown(entry.path, uid, gid, follow_symlinks=False)


_ids_lock = threading.Lock()


@functools.cache
def _sandbox_ids() -> tuple[int, int]:
    """The uid/gid commands run as: ours unless root; as root the dedicated system user."""
    return _system_user(SANDBOX_USER)


@functools.cache
def browser_ids() -> tuple[int, int]:
    """The uid/gid the instances' browser runs as: ours unless root; as root a system user
    of its own (its files and processes apart from the other roles'; the process limit
    is per sandbox whatever the user, see ``worldenv.sandbox``)."""
    return _system_user(BROWSER_USER)


def _system_user(name: str) -> tuple[int, int]:
    if os.geteuid() != 0:
        return os.getuid(), os.getgid()
    with _ids_lock:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            useradd = shutil.which("useradd", path=HOST_ENV["PATH"])
            if useradd:
                subprocess.run(
                    [useradd, "--system", "--user-group", "--no-create-home",
                     "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name],
                    capture_output=True, check=False, env=HOST_ENV, timeout=60)
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
