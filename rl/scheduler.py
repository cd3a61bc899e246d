"""WildAWM's adaptive rollouts (methods.md section 6) as an asyncio orchestrator: how many
rollouts a task's group launches, when it is decided, what is cancelled, and the per-task
kappa that carries over from one training step to the next. No verl here: a rollout is
whatever ``launch(i)`` awaits, a reward whatever ``reward_of`` reads from it.

Per task, kappa starts at 1. A group of size G launches at once

    n = min(kappa_max * G, G + C * (round(kappa) - 1))          (rl.advantages.launch_count)

and is decided on the rewards of its first K rollouts in launch order, at
K = G, G + C, G + 2C, ... up to kappa_max * G (rl.advantages.group_status):

    mastered   all G base rollouts have reward 1          -> dropped, kappa = 1
    ready      >= 2 distinct rewards, or all are -1       -> trained, kappa = 0.2 kappa
                                                              + 0.8 ceil(K / G)
    exhausted  K = kappa_max * G and neither of the above -> dropped, kappa = kappa_max
    pending    otherwise: wait for (launching if need be) the next block of C

Once decided, every outstanding rollout is cancelled. A ready group of K > G is trained on
G of them (rl.advantages.pick_group: both halves of the sorted rewards).

Worked example (G = 4, C = 8, kappa_max = 3): step 1, kappa = 1 launches 4, all reward 0
(pending), a block of 8 more; among the 12 one reaches 1 and one 0.05 -> ready, K = 12,
kappa = 0.2 + 0.8 * 3 = 13/5. Step 2 launches min(12, 4 + 8 * 2) = 12 at once; the first
4 already differ -> ready at K = 4, the other 8 are cancelled, kappa = 0.2 * 13/5 + 0.8 = 33/25.

Determinism: a decision at K reads exactly rollouts 0..K-1 and waits for those, never
"whichever finished first", so the outcome does not depend on completion order. A rollout
past K that happened to finish is discarded like a cancelled one (result None).

Kappa is an exact Fraction, stored as its canonical string ("13/5") in ``KappaState``,
whose JSON (sorted keys) survives training steps and restarts byte for byte.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Generic, Literal, TypeVar

import msgspec

from gates.errors import RewardError
from rl.advantages import (
    BLOCK,
    KAPPA_MAX,
    GroupStatus,
    group_status,
    launch_count,
    next_block,
    pick_group,
    update_kappa,
)
from worldstore.errors import InputError
from worldstore.folders import write_file

R = TypeVar("R")
T = TypeVar("T")
Decided = Literal["mastered", "ready", "exhausted"]


class KappaState(msgspec.Struct, forbid_unknown_fields=True):
    """kappa per task id, each the canonical string of a Fraction >= 1; a task not here
    has kappa 1. Mutable: ``AdaptiveRollouts`` updates it as groups are decided."""

    kappa: dict[str, str] = msgspec.field(default_factory=dict)

    def get(self, task_id: str) -> Fraction:
        text = self.kappa.get(task_id)
        return Fraction(1) if text is None else Fraction(text)

    def set(self, task_id: str, kappa: Fraction) -> None:
        if kappa < 1:
            raise RewardError(f"kappa {kappa} for task {task_id!r}: kappa is never below 1")
        self.kappa[task_id] = str(kappa)

    def to_json(self) -> bytes:
        return msgspec.json.encode(self, order="deterministic")

    @classmethod
    def from_json(cls, data: bytes, *, source: str = "kappa state") -> KappaState:
        try:
            state = msgspec.json.decode(data, type=cls)
        except msgspec.DecodeError as error:  # ValidationError is a DecodeError too
            raise InputError(str(error), file=source) from error
        for task_id, text in state.kappa.items():
            _check_kappa_text(text, source, task_id)
        return state

    def save(self, path: Path) -> None:
        """Write atomically: a crash mid-write leaves the previous state, never half."""
        write_file(path, self.to_json())

    @classmethod
    def load(cls, path: Path) -> KappaState:
        return cls.from_json(path.read_bytes(), source=str(path))


def _check_kappa_text(text: str, source: str, task_id: str) -> None:
    try:
        value = Fraction(text)
    except (ValueError, ZeroDivisionError):
        value = None
    # Only the canonical form, so that loading and saving again gives the same bytes.
    if value is None or str(value) != text or value < 1:
        raise InputError(f"kappa {text!r} is not a fraction >= 1 written like '13/5'",
                         file=source, field=f"kappa.{task_id}")


class GroupOutcome(msgspec.Struct, frozen=True):
    """A task's decided group. ``rewards`` are those of launches 0..K-1, the ones the
    decision read; ``picked`` indexes them: the G to train on (empty when ``keep`` is
    False: mastered and exhausted groups are dropped). ``cancelled`` counts the launches
    past K, whose results are discarded (None) whether or not they had finished."""

    task_id: str
    status: Decided
    rewards: list[float]
    picked: list[int]
    launched: int
    cancelled: int
    kappa_before: str
    kappa_after: str
    keep: bool

    @property
    def completed(self) -> int:
        """K: the rollouts the decision was made on."""
        return len(self.rewards)


Launch = Callable[[int], Awaitable[R]]


class AdaptiveRollouts:
    """Runs tasks' groups with adaptive rollout counts and keeps their kappa in ``state``.

    ``launch(i)`` starts rollout i of a task (an awaitable that completes with the
    rollout); it retries infrastructure failures itself, so anything it raises ends the
    group: the other rollouts are cancelled and the error propagates, kappa unchanged."""

    def __init__(self, state: KappaState, *, group_size: int = 4, block: int = BLOCK,
                 kappa_max: int = KAPPA_MAX) -> None:
        launch_count(Fraction(1), group_size, block=block, kappa_max=kappa_max)  # refuses
        self.state = state
        self.group_size = group_size
        self.block = block
        self.kappa_max = kappa_max
        self._running: set[str] = set()  # two live groups of one task would race on kappa

    async def run_group(self, task_id: str, launch: Launch[R], reward_of: Callable[[R], float]
                        ) -> tuple[GroupOutcome, list[R | None]]:
        """Decide one task's group; results are per launch, None for those discarded."""
        [played] = await self.run_groups([(task_id, launch)], reward_of)
        return played

    async def run_groups(self, groups: Sequence[tuple[str, Launch[R]]],
                         reward_of: Callable[[R], float]
                         ) -> list[tuple[GroupOutcome, list[R | None]]]:
        """Decide several tasks' groups concurrently, in the order given. Kappa is updated
        only once all are decided: a step that fails leaves the state as it was, so the
        caller can rerun the step without counting a group twice."""
        task_ids = [task_id for task_id, _ in groups]
        self._claim(task_ids)
        try:
            played = await _all_or_none([self._play(task_id, launch, reward_of)
                                         for task_id, launch in groups])
        finally:
            self._running.difference_update(task_ids)
        for outcome, _ in played:
            self.state.set(outcome.task_id, Fraction(outcome.kappa_after))
        return played

    def _claim(self, task_ids: Sequence[str]) -> None:
        repeated = sorted({t for t in task_ids if task_ids.count(t) > 1} | (
            self._running & set(task_ids)))
        if repeated:
            raise RewardError(f"task(s) {repeated} would run two groups at once; a task has "
                              "one group per training step")
        self._running.update(task_ids)

    async def _play(self, task_id: str, launch: Launch[R], reward_of: Callable[[R], float]
                    ) -> tuple[GroupOutcome, list[R | None]]:
        kappa = self.state.get(task_id)
        launches = _Launches(task_id, launch)
        try:
            launches.extend(launch_count(kappa, self.group_size, block=self.block,
                                         kappa_max=self.kappa_max))
            rewards, status = await self._decide(launches, reward_of)
            results = launches.results(len(rewards))
        finally:
            await launches.close()
        return self._outcome(task_id, kappa, rewards, status, launches.launched), results

    async def _decide(self, launches: _Launches[R], reward_of: Callable[[R], float]
                      ) -> tuple[list[float], Decided]:
        """Rewards of launches 0..K-1 for the first K (G, G + C, ...) that decides."""
        rewards: list[float] = []
        status: GroupStatus = "pending"
        while status == "pending":
            # Pending implies K < kappa_max * G, so there is always a next block.
            more = next_block(len(rewards), self.group_size, block=self.block,
                              kappa_max=self.kappa_max) if rewards else self.group_size
            want = len(rewards) + more
            launches.extend(want - launches.launched)  # none when already launched at once
            done = await launches.first(want)
            rewards += [reward_of(result) for result in done[len(rewards):]]
            status = group_status(rewards, self.group_size, kappa_max=self.kappa_max)
        return rewards, status

    def _outcome(self, task_id: str, kappa: Fraction, rewards: list[float], status: Decided,
                 launched: int) -> GroupOutcome:
        after = update_kappa(kappa, status, len(rewards), self.group_size,
                             kappa_max=self.kappa_max)
        keep = status == "ready"
        return GroupOutcome(
            task_id=task_id, status=status, rewards=rewards,
            picked=pick_group(rewards, self.group_size) if keep else [],
            launched=launched, cancelled=launched - len(rewards),
            kappa_before=str(kappa), kappa_after=str(after), keep=keep)


class _Launches(Generic[R]):
    """A group's rollouts as asyncio tasks, in launch order."""

    def __init__(self, task_id: str, launch: Launch[R]) -> None:
        self._task_id = task_id
        self._launch = launch
        self._tasks: list[asyncio.Task[R]] = []

    @property
    def launched(self) -> int:
        return len(self._tasks)

    def extend(self, count: int) -> None:
        for _ in range(count):
            index = len(self._tasks)
            self._tasks.append(asyncio.create_task(
                self._run(index), name=f"rollout {index} of {self._task_id}"))

    async def _run(self, index: int) -> R:
        return await self._launch(index)

    async def first(self, count: int) -> list[R]:
        """The results of launches 0..count-1, once all of them are done."""
        return await _wait_all(self._tasks[:count])

    def results(self, count: int) -> list[R | None]:
        kept: list[R | None] = [task.result() for task in self._tasks[:count]]
        return kept + [None] * (len(self._tasks) - count)

    async def close(self) -> None:
        await _cancel(self._tasks)


async def _all_or_none(coroutines: Sequence[Awaitable[T]]) -> list[T]:
    """Run concurrently; on the first failure cancel the rest and raise it."""
    tasks = [asyncio.ensure_future(coroutine) for coroutine in coroutines]
    try:
        return await _wait_all(tasks)
    finally:
        await _cancel(tasks)


async def _wait_all(tasks: Sequence[asyncio.Future[T]]) -> list[T]:
    """All results, or the failure of the earliest-launched task that failed by the time
    one did (without waiting for the others)."""
    if tasks:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            task.result()  # raises it
    return [task.result() for task in tasks]


async def _cancel(tasks: Sequence[asyncio.Future[T]]) -> None:
    for task in tasks:
        task.cancel()  # a no-op on a task that is done
    # Awaiting them is what makes the cancellation real (their finally blocks run) and
    # retrieves their exceptions, so none is reported as never retrieved.
    await asyncio.gather(*tasks, return_exceptions=True)


__all__ = ["AdaptiveRollouts", "GroupOutcome", "KappaState", "Launch"]
