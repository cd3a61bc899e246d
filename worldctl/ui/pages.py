"""The pages of ``worldctl ui``: each reads what it shows (the store through ``replay``,
the other sources through ``worldctl.ui.sources``) and renders its template.

Every method answers one page as HTML, or raises ``PageRefused`` or a ``WorldError`` that
``worldctl.ui.app`` turns into an error page.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from eval.contract import Results, RunInfo
from eval.runner import RESULTS_FILE, TRIALS_DIR
from gates.contract import GateReport, GateResult, GuiStep, ShellStep, TaskSpec, ToolStep
from gates.quality import failure_detail, render_report
from gates.task import Task, load_task
from replay.browse import read_rows
from replay.engine import Worlds
from replay.files import read_regular
from replay.layout import WORKSPACE
from worldctl.errors import PageRefused
from worldctl.ui.sources import (
    FoundReport,
    GateReports,
    Graded,
    diff_side,
    graded_episodes,
    headline,
    load_run,
    resolve_episode,
    run_folders,
)
from worldctl.ui.templating import Shown, cell, quote, quote_path, render
from worldenv.core.episode import DbChange, FileChange, ShellCall, ToolCall
from worldenv.instances.episodes import EpisodeSummary, list_episodes, load_episode
from worldstore.errors import NotFoundError, WorldError
from worldstore.names import check_relpath

PAGE_ROWS = 50
SHOWN_PAGE_LINKS = 20  # page links a table shows (then only the last and the current)
SHOWN_FILE_BYTES = 256 * 1024
RESULT_CHARS = 2000
EVIDENCE_CHARS = 20_000
MAX_FILE_BYTES = 64 * 1024 * 1024  # the largest eval report the UI serves
IMAGE_TYPES = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"),
               (b"GIF87a", "image/gif"), (b"GIF89a", "image/gif"))
REPORT_FILES = {"report.html": "text/html", "report.md": "text/plain"}


@dataclass(frozen=True)
class EpisodeRow:
    summary: EpisodeSummary
    time: str  # the world clock of its first call
    graded: Graded | None


@dataclass(frozen=True)
class StartWorld:
    """Whether the store holds a task's start world under the hash the task pins."""

    state: str  # "pinned", "other" (another hash) or "missing"
    world_hash: str = ""
    persona: str = ""
    day: int = 0


@dataclass(frozen=True)
class TaskRow:
    task_id: str
    spec: TaskSpec | None
    start: StartWorld | None
    verdict: str | None
    error: str | None


@dataclass(frozen=True)
class Step:
    kind: str
    name: str | None
    text: str


@dataclass(frozen=True)
class VerifierFile:
    name: str
    role: str
    source: str
    error: str | None


@dataclass(frozen=True)
class GateRow:
    gate: str
    status: str
    css: str
    reason: str
    evidence: str | None


@dataclass(frozen=True)
class RunRow:
    name: str
    info: RunInfo | None
    results: Results | None
    metrics: Mapping[str, Any]
    pass1: object
    report: bool
    error: str | None


@dataclass(frozen=True)
class CallRow:
    index: int
    ts: str
    what: str
    result: str
    effects: list[str]
    action: str
    screenshot: str | None
    screenshot_kept: bool
    screenshot_url: str


class Pages:
    """The pages over one store and the task, report and run folders the UI was given."""

    def __init__(self, worlds: Worlds, *, tasks: Mapping[str, Path],
                 reports: Sequence[Path], runs: Sequence[Path]) -> None:
        self.worlds = worlds
        self.tasks = dict(tasks)  # task id -> its folder (see sources.task_index)
        self.reports = GateReports(reports)
        self.runs = list(runs)

    # --- worlds -----------------------------------------------------------------------

    def personas(self) -> str:
        return render("personas.html", title="worlds", personas=self.worlds.store.personas())

    def days(self, persona: str) -> str:
        records = self.worlds.store.days(persona)
        if not records:
            raise PageRefused(404, f"no persona {persona!r} in the store")
        # The diff most often wanted: what the latest day changed.
        latest = records[-1].day
        before = records[-2].day if len(records) > 1 else latest
        return render("days.html", title=persona, persona=persona, records=records,
                      before=before, latest=latest)

    def day(self, persona: str, day: int) -> str:
        record = self.worlds.store.day(persona, day)
        manifest = self.worlds.manifest(record)
        tables = [(service, table, digest.rows)
                  for service, m in sorted(manifest.services.items())
                  for table, digest in sorted(m.tables.items())]
        files = [(path, entry.size) for path, entry in sorted(manifest.files.items())]
        return render("day.html", title=f"{persona}@{day}", persona=persona, day=day,
                      record=record, tables=tables, files=files)

    def table(self, persona: str, day: int, service: str, table: str, page: int,
              search: str) -> str:
        record = self.worlds.store.day(persona, day)
        found = self.worlds.manifest(record).services.get(service)
        if found is None or table not in found.tables:
            raise PageRefused(404, f"no table {service}.{table} in {persona}@{day}")
        with self.worlds.pinned(persona, day) as world:
            rows = read_rows(world, service, table, offset=(page - 1) * PAGE_ROWS,
                             limit=PAGE_ROWS, search=search)
        pages = max(1, -(-rows.total // PAGE_ROWS))
        links = [n for n in range(1, pages + 1)
                 if n <= SHOWN_PAGE_LINKS or n in (pages, page)]
        base = f"/p/{quote(persona)}/{day}/t/{quote(service)}/{quote(table)}"
        shown: list[list[Shown]] = [[cell(v) for v in row] for row in rows.rows]
        return render("table.html", title=f"{service}.{table}", persona=persona, day=day,
                      page=rows, rows=shown, number=page, pages=pages, links=links,
                      base=base)

    def file(self, persona: str, day: int, path: str) -> str:
        kind, data = self.raw(persona, day, path)
        raw = f"/raw/{quote(persona)}/{day}/{quote_path(path)}"
        return render("file.html", title=path, persona=persona, day=day, path=path, raw=raw,
                      size=len(data), shown=SHOWN_FILE_BYTES,
                      image=kind.startswith("image/"),
                      text=data[:SHOWN_FILE_BYTES].decode("utf-8", "replace"))

    def raw(self, persona: str, day: int, path: str) -> tuple[str, bytes]:
        """A workspace file's content type and bytes."""
        check_relpath(path)  # a PathError (400) names what is wrong with it
        record = self.worlds.store.day(persona, day)
        entry = self.worlds.manifest(record).files.get(path)
        if entry is None:
            raise PageRefused(404, f"no file {path!r} in {persona}@{day}")
        with self.worlds.pinned(persona, day) as world:
            data = read_regular(world / WORKSPACE / path, limit=entry.size)
        if data is None:
            raise PageRefused(404, f"{path!r} in {persona}@{day} is not a regular file")
        kind = next((k for magic, k in IMAGE_TYPES if data.startswith(magic)), "text/plain")
        return kind, data

    def diff(self, a: str, b: str) -> str:
        side_a, side_b = diff_side(a), diff_side(b)
        try:
            found = self.worlds.diff(side_a, side_b)
        except OSError as exc:  # a checkout that changed or cannot be read meanwhile
            raise PageRefused(400, f"{exc.filename or a}: cannot be read: "
                                 f"{exc.strerror or exc}") from None
        return render("diff.html", title=f"{a} → {b}", found=found)

    # --- episodes ---------------------------------------------------------------------

    def episodes(self) -> str:
        return render("episodes.html", title="episodes", rows=self._episode_rows(),
                      runs=[str(f) for f in self.runs])

    def _episode_rows(self, task: str | None = None) -> list[EpisodeRow]:
        graded = graded_episodes(self.runs)
        rows = [EpisodeRow(s, s.calls[0].ts if s.calls else "-", graded.get(s.episode_id))
                for s in list_episodes(self.worlds, task=task)]
        # Newest first; the id keeps equal times in one order.
        rows.sort(key=lambda r: r.summary.episode_id)
        rows.sort(key=lambda r: r.time, reverse=True)
        return rows

    def episode(self, episode_id: str) -> str:
        episode = load_episode(self.worlds, episode_id)
        effects: dict[int, list[str]] = {}
        for event in episode.events:
            if isinstance(event, DbChange):
                effects.setdefault(event.index, []).append(f"db: {event.service}")
            elif isinstance(event, FileChange):
                change = "deleted" if event.data is None else f"{len(event.data)} bytes"
                effects.setdefault(event.index, []).append(f"file {event.path}: {change}")
        calls = []
        for call in episode.calls:
            action, screenshot = "", None
            if isinstance(call, ShellCall):
                what, result = f"shell: {call.command}", call.stdout + call.stderr
            elif isinstance(call, ToolCall):
                what, result = call.tool, call.text
            else:  # a GUI action in the instance's browser (worldenv.gui.tools)
                what, result = f"gui: {call.action} {call.url or ''}".rstrip(), call.text
                action, screenshot = call.action, call.screenshot or None
            calls.append(CallRow(
                index=call.index, ts=call.ts, what=what, result=result[:RESULT_CHARS],
                effects=effects.get(call.index, []), action=action, screenshot=screenshot,
                screenshot_kept=screenshot is not None and screenshot in episode.screenshots,
                screenshot_url=f"/episodes/{quote(episode_id)}/screenshots/{screenshot}"))
        graded = graded_episodes(self.runs).get(episode_id)
        return render("episode.html", title=f"episode {episode_id[:12]}", episode=episode,
                      calls=calls, graded=graded)

    def resolve_episode(self, text: str) -> str:
        return resolve_episode(self.worlds, text)

    def screenshot(self, episode_id: str, digest: str) -> bytes:
        """A GUI call's screenshot kept in a stored episode (PNG)."""
        data = load_episode(self.worlds, episode_id).screenshots.get(digest)
        if data is None or not data.startswith(IMAGE_TYPES[0][0]):
            raise PageRefused(404, f"episode {episode_id} keeps no screenshot {digest!r}")
        return data

    # --- tasks ------------------------------------------------------------------------

    def task_list(self) -> str:
        reports = self.reports.latest()
        rows = [self._task_row(task_id, folder, reports.get(task_id))
                for task_id, folder in sorted(self.tasks.items())]
        return render("tasks.html", title="tasks", rows=rows,
                      report_folders=[str(f) for f in self.reports.folders])

    def _task_row(self, task_id: str, folder: Path, found: FoundReport | None) -> TaskRow:
        verdict = None if found is None else _verdict(found.report)
        try:
            spec = load_task(folder).spec
        except WorldError as exc:  # edited into a broken folder since the UI started
            return TaskRow(task_id, None, None, verdict, str(exc))
        return TaskRow(task_id, spec, self._start_world(spec), verdict, None)

    def _start_world(self, spec: TaskSpec) -> StartWorld:
        try:
            record = self.worlds.resolve(spec.world)
        except NotFoundError:
            return StartWorld("missing")
        if record.world_hash != spec.world_hash:
            return StartWorld("other", record.world_hash)
        return StartWorld("pinned", record.world_hash, record.persona, record.day)

    def task(self, task_id: str) -> str:
        folder = self.tasks.get(task_id)
        if folder is None:
            raise PageRefused(404, f"no task {task_id!r} among the {len(self.tasks)} tasks "
                                 "the UI was given")
        task = load_task(folder)
        found = self.reports.latest().get(task_id)
        report: dict[str, Any] = {"found": found}
        if found is not None:
            report.update(
                verdict=_verdict(found.report), rendered=render_report(found.report),
                modified=datetime.fromtimestamp(found.mtime, UTC).strftime(
                    "%Y-%m-%d %H:%M:%S UTC"),
                rounds=[[_gate_row(r) for r in results] for results in found.report.rounds])
        return render("task.html", title=f"task {task_id}", task=task, spec=task.spec,
                      folder=folder, start=self._start_world(task.spec),
                      steps=_solution(task), verifier=_verifier(task),
                      report_folders=[str(f) for f in self.reports.folders],
                      episode_rows=self._episode_rows(task_id), **report)

    # --- eval runs --------------------------------------------------------------------

    def run_list(self) -> str:
        rows = [self._run_row(name, folder) for name, folder in run_folders(self.runs)]
        return render("runs.html", title="eval runs", rows=rows,
                      runs=[str(f) for f in self.runs])

    def _run_row(self, name: str, folder: Path) -> RunRow:
        try:
            info, results = load_run(folder)
        except WorldError as exc:
            return RunRow(name, None, None, {}, None, False, str(exc))
        metrics = results.metrics if results is not None else {}
        pass_at = metrics.get("pass@k")
        pass1 = pass_at.get("1") if isinstance(pass_at, Mapping) else None
        return RunRow(name, info, results, metrics, pass1,
                      (folder / "report.html").is_file(), None)

    def run(self, name: str) -> str:
        folder = self.run_folder(name)
        info, results = load_run(folder)
        reports = [f for f in REPORT_FILES if (folder / f).is_file()]
        results_path = folder / RESULTS_FILE
        stale = results_path.is_file() and any(
            results_path.stat().st_mtime > (folder / f).stat().st_mtime for f in reports)
        return render(
            "run.html", title=f"eval run {name}", name=name, folder=folder,
            facts=_run_facts(folder, info), reports=reports, stale=stale, results=results,
            results_file=RESULTS_FILE, trials_dir=TRIALS_DIR,
            trial_files=sum(1 for _ in (folder / TRIALS_DIR).glob("*.json")),
            headline=None if results is None else headline(results),
            metrics=[] if results is None else list(_flat(results.metrics)),
            known_tasks=set(self.tasks))

    def run_folder(self, name: str) -> Path:
        for found, folder in run_folders(self.runs):
            if found == name:
                return folder
        raise PageRefused(404, f"no eval run {name!r} in "
                             f"{', '.join(str(f) for f in self.runs) or 'no run folder'}")

    def run_report(self, name: str, file: str) -> bytes:
        path = self.run_folder(name) / file
        if not path.is_file():
            raise PageRefused(404, f"no {file} in {path.parent} (worldctl eval report writes "
                                 "it)")
        data = read_regular(path, limit=MAX_FILE_BYTES)
        if data is None:
            raise PageRefused(400, f"{path}: larger than {MAX_FILE_BYTES:,} bytes")
        return data

    # --- errors -----------------------------------------------------------------------

    @staticmethod
    def error(message: str) -> str:
        return render("error.html", title="error", message=message)


def _solution(task: Task) -> list[Step]:
    if task.lacks("solution"):
        return []
    steps = []
    for step in task.solution.steps:
        if isinstance(step, ToolStep | GuiStep):
            name, kind = (step.tool, "tool (mcp)") if isinstance(step, ToolStep) \
                else (step.action, "gui")
            steps.append(Step(kind, name, json.dumps(step.arguments, ensure_ascii=False,
                                                     indent=1)))
        elif isinstance(step, ShellStep):
            steps.append(Step("shell", None, step.command))
        else:  # the final answer
            steps.append(Step("answer", None, step.text))
    return steps


def _verifier(task: Task) -> list[VerifierFile]:
    """Every Python file of the verifier folder: the scripts and their helpers."""
    found = []
    for path in sorted(task.verifier_dir.glob("*.py")):
        role = "script" if path.name in task.scripts else "helper"
        try:
            data = read_regular(path, limit=SHOWN_FILE_BYTES)
        except (OSError, WorldError) as exc:
            found.append(VerifierFile(path.name, role, "", str(exc)))
            continue
        shown = "(larger than the UI shows)" if data is None else data.decode("utf-8",
                                                                              "replace")
        found.append(VerifierFile(path.name, role, shown, None))
    return found


def _gate_row(result: GateResult) -> GateRow:
    detail = failure_detail(result)
    reason = f"{result.reason}: {detail}" if detail else result.reason
    evidence = msgspec.json.format(msgspec.json.encode(result.evidence, order="sorted"),
                                   indent=2).decode()
    if len(evidence) > EVIDENCE_CHARS:
        evidence = evidence[:EVIDENCE_CHARS] + "\n…"
    css = {"passed": "ok", "failed": "bad"}.get(result.status, "muted")
    return GateRow(result.gate, result.status, css, reason,
                   evidence if result.evidence else None)


def _verdict(report: GateReport) -> str:
    # render_report's first line is "task <id>: <verdict>", the one wording of a verdict
    head = render_report(report).partition("\n")[0]
    return head.removeprefix(f"task {report.task_id}: ")


def _run_facts(folder: Path, info: RunInfo) -> list[tuple[str, str]]:
    facts: list[tuple[str, object]] = [
        ("folder", folder), ("run id", info.run_id), ("agent", info.agent),
        ("model", info.model or "-"), ("k", info.k), ("split", info.split or "-"),
        ("hinted", info.hinted), ("max steps", info.max_steps), ("history", info.history),
        ("concurrency", info.concurrency), ("tasks from", ", ".join(info.tasks_source)),
        ("started", info.started), ("model server", info.api_base or "-")]
    return [(name, str(value)) for name, value in facts]


def _flat(metrics: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, object]]:
    """The metrics as (dotted key, value) rows: nested objects spelled out, lists kept."""
    for key, value in metrics.items():
        if isinstance(value, Mapping) and value:
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


__all__ = ["IMAGE_TYPES", "PAGE_ROWS", "REPORT_FILES", "Pages"]
