"""The app worker: serves the tools of app code carried in a world's log.

Run as ``python -m envs.app_worker <channel fd>`` inside the sandbox
(``envs.worker_pool.AppWorker`` starts it), never in the project's own process. It speaks
JSON lines on stdin/stdout:

* ``{"op": "load", "service", "code"}``: run `code` as a fresh module (it defines
  ``app = App(...)``); reply ``{"ok": true, "app", "version", "tools": [...]}``;
* ``{"op": "call", "tool", "arguments", "handover", "clock"}``: run the tool against the
  database the worker holds exactly as an in-process instance does (``envs.dispatch``:
  the same validation, execution and encoding), at the instance's clock (``clock``: an
  ``envs.contract.CallClock`` on the wire; the worker never makes one up); reply
  ``{"ok": true, "is_error", "text", "structured", "changeset", "sequences"}``
  (changeset base64, both null unless the call changed them);
* ``{"op": "forget"}``: close the database the worker holds.

The worker opens no file by name: it sees no instance directory at all. A call whose
``handover`` is ``{"writable": bool}`` comes with the database's file descriptor, sent just
before it on the channel socket (SCM_RIGHTS); the worker drops the database it held and
opens SQLite on that descriptor through the ``agentworlds-handed`` VFS. So the process
holds at most one instance's database at any time: the current request's, or between
requests the last one's. A failed call request leaves it holding nothing.

Nothing the carried code starts may outlive a request (a thread, a process, an interval
timer): such code would run while the next request's database is in the process. The
worker reports it (``"retire"`` in the reply, having dropped its database) and the host
replaces it. What it cannot take away is the code's own memory: module state is shared by
every instance the worker serves, as in any long-lived app process.

Anything the carried code prints goes to stderr: stdout carries only replies.
"""

from __future__ import annotations

import base64
import os
import signal
import socket
import sys
import traceback
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

import apsw
import msgspec

from envs.app import App
from envs.contract import CallClock, CallContext
from envs.dispatch import CompiledTool, compile_app, open_tool_db
from replay.sqlite import frozen_vfs

if TYPE_CHECKING:
    from typing_extensions import Buffer

VFS_NAME = "agentworlds-handed"
HANDED = "/handed.sqlite"  # the handed database's name inside the worker; no such file
HANDOVER_MESSAGE = b"handover"  # what the host sends with each descriptor


class _HandedFile(apsw.VFSFile):
    """The handed database: every read and write goes to the host's descriptor.

    Locks are no-ops because one process uses an instance's database at a time: the host
    never opens a carried app's database itself and asks the worker to ``forget`` it before
    it hashes, diffs, resets or deletes the instance. Syncs are no-ops because an instance
    is a scratch copy (``open_tool_db`` turns them off for in-process instances too).
    """

    def __init__(self, fd: int) -> None:  # no super().__init__(): it inherits no VFS file
        self.fd = fd

    def xRead(self, amount: int, offset: int) -> bytes:
        # A regular file reads short only at its end; apsw zero-fills and reports the short
        # read to SQLite, as the unix VFS does.
        return os.pread(self.fd, amount, offset)

    def xWrite(self, data: Buffer, offset: int) -> None:
        view = memoryview(data).cast("B")
        while view:
            written = os.pwrite(self.fd, view, offset)
            view, offset = view[written:], offset + written

    def xTruncate(self, newsize: int) -> None:
        os.ftruncate(self.fd, newsize)

    def xSync(self, flags: int) -> None:
        pass

    def xFileSize(self) -> int:
        return os.fstat(self.fd).st_size

    def xLock(self, level: int) -> None:
        pass

    def xUnlock(self, level: int) -> None:
        pass

    def xCheckReservedLock(self) -> bool:
        return False

    def xFileControl(self, op: int, ptr: int) -> bool:
        return False

    def xSectorSize(self) -> int:
        return 4096

    def xDeviceCharacteristics(self) -> int:
        return 0

    def xClose(self) -> None:
        pass  # the descriptor belongs to the holding, closed when it is dropped


class _HandedVFS(apsw.VFS):
    """Opens only the handed database (and anonymous temporary files in the sandbox's
    private /tmp); every other name, an ATTACH of a path say, cannot be opened. The
    rollback journal lives in memory, so no journal file is needed; the frozen clock
    comes from the base VFS."""

    def __init__(self) -> None:
        super().__init__(VFS_NAME, frozen_vfs())
        self.fd: int | None = None
        self.writable = False

    def xOpen(self, name: str | apsw.URIFilename | None, flags: list[int]) -> apsw.VFSFile:
        if name is None:
            return apsw.VFSFile("", name, flags)
        filename = name.filename() if isinstance(name, apsw.URIFilename) else name
        if filename != HANDED or self.fd is None:
            raise apsw.CantOpenError(f"{filename}: the worker opens only the database "
                                     "handed over with the request")
        if not self.writable:
            flags[1] = (flags[0] & ~(apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE)
                        ) | apsw.SQLITE_OPEN_READONLY
        else:
            flags[1] = flags[0]
        return _HandedFile(self.fd)

    def xAccess(self, pathname: str, flags: int) -> bool:
        return False  # no journal, WAL or other file exists beside the handed database

    def xDelete(self, filename: str, syncdir: bool) -> None:
        pass  # nothing named exists to delete

    def xFullPathname(self, name: str) -> str:
        return name


class _Holding:
    """The one database the worker holds, received from the host's channel."""

    def __init__(self, channel: socket.socket) -> None:
        self.channel = channel
        self.vfs = _HandedVFS()
        self.conn: apsw.Connection | None = None

    def take(self, writable: bool) -> None:
        """Drop the database held, then open the one sent on the channel."""
        self.drop()
        message, fds, msg_flags, _ = socket.recv_fds(self.channel, 64, 1,
                                                     socket.MSG_DONTWAIT)
        if msg_flags & socket.MSG_CTRUNC or len(fds) != 1 or message != HANDOVER_MESSAGE:
            for fd in fds:
                os.close(fd)
            raise RuntimeError("the database was not handed over with the request "
                               f"(got {message!r} with {len(fds)} descriptors)")
        self.vfs.fd, self.vfs.writable = fds[0], writable
        try:
            self.conn = _open_handed()
        except BaseException:
            self.drop()
            raise

    def drop(self) -> None:
        conn, self.conn = self.conn, None
        fd, self.vfs.fd = self.vfs.fd, None
        try:
            if conn is not None:
                conn.close()
        finally:
            if fd is not None:
                os.close(fd)


def _open_handed() -> apsw.Connection:
    conn = open_tool_db(Path(HANDED), vfs=VFS_NAME)
    # The journal lives in memory (there is no file to put it in). No cache spill: a write
    # reaches the file only when it commits, so a worker killed mid-call (a timeout)
    # leaves the database as the last commit left it, unless killed during the commit.
    for pragma in ("journal_mode=MEMORY", "temp_store=MEMORY", "cache_spill=OFF"):
        conn.execute(f"PRAGMA {pragma}").fetchall()  # a pragma that answers runs on reading
    return conn


class _Worker:
    def __init__(self, holding: _Holding) -> None:
        self.tools: dict[str, CompiledTool] | None = None
        self.holding = holding

    def load(self, request: dict[str, Any]) -> dict[str, Any]:
        service, code = str(request["service"]), str(request["code"])
        module = types.ModuleType(f"agentworlds_carried_{service}")
        module.__file__ = f"<carried app {service}>"
        try:
            exec(compile(code, f"<carried app {service}>", "exec"), module.__dict__)
        except BaseException as exc:
            return {"ok": False, "error": _describe(exc)}
        app = module.__dict__.get("app")
        if not isinstance(app, App):
            return {"ok": False, "error": "the code does not define `app = App(...)`"}
        if app.service != service:
            return {"ok": False, "error": f"the code's app serves {app.service!r}, "
                                          f"not {service!r}"}
        app.source = code
        try:
            self.tools = compile_app(app)
        except Exception as exc:
            return {"ok": False, "error": _describe(exc)}
        left = left_running()
        if left is not None:
            return {"ok": False, "error": f"loading the code left {left} running"}
        return {"ok": True, "app": app.name, "version": app.version, "tools": [
            {"name": i.name, "description": i.description, "writes": i.writes,
             "input_schema": i.input_schema, "output_schema": i.output_schema}
            for i in (t.info for t in self.tools.values())]}

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            reply = self._call(request)
        except Exception as exc:
            reply = {"ok": False, "error": _describe(exc)}
        if not reply.get("ok"):
            self.holding.drop()
        left = left_running()
        if left is not None:
            self.holding.drop()
            reply["retire"] = f"the call left {left} running"
        return reply

    def _call(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.tools is None:
            return {"ok": False, "error": "no app is loaded"}
        handover = request.get("handover")
        if isinstance(handover, dict):
            self.holding.take(bool(handover.get("writable")))
        conn = self.holding.conn
        if conn is None:
            return {"ok": False, "error": "no database was handed over"}
        name = str(request["tool"])
        tool = self.tools.get(name)
        if tool is None:  # the host checks names first; this answers a confused host
            return {"ok": True, "is_error": True, "text": f"Unknown tool: {name!r}",
                    "structured": None, "changeset": None, "sequences": None}
        context = CallContext(CallClock.from_wire(request["clock"]))
        result = tool.call(lambda: conn, dict(request.get("arguments") or {}), context)
        effect = context.effects[0] if context.effects else None
        return {"ok": True, "is_error": result.is_error, "text": result.text,
                "structured": result.structured,
                "changeset": base64.b64encode(effect.changeset).decode() if effect else None,
                "sequences": effect.sequences if effect else None}

    def forget(self, request: dict[str, Any]) -> dict[str, Any]:
        self.holding.drop()
        return {"ok": True}


def left_running() -> str | None:
    """What still runs besides the worker's own thread (None: nothing). Only meaningful
    in the sandbox, whose pid namespace holds its init (the parent) and the worker."""
    _reap_children()
    threads = len(os.listdir("/proc/self/task")) - 1
    if threads:
        return f"{threads} thread(s)"
    others = _other_live_pids({os.getpid(), os.getppid()})
    if others:
        return f"process(es) {', '.join(map(str, others))}"
    for timer in (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF):
        if signal.getitimer(timer) != (0.0, 0.0):
            return "an interval timer"
    return None


def _reap_children() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _other_live_pids(ours: set[int]) -> list[int]:
    """Processes of the namespace but `ours` that are not zombies (an exited grandchild
    waits for init to reap it and can run nothing more)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in ours:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # gone meanwhile
        if state not in (b"Z", b"X"):
            pids.append(int(entry))
    return sorted(pids)


def _describe(exc: BaseException) -> str:
    lines = traceback.format_exception_only(type(exc), exc)
    return "".join(lines).strip()


def main() -> None:
    channel = socket.socket(fileno=int(sys.argv[1]))
    channel.set_inheritable(False)  # the carried code's child processes never get it
    # Keep the protocol's pipes private: the app's prints and reads get stderr and nothing.
    replies = os.fdopen(os.dup(1), "wb", buffering=0)
    requests = os.fdopen(os.dup(0), "rb")
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdout = sys.stderr
    import logging

    logging.getLogger("fastmcp").setLevel(logging.CRITICAL)
    worker = _Worker(_Holding(channel))
    ops = {"load": worker.load, "call": worker.call, "forget": worker.forget}
    decoder = msgspec.json.Decoder()
    encoder = msgspec.json.Encoder()
    for line in requests:
        try:
            request = decoder.decode(line)
            op = ops.get(request.get("op"))
            reply = op(request) if op else {"ok": False, "error": f"unknown op {request!r}"}
        except Exception as exc:
            reply = {"ok": False, "error": _describe(exc)}
        try:
            data = encoder.encode(reply)
        except Exception as exc:
            data = encoder.encode({"ok": False, "error": f"unencodable reply: {exc}"})
        replies.write(data + b"\n")


if __name__ == "__main__":
    main()
