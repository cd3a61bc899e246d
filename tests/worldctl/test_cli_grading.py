"""The grading commands keep their promises: `rollout --json` carries what its table shows,
episodes can be listed by task and agent, `task check` says why a gate failed and takes
`--live-test-n`, and `validate-day` does not call a check that never ran "passed".
Stored data are checked through the library.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner, Result

from gates.contract import Rollout
from gates.rewards import wildawm_rollout_reward
from replay.engine import Worlds
from worldctl.main import cli
from worldenv.instances.episodes import load_episode

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "packs" / "demo" / "world" / "lars.jsonl"
TASK = ROOT / "packs" / "demo" / "tasks" / "mats-work-order"
TASK_ID = "mats-work-order"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="worldctl", catch_exceptions=False)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    location = str(tmp_path_factory.mktemp("grading") / "store")
    assert invoke("--store", location, "import", str(DEMO)).exit_code == 0
    return location


@pytest.fixture(scope="module")
def rollouts(store: str) -> list[dict[str, object]]:
    """Two scripted agents' rollouts, as `rollout --json` prints them."""
    printed = []
    for agent in ("scripted:reference", "scripted:answer-only"):
        result = invoke("--store", store, "rollout", str(TASK), "--agent", agent, "--json")
        assert result.exit_code == 0, result.stderr
        printed += json.loads(result.stdout)
    return printed


def test_rollout_json_carries_v_the_checks_and_the_reward(
        store: str, rollouts: list[dict[str, object]]) -> None:
    reference, answer_only = rollouts
    assert (reference["v"], answer_only["v"]) == (1, 0)
    with Worlds.open(store, create=False) as worlds:
        for item in rollouts:
            rollout = item["rollout"]
            assert isinstance(rollout, dict)
            episode = load_episode(worlds, str(rollout["episode_id"]))
            assert episode.task == TASK_ID and episode.agent == rollout["agent"]
    table = invoke("--store", store, "rollout", str(TASK), "--agent", "scripted:reference")
    row = next(line for line in table.stdout.splitlines() if line.startswith("0 "))
    cells = row.split()  # the hinted column is empty for an unhinted rollout
    assert cells[1] == "scripted:reference"
    assert cells[2:5] == [str(reference["v"]),
                          f"{reference['checks_passed']}/{reference['checks']}",
                          f"{reference['reward']:.3f}"]


def test_the_reward_printed_is_the_rollouts_wildawm_reward(
        rollouts: list[dict[str, object]]) -> None:
    for item in rollouts:
        graded = msgspec.convert(item["rollout"], Rollout)
        assert item["reward"] == wildawm_rollout_reward(graded)
        assert item["checks_passed"] == graded.verdict.satisfied
        assert item["v"] == int(graded.succeeded)


def test_episode_list_filters_by_task_and_agent(store: str,
                                                rollouts: list[dict[str, object]]) -> None:
    graded = [msgspec.convert(item["rollout"], Rollout) for item in rollouts]
    ids = {r.episode_id: r.agent for r in graded}
    listed = json.loads(invoke("--store", store, "episode", "list", "--json").stdout)
    assert set(ids) <= {e["episode_id"] for e in listed}
    of_task = json.loads(invoke("--store", store, "episode", "list", "--task", TASK_ID,
                                "--json").stdout)
    assert {e["episode_id"] for e in of_task} >= set(ids)
    assert all(e["task"] == TASK_ID for e in of_task)
    of_agent = json.loads(invoke("--store", store, "episode", "list", "--agent",
                                 "scripted:answer-only", "--json").stdout)
    assert [e["episode_id"] for e in of_agent] == [
        i for i, agent in ids.items() if agent == "scripted:answer-only"]
    assert all(e["agent"] == "scripted:answer-only" and e["n_calls"] == 0 for e in of_agent)
    none = json.loads(invoke("--store", store, "episode", "list", "--task", "no-such-task",
                             "--json").stdout)
    assert none == []
    plain = invoke("--store", store, "episode", "list", "--agent", "scripted:reference")
    assert "scripted:reference" in plain.stdout and TASK_ID in plain.stdout
    assert "scripted:answer-only" not in plain.stdout


def test_episode_show_names_the_task_and_agent(store: str,
                                               rollouts: list[dict[str, object]]) -> None:
    rollout = rollouts[0]["rollout"]
    assert isinstance(rollout, dict)
    shown = json.loads(invoke("--store", store, "episode", "show",
                              str(rollout["episode_id"]), "--json").stdout)
    assert (shown["task"], shown["agent"]) == (TASK_ID, "scripted:reference")
    turns = rollout["trajectory"]["turns"]
    assert isinstance(turns, list)
    assert shown["n_errors"] == 0
    assert shown["n_calls"] == sum(1 for t in turns if t["step"]["kind"] != "answer")


def test_task_check_says_why_a_gate_failed(store: str, tmp_path: Path) -> None:
    given = tmp_path / "two.json"
    result = invoke("--store", store, "rollout", str(TASK), "-n", "2", "--out", str(given))
    assert result.exit_code == 0, result.stderr
    result = invoke("--store", store, "task", "check", str(TASK), "--rollouts", str(given))
    assert result.exit_code == 1
    line = next(ln for ln in result.stdout.splitlines() if "4. difficulty" in ln)
    assert "failed" in line and "wrong_rollout_count: needs 3 unhinted rollouts, got 2" in line


def test_live_test_n_is_an_option(store: str, tmp_path: Path) -> None:
    given = tmp_path / "two.json"
    assert invoke("--store", store, "rollout", str(TASK), "-n", "2", "--out",
                  str(given)).exit_code == 0
    result = invoke("--store", store, "task", "check", str(TASK), "--rollouts", str(given),
                    "--live-test-n", "2", "--json")
    report = json.loads(result.stdout)
    (difficulty,) = [g for g in report["rounds"][-1] if g["gate"] == "difficulty"]
    # The gate now wants the two unhinted rollouts it is given (both reference runs, both
    # successful: k = 2, "medium"), where with the default of 3 it refused them.
    assert difficulty["evidence"]["live_test_n"] == 2
    assert (difficulty["status"], difficulty["reason"]) == ("passed", "k = 2 of 2: medium")
    plain = invoke("--store", store, "task", "check", str(TASK), "--rollouts", str(given),
                   "--live-test-n", "2")
    assert "4. difficulty             passed   k = 2 of 2: medium" in plain.stdout
    bad = CliRunner().invoke(cli, ["--store", store, "task", "check", str(TASK),
                                   "--live-test-n", "1"])
    assert bad.exit_code == 2 and "live_test_n = 1" in bad.stderr


UNPINNED = (b'{"persona":"una","day":0,"ts":"2026-03-02T08:00:00Z","type":"sql",'
            b'"service":"notes","sql":"CREATE TABLE notes(id INTEGER PRIMARY KEY, t TEXT)"}\n')


def test_validate_day_without_app_pins_has_nothing_to_check(store: str,
                                                           tmp_path: Path) -> None:
    log = tmp_path / "una.jsonl"
    log.write_bytes(UNPINNED)
    assert invoke("--store", store, "import", str(log)).exit_code == 0
    result = invoke("--store", store, "validate-day", "una@0", "--json")
    assert result.exit_code == 0, result.stdout
    health = next(layer for layer in json.loads(result.stdout)["layers"]
                  if layer["layer"] == "health")
    assert health["status"] == "not_run"
    assert health["reason"].startswith("nothing to check: una@0 pins no apps")
    plain = invoke("--store", store, "validate-day", "una@0").stdout
    assert "health" in plain and "not_run" in plain and "nothing to check" in plain
    pinned = json.loads(invoke("--store", store, "validate-day", "lars@5", "--json").stdout)
    assert next(layer for layer in pinned["layers"]
                if layer["layer"] == "health")["status"] == "passed"
