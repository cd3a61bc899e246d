"""Sandboxed workers for app code carried in a world's log.

Carried code is untrusted: it never runs in this process. ``AppWorker`` runs
``python -m envs.app_worker`` (one loaded app) under bubblewrap and sends it one request at a
time; ``WorkerPool`` keeps one worker per (service, code digest), so every instance of
worlds carrying the same code shares it and only the first open waits for a start.

What the worker sees: a new root with the system's ``/usr`` and ``/lib*``, the Python
installation at ``/opt/python``, the virtual environment's site-packages at ``/opt/site``
and the project's packages under ``/opt/src`` (all read-only), and a private ``/tmp``
(tmpfs). No file of the host is writable there, and no instance directory, snapshot or
store is there at all. A call's database reaches it as a file descriptor: on the first call
of an instance (after ``forget``, or after another instance's call), this process opens the
instance's database itself, read-write, or the snapshot's read-only while a lazy instance
has no copy, and sends the descriptor over a Unix socket (SCM_RIGHTS) with the request; the
worker then drops the one it held (see ``envs.app_worker``). So while a call runs, the worker
process holds no database but that instance's.

No network (only a private loopback), new pid/ipc/uts/cgroup/user namespaces, no nested
user namespaces, every capability dropped, no new privileges, and ``prlimit`` bounds on
address space, CPU seconds, file size and open files. A call that outlives ``timeout_s``
(or a worker that dies) gets an error result; the worker is killed and restarted on the
next call. A worker whose call left a thread, a process or a timer running is replaced too.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import selectors
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from envs.app import ToolSpec
from envs.app_worker import HANDOVER_MESSAGE
from envs.contract import CallClock, CallContext, Effect, ToolInfo, ToolResult
from envs.dispatch import tool_failure
from envs.errors import AppLoadError, SandboxError, WorkerError
from envs.sandbox import (
    Bind,
    Rlimits,
    SandboxPolicy,
    Tmpfs,
    bwrap_argv,
    find_sandbox_tools,
    kill_sandbox,
)
from worldstore.canonical import digest

PYTHON_AT = "/opt/python"
SITE_AT = "/opt/site"
SRC_AT = "/opt/src"
PACKAGES = ("envs", "replay", "worldstore")
SYSTEM_PATHS = ("/usr", "/bin", "/lib", "/lib32", "/lib64", "/libx32")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerLimits:
    timeout_s: float = 10.0  # wall clock per request
    start_timeout_s: float = 60.0  # the first request (load) also starts Python
    cpu_s: int = 600  # CPU seconds for the worker's whole life (it restarts when hit)
    memory_mib: int = 2048  # address space
    max_file_mib: int = 256


def _python_paths() -> tuple[str, str, list[str]]:
    """The interpreter's prefix, the venv's site-packages and the package directories."""
    prefix = os.path.realpath(sys.base_prefix)
    site = os.path.realpath(sysconfig.get_paths()["purelib"])
    import envs

    root = Path(envs.__file__).resolve().parent.parent
    packages = [str(root / name) for name in PACKAGES if (root / name / "__init__.py").exists()]
    return prefix, site, packages


class AppWorker:
    """One sandboxed ``envs.app_worker`` process serving one carried app to the instances under
    `root` (it is handed databases there only)."""

    def __init__(self, service: str, code: str, root: Path,
                 limits: WorkerLimits | None = None) -> None:
        self.service = service
        self.code = code
        self.root = Path(os.path.realpath(root))
        self.limits = limits or WorkerLimits()
        self.loaded: dict[str, Any] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: Any = None
        self._buffer = bytearray()
        self._channel: socket.socket | None = None  # our end of the descriptor channel
        self._held: tuple[str, str] | None = None  # (database, file handed) the worker holds
        self._lock = threading.Lock()
        try:  # the worker never drops from root to another uid, so it needs no setpriv
            self._tools = find_sandbox_tools(setpriv=False)
        except SandboxError as exc:
            raise SandboxError(f"running carried app code needs a sandbox: {exc}") from None

    @property
    def pid(self) -> int | None:
        """The host pid of the sandbox (bwrap), while running."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def policy(self) -> SandboxPolicy:
        """The worker's sandbox: the system without /etc, the interpreter, site-packages
        and the project's packages read-only, a private /tmp as its cwd and nothing else.
        Its user is the caller's own (it gets every database as a descriptor, so it needs
        no uid of its own), and bwrap's init stays its pid 1 to reap what a call orphans."""
        prefix, site, packages = _python_paths()
        lim = self.limits
        return SandboxPolicy(
            cwd="/tmp",
            rlimits=Rlimits(cpu_s=lim.cpu_s, memory_mib=lim.memory_mib,
                            max_file_mib=lim.max_file_mib),
            system_paths=SYSTEM_PATHS,
            tmpfs=(Tmpfs("/tmp", 64),),
            binds=(Bind(Path(prefix), PYTHON_AT), Bind(Path(site), SITE_AT),
                   *(Bind(Path(package), f"{SRC_AT}/{Path(package).name}")
                     for package in packages)),
            env=(("PATH", f"{PYTHON_AT}/bin:/usr/bin:/bin"), ("PYTHONHOME", PYTHON_AT),
                 ("PYTHONPATH", f"{SRC_AT}:{SITE_AT}"), ("LD_LIBRARY_PATH", f"{PYTHON_AT}/lib"),
                 ("PYTHONDONTWRITEBYTECODE", "1"), ("HOME", "/tmp"), ("LANG", "C.UTF-8")))

    def argv(self, channel_fd: int) -> list[str]:
        """The command line; `channel_fd` is the worker's end of the descriptor channel."""
        python = f"{PYTHON_AT}/bin/python{sys.version_info[0]}.{sys.version_info[1]}"
        return bwrap_argv(self.policy(), [python, "-s", "-m", "envs.app_worker",
                                          str(channel_fd)], self._tools)

    # --- requests ---------------------------------------------------------------------

    def load(self) -> dict[str, Any]:
        """Start the worker and load the code (once); the load reply describes the tools."""
        with self._lock:
            if self.loaded is None:
                self._ensure_started()
            assert self.loaded is not None
            return self.loaded

    def call(self, tool: str, arguments: dict[str, Any], *, db: Path, clock: CallClock,
             source: Path | None = None) -> dict[str, Any]:
        """Run one tool call against the instance database `db` at the instance's `clock`;
        a timeout or crash is an error reply (and a restart later). `source` is the file to
        read instead while a lazy instance has no copy of `db` (its snapshot's database,
        handed read-only)."""
        source = source or db
        held = (str(db), str(source))
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
                       "clock": clock.to_wire()}
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
        """A descriptor of `source` to hand over: `db` itself read-write, or a snapshot's
        database read-only. Refuses a database outside this worker's instances directory,
        a symlink and anything but a regular file."""
        if not Path(os.path.realpath(db)).is_relative_to(self.root):
            raise OSError(f"not under the worker's instances directory {self.root}")
        flags = os.O_RDWR | os.O_CREAT if source == db else os.O_RDONLY
        fd = os.open(source, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
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
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives with the worker
        # Datagrams keep each descriptor with its own message.
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                self.argv(theirs.fileno()), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=self._stderr, start_new_session=True, close_fds=True,
                pass_fds=(theirs.fileno(),), env={"PATH": "/usr/bin:/bin"})
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._channel = ours
        reply = self._request({"op": "load", "service": self.service, "code": self.code},
                              self.limits.start_timeout_s)
        if not reply.get("ok"):
            self._stop()
            raise AppLoadError(str(reply.get("error")))
        self.loaded = reply

    def _request(self, request: dict[str, Any], timeout: float,
                 fd: int | None = None) -> dict[str, Any]:
        """Send one request (first `fd` on the channel, if given; it is closed here) and
        wait for its reply."""
        proc = self._proc
        try:
            if proc is None or proc.stdin is None or proc.stdout is None or not self._channel:
                raise WorkerError("the app worker is not running")
            if fd is not None:
                self._send_fd(fd)
        finally:
            if fd is not None:
                os.close(fd)
        try:
            proc.stdin.write(msgspec.json.encode(request) + b"\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise WorkerError(f"the app worker died{self._why()}") from exc
        line = self._read_line(proc, time.monotonic() + timeout, timeout)
        try:
            reply = msgspec.json.decode(line)
        except msgspec.DecodeError as exc:
            raise WorkerError(f"the app worker sent a bad reply: {line[:200]!r}") from exc
        if not isinstance(reply, dict):
            raise WorkerError("the app worker sent a bad reply")
        return reply

    def _send_fd(self, fd: int) -> None:
        assert self._channel is not None
        try:
            socket.send_fds(self._channel, [HANDOVER_MESSAGE], [fd])
        except OSError as exc:
            raise WorkerError(f"the app worker died{self._why()}") from exc

    def _read_line(self, proc: subprocess.Popen[bytes], deadline: float,
                   timeout: float) -> bytes:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while True:
                end = self._buffer.find(b"\n")
                if end >= 0:
                    line = bytes(self._buffer[:end])
                    del self._buffer[:end + 1]
                    return line
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WorkerError(f"the app call took longer than {timeout:g} s; "
                                      "the app worker was stopped")
                if sel.select(left):
                    chunk = os.read(fd, 1 << 20)
                    if not chunk:
                        proc.wait(timeout=5)
                        raise WorkerError(f"the app worker died (exit {proc.returncode})"
                                          f"{self._why()}")
                    self._buffer += chunk

    def _why(self) -> str:
        if self._stderr is None:
            return ""
        with contextlib.suppress(OSError):
            self._stderr.seek(0, os.SEEK_END)
            size = self._stderr.tell()
            self._stderr.seek(max(0, size - 2000))
            tail = self._stderr.read().decode("utf-8", "replace").strip()
            return f": {tail}" if tail else ""
        return ""

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        self._buffer.clear()
        self._held = None  # a new process holds no database
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if proc is not None:
            if proc.poll() is None:
                kill_sandbox(proc)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


@dataclass(frozen=True, slots=True, eq=False)
class RemoteTool:
    """A carried app's tool: each call runs in the app's sandboxed worker, at the clock of
    the instance that makes it."""

    spec: ToolSpec
    info: ToolInfo
    worker: AppWorker

    def call(self, arguments: dict[str, Any], context: CallContext, *, db: Path,
             source: Path) -> ToolResult:
        """Run the call on the instance database `db` (read from `source`, see
        ``AppWorker.call``); the worker validates the arguments and encodes the result as
        an in-process call does. Its effect is recorded in `context`."""
        reply = self.worker.call(self.info.name, arguments, db=db, source=source,
                                 clock=context.clock)
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
    """A carried app as an instance sees it: its tools, served by its worker."""

    def __init__(self, service: str, worker: AppWorker) -> None:
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
                spec.writes), worker))

    def tools(self) -> list[RemoteTool]:
        return list(self._tools)


class WorkerPool:
    """One worker per (service, code digest, instances directory)."""

    def __init__(self, limits: WorkerLimits | None = None) -> None:
        self.limits = limits
        self._apps: dict[tuple[str, str, str], RemoteApp] = {}
        self._lock = threading.Lock()

    def app(self, service: str, code: str, root: Path) -> RemoteApp:
        key = (service, digest(code.encode("utf-8")), os.path.realpath(root))
        with self._lock:
            found = self._apps.get(key)
            if found is None:
                worker = AppWorker(service, code, root, self.limits)
                try:
                    found = RemoteApp(service, worker)
                except BaseException:
                    worker.close()
                    raise
                self._apps[key] = found
            return found

    def workers(self) -> list[AppWorker]:
        with self._lock:
            return [a.worker for a in self._apps.values()]

    def close(self) -> None:
        with self._lock:
            apps, self._apps = list(self._apps.values()), {}
        for app in apps:
            app.worker.close()
