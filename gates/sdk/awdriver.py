"""awdriver: the verifier runner's driver, the one Python process of a verifier sandbox.

``gates.verifier`` starts it (``python -I -S -B -c DRIVER CONFIG``: ``import awdriver;
awdriver.drive(config)``); verifier scripts never call it. It imports the SDK (``awsdk``)
and what scripts commonly use once, then forks a process per script; with
``config["serve"]`` it serves job after job for ``gates.verifier_server``. Standard library
only, like the SDK.
"""

from __future__ import annotations

import atexit
import binascii
import builtins
import ctypes
import json
import os
import resource  # noqa: F401  (os.wait4 imports it for its rusage: here, not in a job)
import select
import sys
import time
import types
from collections.abc import Iterable, Mapping, Sequence

# Everything the driver uses is imported here, never later: a module it imported once it
# had read a job could come from where a job put it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn


# --- the driver ---------------------------------------------------------------------------
#
# One verifier run is one sandbox and one Python start: this driver imports what scripts
# commonly use once, then forks a child per script (up to `parallel` at a time), which
# runs the script as __main__ with its stdout and stderr on pipes of its own. The driver
# enforces each script's time and output limits, kills what a script leaves behind, and
# writes one JSON record per finished script on its own stdout, the runner's only channel.
#
# Why a script cannot write a record for another script, although every process here has
# the same uid: a child keeps none of the driver's descriptors (they are closed before the
# script's first line); the driver is not dumpable (PR_SET_DUMPABLE 0, which its children
# inherit), and the kernel refuses a same-uid process without CAP_SYS_PTRACE the /proc
# fd, mem and ptrace of a process that is not dumpable; the children hold no capabilities.
# As root the sandbox's pid 1 (bwrap) holds the runner's pipe too, but it sits in the
# parent user namespace and its /proc/1/fd is refused as well (otherwise the driver is pid
# 1 itself). tests/gates/test_verifier.py tries each way.
#
# What stays open: signals between processes of one uid cannot be refused, so a script can
# kill or stop the driver (the scripts not yet reported then get an error, never a pass)
# or another script (an error for that one). A program a script runs (exec) is dumpable
# again, so while it runs a sibling script can take that script's stdout from it through
# /proc, and a line written there while the script has not yet exited counts as its
# output. Once it exits, the driver takes its output and closes its pipes before reaping
# it, so nothing more can be added. With parallel=1 no two scripts ever run at once, and
# everything a script leaves behind is killed when it ends.

# What scripts commonly import beyond this module's own imports: the SDK (and with it
# sqlite3, which brings datetime), csv. Not typing, nor difflib: they cost every run more
# than the few scripts that use them would save. Imported before the first job is read,
# with the verifier folder on no path of the driver's.
_PRELOAD = ("awsdk", "csv", "datetime")
_PR_SET_DUMPABLE, _PR_SET_CHILD_SUBREAPER = 4, 36
_SIGKILL = 9  # the signal module costs a few ms of enum building to import
_RETRY_S = 0.01  # how soon a fork that found no process to spare is tried again
_GRACE_S = 1.0  # how long a killed script may take to be gone before it is killed again
_RLIMIT_MSGQUEUE, _IPC_RMID = 12, 0
_WRITABLE = ("/tmp", "/dev/shm", "/workspace")  # in a verifier sandbox
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, _PR_SET_NO_NEW_PRIVS = 22, 2, 38
_EPERM = 1
# The keyring calls (add_key, request_key, keyctl) by seccomp's AUDIT_ARCH_* value, for
# each machine's own ABI and the 32-bit one it also runs; on x86_64 an x32 call is the
# same number with bit 30 set, which the filter masks off.
_KEYRING_CALLS = {
    "x86_64": ((0xC000003E, (248, 249, 250)), (0x40000003, (286, 287, 288))),
    "aarch64": ((0xC00000B7, (217, 218, 219)), (0x40000028, (309, 310, 311))),
}
_IOPRIO_GET = {"x86_64": 252, "aarch64": 31}
# What the driver reads of itself after each served job (see _fingerprint).
_STATUS_KEPT = (b"Umask", b"Sig", b"ShdPnd", b"NoNewPrivs", b"Seccomp", b"Cap")
_SOCKET_COUNTS = (b"used", b"inuse", b"tw")  # the sandbox network's own, in sockstat


def drive(config: Mapping[str, Any]) -> None:
    """Run the scripts named in `config` (see ``gates.verifier.driver_argv``); write one
    record per script on stdout, in the order they finish. With ``config["serve"]`` (see
    ``gates.verifier_server``), run job after job read from stdin instead."""
    libc = _set_up(config)
    if config.get("serve"):
        _serve(config, libc)
    else:
        _Driver(config).run()
    os._exit(0)  # every record is written (unbuffered); interpreter teardown is waste


def _set_up(config: Mapping[str, Any]) -> Any:
    """What the driver is before the first script: not dumpable, the subreaper of every
    process its scripts start, no POSIX message queue to make (one would outlive its maker
    in a server's IPC namespace), no kernel keyring to reach (``_deny_keyrings``), the
    common imports done, the start marker written."""
    libc = ctypes.CDLL(None, use_errno=True)
    for option, value in ((_PR_SET_DUMPABLE, 0), (_PR_SET_CHILD_SUBREAPER, 1),
                          (_PR_SET_NO_NEW_PRIVS, 1)):
        if libc.prctl(option, value, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"prctl({option}, {value}) failed")
    limit = (ctypes.c_ulong * 2)(0, 0)
    if libc.setrlimit(_RLIMIT_MSGQUEUE, limit) != 0:
        raise OSError(ctypes.get_errno(), "setrlimit(RLIMIT_MSGQUEUE, 0) failed")
    _deny_keyrings(libc)
    for name in _PRELOAD:
        try:
            __import__(name)
        except Exception:  # a script importing it meets the same error itself
            continue
    os.write(2, (str(config["marker"]) + "\n").encode())
    return libc


# --- serving: one sandbox for job after job (gates.verifier_server) -----------------------
#
# The runner stages each job's worlds, verifier and answer where this sandbox sees them
# (/w0, /w, /verifier, /answer.txt) and writes one JSON line per job on stdin; the driver
# runs the job's scripts exactly as a one-run driver would, then ends every process they
# left, empties every place they could write (/tmp, /dev/shm, /workspace) and removes
# their System V IPC objects, so the next job starts from what a fresh sandbox holds.
# What it cannot undo it checks (_fingerprint): a script can change the driver's rlimits
# and scheduling from outside (prlimit, renice, taskset, chrt, ionice: same uid), and the
# scripts of later jobs would inherit them; a TCP port left in TIME_WAIT outlives its
# process; and a module the driver imported while serving could be a job's. Its last line
# per job says whether all that held; a server that could not clean up, or whose driver a
# job changed, is not given another job. stdin is the driver's alone: a script's stdin is
# /dev/null. Keyrings need no cleanup: no process here can make a key (_deny_keyrings).


def _serve(config: Mapping[str, Any], libc: Any) -> None:
    # The places a script may write, as the sandbox made them.
    modes = {top: os.lstat(top).st_mode & 0o7777 for top in _WRITABLE}
    before = _fingerprint(libc)
    _Driver._emit({"ready": True})
    for job in _jobs():
        _Driver({**job, "verifier": config["verifier"]}).run()
        problems = _scrub(libc, modes) + _changes(libc, before)
        times = os.times()
        _Driver._emit({"done": job["id"], "problems": problems,
                       "cpu_s": round(times.user + times.system, 3)})


def _jobs() -> Iterable[dict[str, Any]]:
    """The job lines on stdin, until it closes."""
    pending = b""
    while True:
        chunk = os.read(0, 65536)
        if not chunk:
            return
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            yield json.loads(line)


def _deny_keyrings(libc: Any) -> None:
    """Make every keyring call of this process and of all it starts fail with EPERM
    (a seccomp filter: inherited by every child, never lifted). Keys outlive their
    makers: a user keyring is one per uid and user namespace, shared by every job of a
    server, and a key made readable to its uid is readable in any sandbox of that uid. A
    machine without a table entry (neither x86_64 nor aarch64) goes without the filter."""
    arches = _KEYRING_CALLS.get(os.uname().machine)
    if arches is None:
        return

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte),
                    ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    program = _keyring_filter(arches)
    filters = (SockFilter * len(program))(*(SockFilter(*insn) for insn in program))
    fprog = SockFprog(len(program), filters)
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


def _keyring_filter(arches: Sequence[tuple[int, Sequence[int]]]
                    ) -> list[tuple[int, int, int, int]]:
    """The classic BPF program (code, jt, jf, k) that denies the keyring calls of
    `arches` and every call of any other ABI, and allows the rest."""
    load, jump_eq, ret, and_k = 0x20, 0x15, 0x06, 0x54  # BPF_LD|W|ABS, JMP|JEQ|K, ...
    allow, deny = 0x7FFF0000, 0x00050000 | _EPERM  # SECCOMP_RET_ALLOW, RET_ERRNO
    count = len(arches)
    deny_at = count + 2 + 6 * count  # after the dispatch, its fall-through and the blocks
    program = [(load, 0, 0, 4)]  # seccomp_data.arch
    program += [(jump_eq, count + 5 * i, 0, arch) for i, (arch, _) in enumerate(arches)]
    program.append((ret, 0, 0, deny))  # an ABI not listed
    for i, (_, calls) in enumerate(arches):
        at = count + 2 + 6 * i
        program += [(load, 0, 0, 0), (and_k, 0, 0, 0xBFFFFFFF)]  # seccomp_data.nr, x32 bit
        program += [(jump_eq, deny_at - (at + 2 + j) - 1, 0, call)
                    for j, call in enumerate(calls)]
        program.append((ret, 0, 0, allow))
    program.append((ret, 0, 0, deny))
    return program


def _fingerprint(libc: Any) -> dict[str, object]:
    """What of the driver a served job's scripts could change from outside, that no
    scrub undoes and later jobs would inherit or meet: its rlimits (prlimit on another
    process of the uid), its scheduling (renice, taskset, chrt, ionice), its signal state,
    mask and capabilities, what it holds (descriptors, modules), and the sockets of the
    sandbox's network (a TCP port in TIME_WAIT outlives its process)."""
    status = _read("/proc/self/status").splitlines()
    return {
        "rlimits": _read("/proc/self/limits"),
        "signals and privileges": [line for line in status if line.startswith(_STATUS_KEPT)],
        "nice value": os.getpriority(os.PRIO_PROCESS, 0),
        "scheduler": (os.sched_getscheduler(0), os.sched_getparam(0).sched_priority),
        "CPU affinity": sorted(os.sched_getaffinity(0)),
        "I/O priority": _io_priority(libc),
        "descriptors": sorted(os.listdir("/proc/self/fd")),
        "modules": sorted(sys.modules),
        "sockets": _sockets(),
    }


def _sockets() -> list[bytes]:
    """The sockets of the sandbox's network: its counts in /proc/net/sockstat and
    sockstat6 (in use, and TCP's TIME_WAIT; their other figures are the host's) and its
    Unix sockets. /proc/net/tcp would list each, but reading it walks the host's whole
    table (~2 ms, a sixth of a served job)."""
    kept = []
    for name in ("sockstat", "sockstat6"):
        for line in _read(f"/proc/net/{name}").splitlines():
            kind, _, figures = line.partition(b":")
            pairs = figures.split()
            kept += [kind + b" " + pairs[i] + b" " + pairs[i + 1]
                     for i in range(0, len(pairs) - 1, 2) if pairs[i] in _SOCKET_COUNTS]
    return [*kept, _read("/proc/net/unix")]


def _changes(libc: Any, before: Mapping[str, object]) -> list[str]:
    """What differs from `before` in the driver's fingerprint now, in words."""
    try:
        now = _fingerprint(libc)
    except OSError as exc:
        return [f"the driver could not read its own state: {exc}"]
    return [f"the driver's {name} changed{_what_changed(was, now[name])}"
            for name, was in before.items() if now[name] != was]


def _what_changed(was: object, now: object) -> str:
    """Which entries came and went, for a list of names (modules, descriptors)."""
    if not isinstance(was, list) or not isinstance(now, list):
        return ""
    came = sorted(set(map(str, now)) - set(map(str, was)))[:5]
    went = sorted(set(map(str, was)) - set(map(str, now)))[:5]
    return f" (new: {', '.join(came) or '-'}; gone: {', '.join(went) or '-'})"


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _io_priority(libc: Any) -> int | None:
    number = _IOPRIO_GET.get(os.uname().machine)
    if number is None:
        return None
    return int(libc.syscall(number, 1, 0))  # IOPRIO_WHO_PROCESS, this process


def _scrub(libc: Any, modes: Mapping[str, int]) -> list[str]:
    """Undo what a job's scripts left: their processes, their files, their IPC objects.
    What could not be undone, in words (empty when all was)."""
    problems = []
    if not _end_every_process():
        problems.append("processes a script started outlived every kill")
    for top, mode in modes.items():
        try:
            _empty(top, mode)
        except OSError as exc:
            problems.append(f"{top} could not be emptied: {exc}")
    problems += _remove_ipc(libc)
    return problems


def _end_every_process() -> bool:
    """SIGKILL every descendant (as subreaper the driver adopts every orphan, so that is
    every process a script started) and reap them; False if some keep appearing."""
    me = os.getpid()
    for _ in range(200):
        found, todo = [], [me]
        while todo:
            kids = _children(todo.pop())
            found += kids
            todo += kids
        _reap_exited()
        if not found:
            return True
        for pid in found:
            _kill(pid, _SIGKILL, group=False)
        time.sleep(0.001)
        _reap_exited()
    return False


def _reap_exited() -> None:
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG)
        except ChildProcessError:
            return
        if info is None or info.si_pid == 0:
            return


def _empty(top: str, mode: int) -> None:
    """Remove everything under `top`, which stays, with its mode `mode` again:
    iteratively (any depth), never following a symlink, opening to the owner what a script
    closed (everything here is the sandbox uid's, or the script could not have made it)."""
    _chmod_if_ours(top, 0o700)
    pending = [top]
    made = []
    while pending:
        here = pending.pop()
        if here != top:
            os.chmod(here, 0o700)
            made.append(here)
        with os.scandir(here) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                else:
                    os.unlink(entry.path)
    for here in reversed(made):
        os.rmdir(here)
    _chmod_if_ours(top, mode)


def _chmod_if_ours(path: str, mode: int) -> None:
    try:
        os.chmod(path, mode)
    except PermissionError:  # not the sandbox uid's: then no script changed it either
        return


def _remove_ipc(libc: Any) -> list[str]:
    """Remove every System V shared memory segment, semaphore set and message queue of
    this IPC namespace (the sandbox's own)."""
    problems = []
    for kind in ("shm", "sem", "msg"):
        try:
            with open(f"/proc/sysvipc/{kind}", "rb") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            ident = int(row.split()[1])
            if kind == "shm":
                status = libc.shmctl(ident, _IPC_RMID, None)
            elif kind == "sem":
                status = libc.semctl(ident, 0, _IPC_RMID)
            else:
                status = libc.msgctl(ident, _IPC_RMID, None)
            if status != 0:
                problems.append(f"System V {kind} {ident} could not be removed")
    return problems


class _Child:
    """One script's process as the driver sees it."""

    __slots__ = ("cpu_s", "deadline", "exited", "flooded", "kept", "name", "pid", "pipes",
                 "seen", "started", "status", "timed_out")

    def __init__(self, name: str, pid: int, pipes: dict[int, int], started: float,
                 timeout_s: float) -> None:
        self.name = name
        self.pid = pid
        self.pipes = pipes  # read end -> 0 (stdout) or 1 (stderr), until its EOF
        self.started = started
        self.deadline = started + timeout_s
        self.kept = (bytearray(), bytearray())
        self.seen = [0, 0]
        self.exited = False
        self.status: int | None = None  # shell-style: 128 + N when killed by signal N
        self.cpu_s = 0.0
        self.timed_out = False
        self.flooded = False


class _Driver:
    def __init__(self, config: Mapping[str, Any]) -> None:
        self.folder = str(config["verifier"])
        self.pending = [str(name) for name in config["scripts"]]
        self.timeout_s = float(config["timeout_s"])
        self.cap = int(config["cap"])
        self.kill_at = int(config["kill_at"])
        self.parallel = int(config["parallel"])
        self.me = os.getpid()
        self.running: dict[int, _Child] = {}
        self.by_fd: dict[int, _Child] = {}
        self.pidfds: dict[int, int] = {}  # pidfd -> pid
        self.blocked_since: float | None = None
        self.retry_at: float | None = None
        self.poller = select.poll()

    def run(self) -> None:
        try:
            while self.pending or self.running:
                self._start_what_fits()
                self._wait()
                self._reap()
                self._enforce_deadlines()
                for child in [c for c in self.running.values() if c.exited]:
                    del self.running[child.pid]
                    self._emit(self._record(child))
        finally:
            for pidfd in self.pidfds:  # a child reaped before its pidfd was polled
                os.close(pidfd)
            self.pidfds.clear()

    # starting

    def _start_what_fits(self) -> None:
        now = time.monotonic()
        if self.retry_at is not None and now < self.retry_at:
            return
        self.retry_at = None
        while self.pending and len(self.running) < self.parallel:
            name = self.pending[0]
            try:
                child = self._spawn(name)
            except OSError as exc:  # no process or descriptor to spare right now
                self._kill_strays()
                self._reap()
                if not self.running:
                    # Nothing of this run holds them any more: a stray, or a sandbox of
                    # the same uid elsewhere. Wait for them, but only so long.
                    self.blocked_since = self.blocked_since or now
                    if now - self.blocked_since >= self.timeout_s:
                        self.pending.pop(0)
                        self.blocked_since = None
                        self._emit({"script": name, "start_error": f"{exc} (retried for "
                                    f"{self.timeout_s:g} s)"})
                        continue
                self.retry_at = now + _RETRY_S
                return
            self.blocked_since = None
            self.pending.pop(0)
            self.running[child.pid] = child

    def _spawn(self, name: str) -> _Child:
        out_r, out_w = os.pipe()
        try:
            err_r, err_w = os.pipe()
        except OSError:
            os.close(out_r)
            os.close(out_w)
            raise
        try:
            pid = os.fork()
        except OSError:
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            raise
        if pid == 0:
            _run_child(self.folder, name, out_w, err_w)
        started = time.monotonic()
        os.close(out_w)
        os.close(err_w)
        _own_group(pid)  # the child does it too: whichever runs first, it precedes a kill
        child = _Child(name, pid, {out_r: 0, err_r: 1}, started, self.timeout_s)
        for fd in (out_r, err_r):
            os.set_blocking(fd, False)
            self.poller.register(fd, 0x001 | 0x010)  # POLLIN | POLLHUP
            self.by_fd[fd] = child
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            pass  # no pidfd: the wait below polls instead
        else:
            self.poller.register(pidfd, 0x001)
            self.pidfds[pidfd] = pid
        return child

    # waiting

    def _wait(self) -> None:
        now = time.monotonic()
        wake = [c.deadline for c in self.running.values()]
        if self.retry_at is not None:
            wake.append(self.retry_at)
        if len(self.pidfds) < sum(not c.exited for c in self.running.values()):
            wake.append(now + 0.02)
        timeout_ms = max(0, int((min(wake) - now) * 1000) + 1) if wake else None
        for fd, _ in self.poller.poll(timeout_ms):
            if fd in self.pidfds:
                self.poller.unregister(fd)
                os.close(fd)
                del self.pidfds[fd]
            elif fd in self.by_fd:
                self._read(fd)

    def _read(self, fd: int) -> bool:
        """Take what the pipe holds now; False once nothing more is there to take."""
        child = self.by_fd[fd]
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return False
        if not chunk:
            self._close(fd)
            return False
        which = child.pipes[fd]
        child.seen[which] += len(chunk)
        room = self.cap - len(child.kept[which])
        if room > 0:
            child.kept[which].extend(chunk[:room])
        if child.seen[which] > self.kill_at and not (child.flooded or child.timed_out):
            child.flooded = True
            if not child.exited:
                self._stop(child)
        return True

    def _close(self, fd: int) -> None:
        self.poller.unregister(fd)
        os.close(fd)
        del self.by_fd[fd].pipes[fd]
        del self.by_fd[fd]

    def _reap(self) -> None:
        """Reap every exited child: the scripts and the orphans this subreaper adopted."""
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid == 0:
                return
            child = self.running.get(info.si_pid)
            if child is not None:
                # Still a zombie, so its pid cannot have been reused as a group's id; its
                # output is taken before it is reaped, so that nobody waiting for it to
                # vanish can add to it.
                child.exited = True
                _kill(info.si_pid, _SIGKILL, group=True)
                self._kill_strays()
                self._finish_output(child)
            _, status, usage = os.wait4(info.si_pid, 0)
            if child is not None:
                code = os.waitstatus_to_exitcode(status)
                child.status = 128 - code if code < 0 else code
                child.cpu_s = usage.ru_utime + usage.ru_stime

    def _finish_output(self, child: _Child) -> None:
        """A script's output ends when it does: everything it wrote is in its pipes by now,
        and what it left behind is being killed. The pipes are closed without waiting for
        their end, so whoever else holds one (another script that reached a program this
        one ran) can add nothing after its last line."""
        for fd in list(child.pipes):
            # A pipe holds 64 KiB, 1 MiB if resized: this many reads empty it, and a writer
            # that keeps it filling cannot hold the driver here.
            for _ in range(64):
                if not self._read(fd):
                    break
            if fd in child.pipes:
                self._close(fd)

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        for child in self.running.values():
            if now >= child.deadline and not child.exited:
                child.deadline = now + _GRACE_S  # killed at once; killed again if still there
                child.timed_out = child.timed_out or not child.flooded
                self._stop(child)

    def _stop(self, child: _Child) -> None:
        _kill(child.pid, _SIGKILL, group=True)
        _kill(child.pid, _SIGKILL, group=False)  # in case it left its group
        self._kill_strays()

    def _kill_strays(self) -> None:
        """SIGKILL every descendant of the driver that no running script owns (by descent
        or process group): what a finished script left behind, including processes that
        left its group. As a subreaper the driver adopts such orphans, so they stay its
        descendants; nothing else is ever touched."""
        live = {pid for pid, child in self.running.items() if not child.exited}
        todo = [(self.me, False)]
        while todo:
            parent, owned = todo.pop()
            for pid in _children(parent):
                mine = owned or pid in live
                if not mine and _group(pid) not in live:
                    _kill(pid, _SIGKILL, group=False)
                todo.append((pid, mine))

    # reporting

    def _record(self, child: _Child) -> dict[str, Any]:
        killed = child.timed_out or child.flooded
        return {
            "script": child.name,
            "exit": None if killed else child.status,
            "timed_out": child.timed_out,
            "flooded": child.flooded,
            "cpu_s": round(child.cpu_s, 3),
            "seconds": round(time.monotonic() - child.started, 4),
            "stdout": binascii.b2a_base64(bytes(child.kept[0]), newline=False).decode(),
            "stdout_cut": child.seen[0] > self.cap,
            "stderr": binascii.b2a_base64(bytes(child.kept[1]), newline=False).decode(),
            "stderr_cut": child.seen[1] > self.cap,
        }

    @staticmethod
    def _emit(record: Mapping[str, Any]) -> None:
        data = memoryview((json.dumps(record) + "\n").encode())
        while data:
            data = data[os.write(1, data):]


def _own_group(pid: int) -> None:
    try:
        os.setpgid(pid, pid)
    except OSError:
        return  # it exited already, or ran exec (a script may), having done it itself


def _kill(pid: int, sig: int, *, group: bool) -> None:
    try:
        (os.killpg if group else os.kill)(pid, sig)
    except (ProcessLookupError, PermissionError):
        return  # gone already


def _children(pid: int) -> list[int]:
    """The children of `pid`, whichever of its threads forked them."""
    found: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found  # it ended meanwhile
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                found += [int(kid) for kid in f.read().split()]
        except OSError:
            continue
    return found


def _group(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None  # it ended meanwhile
    # pid (name) state ppid pgrp ...: the name may hold spaces and parentheses
    return int(stat[stat.rindex(b")") + 2:].split()[2])


def _run_child(folder: str, name: str, out_w: int, err_w: int) -> NoReturn:
    """In the forked child: take the script's own pipes, drop every other descriptor of the
    driver, put the verifier folder last on the module path (after the standard library
    and the SDK, so that none of its files stands in for one of theirs), run the script
    as ``python folder/name`` would, exit with its status. Never returns into the driver's
    code, whatever happens."""
    status = 1
    try:
        os.setpgid(0, 0)
        os.dup2(os.open("/dev/null", os.O_RDONLY), 0)  # a server's stdin carries its jobs
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.closerange(3, max(os.sysconf("SC_OPEN_MAX"), 1024))
        sys.path.append(folder)
        status = _run_main(f"{folder}/{name}")
    finally:
        os._exit(status)


def _run_main(path: str) -> int:
    atexit._clear()  # callbacks the driver's imports registered are not the script's
    sys.argv = [path]
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __builtins__=builtins, __cached__=None)
    sys.modules["__main__"] = main  # dataclasses, pickle and friends look it up by name
    try:
        with open(path, "rb") as f:
            code = compile(f.read(), path, "exec")
    except Exception as exc:  # as `python path` reports a file it cannot open or compile
        _print_uncaught(exc.with_traceback(None))
        return _wind_down(1)
    try:
        exec(code, main.__dict__)
    except SystemExit as exc:
        return _wind_down(_exit_status(exc))
    except BaseException as exc:
        tb = exc.__traceback__  # its first frame is this function's: not the script's
        _print_uncaught(exc.with_traceback(tb.tb_next if tb is not None else None))
        return _wind_down(1)
    return _wind_down(0)


def _print_uncaught(exc: BaseException) -> None:
    sys.excepthook(type(exc), exc, exc.__traceback__)


def _exit_status(exc: SystemExit) -> int:
    """The status Python's own exit gives a SystemExit: None 0, an int its low byte,
    anything else printed to stderr and 1."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    sys.stderr.write(f"{exc.code}\n")
    return 1


def _wind_down(status: int) -> int:
    """What interpreter exit does: wait for the threads that are not daemons, run the
    atexit callbacks, flush stdout and stderr."""
    threading = sys.modules.get("threading")
    shutdown = getattr(threading, "_shutdown", None)  # private: typeshed does not list it
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and not stream.closed:
                stream.flush()
        except Exception:
            if stream is sys.stdout:
                status = 120  # what Python exits with when it cannot flush stdout
    return status
