"""``synth envs --code-format awm``: the scripted scenario library_loans
(tests/support/synth_script.py) synthesized with its app rendered as AWM's server code and
carried for the AWM adapter; its tasks pass the gates on that world; ``synth export-awm``
then writes the same files as for the recorded run in the project's app contract
(examples/recorded/synth), byte for byte, since the render is deterministic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replay.engine import Worlds
from tests.support import synth_script
from tests.support.cli_harness import invoke
from tests.support.llm_server import serving
from worldenv.awm.host import AWM_APP

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "examples" / "recorded" / "synth"

pytestmark = pytest.mark.usefixtures("loopback_env")


def test_an_env_in_awms_code_format_is_served_by_the_adapter_and_exports_alike(
        tmp_path: Path) -> None:
    run, store = tmp_path / "run", tmp_path / "store"
    scenarios = tmp_path / "scenarios.jsonl"
    scenarios.write_text(synth_script.scenarios_line(), encoding="utf-8")
    with serving(synth_script.rules()) as server:
        built = invoke("--store", str(store), "synth", "envs", "--scenarios", str(scenarios),
                       "--tasks-per-scenario", "2", "--code-format", "awm", "--run", str(run),
                       "--model", "openai/loopback", "--api-base", server.url)
    assert built.exit_code == 0, built.output
    assert "4 tools, 2/2 tasks verified, 2 accepted by the gates" in built.stdout
    world = [json.loads(line) for line in
             (run / "worlds" / "library_loans.jsonl").read_text(encoding="utf-8").splitlines()]
    apps = [line for line in world if line["type"] == "app"]
    assert [a["app"] for a in apps] == [AWM_APP]  # the AWM adapter serves it
    assert "from fastapi import FastAPI" in apps[0]["code"]
    with Worlds.open(store) as worlds:
        assert worlds.resolve("library_loans@0").world_hash != json.loads(
            (RECORDED / "worlds" / "library_loans.json").read_text())["world_hash"]
    assert json.loads((run / "run.json").read_text())["commands"][0]["args"][
        "code_format"] == "awm"

    ours, recorded = tmp_path / "ours", tmp_path / "recorded"
    for source, out in ((run, ours), (RECORDED, recorded)):
        done = invoke("synth", "export-awm", str(source), "--out", str(out))
        assert done.exit_code == 0, done.output
    names = sorted(p.name for p in recorded.iterdir())
    assert sorted(p.name for p in ours.iterdir()) == names
    for name in names:
        assert (ours / name).read_bytes() == (recorded / name).read_bytes(), name
