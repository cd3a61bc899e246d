"""The README stays true: its set-up commands and its CLI tour run, and every CLI command
and event type is documented."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from replay import Worlds
from worldstore.cli import cli
from worldstore.events import EVENT_TYPES

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
BIN = Path(sys.executable).parent


def _bash_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", README, re.S)


def _env(tmp_path: Path, demo_jsonl: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
    env["DEMO"] = str(demo_jsonl)
    env.pop("WORLDCTL_STORE", None)
    env.pop("WORLDCTL_CACHE", None)
    return env


def test_setup_commands_are_the_demo_and_the_ci_test_command() -> None:
    demo_cmd, test_cmd = _bash_blocks()[:2]
    assert "worldctl demo" in demo_cmd and 'pip install -e ".[envs]"' in demo_cmd
    assert test_cmd.strip() == "bash scripts/test.sh"
    ci_lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_cmd.strip() in ci_lines, ".ci/run must run exactly the README's test command"


def test_demo_command_runs_the_main_job(tmp_path: Path, demo_jsonl: Path) -> None:
    # The package is already installed in this environment; the rest of command 1 runs.
    demo_cmd = _bash_blocks()[0]
    worldctl_part = demo_cmd.split("&&")[-1].strip().replace(".venv/bin/", "")
    proc = subprocess.run(
        ["bash", "-c", f"{worldctl_part} --checkout-dir {tmp_path / 'co'}"],
        cwd=tmp_path, env=_env(tmp_path, demo_jsonl), capture_output=True, text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verify OK" in proc.stdout
    with Worlds.open(tmp_path / ".worldctl") as worlds:
        recorded = worlds.resolve("lars@5").world_hash
        assert len(worlds.store.days("lars")) == 8
    assert f"{recorded}  (recorded: {recorded})" in proc.stdout
    assert "table shop.orders (changed): +1" in proc.stdout
    assert "episode verify OK" in proc.stdout  # the environment half of the demo
    assert "file jobs/nordlys/install-checklist.md (changed" in proc.stdout


def test_cli_tour_runs(tmp_path: Path, demo_jsonl: Path) -> None:
    assert shutil.which("sqlite3"), "the tour uses the sqlite3 CLI (apt-get install sqlite3)"
    tour = next(b for b in _bash_blocks() if "worldctl import" in b)
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", tour], cwd=tmp_path,
                          env=_env(tmp_path, demo_jsonl), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with Worlds.open(tmp_path / ".worldctl") as worlds:
        lars3 = worlds.resolve("lars@3").world_hash
        latest = worlds.resolve("lars").world_hash
    assert lars3 in proc.stdout.splitlines()
    diff = json.loads((tmp_path / "diff.json").read_text())
    assert diff["after"] == lars3 and diff["tables"]
    fresh = json.loads(proc.stdout[proc.stdout.rindex("[\n"):])
    assert fresh[0]["world_hash"] == latest


def test_every_cli_command_is_documented() -> None:
    for name in cli.commands:
        assert f"`worldctl {name}" in README, f"worldctl {name} is missing from the README"


def test_every_event_type_is_documented() -> None:
    for event_type in EVENT_TYPES:
        assert f"`{event_type}`" in README


def test_python_examples_run(tmp_path: Path, demo_jsonl: Path) -> None:
    """The README's Python blocks run as written, against a store holding the demo."""
    with Worlds.open(tmp_path / ".worldctl") as worlds:
        worlds.import_file(demo_jsonl)
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert len(blocks) >= 2
    for block in blocks:
        proc = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, f"{block}\n{proc.stderr}"
