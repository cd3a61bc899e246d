"""A synthesis run: its folder, its commands, its summary, its status and its replay.

A run lives in one folder::

    run.json                 the configuration (model, attempts, prompt versions, the
                             run's name) and every command run, in order, with its
                             options (the judge model of ``envs``, the embedding model
                             of ``scenarios``)
    inputs/                  the seeds and scenarios files given, named by content
    recordings/<key>.json    every LLM call (``worldllm.client``: cache mode), the run's source
    outputs/<stage>/<key>.json  every stage outcome, content-addressed (``synth.stage``)
    scenarios.jsonl          the scenarios kept by ``synth scenarios`` (+ .report.json)
    personas.jsonl           the personas accepted by ``synth persona`` (name, signature)
    personas/<name>/         each accepted persona's bible.json and accounts.json, and its
                             day plans (plans/day-<N>.json, ``synth day --plan-only``)
                             and days (days/day-<N>.json: the implementation's attempts)
    apps/<service>.json      the app library: apps days wrote for services no app served
                             (``synth.worlds.applib``), for later days and personas
    skills.jsonl             the skill library (``synth.worlds.skills``): what stored days showed
                             and what refused days and tasks taught
    tasks/<persona>/<id>.json  every task rank of ``synth tasks``: its candidate, the
                             diversity gate's decision, the gates' rounds (the funnel)
    log/<scenario>.jsonl     the synthesis log: every attempt, output, error, summary
    worlds/<persona>.jsonl   each world's log as interchange lines (+ .json: its hashes)
    envs/<scenario>.json     what became of each scenario, stage by stage, task by task
    pack/<name>/             a pack (``packs``; named as the run): world logs, the task
                             folders the gates accepted, splits (``worldctl pack import``)
    summary.json             AWM's Table 1: success per stage, corrections, cost per 100

The model's endpoint, the concurrency and the budgets are not part of the configuration:
they change how a run is made, not what it makes. A folder made with another model,
another number of attempts or other prompt versions is refused rather than mixed (stage
outcomes are keyed by them); the judge and embedding models decide no stage outcome and
are options of the commands that use them.

**Replay.** ``replay_run`` re-runs every recorded command in a fresh folder and a fresh
store, offline (the client in replay mode on the run's recordings, one scenario at a
time), and compares every output file byte for byte and every world hash. Every command
of ``run.json`` and every input file it names is checked first (known kinds, persona
names, ``inputs/`` names, regular files), and ``--out`` is filled as a temporary folder
renamed into place at the end, so a refused replay writes nothing.

**A run folder may come from someone else.** Each command starts by refusing a run folder
that holds anything but regular files and folders (``refuse_links``: a symlink or a FIFO
is named, never followed), and files are read without following a link
(``worldstore.folders``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import re
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import msgspec

from gates.judges import AgentJudge, CodeJudge
from gates.quality import Judges
from packs.registry import FORMAT as PACK_FORMAT
from replay.engine import Worlds
from synth.environments.database import ScenarioSpec
from synth.environments.pipeline import (
    CODE_FORMATS,
    EnvOptions,
    EnvResult,
    StageResult,
    synthesize_env,
)
from synth.environments.scenarios import expand, read_scenarios, read_seeds
from synth.environments.verifiers import gate_feedback
from synth.errors import BudgetSpent, SynthError
from synth.prompts import ENV_STAGES, versions
from synth.stage import (
    MAX_ATTEMPTS,
    Budget,
    Context,
    Progress,
    StageOutcome,
    canonical_digest,
    encode,
    run_stage,
    write_atomically,
)
from synth.worlds.applib import add_to_library, library_tools, read_library
from synth.worlds.explore import STAGE as EXPLORE_STAGE
from synth.worlds.explore import Exploration, explore
from synth.worlds.implement import DayOutcome, implement_day
from synth.worlds.personas import (
    BibleOut,
    accounts_file,
    signature,
    synthesize_persona,
)
from synth.worlds.plans import PlanOut, PlanStage, WorldFacts, world_facts
from synth.worlds.setup import setup_lines
from synth.worlds.skills import MAX_LESSONS, add_skills, lesson, read_skills, retrieve
from synth.worlds.tasks import Slot, TasksJob, ensemble, funnel, read_records, synthesize_tasks
from worldenv.instances.instance import Environment
from worldllm.client import LLMClient, Mode
from worldllm.errors import RecordingMissing
from worldstore.errors import FolderError, NotFoundError
from worldstore.folders import (
    DIR,
    FILE,
    entry_kind,
    read_bytes,
    staged_folder,
    walk_files,
    write_bytes,
)
from worldstore.folders import refuse_links as only_data
from worldstore.names import is_persona

RUN_FILE = "run.json"
RUN_FORMAT = 1
NOT_RUN_NO_MODEL = "not run: no model configured"
COMPARED = ("run.json", "scenarios.jsonl", "scenarios.report.json", "personas.jsonl",
            "personas", "outputs", "log", "worlds", "envs", "tasks", "pack", "skills.jsonl",
            "apps", "summary.json")
# Splits of a run's pack, by the task id's SHA-256 (a task keeps its split across runs).
SPLIT_OF_TENTH = {0: "eval", 1: "eval", 2: "sft"}


class Command(msgspec.Struct, frozen=True):
    kind: str  # "scenarios", "envs", "persona", "plan", "setup" or "day"
    args: dict[str, Any]


class RunConfig(msgspec.Struct, frozen=True):
    """What a run makes things with. The judge and embedding models are options of the
    commands that use them (in ``commands``): they decide no stage outcome."""

    format: int
    name: str
    model: str | None
    max_attempts: int
    prompts: dict[str, int]
    commands: list[Command] = []

    @property
    def judge_model(self) -> str | None:
        """The judge model of the last ``synth envs`` (None: gates 1 and 5 not run)."""
        envs = [c for c in self.commands if c.kind == "envs"]
        found = envs[-1].args.get("judge_model") if envs else None
        return str(found) if found else None


@dataclass
class Settings:
    """How a run is made (not part of what it makes)."""

    model: str | None = None
    judge_model: str | None = None
    embedding_model: str | None = None  # the scenarios' duplicate filter (default: model)
    api_base: str | None = None
    api_key: str | None = None
    concurrency: int = 4
    budget_tokens: int | None = None
    budget_cost: float | None = None
    progress: TextIO | None = None
    max_attempts: int = MAX_ATTEMPTS
    mode: Mode = "cache"
    recordings: Path | None = None  # default: the run's own


@dataclass
class EnvsReport:
    results: list[EnvResult] = field(default_factory=list)
    stopped: str | None = None  # why the run stopped early (a budget), None if it did not
    summary: dict[str, Any] = field(default_factory=dict)


# --- the run folder -------------------------------------------------------------------


def run_name(folder: Path) -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", folder.resolve().name.lower()).strip("-")
    return name or "synth"


def open_run(folder: Path, settings: Settings) -> tuple[RunConfig, Context]:
    """The run's configuration (made, or checked against the settings) and the context its
    stages run in."""
    refuse_links(folder)
    config = _config(folder, settings)
    client = LLMClient(config.model, api_base=settings.api_base, api_key=settings.api_key,
                       recordings=settings.recordings or folder / "recordings",
                       mode=settings.mode)
    ctx = Context(client, folder / "outputs",
                  Budget(settings.budget_tokens, settings.budget_cost),
                  Progress(settings.progress), max_attempts=config.max_attempts)
    return config, ctx


def _client(folder: Path, settings: Settings, model: str | None,
            budget: Budget | None = None) -> LLMClient | None:
    """A client of another model (a judge's, the embeddings', the rollouts') recording
    with the run's; `budget`: its calls count against the run's (a stage's own calls are
    counted by the stage's context instead)."""
    if not model:
        return None
    client = LLMClient(model, api_base=settings.api_base, api_key=settings.api_key,
                       recordings=settings.recordings or folder / "recordings",
                       mode=settings.mode)
    return client if budget is None else client.metered(budget)


def refuse_links(folder: Path) -> None:
    """SynthError naming the first entry of the run folder that is not a regular file or
    a folder: a run folder may come from someone else, and a symlink or a FIFO in it
    would lead a read or a write out of it (or block). Nothing is followed on the way."""
    try:
        only_data(folder)
    except FolderError as exc:
        raise SynthError(f"--run {folder}: {exc}") from None


def read_config(folder: Path) -> RunConfig:
    path = folder / RUN_FILE
    try:
        return msgspec.json.decode(read_bytes(folder, RUN_FILE), type=RunConfig)
    except FolderError as exc:
        raise SynthError(str(exc)) from None
    except FileNotFoundError:
        raise SynthError(f"{folder}: not a synthesis run (no {RUN_FILE})") from None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SynthError(f"{path}: not a run configuration: {exc}") from None


def _config(folder: Path, settings: Settings) -> RunConfig:
    wanted = RunConfig(RUN_FORMAT, run_name(folder), settings.model, settings.max_attempts,
                       versions())
    if not (folder / RUN_FILE).exists():
        if folder.exists() and not folder.is_dir():
            raise SynthError(f"--run {folder}: not a folder")
        if wanted.model is not None:  # a run without a model makes nothing to keep
            write_atomically(folder / RUN_FILE, encode(wanted))
        return wanted
    have = read_config(folder)
    # Prompts added since the run was made change none of its outcomes (every outcome is
    # keyed by its prompt's version): only the prompts it knows must be as they were.
    known = {stage: wanted.prompts.get(stage) for stage in have.prompts}
    for what, mine, theirs in (("model", wanted.model, have.model),
                               ("attempts per stage", wanted.max_attempts, have.max_attempts),
                               ("prompt versions", known, have.prompts)):
        if mine != theirs:
            raise SynthError(f"{folder}: the run was made with {what} {theirs!r}, not "
                             f"{mine!r}; use another --run folder (outputs are never mixed)")
    return have


def _record(folder: Path, command: Command) -> None:
    config = read_config(folder)
    if config.commands and config.commands[-1] == command:
        return  # the same command again (a resume) is recorded once
    write_atomically(folder / RUN_FILE, encode(msgspec.structs.replace(
        config, commands=[*config.commands, command])))


def _keep_input(folder: Path, source: Path, kind: str) -> str:
    """A copy of an input file in the run, named by its content; its path in the run."""
    try:
        data = source.read_bytes()
    except OSError as exc:
        raise SynthError(f"{source}: cannot read the {kind} file: {exc}") from None
    return _keep_data(folder, data, kind, ".jsonl")


def _keep_data(folder: Path, data: bytes, kind: str, suffix: str) -> str:
    """`data` kept in the run's inputs, named by its content; its path in the run."""
    name = f"inputs/{kind}-{hashlib.sha256(data).hexdigest()[:16]}{suffix}"
    if not (folder / name).exists():
        write_atomically(folder / name, data)
    return name


# --- the commands ---------------------------------------------------------------------


def synth_scenarios(folder: Path, settings: Settings, seeds: Path, n: int,
                    cap: int | None = None) -> dict[str, Any]:
    """``synth scenarios``: scenarios from seeds into the run's scenarios.jsonl."""
    read_seeds(seeds)  # refuse a bad file before anything is made
    _, ctx = open_run(folder, settings)
    if not ctx.client.configured:
        return {"status": NOT_RUN_NO_MODEL}
    command = Command("scenarios", {"seeds": _keep_input(folder, seeds, "seeds"), "n": n,
                                    "cap": cap, "embedding_model": settings.embedding_model})
    _record(folder, command)
    return _run_scenarios(folder, ctx, command, settings)


def _run_scenarios(folder: Path, ctx: Context, command: Command, settings: Settings
                   ) -> dict[str, Any]:
    seeds = read_seeds(folder / command.args["seeds"])
    ctx.embedder = _client(folder, settings, command.args.get("embedding_model"))
    report = expand(ctx, seeds, int(command.args["n"]), cap=command.args.get("cap"))
    lines = b"".join(msgspec.json.encode(s) + b"\n" for s in report.kept)
    write_atomically(folder / "scenarios.jsonl", lines)
    write_atomically(folder / "scenarios.report.json", encode(report.as_dict()))
    return {"status": "done", **report.as_dict()}


def synth_persona(folder: Path, settings: Settings, hint: str | None = None
                  ) -> dict[str, Any]:
    """``synth persona``: one persona bible (``synth.worlds.personas``), judged for diversity
    against the run's accepted personas; an accepted one goes to RUN/personas/."""
    _, ctx = open_run(folder, settings)
    if not ctx.client.configured:
        return {"status": NOT_RUN_NO_MODEL}
    # The accepted personas are part of the command: the same command again is a resume,
    # another persona after more were accepted is another command.
    command = Command("persona", {"name": hint, "after": sorted(accepted_personas(folder))})
    _record(folder, command)
    return _run_persona(folder, ctx, command)


def accepted_personas(folder: Path) -> dict[str, str]:
    """The run's accepted personas: name -> signature (``personas.jsonl``)."""
    path = folder / "personas.jsonl"
    if not path.is_file():
        return {}
    found = {}
    for number, line in enumerate(path.read_bytes().splitlines(), 1):
        try:
            entry = msgspec.json.decode(line, type=dict[str, str])
            found[entry["name"]] = entry["signature"]
        except (msgspec.DecodeError, msgspec.ValidationError, KeyError):
            raise SynthError(f"{path}:{number}: not a persona line (name, signature)"
                             ) from None
    return found


def _run_persona(folder: Path, ctx: Context, command: Command) -> dict[str, Any]:
    after = set(command.args.get("after") or [])
    accepted = {n: s for n, s in accepted_personas(folder).items() if n in after}
    result = synthesize_persona(ctx, library_tools(read_library(folder)), accepted,
                                command.args.get("name"))
    if result.status == "accepted" and result.bible is not None:
        bible = result.bible
        where = folder / "personas" / bible.name
        write_atomically(where / "bible.json", encode(bible))
        write_atomically(where / "accounts.json", encode(accounts_file(bible)))
        lines = {**accepted_personas(folder), bible.name: signature(bible)}
        write_atomically(folder / "personas.jsonl", b"".join(
            msgspec.json.encode({"name": n, "signature": lines[n]}) + b"\n"
            for n in sorted(lines)))
    return {"status": result.status, "name": result.bible.name if result.bible else None,
            "signature": result.signature, "reason": result.reason,
            "revisions": result.revisions, "stages": [
                {"stage": o.stage, "status": o.status, "attempts": len(o.attempts),
                 "tokens": o.tokens} for o in result.outcomes]}


def synth_plan(folder: Path, settings: Settings, persona: str, day: int,
               open_worlds: Callable[..., Worlds]) -> dict[str, Any]:
    """``synth day --plan-only``: the plan of `persona`'s day `day` (``synth.worlds.plans``), from
    its bible, its earlier plans and what the store holds of its world before that day
    (`open_worlds(create=False)`: a store not made yet holds nothing yet)."""
    _bible(folder, persona)  # refuse a persona the run has not accepted, first
    if day < 1:
        raise SynthError(f"--day {day}: days to plan start at 1 (day 0 is the world's set-up)")
    _, ctx = open_run(folder, settings)
    if not ctx.client.configured:
        return {"status": NOT_RUN_NO_MODEL}
    try:
        with open_worlds(create=False) as worlds:
            facts = world_facts(worlds, persona, day)
    except NotFoundError:  # no store yet: nothing of any world
        facts = WorldFacts([], {}, {}, {}, [])
    command = Command("plan", {"persona": persona, "day": day,
                               "facts": _keep_data(folder, encode(facts), "facts", ".json")})
    _record(folder, command)
    return _run_plan(folder, ctx, command, open_worlds)


def _explore_before(ctx: Context, open_worlds: Callable[..., Worlds], persona: str,
                   day: int) -> str:
    """What exploring `persona`'s world through day `day` - 1 finds ("" when the store
    has no such day)."""
    try:
        with open_worlds(create=False) as worlds:
            if day - 1 not in {r.day for r in worlds.store.days(persona)}:
                return ""
            record = worlds.record(f"{persona}@{day - 1}")
            with worlds.pinned(persona, day - 1) as world:
                return explore(ctx, world, record.world_hash,
                               f"plan day {day} of {persona}'s life",
                               f"{persona}@{day - 1}").findings
    except NotFoundError:
        return ""


def _bible(folder: Path, persona: str) -> BibleOut:
    path = folder / "personas" / persona / "bible.json"
    try:
        return msgspec.json.decode(path.read_bytes(), type=BibleOut)
    except FileNotFoundError:
        raise SynthError(f"persona {persona!r} is not an accepted persona of the run "
                         f"{folder} (make one with `worldctl synth persona --run {folder}`)"
                         ) from None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SynthError(f"{path}: not a persona bible: {exc}") from None


def _run_plan(folder: Path, ctx: Context, command: Command,
              open_worlds: Callable[..., Worlds]) -> dict[str, Any]:
    persona, day = str(command.args["persona"]), int(command.args["day"])
    bible = _bible(folder, persona)
    explored = _explore_before(ctx, open_worlds, persona, day)
    facts = msgspec.json.decode((folder / command.args["facts"]).read_bytes(),
                                type=WorldFacts)
    plans = folder / "personas" / persona / "plans"
    earlier = [msgspec.json.decode(p.read_bytes(), type=PlanOut)
               for p in sorted(plans.glob("day-*.json"))] if plans.is_dir() else []
    earlier = [p for p in earlier if p.day < day]
    outcome = run_stage(ctx, PlanStage(bible, library_tools(read_library(folder)), day,
                                       earlier, facts, explored),
                        f"{persona}@{day}")
    if outcome.status == "accepted":
        write_atomically(plans / f"day-{day}.json", encode(msgspec.convert(
            outcome.output, PlanOut)))
    chosen = outcome.attempts[-1] if outcome.attempts else None
    return {"status": outcome.status, "persona": persona, "day": day,
            "plan": outcome.output if outcome.status == "accepted" else None,
            "attempts": len(outcome.attempts), "tokens": outcome.tokens,
            "errors": chosen.errors if chosen is not None and outcome.status != "accepted"
            else []}


def synth_day(folder: Path, settings: Settings, persona: str, day: int,
              open_worlds: Callable[..., Worlds]) -> dict[str, Any]:
    """``synth day``: day `day` of `persona`'s world, planned when it has no plan yet, then
    implemented by the coding agent, validated and stored (``synth.worlds.implement``). Day 0,
    the world's set-up, is stored first when the store has no day of the persona."""
    if settings.model is None:  # said before anything is checked or written
        return {"status": NOT_RUN_NO_MODEL}
    _bible(folder, persona)
    if day < 1:
        raise SynthError(f"--day {day}: days to make start at 1 (day 0 is the world's set-up, "
                         "made with the first day)")
    stored = _stored_days(open_worlds, persona)
    if day in stored:
        return _day_report(folder, persona, day, already=True)
    last = stored[-1] if stored else None
    if (last if last is not None else 0) != day - 1:
        raise SynthError(f"{persona}: day {day} comes after day {day - 1}, but the store's "
                         f"last day of {persona} is "
                         f"{last if last is not None else 'none (make day 1 first)'}")
    _, ctx = open_run(folder, settings)  # checks the run's configuration, first write
    open_worlds().close()  # the store is made, or refused, before any model call
    if last is None:
        setup = Command("setup", {"persona": persona})
        _record(folder, setup)
        _run_setup(folder, setup, open_worlds)
    if not _plan_path(folder, persona, day).is_file():
        planned = synth_plan(folder, settings, persona, day, open_worlds)
        if planned["status"] != "accepted":
            return {**planned, "status": "failed", "stage": "plan"}
    command = Command("day", {"persona": persona, "day": day})
    _record(folder, command)
    return _run_day(folder, ctx, command, open_worlds)


def synth_world(folder: Path, settings: Settings, persona: str, to_day: int,
                open_worlds: Callable[..., Worlds]) -> dict[str, Any]:
    """``synth world``: every day of `persona` up to `to_day` the store lacks, in order,
    stopping at the first that is not stored."""
    if settings.model is None:  # said before anything is checked or written
        return {"status": NOT_RUN_NO_MODEL}
    _bible(folder, persona)
    if to_day < 1:
        raise SynthError(f"--to-day {to_day}: a world's days to make start at 1")
    days = []
    for day in range(1, to_day + 1):
        report = synth_day(folder, settings, persona, day, open_worlds)
        days.append(report)
        if report["status"] != "stored":
            return {"status": "stopped", "persona": persona, "to_day": to_day, "days": days}
    return {"status": "stored", "persona": persona, "to_day": to_day, "days": days}


def _stored_days(open_worlds: Callable[..., Worlds], persona: str) -> list[int]:
    """The persona's stored days, ascending; none when there is no store yet (nothing is
    made to find that out)."""
    try:
        with open_worlds(create=False) as worlds:
            return [r.day for r in worlds.store.days(persona)]
    except NotFoundError:
        return []


def _plan_path(folder: Path, persona: str, day: int) -> Path:
    return folder / "personas" / persona / "plans" / f"day-{day}.json"


def _day_path(folder: Path, persona: str, day: int) -> Path:
    return folder / "personas" / persona / "days" / f"day-{day}.json"


def _run_setup(folder: Path, command: Command, open_worlds: Callable[[], Worlds]) -> None:
    persona = str(command.args["persona"])
    bible = _bible(folder, persona)
    with open_worlds() as worlds:
        if not list(worlds.store.days(persona)):
            worlds.import_stream(io.BytesIO(setup_lines(bible, read_library(folder))),
                                 source=f"<synth setup of {persona}>")
        _write_world(folder, worlds, persona)


def _run_day(folder: Path, ctx: Context, command: Command,
             open_worlds: Callable[[], Worlds]) -> dict[str, Any]:
    persona, day = str(command.args["persona"]), int(command.args["day"])
    bible = _bible(folder, persona)
    plan = msgspec.json.decode(_plan_path(folder, persona, day).read_bytes(), type=PlanOut)
    with open_worlds() as worlds:
        if day in {r.day for r in worlds.store.days(persona)}:
            return _day_report(folder, persona, day, already=True)
        given = retrieve(read_skills(folder), plan, bible.services)
        outcome = implement_day(ctx, worlds, bible, plan, skills=given,
                                library=read_library(folder))
        write_atomically(_day_path(folder, persona, day), encode(outcome))
        add_skills(folder, outcome.learned)
        add_to_library(folder, outcome.apps)
        if outcome.status == "stored":
            _write_world(folder, worlds, persona)
    return _day_report(folder, persona, day)


def _day_report(folder: Path, persona: str, day: int, *, already: bool = False
                ) -> dict[str, Any]:
    path = _day_path(folder, persona, day)
    outcome = msgspec.json.decode(path.read_bytes(), type=DayOutcome) if path.is_file() \
        else None
    if outcome is None:  # stored by other means (an episode, an import)
        return {"status": "stored", "persona": persona, "day": day, "already": already,
                "attempts": [], "world_hash": None, "tokens": 0}
    return {"status": outcome.status, "persona": persona, "day": day, "already": already,
            "world_hash": outcome.world_hash, "tokens": outcome.tokens,
            "attempts": [msgspec.to_builtins(a) for a in outcome.attempts]}


def _write_world(folder: Path, worlds: Worlds, persona: str) -> None:
    """The persona's log as the run's world file (the pack takes it) and its days'
    hashes beside it."""
    out = io.BytesIO()
    worlds.export(persona, out)
    write_atomically(folder / "worlds" / f"{persona}.jsonl", out.getvalue())
    days = {str(r.day): r.world_hash for r in worlds.store.days(persona)}
    last = max(worlds.store.days(persona), key=lambda r: r.day)
    write_atomically(folder / "worlds" / f"{persona}.json", encode(
        {"persona": persona, "world_hash": last.world_hash, "days": days}))


def synth_tasks(folder: Path, settings: Settings, persona: str, days: list[int],
                difficulties: list[str], count: int, parallel: int,
                open_worlds: Callable[..., Worlds], agent_models: list[str] | None = None
                ) -> dict[str, Any]:
    """``synth tasks``: `count` tasks per slot (a day and a difficulty) on `persona`'s
    world, through proposal, the diversity gate, ensemble rollouts and the five gates with
    revisions (``synth.worlds.tasks``); accepted ones into the run's pack."""
    if settings.model is None:  # said before anything is checked or written
        return {"status": NOT_RUN_NO_MODEL}
    _bible(folder, persona)
    if len(difficulties) == 1:
        difficulties = difficulties * len(days)
    if not days or len(difficulties) != len(days):
        raise SynthError(f"--days has {len(days)} days and --difficulty {len(difficulties)} "
                         "labels: give one label, or one per day")
    bad = sorted({d for d in difficulties if d not in ("hard", "medium")})
    if bad:
        raise SynthError(f"--difficulty {bad[0]}: a task is asked for as hard or medium")
    stored = _stored_days(open_worlds, persona)
    missing = [d for d in days if d not in stored]
    if missing:
        raise SynthError(f"{persona}@{missing[0]} is not in the store (make the world first: "
                         f"`worldctl synth world {persona} --to-day {max(days)}`)")
    if count < 1 or parallel < 1:
        raise SynthError("--count and --parallel are at least 1")
    _, ctx = open_run(folder, settings)  # checks the run's configuration, first write
    config = read_config(folder)
    command = Command("tasks", {
        "persona": persona, "days": days, "difficulties": difficulties, "count": count,
        "parallel": parallel, "agent_models": agent_models or [config.model],
        "judge_model": settings.judge_model, "embedding_model": settings.embedding_model,
        "after": sorted(_pack_tasks(folder, config, persona))})
    _record(folder, command)
    return _run_tasks(folder, ctx, command, settings, open_worlds)


def _pack_tasks(folder: Path, config: RunConfig, persona: str) -> dict[str, str]:
    """The pack's accepted tasks on `persona`'s world: task id -> instruction."""
    tasks = pack_dir(folder, config) / "tasks"
    found = {}
    for spec in sorted(tasks.glob("*/task.json")) if tasks.is_dir() else []:
        data = msgspec.json.decode(spec.read_bytes())
        if str(data.get("world", "")).startswith(f"{persona}@"):
            found[str(data["task_id"])] = str(data["instruction"])
    return found


def _run_tasks(folder: Path, ctx: Context, command: Command, settings: Settings,
               open_worlds: Callable[..., Worlds]) -> dict[str, Any]:
    args = command.args
    persona = str(args["persona"])
    config = read_config(folder)
    bible = _bible(folder, persona)
    after = set(args.get("after") or [])
    taken = [t for i, t in sorted(_pack_tasks(folder, config, persona).items()) if i in after]
    ctx.embedder = _client(folder, settings, args.get("embedding_model"))
    judge = _client(folder, settings, args.get("judge_model"), ctx.budget)
    slots = [Slot(int(d), str(k)) for d, k in  # type: ignore[arg-type]
             zip(args["days"], args["difficulties"], strict=True)]

    def client_for(model: str) -> LLMClient:
        found = _client(folder, settings, model, ctx.budget)
        assert found is not None
        return found

    with open_worlds() as worlds, Environment(worlds) as env:
        judges = (Judges(llm=CodeJudge(judge), agent=AgentJudge(judge, worlds=worlds))
                  if judge is not None else Judges())
        scope = _fresh_scope(worlds, f"synth-tasks:{config.name}:"
                                     f"{canonical_digest(msgspec.to_builtins(command))[:16]}")
        lessons = [s.text for s in read_skills(folder)
                   if s.kind == "lesson" and s.source.startswith("task ")][-MAX_LESSONS:]
        job = TasksJob(ctx=ctx, env=env, bible=bible, slots=slots, count=int(args["count"]),
                       lessons=lessons,
                       parallel=int(args["parallel"]), scope=scope, taken=taken,
                       records=folder / "tasks" / persona,
                       accepted_dir=pack_dir(folder, config) / "tasks",
                       agents=ensemble([str(m) for m in args["agent_models"]]),
                       client_for=client_for, judges=judges)
        records = synthesize_tasks(job)
    add_skills(folder, [lesson("a task was rejected: "
                               + gate_feedback(g["gate"], g["reason"], None),
                               f"task {r.task_id}")
                        for r in records for results in r.rounds for g in results
                        if g["status"] == "failed"])
    write_pack(folder, config)
    return {"status": "done", "persona": persona, "funnel": funnel(records), "tasks": [
        {"task_id": r.task_id, "day": r.day, "rank": r.rank, "diversity": r.diversity,
         "accepted": r.accepted, "difficulty": r.difficulty, "revisions": r.revisions,
         "instruction": r.instruction} for r in records]}


def _fresh_scope(worlds: Worlds, base: str) -> str:
    """The first scope of `base` no claim uses yet: a command started again after it was
    stopped decides in a scope of its own (its model calls come from the recordings)."""
    for n in range(10_000):
        scope = f"{base}:{n}"
        if not worlds.store.claims(scope):
            return scope
    raise SynthError(f"{base}: no fresh claims scope left")


def task_funnel(folder: Path) -> dict[str, Any]:
    """``synth funnel``: the funnel report over every task record of the run."""
    refuse_links(folder)
    read_config(folder)
    return {"run": str(folder), **funnel(read_records(folder))}


def synth_envs(folder: Path, settings: Settings, scenarios: Path,
               open_worlds: Callable[[], Worlds], *, only: str | None = None,
               tasks_per_scenario: int = 10, code_format: str = "app") -> EnvsReport:
    """``synth envs``: every scenario of the file through the stages."""
    if only is not None and only not in ENV_STAGES:
        raise SynthError(f"--only {only}: no such stage (the stages: {', '.join(ENV_STAGES)})")
    if code_format not in CODE_FORMATS:
        raise SynthError(f"--code-format {code_format}: not one of {', '.join(CODE_FORMATS)}")
    specs = read_scenarios(scenarios)
    if settings.model is None:
        return EnvsReport([_not_run(s) for s in specs], summary=summarize(folder))
    open_worlds().close()  # the store is made, or refused, before the run or a model call
    _, ctx = open_run(folder, settings)
    # Only a run in AWM's code format records it: a default run's run.json stays as before.
    extra = {"code_format": code_format} if code_format != "app" else {}
    command = Command("envs", {"scenarios": _keep_input(folder, scenarios, "scenarios"),
                               "only": only, "tasks_per_scenario": tasks_per_scenario,
                               "judge_model": settings.judge_model, **extra})
    _record(folder, command)
    return _run_envs(folder, ctx, command, settings, open_worlds)


def _run_envs(folder: Path, ctx: Context, command: Command, settings: Settings,
              open_worlds: Callable[[], Worlds]) -> EnvsReport:
    specs = read_scenarios(folder / command.args["scenarios"])
    config = read_config(folder)
    judge = _client(folder, settings, command.args.get("judge_model"), ctx.budget)
    options = EnvOptions(tasks_per_scenario=int(command.args["tasks_per_scenario"]),
                         only=command.args.get("only"), judge=judge,
                         tasks_dir=pack_dir(folder, config) / "tasks",
                         code_format=str(command.args.get("code_format", "app")))
    report = EnvsReport()

    def one(spec: ScenarioSpec) -> EnvResult:
        try:
            return synthesize_env(ctx, spec, open_worlds, folder, options)
        except BudgetSpent as exc:
            report.stopped = str(exc)
            return _stopped(spec, "stopped: the budget is spent")
        except RecordingMissing as exc:
            return _stopped(spec, f"stopped: no recording for a call ({exc})")

    with ThreadPoolExecutor(max_workers=max(1, settings.concurrency)) as pool:
        report.results = list(pool.map(one, specs))
    for result in report.results:
        if result.persona:
            write_atomically(folder / "envs" / f"{result.scenario}.json", encode(result))
    write_pack(folder, config)
    report.summary = summarize(folder)
    write_atomically(folder / "summary.json", encode(report.summary))
    return report


def _not_run(spec: ScenarioSpec) -> EnvResult:
    return EnvResult(spec.name, "", ENV_STAGES[0], NOT_RUN_NO_MODEL,
                     [StageResult(s, spec.name, "not_run", reason=NOT_RUN_NO_MODEL)
                      for s in ENV_STAGES])


def _stopped(spec: ScenarioSpec, reason: str) -> EnvResult:
    return EnvResult(spec.name, "", None, reason, [])


# --- the pack -------------------------------------------------------------------------


def split_of(task_id: str) -> str:
    tenth = int(hashlib.sha256(task_id.encode()).hexdigest()[:8], 16) % 10
    return SPLIT_OF_TENTH.get(tenth, "rl")


def pack_dir(folder: Path, config: RunConfig) -> Path:
    """Where the run's pack is (a pack's folder is named as the pack)."""
    return folder / "pack" / config.name


def write_pack(folder: Path, config: RunConfig) -> Path:
    """The run's pack: the worlds built, the task folders the gates accepted, splits."""
    pack = pack_dir(folder, config)
    tasks_dir = pack / "tasks"
    tasks = sorted(p.name for p in tasks_dir.iterdir() if p.is_dir()) if tasks_dir.is_dir() \
        else []
    world_dir = pack / "world"
    if world_dir.exists():
        shutil.rmtree(world_dir)
    world_dir.mkdir(parents=True)
    worlds = sorted((folder / "worlds").glob("*.jsonl")) if (folder / "worlds").is_dir() else []
    for world in worlds:
        shutil.copyfile(world, world_dir / world.name)
    tasks_dir.mkdir(parents=True, exist_ok=True)
    splits: dict[str, list[str]] = {"sft": [], "rl": [], "eval": []}
    for task in tasks:
        splits[split_of(task)].append(task)
    spec = {"name": config.name, "title": f"Synthesized environments ({config.name})",
            "description": (f"{len(worlds)} tool-use environments and {len(tasks)} tasks "
                            f"synthesized by agent-worlds with model {config.model}; every "
                            "task passed its verifier checks and the quality gates that ran."),
            "worlds": [f"world/{w.name}" for w in worlds], "tasks": "tasks",
            "splits": "splits.json", "format": PACK_FORMAT}
    write_atomically(pack / "pack.json", encode(spec))
    write_atomically(pack / "splits.json", encode(splits))
    return pack


# --- summary and status ---------------------------------------------------------------


def _results(folder: Path) -> list[EnvResult]:
    found = sorted((folder / "envs").glob("*.json")) if (folder / "envs").is_dir() else []
    return [msgspec.json.decode(p.read_bytes(), type=EnvResult) for p in found]


def summarize(folder: Path) -> dict[str, Any]:
    """AWM's Table 1 for the run: per stage the subjects that reached it, the success rate
    (accepted within the attempts), the mean correction iterations, tokens and cost; and
    the cost per 100 environments."""
    results = _results(folder)
    rows: list[dict[str, Any]] = []
    for stage in ENV_STAGES:
        ran = [s for r in results for s in r.stages if s.stage == stage and s.status != "not_run"]
        costs = [s.cost for s in ran if s.cost is not None]
        rows.append({
            "stage": stage, "ran": len(ran),
            "accepted": sum(s.status == "accepted" for s in ran),
            "kept_best": sum(s.status == "kept_best" for s in ran),
            "failed": sum(s.status == "failed" for s in ran),
            "success_rate": _ratio(sum(s.status == "accepted" for s in ran), len(ran)),
            "mean_corrections": _ratio(sum(s.attempts - 1 for s in ran), len(ran)),
            "tokens": sum(s.tokens for s in ran),
            "cost": sum(costs) if costs else None})
    built = [r for r in results if r.built]
    tokens = sum(int(row["tokens"]) for row in rows)
    costs = [float(row["cost"]) for row in rows if row["cost"] is not None]
    tasks = [t for r in results for t in r.tasks]
    return {"stages": rows, "scenarios": len(results), "envs_built": len(built),
            "tools": sum(r.tools for r in built),
            "tasks_verified": sum(t.verified for t in tasks),
            "tasks_accepted": sum(t.accepted for t in tasks),
            "tokens": tokens, "cost": sum(costs) if costs else None,
            "tokens_per_100_envs": _per_100(tokens, len(built)),
            "cost_per_100_envs": _per_100(sum(costs), len(built)) if costs else None}


def _ratio(a: float, b: int) -> float | None:
    return round(a / b, 4) if b else None


def _per_100(total: float, envs: int) -> float | None:
    return round(total * 100 / envs, 4) if envs else None


def status(folder: Path) -> dict[str, Any]:
    """Per stage, from the stored outcomes (so also for a run that was killed): subjects
    done (accepted or kept best), failed, attempts, tokens, cost."""
    refuse_links(folder)
    config = read_config(folder)
    stages = []
    outputs = folder / "outputs"
    for stage_dir in sorted(outputs.iterdir()) if outputs.is_dir() else []:
        if stage_dir.name == EXPLORE_STAGE:  # an agent's outcomes, not a stage's
            stages.append(_explored(stage_dir))
            continue
        outcomes = [msgspec.json.decode(p.read_bytes(), type=StageOutcome)
                    for p in sorted(stage_dir.glob("*.json"))]
        costs = [o.cost for o in outcomes if o.cost is not None]
        stages.append({
            "stage": stage_dir.name,
            "accepted": sum(o.status == "accepted" for o in outcomes),
            "kept_best": sum(o.status == "kept_best" for o in outcomes),
            "failed": sum(o.status == "failed" for o in outcomes),
            "attempts": sum(len(o.attempts) for o in outcomes),
            "tokens": sum(o.tokens for o in outcomes),
            "cost": sum(costs) if costs else None})
    order = ["scenarios", "classify", *ENV_STAGES, "persona", "diversity", EXPLORE_STAGE,
             "plan", "propose", "revise"]
    stages.sort(key=lambda s: order.index(s["stage"]) if s["stage"] in order else len(order))
    return {"run": str(folder), "model": config.model, "judge_model": config.judge_model,
            "commands": len(config.commands), "stages": stages,
            "recordings": len(list((folder / "recordings").glob("*.json")))
            if (folder / "recordings").is_dir() else 0}


def _explored(folder: Path) -> dict[str, Any]:
    """The explorations of a run as a status row: with findings (accepted) or without
    (failed), their model calls as attempts."""
    found = [msgspec.json.decode(p.read_bytes(), type=Exploration)
             for p in sorted(folder.glob("*.json"))]
    return {"stage": EXPLORE_STAGE, "accepted": sum(bool(e.findings) for e in found),
            "kept_best": 0, "failed": sum(not e.findings for e in found),
            "attempts": sum(e.turns for e in found), "tokens": sum(e.tokens for e in found),
            "cost": None}


# --- replay ---------------------------------------------------------------------------


@dataclass
class ReplayReport:
    folder: Path
    compared: int
    differences: list[str]
    world_hashes: dict[str, str]
    stopped: list[str] = field(default_factory=list)  # scenarios the replay could not finish

    @property
    def identical(self) -> bool:
        return not self.differences

    def as_dict(self) -> dict[str, Any]:
        return {"replayed_into": str(self.folder), "files_compared": self.compared,
                "identical": self.identical, "differences": self.differences,
                "world_hashes": self.world_hashes, "stopped": self.stopped}


def replay_run(folder: Path, out: Path | None = None) -> ReplayReport:
    """Re-run the run's commands offline into `out` (a fresh folder; default a temporary
    one, removed after) and compare (see the module docstring). Every command and the
    input files it names are checked before anything is written, and `out` is filled as a
    temporary folder beside it, renamed into place at the end: a refused replay leaves no
    `out` behind."""
    refuse_links(folder)
    config = read_config(folder)
    if not config.commands:
        raise SynthError(f"{folder}: the run has no command to replay")
    inputs = _replay_inputs(folder, config)
    if out is None:
        target = Path(tempfile.mkdtemp(prefix="synth-replay-"))
        try:
            return _replay_into(folder, target, config, inputs)
        finally:
            shutil.rmtree(target, ignore_errors=True)
    try:
        with staged_folder(out, "--out") as staging:
            report = _replay_into(folder, staging, config, inputs)
    except FolderError as exc:
        raise SynthError(str(exc)) from None
    return dataclasses.replace(report, folder=out)


# What each command's arguments must look like before a replay acts on them: a run.json
# someone handed over could name '../' paths or persona names that lead out of --out.
_INPUT_NAME = re.compile(r"inputs/(seeds|scenarios|facts)-[0-9a-f]{16}\.jsonl?\Z")
_FILE_ARGS = ("seeds", "scenarios", "facts")
_KINDS = frozenset({"scenarios", "envs", "persona", "plan", "setup", "day", "tasks"})


def _replay_inputs(folder: Path, config: RunConfig) -> dict[str, bytes]:
    """The input files the commands name, read (regular files only) from the run, after
    checking every command's kind, persona and file names; SynthError naming the first
    that is refused."""
    inputs: dict[str, bytes] = {}
    for i, command in enumerate(config.commands):
        where = f"{folder / RUN_FILE}: commands[{i}]"
        if command.kind not in _KINDS:
            raise SynthError(f"{where}: unknown command kind {command.kind!r}")
        persona = command.args.get("persona")
        if persona is not None and not (isinstance(persona, str) and is_persona(persona)):
            raise SynthError(f"{where}: persona {persona!r} is not a persona name")
        for key in _FILE_ARGS:
            name = command.args.get(key)
            if key not in command.args:
                continue
            if not (isinstance(name, str) and _INPUT_NAME.match(name)):
                raise SynthError(f"{where}: {key} {name!r} is not a file of the run's "
                                 "inputs/ (inputs/<kind>-<digest>.json[l])")
            try:
                inputs[name] = read_bytes(folder, name)
            except FileNotFoundError:
                raise SynthError(f"{folder / name}: named by {where}, not in the run"
                                 ) from None
            except FolderError as exc:
                raise SynthError(str(exc)) from None
    return inputs


def _replay_into(folder: Path, target: Path, config: RunConfig,
                 inputs: dict[str, bytes]) -> ReplayReport:
    target.mkdir(parents=True, exist_ok=True)
    fresh = msgspec.structs.replace(config, commands=[])
    write_atomically(target / RUN_FILE, encode(fresh))
    settings = Settings(model=config.model, concurrency=1,
                        max_attempts=config.max_attempts, mode="replay",
                        recordings=folder / "recordings")
    store = target / "store"

    def open_worlds(*, create: bool = True) -> Worlds:
        return Worlds.open(store / "worlds.sqlite", store / "cache", create=create)

    stopped: list[str] = []
    for command in config.commands:
        for name in sorted({v for k, v in command.args.items() if k in _FILE_ARGS}):
            write_bytes(target, name, inputs[name])
        _record(target, command)
        _, ctx = open_run(target, settings)
        if command.kind == "scenarios":
            _run_scenarios(target, ctx, command, settings)
        elif command.kind == "persona":
            _run_persona(target, ctx, command)
        elif command.kind == "plan":
            _run_plan(target, ctx, command, open_worlds)
        elif command.kind == "setup":
            _run_setup(target, command, open_worlds)
        elif command.kind == "day":
            _run_day(target, ctx, command, open_worlds)
        elif command.kind == "tasks":
            _run_tasks(target, ctx, command, settings, open_worlds)
        else:
            envs = _run_envs(target, ctx, command, settings, open_worlds)
            stopped += [f"{r.scenario}: {r.reason}" for r in envs.results
                        if r.reason.startswith("stopped")]
    differences, compared = compare_runs(folder, target)
    return ReplayReport(target, compared, differences, _world_hashes(target), stopped)


def _world_hashes(folder: Path) -> dict[str, str]:
    found = {}
    for path in sorted((folder / "worlds").glob("*.json")) if (folder / "worlds").is_dir() \
            else []:
        found[path.stem] = msgspec.json.decode(path.read_bytes())["world_hash"]
    return found


def compare_runs(a: Path, b: Path) -> tuple[list[str], int]:
    """Files of COMPARED that differ, are missing or are extra in `b`, and the count
    compared."""
    differences: list[str] = []
    compared = 0
    for top in COMPARED:
        left, right = _files(a, top), _files(b, top)
        for rel in sorted(set(left) | set(right)):
            compared += 1
            if rel not in right:
                differences.append(f"{rel}: in the run, not in the replay")
            elif rel not in left:
                differences.append(f"{rel}: in the replay, not in the run")
            elif read_bytes(a, left[rel]) != read_bytes(b, right[rel]):
                differences.append(f"{rel}: differs")
    return differences, compared


def _files(root: Path, top: str) -> dict[str, str]:
    """rel -> rel of the regular files of `top` in `root` (itself, if a file); links and
    special files are never followed nor opened (``refuse_links`` names them first)."""
    kind = entry_kind(root, top)
    if kind == FILE:
        return {top: top}
    if kind != DIR:
        return {}
    return {rel: rel for rel in walk_files(root, top)
            if not rel.rsplit("/", 1)[-1].startswith(".")}


__all__ = ["COMPARED", "NOT_RUN_NO_MODEL", "Command", "EnvsReport", "ReplayReport",
           "RunConfig", "Settings", "compare_runs", "open_run",
           "pack_dir", "read_config", "replay_run", "run_name", "split_of", "status", "summarize",
           "synth_day", "synth_envs", "synth_persona", "synth_plan", "synth_scenarios",
           "synth_tasks", "synth_world", "task_funnel", "write_pack"]

