"""Import a directory of AWM files: one world (and its task folders) per scenario.

Per scenario: read (``awmbridge.formats``), pre-run and plan day 0 (``awmbridge.world``), import it
through the store's own import (``Worlds.import_stream``: validated, applied, hashed and
committed atomically, never a partial day), count its rows in the stored world, and write
its task folders (``awmbridge.tasks``) when asked.

**Refusals.** A file that is not AWM's format refuses the whole import (nothing stored).
A scenario with a problem is refused alone (``ImportReport.refused``) and the others are
imported; with ``strict`` nothing at all is stored if any scenario is refused. With
``tasks_out``, every task folder target is checked (``awmbridge.tasks.check_task_targets``: no
link, no foreign folder of a task's name, a folder for ``tasks_out``) before the first
world is stored, so a scenario refused for its task folders stores nothing.

**Importing again.** Day 0 is a pure function of the files, so importing the same
scenario again is a no-op (status ``unchanged``). A persona that already holds a
different day 0 (other AWM files, or another world of the same name) is refused with a
message saying so; nothing is changed.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from awmbridge.errors import AwmError, ScenarioRefused
from awmbridge.formats import AwmFiles, Origin, Scenario, read_awm_dir, unverified_tasks
from awmbridge.world import (
    AWM_SERVICE,
    Day0,
    DroppedStatement,
    check_dropped,
    persona_for,
    plan_day0,
)
from replay.engine import DayResult, Worlds
from replay.errors import ApplyError
from worldenv.awm.host import route_count
from worldstore.errors import NotFoundError, WorldError


@dataclass(frozen=True, slots=True)
class ScenarioReport:
    """One imported scenario. `tables` in AWM's order (then any others the DDL made),
    `rows` per table as counted in the stored world; `tools` is the number of routes of
    the server code (0 without code); `tasks_written` is None without ``tasks_out``."""

    scenario: str
    persona: str
    status: str  # "imported", or "unchanged" when the store held this day 0 already
    world_hash: str
    tables: tuple[str, ...]
    rows: dict[str, int]
    statements: int
    dropped: tuple[DroppedStatement, ...]
    tools: int
    tasks: tuple[Path, ...] | None = None  # the task folders written (None: not asked)
    unverified: tuple[int, ...] = ()  # indexes of AWM tasks with no verifier (no folder)

    @property
    def tasks_written(self) -> int | None:
        return None if self.tasks is None else len(self.tasks)

    def as_dict(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "persona": self.persona, "status": self.status,
                "world_hash": self.world_hash, "tables": list(self.tables),
                "rows": self.rows, "statements": self.statements,
                "dropped": [d.as_dict() for d in self.dropped], "tools": self.tools,
                "tasks_written": self.tasks_written,
                "tasks": None if self.tasks is None else [str(p) for p in self.tasks],
                "tasks_without_verifier": list(self.unverified)}


@dataclass(frozen=True, slots=True)
class Skipped:
    """A seed only gen_scenario.jsonl names: no database, so no world (not an error)."""

    scenario: str
    origin: Origin

    @property
    def reason(self) -> str:
        return "only a description in gen_scenario.jsonl: no database, no world"

    def as_dict(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "file": self.origin.file,
                "line": self.origin.line, "reason": self.reason}


@dataclass(slots=True)
class ImportReport:
    imported: list[ScenarioReport] = field(default_factory=list)
    refused: list[ScenarioRefused] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    # With strict: scenarios that were fine but not stored because another was refused.
    not_stored: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.refused

    def as_dict(self) -> dict[str, Any]:
        return {"scenarios": [r.as_dict() for r in self.imported],
                "refused": [{"scenario": r.scenario, "problems": list(r.problems)}
                            for r in self.refused],
                "skipped": [s.as_dict() for s in self.skipped],
                "not_stored": self.not_stored}


def import_awm(worlds: Worlds, directory: Path, *, scenarios: Sequence[str] | None = None,
               strict: bool = False, tasks_out: Path | None = None) -> ImportReport:
    """Import the scenarios of an AWM directory (all, or those named in `scenarios`)."""
    files = read_awm_dir(directory)
    chosen = select_scenarios(files, scenarios)
    write_tasks = _task_writer() if tasks_out is not None else None
    report = ImportReport()
    if not scenarios:
        report.skipped = [Skipped(name, origin) for name, origin in
                          files.described_only.items()]
    if tasks_out is not None:
        chosen = _writable_tasks(chosen, tasks_out, report)
    days = _plan_all(worlds, chosen, strict, report)
    for day, result in _store(worlds, days, chosen, strict, report):
        scenario = chosen[day.scenario]
        written = None
        if write_tasks is not None and tasks_out is not None:
            written = _tasks_of(scenario, day, result, write_tasks, tasks_out, report)
        report.imported.append(_scenario_report(worlds, scenario, day, result, written))
    return report


def _store(worlds: Worlds, days: list[Day0], chosen: dict[str, Scenario], strict: bool,
           report: ImportReport) -> list[tuple[Day0, DayResult]]:
    """Import the planned days: each on its own, or with strict all in one import and
    only if no scenario was refused (the others are then listed as not stored)."""
    if not strict:
        return _store_each(worlds, days, chosen, report)
    if report.refused:
        report.not_stored = [day.scenario for day in days]
        return []
    try:
        return _store_together(worlds, days, chosen)
    except ScenarioRefused as refused:
        report.refused.append(refused)
        report.not_stored = [d.scenario for d in days if d.scenario != refused.scenario]
        return []


def _writable_tasks(chosen: dict[str, Scenario], out: Path,
                   report: ImportReport) -> dict[str, Scenario]:
    """The scenarios whose task folders can be written under `out`; the others are refused
    before their world is stored (a link or a foreign folder where a task folder goes)."""
    from awmbridge.tasks import check_task_targets

    kept: dict[str, Scenario] = {}
    for name, scenario in chosen.items():
        try:
            check_task_targets(scenario, out)
        except AwmError as exc:
            report.refused.append(ScenarioRefused(name, [
                f"{scenario.origin()}: scenario {name}: not stored: {exc}"]))
        else:
            kept[name] = scenario
    return kept


def _tasks_of(scenario: Scenario, day: Day0, result: DayResult, write_tasks: TaskWriter,
              out: Path, report: ImportReport) -> tuple[Path, ...] | None:
    """The task folders written for a stored scenario; a refusal is reported (the world
    stays stored: it is complete and verified without its tasks)."""
    try:
        return tuple(write_tasks(scenario, persona=day.persona, world_hash=result.world_hash,
                                 out=out))
    except (WorldError, OSError) as exc:  # a task the grader refuses, an unwritable DIR
        report.refused.append(ScenarioRefused(scenario.name, [
            f"{scenario.origin()}: scenario {scenario.name}: its world is stored as "
            f"{day.persona}@0 but its tasks were not written: {exc}"]))
        return None


def select_scenarios(files: AwmFiles, names: Sequence[str] | None) -> dict[str, Scenario]:
    """The scenarios to import by name: all, or those named (by scenario or persona
    name); an unknown name, or a seed without a database, is refused."""
    if not names:
        return dict(files.scenarios)
    by_persona = {_safe_persona(s): s for s in files.scenarios}
    chosen: dict[str, Scenario] = {}
    for name in names:
        if name in files.described_only:
            origin = files.described_only[name]
            raise AwmError(f"{origin}: scenario {name}: only a description in "
                           "gen_scenario.jsonl; it has no database (gen_db.jsonl), so there "
                           "is no world to import")
        found = files.scenarios.get(name) or files.scenarios.get(by_persona.get(name, ""))
        if found is None:
            known = ", ".join(list(files.scenarios)[:10]) or "none"
            raise AwmError(f"--scenario {name}: no such scenario in {files.directory} "
                           f"(scenarios there: {known})")
        chosen[found.name] = found
    return chosen


def _safe_persona(name: str) -> str:
    try:
        return persona_for(name)
    except AwmError:
        return ""


def _plan_all(worlds: Worlds, chosen: dict[str, Scenario], strict: bool,
              report: ImportReport) -> list[Day0]:
    days: list[Day0] = []
    owners: dict[str, Scenario] = {}
    for scenario in chosen.values():
        try:
            day = plan_day0(scenario, strict=strict)
            _check_persona(worlds, scenario, day, owners.get(day.persona))
        except ScenarioRefused as refused:
            report.refused.append(refused)
            continue
        owners[day.persona] = scenario
        days.append(day)
    return days


def _check_persona(worlds: Worlds, scenario: Scenario, day: Day0,
                   owner: Scenario | None) -> None:
    """Refuse a persona another scenario of this import maps to, or that the store holds
    with another day 0."""
    where = f"{scenario.origin()}: scenario {scenario.name}"
    if owner is not None:
        raise ScenarioRefused(scenario.name, [
            f"{where}: maps to persona {day.persona!r}, as scenario {owner.name} "
            f"({owner.origin()}) does; rename one of them"])
    stored = _stored_day0(worlds, day.persona)
    if stored is not None and stored != day.lines():
        raise ScenarioRefused(scenario.name, [
            f"{where}: persona {day.persona!r} is already in the store {worlds.store.url} "
            "with another day 0 (other AWM files, or another world of that name); nothing "
            "was changed"])


def _stored_day0(worlds: Worlds, persona: str) -> bytes | None:
    """The persona's stored day 0 as interchange lines (None if there is no persona);
    the export of an identical day is byte-identical to ``Day0.lines``."""
    if worlds.store.persona(persona) is None:
        return None
    out = io.BytesIO()
    try:
        worlds.export(persona, out, through_day=0)
    except NotFoundError:
        return b""  # a persona without a day 0: never identical
    return out.getvalue()


def import_day0(worlds: Worlds, scenario: Scenario, day: Day0) -> ScenarioReport:
    """Store one planned day 0 as ``import-awm`` stores a scenario's (the persona checks,
    the atomic import, a statement replay refuses dropped and the day tried again) and
    report it the same way; ScenarioRefused when it cannot be stored. For days 0 made
    elsewhere (synthesis), from a scenario in AWM's shape."""
    _check_persona(worlds, scenario, day, None)
    stored, result = _store_one(worlds, scenario, day)
    return _scenario_report(worlds, scenario, stored, result, None)


def _source(day: Day0) -> str:
    return f"<AWM scenario {day.scenario}, day 0>"


def _store_each(worlds: Worlds, days: list[Day0], chosen: dict[str, Scenario],
                report: ImportReport) -> list[tuple[Day0, DayResult]]:
    stored: list[tuple[Day0, DayResult]] = []
    for day in days:
        try:
            stored.append(_store_one(worlds, chosen[day.scenario], day))
        except ScenarioRefused as refused:
            report.refused.append(refused)
    return stored


def _store_one(worlds: Worlds, scenario: Scenario, day: Day0) -> tuple[Day0, DayResult]:
    """Import one day 0. A statement the pre-run kept but the replay refuses (its own
    guards differ in some corner) is dropped like any failing statement, and the day is
    tried again: each try stores all of it or nothing."""
    while True:
        try:
            results = worlds.import_stream(io.BytesIO(day.lines()), source=_source(day))
        except ApplyError as exc:
            day = _drop_failed(scenario, day, exc, strict=False)
            continue
        return day, results[0]


def _drop_failed(scenario: Scenario, day: Day0, exc: ApplyError, *, strict: bool) -> Day0:
    if exc.index >= len(day.kept):  # the app line
        raise ScenarioRefused(scenario.name, [
            f"{scenario.origin()}: scenario {scenario.name}: its server code could not be "
            f"pinned as the app of service {AWM_SERVICE}: {exc.reason}"])
    smaller = day.without(exc.index, exc.reason)
    check_dropped(scenario, smaller, strict=strict)
    return smaller


def _store_together(worlds: Worlds, days: list[Day0], chosen: dict[str, Scenario]
                    ) -> list[tuple[Day0, DayResult]]:
    """With strict: every day in one import, so that all are stored or none (a refusal
    raises ScenarioRefused for the scenario at fault)."""
    if not days:
        return []
    stream = io.BytesIO(b"".join(day.lines() for day in days))
    try:
        results = worlds.import_stream(stream, source="<AWM scenarios, day 0>")
    except ApplyError as exc:
        day = next(d for d in days if d.persona == exc.persona)
        _drop_failed(chosen[day.scenario], day, exc, strict=True)  # strict: it refuses
        raise ScenarioRefused(day.scenario, [str(exc)]) from None
    by_persona = {r.persona: r for r in results}
    return [(day, by_persona[day.persona]) for day in days]


def _scenario_report(worlds: Worlds, scenario: Scenario, day: Day0, result: DayResult,
                     written: tuple[Path, ...] | None) -> ScenarioReport:
    rows = row_counts(worlds, day.persona, [t.name for t in scenario.tables])
    return ScenarioReport(
        scenario=scenario.name, persona=day.persona,
        status="unchanged" if result.status == "unchanged" else "imported",
        world_hash=result.world_hash, tables=tuple(rows), rows=rows,
        statements=day.total, dropped=day.dropped,
        tools=route_count(scenario.code) if scenario.code is not None else 0,
        tasks=written, unverified=tuple(unverified_tasks(scenario)))


def row_counts(worlds: Worlds, persona: str, order: Iterable[str] = ()) -> dict[str, int]:
    """Rows per table of the persona's stored day 0 (the counts its manifest recorded when
    the day was hashed), tables in `order` first (those that exist), then the others by
    name."""
    manifest = worlds.manifest(worlds.store.day(persona, 0))
    service = manifest.services.get(AWM_SERVICE)
    counts = {} if service is None else {
        name: digest.rows for name, digest in service.tables.items()
        if not name.startswith("sqlite_")}
    first = [name for name in order if name in counts]
    return {name: counts[name] for name in [*first, *sorted(set(counts) - set(first))]}


# --- task folders (awmbridge.tasks) ----------------------------------------------------------

TaskWriter = Callable[..., list[Path]]


def _task_writer() -> TaskWriter:
    """``awmbridge.tasks.write_tasks``, imported only when task folders are asked for (it brings
    the grading package)."""
    from awmbridge.tasks import write_tasks

    return write_tasks
