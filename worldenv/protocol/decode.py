"""From what a client sent to an action (``worldenv.protocol.actions``).

Two shapes reach the instances:

- a model's tool call (``decode_call``): a tool's name and its arguments, as the JSON text
  the model wrote (the LLM agent, the verl loop) or as an object (an MCP client). Whatever
  the model wrote is an action: one that cannot be executed is ``Unexecutable``, with the
  problem the model is shown (data for the model, never an exception);
- an action as a JSON object (``action_from_json``): Gym's and OpenEnv's ``{"tool": name,
  "arguments": {...}}``, ``{"shell": command}``, ``{"gui": {"action": ..., "arguments":
  {...}}}``, ``{"answer": text}``, and OpenEnv's MCP actions ``{"type": "call_tool",
  "tool_name": ..., "arguments": {...}}`` and ``{"type": "list_tools"}``. A client
  program's malformed action is its misuse: ``ActionError``.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from worldenv.errors import ActionError
from worldenv.gui.tools import GUI_ACTIONS, gui_argument_problem, gui_tool_action
from worldenv.protocol.actions import (
    Action,
    AnswerAction,
    GuiAction,
    ListToolsAction,
    MetaCallAction,
    ShellAction,
    ToolAction,
    Unexecutable,
)
from worldenv.protocol.observation import (
    ANSWER,
    CALL_TOOL,
    LIST_TOOLS,
    SHELL,
    Mode,
    meta_call,
    text_argument_problem,
    unknown_tool,
)


def decode_call(name: str, arguments: str | dict[str, Any], offered: Collection[str], *,
                mode: Mode = "tools") -> Action:
    """The action a model's call of tool `name` asks for, among the `offered` tool names;
    `arguments` is the JSON text the model wrote (empty: none) or an object.

    A known ``gui_*`` tool is a ``GuiAction`` (its arguments an object: the instance
    checks the rest, an error result); ``shell`` and ``answer`` take exactly one string;
    in meta mode ``list_tools`` is the catalogue and ``call_tool`` the named tool's call
    (its ``arguments`` an object or that object's text)."""
    if name not in offered:
        return Unexecutable(name, unknown_tool(name, offered))
    if isinstance(arguments, str):
        try:
            decoded = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return Unexecutable(name, f"the arguments of {name!r} are not valid JSON "
                                      f"({exc}): {arguments[:200]!r}")
    else:
        decoded = arguments
    if not isinstance(decoded, dict):
        return Unexecutable(name, f"the arguments of {name!r} must be a JSON object, not "
                                  f"{decoded!r:.200}")
    if mode == "meta" and name == LIST_TOOLS:
        return ListToolsAction(decoded)
    if mode == "meta" and name == CALL_TOOL:
        called = meta_call(decoded)
        if isinstance(called, str):
            return Unexecutable(name, called, decoded)
        return MetaCallAction(called[0], called[1], decoded)
    action = gui_tool_action(name)
    if action is not None:
        return GuiAction(action, decoded)
    if name in (SHELL, ANSWER):
        key = "command" if name == SHELL else "text"
        problem = text_argument_problem(name, key, decoded)
        if problem is not None:
            return Unexecutable(name, problem)
        return ShellAction(decoded[key]) if name == SHELL else AnswerAction(decoded[key])
    return ToolAction(name, decoded)


_KEYS: dict[str, tuple[str, ...]] = {  # every form also takes OpenEnv's "metadata"
    "tool": ("tool", "arguments"), "shell": ("shell",), "answer": ("answer",), "gui": ("gui",),
    "call_tool": ("type", "tool_name", "arguments"), "list_tools": ("type",)}
GUI_SHAPE = '{"action": ACTION, "arguments": {...}}'
SHAPES = ('{"tool": NAME, "arguments": {...}} | {"shell": COMMAND} | {"gui": '
          f'{GUI_SHAPE}}} | {{"answer": TEXT}} | {{"type": "call_tool", "tool_name": NAME, '
          '"arguments": {...}} | {"type": "list_tools"}')


def action_from_json(value: object, *, check_gui: bool = False) -> Action:
    """The action a JSON object names (the shapes above); ActionError naming what is
    wrong otherwise. `check_gui`: refuse a GUI action its tool's schema refuses (an
    unknown action, a missing or mistyped argument) instead of leaving it to the
    instance's error result."""
    if not isinstance(value, dict):
        raise ActionError(f"an action is an object such as {SHAPES}, not {_shown(value)}")
    kinds = [k for k in ("tool", "shell", "gui", "answer") if k in value]
    kind = value.get("type") if not kinds else kinds[0]
    if len(kinds) > 1 or kind not in _KEYS or (kinds and "type" in value):
        raise ActionError(f"action {_shown(value)}: give exactly one of tool, shell, gui or "
                          'answer (or "type": "call_tool" / "list_tools")')
    extra = sorted(set(value) - {*_KEYS[kind], "metadata"})
    if extra:
        raise ActionError(f"a {kind} action has no field {', '.join(map(repr, extra))} "
                          f"(its fields: {', '.join(_KEYS[kind])})")
    arguments = value.get("arguments", {})
    if not isinstance(arguments, dict):
        raise ActionError(f"action arguments must be an object, not {_shown(arguments)}")
    if kind == "list_tools":
        return ListToolsAction()
    if kind == "tool":
        return ToolAction(_text(value["tool"], "tool name"), arguments)
    if kind == "call_tool":
        name = _text(value.get("tool_name"), "tool name")
        return MetaCallAction(name, arguments, {"tool_name": name, "arguments": arguments})
    if kind == "gui":
        return _gui(value["gui"], check=check_gui)
    if kind == "shell":
        return ShellAction(_text(value["shell"], "shell"))
    return AnswerAction(_text(value["answer"], "answer", empty=True))


def _gui(value: object, *, check: bool) -> GuiAction:
    if not isinstance(value, dict) or set(value) - {"action", "arguments"}:
        raise ActionError(f"a gui action is {{\"gui\": {GUI_SHAPE}}}, not {_shown(value)}")
    action, arguments = value.get("action"), value.get("arguments", {})
    if not isinstance(action, str) or (check and action not in GUI_ACTIONS):
        raise ActionError(f"unknown GUI action {_shown(action)}: use one of "
                          f"{', '.join(GUI_ACTIONS)}")
    if not isinstance(arguments, dict):
        raise ActionError(f"the arguments of a GUI action must be an object, not "
                          f"{_shown(arguments)}")
    problem = gui_argument_problem(action, arguments) if check else None
    if problem is not None:
        raise ActionError(problem)
    return GuiAction(action, arguments)


def _text(value: object, name: str, *, empty: bool = False) -> str:
    if not isinstance(value, str) or (not value and not empty):
        raise ActionError(f"{name} must be a{'' if empty else ' non-empty'} string, not "
                          f"{_shown(value)}")
    return value


def _shown(value: object) -> str:
    """A client's value in a message, bounded."""
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= 200 else text[:200] + "..."


__all__ = ["SHAPES", "ActionError", "action_from_json", "decode_call"]
