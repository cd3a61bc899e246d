"""Rendering shared by the commands (and the demo, which prints what they print).

Everything is written as plain text: library messages, paths and cell values may contain
brackets, and a markup language would eat them (``agent-worlds[llm]`` must stay
``agent-worlds[llm]``). Rich is used only for progress bars, and only on a terminal.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from gates.contract import Rollout
    from replay.diff import WorldDiff
    from replay.hashing import Manifest
    from replay.report import DayResult, VerifyReport
    from worldenv.instances.episodes import EpisodeSummary
    from worldstore.store import DayRecord, PersonaSummary

CLIP_CALL = 40
CLIP_RESPONSE = 60


def echo(text: str = "") -> None:
    click.echo(text)


def emit_json(data: Any) -> None:
    import msgspec

    click.echo(msgspec.json.format(msgspec.json.encode(data), indent=2).decode())


def clip(text: str, limit: int) -> str:
    """One line of at most `limit` characters (whitespace runs collapse to one space)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *,
          title: str | None = None) -> str:
    """Columns aligned with two spaces between them, under a header and a rule."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    lines = [title] if title else []
    lines += [line(headers), line(["-" * w for w in widths])]
    lines += [line(row) for row in rows]
    return "\n".join(lines)


# --- progress -------------------------------------------------------------------------


class Bar:
    """A progress bar's handle: advance it, or tell it its total once known."""

    def __init__(self, progress: Any = None, task: Any = None) -> None:
        self._progress = progress
        self._task = task

    def advance(self, *_ignored: object) -> None:
        if self._progress is not None:
            self._progress.advance(self._task)

    def total(self, total: int) -> None:
        if self._progress is not None:
            self._progress.update(self._task, total=total)


@contextlib.contextmanager
def progress(label: str, total: int | None) -> Iterator[Bar]:
    """A transient bar on stderr showing done/total, only when stderr is a terminal."""
    if not sys.stderr.isatty():
        yield Bar()
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    columns = (TextColumn("{task.description}", markup=False), BarColumn(),
               MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bars:
        yield Bar(bars, bars.add_task(label, total=total))


# --- the store ------------------------------------------------------------------------


def step(command: str) -> None:
    """The demo's heading for the command whose output follows."""
    echo()
    echo(f"$ {command}")


def persona_rows(rows: Sequence[PersonaSummary]) -> list[dict[str, Any]]:
    """What `personas --json` prints: every field of the summary and every column of the
    table (the number of events too: seqs are dense from 0, so it is last_seq + 1)."""
    import msgspec

    return [{**msgspec.structs.asdict(r), "n_events": r.last_seq + 1} for r in rows]


def personas(rows: Sequence[PersonaSummary]) -> None:
    echo(table(["persona", "days", "last day", "events", "last ts", "latest world hash"],
               [[r.persona, str(r.n_days), str(r.last_day), str(r.last_seq + 1), r.last_ts,
                 r.world_hash] for r in rows]))


def day_result_dict(r: DayResult) -> dict[str, Any]:
    return {"persona": r.persona, "day": r.day, "events": r.n_events,
            "world_hash": r.world_hash, "recorded_hash": r.recorded_hash,
            "seconds": round(r.seconds, 6), "status": r.status}


def day_results(title: str, results: Sequence[DayResult], *, show_recorded: bool) -> None:
    rows = []
    for r in results:
        status = r.status
        if show_recorded and r.status == "mismatch":
            status = f"MISMATCH (recorded {r.recorded_hash})"
        rows.append([r.persona, str(r.day), str(r.n_events), r.world_hash,
                     f"{r.seconds * 1000:.1f}", status])
    echo(table(["persona", "day", "events", "world hash", "time (ms)", "status"], rows,
               title=title))


def verify_dict(report: VerifyReport) -> dict[str, Any]:
    return {"ok": report.ok, "personas": report.personas, "days": report.days,
            "events": report.events, "cache_entries": report.cache_entries,
            "problems": [p.as_dict() for p in report.problems]}


def verify_report(report: VerifyReport) -> None:
    summary = (f"{report.personas} personas, {report.days} days, {report.events} events, "
               f"{report.cache_entries} cached snapshots checked")
    if report.ok:
        echo(f"verify OK: {summary}")
        return
    echo(f"verify FAILED: {summary}; {len(report.problems)} problems")
    for p in report.problems:
        echo(f"  [{p.kind}] {p.message}")


def checkout(record: DayRecord, dest: Path) -> None:
    echo(f"{record.persona}@{record.day} -> {dest}  (world hash {record.world_hash})")
    echo(f"  open with: sqlite3 {dest}/services/<service>.sqlite ; files in {dest}/workspace/")


def manifest(found: Manifest) -> None:
    """What `hash` prints: a line per service and for the workspace, then the hash."""
    for name, svc in found.services.items():
        rows = sum(t.rows for t in svc.tables.values())
        echo(f"service {name}: {len(svc.tables)} tables, {rows} rows")
    echo(f"workspace: {len(found.files)} files")
    echo(found.world_hash())


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def diff(d: WorldDiff, max_rows: int) -> None:
    echo(f"{d.before} -> {d.after}")
    if d.empty:
        echo("no changes")
    for s in d.services_added:
        echo(f"+ service {s}")
    for s in d.services_removed:
        echo(f"- service {s}")
    for t in d.tables:
        echo(f"table {t.service}.{t.table} ({t.change}): +{t.added} -{t.removed} ~{t.changed}")
        for row in t.rows[:max_rows]:
            mark = {"added": "+", "removed": "-", "changed": "~"}[row.change]
            if row.change == "changed" and row.before is not None and row.after is not None:
                cols = ", ".join(f"{c}: {_short(row.before.get(c))} -> "
                                 f"{_short(row.after.get(c))}" for c in row.columns or [])
                echo(f"  {mark} {row.key}  {cols}")
            else:
                shown = row.after if row.change == "added" else row.before
                cells = ", ".join(f"{k}={_short(v, 40)}" for k, v in (shown or {}).items())
                echo(f"  {mark} {cells}")
        hidden = len(t.rows) - max_rows + (1 if t.truncated else 0)
        if hidden > 0:
            echo("  ... more rows (use --json or --max-rows)")
    for f in d.files:
        before = f.size_before if f.size_before is not None else "-"
        after = f.size_after if f.size_after is not None else "-"
        echo(f"file {f.path} ({f.change}, {before} -> {after} bytes)")
        for side, kind, link in (("before", f.kind_before, f.link_before),
                                 ("after", f.kind_after, f.link_after)):
            if kind is not None:  # a symlink's target is shown, never followed
                echo(f"    {side}: {kind}" + (f" -> {link}" if link is not None else ""))
        for line in f.text_diff or []:
            echo(f"    {line}")


# --- episodes -------------------------------------------------------------------------


def episode_dict(summary: EpisodeSummary) -> dict[str, Any]:
    """What `episode show --json` prints besides the events."""
    return {"episode_id": summary.episode_id, "persona": summary.persona, "day": summary.day,
            "world_hash": summary.world_hash, "final_hash": summary.final_hash,
            "task": summary.task, "agent": summary.agent, "n_calls": summary.n_calls,
            "n_errors": summary.n_errors,
            "effects": {"db_change": summary.n_db_changes,
                        "file_change": summary.n_file_changes}}


def episode(summary: EpisodeSummary) -> None:
    echo(f"{summary.persona}@{summary.day}  {summary.world_hash} -> "
         f"{summary.final_hash or '(none)'}")
    if summary.task or summary.agent:
        echo(f"task {summary.task or '-'}, agent {summary.agent or '-'}")
    rows = [[str(c.index), c.ts, clip(c.call, CLIP_CALL), "ERROR" if c.failed else "",
             ", ".join(c.effects), clip(c.response, CLIP_RESPONSE)] for c in summary.calls]
    echo(table(["#", "ts", "call", "error", "effects", "response"], rows,
               title=f"episode {summary.episode_id}"))
    echo(f"{summary.n_calls} calls, {summary.n_errors} errors; effects: "
         f"{summary.n_db_changes} db changes, {summary.n_file_changes} file changes")


def episode_list_dict(summary: EpisodeSummary) -> dict[str, Any]:
    return {"episode_id": summary.episode_id, "persona": summary.persona, "day": summary.day,
            "world_hash": summary.world_hash, "final_hash": summary.final_hash,
            "task": summary.task, "agent": summary.agent, "n_calls": summary.n_calls,
            "n_errors": summary.n_errors}


def episode_list(summaries: Sequence[EpisodeSummary]) -> None:
    rows = [[s.episode_id, f"{s.persona}@{s.day}", s.task or "-", s.agent or "-",
             str(s.n_calls), str(s.n_errors), s.final_hash or "(none)"] for s in summaries]
    echo(table(["episode", "world", "task", "agent", "calls", "errors", "final hash"], rows))
    echo(f"{len(summaries)} episodes")


def episode_check(ok: bool, message: str) -> None:
    echo(f"{'ok' if ok else 'FAILED'} {message}")


def episode_verify_summary(checked: int, failed: int) -> None:
    summary = f"{checked} episodes checked"
    echo(f"episode verify FAILED: {summary}; {failed} failed" if failed
         else f"episode verify OK: {summary}")


# --- grading --------------------------------------------------------------------------


def rollout_dict(index: int, rollout: Rollout, reward: float | None) -> dict[str, Any]:
    """What `rollout --json` prints per rollout: the numbers of its table row (V, the
    checks, the reward) and the whole graded rollout."""
    import msgspec

    return {"index": index, "v": int(rollout.succeeded), "checks_passed":
            rollout.verdict.satisfied, "checks": rollout.verdict.n, "reward": reward,
            "verifier_error": rollout.verdict.is_error,
            "rollout": msgspec.to_builtins(rollout)}


def rollouts(task_id: str, done: Sequence[Rollout],
             rewards: Sequence[float | None]) -> None:
    rows = [[str(i), r.agent, "yes" if r.hinted else "", str(int(r.succeeded)),
             f"{r.verdict.satisfied}/{r.verdict.n}",
             "error" if reward is None else f"{reward:.3f}", ",".join(r.interfaces_used),
             r.episode_id] for i, (r, reward) in enumerate(zip(done, rewards, strict=True))]
    echo(table(["#", "agent", "hinted", "V", "checks", "reward", "interfaces", "episode"],
               rows, title=f"rollouts of {task_id}"))
