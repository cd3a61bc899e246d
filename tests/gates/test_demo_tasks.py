"""The demo tasks of packs/demo/tasks, on real instances of the bundled demo world.

Each task folder must load, name a recorded day of ``lars`` between 2 and 7 (a different
day per task), need both the MCP tools and the shell, and ship a verifier that tells the
reference solution apart from every degraded scripted agent: the reference passes; the
shortcut (no shell), nothing and answer-only fail; first-half fails unless the task is
labelled medium; V(W0, W0, "") fails. Every verdict comes from the real sandboxed runner
and must leave both worlds exactly as they were.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import msgspec
import pytest

from gates.agents import ScriptedAgent, reference_agent, scripted
from gates.contract import AnswerStep, Difficulty, ShellStep, Solution, ToolStep, Verdict
from gates.rollout import interfaces_used
from gates.task import SOLUTION_FILE, Task, load_task
from gates.verifier import SDK_DIR, run_verifier
from packs.registry import load_pack
from replay.engine import Worlds
from replay.hashing import world_manifest
from worldenv.instances.instance import Environment

PACK = load_pack("demo")  # the tasks as every caller finds them: through the registry
DEMO = PACK.worlds[0]
TASKS = PACK.tasks_dir
# The tasks on lars (MCP and shell); the GUI task on nora has tests/gates/test_demo_gui_task.py.
TASK_IDS = [t for t in PACK.tasks if load_task(TASKS / t).spec.world.startswith("lars@")]
AGENTS = ("reference", "first-half", "shortcut", "nothing", "answer-only")
LIVE_TEST = ("reference", "first-half", "shortcut")  # the difficulty gate's unhinted three
LABEL_BY_SUCCESSES: dict[int, Difficulty] = {1: "hard", 2: "medium"}


@dataclass(frozen=True)
class Graded:
    """One verdict and the hashes of both worlds around the verifier's run."""

    verdict: Verdict
    hashes_before: tuple[str, str]
    hashes_after: tuple[str, str]
    step_errors: tuple[str, ...] = ()
    interfaces: tuple[str, ...] = ()


@pytest.fixture(scope="module")
def env(demo_worlds: Worlds) -> Iterator[Environment]:
    with Environment(demo_worlds) as environment:
        yield environment


def _world_hash(world: Path) -> str:
    return world_manifest(world).world_hash()


def _grade(task: Task, w0: Path, w: Path, answer: str | None) -> tuple[Verdict, tuple[str, str],
                                                                        tuple[str, str]]:
    before = _world_hash(w0), _world_hash(w)
    verdict = run_verifier(task.verifier_dir, w0, w, answer)
    return verdict, before, (_world_hash(w0), _world_hash(w))


def _w0(env: Environment, task: Task) -> Path:
    record = env.worlds.resolve(task.spec.world)
    return env.worlds.snapshot(record.persona, record.day)


def _rollout(env: Environment, task: Task, agent: ScriptedAgent) -> Graded:
    with env.open(task.spec.world) as instance:
        trajectory = agent.run(instance, task, hinted=False)
        instance.hash()  # closes the instance's connections: W is whole on disk
        verdict, before, after = _grade(task, _w0(env, task), instance.mount.path,
                                        trajectory.answer)
        errors = tuple(f"step {t.index}: {t.observation[:300]}" for t in trajectory.turns
                       if t.is_error)
        return Graded(verdict, before, after, errors, tuple(interfaces_used(instance.episode)))


@pytest.fixture(scope="module")
def graded(env: Environment) -> Iterator[dict[tuple[str, str], Graded]]:
    """Every task's verdicts, computed once: each scripted agent, and W0 against W0."""
    found: dict[tuple[str, str], Graded] = {}
    for task_id in TASK_IDS:
        task = load_task(TASKS / task_id)
        for agent in AGENTS:
            found[task_id, agent] = _rollout(env, task, scripted(agent))
        w0 = _w0(env, task)
        found[task_id, "w0-vs-w0"] = Graded(*_grade(task, w0, w0, ""))
    yield found


def _failed(graded: Graded) -> list[str]:
    return [f"{c.script}:{c.name}" for c in graded.verdict.checks if not c.passed]


# --- the folders ------------------------------------------------------------------------------


def test_at_least_six_tasks_each_on_its_own_day_between_2_and_7() -> None:
    days = [load_task(TASKS / task_id).spec.world for task_id in TASK_IDS]
    assert len(TASK_IDS) >= 6
    assert len(set(days)) == len(days), days
    assert {int(day.split("@")[1]) for day in days} <= set(range(2, 8)), days


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_task_folder_is_complete_and_crosses_interfaces(env: Environment, task_id: str) -> None:
    task = load_task(TASKS / task_id)
    spec = task.spec
    assert spec.task_id == task_id
    assert spec.world.startswith("lars@")
    assert spec.world_hash == env.worlds.resolve(spec.world).world_hash
    assert spec.interfaces == ["mcp", "shell"]
    # An interface switch at least twice: the subtasks interleave the two interfaces.
    order = [sub.interface for sub in spec.subtasks]
    switches = sum(1 for a, b in itertools.pairwise(order) if a != b)
    assert switches >= 2, order
    assert 2 <= len(task.scripts) <= 4, task.scripts
    steps = task.solution.steps
    assert any(isinstance(s, ToolStep) for s in steps)
    assert any(isinstance(s, ShellStep) for s in steps)
    assert isinstance(steps[-1], AnswerStep) and steps[-1].text.strip()
    assert task.rubric.strip() and task.hint.strip()


# --- the verdicts -----------------------------------------------------------------------------


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_reference_solution_passes_every_check(graded: dict[tuple[str, str], Graded],
                                               task_id: str) -> None:
    reference = graded[task_id, "reference"]
    assert not reference.step_errors, reference.step_errors
    assert reference.interfaces == ("mcp", "shell")
    assert not reference.verdict.errors, reference.verdict.errors
    assert reference.verdict.passed, _failed(reference)


@pytest.mark.parametrize("task_id", TASK_IDS)
@pytest.mark.parametrize("agent", ["shortcut", "nothing", "answer-only", "w0-vs-w0"])
def test_degraded_work_fails_on_its_checks(graded: dict[tuple[str, str], Graded],
                                           task_id: str, agent: str) -> None:
    result = graded[task_id, agent]
    # A failure must come from the checklist, not from a broken script.
    assert not result.verdict.errors, result.verdict.errors
    assert result.verdict.checks
    assert not result.verdict.passed
    assert _failed(result)


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_checklist_credits_the_tool_work_of_the_shortcut(
        graded: dict[tuple[str, str], Graded], task_id: str) -> None:
    """The shortcut makes every tool call of the reference and skips the shell: the
    checklist must credit what it did (partial reward) and still fail it on the workspace."""
    def satisfied(agent: str) -> int:
        return graded[task_id, agent].verdict.satisfied

    assert satisfied("nothing") < satisfied("shortcut") < satisfied("reference")
    assert satisfied("reference") == graded[task_id, "reference"].verdict.n


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_difficulty_label_matches_the_live_test(graded: dict[tuple[str, str], Graded],
                                                task_id: str) -> None:
    successes = sum(graded[task_id, agent].verdict.passed for agent in LIVE_TEST)
    label = load_task(TASKS / task_id).spec.difficulty
    assert LABEL_BY_SUCCESSES.get(successes) == label, (successes, label)
    if label == "hard":
        assert _failed(graded[task_id, "first-half"])


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_verifier_never_changes_either_world(graded: dict[tuple[str, str], Graded],
                                             task_id: str) -> None:
    for agent in (*AGENTS, "w0-vs-w0"):
        result = graded[task_id, agent]
        assert result.hashes_after == result.hashes_before, agent


def test_reference_worlds_differ_from_the_start_world(
        graded: dict[tuple[str, str], Graded]) -> None:
    """The reference changes its world; the agents that do nothing leave it as it was."""
    for task_id in TASK_IDS:
        w0_hash = graded[task_id, "w0-vs-w0"].hashes_before[0]
        assert graded[task_id, "reference"].hashes_before[1] != w0_hash, task_id
        assert graded[task_id, "nothing"].hashes_before[1] == w0_hash, task_id
        assert graded[task_id, "answer-only"].hashes_before[1] == w0_hash, task_id


# --- other solutions: right ones written differently pass, plausible wrong ones fail --------

# (task, what differs, replacements in the reference solution's JSON, should it pass)
VARIANTS: list[tuple[str, str, dict[str, str], bool]] = [
    ("sagene-easter-quote", "Norwegian number format and explicit UTC offsets",
     {"10,800.00": "10 800,00", "11,250.00": "11 250,00", "2,812.50": "2 812,50",
      "14,062.50": "14 062,50", "450.00": "450,-", "2026-03-28T16:00": "2026-03-28T15:00Z",
      "2026-03-28T23:00": "2026-03-28T22:00Z"}, True),
    ("sagene-easter-quote", "no weekend surcharge",
     {"10,800.00": "7,200.00", "11,250.00": "7,650.00", "2,812.50": "1,912.50",
      "14,062.50": "9,562.50"}, False),
    ("sagene-easter-quote", "booked as confirmed", {'"tentative"': '"confirmed"'}, False),
    ("mats-work-order", "install dates from before the move",
     {"2026-03-12": "2026-03-11", "2026-03-13": "2026-03-12"}, False),
    ("mats-work-order", "early departure noted on Friday", {'"event_id": 9': '"event_id": 10'},
     False),
    ("nordlys-deposit-invoice", "an invoice number already used",
     {"2026-020": "2026-019"}, False),
    ("nordlys-deposit-invoice", "deposit taken on the total incl. MVA",
     {"59,829.00": "74,786.25", "11,965.80": "14,957.25", "47,863.20": "59,829.00"}, False),
    ("nordlys-stock-allocation", "both RJ45 packs moved",
     {"$3 = $3 - 1; print; $3 = 1; ": ""}, False),
    ("nordlys-delivery-checklist", "the whole BOM, stock lines included",
     {"$7 ~ /^order/": "$7 ~ /^(order|stock)/"}, False),
    ("nordlys-cart-vs-bom", "the draft mount left in the cart",
     {'{"kind": "tool", "tool": "shop_remove_from_cart", "arguments": {"product_id": 27}},':
      ""}, False),
]


def _variant(task: Task, replacements: dict[str, str]) -> Task:
    """The task with its reference solution edited as text, in the order given."""
    text = (task.path / SOLUTION_FILE).read_text(encoding="utf-8")
    for old, new in replacements.items():
        assert old in text, old
        text = text.replace(old, new)
    solution = msgspec.json.decode(text.encode(), type=Solution)
    return dataclasses.replace(task, solution=solution)


@pytest.mark.parametrize(("task_id", "what", "replacements", "passes"), VARIANTS,
                         ids=[f"{v[0]}: {v[1]}" for v in VARIANTS])
def test_other_solutions_are_judged_on_their_content(env: Environment, task_id: str, what: str,
                                                     replacements: dict[str, str],
                                                     passes: bool) -> None:
    result = _rollout(env, _variant(load_task(TASKS / task_id), replacements), reference_agent())
    assert not result.verdict.errors, result.verdict.errors
    assert result.verdict.passed is passes, (what, _failed(result))


# --- the SDK's amount helper, which the verifiers share -----------------------------------


@functools.cache
def _sdk() -> ModuleType:
    """The SDK as a script imports it, loaded here without entering sys.modules."""
    spec = importlib.util.spec_from_file_location("awsdk", SDK_DIR / "awsdk.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("text", "amount", "found"), [
    ("Total NOK 59,829.00 incl. MVA", "59829.00", True),
    ("totalt 59 829,00 kr", "59829.00", True),
    ("kr 59.829,00", "59829.00", True),
    ("NOK 59829", "59829.00", True),
    ("NOK 59829.", "59829.00", True),
    ("NOK 59\u00a0829,00", "59829.00", True),
    ("NOK 59\u202f829,00", "59829.00", True),
    ("MVA: 2,812.50", "2812.50", True),
    ("1,234,567.00 in all", "1234567.00", True),
    ("450,-", "450.00", True),
    ("NOK 159,829.00", "59829.00", False),
    ("NOK 59,829.001", "59829.00", False),
    ("NOK 59,829.50", "59829.00", False),
    ("NOK 59,829.00", "59829.50", False),
    ("NOK 2,812.5", "2812.50", False),
    ("NOK 59829", "59829.50", False),
    ("", "59829.00", False),
    (None, "59829.00", False),
])
def test_has_amount_reads_amounts_however_they_are_grouped(text: str | None, amount: str,
                                                           found: bool) -> None:
    assert _sdk().has_amount(text, amount) is found


@pytest.mark.parametrize("amount", ["59829", "59,829.00", "59829.0", "5e3.00", ""])
def test_has_amount_refuses_an_amount_not_written_as_kroner_dot_ore(amount: str) -> None:
    with pytest.raises(ValueError, match=f"amount {amount!r} must be digits, a dot and two"):
        _sdk().has_amount("NOK 59829.00", amount)


def test_verifiers_take_the_amount_helper_from_the_sdk() -> None:
    """One helper in the SDK, none copied into a verifier folder to drift from it."""
    scripts = sorted(TASKS.glob("*/verifier/*.py"))
    assert any("awsdk.has_amount(" in path.read_text(encoding="utf-8") for path in scripts)
    assert [path for path in scripts if "def has_amount" in path.read_text(encoding="utf-8")
            or path.name == "_money.py"] == []
