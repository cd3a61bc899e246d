"""eval.report and eval.plots: the files a report and a comparison write, read back.

Two runs are built by hand (three tasks of four trials; one trial lost to the
infrastructure, one format error, tasks with mixed interfaces) with a metrics object written
here too, so these tests check the rendering, not eval.metrics. The HTML is opened in
headless Chromium (Debian's package): skipped when it is not installed, except under
CI=true, where a missing browser fails like the PostgreSQL tests do.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from eval.contract import Results, RunInfo, TaskResult, Trial, encode_results
from eval.errors import EvalError
from eval.plots import bar_chart, line_chart
from eval.report import TRIAL_SCHEMA, write_comparison, write_report

SVG = "{http://www.w3.org/2000/svg}"

# Trial codes: S success, F failure, M failure at the step limit, E format error, L lost.
RUN_A = {
    "t-easy": ("easy", ["mcp"], "SSSM"),
    "t-medium": ("medium", ["mcp", "shell"], "SESF"),
    "t-hard": ("hard", ["shell", "gui"], "LFFS"),
}


def _group(success: float, reward: float, at: list[float], hat: list[float], trials: int,
           tasks: int) -> dict[str, Any]:
    return {"success_rate": success, "avg_reward": reward, "trials": trials, "tasks": tasks,
            "pass@k": {str(i + 1): v for i, v in enumerate(at)},
            "pass^k": {str(i + 1): v for i, v in enumerate(hat)}}


# Hand-computed for RUN_A: c = 3, 2, 1 successes of n = 4.
METRICS_A: dict[str, Any] = {
    "success_rate": 0.5, "avg_reward": 0.583333, "avg_reward_graded": 0.636364,
    "checklist_completion": 0.666667,
    "pass@k": {"1": 0.5, "2": 0.777778, "3": 0.916667, "4": 1.0},
    "pass^k": {"1": 0.5, "2": 0.222222, "3": 0.083333, "4": 0.0},
    "trials": 12, "tasks": 3, "trials_lost": 1, "format_error_rate": 0.083333,
    "env_error_rate": 0.083333,
    "terminations": {"answered": 9, "format_error": 1, "max_steps": 1, "sandbox_failed": 1},
    "by_difficulty": {
        "easy": _group(0.75, 0.8125, [0.75, 1, 1, 1], [0.75, 0.5, 0.25, 0], 4, 1),
        "hard": _group(0.25, 0.375, [0.25, 0.5, 0.75, 1], [0.25, 0, 0, 0], 4, 1),
        "medium": _group(0.5, 0.5625, [0.5, 0.833333, 1, 1], [0.5, 0.166667, 0, 0], 4, 1),
    },
    "by_interfaces": {
        "gui+shell": _group(0.25, 0.375, [0.25, 0.5, 0.75, 1], [0.25, 0, 0, 0], 4, 1),
        "mcp": _group(0.75, 0.8125, [0.75, 1, 1, 1], [0.75, 0.5, 0.25, 0], 4, 1),
        "mcp+shell": _group(0.5, 0.5625, [0.5, 0.833333, 1, 1], [0.5, 0.166667, 0, 0], 4, 1),
    },
    "interface_switch_rate": 0.5, "action_share": {"mcp": 0.6, "shell": 0.4},
    "step_budget_curve": [[1, 0.0], [2, 0.25], [3, 0.25], [4, 0.5]],
    "tokens": {"in": {"total": 12000, "p50": 1000, "p90": 1000, "p99": 1000},
               "out": {"total": 1200, "p50": 100, "p90": 100, "p99": 100}},
    "cost": {"total": 0.012, "per_trial": 0.001, "unknown": 0},
    "latency": {"p50": 1.5, "p90": 2.25, "p99": 2.25, "mean": 1.625},
}


def _trial(index: int, code: str) -> Trial:
    lost, fmt = code == "L", code == "E"
    success = code == "S"
    return Trial(
        trial=index, episode_id=f"ep-{index}-{code}", success=success, V=int(success),
        reward=None if lost else {"S": 1.0, "F": 0.25, "M": 0.25, "E": 0.0}[code],
        checks={"S": [True, True], "F": [True, False], "M": [True, False],
                "E": [False, False], "L": []}[code],
        steps=index + 1, interfaces_used=[] if lost else ["mcp", "shell"],
        actions=[] if lost else ["mcp", "shell", "mcp"],
        termination={"S": "answered", "F": "answered", "M": "max_steps",
                     "E": "format_error", "L": "sandbox_failed"}[code],
        format_error=fmt, env_error=lost, tokens_in=1000, tokens_out=100,
        cost=0.001, seconds=1.5 + 0.25 * index, error="sandbox died" if lost else None)


def _results(run_id: str, spec: dict[str, tuple[str, list[str], str]],
             metrics: dict[str, Any]) -> Results:
    run = RunInfo(run_id=run_id, agent="scripted:demo", model=None, k=4, split="eval",
                  hinted=False, max_steps=10, history=4, concurrency=2,
                  tasks_source=["packs/demo"], started="2026-12-01T12:00:00Z")
    tasks = [TaskResult(task_id=task_id, difficulty=difficulty, interfaces=interfaces,
                        trials=[_trial(i, code) for i, code in enumerate(codes)])
             for task_id, (difficulty, interfaces, codes) in spec.items()]
    return Results(run=run, tasks=tasks, metrics=metrics)


def _run_dir(root: Path, name: str, results: Results) -> Path:
    run_dir = root / name
    run_dir.mkdir(parents=True)
    (run_dir / "results.json").write_bytes(encode_results(results))
    return run_dir


@pytest.fixture
def run_a(tmp_path: Path) -> Path:
    return _run_dir(tmp_path, "base", _results("run-a", RUN_A, METRICS_A))


def _all_files(run_dir: Path) -> dict[str, bytes]:
    return {p.relative_to(run_dir).as_posix(): p.read_bytes()
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


# --- one run ---------------------------------------------------------------------------------


def test_report_writes_every_file_at_the_default_paths(run_a: Path) -> None:
    files = write_report(run_a, html=None, md=None)
    assert files.md == run_a / "report.md"
    assert files.html == run_a / "report.html"
    assert files.csv == run_a / "trials.csv"
    assert files.parquet == run_a / "trials.parquet"
    assert sorted(p.name for p in files.plots) == [
        "by_difficulty.svg", "by_interfaces.svg", "errors.svg", "pass_k.svg",
        "step_budget.svg"]
    for path in (files.md, files.html, files.csv, files.parquet, *files.plots):
        assert path.is_file() and path.stat().st_size > 0, path
    assert all(p.parent == run_a / "plots" for p in files.plots)


def test_report_honours_given_paths(run_a: Path, tmp_path: Path) -> None:
    files = write_report(run_a, html=tmp_path / "out" / "r.html", md=tmp_path / "out" / "r.md")
    assert files.html.is_file() and files.md.is_file()
    assert not (run_a / "report.md").exists()
    # The Markdown links the plot files relative to where it was written.
    assert "](../base/plots/pass_k.svg)" in files.md.read_text()


def test_markdown_has_the_numbers(run_a: Path) -> None:
    text = write_report(run_a, html=None, md=None).md.read_text()
    assert "| Success rate | 50.0% |" in text
    assert "| Average reward (lost trials count 0) | 0.583 |" in text
    assert "| Checklist completion | 66.7% |" in text
    assert "| Trials lost to infrastructure | 1 |" in text
    assert "| Format-error rate | 8.3% |" in text
    # pass@k / pass^k, k = 1..4
    assert "| 2 | 77.8% | 22.2% |" in text
    assert "| 4 | 100.0% | 0.0% |" in text
    # Per difficulty, easy first: tasks, trials, success, reward, pass@4, pass^4.
    easy = text.index("| easy | 1 | 4 | 75.0% | 0.812 | 100.0% | 0.0% |")
    assert easy < text.index("| medium |") < text.index("| hard |")
    assert "| mcp\\+shell |" not in text and "| mcp+shell | 1 | 4 | 50.0% |" in text
    # Errors: counted from the trials, the lost one reported as lost, with its reason.
    assert "1 of 12 trials were lost to the infrastructure" in text
    assert "| environment errors (lost) | 1 | 8.3% |" in text
    assert "| format errors | 1 | 8.3% |" in text
    assert "| max\\_steps | 1 | 8.3% |" in text
    assert "| t-hard | 0 | ep-0-L | sandbox\\_failed | sandbox died |" in text
    # Tokens, cost, latency with units.
    assert "| Tokens in (total) | 12,000 |" in text
    assert "| Cost (total) | $0.0120 |" in text
    assert "| Latency (p90) | 2.25 s |" in text
    # Per task (computed from the trials): t-hard has one success of four, one lost.
    assert "| t-hard | hard | gui+shell | 4 | 1 | 25.0% | 0.375 | 1 | 0 | 2.5 | 1.88 s |" \
        in text
    assert "![pass@k and pass^k against k](plots/pass_k.svg)" in text


def test_only_present_metrics_are_rendered(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, "sparse",
                       _results("run-s", RUN_A, {"success_rate": 0.5, "pass^k": {"1": 0.5}}))
    files = write_report(run_dir, html=None, md=None)
    text = files.md.read_text()
    assert "| Success rate | 50.0% |" in text and "| 1 | — | 50.0% |" in text
    assert "Checklist" not in text and "By difficulty" not in text and "Latency" not in text
    assert sorted(p.name for p in files.plots) == ["errors.svg", "pass_k.svg"]


def test_trial_table_csv_and_parquet(run_a: Path) -> None:
    files = write_report(run_a, html=None, md=None)
    columns = ["run_id", "task_id", "difficulty", "task_interfaces",
               *Trial.__struct_fields__]
    parquet = pl.read_parquet(files.parquet)
    assert parquet.columns == columns == list(TRIAL_SCHEMA)
    assert parquet.height == 12
    assert parquet.select("task_id", "trial").rows() == [
        (t, i) for t in ("t-easy", "t-hard", "t-medium") for i in range(4)]
    lost = parquet.filter(pl.col("env_error")).row(0, named=True)
    assert lost["task_id"] == "t-hard" and lost["reward"] is None
    assert lost["error"] == "sandbox died" and lost["checks"] == []
    assert parquet.schema["actions"] == pl.List(pl.String)
    assert parquet.filter(pl.col("format_error")).height == 1
    assert parquet["success"].sum() == 6

    table = pl.read_csv(files.csv, infer_schema_length=0)  # every cell as text
    assert table.columns == columns and table.height == 12
    first = table.row(0, named=True)
    assert first["task_interfaces"] == '["mcp"]'
    assert first["checks"] == "[true,true]"
    assert first["actions"] == '["mcp","shell","mcp"]'
    assert first["success"] == "true" and first["error"] is None
    assert table.filter(pl.col("env_error") == "true")["reward"].to_list() == [None]


def test_svg_plots_parse_and_carry_their_series(run_a: Path) -> None:
    files = write_report(run_a, html=None, md=None)
    series: dict[str, list[str]] = {}
    texts: dict[str, list[str]] = {}
    for path in files.plots:
        root = ET.parse(path).getroot()
        assert root.tag == f"{SVG}svg"
        assert root.get("width") == "720" and root.get("height") == "380"
        series[path.stem] = [g.get("data-series", "") for g in root.iter(f"{SVG}g")
                             if g.get("class") == "series"]
        texts[path.stem] = [t.text or "" for t in root.iter(f"{SVG}text")]
    assert series["pass_k"] == ["pass@k", "pass^k"]
    assert series["step_budget"] == ["success"]
    assert series["by_difficulty"] == ["success rate", "pass@4", "pass^4"]
    assert series["errors"] == ["trials"]
    assert {"easy", "medium", "hard"} <= set(texts["by_difficulty"])
    assert {"mcp", "mcp+shell", "gui+shell"} <= set(texts["by_interfaces"])
    assert {"format errors", "lost (env errors)", "sandbox_failed"} <= set(texts["errors"])
    assert {"0%", "100%", "k (trials drawn)"} <= set(texts["pass_k"])
    # pass@k has a point per k, drawn as one line.
    root = ET.parse(run_a / "plots" / "pass_k.svg").getroot()
    first = next(g for g in root.iter(f"{SVG}g") if g.get("data-series") == "pass@k")
    assert len(first.findall(f"{SVG}circle")) == 4
    assert len(first.findall(f"{SVG}polyline")) == 1


def test_rendering_is_byte_identical(run_a: Path, tmp_path: Path) -> None:
    write_report(run_a, html=None, md=None)
    first = _all_files(run_a)
    write_report(run_a, html=None, md=None)
    assert _all_files(run_a) == first
    twin = _run_dir(tmp_path, "twin", _results("run-a", RUN_A, METRICS_A))
    write_report(twin, html=None, md=None)
    assert _all_files(twin) == first


def test_html_is_self_contained_and_escaped(tmp_path: Path) -> None:
    nasty = '<img src=x onerror="alert(1)">|&amp;'
    spec = {nasty: ("easy", ["mcp"], "SSFF"), **RUN_A}
    metrics = {**METRICS_A, "by_difficulty": {**METRICS_A["by_difficulty"], nasty: {
        "success_rate": 0.5}}}
    run_dir = _run_dir(tmp_path, "nasty", _results("run-n", spec, metrics))
    files = write_report(run_dir, html=None, md=None)
    page = files.html.read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert nasty not in page and "<img" not in page
    assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;|&amp;amp;" in page
    for banned in ("<script", "http://", "https://", "url(", "<link", "src=", "@import"):
        assert banned not in page.replace("&lt;img src=x", ""), banned
    assert page.count("<svg") == 5 and "<style>" in page
    markdown = files.md.read_text()
    assert nasty not in markdown and "\\<img src=x onerror=\"alert(1)\"\\>\\|&amp;" in markdown
    for path in files.plots:  # the group name reaches the bar chart, escaped for XML
        ET.parse(path)


def test_charts_escape_text_and_handle_no_data() -> None:
    svg = line_chart('a<b & "c"', [("x<y", [(1, 0.5), (2, 1.0)])], x_label="k", y_label="r")
    root = ET.fromstring(svg)
    assert root.find(f"{SVG}title") is not None
    assert root.findtext(f"{SVG}title") == 'a<b & "c"'
    assert [g.get("data-series") for g in root.iter(f"{SVG}g")
            if g.get("class") == "series"] == ["x<y"]
    empty = ET.fromstring(bar_chart("nothing", [], [], x_label="x", y_label="y"))
    assert "no data" in [t.text for t in empty.iter(f"{SVG}text")]
    counts = ET.fromstring(bar_chart("n", ["a", "b"], [("s", [3.0, None])], x_label="x",
                                     y_label="y", percent=False))
    assert len([r for r in counts.iter(f"{SVG}rect") if r.find(f"{SVG}title") is not None]) \
        == 1
    assert line_chart("t", [("s", [(1, 0.5)])], x_label="x", y_label="y") == line_chart(
        "t", [("s", [(1, 0.5)])], x_label="x", y_label="y")


# --- comparing runs --------------------------------------------------------------------------


# RUN_A twice over: six tasks, as many as a verdict needs (eval.metrics.min_tasks), with
# RUN_A's rates; only the counts of METRICS_A double.
RUN_A6 = {**RUN_A, **{f"{task}-2": spec for task, spec in RUN_A.items()}}
METRICS_A6 = {**METRICS_A, "trials": 24, "tasks": 6, "trials_lost": 2}


def test_comparison_marks_a_big_difference_better_and_a_twin_noise(tmp_path: Path) -> None:
    base = _run_dir(tmp_path, "base", _results("run-a", RUN_A6, METRICS_A6))
    all_pass = {task: (d, i, "SSSS") for task, (d, i, _) in RUN_A6.items()}
    better = _run_dir(tmp_path, "better", _results(
        "run-b", all_pass, {"success_rate": 1.0, "avg_reward": 1.0,
                            "pass^k": {"1": 1.0, "2": 1.0, "3": 1.0, "4": 1.0}}))
    twin = _run_dir(tmp_path, "twin", _results("run-a2", RUN_A6, METRICS_A6))
    out = tmp_path / "cmp"
    comparison = write_comparison([base, better, twin], html=out / "c.html", md=out / "c.md")
    verdicts = {(d.run, d.metric): d.verdict for d in comparison.deltas}
    assert verdicts == {("better", "success_rate"): "better", ("better", "avg_reward"): "better",
                        ("twin", "success_rate"): "noise", ("twin", "avg_reward"): "noise"}
    gain = next(d for d in comparison.deltas if d.run == "better" and d.metric == "success_rate")
    assert gain.delta == pytest.approx(0.5) and gain.low > 0 and gain.tasks == 6
    twin_delta = next(d for d in comparison.deltas if d.run == "twin")
    assert (twin_delta.delta, twin_delta.low, twin_delta.high) == (0.0, 0.0, 0.0)

    text = (out / "c.md").read_text()
    assert text == comparison.markdown
    assert "| Metric | base (baseline) | better | Δ better | twin | Δ twin |" in text
    assert "| Success rate | 50.0% | 100.0% | +50.0 pts | 50.0% | +0.0 pts |" in text
    assert "| pass^2 | 22.2% | 100.0% | +77.8 pts | 22.2% | +0.0 pts |" in text
    assert "| better | Success rate | 6 | 50.0% | 100.0% | +50.0 pts |" in text
    assert "| twin | Success rate | 6 | 50.0% | 50.0% | +0.0 pts | +0.0 to +0.0 pts | noise |" \
        in text
    assert '"too few tasks for a verdict" when fewer than 6 of the shared tasks differ' in text
    assert "## Plots" not in text  # only in the HTML: the comparison writes no plot files
    page = (out / "c.html").read_text()
    assert "<script" not in page and "http" not in page and page.count("<svg") == 2
    assert write_comparison([base, better, twin], html=None, md=None).markdown == text


def test_comparison_of_three_tasks_gives_no_verdict(run_a: Path, tmp_path: Path) -> None:
    all_pass = {task: (d, i, "SSSS") for task, (d, i, _) in RUN_A.items()}
    better = _run_dir(tmp_path, "better", _results("run-b", all_pass, {"success_rate": 1.0}))
    comparison = write_comparison([run_a, better], html=None, md=None)
    assert {d.verdict for d in comparison.deltas} == {"too few tasks for a verdict (n=3)"}
    assert "| better | Success rate | 3 | 50.0% | 100.0% | +50.0 pts |" in comparison.markdown


def test_comparison_notes_tasks_not_shared(run_a: Path, tmp_path: Path) -> None:
    other = {"t-easy": RUN_A["t-easy"], "t-medium": RUN_A["t-medium"],
             "t-new": ("hard", ["gui"], "SSSS")}
    run_b = _run_dir(tmp_path, "other", _results("run-o", other, {"success_rate": 0.6}))
    comparison = write_comparison([run_a, run_b], html=None, md=None)
    assert {d.tasks for d in comparison.deltas} == {2}
    assert "other: 2 shared tasks compared; not in other: t-hard; only in other: t-new." \
        in comparison.markdown


def test_refusals(run_a: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(EvalError, match=r"empty: no results\.json"):
        write_report(empty, html=None, md=None)
    with pytest.raises(EvalError, match=r"empty: no results\.json"):
        write_comparison([run_a, empty], html=None, md=None)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "results.json").write_text('{"run": {}, "tasks": []}')
    with pytest.raises(EvalError, match=r"broken/results.json: not a results file"):
        write_report(broken, html=None, md=None)
    with pytest.raises(EvalError, match=r"broken/results.json: not a results file"):
        write_comparison([run_a, broken], html=None, md=None)
    disjoint = _run_dir(tmp_path, "disjoint", _results(
        "run-d", {"t-other": ("easy", ["mcp"], "SSSS")}, {"success_rate": 1.0}))
    with pytest.raises(EvalError, match="disjoint: no task in common with the baseline"):
        write_comparison([run_a, disjoint], html=None, md=tmp_path / "never.md")
    assert not (tmp_path / "never.md").exists()
    with pytest.raises(EvalError, match="at least two run folders"):
        write_comparison([run_a], html=None, md=None)


# --- the HTML in a real browser --------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _chromium() -> str:
    if CHROMIUM:
        return CHROMIUM
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("CI=true but chromium is not installed: the report must be checked in a "
                    "real browser in CI (apt-get install chromium)")
    pytest.skip("chromium is not installed (apt-get install -y chromium)")


def _open(browser: str, page: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-extensions", "--enable-logging=stderr", "--v=0", "--log-level=0",
         f"--user-data-dir={page.parent / 'chromium-profile'}", *flags, page.as_uri()],
        capture_output=True, text=True, timeout=120, check=False)


def _console_errors(stderr: str) -> list[str]:
    markers = ("CONSOLE", "Uncaught", "ERR_FILE_NOT_FOUND", "ERR_BLOCKED", "net::ERR")
    return [line for line in stderr.splitlines() if any(m in line for m in markers)]


def test_html_opens_in_headless_chromium(run_a: Path, tmp_path: Path) -> None:
    from PIL import Image

    browser = _chromium()
    files = write_report(run_a, html=None, md=None)
    # The console watch sees a console error when there is one.
    probe = tmp_path / "probe.html"
    probe.write_text("<!DOCTYPE html><title>p</title><script>console.error('probe-42')"
                     "</script>")
    assert any("probe-42" in line for line in _console_errors(_open(
        browser, probe, "--dump-dom").stderr))

    dom = _open(browser, files.html, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert _console_errors(dom.stderr) == []
    assert dom.stdout.count("<svg") == 5 and "t-hard" in dom.stdout

    shot = tmp_path / "report.png"
    result = _open(browser, files.html, f"--screenshot={shot}", "--window-size=1200,2000",
                   "--hide-scrollbars")
    assert result.returncode == 0 and shot.is_file(), result.stderr[-2000:]
    assert _console_errors(result.stderr) == []
    assert shot.stat().st_size > 20_000
    with Image.open(shot) as image:
        assert image.size == (1200, 2000)
        colors = image.convert("RGB").getcolors(maxcolors=1_000_000)
    assert colors is not None and len(colors) > 50  # text, tables and the charts' colours
    # The charts' palette is on the page: pass@k's blue and pass^k's orange.
    present = {rgb for _, rgb in colors}
    assert (0x4E, 0x79, 0xA7) in present and (0xF2, 0x8E, 0x2B) in present
