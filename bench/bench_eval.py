"""The evaluation harness's costs (``eval.runner``), with scripted agents (no model time).

    .venv/bin/python bench/bench_eval.py [--quick] [--rounds R] [--tasks N] [-k K]

1. **Harness overhead per trial**: ``run_eval`` (trial files written atomically, the
   results file and its metrics) against running the same scripted rollouts directly
   through ``gates.rollout.run_rollout``, the same tasks and trials, one at a time,
   interleaved round by round. Target <= 1.2x.
2. **A 100-task x 4-trial scripted run** (the demo pack's six tasks copied under 100
   task ids; the reference agent, so every trial stores an episode and runs the task's
   verifier): wall time and trials per second, at concurrency 1 and 2.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Any

from _common import REPO, WORK_DIR, Report, Row, emit, fmt_s, fresh_dir, interleave, median

B = "eval"
DEMO = REPO / "packs" / "demo" / "world" / "lars.jsonl"
TASKS = REPO / "packs" / "demo" / "tasks"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--tasks", type=int, default=None)
    ap.add_argument("-k", type=int, default=4)
    a = ap.parse_args(argv)
    rounds = a.rounds or (2 if a.quick else 5)
    count = a.tasks or (12 if a.quick else 100)
    work = fresh_dir(WORK_DIR / B)
    from replay import Worlds
    from worldenv.instances.instance import Environment

    worlds = Worlds.open(work / "store")
    worlds.import_file(DEMO)
    tasks = _copies(work / "tasks", count)
    report = Report(B, {"rounds": rounds, "tasks": count, "k": a.k})
    with Environment(worlds) as env:
        _overhead(report, env, tasks[:6], rounds, work)
        _big_run(report, env, tasks, a.k, work)
    worlds.close()
    emit(report, quick=a.quick)


def _copies(folder: Path, count: int) -> list[Any]:
    """`count` task folders: the demo's tasks cycled, each under its own task id."""
    from gates.task import load_task

    sources = sorted(p for p in TASKS.iterdir() if (p / "task.json").is_file())
    tasks = []
    for i in range(count):
        source = sources[i % len(sources)]
        target = folder / f"{source.name}-{i:03d}"
        shutil.copytree(source, target)
        spec = json.loads((target / "task.json").read_text())
        spec["task_id"] = target.name
        (target / "task.json").write_text(json.dumps(spec, indent=2))
        tasks.append(load_task(target))
    return tasks


def _overhead(report: Report, env: Any, tasks: list[Any], rounds: int, work: Path) -> None:
    from eval.runner import EvalConfig, run_eval
    from gates.agents import scripted
    from gates.rollout import run_rollout

    k = 2
    agent = scripted("reference")
    runs = iter(range(10_000))

    def harness() -> float:
        out = work / "runs" / f"overhead-{next(runs)}"
        t0 = time.perf_counter()
        run_eval(env, tasks, EvalConfig(agent="scripted:reference", k=k), out, agent=agent)
        return time.perf_counter() - t0

    def direct() -> float:
        t0 = time.perf_counter()
        for task in sorted(tasks, key=lambda t: t.task_id):
            for n in range(k):
                run_rollout(env, task, agent, hinted=False, index=n)
        return time.perf_counter() - t0

    harness()
    direct()  # warm: snapshots built, verifier sandboxes started once
    times = interleave({"harness": harness, "direct": direct}, rounds)
    trials = len(tasks) * k
    ours, base = median(times["harness"]) / trials, median(times["direct"]) / trials
    report.rows.append(Row(B, f"harness overhead per trial ({trials} trials, scripted)",
                           fmt_s(ours), fmt_s(base), f"harness/direct = {ours / base:.2f}x",
                           "<= 1.2x", ours / base <= 1.2))
    report.data["overhead"] = times


def _big_run(report: Report, env: Any, tasks: list[Any], k: int, work: Path) -> None:
    from eval.runner import EvalConfig, run_eval

    for concurrency in (1, 2):
        out = work / "runs" / f"big-{concurrency}"
        t0 = time.perf_counter()
        results = run_eval(env, tasks, EvalConfig(agent="scripted:reference", k=k,
                                                  concurrency=concurrency), out)
        took = time.perf_counter() - t0
        trials = len(tasks) * k
        lost = results.metrics.get("trials_lost", 0)
        report.rows.append(Row(
            B, f"{len(tasks)} tasks x {k} trials, concurrency {concurrency}: wall time",
            fmt_s(took), "", f"{trials / took:.1f} trials/s; {lost} lost", "", None))
        report.data[f"big_{concurrency}"] = {"seconds": took, "trials": trials,
                                             "success_rate": results.metrics["success_rate"]}


if __name__ == "__main__":
    main()
