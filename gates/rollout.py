"""One rollout: a fresh instance of the task's world, an agent working it, the verifier's
verdict on (W0, W, answer), and the episode saved to the world store."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec

from envs.episode import Episode, ShellCall, ToolCall, apply_effects
from envs.episodes_store import save_episode
from envs.instance import Environment, Instance
from gates.agents import Agent, scripted
from gates.contract import Interface, Rollout, Verdict
from gates.task import SPEC_FILE, Task
from gates.verifier import run_verifier
from replay.engine import Worlds
from worldstore.canonical import digest_of
from worldstore.errors import TaskError
from worldstore.store import DayRecord


def run_rollout(env: Environment, task: Task, agent: Agent, *, hinted: bool,
                index: int = 0) -> Rollout:
    """Run `agent` on a fresh instance of the task's world and grade the result."""
    with open_task_instance(env, task) as instance:
        trajectory = agent.run(instance, task, hinted=hinted)
        instance.episode = msgspec.structs.replace(instance.episode, answer=trajectory.answer)
        episode_id = save_episode(env.worlds, instance)
        final_hash = instance.hash()
        verdict = grade(env, task, instance, trajectory.answer)
        used = interfaces_used(instance.episode)
    return Rollout(
        rollout_id=digest_of([task.task_id, agent.name, hinted, index, episode_id]),
        task_id=task.task_id, agent=agent.name, hinted=hinted, episode_id=episode_id,
        final_hash=final_hash, interfaces_used=used, trajectory=trajectory, verdict=verdict)


def open_task_instance(env: Environment, task: Task) -> Instance:
    """An instance of the task's world; refuses a world whose hash is not the task's."""
    _task_record(env.worlds, task)
    return env.open(task.spec.world_hash)


def grade(env: Environment, task: Task, instance: Instance, answer: str | None) -> Verdict:
    """V(W0, W, a) with W0 the task's snapshot and W the instance as it is now."""
    instance.hash()  # closes the instance's connections and copies every part: W is whole
    return run_verifier(task.verifier_dir, task_w0(env.worlds, task), instance.mount.path,
                        answer)


@contextlib.contextmanager
def episode_worlds(worlds: Worlds, task: Task, episode: Episode
                   ) -> Iterator[tuple[Path, Path]]:
    """(W0, W) of a stored episode of `task`: the task's snapshot (read-only, shared) and a
    scratch mount of it with the episode's effects replayed, removed afterwards. Refuses an
    episode that did not start from the task's world."""
    if episode.world_hash != task.spec.world_hash:
        raise TaskError(f"episode {episode.episode_id} starts from world "
                        f"{episode.world_hash}, the task from {task.spec.world_hash}",
                        file=str(task.path / SPEC_FILE), field="world_hash")
    w0 = task_w0(worlds, task)
    with worlds.mount(episode.world_hash) as mount:
        apply_effects(mount, episode.events)
        mount.hash()  # settles journals and copies every lazy part: W is whole on disk
        yield w0, mount.path


def task_w0(worlds: Worlds, task: Task) -> Path:
    """The task's start world W0 (a read-only cached snapshot); refuses a store where the
    task's persona@day is not the world the task was written for."""
    record = _task_record(worlds, task)
    return worlds.snapshot(record.persona, record.day)


def _task_record(worlds: Worlds, task: Task) -> DayRecord:
    record = worlds.resolve(task.spec.world)
    if record.world_hash != task.spec.world_hash:
        raise TaskError(
            f"{task.spec.world} has world hash {record.world_hash} in this store, not "
            f"{task.spec.world_hash}: the task was written for another world",
            file=str(task.path / SPEC_FILE), field="world_hash")
    return record


def interfaces_used(episode: Episode) -> list[Interface]:
    """The interfaces the episode used successfully: a tool call that was not an error
    result (mcp), a shell command that exited 0 (shell)."""
    used: set[Interface] = set()
    for event in episode.events:
        if isinstance(event, ToolCall) and not event.is_error:
            used.add("mcp")
        elif isinstance(event, ShellCall) and event.exit_code == 0:
            used.add("shell")
    return sorted(used)


# (agent, hinted) of the default scripted rollouts: three unhinted (the difficulty gate's
# live test) and three hinted, as the papers' six; only the reference should succeed on a
# good task, and each degraded agent is a trap for a bad verifier.
SCRIPTED_SET: tuple[tuple[str, bool], ...] = (
    ("reference", False), ("first-half", False), ("shortcut", False),
    ("reference", True), ("first-half", True), ("answer-only", True),
)


def scripted_rollouts(env: Environment, task: Task) -> list[Rollout]:
    """The six default scripted rollouts of a task (no model needed)."""
    return [run_rollout(env, task, scripted(name), hinted=hinted, index=i)
            for i, (name, hinted) in enumerate(SCRIPTED_SET)]


def agent_rollouts(env: Environment, task: Task, agent: Agent, *, n: int, hinted: int
                   ) -> list[Rollout]:
    """`n` rollouts of one agent, the last `hinted` of them with the hint."""
    if not 0 <= hinted <= n:
        raise ValueError(f"--hinted {hinted} must be between 0 and -n {n}")
    return [run_rollout(env, task, agent, hinted=i >= n - hinted, index=i) for i in range(n)]


def verifier_reward(env: Environment, task: Task) -> Callable[[Instance, str], float]:
    """A reward function for ``envs.gym.WorldEnv``: WildAWM's reward of the task's verifier
    on the instance's final world and the answer (a verifier error raises RewardError)."""
    from gates.rewards import wildawm_reward

    def reward(instance: Instance, answer: str) -> float:
        verdict = grade(env, task, instance, answer)
        return wildawm_reward(False, verdict)

    return reward
