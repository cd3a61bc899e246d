"""The world side of training: per process, one store, one environment, the tasks, the
tool schemas and a pool of instances opened ahead of time; per rollout, a session that
acts on its instance under timeouts and ends graded, its episode stored.

No verl or torch here: the agent loop (``rl.loop``) drives this, and so can any other
trainer in this process.

A task that declares the ``gui`` interface is offered the GUI tools too (tools mode, as
``gates.llm_agent`` offers them); a GUI call runs in the instance's browser like any
other blocking call. Training shows the model no images: where ``gates.llm_agent`` would
show a GUI step's screenshot, the observation carries ``screenshot``, the text note that
stands in for it (``gates.llm_agent.screenshot_note``: the page's title and path).

Each call is the agent protocol's action (``worldenv.protocol``), done by its ``execute``
and shown as every other surface shows it (the LLM agent, the gateway, Gym, the SFT rows).

Everything slow or blocking (opening an instance, a shell command, a carried app's call,
storing the episode, hashing, the verifier) runs in worker threads, never on the event
loop that hundreds of concurrent rollouts share. A call that outlives its timeout gives
the model the error result "... timed out after N s"; it runs on in its thread, and the
rollout's next call waits for it first (an instance serves one call at a time). A shipped
app's tool call (SQLite within the SQL gate's budget, well under a millisecond; a lazy
instance's first write copies that service's database) runs on the loop itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from gates.agents import action_of, step_of, turn_of
from gates.contract import Step, ToolStep, Trajectory, Verdict
from gates.llm_agent import offers_gui, screenshot_caption, screenshot_note
from gates.rollout import grade, interfaces_used, open_task_instance
from gates.task import Task, load_task
from packs.registry import load_pack
from replay.engine import Worlds
from rl.contract import Mode, RowInfo
from rl.errors import RLError
from worldenv.instances.episodes import save_episode
from worldenv.instances.instance import Environment, Instance
from worldenv.protocol import (
    Action,
    AnswerAction,
    GuiAction,
    ListToolsAction,
    Unexecutable,
    decode_call,
    describe,
    execute,
    refused,
    runs_inline,
    toolset_of,
)
from worldenv.protocol import Observation as Shown
from worldenv.protocol.observation import ANSWER, CALL_TOOL, LIST_TOOLS, SHELL, timed_out

STORE_ENV = "WORLDCTL_STORE"  # the store a training process opens (path or URL)
PACKS_ENV = "WORLDCTL_PACKS"  # installed packs folder (default: beside the store)
CACHE_ENV = "WORLDCTL_CACHE"  # snapshot cache folder; "{pid}": one per process
DEFAULT_TOOL_TIMEOUT = 60.0  # seconds for one tool call or shell command
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Observation:
    """What one call returned, as the model is shown it; for a GUI call that took a
    screenshot, the note shown in its place (no images in training)."""

    text: str
    is_error: bool
    screenshot: str | None = None
    whole: bool = False  # the catalogue: shown uncut (worldenv.protocol.observation.shown)


@dataclass
class WorldRuntime:
    """One per process and store (``runtime()``): rollouts share its environment, its
    task cache and its prefetched instances."""

    worlds: Worlds
    packs_dir: Path | None = None
    environment: Environment = field(init=False)
    _tasks: dict[tuple[str, str], Task] = field(default_factory=dict, init=False)
    _schemas: dict[tuple[str, Mode, bool], tuple[list[dict[str, Any]], frozenset[str]]] = \
        field(default_factory=dict, init=False)
    _ready: dict[str, deque[Instance]] = field(default_factory=lambda: defaultdict(deque),
                                               init=False)
    _open_lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _pool_lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    opened: int = 0  # instances opened, prefetched ones included
    prefetched_hits: int = 0  # rollouts that found their instance already open

    def __post_init__(self) -> None:
        self.environment = Environment(self.worlds)

    # --- tasks and schemas ----------------------------------------------------------

    def task(self, info: RowInfo) -> Task:
        """The row's task folder, loaded once; refused when its world is not the row's."""
        key = (info.pack, info.task_id)
        found = self._tasks.get(key)
        if found is None:
            pack = load_pack(info.pack, self.packs_dir)
            found = self._tasks[key] = load_task(pack.task_dir(info.task_id))
        if found.spec.world_hash != info.world_hash:
            raise RLError(f"row of task {info.task_id!r} names world {info.world_hash}, "
                          f"the task folder {found.spec.world_hash}: the dataset is stale; "
                          "write it again with worldctl rl dataset")
        return found

    def tools(self, instance: Instance, mode: Mode, *, gui: bool = False
              ) -> tuple[list[dict[str, Any]], frozenset[str]]:
        """The tool schemas the model is offered (OpenAI function format) and their names,
        built once per world, mode and GUI: the instance's MCP tools, the GUI tools when
        `gui` (tools mode only), ``shell`` and ``answer``, or AWM's two meta-tools and
        ``answer`` (``worldenv.protocol.toolset_of``, as every surface offers them)."""
        gui = gui and mode == "tools"
        key = (instance.record.world_hash, mode, gui)
        found = self._schemas.get(key)
        if found is None:
            offer = toolset_of(instance, mode=mode, gui=gui)
            found = self._schemas[key] = (offer.schemas(), offer.names)
        return found

    # --- instances --------------------------------------------------------------------

    async def open(self, task: Task) -> Instance:
        """A fresh instance of the task's world: a prefetched one when there is one."""
        world = task.spec.world_hash
        with self._pool_lock:
            ready = self._ready.get(world)
            if ready:
                self.prefetched_hits += 1
                return ready.popleft()
        return await asyncio.to_thread(self._open_now, task)

    def _open_now(self, task: Task) -> Instance:
        # One open at a time: the first open of a world may build and cache its snapshot.
        with self._open_lock:
            instance = open_task_instance(self.environment, task)
            self.opened += 1
            return instance

    async def prefetch(self, tasks: Sequence[Task]) -> int:
        """Open an instance for each of `tasks` (one per coming rollout; a task may repeat)
        now, less those already open for the same world: AWM's pre-fetch, the next batch's
        instances prepared while the current one trains. Returns how many were opened."""
        wanted: list[Task] = []
        need: dict[str, int] = defaultdict(int)
        for task in tasks:
            need[task.spec.world_hash] += 1
        with self._pool_lock:
            for task in tasks:
                world = task.spec.world_hash
                if need[world] > len(self._ready[world]):
                    need[world] -= 1
                    wanted.append(task)
        opened = await asyncio.gather(*(asyncio.to_thread(self._open_now, t) for t in wanted))
        with self._pool_lock:
            for instance in opened:
                self._ready[instance.record.world_hash].append(instance)
        return len(opened)

    def close(self) -> None:
        """Close the prefetched instances and the environment's workers."""
        with self._pool_lock:
            pending = [i for ready in self._ready.values() for i in ready]
            self._ready.clear()
        for instance in pending:
            instance.close()
        self.environment.close()


_RUNTIMES: dict[str, WorldRuntime] = {}
_RUNTIMES_LOCK = threading.Lock()


def runtime(store: str | None = None, *, packs_dir: str | None = None,
            cache: str | None = None) -> WorldRuntime:
    """This process's runtime for `store` (default: ``$WORLDCTL_STORE``), made on
    first use: every trajectory of a Ray worker shares it. `cache` (default:
    ``$WORLDCTL_CACHE``, else the store's default) is the snapshot cache folder;
    ``{pid}`` in it gives each process its own, like separate nodes' local disks."""
    location = store or os.environ.get(STORE_ENV)
    if not location:
        raise RLError(f"no world store: set {STORE_ENV} (a store path or a PostgreSQL URL) "
                      "or the agent loop's `store` setting")
    packs = packs_dir or os.environ.get(PACKS_ENV)
    folder = cache or os.environ.get(CACHE_ENV)
    with _RUNTIMES_LOCK:
        found = _RUNTIMES.get(location)
        if found is None:
            worlds = Worlds.open(location, folder.replace("{pid}", str(os.getpid()))
                                 if folder else None, create=False)
            found = _RUNTIMES[location] = WorldRuntime(
                worlds, packs_dir=Path(packs) if packs else None)
        return found


def forget_runtimes() -> None:
    """Close and drop every runtime of this process (tests; a worker's shutdown)."""
    with _RUNTIMES_LOCK:
        found = list(_RUNTIMES.values())
        _RUNTIMES.clear()
    for item in found:
        item.close()


# --- one rollout ---------------------------------------------------------------------------


@dataclass
class WorldSession:
    """One rollout's instance: the calls the model makes, as gates ``TurnRecord``s (the
    trajectory the rewards and judges read), each under the runtime's timeout."""

    runtime: WorldRuntime
    task: Task
    instance: Instance
    mode: Mode
    timeout: float = DEFAULT_TOOL_TIMEOUT
    trajectory: Trajectory = field(default_factory=lambda: Trajectory(turns=[]))
    timeouts: int = 0
    step_seconds: list[float] = field(default_factory=list)  # each call, as the loop waited
    _pending: asyncio.Future[Any] | None = field(default=None, init=False)

    @classmethod
    async def start(cls, runtime: WorldRuntime, info: RowInfo, *,
                    timeout: float = DEFAULT_TOOL_TIMEOUT) -> WorldSession:
        task = runtime.task(info)
        return cls(runtime, task, await runtime.open(task), info.mode, timeout)

    @property
    def gui(self) -> bool:
        """Whether the GUI tools are offered: tools mode, a task declaring gui."""
        return self.mode == "tools" and offers_gui(self.task)

    def tools(self) -> tuple[list[dict[str, Any]], frozenset[str]]:
        return self.runtime.tools(self.instance, self.mode, gui=self.gui)

    @property
    def answered(self) -> bool:
        return self.trajectory.answer is not None

    async def act(self, step: Step, reasoning: str) -> Observation:
        """Execute one parsed call and record its turn (in meta mode a step named after a
        meta-tool is that meta-tool's call)."""
        if self.mode == "meta" and isinstance(step, ToolStep) and \
                step.tool in (LIST_TOOLS, CALL_TOOL):
            return await self.execute(decode_call(step.tool, dict(step.arguments),
                                                  (LIST_TOOLS, CALL_TOOL), mode="meta"),
                                      reasoning)
        return await self.execute(action_of(step), reasoning)

    def refuse(self, tool: str, problem: str, reasoning: str) -> Observation:
        """Record a call that could not be executed (unknown tool, bad arguments)."""
        return self._record(Unexecutable(tool, problem), refused(problem), reasoning)

    async def execute(self, action: Action, reasoning: str) -> Observation:
        """Execute one action (``worldenv.protocol.execute``) under the timeout and record
        its turn. What does not act on the world (the answer, the catalogue, a refusal)
        is done at once."""
        if isinstance(action, AnswerAction | ListToolsAction | Unexecutable):
            return self._record(action, execute(self.instance, action), reasoning)
        done = await self._bounded(lambda: execute(self.instance, action),
                                   describe=describe(action),
                                   inline=runs_inline(self.instance, action))
        if isinstance(done, str):  # the timeout's message
            done = Shown(text=done, is_error=True)
        return self._record(action, done, reasoning)

    def _record(self, action: Action, shown: Shown, reasoning: str) -> Observation:
        self.trajectory.turns.append(turn_of(len(self.trajectory.turns), step_of(action),
                                             shown, reasoning))
        if shown.done:
            self.trajectory.answer = shown.answer
            self.trajectory.stopped = "answer"
        note = None
        if isinstance(action, GuiAction) and shown.screenshot is not None:
            note = screenshot_note(screenshot_caption(action.action, shown.text))
        return Observation(shown.text, shown.is_error, note, whole=shown.whole)

    async def _bounded(self, work: Callable[[], T], *, describe: str,
                       inline: bool = False) -> T | str:
        """`work` in a thread under the timeout: its result, or the timeout's message.
        `inline` work (a shipped app's tool: SQLite within the SQL gate's budget) runs on
        the event loop itself: a thread hop would cost more than the call, and hundreds
        of rollouts would queue for the pool's few threads behind tokenizer work."""
        if self._pending is not None:  # the last call timed out: the instance is still busy
            with contextlib.suppress(Exception):
                await self._pending
            self._pending = None
        began = time.perf_counter()
        if inline:
            try:
                return work()
            finally:
                self.step_seconds.append(time.perf_counter() - began)
        future = asyncio.ensure_future(asyncio.to_thread(work))
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.timeout)
        except TimeoutError:
            self._pending = future
            self.timeouts += 1
            return timed_out(describe, self.timeout)
        finally:
            self.step_seconds.append(time.perf_counter() - began)

    async def finish(self, *, agent: str) -> Graded:
        """Store the episode, grade the final world and close the instance, in a thread.
        A verifier that fails is an environment error (no verdict), never a crash."""
        if self._pending is not None:
            with contextlib.suppress(Exception):
                await self._pending
        return await asyncio.to_thread(self._finish, agent)

    def _finish(self, agent: str) -> Graded:
        instance = self.instance
        try:
            instance.episode = msgspec.structs.replace(
                instance.episode, answer=self.trajectory.answer, task=self.task.task_id,
                agent=agent)
            episode_id = save_episode(self.runtime.worlds, instance)
            used = [str(i) for i in interfaces_used(instance.episode)]
            try:
                verdict: Verdict | None = grade(self.runtime.environment, self.task, instance,
                                                self.trajectory.answer)
                problem = None if verdict is None or not verdict.is_error else \
                    "; ".join(verdict.errors)
            except Exception as exc:  # a verifier crash is the environment's, not the model's
                verdict, problem = None, f"{type(exc).__name__}: {exc}"
            return Graded(episode_id=episode_id, verdict=verdict, interfaces=used,
                          grading_error=problem)
        finally:
            instance.close()

    async def abandon(self) -> None:
        """Close the instance without grading (the rollout was lost or cancelled)."""
        if self._pending is not None:
            with contextlib.suppress(Exception):
                await self._pending
        await asyncio.to_thread(self.instance.close)


@dataclass(frozen=True, slots=True)
class Graded:
    episode_id: str
    verdict: Verdict | None  # None: the verifier could not run
    interfaces: list[str]
    grading_error: str | None


__all__ = [
    "ANSWER",
    "CACHE_ENV",
    "CALL_TOOL",
    "DEFAULT_TOOL_TIMEOUT",
    "LIST_TOOLS",
    "PACKS_ENV",
    "SHELL",
    "STORE_ENV",
    "Graded",
    "Observation",
    "WorldRuntime",
    "WorldSession",
    "forget_runtimes",
    "runtime",
]
