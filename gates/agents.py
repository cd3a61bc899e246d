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
from worldenv.protocol import (
    Action,
    AnswerAction,
    GuiAction,
    ListToolsAction,
    MetaCallAction,
    Observation,
    ShellAction,
    ToolAction,
    execute,
)
from worldenv.protocol.observation import CALL_TOOL, LIST_TOOLS
from worldstore.errors import ConfigError


class Agent(Protocol):
    name: str

    def run(self, instance: Instance, task: Task, *, hinted: bool) -> Trajectory:
        """Act on `instance` until done; never raises for a bad step (it is recorded)."""
        ...


def action_of(step: Step) -> Action:
    """The protocol's action for a step (``worldenv.protocol``)."""
    if isinstance(step, ToolStep):
        return ToolAction(step.tool, dict(step.arguments))
    if isinstance(step, ShellStep):
        return ShellAction(step.command)
    if isinstance(step, GuiStep):
        return GuiAction(step.action, dict(step.arguments))
    return AnswerAction(step.text)


def step_of(action: Action) -> Step:
    """The step a trajectory records for an action: a meta-tool's call, or a call that
    could not be executed, as the model wrote it (the tool it named, and its arguments
    when they were an object)."""
    if isinstance(action, ToolAction):
        return ToolStep(tool=action.tool, arguments=action.arguments)
    if isinstance(action, ShellAction):
        return ShellStep(command=action.command)
    if isinstance(action, GuiAction):
        return GuiStep(action=action.action, arguments=action.arguments)
    if isinstance(action, AnswerAction):
        return AnswerStep(text=action.text)
    if isinstance(action, ListToolsAction):
        return ToolStep(tool=LIST_TOOLS, arguments=action.written or {})
    if isinstance(action, MetaCallAction):
        return ToolStep(tool=CALL_TOOL, arguments=action.written if action.written is not None
                        else {"tool_name": action.tool_name, "arguments": action.arguments})
    return ToolStep(tool=action.tool, arguments=action.written or {})


def turn_of(index: int, step: Step, observation: Observation, reasoning: str = ""
            ) -> TurnRecord:
    """The turn that records a step and what it showed."""
    return TurnRecord(index=index, step=step, observation=observation.text,
                      is_error=observation.is_error, reasoning=reasoning,
                      screenshot=observation.screenshot)


def take_step(instance: Instance, index: int, step: Step, reasoning: str = "") -> TurnRecord:
    """Execute one step on the instance and record what the agent observed."""
    return turn_of(index, step, execute(instance, action_of(step)), reasoning)


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


__all__ = ["Agent", "AgentSpec", "ScriptedAgent", "action_of", "parse_agent_spec", "scripted",
           "step_interface", "step_of", "take_step", "turn_of"]
