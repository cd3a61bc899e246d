"""MCP surfaces of an instance.

``instance_server(instance)`` builds an MCP server for one instance, in one of two modes:

* ``"tools"``: every service tool under its own name (``shop_search_products``, ...);
* ``"meta"``: AWM's two meta-tools: ``list_tools`` (every tool with name, description and
  input schema) and ``call_tool(tool_name, arguments)``.

In either mode the caller may add agent tools beside them (the gateway does, per
instance): ``shell(command)``, one bash command in the instance's workspace,
``answer(text)``, the agent's final answer, and the GUI tools (``envs.gui.GUI_TOOLS``:
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
the call in its episode. The server works with any MCP transport: in memory
(``fastmcp.Client(server)``), stdio, or streamable HTTP (``server.http_app()``).
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from fastmcp import FastMCP
from fastmcp.tools import Tool, ToolResult
from mcp.types import ImageContent, TextContent, ToolAnnotations
from pydantic import Field

from envs.contract import ToolResult as CallResult
from envs.gui import GUI_TOOLS, gui_tool_action
from envs.instance import GuiResult, Instance

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
    arguments pass on unchecked (``envs.gui`` checks them, and a bad one is an error
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
    return server


def _add_agent_tools(server: FastMCP, taken: set[str], shell: TextCaller | None,
                     answer: TextCaller | None, gui: GuiCaller | None) -> None:
    wanted = [("shell", shell), ("answer", answer),
              *((name, gui) for name in GUI_TOOL_NAMES)]
    for name, given in wanted:
        if given is not None and name in taken:
            raise ValueError(f"a service tool is already named {name!r}: the {name} tool "
                             "cannot be served beside it (serve service-prefixed names)")
    if shell is not None:
        run = shell

        async def shell_tool(command: Annotated[str, Field(
                description="One bash command, run in the workspace (the world's files)")]
                             ) -> ToolResult:
            """Run one bash command in this world's workspace and see its output: stdout,
            then [stderr] and [exit N] when there are any. Files it writes stay."""
            return _tool_result(await run(command))

        server.add_tool(Tool.from_function(shell_tool, name="shell"))
    if answer is not None:
        give = answer

        async def answer_tool(text: Annotated[str, Field(
                description="Your final answer, in words")]) -> ToolResult:
            """Give your final answer to the task. Call it once, when you are done: it
            ends the episode."""
            return _tool_result(await give(text))

        server.add_tool(Tool.from_function(answer_tool, name="answer"))
    if gui is not None:
        for info in GUI_TOOLS:
            server.add_tool(_GuiTool(
                name=info.name, description=info.description, parameters=info.input_schema,
                gui=gui, annotations=ToolAnnotations(read_only_hint=not info.writes)))


def _tool_result(result: CallResult) -> ToolResult:
    return ToolResult(content=[TextContent(type="text", text=result.text)],
                      is_error=result.is_error)


def _add_meta_tools(server: FastMCP, instance: Instance, caller: Caller) -> None:
    def list_tools() -> list[dict[str, Any]]:
        """List every tool of this environment: name, description and input schema.
        Call it once, first."""
        return [{"name": t.name, "description": t.description, "input_schema": t.input_schema}
                for t in instance.list_tools()]

    async def call_tool(
        tool_name: Annotated[str, Field(description="A name returned by list_tools")],
        arguments: Annotated[dict[str, Any] | str, Field(
            description="The tool's arguments: a JSON object (or its JSON text)")] = "{}",
    ) -> ToolResult:
        """Call one tool of this environment by name with JSON arguments."""
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except json.JSONDecodeError as exc:
                return _error(f"arguments are not valid JSON: {exc}")
            if not isinstance(arguments, dict):
                return _error("arguments must be a JSON object")
        return _tool_result(await caller(tool_name, arguments))

    server.add_tool(Tool.from_function(list_tools, name="list_tools"))
    server.add_tool(Tool.from_function(call_tool, name="call_tool"))


def _error(text: str) -> ToolResult:
    return ToolResult(content=[TextContent(type="text", text=text)], is_error=True)
