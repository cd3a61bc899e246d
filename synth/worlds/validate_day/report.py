"""The report of a validated day: one result per layer, and its plain-text table."""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgspec

from gates.contract import GateStatus

__all__ = ["LAYERS", "DayReport", "LayerResult", "render_day_report"]

LAYERS = ("lint", "replay", "declarations", "health", "review")


class LayerResult(msgspec.Struct, frozen=True):
    layer: str
    status: GateStatus
    reason: str
    evidence: dict[str, Any] = {}


class DayReport(msgspec.Struct):
    """One result per layer, in order. ``ok``: no layer failed; ``not_run`` says how many
    layers did not run (an ok report with layers not run is not a full pass)."""

    persona: str
    day: int
    world_hash: str
    layers: list[LayerResult]
    ok: bool = False
    passed: int = 0
    failed: int = 0
    not_run: int = 0

    def __post_init__(self) -> None:
        counts = Counter(layer.status for layer in self.layers)
        self.passed, self.failed, self.not_run = (
            counts["passed"], counts["failed"], counts["not_run"])
        self.ok = self.failed == 0

    def layer(self, name: str) -> LayerResult:
        return next(result for result in self.layers if result.layer == name)

    @property
    def summary(self) -> str:
        verdict = "ok" if self.ok else "FAILED"
        return (f"{verdict}: {self.passed} passed, {self.failed} failed, "
                f"{self.not_run} not run")


def render_day_report(report: DayReport) -> str:
    """A plain-text table: one line per layer, then the summary."""
    head = f"{report.persona}@{report.day}  world {report.world_hash}"
    width = max(len(name) for name in LAYERS)
    lines = [head, f"  #  {'layer':<{width}}  {'status':<8}  reason"]
    for number, result in enumerate(report.layers, start=1):
        reason = " ".join(result.reason.split())
        lines.append(f"  {number}  {result.layer:<{width}}  {result.status:<8}  {reason}")
    lines.append(report.summary)
    return "\n".join(lines) + "\n"
