"""Agents work an instance towards a task and return their trajectory.

An agent is anything with a ``name`` and ``run(instance, task, hinted=...)``. The scripted
agents here need no model: they replay the task's reference solution, or a degraded form
of it (nothing, its first k steps, a shortcut that skips one interface), and serve as tests
of the gates and as baselines. The LLM agent lives in ``gates.llm_agent``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from gates.contract import (
    AnswerStep,
    GuiStep,
    ShellStep,
    Step,
    ToolStep,
    Trajectory,
    TurnRecord,
)
from gates.task import Task, step_interface
from worldenv.instances.instance import Instance
from worldenv.protocol.observation import shell_result
from worldstore.errors import ConfigError


class Agent(Protocol):
    name: str

    def run(self, instance: Instance, task: Task, *, hinted: bool) -> Trajectory:
        """Act on `instance` until done; never raises for a bad step (it is recorded)."""
        ...


def take_step(instance: Instance, index: int, step: Step, reasoning: str = "") -> TurnRecord:
    """Execute one step on the instance and record what the agent observed."""
    if isinstance(step, ToolStep):
        result = instance.call_tool(step.tool, dict(step.arguments))
        return TurnRecord(index=index, step=step, observation=result.text,
                          is_error=result.is_error, reasoning=reasoning)
    if isinstance(step, ShellStep):
        result = shell_result(instance.shell(step.command))
        return TurnRecord(index=index, step=step, observation=result.text,
                          is_error=result.is_error, reasoning=reasoning)
    if isinstance(step, GuiStep):
        return gui_turn(instance, index, step, reasoning)[0]
    return TurnRecord(index=index, step=step, observation="", reasoning=reasoning)


def gui_turn(instance: Instance, index: int, step: GuiStep, reasoning: str = ""
             ) -> tuple[TurnRecord, bytes | None]:
    """Execute a GUI step and keep its screenshot: the turn, and the PNG an agent may be
    shown (None when the action left no page)."""
    done = instance.gui(step.action, dict(step.arguments))
    return TurnRecord(index=index, step=step, observation=done.text, is_error=done.is_error,
                      reasoning=reasoning, screenshot=done.screenshot), done.image


class ScriptedAgent:
    """Plays a fixed list of steps chosen from the task (never looks at observations)."""

    def __init__(self, name: str, choose: Callable[[Task], Sequence[Step]]) -> None:
        self.name = name
        self._choose = choose

    def run(self, instance: Instance, task: Task, *, hinted: bool) -> Trajectory:
        trajectory = Trajectory(turns=[])
        for index, step in enumerate(self._choose(task)):
            trajectory.turns.append(take_step(instance, index, step))
            if isinstance(step, AnswerStep):
                trajectory.answer = step.text
                trajectory.stopped = "answer"
                break
        else:
            trajectory.stopped = "script_end"
        return trajectory


def reference_agent() -> ScriptedAgent:
    """Replays the reference solution."""
    return ScriptedAgent("scripted:reference", lambda task: task.solution.steps)


def nothing_agent() -> ScriptedAgent:
    """Does nothing and gives no answer."""
    return ScriptedAgent("scripted:nothing", lambda task: [])


def first_k_agent(k: int | None = None) -> ScriptedAgent:
    """Stops after the reference's first k actions (default: half of them), then answers
    with the reference's answer — the agent that gives up half-way but claims success."""

    def choose(task: Task) -> list[Step]:
        actions = [s for s in task.solution.steps if not isinstance(s, AnswerStep)]
        n = len(actions) // 2 if k is None else k
        return [*actions[:n], *_answers(task)]

    return ScriptedAgent(f"scripted:first-{'half' if k is None else k}", choose)


def shortcut_agent() -> ScriptedAgent:
    """The plausible shortcut: the reference solution without its GUI steps when it has
    any (skip looking), else without its shell steps when it has any (answer from the tools
    alone, leave the workspace untouched), otherwise without its writing tool calls' second
    half; it still claims the reference answer."""

    def choose(task: Task) -> list[Step]:
        steps = list(task.solution.steps)
        for skipped in (GuiStep, ShellStep):
            if any(isinstance(s, skipped) for s in steps):
                return [s for s in steps if not isinstance(s, skipped)]
        actions = [s for s in steps if not isinstance(s, AnswerStep)]
        return [*actions[: max(0, len(actions) - 1)], *_answers(task)]

    return ScriptedAgent("scripted:shortcut", choose)


def answer_only_agent() -> ScriptedAgent:
    """Answers with the reference answer without touching the world."""
    return ScriptedAgent("scripted:answer-only", _answers)


def _answers(task: Task) -> list[Step]:
    return [s for s in task.solution.steps if isinstance(s, AnswerStep)]


SCRIPTED: dict[str, Callable[[], ScriptedAgent]] = {
    "reference": reference_agent,
    "nothing": nothing_agent,
    "first-half": first_k_agent,
    "shortcut": shortcut_agent,
    "answer-only": answer_only_agent,
}


def scripted(name: str) -> ScriptedAgent:
    """`reference`, `nothing`, `first-half`, `first-K` (K an integer), `shortcut`,
    `answer-only`."""
    if name.startswith("first-") and name[len("first-"):].isdigit():
        return first_k_agent(int(name[len("first-"):]))
    factory = SCRIPTED.get(name)
    if factory is None:
        raise ValueError(f"unknown scripted agent {name!r}; known: "
                         f"{', '.join([*SCRIPTED, 'first-K'])}")
    return factory()


@dataclass(frozen=True)
class AgentSpec:
    """An agent named in text: ``scripted:NAME`` (a scripted agent above) or ``llm:MODEL``
    (the LLM agent of ``gates.llm_agent`` on a litellm model name)."""

    kind: Literal["scripted", "llm"]
    name: str


def parse_agent_spec(spec: str) -> AgentSpec:
    """Parse ``scripted:NAME`` or ``llm:MODEL``; ConfigError naming the spec otherwise (an
    unknown scripted agent included). ``gates.rollout.make_agent`` builds the agent."""
    kind, _, name = spec.partition(":")
    if kind == "scripted" and name:
        if not _is_scripted_name(name):
            raise ConfigError(f"agent {spec!r}: unknown scripted agent {name!r}; known: "
                              f"{', '.join([*SCRIPTED, 'first-K'])}")
        return AgentSpec("scripted", name)
    if kind == "llm" and name:
        return AgentSpec("llm", name)
    raise ConfigError(f"agent {spec!r}: use scripted:NAME (one of "
                      f"{', '.join([*SCRIPTED, 'first-K'])}) or llm:MODEL")


def _is_scripted_name(name: str) -> bool:
    return name in SCRIPTED or (name.startswith("first-") and name[len("first-"):].isdigit())


__all__ = ["Agent", "AgentSpec", "ScriptedAgent", "gui_turn", "parse_agent_spec", "scripted",
           "step_interface", "take_step"]
