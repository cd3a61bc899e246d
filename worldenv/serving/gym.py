"""A Gymnasium-style wrapper: ``reset() -> (observation, info)`` and
``step(action) -> (observation, reward, terminated, truncated, info)``.

Actions are dicts: ``{"tool": name, "arguments": {...}}`` calls a tool,
``{"shell": command}`` runs a shell command, ``{"gui": {"action": "click", "arguments":
{...}}}`` acts in the instance's browser (``worldenv.gui.tools``; the observation carries the
screenshot as PNG bytes), ``{"answer": text}`` ends the episode.
The reward is 0.0 until the episode ends; then ``reward_fn(instance, answer)`` decides
(tasks and verifiers plug in there). Misuse raises, as in Gymnasium: ``step`` before
``reset`` or after the episode ended is an error, a bad tool call is an observation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from worldenv.errors import ResetNeeded
from worldenv.instances.instance import Environment, Instance

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

    def step(self, action: dict[str, Any]
             ) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        if self.instance is None or self._done:
            raise ResetNeeded("call reset() before step() (and after an episode ends)")
        self._steps += 1
        if "answer" in action:
            self._done = True
            answer = str(action["answer"])
            reward = self.reward_fn(self.instance, answer) if self.reward_fn else 0.0
            return {"answer": answer}, reward, True, False, self._info()
        if "shell" in action:
            call = self.instance.shell(str(action["shell"]))
            observation: dict[str, Any] = {
                "exit_code": call.exit_code, "stdout": call.stdout, "stderr": call.stderr,
                "is_error": call.exit_code != 0}
        elif "tool" in action:
            result = self.instance.call_tool(str(action["tool"]), action.get("arguments") or {})
            observation = {"text": result.text, "is_error": result.is_error}
        elif "gui" in action:
            gui = action["gui"]
            if not isinstance(gui, dict):
                raise ValueError('a gui action is {"gui": {"action": ..., "arguments": {...}}}')
            done = self.instance.gui(str(gui.get("action", "")), gui.get("arguments") or {})
            observation = {"text": done.text, "is_error": done.is_error, "url": done.url,
                           "screenshot": done.image}
        else:
            raise ValueError(f"unknown action {sorted(action)}: use tool, shell, gui or answer")
        truncated = self._steps >= self.max_steps
        self._done = truncated
        return observation, 0.0, False, truncated, self._info()

    def _info(self) -> dict[str, Any]:
        assert self.instance is not None
        return {"step": self._steps, "episode_id": self.instance.episode.episode_id}

    def close(self) -> None:
        if self.instance is not None:
            self.instance.close()
            self.instance = None
