"""Instances: an isolated, resettable copy of a world that agents act on through tools
and a shell, with every call recorded as an episode.

``Environment`` opens instances of ``persona@day`` (or of a world hash) from a ``Worlds``
store. An ``Instance`` owns a mount of the snapshot, one SQLite connection per service,
a deterministic clock (it starts at the snapshot's last timestamp and advances one second
per call) and the episode. The shell runs in the sandbox.

A tool call has one dispatch (``call_tool``, or ``acall_tool`` on an event loop): the
instance takes the call's index and clock (``worldenv.core.contract.CallContext``), finds the tool
and runs it: a shipped app's here (``worldenv.core.dispatch``: validate the arguments against its
schema, run it on this instance's database, encode the result), a carried app's in its
sandboxed worker, which receives the clock and does the same; then the call and its effects
join the episode. MCP servers (``worldenv.serving.mcp``) call this dispatch; nothing else sits
between.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import apsw
import msgspec

from replay.diff import WorldDiff
from replay.engine import Worlds
from replay.files import read_regular
from replay.layout import WORKSPACE, iter_apps, service_db, workspace_path
from replay.mount import Mount
from worldenv.apps import SHIPPED
from worldenv.core.app import App, ToolSpec
from worldenv.core.contract import CallClock, CallContext, ToolInfo, ToolResult
from worldenv.core.dispatch import (
    CompiledTool,
    compile_app,
    execute_sql,
    open_snapshot_tool_db,
    open_tool_db,
    tool_failure,
)
from worldenv.core.episode import (
    DbChange,
    Episode,
    FileChange,
    FormSubmission,
    GuiCall,
    ShellCall,
    ToolCall,
)
from worldenv.core.workspace import (
    Content,
    WorkspaceLimits,
    WorkspaceState,
    check_workspace,
    roll_back,
)
from worldenv.errors import AppLoadError, AppPinError, InstanceClosed, SandboxError, ToolError
from worldenv.gui.browser import Browser, Intercepted, Served, shared_browser
from worldenv.gui.site import PageRequest, PageResponse, Site, serve
from worldenv.gui.tools import GuiSession
from worldenv.sandbox.choice import default_sandbox, run_sandboxed
from worldenv.sandbox.workers import RemoteApp, RemoteTool, WorkerLimits, WorkerPool
from worldenv.sites import SHIPPED_SITES
from worldstore.canonical import digest_of
from worldstore.errors import InputError, PathError
from worldstore.names import check_relpath, ts_millis, ts_problem
from worldstore.store import DayRecord

__all__ = ["Environment", "GuiResult", "Instance", "ToolInfo", "ToolResult", "WorkspaceLimits",
           "read_pins"]

# Keyed by the identity of the App objects (kept alive by the entry, so ids stay unique).
_TABLES: dict[tuple[int, ...], tuple[tuple[App | RemoteApp, ...], _ToolTable]] = {}
_TABLES_LOCK = threading.Lock()
SQL_CALL = "sql"  # the name an episode records `Instance.sql` calls under


def read_pins(root: Path) -> dict[str, dict[str, Any]]:
    """The app pins of a world directory, by service."""
    pins = {}
    for name, path in iter_apps(root):
        if name.endswith(".json"):
            pin = msgspec.json.decode(path.read_bytes())
            pins[str(pin["service"])] = pin
    return pins


@dataclass(frozen=True, slots=True)
class _ToolTable:
    """The tools of one set of apps by name, built once and shared by every instance that
    the same apps serve: a shipped app's run here, a carried app's in its worker."""

    tools: dict[str, CompiledTool | RemoteTool]
    specs: dict[str, ToolSpec]
    infos: list[ToolInfo]


def _tool_table(apps: list[App | RemoteApp], *, bare: bool = False) -> _ToolTable:
    key = (*sorted(id(a) for a in apps), bare)
    with _TABLES_LOCK:
        found = _TABLES.get(key)
        if found is None:
            table = _build_table(apps)
            found = _TABLES[key] = (tuple(apps), _bare_table(table) if bare else table)
    return found[1]


def _bare_table(table: _ToolTable) -> _ToolTable:
    """The same tools under their bare names (``search_channels``, not
    ``awm_search_channels``: what agents trained on AWM's servers call them)."""
    tools: dict[str, CompiledTool | RemoteTool] = {}
    for full, tool in table.tools.items():
        bare = tool.spec.name
        if bare in tools:
            raise AppPinError(f"bare tool names need unique names: {bare!r} is a tool of "
                              f"service {tools[bare].spec.service!r} and of "
                              f"{tool.spec.service!r} ({full})")
        tools[bare] = tool
    infos = [dataclasses.replace(t.info, name=n) for n, t in sorted(tools.items())]
    return _ToolTable(dict(sorted(tools.items())), {n: t.spec for n, t in tools.items()},
                      infos)


def _build_table(apps: list[App | RemoteApp]) -> _ToolTable:
    tools: dict[str, CompiledTool | RemoteTool] = {}
    for app in sorted(apps, key=lambda a: a.service):
        served = compile_app(app).values() if isinstance(app, App) else app.tools()
        tools.update((tool.info.name, tool) for tool in served)
    return _ToolTable(tools, {n: t.spec for n, t in tools.items()},
                      [t.info for t in tools.values()])


class Environment:
    """Opens instances of stored worlds with the apps that serve their services."""

    def __init__(self, worlds: Worlds, apps: dict[str, App] | None = None, *,
                 check_pins: bool = True, lazy: bool = True,
                 workspace_limits: WorkspaceLimits | None = None,
                 bare_names: bool = False, worker_limits: WorkerLimits | None = None,
                 workers: WorkerPool | None = None, sites: dict[str, Site] | None = None,
                 browser: Callable[[], Browser] | None = None,
                 keep_screenshots: bool = True) -> None:
        """`apps` defaults to the shipped apps. With ``check_pins=False`` the world's app
        pins are ignored and `apps` serve its services by name (for testing other code
        against a world; never for training data). Instances are lazy mounts by default:
        opening one copies nothing, a service's database is copied on its first write and
        the workspace on the first shell command (``lazy=False`` copies all at open).
        `workspace_limits` are the quotas of every instance's workspace (see
        ``worldenv.core.workspace.WorkspaceLimits`` for the defaults). With ``bare_names=True``
        instances name their tools without the service prefix (``search_channels``: the
        ``operation_id`` names AWM-trained agents expect; ``open`` can say otherwise per
        instance), in the tool list and in meta-tool mode alike. `worker_limits` bound the
        sandboxed workers of carried apps (``worldenv.sandbox.workers.WorkerLimits`` by default).
        `workers`: a pool of carried-app workers shared with other environments (whose
        worlds share this one's snapshot cache, so the same code's worker serves them
        all); the caller closes it, ``close`` does not. `sites` are the web pages of the
        services (``worldenv.sites.SHIPPED_SITES`` by default); `browser` gives the browser GUI
        actions run in (the process's shared one by default, started on the first GUI
        action); with ``keep_screenshots=False`` episodes keep only the screenshots'
        digests."""
        self.worlds = worlds
        self.bare_names = bare_names
        self.workspace_limits = workspace_limits or WorkspaceLimits()
        self.apps = dict(SHIPPED if apps is None else apps)
        self.check_pins = check_pins
        self.lazy = lazy
        self._ids = itertools.count(1)
        self._pins: dict[str, dict[str, dict[str, Any]]] = {}
        self._pool: WorkerPool | None = workers
        self._owns_pool = workers is None
        self.worker_limits = worker_limits
        self.sites = dict(SHIPPED_SITES if sites is None else sites)
        self.browser = browser or shared_browser
        self.keep_screenshots = keep_screenshots

    def close(self) -> None:
        """Stop the sandboxed workers of carried apps (instances stay usable for shipped
        apps; a carried app's next call starts its worker again)."""
        if not self._owns_pool:
            return
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def __enter__(self) -> Environment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self, ref: str, *, bare_names: bool | None = None) -> Instance:
        """An instance of `ref`; `bare_names` (default: the environment's) names its tools
        without their service prefix."""
        record = self.worlds.record(ref)
        mount = self.worlds.mount(record.world_hash, lazy=self.lazy)
        try:
            apps = self._apps_for(mount)
        except AppPinError:
            mount.close()
            raise
        try:
            instance = Instance(mount, record, apps, instance_id=f"i{next(self._ids)}",
                                workspace_limits=self.workspace_limits,
                                bare_names=self.bare_names if bare_names is None
                                else bare_names)
        except AppPinError:
            mount.close()
            raise
        instance.sites = {service: site for service, site in sorted(self.sites.items())
                          if service in mount.manifest.services}
        instance.browser = self.browser
        instance.keep_screenshots = self.keep_screenshots
        return instance

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
        code = (mount.snapshot / "apps" / f"{service}.py").read_text(encoding="utf-8")
        if self._pool is None:
            self._pool = WorkerPool(self.worker_limits)
        try:
            return self._pool.app(service, code, mount.path.parent)
        except AppLoadError as exc:
            raise AppPinError(f"service {service!r}: the app {pin['app']!r} carried in the "
                              f"world's log cannot be served: {exc}") from exc


class Instance:
    """One agent's private world. Not for concurrent use by several agents."""

    def __init__(self, mount: Mount, record: DayRecord, apps: list[App | RemoteApp], *,
                 instance_id: str, workspace_limits: WorkspaceLimits | None = None,
                 bare_names: bool = False) -> None:
        """`workspace_limits` (default ``WorkspaceLimits()``) bound what shell calls may
        leave; each is raised to what the snapshot itself holds. `bare_names`: tools are
        named without their service prefix (refused if two services share a name)."""
        self.mount = mount
        self.workspace_limits = (workspace_limits or WorkspaceLimits()).covering(
            mount.manifest)
        self._workspace: WorkspaceState | None = None  # after the last call, once scanned
        self.record = record
        self.instance_id = instance_id
        table = _tool_table(apps, bare=bare_names)
        self.bare_names = bare_names
        self._tools = table.tools
        self.tools: dict[str, ToolSpec] = table.specs
        self._infos = table.infos
        self._remote = [a for a in apps if not isinstance(a, App)]
        self._conns: dict[str, tuple[apsw.Connection, bool]] = {}
        self._lock = threading.RLock()
        self._closed = False
        self._episode_count = 0
        # The web pages and the browser (set by Environment.open; none for a bare Instance).
        self.sites: dict[str, Site] = {}
        self.browser: Callable[[], Browser] = shared_browser
        self.keep_screenshots = True
        self._gui: GuiSession | None = None
        self._page_call: _PageCall | None = None
        self._settled: str | None = None  # the world's hash since the last call (settle)
        self.hashes = 0  # times the whole world was hashed (each reads every part)
        self._new_episode()

    # --- the agent's surface -------------------------------------------------------

    def list_tools(self) -> list[ToolInfo]:
        """Every tool of this instance's services, sorted by name."""
        return list(self._infos)

    def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> ToolResult:
        """Call one tool, in this thread. A bad call (unknown tool, bad arguments, a
        refusal) is an error result for the agent, never an exception."""
        call = self._start_call(name, arguments)
        return self._finish_call(call, self._dispatch(call))

    def runs_inline(self, name: str) -> bool:
        """Whether a call of `name` runs in this process: a shipped app's tool (SQLite
        under the SQL gate's budget, well under a millisecond), or a name no app serves
        (refused at once). A carried app's tool waits for its sandboxed worker."""
        return not isinstance(self._tools.get(name), RemoteTool)

    def sql(self, service: str, statement: str, params: list[Any] | None = None
            ) -> ToolResult:
        """Run SQL on one service's database under the gate every event's SQL passes (no
        ATTACH, no transaction control, no pragma or function that reaches outside the
        database; the call's frozen clock and seeded randomness). Its writes join the
        episode as a tool call's do, recorded as a call of ``sql``; a refusal or an SQL
        error is an error result, and changes nothing."""
        call = self._start_call(SQL_CALL, {"service": service, "sql": statement,
                                           "params": list(params or [])})
        if service not in self.mount.manifest.services:
            result = ToolResult(True, f"no service {service!r} in this world; its services: "
                                      f"{', '.join(sorted(self.mount.manifest.services))}")
        else:
            result = execute_sql(self._connection(service, writes=True), service, statement,
                                 list(params or []), call.context)
        return self._finish_call(call, result, writes=True)

    def set_clock(self, ts: str) -> None:
        """Let the episode's clock read `ts` at the next call (one second more per call
        after it): a day's implementer follows the plan's times. The clock only goes
        forward: `ts` before the next call's time is refused (``InputError``)."""
        self._check_open()
        problem = ts_problem(ts)
        if problem is not None:
            raise InputError(f"clock: {problem}")
        wanted = ts_millis(ts) // 1000 * 1000  # the clock ticks in whole seconds
        next_call = self._clock(self._call_index + 1)
        if wanted < next_call.millis:
            raise InputError(f"clock {ts}: before the episode's next call time "
                             f"{next_call.now}; the clock only goes forward")
        self._clock_base = (_iso(wanted), self._call_index + 1)

    async def acall_tool(self, name: str, arguments: dict[str, Any] | None = None
                         ) -> ToolResult:
        """`call_tool` for an event loop: a shipped app's tool runs inline (SQLite, well
        under a millisecond), a carried app's waits for its worker in a thread."""
        call = self._start_call(name, arguments)
        if isinstance(call.tool, RemoteTool):
            result = await asyncio.to_thread(self._dispatch, call)
        else:
            result = self._dispatch(call)
        return self._finish_call(call, result)

    def shell(self, command: str, limits: Any = None, *,
              env: dict[str, str] | None = None) -> ShellCall:
        """Run `command` in the workspace inside the sandbox; file changes join the episode.
        `env` adds variables to the sandbox's environment (a re-execution check runs the
        same commands under another time zone, say).

        What the command left is checked first (``worldenv.core.workspace``): a special file, a
        name no world can hold or a broken quota makes the call an error result
        (``refused`` says why, ``exit_code`` is None) and its changes are rolled back."""
        self._check_open()
        index = self._next_call()
        workspace = self.mount.workspace  # a lazy mount copies the workspace now
        before = self._workspace_before(workspace)
        outcome = (run_sandboxed(command, workspace, limits) if env is None
                   else default_sandbox().run(command, workspace, limits, env=env))
        checked = check_workspace(workspace, self.workspace_limits, before)
        refused = checked if isinstance(checked, str) else None
        if isinstance(checked, str):
            self._roll_back(workspace, before)
        else:
            self._workspace = checked.state
        stderr = outcome.stderr
        if refused is not None:
            stderr += ("" if not stderr or stderr.endswith("\n") else "\n") + (
                f"error: {refused}; the command's changes to the workspace were rolled back\n")
        call = ShellCall(index=index, ts=self._clock(index).now, command=command,
                         exit_code=None if refused else outcome.exit_code,
                         stdout=outcome.stdout, stderr=stderr, truncated=outcome.truncated,
                         timed_out=outcome.timed_out, refused=refused)
        self.episode.events.append(call)
        if not isinstance(checked, str):
            self.episode.events.extend(
                FileChange(index=index, path=c.path, data=c.data, link=c.link)
                for c in checked.changes)
        return call

    # --- the web pages and the browser (worldenv.gui.site, worldenv.gui.tools)
    # ----------------------------

    def page(self, method: str, target: str, body: bytes = b"") -> PageResponse:
        """One request of the instance's web pages (``/shop/products?q=x``; a form's body
        as ``application/x-www-form-urlencoded``), recorded in the episode as a GUI call
        ``request``: a form's tool runs under its clock and its writes join the episode."""
        index = self._next_gui_call()
        context = CallContext(self._clock(index))
        request = PageRequest.of(method, target, body)
        self._page_call = _PageCall(context, [])
        try:
            response = serve(self.sites, self, request, context.clock.now)
        finally:
            call, self._page_call = self._page_call, None
        arguments: dict[str, object] = {"method": request.method, "target": target}
        if request.form:
            arguments["form"] = dict(request.form)
        text = f"{response.status} {response.content_type}" + (
            f" -> {response.location}" if response.location else "")
        self._record_gui(call, GuiCall(
            index=index, ts=context.clock.now, action="request", arguments=arguments,
            is_error=response.status >= 400, text=text, url=request.path,
            forms=call.forms))
        return response

    def gui(self, action: str, arguments: dict[str, Any] | None = None) -> GuiResult:
        """One GUI action in the instance's browser page (``worldenv.gui.tools``: open, screenshot,
        click, type, key, scroll, read), recorded as a ``GuiCall`` with the digest of the
        screenshot after it. A bad action is an error result, never an exception; the
        browser starts with the first action."""
        index = self._next_gui_call()
        context = CallContext(self._clock(index))
        arguments = dict(arguments or {})
        if self._gui is None:
            self._gui = GuiSession(self.browser, self._serve_intercepted)
        self._page_call = _PageCall(context, [])
        try:
            outcome = self._gui.act(action, arguments)
        finally:
            call, self._page_call = self._page_call, None
        text = outcome.text + "".join(f"\nthe form was refused: {form.text}"
                                      for form in call.forms if form.is_error)
        self._record_gui(call, GuiCall(
            index=index, ts=context.clock.now, action=action, arguments=arguments,
            is_error=outcome.is_error, text=text, url=outcome.url,
            screenshot=outcome.screenshot, forms=call.forms))
        if outcome.png is not None and outcome.screenshot is not None and self.keep_screenshots:
            self.episode.screenshots[outcome.screenshot] = outcome.png
        return GuiResult(outcome.is_error, text, outcome.png, outcome.url, outcome.screenshot)

    def _next_gui_call(self) -> int:
        self._check_open()
        return self._next_call()

    def _record_gui(self, call: _PageCall, record: GuiCall) -> None:
        self.episode.events.append(record)
        self.episode.events.extend(
            DbChange(index=record.index, service=e.service, changeset=e.changeset,
                     sequences=e.sequences) for e in call.context.effects)

    def _serve_intercepted(self, request: Intercepted) -> Served:
        """A request the browser page made, served by this instance's pages (it runs in
        the thread of the GUI action that caused it)."""
        call = self._page_call
        if call is None:  # nothing of ours is running: nothing may change the world
            return Served(0, [], b"")
        response = serve(self.sites, self, PageRequest.of(request.method, request.url,
                                                          request.body),
                         call.context.clock.now)
        return Served(response.status, response.headers(), response.body)

    # SiteHost: what the pages read and the forms call.

    def site_rows(self, service: str, sql: str, params: Sequence[Any] | Mapping[str, Any]
                  ) -> list[dict[str, Any]]:
        if service not in self.mount.manifest.services:
            raise ToolError(f"no service {service!r} in this world")
        conn = self._connection(service, writes=False)
        saved = conn.authorizer
        conn.authorizer = _reads_only
        try:
            cursor = conn.execute(sql, params)
            try:
                names = [d[0] for d in cursor.getdescription()]
            except apsw.ExecutionCompleteError:
                return []
            return [dict(zip(names, row, strict=True)) for row in cursor]
        except apsw.AuthError:
            raise ToolError("a page only reads its databases") from None
        finally:
            conn.authorizer = saved

    def site_file(self, path: str) -> bytes | None:
        try:
            check_relpath(path)
        except PathError:
            return None
        for event in reversed(self.episode.events):
            if isinstance(event, FileChange) and event.path == path:
                return event.data
        try:
            source = workspace_path(self.mount.snapshot, path)  # no symlink on the way
            return read_regular(source, limit=self.workspace_limits.max_file_bytes)
        except (OSError, PathError):
            return None

    def site_call(self, service: str, tool: str, arguments: dict[str, Any]) -> ToolResult:
        call = self._page_call
        if call is None:
            raise ToolError("a form's tool runs only within a GUI call")
        found = next((t for t in self._tools.values()
                      if t.spec.service == service and t.spec.name == tool), None)
        if found is None:
            result = ToolResult(True, f"the site's form calls {service}.{tool}, which no "
                                      "app of this world serves")
        elif isinstance(found, CompiledTool):
            spec = found.spec
            result = found.call(lambda: self._connection(spec.service, writes=spec.writes),
                                dict(arguments), call.context)
        else:
            result = self._run_in_worker(found, dict(arguments), call.context)
        call.forms.append(FormSubmission(tool=found.info.name if found else tool,
                                         arguments=dict(arguments), is_error=result.is_error,
                                         text=result.text if result.is_error else ""))
        return result

    def _workspace_before(self, workspace: Path) -> WorkspaceState:
        """The workspace as the last call left it (scanned once, then carried along)."""
        if self._workspace is None:
            found = check_workspace(workspace, self.workspace_limits, None, changes=False)
            if isinstance(found, str):
                raise SandboxError(f"instance {self.instance_id}: its workspace is refused "
                                   f"before any command runs: {found}")
            self._workspace = found.state
        return self._workspace

    def _roll_back(self, workspace: Path, before: WorkspaceState) -> None:
        roll_back(workspace, before, self._content_before)
        again = check_workspace(workspace, self.workspace_limits, before, changes=False)
        if isinstance(again, str) or again.changes:
            self._workspace = None
            raise SandboxError(f"instance {self.instance_id}: the workspace could not be "
                               f"rolled back ({again if isinstance(again, str) else 'changed'})")
        self._workspace = again.state

    def _content_before(self, path: str) -> Content:
        """A workspace file as it was before this call: its last write in the episode,
        else the snapshot's copy."""
        for event in reversed(self.episode.events):
            if isinstance(event, FileChange) and event.path == path:
                return event.data, event.link
        source = self.mount.snapshot / WORKSPACE / path
        if source.is_symlink():
            return None, os.readlink(source)
        data = read_regular(source, limit=self.workspace_limits.max_file_bytes)
        assert data is not None  # the limits cover every snapshot file
        return data, None

    def reset(self) -> None:
        """Back to the snapshot (same hash), with a fresh episode and clock."""
        self._check_open()
        with self._lock:
            self._close_gui()
            self._close_connections()
            self.mount.reset()
            self._workspace = None
            self._settled = None
            self._new_episode()

    def settle(self) -> str:
        """Make the world whole on disk and return its hash: the connections closed
        (their journals settled) and every lazy part copied, so ``mount.path`` is the
        world W a verifier reads. The hash is kept until the next call: a rollout settles
        once at its end and passes the hash on (the stored episode, the rollout, grading)
        instead of hashing the world again."""
        self._check_open()
        if self._settled is None:
            self.hash()
        assert self._settled is not None
        return self._settled

    def hash(self) -> str:
        """The world's hash now, computed again (every part hashed): ``settle`` keeps it."""
        self._check_open()
        self._close_connections()
        self.hashes += 1
        self._settled = self.mount.hash()
        return self._settled

    def diff(self) -> WorldDiff:
        self._check_open()
        self._close_connections()
        return self.mount.diff()

    def close(self) -> None:
        """Delete the instance; safe to call twice."""
        if not self._closed:
            self._closed = True
            self._close_gui()
            self._close_connections()
            self.mount.close()

    def __enter__(self) -> Instance:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the one dispatch of a tool call ---------------------------------------------

    def _start_call(self, name: str, arguments: dict[str, Any] | None) -> _PendingCall:
        """The call's place in the episode, its clock and its tool (None: unknown)."""
        self._check_open()
        context = CallContext(self._clock(self._next_call()))
        return _PendingCall(name, dict(arguments or {}), self._tools.get(name), context)

    def _dispatch(self, call: _PendingCall) -> ToolResult:
        """Run the call: a shipped app's tool here (it validates its arguments, then runs
        on this instance's database), a carried app's in its sandboxed worker."""
        tool = call.tool
        if tool is None:
            return ToolResult(True, f"Unknown tool {call.name!r}. Valid tools: "
                                    f"{', '.join(sorted(self._tools))}")
        if isinstance(tool, CompiledTool):
            spec = tool.spec
            return tool.call(lambda: self._connection(spec.service, writes=spec.writes),
                             call.arguments, call.context)
        return self._run_in_worker(tool, call.arguments, call.context)

    def _run_in_worker(self, tool: RemoteTool, arguments: dict[str, Any],
                       context: CallContext) -> ToolResult:
        service = tool.spec.service
        try:
            db = service_db(self.mount.path, service)  # names it for forget, whatever is read
            source = self.mount.read_db_path(service)
            if tool.spec.writes and tool.info.reads_first and source != db:
                # Most such calls only read: try on the snapshot before copying anything.
                result = tool.call(arguments, context, db=db, source=source, read_first=True)
                if result is not None:
                    return result
            if tool.spec.writes:
                self.mount.db_path(service)  # a lazy instance copies its database now
                source = self.mount.read_db_path(service)
        except Exception as exc:
            return tool_failure(tool.info.name, exc)
        result = tool.call(arguments, context, db=db, source=source)
        assert result is not None  # only a read-first call asks to be run again
        return result

    def _finish_call(self, call: _PendingCall, result: ToolResult, *, writes: bool = False
                     ) -> ToolResult:
        """Record the call, then its effects, in the episode."""
        index = call.context.clock.index
        self.episode.events.append(ToolCall(
            index=index, ts=call.context.clock.now, tool=call.name, arguments=call.arguments,
            is_error=result.is_error, text=result.text, structured=result.structured,
            writes=writes or (call.tool is not None and call.tool.spec.writes)))
        self.episode.events.extend(
            DbChange(index=index, service=e.service, changeset=e.changeset,
                     sequences=e.sequences) for e in call.context.effects)
        return result

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

    def _close_gui(self) -> None:
        gui, self._gui = self._gui, None
        if gui is not None:
            gui.close()

    def _close_connections(self) -> None:
        conns, self._conns = self._conns, {}
        for conn, _writable in conns.values():
            conn.close()
        for app in self._remote:  # carried apps keep their connections in their worker
            app.worker.forget(service_db(self.mount.path, app.service))

    def _next_call(self) -> int:
        self._settled = None  # the call may change the world
        self._call_index += 1
        return self._call_index

    def _clock(self, index: int) -> CallClock:
        start, first = self._clock_base
        clock = CallClock.of_call(start, self.record.world_hash, index - first)
        # The seed stays the call's position in the episode, wherever the clock was set.
        return dataclasses.replace(clock, index=index, seed=f"{self.record.world_hash}:{index}")

    def _new_episode(self) -> None:
        self._episode_count += 1
        self._call_index = 0
        self._clock_base = (self.record.last_ts, 0)
        episode_id = digest_of([self.record.world_hash, self.instance_id, self._episode_count])
        self.episode = Episode(episode_id=episode_id, world_hash=self.record.world_hash,
                               persona=self.record.persona, day=self.record.day)

    def _check_open(self) -> None:
        if self._closed:
            raise InstanceClosed(f"instance {self.instance_id} is closed")


def _iso(millis: int) -> str:
    """The whole-second timestamp of `millis` since the epoch (no time zone involved)."""
    return datetime.fromtimestamp(millis // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class GuiResult:
    """What a GUI action shows the agent: text, and the screenshot after it (PNG)."""

    is_error: bool
    text: str
    image: bytes | None
    url: str | None
    screenshot: str | None = None  # the image's digest


@dataclass(frozen=True, slots=True)
class _PageCall:
    """A GUI call in progress: its clock and effects, and the forms it submitted."""

    context: CallContext
    forms: list[FormSubmission]


_READS = frozenset({apsw.SQLITE_SELECT, apsw.SQLITE_READ, apsw.SQLITE_FUNCTION,
                    apsw.SQLITE_RECURSIVE})


def _reads_only(operation: int, *_args: object) -> int:
    return apsw.SQLITE_OK if operation in _READS else apsw.SQLITE_DENY


@dataclass(frozen=True, slots=True)
class _PendingCall:
    """A tool call between its start (index, clock) and its record in the episode."""

    name: str
    arguments: dict[str, Any]
    tool: CompiledTool | RemoteTool | None
    context: CallContext
