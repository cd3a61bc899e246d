"""One run's report: its sections (headline, groups, budget, usage, errors, tasks) and
``write_report``."""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval import plots
from eval.contract import Results
from eval.metrics import interfaces_key
from eval.report.data import (
    RESULTS_FILE,
    load_results,
    ordered_groups,
    rel_link,
    task_metrics,
    trial_frame,
    trial_rows,
    trials_csv,
    write_all,
)
from eval.report.document import Document, Plot, Section, Table
from eval.report.html import render_html
from eval.report.markdown import render_md
from eval.report.numbers import (
    DASH,
    HEADLINE,
    USAGE,
    as_float,
    fmt_int,
    fmt_num,
    fmt_pct,
    fmt_seconds,
    is_number,
    k_values,
)

__all__ = ["PLOTS_DIR", "ReportFiles", "k_curve", "mapping", "write_report"]

PLOTS_DIR = "plots"


@dataclass(frozen=True)
class ReportFiles:
    """What ``write_report`` wrote."""

    md: Path
    html: Path
    csv: Path
    parquet: Path
    plots: tuple[Path, ...]


def _rate_bars(title: str, groups: Mapping[str, Any], order: Sequence[str], top_k: str | None,
               x_label: str) -> str:
    series: list[tuple[str, list[float | None]]] = [
        ("success rate", [as_float(groups[g].get("success_rate")) for g in order])]
    if top_k is not None:
        for name in ("pass@k", "pass^k"):
            label = name.replace("k", top_k)
            series.append((label, [as_float(mapping(groups[g].get(name)).get(top_k))
                                   for g in order]))
    return plots.bar_chart(title, order, series, x_label=x_label, y_label="rate")


def k_curve(estimates: Mapping[str, Any]) -> list[tuple[float, float]]:
    """The points (k, value) of a pass@k or pass^k object."""
    return [(float(k), v) for k in k_values(estimates)
            if k.isdigit() and (v := as_float(estimates.get(k))) is not None]


def mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _group_section(title: str, key: str, metrics: Mapping[str, Any], *, by_difficulty: bool,
                   x_label: str) -> Section | None:
    groups = mapping(metrics.get(key))
    groups = {name: mapping(value) for name, value in groups.items()}
    if not groups:
        return None
    order = ordered_groups(groups, by_difficulty=by_difficulty)
    ks = k_values(*(g.get("pass^k") for g in groups.values()), *(g.get("pass@k") for g in
                                                             groups.values()))
    top_k = ks[-1] if ks else None
    headers = [x_label, "Tasks", "Trials", "Success", "Avg reward"]
    if top_k is not None:
        headers += [f"pass@{top_k}", f"pass^{top_k}"]
    rows = []
    for name in order:
        group = groups[name]
        row = [name, fmt_int(group.get("tasks")), fmt_int(group.get("trials")),
               fmt_pct(group.get("success_rate")), fmt_num(group.get("avg_reward"))]
        if top_k is not None:
            row += [fmt_pct(mapping(group.get(n)).get(top_k)) for n in ("pass@k", "pass^k")]
        rows.append(row)
    section = Section(title, tables=[Table(headers, rows)])
    if top_k is not None:
        section.notes.append(f"pass@{top_k} and pass^{top_k}: a dash where a group has fewer "
                             f"than {top_k} trials of some task.")
    section.plots.append(Plot(key, title, _rate_bars(title, groups, order, top_k, x_label)))
    return section


def _headline_sections(results: Results) -> list[Section]:
    metrics = results.metrics
    sections = []
    rows = [[m.label, m.fmt(m.value(metrics))] for m in HEADLINE if m.value(metrics) is not None]
    if rows:
        sections.append(Section("Headline metrics", tables=[Table(["Metric", "Value"], rows)]))
    at, hat = mapping(metrics.get("pass@k")), mapping(metrics.get("pass^k"))
    ks = k_values(at, hat)
    if ks:
        section = Section(
            "pass@k and pass^k",
            notes=["pass@k: the chance that at least one of k trials succeeds (unbiased "
                   "estimator); pass^k: the chance that all k succeed (tau2-bench). Lost "
                   "trials count as failures."],
            tables=[Table(["k", "pass@k", "pass^k"],
                           [[k, fmt_pct(at.get(k)), fmt_pct(hat.get(k))] for k in ks])])
        series = [(name, k_curve(est)) for name, est in (("pass@k", at), ("pass^k", hat))
                  if est]
        section.plots.append(Plot("pass_k", "pass@k and pass^k against k", plots.line_chart(
            "pass@k and pass^k against k", series, x_label="k (trials drawn)",
            y_label="rate")))
        sections.append(section)
    return sections


def _budget_section(metrics: Mapping[str, Any]) -> Section | None:
    curve = metrics.get("step_budget_curve")
    points = [(float(p[0]), float(p[1])) for p in curve or []
              if isinstance(p, list | tuple) and len(p) == 2 and all(map(is_number, p))]
    if not points:
        return None
    shown = [p for i, p in enumerate(points)
             if i == 0 or i == len(points) - 1 or p[1] != points[i - 1][1]]
    title = "Success within a step budget"
    return Section(
        title, notes=["The share of all trials that succeeded within each step budget "
                      "(rows where it changes)."],
        tables=[Table(["Step budget", "Success"],
                       [[fmt_int(b), fmt_pct(r)] for b, r in shown])],
        plots=[Plot("step_budget", title, plots.line_chart(
            title, [("success", points)], x_label="step budget", y_label="success rate"))])


def _usage_sections(metrics: Mapping[str, Any]) -> list[Section]:
    sections = []
    share = {k: v for k, v in mapping(metrics.get("action_share")).items() if is_number(v)}
    switch = metrics.get("interface_switch_rate")
    if share or switch is not None:
        section = Section("Interfaces used")
        if switch is not None:
            section.notes.append(f"Interface-switch rate: {fmt_pct(switch)} of consecutive "
                                 "action pairs change interface (per trial, averaged).")
        if share:
            section.tables.append(Table(["Interface", "Share of actions"],
                                         [[k, fmt_pct(share[k])] for k in sorted(share)]))
        sections.append(section)
    rows = [[m.label, m.fmt(m.value(metrics))] for m in USAGE if m.value(metrics) is not None]
    if rows:
        sections.append(Section("Tokens, cost and latency",
                                 tables=[Table(["Metric", "Value"], rows)]))
    return sections


def _error_section(results: Results) -> Section:
    trials = [(task, t) for task in results.tasks for t in task.trials]
    total = len(trials)
    lost = [(task, t) for task, t in trials if t.env_error]
    format_errors = sum(1 for _, t in trials if t.format_error)
    terminations = Counter(t.termination for _, t in trials)

    def share(count: int) -> str:
        return fmt_pct(count / total) if total else DASH

    section = Section("Errors and terminations", notes=[
        f"{len(lost)} of {total} trials were lost to the infrastructure (instance, sandbox "
        "or verifier failed); they count as failures in every rate above, never dropped."])
    section.tables.append(Table(
        ["Kind", "Trials", "Share"],
        [["format errors", fmt_int(format_errors), share(format_errors)],
         ["environment errors (lost)", fmt_int(len(lost)), share(len(lost))]],
        caption="Errors"))
    section.tables.append(Table(
        ["Termination", "Trials", "Share"],
        [[reason, fmt_int(terminations[reason]), share(terminations[reason])]
         for reason in sorted(terminations)], caption="Termination reasons"))
    if lost:
        section.tables.append(Table(
            ["Task", "Trial", "Episode", "Termination", "Error"],
            [[task.task_id, str(t.trial), t.episode_id, t.termination, t.error or DASH]
             for task, t in sorted(lost, key=lambda p: (p[0].task_id, p[1].trial))],
            caption="Lost trials"))
    groups = ["format errors", "lost (env errors)", *sorted(terminations)]
    counts: list[float | None] = [float(format_errors), float(len(lost)),
                                  *(float(terminations[r]) for r in sorted(terminations))]
    section.plots.append(Plot("errors", "Error breakdown", plots.bar_chart(
        "Error breakdown and termination reasons", groups, [("trials", counts)],
        x_label="kind", y_label="trials", percent=False)))
    return section


def _task_section(path: Path, results: Results) -> Section:
    rows = []
    for task in sorted(results.tasks, key=lambda t: t.task_id):
        m = task_metrics(path, task)
        n = len(task.trials)
        rows.append([
            task.task_id, task.difficulty, interfaces_key(task), fmt_int(n),
            fmt_int(sum(1 for t in task.trials if t.success)), fmt_pct(m.get("success_rate")),
            fmt_num(m.get("avg_reward")), fmt_int(m.get("trials_lost")),
            fmt_int(sum(1 for t in task.trials if t.format_error)),
            f"{sum(t.steps for t in task.trials) / n:.1f}",
            fmt_seconds(mapping(m.get("latency")).get("mean"))])
    return Section("Tasks", tables=[Table(
        ["Task", "Difficulty", "Interfaces", "Trials", "Successes", "Success", "Avg reward",
         "Lost", "Format errors", "Mean steps", "Mean time"], rows)])


def _run_table(results: Results) -> Table:
    run = results.run
    rows = [["run id", run.run_id], ["agent", run.agent], ["model", run.model or DASH],
            ["k", str(run.k)], ["split", run.split or DASH], ["hinted", str(run.hinted).lower()],
            ["max steps", str(run.max_steps)], ["history", str(run.history)],
            ["concurrency", str(run.concurrency)],
            ["tasks from", ", ".join(run.tasks_source) or DASH], ["started", run.started]]
    if run.api_base:
        rows.append(["api base", run.api_base])
    return Table(["Setting", "Value"], rows)


def _report_document(path: Path, results: Results) -> Document:
    metrics = results.metrics
    sections = [Section("Run", tables=[_run_table(results)]), *_headline_sections(results)]
    for section in (
        _group_section("By difficulty", "by_difficulty", metrics, by_difficulty=True,
                       x_label="Difficulty"),
        _group_section("By interface set", "by_interfaces", metrics, by_difficulty=False,
                       x_label="Interfaces"),
        _budget_section(metrics),
    ):
        if section is not None:
            sections.append(section)
    sections += [*_usage_sections(metrics), _error_section(results),
                 _task_section(path, results)]
    return Document(f"Evaluation of {results.run.agent}",
                     [f"Run {results.run.run_id}, started {results.run.started}."], sections)


def write_report(run_dir: Path, *, html: Path | None = None,
                 md: Path | None = None) -> ReportFiles:
    """Render a run folder: ``md`` (default ``run_dir/report.md``), ``html`` (default
    ``run_dir/report.html``), ``run_dir/trials.csv``, ``run_dir/trials.parquet`` and
    ``run_dir/plots/*.svg``. Refuses (``EvalError``) a folder without a readable
    results.json."""
    run_dir = Path(run_dir)
    results = load_results(run_dir)
    md_path = md if md is not None else run_dir / "report.md"
    html_path = html if html is not None else run_dir / "report.html"
    doc = _report_document(run_dir / RESULTS_FILE, results)

    plots_made = [(f"{PLOTS_DIR}/{plot.name}.svg", plot.svg)
                  for section in doc.sections for plot in section.plots]
    plot_paths = [run_dir / rel for rel, _svg in plots_made]
    links = {p.stem: rel_link(p, md_path.parent) for p in plot_paths}

    rows = trial_rows(results)
    csv_path, parquet_path = run_dir / "trials.csv", run_dir / "trials.parquet"
    buffer = io.BytesIO()
    trial_frame(results).write_parquet(buffer, compression="zstd", statistics=True)
    write_all([*((run_dir, rel, svg) for rel, svg in plots_made),
                (run_dir, csv_path.name, trials_csv(rows)),
                (run_dir, parquet_path.name, buffer.getvalue()),
                (md_path.parent, md_path.name, render_md(doc, links)),
                (html_path.parent, html_path.name, render_html(doc))])
    return ReportFiles(md=md_path, html=html_path, csv=csv_path, parquet=parquet_path,
                       plots=tuple(plot_paths))
