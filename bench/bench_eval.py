"""The evaluation harness's costs (``eval.runner``), with scripted agents (no model time).

    .venv/bin/python bench/bench_eval.py [--quick] [--rounds R] [--tasks N] [-k K]

1. **Harness overhead per trial**: ``run_eval`` (trial files written atomically, the
   results file and its metrics) against running the same scripted rollouts directly
   through ``gates.rollout.run_rollout``, the same tasks and trials, one at a time,
   interleaved round by round. Target <= 1.2x.
2. **A 100-task x 4-trial scripted run** (the demo pack's tasks copied under 100 task
   ids; the reference agent, so every trial stores an episode and runs the task's
   verifier): wall time and trials per second, at concurrency 1 and 2.

The store holds every world the pack ships (its tasks start from more than one persona).
``--quick`` is a smoke run: 1 task for the overhead (no warm-up), then one task per
persona's world, k = 1, concurrency 1 only.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from _common import (
    Report,
    Row,
    bench_parser,
    emit,
    fmt_s,
    interleave,
    median,
    scratch_dir,
    setup_run,
)

B = "eval"


def main(argv: list[str] | None = None) -> None:
    ap = bench_parser(__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--tasks", type=int, default=None)
    ap.add_argument("-k", type=int, default=None)
    a = ap.parse_args(argv)
    setup_run(a)
    rounds = a.rounds or (1 if a.quick else 5)
    count = a.tasks or (2 if a.quick else 100)
    k = a.k or (1 if a.quick else 4)
    work = scratch_dir(B)
    from packs.registry import load_pack
    from replay import Worlds
    from worldenv.instances.instance import Environment

    pack = load_pack("demo")
    worlds = Worlds.open(work / "store")
    for log in pack.worlds:  # every world the pack's tasks start from
        worlds.import_file(log)
    tasks = _copies(pack.tasks_dir, work / "tasks", count)
    report = Report(B, {"rounds": rounds, "tasks": count, "k": k})
    with Environment(worlds) as env:
        _overhead(report, env, tasks[:1] if a.quick else tasks[:6], rounds, work,
                  k=1 if a.quick else 2, warm=not a.quick)
        _big_run(report, env, tasks, k, work, concurrencies=(1,) if a.quick else (1, 2))
    worlds.close()
    emit(report)


def _copies(source_dir: Path, folder: Path, count: int) -> list[Any]:
    """`count` task folders: the demo's tasks cycled, each under its own task id."""
    from gates.task import load_task

    sources = sorted(p for p in source_dir.iterdir() if (p / "task.json").is_file())
    if count < len(sources):  # a short run still starts from every persona's world
        by_persona: dict[str, Path] = {}
        for source in sources:
            world = json.loads((source / "task.json").read_text())["world"]
            by_persona.setdefault(world.split("@")[0], source)
        firsts = list(by_persona.values())
        sources = firsts + [s for s in sources if s not in firsts]
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


def _overhead(report: Report, env: Any, tasks: list[Any], rounds: int, work: Path, *,
              k: int, warm: bool) -> None:
    from eval.runner import EvalConfig, run_eval
    from gates.agents import scripted
    from gates.rollout import run_rollout

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

    if warm:  # snapshots built, verifier sandboxes started once
        harness()
        direct()
    times = interleave({"harness": harness, "direct": direct}, rounds)
    trials = len(tasks) * k
    ours, base = median(times["harness"]) / trials, median(times["direct"]) / trials
    report.rows.append(Row(B, f"harness overhead per trial ({trials} trials, scripted)",
                           fmt_s(ours), fmt_s(base), f"harness/direct = {ours / base:.2f}x",
                           "<= 1.2x", ours / base <= 1.2))
    report.data["overhead"] = times


def _big_run(report: Report, env: Any, tasks: list[Any], k: int, work: Path, *,
             concurrencies: tuple[int, ...]) -> None:
    from eval.runner import EvalConfig, run_eval

    for concurrency in concurrencies:
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
