"""The gateway's JSON API: create, list, inspect, reset, close instances; a shell command,
the answer, a GUI action, a grade on one; the tasks served; health. Request bodies are
msgspec Structs (a field a Struct does not know is refused: a typo must not pass unseen);
the MCP endpoint of each instance is routed here too."""

from __future__ import annotations

import base64
import re
from typing import Annotated, Any

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from worldenv.errors import HttpError
from worldenv.gui.tools import GUI_ACTIONS, gui_argument_problem
from worldenv.protocol.actions import GuiAction, Observation, ShellAction
from worldenv.serving.hosting import MAX_STEPS, Hosted, Hosting, Setup, enabled, hosting_of
from worldenv.serving.http import (
    JsonRoute,
    Message,
    Receive,
    Scope,
    Send,
    check_depth,
    client_of,
    decode_body,
    json_bytes_response,
    json_response,
    not_from_a_page,
    read_body,
    shown,
)
from worldenv.serving.mcp import Mode

MAX_MCP_BODY = 8 << 20  # an MCP request: a tool call's arguments may carry a file
MAX_REF = 256  # characters of a world reference
DAY_LIMIT = 1 << 63  # a day is a signed 64-bit integer in every store
_REF_DAY = re.compile(r"@(-?\d+)\Z")  # \d as the library reads a day: any digits
MAX_LABEL = 200  # characters of an agent label

class CreateRequest(Struct, forbid_unknown_fields=True, frozen=True):
    """``POST /instances``: every field may be left out (the world then is the task's)."""

    world: Annotated[str, Meta(min_length=1, max_length=MAX_REF, description=(
        '"persona@day", a persona, or a world hash (default: the task\'s world)'))
        ] | UnsetType = UNSET
    mode: Annotated[Mode, Meta(description=(
        "the MCP surface: the service tools, or list_tools/call_tool (default: the "
        "gateway's)"))] | UnsetType = UNSET
    bare_names: Annotated[bool, Meta(description=(
        "tools without the service prefix (AWM's operation_id names)"))] | UnsetType = UNSET
    task: Annotated[str, Meta(description="a task id (GET /tasks)")] | UnsetType = UNSET
    agent: Annotated[str, Meta(pattern=r"\S", max_length=MAX_LABEL, description=(
        "a label stored with the episode"))] | UnsetType = UNSET
    shell: Annotated[bool, Meta(description=(
        "the shell tool (default: when the task declares the shell interface)"))
        ] | UnsetType = UNSET
    answer: Annotated[bool, Meta(description=(
        "the answer tool (default: when there is a task)"))] | UnsetType = UNSET
    gui: Annotated[bool, Meta(description=(
        "the GUI: pages and gui_ tools (default: when the task declares it)"))
        ] | UnsetType = UNSET
    max_steps: Annotated[int, Meta(ge=1, le=1_000_000, description=(
        f"OpenEnv's step limit (default: the gateway's, {MAX_STEPS} unless set)"))
        ] | UnsetType = UNSET


class ShellRequest(Struct, forbid_unknown_fields=True, frozen=True):
    command: Annotated[str, Meta(pattern=r"\S", description="one bash command")]


class AnswerRequest(Struct, forbid_unknown_fields=True, frozen=True):
    text: Annotated[str, Meta(description="the final answer")]


class GuiRequest(Struct, forbid_unknown_fields=True, frozen=True):
    # Any, checked after decoding: an unknown action is named as one, with the list.
    action: Annotated[Any, Meta(description=" | ".join(f'"{a}"' for a in GUI_ACTIONS))
                      ] = None
    arguments: Annotated[Any, Meta(description=(
        "the arguments of the gui_ tool of that name (an object)"))] = msgspec.field(
        default_factory=dict)


class GradeRequest(Struct, forbid_unknown_fields=True, frozen=True):
    task: Annotated[str, Meta(description="a task id (default: the instance's)")
                    ] | UnsetType = UNSET
    answer: Annotated[str | None, Meta(description="the answer graded (default: the "
                                                   "answer given)")] | UnsetType = UNSET


GUI_SHAPE = ('{"action": "open" | "screenshot" | "click" | "type" | "key" | "scroll" | '
              '"read", "arguments": {...} (those of the gui_ tool of that name)}')


def gui_action(action: object, arguments: object) -> tuple[str, dict[str, Any]]:
    """A GUI action's name and arguments, checked against its gui_ tool's schema (the
    fields, their types and the required ones): a malformed action is refused before it
    reaches the browser. Whether it can be done on the page (an element of that name, a
    URL of the instance) is the action's result."""
    if not isinstance(action, str) or action not in GUI_ACTIONS:
        raise HttpError(400, f"unknown GUI action {shown(action)}: use one of "
                             f"{', '.join(GUI_ACTIONS)}")
    if not isinstance(arguments, dict):
        raise HttpError(400, f"the arguments of a GUI action must be an object, not "
                             f"{shown(arguments)}")
    problem = gui_argument_problem(action, arguments)
    if problem is not None:
        raise HttpError(400, problem)
    return action, arguments


def gui_observation(result: Observation) -> dict[str, Any]:
    """A GUI action's result over REST and OpenEnv: whether it failed, the page it ended
    on, the screenshot's digest and the screenshot (PNG, base64)."""
    return {"is_error": result.is_error, "url": result.url, "screenshot": result.screenshot,
            "image": base64.b64encode(result.image).decode("ascii")
            if result.image is not None else None, "mime_type": "image/png"}


def world_ref(value: str) -> str:
    """A world reference whose day, if it names one, fits 64 bits (checked before the
    library resolves it)."""
    day = _REF_DAY.search(value)
    if day is not None and not -DAY_LIMIT <= int(day.group(1)) < DAY_LIMIT:
        raise HttpError(422, f"the day of {shown(value)} does not fit 64 bits: "
                             "no persona has such a day")
    return value


def setup_of(hosting: Hosting, request: CreateRequest) -> tuple[Setup, str, bool | None]:
    """A create request's setup, world reference and bare_names, defaults filled in."""
    task = hosting.task(request.task) if not isinstance(request.task, UnsetType) else None
    if not isinstance(request.world, UnsetType):
        world = world_ref(request.world)
    elif task is not None:
        world = task.world_hash  # the task's world, whatever its persona@day is called
    else:
        raise HttpError(400, 'the body needs "world": "persona@day" (or persona, or a '
                             "world hash)")

    def flag(value: bool | UnsetType, default: bool) -> bool:
        return default if isinstance(value, UnsetType) else value

    setup = Setup(
        mode=hosting.mode if isinstance(request.mode, UnsetType) else request.mode,
        task=task, agent=None if isinstance(request.agent, UnsetType) else request.agent,
        shell=flag(request.shell, task is not None and "shell" in task.interfaces),
        answer=flag(request.answer, task is not None),
        gui=flag(request.gui, task is not None and "gui" in task.interfaces),
        max_steps=hosting.max_steps if isinstance(request.max_steps, UnsetType)
        else request.max_steps)
    bare_names = None if isinstance(request.bare_names, UnsetType) else request.bare_names
    return setup, world, bare_names


def at(hosting: Hosting, request: Request) -> Hosted:
    """The instance a JSON API request names; a change a web page asked for is refused."""
    hosted = hosting.hosted(request.path_params["iid"])
    if request.method not in ("GET", "HEAD"):  # the JSON API acts for programs, not pages
        not_from_a_page(request.scope)
    return hosted


async def healthz(request: Request) -> Response:
    """Whether the gateway answers: ``{"ok": true, "instances": n, "tasks": n}``."""
    hosting = hosting_of(request)
    return json_response({"ok": True, "instances": len(hosting.instances),
                          "tasks": len(hosting.tasks)})

async def tasks(request: Request) -> Response:
    """The tasks served: ``{"tasks": [{task_id, instruction, world, world_hash,
    interfaces}, ...]}``."""
    hosting = hosting_of(request)
    return json_response({"tasks": [t.brief() for t in hosting.tasks.values()]})

async def instances(request: Request) -> Response:
    """GET: ``{"instances": [info, ...]}``. POST: create an instance (body:
    ``CreateRequest``) -> 201 info: ``{id, world_hash, persona, day, mode, mcp_url,
    tools, task, gui_url, episode_id, ...}``; beyond a cap 429 ``{"error", "cap",
    "limit"}``."""
    hosting = hosting_of(request)
    if request.method == "GET":
        return json_response({"instances": [h.info() for h in hosting.instances.values()]})
    not_from_a_page(request.scope)
    setup, world, bare_names = setup_of(hosting, await decode_body(request, CreateRequest))
    hosted = await hosting.create(setup, world, bare_names, client_of(request.scope))
    return json_response(hosted.info(), 201)

async def instance(request: Request) -> Response:
    """GET: the instance's info (world, mode, task, calls so far, idle seconds, ...).
    DELETE: store its episode, close it, delete its directory -> ``{id, episode_id,
    stored, calls, ...}``."""
    hosting = hosting_of(request)
    hosted = at(hosting, request)
    if request.method == "GET":
        hosted.touch()
        return json_response(hosted.info())
    if hosting.unpublish(hosted.id) is None:  # closed meanwhile
        raise HttpError(404, f"instance {hosted.id} was closed")
    return json_response(await hosting.close(hosted))

async def reset(request: Request) -> Response:
    """Store the episode, back to the snapshot with a fresh one -> info +
    ``{"stored_episode_id"}``."""
    hosting = hosting_of(request)
    hosted = at(hosting, request)
    stored = await hosted.run_locked(hosted.reset)
    return json_response({**hosted.info(), "stored_episode_id": stored})

async def world_hash(request: Request) -> Response:
    """``{"hash": <world hash now>, "world_hash": <snapshot>, "changed"}``."""
    hosting = hosting_of(request)
    hosted = at(hosting, request)
    now = await hosted.run_locked(hosted.instance.hash)
    world = hosted.instance.record.world_hash
    return json_response({"id": hosted.id, "hash": now, "world_hash": world,
                          "changed": now != world})

async def diff(request: Request) -> Response:
    """The WorldDiff since the snapshot."""
    hosting = hosting_of(request)
    hosted = at(hosting, request)
    instance = hosted.instance
    return json_bytes_response(200, await hosted.run_locked(
        lambda: msgspec.json.encode(instance.diff())))

async def episode(request: Request) -> Response:
    """The Episode so far."""
    hosting = hosting_of(request)
    hosted = at(hosting, request)
    instance = hosted.instance
    return json_bytes_response(200, await hosted.run_locked(
        lambda: instance.episode.to_json()))

async def shell(request: Request) -> Response:
    """One shell command in the instance's workspace (body: ``ShellRequest``) ->
    ``{observation, is_error, exit_code, stdout, stderr, ...}``."""
    hosting = hosting_of(request)
    hosted = at(hosting, request)
    body = await decode_body(request, ShellRequest)
    enabled(hosted, "shell")
    seen = await hosted.act(ShellAction(body.command))
    return json_response({"observation": seen.text, "is_error": seen.is_error,
                          **(seen.structured or {})})

async def answer(request: Request) -> Response:
    """The episode's final answer (body: ``AnswerRequest``) -> ``{id, answer}``; a
    second answer: 409."""
    hosting = hosting_of(request)
    hosted = at(hosting, request)
    body = await decode_body(request, AnswerRequest)
    enabled(hosted, "answer")
    result = await hosted.answer(body.text)
    if result.is_error:
        raise HttpError(409, result.text)
    return json_response({"id": hosted.id, "answer": body.text})

async def gui(request: Request) -> Response:
    """One GUI action in the instance's browser page (body: ``GuiRequest``) ->
    ``{observation, action, is_error, url, screenshot (digest), image (PNG, base64),
    mime_type}``."""
    hosting = hosting_of(request)
    hosted = at(hosting, request)
    if request.method == "GET":
        raise HttpError(405, f"method GET not allowed here (use POST with {GUI_SHAPE}; "
                             f"the instance's pages are at {hosted.gui_url})",
                        [(b"allow", b"POST")])
    body = await decode_body(request, GuiRequest)
    action, arguments = gui_action(body.action, body.arguments)
    enabled(hosted, "gui")
    seen = await hosted.act(GuiAction(action, arguments))
    return json_response({"observation": seen.text, "action": action,
                          **gui_observation(seen)})

async def grade(request: Request) -> Response:
    """V(W0, W, answer) of the instance now (body: ``GradeRequest``) -> ``{task_id, V,
    checks, reward, errors, answer}``; a task of another world: 409."""
    hosting = hosting_of(request)
    hosted = at(hosting, request)
    body = await decode_body(request, GradeRequest)
    if isinstance(body.task, UnsetType):
        if hosted.task is None:
            raise HttpError(400, f"instance {hosted.id} was created without a task: "
                                 'name one, {"task": "<task id>"}')
        task = hosted.task
    else:
        task = hosting.task(body.task)
    given = hosted.instance.episode.answer if isinstance(body.answer, UnsetType) \
        else body.answer
    return json_response(await hosting.graded(hosted, task, given))


class Mcp:
    """The instance's MCP endpoint (streamable HTTP): every method, handed to the
    instance's own MCP app; a POST's JSON-RPC body is checked first like every other
    body."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        hosted = at(hosting_of(request), request)
        # The GET event stream stays open while a client is connected; it does not keep an
        # idle instance alive. Other requests do while they run.
        counts = scope["method"] != "GET"
        hosted.touch()
        hosted.in_flight += counts
        try:
            assert hosted.app is not None
            if scope["method"] == "POST":  # JSON-RPC: checked here like every other body
                body = await read_body(request, MAX_MCP_BODY)
                check_depth(body)
                receive = _replaying(body, receive)
            await hosted.app(scope, receive, send)
        finally:
            hosted.in_flight -= counts
            hosted.touch()


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


ROUTES: list[BaseRoute] = [
    JsonRoute("/healthz", healthz, methods=("GET",)),
    JsonRoute("/tasks", tasks, methods=("GET",)),
    JsonRoute("/instances", instances, methods=("GET", "POST"), bodies=[CreateRequest]),
    JsonRoute("/instances/{iid}", instance, methods=("GET", "DELETE")),
    JsonRoute("/instances/{iid}/reset", reset, methods=("POST",)),
    JsonRoute("/instances/{iid}/hash", world_hash, methods=("GET",)),
    JsonRoute("/instances/{iid}/diff", diff, methods=("GET",)),
    JsonRoute("/instances/{iid}/episode", episode, methods=("GET",)),
    JsonRoute("/instances/{iid}/shell", shell, methods=("POST",), bodies=[ShellRequest]),
    JsonRoute("/instances/{iid}/answer", answer, methods=("POST",), bodies=[AnswerRequest]),
    JsonRoute("/instances/{iid}/gui", gui, methods=("GET", "POST"), bodies=[GuiRequest]),
    JsonRoute("/instances/{iid}/grade", grade, methods=("POST",), bodies=[GradeRequest]),
    JsonRoute("/instances/{iid}/mcp", Mcp()),
    JsonRoute("/instances/{iid}/mcp/{rest:path}", Mcp()),
]
