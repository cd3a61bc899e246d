"""What a model can do to an instance, and what it is shown back: the protocol's types.

An action is one of the ``Action`` union's msgspec Structs, tagged by ``type`` (so a
JSON object such as OpenEnv's ``{"type": "list_tools"}`` decodes straight into one):

- ``ToolAction``: a service tool's call (``type: "tool"``);
- ``ShellAction``: one bash command in the workspace (``"shell"``);
- ``GuiAction``: one action of the instance's browser page (``"gui"``, ``worldenv.gui.tools``);
- ``AnswerAction``: the final answer, which ends the episode (``"answer"``);
- ``ListToolsAction``: meta mode's catalogue (``"list_tools"``);
- ``MetaCallAction``: meta mode's ``call_tool`` of a named tool (``"call_tool"``);
- ``Unexecutable``: a call that cannot reach the instance (an unknown tool, arguments that
  are not JSON or not the tool's shape), carrying why (``"not_executed"``).

A surface decodes what its client sent (``worldenv.protocol.decode``) into one of these and
hands it to ``worldenv.protocol.execute``, which answers an ``Observation``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from worldenv.protocol.observation import shown


class ToolAction(msgspec.Struct, frozen=True, tag="tool", forbid_unknown_fields=True):
    """Call a service tool of the instance (tools mode)."""

    tool: str
    arguments: dict[str, Any] = msgspec.field(default_factory=dict)


class ShellAction(msgspec.Struct, frozen=True, tag="shell", forbid_unknown_fields=True):
    """Run one bash command in the instance's workspace (sandboxed)."""

    command: str


class GuiAction(msgspec.Struct, frozen=True, tag="gui", forbid_unknown_fields=True):
    """One action of the instance's browser page: `action` is a ``worldenv.gui.tools``
    action (``click``, ...), its tool's name without ``gui_``."""

    action: str
    arguments: dict[str, Any] = msgspec.field(default_factory=dict)


class AnswerAction(msgspec.Struct, frozen=True, tag="answer", forbid_unknown_fields=True):
    """The final answer: the episode is over."""

    text: str


class ListToolsAction(msgspec.Struct, frozen=True, tag="list_tools",
                      forbid_unknown_fields=True):
    """Meta mode's ``list_tools``: every tool's name, description and input schema.
    `written`: its arguments as the model wrote them (it takes none; a trajectory records
    them)."""

    written: dict[str, Any] | None = None


class MetaCallAction(msgspec.Struct, frozen=True, tag="call_tool", forbid_unknown_fields=True):
    """Meta mode's ``call_tool``: the named tool's call. `written` is the meta-call's own
    arguments as the model wrote them (its ``arguments`` possibly JSON text): a trajectory
    records those."""

    tool_name: str
    arguments: dict[str, Any] = msgspec.field(default_factory=dict)
    written: dict[str, Any] | None = None


class Unexecutable(msgspec.Struct, frozen=True, tag="not_executed", forbid_unknown_fields=True):
    """A call that never reaches the instance (nothing is recorded in its episode):
    `tool` as the model named it, `problem` why. `written`: the call's arguments when
    they were a JSON object (a meta-call whose inner arguments could not be used), else
    None."""

    tool: str
    problem: str
    written: dict[str, Any] | None = None


Action = (ToolAction | ShellAction | GuiAction | AnswerAction | ListToolsAction
          | MetaCallAction | Unexecutable)


class Observation(msgspec.Struct, frozen=True, kw_only=True):
    """What one action gave back, the same on every surface.

    `text` and `is_error`: the result as data (what the gateway's MCP, REST and OpenEnv
    answers carry); ``shown()`` is the same result as a tool message's content (what the
    LLM agent, the verl loop and the SFT rows write). `executed`: the action reached the
    instance. `whole`: never cut when shown (meta mode's catalogue). `done` and `answer`:
    the action was the final answer. `structured`: the result as data for programs (a
    tool's structured content, a shell command's fields, the catalogue as a list). A GUI
    action's screenshot: `image` (PNG) and its digest `screenshot`, and the page's `url`.
    """

    text: str
    is_error: bool = False
    executed: bool = True
    whole: bool = False
    done: bool = False
    answer: str | None = None
    structured: Any = None
    image: bytes | None = None
    screenshot: str | None = None
    url: str | None = None

    def shown(self) -> str:
        """The result as a tool message's content (``worldenv.protocol.observation.shown``)."""
        return shown(self.text, self.is_error, whole=self.whole)


def describe(action: Action) -> str:
    """What an action is, in the words of a timeout's message
    (``worldenv.protocol.observation.timed_out``)."""
    if isinstance(action, ShellAction):
        return "shell command"
    if isinstance(action, GuiAction):
        return "GUI action"
    if isinstance(action, AnswerAction):
        return "answer"
    return "tool call"


__all__ = ["Action", "AnswerAction", "GuiAction", "ListToolsAction", "MetaCallAction",
           "Observation", "ShellAction", "ToolAction", "Unexecutable", "describe"]
