"""One step: an action on an instance, and the observation every surface shows of it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from worldenv.core.contract import ToolResult
from worldenv.instances.instance import Instance
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
)
from worldenv.protocol.observation import catalogue, not_executed, shell_result, timed_out

Executor = Callable[[Action], Awaitable[Observation]]


def execute(instance: Instance, action: Action) -> Observation:
    """Do `action` on `instance` (in this thread) and return what it shows. A bad call is
    an error observation, never an exception; only a closed instance or a failing host
    raises. The answer is not recorded here: the surface that ends the episode does."""
    if isinstance(action, ToolAction):
        return tool_observation(instance.call_tool(action.tool, action.arguments))
    if isinstance(action, MetaCallAction):
        return tool_observation(instance.call_tool(action.tool_name, action.arguments))
    if isinstance(action, ShellAction):
        return tool_observation(shell_result(instance.shell(action.command)))
    if isinstance(action, GuiAction):
        done = instance.gui(action.action, action.arguments)
        return Observation(text=done.text, is_error=done.is_error, image=done.image,
                           screenshot=done.screenshot, url=done.url)
    return at_once(instance, action)


async def aexecute(instance: Instance, action: Action) -> Observation:
    """``execute`` for an event loop: a shipped app's tool call runs on the loop (SQLite,
    well under a millisecond), a carried app's tool, a shell command and a GUI action
    in a thread."""
    if runs_inline(instance, action):
        return execute(instance, action)
    return await asyncio.to_thread(execute, instance, action)


def runs_inline(instance: Instance, action: Action) -> bool:
    """Whether `action` is done at once in this thread (no sandbox, worker or browser to
    wait for): the answer, the catalogue, a refusal, a shipped app's tool call."""
    if isinstance(action, ToolAction):
        return instance.runs_inline(action.tool)
    if isinstance(action, MetaCallAction):
        return instance.runs_inline(action.tool_name)
    return not isinstance(action, ShellAction | GuiAction)


def at_once(instance: Instance, action: Action) -> Observation:
    """The observation of an action that does not act on the world: the catalogue, the
    answer, a refusal (nothing recorded in the episode)."""
    if isinstance(action, ListToolsAction):
        infos = instance.list_tools()
        # the text is the catalogue the agents show; the structure, the same for programs
        return Observation(text=catalogue(infos), whole=True, structured={"result": [
            {"name": t.name, "description": t.description, "input_schema": t.input_schema}
            for t in infos]})
    if isinstance(action, AnswerAction):
        return Observation(text="", done=True, answer=action.text)
    if isinstance(action, Unexecutable):
        return refused(action.problem)
    raise TypeError(f"{type(action).__name__} acts on the world: use execute()")


def tool_observation(result: ToolResult) -> Observation:
    """A tool's (or a shell command's) result as an observation."""
    return Observation(text=result.text, is_error=result.is_error,
                       structured=result.structured)


def refused(problem: str) -> Observation:
    """The observation of a call that never reached the instance."""
    return Observation(text=not_executed(problem), is_error=True, executed=False)


def timed_out_observation(what: str, seconds: float) -> Observation:
    """The observation of a call that outlived its timeout (it runs on, and is recorded
    when it ends): `what` is ``actions.describe`` of it."""
    return Observation(text=timed_out(what, seconds), is_error=True)


__all__ = ["Executor", "aexecute", "at_once", "execute", "refused", "runs_inline",
           "timed_out_observation", "tool_observation"]
