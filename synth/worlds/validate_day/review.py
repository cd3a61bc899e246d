"""Layer 5, review: an independent reviewer checks the day's world against the day's plan."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import msgspec

from synth.errors import BudgetSpent
from synth.worlds.validate_day.report import LayerResult
from worldllm.errors import NoModel, RecordingMissing

__all__ = ["ReviewOutcome", "Reviewer", "review_layer"]


class ReviewOutcome(msgspec.Struct, frozen=True):
    passed: bool
    reason: str
    findings: list[str] = []
    model: str | None = None


class Reviewer(Protocol):
    """An independent reviewer (an LLM agent, say) outside the implementer's container."""

    def review(self, world_dir: Path, plan: str) -> ReviewOutcome:
        """Check the world at `world_dir` (a private copy, ``services/`` and
        ``workspace/``) against the day's plan."""
        ...



def review_layer(world_dir: Path, reviewer: Reviewer | None, plan: str | None) -> LayerResult:
    if reviewer is None:
        return LayerResult("review", "not_run", "no model configured")
    if plan is None:
        return LayerResult("review", "not_run", "no plan given to review the world against")
    try:
        outcome = reviewer.review(world_dir, plan)
    except (NoModel, RecordingMissing, BudgetSpent):
        raise  # the review did not happen: the caller says so (not run, stopped)
    except Exception as exc:  # the reviewer is plugged in from outside: report, never pass
        return LayerResult("review", "failed", f"the reviewer raised "
                           f"{type(exc).__name__}: {exc}")
    evidence = {"findings": list(outcome.findings), "model": outcome.model}
    return LayerResult("review", "passed" if outcome.passed else "failed", outcome.reason,
                       evidence)
