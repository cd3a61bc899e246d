"""Adaptive rollouts inside verl: a training step really launches, cancels and selects
rollouts the WildAWM way (``rl.scheduler``), and prepares its instances first.

``actor_rollout_ref.rollout.agent.agent_loop_manager_class=
rl.verl_manager.AdaptiveAgentLoopManager`` makes verl's agent-loop manager start
``AdaptiveAgentLoopWorker`` actors. verl hands a worker its share of the batch as G copies
of each task's row (``rollout.n = G``, one uid per task). The worker:

1. has the batch's instances open before its rollouts start (AWM's pre-fetch,
   ``prefetch`` per row): after a batch, it starts opening the same worlds' instances for
   the next one in the background, while the trainer updates, and tops up at the start;
2. runs each task's group under ``AdaptiveRollouts``: ``launch_count(kappa)`` rollouts at
   once, decided after the G base rollouts and after each block of C, the outstanding
   ones of a decided task cancelled (their instances closed, nothing stored);
3. answers with exactly G rollouts per task, as verl's trainer expects: a ready group's
   G picked from both halves of its sorted rewards, a dropped group's (mastered,
   exhausted) first G, whose advantages are zero anyway (all rewards equal; ``rl.loss``
   leaves such groups out of the step's group mean);
4. keeps kappa per task across steps: in ``agent_worlds.kappa_state`` (a JSON file the
   workers share: read at the start of each batch, and after it each worker writes the
   tasks it ran into it under a file lock), so a task that lands on another worker next
   step, or a restarted run, goes on from its kappa; without a file, in the process.

``AgentLoopManager.generate_sequences`` splits the batch into equal chunks; a chunk that
splits a task's G copies is refused (make the batch size a multiple of workers x G).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import threading
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import ray
from verl.experimental.agent_loop.agent_loop import AgentLoopManager, AgentLoopWorker
from verl.protocol import DataProto

from rl.contract import RowInfo
from rl.errors import RLError
from rl.scheduler import AdaptiveRollouts, GroupOutcome, KappaState
from rl.verl_loop import SETTINGS_KEY, LoopSettings
from rl.world import runtime

_BOOKS: dict[str, KappaState] = {}
_BOOKS_LOCK = threading.Lock()


def kappa_book(path: str | None) -> KappaState:
    """The kappa state a batch starts from. With a file: read afresh for every batch, so
    a task whose group another worker ran last step (verl splits each batch among its
    workers by position) starts from that worker's kappa, and a restarted run resumes.
    Without one: this process's own state, kept across its batches."""
    if path:
        file = Path(path)
        with _file_lock(file):
            return KappaState.load(file) if file.exists() else KappaState()
    with _BOOKS_LOCK:
        return _BOOKS.setdefault("", KappaState())


def save_kappa(path: str, state: KappaState, tasks: list[str]) -> None:
    """Write this batch's tasks' kappa into the file, leaving every other task's as the
    file has it (workers share the file; each writes only the tasks it ran), under a
    lock and atomically."""
    file = Path(path)
    with _file_lock(file):
        merged = KappaState.load(file) if file.exists() else KappaState()
        for task in tasks:
            merged.set(task, state.get(task))
        merged.save(file)


@contextlib.contextmanager
def _file_lock(file: Path) -> Iterator[None]:
    file.parent.mkdir(parents=True, exist_ok=True)
    with open(file.with_name(file.name + ".lock"), "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class AdaptiveAgentLoopWorker(AgentLoopWorker):
    """verl's agent-loop worker with WildAWM's adaptive rollout counts."""

    async def generate_sequences(self, batch: DataProto) -> DataProto:
        if batch.meta_info.get("validate", False):
            # validation measures the policy: a fixed number per task, no kappa touched
            return await super().generate_sequences(batch)
        settings = LoopSettings.read(self.config.get(SETTINGS_KEY, {}))
        groups = _groups(batch)
        sampling = _sampling_params(self.rollout_config, batch)
        await self._prefetch(batch, settings)
        book = kappa_book(settings.kappa_state)
        scheduler = AdaptiveRollouts(book, group_size=len(next(iter(groups.values()))),
                                     block=settings.block, kappa_max=settings.kappa_max)
        step = batch.meta_info.get("global_steps", -1)
        keys = [_task_key(batch, rows[0]) for rows in groups.values()]
        plays = await scheduler.run_groups(
            [(key, self._launcher(batch, rows[0], sampling, step))
             for key, rows in zip(keys, groups.values(), strict=True)], _reward_of)
        if settings.kappa_state:
            await asyncio.to_thread(save_kappa, settings.kappa_state, book, keys)
        placed: dict[int, Any] = {}
        decided: dict[int, dict[str, Any]] = {}
        for (outcome, results), rows in zip(plays, groups.values(), strict=True):
            picked = outcome.picked or list(range(len(rows)))
            for row, index in zip(rows, picked, strict=True):
                kept = results[index]
                assert kept is not None, "a decided group's picked rollout has a result"
                placed[row], decided[row] = kept, _outcome_info(outcome)
        # verl's rows stay where they were: rollouts are placed back in the batch's order.
        output: DataProto = self._postprocess(
            [placed[row] for row in range(len(batch))],
            input_non_tensor_batch=batch.non_tensor_batch,
            validate=batch.meta_info.get("validate", False))
        # per row, not in meta_info: verl concatenates workers' outputs, and meta_info
        # must then be equal across them
        column = np.empty(len(batch), dtype=object)
        column[:] = [decided[row] for row in range(len(batch))]
        output.non_tensor_batch["adaptive"] = column
        self._start_refill(settings)
        return output

    async def _agent_loop_postprocess(self, output: Any, validate: bool, **kwargs: Any) -> Any:
        if isinstance(output, list):
            raise RLError(f"the agent loop cut a rollout into {len(output)} samples; verl's "
                          "classic trainer takes one sequence per rollout: set "
                          "agent_worlds.samples=rollout with a history that keeps one "
                          "context, or train with trainer.use_v1=True")
        return await super()._agent_loop_postprocess(output, validate, **kwargs)

    def _launcher(self, batch: DataProto, row: int, sampling: dict[str, Any], step: int) -> Any:
        kwargs = {k: v[row] for k, v in batch.non_tensor_batch.items() if k != "__do_sample__"}
        index = int(kwargs.get("index", row)) if "index" in kwargs else row

        async def launch(i: int) -> Any:
            trajectory = {"step": step, "sample_index": index, "rollout_n": i,
                          "validate": batch.meta_info.get("validate", False)}
            return await self._run_agent_loop(dict(sampling), trajectory, trace=False,
                                              **kwargs)

        return launch

    async def _prefetch(self, batch: DataProto, settings: LoopSettings) -> None:
        """Instances for this batch: most were opened while the last batch trained (the
        refill below); top up what this batch needs beyond them, then start refilling for
        the next batch in the background, which runs while the trainer updates."""
        infos = [_info(x) for x in batch.non_tensor_batch.get("extra_info", [])]
        if not infos or not settings.prefetch:
            return
        refill: asyncio.Task[int] | None = getattr(self, "_refill", None)
        if refill is not None and refill.get_loop() is asyncio.get_running_loop():
            await asyncio.gather(refill, return_exceptions=True)  # an error shows below
        world = runtime(settings.store, packs_dir=settings.packs_dir, cache=settings.cache)
        # one instance per row (kappa 1: G per task), times the setting
        wanted = [world.task(i) for i in infos] * settings.prefetch
        await world.prefetch(wanted)
        self._next = wanted  # the next batch is likely to need the same worlds

    def _start_refill(self, settings: LoopSettings) -> None:
        wanted = getattr(self, "_next", None)
        if wanted and settings.prefetch:
            world = runtime(settings.store, packs_dir=settings.packs_dir, cache=settings.cache)
            self._refill = asyncio.ensure_future(world.prefetch(wanted))


class AdaptiveAgentLoopManager(AgentLoopManager):
    """verl's agent-loop manager, starting ``AdaptiveAgentLoopWorker`` actors."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.agent_loop_workers_class = ray.remote(AdaptiveAgentLoopWorker)
        super().__init__(*args, **kwargs)


def _groups(batch: DataProto) -> OrderedDict[str, list[int]]:
    """Rows by task group (uid), in first-seen order; all groups the same size."""
    uids = batch.non_tensor_batch.get("uid")
    if uids is None:
        raise RLError("adaptive rollouts need verl's uid column (one uid per task group)")
    groups: OrderedDict[str, list[int]] = OrderedDict()
    for row, uid in enumerate(uids.tolist()):
        groups.setdefault(str(uid), []).append(row)
    sizes = sorted({len(rows) for rows in groups.values()})
    if len(sizes) != 1:
        raise RLError(f"a worker got task groups of sizes {sizes}: the batch split a group "
                      "between workers; make the batch a multiple of workers x rollout.n")
    return groups


def _task_key(batch: DataProto, row: int) -> str:
    """A group's task across steps (verl's uid is new every step): pack/task."""
    raw = batch.non_tensor_batch.get("extra_info")
    if raw is None:
        return str(batch.non_tensor_batch["uid"][row])
    info = _info(raw[row])
    return f"{info.pack}/{info.task_id}"


def _sampling_params(config: Any, batch: DataProto) -> dict[str, Any]:
    validate = batch.meta_info.get("validate", False)
    source = config.val_kwargs if validate else config
    return {"temperature": source.temperature, "top_p": source.top_p, "top_k": source.top_k,
            "repetition_penalty": 1.0, "logprobs": config.calculate_log_probs}


def _reward_of(output: Any) -> float:
    score = output.reward_score
    if score is None:
        raise RLError("an agent-worlds rollout came back without its reward")
    return float(score)


def _info(raw: Any) -> RowInfo:
    import msgspec

    return msgspec.convert(dict(raw), RowInfo)


def _outcome_info(outcome: GroupOutcome) -> dict[str, Any]:
    return {"task": outcome.task_id, "status": outcome.status, "launched": outcome.launched,
            "cancelled": outcome.cancelled, "completed": outcome.completed,
            "kappa": outcome.kappa_after}


__all__ = ["AdaptiveAgentLoopManager", "AdaptiveAgentLoopWorker", "kappa_book", "save_kappa"]

