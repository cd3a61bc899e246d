"""The data of a report: ``results.json`` read from a run folder, the per-trial table (CSV
and parquet), and the files written as new files renamed into place."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from eval.contract import Results, TaskResult, decode_results
from eval.errors import EvalError
from eval.metrics import compute_metrics
from worldstore.folders import check_writable, read_bytes, write_bytes

__all__ = [
    "RESULTS_FILE",
    "TRIAL_SCHEMA",
    "load_results",
    "ordered_groups",
    "rel_link",
    "task_metrics",
    "trial_frame",
    "trial_rows",
    "trials_csv",
    "write_all",
]

RESULTS_FILE = "results.json"


_MAX_RESULTS = 1 << 30  # a results file larger than this is not one a run wrote


_DIFFICULTY_ORDER = ("trivial", "easy", "medium", "hard", "expert")


def load_results(run_dir: Path) -> Results:
    """A run folder's results; ``EvalError`` naming the folder or file when there is none
    or it is not a results file."""
    path = Path(run_dir) / RESULTS_FILE
    try:  # a link or a FIFO named results.json is refused, never followed nor opened
        data = read_bytes(Path(run_dir), RESULTS_FILE, limit=_MAX_RESULTS)
    except FileNotFoundError:
        raise EvalError(f"{run_dir}: no {RESULTS_FILE} here; is it a run folder "
                        "(worldctl eval run --out RUN_DIR writes one)?") from None
    except OSError as exc:
        raise EvalError(f"{path}: cannot be read: {exc.strerror or exc}") from exc
    try:
        return decode_results(data)
    except msgspec.DecodeError as exc:
        raise EvalError(f"{path}: not a results file of eval.contract: {exc}") from exc


def task_metrics(path: Path, task: TaskResult) -> dict[str, Any]:
    try:
        return compute_metrics([task])
    except EvalError as exc:
        raise EvalError(f"{path}: {exc}") from exc


def ordered_groups(groups: Mapping[str, Any], *, by_difficulty: bool) -> list[str]:
    def rank(name: str) -> tuple[int, str]:
        if by_difficulty and name in _DIFFICULTY_ORDER:
            return _DIFFICULTY_ORDER.index(name), name
        return len(_DIFFICULTY_ORDER), name

    return sorted(groups, key=rank)


_LIST_COLUMNS = ("task_interfaces", "checks", "interfaces_used", "actions")
TRIAL_SCHEMA: dict[str, Any] = {
    "run_id": pl.String, "task_id": pl.String, "difficulty": pl.String,
    "task_interfaces": pl.List(pl.String),
    "trial": pl.Int64, "episode_id": pl.String, "success": pl.Boolean, "V": pl.Int64,
    "reward": pl.Float64, "checks": pl.List(pl.Boolean), "steps": pl.Int64,
    "interfaces_used": pl.List(pl.String), "actions": pl.List(pl.String),
    "termination": pl.String, "format_error": pl.Boolean, "env_error": pl.Boolean,
    "tokens_in": pl.Int64, "tokens_out": pl.Int64, "cost": pl.Float64, "seconds": pl.Float64,
    "error": pl.String,
}
"""The per-trial table's columns: the run and task, then every ``Trial`` field in order."""


def trial_rows(results: Results) -> list[dict[str, Any]]:
    """One row per trial, sorted by task id and trial number."""
    rows = []
    for task in sorted(results.tasks, key=lambda t: t.task_id):
        for trial in sorted(task.trials, key=lambda t: t.trial):
            rows.append({"run_id": results.run.run_id, "task_id": task.task_id,
                         "difficulty": task.difficulty,
                         "task_interfaces": list(task.interfaces),
                         **msgspec.structs.asdict(trial)})
    return rows


def trial_frame(results: Results) -> pl.DataFrame:
    """The per-trial table (lists kept as lists), what ``trials.parquet`` holds."""
    return pl.DataFrame(trial_rows(results), schema=TRIAL_SCHEMA, orient="row")


def trials_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    """CSV of the trial rows: lists as compact JSON text, None as an empty cell, floats in
    Python's shortest round-trip form."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(list(TRIAL_SCHEMA))
    for row in rows:
        cells = []
        for name in TRIAL_SCHEMA:
            value = row[name]
            if name in _LIST_COLUMNS:
                cells.append(json.dumps(value, separators=(",", ":")))
            elif value is None:
                cells.append("")
            elif isinstance(value, bool):
                cells.append("true" if value else "false")
            else:
                cells.append(str(value))
        writer.writerow(cells)
    return buffer.getvalue()


def _bytes(data: str | bytes) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else data


def write_all(files: Sequence[tuple[Path, str, str | bytes]]) -> None:
    """Write (folder, name inside it, data) each as a new file renamed into place, never
    through a link (``worldstore.folders``); every target is checked first, so a run
    folder with a link or a folder where a file goes is refused with nothing written."""
    for folder, rel, _data in files:
        check_writable(folder, [rel])
    for folder, rel, data in files:
        folder.mkdir(parents=True, exist_ok=True)  # as named by the caller (--html, --md)
        write_bytes(folder, rel, _bytes(data))


def rel_link(target: Path, start: Path) -> str:
    return Path(os.path.relpath(target.resolve(), start.resolve())).as_posix()
