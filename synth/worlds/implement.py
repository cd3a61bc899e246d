"""Day implementation (methods.md section 4): a coding agent writes a planned day into a
live instance of ``persona@N-1``; its recorded episode becomes day N, stored only after
the day passed validation.

**The implementer** is a model with native tool calls, offered every service's tools,
``sql`` (one service's database, under the gate every stored event passes:
``Instance.sql``), ``shell`` (the workspace, sandboxed), ``begin`` (the plan's activity
k starts: the instance's clock moves to its time, ``Instance.set_clock``, so every call
is stamped from the plan's clock, never the wall clock), ``create_app`` (a new service
with its tools, when the plan needs one no app serves: checked by the app stage at once,
its pin and schema first among the day's events, then into the run's app library:
``synth.worlds.applib``) and ``done`` (the day is over;
with an optional ``produces`` declaration, checked by validation's layer 3). Its steps
are bounded (``MAX_STEPS``), and, as for every agent here, a bad call is data for the
model, not an exception.

**An attempt** then goes through, in order, stopping at the first failure:

1. *the episode as a day* (``synth.worlds.days.day_from_episode``): its effects as events, which
   must replay to exactly the world the agent left;
2. *re-execution* (the "replay" layer's determinism half for an episode): every call is
   run again, in order and at its recorded time, on a fresh instance of N-1, shell
   commands under another time zone and at least a second later; every call must have
   the same effects. A command that wrote the machine's clock, randomness or the
   sandbox's process ids fails here, naming the call and what differed;
3. *the five layers* of ``synth.worlds.validate_day`` on the candidate day, in a scratch store
   holding the persona's stored days (copied, not replayed) and the candidate (nothing
   reaches the real store before the day passed), with names reserved by the real
   store's other personas, the declarations from ``done`` and, with a model, the
   reviewer against the plan.

A failed attempt's reasons (deterministic texts: no paths, no times) go to the next
attempt, at most ``max_attempts`` (default ``MAX_DAY_ATTEMPTS``); a day that passes is
appended to the store. Everything that reaches the model is a function of the plan, the
world and earlier outputs, so a run's replay makes the same requests, answered from its
recordings, and the same day: the same world hash.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from gates.agents import take_step
from gates.contract import ShellStep, ToolStep
from gates.llm_agent import SHELL_TOOL, mcp_tool, shown
from replay.engine import Worlds
from replay.files import remove_tree
from synth.errors import SynthError
from synth.prompts import prompt
from synth.stage import Context
from synth.worlds.applib import LibraryApp, app_payloads, check_app, taken_services
from synth.worlds.days import EpisodeDay, Event, day_from_episode, store_day
from synth.worlds.personas import BibleOut
from synth.worlds.plans import PlanOut
from synth.worlds.reviewer import LLMReviewer
from synth.worlds.skills import Skill, lesson, skills_of_day, skills_text
from synth.worlds.validate_day import DayReport, validate_day
from worldenv.core.episode import Call, DbChange, Episode, FileChange, GuiCall, ShellCall
from worldenv.instances.episodes import content_id, save_episode
from worldenv.instances.instance import SQL_CALL, Environment, Instance
from worldllm.client import Completion, Message, assistant_message, function_tool, object_parameters
from worldstore.errors import WorldError
from worldstore.events import blob_of
from worldstore.open import open_event_store
from worldstore.store import EventStore, NewDay

MAX_STEPS = 40
MAX_DAY_ATTEMPTS = 3
MAX_INVALID_STEPS = 3
STEP_TOKENS = 4096
BEGIN, DONE, CREATE_APP = "begin", "done", "create_app"
IMPLEMENTER = "synth:implement"  # the agent name of the implementer's stored episodes
# A re-execution's shell runs 14 hours east of the first run's UTC (and a second later at
# least), so `date` in any form differs between the two.
REEXECUTION_ENV = {"TZ": "Pacific/Kiritimati"}
REEXECUTION_GAP_S = 1.05

SQL_TOOL = function_tool(
    SQL_CALL, "Run SQL on one service's database (the rules of a stored event: one "
              "service, no ATTACH, no transactions, no host pragmas). Returns the rows and "
              "how many rows it changed.",
    {"type": "object", "required": ["service", "sql"], "additionalProperties": False,
     "properties": {"service": {"type": "string", "description": "The service, e.g. chat"},
                    "sql": {"type": "string", "description": "The SQL"},
                    "params": {"type": "array", "description": "Values bound to ? marks"}}})
BEGIN_TOOL = function_tool(
    BEGIN, "Start one of the plan's activities: the clock moves to its time.",
    object_parameters({"activity": {"type": "integer",
                                    "description": "The activity's number in the plan (1..)"}}))
CREATE_APP_TOOL = function_tool(
    CREATE_APP, "Write a new app when the plan needs a service the world lacks: its schema "
                "(CREATE statements) and its code in the app contract (worldenv.core.app: app = "
                "App(service=..., name=..., version=...), tools with @app.tool). It is "
                "checked at once; once accepted, the world serves it from the next day.",
    {"type": "object", "required": ["service", "description", "schema", "code"],
     "additionalProperties": False,
     "properties": {"service": {"type": "string", "description": "The new service's name"},
                    "description": {"type": "string", "description": "What it is for"},
                    "schema": {"type": "array", "items": {"type": "string"},
                               "description": "The CREATE statements of its database"},
                    "code": {"type": "string", "description": "The app's Python module"}}})
DONE_TOOL = function_tool(
    DONE, "End the day: every activity is done.",
    {"type": "object", "required": ["summary"], "additionalProperties": False,
     "properties": {"summary": {"type": "string", "description": "What the day did"},
                    "produces": {"type": "object",
                                 "description": "What the day produces (produces.json)"}}})

Status = Literal["stored", "failed"]


class DayAttempt(msgspec.Struct, frozen=True):
    """One implementation of the day and what its checks said."""

    number: int
    steps: int
    stopped: str  # "done", "step_limit" or "format_error"
    calls: int  # calls the episode recorded
    events: int  # the day's events (0 when no day could be made)
    world_hash: str | None  # the candidate day's world (once re-execution showed it is one)
    layers: list[dict[str, str]]  # [{"layer", "status", "reason"}] of what ran
    problem: str | None  # why the attempt was refused; None: it passed
    tokens: int
    apps: list[dict[str, Any]] = []  # each create_app: service, accepted, problems


class DayOutcome(msgspec.Struct, frozen=True):
    persona: str
    day: int
    status: Status
    world_hash: str | None
    attempts: list[DayAttempt]
    skills: list[str] = []  # the keys of the library's skills the implementer was given
    learned: list[Skill] = []  # what the day adds to the library
    apps: list[LibraryApp] = []  # the apps the stored day added (to the app library)

    @property
    def tokens(self) -> int:
        return sum(a.tokens for a in self.attempts)


@dataclass
class _Work:
    """What one attempt's agent did."""

    steps: int = 0
    stopped: str = "step_limit"
    tokens: int = 0
    produces: dict[str, Any] | None = None
    started: float = field(default_factory=time.monotonic)
    taken: set[str] = field(default_factory=set)  # service names a new app may not take
    made_by: str = ""
    apps: list[LibraryApp] = field(default_factory=list)  # accepted by the app stage
    episode: Episode | None = None  # the attempt's episode, once it is over
    app_log: list[dict[str, Any]] = field(default_factory=list)


def implement_day(ctx: Context, worlds: Worlds, bible: BibleOut, plan: PlanOut, *,
                  max_attempts: int = MAX_DAY_ATTEMPTS, review: bool = True,
                  max_steps: int = MAX_STEPS, skills: Sequence[Skill] = (),
                  library: Mapping[str, LibraryApp] | None = None) -> DayOutcome:
    """Day `plan.day` of `bible`'s persona, implemented, validated and stored (see the
    module docstring), the implementer given `skills` (``synth.worlds.skills``) and the app
    `library` (``synth.worlds.applib``: its services are taken names). The day before
    it must be the persona's last stored day. The outcome's ``learned`` are the skills the
    stored day shows and the lessons of its refused attempts."""
    persona, day = bible.name, plan.day
    days = [r.day for r in worlds.store.days(persona)]
    if not days:
        raise SynthError(f"persona {persona!r} has no world in the store yet (day 0 comes "
                         "first)")
    if days[-1] != day - 1:
        raise SynthError(f"{persona}: day {day} comes after day {day - 1}, but the store's "
                         f"last day of {persona} is {days[-1]}")
    reviewer = LLMReviewer(ctx.client.metered(ctx.budget)) if review else None
    attempts: list[DayAttempt] = []
    given = [s.key for s in skills]
    with Environment(worlds) as env:
        for number in range(1, max_attempts + 1):
            attempt, made, work = _attempt(ctx, worlds, env, bible, plan, attempts,
                                           number, max_steps, reviewer, skills,
                                           library or {})
            attempts.append(attempt)
            if made is not None:
                assert work.episode is not None  # set by every attempt
                record = store_day(worlds, made, source=f"<synth day {persona}@{day}>")
                shown = skills_of_day(work.episode, worlds.snapshot(persona, day),
                                      bible.services, f"{persona}@{day}")
                return DayOutcome(persona, day, "stored", record.world_hash, attempts,
                                  given, [*_lessons(persona, day, attempts), *shown],
                                  list(work.apps))
    return DayOutcome(persona, day, "failed", None, attempts, given,
                      _lessons(persona, day, attempts))


def _lessons(persona: str, day: int, attempts: Sequence[DayAttempt]) -> list[Skill]:
    return [lesson(f"a day was refused by {a.problem}", f"{persona}@{day} attempt {a.number}")
            for a in attempts if a.problem]


def _attempt(ctx: Context, worlds: Worlds, env: Environment, bible: BibleOut, plan: PlanOut,
             earlier: Sequence[DayAttempt], number: int, max_steps: int,
             reviewer: LLMReviewer | None, skills: Sequence[Skill],
             library: Mapping[str, LibraryApp]) -> tuple[DayAttempt, EpisodeDay | None, _Work]:
    ref = f"{bible.name}@{plan.day - 1}"
    with env.open(ref) as instance:
        work = _Work(taken=taken_services(instance.mount.manifest.services, library),
                     made_by=f"{bible.name}@{plan.day}")
        _run_agent(ctx, instance, bible, plan, earlier, max_steps, skills, work)
        episode = msgspec.structs.replace(instance.episode, final_hash=instance.hash(),
                                          agent=IMPLEMENTER)
    # Kept for whoever debugs the day (`worldctl episode list --agent synth:implement`);
    # not part of the run's outputs, since a command's output printed to the terminal
    # (not written to the world) may differ from one run to the next.
    episode = msgspec.structs.replace(episode, episode_id=content_id(episode))
    save_episode(worlds, episode)
    work.episode = episode

    def refused(problem: str, layers: list[dict[str, str]] | None = None,
                events: int = 0, world: str | None = None
                ) -> tuple[DayAttempt, None, _Work]:
        return DayAttempt(number, work.steps, work.stopped, len(episode.calls), events,
                          world, layers or [], problem, work.tokens, work.app_log), None, work

    if work.stopped != DONE:
        return refused(f"the implementer did not call `done` ({work.stopped.replace('_', ' ')} "
                       f"after {work.steps} steps)")
    try:
        made = day_from_episode(worlds, episode, before=_app_events(work, plan, episode))
    except SynthError as exc:
        return refused(f"the episode is not a day: {exc}")
    differs = _reexecution_difference(env, ref, episode, work.started)
    if differs is not None:
        layer = {"layer": "replay", "status": "failed", "reason": differs}
        # (no world hash: a world that differs from one run to the next has none to keep)
        return refused(f"replay: {differs}", [layer], made.events)
    try:
        report = validate_candidate(worlds, made, produces=work.produces, reviewer=reviewer,
                                    plan=_plan_text(plan))
    except WorldError as exc:
        return refused(f"the day cannot be validated: {exc}", [], made.events, made.world_hash)
    layers = [{"layer": r.layer, "status": r.status, "reason": r.reason} for r in report.layers]
    failed = next((r for r in report.layers if r.status == "failed"), None)
    if failed is not None:
        return refused(f"{failed.layer}: {failed.reason}", layers, made.events, made.world_hash)
    return DayAttempt(number, work.steps, work.stopped, len(episode.calls), made.events,
                      made.world_hash, layers, None, work.tokens, work.app_log), made, work


def _app_events(work: _Work, plan: PlanOut, episode: Episode) -> list[Event]:
    """The new apps' pins and schemas, first among the day's events: at the day's first
    call's time (or the plan's first activity's, when there is none)."""
    calls = episode.calls
    ts = calls[0].ts if calls else activity_ts(plan, 1)
    return [(ts, payload, blob) for app in work.apps for payload, blob in app_payloads(app)]


# --- the agent --------------------------------------------------------------------------


def _run_agent(ctx: Context, instance: Instance, bible: BibleOut, plan: PlanOut,
               earlier: Sequence[DayAttempt], max_steps: int, skills: Sequence[Skill],
               work: _Work) -> None:
    infos = instance.list_tools()
    tools = [*(mcp_tool(t) for t in infos), SQL_TOOL, SHELL_TOOL, BEGIN_TOOL,
             CREATE_APP_TOOL, DONE_TOOL]
    known = {t.name for t in infos} | {SQL_CALL, "shell", BEGIN, CREATE_APP, DONE}
    messages: list[Message] = [{"role": "system", "content": prompt("implement").system()},
                               {"role": "user", "content": _request(bible, plan, earlier,
                                                                    skills)}]
    invalid = 0
    while work.steps < max_steps:
        reply = _complete(ctx, messages, tools)
        work.steps += 1
        work.tokens += reply.tokens_in + reply.tokens_out
        messages.append(assistant_message(reply))
        if not reply.tool_calls:
            messages.append({"role": "user", "content": "You did not call a tool. Go on with "
                             "the plan's next activity, or call `done` when every one is "
                             "done."})
            invalid += 1
        else:
            executed = False
            for call in reply.tool_calls:
                text, ran, finished = _act(instance, plan, call.name, call.arguments, known,
                                           work)
                executed = executed or ran
                messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
                if finished:
                    work.stopped = DONE
                    return
            invalid = 0 if executed else invalid + 1
        if invalid >= MAX_INVALID_STEPS:
            work.stopped = "format_error"
            return


def _complete(ctx: Context, messages: list[Message], tools: list[dict[str, Any]]
              ) -> Completion:
    ctx.budget.check()
    reply = ctx.client.complete(messages, tools=tools, temperature=0.0,
                                max_tokens=STEP_TOKENS)
    if not reply.from_recording:
        ctx.budget.charge(reply.tokens_in + reply.tokens_out, reply.cost)
    return reply


def _act(instance: Instance, plan: PlanOut, name: str, arguments_text: str,
         known: set[str], work: _Work) -> tuple[str, bool, bool]:
    """(what the model is shown, whether the call ran, whether the day is done)."""
    if name not in known:
        return (f"[error] Not executed: there is no tool {name!r}. Valid tools: "
                f"{', '.join(sorted(known))}", False, False)
    try:
        arguments = json.loads(arguments_text) if arguments_text.strip() else {}
    except json.JSONDecodeError as exc:
        return f"[error] Not executed: the arguments are not JSON ({exc})", False, False
    if not isinstance(arguments, dict):
        return "[error] Not executed: the arguments must be a JSON object", False, False
    if name == DONE:
        produces = arguments.get("produces")
        if produces is not None and not isinstance(produces, dict):
            return "[error] Not executed: `produces` must be a JSON object", False, False
        work.produces = produces
        return "The day is over.", True, True
    if name == BEGIN:
        return _begin(instance, plan, arguments.get("activity"))
    if name == CREATE_APP:
        return _create_app(work, arguments)
    if name == SQL_CALL:
        service, sql, params = (arguments.get("service"), arguments.get("sql"),
                                arguments.get("params", []))
        if not isinstance(service, str) or not isinstance(sql, str) or \
                not isinstance(params, list):
            return ("[error] Not executed: `sql` takes service (a string), sql (a string) "
                    "and params (a list)", False, False)
        result = instance.sql(service, sql, params)
        return shown(result.text, result.is_error), True, False
    if name == "shell":
        command = arguments.get("command")
        if not isinstance(command, str):
            return "[error] Not executed: `shell` takes command (a string)", False, False
        turn = take_step(instance, 0, ShellStep(command=command))
    else:
        turn = take_step(instance, 0, ToolStep(tool=name, arguments=arguments))
    return shown(turn.observation, turn.is_error), True, False


def _begin(instance: Instance, plan: PlanOut, number: object) -> tuple[str, bool, bool]:
    if not isinstance(number, int) or not 1 <= number <= len(plan.activities):
        return (f"[error] Not executed: `activity` is a number from 1 to "
                f"{len(plan.activities)}", False, False)
    activity = plan.activities[number - 1]
    ts = activity_ts(plan, number)
    try:
        instance.set_clock(ts)
    except WorldError as exc:
        return f"[error] {exc}", False, False
    where = activity.tool or activity.file or ""
    return (f"The clock is {ts}. Activity {number}: {activity.what}"
            + (f" ({activity.interface}: {where})" if where else ""), True, False)


def _create_app(work: _Work, arguments: dict[str, Any]) -> tuple[str, bool, bool]:
    service, description = arguments.get("service"), arguments.get("description")
    schema, code = arguments.get("schema"), arguments.get("code")
    if not (isinstance(service, str) and isinstance(description, str)
            and isinstance(code, str) and isinstance(schema, list)
            and all(isinstance(s, str) for s in schema)):
        return ("[error] Not executed: `create_app` takes service, description and code "
                "(strings) and schema (a list of strings)", False, False)
    app, problems = check_app(service, description, schema, code, taken=work.taken,
                              made_by=work.made_by)
    work.app_log.append({"service": service, "accepted": app is not None,
                         "problems": problems})
    if app is None:
        return ("[error] The app stage refused the app:\n"
                + "\n".join(f"- {p}" for p in problems), True, False)
    work.apps.append(app)
    work.taken.add(app.service)
    return (f"App {app.service} accepted with tools {', '.join(app.tools)}. It is part of "
            "this day; its tools serve the world from the next day.", True, False)


def activity_ts(plan: PlanOut, number: int) -> str:
    """When activity `number` (1-based) of `plan` starts."""
    return f"{plan.date}T{plan.activities[number - 1].time}:00Z"


def _request(bible: BibleOut, plan: PlanOut, earlier: Sequence[DayAttempt],
             skills: Sequence[Skill]) -> str:
    people = ", ".join(f"{c.name} ({c.relation})" for c in bible.contacts)
    lines = [f"Persona: {bible.name}, {bible.occupation} ({bible.life_domain}). "
             f"Contacts: {people}. Services: {', '.join(sorted(bible.services))}.",
             "", f"The plan of day {plan.day}:", _plan_text(plan)]
    if skills:
        lines += ["", "Skills from earlier days (what worked, what was refused):",
                  skills_text(skills)]
    refused = [a for a in earlier if a.problem]
    if refused:
        lines += ["", "Earlier attempts at this day were refused by its checks:"]
        lines += [f"- attempt {a.number}: {a.problem}" for a in refused]
        lines += ["Write the whole day again with these fixed."]
    return "\n".join(lines)


def _plan_text(plan: PlanOut) -> str:
    lines = [f"Day {plan.day}, {plan.date}: {plan.summary}"]
    for number, a in enumerate(plan.activities, 1):
        where = a.tool or a.file or ""
        lines.append(f"{number}. {a.time} [{a.interface}{': ' + where if where else ''}] "
                     f"{a.what}" + (f" (arc: {a.arc})" if a.arc else ""))
    return "\n".join(lines)


# --- re-execution -----------------------------------------------------------------------


def _reexecution_difference(env: Environment, ref: str, episode: Episode,
                            started: float) -> str | None:
    """Why the episode's calls, run again on a fresh instance of `ref`, do not have the
    same effects; None when they do."""
    calls = episode.calls
    if any(isinstance(c, ShellCall) for c in calls):
        time.sleep(max(0.0, REEXECUTION_GAP_S - (time.monotonic() - started)))
    with env.open(ref) as again:
        for call in calls:
            again.set_clock(call.ts)
            if isinstance(call, ShellCall):
                again.shell(call.command, env=REEXECUTION_ENV)
            elif isinstance(call, GuiCall):
                again.gui(call.action, dict(call.arguments))
            elif call.tool == SQL_CALL:
                args = call.arguments
                params = args.get("params")
                again.sql(str(args.get("service")), str(args.get("sql")),
                          params if isinstance(params, list) else [])
            else:
                again.call_tool(call.tool, dict(call.arguments))
        rerun = again.episode
    first, second = _effects(episode), _effects(rerun)
    for index in sorted(set(first) | set(second)):
        if first.get(index) != second.get(index):
            call = next(c for c in calls if c.index == index)
            what = _what_differs(first.get(index, []), second.get(index, []))
            return (f"call #{index} ({_call_text(call)}) had other effects when run again "
                    f"from the same world at the same clock ({what}): "
                    "it reads the machine's clock, randomness or the machine itself; write "
                    "literal values, with times from the plan's clock")
    return None


def _effects(episode: Episode) -> dict[int, list[tuple[str, str, bytes | None]]]:
    found: dict[int, list[tuple[str, str, bytes | None]]] = {}
    for event in episode.events:
        if isinstance(event, DbChange):
            found.setdefault(event.index, []).append(("service", event.service,
                                                      event.changeset))
        elif isinstance(event, FileChange):
            data = event.data if event.link is None else event.link.encode()
            found.setdefault(event.index, []).append(("file", event.path, data))
    return found


def _what_differs(a: list[tuple[str, str, bytes | None]],
                  b: list[tuple[str, str, bytes | None]]) -> str:
    names = sorted({f"{kind} {name!r}" for kind, name, _ in set(a) ^ set(b)})
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _call_text(call: Call) -> str:
    if isinstance(call, ShellCall):
        command = call.command if len(call.command) <= 120 else call.command[:117] + "..."
        return f"shell `{command}`"
    if isinstance(call, GuiCall):
        return f"gui_{call.action}"
    return f"tool {call.tool}"


# --- validation before commit -----------------------------------------------------------


def validate_candidate(worlds: Worlds, made: EpisodeDay, *,
                       produces: dict[str, Any] | None = None,
                       reviewer: LLMReviewer | None = None,
                       plan: str | None = None) -> DayReport:
    """The five layers on a day not yet stored: in a scratch store (beside the snapshot
    cache, which it shares) holding the persona's stored days, copied as they are (no day
    is applied again), and the candidate, imported on top of the day before's snapshot;
    with the names the real store's other personas reserve."""
    scratch = worlds.cache.scratch()
    try:
        candidate = Worlds(open_event_store(scratch / "candidate.sqlite"), worlds.cache)
        try:
            copy_persona(worlds.store, candidate.store, made.persona)
            candidate.import_stream(io.BytesIO(made.lines),
                                    source=f"<candidate {made.persona}@{made.day}>")
            with Environment(candidate) as env:
                return validate_day(candidate, f"{made.persona}@{made.day}", produces=produces,
                                    reviewer=reviewer, env=env, plan=plan, reserved_by=worlds)
        finally:
            candidate.close()
    finally:
        remove_tree(scratch)


def copy_persona(source: EventStore, dest: EventStore, persona: str) -> None:
    """Every stored day of `persona` from `source` into `dest` (which has none of it):
    records, events and blobs as they are, so nothing is replayed."""
    for record in source.days(persona):
        events = list(source.events(persona, record.first_seq, record.last_seq))
        digests = {d for d in (blob_of(e.payload) for e in events) if d is not None}
        dest.append_day(NewDay(record=record, events=events,
                               blobs={d: source.blob(d) for d in sorted(digests)}),
                        expected_last_seq=record.first_seq - 1)


__all__ = ["MAX_DAY_ATTEMPTS", "MAX_STEPS", "DayAttempt", "DayOutcome", "activity_ts",
           "copy_persona", "implement_day", "validate_candidate"]
