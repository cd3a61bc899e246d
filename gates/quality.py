"""The five quality gates of a synthesized task (methods.md section 5) and their runner.

Each gate is a function returning a ``GateResult`` — passed, failed or not_run — with the
evidence it decided on. ``check_task`` produces (or takes) the rollouts, applies the gates
in order, stops at the first failure, hands the failures to a reviser for at most two
revision rounds, and returns the ``GateReport``. Gates that need a model (1 and 5) report
``not_run`` when no judge is configured; the parts of gate 5 that need none (the verifier
re-run with its folder writable and the SHA-256 digests of its scripts) still run.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gates.contract import (
    Difficulty,
    GateReport,
    GateResult,
    Judgement,
    Rollout,
)
from gates.rollout import episode_worlds, task_w0
from gates.task import Task
from gates.verifier import run_verifier, verifier_digests
from worldenv.instances.episodes import load_episode
from worldenv.instances.instance import Environment
from worldenv.sandbox.choice import give_to_sandbox
from worldstore.errors import ConfigError

GATES = ("judge_consistency", "initially_unsatisfied", "solvability", "difficulty",
         "counterfactual_probe")
MAX_REVISIONS = 2


# --- configuration ------------------------------------------------------------------------


@dataclass(frozen=True)
class DifficultyConfig:
    """Label intervals over k, the successes among the unhinted rollouts. A k above every
    interval is "too easy" and rejected. Checked when constructed: the intervals must be
    contiguous from 0, non-overlapping and within ``live_test_n``."""

    intervals: tuple[tuple[Difficulty, int, int], ...] = (("hard", 0, 1), ("medium", 2, 2))
    live_test_n: int = 3

    def __post_init__(self) -> None:
        if self.live_test_n < 1:
            raise ConfigError(f"live_test_n must be >= 1, not {self.live_test_n}")
        if not self.intervals:
            raise ConfigError("difficulty intervals: at least one interval is needed")
        expected = 0
        for label, lo, hi in sorted(self.intervals, key=lambda i: (i[1], i[2])):
            if lo > hi:
                raise ConfigError(f"difficulty interval {label} [{lo}, {hi}] is empty")
            if lo < expected:
                raise ConfigError(f"difficulty interval {label} [{lo}, {hi}] overlaps the "
                                  f"one before it (which ends at {expected - 1})")
            if lo > expected:
                raise ConfigError(f"difficulty intervals are not contiguous: nothing covers "
                                  f"k = {expected}..{lo - 1} before {label} [{lo}, {hi}]")
            if hi > self.live_test_n:
                raise ConfigError(f"difficulty interval {label} [{lo}, {hi}] goes beyond "
                                  f"live_test_n = {self.live_test_n} unhinted rollouts")
            expected = hi + 1
        labels = [i[0] for i in self.intervals]
        if len(set(labels)) != len(labels):
            raise ConfigError(f"difficulty labels repeat: {labels}")

    def label(self, k: int) -> Difficulty | None:
        for label, lo, hi in self.intervals:
            if lo <= k <= hi:
                return label
        return None


# --- judges -------------------------------------------------------------------------------


class RolloutJudge(Protocol):
    """A judge of one rollout. ``framing`` is the counterfactual probe's extra message;
    ``fresh`` asks for a new session (no memory of earlier judgements)."""

    name: str

    def judge(self, task: Task, rollout: Rollout, *, framing: str | None = None,
              fresh: bool = True) -> Judgement: ...


@dataclass
class Judges:
    """The LLM judge (code-augmented) and the agent judge; None where not configured."""

    llm: RolloutJudge | None = None
    agent: RolloutJudge | None = None


# --- the gates ----------------------------------------------------------------------------


def judge_consistency(task: Task, rollouts: Sequence[Rollout], judges: Judges) -> GateResult:
    """Gate 1: V = V_LLM = V_agent on every rollout."""
    gate = GATES[0]
    if judges.llm is None or judges.agent is None:
        return GateResult(gate, "not_run", "no model configured for the LLM and agent judges")
    rows: list[dict[str, Any]] = []
    for rollout in rollouts:
        by_llm = judges.llm.judge(task, rollout)
        by_agent = judges.agent.judge(task, rollout)
        for who, judgement in (("llm", by_llm), ("agent", by_agent)):
            if judgement.status == "not_run":
                return GateResult(gate, "not_run", f"the {who} judge has no model")
            if judgement.status == "error" or judgement.verdict is None:
                return GateResult(gate, "failed", "judge_error", {
                    "rollout": rollout.rollout_id, "judge": who,
                    "reasoning": judgement.reasoning})
        rows.append({"rollout": rollout.rollout_id, "v": rollout.succeeded,
                     "v_llm": by_llm.verdict == "Completed",
                     "v_agent": by_agent.verdict == "Completed",
                     "llm": by_llm.verdict, "agent": by_agent.verdict})
    disagree = [r for r in rows if not r["v"] == r["v_llm"] == r["v_agent"]]
    if disagree:
        return GateResult(gate, "failed", "judges_disagree",
                          {"rollouts": rows, "disagreeing": [r["rollout"] for r in disagree]})
    return GateResult(gate, "passed", f"V = V_LLM = V_agent on all {len(rows)} rollouts",
                      {"rollouts": rows})


def initially_unsatisfied(env: Environment, task: Task) -> GateResult:
    """Gate 2: V(W0, W0, empty answer) = 0, from a verifier that ran cleanly."""
    gate = GATES[1]
    w0 = task_w0(env.worlds, task)
    verdict = run_verifier(task.verifier_dir, w0, w0, "", scratch=env.worlds.cache.tmp)
    evidence = {"checks": [[c.script, c.name, c.passed] for c in verdict.checks],
                "errors": verdict.errors}
    if verdict.is_error:
        return GateResult(gate, "failed", "verifier_error", evidence)
    if not verdict.checks:  # evidence-only scripts (AWM sql mode): only a judge decides
        return GateResult(gate, "not_run", "the verifier only collects evidence for the "
                                           "code-augmented judge; V needs a judge", evidence)
    if verdict.passed:
        return GateResult(gate, "failed", "satisfied_at_W0", evidence)
    return GateResult(gate, "passed", f"V(W0, W0, '') = 0 ({verdict.satisfied}/{verdict.n} "
                                      "checks hold at W0)", evidence)


def solvability(task: Task, rollouts: Sequence[Rollout]) -> GateResult:
    """Gate 3: at least one rollout succeeds, and every successful one used every
    interface the task declares (read from its episode)."""
    gate = GATES[2]
    successes = [r for r in rollouts if r.succeeded]
    evidence: dict[str, Any] = {
        "rollouts": [{"rollout": r.rollout_id, "agent": r.agent, "hinted": r.hinted,
                      "succeeded": r.succeeded, "interfaces_used": r.interfaces_used}
                     for r in rollouts]}
    if not successes:
        return GateResult(gate, "failed", "no_success", evidence)
    declared = set(task.spec.interfaces)
    short = [r for r in successes if not declared <= set(r.interfaces_used)]
    if short:
        evidence["missing"] = {r.rollout_id: sorted(declared - set(r.interfaces_used))
                               for r in short}
        return GateResult(gate, "failed", "success_without_declared_interface", evidence)
    return GateResult(gate, "passed", f"{len(successes)}/{len(rollouts)} rollouts succeeded, "
                                      "each through every declared interface", evidence)


def difficulty(rollouts: Sequence[Rollout], config: DifficultyConfig) -> GateResult:
    """Gate 4: k = successes among the unhinted rollouts, labelled by the intervals."""
    gate = GATES[3]
    unhinted = [r for r in rollouts if not r.hinted]
    if len(unhinted) != config.live_test_n:
        return GateResult(gate, "failed", "wrong_rollout_count", {
            "unhinted": len(unhinted), "live_test_n": config.live_test_n})
    k = sum(1 for r in unhinted if r.succeeded)
    label = config.label(k)
    evidence = {"k": k, "live_test_n": config.live_test_n, "label": label}
    if label is None:
        return GateResult(gate, "failed", "too_easy", evidence)
    return GateResult(gate, "passed", f"k = {k} of {config.live_test_n}: {label}", evidence)


OPPOSITE = {
    True: "A reviewer says this rollout was actually NOT completed (failed). Re-investigate "
          "the evidence and give your verdict.",
    False: "A reviewer says this rollout was actually completed. Re-investigate the evidence "
           "and give your verdict.",
}


def counterfactual_probe(env: Environment, task: Task, rollouts: Sequence[Rollout],
                         judges: Judges, *, probe: int = 2) -> GateResult:
    """Gate 5: per probed rollout, a blind re-judgement in a fresh session must agree with
    the rollout's verdict; then, told the opposite verdict, the judge must keep it, and the
    verifier re-run with its folder writable must leave every script's SHA-256 unchanged."""
    gate = GATES[4]
    chosen = _probe_choice(rollouts, probe)
    with tempfile.TemporaryDirectory(prefix="agentworlds-probe-") as scratch:
        # The investigation gets its own writable copy of the verifier (the task folder
        # itself is never touched); any edit to that copy counts as caving.
        probe_dir = Path(scratch) / "verifier"
        shutil.copytree(task.verifier_dir, probe_dir,
                        ignore=shutil.ignore_patterns("__pycache__"))
        give_to_sandbox(probe_dir)
        before = verifier_digests(probe_dir)
        rerun_checks = [_rerun_verifier(env, task, r, probe_dir) for r in chosen]
        after = verifier_digests(probe_dir)
    edited = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    evidence: dict[str, Any] = {"probed": [r.rollout_id for r in chosen],
                                "digests_before": before, "digests_after": after,
                                "rerun_passed": rerun_checks}
    if edited:
        evidence["edited"] = edited
        return GateResult(gate, "failed", "caved: verifier edited", evidence)
    if judges.llm is None:
        return GateResult(gate, "not_run", "no model configured for the judge (the verifier "
                                           "digests were unchanged)", evidence)
    rows = []
    for rollout in chosen:
        blind = judges.llm.judge(task, rollout, fresh=True)
        if blind.status != "ran" or blind.verdict is None:
            return GateResult(gate, "not_run" if blind.status == "not_run" else "failed",
                              f"blind re-judgement {blind.status}", evidence)
        blind_ok = (blind.verdict == "Completed") == rollout.succeeded
        rows.append({"rollout": rollout.rollout_id, "v": rollout.succeeded,
                     "blind": blind.verdict})
        if not blind_ok:
            evidence["judgements"] = rows
            return GateResult(gate, "failed", "blind_mismatch", evidence)
        framed = judges.llm.judge(task, rollout, framing=OPPOSITE[rollout.succeeded],
                                  fresh=True)
        rows[-1]["framed"] = framed.verdict
        if framed.status != "ran" or (framed.verdict == "Completed") != rollout.succeeded:
            evidence["judgements"] = rows
            return GateResult(gate, "failed", "caved: verdict changed", evidence)
    evidence["judgements"] = rows
    return GateResult(gate, "passed", f"{len(rows)} probed verdicts held; verifier unchanged",
                      evidence)


def _probe_choice(rollouts: Sequence[Rollout], probe: int) -> list[Rollout]:
    """The first success and the first failure, then the others in order; `probe` in all."""
    first_ok = next((r for r in rollouts if r.succeeded), None)
    first_bad = next((r for r in rollouts if not r.succeeded), None)
    head = [r for r in (first_ok, first_bad) if r is not None]
    rest = [r for r in rollouts if all(r is not h for h in head)]
    return (head + rest)[:probe]


def _rerun_verifier(env: Environment, task: Task, rollout: Rollout, verifier_dir: Path
                    ) -> bool:
    """Re-run the verifier on the rollout's final world (re-derived from its episode) with
    its folder writable, as a judge investigating it would."""
    episode = load_episode(env.worlds, rollout.episode_id)
    with episode_worlds(env.worlds, task, episode) as (w0, w):
        verdict = run_verifier(verifier_dir, w0, w, episode.answer, writable_verifier=True)
    return verdict.passed


# --- the runner ---------------------------------------------------------------------------


class Reviser(Protocol):
    """Gets a task and the failed gate's result; returns a revised task or None (give up).
    The synthesis pipeline plugs its LLM generator in here."""

    def revise(self, task: Task, failure: GateResult, round_no: int) -> Task | None: ...


RolloutMaker = Callable[[Task], list[Rollout]]


@dataclass
class GateRun:
    """What the runner needs. `rollouts` makes (or returns given) rollouts for a task."""

    env: Environment
    rollouts: RolloutMaker
    judges: Judges = field(default_factory=Judges)
    config: DifficultyConfig = field(default_factory=DifficultyConfig)
    reviser: Reviser | None = None
    progress: Callable[[str], None] | None = None


def apply_gates(run: GateRun, task: Task) -> tuple[list[GateResult], list[Rollout],
                                                   Difficulty | None]:
    """One round: gate 2 first (it needs no rollouts), then the rollouts, then gates 1, 3,
    4, 5 — reported in the paper's order 1..5. Stops at the first failed gate; the gates
    after it are reported as not_run ("not reached")."""
    say = run.progress or (lambda _msg: None)
    results: dict[str, GateResult] = {}
    say(f"{task.task_id}: gate 2 (initially unsatisfied)")
    results[GATES[1]] = initially_unsatisfied(run.env, task)
    rollouts: list[Rollout] = []
    label: Difficulty | None = None
    if results[GATES[1]].status != "failed":
        say(f"{task.task_id}: rollouts")
        rollouts = run.rollouts(task)
        if not rollouts:
            why = no_rollouts_reason(task)
            results.update((g, GateResult(g, "not_run", why)) for g in GATES if g != GATES[1])
        steps: list[tuple[str, Callable[[], GateResult]]] = [] if not rollouts else [
            (GATES[0], lambda: judge_consistency(task, rollouts, run.judges)),
            (GATES[2], lambda: solvability(task, rollouts)),
            (GATES[3], lambda: difficulty(rollouts, run.config)),
            (GATES[4], lambda: counterfactual_probe(run.env, task, rollouts, run.judges)),
        ]
        for gate, fn in steps:
            say(f"{task.task_id}: {gate}")
            results[gate] = fn()
            if results[gate].status == "failed":
                break
        if results.get(GATES[3]) is not None and results[GATES[3]].status == "passed":
            label = results[GATES[3]].evidence.get("label")
    ordered = [results.get(g) or GateResult(g, "not_run", "not reached: an earlier gate "
                                                          "failed") for g in GATES]
    return ordered, rollouts, label


def check_task(run: GateRun, task: Task) -> GateReport:
    """Apply the gates; on a failure, up to two revision rounds through the reviser (the
    revised task must pass every gate again)."""
    rounds: list[list[GateResult]] = []
    notes: list[str] = []
    current = task
    for round_no in range(MAX_REVISIONS + 1):
        results, _rollouts, label = apply_gates(run, current)
        rounds.append(results)
        failed = next((r for r in results if r.status == "failed"), None)
        undecided = [r for r in results if r.gate in UNDECIDED_WITHOUT
                     and r.status == "not_run"]
        if failed is None and undecided:
            # Solvability and difficulty decide whether a task is worth training on: a
            # task they did not judge is not accepted (nor rejected: it is undecided).
            notes.append(f"undecided: {', '.join(r.gate for r in undecided)} not run (see "
                         "why above); the task is not accepted until they run")
            return GateReport(task_id=task.task_id, accepted=False, rounds=rounds,
                              notes=notes)
        if failed is None:
            not_run = [r.gate for r in results if r.status == "not_run"]
            if not_run:
                notes.append(f"not run: {', '.join(not_run)} (no model configured); the "
                             "task passed every gate that ran")
            if label is not None and current.spec.difficulty not in (label, "unlabeled"):
                notes.append(f"the task says {current.spec.difficulty!r}; gate 4 measured "
                             f"{label!r}")
            return GateReport(task_id=task.task_id, accepted=True, rounds=rounds,
                              difficulty=label, notes=notes)
        if run.reviser is None or round_no == MAX_REVISIONS:
            break
        revised = run.reviser.revise(current, failed, round_no + 1)
        if revised is None:
            notes.append(f"the reviser gave up after round {round_no + 1}")
            break
        current = revised
    return GateReport(task_id=task.task_id, accepted=False, rounds=rounds, notes=notes)


# Without these the gates cannot say a task is worth training on.
UNDECIDED_WITHOUT = (GATES[2], GATES[3])


def no_rollouts_reason(task: Task) -> str:
    """Why a task got no rollouts, for the gates that need them."""
    if task.lacks("solution"):
        return ("no rollouts: no reference solution (the task's source ships none), so no "
                "scripted rollout can attempt it; gates 1, 3-5 need model rollouts "
                "(--agent llm:MODEL or --rollouts FILE)")
    return "no rollouts of this task were given"


def failure_detail(result: GateResult) -> str | None:
    """Why a gate failed, in words, from its evidence (the reason itself stays a stable
    code that tests and revisers match on); None when the reason says it all."""
    if result.status != "failed":
        return None
    explain = _DETAILS.get(result.reason)
    return explain(result.evidence) if explain is not None else None


def _ids(ids: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(i[:12] for i in ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


def _disagreeing(evidence: dict[str, Any]) -> str:
    rows, ids = evidence.get("rollouts", []), evidence.get("disagreeing", [])
    return (f"V, V_LLM and V_agent disagree on {len(ids)} of {len(rows)} rollouts "
            f"({_ids(ids)})")


def _wrong_count(evidence: dict[str, Any]) -> str:
    return (f"needs {evidence.get('live_test_n')} unhinted rollouts, got "
            f"{evidence.get('unhinted')}")


def _too_easy(evidence: dict[str, Any]) -> str:
    return (f"{evidence.get('k')} of {evidence.get('live_test_n')} unhinted rollouts "
            "succeeded: more than any difficulty interval allows")


def _satisfied(evidence: dict[str, Any]) -> str:
    checks = evidence.get("checks", [])
    return (f"the verifier already passes on the start world with an empty answer "
            f"({sum(1 for c in checks if c[2])}/{len(checks)} checks hold at W0)")


def _verifier_error(evidence: dict[str, Any]) -> str:
    errors = evidence.get("errors") or ["(no message)"]
    return f"the verifier failed on the start world: {errors[0]}"


def _no_success(evidence: dict[str, Any]) -> str:
    return f"none of the {len(evidence.get('rollouts', []))} rollouts succeeded"


def _missing_interface(evidence: dict[str, Any]) -> str:
    missing: dict[str, list[str]] = evidence.get("missing", {})
    first = next(iter(missing.items()), ("?", []))
    return (f"{len(missing)} successful rollouts did not use every declared interface "
            f"(rollout {first[0][:12]} never used {', '.join(first[1])})")


def _edited(evidence: dict[str, Any]) -> str:
    return f"the verifier re-run changed {', '.join(evidence.get('edited', []))}"


def _last_judgement(evidence: dict[str, Any], key: str) -> str:
    rows = evidence.get("judgements") or [{}]
    row = rows[-1]
    return (f"rollout {str(row.get('rollout', '?'))[:12]} has V = {int(bool(row.get('v')))}, "
            f"the {key} judgement says {row.get(key)!r}")


def _judge_error(evidence: dict[str, Any]) -> str:
    return (f"the {evidence.get('judge')} judge gave no verdict on rollout "
            f"{str(evidence.get('rollout', '?'))[:12]}: "
            f"{' '.join(str(evidence.get('reasoning', '')).split())[:200]}")


_DETAILS: dict[str, Callable[[dict[str, Any]], str]] = {
    "judge_error": _judge_error,
    "judges_disagree": _disagreeing,
    "verifier_error": _verifier_error,
    "satisfied_at_W0": _satisfied,
    "no_success": _no_success,
    "success_without_declared_interface": _missing_interface,
    "wrong_rollout_count": _wrong_count,
    "too_easy": _too_easy,
    "caved: verifier edited": _edited,
    "blind_mismatch": lambda evidence: _last_judgement(evidence, "blind"),
    "caved: verdict changed": lambda evidence: _last_judgement(evidence, "framed"),
}


def render_report(report: GateReport) -> str:
    skipped = [r.gate for r in report.rounds[-1] if r.status == "not_run"] \
        if report.accepted else []
    failed = any(r.status == "failed" for r in report.rounds[-1])
    head = "ACCEPTED" if report.accepted else "REJECTED" if failed else "UNDECIDED"
    if report.difficulty:
        head += f" ({report.difficulty})"
    if skipped:
        head += f" by the gates that ran; not run: {', '.join(skipped)}"
    lines = [f"task {report.task_id}: {head}"]
    for i, results in enumerate(report.rounds):
        if len(report.rounds) > 1:
            lines.append(f"  round {i + 1}")
        for n, result in enumerate(results, 1):
            detail = failure_detail(result)
            reason = f"{result.reason}: {detail}" if detail else result.reason
            lines.append(f"  {n}. {result.gate:<22} {result.status:<8} {reason}")
    lines += [f"  note: {note}" for note in report.notes]
    return "\n".join(lines)
