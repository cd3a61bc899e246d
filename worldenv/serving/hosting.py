"""Instances hosted by the gateway: each ``Hosted`` holds an ``Instance``, its MCP app
(whose lifespan runs in a task of its own, so instances come and go while the server
runs) and its bookkeeping; ``Hosting`` holds them all: their unguessable ids, the caps
(instances in all, GUI instances in all and per client), idle reaping, closing (every
episode stored), the tasks served and grading.

Tool calls run in worker threads, one at a time per instance, under a per-call timeout:
a tool that hangs gives the agent the error result "tool call timed out after N s" and
stalls neither the event loop nor other instances (the call itself runs on and is
recorded in the episode when it ends; the instance's next call waits for it). Opening,
resetting, hashing and diffing copy and hash files, so they run in threads too."""

from __future__ import annotations

import asyncio
import logging
import queue
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, get_args

import msgspec
from fastmcp.server.http import StarletteWithLifespan
from starlette.requests import HTTPConnection

from worldenv.core.contract import ToolResult
from worldenv.errors import GatewayError, HttpError
from worldenv.gui.site import PageResponse
from worldenv.instances.episodes import save_episode
from worldenv.instances.instance import Environment, GuiResult, Instance
from worldenv.protocol.actions import (
    Action,
    AnswerAction,
    GuiAction,
    ListToolsAction,
    MetaCallAction,
    Observation,
    ShellAction,
    ToolAction,
    Unexecutable,
    describe,
)
from worldenv.protocol.execute import at_once, execute
from worldenv.protocol.observation import timed_out
from worldenv.serving.http import shown, status_of
from worldenv.serving.mcp import Mode, instance_server
from worldstore.errors import WorldError

if TYPE_CHECKING:
    from replay.engine import Worlds

MAX_STEPS = 50  # OpenEnv steps of an episode unless a create request says otherwise
CLOSED_KEPT = 4096  # closed instances remembered (for their stored episode's id)
ID_BYTES = 16  # random bytes in an instance's id: 128 bits, not guessable
# A GUI instance holds a browser page (~75 MiB): at most this many at a time, per client
# (the peer address) and in all; a create request beyond either cap is 429.
MAX_GUI_INSTANCES = 32
MAX_GUI_PER_CLIENT = 8
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
class Setup:
    """What a create request asked for (defaults filled in)."""

    mode: Mode
    task: ServedTask | None = None
    agent: str | None = None
    shell: bool = False
    answer: bool = False
    gui: bool = False
    max_steps: int = MAX_STEPS


# --- one hosted instance ---------------------------------------------------------------


class Hosted:
    """An instance, its MCP app (lifespan run in a task of its own) and its bookkeeping.
    Every operation on the instance holds `lock`: tool calls and REST calls never overlap."""

    def __init__(self, instance: Instance, setup: Setup, call_timeout: float,
                 workers: Workers, worlds: Worlds, client: str = "") -> None:
        # Unguessable: the id is in every URL of the instance (pages, forms, REST, MCP), so
        # knowing it is what it takes to act on the instance; a page served for another
        # instance cannot name it (see pages.page_source).
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
        # Held by an OpenEnv WebSocket session (worldenv.serving.openenv_ws), which closes
        # it when its socket closes or idles out: the reaper leaves it to the session.
        self.held = False
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

    async def act(self, action: Action) -> Observation:
        """One action of the agent protocol on the instance (``worldenv.protocol.execute``:
        every surface's step), in a worker thread under the lock and timeout of a tool
        call. The catalogue and a refusal do not act on the world: answered at once. The
        answer is recorded on the episode here (``answer``)."""
        if isinstance(action, AnswerAction):
            result = await self.answer(action.text)
            if result.is_error:
                return Observation(text=result.text, is_error=True)
            return at_once(self.instance, action)
        if isinstance(action, ListToolsAction | Unexecutable):
            self.touch()
            return at_once(self.instance, action)
        return await self._timed(describe(action), _label(action),
                                 lambda: execute(self.instance, action), _failure)

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """A tool call (the MCP server's caller)."""
        seen = await self.act(ToolAction(name, arguments))
        return ToolResult(seen.is_error, seen.text, seen.structured)

    async def shell(self, command: str) -> ToolResult:
        """One shell command in the workspace, under the same lock and timeout as a tool
        call; its text is what the agent sees, its structured part the ShellCall's."""
        seen = await self.act(ShellAction(command))
        return ToolResult(seen.is_error, seen.text, seen.structured)

    async def gui(self, action: str, arguments: dict[str, Any]) -> GuiResult:
        """One GUI action in the instance's browser (``Instance.gui``: recorded in the
        episode with its screenshot's digest), under the same lock and timeout as a tool
        call: the first one starts the browser, each can take up to a second."""
        seen = await self.act(GuiAction(action, arguments))
        return GuiResult(seen.is_error, seen.text, seen.image, seen.url, seen.screenshot)

    async def page(self, method: str, target: str, body: bytes
                   ) -> PageResponse | HttpError:
        """One request of the instance's web pages (``Instance.page``: recorded in the
        episode; a form's tool writes like a tool call), under the lock and timeout of a
        tool call; what went wrong instead of the page when it did not run or failed."""
        return await self._timed("page request", f"page request {method} {target}",
                                 lambda: self.instance.page(method, target, body),
                                 HttpError)

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
                return failed(status_of(exc), str(exc))
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
                    raise HttpError(404, f"instance {self.id} was closed")
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


def _failure(_status: int, message: str) -> Observation:
    """What an action that did not run, or failed, shows (the status is REST's concern)."""
    return Observation(text=message, is_error=True)


def _label(action: Action) -> str:
    """An action in the log."""
    if isinstance(action, ToolAction):
        return f"tool call {action.tool}"
    if isinstance(action, MetaCallAction):
        return f"tool call {action.tool_name}"
    if isinstance(action, GuiAction):
        return f"GUI action {action.action}"
    return describe(action)


_Job = Callable[[], Any]


class Workers:
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




def hosting_of(request: HTTPConnection) -> Hosting:
    """The instances the app that routed `request` (or WebSocket) serves (its
    ``state.hosting``)."""
    hosting = request.app.state.hosting
    assert isinstance(hosting, Hosting)
    return hosting


def enabled(hosted: Hosted, tool: str) -> None:
    """Refuse the shell, the answer or the GUI on an instance created without it."""
    if not getattr(hosted.setup, tool):
        what = "the GUI (its pages and the gui_ tools)" if tool == "gui" else f"the {tool} tool"
        raise HttpError(409, f"instance {hosted.id} was created without {what} "
                             f'(create one with "{tool}": true, or for a task that has it)')


class Hosting:
    """The instances of one environment a gateway serves, and what they may use: see
    ``Gateway`` for the arguments (it is one)."""

    def __init__(self, environment: Environment, *, max_instances: int = 256,
                 idle_timeout: float = 600.0, call_timeout: float = 30.0,
                 mode: Mode = "tools", reap_interval: float | None = None,
                 workers: int | None = None, tasks: Mapping[str, ServedTask] | None = None,
                 max_steps: int = MAX_STEPS, max_gui_instances: int = MAX_GUI_INSTANCES,
                 max_gui_per_client: int = MAX_GUI_PER_CLIENT) -> None:
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
        self.instances: dict[str, Hosted] = {}
        self._pending = 0
        self._open_lock = threading.Lock()
        self._workers = Workers(workers or min(64, max_instances))
        self._reaper: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[dict[str, Any]]] = set()

    # --- finding an instance, a task -----------------------------------------------------

    def hosted(self, iid: str) -> Hosted:
        """The served instance of that id, or a 404 that says what became of it."""
        found = self.instances.get(iid)
        if found is not None:
            return found
        closed = self.closed.get(iid)
        if closed is None:
            raise HttpError(404, f"no instance {shown(iid)} (closed, reaped or never "
                                 "created)")
        stored = (f"its episode was stored as {closed['episode_id']}"
                  if closed.get("episode_id") else "its episode was not stored")
        raise HttpError(404, f"instance {iid} was closed: {stored}", extra={"closed": closed})

    def task(self, value: str) -> ServedTask:
        if not self.tasks:
            raise HttpError(404, f"no task {shown(value)}: this gateway serves no tasks "
                                 "(start it with worldctl serve --tasks DIR|PACK)")
        task = self.tasks.get(value)
        if task is None:
            names = sorted(self.tasks)
            listed = ", ".join(names[:10]) + (f" and {len(names) - 10} more"
                                              if len(names) > 10 else "")
            raise HttpError(404, f"no task {shown(value)} (served: {listed}; GET /tasks)")
        return task

    async def graded(self, hosted: Hosted, task: ServedTask, answer: str | None
                     ) -> dict[str, Any]:
        """V(W0, W, answer) of the instance as it is now (in a thread: the verifier copies
        and hashes files and runs in a subprocess)."""
        world = hosted.instance.record.world_hash
        if world != task.world_hash:
            raise HttpError(409, f"instance {hosted.id} is world {world}, but task "
                                 f"{task.task_id} starts from {task.world} "
                                 f"({task.world_hash}): create an instance of the task's "
                                 'world ({"task": "' + task.task_id + '"})')
        instance = hosted.instance
        grade: Grade = await hosted.run_locked(lambda: task.grade(instance, answer))
        return {"task_id": task.task_id, "answer": answer, **grade}

    # --- creating and closing -----------------------------------------------------------

    async def create(self, setup: Setup, world: str, bare_names: bool | None,
                     client: str) -> Hosted:
        """Open an instance of `world` and publish it, or refuse (429) beyond a cap."""
        if len(self.instances) + self._pending >= self.max_instances:
            raise HttpError(429, f"the gateway already holds its maximum of "
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
                raise HttpError(status_of(exc), str(exc)) from None
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
                raise HttpError(429, f"{whose} its maximum of {limit} instances with the GUI "
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

    def unpublish(self, iid: str) -> Hosted | None:
        """Take an instance out of the served ones (it is closed next); None if it was."""
        hosted = self.instances.pop(iid, None)
        if hosted is not None and hosted.setup.gui:
            self._uncount_gui(hosted.client)
        return hosted

    def _open(self, world: str, setup: Setup, bare_names: bool | None = None,
              client: str = "") -> Hosted:
        # One open at a time: a first open may build and cache the snapshot.
        with self._open_lock:
            instance = self.environment.open(world, bare_names=bare_names)
        try:
            task = setup.task
            if task is not None and instance.record.world_hash != task.world_hash:
                raise HttpError(409, f"{world} is world {instance.record.world_hash}, but "
                                     f"task {task.task_id} starts from {task.world} "
                                     f"({task.world_hash}): leave out \"world\" to get the "
                                     "task's")
            try:
                return Hosted(instance, setup, self.call_timeout, self._workers,
                              self.environment.worlds, client)
            except ValueError as exc:  # a service tool named like an agent tool
                raise HttpError(409, str(exc)) from None
        except BaseException:
            instance.close()
            raise

    async def close(self, hosted: Hosted) -> dict[str, Any]:
        """Close an unpublished instance, storing its episode; remember what it left."""
        closing = await hosted.close()
        self.closed[hosted.id] = closing
        while len(self.closed) > CLOSED_KEPT:
            del self.closed[next(iter(self.closed))]
        if closing.get("episode_id"):
            log.info("instance %s closed: episode %s stored", hosted.id,
                     closing["episode_id"])
        return closing

    def _discard(self, iid: str) -> asyncio.Task[dict[str, Any]] | None:
        """Unpublish an instance now and close it in the background (a task shutdown
        waits for); None if it was no longer published."""
        hosted = self.unpublish(iid)
        if hosted is None:
            return None
        task = asyncio.create_task(self.close(hosted), name=f"close-{iid}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        return task

    async def release(self, hosted: Hosted) -> dict[str, Any] | None:
        """Unpublish and close an instance, storing its episode; what closing it left
        (None if it was closed meanwhile). The close runs on if the caller is cancelled
        (a socket's handler at shutdown): shutdown waits for it."""
        task = self._discard(hosted.id)
        return None if task is None else await asyncio.shield(task)

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(self.reap_interval)
            now = time.monotonic()
            for iid, hosted in list(self.instances.items()):
                if (hosted.in_flight == 0 and not hosted.lock.locked() and not hosted.held
                        and now - hosted.last_active >= self.idle_timeout):
                    log.info("instance %s idle for %.0f s: closing it", iid,
                             now - hosted.last_active)
                    try:
                        self._discard(iid)
                    except Exception:  # keep reaping the others
                        log.exception("could not close idle instance %s", iid)

    # --- the server's lifespan ----------------------------------------------------------

    def startup(self) -> None:
        """Start looking for idle instances (in the server's event loop)."""
        self._reaper = asyncio.create_task(self._reap(), name="gateway-reaper")

    async def shutdown(self) -> None:
        """Close every instance (waiting at most a call timeout for running calls)."""
        if self._reaper is not None:
            self._reaper.cancel()
        for iid in list(self.instances):
            self._discard(iid)
        if self._closing:
            await asyncio.wait(set(self._closing), timeout=self.call_timeout + 5)
        self._workers.shutdown()
