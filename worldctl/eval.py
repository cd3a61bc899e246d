"""The evaluation commands: ``eval run|report|compare`` (the library is ``eval``).

``eval run`` takes a pack (its ``--split``, default eval) or task folders; its progress
bar (trials, ETA, running success) goes to stderr; ``--json`` prints the results contract
to stdout. ``report`` and ``compare`` render run folders.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from worldctl import render
from worldctl.session import installed_packs, packs_option, remember_packs, worlds

if TYPE_CHECKING:
    from eval.contract import Trial
    from gates.task import Task


@click.group("eval")
@packs_option
@click.pass_context
def eval_group(ctx: click.Context, packs_dir: str | None) -> None:
    """Measure agents on tasks: runs, reports, comparisons."""
    remember_packs(ctx, packs_dir)


@eval_group.command("run")
@click.argument("sources", nargs=-1, required=True, metavar="(PACK | TASK_DIR...)")
@click.option("--agent", required=True, help="llm:MODEL (any litellm model) or scripted:NAME.")
@click.option("--split", default="eval", show_default=True,
              help="The pack's split (sft, rl, eval); ignored for task folders.")
@click.option("-k", "k", default=4, show_default=True, type=click.IntRange(min=1),
              help="Trials per task.")
@click.option("--hinted", is_flag=True, help="Show the agents the tasks' hints.")
@click.option("--protocol", "protocol_name", type=click.Choice(["awm", "wildawm"]), default=None,
              help="Run the LLM agent as a paper evaluates: awm (meta-tool mode, temperature "
                   "0.6, top-k 20, top-p 0.95, window 10, 20 steps) or wildawm (256 steps, "
                   "no window, compaction at 76,800 of 102,400 tokens). --max-steps and "
                   "--history, when given, win over its values.")
@click.option("--max-steps", default=None, type=click.IntRange(min=1),
              help="Model steps per trial (LLM agents) [default: 20, or the protocol's; "
                   "wins over --protocol].")
@click.option("--history", default=None, type=click.IntRange(min=0),
              help="Recent steps the LLM agent sees (AWM's window; 0: all) [default: 10, "
                   "or the protocol's; wins over --protocol].")
@click.option("--concurrency", default=1, show_default=True, type=click.IntRange(min=1),
              help="Trials at once.")
@click.option("--api-base", default=None, help="The model server (e.g. a local vLLM).")
@click.option("--out", "out", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="The run folder (default: runs/<run id>); an existing one resumes.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.pass_context
def eval_run(ctx: click.Context, sources: tuple[str, ...], agent: str, split: str, k: int,
             hinted: bool, protocol_name: str | None, max_steps: int | None,
             history: int | None, concurrency: int, api_base: str | None, out: Path | None,
             as_json: bool) -> None:
    """Run K trials of an agent on every task, each graded, and write the results.

    Trials are content-addressed: a killed run resumes where it stopped when run again
    with the same --out."""
    from eval.contract import encode_results
    from eval.protocols import protocol
    from eval.runner import EvalConfig, run_eval, run_id_of
    from worldenv.instances.instance import Environment

    tasks, used_split = _tasks(ctx, sources, split)
    steps, window = protocol(protocol_name).limits(max_steps, history)
    config = EvalConfig(agent=agent, k=k, split=used_split, hinted=hinted,
                        max_steps=steps, history=window, concurrency=concurrency,
                        api_base=api_base, protocol=protocol_name)
    config.check()
    folder = out or Path("runs") / run_id_of(config, tasks)
    quiet = as_json or not sys.stderr.isatty()  # a bar only where someone watches it
    with Environment(worlds(ctx)) as env, _Bar(quiet=quiet) as bar:
        results = run_eval(env, tasks, config, folder, sources=list(sources), progress=bar)
    if as_json:
        sys.stdout.buffer.write(encode_results(results))
        return
    metrics = results.metrics
    render.echo(f"run {results.run.run_id}: {len(results.tasks)} tasks x {k} trials of "
               f"{agent} -> {folder}")
    render.echo(f"success {_pct(metrics.get('success_rate'))}, avg reward "
               f"{_num(metrics.get('avg_reward'))}, pass@1 "
               f"{_pct(metrics.get('pass@k', {}).get('1'))}, pass^{k} "
               f"{_pct(metrics.get('pass^k', {}).get(str(k)))}, lost "
               f"{metrics.get('trials_lost', 0)}")


@eval_group.command("report")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--html", "html", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="The HTML file (default RUN_DIR/report.html).")
@click.option("--md", "md", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="The Markdown file (default RUN_DIR/report.md).")
def eval_report(run_dir: Path, html: Path | None, md: Path | None) -> None:
    """Markdown and HTML reports of a run with plots, and its trials as CSV and parquet."""
    from eval.report import write_report

    files = write_report(run_dir, html=html, md=md)
    for path in (files.md, files.html, files.csv, files.parquet, *files.plots):
        render.echo(str(path))


@eval_group.command("compare")
@click.argument("run_dirs", nargs=-1, required=True,
                type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--html", "html", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="The HTML file (default: compare.html in the current folder).")
@click.option("--md", "md", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="The Markdown file (default: compare.md in the current folder).")
def eval_compare(run_dirs: tuple[Path, ...], html: Path | None, md: Path | None) -> None:
    """Runs side by side (the first is the baseline): deltas with bootstrap intervals.

    Each delta's verdict is better, worse, noise (the interval contains 0) or, where fewer
    than 6 of the shared tasks differ between the runs (too few for any test at 95 %),
    "too few tasks for a verdict".
    """
    from eval.errors import EvalError
    from eval.report import write_comparison

    if len(run_dirs) < 2:
        raise EvalError("compare needs at least two run folders")
    found = write_comparison(list(run_dirs), html=html or Path("compare.html"),
                             md=md or Path("compare.md"))
    for delta in found.deltas:
        render.echo(f"{delta.run}: {delta.metric} {delta.baseline:.3f} -> {delta.value:.3f} "
                    f"({delta.delta:+.3f}, 95% [{delta.low:+.3f}, {delta.high:+.3f}] over "
                    f"{delta.tasks} tasks): {delta.verdict}")
    for path in (found.md, found.html):
        if path is not None:
            render.echo(str(path))


# --- helpers -----------------------------------------------------------------------------


def _tasks(ctx: click.Context, sources: tuple[str, ...], split: str
           ) -> tuple[list[Task], str | None]:
    """The tasks of the sources (task folders, folders of them, packs: their `split`),
    and the split when a pack was among them."""
    from gates.task import load_task, task_folders

    installed = installed_packs(ctx)
    folders = [f for s in sources for f in task_folders(s, installed, split=split)]
    from_pack = any(not Path(s).is_dir() for s in sources)
    return [load_task(f) for f in folders], split if from_pack else None


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * float(value):.1f} %"


def _num(value: Any) -> str:
    return "-" if value is None else f"{float(value):.3f}"


class _Bar:
    """The progress bar on stderr: trials done of all, ETA, running success rate."""

    def __init__(self, *, quiet: bool) -> None:
        self.quiet = quiet
        self.done = self.successes = 0
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> _Bar:
        if not self.quiet:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("trials"), BarColumn(), MofNCompleteColumn(),
                TextColumn("ETA"), TimeRemainingColumn(),
                TextColumn("success {task.fields[rate]}"),
                console=Console(stderr=True, highlight=False), transient=False)
            self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)

    def start(self, total: int, done: list[Trial]) -> None:
        self.done, self.successes = len(done), sum(t.success for t in done)
        if self._progress is not None:
            self._task = self._progress.add_task("trials", total=total, completed=self.done,
                                                 rate=self._rate())

    def advance(self, task_id: str, trial: Trial) -> None:
        self.done += 1
        self.successes += trial.success
        if self._progress is not None:
            self._progress.update(self._task, advance=1, rate=self._rate())

    def _rate(self) -> str:
        return "-" if not self.done else f"{100 * self.successes / self.done:.1f} %"
