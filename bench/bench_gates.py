"""The gate runner's own cost per task, model time excluded.

For each demo task (``packs/demo/tasks``), ``check_task`` with the six default scripted
rollouts (gates 1 and 5 find no model and do only their model-free parts) is timed against
the work it cannot avoid, measured in the same run and interleaved with it:

* the agents' steps: the six scripted agents each acting on a fresh instance of the
  task's world (open, steps, close);
* the verifier runs: seven runs of the task's verifier on the store cache's verifier
  server, as the gates run them (gate 2's V(W0, W0, '') and one per rollout), plus the
  counterfactual probe's re-run, whose writable verifier gets a sandbox of its own.

Overhead = check_task - (agents + verifier runs): opening instances for grading, saving
episodes, hashing final worlds, re-deriving the probed worlds from their episodes, the
gate logic. Reported per task (median over rounds) and as a share of the total.

The store holds every world the demo pack ships. ``--quick`` is a smoke run: one task, one
round, no warm-up.
"""

from __future__ import annotations

import time

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

B = "gates"


def run(rounds: int, only: int | None, *, warm: bool = True) -> Report:
    from gates.agents import scripted
    from gates.quality import GateRun, check_task
    from gates.rollout import SCRIPTED_SET, scripted_rollouts
    from gates.task import load_task
    from gates.verifier import run_verifier
    from packs.registry import load_pack
    from replay.engine import Worlds
    from worldenv.instances.instance import Environment

    pack = load_pack("demo")
    tasks = [load_task(pack.task_dir(name)) for name in pack.tasks][:only]
    work = scratch_dir(B)
    worlds = Worlds.open(work / "store")
    for log in pack.worlds:  # every world the pack's tasks start from
        worlds.import_file(log)
    env = Environment(worlds)
    totals: dict[str, list[float]] = {"check": [], "agents": [], "verifier": []}
    per_task: dict[str, dict[str, list[float]]] = {}

    for task in tasks:
        record = worlds.resolve(task.spec.world)
        w0 = worlds.snapshot(record.persona, record.day)

        def t_check(task=task) -> float:  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            report = check_task(GateRun(env=env, rollouts=lambda t: scripted_rollouts(env, t)),
                                task)
            took = time.perf_counter() - t0
            assert report.accepted, report
            return took

        def t_agents(task=task) -> float:  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            for name, hinted in SCRIPTED_SET:
                with env.open(task.spec.world) as inst:
                    scripted(name).run(inst, task, hinted=hinted)
            return time.perf_counter() - t0

        def t_verifier(task=task, w0=w0) -> float:  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            # gate 2 and six rollouts, on the cache's verifier server as the gates run them,
            # then the probe's re-run, whose writable verifier gets a sandbox of its own
            # (all on W0: the same scripts and reads)
            for _ in range(len(SCRIPTED_SET) + 1):
                run_verifier(task.verifier_dir, w0, w0, "", scratch=worlds.cache.tmp)
            run_verifier(task.verifier_dir, w0, w0, "", writable_verifier=True)
            return time.perf_counter() - t0

        if warm:
            t_check(), t_agents(), t_verifier()
        got = interleave({"check": t_check, "agents": t_agents, "verifier": t_verifier},
                         rounds)
        per_task[task.task_id] = got
        for k, v in got.items():
            totals[k].append(median(v))

    env.close()
    worlds.close()
    rows = []
    for task_id, got in per_task.items():
        check, agents, verifier = (median(got[k]) for k in ("check", "agents", "verifier"))
        overhead = check - agents - verifier
        rows.append(Row(B, f"task check, `{task_id}`: 6 scripted rollouts, gates 1-5",
                        fmt_s(check), f"{fmt_s(agents)} agents + {fmt_s(verifier)} verifier",
                        f"overhead {fmt_s(overhead)} = {overhead / check:.0%} of the check"))
    check, agents, verifier = (sum(totals[k]) / len(tasks) for k in ("check", "agents",
                                                                      "verifier"))
    overhead = check - agents - verifier
    rows.append(Row(B, f"mean over {len(tasks)} tasks: gate-runner overhead per task "
                       "(no model time)", fmt_s(overhead), fmt_s(check) + " whole check",
                    f"{overhead / check:.0%} of the check; agents {agents / check:.0%}, "
                    f"verifier runs {verifier / check:.0%}"))
    report = Report("gates", {"rounds": rounds, "tasks": [t.task_id for t in tasks]},
                    rows=rows, data={"per_task_s": per_task})
    report.notes.append(
        "Overhead is check_task minus the agents' steps on fresh instances and eight "
        "verifier runs (seven on a verifier server, the probe's in a sandbox of its own, "
        "as the gates run them), all measured in the same run: it is opening and grading "
        "instances, "
        "saving episodes, hashing final worlds and re-deriving probed worlds from episodes.")
    return report


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("gate-runner overhead per task")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args(argv)
    setup_run(a)
    emit(run(1 if a.quick else a.rounds, 1 if a.quick else None, warm=not a.quick))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
