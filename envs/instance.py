"""Instances: an isolated, resettable copy of a world that agents act on through tools
and a shell, with every call recorded as an episode.

``Environment`` opens instances of ``persona@day`` (or of a world hash) from a ``Worlds``
store. An ``Instance`` owns a mount of the snapshot, one SQLite connection per service,
a deterministic clock (it starts at the snapshot's last timestamp and advances one second
per call) and the episode. Tools of shipped apps run in this process; the shell runs in
the sandbox.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import apsw
import msgspec
from fastmcp import FastMCP
from fastmcp.exceptions import NotFoundError as McpNotFound
from fastmcp.exceptions import ToolError as McpToolError
from fastmcp.exceptions import ValidationError as McpValidationError
from fastmcp.tools import Tool
from mcp.types import ToolAnnotations

from envs.app import App, ToolSpec, bind
from envs.episode import DbChange, Episode, FileChange, ShellCall, ToolCall
from envs.execute import execute_tool, open_snapshot_tool_db, open_tool_db
from replay.diff import WorldDiff
from replay.engine import Worlds, ref_is_stable
from replay.hashing import file_digest
from replay.layout import iter_apps, iter_workspace, service_db
from replay.mount import Mount
from worldstore.canonical import digest_of
from worldstore.errors import WorldError
from worldstore.names import ts_millis
from worldstore.store import DayRecord

if TYPE_CHECKING:
    from envs.workers import RemoteApp, WorkerPool

T = TypeVar("T")
_CURRENT: contextvars.ContextVar[Instance] = contextvars.ContextVar("agentworlds_instance")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Keyed by the identity of the App objects (kept alive by the entry, so ids stay unique).
_TOOLS_FOR_APPS: dict[tuple[int, ...], tuple[tuple[App | RemoteApp, ...], ToolSet]] = {}
_TOOLS_LOCK = threading.Lock()


class InstanceClosed(WorldError):
    """A call on an instance that was closed."""


class AppPinError(WorldError):
    """A world pins app code that this installation cannot serve."""


def read_pins(root: Path) -> dict[str, dict[str, Any]]:
    """The app pins of a world directory, by service."""
    pins = {}
    for name, path in iter_apps(root):
        if name.endswith(".json"):
            pin = msgspec.json.decode(path.read_bytes())
            pins[str(pin["service"])] = pin
    return pins


@dataclass(frozen=True, slots=True)
class ToolInfo:
    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None
    writes: bool


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What the agent sees: text (JSON for structured results), and an error flag."""

    is_error: bool
    text: str
    structured: Any = None


@dataclass(frozen=True, slots=True)
class ToolSet:
    """The tools of a set of apps: one FastMCP server (schemas, argument validation) shared
    by every instance; each call runs against the instance in the current context."""

    server: FastMCP
    specs: dict[str, ToolSpec]
    infos: list[ToolInfo]


def tool_set(apps: list[App | RemoteApp]) -> ToolSet:
    key = tuple(sorted(id(a) for a in apps))
    with _TOOLS_LOCK:
        found = _TOOLS_FOR_APPS.get(key)
        if found is None:
            found = _TOOLS_FOR_APPS[key] = (tuple(apps), _build_tool_set(apps))
    return found[1]


def _build_tool_set(apps: list[App | RemoteApp]) -> ToolSet:
    _quiet_fastmcp()
    server = FastMCP("agent-worlds")
    specs: dict[str, ToolSpec] = {}
    infos = []
    for app in sorted(apps, key=lambda a: a.service):
        if not isinstance(app, App):  # carried code: tools served by its sandboxed worker
            for spec, remote in app.tools():
                server.add_tool(remote)
                specs[spec.full_name] = spec
                infos.append(ToolInfo(spec.full_name, spec.description, remote.parameters,
                                      remote.output_schema, spec.writes))
            continue
        for spec in sorted(app.tools.values(), key=lambda s: s.name):
            tool = Tool.from_function(
                bind(spec, _run_in_current), name=spec.full_name,
                description=spec.description, run_in_thread=False,
                annotations=ToolAnnotations(read_only_hint=not spec.writes),
            )
            server.add_tool(tool)
            specs[spec.full_name] = spec
            infos.append(ToolInfo(spec.full_name, spec.description, tool.parameters,
                                  tool.output_schema, spec.writes))
    return ToolSet(server, specs, infos)


def _quiet_fastmcp() -> None:
    # FastMCP logs every failed call; for an RL environment a refused call is data the
    # agent receives, not an operational error.
    import logging

    logging.getLogger("fastmcp").setLevel(logging.CRITICAL)


def _run_in_current(spec: ToolSpec, kwargs: dict[str, Any]) -> Any:
    return _CURRENT.get()._execute(spec, kwargs)


class Environment:
    """Opens instances of stored worlds with the apps that serve their services."""

    def __init__(self, worlds: Worlds, apps: dict[str, App] | None = None, *,
                 check_pins: bool = True, lazy: bool = True) -> None:
        """`apps` defaults to the shipped apps. With ``check_pins=False`` the world's app
        pins are ignored and `apps` serve its services by name (for testing other code
        against a world; never for training data). Instances are lazy mounts by default:
        opening one copies nothing, a service's database is copied on its first write and
        the workspace on the first shell command (``lazy=False`` copies all at open)."""
        if apps is None:
            from envs.apps import SHIPPED

            apps = SHIPPED
        self.worlds = worlds
        self.apps = dict(apps)
        self.check_pins = check_pins
        self.lazy = lazy
        self._ids = itertools.count(1)
        # persona@N and world hashes always name the same stored day (Worlds.mount caches
        # them the same way): resolve each once, not with two store queries per open.
        self._records: dict[str, DayRecord] = {}
        self._pins: dict[str, dict[str, dict[str, Any]]] = {}
        self._pool: WorkerPool | None = None

    def close(self) -> None:
        """Stop the sandboxed workers of carried apps (instances stay usable for shipped
        apps; a carried app's next call starts its worker again)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def __enter__(self) -> Environment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self, ref: str) -> Instance:
        record = self._records.get(ref)
        if record is None:
            record = self.worlds.resolve(ref)
            if ref_is_stable(ref):
                self._records[ref] = record
        mount = self.worlds.mount(record.world_hash, lazy=self.lazy)
        try:
            apps = self._apps_for(mount)
        except AppPinError:
            mount.close()
            raise
        return Instance(mount, record, apps, instance_id=f"i{next(self._ids)}")

    def _apps_for(self, mount: Mount) -> list[App | RemoteApp]:
        """The apps serving a world's services. A service the world pins must be served by
        exactly the pinned code (name, version and source digest); an unpinned service is
        served by the app of the same service name, if there is one."""
        pins = self._pins_of(mount) if self.check_pins else {}
        apps: list[App | RemoteApp] = []
        for service in sorted(mount.manifest.services):
            app = self.apps.get(service)
            pin = pins.get(service)
            if pin is not None:
                if pin.get("carried"):
                    apps.append(self._carried(mount, service, pin))
                    continue
                if app is None or (app.name, app.version, app.digest) != (
                        pin["app"], pin["version"], pin["digest"]):
                    have = f"{app.name} {app.version} ({app.digest})" if app else "no app"
                    raise AppPinError(
                        f"the world pins app {pin['app']} {pin['version']} ({pin['digest']}) "
                        f"for service {service!r}; this install has {have}")
            if app is not None:
                apps.append(app)
        return apps

    def _pins_of(self, mount: Mount) -> dict[str, dict[str, Any]]:
        # A snapshot never changes (it is named by its hash): read its pins once.
        pins = self._pins.get(mount.world_hash)
        if pins is None:
            pins = self._pins[mount.world_hash] = read_pins(mount.snapshot)
        return pins

    def _carried(self, mount: Mount, service: str, pin: dict[str, Any]) -> RemoteApp:
        """A carried app, served by a sandboxed worker (shared by every instance whose
        world carries the same code); its code never runs in this process."""
        from envs.workers import AppLoadError, WorkerPool

        code = (mount.snapshot / "apps" / f"{service}.py").read_text(encoding="utf-8")
        if self._pool is None:
            self._pool = WorkerPool()
        try:
            return self._pool.app(service, code, mount.path.parent)
        except AppLoadError as exc:
            raise AppPinError(f"service {service!r}: the app {pin['app']!r} carried in the "
                              f"world's log cannot be served: {exc}") from exc


class Instance:
    """One agent's private world. Not for concurrent use by several agents."""

    def __init__(self, mount: Mount, record: DayRecord, apps: list[App | RemoteApp], *,
                 instance_id: str) -> None:
        self.mount = mount
        self.record = record
        self.instance_id = instance_id
        tools = tool_set(apps)
        self._remote = [a for a in apps if not isinstance(a, App)]
        self.server, self.tools, self._infos = tools.server, tools.specs, tools.infos
        self._conns: dict[str, tuple[apsw.Connection, bool]] = {}
        self._start = datetime.fromisoformat(record.last_ts[:-1]).replace(tzinfo=UTC)
        self._lock = threading.RLock()
        self._closed = False
        self._episode_count = 0
        self._new_episode()

    # --- the agent's surface -------------------------------------------------------

    def list_tools(self) -> list[ToolInfo]:
        """Every tool of this instance's services, sorted by name."""
        return list(self._infos)

    def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> ToolResult:
        return _run(self.acall_tool(name, arguments))

    async def acall_tool(self, name: str, arguments: dict[str, Any] | None = None
                         ) -> ToolResult:
        """Call one tool. A bad call (unknown tool, bad arguments, a refusal) is an error
        result for the agent, never an exception."""
        self._check_open()
        arguments = dict(arguments or {})
        index, ts = self._next_call()
        spec = self.tools.get(name)
        if spec is None:
            result = ToolResult(True, f"Unknown tool {name!r}. Valid tools: "
                                      f"{', '.join(sorted(self.tools))}")
        else:
            token = _CURRENT.set(self)
            self._pending: list[DbChange] = []
            try:
                raw = await self.server.call_tool(name, arguments)
                text = "".join(getattr(c, "text", "") for c in raw.content)
                result = ToolResult(bool(getattr(raw, "is_error", False)), text,
                                    raw.structured_content)
            except (McpToolError, McpValidationError, McpNotFound) as exc:
                result = ToolResult(True, str(exc))
            finally:
                _CURRENT.reset(token)
        self.episode.events.append(ToolCall(
            index=index, ts=ts, tool=name, arguments=arguments, is_error=result.is_error,
            text=result.text, structured=result.structured,
            writes=bool(spec and spec.writes)))
        if spec is not None:
            self.episode.events.extend(self._pending)
            self._pending = []
        return result

    def shell(self, command: str, limits: Any = None) -> ShellCall:
        """Run `command` in the workspace inside the sandbox; file changes join the episode."""
        from envs.sandbox import run_sandboxed

        self._check_open()
        index, ts = self._next_call()
        workspace = self.mount.workspace  # a lazy mount copies the workspace now
        before = _workspace_state(self.mount.path)
        outcome = run_sandboxed(command, workspace, limits)
        call = ShellCall(index=index, ts=ts, command=command, exit_code=outcome.exit_code,
                         stdout=outcome.stdout, stderr=outcome.stderr,
                         truncated=outcome.truncated, timed_out=outcome.timed_out)
        self.episode.events.append(call)
        self.episode.events.extend(_file_changes(self.mount.path, before, index))
        return call

    def reset(self) -> None:
        """Back to the snapshot (same hash), with a fresh episode and clock."""
        self._check_open()
        with self._lock:
            self._close_connections()
            self.mount.reset()
            self._new_episode()

    def hash(self) -> str:
        self._check_open()
        self._close_connections()
        return self.mount.hash()

    def diff(self) -> WorldDiff:
        self._check_open()
        self._close_connections()
        return self.mount.diff()

    def close(self) -> None:
        """Delete the instance; safe to call twice."""
        if not self._closed:
            self._closed = True
            self._close_connections()
            self.mount.close()

    def __enter__(self) -> Instance:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- execution ------------------------------------------------------------------

    def _execute(self, spec: ToolSpec, kwargs: dict[str, Any]) -> Any:
        conn = self._connection(spec.service, writes=spec.writes)
        call = self._call_index
        # Seeded by the snapshot and the call's position only: the same calls on any
        # instance of the same snapshot draw the same "random" values.
        result, effect = execute_tool(
            conn, spec, kwargs, millis=self._millis(call),
            seed=f"{self.record.world_hash}:{call}", now=self._iso(call), call_index=call)
        if effect is not None:
            self._record_effect(spec.service, *effect)
        return result

    def _record_effect(self, service: str, changeset: bytes,
                       sequences: list[tuple[str, int]] | None) -> None:
        self._pending.append(DbChange(index=self._call_index, service=service,
                                      changeset=changeset, sequences=sequences))

    def _connection(self, service: str, *, writes: bool) -> apsw.Connection:
        """The service's connection: on the instance's own copy once the service has been
        written (or is about to be), else read-only on the snapshot (no copy needed yet)."""
        found = self._conns.get(service)
        if found is not None and (found[1] or not writes):
            return found[0]
        if found is not None:
            found[0].close()
        path = self.mount.read_db_path(service)
        if writes or path == service_db(self.mount.path, service):
            conn, writable = open_tool_db(self.mount.db_path(service)), True
        else:
            conn, writable = open_snapshot_tool_db(path), False
        self._conns[service] = (conn, writable)
        return conn

    def _close_connections(self) -> None:
        conns, self._conns = self._conns, {}
        for conn, _writable in conns.values():
            conn.close()
        for app in self._remote:  # carried apps keep their connections in their worker
            app.worker.forget(service_db(self.mount.path, app.service))

    def _next_call(self) -> tuple[int, str]:
        self._call_index += 1
        return self._call_index, self._iso(self._call_index)

    def _millis(self, call: int) -> int:
        return ts_millis(self.record.last_ts) + 1000 * call

    def _iso(self, call: int) -> str:
        moment = self._start + timedelta(seconds=call)
        return moment.strftime("%Y-%m-%dT%H:%M:%SZ")

    def _new_episode(self) -> None:
        self._episode_count += 1
        self._call_index = 0
        self._pending = []
        episode_id = digest_of([self.record.world_hash, self.instance_id, self._episode_count])
        self.episode = Episode(episode_id=episode_id, world_hash=self.record.world_hash,
                               persona=self.record.persona, day=self.record.day)

    def _check_open(self) -> None:
        if self._closed:
            raise InstanceClosed(f"instance {self.instance_id} is closed")


def _workspace_state(root: Path) -> dict[str, tuple[int, str, str | None]]:
    return {rel: (d.size, d.digest, d.link) for rel, d in
            ((rel, file_digest(p)) for rel, p in iter_workspace(root))}


def _file_changes(root: Path, before: dict[str, tuple[int, str, str | None]],
                  index: int) -> list[FileChange]:
    after = _workspace_state(root)
    deleted = [FileChange(index=index, path=p, data=None) for p in sorted(before)
               if p not in after]
    written = []
    for path in sorted(after):
        if before.get(path) == after[path]:
            continue
        link = after[path][2]
        data = None if link is not None else (root / "workspace" / path).read_bytes()
        written.append(FileChange(index=index, path=path, data=data, link=link))
    return deleted + written


_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine from synchronous code on one private event-loop thread."""
    global _LOOP
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        coro.close()
        raise RuntimeError("use the async API (acall_tool) inside an event loop")
    with _LOOP_LOCK:
        if _LOOP is None:
            _LOOP = asyncio.new_event_loop()
            threading.Thread(target=_LOOP.run_forever, name="agentworlds-loop",
                             daemon=True).start()
    return asyncio.run_coroutine_threadsafe(coro, _LOOP).result()
