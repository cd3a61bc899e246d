"""What the V1 (TransferQueue) training tests share: a local Ray cluster holding
TransferQueue's controller and storage units, and one batch run through our V1 worker
(``rl.verl_manager.WorldAgentLoopWorker``) with what it left in TransferQueue.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import transfer_queue as tq
from omegaconf import DictConfig
from tensordict import TensorDict

from rl.local_cluster import transfer_queue_cluster
from tests.support.rl_harness import ScriptedServer

__all__ = ["Run", "transfer_queue_cluster", "values"]


class Run:
    """One training (or validation) batch through ``WorldAgentLoopWorker`` and what it
    left in TransferQueue."""

    def __init__(self, config: DictConfig, server: ScriptedServer, rows: list[dict[str, Any]],
                 *, validate: bool = False, step: int = 1) -> None:
        from verl.utils import tensordict_utils as tu

        from rl.verl_manager import WorldAgentLoopWorker

        self.partition = "val" if validate else "train"
        self.uids = [f"p{step}x{i}" for i in range(len(rows))]
        batch_dict = {
            "raw_prompt": np.array([r["prompt"] for r in rows], dtype=object),
            "agent_name": np.array([r["agent_name"] for r in rows], dtype=object),
            "extra_info": np.array([r["extra_info"] for r in rows], dtype=object),
            "data_source": np.array([r["data_source"] for r in rows], dtype=object),
            "index": np.array([r["extra_info"]["index"] for r in rows]),
            "uid": np.array(self.uids, dtype=object),
        }
        batch = tu.get_tensordict(batch_dict)
        tu.assign_non_tensor_data(batch, "global_steps", step)
        if validate:
            tu.assign_non_tensor_data(batch, "validate", True)
        tq.kv_batch_put(keys=self.uids, partition_id=self.partition,
                        tags=[{"is_prompt": True, "status": "pending", "global_steps": step}
                              for _ in self.uids])
        self.worker = WorldAgentLoopWorker(config, server)

        async def go() -> None:
            await self.worker.generate_sequences(batch)
            await asyncio.gather(*list(self.worker.background_tasks))
            if self.worker._refill is not None:
                await self.worker._refill

        asyncio.run(go())
        listed = tq.kv_list(self.partition).get(self.partition, {})
        self.status = {uid: listed[uid]["status"] for uid in self.uids}
        self.keys = sorted(k for k, tag in listed.items()
                           if not tag.get("is_prompt") and k.split("_")[0] in self.uids)
        self.tags = [listed[k] for k in self.keys]

    def fields(self, *names: str) -> TensorDict:
        found: TensorDict = tq.kv_batch_get(keys=self.keys, partition_id=self.partition,
                                            select_fields=list(names))
        return found

    def sessions(self) -> dict[str, list[str]]:
        """The keys of each session (rollout), in output order."""
        found: dict[str, list[str]] = {}
        for key in self.keys:
            uid, session, _ = key.rsplit("_", 2)
            found.setdefault(f"{uid}_{session}", []).append(key)
        return {k: sorted(v, key=lambda key: int(key.rsplit("_", 1)[1]))
                for k, v in found.items()}

    def advantages(self, config: DictConfig) -> list[torch.Tensor]:
        """verl's own V1 advantage step over this batch (what its trainer runs between the
        old log-probs and the actor update), read back per key."""
        from transfer_queue import KVBatchMeta
        from verl.trainer.ppo.v1.trainer_base import PPOTrainer

        # the old log-probs step before it, in verl's bypass mode: the rollout's own
        rollout = self.fields("rollout_log_probs")["rollout_log_probs"]
        tq.kv_batch_put(keys=self.keys, partition_id=self.partition,
                        fields=TensorDict({"old_log_probs": rollout},
                                          batch_size=len(self.keys)))
        meta = KVBatchMeta(partition_id=self.partition, keys=self.keys, tags=self.tags)
        PPOTrainer._compute_advantage(SimpleNamespace(config=config), meta, {})
        return list(self.fields("advantages")["advantages"].unbind(0))

    def clear(self) -> None:
        tq.kv_clear(keys=[*self.uids, *self.keys], partition_id=self.partition)


def values(stack: Any) -> list[Any]:
    return list(stack.tolist() if hasattr(stack, "tolist") else stack)


def tensors(stack: Any) -> list[list[int]]:
    return [t.tolist() for t in stack.unbind(0)]


__all__ = ["Run", "tensors", "transfer_queue_cluster", "values"]
