"""Gates 1 and 5 of synthesized tasks, with a judge model: the real CodeJudge and
AgentJudge through litellm to the loopback server, whose scripted judge answers decide
from what they are shown (the code judge from the verifier's V, the agent judge from a
query it runs on the final world), and a replay of the judged run offline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from replay.engine import Worlds
from synth.runs import Settings, read_config, replay_run, synth_envs
from tests.support import synth_script
from tests.support.llm_server import serving

BORROW = "Borrow the book titled 'Dune'"
RETURN = "Return my loan of the book 'Neuromancer'"


def _code(when: dict[str, Any], verdict: str) -> dict[str, Any]:
    return {"when": {"has_tools": False, **when},
            "reply": {"content": json.dumps({"verdict": verdict, "reasoning": "scripted"})}}


def _verdict(verdict: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "verdict",
                            "arguments": {"verdict": verdict, "reasoning": "scripted"}}]}


def _agent(task: str, sql: str, done: str) -> list[dict[str, Any]]:
    """An agent judge that queries the final world, then decides from the rows."""
    return [
        {"when": {"has_tools": True, "any_contains": task, "last_role": "tool",
                  "last_contains": done}, "reply": _verdict("Completed")},
        {"when": {"has_tools": True, "any_contains": task, "last_role": "tool"},
         "reply": _verdict("Agent Error")},
        {"when": {"has_tools": True, "any_contains": task},
         "reply": {"tool_calls": [{"name": "query", "arguments": {
             "world": "final", "service": "awm", "sql": sql}}]}},
    ]


CONSISTENT = [
    _code({"any_contains": "V = 1 (", "last_contains": "NOT completed"}, "Completed"),
    _code({"any_contains": "V = 0 (", "last_contains": "actually completed"}, "Agent Error"),
    _code({"any_contains": "V = 1 ("}, "Completed"),
    _code({"any_contains": "## Verifier"}, "Agent Error"),
    *_agent(BORROW, "SELECT available FROM books WHERE id = 1", '"rows": [[0]]'),
    *_agent(RETURN, "SELECT returned FROM loans WHERE id = 2", '"rows": [[1]]'),
]
LENIENT = [_code({"any_contains": "## Verifier"}, "Completed"), *CONSISTENT]


def _run(tmp: Path, judge_rules: list[dict[str, Any]]) -> tuple[Path, Any]:
    (tmp / "scenarios.jsonl").write_text(synth_script.scenarios_line(), encoding="utf-8")
    with serving([*synth_script.rules(), *judge_rules]) as server:
        settings = Settings(model="openai/synth", judge_model="openai/judge",
                            api_base=server.url, api_key="x", concurrency=1)
        report = synth_envs(tmp / "run", settings, tmp / "scenarios.jsonl",
                            lambda: Worlds.open(tmp / "store", tmp / "cache"),
                            tasks_per_scenario=2)
    return tmp / "run", report


def _gates(report: Any) -> dict[str, dict[str, str]]:
    return {t.task_id: {g["gate"]: g["status"] for g in t.gates}
            for r in report.results for t in r.tasks}


def test_a_consistent_judge_runs_gates_1_and_5_and_the_tasks_are_accepted(
        tmp_path: Path) -> None:
    run, report = _run(tmp_path, CONSISTENT)
    gates = _gates(report)
    assert set(gates) == {"library-loans-01", "library-loans-02"}
    for statuses in gates.values():
        assert statuses == {"judge_consistency": "passed", "initially_unsatisfied": "passed",
                            "solvability": "passed", "difficulty": "passed",
                            "counterfactual_probe": "passed"}
    assert all(t.accepted for r in report.results for t in r.tasks)
    assert read_config(run).judge_model == "openai/judge"
    # The judges' calls are recorded with the run's: the judged run replays offline.
    replayed = replay_run(run)
    assert replayed.identical, replayed.differences


def test_a_lenient_judge_fails_gate_1_and_the_task_is_not_in_the_pack(tmp_path: Path) -> None:
    run, report = _run(tmp_path, LENIENT)
    gates = _gates(report)
    assert all(statuses["judge_consistency"] == "failed" for statuses in gates.values())
    assert not any(t.accepted for r in report.results for t in r.tasks)
    pack = run / "pack" / "run"
    assert json.loads((pack / "splits.json").read_text()) == {"eval": [], "rl": [], "sft": []}
    assert not any((pack / "tasks").iterdir())


@pytest.fixture(autouse=True)
def _api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLDCTL_LLM_API_KEY", "x")
