"""What the UI reads besides the store's worlds: task folders, gate reports, eval run
folders, world checkouts given to /diff, and stored episodes found by an id prefix.

Nothing here writes or renders; the pages (``worldctl.ui.pages``) turn it into HTML.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

from eval.contract import Results, RunInfo, decode_results
from eval.errors import EvalError
from eval.runner import RESULTS_FILE, RUN_FILE, load_run_info
from gates.contract import GateReport
from gates.task import load_task, task_folders
from packs.registry import list_packs
from replay.engine import Worlds
from replay.files import read_regular
from replay.layout import APPS, SERVICES, WORKSPACE, check_world_dir
from worldctl.errors import PageRefused
from worldstore.errors import ConfigError, NotFoundError, WorldError

MAX_REPORT_FILES = 10_000  # JSON files looked at per reports folder, per page
MAX_JSON_BYTES = 64 * 1024 * 1024
SHOWN_IDS = 5  # ids an ambiguous episode prefix names
Z_95 = 1.959963984540054  # the normal quantile of a two-sided 95 % interval


# --- tasks and gate reports ---------------------------------------------------------------


def task_index(sources: Sequence[str], installed: Path | None = None) -> dict[str, Path]:
    """The task folders the UI shows, by task id: those of `sources` (each as ``worldctl
    serve --tasks`` reads it: a task folder, a folder of them, or a pack), or with none
    given every shipped and installed pack's. Each must load now (TaskError names the
    file and field); an id in two folders is refused, as ``serve`` refuses it."""
    if sources:
        folders = [f for source in sources for f in task_folders(source, installed)]
    else:
        folders = [p.task_dir(name) for p in list_packs(installed) for name in p.tasks]
    index: dict[str, Path] = {}
    for folder in folders:
        task_id = load_task(folder).task_id
        if task_id in index and index[task_id].resolve() != folder.resolve():
            raise ConfigError(f"task id {task_id!r} is in both {index[task_id]} and {folder}")
        index[task_id] = folder
    return index


def synth_records(folders: Iterable[Path]) -> list[Path]:
    """The task-record folders of the synthesis runs whose packs hold `folders`: ``synth
    tasks`` keeps every task's gate rounds in RUN/tasks/<persona>/ beside the pack
    RUN/pack/<run>/, which is where the gate reports of those tasks already are."""
    found: list[Path] = []
    for folder in folders:
        pack = folder.resolve().parent.parent
        run = pack.parent.parent
        records = run / "tasks"
        if (pack.parent.name == "pack" and (run / "run.json").is_file()
                and records.is_dir() and records not in found):
            found.append(records)
    return found


@dataclass(frozen=True)
class FoundReport:
    report: GateReport
    path: Path
    mtime: float


class GateReports:
    """The gate reports in some folders: every ``*.json`` directly in one or a level down
    that decodes as a ``GateReport`` (what ``worldctl task check --report`` writes; a
    synthesis run's task record has the same fields) and reached the gates. Other JSON
    files are passed over: a folder of reports may hold anything else too. Folders are
    read again on every page, so a new report shows without a restart; a file is decoded
    again only when it changed."""

    def __init__(self, folders: Sequence[Path]) -> None:
        self.folders = list(folders)
        self._decoded: dict[Path, tuple[tuple[int, int], GateReport | None]] = {}

    def latest(self) -> dict[str, FoundReport]:
        """Per task id, the report modified last (ties: the later path)."""
        found: dict[str, FoundReport] = {}
        for path, stat in self._files():
            report = self._decode(path, stat)
            if report is None:
                continue
            known = found.get(report.task_id)
            if known is None or (stat.st_mtime, str(path)) >= (known.mtime, str(known.path)):
                found[report.task_id] = FoundReport(report, path, stat.st_mtime)
        return found

    def _files(self) -> Iterator[tuple[Path, os.stat_result]]:
        for folder in self.folders:
            yield from _json_files(folder, depth=2, limit=MAX_REPORT_FILES)

    def _decode(self, path: Path, stat: os.stat_result) -> GateReport | None:
        key = (stat.st_mtime_ns, stat.st_size)
        cached = self._decoded.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        report: GateReport | None = None
        try:
            data = read_regular(path, limit=MAX_JSON_BYTES)
            if data is not None:
                report = msgspec.json.decode(data, type=GateReport)
        except (OSError, WorldError, msgspec.DecodeError):
            report = None
        if report is not None and not report.rounds:
            report = None  # a task record of a candidate that never reached the gates
        self._decoded[path] = (key, report)
        return report


def _json_files(folder: Path, *, depth: int, limit: int
                ) -> Iterator[tuple[Path, os.stat_result]]:
    """Regular ``*.json`` files in `folder` and its subfolders down to `depth` levels,
    sorted, at most `limit` (no symlink is followed)."""
    pending, seen = [(folder, depth)], 0
    while pending and seen < limit:
        current, left = pending.pop(0)
        try:
            entries = sorted(os.scandir(current), key=lambda e: e.name)
        except OSError:
            continue  # removed or unreadable meanwhile: nothing to show from it
        for entry in entries:
            if entry.is_dir(follow_symlinks=False) and left > 1:
                pending.append((Path(entry.path), left - 1))
            elif entry.name.endswith(".json") and entry.is_file(follow_symlinks=False):
                seen += 1
                yield Path(entry.path), entry.stat(follow_symlinks=False)
                if seen >= limit:
                    return


# --- eval runs ----------------------------------------------------------------------------


def run_folders(sources: Sequence[Path]) -> list[tuple[str, Path]]:
    """The eval run folders of `sources` (each a run folder, holding run.json, or a folder
    of them), read now, each named by its folder; a name taken already gets -2, -3, ..."""
    folders: list[Path] = []
    for source in sources:
        if (source / RUN_FILE).is_file():
            folders.append(source)
        elif source.is_dir():
            folders += sorted(p for p in source.iterdir() if (p / RUN_FILE).is_file())
    named: list[tuple[str, Path]] = []
    for folder in folders:
        base = folder.resolve().name
        name, n = base, 2
        while any(name == taken for taken, _ in named):
            name, n = f"{base}-{n}", n + 1
        named.append((name, folder))
    return named


def load_run(folder: Path) -> tuple[RunInfo, Results | None]:
    """A run folder's configuration, and its results once it has finished."""
    info = load_run_info(folder / RUN_FILE)
    path = folder / RESULTS_FILE
    if not path.is_file():
        return info, None
    data = read_regular(path, limit=MAX_JSON_BYTES)
    if data is None:
        raise EvalError(f"{path}: larger than {MAX_JSON_BYTES:,} bytes")
    try:
        return info, decode_results(data)
    except msgspec.DecodeError as exc:
        raise EvalError(f"{path}: not a results file of eval.contract: {exc}") from None


@dataclass(frozen=True)
class Headline:
    """What a run page leads with: the pass rate with its 95 % Wilson score interval over
    the n trials (lost trials count as failures, as in ``success_rate``), the mean number
    of steps, and the cost when any trial's cost is known."""

    successes: int
    trials: int
    tasks: int
    low: float
    high: float
    mean_steps: float
    trials_lost: int
    cost_total: float | None
    cost_unknown: int

    @property
    def rate(self) -> float:
        return self.successes / self.trials


def headline(results: Results) -> Headline | None:
    """The headline of a finished run; None for one without a trial."""
    trials = [t for task in results.tasks for t in task.trials]
    if not trials:
        return None
    successes = sum(t.success for t in trials)
    low, high = wilson(successes, len(trials))
    costs = [t.cost for t in trials if t.cost is not None]
    return Headline(successes=successes, trials=len(trials), tasks=len(results.tasks),
                    low=low, high=high, mean_steps=sum(t.steps for t in trials) / len(trials),
                    trials_lost=sum(t.env_error for t in trials),
                    cost_total=math.fsum(costs) if costs else None,
                    cost_unknown=len(trials) - len(costs))


def wilson(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a proportion: unlike p ± z·se it stays inside [0, 1]
    and is not degenerate at 0 or n successes, which small runs often have."""
    p = successes / n
    scale = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / scale
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / scale
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class Graded:
    """An episode's verdict as an eval run recorded it (its trial's V)."""

    run: str
    trial: int
    passed: bool


def graded_episodes(sources: Sequence[Path]) -> dict[str, Graded]:
    """The verdicts the finished eval runs of `sources` recorded, by episode id (a run
    folder that cannot be read is passed over: the runs page says what is wrong with it)."""
    found: dict[str, Graded] = {}
    for name, folder in run_folders(sources):
        try:
            _, results = load_run(folder)
        except WorldError:
            continue
        for task in results.tasks if results is not None else []:
            for t in task.trials:
                found.setdefault(t.episode_id, Graded(name, t.trial, t.success))
    return found


# --- episodes and checkouts ---------------------------------------------------------------


def resolve_episode(worlds: Worlds, text: str) -> str:
    """The id of the stored episode `text` names: its id, or a prefix of exactly one
    stored id. PageRefused 404 when none starts so, 400 when several do (some named)."""
    try:
        return worlds.store.episode(text).episode_id
    except NotFoundError:
        pass
    matches = sorted(r.episode_id for r in worlds.store.episodes()
                     if r.episode_id.startswith(text))
    if not matches:
        raise PageRefused(404, f"no stored episode {text!r} (nor one whose id starts so)")
    if len(matches) > 1:
        named = ", ".join(m[:16] for m in matches[:SHOWN_IDS])
        more = f" and {len(matches) - SHOWN_IDS} more" if len(matches) > SHOWN_IDS else ""
        raise PageRefused(400, f"episode prefix {text!r} is ambiguous: {len(matches)} stored "
                             f"episodes start so ({named}{more}); give more characters")
    return matches[0]


def diff_side(text: str) -> str | Path:
    """A side of /diff: a reference, or (with a '/', which no reference has) the path of
    a world checkout on this machine, refused unless it is one."""
    if "/" not in text:
        return text
    folder = Path(text)
    if not folder.is_dir():
        raise PageRefused(400, f"{text}: not a directory (a side with a '/' is the path of "
                             "a world checkout)")
    try:
        check_world_dir(folder)
    except OSError as exc:
        raise PageRefused(400, f"{text}: cannot be read: {exc.strerror or exc}") from None
    except WorldError:  # its message names an entry: no listing of other folders
        raise PageRefused(400, f"{text}: not a world checkout (a world holds only "
                             f"{SERVICES}/, {WORKSPACE}/ and {APPS}/)") from None
    if not any((folder / part).is_dir() for part in (SERVICES, WORKSPACE)):
        raise PageRefused(400, f"{text}: not a world checkout (it holds neither {SERVICES}/ "
                             f"nor {WORKSPACE}/)")
    return folder


__all__ = ["FoundReport", "GateReports", "Graded", "Headline", "diff_side",
           "graded_episodes", "headline", "load_run", "resolve_episode", "run_folders",
           "synth_records", "task_index", "wilson"]
