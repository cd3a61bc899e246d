"""Record the shipped runs again (after a prompt, a tool catalogue or the demo world
changed): the model is the test suite's loopback server answering from its scripts, so
this needs a checkout (``tests/``), not an API key.

    .venv/bin/python examples/recorded/record.py

Writes ``examples/recorded/synth`` (a synthesis run of the scenario library_loans),
``examples/recorded/eval/recordings`` (an LLM agent solving ``eval/fjellrommet-title`` on
the demo world lars@7) and ``bench/fixtures/persona`` (what ``bench/bench_persona.py``
replays). ``tests/project/test_recorded_runs.py`` runs the commands of ``README.md`` on them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
# the checkout first (tests.support: the loopback model server and its scripts; verl
# installs a `tests` package of its own)
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
WORLDCTL = Path(sys.executable).parent / "worldctl"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORLDCTL_LLM_")}
    return {**env, "WORLDCTL_LLM_API_KEY": "x", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            **extra}


def _run(*args: str, env: dict[str, str]) -> None:
    done = subprocess.run([str(WORLDCTL), *args], env=env, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"worldctl {' '.join(args)}: exit {done.returncode}\n"
                         f"{done.stdout}{done.stderr}")


def record_synth() -> None:
    from tests.support import synth_script
    from tests.support.llm_server import serving

    target = HERE / "synth"
    shutil.rmtree(target, ignore_errors=True)
    with tempfile.TemporaryDirectory() as scratch, serving(synth_script.rules()) as server:
        scenarios = Path(scratch) / "scenarios.jsonl"
        scenarios.write_text(synth_script.scenarios_line(), encoding="utf-8")
        _run("--store", f"{scratch}/store.sqlite", "synth", "envs", "--scenarios",
             str(scenarios), "--run", str(target), "--model", "openai/loopback",
             "--api-base", server.url, "--tasks-per-scenario", "2", env=_env())


def record_eval() -> None:
    from tests.support.llm_server import load_script, serving

    recordings = HERE / "eval" / "recordings"
    task = HERE / "eval" / "fjellrommet-title"
    shutil.rmtree(recordings, ignore_errors=True)
    shutil.rmtree(task, ignore_errors=True)  # the test suite's copy is kept up to date
    shutil.copytree(REPO / "tests" / "fixtures" / "llm" / "fjellrommet-title", task)
    with tempfile.TemporaryDirectory() as scratch, serving(load_script("agent_solves")) as server:
        store = f"{scratch}/store"
        _run("--store", store, "import", str(REPO / "packs" / "demo" / "world" / "lars.jsonl"),
             env=_env())
        _run("--store", store, "eval", "run", str(task),
             "--agent", "llm:openai/scripted", "--api-base", server.url, "-k", "1",
             "--out", f"{scratch}/run",
             env=_env(WORLDCTL_LLM_MODE="record", WORLDCTL_LLM_RECORDINGS=str(recordings)))


def record_persona() -> None:
    import bench_persona

    from synth.runs import Settings
    from tests.support.llm_server import serving
    from tests.synth import test_synth_implement as scripts

    fixture = bench_persona.FIXTURE
    shutil.rmtree(fixture, ignore_errors=True)
    fixture.mkdir(parents=True)
    (fixture / "plan.json").write_text(json.dumps(scripts.PLAN1, indent=2) + "\n")
    # The implementer is right the first time here: the fixed day-1 answers for every call.
    rules = [{"when": {"any_contains": scripts.IMPLEMENT},
              "reply": {"tool_calls": scripts.DAY1_FIXED}},
             *(r for r in scripts._rules() if scripts.IMPLEMENT not in str(r["when"]))]
    with tempfile.TemporaryDirectory() as scratch, serving(rules) as server:
        settings = Settings(model=bench_persona.MODEL, api_base=server.url, api_key="x",
                            mode="record", recordings=fixture / "recordings")
        days = bench_persona.Days(Path(scratch), settings)
        days.implement()
        days.candidate()
        days.stored()


if __name__ == "__main__":
    record_synth()
    record_eval()
    record_persona()
