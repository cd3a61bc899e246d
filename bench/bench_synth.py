"""The validation cost of one synthesized environment, model time excluded, against AWM's
way of checking a generated server.

    .venv/bin/python bench/bench_synth.py [--quick] [--rounds R]

On the scenario ``library_loans`` of the shipped recorded run (``examples/recorded/synth``:
its accepted outputs of the schema, data, spec, code and verifier stages; no model is
called),
everything synthesis does to check the environment once the model's outputs are known.
As in a run, every round's environment goes to the run's one store and snapshot cache
(opened per scenario, as the pipeline does), each round a scenario of its own
(``library_loans_<round>``: its own persona and world), so what a run starts once (the
store itself, the verifier server of its cache) is started in the warm-up round, and the
row "first environment of a run" says what that costs:

* **(a) schema + data**: ``SchemaStage.execute`` and ``DataStage.execute`` (each statement
  pre-run on a scratch database with the replay's guards), then ``day0`` (the AWM import
  path's plan: the same pre-run again, the refusal at 10 %), whose lines (b) takes;
* **(b) code**: ``CodeStage.execute`` with CODE_OK: parse, a scratch store holding day 0
  with the app pinned, the app loaded in a sandboxed worker, ``list_tools`` against the
  spec, a smoke call of every tool on a fresh instance;
* **(c) world + verifiers**: the world stored as the pipeline stores it (``import_day0``
  into a fresh store, an instance's ``list_tools``), then for each of the 2 tasks the
  task folder written (``write_task_folder``) and ``check_task_folder``: the verifier at
  W0, the reference solution played on a fresh instance, the verifier on its result, each
  verifier run on the cache's verifier server (``gates.verifier_server``, as the gates
  run them). One ``Environment`` serves both tasks, as in the pipeline.

The baseline, measured in the same run and interleaved round by round: AWM's check of one
generated server (``bench_awm.awm_start`` on content_platform_1, the AWM sample): rebuild
its database from DDL + INSERTs with stdlib sqlite3, start the generated FastAPI server
(``FastMCP.from_fastapi`` under uvicorn) in a process of its own, wait until ``list_tools``
answers. Ratio ours/AWM: the whole of (a)+(b)+(c), and (a)+(b) alone (the part that
corresponds to AWM's check of a server: its database built and its tools listed; (c) has
no counterpart in AWM's check, which runs no verifier). Target: ours <= 1/10 of AWM's.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from _common import (
    REPO,
    Report,
    Row,
    bench_parser,
    emit,
    fmt_s,
    median,
    remove,
    scratch_dir,
    setup_run,
    spread,
)

B = "synth"
TARGET_RATIO = 0.1
SPARE_WAIT_S = 3.0  # after each validation: a run's model time, shorter than any
PARTS = ("a_schema_data", "b_code", "c_world_verifiers")
LABELS = {
    "a_schema_data": "(a) execute schema + data (SchemaStage/DataStage.execute, day0 plan)",
    "b_code": "(b) CodeStage.execute: app loaded in a sandboxed worker, every tool smoked",
    "c_world_verifiers": "(c) world stored + 2 tasks: verifier at W0, reference solution, "
                         "verifier after",
}


RECORDED_RUN = REPO / "examples" / "recorded" / "synth"


def _script() -> SimpleNamespace:
    """The scenario and the model's accepted outputs of the shipped recorded synthesis run
    (``examples/recorded/synth``, library_loans): what synthesis validates once the model
    has answered. A task's verifier is its last revision."""
    import json

    outputs: dict[tuple[str, str], Any] = {}
    revisions: dict[str, tuple[str, Any]] = {}
    for path in sorted((RECORDED_RUN / "outputs").glob("*/*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc["stage"] == "verifier":
            task, _, revision = doc["subject"].partition("/")
            if task not in revisions or revision > revisions[task][0]:
                revisions[task] = (revision, doc["output"])
        else:
            outputs[doc["stage"], doc["subject"]] = doc["output"]
    inputs = sorted((RECORDED_RUN / "inputs").glob("scenarios-*.jsonl"))
    scenario = json.loads(inputs[0].read_text(encoding="utf-8").splitlines()[0])
    name = scenario["name"]
    return SimpleNamespace(
        SCENARIO={"name": name, "description": scenario["description"]},
        TASKS=outputs["tasks", name]["tasks"], TABLES_OK=outputs["schema", name]["tables"],
        DATA_OK=outputs["data", name]["inserts"], SPEC=outputs["spec", name]["tools"],
        CODE_OK=outputs["code", name]["code"],
        VERIFIERS=[revisions[task][1] for task in sorted(revisions)])


PROBE: dict[str, list[float]] = {}
_INSTRUMENTED: list[bool] = []


def _instrument(probe: dict[str, list[float]]) -> None:
    """Thin timing wrappers (where the time goes; nothing else changes): app worker
    starts (spawn of the sandboxed worker + loading the code) and verifier sandbox runs."""
    import functools

    import gates.quality
    import gates.rollout
    from worldenv.sandbox.workers import AppWorker

    start = AppWorker._ensure_started

    @functools.wraps(start)
    def timed_start(worker: AppWorker) -> None:
        proc = worker._proc
        if proc is not None and proc.poll() is None:
            return start(worker)
        t0 = time.perf_counter()
        try:
            return start(worker)
        finally:
            probe.setdefault("worker_start", []).append(time.perf_counter() - t0)

    AppWorker._ensure_started = timed_start  # type: ignore[method-assign]
    for module in (gates.quality, gates.rollout):
        verify = module.run_verifier

        @functools.wraps(verify)
        def timed_verify(*args: Any, _verify: Any = verify, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return _verify(*args, **kwargs)
            finally:
                probe.setdefault("verifier_run", []).append(time.perf_counter() - t0)

        module.run_verifier = timed_verify  # type: ignore[attr-defined]


class Ours:
    """The scripted scenario's accepted outputs and the validation run on them."""

    def __init__(self, work: Path, *, spare: bool) -> None:
        """`spare`: the pipeline's worker limits (one spare worker kept started, as during
        a run, where it starts while the model writes the next code), else the same limits
        without spares (every worker started on the critical path)."""
        import dataclasses

        import msgspec

        from synth.environments.appgen import SMOKE_LIMITS

        self.limits = SMOKE_LIMITS if spare else dataclasses.replace(SMOKE_LIMITS, spares=0)

        from awmbridge.world import persona_for
        from synth.environments.appgen import CodeOut, SpecOut
        from synth.environments.database import DataOut, ScenarioSpec, SchemaOut
        from synth.environments.verifiers import VerifierOut

        s = _script()
        self.work = work
        self.scenario = s.SCENARIO
        self.spec = ScenarioSpec(name=s.SCENARIO["name"], description=s.SCENARIO["description"])
        self.tasks: list[str] = list(s.TASKS)
        self.persona = persona_for(self.spec.name)
        self._persona_for = persona_for
        self.schema = msgspec.convert({"tables": s.TABLES_OK}, type=SchemaOut)
        self.data = msgspec.convert({"inserts": s.DATA_OK}, type=DataOut)
        self.api = msgspec.convert({"tools": s.SPEC}, type=SpecOut)
        self.code = CodeOut(s.CODE_OK)
        self.verifiers = [msgspec.convert(v, type=VerifierOut) for v in s.VERIFIERS]
        self.rounds = 0
        self.checks: list[dict[str, Any]] = []
        self.probes: list[dict[str, list[float]]] = []
        self._probe = PROBE
        if not _INSTRUMENTED:
            _instrument(PROBE)
            _INSTRUMENTED.append(True)


    def once(self) -> dict[str, float]:
        """One validation of the environment, as the pipeline runs it: one store (opened
        first), one worker pool and one snapshot cache for the smoke calls and the world's
        instances, so the accepted code's worker starts once. Seconds of each part."""
        import dataclasses

        from awmbridge.importer import import_day0
        from awmbridge.world import AWM_SERVICE
        from replay.engine import Worlds
        from synth.environments.appgen import APP_VERSION, CodeStage, app_name
        from synth.environments.database import (
            DataStage,
            ScenarioSpec,
            SchemaStage,
            day0,
            scenario_files,
        )
        from synth.environments.verifiers import TaskRef, check_task_folder, write_task_folder
        from worldenv.instances.instance import Environment
        from worldenv.sandbox.workers import WorkerPool

        t: dict[str, float] = {}
        check: dict[str, Any] = {}
        self._probe.clear()
        # As in a run: every environment goes to the run's one store and snapshot cache
        # (opened per scenario), each a scenario (so a persona and a world) of its own.
        name = f"{self.scenario['name']}_{self.rounds}"
        self.spec = ScenarioSpec(name=name, description=self.scenario["description"])
        self.persona = self._persona_for(name)
        self.rounds += 1
        root = self.work / "run"
        t0 = time.perf_counter()
        worlds = Worlds.open(root / "store", root / "cache")
        workers = WorkerPool(self.limits)
        t["store_open"] = time.perf_counter() - t0
        try:
            t0 = time.perf_counter()
            m_schema = SchemaStage(self.spec, self.tasks, self.persona).execute(self.schema)
            t1 = time.perf_counter()
            m_data = DataStage(self.spec, self.tasks, self.schema,
                               self.persona).execute(self.data)
            t2 = time.perf_counter()
            day = day0(self.spec, self.tasks, self.schema, self.data)
            t3 = time.perf_counter()
            t.update(schema_execute=t1 - t0, data_execute=t2 - t1, day0_plan=t3 - t2)
            check["schema_errors"] = list(m_schema.errors)
            check["data_errors"] = list(m_data.errors)

            ddl = [st.sql for st in day.kept if st.kind != "insert"]
            t0 = time.perf_counter()
            m_code = CodeStage(self.spec.name, self.persona, self.api, ddl, day.lines(),
                               workers=workers, cache=worlds.cache.root).execute(self.code)
            t["code_execute"] = time.perf_counter() - t0
            check["code_errors"] = list(m_code.errors)
            check["code_facts"] = dict(m_code.facts)

            with_app = dataclasses.replace(day, app={
                "type": "app", "service": AWM_SERVICE, "app": app_name(self.persona),
                "version": APP_VERSION, "code": self.code.code})
            t0 = time.perf_counter()
            report = import_day0(worlds, scenario_files(self.spec, self.tasks, self.schema,
                                                        self.data), with_app)
            t1 = time.perf_counter()
            with Environment(worlds, workers=workers) as env, \
                    env.open(f"{self.persona}@0") as instance:
                check["tools"] = len(instance.list_tools())
            t2 = time.perf_counter()
            t.update(world_import=t1 - t0, world_list_tools=t2 - t1)
            task_errors = []
            with tempfile.TemporaryDirectory(prefix="bench-synth-task-") as scratch:
                t0 = time.perf_counter()
                with Environment(worlds, workers=workers) as env:
                    t1 = time.perf_counter()
                    t["env_open"] = t1 - t0
                    for i, (text, out) in enumerate(zip(self.tasks, self.verifiers,
                                                        strict=True)):
                        t0 = time.perf_counter()
                        ref = TaskRef(task_id=f"library-loans-{i + 1:02d}", instruction=text,
                                      persona=self.persona, world_hash=report.world_hash,
                                      source=f"bench: task {i + 1}")
                        folder = write_task_folder(Path(scratch) / ref.task_id, ref, out)
                        t1 = time.perf_counter()
                        task_errors.append(check_task_folder(env, folder))
                        t2 = time.perf_counter()
                        t[f"task{i + 1}_write_folder"] = t1 - t0
                        t[f"task{i + 1}_check"] = t2 - t1
                    t0 = time.perf_counter()
                t["env_close"] = time.perf_counter() - t0
            check["task_errors"] = task_errors
        finally:
            workers.close()  # untimed, as stopping AWM's server is not timed
            worlds.close()
        t["a_schema_data"] = t["schema_execute"] + t["data_execute"] + t["day0_plan"]
        t["b_code"] = t["code_execute"]
        t["c_world_verifiers"] = (t["store_open"] + t["world_import"] + t["world_list_tools"]
                                  + t["env_open"]
                                  + sum(t[f"task{i}_{k}"] for i in (1, 2)
                                        for k in ("write_folder", "check")) + t["env_close"])
        t["total"] = t["a_schema_data"] + t["b_code"] + t["c_world_verifiers"]
        self.checks.append(check)
        self.probes.append({k: list(v) for k, v in self._probe.items()})
        return t


def _first_environment(work: Path) -> float:
    """One validation into a store of its own, with no verifier server started yet."""
    from gates.verifier_server import close_servers

    close_servers()
    first = Ours(work, spare=True)
    got = first.once()
    if not clean(first.checks[0]):
        raise RuntimeError(f"the first environment's validation failed: {first.checks[0]}")
    return got["total"]  # the store's creation is its store_open, part of (c)


def clean(check: dict[str, Any]) -> bool:
    return (not check["schema_errors"] and not check["data_errors"]
            and not check["code_errors"] and check["tools"] == 4
            and all(not e for e in check["task_errors"]))


class Awm:
    """bench_awm's AWM start on content_platform_1 (rebuild + server process + list_tools)."""

    def __init__(self, work: Path) -> None:
        import bench_awm

        self.bench_awm = bench_awm
        self.statements = bench_awm.awm_statements(bench_awm.DEFAULT_SAMPLES)
        self.code_file = work / f"{bench_awm.SCENARIO}.py"
        self.code_file.write_text(bench_awm._scenario_line(
            bench_awm.DEFAULT_SAMPLES, "gen_envs.jsonl")["full_code"], encoding="utf-8")
        self.scratch = work / "awm"

    def once(self) -> dict[str, float]:
        rebuilt, listed, _called = self.bench_awm.awm_start(self.statements, self.code_file,
                                                            self.scratch)
        return {"rebuild": rebuilt, "start_list_tools": listed - rebuilt, "total": listed}


def run(rounds: int) -> Report:
    work = scratch_dir("synth")
    report = Report(B, {"rounds": rounds, "scenario": "library_loans",
                        "baseline": "bench_awm.awm_start on content_platform_1"})
    ours, cold, awm = (Ours(work / "ours", spare=True), Ours(work / "cold", spare=False),
                       Awm(work))
    contenders = {"ours": ours.once, "cold": cold.once, "awm": awm.once}
    # warm-up round (imports, page cache, the first spare), discarded
    t0 = time.perf_counter()
    warm = {name: fn() for name, fn in contenders.items()}
    warm_s = time.perf_counter() - t0
    got: dict[str, list[dict[str, float]]] = {n: [] for n in contenders}
    names = list(contenders)
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            got[name].append(contenders[name]())
            if name == "ours":
                time.sleep(SPARE_WAIT_S)  # the model's time, in a run: the spare starts
    first = _first_environment(work / "first")
    remove(work)

    def col(who: str, key: str) -> list[float]:
        return [g[key] for g in got[who]]

    med = {k: median(col("ours", k)) for k in got["ours"][0]}
    cold_med = {k: median(col("cold", k)) for k in got["cold"][0]}
    awm_med = {k: median(col("awm", k)) for k in got["awm"][0]}
    base = awm_med["total"]
    ab = [g["a_schema_data"] + g["b_code"] for g in got["ours"]]
    ab_s = median(ab)
    n = len(got["ours"])
    rows = [Row(B, f"{LABELS[p]}, median of {n}", fmt_s(med[p]), "", f"{med[p] / base:.3f}x AWM")
            for p in PARTS]
    rows += [
        Row(B, "(a)+(b): what corresponds to AWM's check of a server (db built, tools "
               "listed; ours also smoke-calls every tool)", fmt_s(ab_s),
            fmt_s(base) + " AWM", f"{ab_s / base:.3f}x AWM", f"<= {TARGET_RATIO:g}x AWM",
            ab_s <= TARGET_RATIO * base),
        Row(B, "total validation of one environment, (a)+(b)+(c), model time excluded "
               "(a spare worker started during the model's time, as in a run)",
            fmt_s(med["total"]), fmt_s(base) + " AWM", f"{med['total'] / base:.3f}x AWM",
            f"<= {TARGET_RATIO:g}x AWM", med["total"] <= TARGET_RATIO * base),
        Row(B, "the same without spare workers (the worker's Python start on the critical "
               "path)", fmt_s(cold_med["total"]), fmt_s(base) + " AWM",
            f"{cold_med['total'] / base:.3f}x AWM"),
        Row(B, "first environment of a run: the same with what a run starts once (its store "
               "created, its cache's verifier server started), one run", fmt_s(first),
            fmt_s(base) + " AWM", f"{first / base:.3f}x AWM"),
        Row(B, "AWM's check of one server (bench_awm.awm_start, content_platform_1): rebuild "
               "db (stdlib sqlite3) + start FastMCP.from_fastapi under uvicorn + list_tools "
               f"answered, median of {len(got['awm'])}", fmt_s(base)),
        Row(B, "  of which the db rebuild / the process start until list_tools answers",
            f"{fmt_s(awm_med['rebuild'])} / {fmt_s(awm_med['start_list_tools'])}"),
    ]
    report.rows += rows
    steps = [k for k in got["ours"][0] if k not in (*PARTS, "total")]
    report.data = {"ours_s": got["ours"], "cold_s": got["cold"], "awm_s": got["awm"],
                   "warmup": warm, "warmup_s": warm_s, "ours_median_s": med,
                   "cold_median_s": cold_med, "awm_median_s": awm_med, "a_plus_b_s": ab,
                   "checks": ours.checks + cold.checks}
    report.notes.append(
        "Sub-steps, medians: " + ", ".join(f"{k} {fmt_s(med[k])}" for k in steps) + ".")
    report.notes.append(
        f"Spread (min..max, s): ours total {spread(col('ours', 'total'))}, (a) "
        f"{spread(col('ours', 'a_schema_data'))}, (b) {spread(col('ours', 'b_code'))}, (c) "
        f"{spread(col('ours', 'c_world_verifiers'))}, (a)+(b) {spread(ab)}; without spares "
        f"{spread(col('cold', 'total'))}; AWM {spread(col('awm', 'total'))}. Rounds "
        "interleaved (order rotated), one warm-up round discarded.")
    report.notes.append(
        "The spare worker (synth.environments.appgen.SMOKE_LIMITS: spares=1) is a sandboxed worker "
        "process started ahead of need, its imports done and no code loaded; taking it "
        "starts its replacement in the background. In a run that start overlaps the "
        f"model's time (the bench waits {SPARE_WAIT_S:g} s for it after each validation); "
        "its cost, the worker's Python start, is the 'without spare workers' row's "
        "difference.")
    report.notes.append(
        "The baseline is AWM's sample server (content_platform_1, 34 routes) as bench_awm "
        "starts it; the scripted scenario is smaller (3 tables, 4 tools), but AWM's check "
        "is dominated by the process start (interpreter, FastAPI/SQLAlchemy/FastMCP "
        "imports), not by the server's size.")
    for who, source in (("ours", ours), ("cold", cold)):
        probes = source.probes[1:]  # the warm-up round's left out
        starts = [p.get("worker_start", []) for p in probes]
        verifies = [p.get("verifier_run", []) for p in probes]
        start_sum = [sum(x) for x in starts]
        share = median([a / g["total"] for a, g in zip(start_sum, got[who], strict=True)])
        label = "with a spare" if who == "ours" else "without spares"
        report.rows.append(Row(
            B, f"  where it goes ({label}): app worker starts (spawn or spare + load the "
               f"code), {median([len(x) for x in starts]):g} per validation, "
               f"{fmt_s(median([y for x in starts for y in x]))} each",
            fmt_s(median(start_sum)), "", f"{share:.0%} of it"))
        if who == "ours":
            report.rows.append(Row(
                B, f"  where it goes: verifier sandbox runs, "
                   f"{median([len(x) for x in verifies]):g} per validation, "
                   f"{fmt_s(median([y for x in verifies for y in x]))} each",
                fmt_s(median([sum(x) for x in verifies]))))
        report.data[f"probes_{who}_s"] = probes
    checks = ours.checks + cold.checks
    bad = [i for i, c in enumerate(checks) if not clean(c)]
    if bad:
        report.notes.append(f"WARNING: validation reported errors in rounds {bad}: "
                            f"{checks[bad[0]]}")
    return report


def run_quick() -> Report:
    """The smoke path: one validation of the environment (a spare worker, as in a run),
    no warm-up, no baseline (AWM's server start alone takes seconds), nothing judged."""
    work = scratch_dir("synth")
    ours = Ours(work / "ours", spare=True)
    got = ours.once()
    remove(work)
    report = Report(B, {"rounds": 1, "scenario": "library_loans", "baseline": None})
    report.rows += [Row(B, f"{LABELS[p]}, one run", fmt_s(got[p])) for p in PARTS]
    report.rows.append(Row(B, "total validation of one environment, (a)+(b)+(c)",
                           fmt_s(got["total"])))
    report.data = {"ours_s": [got], "checks": ours.checks}
    report.notes.append("quick run: one validation, no warm-up and no AWM baseline")
    if not clean(ours.checks[0]):
        raise RuntimeError(f"the environment's validation failed: {ours.checks[0]}")
    return report


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("synthesis validation vs AWM's server check")
    ap.add_argument("--rounds", type=int, help="timed rounds (after one warm-up round)")
    a = ap.parse_args(argv)
    setup_run(a)
    emit(run_quick() if a.quick else run(a.rounds or 5))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    raise SystemExit(main())
