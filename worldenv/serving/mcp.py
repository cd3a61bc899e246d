"""MCP surfaces of an instance.

``instance_server(instance)`` builds an MCP server for one instance, in one of two modes:

* ``"tools"``: every service tool under its own name (``shop_search_products``, ...);
* ``"meta"``: AWM's two meta-tools: ``list_tools`` (every tool with name, description and
  input schema) and ``call_tool(tool_name, arguments)``.

In either mode the caller may add agent tools beside them (the gateway does, per
instance): ``shell(command)``, one bash command in the instance's workspace,
``answer(text)``, the agent's final answer, and the GUI tools
(``worldenv.gui.tools.GUI_TOOLS``: ``gui_open``, ``gui_screenshot``, ``gui_click``,
``gui_type``, ``gui_key``, ``gui_scroll``, ``gui_read``), actions in the instance's browser
whose result is the action's text and the screenshot after it (an MCP ``ImageContent``,
``image/png``). The tools are offered in the protocol's one order
(``worldenv.protocol.toolset_of``). Each is enabled with True (done by the executor) or
with a coroutine of the caller's that does it; ``gui_caller(instance)`` is the plain one
for the GUI tools (``Instance.gui`` in a thread: an action can take a second, the first
one starts the browser)::

    server = instance_server(instance, shell=True, gui=gui_caller(instance))

This server is the only FastMCP layer of a call: every call, whatever its tool, is decoded
into the agent protocol's action (``worldenv.protocol.decode_call``, as the LLM agent and
the verl loop decode theirs) and done by ``worldenv.protocol.aexecute`` (or the caller's
executor, ``execute=``: the gateway's adds its lock and timeout), which hands a tool call to
the instance's one dispatch: it validates the arguments against the tool's schema, runs the
tool against this instance only and records the call in its episode.

What a model reads here is what the LLM agent and the RL loop show it
(``worldenv.protocol.observation``): the agent tools and meta-tools are served with their
names, descriptions and schemas; ``list_tools`` answers with the catalogue's text (and the
same list as structured content); a ``call_tool``, ``shell`` or ``answer`` call whose
arguments cannot be used, and a call of a tool the server does not have, get the agents'
"Not executed: ..." error result. The server works with any MCP transport: in memory
(``fastmcp.Client(server)``), stdio, or streamable HTTP (``server.http_app()``).
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from fastmcp import FastMCP
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.tools import Tool, ToolResult
from mcp.types import CallToolRequestParams, ImageContent, TextContent, ToolAnnotations

from worldenv.core.contract import ToolResult as CallResult
from worldenv.gui.tools import GUI_TOOLS
from worldenv.instances.instance import GuiResult, Instance
from worldenv.protocol import (
    Action,
    AnswerAction,
    Executor,
    GuiAction,
    MetaCallAction,
    Observation,
    ShellAction,
    ToolAction,
    aexecute,
    decode_call,
    tool_observation,
    toolset_of,
)

Mode = Literal["tools", "meta"]
Caller = Callable[[str, dict[str, Any]], Awaitable[CallResult]]
TextCaller = Callable[[str], Awaitable[CallResult]]  # shell(command) / answer(text)
GuiCaller = Callable[[str, dict[str, Any]], Awaitable[GuiResult]]  # gui(action, arguments)
AGENT_TOOLS = ("shell", "answer")
GUI_TOOL_NAMES = tuple(t.name for t in GUI_TOOLS)


class _ProtocolTool(Tool):
    """A tool of the server: a plain ``Tool`` (FastMCP checks nothing), whose call is
    decoded into the protocol's action and handed to the executor."""

    run_action: Any = None

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        result: ToolResult = await self.run_action(self.name, arguments)
        return result


def observation_result(observation: Observation) -> ToolResult:
    """An observation as MCP content: its text (then a GUI action's screenshot, PNG),
    its error flag, and its structured part when that is an object."""
    content: list[TextContent | ImageContent] = [
        TextContent(type="text", text=observation.text)]
    if observation.image is not None:
        content.append(ImageContent(type="image", mime_type="image/png",
                                    data=base64.b64encode(observation.image).decode("ascii")))
    structured = observation.structured if isinstance(observation.structured, dict) else None
    return ToolResult(content=content, structured_content=structured,
                      is_error=observation.is_error)


def gui_tool_result(result: GuiResult) -> ToolResult:
    """A GUI action's result as MCP content: its text, then the screenshot (PNG) when
    there is one."""
    return observation_result(_gui_observation(result))


def gui_caller(instance: Instance) -> GuiCaller:
    """The GUI tools' caller of a lone instance: ``Instance.gui`` in a thread (the
    gateway's own adds its lock and the per-call timeout)."""

    async def gui(action: str, arguments: dict[str, Any]) -> GuiResult:
        return await asyncio.to_thread(instance.gui, action, arguments)

    return gui


def instance_server(instance: Instance, mode: Mode = "tools", *,
                    execute: Executor | None = None, call: Caller | None = None,
                    shell: TextCaller | bool | None = None,
                    answer: TextCaller | bool | None = None,
                    gui: GuiCaller | bool | None = None) -> FastMCP:
    """The MCP server of `instance`: its tools as the protocol's catalogue offers them
    (``worldenv.protocol.toolset_of``: the service tools or the meta-tools, then the GUI
    tools, ``shell`` and ``answer`` when enabled), every call done by `execute` (default:
    ``worldenv.protocol.aexecute`` on the instance).

    `shell`, `answer` and `gui` enable those tools: True through `execute`, or a coroutine
    that does them instead (``gui_caller(instance)`` for a lone instance's GUI); `call`
    replaces the executor for tool calls. ValueError if a service tool already has one of
    these names in tools mode (a bare-named tool can)."""
    if mode not in ("tools", "meta"):
        raise ValueError(f"unknown MCP mode {mode!r}: use 'tools' or 'meta'")
    offer = toolset_of(instance, mode=mode, gui=bool(gui), shell=bool(shell),
                       answer=bool(answer))
    service = {t.name for t in offer.service} if mode == "tools" else set()
    for name, given in (*((n, gui) for n in GUI_TOOL_NAMES), ("shell", shell),
                        ("answer", answer)):
        if given and name in service:
            raise ValueError(f"a service tool is already named {name!r}: the {name} tool "
                             "cannot be served beside it (serve service-prefixed names)")
    run = _executor(instance, execute, call, shell, answer, gui)

    async def run_action(name: str, arguments: dict[str, Any]) -> ToolResult:
        return observation_result(await run(decode_call(name, arguments, offer.names,
                                                        mode=mode)))

    server = FastMCP(f"agent-worlds {instance.record.persona}@{instance.record.day}")
    gui_names = set(GUI_TOOL_NAMES)
    for info in offer.tools:
        hinted = info.name in service or info.name in gui_names
        server.add_tool(_ProtocolTool(
            name=info.name, description=info.description, parameters=info.input_schema,
            output_schema=info.output_schema if info.name in service else None,
            annotations=ToolAnnotations(read_only_hint=not info.writes) if hinted else None,
            run_action=run_action))
    server.add_middleware(_UnknownTools(run_action, offer.names))
    return server


def _executor(instance: Instance, execute: Executor | None, call: Caller | None,
              shell: TextCaller | bool | None, answer: TextCaller | bool | None,
              gui: GuiCaller | bool | None) -> Executor:
    """Where the server's actions go: the given coroutines for what they do, the
    executor for the rest."""
    default: Executor = execute or (lambda action: aexecute(instance, action))

    async def run(action: Action) -> Observation:
        if call is not None and isinstance(action, ToolAction | MetaCallAction):
            name = action.tool if isinstance(action, ToolAction) else action.tool_name
            return tool_observation(await call(name, action.arguments))
        if callable(shell) and isinstance(action, ShellAction):
            return tool_observation(await shell(action.command))
        if callable(answer) and isinstance(action, AnswerAction):
            return tool_observation(await answer(action.text))
        if callable(gui) and isinstance(action, GuiAction):
            return _gui_observation(await gui(action.action, action.arguments))
        return await default(action)

    return run


def _gui_observation(result: GuiResult) -> Observation:
    return Observation(text=result.text, is_error=result.is_error, image=result.image,
                       screenshot=result.screenshot, url=result.url)


class _UnknownTools(Middleware):
    """A call of a tool the server does not have gets the error result the agents give
    one (the protocol's refusal of an unknown tool), not FastMCP's own error."""

    def __init__(self, run_action: Callable[[str, dict[str, Any]], Awaitable[ToolResult]],
                 names: frozenset[str]) -> None:
        self.run_action = run_action
        self.names = names

    async def on_call_tool(self, context: MiddlewareContext[CallToolRequestParams],
                           call_next: CallNext[CallToolRequestParams, ToolResult]
                           ) -> ToolResult:
        name = context.message.name
        if name not in self.names:
            return await self.run_action(name, dict(context.message.arguments or {}))
        return await call_next(context)
