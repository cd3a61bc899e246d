"""The README stays true: its two set-up commands are the demo and the CI test command, the
demo runs the main job, its tour runs, and its links lead to pages that exist. The
documentation site's own blocks and references are tests/project/test_docs.py's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from replay import Worlds

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
BIN = Path(sys.executable).parent
# A runnable bash block starts by putting the checkout's .venv on PATH, as a user would.
RUNNABLE = 'export PATH="$PWD/.venv/bin:$PATH"'


def _bash_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", README, re.S)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
    env.pop("WORLDCTL_STORE", None)
    env.pop("WORLDCTL_CACHE", None)
    return env


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
    (tour,) = [b for b in _bash_blocks() if b.startswith(RUNNABLE)]
    return tour


def test_the_tour_is_short_and_defines_every_variable_it_uses() -> None:
    tour = _tour()
    assert len(tour.splitlines()) <= 10
    used = set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", tour))
    defined = set(re.findall(r"^(?:export )?([A-Za-z_][A-Za-z0-9_]*)=", tour, re.M))
    assert used - defined <= {"PATH", "PWD"}, used - defined


def test_the_tour_runs(tmp_path: Path) -> None:
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", _tour()], cwd=ROOT,
                          env=_user_env(tmp_path), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (where,) = tmp_path.iterdir()  # the tour's own directory, from `mktemp -d`
    with Worlds.open(where / ".worldctl") as worlds:
        lars3 = worlds.resolve("lars@3").world_hash
    assert lars3 in proc.stdout.splitlines()  # `worldctl hash` of the checkout


def test_the_readme_is_short_and_its_links_lead_somewhere() -> None:
    assert len(README.splitlines()) <= 200
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    assert links
    for link in links:
        if "://" not in link:
            assert (ROOT / link).is_file(), f"the README links to {link}, which is missing"


def test_the_extras_named_are_the_packages_extras() -> None:
    """The README's extras list names every extra pyproject.toml declares (awm too)."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    listed = README.split("Extras:", 1)[1].split("\n\n", 1)[0]
    for extra in extras:
        assert f"`{extra}`" in listed, f"the extra {extra} is missing from the README"


def test_cpu_torch_is_installed_from_the_cpu_index() -> None:
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" \
        in README
