"""eval.metrics: pass@k, pass^k and every key of results.json's ``metrics`` object against
values computed by hand (the comments show the arithmetic), the lost-trial trap of tau2's
pass^1, refusals, nearest-rank percentiles and the paired bootstrap of ``compare``."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eval.contract import TaskResult, Trial
from eval.errors import EvalError
from eval.metrics import (
    bootstrap_delta,
    compute_metrics,
    interfaces_key,
    pass_at_k,
    pass_hat_k,
    per_task_success,
    percentile,
)


def trial(index: int, *, V: int = 0, reward: float | None = 0.0,
          checks: list[bool] | None = None, actions: list[str] | None = None,
          termination: str = "answer", format_error: bool = False, env_error: bool = False,
          tokens: tuple[int, int] = (0, 0), cost: float | None = None,
          seconds: float = 1.0, steps: int | None = None) -> Trial:
    actions = actions or []
    return Trial(
        trial=index, episode_id=f"ep-{index}",
        success=V == 1 and not format_error and not env_error, V=V, reward=reward,
        checks=checks if checks is not None else [], steps=len(actions) if steps is None
        else steps, interfaces_used=sorted(set(actions)), actions=actions,
        termination=termination, format_error=format_error, env_error=env_error,
        tokens_in=tokens[0], tokens_out=tokens[1], cost=cost, seconds=seconds,
        error="sandbox died" if env_error else None)


def task(task_id: str, trials: list[Trial], *, difficulty: str = "easy",
         interfaces: list[str] | None = None) -> TaskResult:
    return TaskResult(task_id=task_id, difficulty=difficulty,
                      interfaces=interfaces if interfaces is not None else ["mcp"],
                      trials=trials)


def successes(pattern: str, task_id: str = "t") -> TaskResult:
    """A task whose trials succeed ('1'), fail ('0') or are lost ('x'), in that order."""
    trials = [trial(i, V=1, reward=1.0, checks=[True]) if mark == "1"
              else trial(i, env_error=True, reward=None, termination="env_error")
              if mark == "x" else trial(i, checks=[False])
              for i, mark in enumerate(pattern)]
    return task(task_id, trials)


# --- pass@k and pass^k ---------------------------------------------------------------------

# (n, c, k, pass@k = 1 - C(n-c,k)/C(n,k), pass^k = C(c,k)/C(n,k))
ESTIMATES = [
    (1, 0, 1, 0.0, 0.0),                 # c = 0
    (1, 1, 1, 1.0, 1.0),                 # c = n = k
    (4, 0, 1, 0.0, 0.0),
    (4, 0, 4, 0.0, 0.0),
    (4, 4, 1, 1.0, 1.0),                 # c = n
    (4, 4, 4, 1.0, 1.0),                 # c = n, k = n
    (4, 1, 1, 0.25, 0.25),               # c/n
    (4, 1, 2, 0.5, 0.0),                 # 1 - C(3,2)/C(4,2) = 1 - 3/6; C(1,2) = 0
    (4, 1, 3, 0.75, 0.0),                # 1 - C(3,3)/C(4,3) = 1 - 1/4
    (4, 1, 4, 1.0, 0.0),                 # k = n: any success is in the draw
    (4, 2, 2, 5 / 6, 1 / 6),             # tie c = k = n - c: 1 - 1/6; C(2,2)/C(4,2) = 1/6
    (4, 3, 2, 1.0, 0.5),                 # C(1,2) = 0; C(3,2)/C(4,2) = 3/6
    (4, 3, 3, 1.0, 0.25),                # C(3,3)/C(4,3) = 1/4
    (4, 3, 4, 1.0, 0.0),                 # k = n, one failure: pass^4 = 0
    (5, 2, 3, 0.9, 0.0),                 # 1 - C(3,3)/C(5,3) = 1 - 1/10
    (10, 3, 5, 11 / 12, 0.0),            # 1 - C(7,5)/C(10,5) = 1 - 21/252
    (10, 7, 5, 1.0, 1 / 12),             # C(3,5) = 0; C(7,5)/C(10,5) = 21/252
]


@pytest.mark.parametrize(("n", "c", "k", "at_k", "hat_k"), ESTIMATES)
def test_pass_at_k_and_pass_hat_k_match_hand_values(n: int, c: int, k: int, at_k: float,
                                                    hat_k: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(at_k, abs=1e-15)
    assert pass_hat_k(n, c, k) == pytest.approx(hat_k, abs=1e-15)


@pytest.mark.parametrize(("n", "c", "k", "words"), [
    (3, 1, 4, "k = 4 is more than the n = 3"),    # k > trials
    (0, 0, 1, "n and k must be at least 1"),
    (4, -1, 1, "c at least 0"),                   # a negative count
    (4, 1, 0, "n and k must be at least 1"),
    (4, 5, 1, "c = 5 successes out of n = 4"),    # c > n
    (4, True, 1, "c = True is not a whole number"),
])
def test_estimators_refuse_impossible_counts(n: int, c: int, k: int, words: str) -> None:
    for estimator in (pass_at_k, pass_hat_k):
        with pytest.raises(EvalError, match=words):
            estimator(n, c, k)


@given(st.integers(1, 40).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n))))
def test_estimators_are_bounded_and_monotone_in_k(counts: tuple[int, int]) -> None:
    n, c = counts
    at = [pass_at_k(n, c, k) for k in range(1, n + 1)]
    hat = [pass_hat_k(n, c, k) for k in range(1, n + 1)]
    assert all(0.0 <= x <= 1.0 for x in at + hat)
    assert all(x <= y for x, y in pairwise(at))   # non-decreasing in k
    assert all(x >= y for x, y in pairwise(hat))  # non-increasing in k
    assert at[0] == hat[0] == c / n
    assert all(h <= a for a, h in zip(at, hat, strict=True))


# --- percentiles ---------------------------------------------------------------------------

@pytest.mark.parametrize(("values", "p", "expected"), [
    (list(range(1, 11)), 50, 5),       # rank ceil(5) = 5
    (list(range(1, 11)), 90, 9),       # rank ceil(9) = 9
    (list(range(1, 11)), 99, 10),      # rank ceil(9.9) = 10
    (list(range(1, 11)), 100, 10),
    (list(range(1, 11)), 1, 1),        # rank ceil(0.1) = 1
    ([10, 1, 7, 3], 50, 3),            # sorted 1 3 7 10, rank 2
    ([10, 1, 7, 3], 51, 7),            # rank ceil(2.04) = 3
    ([7], 50, 7),
    ([7], 99, 7),
    ([2.5, 0.5], 50, 0.5),             # rank 1: never interpolated
    ([2.5, 0.5], 90, 2.5),
])
def test_percentile_is_nearest_rank(values: list[float], p: float, expected: float) -> None:
    assert percentile(values, p) == expected


@pytest.mark.parametrize(("values", "p"), [([], 50), ([1], 0), ([1], 101)])
def test_percentile_refuses_no_values_and_bad_ranks(values: list[float], p: float) -> None:
    with pytest.raises(EvalError):
        percentile(values, p)


# --- a synthetic run -----------------------------------------------------------------------

def synthetic_run() -> list[TaskResult]:
    """3 tasks x 4 trials; every metric below is computed by hand from this table.

    t-easy  easy  [mcp]        S S F S        rewards 1 1 .5 1       steps 2 3 4 1
    t-mixed hard  [shell, mcp] S lost FMT F   rewards 1 - -1 .2      steps 3 0 2 5
    t-gui   hard  [gui]        F F F F        rewards 0 0 0 0        steps 6 6 6 6
    (FMT: a format error with V = 1, which is not a success; t-gui's last trial was
    graded without checks.)
    """
    easy = task("t-easy", [
        trial(0, V=1, reward=1.0, checks=[True, True], actions=["mcp"] * 2,
              tokens=(100, 10), cost=0.01, seconds=1.0),
        trial(1, V=1, reward=1.0, checks=[True, True], actions=["mcp"] * 3,
              tokens=(200, 20), cost=0.02, seconds=2.0),
        trial(2, V=0, reward=0.5, checks=[True, False], actions=["mcp"] * 4,
              tokens=(300, 30), cost=0.03, seconds=3.0),
        trial(3, V=1, reward=1.0, checks=[True, True], actions=["mcp"],
              tokens=(400, 40), cost=0.04, seconds=4.0),
    ], difficulty="easy", interfaces=["mcp"])
    mixed = task("t-mixed", [
        trial(0, V=1, reward=1.0, checks=[True] * 3, actions=["mcp", "shell", "mcp"],
              tokens=(500, 50), cost=None, seconds=5.0),
        trial(1, V=0, reward=None, env_error=True, termination="env_error",
              tokens=(0, 0), cost=None, seconds=0.5),
        trial(2, V=1, reward=-1.0, checks=[True] * 3, actions=["shell", "shell"],
              format_error=True, termination="format_error", tokens=(600, 60), cost=0.06,
              seconds=6.0),
        trial(3, V=0, reward=0.2, checks=[True, False, False],
              actions=["mcp", "shell", "shell", "shell", "mcp"], termination="max_steps",
              tokens=(700, 70), cost=0.07, seconds=7.0),
    ], difficulty="hard", interfaces=["shell", "mcp"])
    gui = task("t-gui", [
        trial(i, V=0, reward=0.0, checks=[] if i == 3 else [False], actions=["gui"] * 6,
              termination="max_steps", tokens=(800 + 100 * i, 80 + 10 * i),
              seconds=8.0 + i)
        for i in range(4)
    ], difficulty="hard", interfaces=["gui"])
    return [easy, mixed, gui]


# Core metrics of each task alone (n = 4): t-easy c = 3, t-mixed c = 1, t-gui c = 0.
#   pass@k  t-easy 3/4 1 1 1      t-mixed 1/4 1/2 3/4 1      t-gui 0 0 0 0
#   pass^k  t-easy 3/4 1/2 1/4 0  t-mixed 1/4 0 0 0          t-gui 0 0 0 0
EASY_CORE = {  # rewards 1 + 1 + .5 + 1 = 3.5 over 4 trials
    "success_rate": 0.75, "avg_reward": 0.875,
    "pass@k": {"1": 0.75, "2": 1.0, "3": 1.0, "4": 1.0},
    "pass^k": {"1": 0.75, "2": 0.5, "3": 0.25, "4": 0.0}, "trials": 4, "tasks": 1}
MIXED_CORE = {  # rewards 1 + 0 (lost) - 1 + .2 = .2 over 4 trials
    "success_rate": 0.25, "avg_reward": 0.05,
    "pass@k": {"1": 0.25, "2": 0.5, "3": 0.75, "4": 1.0},
    "pass^k": {"1": 0.25, "2": 0.0, "3": 0.0, "4": 0.0}, "trials": 4, "tasks": 1}
GUI_CORE = {
    "success_rate": 0.0, "avg_reward": 0.0,
    "pass@k": {"1": 0.0, "2": 0.0, "3": 0.0, "4": 0.0},
    "pass^k": {"1": 0.0, "2": 0.0, "3": 0.0, "4": 0.0}, "trials": 4, "tasks": 1}

EXPECTED: dict[str, Any] = {
    "success_rate": 0.333333,            # 4 successes / 12 trials (the lost one included)
    "avg_reward": 0.308333,              # (3.5 + .2 + 0) / 12 = 3.7 / 12
    "avg_reward_graded": 0.336364,       # 3.7 / 11 (the lost trial has no reward)
    "checklist_completion": 0.530303,    # (1 + 1 + 1/2 + 1) + (1 + 0 + 1 + 1/3) + (0 + 0 + 0)
                                         # = 35/6 over 11 trials (t-gui's unchecked one out)
    "pass@k": {"1": 0.333333,            # (3/4 + 1/4 + 0) / 3
               "2": 0.5,                 # (1 + 1/2 + 0) / 3
               "3": 0.583333,            # (1 + 3/4) / 3 = 7/12
               "4": 0.666667},           # (1 + 1) / 3
    "pass^k": {"1": 0.333333,            # (3/4 + 1/4) / 3
               "2": 0.166667,            # (1/2) / 3
               "3": 0.083333,            # (1/4) / 3
               "4": 0.0},
    "trials": 12, "tasks": 3, "trials_lost": 1,
    "format_error_rate": 0.083333,       # 1 / 12
    "env_error_rate": 0.083333,          # 1 / 12
    "terminations": {"answer": 5, "env_error": 1, "format_error": 1, "max_steps": 5},
    "by_difficulty": {
        "easy": EASY_CORE,
        "hard": {                        # t-mixed and t-gui: 1 success in 8 trials
            "success_rate": 0.125, "avg_reward": 0.025,          # .2 / 8
            "pass@k": {"1": 0.125, "2": 0.25, "3": 0.375, "4": 0.5},   # t-mixed's / 2
            "pass^k": {"1": 0.125, "2": 0.0, "3": 0.0, "4": 0.0},
            "trials": 8, "tasks": 2},
    },
    "by_interfaces": {"gui": GUI_CORE, "mcp": EASY_CORE, "mcp+shell": MIXED_CORE},
    # trials with >= 2 actions: t-easy 0/1 0/2 0/3; t-mixed m-s-m 2/2, s-s 0/1,
    # m-s-s-s-m 2/4; t-gui 4 x 0/5: (1 + 1/2) / 10
    "interface_switch_rate": 0.15,
    # 44 actions: mcp 10 + 2 + 2 = 14, shell 1 + 2 + 3 = 6, gui 24
    "action_share": {"gui": 0.545455, "mcp": 0.318182, "shell": 0.136364},
    # successes at steps 2, 3, 1 (t-easy) and 3 (t-mixed), over 12 trials
    "step_budget_curve": [[1, 0.083333], [2, 0.166667], [3, 0.333333], [4, 0.333333],
                          [5, 0.333333], [6, 0.333333]],
    # tokens in: 0, 100, ..., 1100 (sum 6600); ranks ceil(6) = 6, ceil(10.8) = 11, 12
    "tokens": {"in": {"total": 6600, "p50": 500, "p90": 1000, "p99": 1100},
               "out": {"total": 660, "p50": 50, "p90": 100, "p99": 110}},
    # known: .01 + .02 + .03 + .04 + .06 + .07 = .23 over 6; 6 unknown
    "cost": {"total": 0.23, "per_trial": 0.038333, "unknown": 6},
    # seconds sorted .5 1 2 ... 11; mean 66.5 / 12
    "latency": {"p50": 5.0, "p90": 10.0, "p99": 11.0, "mean": 5.541667},
}


def test_synthetic_run_metrics_equal_hand_computed_values() -> None:
    metrics = compute_metrics(synthetic_run())
    assert metrics == EXPECTED
    assert list(metrics) == sorted(metrics)


def test_metrics_do_not_depend_on_task_or_trial_order() -> None:
    run = synthetic_run()
    shuffled = [task(t.task_id, t.trials[::-1], difficulty=t.difficulty,
                     interfaces=t.interfaces[::-1]) for t in run[::-1]]
    assert compute_metrics(shuffled) == compute_metrics(run)


def test_one_surviving_trial_does_not_read_as_certain_success() -> None:
    # tau2's trap: 3 of 4 trials lost and 1 success; dropping the lost ones gives 1.0.
    metrics = compute_metrics([successes("xxx1")])
    assert metrics["pass^k"]["1"] == 0.25
    assert metrics["pass@k"]["1"] == 0.25
    assert metrics["pass^k"]["4"] == 0.0
    assert metrics["success_rate"] == 0.25
    assert metrics["trials"] == 4
    assert metrics["trials_lost"] == 3
    assert metrics["env_error_rate"] == 0.75
    assert metrics["avg_reward"] == 0.25         # lost trials count 0
    assert metrics["avg_reward_graded"] == 1.0   # the one graded trial
    assert metrics["checklist_completion"] == 0.25


def test_k_runs_to_the_smallest_trial_count() -> None:
    # 2 and 4 trials: only k = 1, 2 over the run; the 4-trial group alone goes to 4.
    short = successes("10", "a")
    long = task("b", successes("1100").trials, difficulty="hard")
    metrics = compute_metrics([short, long])
    assert metrics["pass@k"] == {"1": 0.5,            # (1/2 + 2/4) / 2
                                 "2": 0.916667}       # (1 + (1 - 1/6)) / 2 = 11/12
    assert metrics["pass^k"] == {"1": 0.5, "2": 0.083333}   # (0 + 1/6) / 2
    assert list(metrics["by_difficulty"]["hard"]["pass^k"]) == ["1", "2", "3", "4"]
    assert list(metrics["by_difficulty"]["easy"]["pass^k"]) == ["1", "2"]


def test_empty_lists_give_none_not_zero_divisions() -> None:
    # one lost trial: no reward, no actions, no steps, no known cost
    metrics = compute_metrics([successes("x")])
    assert metrics["avg_reward_graded"] is None
    assert metrics["interface_switch_rate"] is None
    assert metrics["action_share"] == {}
    assert metrics["step_budget_curve"] == []
    assert metrics["cost"] == {"total": None, "per_trial": None, "unknown": 1}
    graded_without_checks = task("j", [trial(0, V=1, reward=1.0, checks=[])])
    assert compute_metrics([graded_without_checks])["checklist_completion"] is None


def test_interfaces_key_is_sorted_and_named_when_empty() -> None:
    assert interfaces_key(task("a", [], interfaces=["shell", "mcp", "shell"])) == "mcp+shell"
    assert interfaces_key(task("a", [], interfaces=[])) == "none"


def bad_trial(**changes: Any) -> Trial:
    fields = {f: getattr(trial(2, V=1, reward=1.0), f) for f in Trial.__struct_fields__}
    return Trial(**{**fields, **changes})


@pytest.mark.parametrize(("tasks", "words"), [
    ([], "no tasks"),
    ([task("t-1", [])], "task t-1 has no trials"),
    ([successes("1", "t-1"), successes("0", "t-1")], "task t-1 appears twice"),
    ([task("t-1", [bad_trial(steps=-1)])], "task t-1, trial 2: steps = -1 is negative"),
    ([task("t-1", [bad_trial(tokens_in=-5)])], "task t-1, trial 2: tokens_in = -5"),
    ([task("t-1", [bad_trial(seconds=-1.0)])], "task t-1, trial 2: seconds = -1.0"),
    ([task("t-1", [bad_trial(cost=float("nan"))])], "trial 2: cost = nan is not a finite"),
    ([task("t-1", [bad_trial(V=2)])], "task t-1, trial 2: V = 2, not 0 or 1"),
    ([task("t-1", [bad_trial(success=False)])], "trial 2: success is False but V = 1"),
    ([task("t-1", [bad_trial(env_error=True)])], "success is True but .* env_error = True"),
])
def test_compute_metrics_refuses_broken_runs(tasks: list[TaskResult], words: str) -> None:
    with pytest.raises(EvalError, match=words):
        compute_metrics(tasks)


# --- properties of whole runs --------------------------------------------------------------

MARKS = st.text(alphabet="01x", min_size=1, max_size=6)


@given(st.lists(MARKS, min_size=1, max_size=6))
def test_run_properties(patterns: list[str]) -> None:
    tasks = [successes(p, f"t{i}") for i, p in enumerate(patterns)]
    metrics = compute_metrics(tasks)
    assert metrics["pass@k"]["1"] == metrics["pass^k"]["1"]
    assert list(metrics["pass@k"]) == [str(k) for k in range(1, min(map(len, patterns)) + 1)]
    assert metrics["trials"] == sum(map(len, patterns))
    assert metrics["trials_lost"] == sum(p.count("x") for p in patterns)
    total = sum(p.count("1") for p in patterns)
    assert metrics["success_rate"] == round(total / metrics["trials"], 6)
    curve = metrics["step_budget_curve"]
    assert not curve or curve[-1][1] == metrics["success_rate"]


# --- the comparison bootstrap --------------------------------------------------------------

def test_per_task_success_counts_lost_trials_as_failures() -> None:
    tasks = [successes("11x0", "b"), successes("xxx1", "a")]
    assert per_task_success(tasks) == {"a": 0.25, "b": 0.5}
    assert list(per_task_success(tasks)) == ["a", "b"]


SPREAD = [0.0, 0.25, 0.5, 0.75, 1.0, 0.5, 0.25, 0.0, 1.0, 0.75] * 3


def test_bootstrap_is_deterministic_for_a_seed() -> None:
    b = [min(1.0, x + 0.25) if i % 2 else x for i, x in enumerate(SPREAD)]
    first = bootstrap_delta(SPREAD, b, seed=7)
    assert bootstrap_delta(SPREAD, b, seed=7) == first
    assert first["low"] <= first["delta"] <= first["high"]
    assert set(first) == {"delta", "low", "high", "noise", "level", "samples", "tasks"}
    assert first["tasks"] == 30 and first["samples"] == 2000 and first["level"] == 0.95


def test_a_clear_difference_is_not_noise() -> None:
    b = [min(1.0, x + 0.5) for x in SPREAD]   # every task gains, by .5 or up to 1
    result = bootstrap_delta(SPREAD, b)
    assert result["noise"] is False
    assert 0 < result["low"] <= result["delta"] <= result["high"]
    # gains per 10 tasks .5 .5 .5 .25 0 .5 .5 .5 0 .25 = 3.5: 10.5 / 30
    assert result["delta"] == 0.35


def test_identical_runs_and_a_single_flip_are_noise() -> None:
    same = bootstrap_delta(SPREAD, SPREAD)
    assert same == {"delta": 0.0, "low": 0.0, "high": 0.0, "noise": True, "level": 0.95,
                    "samples": 2000, "tasks": 30}
    flipped = list(SPREAD)
    flipped[1] = 1.0                          # one task of 30 gains .75: +.025 on average
    small = bootstrap_delta(SPREAD, flipped)
    assert small["delta"] == 0.025
    assert small["noise"] is True and small["low"] == 0.0


@pytest.mark.parametrize(("a", "b", "options", "words"), [
    ([0.5], [0.5, 1.0], {}, "1 tasks against 2"),
    ([], [], {}, "no tasks to compare"),
    ([0.5], [float("nan")], {}, r"b\[0\] = nan"),
    ([0.5], [1.0], {"samples": 0}, "samples = 0"),
    ([0.5], [1.0], {"level": 1.0}, "level = 1.0"),
])
def test_bootstrap_refuses_unpaired_or_bad_input(a: list[float], b: list[float],
                                                 options: dict[str, Any], words: str) -> None:
    with pytest.raises(EvalError, match=words):
        bootstrap_delta(a, b, **options)
