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

The package: ``data`` (results.json, the trial table, writing files), ``numbers`` (how
numbers read), ``document`` (one structure for both renderings), ``markdown`` and ``html``
(the renderings), ``run`` (one run's report), ``compare`` (runs side by side).
"""

from eval.report.compare import Comparison, Delta, write_comparison
from eval.report.data import TRIAL_SCHEMA, load_results, trial_frame, trial_rows
from eval.report.numbers import fmt_cost, fmt_int, fmt_num, fmt_pct, fmt_seconds
from eval.report.run import ReportFiles, write_report

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
