"""verl's V1 agent-loop manager (ours, ``WorldAgentLoopManager``) in a local Ray cluster:
two worker processes, each opening the store (SQLite or PostgreSQL) with a cold snapshot
cache of its own, like two nodes; their rollouts of the same task start from the same
world hashes, solve it, and land in TransferQueue under the prompts' keys.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gates.task import load_task
from packs.registry import load_pack
from replay import Worlds
from rl.dataset import rl_rows
from rl.world import CACHE_ENV, STORE_ENV
from tests.support.rl_harness import (
    DEMO_JSONL,
    ScriptedServer,
    replaying,
    tiny_model,
    tokenizer_of,
    verl_config,
)

tq = pytest.importorskip("transfer_queue")
from tests.support.rl_v1_harness import transfer_queue_cluster, values  # noqa: E402

PACK = load_pack("demo")
TASKS = PACK.split("rl")


def _reference(_k: int, prompt: str) -> Any:
    [name] = [n for n in TASKS if load_task(PACK.task_dir(n)).instruction(hinted=False)
              in prompt]
    return replaying(load_task(PACK.task_dir(name)).solution.steps)


@pytest.mark.slow
def test_two_ray_workers_fill_their_own_caches_with_the_same_hashes(
        store_location: str, tmp_path: Path) -> None:
    from verl.utils import tensordict_utils as tu

    from rl.verl_manager import WorldAgentLoopManager

    model = tiny_model(tmp_path / "model")
    worlds = Worlds.open(store_location)
    worlds.import_file(DEMO_JSONL)
    worlds.close()
    caches = tmp_path / "caches"
    # the workers import the harness as tests.support.*: the checkout comes before
    # site-packages, where verl ships a `tests` package of its own
    root = str(Path(__file__).resolve().parents[2])
    env = {STORE_ENV: store_location, CACHE_ENV: str(caches / "{pid}"), "PYTHONPATH": root}
    [row] = [r for r in rl_rows(PACK, "rl") if r["extra_info"]["task_id"] == TASKS[0]]
    uids = ["c0", "c1"]
    with transfer_queue_cluster(runtime_env={"env_vars": env}):
        # the store and the caches come from the workers' environment, as on a cluster
        config = verl_config(model, "trainer.use_v1=true", "algorithm.adv_estimator=wildawm",
                             "actor_rollout_ref.rollout.agent.num_workers=2",
                             "actor_rollout_ref.rollout.n=2")
        manager = WorldAgentLoopManager.create(
            config, llm_client=ScriptedServer(tokenizer_of(model), _reference))
        # the same task for both workers (verl gives each a chunk of the batch)
        batch = tu.get_tensordict({
            "raw_prompt": np.array([row["prompt"]] * 2, dtype=object),
            "agent_name": np.array([row["agent_name"]] * 2, dtype=object),
            "extra_info": np.array([row["extra_info"]] * 2, dtype=object),
            "data_source": np.array([row["data_source"]] * 2, dtype=object),
            "index": np.array([0, 1]),
            "uid": np.array(uids, dtype=object)})
        tu.assign_non_tensor_data(batch, "global_steps", 1)
        tq.kv_batch_put(keys=uids, partition_id="train",
                        tags=[{"is_prompt": True, "status": "pending", "global_steps": 1}] * 2)
        manager.generate_sequences(batch)  # returns once the prompts are spawned
        deadline = time.monotonic() + 600
        while True:
            listed = tq.kv_list("train").get("train", {})
            if all(listed[u]["status"] in ("finished", "failure") for u in uids):
                break
            assert time.monotonic() < deadline, listed
            time.sleep(1)
        assert [listed[u]["status"] for u in uids] == ["finished", "finished"]
        keys = sorted(k for k, tag in listed.items() if not tag.get("is_prompt"))
        assert len(keys) == 4  # 2 prompts x G = 2, one sample per rollout
        extras = values(tq.kv_batch_get(keys=keys, partition_id="train",
                                        select_fields=["extra_fields"])["extra_fields"])
        assert [e["reward_extra_info"]["V"] for e in extras] == [1, 1, 1, 1]
    filled = sorted(p for p in caches.iterdir() if p.is_dir())
    assert len(filled) == 2, filled  # one cache per worker process
    snapshots = [sorted(q.name for q in (p / "snapshots").iterdir()) for p in filled
                 if (p / "snapshots").exists()]
    assert len(snapshots) == 2 and snapshots[0] == snapshots[1]
