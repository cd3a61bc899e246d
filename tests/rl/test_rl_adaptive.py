"""Adaptive rollouts wired into verl's V1 trainer: ``WorldAgentLoopWorker`` (verl's
``AgentLoopWorkerTQ``, ours) really launches, cancels and selects the WildAWM way inside
each prompt's group (our scheduler, real instances and verifiers), puts the G kept into
TransferQueue with their advantage over the completed pool of K, and keeps kappa across
steps in its file. The same worker in a Ray cluster of two processes: test_rl_cluster.py.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import DictConfig

from gates.task import load_task
from packs.registry import load_pack
from rl.advantages import group_advantages
from rl.dataset import rl_rows
from rl.loss import uid_advantage
from rl.verl_manager import kappa_book
from tests.support.rl_harness import (
    ScriptedServer,
    demo_store,
    replaying,
    tiny_model,
    tokenizer_of,
    verl_config,
)

pytest.importorskip("transfer_queue")
from tests.support.rl_v1_harness import Run, transfer_queue_cluster, values

PACK = load_pack("demo")
TASKS = PACK.split("rl")
CART = TASKS[0]
BROKEN = "<think>I am not sure.</think>\nno call here<|im_end|>"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with demo_store(tmp_path_factory.mktemp("rl-adaptive")) as location:
        yield location


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="module")
def transfer_queue() -> Iterator[None]:
    with transfer_queue_cluster():
        yield


def row(name: str) -> dict[str, Any]:
    [found] = [r for r in rl_rows(PACK, "rl") if r["extra_info"]["task_id"] == name]
    return found


# --- adaptive rollouts ---------------------------------------------------------------------


def adaptive_config(model: Path, kappa: Path, *more: str) -> DictConfig:
    return verl_config(model, "trainer.use_v1=true", "algorithm.adv_estimator=wildawm",
                       "+agent_worlds.adaptive=true", f"+agent_worlds.kappa_state={kappa}",
                       "+agent_worlds.prefetch=1", "actor_rollout_ref.rollout.n=4", *more)


def reference(name: str) -> Any:
    return replaying(load_task(PACK.task_dir(name)).solution.steps)


def test_an_adaptive_group_keeps_g_with_the_pool_advantage_over_k(
        store: Path, model: Path, tmp_path: Path, transfer_queue: None) -> None:
    """The paper's worked example, on real rollouts: the 4 base rollouts all score the
    same (pending), a block of 8 more is launched; among the 12 two differ (ready, K = 12,
    kappa = 0.2 + 0.8 * 3 = 13/5). G = 4 are kept from both halves, and each gets
    (r - mu) / sigma with mu and sigma over all 12, not over the 4."""
    name = CART
    kappa = tmp_path / "kappa.json"
    # launches 0-3 and 4-9 do nothing; 10 solves the task; 11 breaks the format
    def choose(k: int, _p: str) -> Any:
        return reference(name) if k == 10 else (lambda *_: BROKEN) if k == 11 \
            else replaying([])

    config = adaptive_config(model, kappa)
    server = ScriptedServer(tokenizer_of(model), choose)
    run = Run(config, server, [row(name)], step=93)
    try:
        assert run.status == {run.uids[0]: "finished"}
        got = run.fields("uid", "extra_fields")
        extras = values(got["extra_fields"])
        decided = [e["adaptive"] for e in extras if "adaptive" in e]
        assert decided and all(d == decided[0] for d in decided)
        assert (decided[0]["status"], decided[0]["launched"], decided[0]["completed"],
                decided[0]["kappa"]) == ("ready", 12, 12, "13/5")
        assert len(run.sessions()) == 4  # G kept, sessions 0..3
        kept_rewards = sorted(e["reward_extra_info"]["reward"] for e in extras)
        [nothing] = {r for r in kept_rewards if r not in (1.0, -1.0)}
        assert kept_rewards == [-1.0, nothing, nothing, 1.0]  # both halves of the pool
        pool = [nothing] * 10 + [1.0, -1.0]
        carried = sorted({uid_advantage(u) for u in values(got["uid"])})
        assert carried == pytest.approx(sorted(set(group_advantages(pool))))
        # not the z-scores of the 4 kept alone
        assert carried != pytest.approx(sorted(set(group_advantages(kept_rewards))))
        # and verl's V1 advantage step takes them from the uids
        advantages = run.advantages(config)
        uids = values(got["uid"])
        for i in range(len(run.keys)):
            a = uid_advantage(uids[i])
            nonzero = advantages[i][advantages[i] != 0]
            assert nonzero.numel() == 0 or bool(torch.all(torch.sign(nonzero) ==
                                                          math.copysign(1, a)))
        assert kappa.exists()
    finally:
        run.clear()


def test_a_hopeless_task_is_exhausted_then_launches_all_at_once_and_cancels(
        store: Path, model: Path, tmp_path: Path, transfer_queue: None) -> None:
    name = TASKS[1]
    kappa = tmp_path / "kappa.json"
    config = adaptive_config(model, kappa)
    first = Run(config, ScriptedServer(tokenizer_of(model), lambda _k, _p: replaying([])),
                [row(name)], step=94)
    try:
        decided = _decided(first)
        assert (decided["status"], decided["launched"], decided["completed"],
                decided["kappa"]) == ("exhausted", 12, 12, "3")
        assert len(first.sessions()) == 4
        # a dropped group: every kept rollout's advantage is 0
        assert {uid_advantage(u) for u in values(first.fields("uid")["uid"])} == {0.0}
    finally:
        first.clear()
    second = Run(config, ScriptedServer(tokenizer_of(model), lambda _k, _p: reference(name)),
                 [row(name)], step=95)
    try:
        decided = _decided(second)
        assert (decided["status"], decided["launched"], decided["cancelled"],
                decided["kappa"]) == ("mastered", 12, 8, "1")
        assert [e["reward_extra_info"]["V"] for e in
                values(second.fields("extra_fields")["extra_fields"])] == [1, 1, 1, 1]
    finally:
        second.clear()


def test_validation_runs_verls_fixed_group_and_leaves_kappa_alone(
        store: Path, model: Path, tmp_path: Path, transfer_queue: None) -> None:
    kappa = tmp_path / "kappa.json"
    config = adaptive_config(model, kappa, "actor_rollout_ref.rollout.val_kwargs.n=2")
    run = Run(config, ScriptedServer(tokenizer_of(model), lambda _k, _p: replaying([])),
              [row(CART)], validate=True, step=96)
    try:
        assert run.status == {run.uids[0]: "finished"}
        assert len(run.sessions()) == 2
        # validation keeps verl's uid (no advantage is computed for it)
        assert set(values(run.fields("uid")["uid"])) == {run.uids[0]}
        assert not kappa.exists()
    finally:
        run.clear()


def test_adaptive_rollouts_need_the_pool_advantage(store: Path, model: Path,
                                                   tmp_path: Path) -> None:
    from rl.errors import RLError
    from rl.verl_manager import WorldAgentLoopWorker

    config = adaptive_config(model, tmp_path / "k.json", "algorithm.adv_estimator=grpo")
    with pytest.raises(RLError, match="adv_estimator=wildawm"):
        WorldAgentLoopWorker(config, ScriptedServer(tokenizer_of(model),
                                                    lambda _k, _p: replaying([])))


def _decided(run: Run) -> dict[str, Any]:
    found = [e["adaptive"] for e in values(run.fields("extra_fields")["extra_fields"])
             if "adaptive" in e]
    assert found and all(d == found[0] for d in found)
    return dict(found[0])


def test_workers_sharing_a_kappa_file_keep_each_others_tasks(tmp_path: Path) -> None:
    from fractions import Fraction

    from rl.verl_manager import save_kappa

    path = str(tmp_path / "kappa.json")
    first, second = kappa_book(path), kappa_book(path)  # two workers' starting points
    first.set("demo/a", Fraction(13, 5))
    second.set("demo/b", Fraction(3))
    save_kappa(path, first, ["demo/a"])
    save_kappa(path, second, ["demo/b"])  # must not put back a's kappa of before
    assert kappa_book(path).kappa == {"demo/a": "13/5", "demo/b": "3"}
