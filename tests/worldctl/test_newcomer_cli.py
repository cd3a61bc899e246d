"""What a newcomer meets first: the demo on a bare machine, refusals that leave nothing
behind, synthesis without a model, a comparison of too few tasks, one spelling of the
settings and extras that compose.

Every command runs for real (click's runner in process, or a subprocess where the
process itself matters: its PATH-independent tool lookup, its imports), against real
SQLite stores in temporary folders.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from eval.contract import Results, RunInfo, TaskResult, Trial, encode_results
from eval.metrics import bootstrap_delta, compute_metrics, delta_verdict, min_tasks
from tests.support.cli_harness import invoke, refused

ROOT = Path(__file__).resolve().parents[2]
DEMO_LOGS = sorted((ROOT / "packs" / "demo" / "world").glob("*.jsonl"))
PYTHON = sys.executable


def _personas(store: Path) -> list[str]:
    from worldstore.open import open_event_store

    found = open_event_store(store, create=False)
    try:
        return [p.persona for p in found.personas()]
    finally:
        found.close()


# --- the demo on a machine without bubblewrap or Chromium ------------------------------------

# Where the project looks for its tools (worldenv.sandbox and worldenv.gui.browser search
# fixed system folders, not the caller's PATH, so PATH cannot hide them): each is covered
# by /dev/null, which is not executable, inside a bubblewrap namespace that sees the rest
# of the machine as it is.
_HIDDEN = [f"{folder}/{name}" for folder in ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin",
                                              "/usr/bin", "/sbin", "/bin")
           for name in ("bwrap", "chromium", "chromium-browser", "docker")]


def _without_tools(argv: list[str]) -> list[str]:
    bwrap = shutil.which("bwrap")
    if bwrap is None:  # this machine lacks bubblewrap already
        return argv
    hide = [arg for path in _HIDDEN if os.path.lexists(path) and not os.path.islink(path)
            for arg in ("--ro-bind", "/dev/null", path)]
    return [bwrap, "--dev-bind", "/", "/", *hide, *argv]


def test_demo_without_bubblewrap_or_chromium_runs_what_it_can(tmp_path: Path) -> None:
    probe = subprocess.run(_without_tools(["true"]), capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"bubblewrap cannot make a namespace here: {probe.stderr[-200:]!r}")
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    done = subprocess.run(
        _without_tools([PYTHON, "-m", "worldctl.main", "--store", str(tmp_path / "store"),
                        "demo"]),
        capture_output=True, text=True, check=False, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert "error:" not in done.stderr, done.stderr
    out = done.stdout
    # every step it could run ran: the store's steps and the episode through MCP
    for step in ("$ worldctl import", "$ worldctl verify --all", "$ worldctl diff",
                 "$ worldctl episode verify", "$ worldctl task check"):
        assert step in out, out[-3000:]
    tail = out[out.index("skipped, for want of what this machine lacks:"):]
    assert "needs bubblewrap" in tail and "worldctl task check" in tail, tail
    if shutil.which("bwrap") is not None:  # both were hidden
        assert "needs Chromium" in tail, tail
        assert tail.rstrip().endswith("install them and run the demo again: "
                                      "apt-get install bubblewrap util-linux chromium"), tail
    else:
        assert "apt-get install bubblewrap util-linux" in tail, tail
    assert _personas(tmp_path / "store") == ["lars", "nora"]


# --- refusals leave nothing behind -------------------------------------------------------------


def test_a_refused_import_leaves_no_store(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "sql"}\n', encoding="utf-8")
    store = tmp_path / "deep" / "store"
    assert "bad.jsonl:1" in refused(invoke("--store", str(store), "import", str(bad)))
    assert not (tmp_path / "deep").exists()

    # a store folder the user made (empty) keeps being what it was
    made = tmp_path / "made"
    made.mkdir()
    (made / "notes.txt").write_text("mine", encoding="utf-8")
    refused(invoke("--store", str(made), "import", str(bad)))
    assert sorted(os.listdir(made)) == ["notes.txt"]


def test_import_of_several_files_is_all_or_nothing(tmp_path: Path) -> None:
    store = tmp_path / "store"
    first, second = DEMO_LOGS  # lars.jsonl, nora.jsonl
    broken = tmp_path / "broken.jsonl"
    lines = second.read_text(encoding="utf-8").splitlines(keepends=True)
    broken.write_text("".join(lines[:3]) + "{not json\n" + "".join(lines[3:]),
                      encoding="utf-8")

    line = refused(invoke("--store", str(store), "import", str(first), str(broken)))
    assert f"{broken}:4" in line, line
    assert not store.exists()  # a new store: nothing at all

    done = invoke("--store", str(store), "import", str(second))
    assert done.exit_code == 0, done.output
    line = refused(invoke("--store", str(store), "import", str(first), str(broken)))
    assert f"{broken}:4" in line, line
    assert _personas(store) == ["nora"]  # an existing store: lars was not committed


def test_import_awm_refused_against_a_new_store_leaves_none(tmp_path: Path) -> None:
    empty = tmp_path / "awm-out"
    empty.mkdir()
    store = tmp_path / "store"
    result = invoke("--store", str(store), "import-awm", str(empty))
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: "), result.stderr
    assert not store.exists()


def test_demo_refuses_a_day_before_it_imports(tmp_path: Path) -> None:
    store = tmp_path / "store"
    line = refused(invoke("--store", str(store), "demo", "--day", "99"))
    assert "'--day'" in line and "99" in line and "between 1 and" in line, line
    assert not store.exists()


def test_pack_export_makes_no_store(tmp_path: Path) -> None:
    done = subprocess.run([PYTHON, "-m", "worldctl.main", "pack", "export", "demo",
                           str(tmp_path / "demo.tar")],
                          capture_output=True, text=True, check=False, cwd=tmp_path,
                          env={k: v for k, v in os.environ.items()
                               if not k.startswith("WORLDCTL_")})
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(tmp_path)) == ["demo.tar"]


# --- synthesis without a model -------------------------------------------------------------


@pytest.mark.parametrize("args", [
    ["scenarios", "--seeds", str(ROOT / "synth" / "seeds" / "seed_scenario.jsonl"), "-n", "3"],
    ["envs"],
    ["persona"],
    ["day", "astrid", "--day", "1"],
    ["world", "astrid", "--to-day", "2"],
    ["tasks", "astrid", "--days", "1"],
])
def test_synthesis_without_a_model_is_refused(tmp_path: Path, args: list[str]) -> None:
    run = tmp_path / "run"
    result = invoke("--store", str(tmp_path / "store"), "synth", *args, "--run", str(run),
                    env={"WORLDCTL_LLM_MODEL": ""})
    line = refused(result)
    assert f"synth {args[0]}: no model" in line and "WORLDCTL_LLM_MODEL" in line, line
    assert "None@None" not in result.output and result.stdout == ""
    assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.parametrize("command", ["status", "funnel", "replay"])
def test_a_folder_that_is_no_run_is_refused_before_the_imports(tmp_path: Path,
                                                               command: str) -> None:
    code = ("import sys\nfrom worldctl.main import main\n"
            f"sys.argv = ['worldctl', 'synth', {command!r}, {str(tmp_path)!r}]\n"
            "try:\n    main()\nexcept SystemExit as exc:\n"
            "    print(exc.code, 'synth.runs' in sys.modules, 'litellm' in sys.modules)\n")
    done = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, check=False,
                          cwd=ROOT)
    assert done.stdout.split() == ["2", "False", "False"], done.stdout + done.stderr
    assert done.stderr == f"error: {tmp_path}: not a synthesis run (no run.json)\n"


# --- eval compare with too few tasks ---------------------------------------------------------


def _run_dir(root: Path, name: str, outcomes: dict[str, bool]) -> Path:
    tasks = [TaskResult(task_id=task_id, difficulty="easy", interfaces=["mcp"], trials=[
        Trial(trial=0, episode_id=f"{name}-{task_id}", success=ok, V=int(ok),
              reward=1.0 if ok else 0.0, checks=[ok], steps=1, interfaces_used=["mcp"],
              actions=["mcp"], termination="answered", format_error=False, env_error=False,
              tokens_in=10, tokens_out=1, cost=None, seconds=1.0, error=None)])
        for task_id, ok in outcomes.items()]
    run = RunInfo(run_id=name, agent="scripted:demo", model=None, k=1, split=None,
                  hinted=False, max_steps=10, history=4, concurrency=1,
                  tasks_source=["packs/demo"], started="2026-12-01T12:00:00Z")
    folder = root / name
    folder.mkdir()
    (folder / "results.json").write_bytes(encode_results(
        Results(run=run, tasks=tasks, metrics=compute_metrics(tasks))))
    return folder


def test_compare_says_three_tasks_are_too_few_for_a_verdict(tmp_path: Path) -> None:
    ids = ["t1", "t2", "t3"]
    base = _run_dir(tmp_path, "base", dict.fromkeys(ids, False))
    other = _run_dir(tmp_path, "other", dict.fromkeys(ids, True))
    done = invoke("eval", "compare", str(base), str(other), "--md", str(tmp_path / "c.md"),
                  "--html", str(tmp_path / "c.html"))
    assert done.exit_code == 0, done.output
    verdicts = [line.rsplit(": ", 1)[1] for line in done.stdout.splitlines()
                if line.startswith("other: ")]
    assert verdicts == ["too few tasks for a verdict (n=3)"] * 2, done.stdout
    assert "better" not in (tmp_path / "c.md").read_text(encoding="utf-8")


def test_the_verdict_needs_enough_differing_tasks() -> None:
    assert min_tasks(0.95) == 6 and min_tasks(0.99) == 8
    for n_tasks, n_better, verdict in [
            (5, 5, "too few tasks for a verdict (n=5)"),
            (6, 6, "better"),
            (20, 4, "too few tasks for a verdict (n=20, 4 differ)")]:
        a = [0.0] * n_tasks
        b = [1.0] * n_better + [0.0] * (n_tasks - n_better)
        assert delta_verdict(a, b, bootstrap_delta(a, b)) == verdict
        assert delta_verdict(b, a, bootstrap_delta(b, a)) == verdict.replace("better", "worse")
    spread = [0.0, 1.0] * 10
    assert delta_verdict(spread, spread[::-1], bootstrap_delta(spread, spread[::-1])) == "noise"
    same = [0.0, 1.0, 1.0]  # no difference is no claim: noise, whatever n
    assert delta_verdict(same, same, bootstrap_delta(same, same)) == "noise"


# --- one spelling of the settings; extras that compose -------------------------------------------


def test_settings_have_one_prefix() -> None:
    old = "AGENT_" + "WORLDS_"  # split, so that this file does not find itself
    tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                             capture_output=True, text=True, check=True, cwd=ROOT).stdout
    code = [ROOT / name for name in tracked.splitlines()
            if name.endswith((".py", ".sh", ".toml", ".yaml", ".yml", ".ini", ".cfg"))]
    assert code, "no code found"
    found = [f"{path.relative_to(ROOT)}:{number}"
             for path in code if path.is_file()
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if old in line]
    assert found == [], found


def test_the_dev_extra_composes_the_others_and_vllm_is_pinned() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    name = project["name"]
    composed = [r for r in extras["dev"] if r.startswith(f"{name}[")]
    assert len(composed) == 1, extras["dev"]
    match = re.fullmatch(rf"{name}\[([a-z0-9,]+)\]", composed[0])
    assert match is not None, composed
    included = set(match[1].split(","))
    # every extra but the GPU engine and the benchmarks' baseline, and nothing by hand
    assert included == set(extras) - {"dev", "vllm", "bench"}
    for extra in included:
        for requirement in extras[extra]:
            assert requirement not in extras["dev"], requirement
    (vllm,) = extras["vllm"]
    assert re.fullmatch(r"vllm==\d+\.\d+\.\d+", vllm), vllm
