"""Sandboxed workers for app code carried in a world's log.

Carried code is untrusted: it never runs in this process. ``AppWorker`` runs
``python -m worldenv.sandbox.app_worker`` (one loaded app) under bubblewrap and sends it one
request at a
time. ``AppWorkers`` is the set of such processes serving one (service, code digest,
instances directory): every instance of worlds carrying the same code shares it, and each
call goes to a worker no other call is using, so one instance's runaway call costs only that
instance: its worker is killed at the timeout while the other instances' calls run in other
workers (a call that finds every worker busy starts one more, up to ``max_workers``; workers
idle for ``idle_s`` are stopped, all but one). ``WorkerPool`` holds them per app.

What the worker sees: a new root with the system's ``/usr`` and ``/lib*``, the Python
installation at ``/opt/python``, the virtual environment's site-packages at ``/opt/site``
and the project's packages under ``/opt/src`` (all read-only), and a private ``/tmp``
(tmpfs); the kernel's entropy and clock files (``MASKED``: ``/dev/urandom``,
``/proc/sys/kernel/random/uuid``, ``/proc/uptime``...) cannot be opened, and every worker
has the same str hash seed, so what the app code writes cannot come from them. It runs as
the sandbox's unprivileged user (``worldenv.sandbox.policy.sandbox_ids``: as root, the dedicated
system user), so no file of the host is writable there, and no instance
directory, snapshot or store is there at all. A call's database reaches it as a file
descriptor: on the first call of an instance in that worker (after ``forget``, or after
another instance's call), this process opens the instance's database itself, read-write, or
the snapshot's read-only while a lazy instance has no copy, and sends the descriptor over a
Unix socket (SCM_RIGHTS) with the request; the worker then drops the one it held (see
``worldenv.sandbox.app_worker``). So while a call runs, the worker process holds no database but
that
instance's, and a database is held by at most one worker at a time.

A snapshot's database is never handed as a descriptor of the cache's file: on a host that
does not run as root the worker's uid owns that file, and could re-mode it through the
descriptor (``fchmod``) and reopen it for writing (``/proc/self/fd/N``), changing the
snapshot every instance and ``verify`` read. The worker gets a read-only open of a sealed
copy instead (``_SealedCopies``: a memfd sealed against writes, growth, shrinking and new
seals), which nobody can change, whoever owns it and however it is reopened or mapped. The
copy is made once per snapshot file and kept while the copies fit in
``SEALED_COPIES_MAX_BYTES`` (least recently handed dropped first); a handover of a kept
copy costs a ``dup``.

Requests and replies travel on a stream socket made for that one request and handed over
with it; a reply must be one frame carrying the request's id, then the end of the stream
(``worldenv.sandbox.app_worker`` describes the protocol). Anything else (a reply with another id, a
second reply, bytes after it, a request channel left open) is a protocol violation: the
call gets an error result and its worker is stopped. The worker's stdin is ``/dev/null``
and its stdout and stderr go to a log file here, whose tail explains a crash.

No network (only a private loopback), new pid/ipc/uts/cgroup/user namespaces, no nested
user namespaces, every capability dropped, no new privileges, and ``prlimit`` bounds on
address space, CPU seconds, file size and open files, and on the processes and threads of
the worker's sandbox (``max_procs``, counted for that sandbox alone: ``worldenv.sandbox``), so a
call that hoards them or forks a bomb starves no other worker, shell, verifier or browser.
A call that outlives ``timeout_s``
(or a worker that dies) gets an error result; the worker is killed and another serves the
next call. A worker whose call left a thread, a process or a timer running is replaced too.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import fcntl
import itertools
import logging
import os
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from worldenv.core.app import ToolSpec
from worldenv.core.contract import CallClock, CallContext, Effect, ToolInfo, ToolResult
from worldenv.core.dispatch import tool_failure
from worldenv.errors import AppLoadError, SandboxError, WorkerError
from worldenv.sandbox.app_worker import CALL_MESSAGE, FRAME_HEADER, MAX_FRAME, frame
from worldenv.sandbox.bubblewrap import (
    bwrap_argv,
    find_sandbox_tools,
    kill_sandbox,
    popen_long_lived,
)
from worldenv.sandbox.contract import Bind
from worldenv.sandbox.policy import Rlimits, SandboxPolicy, Tmpfs, sandbox_ids
from worldstore.canonical import digest

PYTHON_AT = "/opt/python"
SITE_AT = "/opt/site"
SRC_AT = "/opt/src"
PACKAGES = ("worldenv", "replay", "worldstore")
SYSTEM_PATHS = ("/usr", "/bin", "/lib", "/lib32", "/lib64", "/libx32")
# Kernel files a worker reads no world from: fresh entropy or the machine's clock on every
# read. /dev/null bound read-only (nodev) over each: opening one fails, for every reader.
MASKED = ("/proc/sys/kernel/random/uuid", "/proc/sys/kernel/random/boot_id",
          "/proc/uptime", "/proc/loadavg", "/dev/urandom", "/dev/random")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerLimits:
    timeout_s: float = 10.0  # wall clock per request
    start_timeout_s: float = 60.0  # the first request (load) also starts Python
    cpu_s: int = 600  # CPU seconds for the worker's whole life (it restarts when hit)
    memory_mib: int = 2048  # address space
    max_file_mib: int = 256
    # Processes and threads of one worker's sandbox (its own count: worldenv.sandbox), so a
    # call that hoards them or forks a bomb starves neither other workers nor other roles.
    max_procs: int = 64
    max_workers: int = 16  # processes per app: calls at once beyond this wait for one
    idle_s: float = 300.0  # a worker idle this long is stopped (but an app's last one)
    # Processes kept started ahead of need, their imports done and no code loaded yet: a
    # worker then starts in the time its code takes to load (see ``_Spares``).
    spares: int = 0


def _python_paths() -> tuple[str, str, list[str]]:
    """The interpreter's prefix, the venv's site-packages and the package directories."""
    prefix = os.path.realpath(sys.base_prefix)
    site = os.path.realpath(sysconfig.get_paths()["purelib"])
    import worldenv

    root = Path(worldenv.__file__).resolve().parent.parent
    packages = [str(root / name) for name in PACKAGES if (root / name / "__init__.py").exists()]
    return prefix, site, packages


class AppWorker:
    """One sandboxed ``worldenv.sandbox.app_worker`` process serving one carried app to the
    instances under
    `root` (it is handed databases there only), one request at a time."""

    def __init__(self, service: str, code: str, root: Path,
                 limits: WorkerLimits | None = None) -> None:
        self.service = service
        self.code = code
        self.root = Path(os.path.realpath(root))
        self.limits = limits or WorkerLimits()
        self.loaded: dict[str, Any] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None  # the worker's stdout and stderr
        self._control: socket.socket | None = None  # our end of the control socket
        self._held: tuple[str, str] | None = None  # (database, file handed) the worker holds
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        try:  # as root, setpriv drops the sandbox to its unprivileged user
            self._tools = find_sandbox_tools(setpriv=os.geteuid() == 0)
        except SandboxError as exc:
            raise SandboxError(f"running carried app code needs a sandbox: {exc}") from None

    @property
    def pid(self) -> int | None:
        """The host pid of the sandbox (bwrap), while running."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def holds(self) -> str | None:
        """The database (an instance's path) the worker holds, if any."""
        return self._held[0] if self._held is not None else None

    def policy(self) -> SandboxPolicy:
        """The worker's sandbox: the system without /etc, the interpreter, site-packages
        and the project's packages read-only, a private /tmp as its cwd and nothing else.
        Its user is the sandbox's unprivileged one (it gets every database as a descriptor,
        so it needs no file permission), and bwrap's init stays its pid 1 to reap what a
        call orphans."""
        prefix, site, packages = _python_paths()
        lim = self.limits
        return SandboxPolicy(
            cwd="/tmp",
            rlimits=Rlimits(cpu_s=lim.cpu_s, memory_mib=lim.memory_mib,
                            max_file_mib=lim.max_file_mib, max_procs=lim.max_procs),
            system_paths=SYSTEM_PATHS,
            tmpfs=(Tmpfs("/tmp", 64),),
            binds=(Bind(Path(prefix), PYTHON_AT), Bind(Path(site), SITE_AT),
                   *(Bind(Path(package), f"{SRC_AT}/{Path(package).name}")
                     for package in packages),
                   *(Bind(Path("/dev/null"), masked) for masked in MASKED)),
            # One str hash seed for every worker: hash() and set order of strings are the
            # same in every process (worldenv.awm.adapter freezes the rest).
            env=(("PATH", f"{PYTHON_AT}/bin:/usr/bin:/bin"), ("PYTHONHOME", PYTHON_AT),
                 ("PYTHONHASHSEED", "0"),
                 ("PYTHONPATH", f"{SRC_AT}:{SITE_AT}"), ("LD_LIBRARY_PATH", f"{PYTHON_AT}/lib"),
                 ("PYTHONDONTWRITEBYTECODE", "1"), ("HOME", "/tmp"), ("LANG", "C.UTF-8"),
                 ("TZ", "UTC")),
            user=sandbox_ids())

    def argv(self, control_fd: int) -> list[str]:
        """The command line; `control_fd` is the worker's end of the control socket."""
        python = f"{PYTHON_AT}/bin/python{sys.version_info[0]}.{sys.version_info[1]}"
        return bwrap_argv(self.policy(), [python, "-s", "-m", "worldenv.sandbox.app_worker",
                                          str(control_fd)], self._tools)

    # --- requests ---------------------------------------------------------------------

    def load(self) -> dict[str, Any]:
        """Start the worker and load the code (once); the load reply describes the tools."""
        with self._lock:
            if self.loaded is None or self._proc is None:
                self._ensure_started()
            assert self.loaded is not None
            return self.loaded

    def call(self, tool: str, arguments: dict[str, Any], *, db: Path, clock: CallClock,
             source: Path | None = None, read_first: bool = False) -> dict[str, Any]:
        """Run one tool call against the instance database `db` at the instance's `clock`;
        a timeout, a crash or a protocol violation is an error reply (and a restart later).
        `source` is the file to read instead while a lazy instance has no copy of `db` (its
        snapshot's database, handed read-only). With `read_first` (only on such a source)
        a call that tries to write is stopped and answered ``needs_write``."""
        source = source or db
        # A snapshot's database is the same read-only file for every instance of it: the
        # worker keeps it open from one instance to the next (its schema parsed, its pages
        # cached). An instance's own copy is held for that instance alone.
        held = (str(db), str(source)) if source == db else ("", str(source))
        with self._lock:
            try:
                self._ensure_started()
            except (WorkerError, AppLoadError) as exc:
                self._stop()
                return {"ok": False, "error": str(exc)}
            try:
                fd = None if self._held == held else self._open_handed(db, source)
            except OSError as exc:
                return {"ok": False, "error": f"{source}: cannot hand the database to the "
                                              f"app worker: {exc}"}
            request = {"op": "call", "tool": tool, "arguments": arguments,
                       "handover": None if fd is None else {"writable": source == db},
                       "clock": clock.to_wire(), "read_first": read_first and source != db}
            self._held = None  # until the reply says otherwise
            try:
                reply = self._request(request, self.limits.timeout_s, fd)
            except WorkerError as exc:
                self._stop()
                return {"ok": False, "error": str(exc)}
            self._held = held if reply.get("ok") else None  # a failed call holds nothing
            if reply.get("retire"):
                log.warning("carried app %r: %s; its worker is replaced", self.service,
                            reply["retire"])
                self._stop()
            return reply

    def forget(self, db: Path) -> None:
        """Make the worker drop `db` if it holds it (before the instance's files are read,
        replaced or deleted here)."""
        with self._lock:
            if self._held is None or self._held[0] != str(db):
                return
            self._held = None
            if self._proc is None:
                return
            try:
                reply = self._request({"op": "forget"}, self.limits.timeout_s)
            except WorkerError:
                reply = {}
            if not reply.get("ok"):
                self._stop()  # it may still hold the database: it must not outlive this

    def _open_handed(self, db: Path, source: Path) -> int:
        """A descriptor of `source` to hand over: `db` itself read-write, or a sealed copy
        of a snapshot's database read-only (never the cache's file). Refuses a database
        outside this worker's instances directory, a symlink and anything but a regular
        file."""
        if not Path(os.path.realpath(db)).is_relative_to(self.root):
            raise OSError(f"not under the worker's instances directory {self.root}")
        if source != db:
            return _SEALED.open(source)
        fd = os.open(source, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError("not a regular file")
        return fd

    def close(self) -> None:
        with self._lock:
            self._stop()

    # --- process ----------------------------------------------------------------------

    def _ensure_started(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        self._stop()
        started = _SPARES.take(self.limits) if self.limits.spares else None
        if started is None:
            started = _spawn(self.argv)
        if self.limits.spares:
            _SPARES.refill(self.limits, self.argv)
        self._proc, self._control, self._log = started
        reply = self._request({"op": "load", "service": self.service, "code": self.code},
                              self.limits.start_timeout_s)
        if not reply.get("ok"):
            self._stop()
            raise AppLoadError(str(reply.get("error")))
        reply.pop("id", None)
        if self.loaded is not None and reply != self.loaded:
            self._stop()
            raise AppLoadError("the code describes other tools each time it is loaded")
        self.loaded = reply

    def _request(self, request: dict[str, Any], timeout: float,
                 fd: int | None = None) -> dict[str, Any]:
        """Send one request, with the database `fd` if given (closed here), on a channel of
        its own, and read its one reply there."""
        call_id = next(self._ids)
        deadline = time.monotonic() + timeout
        try:
            channel = self._open_channel(fd)
        finally:
            if fd is not None:
                os.close(fd)
        with channel:
            try:
                channel.settimeout(timeout)
                channel.sendall(frame(msgspec.json.encode({**request, "id": call_id})))
                channel.shutdown(socket.SHUT_WR)
                data = self._read_reply(channel, deadline, timeout)
            except TimeoutError:
                raise WorkerError(f"the app call took longer than {timeout:g} s; "
                                  "the app worker was stopped") from None
            except OSError as exc:
                raise WorkerError(f"the app worker died{self._why()}") from exc
        try:
            reply = msgspec.json.decode(data)
        except msgspec.DecodeError as exc:
            raise WorkerError(f"the app worker sent a bad reply: {data[:200]!r}") from exc
        if not isinstance(reply, dict) or reply.get("id") != call_id:
            got = reply.get("id") if isinstance(reply, dict) else None
            raise WorkerError(f"the app worker answered request {call_id} with a reply for "
                              f"{got!r}; it was stopped")
        return reply

    def _open_channel(self, fd: int | None) -> socket.socket:
        """A new stream socket for one request, its other end sent to the worker (with the
        database `fd`, if any) on the control socket."""
        if self._proc is None or self._control is None:
            raise WorkerError("the app worker is not running")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            socket.send_fds(self._control, [CALL_MESSAGE],
                            [theirs.fileno(), *([] if fd is None else [fd])])
        except OSError as exc:
            ours.close()
            raise WorkerError(f"the app worker died{self._why()}") from exc
        finally:
            theirs.close()
        return ours

    def _read_reply(self, channel: socket.socket, deadline: float, timeout: float) -> bytes:
        """The one frame of a reply, then the end of the stream: a second frame, stray
        bytes or a channel left open are protocol violations."""
        buffer = bytearray()
        size: int | None = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            channel.settimeout(left)
            chunk = channel.recv(1 << 20)
            if not chunk:
                break
            buffer += chunk
            if size is None and len(buffer) >= FRAME_HEADER.size:
                (size,) = FRAME_HEADER.unpack_from(buffer)
                if size > MAX_FRAME:
                    raise WorkerError(f"the app worker sent a reply of {size} bytes; "
                                      "it was stopped")
            if size is not None and len(buffer) > FRAME_HEADER.size + size:
                raise WorkerError("the app worker sent more than one reply to one request; "
                                  "it was stopped")
        if size is None or len(buffer) != FRAME_HEADER.size + size:
            if self._proc is not None and self._proc.poll() is not None:
                raise WorkerError(f"the app worker died (exit {self._proc.returncode})"
                                  f"{self._why()}")
            if self._proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(timeout=0.5)
                if self._proc.poll() is not None:
                    raise WorkerError(f"the app worker died (exit {self._proc.returncode})"
                                      f"{self._why()}")
            raise WorkerError("the app worker closed the request's channel without a "
                              "whole reply; it was stopped")
        return bytes(buffer[FRAME_HEADER.size:])

    def _why(self) -> str:
        if self._log is None:
            return ""
        with contextlib.suppress(OSError):
            self._log.seek(0, os.SEEK_END)
            size = self._log.tell()
            self._log.seek(max(0, size - 2000))
            tail = self._log.read().decode("utf-8", "replace").strip()
            return f": {tail}" if tail else ""
        return ""

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        self._held = None  # a new process holds no database
        if self._control is not None:
            self._control.close()
            self._control = None
        if proc is not None:
            if proc.poll() is None:
                kill_sandbox(proc)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        if self._log is not None:
            self._log.close()
            self._log = None


_Started = tuple[subprocess.Popen[bytes], socket.socket, Any]  # process, control, log

SEALED_COPIES_MAX_BYTES = 512 << 20
_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE


class _SealedCopies:
    """Sealed in-memory copies of the read-only databases handed to workers, one per file
    (by device, inode, size, mtime and ctime), kept while they fit in `max_bytes`: the
    least recently handed is closed first (a worker holding it keeps its own open). A
    copy bigger than `max_bytes` is made for each handover and not kept.

    What is kept is a read-only open file of the copy, and a handover is a ``dup`` of it:
    never a new open by path, which a worker that re-moded the copy (its uid may own it)
    could make fail for every later worker. The open file is shared, but a reader of it
    uses ``pread`` (the offset is never read) and nobody can write through it."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._copies: OrderedDict[tuple[int, ...], tuple[int, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def open(self, path: Path) -> int:
        """A new read-only descriptor of the sealed copy of the regular file `path`
        (never followed if a symlink)."""
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError("not a regular file")
            key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            with self._lock:
                kept = self._copies.get(key)
                if kept is not None:
                    self._copies.move_to_end(key)
                    return os.dup(kept[0])
            sealed = _sealed_copy(fd, st.st_size)
        finally:
            os.close(fd)
        try:
            return os.dup(sealed)
        finally:
            self._keep(key, sealed, st.st_size)

    def _keep(self, key: tuple[int, ...], sealed: int, size: int) -> None:
        with self._lock:
            if key in self._copies or size > self.max_bytes:
                os.close(sealed)  # another thread kept one first, or it would never fit
                return
            self._copies[key] = (sealed, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (oldest, freed) = self._copies.popitem(last=False)
                os.close(oldest)
                self._bytes -= freed

    def close(self) -> None:
        with self._lock:
            copies, self._copies, self._bytes = list(self._copies.values()), OrderedDict(), 0
        for sealed, _ in copies:
            os.close(sealed)


def _sealed_copy(fd: int, size: int) -> int:
    """A read-only open file of a memfd holding the `size` bytes of the file `fd`, sealed:
    no write, no change of size and no further seal, by anyone, through any descriptor
    or mapping of it. It is opened read-only before anyone else can reach the memfd."""
    memfd = os.memfd_create("agentworlds-snapshot-db", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        offset = 0
        while offset < size:
            sent = os.sendfile(memfd, fd, offset, size - offset)
            if sent == 0:
                raise OSError("the file shrank while it was copied")
            offset += sent
        fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, _SEALS)
        return os.open(f"/proc/self/fd/{memfd}", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(memfd)


_SEALED = _SealedCopies(SEALED_COPIES_MAX_BYTES)


def _spawn(argv: Callable[[int], list[str]]) -> _Started:
    """Start one worker process (no code loaded yet): its process, our end of its control
    socket and its log file. ``popen_long_lived`` starts it, so that it outlives the thread
    that asked for it."""
    log_file = tempfile.TemporaryFile()  # noqa: SIM115 - lives with the worker
    # Datagrams keep each request's descriptors with its own message.
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        proc = popen_long_lived(
            argv(theirs.fileno()), stdin=subprocess.DEVNULL, stdout=log_file,
            stderr=log_file, start_new_session=True, close_fds=True,
            pass_fds=(theirs.fileno(),), env={"PATH": "/usr/bin:/bin"})
    except BaseException:
        ours.close()
        log_file.close()
        raise
    finally:
        theirs.close()
    return proc, ours, log_file


class _Spares:
    """Worker processes started ahead of need, per set of limits (the sandbox a worker
    runs in depends on its limits only, never on the code it will load). A spare has run
    no carried code: it waits for its first request having done its imports, which is most
    of a worker's start. Taking one has its replacement started in the background.

    Spares are stopped when this process exits; a forked child inherits them but never
    owns them."""

    def __init__(self) -> None:
        self._ready: dict[WorkerLimits, list[_Started]] = {}
        self._argv: dict[WorkerLimits, Callable[[int], list[str]]] = {}
        self._lock = threading.Lock()
        self._wanted = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._owner = os.getpid()
        atexit.register(self.close)

    def take(self, limits: WorkerLimits) -> _Started | None:
        with self._lock:
            if os.getpid() != self._owner:
                return None
            ready = self._ready.get(limits, [])
            while ready:
                started = ready.pop(0)
                if started[0].poll() is None:
                    return started
                _discard(started)
        return None

    def refill(self, limits: WorkerLimits, argv: Callable[[int], list[str]]) -> None:
        """Have `limits.spares` ready again soon (the spawning thread does it)."""
        with self._lock:
            if os.getpid() != self._owner:
                return
            self._argv[limits] = argv
            if self._thread is None:
                self._thread = threading.Thread(target=self._spawn_forever, daemon=True,
                                                name="app-worker-spares")
                self._thread.start()
            self._wanted.notify()

    def _short(self) -> WorkerLimits | None:
        """Limits with fewer spares ready than wanted (the lock held)."""
        return next((limits for limits in self._argv
                     if len(self._ready.get(limits, [])) < limits.spares), None)

    def _spawn_forever(self) -> None:
        while True:
            with self._wanted:
                limits = self._short()
                while limits is None:
                    self._wanted.wait()
                    limits = self._short()
                argv = self._argv[limits]
            try:
                started = _spawn(argv)
            except (OSError, SandboxError) as exc:  # spares only save time: logged
                log.warning("could not start a spare app worker: %s", exc)
                with self._lock:
                    self._argv.pop(limits, None)  # until the next refill asks again
                continue
            with self._lock:
                self._ready.setdefault(limits, []).append(started)

    def close(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, {}
            self._argv.clear()
        if os.getpid() != self._owner:
            return  # the parent's processes: not this child's to stop
        for spares in ready.values():
            for started in spares:
                _discard(started)


def _discard(started: _Started) -> None:
    proc, control, log_file = started
    control.close()
    if proc.poll() is None:
        kill_sandbox(proc)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    log_file.close()


_SPARES = _Spares()


class AppWorkers:
    """The worker processes serving one carried app to the instances under `root`.

    Each call gets a worker of its own for its duration: the one already holding the call's
    database if it is free (no handover), else any free one, else a new one (up to
    ``limits.max_workers``; beyond, the call waits for one until its timeout). A database is
    held by at most one worker: a call for a database that a busy worker holds waits for
    that worker (an instance's calls run one at a time anyway)."""

    def __init__(self, service: str, code: str, root: Path,
                 limits: WorkerLimits | None = None) -> None:
        self.service = service
        self.code = code
        self.root = root
        self.limits = limits or WorkerLimits()
        self._all: list[AppWorker] = []
        self._busy: set[AppWorker] = set()
        self._serving: dict[AppWorker, str] = {}  # a busy worker's call's database
        self._idle_since: dict[AppWorker, float] = {}
        self._changed = threading.Condition()
        self._closed = False

    def load(self) -> dict[str, Any]:
        """Start the first worker and load the code; the reply describes the tools."""
        worker = self._take(None, time.monotonic() + self.limits.start_timeout_s)
        try:
            return worker.load()
        finally:
            self._give_back(worker)

    def call(self, tool: str, arguments: dict[str, Any], *, db: Path, clock: CallClock,
             source: Path | None = None, read_first: bool = False) -> dict[str, Any]:
        """``AppWorker.call`` on a worker that runs nothing else meanwhile."""
        try:
            worker = self._take(str(db), time.monotonic() + self.limits.timeout_s)
        except WorkerError as exc:
            return {"ok": False, "error": str(exc)}
        try:
            return worker.call(tool, arguments, db=db, clock=clock, source=source,
                               read_first=read_first)
        finally:
            self._give_back(worker)

    def forget(self, db: Path) -> None:
        """Make the worker holding `db` (if one does) drop it."""
        with self._changed:
            holder = self._holder(str(db))
            while holder is not None and holder in self._busy:
                self._changed.wait()
                holder = self._holder(str(db))
            if holder is None:
                return
            self._busy.add(holder)
        try:
            holder.forget(db)
        finally:
            self._give_back(holder)

    def workers(self) -> list[AppWorker]:
        with self._changed:
            return list(self._all)

    def close(self) -> None:
        with self._changed:
            self._closed = True
            workers, self._all = self._all, []
            self._changed.notify_all()
        for worker in workers:
            worker.close()

    # --- who serves a call -------------------------------------------------------------

    def _holder(self, db: str) -> AppWorker | None:
        """The worker holding `db`, or running a call on it."""
        return next((w for w in self._all if w.holds == db or self._serving.get(w) == db),
                    None)

    def _take(self, db: str | None, deadline: float) -> AppWorker:
        with self._changed:
            while True:
                if self._closed:
                    raise WorkerError("the app's workers were stopped")
                chosen = self._choose(db)
                if chosen is not None:
                    self._busy.add(chosen)
                    if db is not None:
                        self._serving[chosen] = db
                    self._idle_since.pop(chosen, None)
                    return chosen
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WorkerError(f"all {len(self._all)} workers of the carried app "
                                      f"{self.service!r} stayed busy")
                self._changed.wait(left)

    def _choose(self, db: str | None) -> AppWorker | None:
        """A free worker for a call on `db`, a new one if none is free (None: wait)."""
        self._stop_long_idle()
        holder = self._holder(db) if db is not None else None
        if holder is not None:
            return None if holder in self._busy else holder
        free = [w for w in self._all if w not in self._busy]
        if free:  # prefer one holding nothing: no other instance's database is dropped
            return min(free, key=lambda w: (w.pid is None, w.holds is not None))
        if len(self._all) >= self.limits.max_workers:
            return None
        worker = AppWorker(self.service, self.code, self.root, self.limits)
        if self._all:  # every worker loads the same code: it describes the same tools
            worker.loaded = self._all[0].loaded
        self._all.append(worker)
        return worker

    def _stop_long_idle(self) -> None:
        now = time.monotonic()
        for worker, since in list(self._idle_since.items()):
            if len(self._all) > 1 and now - since > self.limits.idle_s:
                self._all.remove(worker)
                del self._idle_since[worker]
                worker.close()  # idle, so this takes no time

    def _give_back(self, worker: AppWorker) -> None:
        with self._changed:
            self._busy.discard(worker)
            self._serving.pop(worker, None)
            if worker in self._all:
                self._idle_since[worker] = time.monotonic()
            self._changed.notify_all()


@dataclass(frozen=True, slots=True, eq=False)
class RemoteTool:
    """A carried app's tool: each call runs in one of the app's sandboxed workers, at the
    clock of the instance that makes it."""

    spec: ToolSpec
    info: ToolInfo
    worker: AppWorkers

    def call(self, arguments: dict[str, Any], context: CallContext, *, db: Path,
             source: Path, read_first: bool = False) -> ToolResult | None:
        """Run the call on the instance database `db` (read from `source`, see
        ``AppWorker.call``); the worker validates the arguments and encodes the result as
        an in-process call does. Its effect is recorded in `context`. None: a `read_first`
        call that tried to write (nothing recorded; run it again on the instance's copy)."""
        reply = self.worker.call(self.info.name, arguments, db=db, source=source,
                                 clock=context.clock, read_first=read_first)
        if reply.get("ok") and reply.get("needs_write"):
            return None
        if not reply.get("ok"):
            return tool_failure(self.info.name, reply.get("error"))
        if reply.get("changeset") is not None or reply.get("sequences") is not None:
            sequences = reply.get("sequences")
            context.record(Effect(
                self.spec.service, base64.b64decode(reply.get("changeset") or ""),
                [(str(n), int(s)) for n, s in sequences] if sequences is not None else None))
        structured = reply.get("structured")
        if reply.get("is_error"):
            return ToolResult(True, str(reply.get("text")))
        return ToolResult(False, str(reply.get("text")),
                          structured if isinstance(structured, dict) else None)


def _never(*_: Any, **__: Any) -> Any:
    raise RuntimeError("a carried app's tools run only in its sandboxed worker")


class RemoteApp:
    """A carried app as an instance sees it: its tools, served by its workers."""

    def __init__(self, service: str, worker: AppWorkers) -> None:
        loaded = worker.load()
        self.service = service
        self.worker = worker
        self.name = str(loaded["app"])
        self.version = str(loaded["version"])
        self._tools = []
        for info in loaded["tools"]:
            full = str(info["name"])
            prefix = f"{service}_"
            spec = ToolSpec(service, full[len(prefix):] if full.startswith(prefix) else full,
                            _never, str(info["description"]), bool(info["writes"]))
            self._tools.append(RemoteTool(spec, ToolInfo(
                full, spec.description, info["input_schema"], info["output_schema"],
                spec.writes, reads_first=bool(info.get("reads_first"))), worker))

    def tools(self) -> list[RemoteTool]:
        return list(self._tools)


class WorkerPool:
    """The workers of each (service, code digest, instances directory)."""

    def __init__(self, limits: WorkerLimits | None = None) -> None:
        self.limits = limits
        self._apps: dict[tuple[str, str, str], RemoteApp] = {}
        self._lock = threading.Lock()

    def app(self, service: str, code: str, root: Path) -> RemoteApp:
        key = (service, digest(code.encode("utf-8")), os.path.realpath(root))
        with self._lock:
            found = self._apps.get(key)
            if found is None:
                worker = AppWorkers(service, code, root, self.limits)
                try:
                    found = RemoteApp(service, worker)
                except BaseException:
                    worker.close()
                    raise
                self._apps[key] = found
            return found

    def release(self, service: str, code: str) -> None:
        """Stop and forget the workers of `code` (every instances directory): an app that
        will not be served again."""
        wanted = (service, digest(code.encode("utf-8")))
        with self._lock:
            gone = [k for k in self._apps if k[:2] == wanted]
            apps = [self._apps.pop(k) for k in gone]
        for app in apps:
            app.worker.close()

    def workers(self) -> list[AppWorker]:
        """Every worker process of every app (running or stopped)."""
        with self._lock:
            return [w for a in self._apps.values() for w in a.worker.workers()]

    def close(self) -> None:
        with self._lock:
            apps, self._apps = list(self._apps.values()), {}
        for app in apps:
            app.worker.close()
