"""Persona-world synthesis outside the model: what a day and a task claim cost the system.

Contenders, interleaved round by round, medians reported:

* **a day implemented** (``synth.worlds.implement.implement_day`` on a fresh store holding the
  persona's day 0): the implementer's 8 calls on a live instance (the model's answers
  from recordings, so no model time), the episode made a day, its re-execution
  on a fresh instance, the five layers on the candidate in a scratch store (the reviewer
  answered from the recordings) and the append. Baseline: importing the same day's lines
  into the same store (what appending the day costs when nothing is checked). The
  re-execution's wait for the next wall-clock second is set to 0 here: in a run it is
  covered by the model's own time (the attempt's first shell call is over a second
  before the attempt ends), so counting it would measure a sleep.
* **validation before commit** (``validate_candidate``: the persona's log and the
  candidate imported into a scratch store, then the five layers) against the five layers
  on the same day once stored (``validate_day``): the price of never storing a refused day.
* **a diversity decision** (``store.claim`` with the gate's decision: cosine of 3
  candidates against 32 claimed tasks, under the store's claim lock) against reading the
  scope's claims (``store.claims``).
"""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import msgspec
from _common import (
    BENCH_DIR,
    Report,
    Row,
    bench_parser,
    emit,
    fmt_s,
    interleave,
    median,
    remove,
    scratch_dir,
    setup_run,
    spread,
)

B = "persona"
# The model's answers (persona astrid accepted, day 1 implemented and reviewed) and the
# day's plan, recorded once by examples/recorded/record.py: a run replays them offline.
FIXTURE = BENCH_DIR / "fixtures" / "persona"
MODEL = "openai/loopback"


def replay_settings() -> Any:
    from synth.runs import Settings

    return Settings(model=MODEL, mode="replay", recordings=FIXTURE / "recordings")


class Days:
    """One run folder (the persona accepted once); a fresh store per round."""

    def __init__(self, work: Path, settings: Any) -> None:
        import synth.worlds.implement as implement
        from synth.runs import open_run, synth_persona
        from synth.worlds.personas import BibleOut
        from synth.worlds.plans import PlanOut

        self.work = work
        self.settings = settings
        self.run_dir = work / "run"
        report = synth_persona(self.run_dir, self.settings, "astrid")
        assert report["status"] == "accepted", report
        self.bible = msgspec.json.decode(
            (self.run_dir / "personas" / "astrid" / "bible.json").read_bytes(), type=BibleOut)
        self.plan = msgspec.json.decode((FIXTURE / "plan.json").read_bytes(), type=PlanOut)
        _, self.ctx = open_run(self.run_dir, self.settings)
        implement.REEXECUTION_GAP_S = 0.0  # see the module docstring
        self.lines: bytes = b""
        self.n = 0

    def _store(self) -> Any:
        from replay.engine import Worlds
        from synth.worlds.setup import setup_lines

        self.n += 1
        worlds = Worlds.open(self.work / f"store-{self.n}", self.work / "cache")
        worlds.import_stream(io.BytesIO(setup_lines(self.bible)), source="<day 0>")
        return worlds

    def implement(self) -> float:
        from synth.worlds.implement import implement_day

        worlds = self._store()
        try:
            t0 = time.perf_counter()
            outcome = implement_day(self.ctx, worlds, self.bible, self.plan)
            took = time.perf_counter() - t0
            assert outcome.status == "stored", outcome
            if not self.lines:
                out = io.BytesIO()
                worlds.export("astrid", out)
                self.lines = b"".join(line + b"\n" for line in out.getvalue().splitlines()
                                      if b'"day":1,' in line)
            return took
        finally:
            worlds.close()

    def import_day(self) -> float:
        worlds = self._store()
        try:
            t0 = time.perf_counter()
            worlds.import_stream(io.BytesIO(self.lines), source="<day 1>")
            return time.perf_counter() - t0
        finally:
            worlds.close()

    def candidate(self) -> float:
        from synth.worlds.days import EpisodeDay
        from synth.worlds.implement import _plan_text, validate_candidate
        from synth.worlds.reviewer import LLMReviewer

        worlds = self._store()
        try:
            made = EpisodeDay("astrid", 1, self.lines, len(self.lines.splitlines()), "")
            t0 = time.perf_counter()
            report = validate_candidate(worlds, made, reviewer=LLMReviewer(self.ctx.client),
                                        plan=_plan_text(self.plan))
            took = time.perf_counter() - t0
            assert report.ok, report
            return took
        finally:
            worlds.close()

    def stored(self) -> float:
        from synth.worlds.implement import _plan_text
        from synth.worlds.reviewer import LLMReviewer
        from synth.worlds.validate_day import validate_day
        from worldenv.instances.instance import Environment

        worlds = self._store()
        try:
            worlds.import_stream(io.BytesIO(self.lines), source="<day 1>")
            with Environment(worlds) as env:
                t0 = time.perf_counter()
                report = validate_day(worlds, "astrid@1", reviewer=LLMReviewer(
                    self.ctx.client), env=env, plan=_plan_text(self.plan))
                took = time.perf_counter() - t0
            assert report.ok, report
            return took
        finally:
            worlds.close()


class Claims:
    def __init__(self, work: Path) -> None:
        from replay.engine import Worlds

        self.worlds = Worlds.open(work / "claims-store", work / "claims-cache")
        self.round = 0

    def _vector(self, i: int) -> list[float]:
        return [float((i * 7 + j * 3) % 11) for j in range(64)]

    def _filled(self) -> str:
        self.round += 1
        scope = f"bench:{self.round}"
        for i in range(32):
            self.worlds.store.claim(scope, f"{i:08d}", "w", lambda _f, i=i: (
                "open", msgspec.json.encode({"state": "claimed", "instruction": f"task {i}",
                                             "vector": self._vector(i)})))
        return scope

    def decide(self) -> float:
        from synth.worlds.tasks import _least_similar

        scope = self._filled()
        candidates: list[Any] = [(object(), self._vector(100 + k)) for k in range(3)]

        def decision(found: list[Any]) -> tuple[Any, bytes]:
            claimed = [(b["instruction"], b["vector"]) for b in
                       (msgspec.json.decode(c.body) for c in found)]
            choice = _least_similar(candidates, claimed)
            return "open", msgspec.json.encode({"state": choice.status})

        t0 = time.perf_counter()
        self.worlds.store.claim(scope, f"{32:08d}", "w", decision)
        return time.perf_counter() - t0

    def read(self) -> float:
        scope = self._filled()
        t0 = time.perf_counter()
        self.worlds.store.claims(scope)
        return time.perf_counter() - t0


def run(rounds: int, *, warm: bool = True) -> Report:
    work = scratch_dir("persona")
    report = Report(B, {"rounds": rounds, "persona": "astrid (chat, notes)",
                        "day": "8 calls: 4 SQL, 1 tool, 1 shell, 2 begin"})
    days = Days(work, replay_settings())
    days.implement()  # the day's lines, which the import contender needs
    claims = Claims(work)
    if warm:
        days.candidate()
        days.stored()
        claims.decide()
    times = interleave({"implement": days.implement, "import": days.import_day,
                        "candidate": days.candidate, "stored": days.stored,
                        "decide": claims.decide, "read": claims.read}, rounds)
    claims.worlds.close()
    remove(work)
    m = {k: median(v) for k, v in times.items()}
    report.data = {"seconds": times}
    report.rows += [
        Row(B, "a day implemented: 8 calls, day from the episode, re-execution, five "
               "layers in a scratch store, append (model answers from recordings)",
            fmt_s(m["implement"]), fmt_s(m["import"]) + " (import of the same day)",
            f"implement/import = {m['implement'] / m['import']:.1f}x"),
        Row(B, "validation before commit (scratch store: the log and the candidate, then "
               "the five layers)", fmt_s(m["candidate"]),
            fmt_s(m["stored"]) + " (the five layers on the stored day)",
            f"candidate/stored = {m['candidate'] / m['stored']:.2f}x"),
        Row(B, "a diversity decision: 3 candidates against 32 claims, under the claim lock",
            fmt_s(m["decide"]), fmt_s(m["read"]) + " (reading the 32 claims)",
            f"decide/read = {m['decide'] / m['read']:.1f}x"),
    ]
    report.notes += [f"{k}: {spread(v)} s over {rounds} rounds" for k, v in times.items()]
    return report


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("persona-world synthesis outside the model")
    ap.add_argument("--rounds", type=int, help="timed rounds (after one warm-up round)")
    a = ap.parse_args(argv)
    setup_run(a)
    a.rounds = a.rounds or (1 if a.quick else 7)
    report = run(a.rounds, warm=not a.quick)
    emit(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
