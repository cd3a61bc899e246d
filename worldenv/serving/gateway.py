"""The gateway: many instances of one ``Environment`` behind one HTTP server, a Starlette
app assembled from rooms of its own:

- ``worldenv.serving.http``: the HTTP layer (the token or loopback guard, bodies read,
  bounded and decoded into msgspec Structs, errors as one JSON line);
- ``worldenv.serving.hosting``: the instances hosted (ids, caps, idle reaping, closing,
  tasks and grading);
- ``worldenv.serving.rest``: the JSON API and each instance's MCP endpoint;
- ``worldenv.serving.openenv``: OpenEnv's reset / step / state of one instance;
- ``worldenv.serving.openenv_ws``: OpenEnv's WebSocket sessions (``/ws``, a session per
  connection, an instance per session) and its top-level ``/reset``, ``/step``, ``/health``;
- ``worldenv.serving.pages``: an instance's web pages, proxied;
- ``worldenv.serving.reference``: the HTTP reference, generated from the routes.

Agents (or the trainer that drives them) create instances over a small JSON API and talk
to each instance's MCP server over streamable HTTP (``/instances/{id}/mcp``), its REST
endpoints, OpenEnv's (``/instances/{id}/openenv/...``) or its pages
(``/instances/{id}/gui/...``); OpenEnv's own client connects to ``/ws`` instead, each
connection a session holding one instance of the task its first reset names;
``http_reference_markdown()`` lists them all.

Beside its service tools (or ``list_tools``/``call_tool`` in meta mode) an instance's MCP
server has ``shell(command)`` and ``answer(text)`` when enabled: by default both for a
task that declares the shell interface, the answer alone for any other task, neither
without a task. Shell commands run like tool calls (worker thread, lock, timeout) and are
recorded in the episode; the answer is recorded on it (one per episode). With ``"gui":
true`` (the default for a task that declares the gui interface) an instance also has the
GUI tools (``worldenv.gui.tools``), actions in its own page of the shared sandboxed
browser; REST's ``/gui`` and OpenEnv's ``{"gui": {"action", "arguments"}}`` do the same.
A malformed action is a 400 over REST and OpenEnv; one the page cannot do is an error
result, as over MCP.

Instances share the gateway's origin, so nothing served for one may act on another: an
instance's id is unguessable (``i3-`` and 128 random bits, the capability in every URL of
the instance); a page request made by a page is served only when that page is one of the
same instance's; and the JSON API does not act on a non-GET request a web page made
(``Sec-Fetch-Site`` other than ``none``, or an ``Origin`` header): a form's
``text/plain`` body is valid JSON. JSON answers carry ``nosniff`` and a ``sandbox``
policy, so a browser sent to one renders nothing of it.

Every episode is stored in the world store (``worldenv.instances.episodes.save_episode``)
when its instance is closed (DELETE, idle reaping, shutdown) or reset, unless it has no
calls and no answer; its id is drawn when it starts, so the ``episode_id`` clients see is
the stored episode's from the first response on. Tasks are injected (``tasks``:
``ServedTask`` by id, built by ``gates.served``: ``worldenv`` never imports ``gates``).

What a model reads through any of these is rendered by ``worldenv.protocol.observation``,
as the LLM agent and the RL loop render it.

Instances idle for ``idle_timeout`` seconds are closed and their directories deleted; at
most ``max_instances`` exist at a time, at most ``max_gui_instances`` with the GUI, and
``max_gui_per_client`` of them per client (the peer address): beyond a cap a create
request is 429 with ``{"error", "cap", "limit"}``. With a token, every request needs
``Authorization: Bearer <token>``; ``serve`` refuses to listen beyond loopback without
one. Without a token, only requests addressed to a loopback host (and from no or a
loopback ``Origin``) are answered.

Every request is parsed in one layer before anything acts on it: a body over
``MAX_BODY`` (``MAX_MCP_BODY`` for MCP) is 413, JSON nested deeper than ``MAX_DEPTH`` is
refused before it is decoded, a world reference is bounded in length and in its day (a
64-bit integer) before the library resolves it, and the library's errors map to
statuses in one place (``status_of``: not found 404, conflict 409, any other
``WorldError`` 400). A malformed request gets a 4xx with ``{"error": "..."}`` naming what
was wrong; an unexpected failure a 500 with one line, never a traceback.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute

from worldenv.errors import GatewayError
from worldenv.instances.instance import Environment
from worldenv.serving import openenv, openenv_ws, pages, rest
from worldenv.serving.hosting import (
    CLOSED_KEPT,
    ID_BYTES,
    MAX_GUI_INSTANCES,
    MAX_GUI_PER_CLIENT,
    MAX_STEPS,
    Grade,
    Grader,
    Hosting,
    ServedTask,
)
from worldenv.serving.http import (
    EXCEPTION_HANDLERS,
    MAX_BODY,
    MAX_DEPTH,
    Guard,
    Receive,
    Scope,
    Send,
    Slashes,
    from_loopback,
    is_loopback,
)
from worldenv.serving.mcp import Mode
from worldenv.serving.openenv_ws import Sessions
from worldenv.serving.pages import PageLinks
from worldenv.serving.rest import MAX_MCP_BODY, MAX_REF

__all__ = ["CLOSED_KEPT", "DEFAULT_HOST", "DEFAULT_PORT", "ID_BYTES", "MAX_BODY", "MAX_DEPTH",
           "MAX_GUI_INSTANCES", "MAX_GUI_PER_CLIENT", "MAX_MCP_BODY", "MAX_REF", "MAX_STEPS",
           "ROUTES", "Gateway", "Grade", "Grader", "ServedTask", "check_bind", "from_loopback",
           "is_loopback", "serve"]

DEFAULT_HOST = "127.0.0.1"
# Every route of the gateway, room by room: the HTTP reference walks these.
ROUTES: list[BaseRoute] = [*rest.ROUTES, *openenv.ROUTES, *openenv_ws.ROUTES, *pages.ROUTES]
DEFAULT_PORT = 8765


class Gateway(Hosting):
    """An ASGI app (Starlette) serving instances of one environment (REST, MCP, OpenEnv,
    pages); see the module docstring. Run it with ``serve`` or any ASGI server with
    lifespan support, once: its shutdown closes every instance and its tool threads.

    `token`: the bearer token every request needs (none: loopback only); `mode` is the
    MCP surface of instances created without one; `workers` caps the threads that run
    tool calls (default ``min(64, max_instances)``); `reap_interval` is how often idle
    instances are looked for (default a quarter of `idle_timeout`, at most 5 s). `tasks`
    (by task id) are what instances can be created for and graded against; `max_steps` is
    the OpenEnv step limit of instances created without one; `max_gui_instances` and
    `max_gui_per_client` cap the instances with the GUI (each holds a browser page) in all
    and per client (the peer address). `max_sessions` caps OpenEnv's WebSocket sessions
    (default `max_instances`: each holds an instance); `session_timeout` is how long one
    may send nothing before it is closed (default `idle_timeout`)."""

    def __init__(self, environment: Environment, *, token: str | None = None,
                 max_instances: int = 256, idle_timeout: float = 600.0,
                 call_timeout: float = 30.0, mode: Mode = "tools",
                 reap_interval: float | None = None, workers: int | None = None,
                 tasks: Mapping[str, ServedTask] | None = None,
                 max_steps: int = MAX_STEPS, max_gui_instances: int = MAX_GUI_INSTANCES,
                 max_gui_per_client: int = MAX_GUI_PER_CLIENT,
                 max_sessions: int | None = None,
                 session_timeout: float | None = None) -> None:
        if token is not None and not token.strip():
            raise GatewayError("the bearer token is empty: give a real token or none")
        if max_sessions is not None and max_sessions < 1:
            raise GatewayError(f"max_sessions must be at least 1, not {max_sessions}")
        if session_timeout is not None and session_timeout <= 0:
            raise GatewayError("session_timeout must be positive seconds")
        super().__init__(environment, max_instances=max_instances, idle_timeout=idle_timeout,
                         call_timeout=call_timeout, mode=mode, reap_interval=reap_interval,
                         workers=workers, tasks=tasks, max_steps=max_steps,
                         max_gui_instances=max_gui_instances,
                         max_gui_per_client=max_gui_per_client)
        self.sessions = Sessions(max_sessions or max_instances,
                                 session_timeout or idle_timeout)
        self.app = app(self, token, self.sessions)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


def app(hosting: Hosting, token: str | None = None, sessions: Sessions | None = None
        ) -> Starlette:
    """The Starlette app serving `hosting` (and its OpenEnv `sessions`, by default capped
    and timed out as its instances): the guard (token or loopback), the pages' own links
    redirected under their instance, then the routes of each room."""

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        hosting.startup()
        try:
            yield
        finally:
            await hosting.shutdown()

    served = Starlette(routes=ROUTES, lifespan=lifespan,
                       middleware=[Middleware(Guard, token=token), Middleware(PageLinks),
                                   Middleware(Slashes)],
                       exception_handlers=dict(EXCEPTION_HANDLERS))
    served.router.redirect_slashes = False  # Slashes has made every path its endpoint's
    served.state.hosting = hosting  # what the handlers act on (``hosting_of``)
    served.state.sessions = sessions or Sessions(hosting.max_instances, hosting.idle_timeout)
    return served


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
