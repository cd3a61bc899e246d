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

import click

from replay import Worlds
from worldctl.main import cli
from worldstore.events import EVENT_TYPES

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
BIN = Path(sys.executable).parent


def _bash_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", README, re.S)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
    env.pop("WORLDCTL_STORE", None)
    env.pop("WORLDCTL_CACHE", None)
    return env


def test_setup_commands_are_the_demo_and_the_ci_test_command() -> None:
    demo_cmd, test_cmd = _bash_blocks()[:2]
    assert "worldctl demo" in demo_cmd and 'pip install -e ".[envs]"' in demo_cmd
    assert test_cmd.strip() == "bash scripts/test.sh"
    ci_lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_cmd.strip() in ci_lines, ".ci/run must run exactly the README's test command"


def test_demo_command_runs_the_main_job(tmp_path: Path) -> None:
    # The package is already installed in this environment; the rest of command 1 runs.
    demo_cmd = _bash_blocks()[0]
    worldctl_part = demo_cmd.split("&&")[-1].strip().replace(".venv/bin/", "")
    proc = subprocess.run(
        ["bash", "-c", f"{worldctl_part} --checkout-dir {tmp_path / 'co'}"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verify OK" in proc.stdout
    with Worlds.open(tmp_path / ".worldctl") as worlds:
        recorded = worlds.resolve("lars@5").world_hash
        assert len(worlds.store.days("lars")) == 8
    # The demo's `hash` step prints what `worldctl hash` prints (the hash last), then
    # says that it equals the recorded hash.
    hash_step = proc.stdout.split(f"$ worldctl hash {tmp_path / 'co'}\n", 1)[1].splitlines()
    note = next(i for i, line in enumerate(hash_step) if line.startswith("# "))
    assert hash_step[note - 1] == recorded, hash_step
    assert f"# equals the recorded hash of lars@5: {recorded}" in proc.stdout
    assert "table shop.orders (changed): +1" in proc.stdout
    assert "episode verify OK" in proc.stdout  # the environment half of the demo
    assert "file jobs/nordlys/install-checklist.md (changed" in proc.stdout


def _tour() -> str:
    return next(b for b in _bash_blocks() if "worldctl import" in b)


def _user_env(tmp_path: Path) -> dict[str, str]:
    """A user's shell before the tour: no worldctl on PATH (the tour puts the checkout's
    .venv there), no DEMO, no store settings; `mktemp -d` makes its directory in
    tmp_path."""
    env = dict(os.environ)
    path = [p for p in env["PATH"].split(os.pathsep) if p and not (Path(p) / "worldctl").exists()]
    if not (ROOT / ".venv" / "bin" / "worldctl").exists():
        path.append(str(BIN))  # the tests run in another environment than the checkout's .venv
    env["PATH"] = os.pathsep.join(path)
    env["TMPDIR"] = str(tmp_path)
    for name in ("DEMO", "WORLDCTL_STORE", "WORLDCTL_CACHE", "WORLDCTL_PACKS"):
        env.pop(name, None)
    return env


def test_the_tour_defines_every_variable_it_uses() -> None:
    tour = _tour()
    used = set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", tour))
    defined = set(re.findall(r"^(?:export )?([A-Za-z_][A-Za-z0-9_]*)=", tour, re.M))
    assert used - defined <= {"PATH", "PWD"}, used - defined
    assert tour.splitlines()[0].startswith('export PATH="$PWD/.venv/bin:$PATH"')


def test_cli_tour_runs(tmp_path: Path) -> None:
    assert shutil.which("sqlite3"), "the tour uses the sqlite3 CLI (apt-get install sqlite3)"
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", _tour()], cwd=ROOT,
                          env=_user_env(tmp_path), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (where,) = tmp_path.iterdir()  # the tour's own directory, from `mktemp -d`
    with Worlds.open(where / ".worldctl") as worlds:
        lars3 = worlds.resolve("lars@3").world_hash
        latest = worlds.resolve("lars").world_hash
    assert lars3 in proc.stdout.splitlines()
    assert "table shop.products (changed): +0 -0 ~1" in proc.stdout  # the hand edit
    diff = json.loads((where / "diff.json").read_text())
    assert diff["after"] == lars3 and diff["tables"]
    fresh = json.loads(proc.stdout[proc.stdout.rindex("[\n"):])
    assert fresh[0]["world_hash"] == latest


def _training_block() -> str:
    return next(b for b in _bash_blocks() if "worldctl rl config" in b)


def test_the_training_block_defines_every_variable_it_uses() -> None:
    block = _training_block()
    used = set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", block))
    defined = set(re.findall(r"^(?:export )?([A-Za-z_][A-Za-z0-9_]*)=", block, re.M))
    defined |= set(re.findall(r"\bread -r ([A-Za-z_][A-Za-z0-9_]*)", block))
    assert used - defined <= {"PATH", "PWD"}, used - defined


def test_the_training_block_runs(tmp_path: Path) -> None:
    """The README's "Training with verl" commands, as a user runs them from the checkout:
    both worlds imported, the datasets, an SFT episode and a run folder whose launch is
    checked against verl's config and the model's (a small local model folder here: no
    hub id can be resolved offline)."""
    env = _user_env(tmp_path)
    env["MODEL"] = str(ROOT / "tests" / "fixtures" / "models" / "long-context")
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", _training_block()], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (where,) = tmp_path.iterdir()
    run = where / "run"
    for name in ("launch.sh", "run.env", "sft.sh", "train.parquet", "val.parquet",
                 "sft.parquet"):
        assert (run / name).is_file(), name
    assert "trainer.use_v1=true" in (run / "launch.sh").read_text()
    with Worlds.open(where / ".worldctl") as worlds:
        assert sorted(p.persona for p in worlds.store.personas()) == ["lars", "nora"]


def test_every_cli_command_is_documented() -> None:
    for name in cli.list_commands(click.Context(cli)):
        assert f"`worldctl {name}" in README, f"worldctl {name} is missing from the README"


def test_every_subcommand_is_documented() -> None:
    context = click.Context(cli)
    for name in cli.list_commands(context):
        group = cli.get_command(context, name)
        if not isinstance(group, click.Group):
            continue
        for sub in group.list_commands(click.Context(group)):
            assert f"`worldctl {name} {sub}" in README or f"`{name} {sub}" in README, \
                f"worldctl {name} {sub} is missing from the README"


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
