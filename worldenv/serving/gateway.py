"""The gateway: many instances of one ``Environment`` behind one HTTP server.

Agents (or the trainer that drives them) create instances over a small JSON API and talk
to each instance's MCP server over streamable HTTP::

    POST   /instances               {"world": "lars@7" | <world hash>, "mode": "tools"|"meta",
                                     "bare_names": false|true (tools without the service
                                     prefix: AWM's operation_id names),
                                     "task": <task id> (world defaults to the task's),
                                     "agent": <label>, "shell": bool, "answer": bool,
                                     "gui": bool, "max_steps": <OpenEnv step limit>}
                                    -> 201 {id, world_hash, persona, day, mode, mcp_url,
                                            tools (the environment's tool count), task, ...}
    GET    /instances               {"instances": [info, ...]}
    GET    /instances/{id}          info: world, mode, task, calls so far, idle seconds, ...
    POST   /instances/{id}/reset    store the episode, back to the snapshot with a fresh one
                                    -> info + {"stored_episode_id"}
    GET    /instances/{id}/hash     {"hash": <world hash now>, "world_hash": <snapshot>, ...}
    GET    /instances/{id}/diff     the WorldDiff since the snapshot
    GET    /instances/{id}/episode  the Episode so far
    POST   /instances/{id}/shell    {"command": "..."} -> {observation, is_error, exit_code,
                                                          stdout, stderr, ...}
    POST   /instances/{id}/answer   {"text": "..."} -> {id, answer}; a second answer: 409
    POST   /instances/{id}/gui      {"action": "click", "arguments": {...}} -> {observation,
                                     is_error, url, screenshot (digest), image (PNG, base64)}
    GET    /instances/{id}/gui/{path}  the instance's web pages (``Instance.page``), and a
    POST   /instances/{id}/gui/{path}  form's POST (application/x-www-form-urlencoded)
    POST   /instances/{id}/grade    {"task": id (default: the instance's), "answer": text
                                     (default: the answer given)} -> {task_id, V, checks,
                                     reward, errors, answer}
    DELETE /instances/{id}          store its episode, close it, delete its directory
                                    -> 200 {id, episode_id, stored, calls, ...}
    *      /instances/{id}/mcp      the instance's MCP endpoint (streamable HTTP)
    POST   /instances/{id}/openenv/reset  OpenEnv's reset: {"observation", "reward",
    POST   /instances/{id}/openenv/step   "done", "metadata"}; step takes {"action": ...}
    GET    /instances/{id}/openenv/state  {"episode_id", "step_count", "done", ...}
    GET    /tasks                   {"tasks": [{task_id, instruction, world, ...}, ...]}
    GET    /healthz                 {"ok": true, "instances": n, "tasks": n}

Beside its service tools (or ``list_tools``/``call_tool`` in meta mode) an instance's MCP
server has ``shell(command)`` and ``answer(text)`` when enabled: by default both for a
task that declares the shell interface, the answer alone for any other task, neither
without a task. Shell commands run like tool calls (worker thread, lock, timeout) and are
recorded in the episode; the answer is recorded on it (one per episode).

With ``"gui": true`` (the default for a task that declares the gui interface) an instance
also has the GUI tools (``worldenv.gui.tools``: ``gui_open``, ``gui_screenshot``, ``gui_click``,
``gui_type``, ``gui_key``, ``gui_scroll``, ``gui_read``), actions in its own page of the
shared sandboxed browser whose MCP result is the text and the screenshot after it (an
``ImageContent``, PNG); REST's ``/gui`` and OpenEnv's ``{"gui": {"action", "arguments"}}``
do the same. Each runs like a tool call (worker thread, lock, timeout) and is recorded as a
``GuiCall`` with its screenshot's digest. A malformed action (unknown, an argument its
tool does not take or of the wrong type) is a 400 over REST and OpenEnv; one the page
cannot do (no element of that name) is an error result, as over MCP.

Such an instance's pages are served too, for a person's browser or an agent's own, under
``/instances/{id}/gui/``: ``GET /instances/i3-<id>/gui/shop/products/1`` is the instance's
``/shop/products/1``, recorded in the episode (a ``GuiCall`` "request") like every page
request, and a form's POST runs its tool like a tool call. Pages are the instance's bytes,
never rewritten (they are deterministic); they link by absolute paths of their own origin
(``/shop/cart``), so the gateway (1) adds the prefix to a redirect's ``Location`` and (2)
serves pages with ``Referrer-Policy: same-origin``, and answers a request for any path
outside ``/instances`` whose Referer is a page of an instance on the same origin with a
307 to that path under the instance's prefix (a form's POST is sent again there). A link
only works from a browser that sends the Referer (every current one does); the bearer
token, when there is one, must be added by the client (a browser needs a tokenless
loopback gateway or a proxy). A page request from another site (``Sec-Fetch-Site``) is
403: it would write into the episode.

Instances share the gateway's origin, so nothing served for one may act on another: an
instance's id is unguessable (``i3-`` and 128 random bits, the capability in every URL of
the instance: pages, forms, REST, MCP); a page request made by a page (fetch metadata, a
Referer) is served only when that page is one of the same instance's (a person's own
navigation, ``Sec-Fetch-Site: none``, and a program, with neither, are served); and the
JSON API (create, close, reset, shell, answer, grade, GUI actions, MCP, OpenEnv) does not
act on a non-GET request a web page made (``Sec-Fetch-Site`` other than ``none``, or an
``Origin`` header): a form's ``text/plain`` body is valid JSON. JSON answers carry
``nosniff`` and a ``sandbox`` policy, so a browser sent to one renders nothing of it.

Every episode is stored in the world store (``worldenv.instances.episodes.save_episode``) when its
instance is closed (DELETE, idle reaping, shutdown) or reset, unless it has no calls and
no answer; DELETE answers its id, and a closed instance's 404 names it too. An episode's
id is drawn when it starts (the instance is created or reset) and the episode is stored
under it, so the ``episode_id`` in info, ``/episode`` and OpenEnv's reset, step and state
is the stored episode's from the first response on (a client can look it up later without
waiting for the close). Tasks are
injected (``tasks``: ``ServedTask`` by id, built by ``gates.served``: ``envs`` never imports
``gates``); grading runs in a thread, and a task whose world is not the instance's is 409.

The OpenEnv surface follows OpenEnv's HTTP contract (meta-pytorch/OpenEnv
``HTTPEnvServer``: POST /reset, POST /step ``{"action": {...}}``, GET /state, answers
``{"observation", "reward", "done", "metadata"}``) under ``/instances/{id}/openenv``: an
OpenEnv HTTP client given that base URL drives one instance. OpenEnv's own top-level HTTP
endpoints are stateless (a fresh environment per request, sessions only over WebSocket),
which a world cannot be, so the gateway serves only the per-instance form. Actions are
worldenv.serving.gym's (``{"tool": name, "arguments": {...}}``, ``{"shell": command}``, ``{"answer":
text}``) and OpenEnv's MCP actions (``{"type": "call_tool", "tool_name", "arguments"}``,
``{"type": "list_tools"}``); the episode is done after an answer or ``max_steps`` steps,
when a task's instance is graded and the reward is the grade's (0.0 before, and without a
task).

What a model reads through any of these (a shell command's text, the meta-mode catalogue,
a refusal, a timeout) is rendered by ``worldenv.protocol.observation``, as the LLM agent and the RL
loop
render it; OpenEnv's ``list_tools`` observation carries that catalogue's text beside the
tools as data.

Every instance's MCP app (``instance_server(...).http_app()``) runs its lifespan (the
streamable-HTTP session manager) in a task of its own, so instances come and go while the
server runs. Tool calls run in worker threads, one at a time per instance, under a
per-call timeout: a tool that hangs gives the agent the error result "tool call timed out
after N s" and stalls neither the event loop nor other instances (the call itself runs on
and is recorded in the episode when it ends; the instance's next call waits for it).
Opening, resetting, hashing and diffing copy and hash files, so they run in threads too.

Instances idle for ``idle_timeout`` seconds (no REST call on them, no MCP request) are
closed and their directories deleted; at most ``max_instances`` exist at a time, and at
most ``max_gui_instances`` with the GUI (default 32: each holds a browser page, ~75 MiB),
``max_gui_per_client`` of them per client (default 8; a client is the peer address, so
behind a proxy every client is one): beyond a cap a create request is 429 with
``{"error", "cap", "limit"}`` naming it. With a token, every request needs
``Authorization: Bearer <token>``; ``serve`` refuses to listen beyond loopback without
one. Without a token, only requests addressed to a loopback host (and from no or a
loopback ``Origin``) are answered, so web pages cannot reach the gateway through a
browser (DNS rebinding, cross-site requests); put a token on it before putting it behind
a proxy.

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
import base64
import hmac
import ipaddress
import json
import logging
import queue
import re
import secrets
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, get_args
from urllib.parse import parse_qsl, quote, urlsplit

import msgspec
from fastmcp.server.http import StarletteWithLifespan

from replay.errors import IntegrityError
from worldenv.core.contract import ToolResult
from worldenv.errors import GatewayError
from worldenv.gui.site import MAX_FORM_BYTES, PageResponse
from worldenv.gui.tools import GUI_ACTIONS, gui_argument_problem
from worldenv.instances.episodes import save_episode
from worldenv.instances.instance import Environment, GuiResult, Instance
from worldenv.protocol.observation import catalogue, shell_result, timed_out
from worldenv.serving.mcp import Mode, instance_server
from worldstore.errors import ConflictError, NotFoundError, WorldError

if TYPE_CHECKING:
    from replay.engine import Worlds

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
MAX_LABEL = 200  # characters of an agent label
MAX_STEPS = 50  # OpenEnv steps of an episode unless a create request says otherwise
MAX_TARGET = 8192  # characters of a page request's path and query
FORM_TYPE = "application/x-www-form-urlencoded"
_GUI_PAGE = re.compile(r"/instances/([^/?#]+)/gui/")  # a page of an instance, in a Referer
CLOSED_KEPT = 4096  # closed instances remembered (for their stored episode's id)
ID_BYTES = 16  # random bytes in an instance's id: 128 bits, not guessable
# A GUI instance holds a browser page (~75 MiB): at most this many at a time, per client
# (the peer address) and in all; a create request beyond either cap is 429.
MAX_GUI_INSTANCES = 32
MAX_GUI_PER_CLIENT = 8
JSON_HEADERS = [(b"x-content-type-options", b"nosniff"),
                (b"content-security-policy", b"default-src 'none'; sandbox")]
MODES: tuple[str, ...] = get_args(Mode)
log = logging.getLogger("agentworlds.gateway")

Grade = dict[str, Any]
Grader = Callable[[Instance, str | None], Grade]
T = TypeVar("T")


@dataclass(frozen=True)
class ServedTask:
    """A task the gateway serves and grades against. The caller builds it (``envs`` loads
    no tasks and runs no verifiers: ``gates.served`` does). ``grade(instance, answer)``
    runs in a thread and returns ``{"V": 0 | 1, "checks": [{"name", "passed", ...}],
    "reward": float | None, "errors": [...]}``."""

    task_id: str
    instruction: str
    world: str  # persona@day
    world_hash: str
    interfaces: tuple[str, ...]
    grade: Grader

    def brief(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "instruction": self.instruction,
                "world": self.world, "world_hash": self.world_hash,
                "interfaces": list(self.interfaces)}


@dataclass(frozen=True)
class _Setup:
    """What a create request asked for (defaults filled in)."""

    mode: Mode
    task: ServedTask | None = None
    agent: str | None = None
    shell: bool = False
    answer: bool = False
    gui: bool = False
    max_steps: int = MAX_STEPS


class _HttpError(Exception):
    def __init__(self, status: int, message: str,
                 headers: list[tuple[bytes, bytes]] | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or []
        self.extra = extra or {}


# --- one hosted instance ---------------------------------------------------------------


class _Hosted:
    """An instance, its MCP app (lifespan run in a task of its own) and its bookkeeping.
    Every operation on the instance holds `lock`: tool calls and REST calls never overlap."""

    def __init__(self, instance: Instance, setup: _Setup, call_timeout: float,
                 workers: _Workers, worlds: Worlds, client: str = "") -> None:
        # Unguessable: the id is in every URL of the instance (pages, forms, REST, MCP), so
        # knowing it is what it takes to act on the instance; a page served for another
        # instance cannot name it (see _page_source).
        self.id = f"{instance.instance_id}-{secrets.token_hex(ID_BYTES)}"
        self.client = client  # who created it: the per-client GUI cap counts by it
        self.instance = instance
        self.setup = setup
        self.mode = setup.mode
        self.mcp_url = f"/instances/{self.id}/mcp"
        self.gui_url = f"/instances/{self.id}/gui/"  # the instance's pages (when gui)
        self.call_timeout = call_timeout
        self.workers = workers
        self.worlds = worlds
        self.lock = asyncio.Lock()
        self.created = self.last_active = time.monotonic()
        self.calls_total = 0
        self.timeouts = 0
        self.in_flight = 0  # MCP requests other than the long-lived GET event stream
        self.closed = False
        self.steps = 0  # OpenEnv steps since the last reset
        self.done = False  # answered, or the OpenEnv step limit reached
        self.stored: list[str] = []  # episode ids stored from this instance, in order
        self.closing: dict[str, Any] | None = None  # what closing it left
        self._label()
        self.server = instance_server(instance, setup.mode, call=self.call,
                                      shell=self.shell if setup.shell else None,
                                      answer=self.answer if setup.answer else None,
                                      gui=self.gui if setup.gui else None)
        self.app: StarletteWithLifespan | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._jobs: set[asyncio.Task[Any]] = set()

    @property
    def task(self) -> ServedTask | None:
        return self.setup.task

    def touch(self) -> None:
        self.last_active = time.monotonic()

    def info(self) -> dict[str, Any]:
        record = self.instance.record
        episode = self.instance.episode
        now = time.monotonic()
        return {"id": self.id, "world_hash": record.world_hash, "persona": record.persona,
                "day": record.day, "mode": self.mode, "mcp_url": self.mcp_url,
                "bare_names": self.instance.bare_names,
                "tools": len(self.instance.list_tools()),
                "task": self.task.task_id if self.task else None, "agent": self.setup.agent,
                "shell": self.setup.shell, "answer": self.setup.answer,
                "gui": self.setup.gui, "gui_url": self.gui_url if self.setup.gui else None,
                "answered": episode.answer is not None, "done": self.done,
                "steps": self.steps, "max_steps": self.setup.max_steps,
                "episode_id": episode.episode_id, "stored_episodes": list(self.stored),
                "calls": len(episode.calls), "calls_total": self.calls_total,
                "timeouts": self.timeouts, "busy": self.lock.locked(),
                "age_s": round(now - self.created, 3), "idle_s": round(now - self.last_active, 3)}

    def _label(self) -> None:
        """Name the episode's task and agent (a fresh episode after a reset too): they are
        part of what a stored episode holds; and give it the id it will be stored under,
        drawn now because clients are told it before the episode ends (a content id
        exists only then). Random: an instance's counter ("i3") repeats across gateways."""
        self.instance.episode = msgspec.structs.replace(
            self.instance.episode, episode_id=uuid.uuid4().hex,
            task=self.task.task_id if self.task else None, agent=self.setup.agent)

    # --- calls: tools, shell commands, the answer ------------------------------------

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """A tool call (the MCP server's caller)."""
        return await self._timed("tool call", f"tool call {name}",
                                 lambda: self.instance.call_tool(name, arguments),
                                 _tool_failure)

    async def shell(self, command: str) -> ToolResult:
        """One shell command in the workspace, under the same lock and timeout as a tool
        call; its text is what the agent sees, its structured part the ShellCall's."""
        return await self._timed("shell command", "shell command",
                                 lambda: shell_result(self.instance.shell(command)),
                                 _tool_failure)

    async def gui(self, action: str, arguments: dict[str, Any]) -> GuiResult:
        """One GUI action in the instance's browser (``Instance.gui``: recorded in the
        episode with its screenshot's digest), under the same lock and timeout as a tool
        call: the first one starts the browser, each can take up to a second."""
        return await self._timed("GUI action", f"GUI action {action}",
                                 lambda: self.instance.gui(action, arguments),
                                 lambda _status, text: GuiResult(True, text, None, None))

    async def page(self, method: str, target: str, body: bytes
                   ) -> PageResponse | _HttpError:
        """One request of the instance's web pages (``Instance.page``: recorded in the
        episode; a form's tool writes like a tool call), under the lock and timeout of a
        tool call; what went wrong instead of the page when it did not run or failed."""
        return await self._timed("page request", f"page request {method} {target}",
                                 lambda: self.instance.page(method, target, body),
                                 _HttpError)

    async def answer(self, text: str) -> ToolResult:
        """Record the final answer on the episode; a second one is an error result (an
        episode has one answer: reset the instance to start over)."""
        self.touch()
        try:
            async with self.lock:
                if self.closed:
                    return ToolResult(True, f"instance {self.id} is closed")
                if self.instance.episode.answer is not None:
                    return ToolResult(True, "an answer was already given: an episode has one "
                                            "final answer (reset the instance to start over)")
                self.instance.episode = msgspec.structs.replace(self.instance.episode,
                                                                answer=text)
                self.done = True
                return ToolResult(False, "answer recorded")
        finally:
            self.touch()

    async def _timed(self, what: str, label: str, job: Callable[[], T],
                     failed: Callable[[int, str], T]) -> T:
        """Run `job` in a worker thread under the lock, within the call timeout; when it
        cannot give its result, ``failed(status, message)`` (504 timed out, 404 closed,
        400 refused by the library, 500 failed) is what the caller gets."""
        self.touch()
        started = asyncio.Event()
        task = asyncio.ensure_future(self._run(label, job, started, failed))
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)
        try:
            # shield: on timeout a started call runs on (a thread cannot be interrupted)
            # and keeps the instance's lock until it ends; the agent gets its answer now.
            return await asyncio.wait_for(asyncio.shield(task), self.call_timeout)
        except TimeoutError:
            self.timeouts += 1
            message = timed_out(what, self.call_timeout)
            if not started.is_set():  # still waiting for an earlier call: never run it
                task.cancel()
                message += (" (not run: the instance was still busy with an earlier call "
                            "that timed out)")
            return failed(504, message)
        finally:
            self.touch()

    async def _run(self, label: str, job: Callable[[], T], started: asyncio.Event,
                   failed: Callable[[int, str], T]) -> T:
        async with self.lock:
            started.set()
            if self.closed:
                return failed(404, f"instance {self.id} is closed")
            self.calls_total += 1
            try:
                result: T = await asyncio.wrap_future(self.workers.submit(job))
                return result
            except WorldError as exc:
                return failed(_status_of(exc), str(exc))
            except Exception as exc:
                log.exception("%s on instance %s failed", label, self.id)
                return failed(500, f"{label} failed: {type(exc).__name__}: {exc}")

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

    def reset(self) -> str | None:
        """(In a thread, under the lock.) Store the episode so far, then back to the
        snapshot with a fresh, labelled episode; the stored episode's id, if any."""
        stored = self._store()
        self.instance.reset()
        self._label()
        self.steps, self.done = 0, False
        return stored

    def _store(self) -> str | None:
        episode = self.instance.episode
        if not episode.calls and episode.answer is None:
            return None  # nothing happened: an empty episode is not worth a row
        # Stored as a bare Episode, which keeps the id clients were given (an instance's
        # would be renamed to its content id); its final hash is the instance's now.
        episode_id = save_episode(self.worlds, msgspec.structs.replace(
            episode, final_hash=self.instance.hash()))
        self.stored.append(episode_id)
        return episode_id

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

    async def close(self) -> dict[str, Any]:
        """Stop the MCP app (ends its sessions), wait for a running call, store the
        episode, delete the instance; what was stored. Call it after unpublishing the
        instance."""
        self._stop.set()
        if self._task is not None:
            try:
                await self._task
            except Exception:
                log.exception("MCP app of instance %s failed while stopping", self.id)
        async with self.lock:
            if not self.closed:
                self.closed = True
                self.closing = await asyncio.to_thread(self._store_and_close)
        assert self.closing is not None
        return self.closing

    def _store_and_close(self) -> dict[str, Any]:
        closing: dict[str, Any] = {"id": self.id, "closed": True,
                                   "calls": len(self.instance.episode.calls)}
        try:
            episode_id = self._store()
        except Exception as exc:  # the instance is deleted all the same
            log.exception("could not store the episode of instance %s", self.id)
            closing |= {"episode_id": None, "stored": False,
                        "error": f"the episode could not be stored: {type(exc).__name__}: "
                                 f"{exc}"}
        else:
            closing |= {"episode_id": episode_id, "stored": episode_id is not None}
            if episode_id is None:
                closing["reason"] = "the episode has no calls and no answer: not stored"
        finally:
            self.instance.close()
        closing["stored_episodes"] = list(self.stored)
        return closing


def _tool_failure(_status: int, message: str) -> ToolResult:
    return ToolResult(True, message)


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


# REST actions on one instance -> the Gateway method that answers them.
_ACTIONS = {"": "_at_instance", "reset": "_reset", "hash": "_hash", "diff": "_diff",
            "episode": "_episode", "shell": "_shell", "answer": "_answer", "grade": "_grade",
            "gui": "_gui"}
_CREATE_FIELDS = ("world", "mode", "bare_names", "task", "agent", "shell", "answer", "gui",
                  "max_steps")
_CREATE_SHAPE = ('{"world": "persona@day" or a world hash, "mode": "tools" or "meta", '
                 '"bare_names": true or false, "task": "<task id>", "agent": "<label>", '
                 '"shell": true or false, "answer": true or false, "gui": true or false, '
                 '"max_steps": <int>}')
_GUI_SHAPE = ('{"action": "open" | "screenshot" | "click" | "type" | "key" | "scroll" | '
              '"read", "arguments": {...} (those of the gui_ tool of that name)}')


class Gateway:
    """A raw ASGI app serving instances of one environment (REST + MCP); see the module
    docstring. Run it with ``serve`` or any ASGI server with lifespan support, once: its
    shutdown closes every instance and its tool threads.

    `mode` is the MCP surface of instances created without one; `workers` caps the threads
    that run tool calls (default ``min(64, max_instances)``); `reap_interval` is how often
    idle instances are looked for (default a quarter of `idle_timeout`, at most 5 s).
    `tasks` (by task id) are what instances can be created for and graded against;
    `max_steps` is the OpenEnv step limit of instances created without one;
    `max_gui_instances` and `max_gui_per_client` cap the instances with the GUI (each holds
    a browser page) in all and per client (the peer address)."""

    def __init__(self, environment: Environment, *, token: str | None = None,
                 max_instances: int = 256, idle_timeout: float = 600.0,
                 call_timeout: float = 30.0, mode: Mode = "tools",
                 reap_interval: float | None = None, workers: int | None = None,
                 tasks: Mapping[str, ServedTask] | None = None,
                 max_steps: int = MAX_STEPS, max_gui_instances: int = MAX_GUI_INSTANCES,
                 max_gui_per_client: int = MAX_GUI_PER_CLIENT) -> None:
        if token is not None and not token.strip():
            raise GatewayError("the bearer token is empty: give a real token or none")
        if max_instances < 1:
            raise GatewayError(f"max_instances must be at least 1, not {max_instances}")
        if idle_timeout <= 0 or call_timeout <= 0:
            raise GatewayError("idle_timeout and call_timeout must be positive seconds")
        if mode not in MODES:
            raise GatewayError(f"unknown MCP mode {mode!r}: use 'tools' or 'meta'")
        if max_steps < 1:
            raise GatewayError(f"max_steps must be at least 1, not {max_steps}")
        if max_gui_instances < 1 or max_gui_per_client < 1:
            raise GatewayError("max_gui_instances and max_gui_per_client must be at least 1, "
                               f"not {max_gui_instances} and {max_gui_per_client}")
        self.max_gui_instances = max_gui_instances
        self.max_gui_per_client = max_gui_per_client
        self._gui_clients: dict[str, int] = {}  # GUI instances (made or being made) by client
        self.environment = environment
        self.tasks: dict[str, ServedTask] = dict(tasks or {})
        self.max_steps = max_steps
        self.closed: dict[str, dict[str, Any]] = {}  # the last CLOSED_KEPT closed instances
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
        self._closing: set[asyncio.Task[dict[str, Any]]] = set()

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
            if self._token is None and not from_loopback(scope):
                raise _HttpError(403, "without a token the gateway only answers requests "
                                      "for a loopback host from no or a loopback origin "
                                      "(DNS-rebinding and cross-site protection)")
            await self._route(scope, receive, send)
        except _HttpError as exc:
            await _send_json(send, exc.status, {"error": exc.message, **exc.extra},
                             exc.headers)
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
        path: str = scope["path"]
        parts = path.strip("/").split("/")
        if path == "/favicon.ico":  # a browser asks for it on every page: none, no episode
            _allow(method, "GET", "HEAD")
            await _send(send, 204, b"", b"", [(b"cache-control", b"max-age=86400")])
            return
        if parts[0] != "instances" and (iid := _linked_from_page(scope)) is not None:
            # A page's own link (/shop/cart) followed in a person's browser: the same
            # request, under the prefix of the instance whose page it came from.
            await _redirect_to_page(send, iid, path, scope)
            return
        if parts == ["healthz"]:
            _allow(method, "GET")
            await _send_json(send, 200, {"ok": True, "instances": len(self.instances),
                                         "tasks": len(self.tasks)})
            return
        if parts == ["tasks"]:
            _allow(method, "GET")
            await _send_json(send, 200, {"tasks": [t.brief() for t in self.tasks.values()]})
            return
        if parts[0] != "instances":
            raise _HttpError(404, f"no such endpoint: {_shown(scope['path'])}")
        if len(parts) == 1:
            if _allow(method, "GET", "POST") == "GET":
                await _send_json(send, 200, {"instances": [h.info() for h in
                                                           self.instances.values()]})
            else:
                _not_from_a_page(scope)
                hosted = await self._create(receive, _client(scope))
                await _send_json(send, 201, hosted.info())
            return
        hosted = self._hosted(parts[1])
        action = "/".join(parts[2:])
        if path.startswith(hosted.gui_url):  # the instance's pages: /instances/ID/gui/...
            await self._page(hosted, path.removeprefix(hosted.gui_url[:-1]), scope, receive,
                             send)
            return
        if method not in ("GET", "HEAD"):  # the JSON API acts for programs, not pages
            _not_from_a_page(scope)
        if parts[2:3] == ["mcp"]:
            await self._mcp(hosted, scope, receive, send)
        elif action.startswith("openenv/"):
            await self._openenv(hosted, action.removeprefix("openenv/"), scope, receive,
                                send)
        elif action in _ACTIONS:
            handler = getattr(self, _ACTIONS[action])
            await handler(hosted, method, receive, send)
        else:
            raise _HttpError(404, f"no such endpoint: {_shown(scope['path'])}")

    def _hosted(self, iid: str) -> _Hosted:
        found = self.instances.get(iid)
        if found is not None:
            return found
        closed = self.closed.get(iid)
        if closed is None:
            raise _HttpError(404, f"no instance {_shown(iid)} (closed, reaped or never "
                                  "created)")
        stored = (f"its episode was stored as {closed['episode_id']}"
                  if closed.get("episode_id") else "its episode was not stored")
        raise _HttpError(404, f"instance {iid} was closed: {stored}", extra={"closed": closed})

    # --- REST on one instance ---------------------------------------------------------

    async def _at_instance(self, hosted: _Hosted, method: str, receive: Receive,
                           send: Send) -> None:
        if _allow(method, "GET", "DELETE") == "GET":
            hosted.touch()
            await _send_json(send, 200, hosted.info())
            return
        if self._unpublish(hosted.id) is None:  # closed meanwhile
            raise _HttpError(404, f"instance {hosted.id} was closed")
        await _send_json(send, 200, await self._close(hosted))

    async def _reset(self, hosted: _Hosted, method: str, receive: Receive,
                     send: Send) -> None:
        _allow(method, "POST")
        stored = await hosted.run_locked(hosted.reset)
        await _send_json(send, 200, {**hosted.info(), "stored_episode_id": stored})

    async def _hash(self, hosted: _Hosted, method: str, receive: Receive, send: Send) -> None:
        _allow(method, "GET")
        now = await hosted.run_locked(hosted.instance.hash)
        world = hosted.instance.record.world_hash
        await _send_json(send, 200, {"id": hosted.id, "hash": now, "world_hash": world,
                                     "changed": now != world})

    async def _diff(self, hosted: _Hosted, method: str, receive: Receive, send: Send) -> None:
        _allow(method, "GET")
        instance = hosted.instance
        await _send(send, 200, await hosted.run_locked(
            lambda: msgspec.json.encode(instance.diff())))

    async def _episode(self, hosted: _Hosted, method: str, receive: Receive,
                       send: Send) -> None:
        _allow(method, "GET")
        instance = hosted.instance
        await _send(send, 200, await hosted.run_locked(lambda: instance.episode.to_json()))

    async def _shell(self, hosted: _Hosted, method: str, receive: Receive,
                     send: Send) -> None:
        _allow(method, "POST")
        request = _fields(_json_body(await _read_body(receive)), ("command",),
                          '{"command": "<one bash command>"}')
        command = _text(request.get("command"), "command")
        _enabled(hosted, "shell")
        result = await hosted.shell(command)
        await _send_json(send, 200, {"observation": result.text, "is_error": result.is_error,
                                     **(result.structured or {})})

    async def _answer(self, hosted: _Hosted, method: str, receive: Receive,
                      send: Send) -> None:
        _allow(method, "POST")
        request = _fields(_json_body(await _read_body(receive)), ("text",),
                          '{"text": "<the final answer>"}')
        text = _text(request.get("text"), "text", empty=True)
        _enabled(hosted, "answer")
        result = await hosted.answer(text)
        if result.is_error:
            raise _HttpError(409, result.text)
        await _send_json(send, 200, {"id": hosted.id, "answer": text})

    async def _gui(self, hosted: _Hosted, method: str, receive: Receive, send: Send) -> None:
        if method == "GET":
            raise _HttpError(405, f"method GET not allowed here (use POST with {_GUI_SHAPE}; "
                                  f"the instance's pages are at {hosted.gui_url})",
                             [(b"allow", b"POST")])
        _allow(method, "POST")
        request = _fields(_json_body(await _read_body(receive)), ("action", "arguments"),
                          _GUI_SHAPE)
        action, arguments = _gui_action(request)
        _enabled(hosted, "gui")
        result = await hosted.gui(action, arguments)
        await _send_json(send, 200, {"observation": result.text, "action": action,
                                     **_gui_observation(result)})

    async def _page(self, hosted: _Hosted, target: str, scope: Scope, receive: Receive,
                    send: Send) -> None:
        """One request of the instance's pages (GET, or a form's POST), answered as the
        instance answers it: its status, body and headers, but for a redirect's Location,
        which gets the instance's prefix, and the Referrer-Policy (see _linked_from_page)."""
        method = _allow(scope["method"], "GET", "POST")
        _same_origin_fetch(scope)
        _page_source(scope, hosted.id)
        query = bytes(scope.get("query_string", b""))
        target = quote(target, safe="/:@!$&'()*+,;=-._~") + (
            "?" + query.decode("latin-1") if query else "")
        if len(target) > MAX_TARGET:
            raise _HttpError(414, f"the page's path and query are over {MAX_TARGET} "
                                  "characters")
        _utf8_form(query, "the query")
        body = await _read_body(receive, MAX_FORM_BYTES)
        if method == "GET" and body:
            raise _HttpError(400, "a GET of a page has no body (a form posts its fields)")
        if method == "POST":
            kind = _header(scope, b"content-type") or ""
            if kind.partition(";")[0].strip().lower() != FORM_TYPE:
                raise _HttpError(415, f"a form posts {FORM_TYPE}, not "
                                      f"{_shown(kind or 'no content type')} (a GUI action "
                                      f"is POST /instances/{hosted.id}/gui, JSON)")
            _utf8_form(body, "the form body")
        _enabled(hosted, "gui")
        response = await hosted.page(method, target, body)
        if isinstance(response, _HttpError):
            raise response
        headers = []
        for name, value in response.headers():
            if name == "Location":  # a path of the instance's origin: under its prefix
                value = quote(hosted.gui_url[:-1] + value if value.startswith("/") else value,
                              safe="/?#&=%:@!$'()*+,;-._~")
            elif name == "Referrer-Policy":
                value = "same-origin"
            headers.append((name.lower().encode("latin-1"), value.encode("latin-1")))
        await _send(send, response.status, response.body, b"", headers)

    async def _grade(self, hosted: _Hosted, method: str, receive: Receive,
                     send: Send) -> None:
        _allow(method, "POST")
        request = _fields(_json_body(await _read_body(receive)), ("task", "answer"),
                          '{"task": "<task id>" (default: the instance\'s), "answer": '
                          '"<text>" (default: the answer given)}')
        task_id = request.get("task", hosted.task.task_id if hosted.task else None)
        if task_id is None:
            raise _HttpError(400, f"instance {hosted.id} was created without a task: name "
                                  'one, {"task": "<task id>"}')
        task = self._task(task_id)
        answer = request.get("answer", hosted.instance.episode.answer)
        if answer is not None:
            answer = _text(answer, "answer", empty=True)
        await _send_json(send, 200, await self._graded(hosted, task, answer))

    async def _graded(self, hosted: _Hosted, task: ServedTask, answer: str | None
                      ) -> dict[str, Any]:
        """V(W0, W, answer) of the instance as it is now (in a thread: the verifier copies
        and hashes files and runs in a subprocess)."""
        world = hosted.instance.record.world_hash
        if world != task.world_hash:
            raise _HttpError(409, f"instance {hosted.id} is world {world}, but task "
                                  f"{task.task_id} starts from {task.world} "
                                  f"({task.world_hash}): create an instance of the task's "
                                  'world ({"task": "' + task.task_id + '"})')
        instance = hosted.instance
        grade: Grade = await hosted.run_locked(lambda: task.grade(instance, answer))
        return {"task_id": task.task_id, "answer": answer, **grade}

    def _task(self, value: object) -> ServedTask:
        if not isinstance(value, str):
            raise _HttpError(400, f"task must be a task id (a string), not {_shown(value)}")
        if not self.tasks:
            raise _HttpError(404, f"no task {_shown(value)}: this gateway serves no tasks "
                                  "(start it with worldctl serve --tasks DIR|PACK)")
        task = self.tasks.get(value)
        if task is None:
            names = sorted(self.tasks)
            listed = ", ".join(names[:10]) + (f" and {len(names) - 10} more"
                                              if len(names) > 10 else "")
            raise _HttpError(404, f"no task {_shown(value)} (served: {listed}; GET /tasks)")
        return task

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

    # --- OpenEnv: reset / step / state of one instance ----------------------------------

    async def _openenv(self, hosted: _Hosted, op: str, scope: Scope, receive: Receive,
                       send: Send) -> None:
        method: str = scope["method"]
        if op == "reset":
            _allow(method, "POST")
            request = _fields(_json_body(await _read_body(receive)), ("seed", "episode_id"),
                              '{"seed": <int> (ignored: worlds are deterministic), '
                              '"episode_id": <string> (ignored: the gateway draws the '
                              "ids episodes are stored under)}")
            _openenv_reset_fields(request)
            stored = await hosted.run_locked(hosted.reset)
            await _send_json(send, 200, {
                "observation": _first_observation(hosted), "reward": None, "done": False,
                "metadata": {"step": 0, "episode_id": hosted.instance.episode.episode_id,
                             "stored_episode_id": stored}})
        elif op == "step":
            _allow(method, "POST")
            request = _fields(_json_body(await _read_body(receive)),
                              ("action", "timeout_s", "request_id"),
                              '{"action": {"tool": NAME, "arguments": {...}} | {"shell": '
                              'COMMAND} | {"gui": {"action": ACTION, "arguments": {...}}} | '
                              '{"answer": TEXT} | {"type": "call_tool", "tool_name": NAME, '
                              '"arguments": {...}} | {"type": "list_tools"}}')
            await _send_json(send, 200, await self._step(hosted, _action(
                request.get("action"))))
        elif op == "state":
            _allow(method, "GET")
            hosted.touch()
            episode = hosted.instance.episode
            await _send_json(send, 200, {
                "episode_id": episode.episode_id, "step_count": hosted.steps,
                "done": hosted.done, "max_steps": hosted.setup.max_steps,
                "task": episode.task, "agent": episode.agent, "answer": episode.answer,
                "calls": len(episode.calls), "world_hash": episode.world_hash})
        else:
            raise _HttpError(404, f"no such endpoint: {_shown(scope['path'])} (OpenEnv: "
                                  "openenv/reset, openenv/step, openenv/state)")

    async def _step(self, hosted: _Hosted, action: _Action) -> dict[str, Any]:
        if hosted.done:
            raise _HttpError(409, f"the episode of instance {hosted.id} is done (answered "
                                  "or at its step limit): POST "
                                  f"/instances/{hosted.id}/openenv/reset to start another")
        kind, value, arguments = action
        if kind in ("shell", "answer", "gui"):
            _enabled(hosted, kind)
        hosted.steps += 1
        observation: dict[str, Any]
        if kind == "list_tools":  # the catalogue's text too: what an agent shows a model
            infos = hosted.instance.list_tools()
            observation = {"tools": [
                {"name": t.name, "description": t.description, "input_schema": t.input_schema}
                for t in infos], "text": catalogue(infos)}
        elif kind == "tool":
            result = await hosted.call(value, arguments)
            observation = {"text": result.text, "is_error": result.is_error}
        elif kind == "shell":
            result = await hosted.shell(value)
            observation = {"text": result.text, "is_error": result.is_error,
                           **(result.structured or {})}
        elif kind == "gui":
            shown = await hosted.gui(value, arguments)
            observation = {"text": shown.text, "action": value, **_gui_observation(shown)}
        else:
            result = await hosted.answer(value)
            if result.is_error:  # answered meanwhile (over MCP or REST)
                raise _HttpError(409, result.text)
            observation = {"answer": value}
        truncated = not hosted.done and hosted.steps >= hosted.setup.max_steps
        hosted.done = hosted.done or truncated
        metadata: dict[str, Any] = {"step": hosted.steps, "truncated": truncated,
                                    "episode_id": hosted.instance.episode.episode_id}
        reward: float | None = 0.0
        if hosted.done and hosted.task is not None:
            graded = await self._graded(hosted, hosted.task, hosted.instance.episode.answer)
            metadata["grade"] = graded
            reward = graded["reward"]
        return {"observation": observation, "reward": reward, "done": hosted.done,
                "metadata": metadata}

    # --- instances --------------------------------------------------------------------

    async def _create(self, receive: Receive, client: str) -> _Hosted:
        request = _fields(_json_body(await _read_body(receive)), _CREATE_FIELDS,
                          _CREATE_SHAPE)
        setup, world, bare_names = self._setup(request)
        if len(self.instances) + self._pending >= self.max_instances:
            raise _HttpError(429, f"the gateway already holds its maximum of "
                                  f"{self.max_instances} instances: DELETE one, or wait for "
                                  "idle ones to be reaped", [(b"retry-after", b"5")],
                             {"cap": "max_instances", "limit": self.max_instances})
        if setup.gui:
            self._count_gui(client)
        self._pending += 1
        published = False
        try:
            try:
                hosted = await asyncio.to_thread(self._open, world, setup, bare_names,
                                                 client)
            except WorldError as exc:
                raise _HttpError(_status_of(exc), str(exc)) from None
            try:
                await hosted.start()
            except BaseException:
                await asyncio.to_thread(hosted.instance.close)
                raise
            self.instances[hosted.id] = hosted
            published = True
        finally:
            self._pending -= 1
            if setup.gui and not published:
                self._uncount_gui(client)
        return hosted

    def _count_gui(self, client: str) -> None:
        """Count a GUI instance of `client` about to be made, or refuse it (429) when the
        gateway or the client holds its cap of them: each holds a browser page."""
        held = sum(self._gui_clients.values())
        mine = self._gui_clients.get(client, 0)
        for cap, limit, count, whose in (
                ("max_gui_per_client", self.max_gui_per_client, mine, "this client holds"),
                ("max_gui_instances", self.max_gui_instances, held, "the gateway holds")):
            if count >= limit:
                raise _HttpError(429, f"{whose} its maximum of {limit} instances with the GUI "
                                      f"({cap}): DELETE one, or wait for idle ones to be "
                                      "reaped", [(b"retry-after", b"5")],
                                 {"cap": cap, "limit": limit})
        self._gui_clients[client] = mine + 1

    def _uncount_gui(self, client: str) -> None:
        left = self._gui_clients.get(client, 0) - 1
        if left > 0:
            self._gui_clients[client] = left
        else:
            self._gui_clients.pop(client, None)

    def _unpublish(self, iid: str) -> _Hosted | None:
        """Take an instance out of the served ones (it is closed next); None if it was."""
        hosted = self.instances.pop(iid, None)
        if hosted is not None and hosted.setup.gui:
            self._uncount_gui(hosted.client)
        return hosted

    def _setup(self, request: dict[str, Any]) -> tuple[_Setup, str, bool | None]:
        """A create request's setup, world reference and bare_names, checked."""
        task = self._task(request["task"]) if "task" in request else None
        if "world" in request or task is None:
            world = _world_ref(request.get("world"))
        else:
            world = task.world_hash  # the task's world, whatever its persona@day is called
        agent = request.get("agent")
        if agent is not None:
            agent = _text(agent, "agent", limit=MAX_LABEL)
        max_steps = request.get("max_steps", self.max_steps)
        if not isinstance(max_steps, int) or isinstance(max_steps, bool) or not (
                1 <= max_steps <= 1_000_000):
            raise _HttpError(400, f"max_steps must be an integer from 1 to 1000000, not "
                                  f"{_shown(max_steps)}")
        setup = _Setup(
            mode=_mode(request.get("mode", self.mode)), task=task, agent=agent,
            shell=_flag(request, "shell", task is not None and "shell" in task.interfaces),
            answer=_flag(request, "answer", task is not None),
            gui=_flag(request, "gui", task is not None and "gui" in task.interfaces),
            max_steps=max_steps)
        bare_names = request.get("bare_names")
        if bare_names is not None and not isinstance(bare_names, bool):
            raise _HttpError(400, f"bare_names must be true or false, not {_shown(bare_names)}")
        return setup, world, bare_names

    def _open(self, world: str, setup: _Setup, bare_names: bool | None = None,
              client: str = "") -> _Hosted:
        # One open at a time: a first open may build and cache the snapshot.
        with self._open_lock:
            instance = self.environment.open(world, bare_names=bare_names)
        try:
            task = setup.task
            if task is not None and instance.record.world_hash != task.world_hash:
                raise _HttpError(409, f"{world} is world {instance.record.world_hash}, but "
                                      f"task {task.task_id} starts from {task.world} "
                                      f"({task.world_hash}): leave out \"world\" to get the "
                                      "task's")
            try:
                return _Hosted(instance, setup, self.call_timeout, self._workers,
                               self.environment.worlds, client)
            except ValueError as exc:  # a service tool named like an agent tool
                raise _HttpError(409, str(exc)) from None
        except BaseException:
            instance.close()
            raise

    async def _close(self, hosted: _Hosted) -> dict[str, Any]:
        """Close an unpublished instance, storing its episode; remember what it left."""
        closing = await hosted.close()
        self.closed[hosted.id] = closing
        while len(self.closed) > CLOSED_KEPT:
            del self.closed[next(iter(self.closed))]
        if closing.get("episode_id"):
            log.info("instance %s closed: episode %s stored", hosted.id,
                     closing["episode_id"])
        return closing

    def _discard(self, iid: str) -> None:
        """Unpublish an instance now and close it in the background."""
        hosted = self._unpublish(iid)
        if hosted is not None:
            task = asyncio.create_task(self._close(hosted), name=f"close-{iid}")
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


def _fields(request: dict[str, Any], allowed: tuple[str, ...], shape: str) -> dict[str, Any]:
    """Refuse a body field the endpoint does not know (a typo must not pass unseen)."""
    unknown = sorted(set(request) - set(allowed))
    if unknown:
        raise _HttpError(400, f"unknown field(s) {', '.join(_shown(u) for u in unknown[:5])}: "
                              f"the body is {shape}")
    return request


def _text(value: object, name: str, *, empty: bool = False, limit: int | None = None
          ) -> str:
    if not isinstance(value, str) or (not empty and not value.strip()):
        raise _HttpError(400, f"{name} must be a{'' if empty else ' non-empty'} string, not "
                              f"{_shown(value)}")
    if limit is not None and len(value) > limit:
        raise _HttpError(400, f"{name} is over {limit} characters")
    return value


def _flag(request: dict[str, Any], name: str, default: bool) -> bool:
    value = request.get(name, default)
    if not isinstance(value, bool):
        raise _HttpError(400, f"{name} must be true or false, not {_shown(value)}")
    return value


def _enabled(hosted: _Hosted, tool: str) -> None:
    """Refuse the shell, the answer or the GUI on an instance created without it."""
    if not getattr(hosted.setup, tool):
        what = "the GUI (its pages and the gui_ tools)" if tool == "gui" else f"the {tool} tool"
        raise _HttpError(409, f"instance {hosted.id} was created without {what} "
                              f'(create one with "{tool}": true, or for a task that has it)')


def _gui_action(request: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A GUI action's name and arguments, checked against its gui_ tool's schema (the
    fields, their types and the required ones): a malformed action is refused before it
    reaches the browser. Whether it can be done on the page (an element of that name, a
    URL of the instance) is the action's result."""
    action = request.get("action")
    if not isinstance(action, str) or action not in GUI_ACTIONS:
        raise _HttpError(400, f"unknown GUI action {_shown(action)}: use one of "
                              f"{', '.join(GUI_ACTIONS)}")
    arguments = request.get("arguments", {})
    if not isinstance(arguments, dict):
        raise _HttpError(400, f"the arguments of a GUI action must be an object, not "
                              f"{_shown(arguments)}")
    problem = gui_argument_problem(action, arguments)
    if problem is not None:
        raise _HttpError(400, problem)
    return action, arguments


def _gui_observation(result: GuiResult) -> dict[str, Any]:
    """A GUI action's result over REST and OpenEnv: whether it failed, the page it ended
    on, the screenshot's digest and the screenshot (PNG, base64)."""
    return {"is_error": result.is_error, "url": result.url, "screenshot": result.screenshot,
            "image": base64.b64encode(result.image).decode("ascii")
            if result.image is not None else None, "mime_type": "image/png"}


# An OpenEnv action: (kind, the tool name / command / answer, a tool's arguments).
_Action = tuple[str, str, dict[str, Any]]
_ACTION_KEYS: dict[str, tuple[str, ...]] = {  # every form also takes OpenEnv's "metadata"
    "tool": ("tool", "arguments"), "shell": ("shell",), "answer": ("answer",), "gui": ("gui",),
    "call_tool": ("type", "tool_name", "arguments"), "list_tools": ("type",)}


def _action(value: object) -> _Action:
    """A step's action: ours (tool / shell / answer, as worldenv.serving.gym takes) or OpenEnv's MCP
    actions (``{"type": "call_tool" | "list_tools", ...}``)."""
    if not isinstance(value, dict):
        raise _HttpError(400, 'the body needs "action": an object such as {"tool": NAME, '
                              '"arguments": {...}}, {"shell": COMMAND}, {"gui": {"action": '
                              'ACTION, "arguments": {...}}} or {"answer": TEXT}')
    kinds = [k for k in ("tool", "shell", "gui", "answer") if k in value]
    kind = value.get("type") if not kinds else kinds[0]
    if len(kinds) > 1 or kind not in _ACTION_KEYS or (kinds and "type" in value):
        raise _HttpError(400, f"action {_shown(value)}: give exactly one of tool, shell, gui "
                              'or answer (or "type": "call_tool" / "list_tools")')
    _fields(value, (*_ACTION_KEYS[kind], "metadata"), f"a {kind} action")
    arguments = value.get("arguments", {})
    if not isinstance(arguments, dict):
        raise _HttpError(400, f"action arguments must be an object, not {_shown(arguments)}")
    if kind == "list_tools":
        return "list_tools", "", {}
    if kind in ("tool", "call_tool"):
        return "tool", _text(value.get("tool", value.get("tool_name")), "tool name"), arguments
    if kind == "gui":
        gui = value["gui"]
        if not isinstance(gui, dict):
            raise _HttpError(400, f"a gui action is {{\"gui\": {_GUI_SHAPE}}}, not "
                                  f"{_shown(gui)}")
        return ("gui", *_gui_action(_fields(gui, ("action", "arguments"), _GUI_SHAPE)))
    return kind, _text(value[kind], kind, empty=kind == "answer"), {}


def _openenv_reset_fields(request: dict[str, Any]) -> None:
    seed = request.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise _HttpError(400, f"seed must be an integer or null, not {_shown(seed)}")
    episode_id = request.get("episode_id")
    if episode_id is not None:
        _text(episode_id, "episode_id", limit=255)


def _first_observation(hosted: _Hosted) -> dict[str, Any]:
    task = hosted.task
    return {"instruction": task.instruction if task else None,
            "task": task.task_id if task else None,
            "tools": [t.name for t in hosted.instance.list_tools()],
            "shell": hosted.setup.shell, "answer": hosted.setup.answer,
            "gui": hosted.setup.gui, "world_hash": hosted.instance.record.world_hash,
            "max_steps": hosted.setup.max_steps}


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
    # Data, never a document: a browser sent here renders nothing of it and sniffs nothing.
    await _send(send, status, msgspec.json.encode(data), headers=[*JSON_HEADERS,
                                                                  *(headers or [])])


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


def from_loopback(scope: Scope) -> bool:
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


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if bytes(key) == name:
            return bytes(value).decode("latin-1")
    return None


def _linked_from_page(scope: Scope) -> str | None:
    """The instance whose page a request came from, when its Referer is a page of an
    instance on this same origin (the gateway serves pages with ``Referrer-Policy:
    same-origin`` so that a browser says so).

    Pages link by absolute paths of their own origin (``/shop/cart``, the font at
    ``/_static/...``): rewriting them under the instance's prefix would change the bytes
    a page is, so the gateway instead answers such a request, made from one of its pages,
    with a redirect to the same path under that instance's prefix (307: a form's POST
    is sent again there). A request without such a Referer is the gateway's own."""
    referer = _header(scope, b"referer")
    if not referer:
        return None
    parts = urlsplit(referer)
    found = _GUI_PAGE.match(parts.path)
    if found is None or parts.netloc.lower() != (_header(scope, b"host") or "").lower():
        return None
    return found.group(1)


async def _redirect_to_page(send: Send, iid: str, path: str, scope: Scope) -> None:
    query = bytes(scope.get("query_string", b"")).decode("latin-1")
    location = f"/instances/{quote(iid, safe='')}/gui{quote(path, safe='/')}" + (
        f"?{query}" if query else "")
    if len(location) > MAX_TARGET:
        raise _HttpError(414, f"the page's path and query are over {MAX_TARGET} characters")
    await _send(send, 307, b"", b"text/plain; charset=utf-8",
                [(b"location", location.encode("latin-1")),
                 (b"cache-control", b"no-store")])


def _client(scope: Scope) -> str:
    """Who made a request, for the per-client caps: the peer address the server saw."""
    peer = scope.get("client")
    return str(peer[0]) if peer else ""


def _made_by_a_page(scope: Scope) -> bool:
    """Whether a web page made this request, rather than a program or a person's own
    navigation: fetch metadata says so (``Sec-Fetch-Site`` other than ``none``), or, from
    a browser without it, an ``Origin`` header (sent on every POST a page makes)."""
    site = _header(scope, b"sec-fetch-site")
    if site is not None:
        return site.strip().lower() != "none"
    return _header(scope, b"origin") is not None


def _not_from_a_page(scope: Scope) -> None:
    """Refuse a change (create, reset, shell, answer, grade, close, GUI action, MCP,
    OpenEnv) that a web page asked for: a page served for one instance could otherwise
    drive the JSON API of any (a form's text/plain body is valid JSON)."""
    if _made_by_a_page(scope):
        raise _HttpError(403, "the JSON API does not act on a request a web page made (a "
                              "program calls it, with no Sec-Fetch-Site or Origin header)")


def _page_source(scope: Scope, iid: str) -> None:
    """Refuse a request of an instance's pages that a page of another instance made: a
    page a browser shows may only lead to its own instance. A person's own navigation
    (typed, bookmarked: ``Sec-Fetch-Site: none``) and a program (no fetch metadata, no
    Referer) may open any instance they know the id of; a page's request names its page
    in the Referer (pages are served with ``Referrer-Policy: same-origin``), which must be
    a page of this instance."""
    site = (_header(scope, b"sec-fetch-site") or "").strip().lower()
    if site == "none":
        return
    referer = _header(scope, b"referer")
    source = _GUI_PAGE.match(urlsplit(referer).path) if referer else None
    if source is not None and source.group(1) == iid:
        return
    if source is not None or site or referer or _header(scope, b"origin") is not None:
        raise _HttpError(403, "a page of an instance is only served to that instance's own "
                              "pages (this request was made by another page: "
                              f"{_shown(referer or 'no Referer')})")


def _same_origin_fetch(scope: Scope) -> None:
    """Refuse a page request a browser made for another site (``Sec-Fetch-Site``: an
    image of another site's page pointing here): every page request is recorded in the
    instance's episode, so only the person's own navigation may make one."""
    site = _header(scope, b"sec-fetch-site")
    if site is not None and site.lower() not in ("same-origin", "none"):
        raise _HttpError(403, f"a page of an instance is not served to a request from "
                              f"another site (Sec-Fetch-Site: {_shown(site)})")


def _utf8_form(data: bytes, what: str) -> None:
    """Refuse a query or form body that is not UTF-8 form encoding."""
    try:
        parse_qsl(data.decode("utf-8"), keep_blank_values=True, errors="strict")
    except UnicodeDecodeError:
        raise _HttpError(400, f"{what} is not UTF-8 form encoding") from None


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
