"""WildAWM's group advantages and adaptive rollout counts (methods.md section 6): the
arithmetic RL applies to a task's group of rewards (``gates.rewards`` computes each one).

Pure functions: no I/O, no clock, no randomness; exact ``fractions.Fraction`` arithmetic,
rounded to a float once at the end, so no result depends on the order of a sum.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Literal

from gates.errors import RewardError


def group_advantages(rewards: Sequence[float]) -> list[float]:
    """A_j = (r_j - mu) / sigma when sigma > 0 (population std over the K rewards);
    -K^(-1/2) for every rollout when sigma = 0 and all are format failures; 0 otherwise.

    A reward of -1 is exactly a format failure: every other reward is min(1, ...) >= 0.
    """
    if not rewards:
        raise RewardError("a group without rollouts has no advantages")
    exact = [_reward_value(index, r) for index, r in enumerate(rewards)]
    k = len(exact)
    mean = sum(exact, Fraction(0)) / k
    variance = sum(((r - mean) ** 2 for r in exact), Fraction(0)) / k
    if variance > 0:
        # (r - mu) / sigma as sign * sqrt((r - mu)^2 / variance): the ratio is exact and of
        # order 1, where sigma alone can underflow to 0.0 for tiny but real spreads.
        return [math.copysign(math.sqrt((r - mean) ** 2 / variance), r - mean) for r in exact]
    if exact[0] == -1:
        return [-1.0 / math.sqrt(k)] * k
    return [0.0] * k


def _reward_value(index: int, reward: float) -> Fraction:
    if isinstance(reward, bool) or not isinstance(reward, int | float) \
            or not math.isfinite(reward):
        raise RewardError(f"reward {index} is {reward!r}, not a finite number")
    value = Fraction(reward)
    if value != -1 and not 0 <= value <= 1:
        raise RewardError(f"reward {index} is {reward}: a WildAWM reward is -1 or in [0, 1]")
    return value


# --- WildAWM: adaptive rollouts ------------------------------------------------------------

BLOCK = 8
KAPPA_MAX = 3
GroupStatus = Literal["mastered", "ready", "exhausted", "pending"]


def launch_count(kappa: Fraction, group_size: int, *, block: int = BLOCK,
                 kappa_max: int = KAPPA_MAX) -> int:
    """n = min(kappa_max * G, G + C * (round(kappa) - 1)) rollouts to launch at once.
    round() is half-up (the paper does not say; Python's round would send 2.5 to 2)."""
    _check_group(group_size, block, kappa_max)
    rounded = math.floor(kappa + Fraction(1, 2))
    return min(kappa_max * group_size, group_size + block * (rounded - 1))


def group_status(rewards: Sequence[float], group_size: int, *,
                 kappa_max: int = KAPPA_MAX) -> GroupStatus:
    """Where a task's group stands after a block, from its completed rewards in launch
    order (the first G are the base rollouts): mastered when all G base rollouts succeeded
    (reward 1, which only V = 1 reaches); ready with >= 2 distinct rewards or all format
    failures; exhausted at kappa_max * G rollouts; else pending (launch another block)."""
    _check_group(group_size, BLOCK, kappa_max)
    exact = [_reward_value(index, r) for index, r in enumerate(rewards)]
    if len(exact) < group_size:
        raise RewardError(f"{len(exact)} rewards: the {group_size} base rollouts are not done")
    if all(r == 1 for r in exact[:group_size]):
        return "mastered"
    if len(set(exact)) >= 2 or all(r == -1 for r in exact):
        return "ready"
    return "exhausted" if len(exact) >= kappa_max * group_size else "pending"


def next_block(completed: int, group_size: int, *, block: int = BLOCK,
               kappa_max: int = KAPPA_MAX) -> int:
    """How many rollouts a pending group adds: a block of C, capped at kappa_max * G."""
    _check_group(group_size, block, kappa_max)
    return max(0, min(block, kappa_max * group_size - completed))


def update_kappa(kappa: Fraction, status: GroupStatus, completed: int, group_size: int, *,
                 kappa_max: int = KAPPA_MAX) -> Fraction:
    """mastered -> 1; ready -> 0.2 kappa + 0.8 ceil(K/G); exhausted -> kappa_max."""
    _check_group(group_size, BLOCK, kappa_max)
    if status == "mastered":
        return Fraction(1)
    if status == "exhausted":
        return Fraction(kappa_max)
    if status == "ready":
        blocks = -(-completed // group_size)
        return Fraction(1, 5) * kappa + Fraction(4, 5) * blocks
    raise RewardError("kappa is updated once a group is decided, not while it is pending")


def pick_group(rewards: Sequence[float], group_size: int) -> list[int]:
    """Indices of G rollouts to train on when K > G: the G // 2 lowest rewards and the
    rest from the highest, so both halves of the sorted pool are represented. Ties are
    broken by launch order; the result is in launch order."""
    _check_group(group_size, BLOCK, KAPPA_MAX)
    exact = [_reward_value(index, r) for index, r in enumerate(rewards)]
    if len(exact) <= group_size:
        return list(range(len(exact)))
    ranked = sorted(range(len(exact)), key=lambda i: (exact[i], i))
    low = group_size // 2
    return sorted(ranked[:low] + ranked[len(ranked) - (group_size - low):])


def _check_group(group_size: int, block: int, kappa_max: int) -> None:
    if group_size < 1 or block < 1 or kappa_max < 1:
        raise RewardError(f"group size {group_size}, block {block} and kappa_max {kappa_max} "
                          "must all be at least 1")


__all__ = [
    "BLOCK",
    "KAPPA_MAX",
    "GroupStatus",
    "group_advantages",
    "group_status",
    "launch_count",
    "next_block",
    "pick_group",
    "update_kappa",
]
