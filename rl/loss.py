"""WildAWM's advantage and GRPO loss, registered with verl's own registries.

``algorithm.adv_estimator=wildawm`` and ``actor.policy_loss.loss_mode=wildawm_grpo`` select
them (methods.md section 6):

- advantage: per group of rollouts of one task, ``A_j = (r_j - mu) / sigma`` when
  sigma > 0, ``-K^(-1/2)`` when every rollout was a format failure, else 0
  (``rl.advantages.group_advantages``, exact arithmetic);
- loss: the clipped objective with asymmetric clip (eps_low 0.2, eps_high 0.28, no dual
  clip), no KL, entropy bonus 0.001 (verl adds it from ``actor.entropy_coeff``), and the
  triple normalisation: token mean within a rollout, rollout mean within a group, group
  mean within the step.

verl hands the policy loss only token tensors (no group ids), so the normalisation is
carried by the advantages: each token's advantage is multiplied by its weight
``1 / (T_r * K_g * N)`` (T_r the rollout's trained tokens, K_g the group's rollouts, N the
step's groups that have a gradient at all), and the loss is the weighted *sum* of the
clipped per-token terms. The clip is unaffected: for a weight w > 0,
``max(-wA ratio, -wA clip(ratio)) = w max(-A ratio, -A clip(ratio))``. Groups whose
advantages are all zero (mastered and exhausted: every reward equal) add nothing and are
not counted in N, which is what "dropped" means for the group mean.

A rollout may be cut into several rows (history-aware or segment samples: ``rl.samples``);
its rows then carry the uid ``<group>|<rollout>`` and count as one rollout, T_r summed
over its rows. A plain uid is a rollout of its own.

The advantage over the completed pool (WildAWM's adaptive rollouts): a group that ran
K > G rollouts trains on G of them, but mu and sigma are the K rewards'. The rows the
trainer sees hold only the G, so the V1 worker that ran the pool (``rl.verl_manager``)
computes each kept rollout's A_j over all K and writes it into the uid:
``<group>|<rollout>|<A_j as float.hex()>`` (exact, no decimal rounding). A group whose
rows carry their advantage uses it; a group without computes it from its rows' rewards
(K = G).

Format failures: the agent loop trains a format-failed rollout only on its offending
step (its response mask is 1 there alone), so T_r counts those tokens only.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo.core_algos import register_adv_est, register_policy_loss
from verl.utils.torch_functional import masked_sum

from rl.advantages import group_advantages

ADV_ESTIMATOR = "wildawm"
POLICY_LOSS = "wildawm_grpo"
ROLLOUT_SEPARATOR = "|"  # uid of a rollout cut into rows: "<group>|<rollout>"
EPS_LOW, EPS_HIGH, ENTROPY_COEFF = 0.2, 0.28, 0.001


def rollout_uid(group: str, rollout: str, advantage: float | None = None) -> str:
    """The uid of a row of rollout ``rollout`` of ``group``, with the rollout's advantage
    over its completed pool when that pool was larger than what the batch holds."""
    if ROLLOUT_SEPARATOR in group or ROLLOUT_SEPARATOR in rollout or not rollout:
        raise ValueError(f"group {group!r} and rollout {rollout!r} must be non-empty and "
                         f"free of {ROLLOUT_SEPARATOR!r}")
    uid = f"{group}{ROLLOUT_SEPARATOR}{rollout}"
    return uid if advantage is None else f"{uid}{ROLLOUT_SEPARATOR}{float(advantage).hex()}"


def split_uid(uid: str) -> tuple[str, str]:
    """(group, rollout) of a row's uid: ``g|r`` (or ``g|r|A``) for a row of rollout r, a
    plain ``g`` for a rollout that is one row (its own rollout id then is the row's
    position)."""
    group, sep, rest = str(uid).partition(ROLLOUT_SEPARATOR)
    return group, rest.partition(ROLLOUT_SEPARATOR)[0] if sep else ""


def uid_advantage(uid: str) -> float | None:
    """The pool advantage a row's uid carries (``g|r|A``), or None."""
    parts = str(uid).split(ROLLOUT_SEPARATOR)
    if len(parts) < 3:
        return None
    if len(parts) > 3:
        raise ValueError(f"uid {uid!r}: a row uid is group|rollout or group|rollout|advantage")
    try:
        return float.fromhex(parts[2])
    except ValueError:
        raise ValueError(f"uid {uid!r}: {parts[2]!r} is no advantage written by "
                         "float.hex()") from None


def normalisation_weights(uids: Sequence[str], trained_tokens: Sequence[int],
                          advantages: Sequence[float]) -> list[float]:
    """Each row's token weight 1 / (T_r K_g N): T_r the tokens its rollout trains on (over
    all the rollout's rows), K_g the rollouts of its group, N the groups with any non-zero
    advantage. Rows of groups without a gradient, and rollouts without trained tokens,
    get 0."""
    rollout_of = [_rollout_key(i, uid) for i, uid in enumerate(uids)]
    tokens: dict[tuple[str, str], int] = defaultdict(int)
    rollouts: dict[str, set[tuple[str, str]]] = defaultdict(set)
    live: set[str] = set()
    for key, count, advantage in zip(rollout_of, trained_tokens, advantages, strict=True):
        tokens[key] += int(count)
        rollouts[key[0]].add(key)
        if advantage != 0.0:
            live.add(key[0])
    if not live:
        return [0.0] * len(rollout_of)
    weights = []
    for key in rollout_of:
        if key[0] not in live or tokens[key] == 0:
            weights.append(0.0)
        else:
            weights.append(1.0 / (tokens[key] * len(rollouts[key[0]]) * len(live)))
    return weights


def _rollout_key(row: int, uid: str) -> tuple[str, str]:
    group, rollout = split_uid(uid)
    return group, rollout or f"#{row}"


def rollout_rewards(uids: Sequence[str], scores: Sequence[float]
                    ) -> dict[str, dict[tuple[str, str], float]]:
    """Per group, each rollout's reward (the rows of one rollout must agree)."""
    groups: dict[str, dict[tuple[str, str], float]] = defaultdict(dict)
    for row, (uid, score) in enumerate(zip(uids, scores, strict=True)):
        key = _rollout_key(row, uid)
        seen = groups[key[0]].get(key)
        if seen is not None and seen != score:
            raise ValueError(f"rows of rollout {key[1]!r} of group {key[0]!r} carry rewards "
                             f"{seen} and {score}: a rollout has one reward")
        groups[key[0]][key] = score
    return groups


def wildawm_row_advantages(uids: Sequence[str], scores: Sequence[float]) -> list[float]:
    """Each row's (unweighted) advantage: its rollout's A_j within its group, as its uid
    carries it (computed over the completed pool) or from the group's rows."""
    groups = rollout_rewards(uids, scores)
    given = _given_advantages(uids)
    by_rollout: dict[tuple[str, str], float] = {}
    for group, rewards in groups.items():
        keys = list(rewards)  # insertion order: the batch's row order, never a set's
        carried = [given[k] for k in keys if k in given]
        if carried and len(carried) != len(keys):
            raise ValueError(f"group {group!r} has rollouts with and without a pool "
                             "advantage in their uid: a group's advantages come from one "
                             "place")
        values = carried or group_advantages([rewards[k] for k in keys])
        by_rollout.update(zip(keys, values, strict=True))
    return [by_rollout[_rollout_key(i, uid)] for i, uid in enumerate(uids)]


def _given_advantages(uids: Sequence[str]) -> dict[tuple[str, str], float]:
    given: dict[tuple[str, str], float] = {}
    for row, uid in enumerate(uids):
        advantage = uid_advantage(uid)
        if advantage is None:
            continue
        key = _rollout_key(row, uid)
        if given.setdefault(key, advantage) != advantage:
            raise ValueError(f"rows of rollout {key[1]!r} of group {key[0]!r} carry "
                             f"advantages {given[key]} and {advantage}")
    return given


@register_adv_est(ADV_ESTIMATOR)  # type: ignore[untyped-decorator]
def compute_wildawm_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                              index: np.ndarray[Any, Any], config: Any = None,
                              **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's advantage hook: (advantages, returns), both (batch, response_length); the
    advantages carry the triple-normalisation weights (see the module docstring)."""
    scores = token_level_rewards.sum(dim=-1).tolist()
    uids = [str(u) for u in index.tolist()]
    advantages = wildawm_row_advantages(uids, scores)
    trained = response_mask.sum(dim=-1).tolist()
    weights = normalisation_weights(uids, [int(t) for t in trained], advantages)
    scale = torch.tensor([a * w for a, w in zip(advantages, weights, strict=True)],
                         dtype=torch.float32, device=response_mask.device)
    weighted = scale.unsqueeze(-1) * response_mask.to(torch.float32)
    return weighted, weighted


@register_policy_loss(POLICY_LOSS)
def compute_wildawm_policy_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor,
                                advantages: torch.Tensor, response_mask: torch.Tensor,
                                loss_agg_mode: str = "token-mean", config: Any = None,
                                rollout_is_weights: torch.Tensor | None = None
                                ) -> tuple[torch.Tensor, dict[str, Any]]:
    """The clipped objective summed over tokens with the weights the advantages carry;
    ``loss_agg_mode`` is ignored for it (the weights are the aggregation) and still
    applies to verl's entropy term. Scaled by the data-parallel size like verl's own
    losses, since data-parallel training averages gradients over ranks."""
    eps_low, eps_high = _clip_range(config)
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    per_token = torch.maximum(unclipped, clipped)
    if rollout_is_weights is not None:
        per_token = per_token * rollout_is_weights
    dp_size = int(_global_info(config).get("dp_size", 1) or 1)
    loss = masked_sum(per_token, response_mask) * dp_size
    metrics = {
        "actor/pg_clipfrac": _mean(torch.gt(clipped, unclipped).float(), response_mask),
        "actor/ppo_kl": _mean(-log_ratio, response_mask),
        "actor/pg_clipfrac_lower": 0.0,
    }
    return loss, metrics


def _mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    """A masked mean for the logs (0 for a micro-batch without trained tokens)."""
    weights = mask.to(values.dtype)
    return float((values * weights).sum().detach() / weights.sum().clamp(min=1.0))


def _clip_range(config: Any) -> tuple[float, float]:
    if config is None:
        return EPS_LOW, EPS_HIGH
    base = config.get("clip_ratio", None) if hasattr(config, "get") else None
    low = config.get("clip_ratio_low", None) if hasattr(config, "get") else None
    high = config.get("clip_ratio_high", None) if hasattr(config, "get") else None
    return (float(low if low is not None else base if base is not None else EPS_LOW),
            float(high if high is not None else base if base is not None else EPS_HIGH))


def _global_info(config: Any) -> dict[str, Any]:
    info = getattr(config, "global_batch_info", None) if config is not None else None
    return dict(info) if info else {}


__all__ = ["ADV_ESTIMATOR", "ENTROPY_COEFF", "EPS_HIGH", "EPS_LOW", "POLICY_LOSS",
           "ROLLOUT_SEPARATOR", "compute_wildawm_advantage", "compute_wildawm_policy_loss",
           "normalisation_weights", "rollout_rewards", "rollout_uid", "split_uid",
           "uid_advantage", "wildawm_row_advantages"]
