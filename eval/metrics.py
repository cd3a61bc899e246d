"""The metrics of an evaluation run: the ``metrics`` object of ``results.json``,
computed from the run's ``TaskResult``\\ s, and the paired bootstrap ``compare`` uses.

Pure functions: no I/O, no clock, no randomness but the seeded PRNG of ``bootstrap_delta``.
Arithmetic is exact (``fractions.Fraction``; a float input such as ``seconds`` is taken at
its exact binary value) and rounded once, at the end, to 6 decimals, so no number depends on
the order of a sum and the JSON is stable.

Definitions (N trials over T tasks; task i has n_i trials of which c_i succeeded):

- success: ``V == 1`` and not ``format_error`` and not ``env_error``. A lost trial
  (``env_error``) is a failure and stays in every denominator: it is never dropped (tau2's
  pass^1 reads 100 % from one surviving trial of four; here it reads 25 %). A trial whose
  ``success`` flag disagrees with this definition is refused.
- ``pass_at_k(n, c, k) = 1 - C(n - c, k) / C(n, k)`` (the unbiased estimator: the chance
  that at least one of k trials drawn without replacement from the n succeeded).
- ``pass_hat_k(n, c, k) = C(c, k) / C(n, k)`` (tau2-bench's pass^k: the chance that all k
  drawn trials succeeded). Both raise ``EvalError`` for k > n (the estimators are undefined
  there); ``compute_metrics`` only asks for k = 1 .. K, K = min_i n_i of the tasks at hand.
- ``pass@k``, ``pass^k``: ``{str(k): (1/T) sum_i pass_*(n_i, c_i, k)}`` for k = 1 .. K.
  In ``by_difficulty`` and ``by_interfaces`` K is the smallest trial count of that group.
- ``success_rate = (sum_i c_i) / N``.
- ``avg_reward = (1/N) sum_j r_j`` with r_j = 0 for a lost trial or a reward of None;
  ``avg_reward_graded`` is the mean over the trials that are not lost and have a reward
  (None when there is none).
- ``checklist_completion = (1/M) sum_j passed_j / len(checks_j)`` over the M trials that are
  lost (counting 0) or have at least one check; a trial that was graded without a checklist
  (a judged-only task) has nothing to complete and is left out. None when M = 0.
- ``format_error_rate = #format_error / N``; ``env_error_rate = trials_lost / N`` with
  ``trials_lost = #env_error``; ``terminations = {reason: count}``.
- ``interface_switch_rate = (1/S) sum_j s_j / (a_j - 1)`` over the S trials with
  a_j >= 2 actions, s_j the number of consecutive action pairs whose interfaces differ
  (each trial weighs the same, whatever its length). None when S = 0.
- ``action_share = {interface: (#actions on it) / (#actions)}`` over all trials.
- ``step_budget_curve = [[b, #(success and steps <= b) / N] for b = 1 .. max steps]``:
  the last point is ``success_rate`` (a success in 0 steps counts within every budget).
- percentiles are nearest-rank: for sorted x_1 <= ... <= x_m, ``P_p = x_r`` with
  ``r = max(1, ceil(p/100 * m))`` (always one of the values, never interpolated).
- ``tokens = {"in"|"out": {"total", "p50", "p90", "p99"}}`` over all N trials;
  ``latency = {"p50", "p90", "p99", "mean"}`` of ``seconds`` over all N trials;
  ``cost = {"total": sum of known costs, "per_trial": total / #known, "unknown": #None}``
  (total and per_trial are None when no cost is known).
- ``bootstrap_delta(a, b)``: delta = mean(b) - mean(a) over paired tasks; ``samples``
  resamples of the task indices with replacement (``random.Random(seed)``), each giving the
  mean of b_i - a_i; [low, high] are the nearest-rank (1 - level)/2 and (1 + level)/2
  quantiles of those means; ``noise`` is low <= 0 <= high.
- ``delta_verdict(a, b, result)``: "noise" when the interval contains 0; else "too few
  tasks for a verdict (n=...)" when fewer than ``min_tasks(level)`` paired tasks differ
  (b_i != a_i); else "better" or "worse" by the sign of delta. ``min_tasks(level)`` is the
  smallest m with ``2 * 2**-m <= 1 - level`` (6 at level 0.95): with fewer differing
  tasks not even a sign test, whose p-value is smallest when every one of them moves
  the same way, can reach the level, so a bootstrap interval that excludes 0 is an
  artefact of resampling a handful of values (with 3 tasks it has only 10 distinct
  resamples, and its interval collapses to a point when all three move alike).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from fractions import Fraction
from itertools import pairwise
from typing import Any, TypeVar

from eval.contract import TaskResult, Trial
from eval.errors import EvalError

DIGITS = 6
PERCENTILES = (50, 90, 99)
NO_INTERFACE = "none"  # the by_interfaces key of a task that declares no interface

_N = TypeVar("_N", int, float)


# --- estimators ----------------------------------------------------------------------------

def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n - c, k) / C(n, k): the chance that at least one of k of the n trials (drawn
    without replacement) succeeded, given c of them did. Raises EvalError for k > n."""
    return float(_pass_at_k(n, c, k))


def pass_hat_k(n: int, c: int, k: int) -> float:
    """C(c, k) / C(n, k) (tau2-bench's pass^k): the chance that all k of k trials drawn from
    the n succeeded, given c of them did. Raises EvalError for k > n."""
    return float(_pass_hat_k(n, c, k))


def _pass_at_k(n: int, c: int, k: int) -> Fraction:
    _check_counts(n, c, k)
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def _pass_hat_k(n: int, c: int, k: int) -> Fraction:
    _check_counts(n, c, k)
    return Fraction(math.comb(c, k), math.comb(n, k))


def _check_counts(n: int, c: int, k: int) -> None:
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise EvalError(f"{name} = {value!r} is not a whole number")
    if n < 1 or c < 0 or k < 1:
        raise EvalError(f"n = {n}, c = {c}, k = {k}: n and k must be at least 1, c at least 0")
    if c > n:
        raise EvalError(f"c = {c} successes out of n = {n} trials: c cannot exceed n")
    if k > n:
        raise EvalError(f"k = {k} is more than the n = {n} trials: pass@k and pass^k are "
                        f"only defined for k <= n")


def percentile(values: Sequence[_N], p: float) -> _N:
    """The nearest-rank p-th percentile (0 < p <= 100): x_r of the sorted values with
    r = max(1, ceil(p/100 * m)); one of the values, never an interpolation."""
    if not values:
        raise EvalError("a percentile of no values is undefined")
    if not 0 < p <= 100:
        raise EvalError(f"percentile {p} is outside (0, 100]")
    ordered = sorted(values)
    rank = max(1, math.ceil(Fraction(p) / 100 * len(ordered)))
    return ordered[rank - 1]


# --- the metrics object --------------------------------------------------------------------

def compute_metrics(tasks: Sequence[TaskResult]) -> dict[str, Any]:
    """The ``metrics`` object of results.json (the module docstring defines every key);
    refuses a run without tasks, a task without trials and a trial that breaks the
    contract (the message names the task and trial)."""
    _check_tasks(tasks)
    trials = [t for task in tasks for t in task.trials]
    metrics: dict[str, Any] = {
        **_core(tasks),
        "avg_reward_graded": _avg_reward_graded(trials),
        "checklist_completion": _checklist_completion(trials),
        "trials_lost": sum(1 for t in trials if t.env_error),
        "format_error_rate": Fraction(sum(1 for t in trials if t.format_error), len(trials)),
        "env_error_rate": Fraction(sum(1 for t in trials if t.env_error), len(trials)),
        "terminations": _sorted_counts(t.termination for t in trials),
        "by_difficulty": _grouped(tasks, lambda task: task.difficulty),
        "by_interfaces": _grouped(tasks, interfaces_key),
        "interface_switch_rate": _interface_switch_rate(trials),
        "action_share": _action_share(trials),
        "step_budget_curve": _step_budget_curve(trials),
        "tokens": {"in": _token_summary([t.tokens_in for t in trials]),
                   "out": _token_summary([t.tokens_out for t in trials])},
        "cost": _cost(trials),
        "latency": _latency(trials),
    }
    return dict(sorted(_rounded(metrics).items()))


def interfaces_key(task: TaskResult) -> str:
    """The by_interfaces key of a task: its declared interfaces, sorted, joined by '+'
    ("mcp+shell"); "none" when it declares none."""
    return "+".join(sorted(set(task.interfaces))) or NO_INTERFACE


def per_task_success(tasks: Sequence[TaskResult]) -> dict[str, float]:
    """{task_id: c_i / n_i}, sorted by task id: each task's success rate with lost trials
    counted as failures; what ``bootstrap_delta`` pairs across two runs."""
    _check_tasks(tasks)
    return {task.task_id: float(Fraction(_successes(task), len(task.trials)))
            for task in sorted(tasks, key=lambda task: task.task_id)}


def _core(tasks: Sequence[TaskResult]) -> dict[str, Any]:
    """The metrics every group carries: success_rate, avg_reward, pass@k, pass^k, trials,
    tasks."""
    trials = [t for task in tasks for t in task.trials]
    top_k = min(len(task.trials) for task in tasks)
    counts = [(len(task.trials), _successes(task)) for task in tasks]
    return {
        "success_rate": Fraction(sum(c for _, c in counts), len(trials)),
        "avg_reward": sum((_reward_or_zero(t) for t in trials), Fraction(0)) / len(trials),
        "pass@k": _averaged(counts, top_k, _pass_at_k),
        "pass^k": _averaged(counts, top_k, _pass_hat_k),
        "trials": len(trials),
        "tasks": len(tasks),
    }


def _averaged(counts: Sequence[tuple[int, int]], top_k: int,
              estimator: Callable[[int, int, int], Fraction]) -> dict[str, Fraction]:
    return {str(k): sum((estimator(n, c, k) for n, c in counts), Fraction(0)) / len(counts)
            for k in range(1, top_k + 1)}


def _grouped(tasks: Sequence[TaskResult],
             key: Callable[[TaskResult], str]) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[TaskResult]] = {}
    for task in tasks:
        groups.setdefault(key(task), []).append(task)
    return {name: _core(groups[name]) for name in sorted(groups)}


def _avg_reward_graded(trials: Sequence[Trial]) -> Fraction | None:
    graded = [r for r in map(_reward, trials) if r is not None]
    return _mean(graded)


def _checklist_completion(trials: Sequence[Trial]) -> Fraction | None:
    fractions = [Fraction(0) if t.env_error else Fraction(sum(t.checks), len(t.checks))
                 for t in trials if t.env_error or t.checks]
    return _mean(fractions)


def _interface_switch_rate(trials: Sequence[Trial]) -> Fraction | None:
    rates = [Fraction(sum(1 for x, y in pairwise(t.actions) if x != y), len(t.actions) - 1)
             for t in trials if len(t.actions) >= 2]
    return _mean(rates)


def _action_share(trials: Sequence[Trial]) -> dict[str, Fraction]:
    counts = Counter(a for t in trials for a in t.actions)
    total = sum(counts.values())
    return {name: Fraction(counts[name], total) for name in sorted(counts)}


def _step_budget_curve(trials: Sequence[Trial]) -> list[list[int | Fraction]]:
    within = Counter(t.steps for t in trials if _succeeded(t))
    curve: list[list[int | Fraction]] = []
    done = within.get(0, 0)
    for budget in range(1, max(t.steps for t in trials) + 1):
        done += within.get(budget, 0)
        curve.append([budget, Fraction(done, len(trials))])
    return curve


def _token_summary(values: Sequence[int]) -> dict[str, int]:
    return {"total": sum(values), **{f"p{p}": percentile(values, p) for p in PERCENTILES}}


def _cost(trials: Sequence[Trial]) -> dict[str, Fraction | int | None]:
    known = [Fraction(t.cost) for t in trials if t.cost is not None]
    total = sum(known, Fraction(0)) if known else None
    return {"total": total, "per_trial": _mean(known), "unknown": len(trials) - len(known)}


def _latency(trials: Sequence[Trial]) -> dict[str, Fraction | float | None]:
    seconds = [t.seconds for t in trials]
    summary: dict[str, Fraction | float | None] = {
        f"p{p}": percentile(seconds, p) for p in PERCENTILES}
    summary["mean"] = _mean([Fraction(s) for s in seconds])
    return summary


# --- trials --------------------------------------------------------------------------------

def _succeeded(trial: Trial) -> bool:
    return trial.V == 1 and not trial.format_error and not trial.env_error


def _successes(task: TaskResult) -> int:
    return sum(1 for t in task.trials if _succeeded(t))


def _reward(trial: Trial) -> Fraction | None:
    """The trial's reward, None when it has none or was lost (a lost trial has no verdict)."""
    if trial.env_error or trial.reward is None:
        return None
    return Fraction(trial.reward)


def _reward_or_zero(trial: Trial) -> Fraction:
    reward = _reward(trial)
    return Fraction(0) if reward is None else reward


def _check_tasks(tasks: Sequence[TaskResult]) -> None:
    if not tasks:
        raise EvalError("no tasks: there are no metrics of an empty run")
    seen: set[str] = set()
    for task in tasks:
        if task.task_id in seen:
            raise EvalError(f"task {task.task_id} appears twice in the run")
        seen.add(task.task_id)
        if not task.trials:
            raise EvalError(f"task {task.task_id} has no trials: a task in a run has at "
                            "least one (a lost trial is recorded, not dropped)")
        for trial in task.trials:
            problem = _trial_problem(trial)
            if problem:
                raise EvalError(f"task {task.task_id}, trial {trial.trial}: {problem}")


def _trial_problem(trial: Trial) -> str | None:
    """What breaks the contract in a trial, or None."""
    if trial.V not in (0, 1):
        return f"V = {trial.V}, not 0 or 1"
    if trial.success != _succeeded(trial):
        return (f"success is {trial.success} but V = {trial.V}, format_error = "
                f"{trial.format_error}, env_error = {trial.env_error} (success is V = 1 "
                "without a format or environment error)")
    for name in ("steps", "tokens_in", "tokens_out"):
        if getattr(trial, name) < 0:
            return f"{name} = {getattr(trial, name)} is negative"
    for name in ("seconds", "cost", "reward"):
        value = getattr(trial, name)
        if value is not None and not math.isfinite(value):
            return f"{name} = {value} is not a finite number"
    if trial.seconds < 0 or (trial.cost is not None and trial.cost < 0):
        return f"seconds = {trial.seconds} and cost = {trial.cost} cannot be negative"
    return None


# --- numbers -------------------------------------------------------------------------------

def _mean(values: Sequence[Fraction]) -> Fraction | None:
    return sum(values, Fraction(0)) / len(values) if values else None


def _sorted_counts(items: Iterable[str]) -> dict[str, int]:
    counts = Counter(items)
    return {name: counts[name] for name in sorted(counts)}


def _rounded(value: Any) -> Any:
    """Every Fraction and float rounded once to DIGITS decimals; ints, bools, None and
    strings kept; dicts and lists rounded throughout."""
    if isinstance(value, Fraction):
        return float(round(value, DIGITS))
    if isinstance(value, float):
        return float(round(Fraction(value), DIGITS))
    if isinstance(value, Mapping):
        return {key: _rounded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_rounded(item) for item in value]
    return value


# --- comparison ----------------------------------------------------------------------------

def bootstrap_delta(a: Sequence[float], b: Sequence[float], *, samples: int = 2000,
                    seed: int = 0, level: float = 0.95) -> dict[str, Any]:
    """A paired bootstrap over tasks of mean(b) - mean(a): a[i] and b[i] are the same task
    in two runs (``per_task_success`` of each, in the same task order). Returns delta, the
    interval low and high at ``level``, and noise (the interval contains 0), plus level,
    samples and tasks; the same inputs give the same result."""
    diffs = _paired_differences(a, b)
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise EvalError(f"samples = {samples!r}: a bootstrap needs at least one resample")
    if not 0 < level < 1:
        raise EvalError(f"level = {level} is outside (0, 1)")
    rng = random.Random(seed)
    count = len(diffs)
    means = [math.fsum(diffs[rng.randrange(count)] for _ in range(count)) / count
             for _ in range(samples)]
    tail = (1 - Fraction(level)) / 2 * 100
    low = percentile(means, float(tail))
    high = percentile(means, float(100 - tail))
    return {"delta": round(math.fsum(diffs) / count, DIGITS), "low": round(low, DIGITS),
            "high": round(high, DIGITS), "noise": low <= 0 <= high, "level": level,
            "samples": samples, "tasks": count}


def min_tasks(level: float = 0.95) -> int:
    """The fewest differing paired tasks with which a two-sided sign test can reach
    ``level``: the smallest m with 2 * 2**-m <= 1 - level."""
    if not 0 < level < 1:
        raise EvalError(f"level = {level} is outside (0, 1)")
    m = 1
    while 2 * Fraction(1, 2 ** m) > 1 - Fraction(level):
        m += 1
    return m


def delta_verdict(a: Sequence[float], b: Sequence[float], result: Mapping[str, Any]) -> str:
    """The verdict on ``bootstrap_delta(a, b)``'s `result`: "noise" (the interval contains
    0), "too few tasks for a verdict (n=N)" when the interval excludes 0 but fewer than
    ``min_tasks`` of the paired tasks differ between the runs, else "better" or "worse"."""
    diffs = _paired_differences(a, b)
    if result["noise"]:
        return "noise"
    differing = sum(1 for d in diffs if d != 0)
    if differing < min_tasks(float(result["level"])):
        shown = f"n={len(diffs)}" if differing == len(diffs) else (
            f"n={len(diffs)}, {differing} differ")
        return f"too few tasks for a verdict ({shown})"
    return "better" if float(result["delta"]) > 0 else "worse"


def _paired_differences(a: Sequence[float], b: Sequence[float]) -> list[float]:
    if len(a) != len(b):
        raise EvalError(f"{len(a)} tasks against {len(b)}: a paired bootstrap needs the "
                        "same tasks in both runs")
    if not a:
        raise EvalError("no tasks to compare")
    for side, values in (("a", a), ("b", b)):
        for index, value in enumerate(values):
            if isinstance(value, bool) or not math.isfinite(value):
                raise EvalError(f"{side}[{index}] = {value!r} is not a finite number")
    return [y - x for x, y in zip(a, b, strict=True)]


__all__ = [
    "bootstrap_delta",
    "compute_metrics",
    "delta_verdict",
    "interfaces_key",
    "min_tasks",
    "pass_at_k",
    "pass_hat_k",
    "per_task_success",
    "percentile",
]
