"""WildAWM's adaptive rollouts (rl/scheduler.py): the decisions of methods.md section 6 on
table-driven groups, its worked example over two training steps, cancellation that really
happens, outcomes that do not depend on completion order, and kappa's state on disk."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import TypeVar

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gates.errors import RewardError
from rl.advantages import pick_group
from rl.scheduler import AdaptiveRollouts, GroupOutcome, KappaState
from worldstore.errors import InputError

T = TypeVar("T")


@dataclass(frozen=True)
class Rollout:
    index: int
    reward: float


def reward_of(rollout: Rollout) -> float:
    return rollout.reward


class Failure(Exception):
    """An infrastructure failure the fake launch raises."""


@dataclass
class Rollouts:
    """Fake rollouts of one task: rollout i yields to the loop ``yields[i]`` times, then
    waits for its gate when ``i`` is held, then returns ``rewards[i]`` (or raises when
    ``i`` is in ``fail``). Everything that happens is logged in order."""

    rewards: Sequence[float]
    held: Collection[int] = ()
    yields: Sequence[int] = ()
    fail: Collection[int] = ()
    log: list[tuple[str, int]] = field(default_factory=list)
    gates: dict[int, asyncio.Event] = field(default_factory=dict)

    def gate(self, index: int) -> asyncio.Event:
        return self.gates.setdefault(index, asyncio.Event())

    async def launch(self, index: int) -> Rollout:
        self.log.append(("start", index))
        try:
            for _ in range(self.yields[index] if self.yields else 0):
                await asyncio.sleep(0)
            if index in self.held:
                await self.gate(index).wait()
            if index in self.fail:
                raise Failure(f"rollout {index}'s sandbox died")
        except asyncio.CancelledError:
            self.log.append(("cancelled", index))
            raise
        self.log.append(("finish", index))
        return Rollout(index, self.rewards[index])

    def indices(self, event: str) -> list[int]:
        return sorted(i for e, i in self.log if e == event)


def run(coroutine: Awaitable[T]) -> T:
    async def main() -> T:
        return await coroutine
    return asyncio.run(main())


def play(rollouts: Rollouts, kappa: Fraction = Fraction(1), sizes: Mapping[str, int] = {}
         ) -> tuple[GroupOutcome, list[Rollout | None], KappaState]:
    state = KappaState()
    state.set("t", kappa)
    outcome, results = run(AdaptiveRollouts(state, **sizes).run_group(
        "t", rollouts.launch, reward_of))
    return outcome, results, state


# --- decisions -------------------------------------------------------------------------------

# (case, rewards in launch order, sizes, (status, K, launched, kappa after))
DECISIONS: list[tuple[str, list[float], dict[str, int], tuple[str, int, int, str]]] = [
    ("mastered at base", [1, 1, 1, 1], {}, ("mastered", 4, 4, "1")),
    ("ready at base", [0, 1, 0, 0], {}, ("ready", 4, 4, "1")),
    ("a format failure among zeros is ready", [-1, 0, 0, 0], {}, ("ready", 4, 4, "1")),
    ("all format failures are ready", [-1, -1, -1, -1], {}, ("ready", 4, 4, "1")),
    ("three successes are not mastered", [1, 1, 1, 0.5], {}, ("ready", 4, 4, "1")),
    ("pending, a block, then ready", [0] * 11 + [0.5], {}, ("ready", 12, 12, "13/5")),
    ("pending to exhausted at 12", [0.3] * 12, {}, ("exhausted", 12, 12, "3")),
    ("two blocks of two", [0, 0, 0, 0, 0, 1], {"group_size": 2, "block": 2},
     ("ready", 6, 6, "13/5")),
    ("the last block is cut at kappa_max * G", [0.0] * 11 + [1.0], {"block": 3},
     ("ready", 12, 12, "13/5")),
    ("a one-rollout group is mastered by one success", [1], {"group_size": 1},
     ("mastered", 1, 1, "1")),
]


@pytest.mark.parametrize(("rewards", "sizes", "expected"), [c[1:] for c in DECISIONS],
                         ids=[c[0] for c in DECISIONS])
def test_decisions(rewards: list[float], sizes: dict[str, int],
                   expected: tuple[str, int, int, str]) -> None:
    rollouts = Rollouts(rewards)
    outcome, results, state = play(rollouts, sizes=sizes)
    status, completed, launched, kappa = expected
    assert (outcome.status, outcome.completed, outcome.launched, outcome.kappa_after) == \
        expected
    assert outcome.keep is (status == "ready")
    assert outcome.rewards == rewards[:completed]
    group = sizes.get("group_size", 4)
    assert outcome.picked == (pick_group(rewards[:completed], group) if outcome.keep else [])
    assert (outcome.cancelled, outcome.kappa_before) == (0, "1")
    assert results == [Rollout(i, r) for i, r in enumerate(rewards[:launched])]
    assert state.get("t") == Fraction(kappa)
    assert rollouts.indices("start") == list(range(launched))


def test_a_block_is_launched_only_once_the_group_is_pending() -> None:
    rollouts = Rollouts([0] * 11 + [1])
    play(rollouts)
    first_block = rollouts.log.index(("start", 4))
    assert sorted(i for e, i in rollouts.log[:first_block] if e == "finish") == [0, 1, 2, 3]


# --- the worked example ----------------------------------------------------------------------


def test_the_papers_worked_example_over_two_training_steps(tmp_path: Path) -> None:
    state = KappaState()
    # Step 1: kappa = 1, 4 zeros -> a block of 8; one reaches 1, one 0.05 -> ready, K = 12.
    step1 = Rollouts([0, 0, 0, 0, 0, 1, 0, 0.05, 0, 0, 0, 0])
    outcome, results = run(AdaptiveRollouts(state).run_group("t", step1.launch, reward_of))
    assert (outcome.status, outcome.completed, outcome.launched) == ("ready", 12, 12)
    assert (outcome.kappa_before, outcome.kappa_after) == ("1", "13/5")
    assert outcome.picked == [0, 1, 5, 7]  # the two lowest (ties by launch), the two highest
    assert float(state.get("t")) == 2.6

    # Between steps the trainer restarts: the state goes to disk and back.
    state.save(tmp_path / "kappa.json")
    state = KappaState.load(tmp_path / "kappa.json")

    # Step 2: kappa = 2.6 -> 12 at once; the first 4 already differ -> the other 8 cancelled.
    step2 = Rollouts([0, 1, 0, 0] + [1] * 8, held=range(4, 12), yields=[1] * 12)
    outcome, results = run(AdaptiveRollouts(state).run_group("t", step2.launch, reward_of))
    assert step2.log[:12] == [("start", i) for i in range(12)]  # all launched at once
    assert (outcome.status, outcome.completed, outcome.launched, outcome.cancelled) == \
        ("ready", 4, 12, 8)
    assert step2.indices("cancelled") == list(range(4, 12))
    assert results[4:] == [None] * 8
    assert (outcome.kappa_before, outcome.kappa_after) == ("13/5", "33/25")
    assert float(state.get("t")) == 1.32 == 0.2 * 2.6 + 0.8 * 1
    assert KappaState.load(tmp_path / "kappa.json").get("t") == Fraction(13, 5)  # not saved


# --- cancellation and failures ----------------------------------------------------------------


def test_the_decision_waits_for_the_first_rollouts_in_launch_order() -> None:
    """Rollouts 4..11 finish first; the decision still reads 0..3 and discards the rest."""
    rollouts = Rollouts([0, 1, 0, 0] + [1] * 8, held=range(12))

    async def main() -> tuple[GroupOutcome, list[Rollout | None]]:
        group = asyncio.create_task(AdaptiveRollouts(KappaState({"t": "3"})).run_group(
            "t", rollouts.launch, reward_of))
        await asyncio.sleep(0)
        for i in range(4, 12):
            rollouts.gate(i).set()
        for _ in range(5):
            await asyncio.sleep(0)
        assert rollouts.indices("finish") == list(range(4, 12))
        assert not group.done()
        for i in range(4):
            rollouts.gate(i).set()
        return await group

    outcome, results = run(main())
    assert (outcome.status, outcome.completed, outcome.cancelled) == ("ready", 4, 8)
    assert results == [Rollout(i, r) for i, r in enumerate([0, 1, 0, 0])] + [None] * 8
    assert rollouts.indices("cancelled") == []


def test_a_failed_launch_cancels_the_rest_and_propagates() -> None:
    rollouts = Rollouts([0] * 12, held=range(4, 12), fail={2})
    state = KappaState({"t": "3"})
    with pytest.raises(Failure, match="rollout 2"):
        run(AdaptiveRollouts(state).run_group("t", rollouts.launch, reward_of))
    assert rollouts.indices("cancelled") == list(range(4, 12))
    assert state.kappa == {"t": "3"}


def test_a_failure_in_a_discarded_rollout_does_not_change_the_outcome() -> None:
    rollouts = Rollouts([0, 1, 0, 0] + [0] * 8, fail={7})
    outcome, _, state = play(rollouts, Fraction(3))
    assert (outcome.status, outcome.completed) == ("ready", 4)
    assert state.get("t") == Fraction(1, 5) * 3 + Fraction(4, 5)


def test_a_reward_that_is_no_reward_cancels_the_rest_and_propagates() -> None:
    rollouts = Rollouts([0, 1.5, 0, 0] + [0] * 8, held=range(4, 12))
    with pytest.raises(RewardError, match=r"reward 1 is 1\.5"):
        play(rollouts, Fraction(3))
    assert rollouts.indices("cancelled") == list(range(4, 12))


def test_cancelling_the_caller_cancels_every_rollout() -> None:
    rollouts = Rollouts([0] * 4, held=range(4))
    state = KappaState()

    async def main() -> None:
        group = asyncio.create_task(AdaptiveRollouts(state).run_group(
            "t", rollouts.launch, reward_of))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        group.cancel()
        with pytest.raises(asyncio.CancelledError):
            await group

    run(main())
    assert rollouts.indices("cancelled") == [0, 1, 2, 3]
    assert state.kappa == {}


# --- completion order -------------------------------------------------------------------------

REWARDS = st.sampled_from([0.0, 0.05, 0.5, 1.0, -1.0])


@given(rewards=st.lists(REWARDS, min_size=12, max_size=12),
       yields=st.lists(st.integers(0, 8), min_size=12, max_size=12),
       kappa=st.sampled_from([Fraction(1), Fraction(2), Fraction(13, 5), Fraction(3)]))
def test_completion_order_does_not_change_the_outcome(
        rewards: list[float], yields: list[int], kappa: Fraction) -> None:
    in_order, in_order_results, in_order_state = play(Rollouts(rewards), kappa)
    shuffled, shuffled_results, shuffled_state = play(Rollouts(rewards, yields=yields), kappa)
    assert shuffled == in_order
    assert shuffled_results == in_order_results
    assert shuffled_state.to_json() == in_order_state.to_json()


# --- several groups ---------------------------------------------------------------------------


def test_groups_run_concurrently_and_come_back_in_order() -> None:
    fast, slow = Rollouts([1, 1, 1, 1]), Rollouts([0] * 11 + [1], yields=[3] * 12)
    state = KappaState()
    played = run(AdaptiveRollouts(state).run_groups(
        [("slow", slow.launch), ("fast", fast.launch)], reward_of))
    assert [(o.task_id, o.status) for o, _ in played] == [("slow", "ready"), ("fast", "mastered")]
    assert state.to_json() == b'{"kappa":{"fast":"1","slow":"13/5"}}'


def test_a_failed_group_cancels_the_others_and_updates_no_kappa() -> None:
    decided = Rollouts([0, 1, 0, 0])
    failing = Rollouts([0] * 4, yields=[10, 0, 0, 0], fail={0})
    waiting = Rollouts([0] * 4, held=range(4))
    state = KappaState()
    with pytest.raises(Failure):
        run(AdaptiveRollouts(state).run_groups(
            [("decided", decided.launch), ("failing", failing.launch),
             ("waiting", waiting.launch)], reward_of))
    assert decided.indices("finish") == [0, 1, 2, 3]  # decided before the failure...
    assert waiting.indices("cancelled") == [0, 1, 2, 3]
    assert state.kappa == {}  # ...but a failed step counts for no task: it is rerun whole


@pytest.mark.parametrize("concurrent", [False, True], ids=["in one call", "in two calls"])
def test_a_task_runs_one_group_at_a_time(concurrent: bool) -> None:
    rollouts = Rollouts([0, 1, 0, 0], held=range(4))
    scheduler = AdaptiveRollouts(KappaState())

    async def main() -> None:
        if not concurrent:
            await scheduler.run_groups([("t", rollouts.launch), ("t", rollouts.launch)],
                                       reward_of)
        first = asyncio.create_task(scheduler.run_group("t", rollouts.launch, reward_of))
        for _ in range(3):
            await asyncio.sleep(0)
        try:
            await scheduler.run_group("t", rollouts.launch, reward_of)
        finally:
            first.cancel()

    with pytest.raises(RewardError, match=r"\['t'\] would run two groups at once"):
        run(main())
    assert rollouts.indices("start") == ([0, 1, 2, 3] if concurrent else [])


@pytest.mark.parametrize("sizes", [{"group_size": 0}, {"block": 0}, {"kappa_max": 0}])
def test_sizes_below_one_are_refused(sizes: dict[str, int]) -> None:
    with pytest.raises(RewardError, match="must all be at least 1"):
        AdaptiveRollouts(KappaState(), **sizes)


# --- kappa's state ----------------------------------------------------------------------------

KAPPAS = st.builds(lambda p, q: Fraction(p, q) + 1, st.integers(0, 10**6), st.integers(1, 5**9))


@given(st.dictionaries(st.text(min_size=1, max_size=20), KAPPAS, max_size=8))
def test_state_json_round_trips_byte_for_byte(kappas: dict[str, Fraction]) -> None:
    state = KappaState()
    for task_id, kappa in kappas.items():
        state.set(task_id, kappa)
    data = state.to_json()
    again = KappaState.from_json(data)
    assert again.to_json() == data
    assert {t: again.get(t) for t in kappas} == kappas
    assert list(msgspec.json.decode(data)["kappa"]) == sorted(kappas)


def test_state_on_disk_is_sorted_and_survives_a_restart(tmp_path: Path) -> None:
    state = KappaState()
    state.set("b", Fraction(33, 25))
    state.set("a", Fraction(3))
    path = tmp_path / "kappa.json"
    state.save(path)
    assert path.read_bytes() == b'{"kappa":{"a":"3","b":"33/25"}}'
    KappaState.load(path).save(path)
    assert path.read_bytes() == b'{"kappa":{"a":"3","b":"33/25"}}'
    assert [p.name for p in tmp_path.iterdir()] == ["kappa.json"]
    assert KappaState().get("never seen") == 1


@pytest.mark.parametrize(("data", "message"), [
    (b"{", "kappa state: "),
    (b'{"kappa": {"t": 1.32}}', "Expected `str`"),
    (b'{"kappa": {"t": "1.32"}}', "kappa '1.32' is not a fraction"),
    (b'{"kappa": {"t": "66/50"}}', "kappa '66/50'"),
    (b'{"kappa": {"t": "1/2"}}', "kappa '1/2'"),
    (b'{"kappa": {"t": "1/0"}}', "kappa '1/0'"),
    (b'{"kappa": {"t": "x"}}', r"\(field 'kappa.t'\)"),
    (b'{"kappa": {}, "version": 2}', "unknown field"),
])
def test_a_malformed_state_is_refused(data: bytes, message: str) -> None:
    with pytest.raises(InputError, match=message):
        KappaState.from_json(data)


def test_kappa_below_one_is_refused() -> None:
    with pytest.raises(RewardError, match="never below 1"):
        KappaState().set("t", Fraction(1, 2))

