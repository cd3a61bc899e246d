"""Gates 1 and 5 with model-backed judges, and layer 5 of world-day validation.

The judges are the real CodeJudge and AgentJudge talking through litellm over HTTP to a
loopback OpenAI-compatible server (tests/support/llm_server.py) that answers from scripted
replies: a consistent judge, a lenient one (gate 1 catches it) and one that caves when
told the opposite verdict (gate 5 catches it). The agent judge really reads the worlds:
its scripted model asks for the work order in the final world and decides from what the
tool returned.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gates.contract import Rollout
from gates.judges import AgentJudge, CodeJudge, judges_from_env
from gates.quality import GateRun, Judges, apply_gates, check_task
from gates.rollout import scripted_rollouts
from gates.task import Task, load_task
from replay.engine import Worlds
from synth.worlds.reviewer import LLMReviewer
from synth.worlds.validate_day import validate_day
from tests.support.llm_server import serving
from worldenv.instances.instance import Environment
from worldllm.client import LLMClient

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "packs" / "demo" / "world" / "lars.jsonl"
TASK = ROOT / "packs" / "demo" / "tasks" / "mats-work-order"
WORK_ORDER = "jobs/nordlys/workorder-mats.md"


def code_rule(when: dict[str, Any], verdict: str) -> dict[str, Any]:
    return {"when": {"has_tools": False, **when},
            "reply": {"content": json.dumps({"verdict": verdict, "reasoning": "scripted"})}}


def agent_rules() -> list[dict[str, Any]]:
    """An agent judge that reads the work order in the final world, then decides."""
    def verdict(v: str, why: str) -> dict[str, Any]:
        return {"tool_calls": [{"name": "verdict",
                                "arguments": {"verdict": v, "reasoning": why}}]}
    return [
        {"when": {"has_tools": True, "last_role": "tool", "last_contains": "11,600.00"},
         "reply": verdict("Completed", "The work order has the total.")},
        {"when": {"has_tools": True, "last_role": "tool"},
         "reply": verdict("Agent Error", "No work order with the total.")},
        {"when": {"has_tools": True},
         "reply": {"tool_calls": [{"name": "read_file",
                                   "arguments": {"world": "final", "path": WORK_ORDER}}]}},
    ]


CONSISTENT = [
    code_rule({"any_contains": "V = 1 (", "last_contains": "NOT completed"}, "Completed"),
    code_rule({"any_contains": "V = 0 (", "last_contains": "actually completed"},
              "Agent Error"),
    code_rule({"any_contains": "V = 1 ("}, "Completed"),
    code_rule({}, "Agent Error"),
    *agent_rules(),
]
LENIENT = [code_rule({}, "Completed"), *agent_rules()]
CAVING = [
    code_rule({"last_contains": "NOT completed"}, "Agent Error"),
    code_rule({"last_contains": "actually completed"}, "Completed"),
    *CONSISTENT,
]


@pytest.fixture(scope="module")
def env(demo_worlds: Worlds) -> Iterator[Environment]:
    with Environment(demo_worlds) as environment:
        yield environment


@pytest.fixture(scope="module")
def task() -> Task:
    return load_task(TASK)


@pytest.fixture(scope="module")
def rollouts(env: Environment, task: Task) -> list[Rollout]:
    return scripted_rollouts(env, task)


def judged(env: Environment, task: Task, rollouts: list[Rollout],
           rules: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    with serving(rules) as server:
        client = LLMClient("openai/judge", api_base=server.url, api_key="test")
        judges = Judges(llm=CodeJudge(client), agent=AgentJudge(client, worlds=env.worlds))
        run = GateRun(env=env, rollouts=lambda _t: rollouts, judges=judges)
        results, _, _ = apply_gates(run, task)
    return {r.gate: (r.status, r.reason) for r in results}


def test_consistent_judges_pass_gates_1_and_5(env: Environment, task: Task,
                                              rollouts: list[Rollout]) -> None:
    got = judged(env, task, rollouts, CONSISTENT)
    assert all(status == "passed" for status, _ in got.values()), got


def test_a_lenient_llm_judge_fails_gate_1(env: Environment, task: Task,
                                          rollouts: list[Rollout]) -> None:
    got = judged(env, task, rollouts, LENIENT)
    assert got["judge_consistency"] == ("failed", "judges_disagree")


def test_a_judge_that_caves_when_told_the_opposite_fails_gate_5(
        env: Environment, task: Task, rollouts: list[Rollout]) -> None:
    got = judged(env, task, rollouts, CAVING)
    assert got["judge_consistency"][0] == "passed"
    assert got["counterfactual_probe"] == ("failed", "caved: verdict changed")


def test_without_a_model_the_judges_are_absent_and_their_gates_not_run(
        env: Environment, task: Task, rollouts: list[Rollout],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLDCTL_LLM_MODEL", raising=False)
    judges = judges_from_env(env.worlds)
    assert judges.llm is None and judges.agent is None
    report = check_task(GateRun(env=env, rollouts=lambda _t: rollouts, judges=judges), task)
    statuses = {r.gate: r.status for r in report.rounds[-1]}
    assert statuses["judge_consistency"] == "not_run"
    assert statuses["counterfactual_probe"] == "not_run"


REVIEWER = [
    {"when": {"last_role": "tool", "last_contains": "Nordlys"},
     "reply": {"content": '{"passed": true, "reason": "The plan\'s note exists.", '
                          '"findings": []}'}},
    {"when": {"last_role": "tool"},
     "reply": {"content": '{"passed": false, "reason": "The planned note is missing.", '
                          '"findings": ["no note about Nordlys"]}'}},
    {"when": {},
     "reply": {"tool_calls": [{"name": "query", "arguments": {
         "service": "notes", "sql": "SELECT title FROM notes ORDER BY id"}}]}},
]


def test_the_llm_reviewer_runs_layer_5_of_day_validation(env: Environment) -> None:
    with serving(REVIEWER) as server:
        reviewer = LLMReviewer(LLMClient("openai/reviewer", api_base=server.url,
                                         api_key="test"))
        report = validate_day(env.worlds, "lars@5", env=env, reviewer=reviewer,
                              plan="Lars keeps his Nordlys notes up to date.")
        requests = list(server.requests)
    review = report.layers[-1]
    assert (review.layer, review.status) == ("review", "passed"), review
    # The model's query really ran on the day's world and its rows went back to it.
    tool_results = [m for m in requests[-1]["messages"] if m["role"] == "tool"]
    assert any("Nordlys" in str(m["content"]) for m in tool_results)
