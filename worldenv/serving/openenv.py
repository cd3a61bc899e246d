"""OpenEnv's HTTP contract for one instance, under ``/instances/{id}/openenv``.

It follows meta-pytorch/OpenEnv's ``HTTPEnvServer``: POST /reset, POST /step ``{"action":
{...}}``, GET /state, answers ``{"observation", "reward", "done", "metadata"}``: an
OpenEnv HTTP client given that base URL drives one instance. OpenEnv's own client speaks
its WebSocket protocol instead, served at ``/ws`` (``worldenv.serving.openenv_ws``) with
these same actions, observations and steps.
Actions are worldenv.serving.gym's (``{"tool": name, "arguments": {...}}``, ``{"shell":
command}``, ``{"gui": {"action", "arguments"}}``, ``{"answer": text}``) and OpenEnv's MCP
actions (``{"type": "call_tool", "tool_name", "arguments"}``, ``{"type":
"list_tools"}``); the episode is done after an answer or ``max_steps`` steps, when a
task's instance is graded and the reward is the grade's (0.0 before, and without a
task)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from worldenv.errors import HttpError
from worldenv.protocol import (
    Action,
    ActionError,
    AnswerAction,
    GuiAction,
    ListToolsAction,
    ShellAction,
    action_from_json,
)
from worldenv.serving.hosting import Hosted, Hosting, enabled, hosting_of
from worldenv.serving.http import (
    JsonRoute,
    allow,
    convert,
    decode_body,
    json_response,
    shown,
)
from worldenv.serving.rest import GUI_SHAPE, GuiRequest, at, gui_action, gui_observation

_Arguments = Annotated[dict[str, Any], Meta(description="the tool's arguments")]
_Name = Annotated[str, Meta(pattern=r"\S", description="a tool's name")]


class ResetRequest(Struct, forbid_unknown_fields=True, frozen=True):
    seed: Annotated[int | None, Meta(description=(
        "ignored: worlds are deterministic"))] = None
    episode_id: Annotated[str, Meta(pattern=r"\S", max_length=255, description=(
        "ignored: the gateway draws the ids episodes are stored under"))] | None = None


class StepRequest(Struct, forbid_unknown_fields=True, frozen=True):
    action: Annotated[dict[str, Any], Meta(description=(
        'one of the actions: {"tool", "arguments"}, {"shell"}, {"gui"}, {"answer"}, '
        '{"type": "call_tool", "tool_name", "arguments"}, {"type": "list_tools"}'))]
    timeout_s: Annotated[Any, Meta(description="OpenEnv's; ignored")] = None
    request_id: Annotated[Any, Meta(description="OpenEnv's; ignored")] = None


# An action as a step's body writes it; every form also takes OpenEnv's "metadata"
# (ignored). A body is checked against these (a refusal names the field), then decoded
# into the agent protocol's action (``worldenv.protocol.action_from_json``).
class ToolStep(Struct, forbid_unknown_fields=True, frozen=True):
    tool: _Name
    arguments: _Arguments = msgspec.field(default_factory=dict)
    metadata: Any = None


class ShellStep(Struct, forbid_unknown_fields=True, frozen=True):
    shell: Annotated[str, Meta(pattern=r"\S", description="one bash command")]
    metadata: Any = None


class GuiStep(Struct, forbid_unknown_fields=True, frozen=True):
    gui: Annotated[Any, Meta(description='{"action": ..., "arguments": {...}} as POST '
                                         "/instances/{iid}/gui takes")]
    metadata: Any = None


class AnswerStep(Struct, forbid_unknown_fields=True, frozen=True):
    answer: Annotated[str, Meta(description="the final answer")]
    metadata: Any = None


class CallToolStep(Struct, forbid_unknown_fields=True, frozen=True):
    type: Literal["call_tool"]
    tool_name: _Name
    arguments: _Arguments = msgspec.field(default_factory=dict)
    metadata: Any = None


class ListToolsStep(Struct, forbid_unknown_fields=True, frozen=True):
    type: Literal["list_tools"]
    metadata: Any = None


STEPS: dict[str, type[Struct]] = {
    "tool": ToolStep, "shell": ShellStep, "gui": GuiStep, "answer": AnswerStep,
    "call_tool": CallToolStep, "list_tools": ListToolsStep}


def action_of(value: dict[str, Any]) -> Action:
    """A step's action: ours (tool / shell / gui / answer, as worldenv.serving.gym takes)
    or OpenEnv's MCP actions (``{"type": "call_tool" | "list_tools", ...}``), told apart
    by the key it has, as the agent protocol's action."""
    kinds = [k for k in ("tool", "shell", "gui", "answer") if k in value]
    kind = value.get("type") if not kinds else kinds[0]
    if len(kinds) > 1 or kind not in STEPS or (kinds and "type" in value):
        raise HttpError(400, f"action {shown(value)}: give exactly one of tool, shell, gui "
                             'or answer (or "type": "call_tool" / "list_tools")')
    assert isinstance(kind, str)
    step = convert(value, STEPS[kind], f"a {kind} action")
    if isinstance(step, GuiStep):  # checked now: a malformed one is never a step
        if not isinstance(step.gui, dict):
            raise HttpError(400, f"a gui action is {{\"gui\": {GUI_SHAPE}}}, not "
                                 f"{shown(step.gui)}")
        request = convert(step.gui, GuiRequest, "a gui action")
        gui_action(request.action, request.arguments)
    try:
        return action_from_json(value, check_gui=True)
    except ActionError as exc:
        raise HttpError(400, str(exc)) from None


async def reset(request: Request) -> Response:
    """OpenEnv's reset (body: ``ResetRequest``): store the episode so far, back to the
    snapshot -> ``{"observation": {instruction, task, tools, shell, answer, gui,
    world_hash, max_steps}, "reward": null, "done": false, "metadata": {step,
    episode_id, stored_episode_id}}``."""
    hosting = hosting_of(request)
    hosted = at(hosting, request)
    await decode_body(request, ResetRequest)
    stored = await hosted.run_locked(hosted.reset)
    return json_response(reset_answer(hosted, stored))

async def step(request: Request) -> Response:
    """OpenEnv's step (body: ``StepRequest``) -> ``{"observation", "reward", "done",
    "metadata": {step, truncated, episode_id, grade (when done with a task)}}``; a
    done episode: 409."""
    hosting = hosting_of(request)
    hosted = at(hosting, request)
    body = await decode_body(request, StepRequest)
    return json_response(await take_step(hosting, hosted, action_of(body.action)))

async def state(request: Request) -> Response:
    """OpenEnv's state: ``{"episode_id", "step_count", "done", "max_steps", "task",
    "agent", "answer", "calls", "world_hash"}``."""
    hosting = hosting_of(request)
    hosted = at(hosting, request)
    hosted.touch()
    return json_response(state_of(hosted))

async def elsewhere(request: Request) -> Response:
    """Not an OpenEnv endpoint: 404 naming the three (the three with another method:
    405, which Starlette would not say here, this route matching every method)."""
    known = {"reset": ("POST",), "step": ("POST",), "state": ("GET",)}
    if request.path_params["other"] in known:
        allow(request.method, *known[request.path_params["other"]])
    raise HttpError(404, f"no such endpoint: {shown(request.url.path)} (OpenEnv: "
                         "openenv/reset, openenv/step, openenv/state)")


ROUTES: list[BaseRoute] = [
    JsonRoute("/instances/{iid}/openenv/reset", reset, methods=("POST",),
              bodies=[ResetRequest]),
    JsonRoute("/instances/{iid}/openenv/step", step, methods=("POST",),
              bodies=[StepRequest, *STEPS.values()]),
    JsonRoute("/instances/{iid}/openenv/state", state, methods=("GET",)),
    JsonRoute("/instances/{iid}/openenv/{other:path}", elsewhere,
              methods=("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"))]


def reset_answer(hosted: Hosted, stored: str | None) -> dict[str, Any]:
    """A reset's answer (over HTTP and the WebSocket): the first observation, and the
    ids of the episode begun and of the one just stored (None when nothing was)."""
    return {"observation": first_observation(hosted), "reward": None, "done": False,
            "metadata": {"step": 0, "episode_id": hosted.instance.episode.episode_id,
                         "stored_episode_id": stored}}


def state_of(hosted: Hosted) -> dict[str, Any]:
    """OpenEnv's state of an instance's episode (its ``episode_id`` is the id the episode
    is stored under)."""
    episode = hosted.instance.episode
    return {"episode_id": episode.episode_id, "step_count": hosted.steps,
            "done": hosted.done, "max_steps": hosted.setup.max_steps,
            "task": episode.task, "agent": episode.agent, "answer": episode.answer,
            "calls": len(episode.calls), "world_hash": episode.world_hash}


async def take_step(hosting: Hosting, hosted: Hosted, action: Action,
                    restart: str | None = None) -> dict[str, Any]:
    """One step: the action done on the instance (``Hosted.act``, the agent protocol's
    ``execute``), its observation as OpenEnv's, and the grade when the episode ends.
    `restart` says how the client starts another episode (default: the HTTP form's)."""
    if hosted.done:
        raise HttpError(409, f"the episode of instance {hosted.id} is done (answered "
                             "or at its step limit): " + (
                                 restart or f"POST /instances/{hosted.id}/openenv/reset")
                        + " to start another")
    for kind, cls in (("shell", ShellAction), ("answer", AnswerAction), ("gui", GuiAction)):
        if isinstance(action, cls):
            enabled(hosted, kind)
    hosted.steps += 1
    seen = await hosted.act(action)
    observation: dict[str, Any]
    if isinstance(action, ListToolsAction):  # the catalogue's text too: what a model reads
        listed = seen.structured["result"] if isinstance(seen.structured, dict) else []
        observation = {"tools": listed, "text": seen.text, "is_error": seen.is_error}
    elif isinstance(action, ShellAction):
        observation = {"text": seen.text, "is_error": seen.is_error,
                       **(seen.structured or {})}
    elif isinstance(action, GuiAction):
        observation = {"text": seen.text, "action": action.action, **gui_observation(seen)}
    elif isinstance(action, AnswerAction):
        if seen.is_error:  # answered meanwhile (over MCP or REST)
            raise HttpError(409, seen.text)
        observation = {"answer": action.text}
    else:
        observation = {"text": seen.text, "is_error": seen.is_error}
    truncated = not hosted.done and hosted.steps >= hosted.setup.max_steps
    hosted.done = hosted.done or truncated
    metadata: dict[str, Any] = {"step": hosted.steps, "truncated": truncated,
                                "episode_id": hosted.instance.episode.episode_id}
    reward: float | None = 0.0
    if hosted.done and hosted.task is not None:
        graded = await hosting.graded(hosted, hosted.task, hosted.instance.episode.answer)
        metadata["grade"] = graded
        reward = graded["reward"]
    return {"observation": observation, "reward": reward, "done": hosted.done,
            "metadata": metadata}


def first_observation(hosted: Hosted) -> dict[str, Any]:
    task = hosted.task
    return {"instruction": task.instruction if task else None,
            "task": task.task_id if task else None,
            "tools": [t.name for t in hosted.instance.list_tools()],
            "shell": hosted.setup.shell, "answer": hosted.setup.answer,
            "gui": hosted.setup.gui, "world_hash": hosted.instance.record.world_hash,
            "max_steps": hosted.setup.max_steps}
