"""Runs side by side, the first as the baseline, with a paired bootstrap interval over the
tasks they share for each delta: ``write_comparison``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval import plots
from eval.contract import Results
from eval.errors import EvalError
from eval.metrics import bootstrap_delta, delta_verdict, min_tasks, per_task_success
from eval.report.data import load_results, ordered_groups, task_metrics, write_all
from eval.report.document import Document, Plot, Section, Table
from eval.report.html import render_html
from eval.report.markdown import render_md
from eval.report.numbers import (
    DASH,
    HEADLINE,
    USAGE,
    as_float,
    fmt_num,
    fmt_pct,
    pass_metrics,
    signed,
)
from eval.report.run import k_curve, mapping

__all__ = ["Comparison", "Delta", "write_comparison"]


@dataclass(frozen=True)
class Delta:
    """One compared metric of one run against the baseline, over their shared tasks."""

    run: str
    metric: str
    baseline: float
    value: float
    delta: float
    low: float
    high: float
    tasks: int
    # "better" or "worse"; "noise" (the interval contains 0); "too few tasks for a verdict
    # (n=...)" (fewer than eval.metrics.min_tasks of the shared tasks differ)
    verdict: str


@dataclass(frozen=True)
class Comparison:
    """What ``write_comparison`` found and wrote: the deltas, the Markdown text and the
    files (None for one not asked for)."""

    deltas: tuple[Delta, ...]
    markdown: str
    md: Path | None
    html: Path | None


def _labels(run_dirs: Sequence[Path]) -> list[str]:
    labels: list[str] = []
    for path in run_dirs:
        base = Path(path).resolve().name or str(path)
        label, n = base, 2
        while label in labels:
            label, n = f"{base} ({n})", n + 1
        labels.append(label)
    return labels


def _per_task_reward(path: Path, results: Results) -> dict[str, float]:
    return {task.task_id: as_float(task_metrics(path, task).get("avg_reward")) or 0.0
            for task in results.tasks}


def _paired(path: Path, results: Results, shared: Sequence[str],
            which: str) -> list[float]:
    try:
        values = (per_task_success(results.tasks) if which == "success_rate"
                  else _per_task_reward(path, results))
    except EvalError as exc:
        raise EvalError(f"{path}: {exc}") from exc
    return [values[t] for t in shared]


def _compare_deltas(paths: Sequence[Path], runs: Sequence[Results], labels: Sequence[str],
                    samples: int, seed: int) -> tuple[list[Delta], list[str]]:
    base_path, base = paths[0], runs[0]
    base_ids = {t.task_id for t in base.tasks}
    deltas, notes = [], []
    for path, run, label in zip(paths[1:], runs[1:], labels[1:], strict=True):
        ids = {t.task_id for t in run.tasks}
        shared = sorted(base_ids & ids)
        if not shared:
            raise EvalError(f"{path}: no task in common with the baseline {base_path}: "
                            "there is nothing to compare")
        if ids != base_ids:
            missing, extra = sorted(base_ids - ids), sorted(ids - base_ids)
            parts = []
            if missing:
                parts.append(f"not in {label}: {', '.join(missing)}")
            if extra:
                parts.append(f"only in {label}: {', '.join(extra)}")
            notes.append(f"{label}: {len(shared)} shared tasks compared; "
                         + "; ".join(parts) + ".")
        for metric in ("success_rate", "avg_reward"):
            a = _paired(base_path, base, shared, metric)
            b = _paired(path, run, shared, metric)
            boot = bootstrap_delta(a, b, samples=samples, seed=seed)
            delta, low, high = float(boot["delta"]), float(boot["low"]), float(boot["high"])
            verdict = delta_verdict(a, b, boot)
            deltas.append(Delta(run=label, metric=metric, baseline=math.fsum(a) / len(a),
                                value=math.fsum(b) / len(b), delta=delta, low=low, high=high,
                                tasks=len(shared), verdict=verdict))
    return deltas, notes


def _delta_rows(deltas: Sequence[Delta]) -> list[list[str]]:
    rows = []
    for d in deltas:
        if d.metric == "success_rate":
            name, show = "Success rate", fmt_pct
            change = f"{signed(d.delta * 100, 1)} pts"
            interval = f"{signed(d.low * 100, 1)} to {signed(d.high * 100, 1)} pts"
        else:
            name, show = "Average reward", fmt_num
            change = signed(d.delta, 3)
            interval = f"{signed(d.low, 3)} to {signed(d.high, 3)}"
        rows.append([d.run, name, str(d.tasks), show(d.baseline), show(d.value), change,
                     interval, d.verdict])
    return rows


def _comparison_document(run_dirs: Sequence[Path], runs: Sequence[Results],
                         labels: Sequence[str], deltas: Sequence[Delta],
                         notes: Sequence[str]) -> Document:
    specs = [*HEADLINE[:4], *pass_metrics(_merged_pass(runs)), *HEADLINE[4:], *USAGE]
    headers = ["Metric", f"{labels[0]} (baseline)"]
    for label in labels[1:]:
        headers += [label, f"Δ {label}"]
    rows = []
    for spec in specs:
        values = [spec.value(r.metrics) for r in runs]
        if all(v is None for v in values):
            continue
        row = [spec.label, spec.fmt(values[0])]
        for value in values[1:]:
            row += [spec.fmt(value), spec.delta(values[0], value)]
        rows.append(row)
    runs_table = Table(
        ["Run", "Folder", "Agent", "Model", "k", "Tasks", "Started"],
        [[label, str(path), r.run.agent, r.run.model or DASH, str(r.run.k),
          str(len(r.tasks)), r.run.started]
         for label, path, r in zip(labels, run_dirs, runs, strict=True)])
    sections = [
        Section("Runs", notes=[f"The baseline is {labels[0]}; deltas are each run minus it."],
                 tables=[runs_table]),
        Section("Headline metrics side by side", notes=[
            "Each run's own metrics over all its tasks; the intervals below pair the shared "
            "tasks only."], tables=[Table(headers, rows)]),
    ]
    level = "95%"
    significance = Section(
        "Is the difference real?",
        notes=[f"Paired bootstrap over the shared tasks ({level} interval of the mean "
               "per-task difference). \"noise\" when the interval contains 0; \"too few "
               f"tasks for a verdict\" when fewer than {min_tasks()} of the shared tasks differ "
               "between the runs.", *notes],
        tables=[Table(["Run", "Metric", "Shared tasks", "Baseline", "Run", "Δ",
                        f"{level} interval", "Verdict"], _delta_rows(deltas))])
    sections.append(significance)
    sections += _comparison_plots(runs, labels)
    title = "Comparison: " + " vs ".join(labels)
    return Document(title, [f"{len(runs)} runs, baseline {labels[0]}."], sections)


def _merged_pass(runs: Sequence[Results]) -> dict[str, Any]:
    merged: dict[str, Any] = {"pass@k": {}, "pass^k": {}}
    for r in runs:
        for name in ("pass@k", "pass^k"):
            merged[name].update({k: 0 for k in mapping(r.metrics.get(name))})
    return merged


def _comparison_plots(runs: Sequence[Results], labels: Sequence[str]) -> list[Section]:
    section = Section("Plots")
    series = []
    for label, r in zip(labels, runs, strict=True):
        hat = mapping(r.metrics.get("pass^k"))
        pts = k_curve(hat)
        if pts:
            series.append((label, pts))
    if series:
        section.plots.append(Plot("compare_pass_hat_k", "pass^k against k", plots.line_chart(
            "pass^k against k", series, x_label="k (trials drawn)", y_label="pass^k")))
    groups: dict[str, None] = {}
    for r in runs:
        groups.update(dict.fromkeys(mapping(r.metrics.get("by_difficulty"))))
    order = ordered_groups(groups, by_difficulty=True)
    if order:
        bars = [(label, [as_float(mapping(mapping(r.metrics.get("by_difficulty"))
                                               .get(g)).get("success_rate")) for g in order])
                for label, r in zip(labels, runs, strict=True)]
        section.plots.append(Plot("compare_by_difficulty", "Success by difficulty",
                                   plots.bar_chart("Success by difficulty", order, bars,
                                                   x_label="difficulty",
                                                   y_label="success rate")))
    return [section] if section.plots else []


def write_comparison(run_dirs: Sequence[Path], *, html: Path | None = None,
                     md: Path | None = None, samples: int = 2000,
                     seed: int = 0) -> Comparison:
    """Compare runs, the first as the baseline: headline metrics side by side with deltas,
    and for success rate and average reward a paired bootstrap 95 % interval over the tasks
    each run shares with the baseline, with a verdict: "better" or "worse", "noise" when the
    interval contains 0, "too few tasks for a verdict" when fewer than ``min_tasks()`` (6)
    of the shared tasks differ (``eval.metrics.delta_verdict``). Writes
    the Markdown to ``md`` and the HTML to ``html`` when given (the Markdown text is also
    returned). Refuses (``EvalError`` naming the folder) fewer than two runs, a folder
    without a readable results.json, and a run with no task in common with the baseline."""
    paths = [Path(p) for p in run_dirs]
    if len(paths) < 2:
        raise EvalError(f"compare needs at least two run folders, got {len(paths)}")
    runs = [load_results(p) for p in paths]
    labels = _labels(paths)
    deltas, notes = _compare_deltas(paths, runs, labels, samples, seed)
    doc = _comparison_document(paths, runs, labels, deltas, notes)
    markdown = render_md(doc, {})
    write_all([(path.parent, path.name, data) for path, data in
                ((md, markdown), (html, render_html(doc) if html is not None else ""))
                if path is not None])
    return Comparison(deltas=tuple(deltas), markdown=markdown, md=md, html=html)
