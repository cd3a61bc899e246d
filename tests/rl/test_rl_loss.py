"""WildAWM's advantage and GRPO loss as verl's registries hold them: hand-computed
tensors, and a few optimizer steps of a tiny randomly initialised model through verl's
own actor loss (``verl.workers.utils.losses.ppo_loss``, what its engine workers call).
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from transformers import Qwen2Config, Qwen2ForCausalLM
from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn
from verl.utils import tensordict_utils as tu
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.utils.losses import ppo_loss

from rl.advantages import group_advantages
from rl.loss import (
    ADV_ESTIMATOR,
    POLICY_LOSS,
    compute_wildawm_advantage,
    normalisation_weights,
    wildawm_row_advantages,
)
from tests.support.rl_harness import tiny_model, verl_config


def rewards_at_end(rewards: list[float], lengths: list[int], width: int) -> torch.Tensor:
    """verl's token-level rewards: each row's reward on its last response token."""
    out = torch.zeros(len(rewards), width)
    for row, (reward, length) in enumerate(zip(rewards, lengths, strict=True)):
        out[row, length - 1] = reward
    return out


def mask_of(lengths: list[int], width: int) -> torch.Tensor:
    return torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths])


def test_both_are_in_verls_registries_in_a_fresh_process() -> None:
    """verl loads our entry point in every process it starts (its plugin discovery), so a
    trainer's actor workers find the loss by name without importing rl themselves."""
    code = ("import verl; from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, "
            "ADV_ESTIMATOR_REGISTRY; print('wildawm_grpo' in POLICY_LOSS_REGISTRY, "
            "'wildawm' in ADV_ESTIMATOR_REGISTRY)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["True", "True"]
    assert get_adv_estimator_fn(ADV_ESTIMATOR) is compute_wildawm_advantage
    assert get_policy_loss_fn(POLICY_LOSS).__name__ == "compute_wildawm_policy_loss"


def test_weights_are_token_then_rollout_then_group_means() -> None:
    # group a: two rollouts of 2 and 4 tokens with a spread; group b: no spread (dropped)
    uids = ["a", "a", "b", "b", "b"]
    weights = normalisation_weights(uids, [2, 4, 3, 3, 3], [1.0, -1.0, 0.0, 0.0, 0.0])
    assert weights == [1 / (2 * 2 * 1), 1 / (4 * 2 * 1), 0.0, 0.0, 0.0]
    # two live groups: each weighs half
    weights = normalisation_weights(["a", "a", "b", "b"], [2, 4, 1, 1], [1, -1, 1, -1])
    assert weights == [1 / 8, 1 / 16, 1 / 4, 1 / 4]
    assert sum(w * t for w, t in zip(weights, [2, 4, 1, 1], strict=True)) == 1.0


def test_a_rollout_cut_into_rows_counts_once() -> None:
    whole = normalisation_weights(["g", "g"], [6, 2], [1.0, -1.0])
    cut = normalisation_weights(["g|r0", "g|r0", "g|r1"], [4, 2, 2], [1.0, 1.0, -1.0])
    assert cut == [whole[0], whole[0], whole[1]]
    assert wildawm_row_advantages(["g|r0", "g|r0", "g|r1"], [1.0, 1.0, 0.0]) == \
        wildawm_row_advantages(["g", "g"], [1.0, 0.0])[:1] * 2 + [-1.0]
    with pytest.raises(ValueError, match="a rollout has one reward"):
        wildawm_row_advantages(["g|r0", "g|r0"], [1.0, 0.5])


def test_the_papers_worked_example_takes_mu_and_sigma_over_the_completed_pool() -> None:
    """methods.md section 6, G = 4: four zeros, then a block of 8; among the 12 one
    reaches 1 and one 0.05 -> ready at K = 12. The 4 kept (both halves: two 0s, the 0.05
    and the 1) are z-scored with the mean and population std of all 12, as their uids
    carry it, and the hook gives them exactly that (times their weights)."""
    from fractions import Fraction

    from rl.advantages import pick_group
    from rl.loss import rollout_uid

    pool = [0.0] * 4 + [0.0, 0.0, 1.0, 0.0, 0.0, 0.05, 0.0, 0.0]
    kept = pick_group(pool, 4)
    assert sorted(pool[i] for i in kept) == [0.0, 0.0, 0.05, 1.0]
    exact = [Fraction(r) for r in pool]
    mu = sum(exact, Fraction(0)) / 12
    sigma = math.sqrt(sum((r - mu) ** 2 for r in exact) / 12)
    over_k = [float(Fraction(pool[i]) - mu) / sigma for i in kept]
    uids = [rollout_uid("g", str(s), group_advantages(pool)[i]) for s, i in enumerate(kept)]
    assert wildawm_row_advantages(uids, [pool[i] for i in kept]) == pytest.approx(over_k)
    # over the 4 alone they would differ (mu 0.2625 instead of 0.0875)
    assert group_advantages([pool[i] for i in kept]) != pytest.approx(over_k)
    lengths = [3, 1, 2, 2]
    rewards = rewards_at_end([pool[i] for i in kept], lengths, 3)
    advantages, _ = compute_wildawm_advantage(rewards, mask_of(lengths, 3),
                                              np.array(uids, dtype=object))
    for row, (a, length) in enumerate(zip(over_k, lengths, strict=True)):
        expected = torch.tensor([a / (length * 4 * 1)] * length + [0.0] * (3 - length))
        assert torch.allclose(advantages[row], expected)


def test_the_advantage_hook_on_hand_computed_tensors() -> None:
    lengths, width = [2, 3, 1, 1], 4
    rewards = rewards_at_end([1.0, 0.0, -1.0, -1.0], lengths, width)
    index = np.array(["t1", "t1", "t2", "t2"], dtype=object)
    advantages, returns = compute_wildawm_advantage(rewards, mask_of(lengths, width), index)
    # t1: z-scores +1 / -1 (population std), t2: all format failures -> -1/sqrt(2);
    # weights 1 / (T_r * K_g * N) with N = 2 live groups
    expected = [[1 / (2 * 2 * 2)] * 2 + [0, 0], [-1 / (3 * 2 * 2)] * 3 + [0],
                [-1 / math.sqrt(2) / (1 * 2 * 2), 0, 0, 0],
                [-1 / math.sqrt(2) / (1 * 2 * 2), 0, 0, 0]]
    assert torch.allclose(advantages, torch.tensor(expected))
    assert torch.equal(advantages, returns)


def test_the_loss_is_the_weighted_sum_of_the_asymmetric_clipped_terms() -> None:
    old = torch.zeros(1, 4)
    new = torch.log(torch.tensor([[1.5, 1.1, 0.5, 0.9]]))
    advantages = torch.tensor([[0.5, 0.5, -0.25, -0.25]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss, metrics = get_policy_loss_fn(POLICY_LOSS)(old, new, advantages, mask)
    # A > 0: ratio 1.5 clipped at 1 + 0.28, 1.1 unclipped; A < 0: ratio 0.5 clipped at
    # 1 - 0.2; the masked token adds nothing
    expected = -(0.5 * 1.28) - 0.5 * 1.1 + 0.25 * 0.8
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 3)


def actor_config(model: Path):  # type: ignore[no-untyped-def]
    config = verl_config(
        model, f"actor_rollout_ref.actor.policy_loss.loss_mode={POLICY_LOSS}",
        "actor_rollout_ref.actor.clip_ratio_low=0.2",
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "actor_rollout_ref.actor.entropy_coeff=0.001",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4")
    return omega_conf_to_dataclass(config.actor_rollout_ref.actor)


def flat_log_probs(model: torch.nn.Module, sequences: torch.Tensor) -> tuple[torch.Tensor,
                                                                             torch.Tensor]:
    """What verl's engine hands its loss: per sequence, position i holds log p(token i+1),
    all sequences flattened (no padding); and the entropy likewise."""
    logits = model(input_ids=sequences).logits[:, :-1].float()
    logp = torch.log_softmax(logits, dim=-1)
    chosen = logp.gather(-1, sequences[:, 1:].unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    pad = torch.zeros(sequences.shape[0], 1)
    return (torch.cat([chosen, pad], dim=1).reshape(-1),
            torch.cat([entropy, pad], dim=1).reshape(-1))


def test_a_few_optimizer_steps_through_verls_actor_loss_decrease_it(tmp_path: Path) -> None:
    torch.manual_seed(0)
    folder = tiny_model(tmp_path / "model")
    model = Qwen2ForCausalLM(Qwen2Config.from_pretrained(str(folder)))  # random weights
    config = actor_config(folder)
    prompt_len, response_len = 3, 4
    sequences = torch.randint(10, 300, (4, prompt_len + response_len))
    response_mask = torch.ones(4, response_len)
    with torch.no_grad():
        old, _ = flat_log_probs(model, sequences)
    old_padded = old.reshape(4, -1)[:, prompt_len - 1: prompt_len - 1 + response_len]
    rewards = rewards_at_end([1.0, 0.0, 0.5, 0.0], [response_len] * 4, response_len)
    advantages, _ = compute_wildawm_advantage(
        rewards, response_mask, np.array(["a", "a", "b", "b"], dtype=object))
    data = TensorDict({
        "prompts": sequences[:, :prompt_len], "responses": sequences[:, prompt_len:],
        "attention_mask": torch.ones_like(sequences), "response_mask": response_mask,
        "old_log_probs": old_padded, "advantages": advantages}, batch_size=4)
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=None, global_batch_size=None)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses, first_entropy = [], 0.0
    for step in range(5):
        optimizer.zero_grad()
        log_probs, entropy = flat_log_probs(model, sequences)
        if step == 0:
            first_entropy = float(entropy.detach().reshape(4, -1)[
                :, prompt_len - 1: prompt_len - 1 + response_len].mean())
        loss, _ = ppo_loss(config, {"log_probs": log_probs, "entropy": entropy}, data)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    # At ratio 1 the surrogate is -sum(w A) = 0 (a group's z-scores sum to zero): the
    # first loss is the entropy bonus alone, -0.001 x the token-mean entropy.
    assert losses[0] == pytest.approx(-0.001 * first_entropy, abs=1e-6)
    assert losses[-1] < losses[0] - 1e-3, losses
