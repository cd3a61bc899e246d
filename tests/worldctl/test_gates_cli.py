"""The grading commands of worldctl, run through click on a real store."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from worldctl.main import cli

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "packs" / "demo" / "world" / "lars.jsonl"
TASK = ROOT / "packs" / "demo" / "tasks" / "mats-work-order"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    location = str(tmp_path_factory.mktemp("cli") / "store")
    result = CliRunner().invoke(cli, ["--store", location, "import", str(DEMO)])
    assert result.exit_code == 0, result.output
    return location


def run(store: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--store", store, *args], catch_exceptions=False)
    return result.exit_code, result.output


def test_rollout_then_check_with_given_rollouts_then_verify_an_episode(store: str,
                                                                       tmp_path: Path) -> None:
    out_file = tmp_path / "rollouts.json"
    code, _ = run(store, "rollout", str(TASK), "--agent", "scripted:reference", "-n", "2",
                  "--hinted", "1", "--out", str(out_file))
    assert code == 0
    rollouts = json.loads(out_file.read_text())
    assert [r["hinted"] for r in rollouts] == [False, True]
    assert all(r["interfaces_used"] == ["mcp", "shell"] for r in rollouts)

    # Given rollouts: only reference runs, 1 unhinted instead of 3 -> gate 4 refuses.
    code, output = run(store, "task", "check", str(TASK), "--rollouts", str(out_file))
    assert code == 1
    assert "difficulty" in output and "wrong_rollout_count" in output

    code, output = run(store, "task", "verify", str(TASK), "--episode",
                       rollouts[0]["episode_id"])
    assert code == 0 and output.strip().endswith("V = 1 (14/14 checks)"), output
    code, output = run(store, "task", "verify", str(TASK), "--episode",
                       rollouts[0]["episode_id"], "--answer", "")
    assert code == 1 and "V = 0" in output


def test_task_check_accepts_a_demo_task_and_writes_its_report(store: str,
                                                              tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    code, output = run(store, "task", "check", str(TASK), "--report", str(report))
    assert code == 0, output
    assert "ACCEPTED (hard) by the gates that ran; not run: judge_consistency, " \
           "counterfactual_probe" in output
    data = json.loads(report.read_text())
    assert data["accepted"] is True and data["difficulty"] == "hard"


def test_a_broken_task_folder_is_refused_naming_file_and_field(store: str,
                                                               tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(TASK, broken)
    spec = json.loads((broken / "task.json").read_text())
    spec["subtasks"][1]["interface"] = "telepathy"
    (broken / "task.json").write_text(json.dumps(spec))
    code, output = run(store, "task", "check", str(broken))
    assert code == 2
    assert "task.json" in output and "subtasks[1].interface" in output


def test_validate_day_reports_every_layer(store: str) -> None:
    code, output = run(store, "validate-day", "lars@5", "--json")
    assert code == 0, output
    layers = json.loads(output)["layers"]
    assert [(layer["layer"], layer["status"]) for layer in layers] == [
        ("lint", "passed"), ("replay", "passed"), ("declarations", "not_run"),
        ("health", "passed"), ("review", "not_run")]


def test_an_unknown_agent_is_refused(store: str) -> None:
    result = CliRunner().invoke(cli, ["--store", store, "rollout", str(TASK), "--agent",
                                      "scripted:genius"])
    assert result.exit_code != 0
    assert "genius" in result.output
