"""The app worker: serves the tools of app code carried in a world's log.

Run as ``python -m worldenv.sandbox.app_worker <control fd>`` inside the sandbox
(``worldenv.sandbox.workers.AppWorker`` starts it), never in the project's own process, as the
sandbox's unprivileged user.

**Channels.** The control socket (a ``SOCK_SEQPACKET`` socket inherited at `<control fd>`)
carries no request and no reply: each of its messages is ``CALL_MESSAGE`` with the
descriptors of one request, sent with SCM_RIGHTS: first the request's own channel (a fresh
stream socket the host made for this request alone), then, if the request hands a database
over, that database. On the request's channel the host writes one frame (``frame``: an
8-byte length and JSON) and the worker answers with one frame and closes it. The host
accepts exactly one frame followed by the end of the stream, carrying the request's
``id``; anything else (a second frame, bytes after it, another id, no end) is a protocol
violation that stops the worker. So a reply belongs to its request: what a call writes
anywhere (stdout and stderr are the host's log file, stdin is ``/dev/null``) never becomes a
reply, and a stale or extra frame can never be read as the answer to a later request,
whose channel did not exist yet. Carried code runs in this process, so it can reach its own
request's channel (and could lie about its own call's result, as it can by returning it);
it cannot reach any other request's.

Requests:

* ``{"op": "load", "id", "service", "code"}``: run `code` as a fresh module (it defines
  ``app = App(...)``); reply ``{"ok": true, "id", "app", "version", "tools": [...]}``;
* ``{"op": "call", "id", "tool", "arguments", "handover", "clock"}``: run the tool against
  the database the worker holds exactly as an in-process instance does (``worldenv.core.dispatch``:
  the same validation, execution and encoding), at the instance's clock (``clock``: an
  ``worldenv.core.contract.CallClock`` on the wire; the worker never makes one up); reply
  ``{"ok": true, "id", "is_error", "text", "structured", "changeset", "sequences"}``
  (changeset base64, both null unless the call changed them);
* ``{"op": "forget", "id"}``: close the database the worker holds.

The worker opens no file by name: it sees no instance directory at all. A call whose
``handover`` is ``{"writable": bool}`` comes with the database's file descriptor; the worker
drops the database it held and opens SQLite on that descriptor through the
``agentworlds-handed`` VFS. So the process holds at most one instance's database at any
time: the current request's, or between requests the last one's. A failed call request
leaves it holding nothing.

Nothing the carried code starts may outlive a request (a thread, a process, an interval
timer): such code would run while the next request's database is in the process. The
worker reports it (``"retire"`` in the reply, having dropped its database) and the host
replaces it. What it cannot take away is the code's own memory: module state is shared by
every instance the worker serves, as in any long-lived app process.
"""

from __future__ import annotations

import base64
import contextlib
import gc
import os
import signal
import socket
import struct
import sys
import traceback
import types
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import apsw
import msgspec

from replay.sqlite import frozen_vfs
from worldenv.core.app import App
from worldenv.core.contract import CallClock, CallContext
from worldenv.core.dispatch import CompiledTool, compile_app, open_tool_db

if TYPE_CHECKING:
    from typing_extensions import Buffer

VFS_NAME = "agentworlds-handed"
HANDED = "/handed.sqlite"  # the handed database's name inside the worker; no such file
CALL_MESSAGE = b"call"  # each control message: a request's channel (and database) only
FRAME_HEADER = struct.Struct(">Q")  # a frame: its length, then that many bytes of JSON
MAX_FRAME = 1 << 30  # no request or reply is larger (a changeset is bounded by the file)


def frame(data: bytes) -> bytes:
    """One frame on a request's channel."""
    return FRAME_HEADER.pack(len(data)) + data


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
    """The one database the worker holds, handed over with a request."""

    def __init__(self) -> None:
        self.vfs = _HandedVFS()
        self.conn: apsw.Connection | None = None

    @property
    def writable(self) -> bool:
        return self.vfs.writable

    def take(self, fd: int, writable: bool) -> None:
        """Drop the database held, then open the one handed over as `fd` (owned now)."""
        self.drop()
        self.vfs.fd, self.vfs.writable = fd, writable
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


@contextlib.contextmanager
def _refusing_writes(conn: apsw.Connection) -> Iterator[list[str]]:
    """Abort every statement that would write (the list names those tried): a read-first
    call learns that it needs the instance's own copy after all."""
    tried: list[str] = []

    def trace(cursor: apsw.Cursor, sql: str, bindings: Any) -> bool:
        if cursor.is_readonly:  # (BEGIN, SAVEPOINT, RELEASE and COMMIT count as read-only)
            return True
        tried.append(sql)
        return False  # apsw raises ExecTraceAbort in the tool

    conn.exec_trace = trace
    try:
        yield tried
    finally:
        conn.exec_trace = None


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
        self.handed: int | None = None  # the current request's database descriptor

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
        try:  # an app that builds its own tools (the AWM adapter: one per route) says how
            compile_tools = getattr(app, "compile_tools", None)
            self.tools = compile_tools() if callable(compile_tools) else compile_app(app)
        except Exception as exc:
            return {"ok": False, "error": _describe(exc)}
        left = left_running()
        if left is not None:
            return {"ok": False, "error": f"loading the code left {left} running"}
        # What loading made (the code's modules, a web framework, an ORM's models) lives
        # as long as the worker: set it aside from the collector, whose full passes over
        # it otherwise cost calls a third of their time on average.
        gc.collect()
        gc.freeze()
        return {"ok": True, "app": app.name, "version": app.version, "tools": [
            {"name": i.name, "description": i.description, "writes": i.writes,
             "reads_first": i.reads_first,
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
        handed, self.handed = self.handed, None
        if isinstance(handover, dict) != (handed is not None):
            if handed is not None:
                os.close(handed)
            raise RuntimeError("the database was not handed over with the request")
        if handed is not None and isinstance(handover, dict):
            self.holding.take(handed, bool(handover.get("writable")))
        conn = self.holding.conn
        if conn is None:
            return {"ok": False, "error": "no database was handed over"}
        name = str(request["tool"])
        tool = self.tools.get(name)
        if tool is None:  # the host checks names first; this answers a confused host
            return {"ok": True, "is_error": True, "text": f"Unknown tool: {name!r}",
                    "structured": None, "changeset": None, "sequences": None}
        context = CallContext(CallClock.from_wire(request["clock"]))
        arguments = dict(request.get("arguments") or {})
        if request.get("read_first"):
            if self.holding.writable:
                raise RuntimeError("a read-first call needs the database handed read-only")
            with _refusing_writes(conn) as tried:
                result = tool.call(lambda: conn, arguments, context)
            if tried:  # whatever the tool made of the refusal, it is run again on a copy
                return {"ok": True, "needs_write": True}
        else:
            result = tool.call(lambda: conn, arguments, context)
        effect = context.effects[0] if context.effects else None
        return {"ok": True, "is_error": result.is_error, "text": result.text,
                "structured": result.structured,
                "changeset": base64.b64encode(effect.changeset).decode() if effect else None,
                "sequences": effect.sequences if effect else None}

    def forget(self, request: dict[str, Any]) -> dict[str, Any]:
        self.holding.drop()
        return {"ok": True}


def _ancestors() -> set[int]:
    """This process and the ones above it in the sandbox's pid namespace (bwrap's init,
    and the unprivileged bwrap when the sandbox dropped from root to its user)."""
    pids, pid = set(), os.getpid()
    while pid > 0 and pid not in pids:
        pids.add(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return pids


_OURS: set[int] = set()  # filled by main(), before any carried code runs


def left_running() -> str | None:
    """What still runs besides the worker's own thread (None: nothing). Only meaningful
    in the sandbox, whose pid namespace holds only the worker and the processes above it."""
    _reap_children()
    threads = len(os.listdir("/proc/self/task")) - 1
    if threads:
        return f"{threads} thread(s)"
    others = _other_live_pids(_OURS or {os.getpid(), os.getppid()})
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


def _read_frame(channel: socket.socket) -> bytes:
    header = _read_exactly(channel, FRAME_HEADER.size)
    (size,) = FRAME_HEADER.unpack(header)
    if size > MAX_FRAME:
        raise RuntimeError(f"a request of {size} bytes")
    return _read_exactly(channel, size)


def _read_exactly(channel: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = channel.recv(min(left, 1 << 20))
        if not chunk:
            raise RuntimeError("the request's channel closed mid-frame")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _next_request(control: socket.socket) -> tuple[socket.socket, int | None] | None:
    """The next request's channel and handed database (None: the host has gone)."""
    message, fds, msg_flags, _ = socket.recv_fds(control, 64, 2, socket.MSG_CMSG_CLOEXEC)
    if not message and not fds:
        return None
    if msg_flags & socket.MSG_CTRUNC or message != CALL_MESSAGE or not 1 <= len(fds) <= 2:
        for fd in fds:
            os.close(fd)
        raise SystemExit(f"a control message that is not a request: {message!r} with "
                         f"{len(fds)} descriptor(s)")
    return socket.socket(fileno=fds[0]), (fds[1] if len(fds) == 2 else None)


WARM_UP_APP = """\
from typing import Annotated, Any

from pydantic import BaseModel, Field

from worldenv.core.app import App, ToolContext

app = App(service="warmup", name="warmup", version="0")


class Row(BaseModel):
    id: int
    name: str


@app.tool(writes=False)
def row(ctx: ToolContext, row_id: Annotated[int, Field(description="id", ge=1)],
        name: Annotated[str, Field(description="name")] = "") -> Row:
    \"\"\"A row.\"\"\"
    return Row(id=row_id, name=name)


@app.tool(writes=True)
def rows(ctx: ToolContext, query: Annotated[str, Field(description="query")]
         ) -> list[dict[str, Any]]:
    \"\"\"Rows.\"\"\"
    return [{"query": query}]
"""


def _warm_up() -> None:
    """Load and compile a small app of the project's own (``WARM_UP_APP``) before the first
    request. pydantic and FastMCP build their schema and validation machinery lazily, on
    first use (about 200 ms of a first load); done here, a worker started ahead of need (a
    spare) loads its code in the time that code itself takes. No carried code runs here."""
    module = types.ModuleType("agentworlds_warm_up")
    exec(compile(WARM_UP_APP, "<warm-up app>", "exec"), module.__dict__)
    tools = compile_app(module.app)
    row = module.Row(id=1, name="n")
    for name, arguments, result in (("warmup_row", {"row_id": 1}, row),
                                    ("warmup_rows", {"query": "q"}, [{"query": "q"}])):
        tools[name].validator.validate_python(arguments)
        tools[name].encoder.convert_result(result)
    # Everything imported so far lives as long as the worker. Collected and frozen now, a
    # load's own collection (see ``_Worker.load``) passes over what loading made only: in a
    # spare, that is ~45 ms of a load's ~60 ms no longer on the caller's path.
    gc.collect()
    gc.freeze()


def main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    control.set_inheritable(False)  # the carried code's child processes never get it
    # stdin is /dev/null and stdout/stderr are the host's log of this worker: nothing the
    # carried code prints or reads there is part of the protocol.
    sys.stdout = sys.stderr
    _OURS.update(_ancestors())
    import logging

    logging.getLogger("fastmcp").setLevel(logging.CRITICAL)
    _warm_up()
    worker = _Worker(_Holding())
    ops = {"load": worker.load, "call": worker.call, "forget": worker.forget}
    decoder = msgspec.json.Decoder()
    encoder = msgspec.json.Encoder()
    while (received := _next_request(control)) is not None:
        channel, worker.handed = received
        with channel:
            try:
                request = decoder.decode(_read_frame(channel))
                op = ops.get(request.get("op"))
                reply = op(request) if op else {"ok": False,
                                                "error": f"unknown op {request!r}"}
                reply["id"] = request.get("id")
            except Exception as exc:
                reply = {"ok": False, "error": _describe(exc)}
            finally:
                if worker.handed is not None:  # a request that never took its database
                    os.close(worker.handed)
                    worker.handed = None
            try:
                data = encoder.encode(reply)
            except Exception as exc:
                data = encoder.encode({"ok": False, "id": reply.get("id"),
                                       "error": f"unencodable reply: {exc}"})
            with contextlib.suppress(OSError):  # the host gave up (a timeout); it stops us
                channel.sendall(frame(data))


if __name__ == "__main__":
    main()
