"""Synthesis runs through the real CLI (``worldctl synth ...``) against the loopback
OpenAI-compatible server (real HTTP via litellm), a real SQLite store and real sandboxes:
one recorded run of the scripted scenario library_loans (tests/support/synth_script.py), with a
failure at every stage, shared by the tests; `synth funnel` on it; its offline replay;
resuming after kill -9; the token budget; no model; and the refusals."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from gates.task import load_task, task_folders
from packs.registry import load_pack
from replay.engine import Worlds
from synth.runs import compare_runs
from tests.support import synth_script
from tests.support.cli_harness import invoke, refused
from tests.support.llm_server import serving

ROOT = Path(__file__).resolve().parents[2]
WORLDCTL = Path(sys.executable).parent / "worldctl"
MODEL = "openai/loopback"


pytestmark = pytest.mark.usefixtures("loopback_env")




def envs_args(store: Path, scenarios: Path, run: Path, url: str, *extra: str) -> list[str]:
    return ["--store", str(store), "synth", "envs", "--scenarios", str(scenarios),
            "--run", str(run), "--model", MODEL, "--api-base", url,
            "--tasks-per-scenario", "2", *extra]


def scenarios_file(folder: Path) -> Path:
    path = folder / "scenarios.jsonl"
    path.write_text(synth_script.scenarios_line(), encoding="utf-8")
    return path


def world_hash_of(run: Path) -> str:
    report = json.loads((run / "worlds" / "library_loans.json").read_text(encoding="utf-8"))
    return str(report["world_hash"])


@dataclass
class Recorded:
    root: Path
    run: Path
    store: Path
    scenarios: Path
    result: Result
    requests: int  # chat requests a whole run makes


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    root = tmp_path_factory.mktemp("synth-run")
    scenarios = scenarios_file(root)
    run, store = root / "run", root / "store.sqlite"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WORLDCTL_LLM_API_KEY", "x")
        mp.delenv("WORLDCTL_LLM_MODEL", raising=False)
        with serving(synth_script.rules()) as server:
            result = invoke(*envs_args(store, scenarios, run, server.url))
            requests = len(server.requests)
    yield Recorded(root, run, store, scenarios, result, requests)


def log_lines(run: Path) -> list[dict[str, Any]]:
    text = (run / "log" / "library_loans.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def attempts(lines: list[dict[str, Any]], stage: str,
             subject: str = "library_loans") -> list[dict[str, Any]]:
    found = [x for x in lines if x["stage"] == stage and x["subject"] == subject]
    return sorted(found, key=lambda x: x["attempt"])


# --- 1. the recorded run --------------------------------------------------------------


def test_the_run_builds_the_world(recorded: Recorded) -> None:
    result = recorded.result
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    world_hash = world_hash_of(recorded.run)
    assert f"library_loans: world library_loans@0 {world_hash}" in result.stdout
    assert "2/2 tasks verified, 2 accepted" in result.stdout
    with Worlds.open(recorded.store, create=False) as worlds:
        day = worlds.resolve("library_loans@0")
    assert (day.persona, day.day, day.world_hash) == ("library_loans", 0, world_hash)
    assert recorded.requests > 0


def test_the_log_shows_every_self_correction(recorded: Recorded) -> None:
    lines = log_lines(recorded.run)

    schema = attempts(lines, "schema")
    assert [a["attempt"] for a in schema] == [1, 2]
    assert any("CREAT" in e and "loans" in e for e in schema[0]["errors"]), schema[0]["errors"]
    assert not schema[0]["kept"] and schema[1]["kept"] and schema[1]["errors"] == []

    data = attempts(lines, "data")
    assert [a["attempt"] for a in data] == [1, 2] and data[1]["kept"]
    assert any("FOREIGN KEY" in e for e in data[0]["errors"]), data[0]["errors"]

    code = attempts(lines, "code")
    assert [a["attempt"] for a in code] == [1, 2] and code[1]["kept"]
    assert any("does not load" in e and "fails on import" in e
               for e in code[0]["errors"]), code[0]["errors"]

    first = attempts(lines, "verifier", "library-loans-01")
    assert [a["attempt"] for a in first] == [1, 2] and first[1]["kept"]
    assert any("V = 0 at W0" in e for e in first[0]["errors"]), first[0]["errors"]

    # attempt 2 checks only the answer: stage 6 accepts it, the gates find it too easy,
    # and their reviser asks the verifier stage again with why
    assert "answer_names_dune" in first[1]["output"]["verifier"]
    revision = attempts(lines, "verifier", "library-loans-01/revision-1")
    assert [a["attempt"] for a in revision] == [1] and revision[0]["kept"]
    assert "dune_borrowed" in revision[0]["output"]["verifier"]
    result = json.loads((recorded.run / "envs" / "library_loans.json").read_text())
    by_task = {t["task_id"]: t for t in result["tasks"]}
    assert by_task["library-loans-01"]["revisions"] == 1
    assert by_task["library-loans-02"]["revisions"] == 0
    assert all(t["accepted"] for t in by_task.values())

    second = attempts(lines, "verifier", "library-loans-02")
    assert [a["attempt"] for a in second] == [1, 2] and second[1]["kept"]
    assert any("checks fail after the reference solution" in e
               for e in second[0]["errors"]), second[0]["errors"]

    spec, tasks = attempts(lines, "spec"), attempts(lines, "tasks")
    assert len(spec) == 1 and len(tasks) == 1 and spec[0]["kept"] and tasks[0]["kept"]

    failed = [x for x in lines if x["errors"]]
    assert len(failed) == 5
    assert all(isinstance(x["summary"], str) and x["summary"].strip() for x in failed)


def test_the_summary_and_the_pack(recorded: Recorded) -> None:
    summary = json.loads((recorded.run / "summary.json").read_text(encoding="utf-8"))
    rows = {row["stage"]: row for row in summary["stages"]}
    assert list(rows) == ["tasks", "schema", "data", "spec", "code", "verifier"]
    assert all(row["success_rate"] == 1.0 for row in rows.values()), rows
    assert rows["schema"]["mean_corrections"] == 1.0
    assert rows["data"]["mean_corrections"] == 1.0
    assert rows["code"]["mean_corrections"] == 1.0
    # two tasks and one revision by the gates' reviser: corrections 1, 1 and 0
    assert rows["verifier"]["ran"] == 3
    assert rows["verifier"]["mean_corrections"] == round(2 / 3, 4)
    assert rows["spec"]["mean_corrections"] == 0.0
    assert rows["tasks"]["mean_corrections"] == 0.0
    assert summary["envs_built"] == 1 and summary["tasks_verified"] == 2

    pack_root = recorded.run / "pack" / recorded.run.name
    pack = load_pack(str(pack_root))
    assert set(pack.tasks) == {"library-loans-01", "library-loans-02"}
    assert [w.name for w in pack.worlds] == ["library_loans.jsonl"]
    for name in pack.tasks:
        task = load_task(pack.task_dir(name))
        assert task is not None
    covered = [t for names in pack.splits.values() for t in names]
    assert sorted(covered) == sorted(pack.tasks)


def test_funnel_of_an_environment_run_shows_its_stages(recorded: Recorded) -> None:
    # `synth funnel` on a run of `synth envs`: the run's stage counts, not a task funnel of
    # zeros.
    run = recorded.run
    text = invoke("synth", "funnel", str(run))
    assert text.exit_code == 0, text.output
    first, *table = text.stdout.splitlines()
    assert first == (f"{run} is an environment run (synth envs): its stages; the task "
                     "funnel is for the tasks of `synth tasks` on a persona run")
    assert "candidates 0" not in text.stdout
    found = json.loads(invoke("synth", "funnel", str(run), "--json").stdout)
    assert found["kind"] == "envs" and found["run"] == str(run)
    stages = {row["stage"]: row["ran"] for row in found["summary"]["stages"]}
    assert stages["tasks"] >= 1 and sum(stages.values()) > 0, stages
    # the table is the one `synth envs` ends with, one row per stage
    assert [line.split()[0] for line in table[2:2 + len(stages)]] == list(stages)


def test_the_pack_is_what_eval_and_rl_read(recorded: Recorded, tmp_path: Path) -> None:
    pack_root = recorded.run / "pack" / recorded.run.name
    assert [p.name for p in task_folders(str(pack_root))] == [
        "library-loans-01", "library-loans-02"]
    store = str(recorded.store)
    evaluated = invoke("--store", store, "eval", "run", str(pack_root), "--split", "rl",
                       "--agent", "scripted:reference", "-k", "1", "--out",
                       str(tmp_path / "eval"))
    assert evaluated.exit_code == 0, evaluated.output
    assert "success 100.0 %" in evaluated.stdout
    dataset = invoke("--store", store, "rl", "dataset", str(pack_root), "--split", "rl",
                     "--out", str(tmp_path / "train.parquet"))
    assert dataset.exit_code == 0, dataset.output
    assert "2 rows" in dataset.stdout


# --- 2. offline replay ----------------------------------------------------------------


def test_replay_is_offline_and_identical(recorded: Recorded, tmp_path: Path) -> None:
    # The server of the recorded run is stopped: a replay that asked the network fails.
    result = invoke("synth", "replay", str(recorded.run))
    assert result.exit_code == 0, result.output
    assert "all identical" in result.stdout
    assert world_hash_of(recorded.run) in result.stdout

    out = tmp_path / "replayed"
    kept = invoke("synth", "replay", str(recorded.run), "--out", str(out))
    assert kept.exit_code == 0, kept.output
    assert world_hash_of(out) == world_hash_of(recorded.run)


def test_a_tampered_recording_is_found(recorded: Recorded, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(recorded.run, copy)
    target = None
    for path in sorted((copy / "recordings").glob("*.json")):
        body = json.loads(path.read_text(encoding="utf-8"))
        if "synth prompt spec@v1" in json.dumps(body["request"]):
            target = path
            break
    assert target is not None
    spec = json.loads(body["response"]["text"])
    spec["tools"][0]["summary"] = "Search the catalogue by title (tampered)"
    body["response"]["text"] = json.dumps(spec)
    target.write_text(json.dumps(body, indent=2), encoding="utf-8")

    result = invoke("synth", "replay", str(copy))
    assert "Traceback" not in result.output
    assert result.exit_code == 1, result.output
    assert "differ" in result.stdout
    # the changed spec asks the code stage something never recorded: the replay says so
    assert "the replay stopped at library_loans: stopped: no recording" in result.stdout
    assert any(line.strip().startswith(("outputs/", "log/", "worlds/", "envs/", "pack/"))
               and (": differs" in line or "not in the" in line)
               for line in result.stdout.splitlines()), result.stdout


# --- 3. resume after kill -9 ----------------------------------------------------------


def test_resume_after_kill(recorded: Recorded, tmp_path: Path) -> None:
    scenarios = scenarios_file(tmp_path)
    run, store = tmp_path / "run", tmp_path / "store.sqlite"
    env = {**os.environ, "WORLDCTL_LLM_API_KEY": "x"}
    env.pop("WORLDCTL_LLM_MODEL", None)
    with serving(synth_script.rules()) as server:
        args = envs_args(store, scenarios, run, server.url)
        proc = subprocess.Popen([str(WORLDCTL), *args], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                schema = run / "outputs" / "schema"
                if schema.is_dir() and any(schema.glob("*.json")):
                    break
                assert proc.poll() is None, "the run ended before the schema stage was done"
                time.sleep(0.02)
            else:
                pytest.fail("no schema outcome within 60 s")
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        assert not (run / "summary.json").exists()

        before = len(server.requests)
        result = invoke(*args)
        second = len(server.requests) - before
        assert result.exit_code == 0, result.output
        assert world_hash_of(run) == world_hash_of(recorded.run)
        assert f"library_loans@0 {world_hash_of(recorded.run)}" in result.stdout
        assert 0 < second < recorded.requests, (second, recorded.requests)
        # The resumed run is the run a whole one makes: the command recorded once, and
        # every compared file (outputs, log, worlds, envs, pack, summary) byte for byte.
        assert len(json.loads((run / "run.json").read_text(encoding="utf-8"))["commands"]) == 1
        assert compare_runs(recorded.run, run)[0] == []

        before = len(server.requests)
        again = invoke(*args)
        assert again.exit_code == 0, again.output
        assert len(server.requests) == before


# --- 4. the budget --------------------------------------------------------------------


def test_the_token_budget_stops_and_resumes(recorded: Recorded, tmp_path: Path) -> None:
    scenarios = scenarios_file(tmp_path)
    run, store = tmp_path / "run", tmp_path / "store.sqlite"
    with serving(synth_script.rules()) as server:
        args = envs_args(store, scenarios, run, server.url)
        result = invoke(*args, "--budget-tokens", "200")
        assert "Traceback" not in result.output
        assert result.exit_code == 1, result.output
        stopped = [line for line in result.stdout.splitlines() if line.startswith("stopped:")]
        assert stopped and "token budget" in stopped[0], result.stdout

        found = invoke("synth", "status", str(run))
        assert found.exit_code == 0, found.output
        rows = [line.split()[0] for line in found.stdout.splitlines() if line.strip()]
        assert "tasks" in rows, found.stdout

        done = invoke(*args)
        assert done.exit_code == 0, done.output
    assert world_hash_of(run) == world_hash_of(recorded.run)
    # the resumed run made the same outputs as the run made in one go
    assert compare_runs(recorded.run, run)[0] == []


# --- 5. no model ----------------------------------------------------------------------


def test_no_model_runs_nothing(tmp_path: Path) -> None:
    scenarios = scenarios_file(tmp_path)
    run = tmp_path / "run"
    result = invoke("--store", str(tmp_path / "store.sqlite"), "synth", "envs",
                    "--scenarios", str(scenarios), "--run", str(run))
    assert "synth envs: no model to synthesize with" in refused(result)
    assert not run.exists() and not (tmp_path / "store.sqlite").exists()

    seeds = ROOT / "synth" / "seeds" / "seed_scenario.jsonl"
    other = tmp_path / "scen-run"
    found = invoke("synth", "scenarios", "--seeds", str(seeds), "-n", "3", "--run", str(other))
    assert "synth scenarios: no model to synthesize with" in refused(found)
    assert not (other / "run.json").exists()


# --- 6. refusals ----------------------------------------------------------------------


def test_refusals(recorded: Recorded, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(synth_script.scenarios_line() + "{not json\n", encoding="utf-8")
    line = refused(invoke("--store", str(tmp_path / "s.sqlite"), "synth", "envs",
                          "--scenarios", str(bad), "--run", str(tmp_path / "r"),
                          "--model", MODEL, "--api-base", "http://127.0.0.1:9/v1"))
    assert f"{bad}:2" in line
    # refused before anything is made: neither the store nor the run folder
    assert not (tmp_path / "s.sqlite").exists() and not (tmp_path / "r").exists()

    unreachable = "postgresql://nobody@127.0.0.1:1/none"
    line = refused(invoke("--store", unreachable, "synth", "envs", "--scenarios",
                          str(recorded.scenarios), "--run", str(tmp_path / "r"),
                          "--model", MODEL, "--api-base", "http://127.0.0.1:9/v1"))
    assert "cannot open the store" in line and not (tmp_path / "r").exists()

    copy = tmp_path / "copy"
    shutil.copytree(recorded.run, copy)
    line = refused(invoke("--store", str(tmp_path / "s.sqlite"), "synth", "envs",
                          "--scenarios", str(recorded.scenarios), "--run", str(copy),
                          "--model", "openai/other", "--api-base", "http://127.0.0.1:9/v1",
                          "--tasks-per-scenario", "2"))
    assert "openai/other" in line and MODEL in line

    plain = tmp_path / "plain"
    plain.mkdir()
    line = refused(invoke("synth", "replay", str(plain)))
    assert "not a synthesis run" in line


# --- 7. one stage at a time -----------------------------------------------------------


def test_only_runs_one_stage_and_needs_the_ones_before(recorded: Recorded,
                                                       tmp_path: Path) -> None:
    scenarios = scenarios_file(tmp_path)
    run, store = tmp_path / "run", tmp_path / "store.sqlite"
    with serving(synth_script.rules()) as server:
        skipping = invoke(*envs_args(store, scenarios, run, server.url, "--only", "spec"))
        assert skipping.exit_code == 1, skipping.output
        assert "tasks: not done yet (run without --only)" in skipping.stdout
        assert not (run / "outputs" / "spec").exists()

        first = invoke(*envs_args(store, scenarios, run, server.url, "--only", "tasks"))
        assert first.exit_code == 0, first.output
        schema = invoke(*envs_args(store, scenarios, run, server.url, "--only", "schema"))
        assert schema.exit_code == 0, schema.output
        assert {p.name for p in (run / "outputs").iterdir()} == {"tasks", "schema"}
        before = len(server.requests)
        rest = invoke(*envs_args(store, scenarios, run, server.url))
        assert rest.exit_code == 0, rest.output
        # tasks and schema were not asked again; the rest was
        asked = server.requests[before:]
        assert not any("synth prompt tasks@v1" in json.dumps(r) for r in asked)
        assert not any("synth prompt schema@v1" in json.dumps(r) for r in asked)
    assert world_hash_of(run) == world_hash_of(recorded.run)
    # the same outputs as the run made in one go (its commands differ, so its run.json)
    assert compare_runs(recorded.run, run)[0] == ["run.json: differs"]


def test_a_run_made_before_prompts_were_added_opens_and_a_changed_prompt_is_refused(
        tmp_path: Path) -> None:
    from synth.errors import SynthError
    from synth.prompts import versions
    from synth.runs import RUN_FILE, Settings, open_run

    run = tmp_path / "run"
    open_run(run, Settings(model=MODEL))
    older = json.loads((run / RUN_FILE).read_text(encoding="utf-8"))
    older["prompts"] = {k: v for k, v in older["prompts"].items() if k != "plan"}
    (run / RUN_FILE).write_text(json.dumps(older), encoding="utf-8")
    assert open_run(run, Settings(model=MODEL))[0].prompts == older["prompts"]
    older["prompts"]["tasks"] = versions()["tasks"] + 1
    (run / RUN_FILE).write_text(json.dumps(older), encoding="utf-8")
    with pytest.raises(SynthError, match="made with prompt versions"):
        open_run(run, Settings(model=MODEL))
