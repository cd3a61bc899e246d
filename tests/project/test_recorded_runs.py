"""The offline tutorial of the recorded runs (``examples/recorded/README.md``): its shell
block runs as written, with no model server, no API key and no network, and gives the
recorded results: the synthesis run replays identical, its reference solutions pass, the
LLM agent solves the demo task from its recordings."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "recorded"
README = EXAMPLES / "README.md"


def shell_block() -> str:
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 1, "the README has one shell block: the tutorial"
    return str(blocks[0])


def offline_env(home: Path) -> dict[str, str]:
    """No model or endpoint of the developer's own, no key; worldctl on the PATH."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("WORLDCTL_", "OPENAI_", "ANTHROPIC_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["TMPDIR"] = str(home)
    # Any request leaving the machine would fail instead of hanging.
    env["HTTPS_PROXY"] = env["HTTP_PROXY"] = "http://127.0.0.1:9"
    return env


def test_the_tutorial_runs_offline_and_gives_the_recorded_results(tmp_path: Path) -> None:
    script = shell_block() + '\nprintf "OUT=%s\\n" "$out"\n'
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT,
                          env=offline_env(tmp_path), capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    out = Path(re.findall(r"^OUT=(.*)$", done.stdout, re.M)[-1])
    assert out.parent == tmp_path

    # the synthesis run: replayed identical, the recorded world's hash
    recorded = json.loads((EXAMPLES / "synth" / "worlds" / "library_loans.json")
                          .read_text(encoding="utf-8"))
    assert "all identical" in done.stdout
    assert f"library_loans@0 {recorded['world_hash']}" in done.stdout

    # its tasks, graded with their reference solutions
    synth_eval = json.loads((out / "library-loans-eval" / "results.json")
                            .read_text(encoding="utf-8"))
    assert [t["task_id"] for t in synth_eval["tasks"]] == ["library-loans-01",
                                                           "library-loans-02"]
    assert synth_eval["metrics"]["success_rate"] == 1.0

    # the LLM agent, answered from the recordings: the demo task solved
    llm_eval = json.loads((out / "llm-eval" / "results.json").read_text(encoding="utf-8"))
    trials = [t for task in llm_eval["tasks"] for t in task["trials"]]
    assert len(trials) == 1 and trials[0]["success"] is True
    assert llm_eval["metrics"]["trials_lost"] == 0
    assert "success 100.0 %" in done.stdout


def test_a_request_that_was_not_recorded_is_refused(tmp_path: Path) -> None:
    """The recorded model answers only what it was asked: another model name is another
    request, which replay refuses (the trial is lost, the run exits 2) instead of calling
    out."""
    env = offline_env(tmp_path)
    store = str(tmp_path / "store")
    worldctl = str(Path(sys.executable).parent / "worldctl")
    subprocess.run([worldctl, "--store", store, "import",
                    str(ROOT / "packs" / "demo" / "world" / "lars.jsonl")], env=env,
                   capture_output=True, check=True)
    env |= {"WORLDCTL_LLM_MODE": "replay",
            "WORLDCTL_LLM_RECORDINGS": str(EXAMPLES / "eval" / "recordings")}
    done = subprocess.run([worldctl, "--store", store, "eval", "run",
                           str(EXAMPLES / "eval" / "fjellrommet-title"), "--agent",
                           "llm:openai/another", "-k", "1", "--out", str(tmp_path / "run")],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no recording" in done.stderr.lower() or "not recorded" in done.stderr.lower(), \
        done.stderr
