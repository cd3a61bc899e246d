"""The contract of grading: tasks, verdicts, trajectories, rollouts, judgements, gate results.

Every other module of ``gates`` (the verifier runtime, rewards, agents, judges, the gates and
their runner, world-day validation) speaks these types and nothing else, so each can be
replaced or tested alone. All are msgspec Structs: they encode to JSON for reports and
recordings and decode back with validation.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

Interface = Literal["mcp", "shell", "gui"]
INTERFACES: tuple[Interface, ...] = ("mcp", "shell", "gui")
Difficulty = Literal["hard", "medium", "easy", "unlabeled"]
JudgeClass = Literal["Completed", "Partially Completed", "Agent Error", "Environment Error"]
JUDGE_CLASSES: tuple[JudgeClass, ...] = (
    "Completed", "Partially Completed", "Agent Error", "Environment Error")
GateStatus = Literal["passed", "failed", "not_run"]


# --- tasks -------------------------------------------------------------------------------


class Subtask(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    description: str
    interface: Interface


Artifact = Literal["solution", "hint", "rubric"]  # what a task may declare absent


class TaskSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``task.json`` of a task folder.

    ``absent`` names the artifacts the task does not have (an imported task: AWM ships no
    reference solution, hint or rubric); their files must then not exist, and every other
    one must. ``source`` says where an imported task came from (file and line)."""

    task_id: str
    instruction: str
    world: str  # persona@day
    world_hash: str
    interfaces: list[Interface]
    difficulty: Difficulty
    subtasks: list[Subtask]
    absent: list[Artifact] = []
    source: str = ""


class ToolStep(msgspec.Struct, frozen=True, tag="tool", tag_field="kind",
               forbid_unknown_fields=True):
    """An MCP tool call."""

    tool: str
    arguments: dict[str, Any] = {}


class ShellStep(msgspec.Struct, frozen=True, tag="shell", tag_field="kind",
                forbid_unknown_fields=True):
    """A shell command in the instance's sandbox."""

    command: str


class GuiStep(msgspec.Struct, frozen=True, tag="gui", tag_field="kind",
              forbid_unknown_fields=True):
    """A GUI action in the instance's browser (``worldenv.gui.tools``): ``action`` is one of open,
    screenshot, click, type, key, scroll, read; ``arguments`` those of its ``gui_`` tool
    (``{"url": "/shop/"}``, ``{"name": "Add to cart", "role": "button"}``)."""

    action: str
    arguments: dict[str, Any] = {}


class AnswerStep(msgspec.Struct, frozen=True, tag="answer", tag_field="kind",
                 forbid_unknown_fields=True):
    """The agent's final answer (ends the rollout)."""

    text: str


Step = ToolStep | ShellStep | GuiStep | AnswerStep


class Solution(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``solution.json``: the reference solution as steps."""

    steps: list[Step]


# --- verifier verdicts -------------------------------------------------------------------


class Check(msgspec.Struct, frozen=True):
    """One criterion v_i of the checklist: which script produced it and whether it holds."""

    script: str
    name: str
    passed: bool


class ScriptResult(msgspec.Struct, frozen=True):
    """One verifier script's run. ``error`` is set when it produced no usable verdict
    (timeout, crash, no/invalid RESULT_JSON line, sandbox refusal)."""

    script: str
    checks: list[Check]
    error: str | None
    exit_code: int | None
    seconds: float
    stdout_tail: str = ""
    stderr_tail: str = ""
    # What the script reported besides its checks ("evidence" of its RESULT_JSON object):
    # for the code-augmented judge, e.g. an AWM sql-mode verifier's findings.
    evidence: dict[str, Any] = {}


class Verdict(msgspec.Struct, frozen=True):
    """V(W0, W, a): the checklist v_1..v_N over all scripts and its product V.

    A script error makes the verdict an error verdict: ``passed`` is False and ``errors``
    says why — the checklist of the scripts that did run is kept as evidence.
    """

    checks: list[Check]
    scripts: list[ScriptResult]
    errors: list[str]

    @property
    def n(self) -> int:
        return len(self.checks)

    @property
    def satisfied(self) -> int:
        return sum(1 for c in self.checks if c.passed)

    @property
    def passed(self) -> bool:
        """V = product of v_i; an error verdict or an empty checklist is never a pass."""
        return not self.errors and bool(self.checks) and all(c.passed for c in self.checks)

    @property
    def is_error(self) -> bool:
        return bool(self.errors)


# --- trajectories and rollouts ------------------------------------------------------------


class TurnRecord(msgspec.Struct, frozen=True):
    """One agent step: what it did and what it saw. ``reasoning`` is the model's text
    (for AWM's format rule 1); scripted agents leave it empty."""

    index: int
    step: Step
    observation: str
    is_error: bool = False
    reasoning: str = ""
    screenshot: str | None = None  # a GUI step's screenshot digest (Episode.screenshots)


class Trajectory(msgspec.Struct):
    turns: list[TurnRecord] = []
    answer: str | None = None
    format_error: str | None = None  # why the rollout was stopped for its format, if it was
    stopped: str | None = None  # "step_limit", "answer", "format_error", "agent_error", ...
    # the model's usage over the rollout (0 / None for scripted agents and unpriced models)
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float | None = None


class Rollout(msgspec.Struct):
    """One agent run of one task on a fresh instance, graded."""

    rollout_id: str
    task_id: str
    agent: str
    hinted: bool
    episode_id: str
    final_hash: str
    interfaces_used: list[Interface]
    trajectory: Trajectory
    verdict: Verdict

    @property
    def succeeded(self) -> bool:
        return self.trajectory.format_error is None and self.verdict.passed


# --- judges and gates ---------------------------------------------------------------------


class Judgement(msgspec.Struct, frozen=True):
    """A judge's class for one rollout. ``status`` is "not_run" when no model was
    configured; then ``verdict`` is None and nobody may read it as a pass."""

    status: Literal["ran", "not_run", "error"]
    verdict: JudgeClass | None
    reasoning: str = ""
    model: str | None = None


class GateResult(msgspec.Struct, frozen=True):
    gate: str
    status: GateStatus
    reason: str
    evidence: dict[str, Any] = {}


class GateReport(msgspec.Struct):
    task_id: str
    accepted: bool
    rounds: list[list[GateResult]]
    difficulty: Difficulty | None = None
    notes: list[str] = []


def to_json(value: Any) -> bytes:
    """The one JSON encoding of these types (sorted keys: reports diff cleanly)."""
    return msgspec.json.format(msgspec.json.encode(value, order="sorted"), indent=2)
