"""No top-level package of the project shadows the import name of another distribution.

A user of this project also has AWM's package, an LLM toolkit, verl and their
dependencies installed; a top-level package named like one of theirs overwrites it (or is
overwritten) on ``pip install``. Two checks: against every distribution installed next to
the project (their top-level names, from their metadata), and against a recorded list of
import names that well-known distributions on the package index install.
"""

from __future__ import annotations

import ast
import re
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# import name -> the distribution on the package index that installs it (checked against
# pypi.org on 2026-12-03). The first three were this project's own names until they moved.
TAKEN = {
    "awm": "agent-world-model (AWM's own package)",
    "llm": "llm",
    "envs": "envs",
    "gym": "gym",
    "gymnasium": "gymnasium",
    "openenv": "openenv-core",
    "harbor": "harbor",
    "verl": "verl",
    "mcp": "mcp",
    "fastmcp": "fastmcp",
    "docker": "docker",
    "tasks": "tasks",
    "agents": "openai-agents",
    "tests": "(many distributions ship a stray tests package)",
    "utils": "utils",
    "common": "common",
    "server": "server",
    "environments": "environments",
}


def project_packages() -> list[str]:
    """The top-level import packages the project installs, as ``setup.py`` names them."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "TOP" for t in node.targets):
            value = ast.literal_eval(node.value)
            assert isinstance(value, list)
            return [str(v) for v in value]
    raise AssertionError("setup.py names no TOP packages")


def installed_top_level_names() -> dict[str, str]:
    """Top-level import names of every other installed distribution -> its name."""
    names: dict[str, str] = {}
    for dist in metadata.distributions():
        owner = dist.metadata["Name"] or "?"
        if re.sub(r"[-_.]+", "-", owner).lower() == "agent-worlds":
            continue
        top = dist.read_text("top_level.txt")
        found = set(top.split()) if top else set()
        for entry in dist.files or ():
            parts = entry.parts
            if len(parts) > 1 and not parts[0].endswith((".dist-info", ".egg-info", ".data")):
                if parts[0] not in ("..", "__pycache__"):
                    found.add(parts[0])
            elif len(parts) == 1 and entry.suffix == ".py":
                found.add(entry.stem)
        for name in found:
            names.setdefault(name, owner)
    return names


def test_every_top_level_folder_is_listed() -> None:
    packages = set(project_packages())
    # tests/ is a package of the checkout only (its folders import tests.support), never
    # installed: setup.py's TOP leaves it out
    folders = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"migrations", "tests"}
    assert folders == packages


def test_no_top_level_package_is_a_known_taken_name() -> None:
    clashes = {name: TAKEN[name] for name in project_packages() if name in TAKEN}
    assert clashes == {}


def test_no_top_level_package_shadows_an_installed_distribution() -> None:
    installed = installed_top_level_names()
    assert len(installed) > 100  # the metadata was read: verl, torch, litellm and theirs
    clashes = {name: installed[name] for name in project_packages() if name in installed}
    assert clashes == {}


def test_the_installed_check_would_see_a_clash() -> None:
    installed = installed_top_level_names()
    assert installed.get("msgspec") == "msgspec"
    assert installed.get("click") == "click"
