"""A rollout's reward and the details verl logs beside it (``reward_extra_info``).

Two recipes (methods.md sections 3 and 6), both on gates' own reward functions:

- ``wildawm``: r = -1 on a format failure, else min(1, V + 0.1/N sum v_i) from the task's
  verifier on the final world (the paper's ablations: no format penalty, a format failure
  scores 0; no partial credit, r = V);
- ``awm``: AWM's six-condition format validator over the trajectory (conditions 1-5: -1,
  the rollout stopped there; condition 6, a call that got an error response: 0), else the
  code-augmented judge's outcome (Completed 1, Partially Completed 0.1, otherwise 0). With
  no model configured the judge does not run and the outcome is the verifier's V (1 or 0):
  ``judge`` then says ``not_run`` in the details, never that a judge passed it.

A rollout lost to the infrastructure (its instance, sandbox or verifier failed three
times) has reward 0, ``env_error`` 1 and no trained tokens: counted, never dropped.

verl stacks every sample's details into arrays, so the keys are the same for every
rollout (``EXTRA_KEYS``) and the values are scalars or strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gates.contract import Judgement, Trajectory, Verdict
from gates.rewards import (
    awm_outcome_reward,
    awm_steps,
    catalogue_from_list_tools,
    validate_awm_rollout,
    wildawm_reward,
)
from rl.contract import RewardKind

WHOLE_ROLLOUT_CONDITION = 5  # AWM's "at least one successful call beyond list_tools"
EXTRA_KEYS = ("reward", "V", "checks", "checks_passed", "checks_total", "interfaces",
              "format_error", "env_error", "steps", "termination", "episode_id", "attempts",
              "judge")


@dataclass(frozen=True, slots=True)
class Scored:
    reward: float
    format_failure: bool
    env_error: bool
    judge: str  # "" (WildAWM), "ran", "not_run" or "error"


def wildawm_score(format_failure: bool, verdict: Verdict | None, *,
                  format_penalty: bool = True, partial_credit: bool = True) -> Scored:
    """The WildAWM reward, or one of the paper's ablations of it: without the format
    penalty a format failure scores 0 (not -1; it still stops the rollout and trains only
    the offending step); without partial credit r = V (the checklist's 0.1/N share left
    out)."""
    if format_failure:
        return Scored(-1.0 if format_penalty else 0.0, True, False, "")
    if verdict is None or verdict.is_error or not verdict.checks:
        return Scored(0.0, False, True, "")
    if not partial_credit:
        return Scored(1.0 if verdict.passed else 0.0, False, False, "")
    return Scored(wildawm_reward(False, verdict), False, False, "")


def awm_format(trajectory: Trajectory, listed: list[dict[str, Any]], *, final: bool = True
               ) -> tuple[str, int | None, str]:
    """("ok" | "format_error" | "environment_error", the step, why) of AWM's validator.
    A rollout still running (`final` False) cannot break condition 5 (a successful call
    beyond list_tools) yet: that one is judged on the whole rollout."""
    check = validate_awm_rollout(awm_steps(trajectory), catalogue_from_list_tools(listed))
    if not final and check.condition == WHOLE_ROLLOUT_CONDITION:
        return "ok", None, ""
    return check.kind, check.step, check.reason


def awm_score(trajectory: Trajectory, listed: list[dict[str, Any]], verdict: Verdict | None,
              judgement: Judgement | None) -> Scored:
    kind, _, _ = awm_format(trajectory, listed)
    if kind == "format_error":
        return Scored(-1.0, True, False, "")
    if kind == "environment_error":
        return Scored(0.0, False, True, "")
    if judgement is not None and judgement.status == "ran" and judgement.verdict is not None:
        return Scored(awm_outcome_reward(judgement), False, False, "ran")
    status = "not_run" if judgement is None else judgement.status
    if verdict is None or verdict.is_error:
        return Scored(0.0, False, True, status)
    return Scored(1.0 if verdict.passed else 0.0, False, False, status)


def extra_info(kind: RewardKind, scored: Scored, verdict: Verdict | None, *,
               interfaces: list[str], steps: int, termination: str, episode_id: str,
               attempts: int) -> dict[str, Any]:
    checks = [] if verdict is None else [c.passed for c in verdict.checks]
    info: dict[str, Any] = {
        "reward": float(scored.reward),
        "V": int(verdict is not None and verdict.passed),
        "checks": "".join("1" if c else "0" for c in checks),
        "checks_passed": sum(checks),
        "checks_total": len(checks),
        "interfaces": ",".join(sorted(interfaces)),
        "format_error": int(scored.format_failure),
        "env_error": int(scored.env_error),
        "steps": int(steps),
        "termination": termination,
        "episode_id": episode_id,
        "attempts": int(attempts),
        "judge": scored.judge if kind == "awm" else "",
    }
    assert tuple(info) == EXTRA_KEYS
    return info


def lost_info(kind: RewardKind, *, attempts: int, why: str) -> dict[str, Any]:
    """The details of a rollout lost to the infrastructure."""
    return extra_info(kind, Scored(0.0, False, True, ""), None, interfaces=[], steps=0,
                      termination=f"lost: {why}"[:200], episode_id="", attempts=attempts)


__all__ = ["EXTRA_KEYS", "Scored", "awm_format", "awm_score", "extra_info", "lost_info",
           "wildawm_score"]
