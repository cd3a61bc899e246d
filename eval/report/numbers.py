"""How a report writes numbers (percentages, counts, seconds, cost, signed deltas) and
which metrics of ``results.json`` it shows."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DASH",
    "HEADLINE",
    "USAGE",
    "as_float",
    "fmt_cost",
    "fmt_int",
    "fmt_num",
    "fmt_pct",
    "fmt_seconds",
    "is_number",
    "k_values",
    "pass_metrics",
    "signed",
]

DASH = "—"


def as_float(value: object) -> float | None:
    """A finite number as a float; None for anything else (None, a bool, NaN, text)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def is_number(value: object) -> bool:
    return as_float(value) is not None


def fmt_pct(value: object) -> str:
    """A rate as a percentage with one decimal: ``0.625`` -> ``62.5%``."""
    v = as_float(value)
    return DASH if v is None else f"{v * 100:.1f}%"


def fmt_num(value: object) -> str:
    """A mean such as a reward, three decimals."""
    v = as_float(value)
    return DASH if v is None else f"{v:.3f}"


def fmt_int(value: object) -> str:
    """A count, with thousands separated: ``12,345``."""
    v = as_float(value)
    return DASH if v is None else f"{round(v):,}"


def fmt_seconds(value: object) -> str:
    """A duration in seconds, two decimals and the unit: ``1.25 s``."""
    v = as_float(value)
    return DASH if v is None else f"{v:.2f} s"


def fmt_cost(value: object) -> str:
    """A cost in dollars, four decimals; a dash when unknown."""
    v = as_float(value)
    return DASH if v is None else f"${v:.4f}"


def signed(value: float, digits: int) -> str:
    text = f"{value:+.{digits}f}"
    return text.replace("-", "+", 1) if float(text) == 0 else text  # never "-0.0"


@dataclass(frozen=True)
class _Metric:
    """One headline number: where it is in the metrics object, its label, its format."""

    path: tuple[str, ...]
    label: str
    fmt: Callable[[object], str]

    @property
    def is_rate(self) -> bool:
        return self.fmt is fmt_pct

    def value(self, metrics: Mapping[str, Any]) -> Any:
        node: Any = metrics
        for key in self.path:
            if not isinstance(node, Mapping) or key not in node:
                return None
            node = node[key]
        return node

    def delta(self, base: object, other: object) -> str:
        a, b = as_float(base), as_float(other)
        if a is None or b is None:
            return DASH
        diff = b - a
        if self.is_rate:
            return f"{signed(diff * 100, 1)} pts"
        if self.fmt is fmt_seconds:
            return f"{signed(diff, 2)} s"
        if self.fmt is fmt_cost:
            return ("-" if round(diff, 4) < 0 else "+") + f"${abs(diff):.4f}"
        if self.fmt is fmt_int:
            return f"{round(diff):+,}"
        return signed(diff, 3)


HEADLINE = (
    _Metric(("success_rate",), "Success rate", fmt_pct),
    _Metric(("avg_reward",), "Average reward (lost trials count 0)", fmt_num),
    _Metric(("avg_reward_graded",), "Average reward (graded trials)", fmt_num),
    _Metric(("checklist_completion",), "Checklist completion", fmt_pct),
    _Metric(("tasks",), "Tasks", fmt_int),
    _Metric(("trials",), "Trials", fmt_int),
    _Metric(("trials_lost",), "Trials lost to infrastructure", fmt_int),
    _Metric(("env_error_rate",), "Environment-error (lost) rate", fmt_pct),
    _Metric(("format_error_rate",), "Format-error rate", fmt_pct),
    _Metric(("interface_switch_rate",), "Interface-switch rate", fmt_pct),
)
USAGE = (
    *(_Metric(("tokens", side, stat), f"Tokens {side} ({stat})", fmt_int)
      for side in ("in", "out") for stat in ("total", "p50", "p90", "p99")),
    _Metric(("cost", "total"), "Cost (total)", fmt_cost),
    _Metric(("cost", "per_trial"), "Cost per trial", fmt_cost),
    _Metric(("cost", "unknown"), "Trials of unknown cost", fmt_int),
    *(_Metric(("latency", stat), f"Latency ({stat})", fmt_seconds)
      for stat in ("mean", "p50", "p90", "p99")),
)


def k_values(*estimates: object) -> list[str]:
    """The k's of pass@k / pass^k objects, in numeric order."""
    keys = {k for est in estimates if isinstance(est, Mapping) for k in est}
    return sorted(keys, key=lambda k: (int(k) if k.isdigit() else math.inf, k))


def pass_metrics(metrics: Mapping[str, Any]) -> list[_Metric]:
    ks = k_values(metrics.get("pass@k"), metrics.get("pass^k"))
    return [_Metric((name, k), f"{name.replace('k', k)}", fmt_pct)
            for name in ("pass@k", "pass^k") for k in ks]
