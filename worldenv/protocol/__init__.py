"""The agent protocol, in one place: what a model can do to an instance and what it is
shown back, the same on every surface (the LLM agent, the verl loop, Gym, MCP, the
gateway's REST and OpenEnv).

- ``actions``: the typed actions (msgspec Structs, a union tagged by ``type``) and the
  ``Observation`` of one;
- ``catalogue``: the tools offered (``Toolset``), in the one order;
- ``decode``: a model's tool call (``decode_call``) or a JSON action
  (``action_from_json``) into an action;
- ``execute``: one step, ``execute(instance, action) -> Observation``;
- ``observation``: the renderer, every text a model reads.

A surface decodes into an action, calls ``execute`` (under its own timeout, lock or thread)
and hands the observation on: as data (``text``, ``is_error``) or as a tool message's
content (``Observation.shown()``).
"""

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
    describe,
)
from worldenv.protocol.catalogue import Toolset, toolset, toolset_of
from worldenv.protocol.decode import ActionError, action_from_json, decode_call
from worldenv.protocol.execute import (
    Executor,
    aexecute,
    execute,
    refused,
    runs_inline,
    timed_out_observation,
    tool_observation,
)
from worldenv.protocol.observation import Mode

__all__ = ["Action", "ActionError", "AnswerAction", "Executor", "GuiAction",
           "ListToolsAction", "MetaCallAction", "Mode", "Observation", "ShellAction",
           "ToolAction", "Toolset", "Unexecutable", "action_from_json", "aexecute",
           "decode_call", "describe", "execute", "refused", "runs_inline",
           "timed_out_observation", "tool_observation", "toolset", "toolset_of"]
