"""Runs an evaluation: k trials of one agent per task, each on a fresh instance of the
task's world, its episode stored and graded by the task's verifier.

A run folder holds::

    run.json          RunInfo: the agent, k, the tasks... (written when the run starts)
    trials/<id>.json  one finished trial each, written as it finishes (a rename: whole or
                      not at all)
    results.json      everything, with the metrics (``eval.contract``), at the end

A trial's id is the digest of the run's id (everything that decides the trials: agent,
tasks and their world hashes, k, hinted, step and history limits, the protocol), its task
and its number, so a run killed at any point resumes where it stopped: finished trials are read
back, never run again, and a run folder made by another configuration is refused rather
than mixed. A trial file is a claim, not a fact: it is read back only when the store holds
its episode (stored under the id its content gives, of its task, by this agent, from the
task's world) and grading that episode again gives the trial's verdict; any other trial
runs again, so an edited folder cannot report successes the store does not back. The
folder may be someone else's: nothing in it is followed or opened unless it is a regular
file, and every write is a new file renamed into place (``worldstore.folders``).

Trials run ``concurrency`` at a time in threads; a trial that raises (its
instance, sandbox, model or verifier failed) is recorded as lost, never dropped. A lost
trial measured nothing, so running the folder again runs it again (after the key or
endpoint was fixed, say) instead of reading it back.

A run whose every trial was lost to the same error (an LLM agent with no API key, or a
model server that is not there) measured nothing: it is refused with that error
(EvalError) instead of reporting 0 % success, and no results are written; its lost trials
stay in the folder and are run again by the next run with the same ``--out``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import msgspec

from eval.contract import Results, RunInfo, TaskResult, Trial, encode_results
from eval.errors import EvalError
from eval.metrics import compute_metrics
from eval.protocols import protocol
from gates import rollout
from gates.agents import Agent, parse_agent_spec
from gates.contract import AnswerStep, Rollout
from gates.rewards import wildawm_reward
from gates.rollout import open_task_instance, run_rollout, task_w0, verify_episode_of_task
from gates.task import Task, step_interface
from worldenv.instances.episodes import content_id, load_episode
from worldenv.instances.instance import Environment
from worldstore.canonical import digest_of
from worldstore.errors import FolderError, WorldError
from worldstore.folders import (
    FILE,
    check_writable,
    entry_kind,
    list_entries,
    make_dirs,
    read_bytes,
    read_file,
    write_bytes,
)

RUN_FILE, RESULTS_FILE, TRIALS_DIR = "run.json", "results.json", "trials"
_MAX_FILE = 1 << 30  # no run.json or trial file a run writes is larger


@dataclass(frozen=True)
class EvalConfig:
    """What decides a run's trials (and so its id), plus how it is run."""

    agent: str  # scripted:NAME or llm:MODEL
    k: int = 4
    split: str | None = None
    hinted: bool = False
    max_steps: int = 20
    history: int = 10  # the LLM agent's window of recent steps (AWM: 10 at evaluation; 0: all)
    concurrency: int = 1
    api_base: str | None = None
    # a paper's protocol (eval.protocols: mode, sampling, compaction); max_steps and
    # history above are the run's own, the protocol's unless given explicitly
    protocol: str | None = None

    def check(self) -> None:
        spec = parse_agent_spec(self.agent)  # refuses an unknown agent before anything runs
        for name, value in (("k", self.k), ("max-steps", self.max_steps),
                            ("concurrency", self.concurrency)):
            if value < 1:
                raise EvalError(f"--{name} must be at least 1, not {value}")
        if self.history < 0:
            raise EvalError(f"--history must be at least 0 (0: all), not {self.history}")
        protocol(self.protocol)  # refuses an unknown one
        if self.protocol is not None and spec.kind != "llm":
            raise EvalError(f"--protocol {self.protocol} runs an LLM agent the paper's way; "
                            f"{self.agent} is scripted")


class _StoredTrial(msgspec.Struct, forbid_unknown_fields=True):
    run_id: str
    task_id: str
    trial: Trial


class Progress(Protocol):
    """Told how much there is to do, then of every trial as it finishes."""

    def start(self, total: int, done: list[Trial]) -> None: ...

    def advance(self, task_id: str, trial: Trial) -> None: ...


def run_id_of(config: EvalConfig, tasks: Sequence[Task]) -> str:
    parts: list[object] = [config.agent, config.k, config.hinted, config.max_steps,
                           config.history, config.api_base or "",
                           [[t.task_id, t.spec.world_hash] for t in tasks]]
    if config.protocol is not None:  # absent otherwise: earlier runs keep their ids
        chosen = protocol(config.protocol)
        sampling = chosen.sampling
        parts.append([chosen.name, chosen.mode, sampling.temperature, sampling.top_p,
                      sampling.top_k, chosen.compact_at])
    return digest_of(parts)


def run_eval(env: Environment, tasks: Sequence[Task], config: EvalConfig, out: Path, *,
             sources: Sequence[str] = (), progress: Progress | None = None,
             agent: Agent | None = None) -> Results:
    """Run (or resume) the evaluation into `out` and return its results, also written
    to ``out/results.json``. `agent` replaces the one the spec names (tests, benches)."""
    config.check()
    if not tasks:
        raise EvalError("no tasks to evaluate: give task folders or a pack with a split")
    ordered = sorted(tasks, key=lambda t: t.task_id)
    _refuse_repeats(ordered)
    _refuse_replays_without_solution(config, ordered)
    _refuse_interfaces_not_offered(config, ordered)
    _refuse_missing_worlds(env, ordered)
    info = _start(out, config, ordered, sources)
    chosen = agent or configured_agent(config)
    done = _finished(env, out, info.run_id, ordered, chosen.name, config.k)
    _warm(env, ordered)
    todo = [(task, n) for task in ordered for n in range(config.k)
            if (task.task_id, n) not in done]
    if progress is not None:
        progress.start(len(ordered) * config.k, list(done.values()))
    lock = threading.Lock()

    def one(task: Task, n: int) -> None:
        trial = run_trial(env, task, chosen, n, hinted=config.hinted)
        _save_trial(out, info.run_id, task.task_id, trial)
        with lock:
            done[(task.task_id, n)] = trial
            if progress is not None:
                progress.advance(task.task_id, trial)

    with ThreadPoolExecutor(max_workers=config.concurrency) as pool:
        for future in [pool.submit(one, task, n) for task, n in todo]:
            future.result()
    _refuse_all_lost(list(done.values()), out)
    return _write_results(out, info, ordered, done)


def configured_agent(config: EvalConfig) -> Agent:
    """The agent the spec names (``gates.rollout.make_agent``); an LLM agent with the
    run's step and history limits and its protocol's mode, sampling and compaction, on
    the model litellm routes (a provider, or ``hosted_vllm/...`` at ``api_base``)."""
    chosen = protocol(config.protocol)
    return rollout.make_agent(config.agent, rollout.AgentOptions(
        max_steps=config.max_steps, window=config.history or None, mode=chosen.mode,
        sampling=chosen.sampling, compact_at=chosen.compact_at, api_base=config.api_base))


def run_trial(env: Environment, task: Task, agent: Agent, n: int, *, hinted: bool) -> Trial:
    """One graded trial; an infrastructure failure is a lost trial, never an exception."""
    started = time.perf_counter()
    try:
        rollout = run_rollout(env, task, agent, hinted=hinted, index=n)
    except WorldError as exc:
        return _lost(n, f"{type(exc).__name__}: {exc}", time.perf_counter() - started)
    except OSError as exc:  # a sandbox or file-system failure of the host
        return _lost(n, f"{type(exc).__name__}: {exc}", time.perf_counter() - started)
    return trial_of(rollout, n, time.perf_counter() - started)


def trial_of(rollout: Rollout, n: int, seconds: float) -> Trial:
    trajectory, verdict = rollout.trajectory, rollout.verdict
    actions = [step_interface(t.step) for t in trajectory.turns
               if not isinstance(t.step, AnswerStep)]
    format_failure = trajectory.format_error is not None
    measured = not verdict.is_error and bool(verdict.checks)
    reward = wildawm_reward(format_failure, verdict) if measured or format_failure else None
    return Trial(
        trial=n, episode_id=rollout.episode_id, success=rollout.succeeded,
        V=int(verdict.passed), reward=reward, checks=[c.passed for c in verdict.checks],
        steps=len(actions), interfaces_used=list(rollout.interfaces_used),
        actions=[a for a in actions if a is not None],
        termination=trajectory.stopped or "unknown", format_error=format_failure,
        env_error=verdict.is_error, tokens_in=trajectory.tokens_in,
        tokens_out=trajectory.tokens_out, cost=trajectory.cost, seconds=round(seconds, 6),
        error="; ".join(verdict.errors) or None)


def _lost(n: int, why: str, seconds: float) -> Trial:
    return Trial(trial=n, episode_id="", success=False, V=0, reward=None, checks=[],
                 steps=0, interfaces_used=[], actions=[], termination="lost",
                 format_error=False, env_error=True, tokens_in=0, tokens_out=0, cost=None,
                 seconds=round(seconds, 6), error=why[:500])


# --- the run folder ---------------------------------------------------------------------


def _start(out: Path, config: EvalConfig, tasks: Sequence[Task],
           sources: Sequence[str]) -> RunInfo:
    """The run's RunInfo: written now for a new folder; for an existing one, read back
    and refused unless it was made by the same configuration."""
    run_id = run_id_of(config, tasks)
    spec = parse_agent_spec(config.agent)
    path = out / RUN_FILE
    if out.is_symlink() and not out.exists():  # mkdir would fail on it, or make it elsewhere
        raise EvalError(f"--out {out}: a symlink to nothing; give a folder")
    # Every file the run will write is checked first: a link, a folder or a FIFO where
    # one goes refuses the run before it writes anything (worldstore.folders).
    check_writable(out, [RUN_FILE, RESULTS_FILE, f"{TRIALS_DIR}/{run_id}.json"])
    if entry_kind(out, RUN_FILE) is not None:
        found = load_run_info(path)
        if found.run_id != run_id:
            raise EvalError(f"{path}: this folder holds run {found.run_id} of agent "
                            f"{found.agent} (k={found.k}); this configuration is run "
                            f"{run_id}: use another --out")
        return found
    if list_entries(out):
        raise EvalError(f"{out}: not empty and not a run folder (no {RUN_FILE}); use "
                        "another --out")
    info = RunInfo(run_id=run_id, agent=config.agent,
                   model=spec.name if spec.kind == "llm" else None, k=config.k,
                   split=config.split, hinted=config.hinted, max_steps=config.max_steps,
                   history=config.history, concurrency=config.concurrency,
                   tasks_source=list(sources), started=_now(), api_base=config.api_base,
                   protocol=config.protocol)
    out.mkdir(parents=True, exist_ok=True)  # the folder named by --out, as named
    make_dirs(out, TRIALS_DIR)
    write_bytes(out, RUN_FILE, msgspec.json.format(msgspec.json.encode(info, order="sorted"),
                                                   indent=2) + b"\n", durable=True)
    return info


def load_run_info(path: Path) -> RunInfo:
    """A run folder's run.json (never through a link, never a special file)."""
    try:
        return msgspec.json.decode(read_file(path, limit=_MAX_FILE), type=RunInfo)
    except (OSError, FolderError, msgspec.DecodeError) as exc:
        raise EvalError(f"{path}: not a run file ({exc})") from None


def _finished(env: Environment, out: Path, run_id: str, tasks: Sequence[Task],
              agent: str, k: int) -> dict[tuple[str, int], Trial]:
    """The trials a killed run finished (a torn write never exists: see write_bytes),
    but not the lost ones: they measured nothing and are run again. A trial file is only
    a claim: it counts when the store holds its episode, of its task by this agent, from
    the task's world, under the id its content gives, and grading that episode again
    gives the trial's verdict (see _holds); any other is run again."""
    by_id = {t.task_id: t for t in tasks}
    found: dict[tuple[str, int], Trial] = {}
    for name, kind in list_entries(out, TRIALS_DIR):
        if kind != FILE or not name.endswith(".json"):
            continue  # a link or a FIFO planted there is never opened
        try:
            stored = msgspec.json.decode(read_bytes(out, f"{TRIALS_DIR}/{name}",
                                                    limit=_MAX_FILE), type=_StoredTrial)
        except (msgspec.DecodeError, FolderError):
            continue  # torn by a power loss (trial files are not fsynced): run it again
        task = by_id.get(stored.task_id)
        key = (stored.task_id, stored.trial.trial)
        if (stored.run_id != run_id or stored.trial.env_error or task is None
                or stored.trial.trial not in range(k) or key in found
                or name != f"{_trial_name(run_id, stored.task_id, stored.trial.trial)}.json"):
            continue
        if _holds(env, task, agent, stored.trial):
            found[key] = stored.trial
    return found


def _holds(env: Environment, task: Task, agent: str, trial: Trial) -> bool:
    """Whether the store backs a trial read back from a file: its episode is stored under
    the id its content gives, was run by `agent` on `task` from the task's world, and
    grading it again gives the trial's verdict (V, checks, success)."""
    try:
        episode = load_episode(env.worlds, trial.episode_id)
    except WorldError:
        return False
    if (content_id(episode) != trial.episode_id or episode.task != task.task_id
            or episode.agent != agent or episode.world_hash != task.spec.world_hash):
        return False
    try:
        verdict = verify_episode_of_task(env.worlds, task, trial.episode_id)
    except WorldError:
        return False
    return (not verdict.is_error and int(verdict.passed) == trial.V
            and trial.checks == [c.passed for c in verdict.checks]
            and trial.success == (verdict.passed and not trial.format_error))


def _refuse_all_lost(trials: Sequence[Trial], out: Path) -> None:
    """EvalError when every trial of the run was lost to one and the same error: that is
    the configuration's fault (no key, no model server, a verifier that cannot start),
    and a report of 0 % success would read as the agent's. Mixed outcomes are reported."""
    if not trials or not all(t.env_error for t in trials):
        return
    errors = {t.error for t in trials}
    if len(errors) != 1:
        return
    (error,) = errors
    which = ("its one trial was lost" if len(trials) == 1
             else f"all {len(trials)} trials were lost to the same error")
    raise EvalError(f"{which}, so no results were written: {error or 'no error recorded'}; "
                    f"fix it and run again with --out {out} (lost trials are run again)")


def _save_trial(out: Path, run_id: str, task_id: str, trial: Trial) -> None:
    """Written whole or not at all for a killed process (a rename); not fsynced, since a
    trial file is a cache of work: one torn by a power loss is run again."""
    data = msgspec.json.encode(_StoredTrial(run_id, task_id, trial), order="sorted")
    write_bytes(out, f"{TRIALS_DIR}/{_trial_name(run_id, task_id, trial.trial)}.json", data)


def _trial_name(run_id: str, task_id: str, n: int) -> str:
    return digest_of([run_id, task_id, n])


def _write_results(out: Path, info: RunInfo, tasks: Sequence[Task],
                   done: dict[tuple[str, int], Trial]) -> Results:
    results = [TaskResult(task_id=t.task_id, difficulty=t.spec.difficulty,
                          interfaces=list(t.spec.interfaces),
                          trials=[done[(t.task_id, n)] for n in range(info.k)])
               for t in tasks]
    full = Results(run=info, tasks=results, metrics=compute_metrics(results))
    write_bytes(out, RESULTS_FILE, encode_results(full), durable=True)
    return full


def _refuse_repeats(tasks: Sequence[Task]) -> None:
    seen: set[str] = set()
    for task in tasks:
        if task.task_id in seen:
            raise EvalError(f"task {task.task_id!r} is given twice")
        seen.add(task.task_id)


def _refuse_replays_without_solution(config: EvalConfig, tasks: Sequence[Task]) -> None:
    """A scripted agent that replays the reference solution (all but ``nothing``) has
    nothing to play on a task that ships none (an imported AWM task): it would read as
    a failing agent, so the run is refused instead."""
    spec = parse_agent_spec(config.agent)
    if spec.kind != "scripted" or spec.name == "nothing":
        return
    for task in tasks:
        if task.lacks("solution"):
            raise EvalError(f"task {task.task_id!r} has no reference solution (its "
                            f"task.json declares it absent), which {config.agent} replays; "
                            "evaluate it with an LLM agent")


def _refuse_interfaces_not_offered(config: EvalConfig, tasks: Sequence[Task]) -> None:
    """A protocol in AWM's meta-tool mode offers the services' tools only (behind
    list_tools and call_tool): a task that needs the shell or the GUI could never pass,
    and would read as the agent's failure, so the run is refused instead."""
    mode = protocol(config.protocol).mode
    if mode != "meta":
        return
    for task in tasks:
        missing = sorted(set(task.spec.interfaces) - {"mcp"})
        if missing:
            raise EvalError(f"task {task.task_id!r} needs {', '.join(missing)}, which "
                            f"--protocol {config.protocol} (AWM's meta-tool mode: the "
                            "services' tools only) does not offer; evaluate it without "
                            "--protocol or with --protocol wildawm")


def _refuse_missing_worlds(env: Environment, tasks: Sequence[Task]) -> None:
    """Every task's start world must be in the store under the hash the task pins: a
    run whose trials could never start is refused before any runs (not reported as
    thousands of lost trials)."""
    for task in tasks:
        try:
            task_w0(env.worlds, task)
        except WorldError as exc:
            raise EvalError(f"task {task.task_id!r} cannot be run on this store: {exc}; "
                            "import the worlds its pack ships first") from None


def _warm(env: Environment, tasks: Sequence[Task]) -> None:
    """Build each world's snapshot once, before trials open instances of it in parallel;
    a world that cannot open shows as lost trials, not here."""
    for world in sorted({t.spec.world_hash for t in tasks}):
        task = next(t for t in tasks if t.spec.world_hash == world)
        with contextlib.suppress(WorldError), open_task_instance(env, task):
            pass


def _now() -> str:
    # When the run started: a report field, never part of what decides a trial.
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


__all__ = [
    "RESULTS_FILE",
    "RUN_FILE",
    "TRIALS_DIR",
    "EvalConfig",
    "configured_agent",
    "load_run_info",
    "run_eval",
    "run_id_of",
    "run_trial",
    "trial_of",
]
