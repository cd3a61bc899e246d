"""Environment synthesis for one scenario, stage after stage, into a world and tasks.

``synthesize_env`` runs, for one scenario: tasks -> schema -> data -> (day 0) -> spec ->
code -> (the world stored) -> a verifier and reference solution per task -> the five
gates per verified task (2-4 with the reference and the scripted rollouts; 1 and 5 with
a judge model). Each stage goes through ``synth.stage.run_stage`` (self-correction,
content-addressed outcomes). A stage whose outcome does not let later stages go on
stops the scenario there, and the result says which stage and why.

Day 0 is made by the AWM import path (``awmbridge.world.plan_day0`` and
``awmbridge.importer.import_day0``): schema and data at the frozen instant ``AWM_DAY0_TS``,
then the app line carrying the generated code; it is stored in the user's store and its
interchange lines are kept in the run (``worlds/<persona>.jsonl``, and in the pack).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from awmbridge.errors import AwmError, ScenarioRefused
from awmbridge.importer import import_day0
from awmbridge.world import AWM_SERVICE, Day0, persona_for
from gates.contract import GateReport, GateResult
from gates.judges import AgentJudge, CodeJudge
from gates.quality import GateRun, Judges, check_task, failure_detail
from gates.rollout import scripted_rollouts
from gates.task import Task, load_task
from replay.engine import Worlds
from synth.environments.appgen import (
    APP_VERSION,
    SMOKE_LIMITS,
    CodeOut,
    CodeStage,
    SpecOut,
    SpecStage,
    app_name,
)
from synth.environments.database import (
    TASKS_PER_SCENARIO,
    DataOut,
    DataStage,
    ScenarioSpec,
    SchemaOut,
    SchemaStage,
    TasksStage,
    day0,
    scenario_files,
    table_columns,
    valid_tasks,
)
from synth.environments.export import render_from_outputs
from synth.environments.verifiers import (
    TaskRef,
    VerifierOut,
    VerifierStage,
    gate_feedback,
    write_task_folder,
)
from synth.prompts import ENV_STAGES
from synth.stage import (
    Context,
    Stage,
    StageOutcome,
    encode,
    run_stage,
    stored_outcome,
    write_atomically,
)
from worldenv.awm.host import AWM_ADAPTER_VERSION, AWM_APP, awm_app_source
from worldenv.instances.instance import Environment
from worldenv.sandbox.workers import WorkerPool
from worldllm.client import LLMClient
from worldstore.errors import WorldError

# What a synthesized world's app carries: the project's app contract (``app``), or the
# same tools rendered as AWM's server code for the AWM adapter (``awm``).
CODE_FORMATS = ("app", "awm")


class StageResult(msgspec.Struct, frozen=True):
    stage: str
    subject: str
    status: str  # accepted, kept_best, failed, not_run
    attempts: int = 0
    error_rate: float | None = None
    tokens: int = 0
    cost: float | None = None
    reason: str = ""


class TaskResult(msgspec.Struct, frozen=True):
    task_id: str
    verified: bool
    gates: list[dict[str, str]] = []  # [{"gate", "status", "reason"}]
    accepted: bool = False
    notes: list[str] = []
    revisions: int = 0  # gate revision rounds (the verifier stage asked again)


class EnvResult(msgspec.Struct, frozen=True):
    """What synthesis made of one scenario."""

    scenario: str
    persona: str
    stopped_at: str | None  # the stage that stopped it, None when it went through
    reason: str
    stages: list[StageResult]
    world_hash: str | None = None
    tools: int = 0
    tasks: list[TaskResult] = []

    @property
    def built(self) -> bool:
        return self.world_hash is not None


@dataclasses.dataclass
class EnvOptions:
    """What shapes one scenario's synthesis (part of the run's configuration)."""

    tasks_per_scenario: int = TASKS_PER_SCENARIO
    only: str | None = None  # run this stage alone (earlier ones must be done)
    judge: LLMClient | None = None  # gates 1 and 5; None: not run
    tasks_dir: Path | None = None  # where accepted task folders go (the run's pack)
    code_format: str = "app"  # CODE_FORMATS: what the world's app carries


class _Stop(Exception):
    """Ends one scenario's chain at a stage (private control flow of this module)."""

    def __init__(self, stage: str, reason: str) -> None:
        self.stage = stage
        self.reason = reason


@dataclasses.dataclass
class _Chain:
    """One scenario's run through the stages, collecting what each did."""

    ctx: Context
    options: EnvOptions
    spec: ScenarioSpec
    persona: str
    run_dir: Path
    stages: list[StageResult] = dataclasses.field(default_factory=list)
    outcomes: list[StageOutcome] = dataclasses.field(default_factory=list)

    def step(self, stage: Stage[Any], subject: str | None = None) -> Any:
        """The stage's output for later stages, or _Stop."""
        subject = subject or self.spec.name
        if self._skipped(stage.name):
            found = stored_outcome(self.ctx, stage)
            if found is None:
                self.stages.append(StageResult(stage.name, subject, "not_run",
                                               reason="not done yet (run without --only)"))
                raise _Stop(stage.name, f"--only {self.options.only}: stage {stage.name} "
                                        "is not done yet")
            return self._use(stage, found, subject)
        self.ctx.progress.expect(stage.name)
        outcome = run_stage(self.ctx, stage, subject)
        self.ctx.progress.done(stage.name, outcome.status == "accepted")
        return self._use(stage, outcome, subject)

    def _skipped(self, name: str) -> bool:
        """With --only, the stages before it are read, never run."""
        only = self.options.only
        return only is not None and ENV_STAGES.index(name) < ENV_STAGES.index(only)

    def _use(self, stage: Stage[Any], outcome: StageOutcome, subject: str) -> Any:
        self.outcomes.append(outcome)
        self.stages.append(StageResult(
            stage.name, subject, outcome.status, len(outcome.attempts), outcome.error_rate,
            outcome.tokens, outcome.cost,
            "" if outcome.status == "accepted" else _last_errors(outcome)))
        if not stage.proceeds(outcome):
            raise _Stop(stage.name, f"{stage.name}: {outcome.status} after "
                                    f"{len(outcome.attempts)} attempts: "
                                    f"{_last_errors(outcome)}")
        return stage.decode(outcome.output)

    def last(self, name: str) -> bool:
        """Whether `name` is the last stage this run does."""
        return self.options.only == name


def _last_errors(outcome: StageOutcome) -> str:
    chosen = next((a for a in outcome.attempts if a.number == outcome.chosen),
                  outcome.attempts[-1] if outcome.attempts else None)
    if chosen is None or not chosen.errors:
        return "no error recorded"
    more = f" (and {len(chosen.errors) - 1} more)" if len(chosen.errors) > 1 else ""
    return chosen.errors[0][:300] + more


def synthesize_env(ctx: Context, spec: ScenarioSpec, open_worlds: Callable[[], Worlds],
                   run_dir: Path, options: EnvOptions) -> EnvResult:
    """One scenario through the stages (see the module docstring)."""
    try:
        persona = persona_for(spec.name)
    except WorldError as exc:
        return EnvResult(spec.name, "", "tasks", str(exc), [])
    chain = _Chain(ctx, options, spec, persona, run_dir)
    world_hash: str | None = None
    tools = 0
    tasks: list[TaskResult] = []
    try:
        task_list = valid_tasks(chain.step(TasksStage(spec, options.tasks_per_scenario)),
                                options.tasks_per_scenario)
        if chain.last("tasks"):
            raise _Stop("", "")
        schema: SchemaOut = chain.step(SchemaStage(spec, task_list, persona))
        if chain.last("schema"):
            raise _Stop("", "")
        data: DataOut = chain.step(DataStage(spec, task_list, schema, persona))
        day = _day0(spec, task_list, schema, data)
        if chain.last("data"):
            raise _Stop("", "")
        ddl = [st.sql for st in day.kept if st.kind != "insert"]
        api: SpecOut = chain.step(SpecStage(spec.name, task_list, ddl, table_columns(day.kept)))
        if chain.last("spec"):
            raise _Stop("", "")
        worlds = open_worlds()
        # One worker pool and one snapshot cache for the code's smoke calls and the world's
        # instances: the accepted code's worker is started once.
        workers = WorkerPool(SMOKE_LIMITS)
        try:
            code: CodeOut = chain.step(CodeStage(spec.name, persona, api, ddl, day.lines(),
                                                 workers=workers, cache=worlds.cache.root))
            with_app = dataclasses.replace(day, app=_app(spec, schema, api, persona, code,
                                                         options.code_format))
            with Environment(worlds, workers=workers) as env:
                world_hash, listed = _store_world(env, spec, task_list, schema, data, with_app,
                                                  run_dir)
                tools = len(listed)
                if chain.last("code"):
                    raise _Stop("", "")
                tasks = _tasks(chain, env, listed, task_list, ddl, world_hash)
        finally:
            workers.close()
            worlds.close()
    except _Stop as stop:
        write_log(run_dir, spec.name, chain.outcomes)
        return EnvResult(spec.name, persona, stop.stage or None, stop.reason, chain.stages,
                         world_hash, tools, tasks)
    write_log(run_dir, spec.name, chain.outcomes)
    return EnvResult(spec.name, persona, None, "", chain.stages, world_hash, tools, tasks)


def _app(spec: ScenarioSpec, schema: SchemaOut, api: SpecOut, persona: str, code: CodeOut,
         code_format: str) -> dict[str, Any]:
    """The world's app line: the accepted code in the project's app contract, or (``awm``)
    rendered as AWM's server code and carried for the AWM adapter, as an imported AWM
    environment's is. The render is deterministic (``awmbridge.export_code``): the model
    wrote and the smoke calls checked the contract's code, and the world serves the same
    tools in AWM's format."""
    if code_format == "app":
        return {"type": "app", "service": AWM_SERVICE, "app": app_name(persona),
                "version": APP_VERSION, "code": code.code}
    try:
        rendered = render_from_outputs(spec.name, spec.description, schema, api, code.code)
    except AwmError as exc:
        raise _Stop("code", f"the code cannot be rendered in AWM's format: {exc}") from None
    return {"type": "app", "service": AWM_SERVICE, "app": AWM_APP,
            "version": AWM_ADAPTER_VERSION, "code": awm_app_source(rendered)}


def _day0(spec: ScenarioSpec, tasks: list[str], schema: SchemaOut, data: DataOut) -> Day0:
    try:
        return day0(spec, tasks, schema, data)
    except ScenarioRefused as refused:
        raise _Stop("data", f"day 0 is refused: {'; '.join(refused.problems)[:500]}") from None


def _store_world(env: Environment, spec: ScenarioSpec, tasks: list[str], schema: SchemaOut,
                 data: DataOut, day: Day0, run_dir: Path
                 ) -> tuple[str, list[dict[str, Any]]]:
    """Store day 0 (with its app) as import-awm would, keep its lines and report in the
    run; the world hash and the tools its instance lists (by bare name, as the verifier
    stage shows them to the model)."""
    scenario = scenario_files(spec, tasks, schema, data)
    try:
        report = import_day0(env.worlds, scenario, day)
    except ScenarioRefused as refused:
        raise _Stop("code", f"the world is refused by the store: "
                            f"{'; '.join(refused.problems)[:500]}") from None
    with env.open(f"{day.persona}@0", bare_names=True) as instance:
        tools = [{"name": t.name, "description": t.description,
                  "input_schema": t.input_schema} for t in instance.list_tools()]
    report = dataclasses.replace(report, tools=len(tools))
    folder = run_dir / "worlds"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{day.persona}.jsonl").write_bytes(day.lines())
    facts = report.as_dict()
    facts["status"] = "imported"  # the same world stored before reads "unchanged": not run data
    (folder / f"{day.persona}.json").write_bytes(encode(facts))
    return report.world_hash, tools


def _tasks(chain: _Chain, env: Environment, tools: list[dict[str, Any]],
           task_list: list[str], ddl: list[str], world_hash: str) -> list[TaskResult]:
    """Stage 6 for every task, then the gates for the verified ones."""
    results: list[TaskResult] = []
    judge = chain.options.judge
    judges = (Judges(llm=CodeJudge(judge), agent=AgentJudge(judge, worlds=env.worlds))
              if judge is not None else Judges())
    for i, text in enumerate(task_list):
        ref = TaskRef(task_id=f"{chain.persona.replace('_', '-')}-{i + 1:02d}",
                      instruction=text, persona=chain.persona, world_hash=world_hash,
                      source=f"synth: scenario {chain.spec.name}, task {i + 1}")
        try:
            out: VerifierOut = chain.step(VerifierStage(env, ref, tools, ddl), ref.task_id)
        except _Stop:
            results.append(TaskResult(ref.task_id, verified=False))
            continue
        results.append(_gate(chain, env, judges, ref, tools, ddl, out))
    return results


def _gate(chain: _Chain, env: Environment, judges: Judges, ref: TaskRef,
          tools: list[dict[str, Any]], ddl: list[str], out: VerifierOut) -> TaskResult:
    """The five gates on a verified task, with the verifier stage as their reviser; an
    accepted task goes into the run's pack. Each version the gates see is staged in a
    folder of this task's own (scenarios run at once)."""
    with tempfile.TemporaryDirectory(prefix="synth-gates-") as staging:
        reviser = _VerifierReviser(chain, env, ref, tools, ddl, out, Path(staging))
        report: GateReport = check_task(GateRun(env, lambda t: scripted_rollouts(env, t),
                                                judges=judges, reviser=reviser),
                                        reviser.task(out, 0))
    gates = [{"gate": r.gate, "status": r.status, "reason": r.reason}
             for r in report.rounds[-1]]
    final = (chain.options.tasks_dir or chain.run_dir / "tasks") / ref.task_id
    if report.accepted:
        write_task_folder(final, ref, reviser.latest)
    elif final.exists():
        shutil.rmtree(final)
    return TaskResult(ref.task_id, verified=True, gates=gates, accepted=report.accepted,
                      notes=list(report.notes), revisions=len(report.rounds) - 1)


class _VerifierReviser:
    """Hands a gate's failure back to the verifier stage (``gates.quality.Reviser``): the
    failure, in words, is the feedback of a new version, which must pass stage 6's own
    checks before the gates see it again (at most ``MAX_REVISIONS`` rounds)."""

    def __init__(self, chain: _Chain, env: Environment, ref: TaskRef,
                 tools: list[dict[str, Any]], ddl: list[str], first: VerifierOut,
                 staging: Path) -> None:
        self.staging = staging
        self.chain = chain
        self.env = env
        self.ref = ref
        self.tools = tools
        self.ddl = ddl
        self.latest = first
        self.feedback: list[str] = []

    def task(self, out: VerifierOut, round_no: int) -> Task:
        folder = self.staging / f"{self.ref.task_id}-r{round_no}"
        write_task_folder(folder, self.ref, out)
        return load_task(folder)

    def revise(self, task: Task, failure: GateResult, round_no: int) -> Task | None:
        del task  # the rejected version is self.latest
        self.feedback.append(gate_feedback(failure.gate, failure.reason,
                                           failure_detail(failure)))
        stage = VerifierStage(self.env, self.ref, self.tools, self.ddl, rejected=self.latest,
                              feedback=self.feedback)
        try:
            out: VerifierOut = self.chain.step(stage, f"{self.ref.task_id}/revision-{round_no}")
        except _Stop:
            return None
        self.latest = out
        return self.task(out, round_no)


def write_log(run_dir: Path, scenario: str, outcomes: list[StageOutcome]) -> None:
    """The synthesis log of one scenario (``log/<scenario>.jsonl``): every attempt of
    every stage it ran, in order, with its output, errors, summary, tokens and cost."""
    lines = []
    for outcome in outcomes:
        for attempt in outcome.attempts:
            lines.append(msgspec.json.encode({
                "stage": outcome.stage, "subject": outcome.subject, "key": outcome.key,
                "prompt": outcome.prompt, "attempt": attempt.number,
                "kept": attempt.number == outcome.chosen, "status": outcome.status,
                "error_rate": attempt.error_rate, "errors": attempt.errors,
                "summary": attempt.summary, "facts": attempt.facts, "output": attempt.output,
                "tokens_in": attempt.tokens_in, "tokens_out": attempt.tokens_out,
                "cost": attempt.cost}, order="sorted"))
    folder = run_dir / "log"
    folder.mkdir(parents=True, exist_ok=True)
    write_atomically(folder / f"{scenario}.jsonl", b"".join(line + b"\n" for line in lines))


__all__ = ["CODE_FORMATS", "EnvOptions", "EnvResult", "StageResult", "TaskResult",
           "synthesize_env", "write_log"]
