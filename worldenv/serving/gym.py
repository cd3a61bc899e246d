"""A Gymnasium-style wrapper: ``reset() -> (observation, info)`` and
``step(action) -> (observation, reward, terminated, truncated, info)``.

Actions are the protocol's JSON actions (``worldenv.protocol.action_from_json``), or its
typed ones: ``{"tool": name, "arguments": {...}}`` calls a tool, ``{"shell": command}``
runs a shell command, ``{"gui": {"action": "click", "arguments": {...}}}`` acts in the
instance's browser (``worldenv.gui.tools``; the observation carries the screenshot as PNG
bytes), ``{"type": "list_tools"}`` and ``{"type": "call_tool", "tool_name": ...,
"arguments": {...}}`` are OpenEnv's MCP actions, ``{"answer": text}`` ends the episode.
Each is done by ``worldenv.protocol.execute``: the observation's ``text`` and ``is_error``
are what every other surface shows (a shell command's fields and a GUI action's page
beside them). The reward is 0.0 until the episode ends; then ``reward_fn(instance,
answer)`` decides (tasks and verifiers plug in there). Misuse raises, as in Gymnasium:
``step`` before ``reset`` or after the episode ended is an error, and so is an action of
no known shape (``ActionError``, a ValueError); a bad tool call is an observation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from worldenv.errors import ResetNeeded
from worldenv.instances.instance import Environment, Instance
from worldenv.protocol import (
    Action,
    AnswerAction,
    GuiAction,
    ListToolsAction,
    Observation,
    ShellAction,
    action_from_json,
    execute,
)

RewardFn = Callable[[Instance, str], float]


class WorldEnv:
    def __init__(self, environment: Environment, ref: str, *, max_steps: int = 20,
                 reward_fn: RewardFn | None = None) -> None:
        self.environment = environment
        self.ref = ref
        self.max_steps = max_steps
        self.reward_fn = reward_fn
        self.instance: Instance | None = None
        self._steps = 0
        self._done = True

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
        # `seed` is accepted for API compatibility; worlds are deterministic without one.
        if self.instance is None:
            self.instance = self.environment.open(self.ref)
        else:
            self.instance.reset()
        self._steps, self._done = 0, False
        tools = [t.name for t in self.instance.list_tools()]
        return {"tools": tools}, {"world_hash": self.instance.record.world_hash,
                                  "episode_id": self.instance.episode.episode_id}

    def step(self, action: dict[str, Any] | Action
             ) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        if self.instance is None or self._done:
            raise ResetNeeded("call reset() before step() (and after an episode ends)")
        chosen = action_from_json(action) if isinstance(action, dict) else action
        self._steps += 1
        observation = execute(self.instance, chosen)
        if isinstance(chosen, AnswerAction):
            self._done = True
            answer = chosen.text
            reward = self.reward_fn(self.instance, answer) if self.reward_fn else 0.0
            return {"answer": answer}, reward, True, False, self._info()
        truncated = self._steps >= self.max_steps
        self._done = truncated
        return _as_data(chosen, observation), 0.0, False, truncated, self._info()

    def _info(self) -> dict[str, Any]:
        assert self.instance is not None
        return {"step": self._steps, "episode_id": self.instance.episode.episode_id}

    def close(self) -> None:
        if self.instance is not None:
            self.instance.close()
            self.instance = None


def _as_data(action: Action, observation: Observation) -> dict[str, Any]:
    """An observation as Gym's dict: its text and error flag, and beside them a shell
    command's fields (exit code, stdout, stderr, ...), a GUI action's page and
    screenshot (PNG), the catalogue's tools."""
    data: dict[str, Any] = {"text": observation.text, "is_error": observation.is_error}
    if isinstance(action, ShellAction) and isinstance(observation.structured, dict):
        data.update(observation.structured)
    elif isinstance(action, GuiAction):
        data.update(url=observation.url, screenshot=observation.image)
    elif isinstance(action, ListToolsAction) and isinstance(observation.structured, dict):
        data["tools"] = observation.structured["result"]
    return data
