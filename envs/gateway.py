"""The gateway: many instances of one ``Environment`` behind one HTTP server.

Agents (or the trainer that drives them) create instances over a small JSON API and talk
to each instance's MCP server over streamable HTTP::

    POST   /instances               {"world": "lars@7" | <world hash>, "mode": "tools"|"meta",
                                     "bare_names": false|true (tools without the service
                                     prefix: AWM's operation_id names)}
                                    -> 201 {id, world_hash, persona, day, mode, mcp_url,
                                            tools (the environment's tool count), ...}
    GET    /instances               {"instances": [info, ...]}
    GET    /instances/{id}          info: world, mode, calls so far, idle seconds, ...
    POST   /instances/{id}/reset    back to the snapshot, with a fresh episode -> info
    GET    /instances/{id}/hash     {"hash": <world hash now>, "world_hash": <snapshot>, ...}
    GET    /instances/{id}/diff     the WorldDiff since the snapshot
    GET    /instances/{id}/episode  the Episode so far
    DELETE /instances/{id}          close it and delete its directory -> 204
    *      /instances/{id}/mcp      the instance's MCP endpoint (streamable HTTP)
    GET    /healthz                 {"ok": true, "instances": n}

Every instance's MCP app (``instance_server(...).http_app()``) runs its lifespan (the
streamable-HTTP session manager) in a task of its own, so instances come and go while the
server runs. Tool calls run in worker threads, one at a time per instance, under a
per-call timeout: a tool that hangs gives the agent the error result "tool call timed out
after N s" and stalls neither the event loop nor other instances (the call itself runs on
and is recorded in the episode when it ends; the instance's next call waits for it).
Opening, resetting, hashing and diffing copy and hash files, so they run in threads too.

Instances idle for ``idle_timeout`` seconds (no REST call on them, no MCP request) are
closed and their directories deleted; at most ``max_instances`` exist at a time (429
beyond). With a token, every request needs ``Authorization: Bearer <token>``; ``serve``
refuses to listen beyond loopback without one. Without a token, only requests addressed to a
loopback host (and from no or a loopback ``Origin``) are answered, so web pages cannot
reach the gateway through a browser (DNS rebinding, cross-site requests); put a token on
it before putting it behind a proxy.

Every request is parsed in one layer before anything acts on it (``_read_body``,
``_json_body``, ``_world_ref``): a body over ``MAX_BODY`` (``MAX_MCP_BODY`` for MCP) is
413, JSON nested deeper than ``MAX_DEPTH`` is refused before it is decoded, a world
reference is bounded in length and in its day (a 64-bit integer) before the library
resolves it, and the library's errors map to statuses in one place (``_status_of``: not
found 404, conflict 409, any other ``WorldError`` 400). A malformed request gets a 4xx with
``{"error": "..."}`` naming what was wrong; an unexpected failure a 500 with one line,
never a traceback.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import queue
import re
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import Future
from typing import Any, get_args
from urllib.parse import urlsplit

import msgspec
from fastmcp.server.http import StarletteWithLifespan

from envs.contract import ToolResult
from envs.errors import GatewayError
from envs.instance import Environment, Instance
from envs.mcp import Mode, instance_server
from replay.errors import IntegrityError
from worldstore.errors import ConflictError, NotFoundError, WorldError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
MAX_BODY = 64 * 1024  # a REST body
MAX_MCP_BODY = 8 << 20  # an MCP request: a tool call's arguments may carry a file
MAX_DEPTH = 64  # JSON nesting of any body (decoders recurse: 30,000 levels crash them)
MAX_REF = 256  # characters of a world reference
DAY_LIMIT = 1 << 63  # a day is a signed 64-bit integer in every store
_REF_DAY = re.compile(r"@(-?\d+)\Z")  # \d as the library reads a day: any digits
# A JSON string, or an unterminated one to the end: linear, never re-scanned.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")
MODES: tuple[str, ...] = get_args(Mode)
log = logging.getLogger("agentworlds.gateway")


class _HttpError(Exception):
    def __init__(self, status: int, message: str,
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or []


# --- one hosted instance ---------------------------------------------------------------


class _Hosted:
    """An instance, its MCP app (lifespan run in a task of its own) and its bookkeeping.
    Every operation on the instance holds `lock`: tool calls and REST calls never overlap."""

    def __init__(self, instance: Instance, mode: Mode, call_timeout: float,
                 workers: _Workers) -> None:
        self.id = instance.instance_id
        self.instance = instance
        self.mode = mode
        self.mcp_url = f"/instances/{self.id}/mcp"
        self.call_timeout = call_timeout
        self.workers = workers
        self.lock = asyncio.Lock()
        self.created = self.last_active = time.monotonic()
        self.calls_total = 0
        self.timeouts = 0
        self.in_flight = 0  # MCP requests other than the long-lived GET event stream
        self.closed = False
        self.server = instance_server(instance, mode, call=self.call)
        self.app: StarletteWithLifespan | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._jobs: set[asyncio.Task[ToolResult]] = set()

    def touch(self) -> None:
        self.last_active = time.monotonic()

    def info(self) -> dict[str, Any]:
        record = self.instance.record
        now = time.monotonic()
        return {"id": self.id, "world_hash": record.world_hash, "persona": record.persona,
                "day": record.day, "mode": self.mode, "mcp_url": self.mcp_url,
                "bare_names": self.instance.bare_names,
                "tools": len(self.instance.list_tools()),
                "episode_id": self.instance.episode.episode_id,
                "calls": len(self.instance.episode.calls), "calls_total": self.calls_total,
                "timeouts": self.timeouts, "busy": self.lock.locked(),
                "age_s": round(now - self.created, 3), "idle_s": round(now - self.last_active, 3)}

    # --- tool calls (the MCP server's caller) --------------------------------------

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        self.touch()
        started = asyncio.Event()
        job = asyncio.ensure_future(self._call(name, arguments, started))
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)
        try:
            # shield: on timeout a started call runs on (a thread cannot be interrupted)
            # and keeps the instance's lock until it ends; the agent gets its answer now.
            return await asyncio.wait_for(asyncio.shield(job), self.call_timeout)
        except TimeoutError:
            self.timeouts += 1
            message = f"tool call timed out after {self.call_timeout:g} s"
            if not started.is_set():  # still waiting for an earlier call: never run it
                job.cancel()
                message += (" (not run: the instance was still busy with an earlier call "
                            "that timed out)")
            return ToolResult(True, message)
        finally:
            self.touch()

    async def _call(self, name: str, arguments: dict[str, Any],
                    started: asyncio.Event) -> ToolResult:
        async with self.lock:
            started.set()
            if self.closed:
                return ToolResult(True, f"instance {self.id} is closed")
            self.calls_total += 1
            instance = self.instance
            try:
                return await asyncio.wrap_future(self.workers.submit(
                    lambda: instance.call_tool(name, arguments)))
            except WorldError as exc:
                return ToolResult(True, str(exc))
            except Exception as exc:
                log.exception("tool call %s on instance %s failed", name, self.id)
                return ToolResult(True, f"tool call failed: {type(exc).__name__}: {exc}")

    # --- REST operations -------------------------------------------------------------

    async def run_locked(self, fn: Callable[[], Any]) -> Any:
        """Run blocking work on the instance in a thread, between tool calls."""
        self.touch()
        try:
            async with self.lock:
                if self.closed:
                    raise _HttpError(404, f"instance {self.id} was closed")
                return await asyncio.to_thread(fn)
        finally:
            self.touch()

    # --- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        self.app = self.server.http_app(path=self.mcp_url)
        self._task = asyncio.create_task(self._serve(self.app), name=f"mcp-{self.id}")
        ready = asyncio.create_task(self._ready.wait())
        done, _ = await asyncio.wait({ready, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if self._task in done:  # the session manager failed to start
            ready.cancel()
            self._task.result()

    async def _serve(self, app: StarletteWithLifespan) -> None:
        # Entered and exited in this one task: the session manager's task group needs it.
        async with app.lifespan(app):
            self._ready.set()
            await self._stop.wait()

    async def close(self) -> None:
        """Stop the MCP app (ends its sessions), wait for a running call, delete the
        instance. Call it after unpublishing the instance."""
        self._stop.set()
        if self._task is not None:
            try:
                await self._task
            except Exception:
                log.exception("MCP app of instance %s failed while stopping", self.id)
        async with self.lock:
            if not self.closed:
                self.closed = True
                await asyncio.to_thread(self.instance.close)


_Job = Callable[[], Any]


class _Workers:
    """Threads that run tool calls (the instance's synchronous dispatch), started as needed
    up to `size`. Daemon threads: a tool that never returns cannot keep the process alive."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._jobs: queue.SimpleQueue[tuple[_Job, Future[Any]] | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def submit(self, job: _Job) -> Future[Any]:
        future: Future[Any] = Future()
        self._jobs.put((job, future))
        if not self._idle.acquire(blocking=False):
            with self._lock:
                if len(self._threads) < self.size:
                    thread = threading.Thread(target=self._work, daemon=True,
                                              name=f"gateway-tools-{len(self._threads)}")
                    thread.start()
                    self._threads.append(thread)
        return future

    def _work(self) -> None:
        while (item := self._jobs.get()) is not None:
            job, future = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(job())
                except BaseException as exc:
                    future.set_exception(exc)
            self._idle.release()

    def shutdown(self) -> None:
        """Let every thread end after its current job."""
        with self._lock:
            for _ in self._threads:
                self._jobs.put(None)


# --- the ASGI app ----------------------------------------------------------------------


class Gateway:
    """A raw ASGI app serving instances of one environment (REST + MCP); see the module
    docstring. Run it with ``serve`` or any ASGI server with lifespan support, once: its
    shutdown closes every instance and its tool threads.

    `mode` is the MCP surface of instances created without one; `workers` caps the threads
    that run tool calls (default ``min(64, max_instances)``); `reap_interval` is how often
    idle instances are looked for (default a quarter of `idle_timeout`, at most 5 s)."""

    def __init__(self, environment: Environment, *, token: str | None = None,
                 max_instances: int = 256, idle_timeout: float = 600.0,
                 call_timeout: float = 30.0, mode: Mode = "tools",
                 reap_interval: float | None = None, workers: int | None = None) -> None:
        if token is not None and not token.strip():
            raise GatewayError("the bearer token is empty: give a real token or none")
        if max_instances < 1:
            raise GatewayError(f"max_instances must be at least 1, not {max_instances}")
        if idle_timeout <= 0 or call_timeout <= 0:
            raise GatewayError("idle_timeout and call_timeout must be positive seconds")
        if mode not in MODES:
            raise GatewayError(f"unknown MCP mode {mode!r}: use 'tools' or 'meta'")
        self.environment = environment
        self.max_instances = max_instances
        self.idle_timeout = idle_timeout
        self.call_timeout = call_timeout
        self.mode: Mode = mode
        self.reap_interval = reap_interval or min(5.0, max(0.1, idle_timeout / 4))
        self.instances: dict[str, _Hosted] = {}
        self._token = token.encode() if token is not None else None
        self._pending = 0
        self._open_lock = threading.Lock()
        self._workers = _Workers(workers or min(64, max_instances))
        self._reaper: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()

    # --- ASGI ---------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":  # websockets: not served
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            return
        try:
            if self._token is not None and not self._authorized(scope):
                raise _HttpError(401, "missing or wrong bearer token "
                                      "(send 'Authorization: Bearer <token>')",
                                 [(b"www-authenticate", b'Bearer realm="agent-worlds"')])
            if self._token is None and not _from_loopback(scope):
                raise _HttpError(403, "without a token the gateway only answers requests "
                                      "for a loopback host from no or a loopback origin "
                                      "(DNS-rebinding and cross-site protection)")
            await self._route(scope, receive, send)
        except _HttpError as exc:
            await _send_json(send, exc.status, {"error": exc.message}, exc.headers)
        except WorldError as exc:
            await _send_json(send, _status_of(exc), {"error": str(exc)})
        except Exception as exc:  # a bug of ours: one line for the client, the trace logged
            log.exception("request %s %s failed", scope.get("method"), scope.get("path"))
            await _send_json(send, 500, {"error": f"internal error: {type(exc).__name__}"})

    def _authorized(self, scope: Scope) -> bool:
        assert self._token is not None
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, credentials = bytes(value).partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(
                    credentials.strip(), self._token)
        return False

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        method: str = scope["method"]
        parts = scope["path"].strip("/").split("/")
        if parts == ["healthz"]:
            _allow(method, "GET")
            await _send_json(send, 200, {"ok": True, "instances": len(self.instances)})
            return
        if parts[0] != "instances":
            raise _HttpError(404, f"no such endpoint: {_shown(scope['path'])}")
        if len(parts) == 1:
            if _allow(method, "GET", "POST") == "GET":
                await _send_json(send, 200, {"instances": [h.info() for h in
                                                           self.instances.values()]})
            else:
                hosted = await self._create(receive)
                await _send_json(send, 201, hosted.info())
            return
        found = self.instances.get(parts[1])
        if found is None:
            raise _HttpError(404, f"no instance {_shown(parts[1])} (closed, reaped or never "
                                  "created)")
        hosted = found
        action = parts[2] if len(parts) > 2 else ""
        if action == "mcp":
            await self._mcp(hosted, scope, receive, send)
            return
        if len(parts) > 3:
            raise _HttpError(404, f"no such endpoint: {_shown(scope['path'])}")
        instance = hosted.instance
        if action == "":
            if _allow(method, "GET", "DELETE") == "GET":
                hosted.touch()
                await _send_json(send, 200, hosted.info())
            else:
                if self.instances.pop(hosted.id, None) is not None:
                    await hosted.close()
                await _send(send, 204, b"", b"")
        elif action == "reset":
            _allow(method, "POST")
            await hosted.run_locked(instance.reset)
            await _send_json(send, 200, hosted.info())
        elif action == "hash":
            _allow(method, "GET")
            now = await hosted.run_locked(instance.hash)
            world = instance.record.world_hash
            await _send_json(send, 200, {"id": hosted.id, "hash": now, "world_hash": world,
                                         "changed": now != world})
        elif action == "diff":
            _allow(method, "GET")
            body = await hosted.run_locked(lambda: msgspec.json.encode(instance.diff()))
            await _send(send, 200, body)
        elif action == "episode":
            _allow(method, "GET")
            body = await hosted.run_locked(lambda: instance.episode.to_json())
            await _send(send, 200, body)
        else:
            raise _HttpError(404, f"no such endpoint: {_shown(scope['path'])}")

    async def _mcp(self, hosted: _Hosted, scope: Scope, receive: Receive, send: Send) -> None:
        # The GET event stream stays open while a client is connected; it does not keep an
        # idle instance alive. Other requests do while they run.
        counts = scope["method"] != "GET"
        hosted.touch()
        hosted.in_flight += counts
        try:
            assert hosted.app is not None
            if scope["method"] == "POST":  # JSON-RPC: checked here like every other body
                body = await _read_body(receive, MAX_MCP_BODY)
                _check_depth(body)
                receive = _replaying(body, receive)
            await hosted.app(scope, receive, send)
        finally:
            hosted.in_flight -= counts
            hosted.touch()

    # --- instances --------------------------------------------------------------------

    async def _create(self, receive: Receive) -> _Hosted:
        request = _json_body(await _read_body(receive))
        unknown = sorted(set(request) - {"world", "mode", "bare_names"})
        if unknown:
            raise _HttpError(400, f"unknown field(s) {', '.join(unknown)}: the body is "
                                  '{"world": "persona@day" or a world hash, "mode": '
                                  '"tools" or "meta", "bare_names": true or false}')
        world = _world_ref(request.get("world"))
        mode = _mode(request.get("mode", self.mode))
        bare_names = request.get("bare_names")
        if bare_names is not None and not isinstance(bare_names, bool):
            raise _HttpError(400, f"bare_names must be true or false, not {_shown(bare_names)}")
        if len(self.instances) + self._pending >= self.max_instances:
            raise _HttpError(429, f"the gateway already holds its maximum of "
                                  f"{self.max_instances} instances: DELETE one, or wait for "
                                  "idle ones to be reaped", [(b"retry-after", b"5")])
        self._pending += 1
        try:
            try:
                hosted = await asyncio.to_thread(self._open, world, mode, bare_names)
            except WorldError as exc:
                raise _HttpError(_status_of(exc), str(exc)) from None
            try:
                await hosted.start()
            except BaseException:
                await asyncio.to_thread(hosted.instance.close)
                raise
            self.instances[hosted.id] = hosted
        finally:
            self._pending -= 1
        return hosted

    def _open(self, world: str, mode: Mode, bare_names: bool | None = None) -> _Hosted:
        # One open at a time: a first open may build and cache the snapshot.
        with self._open_lock:
            instance = self.environment.open(world, bare_names=bare_names)
        try:
            return _Hosted(instance, mode, self.call_timeout, self._workers)
        except BaseException:
            instance.close()
            raise

    def _discard(self, iid: str) -> None:
        """Unpublish an instance now and close it in the background."""
        hosted = self.instances.pop(iid, None)
        if hosted is not None:
            task = asyncio.create_task(hosted.close(), name=f"close-{iid}")
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(self.reap_interval)
            now = time.monotonic()
            for iid, hosted in list(self.instances.items()):
                if (hosted.in_flight == 0 and not hosted.lock.locked()
                        and now - hosted.last_active >= self.idle_timeout):
                    log.info("instance %s idle for %.0f s: closing it", iid,
                             now - hosted.last_active)
                    try:
                        self._discard(iid)
                    except Exception:  # keep reaping the others
                        log.exception("could not close idle instance %s", iid)

    # --- lifespan ---------------------------------------------------------------------

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._reaper = asyncio.create_task(self._reap(), name="gateway-reaper")
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def shutdown(self) -> None:
        """Close every instance (waiting at most a call timeout for running calls)."""
        if self._reaper is not None:
            self._reaper.cancel()
        for iid in list(self.instances):
            self._discard(iid)
        if self._closing:
            await asyncio.wait(set(self._closing), timeout=self.call_timeout + 5)
        self._workers.shutdown()


# --- HTTP helpers ------------------------------------------------------------------------


def _allow(method: str, *allowed: str) -> str:
    if method not in allowed:
        raise _HttpError(405, f"method {method} not allowed here (use {', '.join(allowed)})",
                         [(b"allow", ", ".join(allowed).encode())])
    return method


def _status_of(exc: WorldError) -> int:
    """The one place a library error becomes an HTTP status."""
    if isinstance(exc, NotFoundError):
        return 404
    if isinstance(exc, ConflictError):
        return 409
    if isinstance(exc, IntegrityError):  # the store is damaged: not the request's fault
        return 500
    return 400


def _shown(value: object) -> str:
    """A client's value in an error message, cut short."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


async def _read_body(receive: Receive, limit: int = MAX_BODY) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _HttpError(400, "the client disconnected")
        chunk = bytes(message.get("body", b""))
        size += len(chunk)
        if size > limit:
            raise _HttpError(413, f"request body over {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the body already read, then what the client sends next."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _check_depth(body: bytes) -> None:
    """Refuse JSON nested deeper than MAX_DEPTH before any decoder sees it (linear: the
    strings are cut out, then only brackets are counted)."""
    brackets = _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    if len(brackets) <= MAX_DEPTH:
        return
    depth = 0
    for char in brackets:
        depth += 1 if char in b"[{" else -1
        if depth > MAX_DEPTH:
            raise _HttpError(400, f"the body nests JSON deeper than {MAX_DEPTH} levels")


def _json_body(body: bytes) -> dict[str, Any]:
    _check_depth(body)
    try:
        data = json.loads(body or b"{}")
    except ValueError as exc:  # UnicodeDecodeError too; RecursionError cannot happen here
        raise _HttpError(400, f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise _HttpError(400, "the body must be a JSON object")
    return data


def _mode(value: object) -> Mode:
    for mode in get_args(Mode):
        if value == mode and isinstance(value, str):
            return mode  # type: ignore[no-any-return]
    raise _HttpError(400, f"unknown mode {_shown(value)}: use 'tools' or 'meta'")


def _world_ref(value: object) -> str:
    """The body's world reference, bounded before the library resolves it: a non-empty
    string of at most MAX_REF characters whose day, if it names one, fits 64 bits."""
    if not isinstance(value, str) or not value:
        raise _HttpError(400, 'the body needs "world": "persona@day" (or persona, or a '
                              "world hash)")
    if len(value) > MAX_REF:
        raise _HttpError(400, f"the world reference is over {MAX_REF} characters")
    day = _REF_DAY.search(value)
    if day is not None and not -DAY_LIMIT <= int(day.group(1)) < DAY_LIMIT:
        raise _HttpError(422, f"the day of {_shown(value)} does not fit 64 bits: "
                              "no persona has such a day")
    return value


async def _send_json(send: Send, status: int, data: Any,
                     headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await _send(send, status, msgspec.json.encode(data), headers=headers)


async def _send(send: Send, status: int, body: bytes,
                content_type: bytes = b"application/json",
                headers: list[tuple[bytes, bytes]] | None = None) -> None:
    head = [(b"content-length", str(len(body)).encode()), *(headers or [])]
    if content_type:
        head.append((b"content-type", content_type))
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


# --- serving -----------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _from_loopback(scope: Scope) -> bool:
    """The Host header names a loopback address and an Origin header, if any, too: a web
    page elsewhere cannot drive a tokenless gateway through the browser."""
    headers = {bytes(k): bytes(v).decode("latin-1") for k, v in scope["headers"]}
    host = headers.get(b"host")
    if host is not None:
        name = host[1:].partition("]")[0] if host.startswith("[") else host.partition(":")[0]
        if not is_loopback(name):
            return False
    origin = headers.get(b"origin")
    return origin is None or is_loopback(urlsplit(origin).hostname or "")


def check_bind(host: str, token: str | None) -> None:
    """Refuse to listen beyond loopback without a bearer token."""
    if not is_loopback(host) and not (token and token.strip()):
        raise GatewayError(
            f"refusing to serve on {host!r} without a bearer token: anyone who can reach it "
            "could drive the instances; set a token (--token or WORLDCTL_TOKEN) or bind to "
            "127.0.0.1")


def serve(environment: Environment, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
          token: str | None = None, **limits: Any) -> None:
    """Serve instances of `environment` until interrupted. `limits`: the keyword arguments
    of ``Gateway`` (max_instances, idle_timeout, call_timeout, mode, ...)."""
    import uvicorn

    check_bind(host, token)
    gateway = Gateway(environment, token=token, **limits)
    config = uvicorn.Config(gateway, host=host, port=port, lifespan="on",
                            log_level="info", timeout_graceful_shutdown=5)
    uvicorn.Server(config).run()
