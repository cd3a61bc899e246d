"""The tests mirror the code: one folder per package, cross-cutting rooms named for what
they hold, helpers in ``tests/support``, and benchmarks that never reach into the tests.

A new test file at the top of ``tests/``, a helper left among the tests or a folder named
for no package fails here; so does a package with no tests of its own.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"

# the installed packages (setup.py's TOP), each with its own folder of tests
PACKAGES = {"worldstore", "replay", "worldenv", "worldllm", "gates", "packs", "synth", "rl",
            "eval", "worldctl", "awmbridge"}
# folders that mirror no single package: the hostile corpora (each attacks several
# packages at once) and the project's own promises (layering, names, docs, benchmarks)
CROSS_CUTTING = {"hostile", "project"}
NOT_TESTS = {"support", "fixtures", "__pycache__"}


def folders() -> set[str]:
    return {p.name for p in TESTS.iterdir() if p.is_dir()} - NOT_TESTS


def test_every_test_folder_is_a_package_or_a_named_room() -> None:
    assert folders() <= PACKAGES | CROSS_CUTTING, sorted(folders() - PACKAGES - CROSS_CUTTING)


def test_every_package_has_its_own_tests() -> None:
    for package in sorted(PACKAGES):
        assert sorted((TESTS / package).glob("test_*.py")), f"no tests/{package}/test_*.py"


def test_the_setup_packages_are_the_mirrored_ones() -> None:
    top = next(node for node in ast.walk(ast.parse((ROOT / "setup.py").read_text()))
               if isinstance(node, ast.Assign)
               and any(isinstance(t, ast.Name) and t.id == "TOP" for t in node.targets))
    assert isinstance(top, ast.Assign)
    assert set(ast.literal_eval(top.value)) == PACKAGES


def test_no_test_file_sits_at_the_top() -> None:
    assert sorted(p.name for p in TESTS.glob("*.py")) == ["__init__.py", "conftest.py"]


def test_helpers_live_in_support_and_tests_in_rooms() -> None:
    """A test folder holds test files only (and its package marker); support holds none."""
    for folder in sorted(folders()):
        strays = sorted(p.name for p in (TESTS / folder).glob("*.py")
                        if p.name != "__init__.py" and not p.name.startswith("test_"))
        assert not strays, f"tests/{folder}: helpers belong in tests/support: {strays}"
        assert (TESTS / folder / "__init__.py").is_file(), f"tests/{folder} is not a package"
    support = sorted(p.name for p in (TESTS / "support").glob("test_*.py"))
    assert not support, support


def test_test_files_are_named_once() -> None:
    """Two test files of one name in two folders would be two modules that read alike in
    a report: every name is unique across the tree."""
    seen: dict[str, Path] = {}
    for path in sorted(TESTS.glob("*/test_*.py")):
        assert path.name not in seen, (path, seen[path.name])
        seen[path.name] = path


def test_the_benchmarks_do_not_reach_into_the_tests() -> None:
    """``bench/`` stands on the installed packages: no import of ``tests`` or a helper of
    it, and no ``sys.path`` entry pointing into ``tests/`` (its data fixtures may be read)."""
    helpers = {p.stem for p in (TESTS / "support").glob("*.py")} - {"__init__"}
    for path in sorted((ROOT / "bench").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                root = name.split(".")[0]
                assert root != "tests" and root not in helpers, f"{path.name} imports {name}"
        source = path.read_text(encoding="utf-8")
        for line in source.splitlines():
            if "sys.path" in line:
                assert "tests" not in line, f"{path.name}: {line.strip()}"

