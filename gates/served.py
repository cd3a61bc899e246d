"""Tasks for the gateway: task folders as ``worldenv.serving.gateway.ServedTask``, each grading an
instance with the task's verifier (the gateway cannot: ``envs`` never imports ``gates``).

A source of tasks is a task folder (it holds ``task.json``), a folder of task folders, or
a pack by name (``packs.registry.load_pack``: its ``tasks`` folder).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gates.contract import Verdict
from gates.rewards import wildawm_reward
from gates.rollout import grade, task_w0
from gates.task import Task, load_task, task_folders
from worldenv.instances.instance import Environment, Instance
from worldenv.serving.gateway import Grade, ServedTask
from worldstore.errors import ConfigError


def served_task(env: Environment, task: Task) -> ServedTask:
    """`task` as the gateway serves it; refuses a task whose world this store lacks or
    holds under another hash (checked now, not at the first grade)."""
    task_w0(env.worlds, task)

    def grade_instance(instance: Instance, answer: str | None) -> Grade:
        return grade_of(grade(env, task, instance, answer))

    spec = task.spec
    return ServedTask(task_id=task.task_id, instruction=spec.instruction, world=spec.world,
                      world_hash=spec.world_hash, interfaces=tuple(spec.interfaces),
                      grade=grade_instance)


def grade_of(verdict: Verdict) -> dict[str, Any]:
    """A verdict as the gateway answers it: V, the checks, WildAWM's reward (None for a
    verifier error or an empty checklist, which measured nothing) and the errors."""
    measured = not verdict.is_error and verdict.checks
    return {"V": int(verdict.passed),
            "checks": [{"name": c.name, "script": c.script, "passed": c.passed}
                       for c in verdict.checks],
            "reward": wildawm_reward(False, verdict) if measured else None,
            "errors": list(verdict.errors)}


def load_served_tasks(env: Environment, sources: Sequence[str],
                      installed: Path | None = None) -> dict[str, ServedTask]:
    """Every task of `sources`, by task id; ConfigError naming both folders when two
    tasks share an id."""
    tasks: dict[str, ServedTask] = {}
    where: dict[str, Path] = {}
    for source in sources:
        for folder in task_folders(source, installed):
            task = load_task(folder)
            if task.task_id in tasks:
                raise ConfigError(f"task id {task.task_id!r} is in both {where[task.task_id]} "
                                  f"and {folder}")
            tasks[task.task_id] = served_task(env, task)
            where[task.task_id] = folder
    return tasks


__all__ = ["grade_of", "load_served_tasks", "served_task"]
