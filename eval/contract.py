"""The contract of evaluation: what a run records and what ``results.json`` holds.

``eval.runner`` writes trials, ``eval.metrics`` computes the metrics from them,
``eval.report`` renders them; each reads and writes only these types. ``results.json`` is
their one JSON encoding (``encode_results``: sorted keys, two-space indent), what
``worldctl eval run --json`` prints and other tools read::

    {"run": {...}, "tasks": [{"task_id", "difficulty", "interfaces",
      "trials": [{"trial", "episode_id", "success", "V", "reward", "checks", "steps",
                  "interfaces_used", "actions", "termination", "format_error",
                  "env_error", "tokens_in", "tokens_out", "cost", "seconds"}]}],
     "metrics": {"success_rate", "avg_reward", "pass@k": {"1": ...}, "pass^k": {...},
                 ...}}

A trial lost to the infrastructure (its instance, sandbox or verifier failed) has
``env_error`` true, ``success`` false and counts in every denominator: it is reported
as lost, never dropped. Resuming the run folder runs it again (``eval.runner``).
"""

from __future__ import annotations

from typing import Any

import msgspec


class RunInfo(msgspec.Struct, forbid_unknown_fields=True):
    """How a run was made. ``started`` is when it first started (a resumed run keeps it);
    ``run_id`` is the digest of everything that decides its trials."""

    run_id: str
    agent: str  # the agent spec: scripted:NAME or llm:MODEL
    model: str | None
    k: int
    split: str | None
    hinted: bool
    max_steps: int
    history: int
    concurrency: int
    tasks_source: list[str]
    started: str
    api_base: str | None = None
    protocol: str | None = None  # the paper's protocol the LLM agent ran under (eval.protocols)


class Trial(msgspec.Struct, forbid_unknown_fields=True):
    """One agent run of one task on a fresh instance, graded by the task's verifier.

    ``actions`` is the interface of each action in order (``mcp``, ``shell``, ``gui``;
    the final answer is not an action). ``reward`` is WildAWM's, None when there was no
    verdict (a lost trial). ``cost`` is None when the model's price is unknown."""

    trial: int
    episode_id: str
    success: bool
    V: int
    reward: float | None
    checks: list[bool]
    steps: int
    interfaces_used: list[str]
    actions: list[str]
    termination: str
    format_error: bool
    env_error: bool
    tokens_in: int
    tokens_out: int
    cost: float | None
    seconds: float
    error: str | None = None  # why the trial was lost, when it was


class TaskResult(msgspec.Struct, forbid_unknown_fields=True):
    task_id: str
    difficulty: str
    interfaces: list[str]
    trials: list[Trial]


class Results(msgspec.Struct, forbid_unknown_fields=True):
    run: RunInfo
    tasks: list[TaskResult]
    metrics: dict[str, Any]


def encode_results(results: Results) -> bytes:
    """The one JSON encoding of a run's results (sorted keys: runs diff cleanly)."""
    return msgspec.json.format(msgspec.json.encode(results, order="sorted"), indent=2) + b"\n"


def decode_results(data: bytes) -> Results:
    return msgspec.json.decode(data, type=Results)


__all__ = ["Results", "RunInfo", "TaskResult", "Trial", "decode_results", "encode_results"]
