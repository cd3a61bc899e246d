"""The papers' samples through verl's V1 (TransferQueue) code path, on CPU: our V1 worker
(verl's ``AgentLoopWorkerTQ`` with adaptive rollouts and rollout uids) runs the agent
loop on real demo-world instances against a scripted token-in/token-out server and puts
each rollout's samples into a real TransferQueue (its controller and storage units as Ray
actors of a local cluster); verl's own V1 ``PPOTrainer._compute_advantage`` reads them
back and writes the advantages; verl's actor loss (``ppo_loss``) trains a tiny random
model on them.

- WildAWM: the paper's 9-step rollout with a compaction at step 5 is 3 samples (not 9),
  loss masks on exactly the model's tokens, each weighing 1 / the rollout's trainable
  tokens;
- AWM: a T-turn rollout is T samples, each with the w most recent turns in its context
  and loss on its own turn alone;
- adaptive groups: launched, decided and cancelled by the scheduler, G kept, each with its
  advantage over the completed pool of K.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import DictConfig
from tensordict import TensorDict
from transformers import Qwen2Config, Qwen2ForCausalLM

from gates.contract import AnswerStep, ToolStep
from gates.task import load_task
from packs.registry import load_pack
from rl.advantages import group_advantages
from rl.dataset import rl_rows
from rl.loss import POLICY_LOSS, rollout_uid, split_uid, uid_advantage
from rl.verl_loop import COMPACT_PROMPT
from tests.support.rl_harness import (
    ScriptedServer,
    call_text,
    demo_store,
    replaying,
    tiny_model,
    tokenizer_of,
    verl_config,
)

tq = pytest.importorskip("transfer_queue")
from tests.support.rl_v1_harness import Run, transfer_queue_cluster, values  # noqa: E402

PACK = load_pack("demo")
TASKS = PACK.split("rl")
CART = TASKS[0]  # nordlys-cart-vs-bom: its first solution step reads the cart


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with demo_store(tmp_path_factory.mktemp("rl-v1")) as location:
        yield location


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="module", autouse=True)
def transfer_queue() -> Iterator[None]:
    with transfer_queue_cluster():
        yield


def row(name: str, **kwargs: Any) -> dict[str, Any]:
    [found] = [r for r in rl_rows(PACK, "rl", **kwargs) if r["extra_info"]["task_id"] == name]
    return found


def v1_config(model: Path, *more: str) -> DictConfig:
    return verl_config(model, "trainer.use_v1=true", *more)


# --- WildAWM: segment samples -------------------------------------------------------------


READ_CART = ToolStep(tool="shop_get_cart", arguments={})
BROKEN = "<think>I am not sure.</think>\nno call here<|im_end|>"


def nine_steps(summary: str = "Read the cart eight times.") -> Any:
    """The paper's example: four action steps, the compaction call (step 5), four more
    (the last one answers)."""
    plan = [READ_CART] * 7 + [AnswerStep(text="done")]
    actions = iter(plan)

    def policy(_n: int, prompt: str) -> str:
        if COMPACT_PROMPT[:40] in prompt:
            return summary + "<|im_end|>"
        return call_text(next(actions))

    return policy


def test_the_papers_nine_steps_with_a_compaction_at_step_5_are_three_samples(
        store: Path, model: Path) -> None:
    tokenizer = tokenizer_of(model)
    segments = ("algorithm.adv_estimator=wildawm", "+agent_worlds.history=compaction",
                "+agent_worlds.samples=segments")
    # A rollout without compaction first, to place the threshold between the context
    # after step 4 (the prompt of step 5) and after step 3; a short summary keeps the
    # compacted context under it for steps 6 to 9.
    dry = ScriptedServer(tokenizer, lambda _k, _p: replaying([READ_CART] * 8))
    dry_run = Run(v1_config(model, *segments, "actor_rollout_ref.rollout.n=1"), dry,
                  [row(CART)], step=90)
    dry_run.clear()
    [lengths] = [[len(p) for p in ps] for ps in dry.prompts.values()]
    threshold = (lengths[3] + lengths[4]) // 2
    config = v1_config(model, *segments, f"+agent_worlds.compact_at={threshold}",
                       "actor_rollout_ref.rollout.n=2")
    server = ScriptedServer(tokenizer,
                            lambda k, _p: nine_steps() if k == 0 else (lambda *_: BROKEN))
    run = Run(config, server, [row(CART)], step=91)
    try:
        assert run.status == {run.uids[0]: "finished"}
        # every entry is tagged with the policy versions verl's trainer reads (the batch's
        # step here: the scripted server reports none)
        assert {(t["min_global_steps"], t["max_global_steps"]) for t in run.tags} == {(91, 91)}
        by_session = run.sessions()
        [nine] = [keys for keys in by_session.values() if len(keys) == 3]
        [broken] = [keys for keys in by_session.values() if len(keys) == 1]
        [request] = [r for r, ps in server.prompts.items() if len(ps) == 9]
        prompts, outputs = server.prompts[request], server.outputs[request]
        assert [i for i, p in enumerate(prompts)
                if COMPACT_PROMPT[:40] in tokenizer.decode(p)] == [4]  # step 5
        got = run.fields("prompts", "responses", "response_mask", "uid", "extra_fields")
        position = {key: i for i, key in enumerate(run.keys)}

        def sample(key: str) -> tuple[list[int], list[int], list[int], dict[str, Any]]:
            i = position[key]
            return (got["prompts"][i].tolist(), got["responses"][i].tolist(),
                    got["response_mask"][i].tolist(), values(got["extra_fields"])[i])

        trainable = sum(len(o) for o in outputs)
        for key, steps in zip(nine, ([0, 1, 2, 3], [4], [5, 6, 7, 8]), strict=True):
            prompt, response, mask, extra = sample(key)
            first, last = steps[0], steps[-1]
            assert prompt == prompts[first]
            # the segment is one causal context: prompt + response is the last step's
            assert prompt + response == prompts[last] + outputs[last]
            expected = []
            for t in steps:
                expected += [1] * len(outputs[t])
                if t != last:
                    gap = len(prompts[t + 1]) - len(prompts[t]) - len(outputs[t])
                    expected += [0] * gap
            assert mask == expected
            assert extra["sample_steps"] == steps
            assert extra["sample_weight"] == pytest.approx(1.0 / trainable)
        # the format failure trains its one offending step
        prompt, response, mask, extra = sample(broken[0])
        assert mask == [1] * len(response) and extra["reward_extra_info"]["format_error"] == 1
        # rows of one rollout share its uid, "<prompt uid>|<session>"; the keys stay verl's
        uids = values(got["uid"])
        for keys in (nine, broken):
            session = keys[0].rsplit("_", 2)[1]
            assert {uids[position[k]] for k in keys} == {rollout_uid(run.uids[0], session)}

        # verl's V1 advantage step: A_j z-scored over the group's two rewards, each token
        # weighted 1 / (T_r K_g N) with K_g = 2 rollouts and N = 1 group
        advantages = run.advantages(config)
        reward_of = {k: values(got["extra_fields"])[position[k]]["reward_extra_info"]["reward"]
                     for k in run.keys}
        rewards = [reward_of[nine[0]], reward_of[broken[0]]]
        a_nine, a_broken = group_advantages(rewards)
        for keys, a, tokens in ((nine, a_nine, trainable),
                                (broken, a_broken, len(sample(broken[0])[1]))):
            for key in keys:
                mask = torch.tensor(sample(key)[2], dtype=torch.float32)
                expected_adv = a / (tokens * 2 * 1) * mask
                assert torch.allclose(advantages[position[key]], expected_adv, atol=1e-9)
        # one actor step of a tiny random model through verl's own loss on these samples
        _train_on(model, config, [sample(k) for k in run.keys], advantages)
    finally:
        run.clear()


def _train_on(model_dir: Path, config: DictConfig,
              samples: list[tuple[list[int], list[int], list[int], dict[str, Any]]],
              advantages: list[torch.Tensor]) -> None:
    """verl's ``ppo_loss`` (what its engine workers call) on the samples, padded: the
    surrogate at ratio 1 is -sum(w A) over trained tokens, and a gradient step moves it."""
    from verl.utils import tensordict_utils as tu
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.utils.losses import ppo_loss

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config.from_pretrained(str(model_dir)))
    actor = omega_conf_to_dataclass(verl_config(
        model_dir, f"actor_rollout_ref.actor.policy_loss.loss_mode={POLICY_LOSS}",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4").actor_rollout_ref.actor)
    width_p = max(len(s[0]) for s in samples)
    width_r = max(len(s[1]) for s in samples)
    n = len(samples)
    prompts = torch.zeros(n, width_p, dtype=torch.long)
    responses = torch.zeros(n, width_r, dtype=torch.long)
    mask = torch.zeros(n, width_r)
    adv = torch.zeros(n, width_r)
    for i, (p, r, m, _) in enumerate(samples):
        prompts[i, width_p - len(p):] = torch.tensor(p)  # left-padded prompts, as verl's
        responses[i, : len(r)] = torch.tensor(r)
        mask[i, : len(m)] = torch.tensor(m, dtype=torch.float32)
        adv[i, : len(m)] = advantages[i][: len(m)]
    sequences = torch.cat([prompts, responses], dim=1)

    def log_probs() -> torch.Tensor:
        logits = model(input_ids=sequences).logits[:, :-1].float()
        chosen = torch.log_softmax(logits, -1).gather(-1, sequences[:, 1:, None])[..., 0]
        padded = torch.cat([chosen, torch.zeros(n, 1)], dim=1)
        return padded[:, width_p - 1: width_p - 1 + width_r]

    with torch.no_grad():
        old = log_probs()
    data = TensorDict({"prompts": prompts, "responses": responses,
                       "attention_mask": torch.ones_like(sequences), "response_mask": mask,
                       "old_log_probs": old, "advantages": adv}, batch_size=n)
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=None, global_batch_size=None)
    flat = torch.cat([log_probs(), torch.zeros(n, 0)], dim=1)
    loss, _ = ppo_loss(actor, {"log_probs": _flat(flat, width_p, width_r, n),
                               "entropy": torch.zeros(n * (width_p + width_r))}, data)
    assert float(loss.detach()) == pytest.approx(-float((adv * mask).sum()), abs=1e-6)
    loss.backward()
    assert any(p.grad is not None and float(p.grad.abs().sum()) > 0
               for p in model.parameters())


def _flat(response_log_probs: torch.Tensor, width_p: int, width_r: int,
          n: int) -> torch.Tensor:
    """What verl's engine hands its loss: per sequence, position i holds log p(token
    i+1), sequences flattened; only the response window matters to the loss."""
    out = torch.zeros(n, width_p + width_r)
    out[:, width_p - 1: width_p - 1 + width_r] = response_log_probs
    return out.reshape(-1)


# --- AWM: history-aware samples ------------------------------------------------------------


def test_a_t_turn_awm_rollout_is_t_samples_with_the_w_most_recent_turns(
        store: Path, model: Path) -> None:
    tokenizer = tokenizer_of(model)
    steps = load_task(PACK.task_dir(CART)).solution.steps
    config = v1_config(model, "algorithm.adv_estimator=grpo", "+agent_worlds.window=3",
                       "+agent_worlds.samples=history", "actor_rollout_ref.rollout.n=2")
    server = ScriptedServer(tokenizer, lambda k, _p: replaying(steps) if k == 0
                            else (lambda *_: BROKEN))
    run = Run(config, server, [row(CART)], step=92)
    try:
        by_session = run.sessions()
        [solved] = [keys for keys in by_session.values() if len(keys) == len(steps)]
        [request] = [r for r, ps in server.prompts.items() if len(ps) == len(steps)]
        prompts, outputs = server.prompts[request], server.outputs[request]
        got = run.fields("prompts", "responses", "response_mask", "uid")
        position = {key: i for i, key in enumerate(run.keys)}
        for t, key in enumerate(solved):
            i = position[key]
            assert got["prompts"][i].tolist() == prompts[t]  # the context turn t saw
            assert got["responses"][i].tolist() == outputs[t]  # its own turn alone
            assert got["response_mask"][i].tolist() == [1] * len(outputs[t])
            # system, task and at most the 3 most recent turns' results
            assert tokenizer.decode(prompts[t]).count("<tool_response>") == min(t, 3)
        # GRPO keeps verl's plain uid, and verl's multi-output advantage gives every
        # sample of a session its final output's advantage
        assert set(values(got["uid"])) == {run.uids[0]}
        advantages = run.advantages(config)
        per_session = []
        for keys in by_session.values():
            found = {float(advantages[position[k]][0]) for k in keys}
            assert len(found) == 1
            per_session.append(found.pop())
        low, high = sorted(per_session)
        assert low < 0 < high and low == pytest.approx(-high)
    finally:
        run.clear()


def test_rollout_uids_round_trip_exactly() -> None:
    a = group_advantages([0.0] * 10 + [1.0, 0.05])[10]
    uid = rollout_uid("5f1c", "3", a)
    assert split_uid(uid) == ("5f1c", "3") and uid_advantage(uid) == a
    assert uid_advantage(rollout_uid("5f1c", "3")) is None
    with pytest.raises(ValueError):
        rollout_uid("a|b", "0")


