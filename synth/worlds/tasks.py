"""Task synthesis on persona worlds (methods.md section 5): proposals from a booted world
of ``persona@day``, a diversity gate coordinated through the store, ensemble rollouts, the
five gates with an LLM reviser, and the accepted tasks into the run's pack.

**Slots and rounds.** ``synth tasks`` is given slots (a day and a difficulty each) and a
count: every slot makes ``count`` tasks, one per round, the slots of a round in parallel
(``parallel`` workers). Slot s of round r has the rank ``r * slots + s``.

**Proposal** (``ProposeStage``, self-correcting like every stage): the model reads the
persona, the world at the slot's day (row counts per table, a sample of each table's rows,
the workspace's files, and what an explorer with read-only tools over the booted world
found: ``synth.worlds.explore``, once per day and difficulty), every tool, the difficulty asked
for and the tasks taken already (the pack's accepted tasks of the persona when the command
started, and the slot's own earlier ones), and writes ``CANDIDATES`` candidates, each
with its instruction, ordered subtasks with their interfaces (every task needs both: mcp
and shell), hint, rubric, verifier script and reference solution. A candidate is
executable when its task folder loads, its solution uses both interfaces, and its verifier
passes after the reference solution (whether it already holds at W0 is gate 2's to say).

**The diversity gate** embeds the candidates and keeps, of those whose cosine to every
task taken and to every task *claimed by a lower rank* is under ``DUPLICATE_COSINE``,
the least similar one. Claims live in the store (``worldstore`` claims, under the run's
scope): a rank decides under the store's claim lock, after every lower rank has decided
(it waits for their claims, or their held-back markers), so two workers that would write
the same task never both get it, and which one does is the same in every run and in the
run's offline replay, whatever the timing. A slot whose candidates are all too close to
a claimed task is *held back* for that round.

**The gates** (``gates.quality.check_task``) take the claimed task with six ensemble
rollouts: configurations are the rollout models times agent variants (history window,
step budget, prompting); rollout i uses configuration i mod n, the last three hinted. Gate
1 is the three-tier adjudication (verifier, the code-augmented LLM judge and the agent
judge: ``--judge-model``); up to two revision rounds through ``TaskReviser``, an LLM
stage (``revise``) given the rejected task and the gate's reason. An accepted task goes
into the run's pack (its split from its id); every task's record, accepted or not, goes to
``RUN/tasks/<persona>/<task_id>.json`` for the funnel report (``funnel``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec

from gates.agents import reference_agent
from gates.contract import (
    AnswerStep,
    GateResult,
    Interface,
    Rollout,
    ShellStep,
    Solution,
    Step,
    Subtask,
    TaskSpec,
    ToolStep,
    to_json,
)
from gates.errors import TaskError
from gates.llm_agent import SYSTEM_PROMPT, LLMAgent
from gates.quality import GATES, GateRun, Judges, check_task, failure_detail
from gates.rollout import run_rollout
from gates.task import (
    HINT_FILE,
    RUBRIC_FILE,
    SOLUTION_FILE,
    SPEC_FILE,
    VERIFIER_DIR,
    Task,
    load_task,
)
from replay.engine import Worlds
from replay.layout import service_db
from replay.sqlite import open_readonly, quote_ident
from synth.environments.verifiers import gate_feedback
from synth.errors import SynthError
from synth.stage import Context, Measure, Stage, StageOutcome, encode, run_stage, write_atomically
from synth.worlds.explore import Exploration, explore, findings_block
from synth.worlds.personas import BibleOut
from worldenv.instances.instance import Environment
from worldllm.client import LLMClient
from worldstore.errors import ConflictError, WorldError
from worldstore.store import ClaimRecord, ClaimState

CANDIDATES = 3
DUPLICATE_COSINE = 0.85
ROLLOUTS, HINTED = 6, 3
SAMPLE_ROWS = 3
SHOWN_TABLE_CHARS = 600
WAIT_S = 0.02  # between looks at the store for the lower ranks' decisions
# A lower rank's proposal is model calls (minutes with a slow model, five attempts): its
# worker, in this process, always records a decision, even when it stops, so the limit is
# only for a scope another process shares and left.
WAIT_LIMIT_S = 6 * 3600.0
VERIFIER_SCRIPT = "check.py"
INTERFACES: tuple[Interface, ...] = ("mcp", "shell")
Difficulty = Literal["hard", "medium"]
# Agent variants of the ensemble: (history window, step budget, prompting).
VARIANTS: tuple[tuple[int, int, str], ...] = ((3, 20, "plain"), (10, 30, "plan-first"))
PLAN_FIRST = ("\nBefore your first tool call, write a short numbered plan of the steps the "
              "task needs, then follow it.")


# --- the model's outputs ----------------------------------------------------------------


class SubtaskOut(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    description: str
    interface: Literal["mcp", "shell"]


class StepOut(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    kind: Literal["tool", "shell", "answer"]
    tool: str | None = None
    arguments: dict[str, Any] = {}
    command: str | None = None
    text: str | None = None


class DraftOut(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    instruction: str
    difficulty: Difficulty
    subtasks: list[SubtaskOut]
    hint: str
    rubric: str
    verifier: str
    solution: list[StepOut]


class ProposalsOut(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    tasks: list[DraftOut]


# --- what a job is given ----------------------------------------------------------------


@dataclass(frozen=True)
class Slot:
    day: int
    difficulty: Difficulty


@dataclass(frozen=True)
class AgentConfig:
    """One configuration of the rollout ensemble."""

    model: str
    window: int
    max_steps: int
    prompting: str

    @property
    def name(self) -> str:
        return f"llm:{self.model}/w{self.window}-s{self.max_steps}-{self.prompting}"


def ensemble(models: Sequence[str]) -> list[AgentConfig]:
    """Every model with every agent variant, in that order."""
    return [AgentConfig(m, *v) for m in models for v in VARIANTS]


@dataclass
class TasksJob:
    ctx: Context
    env: Environment
    bible: BibleOut
    slots: list[Slot]
    count: int
    parallel: int
    scope: str  # the claims' scope in the store
    taken: list[str]  # instructions of tasks accepted before (the pack's, this persona's)
    records: Path  # RUN/tasks/<persona>/
    accepted_dir: Path  # the pack's tasks folder
    agents: list[AgentConfig]
    client_for: Callable[[str], LLMClient]
    judges: Judges = field(default_factory=Judges)
    lessons: list[str] = field(default_factory=list)  # from tasks rejected before
    explored: dict[tuple[int, str], Exploration] = field(default_factory=dict)
    _own: dict[int, list[str]] = field(default_factory=dict)  # slot -> claimed instructions
    _lock: threading.Lock = field(default_factory=threading.Lock)


class TaskRecord(msgspec.Struct, frozen=True):
    """What became of one rank: its candidate, the diversity gate's decision, the gates."""

    task_id: str
    persona: str
    day: int
    slot: int
    round: int
    rank: int
    asked: Difficulty
    instruction: str | None
    proposal: str  # "accepted", "kept_best" or "failed" (the proposal stage)
    candidates: int  # executable candidates proposed
    diversity: str  # "claimed", "held_back" or "no_candidate"
    nearest: str | None  # the most similar task taken or claimed, when there was one
    cosine: float | None
    rounds: list[list[dict[str, str]]]  # per gate round: [{"gate", "status", "reason"}]
    revisions: int
    accepted: bool
    difficulty: str | None  # gate 4's label
    tokens: int
    notes: list[str]


# --- the job ------------------------------------------------------------------------------


def synthesize_tasks(job: TasksJob) -> list[TaskRecord]:
    """Every round of every slot (see the module docstring); the records in rank order."""
    vectors = _vectors(job.ctx, job.taken)
    taken = list(zip(job.taken, vectors, strict=True))
    for slot in job.slots:  # once per day and difficulty, before the workers start
        if (slot.day, slot.difficulty) not in job.explored:
            job.explored[slot.day, slot.difficulty] = _explore_for(job, slot)
    records: list[TaskRecord] = []
    for round_no in range(job.count):
        with ThreadPoolExecutor(max_workers=max(1, job.parallel)) as pool:
            records += list(pool.map(functools.partial(_rank, job, round_no, taken=taken),
                                     range(len(job.slots))))
    return records


def _explore_for(job: TasksJob, slot: Slot) -> Exploration:
    worlds, persona = job.env.worlds, job.bible.name
    record = worlds.record(f"{persona}@{slot.day}")
    with worlds.pinned(persona, slot.day) as world:
        return explore(job.ctx, world, record.world_hash,
                       f"propose {slot.difficulty} tasks for an agent on {persona}@{slot.day}"
                       ", each needing the services' tools (mcp) and the workspace (shell)",
                       f"{persona}@{slot.day}")


def _rank(job: TasksJob, round_no: int, slot_no: int, *,
          taken: list[tuple[str, list[float]]]) -> TaskRecord:
    slot = job.slots[slot_no]
    rank = round_no * len(job.slots) + slot_no
    decided = False
    try:
        worlds = job.env.worlds
        record = worlds.record(f"{job.bible.name}@{slot.day}")
        facts = world_text(worlds, job.bible.name, slot.day) + findings_block(
            job.explored.get((slot.day, slot.difficulty)))
        tools = [{"name": t.name, "description": t.description}
                 for t in _tool_infos(job.env, f"{job.bible.name}@{slot.day}")]
        with job._lock:
            own = list(job._own.get(slot_no, []))
        stage = ProposeStage(job.env, job.bible, slot, record.world_hash, facts, tools,
                             [*job.taken, *own], slot_no, len(job.slots), job.lessons)
        outcome = run_stage(job.ctx, stage, f"{job.bible.name}@{slot.day}/r{round_no}-s{slot_no}")
        drafts = _executable(stage, outcome)
        vectors = _vectors(job.ctx, [d.instruction for d in drafts])
        choice = _decide(job, rank, list(zip(drafts, vectors, strict=True)), taken)
        decided = True
        return _gate(job, slot, slot_no, round_no, rank, record.world_hash, outcome,
                     len(drafts), choice)
    finally:
        if not decided:  # the lower ranks' wait must end, whatever stopped this one
            _mark(job, rank, {"state": "failed"})


@dataclass(frozen=True)
class _Choice:
    draft: DraftOut | None
    status: str  # "claimed", "held_back", "no_candidate"
    nearest: str | None
    cosine: float | None


def _decide(job: TasksJob, rank: int, candidates: list[tuple[DraftOut, list[float]]],
            taken: list[tuple[str, list[float]]]) -> _Choice:
    """The diversity gate of one rank, decided in the store after every lower rank."""
    _wait_for_lower(job, rank)
    chosen: list[_Choice] = []

    def decide(found: list[ClaimRecord]) -> tuple[ClaimState, bytes]:
        claimed = [(b["instruction"], b["vector"]) for b in
                   (msgspec.json.decode(c.body) for c in found if _rank_of(c) < rank)
                   if b.get("state") == "claimed"]
        choice = _least_similar(candidates, [*taken, *claimed])
        chosen.append(choice)
        vector = next((v for d, v in candidates if d is choice.draft), None)
        body = {"state": choice.status, "vector": vector,
                "instruction": choice.draft.instruction if choice.draft else None}
        return ("open" if choice.draft else "dropped"), msgspec.json.encode(body)

    job.env.worlds.store.claim(job.scope, _key(rank), f"rank-{rank}", decide)
    return chosen[-1]


def _least_similar(candidates: list[tuple[DraftOut, list[float]]],
                   against: list[tuple[str, list[float]]]) -> _Choice:
    if not candidates:
        return _Choice(None, "no_candidate", None, None)
    scored = []
    for order, (draft, vector) in enumerate(candidates):
        best, nearest = max(((cosine(vector, v), text) for text, v in against),
                            default=(0.0, None))
        scored.append((best, order, draft, nearest))
    scored.sort(key=lambda s: (s[0], s[1]))
    best, _order, draft, nearest = scored[0]
    status = "claimed" if best < DUPLICATE_COSINE else "held_back"
    return _Choice(draft if status == "claimed" else None, status, nearest,
                   round(best, 4) if nearest is not None else None)


def _wait_for_lower(job: TasksJob, rank: int) -> None:
    wanted = {_key(r) for r in range(rank)}
    deadline = time.monotonic() + WAIT_LIMIT_S
    while not wanted <= {c.key for c in job.env.worlds.store.claims(job.scope)}:
        if time.monotonic() > deadline:
            raise SynthError(f"task rank {rank}: the lower ranks did not decide within "
                             f"{WAIT_LIMIT_S:.0f} s (a worker of scope {job.scope} stopped?)")
        time.sleep(WAIT_S)


def _mark(job: TasksJob, rank: int, body: dict[str, Any]) -> None:
    """A rank's decision that claims nothing (stored dropped), unless it decided already."""
    with contextlib.suppress(ConflictError):  # it had decided: that decision stands
        job.env.worlds.store.claim(job.scope, _key(rank), f"rank-{rank}",
                                   lambda _found: ("dropped", msgspec.json.encode(body)))


def _key(rank: int) -> str:
    return f"{rank:08d}"


def _rank_of(claim: ClaimRecord) -> int:
    return int(claim.key) if claim.key.isdigit() else -1


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=False))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0


def _vectors(ctx: Context, texts: Sequence[str]) -> list[list[float]]:
    return ctx.embed(list(texts)).vectors if texts else []


# --- the world as the proposer reads it -------------------------------------------------


def world_text(worlds: Worlds, persona: str, day: int) -> str:
    """What ``persona@day`` holds: per service table its row count and first rows, and the
    workspace's files (deterministic: sorted, cut to bounded sizes)."""
    record = worlds.record(f"{persona}@{day}")
    root = worlds.snapshot(persona, day)
    manifest = worlds.manifest(record)
    lines = [f"The world {persona}@{day} ({record.world_hash}), last event at "
             f"{record.last_ts}."]
    for service in sorted(manifest.services):
        tables = manifest.services[service].tables
        with open_readonly(service_db(root, service)) as conn:
            for table in sorted(tables):
                rows = list(conn.execute(f"SELECT * FROM {quote_ident(table)} LIMIT "
                                         f"{SAMPLE_ROWS}"))
                shown = json.dumps([list(r) for r in rows], default=repr)
                if len(shown) > SHOWN_TABLE_CHARS:
                    shown = shown[:SHOWN_TABLE_CHARS] + " ...]"
                lines.append(f"- {service}.{table}: {tables[table].rows} rows; first: {shown}")
    files = sorted(manifest.files)
    lines.append(f"Workspace files ({len(files)}): " + (", ".join(files[:60]) or "none")
                 + (" ..." if len(files) > 60 else ""))
    return "\n".join(lines)


def _tool_infos(env: Environment, ref: str) -> list[Any]:
    with env.open(ref) as instance:
        return instance.list_tools()


# --- the proposal stage ------------------------------------------------------------------


class ProposeStage(Stage[ProposalsOut]):
    name = "propose"
    threshold = 1.0  # accepted with one executable candidate; a stage of none goes again
    output_type = ProposalsOut
    max_tokens = 12000
    keeps_best = True

    def __init__(self, env: Environment, bible: BibleOut, slot: Slot, world_hash: str,
                 facts: str, tools: list[dict[str, str]], taken: Sequence[str], worker: int,
                 workers: int, lessons: Sequence[str] = ()) -> None:
        self.env = env  # where candidates are tried (not part of the key)
        self.bible, self.slot, self.world_hash = bible, slot, world_hash
        self.facts, self.tools, self.taken = facts, tools, list(taken)
        self.worker, self.workers = worker, workers
        self.lessons = list(lessons)

    def inputs(self) -> Any:
        found = {"persona": self.bible.name, "day": self.slot.day,
                 "difficulty": self.slot.difficulty, "world": self.world_hash,
                 "facts": self.facts, "tools": self.tools, "taken": self.taken,
                 "worker": [self.worker, self.workers], "candidates": CANDIDATES}
        if self.lessons:  # (absent when none: earlier runs' outcomes keep their keys)
            found["lessons"] = self.lessons
        return found

    def request(self) -> str:
        tools = "\n".join(f"- {t['name']}: {t['description']}" for t in self.tools)
        taken = "\n".join(f"- {t}" for t in self.taken) or "- none yet"
        lessons = "".join(f"\n- {lesson}" for lesson in self.lessons)
        return (f"Persona: {self.bible.name}, {self.bible.occupation} "
                f"({self.bible.life_domain}).\n\n{self.facts}\n\nTools:\n{tools}\n\n"
                f"Tasks taken already:\n{taken}\n\n"
                + (f"Lessons from tasks the gates rejected before:{lessons}\n\n"
                   if lessons else "")
                + f"You are worker {self.worker + 1} of "
                f"{self.workers}. Propose {CANDIDATES} {self.slot.difficulty} tasks on "
                f"{self.bible.name}@{self.slot.day}.")

    def execute(self, output: ProposalsOut) -> Measure:
        if not output.tasks:
            return Measure(1.0, ("no task proposed",))
        errors: list[str] = []
        good = []
        for number, draft in enumerate(output.tasks, 1):
            problems = draft_problems(self.env, self.bible.name, self.slot.day,
                                      self.world_hash, draft)
            errors += [f"task {number}: {p}" for p in problems]
            if not problems:
                good.append(number)
        failed = len(output.tasks) - len(good)
        return Measure(failed / len(output.tasks), tuple(errors), {"executable": good})

    def accepts(self, measure: Measure) -> bool:
        return bool(measure.facts.get("executable"))


def _executable(stage: ProposeStage, outcome: StageOutcome) -> list[DraftOut]:
    if outcome.output is None or outcome.chosen is None:
        return []  # (a kept-best attempt has no executable candidate: none is taken)
    chosen = next(a for a in outcome.attempts if a.number == outcome.chosen)
    proposals = stage.decode(outcome.output)
    good = set(chosen.facts.get("executable", []))
    return [d for number, d in enumerate(proposals.tasks, 1) if number in good]


def draft_problems(env: Environment, persona: str, day: int, world_hash: str,
                   draft: DraftOut) -> list[str]:
    """Why a draft is not an executable task: its folder is refused, it does not need
    both interfaces, or its verifier does not pass after its reference solution."""
    used = {s.interface for s in draft.subtasks}
    kinds = {"mcp" if s.kind == "tool" else s.kind for s in draft.solution}
    problems = [f"the subtasks use no {i} step" for i in INTERFACES if i not in used]
    problems += [f"the reference solution has no {i} step" for i in INTERFACES
                 if i not in kinds]
    if problems:
        return problems
    with tempfile.TemporaryDirectory(prefix="synth-draft-") as scratch:
        try:
            task = load_task(write_draft(Path(scratch) / "draft", "draft", persona, day,
                                         world_hash, draft))
        except TaskError as exc:
            return [f"the task folder is refused: {str(exc).replace(scratch, '<task>')}"]
        try:
            rollout = run_rollout(env, task, reference_agent(), hinted=False)
        except WorldError as exc:
            return [f"the reference solution could not be run: {exc}"]
    for turn in rollout.trajectory.turns:
        if turn.is_error:
            problems.append(f"solution step {turn.index + 1} got an error: "
                            f"{turn.observation[:300]}")
    if rollout.verdict.is_error:
        problems += [f"the verifier failed: {e}" for e in rollout.verdict.errors]
    elif not rollout.verdict.passed:
        failing = [c.name for c in rollout.verdict.checks if not c.passed]
        problems.append("checks fail after the reference solution: "
                        + (", ".join(failing) or "no check at all"))
    return problems


def write_draft(dest: Path, task_id: str, persona: str, day: int, world_hash: str,
                draft: DraftOut, source: str = "") -> Path:
    """The task folder (``gates.task``) of a draft."""
    if dest.exists():
        shutil.rmtree(dest)
    (dest / VERIFIER_DIR).mkdir(parents=True)
    spec = TaskSpec(task_id=task_id, instruction=draft.instruction,
                    world=f"{persona}@{day}", world_hash=world_hash,
                    interfaces=list(INTERFACES), difficulty=draft.difficulty,
                    subtasks=[Subtask(description=s.description, interface=s.interface)
                              for s in draft.subtasks], source=source)
    (dest / SPEC_FILE).write_bytes(to_json(spec) + b"\n")
    (dest / VERIFIER_DIR / VERIFIER_SCRIPT).write_text(draft.verifier, encoding="utf-8")
    (dest / RUBRIC_FILE).write_text(draft.rubric.strip() + "\n", encoding="utf-8")
    (dest / HINT_FILE).write_text(draft.hint.strip() + "\n", encoding="utf-8")
    steps = [_step(s) for s in draft.solution]
    (dest / SOLUTION_FILE).write_bytes(to_json(Solution(steps=steps)) + b"\n")
    return dest


def _step(step: StepOut) -> Step:
    if step.kind == "tool":
        return ToolStep(tool=step.tool or "", arguments=dict(step.arguments))
    if step.kind == "shell":
        return ShellStep(command=step.command or "")
    return AnswerStep(text=step.text or "")


# --- the gates --------------------------------------------------------------------------


def task_id_of(persona: str, day: int, instruction: str) -> str:
    return f"{persona}-d{day}-{hashlib.sha256(instruction.encode()).hexdigest()[:8]}"


def _gate(job: TasksJob, slot: Slot, slot_no: int, round_no: int, rank: int, world_hash: str,
          outcome: StageOutcome, candidates: int, choice: _Choice) -> TaskRecord:
    persona = job.bible.name
    draft = choice.draft
    base: dict[str, Any] = {
        "persona": persona, "day": slot.day, "slot": slot_no, "round": round_no,
        "rank": rank, "asked": slot.difficulty, "proposal": outcome.status,
        "candidates": candidates, "diversity": choice.status, "nearest": choice.nearest,
        "cosine": choice.cosine}
    if draft is None:
        record = TaskRecord(task_id=f"{persona}-d{slot.day}-rank{rank}", instruction=None,
                            rounds=[], revisions=0, accepted=False, difficulty=None,
                            tokens=outcome.tokens, notes=[], **base)
        _write_record(job, record)
        return record
    with job._lock:
        job._own.setdefault(slot_no, []).append(draft.instruction)
    task_id = task_id_of(persona, slot.day, draft.instruction)
    source = f"synth: {persona}@{slot.day}, rank {rank}"
    with tempfile.TemporaryDirectory(prefix="synth-task-gates-") as staging:
        reviser = TaskReviser(job, task_id, slot, world_hash, draft, Path(staging), source)
        spent = _Tokens()
        run = GateRun(job.env, lambda task: ensemble_rollouts(job, task, spent),
                      judges=job.judges, reviser=reviser)
        report = check_task(run, reviser.task(draft, 0))
        final = job.accepted_dir / task_id
        if report.accepted:
            write_draft(final, task_id, persona, slot.day, world_hash, reviser.latest, source)
        elif final.exists():
            shutil.rmtree(final)
    job.env.worlds.store.settle(job.scope, _key(rank), "kept")
    record = TaskRecord(
        task_id=task_id, instruction=reviser.latest.instruction,
        rounds=[[{"gate": r.gate, "status": r.status, "reason": r.reason} for r in results]
                for results in report.rounds],
        revisions=len(report.rounds) - 1, accepted=report.accepted,
        difficulty=report.difficulty, tokens=outcome.tokens + reviser.tokens + spent.total,
        notes=list(report.notes), **base)
    _write_record(job, record)
    return record


def _write_record(job: TasksJob, record: TaskRecord) -> None:
    write_atomically(job.records / f"{record.task_id}.json", encode(record))


@dataclass
class _Tokens:
    total: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, n: int) -> None:
        with self._lock:
            self.total += n


def ensemble_rollouts(job: TasksJob, task: Task, spent: _Tokens) -> list[Rollout]:
    """``ROLLOUTS`` rollouts, rollout i by configuration i mod n, the last ``HINTED``
    hinted (the gates read k from the unhinted ones)."""
    rollouts = []
    for index in range(ROLLOUTS):
        config = job.agents[index % len(job.agents)]
        prompt = SYSTEM_PROMPT + (PLAN_FIRST if config.prompting == "plan-first" else "")
        agent = LLMAgent(job.client_for(config.model), window=config.window,
                         max_steps=config.max_steps, name=config.name, system_prompt=prompt)
        rollout = run_rollout(job.env, task, agent, hinted=index >= ROLLOUTS - HINTED,
                              index=index)
        spent.add(rollout.trajectory.tokens_in + rollout.trajectory.tokens_out)
        rollouts.append(rollout)
    return rollouts


class ReviseStage(Stage[DraftOut]):
    name = "revise"
    threshold = 0.0
    output_type = DraftOut
    max_tokens = 8192

    def __init__(self, env: Environment, persona: str, day: int, world_hash: str,
                 rejected: DraftOut, feedback: Sequence[str]) -> None:
        self.env, self.persona, self.day, self.world_hash = env, persona, day, world_hash
        self.rejected, self.feedback = rejected, list(feedback)

    def inputs(self) -> Any:
        return {"persona": self.persona, "day": self.day, "world": self.world_hash,
                "rejected": msgspec.to_builtins(self.rejected), "feedback": self.feedback}

    def request(self) -> str:
        rejected = json.dumps(msgspec.to_builtins(self.rejected), indent=1, sort_keys=True)
        reasons = "\n".join(f"- {f}" for f in self.feedback)
        return (f"The task on {self.persona}@{self.day}:\n{rejected}\n\nThe quality gates "
                f"rejected it:\n{reasons}\n\nWrite the revised task.")

    def execute(self, output: DraftOut) -> Measure:
        problems = draft_problems(self.env, self.persona, self.day, self.world_hash, output)
        return Measure(1.0 if problems else 0.0, tuple(problems))


class TaskReviser:
    """``gates.quality.Reviser`` by an LLM: the failed gate's reason, in words, is the
    feedback of a revision, which must be executable before the gates see it again."""

    def __init__(self, job: TasksJob, task_id: str, slot: Slot, world_hash: str,
                 first: DraftOut, staging: Path, source: str) -> None:
        self.job, self.task_id, self.slot, self.world_hash = job, task_id, slot, world_hash
        self.latest = first
        self.staging, self.source = staging, source
        self.feedback: list[str] = []
        self.tokens = 0

    def task(self, draft: DraftOut, round_no: int) -> Task:
        folder = self.staging / f"{self.task_id}-r{round_no}"
        return load_task(write_draft(folder, self.task_id, self.job.bible.name,
                                     self.slot.day, self.world_hash, draft, self.source))

    def revise(self, task: Task, failure: GateResult, round_no: int) -> Task | None:
        del task  # the rejected version is self.latest
        self.feedback.append(gate_feedback(failure.gate, failure.reason,
                                           failure_detail(failure)))
        stage = ReviseStage(self.job.env, self.job.bible.name, self.slot.day,
                            self.world_hash, self.latest, self.feedback)
        outcome = run_stage(self.job.ctx, stage, f"{self.task_id}/revision-{round_no}")
        self.tokens += outcome.tokens
        if outcome.status != "accepted":
            return None
        self.latest = stage.decode(outcome.output)
        return self.task(self.latest, round_no)


# --- the funnel -------------------------------------------------------------------------


def read_records(folder: Path) -> list[TaskRecord]:
    """Every task record of a run (``RUN/tasks/<persona>/*.json``), by persona and rank."""
    found = sorted(folder.glob("tasks/*/*.json")) if (folder / "tasks").is_dir() else []
    records = [msgspec.json.decode(p.read_bytes(), type=TaskRecord) for p in found]
    return sorted(records, key=lambda r: (r.persona, r.rank))


def funnel(records: Sequence[TaskRecord]) -> dict[str, Any]:
    """WildAWM's funnel over task records: candidates, the diversity gate, then per gate
    the tasks that reached it, passed in the first round, passed after feedback
    (revisions), failed; revisions per gate; tokens per task; acceptance; difficulty."""
    claimed = [r for r in records if r.diversity == "claimed"]
    gates = []
    for gate in GATES:
        reached = [r for r in claimed if _status_in(r, gate, 0) is not None
                   and any(_status_in(r, gate, i) not in (None, "not_run")
                           or "not reached" not in _reason_in(r, gate, i)
                           for i in range(len(r.rounds)))]
        directly = [r for r in reached if _status_in(r, gate, 0) == "passed"]
        later = [r for r in reached if _status_in(r, gate, 0) != "passed"
                 and _status_in(r, gate, len(r.rounds) - 1) == "passed"]
        failed_at = sum(1 for r in reached for i in range(len(r.rounds))
                        if _status_in(r, gate, i) == "failed")
        not_run = [r for r in reached if all(_status_in(r, gate, i) == "not_run"
                                             for i in range(len(r.rounds)))]
        gates.append({"gate": gate, "reached": len(reached), "passed_directly": len(directly),
                      "passed_after_feedback": len(later), "revisions": failed_at,
                      "not_run": len(not_run)})
    accepted = [r for r in claimed if r.accepted]
    tokens = sum(r.tokens for r in records)
    return {"candidates": len(records), "held_back": sum(r.diversity == "held_back"
                                                         for r in records),
            "no_candidate": sum(r.diversity == "no_candidate" for r in records),
            "gated": len(claimed), "gates": gates, "accepted": len(accepted),
            "acceptance_rate": round(len(accepted) / len(claimed), 4) if claimed else None,
            "revisions": sum(r.revisions for r in claimed),
            "tokens": tokens,
            "tokens_per_task": round(tokens / len(records), 1) if records else None,
            "tokens_per_accepted_task": round(tokens / len(accepted), 1) if accepted else None,
            "hard": sum(r.difficulty == "hard" for r in accepted),
            "medium": sum(r.difficulty == "medium" for r in accepted)}


def _status_in(record: TaskRecord, gate: str, round_no: int) -> str | None:
    if round_no >= len(record.rounds):
        return None
    return next((g["status"] for g in record.rounds[round_no] if g["gate"] == gate), None)


def _reason_in(record: TaskRecord, gate: str, round_no: int) -> str:
    if round_no >= len(record.rounds):
        return ""
    return next((g["reason"] for g in record.rounds[round_no] if g["gate"] == gate), "")


__all__ = ["CANDIDATES", "DUPLICATE_COSINE", "AgentConfig", "DraftOut", "ProposalsOut",
           "ProposeStage", "ReviseStage", "Slot", "TaskRecord", "TaskReviser", "TasksJob",
           "cosine", "draft_problems", "ensemble", "ensemble_rollouts", "funnel",
           "read_records", "synthesize_tasks", "task_id_of", "world_text", "write_draft"]
