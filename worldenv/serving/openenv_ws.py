"""OpenEnv's WebSocket protocol at ``/ws``, its stateless top-level ``/reset`` and ``/step``
and its ``/health``, as OpenEnv's server (``HTTPEnvServer``) serves them: OpenEnv's own
client (``EnvClient``: ``GenericEnvClient``, an environment's typed client) given the
gateway's base URL plays its tasks.

A session is a connection. Messages are JSON text, ``{"type": "reset", "data": {...}}``,
``{"type": "step", "data": <action>}``, ``{"type": "state"}``, ``{"type": "close"}``;
each is answered by ``{"type": "observation", "data": {"observation", "reward", "done",
"metadata"}}``, ``{"type": "state", "data": {...}}`` or ``{"type": "error", "data":
{"message", "code"}}`` with OpenEnv's codes (``INVALID_JSON``, ``UNKNOWN_TYPE``,
``VALIDATION_ERROR``, ``EXECUTION_ERROR``, ``CAPACITY_REACHED``). An error answers that
one message: the session goes on.

The first reset names what the session plays, ``reset(task="<task id>")`` (or ``world=``;
any field of ``POST /instances`` is taken: agent, shell, gui, max_steps, ...), and the
session checks out an instance of it. A later reset naming nothing new starts the next
episode on the same instance, the episode so far stored; one naming another task or
setup closes that instance (storing its episode) and checks out another. Steps are the
HTTP form's actions and observations (``worldenv.serving.openenv``); the episode ends
with the answer or at the step limit, graded by the task's verifier, whose reward it
carries. Each episode is stored under the ``episode_id`` the state and every answer's
metadata give (a reset's ``stored_episode_id`` names the one it stored).

Nothing outlives its connection: when the socket closes, cleanly or not, the session's
instance is closed at once and its episode stored. Sessions are capped
(``max_sessions``): beyond the cap a connection is accepted, told ``CAPACITY_REACHED`` and
closed, as OpenEnv's server does (once the client's first message has come, so the client
reads the error as its answer); instances stay capped as ever (``max_instances``: a reset
beyond it is ``CAPACITY_REACHED`` too, the session kept). A session sent nothing
for ``session_timeout`` seconds is closed, the reason in the close frame.

OpenEnv's top-level ``/reset`` and ``/step`` are stateless (a fresh environment per
request, closed after it): ``POST /reset`` opens an instance of the task named, answers
its first observation and closes it; ``POST /step`` is refused (409), since a world's step
acts on what the steps before it left, which an instance opened and dropped per request
cannot hold."""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress
from typing import Annotated, Any

import msgspec
from msgspec import UNSET, Meta, Struct
from starlette.requests import HTTPConnection, Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from worldenv.errors import HttpError
from worldenv.serving.hosting import Hosted, Hosting, Setup, hosting_of
from worldenv.serving.http import (
    JsonRoute,
    SocketRoute,
    check_depth,
    client_of,
    convert,
    decode_body,
    json_response,
    not_from_a_page,
    problem,
    shape,
    shown,
)
from worldenv.serving.openenv import action_of, reset_answer, state_of, take_step
from worldenv.serving.rest import MAX_MCP_BODY, CreateRequest, setup_of

# OpenEnv's error codes (its WSErrorCode), the ones this server sends.
INVALID_JSON = "INVALID_JSON"
UNKNOWN_TYPE = "UNKNOWN_TYPE"
VALIDATION_ERROR = "VALIDATION_ERROR"
EXECUTION_ERROR = "EXECUTION_ERROR"
CAPACITY_REACHED = "CAPACITY_REACHED"
MAX_MESSAGE = MAX_MCP_BODY  # a step's arguments may carry a file, as an MCP call's may
REFUSAL_WAIT = 5.0  # seconds a refused connection is kept for the client's first message
log = logging.getLogger("agentworlds.gateway")


class SessionMessage(Struct, forbid_unknown_fields=True, frozen=True):
    """A message from the client."""

    type: Annotated[str, Meta(description='"reset" | "step" | "state" | "close"')]
    data: Annotated[dict[str, Any], Meta(description=(
        "reset: a SessionReset; step: the action (as OpenEnv's step data, not wrapped in "
        '{"action": ...}); state and close: none'))] = msgspec.field(default_factory=dict)


class SessionReset(CreateRequest, forbid_unknown_fields=True, frozen=True):
    """A reset's data: what the session plays (the fields of ``POST /instances``; the
    first reset names a task or a world) and OpenEnv's own (ignored)."""

    seed: Annotated[int | None, Meta(description="ignored: worlds are deterministic")
                    ] = None
    episode_id: Annotated[str, Meta(max_length=255, description=(
        "ignored: the gateway draws the ids episodes are stored under"))] | None = None


_CREATE_FIELDS = CreateRequest.__struct_fields__


class Session:
    """One connection's session: the instance it holds (none before the first reset) and
    the setup it was checked out for."""

    def __init__(self, hosting: Hosting, client: str) -> None:
        self.hosting = hosting
        self.client = client
        self.hosted: Hosted | None = None
        self.made_from: tuple[Setup, str, bool | None] | None = None
        self.lost: str | None = None  # the instance closed under it, until the next reset

    async def reset(self, data: dict[str, Any]) -> dict[str, Any]:
        request = convert(data, SessionReset, "a reset's data")
        create = CreateRequest(**{f: getattr(request, f) for f in _CREATE_FIELDS})
        named = any(getattr(request, f) is not UNSET for f in _CREATE_FIELDS)
        hosted = self.live()
        if hosted is not None and not named:
            return reset_answer(hosted, await hosted.run_locked(hosted.reset))
        if not named:
            raise HttpError(400, "a session's first reset names what it plays: "
                                 f'reset(task="<task id>") ({served(self.hosting)}) or '
                                 'reset(world="persona@day")')
        made_from = setup_of(self.hosting, create)
        if hosted is not None and made_from == self.made_from:
            return reset_answer(hosted, await hosted.run_locked(hosted.reset))
        stored = None
        if hosted is not None:  # another task or setup: another instance
            closing = await self.release()
            stored = closing.get("episode_id") if closing else None
        setup, world, bare_names = made_from
        hosted = await self.hosting.create(setup, world, bare_names, self.client)
        hosted.held = True  # no await since create published it: the reaper never saw it
        self.hosted, self.made_from, self.lost = hosted, made_from, None
        return reset_answer(hosted, stored)

    async def step(self, data: dict[str, Any]) -> dict[str, Any]:
        hosted = self.live()
        if hosted is None and self.lost is not None:
            raise HttpError(409, f"the session's instance {self.lost} was closed (deleted "
                                 "by its id, or the gateway is shutting down): send a reset "
                                 "to check out another")
        if hosted is None:
            raise HttpError(409, 'no episode yet: send a reset first, naming the task '
                                 '(reset(task="<task id>"))')
        hosted.touch()
        return await take_step(self.hosting, hosted, action_of(data), "send a reset")

    def state(self) -> dict[str, Any]:
        hosted = self.live()
        if hosted is None:
            return {"episode_id": None, "step_count": 0, "done": False, "instance": None}
        hosted.touch()
        return {**state_of(hosted), "instance": hosted.id}

    def live(self) -> Hosted | None:
        """The instance held, unless it was closed meanwhile (a DELETE by its id, the
        gateway shutting down): then none, and the next reset checks out another."""
        hosted = self.hosted
        if hosted is not None and (hosted.closed or
                                   self.hosting.instances.get(hosted.id) is not hosted):
            self.hosted = self.made_from = None
            self.lost = hosted.id
            return None
        return hosted

    async def release(self) -> dict[str, Any] | None:
        """Close the instance held (its episode stored); what closing it left."""
        hosted, self.hosted, self.made_from = self.hosted, None, None
        return None if hosted is None else await self.hosting.release(hosted)


class Sessions:
    """A gateway's open sessions and their limits: at most `limit` at a time; one sent
    nothing for `timeout` seconds is closed."""

    def __init__(self, limit: int, timeout: float) -> None:
        self.limit = limit
        self.timeout = timeout
        self.open: set[Session] = set()


def sessions_of(connection: HTTPConnection) -> Sessions:
    sessions = connection.app.state.sessions
    assert isinstance(sessions, Sessions)
    return sessions


def served(hosting: Hosting) -> str:
    names = sorted(hosting.tasks)
    if not names:
        return "this gateway serves no tasks"
    return "served: " + ", ".join(names[:10]) + (f" and {len(names) - 10} more"
                                                 if len(names) > 10 else "")


def error(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code, **extra}}


def refusal(exc: HttpError) -> dict[str, Any]:
    """A refusal of the HTTP layer in OpenEnv's words: its code, the status beside it."""
    if exc.status == 429:
        code = CAPACITY_REACHED
    elif exc.status in (400, 404, 413, 422):
        code = VALIDATION_ERROR
    else:
        code = EXECUTION_ERROR
    return error(code, exc.message, status=exc.status, **exc.extra)


async def answer(session: Session, raw: str | bytes) -> dict[str, Any] | None:
    """The answer to one message; None for a close."""
    body = raw.encode() if isinstance(raw, str) else raw
    try:
        if len(body) > MAX_MESSAGE:
            raise HttpError(413, f"a message over {MAX_MESSAGE} bytes")
        check_depth(body)
        try:
            message = msgspec.json.decode(body, type=SessionMessage)
        except msgspec.ValidationError as exc:
            raise HttpError(400, f"{problem(exc)}: a message is {shape(SessionMessage)}"
                            ) from None
        except msgspec.DecodeError as exc:
            return error(INVALID_JSON, f"the message is not valid JSON: {exc}")
        if message.type == "reset":
            return {"type": "observation", "data": await session.reset(message.data)}
        if message.type == "step":
            return {"type": "observation", "data": await session.step(message.data)}
        if message.type == "state":
            return {"type": "state", "data": session.state()}
        if message.type == "close":
            return None
        return error(UNKNOWN_TYPE, f"unknown message type {shown(message.type)}: use "
                                   "reset, step, state or close")
    except HttpError as exc:
        return refusal(exc)
    except Exception as exc:  # a bug of ours: one line for the client, the trace logged
        log.exception("an OpenEnv session message failed")
        return error(EXECUTION_ERROR, f"internal error: {type(exc).__name__}")


async def session(websocket: WebSocket) -> None:
    """OpenEnv's WebSocket session (what ``EnvClient`` connects to): one session per
    connection, holding one instance from its first reset until the socket closes. Each
    message is a JSON `SessionMessage`: ``reset`` (data: a `SessionReset`; the first names
    the task, ``{"task": "<task id>"}``), ``step`` (data: an action, one of the forms of
    ``POST /instances/{iid}/openenv/step``), ``state`` or ``close``. Answers: ``{"type":
    "observation", "data": {observation, reward, done, metadata: {step, episode_id,
    stored_episode_id | truncated, grade}}}``, ``{"type": "state", "data": {episode_id,
    step_count, done, max_steps, task, agent, answer, calls, world_hash, instance}}``, or
    ``{"type": "error", "data": {message, code (OpenEnv's: INVALID_JSON, UNKNOWN_TYPE,
    VALIDATION_ERROR, EXECUTION_ERROR, CAPACITY_REACHED), status}}``; an error leaves the
    session open. Beyond the gateway's session cap the one message sent is
    CAPACITY_REACHED, then the socket is closed (code 1013) after the client's first
    message; a session idle past its timeout is closed
    (the reason in the close frame); when the socket closes the instance is closed and its
    episode stored under the ``episode_id`` the state gave."""
    hosting = hosting_of(websocket)
    sessions = sessions_of(websocket)
    await websocket.accept()
    if len(sessions.open) >= sessions.limit:
        await _send(websocket, error(
            CAPACITY_REACHED, f"the gateway already holds its maximum of {sessions.limit} "
                              "OpenEnv sessions: close one, or wait for idle ones to be "
                              "closed", active_sessions=len(sessions.open),
            max_sessions=sessions.limit))
        # OpenEnv's server closes at once, so its client's first send often meets the
        # close instead of the error; waiting for that first message lets the client read
        # the error as its answer. The close frame says it too (code 1013: try again later).
        with suppress(TimeoutError, WebSocketDisconnect, OSError):
            await asyncio.wait_for(websocket.receive(), REFUSAL_WAIT)
        await _close(websocket, f"CAPACITY_REACHED: {sessions.limit} OpenEnv sessions open",
                     1013)
        return
    held = Session(hosting, client_of(websocket.scope))
    sessions.open.add(held)
    try:
        reason = await _serve(websocket, held, sessions.timeout)
    except (WebSocketDisconnect, OSError):  # dropped: the instance goes all the same
        reason = ""
    finally:
        try:
            await held.release()
        finally:
            sessions.open.discard(held)
    await _close(websocket, reason)


async def _serve(websocket: WebSocket, held: Session, timeout: float) -> str:
    """Answer messages until a close, a disconnect or `timeout` seconds of silence; the
    reason the server gives when it closes the socket."""
    while True:
        try:
            message = await asyncio.wait_for(websocket.receive(), timeout)
        except TimeoutError:
            return f"no message for {timeout:g} s: the session is closed"
        if message["type"] == "websocket.disconnect":
            return ""
        raw = message.get("text")
        reply = await answer(held, raw if raw is not None else message.get("bytes") or b"")
        if reply is None:
            return ""
        await _send(websocket, reply)


async def _send(websocket: WebSocket, reply: dict[str, Any]) -> None:
    await websocket.send_text(msgspec.json.encode(reply).decode())


async def _close(websocket: WebSocket, reason: str = "", code: int = 1000) -> None:
    if (websocket.application_state == WebSocketState.CONNECTED
            and websocket.client_state == WebSocketState.CONNECTED):
        # the client went first: nothing left to close
        with suppress(WebSocketDisconnect, RuntimeError, OSError):
            await websocket.close(code, reason)


# --- the stateless endpoints ---------------------------------------------------------------


async def stateless_reset(request: Request) -> Response:
    """OpenEnv's stateless reset (body: ``SessionReset``, naming the task or world): an
    instance opened, its first observation, the instance closed (nothing happened, so
    nothing is stored) -> ``{"observation": {instruction, task, tools, ...}, "reward":
    null, "done": false}``. An episode is played over the WebSocket (``/ws``) or on an
    instance (``/instances/{iid}/openenv``)."""
    hosting = hosting_of(request)
    not_from_a_page(request.scope)
    body = await decode_body(request, SessionReset)
    if not any(getattr(body, f) is not UNSET for f in _CREATE_FIELDS):
        raise HttpError(400, 'name what to reset: {"task": "<task id>"} '
                             f'({served(hosting)}) or {{"world": "persona@day"}}')
    setup, world, bare_names = setup_of(hosting, CreateRequest(
        **{f: getattr(body, f) for f in _CREATE_FIELDS}))
    hosted = await hosting.create(setup, world, bare_names, client_of(request.scope))
    try:
        first = reset_answer(hosted, None)
    finally:
        await hosting.release(hosted)
    return json_response({"observation": first["observation"], "reward": None,
                          "done": False})


async def stateless_step(request: Request) -> Response:
    """OpenEnv's stateless step: refused (409). OpenEnv's server steps a fresh environment
    and drops it; a world's step acts on what the steps before it left, so it needs a
    session (``/ws``) or an instance (``/instances/{iid}/openenv/step``)."""
    not_from_a_page(request.scope)
    raise HttpError(409, "a step needs the episode it continues: OpenEnv's stateless "
                         "POST /step would act on a fresh world and drop it; connect to "
                         "the WebSocket /ws (a session per connection, as OpenEnv's "
                         "EnvClient does) or step an instance at "
                         "/instances/{iid}/openenv/step")


async def health(request: Request) -> Response:
    """OpenEnv's health check (what its providers poll): ``{"status": "healthy"}``."""
    return json_response({"status": "healthy"})


ROUTES: list[BaseRoute] = [
    SocketRoute("/ws", session, bodies=[SessionMessage, SessionReset]),
    JsonRoute("/reset", stateless_reset, methods=("POST",), bodies=[SessionReset]),
    JsonRoute("/step", stateless_step, methods=("POST",)),
    JsonRoute("/health", health, methods=("GET",))]
