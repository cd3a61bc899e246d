"""MCP surfaces of an instance.

``instance_server(instance)`` builds an MCP server for one instance, in one of two modes:

* ``"tools"``: every service tool under its own name (``shop_search_products``, ...);
* ``"meta"``: AWM's two meta-tools: ``list_tools`` (every tool with name, description and
  input schema) and ``call_tool(tool_name, arguments)``.

In either mode the caller may add agent tools beside them (the gateway does, per
instance): ``shell(command)``, one bash command in the instance's workspace,
``answer(text)``, the agent's final answer, and the GUI tools (``worldenv.gui.tools.GUI_TOOLS``:
``gui_open``, ``gui_screenshot``, ``gui_click``, ``gui_type``, ``gui_key``, ``gui_scroll``,
``gui_read``), actions in the instance's browser whose result is the action's text and
the screenshot after it (an MCP ``ImageContent``, ``image/png``). They are the caller's
coroutines: the server only names and describes them. ``gui_caller(instance)`` is the
plain one for the GUI tools (``Instance.gui`` in a thread: an action can take a second,
the first one starts the browser)::

    server = instance_server(instance, gui=gui_caller(instance))

This server is the only FastMCP layer of a call: its tools validate nothing and hand every
call to the instance's one dispatch (``Instance.acall_tool``), which validates the
arguments against the tool's schema, runs the tool against this instance only and records
the call in its episode.

What a model reads here is what the LLM agent and the RL loop show it
(``worldenv.protocol.observation``):
the agent tools and meta-tools are served with their names, descriptions and schemas;
``list_tools`` answers with the catalogue's text (and the same list as structured
content); a ``call_tool``, ``shell`` or ``answer`` call whose arguments cannot be used,
and a call of a tool the server does not have, get the agents' "Not executed: ..." error
result. The server works with any MCP transport: in memory
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

from worldenv.core.contract import ToolInfo
from worldenv.core.contract import ToolResult as CallResult
from worldenv.gui.tools import GUI_TOOLS, gui_tool_action
from worldenv.instances.instance import GuiResult, Instance
from worldenv.protocol.observation import (
    ANSWER_TOOL_INFO,
    CALL_TOOL_INFO,
    LIST_TOOLS_INFO,
    SHELL_TOOL_INFO,
    catalogue,
    meta_call,
    not_executed,
    text_argument_problem,
    unknown_tool,
)

Mode = Literal["tools", "meta"]
Caller = Callable[[str, dict[str, Any]], Awaitable[CallResult]]
TextCaller = Callable[[str], Awaitable[CallResult]]  # shell(command) / answer(text)
GuiCaller = Callable[[str, dict[str, Any]], Awaitable[GuiResult]]  # gui(action, arguments)
AGENT_TOOLS = ("shell", "answer")
GUI_TOOL_NAMES = tuple(t.name for t in GUI_TOOLS)


class _InstanceTool(Tool):
    """A tool whose call is the instance's (recorded) call of the same name: a plain
    ``Tool``, so FastMCP passes the arguments on unchecked (the instance checks them)."""

    call: Any = None

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        result = await self.call(self.name, arguments)
        return ToolResult(
            content=[TextContent(type="text", text=result.text)],
            structured_content=result.structured if isinstance(result.structured, dict)
            else None,
            is_error=result.is_error,
        )


class _GuiTool(Tool):
    """A GUI tool (``gui_click``, ...): its call is one action of the instance's browser;
    the result is the action's text and the screenshot after it. A plain ``Tool``: the
    arguments pass on unchecked (``worldenv.gui.tools`` checks them, and a bad one is an error
    result recorded in the episode like any other action)."""

    gui: Any = None

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        action = gui_tool_action(self.name)
        assert action is not None
        return gui_tool_result(await self.gui(action, arguments))


def gui_tool_result(result: GuiResult) -> ToolResult:
    """A GUI action's result as MCP content: its text, then the screenshot (PNG) when
    there is one."""
    content: list[TextContent | ImageContent] = [TextContent(type="text", text=result.text)]
    if result.image is not None:
        content.append(ImageContent(type="image", mime_type="image/png",
                                    data=base64.b64encode(result.image).decode("ascii")))
    return ToolResult(content=content, is_error=result.is_error)


def gui_caller(instance: Instance) -> GuiCaller:
    """The GUI tools' caller of a lone instance: ``Instance.gui`` in a thread (the
    gateway's own adds its lock and the per-call timeout)."""

    async def gui(action: str, arguments: dict[str, Any]) -> GuiResult:
        return await asyncio.to_thread(instance.gui, action, arguments)

    return gui


def instance_server(instance: Instance, mode: Mode = "tools", *,
                    call: Caller | None = None, shell: TextCaller | None = None,
                    answer: TextCaller | None = None, gui: GuiCaller | None = None
                    ) -> FastMCP:
    """`call` replaces ``instance.acall_tool`` as the coroutine every call goes through
    (the gateway's adds locking and a timeout). `shell` and `answer`, when given, are
    served as the tools of the same names, `gui` as the GUI tools (``gui_open``, ...;
    ``gui_caller(instance)`` for a lone instance); ValueError if a service tool already
    has one of these names in tools mode (a bare-named tool can)."""
    caller: Caller = call or instance.acall_tool
    server = FastMCP(f"agent-worlds {instance.record.persona}@{instance.record.day}")
    if mode == "tools":
        for info in instance.list_tools():
            server.add_tool(_InstanceTool(
                name=info.name, description=info.description, parameters=info.input_schema,
                output_schema=info.output_schema, call=caller,
                annotations=ToolAnnotations(read_only_hint=not info.writes),
            ))
    elif mode == "meta":
        _add_meta_tools(server, instance, caller)
    else:
        raise ValueError(f"unknown MCP mode {mode!r}: use 'tools' or 'meta'")
    # In meta mode service tools sit behind call_tool: only the tools mode can clash.
    taken = {t.name for t in instance.list_tools()} if mode == "tools" else set()
    _add_agent_tools(server, taken, shell, answer, gui)
    server.add_middleware(_UnknownTools(server))
    return server


def _add_agent_tools(server: FastMCP, taken: set[str], shell: TextCaller | None,
                     answer: TextCaller | None, gui: GuiCaller | None) -> None:
    # In the order the agents offer them (worldenv.protocol.observation.tool_schemas): GUI, shell,
    # answer.
    wanted = [*((name, gui) for name in GUI_TOOL_NAMES), ("shell", shell), ("answer", answer)]
    for name, given in wanted:
        if given is not None and name in taken:
            raise ValueError(f"a service tool is already named {name!r}: the {name} tool "
                             "cannot be served beside it (serve service-prefixed names)")
    if gui is not None:
        for info in GUI_TOOLS:
            server.add_tool(_GuiTool(
                name=info.name, description=info.description, parameters=info.input_schema,
                gui=gui, annotations=ToolAnnotations(read_only_hint=not info.writes)))
    for info, key, given in ((SHELL_TOOL_INFO, "command", shell),
                             (ANSWER_TOOL_INFO, "text", answer)):
        if given is not None:
            server.add_tool(_agent_tool(info, _text_tool(info.name, key, given)))


def _text_tool(name: str, key: str, run: TextCaller
               ) -> Callable[[dict[str, Any]], Awaitable[CallResult]]:
    """``shell`` or ``answer``: exactly one string argument, refused as the agents refuse
    it (the tool is a plain one, so nothing else checks its arguments)."""

    async def call(arguments: dict[str, Any]) -> CallResult:
        problem = text_argument_problem(name, key, arguments)
        if problem is not None:
            return CallResult(True, not_executed(problem))
        return await run(arguments[key])

    return call


class _AgentTool(Tool):
    """An agent tool (``shell``, ``answer``, the meta-tools) described by its
    ``worldenv.protocol.observation`` info, so its name, description and schema are the ones the LLM
    agent and the RL loop offer; a plain ``Tool``: its call checks the arguments."""

    call: Any = None

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        result: CallResult = await self.call(arguments)
        structured = result.structured if isinstance(result.structured, dict) else None
        return ToolResult(content=[TextContent(type="text", text=result.text)],
                          structured_content=structured, is_error=result.is_error)


def _agent_tool(info: ToolInfo, call: Callable[[dict[str, Any]], Awaitable[CallResult]]
                ) -> Tool:
    return _AgentTool(name=info.name, description=info.description,
                      parameters=info.input_schema, call=call)


def _add_meta_tools(server: FastMCP, instance: Instance, caller: Caller) -> None:
    async def list_tools(arguments: dict[str, Any]) -> CallResult:
        infos = instance.list_tools()
        # the text is the catalogue the agents show; the structure, the same for programs
        return CallResult(False, catalogue(infos), {"result": [
            {"name": t.name, "description": t.description, "input_schema": t.input_schema}
            for t in infos]})

    async def call_tool(arguments: dict[str, Any]) -> CallResult:
        called = meta_call(arguments)
        if isinstance(called, str):
            return CallResult(True, not_executed(called))
        return await caller(*called)

    server.add_tool(_agent_tool(LIST_TOOLS_INFO, list_tools))
    server.add_tool(_agent_tool(CALL_TOOL_INFO, call_tool))


class _UnknownTools(Middleware):
    """A call of a tool the server does not have gets the error result the agents give
    one (``worldenv.protocol.observation.unknown_tool``), not FastMCP's own error."""

    def __init__(self, server: FastMCP) -> None:
        self.server = server

    async def on_call_tool(self, context: MiddlewareContext[CallToolRequestParams],
                           call_next: CallNext[CallToolRequestParams, ToolResult]
                           ) -> ToolResult:
        known = {t.name for t in await self.server.list_tools()}
        name = context.message.name
        if name not in known:
            return ToolResult(content=[TextContent(type="text", text=not_executed(
                unknown_tool(name, known)))], is_error=True)
        return await call_next(context)
