"""One rollout: a fresh instance of the task's world, an agent working it, the verifier's
verdict on (W0, W, answer), and the episode saved to the world store."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import msgspec

from gates.agents import Agent, parse_agent_spec, scripted
from gates.contract import Interface, Rollout, Verdict
from gates.errors import TaskError
from gates.task import SPEC_FILE, Task
from gates.verifier import run_verifier
from replay.engine import Worlds
from worldenv.core.episode import Episode, GuiCall, ShellCall, ToolCall, apply_effects
from worldenv.instances.episodes import load_episode, save_episode
from worldenv.instances.instance import Environment, Instance
from worldstore.canonical import digest_of
from worldstore.errors import ConfigError, InputError
from worldstore.store import DayRecord

if TYPE_CHECKING:
    from gates.llm_agent import Sampling


def run_rollout(env: Environment, task: Task, agent: Agent, *, hinted: bool,
                index: int = 0) -> Rollout:
    """Run `agent` on a fresh instance of the task's world and grade the result. The
    world is settled (and hashed) once, at the end: the stored episode, the rollout and
    the verifier share that hash and the instance's own snapshot as W0."""
    with open_task_instance(env, task) as instance:
        trajectory = agent.run(instance, task, hinted=hinted)
        instance.episode = msgspec.structs.replace(instance.episode, answer=trajectory.answer,
                                                   task=task.task_id, agent=agent.name)
        final_hash = instance.settle()
        episode_id = save_episode(env.worlds, instance)
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
    """V(W0, W, a): W0 the snapshot the instance was opened on (pinned while it is open),
    which must be the task's world, W the instance settled now."""
    world = instance.record.world_hash
    if world != task.spec.world_hash:
        raise TaskError(f"the instance is of world {world}, the task starts from "
                        f"{task.spec.world_hash}", file=str(task.path / SPEC_FILE),
                        field="world_hash")
    instance.settle()  # W whole on disk: connections closed, every lazy part copied
    return run_verifier(task.verifier_dir, instance.mount.snapshot, instance.mount.path,
                        answer, scratch=env.worlds.cache.tmp)


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


def verify_episode_of_task(worlds: Worlds, task: Task, episode_id: str, *,
                           answer: str | None = None) -> Verdict:
    """V(W0, W, a) of a stored episode of `task`: W is the world its effects lead to, `a`
    its recorded answer unless `answer` is given."""
    episode = load_episode(worlds, episode_id)
    with episode_worlds(worlds, task, episode) as (w0, w):
        return run_verifier(task.verifier_dir, w0, w,
                            answer if answer is not None else episode.answer,
                            scratch=worlds.cache.tmp)


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
    result (mcp), a shell command that exited 0 (shell), a GUI action that was not an
    error result (gui)."""
    used: set[Interface] = set()
    for event in episode.events:
        if isinstance(event, ToolCall) and not event.is_error:
            used.add("mcp")
        elif isinstance(event, ShellCall) and event.exit_code == 0:
            used.add("shell")
        elif isinstance(event, GuiCall) and not event.is_error:
            used.add("gui")
    return sorted(used)


# The agent spec of `task check` that means the default scripted rollouts below.
SCRIPTED_SET_SPEC = "scripted"

# (agent, hinted) of the default scripted rollouts: three unhinted (the difficulty gate's
# live test) and three hinted, as the papers' six; only the reference should succeed on a
# good task, and each degraded agent is a trap for a bad verifier.
SCRIPTED_SET: tuple[tuple[str, bool], ...] = (
    ("reference", False), ("first-half", False), ("shortcut", False),
    ("reference", True), ("first-half", True), ("answer-only", True),
)


def scripted_rollouts(env: Environment, task: Task) -> list[Rollout]:
    """The six default scripted rollouts of a task (no model needed); none for a task
    without a reference solution, which the scripted agents replay."""
    if task.lacks("solution"):
        return []
    return [run_rollout(env, task, scripted(name), hinted=hinted, index=i)
            for i, (name, hinted) in enumerate(SCRIPTED_SET)]


def agent_rollouts(env: Environment, task: Task, agent: Agent, *, n: int, hinted: int,
                   done: Callable[[Rollout], None] | None = None) -> list[Rollout]:
    """`n` rollouts of one agent, the last `hinted` of them with the hint; `done` is told
    of each as it finishes."""
    check_hinted(n, hinted)
    rollouts = []
    for i in range(n):
        rollouts.append(run_rollout(env, task, agent, hinted=i >= n - hinted, index=i))
        if done is not None:
            done(rollouts[-1])
    return rollouts


def check_hinted(n: int, hinted: int) -> None:
    """Refuse a number of hinted rollouts that is not between 0 and the number `n` of
    rollouts (which must be at least 1)."""
    if n < 1:
        raise ConfigError(f"the number of rollouts n = {n} must be at least 1")
    if not 0 <= hinted <= n:
        raise ConfigError(f"hinted = {hinted} rollouts: must be between 0 and the number of "
                          f"rollouts n = {n}")


@dataclass(frozen=True)
class AgentOptions:
    """How an LLM agent runs (``gates.llm_agent.LLMAgent``'s settings; a scripted agent
    has none): its step limit, its window of recent steps (None: all), AWM's meta mode or
    tools mode, sampling (None: the default), compaction (0: never) and the model server
    (None: the environment's). The agent is named by its spec."""

    max_steps: int = 20
    window: int | None = 10
    mode: Literal["tools", "meta"] = "tools"
    sampling: Sampling | None = None
    compact_at: int = 0
    api_base: str | None = None


def make_agent(spec: str, options: AgentOptions = AgentOptions()) -> Agent:
    """The agent an agent spec names: ``scripted:NAME`` or ``llm:MODEL`` (see
    ``gates.agents.parse_agent_spec``); an LLM agent gets the client the environment
    configures (``WORLDCTL_LLM_*``) with that model, and `options`."""
    parsed = parse_agent_spec(spec)
    if parsed.kind == "scripted":
        return scripted(parsed.name)
    from gates.llm_agent import LLMAgent  # loads the LLM client only for an LLM agent
    from gates.llm_agent import Sampling as Default
    from worldllm.client import client_from_env

    client = client_from_env(model=parsed.name)
    if options.api_base:
        client.api_base = options.api_base
    return LLMAgent(client, window=options.window, max_steps=options.max_steps, name=spec,
                    mode=options.mode, sampling=options.sampling or Default(),
                    compact_at=options.compact_at)


def load_rollouts(path: Path) -> list[Rollout]:
    """Rollouts written by ``worldctl rollout --out`` (a JSON list); InputError naming the
    file if it is not one."""
    try:
        return msgspec.json.decode(path.read_bytes(), type=list[Rollout])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InputError(f"not a list of rollouts: {exc}", file=str(path)) from None


def rollout_source(env: Environment, *, given: Sequence[Rollout] | None = None,
                   agent: str = SCRIPTED_SET_SPEC, n: int = 6, hinted: int = 3
                   ) -> Callable[[Task], list[Rollout]]:
    """Where `task check` gets a task's rollouts: the `given` ones (those of the task), else
    the six default scripted rollouts (`agent` "scripted"), else `n` fresh rollouts of the
    agent `agent` names, the last `hinted` of them hinted. A bad agent spec or hinted
    count is refused here, before any gate runs."""
    if given is not None:
        kept = list(given)
        return lambda task: [r for r in kept if r.task_id == task.task_id]
    if agent == SCRIPTED_SET_SPEC:
        return lambda task: scripted_rollouts(env, task)
    check_hinted(n, hinted)
    chosen = make_agent(agent)
    return lambda task: agent_rollouts(env, task, chosen, n=n, hinted=hinted)


def verifier_reward(env: Environment, task: Task) -> Callable[[Instance, str], float]:
    """A reward function for ``worldenv.serving.gym.WorldEnv``: WildAWM's reward of the task's
    verifier
    on the instance's final world and the answer (a verifier error raises RewardError)."""
    from gates.rewards import wildawm_reward

    def reward(instance: Instance, answer: str) -> float:
        verdict = grade(env, task, instance, answer)
        return wildawm_reward(False, verdict)

    return reward
