"""Stage 6 of environment synthesis: a verifier and a reference solution per task.

The model writes, for one task, a verifier script in the task-folder format (a checklist
through ``awsdk``: ``awsdk.result(name=bool, ...)``, RESULT_JSON on stdout), the success
and failure criteria the judge reads (the task's ``rubric.md``) and — beyond AWM — a
reference solution: the tool calls that carry the task out, and a final answer.

Accepted when all three hold, each checked for real: the verifier runs without error in
the verifier sandbox; it gives V = 0 on the untouched world (W0, W0: gate 2's check);
and the reference solution played on a fresh instance (the reference agent of the gates)
gets a non-error answer to every call and V = 1 from the verifier. The error rate is the
share of the three that fail.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from awmbridge.world import AWM_SERVICE
from gates.agents import reference_agent
from gates.contract import AnswerStep, Solution, Subtask, TaskSpec, ToolStep, to_json
from gates.errors import TaskError
from gates.quality import initially_unsatisfied
from gates.rollout import run_rollout
from gates.task import RUBRIC_FILE, SOLUTION_FILE, SPEC_FILE, VERIFIER_DIR, load_task
from synth.stage import Measure, Stage
from worldenv.instances.instance import Environment
from worldstore.errors import WorldError

VERIFIER_SCRIPT = "check.py"
CONDITIONS = 3  # runs cleanly, V = 0 at W0, V = 1 after the reference solution
REVISION_HEAD = ("A previous version passed these checks, but the quality gates rejected the "
                 "task:")
# What a gate's failure means for the verifier's author (by the gate's stable reason code).
GATE_ADVICE = {
    "too_easy": ("agents that leave out part of the reference solution (its first half of "
                 "calls, or all but its last call) also pass the checks: check, in the final "
                 "database, every change the task asks for, not only the answer"),
    "satisfied_at_W0": "the checks hold before anything was done",
    "no_success": "no rollout passed the checks, not even the reference solution",
    "caved: verifier edited": "the checks change their verdict when the verifier's folder "
                              "is writable: never write files",
}


class ToolCallOut(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    tool: str
    arguments: dict[str, Any] = {}


class VerifierOut(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    verifier: str
    success_criteria: str
    failure_criteria: str
    solution: list[ToolCallOut]
    answer: str


class TaskRef(msgspec.Struct, frozen=True):
    """Which task of which world: what a task folder is made for."""

    task_id: str
    instruction: str
    persona: str
    world_hash: str
    source: str


def tool_name(op: str) -> str:
    """The name an instance gives an operation's tool (service first)."""
    prefix = f"{AWM_SERVICE}_"
    return op if op.startswith(prefix) else prefix + op


def write_task_folder(dest: Path, ref: TaskRef, out: VerifierOut) -> Path:
    """The task folder (``gates.task``) of one synthesized task; no hint (declared absent)."""
    if dest.exists():
        shutil.rmtree(dest)
    (dest / VERIFIER_DIR).mkdir(parents=True)
    spec = TaskSpec(task_id=ref.task_id, instruction=ref.instruction,
                    world=f"{ref.persona}@0", world_hash=ref.world_hash, interfaces=["mcp"],
                    difficulty="unlabeled",
                    subtasks=[Subtask(description=ref.instruction, interface="mcp")],
                    absent=["hint"], source=ref.source)
    (dest / SPEC_FILE).write_bytes(to_json(spec) + b"\n")
    (dest / VERIFIER_DIR / VERIFIER_SCRIPT).write_text(out.verifier, encoding="utf-8")
    (dest / RUBRIC_FILE).write_text(
        f"# Success\n\n{out.success_criteria.strip()}\n\n# Failure\n\n"
        f"{out.failure_criteria.strip()}\n", encoding="utf-8")
    steps: list[ToolStep | AnswerStep] = [
        ToolStep(tool=tool_name(c.tool), arguments=dict(c.arguments)) for c in out.solution]
    steps.append(AnswerStep(text=out.answer))
    (dest / SOLUTION_FILE).write_bytes(to_json(Solution(steps=list(steps))) + b"\n")
    return dest


class VerifierStage(Stage[VerifierOut]):
    name = "verifier"
    threshold = 0.0
    output_type = VerifierOut
    max_tokens = 8192

    def __init__(self, env: Environment, ref: TaskRef, tools: Sequence[dict[str, Any]],
                 ddl: Sequence[str], *, rejected: VerifierOut | None = None,
                 feedback: Sequence[str] = ()) -> None:
        """`rejected` and `feedback`: a revision, after the quality gates rejected the
        version `rejected` for the reasons in `feedback`."""
        self.env = env  # the store that holds the task's world (not part of the key)
        self.ref = ref
        self.tools = list(tools)
        self.ddl = list(ddl)
        self.rejected = rejected
        self.feedback = list(feedback)

    def inputs(self) -> Any:
        found: dict[str, Any] = {"task": msgspec.to_builtins(self.ref), "tools": self.tools,
                                 "ddl": self.ddl}
        if self.rejected is not None:
            found["revision"] = {"rejected": msgspec.to_builtins(self.rejected),
                                 "feedback": self.feedback}
        return found

    def request(self) -> str:
        tools = json.dumps(self.tools, indent=1, sort_keys=True)
        ddl = "\n".join(s + ";" for s in self.ddl)
        text = (f"Task: {self.ref.instruction}\n\nDatabase schema (service \"awm\"):\n{ddl}"
                f"\n\nTools (name, description, input schema):\n{tools}")
        if self.rejected is not None:
            rejected = json.dumps(msgspec.to_builtins(self.rejected), indent=1, sort_keys=True)
            reasons = "\n".join(f"- {f}" for f in self.feedback)
            text += (f"\n\n{REVISION_HEAD}\n{reasons}\n\nThe rejected version:\n{rejected}\n\n"
                     "Write a corrected version.")
        return text

    def execute(self, output: VerifierOut) -> Measure:
        with tempfile.TemporaryDirectory(prefix="synth-task-") as scratch:
            folder = write_task_folder(Path(scratch) / self.ref.task_id, self.ref, output)
            errors = [e.replace(scratch, "<task>") for e in check_task_folder(self.env, folder)]
        failed = min(CONDITIONS, len({e.split(":", 1)[0] for e in errors}))
        return Measure(failed / CONDITIONS, tuple(errors), {"steps": len(output.solution)})


def check_task_folder(env: Environment, folder: Path) -> list[str]:
    """The three conditions of stage 6 on a written task folder; each problem starts with
    the condition's name."""
    try:
        task = load_task(folder)
    except TaskError as exc:
        return [f"verifier runs: the task folder is refused: {exc}"]
    gate = initially_unsatisfied(env, task)
    if gate.status == "failed" and gate.reason == "verifier_error":
        return [f"verifier runs: {e}" for e in gate.evidence.get("errors", [])] or [
            "verifier runs: the verifier failed"]
    errors = []
    if gate.status != "passed":
        holding = [c[1] for c in gate.evidence.get("checks", []) if c[2]]
        why = ("every check holds before anything was done" if gate.reason ==
               "satisfied_at_W0" else gate.reason)
        errors.append(f"V = 0 at W0: {why} (holding at W0: {', '.join(holding) or 'none'})")
    try:
        rollout = run_rollout(env, task, reference_agent(), hinted=False)
    except WorldError as exc:
        return [*errors, f"V = 1 after the solution: the solution could not be run: {exc}"]
    for turn in rollout.trajectory.turns:
        if turn.is_error:
            step = turn.step
            name = step.tool if isinstance(step, ToolStep) else type(step).__name__
            errors.append(f"V = 1 after the solution: step {turn.index + 1} ({name}) got an "
                          f"error: {turn.observation[:300]}")
    verdict = rollout.verdict
    if verdict.is_error:
        errors.extend(f"V = 1 after the solution: the verifier failed: {e}"
                      for e in verdict.errors)
    elif not verdict.passed:
        failing = [c.name for c in verdict.checks if not c.passed]
        errors.append(f"V = 1 after the solution: checks fail after the reference solution: "
                      f"{', '.join(failing) or 'no check at all'}")
    return errors


def gate_feedback(gate: str, reason: str, detail: str | None) -> str:
    """One line of revision feedback for a gate's failure (deterministic text)."""
    advice = GATE_ADVICE.get(reason)
    text = f"gate {gate} failed ({reason})"
    if detail:
        text += f": {detail}"
    return f"{text}; {advice}" if advice else text


__all__ = [
    "CONDITIONS",
    "GATE_ADVICE",
    "TaskRef",
    "ToolCallOut",
    "VerifierOut",
    "VerifierStage",
    "check_task_folder",
    "gate_feedback",
    "tool_name",
    "write_task_folder",
]
