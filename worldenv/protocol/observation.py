"""The protocol's renderer: every text a model is shown of an instance, made once.

The surfaces that put an instance in front of a model (the LLM agent, the verl loop over
``rl.world``, Gym, MCP, the gateway's REST and OpenEnv, the SFT rows) decode into the
protocol's actions and call ``worldenv.protocol.execute``, which renders with these
functions; a policy trained on one and evaluated on another sees the same bytes
(``tests/worldenv/test_observation.py`` runs the same actions through every surface):

- the tools offered, in one order (``offered``; as function schemas, ``tool_schemas``:
  the instance's tools, the GUI tools, ``shell`` and ``answer``; or meta mode's
  ``list_tools``, ``call_tool`` and ``answer``), each from its ``ToolInfo``
  (``function_schema``); the agent tools' own
  infos (``SHELL_TOOL_INFO``, ...) are what the gateway's MCP server serves too;
- the catalogue, meta mode's ``list_tools`` result (``catalogue``): compact UTF-8 JSON,
  never cut;
- a shell command's result (``shell_result``): stdout, then ``[stderr]`` and ``[exit N]``;
- a call that could not be executed (``not_executed``), with the problems found here
  (``unknown_tool``, ``text_argument_problem``, ``meta_call``), and a call that outlived
  its time (``timed_out``);
- a result as a tool message's content (``shown``): an error flagged, a long one cut.

A surface that hands results on as data (the gateway's MCP content, REST and OpenEnv
fields) gives the text and the error flag; a surface that writes the model's messages
(the LLM agent, the verl loop, the SFT rows) makes them with ``shown``.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Any, Literal

import msgspec

from worldenv.core.contract import ToolInfo, ToolResult
from worldenv.core.episode import ShellCall
from worldenv.gui.tools import GUI_TOOLS

SHELL, ANSWER = "shell", "answer"
LIST_TOOLS, CALL_TOOL = "list_tools", "call_tool"
Mode = Literal["tools", "meta"]
OBSERVATION_LIMIT = 8000  # characters of one tool result the model is shown
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def _exactly(properties: dict[str, Any]) -> dict[str, Any]:
    """A schema whose arguments are exactly `properties`, all required (in this order:
    the order is part of what the model reads, and of an LLM recording's hash)."""
    return {"type": "object", "properties": properties, "required": list(properties),
            "additionalProperties": False}


SHELL_TOOL_INFO = ToolInfo(
    name=SHELL, description="Run a bash command in the workspace folder (sandboxed, no "
                            "network). Returns stdout, stderr and a non-zero exit code.",
    input_schema=_exactly({"command": {"type": "string", "description": "The bash command."}}),
    output_schema=None, writes=True)
ANSWER_TOOL_INFO = ToolInfo(
    name=ANSWER, description="Give the final answer and end the task.",
    input_schema=_exactly({"text": {"type": "string", "description": "Your final answer."}}),
    output_schema=None, writes=False)
LIST_TOOLS_INFO = ToolInfo(
    name=LIST_TOOLS, description="List every tool of this environment: name, description "
                                 "and input schema. Call it once, first.",
    input_schema={"type": "object", "properties": {}}, output_schema=None, writes=False)
CALL_TOOL_INFO = ToolInfo(
    name=CALL_TOOL, description="Call one tool of this environment by name with JSON "
                                "arguments.",
    input_schema=_exactly({
        "tool_name": {"type": "string", "description": "A name returned by list_tools"},
        "arguments": {"type": ["object", "string"],
                      "description": "The tool's arguments: a JSON object (or its JSON text)"}}),
    output_schema=None, writes=True)
META_TOOL_INFOS = (LIST_TOOLS_INFO, CALL_TOOL_INFO)


def function_schema(info: ToolInfo) -> dict[str, Any]:
    """A tool as the model is offered it (OpenAI function format)."""
    return {"type": "function",
            "function": {"name": info.name, "description": info.description,
                         "parameters": info.input_schema or dict(NO_PARAMETERS)}}


def offered(infos: Sequence[ToolInfo], *, mode: Mode = "tools", gui: bool = False,
            shell: bool = True, answer: bool = True) -> tuple[ToolInfo, ...]:
    """The tools offered, in the one order every surface offers them: in tools mode the
    instance's tools (`infos`); in meta mode (AWM's) ``list_tools`` and ``call_tool``, the
    instance's tools behind them; then the GUI tools when `gui`, ``shell`` and ``answer``,
    each when enabled (the agents offer no GUI tools and no shell in meta mode)."""
    agent = (*(GUI_TOOLS if gui else ()), *((SHELL_TOOL_INFO,) if shell else ()),
             *((ANSWER_TOOL_INFO,) if answer else ()))
    return (*(META_TOOL_INFOS if mode == "meta" else infos), *agent)


def tool_schemas(infos: Sequence[ToolInfo], *, gui: bool = False, mode: Mode = "tools"
                 ) -> list[dict[str, Any]]:
    """What a model is offered (``offered``: the agents offer no shell in meta mode), as
    function schemas."""
    return [function_schema(t) for t in offered(infos, mode=mode, gui=gui and mode == "tools",
                                                shell=mode == "tools")]


def catalogue(infos: Sequence[ToolInfo]) -> str:
    """Meta mode's ``list_tools`` result: every tool's name, description and input schema
    as compact JSON, non-ASCII characters as they are (escapes would cost the model
    tokens and bytes for nothing)."""
    return msgspec.json.encode([{"name": t.name, "description": t.description,
                                 "input_schema": t.input_schema} for t in infos]).decode()


def shell_result(call: ShellCall) -> ToolResult:
    """A shell command's result: stdout, then "[stderr]" and "[exit N]" when there are
    any; an error when it did not exit 0 (a refused or killed one has no exit code). Its
    structured part is the call's fields, for surfaces that hand them on."""
    text = call.stdout + (f"\n[stderr]\n{call.stderr}" if call.stderr else "")
    if call.exit_code != 0:
        text += f"\n[exit {call.exit_code}]"
    return ToolResult(call.exit_code != 0, text, {
        "exit_code": call.exit_code, "stdout": call.stdout, "stderr": call.stderr,
        "timed_out": call.timed_out, "truncated": call.truncated, "refused": call.refused})


def not_executed(problem: str) -> str:
    """The error result of a call that never reached the instance (nothing recorded)."""
    return f"Not executed: {problem}"


def timed_out(what: str, seconds: float) -> str:
    """The error result of a call that outlived its timeout (it runs on, recorded when it
    ends): `what` is "tool call", "shell command" or "GUI action"."""
    return f"{what} timed out after {seconds:g} s"


def unknown_tool(name: str, known: Collection[str]) -> str:
    """Why a call of a tool that is not offered cannot be executed."""
    return f"there is no tool {name!r}. Valid tools: {', '.join(sorted(known))}"


def text_argument_problem(tool: str, key: str, arguments: dict[str, Any]) -> str | None:
    """Why `arguments` are not exactly one string `key` (``shell``'s command, ``answer``'s
    text), or None when they are."""
    if isinstance(arguments.get(key), str) and set(arguments) == {key}:
        return None
    return (f"{tool!r} takes exactly one argument {key!r} (a string); got "
            f"{json.dumps(arguments, ensure_ascii=False)[:200]}")


def meta_call(arguments: dict[str, Any]) -> tuple[str, dict[str, Any]] | str:
    """(tool name, arguments) of AWM's ``call_tool`` meta-call (its ``arguments`` a JSON
    object or that object's text, absent for none), or why it cannot be executed."""
    name, raw = arguments.get("tool_name"), arguments.get("arguments", {})
    if not isinstance(name, str):
        return f"call_tool needs a 'tool_name' string, got {name!r}"
    try:
        decoded = json.loads(raw or "{}") if isinstance(raw, str) else raw
    except json.JSONDecodeError as exc:
        return f"arguments are not valid JSON: {exc}"
    if not isinstance(decoded, dict):
        return "arguments must be a JSON object"
    return name, decoded


def shown(text: str, is_error: bool, limit: int = OBSERVATION_LIMIT, *,
          whole: bool = False) -> str:
    """A result as a tool message's content: "[error] " before an error, cut past `limit`
    characters (saying how many were cut) unless `whole` (the catalogue: a cut one would
    hide tools), "(no output)" for an empty success."""
    if not whole and len(text) > limit:
        text = text[:limit] + f"\n[... {len(text) - limit} more characters cut]"
    return f"[error] {text}" if is_error else (text or "(no output)")


__all__ = ["ANSWER", "ANSWER_TOOL_INFO", "CALL_TOOL", "CALL_TOOL_INFO", "LIST_TOOLS",
           "LIST_TOOLS_INFO", "META_TOOL_INFOS", "NO_PARAMETERS", "OBSERVATION_LIMIT", "SHELL",
           "SHELL_TOOL_INFO", "Mode", "catalogue", "function_schema", "meta_call",
           "not_executed", "offered", "shell_result", "shown", "text_argument_problem",
           "timed_out", "tool_schemas", "unknown_tool"]
