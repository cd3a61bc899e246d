"""`worldctl eval run` end to end: scripted agents on the demo tasks with known outcomes,
the LLM agent through litellm's real call path against the loopback server, the results
contract, lost trials counted, and a run killed with SIGKILL resuming where it stopped.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from eval.contract import decode_results
from eval.runner import TRIALS_DIR
from packs.registry import load_pack
from replay.engine import Worlds
from tests.support.cli_harness import invoke, refused
from tests.support.llm_server import FIXTURES, load_script, serving
from worldenv.instances.episodes import load_episode

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "packs" / "demo" / "world" / "lars.jsonl"
TASKS = ROOT / "packs" / "demo" / "tasks"
EVAL_SPLIT = ["nordlys-delivery-checklist", "sagene-easter-quote",
              "sjoboden-bar-surge-protectors"]




@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    location = str(tmp_path_factory.mktemp("eval") / "store")
    assert invoke("--store", location, "import", *map(str, load_pack("demo").worlds)
                  ).exit_code == 0
    return location


def run_json(store: str, out: Path, *args: str, env: dict[str, str] | None = None
             ) -> dict[str, Any]:
    result = invoke("--store", store, "eval", "run", *args, "--out", str(out), "--json",
                    env=env)
    assert result.exit_code == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    assert (out / "results.json").read_bytes() == result.stdout_bytes
    return data


def test_the_reference_passes_every_trial_and_nothing_none(store: str,
                                                           tmp_path: Path) -> None:
    good = run_json(store, tmp_path / "ref", "demo", "--agent", "scripted:reference", "-k", "2")
    assert sorted(good) == ["metrics", "run", "tasks"]
    assert [t["task_id"] for t in good["tasks"]] == EVAL_SPLIT
    trial = good["tasks"][0]["trials"][0]
    assert sorted(trial) == sorted([
        "trial", "episode_id", "success", "V", "reward", "checks", "steps",
        "interfaces_used", "actions", "termination", "format_error", "env_error",
        "tokens_in", "tokens_out", "cost", "seconds", "error"])
    assert all(t["success"] and t["V"] == 1 and t["reward"] == 1.0
               for task in good["tasks"] for t in task["trials"])
    assert good["metrics"]["success_rate"] == 1.0
    assert good["metrics"]["pass@k"] == {"1": 1.0, "2": 1.0}
    assert good["metrics"]["pass^k"] == {"1": 1.0, "2": 1.0}
    assert trial["interfaces_used"] == ["mcp", "shell"] and "shell" in trial["actions"]
    # every trial's episode is stored and is the task's
    worlds = Worlds.open(store)
    try:
        episode = load_episode(worlds, trial["episode_id"])
    finally:
        worlds.close()
    assert episode.task == EVAL_SPLIT[0]

    bad = run_json(store, tmp_path / "nothing", "demo", "--agent", "scripted:nothing",
                   "-k", "2")
    assert bad["metrics"]["success_rate"] == 0.0
    assert bad["metrics"]["pass@k"] == {"1": 0.0, "2": 0.0}
    rewards = [t["reward"] for task in bad["tasks"] for t in task["trials"]]
    assert all(0.0 <= r < 0.1 for r in rewards)  # only the checklist's partial credit
    assert bad["metrics"]["avg_reward"] == pytest.approx(sum(rewards) / len(rewards), abs=1e-6)


def test_a_trial_lost_to_the_infrastructure_is_counted_never_dropped(
        store: str, tmp_path: Path) -> None:
    """A task whose verifier crashes has no verdict in any trial: they are environment
    errors, counted in every denominator (pass^1 is not read from the other task)."""
    broken = tmp_path / "tasks" / "broken"
    shutil.copytree(TASKS / EVAL_SPLIT[0], broken)
    spec = json.loads((broken / "task.json").read_text())
    spec["task_id"] = "broken"
    (broken / "task.json").write_text(json.dumps(spec))
    (broken / "verifier" / "checklist.py").write_text("raise SystemExit(3)\n")
    data = run_json(store, tmp_path / "run", str(TASKS / EVAL_SPLIT[0]), str(broken),
                    "--agent", "scripted:reference", "-k", "2")
    lost = [t for task in data["tasks"] for t in task["trials"] if t["env_error"]]
    assert len(lost) == 2 and all(t["reward"] is None and t["error"] for t in lost)
    assert data["metrics"]["trials_lost"] == 2
    assert data["metrics"]["success_rate"] == 0.5
    assert data["metrics"]["pass^k"]["1"] == 0.5
    # Lost trials measured nothing: once the verifier is repaired, the same run folder
    # runs them again instead of reading them back.
    shutil.copyfile(TASKS / EVAL_SPLIT[0] / "verifier" / "checklist.py",
                    broken / "verifier" / "checklist.py")
    again = run_json(store, tmp_path / "run", str(TASKS / EVAL_SPLIT[0]), str(broken),
                     "--agent", "scripted:reference", "-k", "2")
    assert again["metrics"]["trials_lost"] == 0 and again["metrics"]["success_rate"] == 1.0
    assert [t["task_id"] for t in again["tasks"]] == ["broken", EVAL_SPLIT[0]]
    assert again["tasks"][1]["trials"] == data["tasks"][1]["trials"]  # finished: kept


def test_a_run_whose_every_trial_is_lost_to_one_error_fails(
        store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An LLM agent with no API key (litellm's real path refuses before any request):
    every trial lost to the same error is one error line, exit 2, no results; the same
    command once the key is given runs the lost trials again and passes."""
    for key in ("WORLDCTL_LLM_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    out = tmp_path / "llm"
    with Worlds.open(store) as worlds:
        episodes = len(worlds.store.episodes())
    with serving(load_script("agent_solves")) as server:
        args = ["--store", store, "eval", "run", str(FIXTURES / "fjellrommet-title"),
                "--agent", "llm:openai/scripted", "--api-base", server.url, "-k", "2",
                "--out", str(out)]
        line = refused(invoke(*args))
        assert "all 2 trials were lost to the same error" in line
        assert "Missing credentials" in line and f"--out {out}" in line
        assert not server.requests and not (out / "results.json").exists()
        with Worlds.open(store) as worlds:
            assert len(worlds.store.episodes()) == episodes  # nothing stored
        monkeypatch.setenv("WORLDCTL_LLM_API_KEY", "sk-loopback")
        data = run_json(store, out, *args[4:-2])
    assert [t["success"] for t in data["tasks"][0]["trials"]] == [True, True]
    assert data["metrics"]["trials_lost"] == 0 and len(server.requests) == 2 * 3


def test_a_dead_model_endpoint_fails_the_run(store: str, tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on once the probe is closed
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}/v1"
    line = refused(invoke(
        "--store", store, "eval", "run", str(FIXTURES / "fjellrommet-title"), "--agent",
        "llm:openai/scripted", "--api-base", dead, "-k", "1", "--out", str(tmp_path / "run"),
        env={"WORLDCTL_LLM_API_KEY": "sk-loopback", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}))
    assert "its one trial was lost" in line and f"at {dead} failed" in line
    assert not (tmp_path / "run" / "results.json").exists()


def test_scripted_replays_of_a_task_without_a_solution_are_refused(
        store: str, tmp_path: Path) -> None:
    bare = tmp_path / "tasks" / "bare"
    shutil.copytree(TASKS / EVAL_SPLIT[0], bare)
    (bare / "solution.json").unlink()
    spec = json.loads((bare / "task.json").read_text())
    spec["task_id"], spec["absent"] = "bare", ["solution"]
    (bare / "task.json").write_text(json.dumps(spec))
    line = refused(invoke("--store", store, "eval", "run", str(bare), "--agent",
                          "scripted:first-half", "--out", str(tmp_path / "run")))
    assert "task 'bare' has no reference solution" in line
    data = run_json(store, tmp_path / "nothing", str(bare), "--agent", "scripted:nothing",
                    "-k", "1")
    assert data["metrics"]["trials"] == 1


def test_a_task_whose_world_is_not_in_the_store_is_refused_before_any_trial(
        store: str, tmp_path: Path) -> None:
    stale = tmp_path / "tasks" / "stale"
    shutil.copytree(TASKS / EVAL_SPLIT[0], stale)
    spec = json.loads((stale / "task.json").read_text())
    spec["task_id"], spec["world_hash"] = "stale", "0" * 32
    (stale / "task.json").write_text(json.dumps(spec))
    out = tmp_path / "run"
    line = refused(invoke("--store", store, "eval", "run", str(stale), "--agent",
                          "scripted:reference", "--out", str(out)))
    assert "task 'stale' cannot be run on this store" in line and "world hash" in line
    assert not out.exists()


def test_the_llm_agent_through_litellm_and_the_loopback_server(store: str,
                                                               tmp_path: Path) -> None:
    with serving(load_script("agent_solves")) as server:
        env = {"WORLDCTL_LLM_API_KEY": "sk-loopback", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        data = run_json(store, tmp_path / "llm", str(FIXTURES / "fjellrommet-title"),
                        "--agent", "llm:openai/scripted", "--api-base", server.url, "-k", "2",
                        env=env)
    trials = data["tasks"][0]["trials"]
    assert [t["success"] for t in trials] == [True, True]
    assert data["run"]["model"] == "openai/scripted"
    assert all(t["tokens_in"] > 0 and t["tokens_out"] > 0 for t in trials)
    assert all(t["cost"] is None for t in trials)  # a loopback model has no price
    assert trials[0]["actions"] == ["mcp", "shell"]
    assert len(server.requests) == 2 * 3  # three model steps a trial


def test_refusals_are_one_error_line(store: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    run_json(store, out, str(TASKS / EVAL_SPLIT[0]), "--agent", "scripted:nothing", "-k", "1")
    line = refused(invoke("--store", store, "eval", "run", str(TASKS / EVAL_SPLIT[0]),
                          "--agent", "scripted:reference", "-k", "1", "--out", str(out)))
    assert "this folder holds run" in line and "use another --out" in line
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert "not empty and not a run folder" in refused(invoke(
        "--store", store, "eval", "run", "demo", "--agent", "scripted:nothing",
        "--out", str(other)))
    assert (other / "notes.txt").read_text() == "mine"
    assert "unknown scripted agent" in refused(invoke(
        "--store", store, "eval", "run", "demo", "--agent", "scripted:genius"))
    assert "no pack named 'nopack'" in refused(invoke(
        "--store", store, "eval", "run", "nopack", "--agent", "scripted:nothing"))


def test_a_run_killed_with_sigkill_resumes_where_it_stopped(store: str,
                                                            tmp_path: Path) -> None:
    """Kill the run after its first trial file appears; running it again runs only the
    missing trials; the results equal an uninterrupted run's (scripted trials are
    deterministic: the same episodes), and a rerun of the finished folder rewrites the
    same results file byte for byte."""
    whole = run_json(store, tmp_path / "whole", "demo", "--agent", "scripted:reference",
                     "-k", "2")
    out = tmp_path / "killed"
    command = [sys.executable, "-m", "worldctl.main", "--store", store, "eval", "run", "demo",
               "--agent", "scripted:reference", "-k", "2", "--out", str(out)]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if list((out / TRIALS_DIR).glob("*.json")) if (out / TRIALS_DIR).exists() else []:
            break
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = sorted(p.name for p in (out / TRIALS_DIR).glob("*.json"))
    trials = 2 * len(EVAL_SPLIT)
    assert 1 <= len(before) < trials, before
    kept = {p: (out / TRIALS_DIR / p).read_bytes() for p in before}
    resumed = run_json(store, out, "demo", "--agent", "scripted:reference", "-k", "2")
    assert {p: (out / TRIALS_DIR / p).read_bytes() for p in before} == kept  # not re-run
    assert len(list((out / TRIALS_DIR).glob("*.json"))) == trials
    assert not list(out.rglob("*.partial"))

    def deterministic(data: dict[str, Any]) -> list[Any]:
        return [[{k: v for k, v in t.items() if k != "seconds"} for t in task["trials"]]
                for task in data["tasks"]]

    assert deterministic(resumed) == deterministic(whole)
    first = (out / "results.json").read_bytes()
    again = run_json(store, out, "demo", "--agent", "scripted:reference", "-k", "2")
    assert (out / "results.json").read_bytes() == first
    assert decode_results(first).run == decode_results(json.dumps(again).encode()).run


def test_report_and_compare_through_the_cli(store: str, tmp_path: Path) -> None:
    ref, nothing = tmp_path / "ref", tmp_path / "nothing"
    run_json(store, ref, "demo", "--agent", "scripted:reference", "-k", "2")
    run_json(store, nothing, "demo", "--agent", "scripted:nothing", "-k", "2")
    shown = invoke("eval", "report", str(ref))
    assert shown.exit_code == 0, shown.stderr
    written = shown.stdout.split()
    assert written[:4] == [str(ref / n) for n in ("report.md", "report.html", "trials.csv",
                                                  "trials.parquet")]
    assert all(Path(p).is_file() for p in written)
    assert "100.0%" in (ref / "report.md").read_text()
    html, md = tmp_path / "c.html", tmp_path / "c.md"
    compared = invoke("eval", "compare", str(nothing), str(ref), "--html", str(html),
                      "--md", str(md))
    assert compared.exit_code == 0, compared.stderr
    [success] = [line for line in compared.stdout.splitlines() if "success_rate" in line]
    # all three tasks differ, yet three are too few to call it (eval.metrics.min_tasks)
    assert "0.000 -> 1.000" in success
    assert success.endswith(": too few tasks for a verdict (n=3)"), success
    assert html.is_file() and md.is_file()
    assert "at least two run folders" in refused(invoke("eval", "compare", str(ref)))
    assert "results.json" in refused(invoke("eval", "report", str(tmp_path)))
