"""Reports of evaluation runs: ``worldctl eval report`` and ``worldctl eval compare``.

``write_report`` reads one run folder's ``results.json`` and writes what people read
(Markdown; one self-contained HTML file with inline CSS and inline SVG plots, no script and
no URL) and what machines read (the per-trial table as CSV and parquet, and the plots as
SVG files). ``write_comparison`` puts runs side by side, the first as the baseline, with a
paired bootstrap interval over the tasks they share for each delta, so a difference that is
noise reads as noise.

Both render from the ``metrics`` object of ``results.json`` (``eval.metrics`` computes it)
and show only the keys it has; the error breakdown and the per-task table are counted from
the trials themselves. The same results give the same bytes in every file.

A run folder may come from someone else: ``results.json`` is read only as a regular file
(never through a link, never a FIFO), and every file is written as a new file renamed
into place, never through a link planted where it goes (``worldstore.folders``); all
targets are checked before the first is written, so a refused report writes nothing.
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from eval import plots
from eval.contract import Results, TaskResult, decode_results
from eval.errors import EvalError
from eval.metrics import bootstrap_delta, compute_metrics, interfaces_key, per_task_success
from worldstore.folders import check_writable, read_bytes, write_bytes

RESULTS_FILE = "results.json"
PLOTS_DIR = "plots"
_MAX_RESULTS = 1 << 30  # a results file larger than this is not one a run wrote
_DASH = "—"
_DIFFICULTY_ORDER = ("trivial", "easy", "medium", "hard", "expert")

# --- numbers ---------------------------------------------------------------------------------


def _as_float(value: object) -> float | None:
    """A finite number as a float; None for anything else (None, a bool, NaN, text)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _is_number(value: object) -> bool:
    return _as_float(value) is not None


def fmt_pct(value: object) -> str:
    """A rate as a percentage with one decimal: ``0.625`` -> ``62.5%``."""
    v = _as_float(value)
    return _DASH if v is None else f"{v * 100:.1f}%"


def fmt_num(value: object) -> str:
    """A mean such as a reward, three decimals."""
    v = _as_float(value)
    return _DASH if v is None else f"{v:.3f}"


def fmt_int(value: object) -> str:
    """A count, with thousands separated: ``12,345``."""
    v = _as_float(value)
    return _DASH if v is None else f"{round(v):,}"


def fmt_seconds(value: object) -> str:
    """A duration in seconds, two decimals and the unit: ``1.25 s``."""
    v = _as_float(value)
    return _DASH if v is None else f"{v:.2f} s"


def fmt_cost(value: object) -> str:
    """A cost in dollars, four decimals; a dash when unknown."""
    v = _as_float(value)
    return _DASH if v is None else f"${v:.4f}"


def _signed(value: float, digits: int) -> str:
    text = f"{value:+.{digits}f}"
    return text.replace("-", "+", 1) if float(text) == 0 else text  # never "-0.0"


@dataclass(frozen=True)
class _Metric:
    """One headline number: where it is in the metrics object, its label, its format."""

    path: tuple[str, ...]
    label: str
    fmt: Callable[[object], str]

    @property
    def is_rate(self) -> bool:
        return self.fmt is fmt_pct

    def value(self, metrics: Mapping[str, Any]) -> Any:
        node: Any = metrics
        for key in self.path:
            if not isinstance(node, Mapping) or key not in node:
                return None
            node = node[key]
        return node

    def delta(self, base: object, other: object) -> str:
        a, b = _as_float(base), _as_float(other)
        if a is None or b is None:
            return _DASH
        diff = b - a
        if self.is_rate:
            return f"{_signed(diff * 100, 1)} pts"
        if self.fmt is fmt_seconds:
            return f"{_signed(diff, 2)} s"
        if self.fmt is fmt_cost:
            return ("-" if round(diff, 4) < 0 else "+") + f"${abs(diff):.4f}"
        if self.fmt is fmt_int:
            return f"{round(diff):+,}"
        return _signed(diff, 3)


_HEADLINE = (
    _Metric(("success_rate",), "Success rate", fmt_pct),
    _Metric(("avg_reward",), "Average reward (lost trials count 0)", fmt_num),
    _Metric(("avg_reward_graded",), "Average reward (graded trials)", fmt_num),
    _Metric(("checklist_completion",), "Checklist completion", fmt_pct),
    _Metric(("tasks",), "Tasks", fmt_int),
    _Metric(("trials",), "Trials", fmt_int),
    _Metric(("trials_lost",), "Trials lost to infrastructure", fmt_int),
    _Metric(("env_error_rate",), "Environment-error (lost) rate", fmt_pct),
    _Metric(("format_error_rate",), "Format-error rate", fmt_pct),
    _Metric(("interface_switch_rate",), "Interface-switch rate", fmt_pct),
)
_USAGE = (
    *(_Metric(("tokens", side, stat), f"Tokens {side} ({stat})", fmt_int)
      for side in ("in", "out") for stat in ("total", "p50", "p90", "p99")),
    _Metric(("cost", "total"), "Cost (total)", fmt_cost),
    _Metric(("cost", "per_trial"), "Cost per trial", fmt_cost),
    _Metric(("cost", "unknown"), "Trials of unknown cost", fmt_int),
    *(_Metric(("latency", stat), f"Latency ({stat})", fmt_seconds)
      for stat in ("mean", "p50", "p90", "p99")),
)


def _ks(*estimates: object) -> list[str]:
    """The k's of pass@k / pass^k objects, in numeric order."""
    keys = {k for est in estimates if isinstance(est, Mapping) for k in est}
    return sorted(keys, key=lambda k: (int(k) if k.isdigit() else math.inf, k))


def _pass_metrics(metrics: Mapping[str, Any]) -> list[_Metric]:
    ks = _ks(metrics.get("pass@k"), metrics.get("pass^k"))
    return [_Metric((name, k), f"{name.replace('k', k)}", fmt_pct)
            for name in ("pass@k", "pass^k") for k in ks]


# --- documents: one structure rendered as Markdown and as HTML -----------------------------


@dataclass(frozen=True)
class _Table:
    headers: Sequence[str]
    rows: Sequence[Sequence[str]]
    caption: str | None = None


@dataclass(frozen=True)
class _Plot:
    name: str  # the file stem under plots/
    title: str
    svg: str


@dataclass
class _Section:
    title: str
    notes: list[str] = field(default_factory=list)
    tables: list[_Table] = field(default_factory=list)
    plots: list[_Plot] = field(default_factory=list)


@dataclass
class _Document:
    title: str
    intro: list[str]
    sections: list[_Section]


_NUMERIC = re.compile(r"^[+\-$]?\d")


def _numeric_columns(table: _Table) -> list[bool]:
    """Which columns hold numbers (right-aligned): every cell a number or a dash."""
    return [i > 0 and all(_NUMERIC.match(row[i]) or row[i] == _DASH for row in table.rows)
            for i in range(len(table.headers))]


def _md_cell(text: str) -> str:
    text = " ".join(text.split())
    for char in ("\\", "|", "<", ">", "*", "_", "`", "["):
        text = text.replace(char, "\\" + char)
    return text or " "


def _render_md(doc: _Document, plot_links: Mapping[str, str]) -> str:
    out = [f"# {_md_cell(doc.title)}", ""]
    out += [line for note in doc.intro for line in (_md_cell(note), "")]
    for section in doc.sections:
        linked = [plot for plot in section.plots if plot.name in plot_links]
        if not (section.notes or section.tables or linked):
            continue  # a section of plots only, with no plot files to link
        out += [f"## {_md_cell(section.title)}", ""]
        out += [line for note in section.notes for line in (_md_cell(note), "")]
        for table in section.tables:
            if table.caption:
                out += [f"**{_md_cell(table.caption)}**", ""]
            out.append("| " + " | ".join(_md_cell(h) for h in table.headers) + " |")
            out.append("|" + "|".join("--:" if num else "---"
                                      for num in _numeric_columns(table)) + "|")
            out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in table.rows]
            out.append("")
        for plot in linked:
            out += [f"![{_md_cell(plot.title)}]({plot_links[plot.name]})", ""]
    return "\n".join(out).rstrip("\n") + "\n"


_CSS = """
body { font-family: system-ui, sans-serif; color: #222; margin: 0; background: #fafafa; }
main { max-width: 1100px; margin: 0 auto; padding: 24px; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 2em;
  border-bottom: 1px solid #ddd; padding-bottom: 4px; }
table { border-collapse: collapse; margin: 12px 0; background: #fff; }
caption { text-align: left; font-weight: bold; padding: 4px 0; }
th, td { border: 1px solid #ddd; padding: 4px 10px; text-align: right; }
th.t, td.t { text-align: left; }
th { background: #f0f0f0; }
tbody tr:nth-child(even) { background: #f8f8f8; }
figure { margin: 12px 0; } figure svg { max-width: 100%; height: auto;
  border: 1px solid #ddd; background: #fff; }
p.note { color: #555; }
"""


def _h(text: str) -> str:
    return html.escape(text, quote=True)


def _render_html(doc: _Document) -> str:
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           f"<title>{_h(doc.title)}</title>", f"<style>{_CSS}</style>", "</head>", "<body>",
           "<main>", f"<h1>{_h(doc.title)}</h1>"]
    out += [f'<p class="note">{_h(note)}</p>' for note in doc.intro]
    for section in doc.sections:
        out.append(f"<section><h2>{_h(section.title)}</h2>")
        out += [f'<p class="note">{_h(note)}</p>' for note in section.notes]
        for table in section.tables:
            out.append("<table>")
            if table.caption:
                out.append(f"<caption>{_h(table.caption)}</caption>")
            cls = ['' if num else ' class="t"' for num in _numeric_columns(table)]
            out.append("<thead><tr>" + "".join(f"<th{c}>{_h(h)}</th>" for c, h in
                                               zip(cls, table.headers, strict=True))
                       + "</tr></thead><tbody>")
            out += ["<tr>" + "".join(f"<td{c}>{_h(cell)}</td>" for c, cell in
                                     zip(cls, row, strict=True)) + "</tr>"
                    for row in table.rows]
            out.append("</tbody></table>")
        for plot in section.plots:
            out.append(f'<figure id="plot-{_h(plot.name)}">{plots.for_html(plot.svg)}</figure>')
        out.append("</section>")
    out += ["</main>", "</body>", "</html>"]
    return "\n".join(out) + "\n"


# --- loading ---------------------------------------------------------------------------------


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


def _task_metrics(path: Path, task: TaskResult) -> dict[str, Any]:
    try:
        return compute_metrics([task])
    except EvalError as exc:
        raise EvalError(f"{path}: {exc}") from exc


def _ordered_groups(groups: Mapping[str, Any], *, by_difficulty: bool) -> list[str]:
    def rank(name: str) -> tuple[int, str]:
        if by_difficulty and name in _DIFFICULTY_ORDER:
            return _DIFFICULTY_ORDER.index(name), name
        return len(_DIFFICULTY_ORDER), name

    return sorted(groups, key=rank)


# --- the trial table -------------------------------------------------------------------------

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


def _trials_csv(rows: Sequence[Mapping[str, Any]]) -> str:
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


# --- one run ---------------------------------------------------------------------------------


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
        ("success rate", [_as_float(groups[g].get("success_rate")) for g in order])]
    if top_k is not None:
        for name in ("pass@k", "pass^k"):
            label = name.replace("k", top_k)
            series.append((label, [_as_float(_mapping(groups[g].get(name)).get(top_k))
                                   for g in order]))
    return plots.bar_chart(title, order, series, x_label=x_label, y_label="rate")


def _k_curve(estimates: Mapping[str, Any]) -> list[tuple[float, float]]:
    """The points (k, value) of a pass@k or pass^k object."""
    return [(float(k), v) for k in _ks(estimates)
            if k.isdigit() and (v := _as_float(estimates.get(k))) is not None]


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _group_section(title: str, key: str, metrics: Mapping[str, Any], *, by_difficulty: bool,
                   x_label: str) -> _Section | None:
    groups = _mapping(metrics.get(key))
    groups = {name: _mapping(value) for name, value in groups.items()}
    if not groups:
        return None
    order = _ordered_groups(groups, by_difficulty=by_difficulty)
    ks = _ks(*(g.get("pass^k") for g in groups.values()), *(g.get("pass@k") for g in
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
            row += [fmt_pct(_mapping(group.get(n)).get(top_k)) for n in ("pass@k", "pass^k")]
        rows.append(row)
    section = _Section(title, tables=[_Table(headers, rows)])
    if top_k is not None:
        section.notes.append(f"pass@{top_k} and pass^{top_k}: a dash where a group has fewer "
                             f"than {top_k} trials of some task.")
    section.plots.append(_Plot(key, title, _rate_bars(title, groups, order, top_k, x_label)))
    return section


def _headline_sections(results: Results) -> list[_Section]:
    metrics = results.metrics
    sections = []
    rows = [[m.label, m.fmt(m.value(metrics))] for m in _HEADLINE if m.value(metrics) is not None]
    if rows:
        sections.append(_Section("Headline metrics", tables=[_Table(["Metric", "Value"], rows)]))
    at, hat = _mapping(metrics.get("pass@k")), _mapping(metrics.get("pass^k"))
    ks = _ks(at, hat)
    if ks:
        section = _Section(
            "pass@k and pass^k",
            notes=["pass@k: the chance that at least one of k trials succeeds (unbiased "
                   "estimator); pass^k: the chance that all k succeed (tau2-bench). Lost "
                   "trials count as failures."],
            tables=[_Table(["k", "pass@k", "pass^k"],
                           [[k, fmt_pct(at.get(k)), fmt_pct(hat.get(k))] for k in ks])])
        series = [(name, _k_curve(est)) for name, est in (("pass@k", at), ("pass^k", hat))
                  if est]
        section.plots.append(_Plot("pass_k", "pass@k and pass^k against k", plots.line_chart(
            "pass@k and pass^k against k", series, x_label="k (trials drawn)",
            y_label="rate")))
        sections.append(section)
    return sections


def _budget_section(metrics: Mapping[str, Any]) -> _Section | None:
    curve = metrics.get("step_budget_curve")
    points = [(float(p[0]), float(p[1])) for p in curve or []
              if isinstance(p, list | tuple) and len(p) == 2 and all(map(_is_number, p))]
    if not points:
        return None
    shown = [p for i, p in enumerate(points)
             if i == 0 or i == len(points) - 1 or p[1] != points[i - 1][1]]
    title = "Success within a step budget"
    return _Section(
        title, notes=["The share of all trials that succeeded within each step budget "
                      "(rows where it changes)."],
        tables=[_Table(["Step budget", "Success"],
                       [[fmt_int(b), fmt_pct(r)] for b, r in shown])],
        plots=[_Plot("step_budget", title, plots.line_chart(
            title, [("success", points)], x_label="step budget", y_label="success rate"))])


def _usage_sections(metrics: Mapping[str, Any]) -> list[_Section]:
    sections = []
    share = {k: v for k, v in _mapping(metrics.get("action_share")).items() if _is_number(v)}
    switch = metrics.get("interface_switch_rate")
    if share or switch is not None:
        section = _Section("Interfaces used")
        if switch is not None:
            section.notes.append(f"Interface-switch rate: {fmt_pct(switch)} of consecutive "
                                 "action pairs change interface (per trial, averaged).")
        if share:
            section.tables.append(_Table(["Interface", "Share of actions"],
                                         [[k, fmt_pct(share[k])] for k in sorted(share)]))
        sections.append(section)
    rows = [[m.label, m.fmt(m.value(metrics))] for m in _USAGE if m.value(metrics) is not None]
    if rows:
        sections.append(_Section("Tokens, cost and latency",
                                 tables=[_Table(["Metric", "Value"], rows)]))
    return sections


def _error_section(results: Results) -> _Section:
    trials = [(task, t) for task in results.tasks for t in task.trials]
    total = len(trials)
    lost = [(task, t) for task, t in trials if t.env_error]
    format_errors = sum(1 for _, t in trials if t.format_error)
    terminations = Counter(t.termination for _, t in trials)

    def share(count: int) -> str:
        return fmt_pct(count / total) if total else _DASH

    section = _Section("Errors and terminations", notes=[
        f"{len(lost)} of {total} trials were lost to the infrastructure (instance, sandbox "
        "or verifier failed); they count as failures in every rate above, never dropped."])
    section.tables.append(_Table(
        ["Kind", "Trials", "Share"],
        [["format errors", fmt_int(format_errors), share(format_errors)],
         ["environment errors (lost)", fmt_int(len(lost)), share(len(lost))]],
        caption="Errors"))
    section.tables.append(_Table(
        ["Termination", "Trials", "Share"],
        [[reason, fmt_int(terminations[reason]), share(terminations[reason])]
         for reason in sorted(terminations)], caption="Termination reasons"))
    if lost:
        section.tables.append(_Table(
            ["Task", "Trial", "Episode", "Termination", "Error"],
            [[task.task_id, str(t.trial), t.episode_id, t.termination, t.error or _DASH]
             for task, t in sorted(lost, key=lambda p: (p[0].task_id, p[1].trial))],
            caption="Lost trials"))
    groups = ["format errors", "lost (env errors)", *sorted(terminations)]
    counts: list[float | None] = [float(format_errors), float(len(lost)),
                                  *(float(terminations[r]) for r in sorted(terminations))]
    section.plots.append(_Plot("errors", "Error breakdown", plots.bar_chart(
        "Error breakdown and termination reasons", groups, [("trials", counts)],
        x_label="kind", y_label="trials", percent=False)))
    return section


def _task_section(path: Path, results: Results) -> _Section:
    rows = []
    for task in sorted(results.tasks, key=lambda t: t.task_id):
        m = _task_metrics(path, task)
        n = len(task.trials)
        rows.append([
            task.task_id, task.difficulty, interfaces_key(task), fmt_int(n),
            fmt_int(sum(1 for t in task.trials if t.success)), fmt_pct(m.get("success_rate")),
            fmt_num(m.get("avg_reward")), fmt_int(m.get("trials_lost")),
            fmt_int(sum(1 for t in task.trials if t.format_error)),
            f"{sum(t.steps for t in task.trials) / n:.1f}",
            fmt_seconds(_mapping(m.get("latency")).get("mean"))])
    return _Section("Tasks", tables=[_Table(
        ["Task", "Difficulty", "Interfaces", "Trials", "Successes", "Success", "Avg reward",
         "Lost", "Format errors", "Mean steps", "Mean time"], rows)])


def _run_table(results: Results) -> _Table:
    run = results.run
    rows = [["run id", run.run_id], ["agent", run.agent], ["model", run.model or _DASH],
            ["k", str(run.k)], ["split", run.split or _DASH], ["hinted", str(run.hinted).lower()],
            ["max steps", str(run.max_steps)], ["history", str(run.history)],
            ["concurrency", str(run.concurrency)],
            ["tasks from", ", ".join(run.tasks_source) or _DASH], ["started", run.started]]
    if run.api_base:
        rows.append(["api base", run.api_base])
    return _Table(["Setting", "Value"], rows)


def _report_document(path: Path, results: Results) -> _Document:
    metrics = results.metrics
    sections = [_Section("Run", tables=[_run_table(results)]), *_headline_sections(results)]
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
    return _Document(f"Evaluation of {results.run.agent}",
                     [f"Run {results.run.run_id}, started {results.run.started}."], sections)


def _bytes(data: str | bytes) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else data


def _write_all(files: Sequence[tuple[Path, str, str | bytes]]) -> None:
    """Write (folder, name inside it, data) each as a new file renamed into place, never
    through a link (``worldstore.folders``); every target is checked first, so a run
    folder with a link or a folder where a file goes is refused with nothing written."""
    for folder, rel, _data in files:
        check_writable(folder, [rel])
    for folder, rel, data in files:
        folder.mkdir(parents=True, exist_ok=True)  # as named by the caller (--html, --md)
        write_bytes(folder, rel, _bytes(data))


def _rel_link(target: Path, start: Path) -> str:
    return Path(os.path.relpath(target.resolve(), start.resolve())).as_posix()


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
    links = {p.stem: _rel_link(p, md_path.parent) for p in plot_paths}

    rows = trial_rows(results)
    csv_path, parquet_path = run_dir / "trials.csv", run_dir / "trials.parquet"
    buffer = io.BytesIO()
    trial_frame(results).write_parquet(buffer, compression="zstd", statistics=True)
    _write_all([*((run_dir, rel, svg) for rel, svg in plots_made),
                (run_dir, csv_path.name, _trials_csv(rows)),
                (run_dir, parquet_path.name, buffer.getvalue()),
                (md_path.parent, md_path.name, _render_md(doc, links)),
                (html_path.parent, html_path.name, _render_html(doc))])
    return ReportFiles(md=md_path, html=html_path, csv=csv_path, parquet=parquet_path,
                       plots=tuple(plot_paths))


# --- comparing runs --------------------------------------------------------------------------


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
    verdict: str  # "better", "worse" or "noise" (the interval contains 0)


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
    return {task.task_id: _as_float(_task_metrics(path, task).get("avg_reward")) or 0.0
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
            verdict = "noise" if boot["noise"] else ("better" if delta > 0 else "worse")
            deltas.append(Delta(run=label, metric=metric, baseline=math.fsum(a) / len(a),
                                value=math.fsum(b) / len(b), delta=delta, low=low, high=high,
                                tasks=len(shared), verdict=verdict))
    return deltas, notes


def _delta_rows(deltas: Sequence[Delta]) -> list[list[str]]:
    rows = []
    for d in deltas:
        if d.metric == "success_rate":
            name, show = "Success rate", fmt_pct
            change = f"{_signed(d.delta * 100, 1)} pts"
            interval = f"{_signed(d.low * 100, 1)} to {_signed(d.high * 100, 1)} pts"
        else:
            name, show = "Average reward", fmt_num
            change = _signed(d.delta, 3)
            interval = f"{_signed(d.low, 3)} to {_signed(d.high, 3)}"
        rows.append([d.run, name, str(d.tasks), show(d.baseline), show(d.value), change,
                     interval, d.verdict])
    return rows


def _comparison_document(run_dirs: Sequence[Path], runs: Sequence[Results],
                         labels: Sequence[str], deltas: Sequence[Delta],
                         notes: Sequence[str]) -> _Document:
    specs = [*_HEADLINE[:4], *_pass_metrics(_merged_pass(runs)), *_HEADLINE[4:], *_USAGE]
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
    runs_table = _Table(
        ["Run", "Folder", "Agent", "Model", "k", "Tasks", "Started"],
        [[label, str(path), r.run.agent, r.run.model or _DASH, str(r.run.k),
          str(len(r.tasks)), r.run.started]
         for label, path, r in zip(labels, run_dirs, runs, strict=True)])
    sections = [
        _Section("Runs", notes=[f"The baseline is {labels[0]}; deltas are each run minus it."],
                 tables=[runs_table]),
        _Section("Headline metrics side by side", notes=[
            "Each run's own metrics over all its tasks; the intervals below pair the shared "
            "tasks only."], tables=[_Table(headers, rows)]),
    ]
    level = "95%"
    significance = _Section(
        "Is the difference real?",
        notes=[f"Paired bootstrap over the shared tasks ({level} interval of the mean "
               "per-task difference). \"noise\" when the interval contains 0.", *notes],
        tables=[_Table(["Run", "Metric", "Shared tasks", "Baseline", "Run", "Δ",
                        f"{level} interval", "Verdict"], _delta_rows(deltas))])
    sections.append(significance)
    sections += _comparison_plots(runs, labels)
    title = "Comparison: " + " vs ".join(labels)
    return _Document(title, [f"{len(runs)} runs, baseline {labels[0]}."], sections)


def _merged_pass(runs: Sequence[Results]) -> dict[str, Any]:
    merged: dict[str, Any] = {"pass@k": {}, "pass^k": {}}
    for r in runs:
        for name in ("pass@k", "pass^k"):
            merged[name].update({k: 0 for k in _mapping(r.metrics.get(name))})
    return merged


def _comparison_plots(runs: Sequence[Results], labels: Sequence[str]) -> list[_Section]:
    section = _Section("Plots")
    series = []
    for label, r in zip(labels, runs, strict=True):
        hat = _mapping(r.metrics.get("pass^k"))
        pts = _k_curve(hat)
        if pts:
            series.append((label, pts))
    if series:
        section.plots.append(_Plot("compare_pass_hat_k", "pass^k against k", plots.line_chart(
            "pass^k against k", series, x_label="k (trials drawn)", y_label="pass^k")))
    groups: dict[str, None] = {}
    for r in runs:
        groups.update(dict.fromkeys(_mapping(r.metrics.get("by_difficulty"))))
    order = _ordered_groups(groups, by_difficulty=True)
    if order:
        bars = [(label, [_as_float(_mapping(_mapping(r.metrics.get("by_difficulty"))
                                               .get(g)).get("success_rate")) for g in order])
                for label, r in zip(labels, runs, strict=True)]
        section.plots.append(_Plot("compare_by_difficulty", "Success by difficulty",
                                   plots.bar_chart("Success by difficulty", order, bars,
                                                   x_label="difficulty",
                                                   y_label="success rate")))
    return [section] if section.plots else []


def write_comparison(run_dirs: Sequence[Path], *, html: Path | None = None,
                     md: Path | None = None, samples: int = 2000,
                     seed: int = 0) -> Comparison:
    """Compare runs, the first as the baseline: headline metrics side by side with deltas,
    and for success rate and average reward a paired bootstrap 95 % interval over the tasks
    each run shares with the baseline, with a verdict ("better", "worse", "noise"). Writes
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
    markdown = _render_md(doc, {})
    _write_all([(path.parent, path.name, data) for path, data in
                ((md, markdown), (html, _render_html(doc) if html is not None else ""))
                if path is not None])
    return Comparison(deltas=tuple(deltas), markdown=markdown, md=md, html=html)


__all__ = [
    "TRIAL_SCHEMA",
    "Comparison",
    "Delta",
    "ReportFiles",
    "fmt_cost",
    "fmt_int",
    "fmt_num",
    "fmt_pct",
    "fmt_seconds",
    "load_results",
    "trial_frame",
    "trial_rows",
    "write_comparison",
    "write_report",
]
