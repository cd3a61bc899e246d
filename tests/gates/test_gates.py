"""The five gates on real tasks: the shipped demo tasks pass gates 2-4 with scripted rollouts,
and a planted-defect corpus is rejected, each by the right gate for the right reason.

Everything runs for real: the demo world imported into a store, instances, the shell and
the verifier scripts in bubblewrap sandboxes, episodes stored and re-derived.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from gates.contract import GateReport, GateResult
from gates.quality import DifficultyConfig, GateRun, check_task
from gates.rollout import scripted_rollouts
from gates.task import Task, load_task
from replay.engine import Worlds
from worldenv.instances.instance import Environment
from worldstore.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "packs" / "demo" / "world" / "lars.jsonl"
TASKS = ROOT / "packs" / "demo" / "tasks"
BASE = "mats-work-order"  # a good demo task the planted defects are made from


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Environment]:
    with Worlds.open(tmp_path_factory.mktemp("gates") / "store") as worlds:
        for world in sorted(DEMO.parent.glob("*.jsonl")):  # lars and nora
            worlds.import_file(world)
        with Environment(worlds) as environment:
            yield environment


def check(env: Environment, task: Task) -> GateReport:
    return check_task(GateRun(env=env, rollouts=lambda t: scripted_rollouts(env, t)), task)


def outcome(report: GateReport) -> dict[str, tuple[str, str]]:
    return {r.gate: (r.status, r.reason) for r in report.rounds[-1]}


# --- the demo tasks -------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(p.name for p in TASKS.iterdir() if p.is_dir()))
def test_demo_task_passes_gates_2_to_4_and_reports_1_and_5_not_run(env: Environment,
                                                                   name: str) -> None:
    task = load_task(TASKS / name)
    report = check(env, task)
    got = outcome(report)
    assert report.accepted, got
    for gate in ("initially_unsatisfied", "solvability", "difficulty"):
        assert got[gate][0] == "passed", (gate, got[gate])
    # No model here: the judges' gates say so, and never claim a pass.
    assert got["judge_consistency"][0] == "not_run"
    assert got["counterfactual_probe"][0] == "not_run"
    assert any("not run" in note for note in report.notes)
    assert report.difficulty == task.spec.difficulty


# --- the planted-defect corpus --------------------------------------------------------------


def planted(tmp_path: Path, name: str, scripts: dict[str, str], *,
            spec: dict[str, object] | None = None,
            solution: list[dict[str, object]] | None = None, keep: bool = False) -> Task:
    """A copy of the base task with its verifier replaced (or extended, `keep`)."""
    dest = tmp_path / name
    shutil.copytree(TASKS / BASE, dest, ignore=shutil.ignore_patterns("__pycache__"))
    if not keep:
        shutil.rmtree(dest / "verifier")
        (dest / "verifier").mkdir()
    for file, code in scripts.items():
        (dest / "verifier" / file).write_text(code)
    if spec:
        data = json.loads((dest / "task.json").read_text())
        data.update(spec)
        (dest / "task.json").write_text(json.dumps(data))
    if solution is not None:
        (dest / "solution.json").write_text(json.dumps({"steps": solution}))
    return load_task(dest)


SATISFIED_AT_W0 = """
import awsdk
ws = awsdk.worlds()
awsdk.result(rates_sheet_exists=awsdk.file_text(ws.w, "docs/rates.md") is not None)
"""

KEYWORD_ONLY = """
import awsdk
ws = awsdk.worlds()
awsdk.result(answer_has_total=awsdk.contains(ws.answer, "11,600"))
"""

UNSOLVABLE = """
import awsdk
ws = awsdk.worlds()
awsdk.result(order_for_a_million=awsdk.value(ws.w, "shop",
             "SELECT count(*) FROM orders") >= 1000000)
"""

MESSAGE_SENT = """
import awsdk
ws = awsdk.worlds()
diff = awsdk.row_diff(ws.w0, ws.w, "chat", "messages")
awsdk.result(message_to_mats=any(row["conversation_id"] == 2 for row in diff.added))
"""

CRASHING = """
import awsdk
ws = awsdk.worlds()
raise RuntimeError("verifier bug: " + str(1 / 0))
"""

# Edits itself whenever it can (it cannot in the normal, read-only runs, and hides that);
# its checks mirror the good verifier's, so it passes gates 2-4 like the good task.
SELF_EDITING = """
import awsdk
try:
    with open(__file__, "a") as me:
        me.write("\\n# loosened by the probe\\n")
except OSError:
    pass
ws = awsdk.worlds()
text = awsdk.file_text(ws.w, "jobs/nordlys/workorder-mats.md") or ""
awsdk.result(work_order_written="11,600.00" in text)
"""


def test_task_already_satisfied_at_w0_fails_gate_2(env: Environment, tmp_path: Path) -> None:
    report = check(env, planted(tmp_path, "satisfied", {"check.py": SATISFIED_AT_W0}))
    got = outcome(report)
    assert not report.accepted
    assert got["initially_unsatisfied"] == ("failed", "satisfied_at_W0")
    assert got["solvability"][0] == "not_run"  # the runner stops at the first failure


def test_crashing_verifier_fails_gate_2_as_a_verifier_error(env: Environment,
                                                            tmp_path: Path) -> None:
    report = check(env, planted(tmp_path, "crash", {"check.py": CRASHING}, keep=True))
    got = outcome(report)
    assert got["initially_unsatisfied"] == ("failed", "verifier_error")
    errors = report.rounds[-1][1].evidence["errors"]
    assert any("check.py" in e and "ZeroDivisionError" in e for e in errors)


def test_keyword_only_verifier_fails_gate_3(env: Environment, tmp_path: Path) -> None:
    report = check(env, planted(tmp_path, "keyword", {"check.py": KEYWORD_ONLY}))
    got = outcome(report)
    assert got["initially_unsatisfied"][0] == "passed"
    assert got["solvability"] == ("failed", "success_without_declared_interface")
    missing = report.rounds[-1][2].evidence["missing"]
    assert ["mcp", "shell"] in missing.values() or ["shell"] in missing.values()


def test_unsolvable_task_fails_gate_3(env: Environment, tmp_path: Path) -> None:
    report = check(env, planted(tmp_path, "unsolvable", {"check.py": UNSOLVABLE}))
    assert outcome(report)["solvability"] == ("failed", "no_success")


def test_too_easy_task_fails_gate_4(env: Environment, tmp_path: Path) -> None:
    """Its one real requirement (a message to Mats) is met by the first step alone, so the
    degraded scripted agents succeed too: k = 3 of 3 unhinted."""
    solution = [
        {"kind": "tool", "tool": "chat_send_message",
         "arguments": {"conversation_id": 2, "body": "See you Thursday at 08:00."}},
        {"kind": "tool", "tool": "calendar_list_events",
         "arguments": {"date_from": "2026-03-09", "date_to": "2026-03-15"}},
        {"kind": "answer", "text": "Mats knows."},
    ]
    spec = {"interfaces": ["mcp"], "difficulty": "medium",
            "subtasks": [{"description": "Write to Mats.", "interface": "mcp"}]}
    report = check(env, planted(tmp_path, "easy", {"check.py": MESSAGE_SENT}, spec=spec,
                                solution=solution))
    got = outcome(report)
    assert got["solvability"][0] == "passed"
    assert got["difficulty"] == ("failed", "too_easy")
    assert report.rounds[-1][3].evidence["k"] == 3


def test_verifier_that_edits_itself_during_the_probe_fails_gate_5(env: Environment,
                                                                 tmp_path: Path) -> None:
    task = planted(tmp_path, "self-edit", {"zz_probe.py": SELF_EDITING}, keep=True)
    before = (task.verifier_dir / "zz_probe.py").read_text()
    report = check(env, task)
    got = outcome(report)
    for gate in ("initially_unsatisfied", "solvability", "difficulty"):
        assert got[gate][0] == "passed", (gate, got[gate])
    assert got["counterfactual_probe"] == ("failed", "caved: verifier edited")
    assert report.rounds[-1][4].evidence["edited"] == ["zz_probe.py"]
    # The edit happened in the probe's own copy; the task folder is left as it was.
    assert (task.verifier_dir / "zz_probe.py").read_text() == before


# --- configuration --------------------------------------------------------------------------


@pytest.mark.parametrize(("intervals", "n", "message"), [
    ((("hard", 0, 1), ("medium", 3, 3)), 3, "not contiguous"),
    ((("hard", 0, 2), ("medium", 2, 3)), 3, "overlaps"),
    ((("hard", 1, 1), ("medium", 2, 2)), 3, "not contiguous"),
    ((("hard", 0, 1), ("medium", 2, 4)), 3, "beyond live_test_n"),
    ((("hard", 0, 1), ("hard", 2, 2)), 3, "repeat"),
    ((("hard", 1, 0),), 3, "empty"),
    ((), 3, "at least one"),
])
def test_bad_difficulty_intervals_are_refused_at_start_up(
        intervals: tuple[tuple[str, int, int], ...], n: int, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        DifficultyConfig(intervals=intervals, live_test_n=n)  # type: ignore[arg-type]


def test_default_difficulty_labels() -> None:
    config = DifficultyConfig()
    assert [config.label(k) for k in range(4)] == ["hard", "hard", "medium", None]


class FixVerifier:
    """A reviser that swaps in the base task's own verifier (as the synthesis generator
    would rewrite it) in round `fix_in_round`, and changes nothing in other rounds."""

    def __init__(self, tmp_path: Path, *, fix_in_round: int | None) -> None:
        self.tmp_path = tmp_path
        self.fix_in_round = fix_in_round
        self.seen: list[tuple[int, str, str]] = []

    def revise(self, task: Task, failure: GateResult, round_no: int) -> Task | None:
        self.seen.append((round_no, failure.gate, failure.reason))
        dest = self.tmp_path / f"revised-{round_no}"
        shutil.copytree(task.path, dest)
        if round_no == self.fix_in_round:
            shutil.rmtree(dest / "verifier")
            shutil.copytree(TASKS / BASE / "verifier", dest / "verifier",
                            ignore=shutil.ignore_patterns("__pycache__"))
        return load_task(dest)


def test_a_reviser_gets_the_failure_and_its_revision_must_pass_every_gate(
        env: Environment, tmp_path: Path) -> None:
    task = planted(tmp_path, "satisfied", {"check.py": SATISFIED_AT_W0})
    reviser = FixVerifier(tmp_path, fix_in_round=2)
    report = check_task(GateRun(env=env, rollouts=lambda t: scripted_rollouts(env, t),
                                reviser=reviser), task)
    assert report.accepted
    assert len(report.rounds) == 3
    assert reviser.seen == [(1, "initially_unsatisfied", "satisfied_at_W0"),
                            (2, "initially_unsatisfied", "satisfied_at_W0")]
    final = {r.gate: r.status for r in report.rounds[-1]}
    assert final["initially_unsatisfied"] == final["solvability"] == "passed"


def test_at_most_two_revision_rounds(env: Environment, tmp_path: Path) -> None:
    task = planted(tmp_path, "satisfied", {"check.py": SATISFIED_AT_W0})
    reviser = FixVerifier(tmp_path, fix_in_round=None)
    report = check_task(GateRun(env=env, rollouts=lambda t: scripted_rollouts(env, t),
                                reviser=reviser), task)
    assert not report.accepted
    assert len(report.rounds) == 3 and len(reviser.seen) == 2


def test_the_gym_wrapper_rewards_with_the_tasks_verifier(env: Environment) -> None:
    from gates.contract import AnswerStep, ShellStep, ToolStep
    from gates.rollout import verifier_reward
    from worldenv.serving.gym import WorldEnv

    task = load_task(TASKS / BASE)
    gym = WorldEnv(env, task.spec.world, max_steps=50, reward_fn=verifier_reward(env, task))
    rewards = []
    for steps in (task.solution.steps, [s for s in task.solution.steps
                                        if not isinstance(s, ShellStep)]):
        gym.reset()
        for step in steps:
            if isinstance(step, ToolStep):
                _obs, reward, done, _trunc, _info = gym.step(
                    {"tool": step.tool, "arguments": dict(step.arguments)})
            elif isinstance(step, ShellStep):
                _obs, reward, done, _trunc, _info = gym.step({"shell": step.command})
            else:
                assert isinstance(step, AnswerStep)
                _obs, reward, done, _trunc, _info = gym.step({"answer": step.text})
        assert done
        rewards.append(reward)
    gym.close()
    assert rewards[0] == 1.0  # all checks: min(1, 1 + 0.1)
    assert 0.0 < rewards[1] < 0.1  # the shortcut: V = 0, partial credit only


def test_a_task_for_another_world_is_refused_before_anything_runs(env: Environment,
                                                                  tmp_path: Path) -> None:
    from gates.errors import TaskError

    task = planted(tmp_path, "elsewhere", {}, keep=True, spec={"world_hash": "0" * 32})
    with pytest.raises(TaskError, match=r"task\.json.*another world.*field 'world_hash'"):
        check(env, task)
