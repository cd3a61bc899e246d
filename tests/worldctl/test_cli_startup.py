"""The command line starts fast, by construction: what each start-up imports.

The timings themselves are measured by bench/bench_startup.py (ratios to `python -c
pass`); these tests pin the causes, which do not depend on the machine: `--help` and
`--version` import click and no rich, msgspec, SQLAlchemy or project library; a command
imports only its own group's module; opening a store at the head revision imports no
alembic; and the static tables the fast paths read agree with what they stand for.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from worldctl.main import COMMANDS, VERSION, cli
from worldstore.migrate import HEAD_REVISION, head_revision

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "packs" / "demo" / "world" / "lars.jsonl"
HEAVY = ("rich", "msgspec", "sqlalchemy", "alembic", "apsw", "replay", "worldenv", "gates",
         "packs", "synth", "worldllm")

PROBE = """
import json, sys
from worldctl.main import main
sys.argv = ["worldctl", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit:
    pass
loaded = sorted({m.split(".")[0] for m in sys.modules} | {m for m in sys.modules
                                                          if m.startswith("worldctl.")})
print("\\nLOADED " + json.dumps(loaded))
"""


def loaded_by(args: list[str], cwd: Path = ROOT) -> set[str]:
    """Top-level modules (and worldctl submodules) a worldctl run has imported."""
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    marker = done.stdout.rindex("\nLOADED ")
    found: list[str] = json.loads(done.stdout[marker + len("\nLOADED "):])
    return set(found)


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["episode", "--help"]])
def test_help_and_version_import_click_and_nothing_heavy(args: list[str]) -> None:
    loaded = loaded_by(args)
    assert "click" in loaded
    assert not loaded & set(HEAVY), loaded & set(HEAVY)


def test_a_command_imports_only_its_groups_module_and_no_alembic(tmp_path: Path) -> None:
    """`personas` reads the event store only: no replay engine, no alembic at head."""
    store = tmp_path / "store"
    result = CliRunner().invoke(cli, ["--store", str(store), "import", str(DEMO)])
    assert result.exit_code == 0, result.output
    loaded = loaded_by(["--store", str(store), "personas"])
    assert {"worldctl.main", "worldctl.store", "sqlalchemy"} <= loaded
    assert not loaded & {"worldctl.envs", "worldctl.tasks", "worldctl.synth", "worldctl.packs",
                         "worldctl.demo", "alembic", "rich", "replay", "worldenv",
                         "gates"}, loaded


def test_importing_worldstore_does_not_import_sqlalchemy() -> None:
    code = ("import sys, worldstore, worldstore.open; "
            "print(sorted(m for m in ('sqlalchemy', 'alembic', 'msgspec') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"


def test_the_static_head_revision_is_alembics_head() -> None:
    assert head_revision() == HEAD_REVISION


def test_the_static_version_is_the_packages() -> None:
    assert importlib.metadata.version("agent-worlds") == VERSION
    assert CliRunner().invoke(cli, ["--version"]).output.strip() == f"worldctl, version {VERSION}"


def test_the_command_table_matches_the_commands() -> None:
    ctx = click.Context(cli)
    assert cli.list_commands(ctx) == list(COMMANDS)
    for name, (_module, _attribute, short_help) in COMMANDS.items():
        command = cli.get_command(ctx, name)
        assert command is not None and command.name == name
        assert command.get_short_help_str(limit=200) == short_help, name
    listed = CliRunner().invoke(cli, ["--help"], terminal_width=200).output
    for name, (_module, _attribute, short_help) in COMMANDS.items():
        assert f"  {name}" in listed and short_help in listed


def test_no_library_module_imports_worldctl() -> None:
    offenders = []
    libraries = ("worldstore", "replay", "packs", "worldenv", "worldllm", "gates", "synth", "rl",
                 "eval")
    for path in (p for name in libraries for p in (ROOT / name).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n == "worldctl" or n.startswith("worldctl.") for n in names):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []
