"""The sandbox contract: a ``Sandbox`` runs ``bash -c command`` in a workspace under
``Limits`` and answers a ``ShellResult``; ``classify_limit`` names the limit that stopped a
process, for the shell and the verifier's scripts alike."""

from __future__ import annotations

import abc
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

__all__ = [
    "LIMIT_REASONS",
    "OUTPUT_KILL_FACTOR",
    "Bind",
    "Limits",
    "Sandbox",
    "ShellResult",
    "classify_limit",
]

OUTPUT_KILL_FACTOR = 4  # one stream past this many times max_output_bytes kills the sandbox


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
