"""verl's V1 (TransferQueue) agent-loop manager for agent-worlds: every rollout's samples
go into TransferQueue, and a training step really launches, cancels and selects rollouts
the WildAWM way (``rl.scheduler``), with its instances prepared first.

``actor_rollout_ref.rollout.agent.agent_loop_manager_class=
rl.verl_manager.WorldAgentLoopManager`` (with ``trainer.use_v1=true``) makes verl's V1
trainer start ``WorldAgentLoopWorker`` actors: verl's own ``AgentLoopWorkerTQ`` (which
spawns one ``_run_prompt`` per prompt of the batch and puts each finished rollout's
outputs under ``{uid}_{session}_{index}``), changed in three places:

1. **Instances first** (AWM's pre-fetch, ``prefetch`` per rollout): before a training
   batch's prompts start, the worker opens their instances (G per task); once the batch's
   prompts have all finished it starts opening the same worlds' instances for the next
   batch in the background, while the trainer updates.
2. **Adaptive rollouts** (``agent_worlds.adaptive=true``): a prompt's group runs under
   ``AdaptiveRollouts``: ``launch_count(kappa)`` rollouts at once, decided after the G
   base rollouts and after each block of C, outstanding ones cancelled (their instances
   closed, nothing stored). Only then are G rollouts put into TransferQueue as sessions
   0..G-1 (a ready group's G from both halves of its sorted rewards, a dropped group's
   first G), and the prompt marked finished. kappa is kept per task across steps in
   ``agent_worlds.kappa_state`` (a JSON file the workers share, under a file lock) or in
   the process. Validation prompts run verl's fixed count and leave kappa alone.
3. **Rollout uids** (``algorithm.adv_estimator=wildawm``): the ``uid`` field of a
   training rollout's outputs is rewritten to ``<uid>|<session>`` (``rl.loss.rollout_uid``)
   so that the advantage sees which rows are one rollout (a rollout cut into segment or
   history samples is several rows); an adaptive group's kept rollouts also carry their
   advantage over the completed pool of K (``<uid>|<session>|<A_j>``), the G kept for the
   update getting the pool's mu and sigma. The TransferQueue *key* keeps verl's plain uid,
   which its replay buffer groups by. Other estimators (AWM's GRPO) keep verl's uid and
   verl's own multi-output advantage (the final output's, broadcast to its session).

A rollout cut into samples comes back from the loop as a list; verl's V1 worker puts each
as its own entry (``{uid}_{session}_{i}``), so AWM's history-aware samples and WildAWM's
segments reach the loss as separate samples.

This is the hook V1 offers for it: a custom manager class whose workers "put agent loop
outputs into TransferQueue" (verl's ``TaskRunnerV1.init_agent_loop_manager``), with
verl's own per-prompt ``_run_prompt`` replaced where the rollout count is adaptive.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import fcntl
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import ray
import transfer_queue as tq
from tensordict import TensorDict
from verl.trainer.ppo.v1.agent_loop_tq import (
    AgentLoopManagerTQ,
    AgentLoopWorkerTQ,
    apply_greedy_sampling_params,
)
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from rl.advantages import group_advantages
from rl.contract import RowInfo
from rl.errors import RLError
from rl.loss import rollout_uid
from rl.scheduler import AdaptiveRollouts, GroupOutcome, KappaState
from rl.verl_loop import SETTINGS_KEY, LoopSettings
from rl.world import runtime

log = logging.getLogger("agentworlds.rl")
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


# the class behind verl's Ray actor (an actor class itself cannot be subclassed)
_WorkerTQ: Any = getattr(AgentLoopWorkerTQ, "__ray_actor_class__")  # noqa: B009
_COLLECTING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "agent_worlds_collecting", default=False)
ADAPTIVE_ESTIMATOR = "wildawm"  # the advantage that reads a pool advantage from the uid


class WorldAgentLoopWorker(_WorkerTQ):  # type: ignore[misc]
    """verl's V1 agent-loop worker with pre-fetched instances, adaptive rollout counts
    and rollout uids (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.world_settings = LoopSettings.read(self.config.get(SETTINGS_KEY, {}))
        estimator = str(self.config.algorithm.adv_estimator)
        self.rollout_uids = estimator == ADAPTIVE_ESTIMATOR
        if self.world_settings.adaptive and not self.rollout_uids:
            raise RLError(f"agent_worlds.adaptive=true needs algorithm.adv_estimator="
                          f"{ADAPTIVE_ESTIMATOR} (the advantage over the completed pool of "
                          f"K rollouts), not {estimator!r}")
        self._next: list[Any] = []
        self._refill: asyncio.Future[Any] | None = None

    async def generate_sequences(self, batch: TensorDict) -> None:
        validate = bool(_scalar(batch["validate"])) if "validate" in batch else False
        if not validate:
            await self._prefetch(batch)
        before = set(self.background_tasks)
        await super().generate_sequences(batch)
        if not validate:
            spawned = set(self.background_tasks) - before
            self._refill = asyncio.ensure_future(self._refill_after(spawned))

    async def _run_prompt(self, prompt: dict[str, Any], sampling_params: dict[str, Any],
                          trajectory: dict[str, Any], trace: bool = False) -> None:
        if trajectory["validate"] or not self.world_settings.adaptive:
            await super()._run_prompt(prompt, sampling_params, trajectory, trace)
            return
        uid = str(prompt["uid"])
        await tq.async_kv_put(key=uid, partition_id="train", tag={"status": "running"})
        try:
            await self._run_adaptive_group(prompt, sampling_params, trajectory, trace)
            status = "finished"
        except Exception:
            log.exception("the adaptive group of prompt %s failed", uid)
            status = "failure"
        await tq.async_kv_put(key=uid, partition_id="train", tag={"status": status})

    async def _agent_loop_postprocess(self, output: Any, validate: bool,
                                      **kwargs: Any) -> Any:
        outputs = output if isinstance(output, list) else [output]
        if _COLLECTING.get():
            # an adaptive group's rollout: what is put is decided once the group is
            if any(o.reward_score is None for o in outputs):
                raise RLError("an agent-worlds rollout came back without its reward")
            return outputs
        await super()._agent_loop_postprocess(output, validate, **kwargs)
        if not validate and self.rollout_uids and outputs:
            await _tag_rollout(str(kwargs["uid"]), int(kwargs["session_id"]), len(outputs),
                               None)
        return None

    async def _run_adaptive_group(self, prompt: dict[str, Any],
                                  sampling_params: dict[str, Any],
                                  trajectory: dict[str, Any], trace: bool) -> None:
        settings = self.world_settings
        rollout = self.config.actor_rollout_ref.rollout
        group_size = int(prompt.pop("__rollout_n__", rollout.n))
        params = dict(sampling_params)
        if not prompt.pop("__do_sample__", True):
            apply_greedy_sampling_params(params)
        key = _task_key(prompt)
        book = await asyncio.to_thread(kappa_book, settings.kappa_state)
        scheduler = AdaptiveRollouts(book, group_size=group_size, block=settings.block,
                                     kappa_max=settings.kappa_max)

        async def launch(i: int) -> list[Any]:
            _COLLECTING.set(True)  # this task's own context: its rollout is held back
            found: list[Any] = await self._run_agent_loop(
                dict(params), trajectory, trace=trace, session_id=i, **prompt)
            return found

        outcome, results = await scheduler.run_group(key, launch, _reward_of)
        if settings.kappa_state:
            await asyncio.to_thread(save_kappa, settings.kappa_state, book, [key])
        await self._put_group(prompt, outcome, results, group_size)

    async def _put_group(self, prompt: dict[str, Any], outcome: GroupOutcome,
                         results: list[list[Any] | None], group_size: int) -> None:
        """The group's G rollouts into TransferQueue as sessions 0..G-1, each with its
        advantage over the completed pool of K in its uid."""
        picked = outcome.picked or list(range(group_size))
        advantages = group_advantages(outcome.rewards)
        decided = _outcome_info(outcome)
        kwargs = {k: v for k, v in prompt.items() if k != "agent_name"}
        for session, index in enumerate(picked):
            outputs = results[index]
            assert outputs is not None, "a decided group's picked rollout has a result"
            outputs[-1].extra_fields["adaptive"] = decided
            await _WorkerTQ._agent_loop_postprocess(self, outputs, False, session_id=session,
                                                    **kwargs)
            await _tag_rollout(str(prompt["uid"]), session, len(outputs), advantages[index])

    async def _prefetch(self, batch: TensorDict) -> None:
        """Instances for this batch: most were opened while the last batch trained (the
        refill); top up what this batch needs beyond them."""
        settings = self.world_settings
        infos = [_info(x) for x in _column(batch, "extra_info")]
        if not infos or not settings.prefetch:
            return
        if self._refill is not None and not self._refill.done():
            await asyncio.gather(self._refill, return_exceptions=True)
        world = runtime(settings.store, packs_dir=settings.packs_dir, cache=settings.cache)
        group = int(self.config.actor_rollout_ref.rollout.n)
        wanted = [world.task(i) for i in infos for _ in range(group)] * settings.prefetch
        await world.prefetch(wanted)
        self._next = wanted  # the next batch is likely to need the same worlds

    async def _refill_after(self, spawned: set[asyncio.Task[Any]]) -> None:
        """Once this batch's prompts are done, open the next batch's instances while the
        trainer updates."""
        if spawned:
            await asyncio.wait(spawned)
        settings = self.world_settings
        if self._next and settings.prefetch:
            world = runtime(settings.store, packs_dir=settings.packs_dir, cache=settings.cache)
            await world.prefetch(self._next)


class WorldAgentLoopManager(AgentLoopManagerTQ):
    """verl's V1 agent-loop manager, starting ``WorldAgentLoopWorker`` actors."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self.agent_loop_workers_class = ray.remote(WorldAgentLoopWorker)


async def _tag_rollout(uid: str, session: int, outputs: int, advantage: float | None) -> None:
    """Rewrite the uid field of a training rollout's entries (their keys stay verl's)."""
    tagged = rollout_uid(uid, str(session), advantage)
    await tq.async_kv_batch_put(
        keys=[f"{uid}_{session}_{i}" for i in range(outputs)], partition_id="train",
        fields=list_of_dict_to_tensordict([{"uid": tagged} for _ in range(outputs)]))


def _column(batch: TensorDict, key: str) -> list[Any]:
    if key not in batch:
        return []
    found = batch[key]
    return list(found.tolist() if hasattr(found, "tolist") else found)


def _scalar(value: Any) -> Any:
    return getattr(value, "data", value)


def _task_key(prompt: dict[str, Any]) -> str:
    """A group's task across steps (verl's uid is new every step): pack/task."""
    raw = prompt.get("extra_info")
    if raw is None:
        return str(prompt["uid"])
    info = _info(raw)
    return f"{info.pack}/{info.task_id}"


def _reward_of(outputs: list[Any]) -> float:
    score = outputs[-1].reward_score
    if score is None:
        raise RLError("an agent-worlds rollout came back without its reward")
    return float(score)


def _info(raw: Any) -> RowInfo:
    return msgspec.convert(dict(raw), RowInfo)


def _outcome_info(outcome: GroupOutcome) -> dict[str, Any]:
    return {"task": outcome.task_id, "status": outcome.status, "launched": outcome.launched,
            "cancelled": outcome.cancelled, "completed": outcome.completed,
            "kappa": outcome.kappa_after}


__all__ = ["WorldAgentLoopManager", "WorldAgentLoopWorker", "kappa_book", "save_kappa"]
