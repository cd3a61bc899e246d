"""Day plans (methods.md section 4, "day planning"): what a persona does on day N, before
any of it is written into the world.

The planner (``PlanStage``) reads the persona's bible, every earlier day's plan, what the
world holds through day N-1 (row counts per service table, the workspace's files, and
what an explorer with read-only tools over it found: ``synth.worlds.explore``) and a
**coverage-pressure block** computed from the store (``coverage``): per service and per
workspace area (a path's first folder), how many events each earlier day wrote, and which
of the persona's services have been used least, so that interfaces spread across days.
A plan is a dated list of timed activities, each through one interface: a service's tool
(``mcp``) or a workspace file (``shell``). ``plan_problems`` checks it: the day and a date
after the last plan's, times in order, every tool one of the persona's services has, every
file a valid workspace path, every arc named one of the bible's, and every arc the bible
schedules on this day advanced by at least one activity. The stage self-corrects like
every stage.

What a plan reads from the store is kept with the run (``WorldFacts``, in the run's
inputs), so a replay plans from the same facts whatever store it runs beside.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, ClassVar, Literal

import msgspec

from replay.engine import Worlds
from synth.stage import Measure, Stage
from synth.worlds.personas import BibleOut
from worldstore.errors import WorldError
from worldstore.events import FileDeletePayload, FileWritePayload, SqlPayload, StoredEvent
from worldstore.names import check_relpath, ts_key

MAX_ACTIVITIES = 40
SHOWN_FILES = 60
_TIME = re.compile(r"([01][0-9]|2[0-3]):[0-5][0-9]")
ROOT_AREA = "(workspace root)"


class ActivityOut(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    time: str  # "HH:MM" on the plan's date
    interface: Literal["mcp", "shell"]
    what: str
    tool: str | None = None  # mcp: "<service>_<tool>"
    file: str | None = None  # shell: the workspace file made, changed or removed
    arc: str | None = None  # the bible arc it advances, by title


class PlanOut(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    day: int
    date: str  # YYYY-MM-DD
    summary: str
    activities: list[ActivityOut]


class WorldFacts(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What a plan reads from the store about the world through day N-1."""

    days: list[int]  # the earlier days the store holds, ascending
    services: dict[str, list[int]]  # service -> events per earlier day (in `days` order)
    areas: dict[str, list[int]]  # workspace area -> file events per earlier day
    tables: dict[str, int]  # "service.table" -> rows on day N-1
    files: list[str]  # the workspace's files on day N-1 (the first SHOWN_FILES)
    more_files: int = 0
    last_ts: str = ""  # the world's last event before day N ("" when none)


def area_of(path: str) -> str:
    """A workspace path's area: its first folder (``photos/`` of ``photos/a.jpg``)."""
    head, sep, _ = path.partition("/")
    return f"{head}/" if sep else ROOT_AREA


def coverage(events: Iterable[StoredEvent], before_day: int) -> tuple[
        list[int], dict[str, list[int]], dict[str, list[int]]]:
    """Per-day histograms of the events of days before `before_day` (day 0, the world's
    set-up, excluded): the days seen, events per service, file events per area."""
    per_service: dict[str, dict[int, int]] = {}
    per_area: dict[str, dict[int, int]] = {}
    days: set[int] = set()
    for event in events:
        if not 0 < event.day < before_day:
            continue
        days.add(event.day)
        payload = event.payload
        if isinstance(payload, SqlPayload):
            bucket = per_service.setdefault(payload.service, {})
            bucket[event.day] = bucket.get(event.day, 0) + 1
        elif isinstance(payload, (FileWritePayload, FileDeletePayload)):
            bucket = per_area.setdefault(area_of(payload.path), {})
            bucket[event.day] = bucket.get(event.day, 0) + 1
    order = sorted(days)

    def rows(found: dict[str, dict[int, int]]) -> dict[str, list[int]]:
        return {k: [found[k].get(d, 0) for d in order] for k in sorted(found)}

    return order, rows(per_service), rows(per_area)


def pressure_block(facts: WorldFacts, bible: BibleOut) -> str:
    """The coverage-pressure block of the planner's request (deterministic text)."""
    if not facts.days:
        return ("Coverage so far: no earlier day. Use several of the persona's services "
                "today.")
    span = f"days {facts.days[0]}-{facts.days[-1]}" if len(facts.days) > 1 else \
        f"day {facts.days[0]}"
    lines = [f"Coverage so far (events per day, {span}):"]
    for service in sorted(set(bible.services) | set(facts.services)):
        counts = facts.services.get(service)
        lines.append(f"- {service}: " + (" ".join(map(str, counts)) + f" (total {sum(counts)})"
                                         if counts else "never used"))
    for area, counts in facts.areas.items():
        lines.append(f"- files {area}: {' '.join(map(str, counts))} (total {sum(counts)})")
    totals = {s: sum(facts.services.get(s, [])) for s in bible.services}
    least = min(totals.values()) if totals else 0
    under = sorted(s for s, n in totals.items() if n == least)
    lines.append(f"Least used of the persona's services: {', '.join(under)}. Prefer them "
                 "today.")
    return "\n".join(lines)


def plan_problems(plan: PlanOut, bible: BibleOut, library: Mapping[str, Sequence[str]],
                  day: int, previous_date: str | None,
                  services: Collection[str] | None = None, after: str = "") -> list[str]:
    """Why the plan cannot be day `day` of the persona (deterministic texts). `services`:
    those whose tools the plan may use (default: the bible's); `after`: the world's last
    event's timestamp, which the day's first activity must come after."""
    problems: list[str] = []
    if plan.day != day:
        problems.append(f"the plan is for day {plan.day}, not day {day}")
    dated = _date_problems(plan.date, previous_date)
    problems += dated
    if not dated and after and plan.activities and _TIME.fullmatch(plan.activities[0].time):
        start = f"{plan.date}T{plan.activities[0].time}:00Z"
        if ts_key(start) <= ts_key(after):
            problems.append(f"the day starts at {start}, not after the world's last event "
                            f"({after}): date the day later")
    if not 1 <= len(plan.activities) <= MAX_ACTIVITIES:
        problems.append(f"{len(plan.activities)} activities; a day has 1 to {MAX_ACTIVITIES}")
    tools = {t for s in (bible.services if services is None else services)
             for t in library.get(s, ())}
    arcs = {a.title for a in bible.arcs}
    last = ""
    for i, act in enumerate(plan.activities, 1):
        where = f"activity {i} ({act.time})"
        if not _TIME.fullmatch(act.time):
            problems.append(f"{where}: the time must be HH:MM")
        elif act.time < last:
            problems.append(f"{where}: comes before the activity above it")
        else:
            last = act.time
        problems += _interface_problems(where, act, tools)
        if act.arc is not None and act.arc not in arcs:
            problems.append(f"{where}: arc {act.arc!r} is not one of the bible's")
    advanced = {act.arc for act in plan.activities}
    for arc in bible.arcs:
        if day in arc.days and arc.title not in advanced:
            problems.append(f"arc {arc.title!r} is scheduled on day {day} but no activity "
                            "advances it")
    return problems


def _date_problems(date: str, previous: str | None) -> list[str]:
    try:
        parsed = dt.date.fromisoformat(date)
    except ValueError:
        return [f"date {date!r} is not YYYY-MM-DD"]
    if len(date) != 10:
        return [f"date {date!r} is not YYYY-MM-DD"]
    if previous is not None and parsed <= dt.date.fromisoformat(previous):
        return [f"date {date} is not after the last plan's date {previous}"]
    return []


def _interface_problems(where: str, act: ActivityOut, tools: set[str]) -> list[str]:
    if act.interface == "mcp":
        if act.tool is None:
            return [f"{where}: an mcp activity names its tool"]
        if act.tool not in tools:
            return [f"{where}: tool {act.tool} is not a tool of the persona's services"]
        return []
    if act.file is None:
        return [f"{where}: a shell activity names the workspace file it touches"]
    try:
        check_relpath(act.file)
    except WorldError as exc:
        return [f"{where}: file {act.file!r}: {exc}"]
    return []


def world_facts(worlds: Worlds, persona: str, day: int) -> WorldFacts:
    """What the store holds of `persona` before `day`: the coverage histograms and, from
    the manifest of the latest stored day before it, row counts and workspace files."""
    store = worlds.store
    if store.persona(persona) is None:
        return WorldFacts([], {}, {}, {}, [])
    days, services, areas = coverage(store.events(persona), day)
    earlier = [r for r in store.days(persona) if r.day < day]
    if not earlier:
        return WorldFacts(days, services, areas, {}, [])
    before = max(earlier, key=lambda r: r.day)
    manifest = worlds.manifest(before)
    tables = {f"{service}.{table}": digest.rows
              for service, m in sorted(manifest.services.items())
              for table, digest in sorted(m.tables.items()) if not table.startswith("sqlite_")}
    files = sorted(manifest.files)
    return WorldFacts(days, services, areas, tables, files[:SHOWN_FILES],
                      max(0, len(files) - SHOWN_FILES), before.last_ts)


class PlanStage(Stage[PlanOut]):
    name = "plan"
    threshold = 0.0
    output_type: ClassVar[type] = PlanOut
    max_tokens = 4096

    def __init__(self, bible: BibleOut, library: Mapping[str, Sequence[str]], day: int,
                 earlier: Sequence[PlanOut], facts: WorldFacts, explored: str = "") -> None:
        """`explored`: what exploring the world through day N-1 found (``synth.worlds.explore``)."""
        self.bible = bible
        self.explored = explored
        # The persona's services, and those its world has gained (an app a day wrote).
        services = set(bible.services) | {t.split(".", 1)[0] for t in facts.tables}
        self.library = {s: list(library[s]) for s in sorted(services) if s in library}
        self.day = day
        self.earlier = sorted(earlier, key=lambda p: p.day)
        self.facts = facts

    @property
    def previous_date(self) -> str | None:
        return self.earlier[-1].date if self.earlier else None

    def inputs(self) -> Any:
        found = {"bible": msgspec.to_builtins(self.bible), "library": self.library,
                 "day": self.day, "earlier": msgspec.to_builtins(self.earlier),
                 "facts": msgspec.to_builtins(self.facts)}
        if self.explored:  # (absent when none: plans made without keep their keys)
            found["explored"] = self.explored
        return found

    def request(self) -> str:
        b = self.bible
        lines = [f"Persona: {b.name}, {b.occupation} ({b.life_domain})",
                 "Contacts: " + ", ".join(f"{c.name} ({c.relation})" for c in b.contacts),
                 "Story arcs:"]
        lines += [f"- {a.title} (days {', '.join(map(str, a.days))}"
                  + (f"; decided by the image {a.image}" if a.image else "") + f"): {a.summary}"
                  for a in b.arcs]
        lines += ["", "Tools of the persona's services:"]
        lines += [f"- {s}: {', '.join(t)}" for s, t in self.library.items()]
        lines += ["", f"Plan day {self.day}."]
        if self.earlier:
            lines += ["Earlier days:"]
            lines += [f"- day {p.day} ({p.date}): {p.summary}" for p in self.earlier]
        lines += ["", "The world through the day before"
                  + (f" (its last event at {self.facts.last_ts}; the day comes after it):"
                     if self.facts.last_ts else ":")]
        lines += [f"- {t}: {n} rows" for t, n in sorted(self.facts.tables.items())] or [
            "- no service data yet"]
        if self.facts.files:
            more = f" (and {self.facts.more_files} more)" if self.facts.more_files else ""
            lines.append(f"- workspace files: {', '.join(self.facts.files)}{more}")
        lines += ["", pressure_block(self.facts, b)]
        if self.explored:
            lines += ["", "What exploring the world through the day before found:",
                      self.explored]
        return "\n".join(lines)

    def execute(self, output: PlanOut) -> Measure:
        problems = plan_problems(output, self.bible, self.library, self.day,
                                 self.previous_date, services=self.library,
                                 after=self.facts.last_ts)
        checks = 4 + len(output.activities)
        return Measure(min(1.0, len(problems) / checks), tuple(problems),
                       {"activities": len(output.activities),
                        "interfaces": sorted({a.interface for a in output.activities})})


__all__ = [
    "ActivityOut",
    "PlanOut",
    "PlanStage",
    "WorldFacts",
    "area_of",
    "coverage",
    "plan_problems",
    "pressure_block",
    "world_facts",
]
