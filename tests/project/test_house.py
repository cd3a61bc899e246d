"""The house rules, checked on the source: data flows one way between packages, no import
cycles between modules, no module reaches into another's private names, verl and torch
only inside rl, and the folder tree names where each concern lives.

Every import counts: module level, inside functions, and under ``TYPE_CHECKING`` (a type
that points the wrong way is still a dependency the wrong way). Only cycles ignore the
``TYPE_CHECKING`` imports, since those never run.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

BELOW_GATES = {"worldstore", "replay", "packs", "worldenv", "worldllm", "gates"}
# package -> the project packages it may import (besides itself)
MAY_IMPORT: dict[str, set[str]] = {
    "worldstore": set(),
    "replay": {"worldstore"},
    "packs": {"worldstore", "replay"},
    "worldenv": {"worldstore", "replay"},
    "worldllm": {"worldstore"},
    "gates": {"worldstore", "replay", "packs", "worldenv", "worldllm"},
    "awmbridge": BELOW_GATES,  # the AWM importer: on grading (its task folders)
    "synth": BELOW_GATES | {"awmbridge"},  # synthesis: day 0 through the AWM import path
    "rl": BELOW_GATES,
    "eval": BELOW_GATES,
    "worldctl": BELOW_GATES | {"synth", "rl", "eval", "awmbridge"},
}
PACKAGES = set(MAY_IMPORT)
ONLY_IN_RL = {"verl", "torch"}

# Rooms inside a package (its subpackages and top-level modules): room -> the rooms of the
# same package it may import. The package's own ``__init__`` is open to every room.
ROOMS: dict[str, dict[str, set[str]]] = {
    "worldenv": {
        "errors": set(),
        "core": {"errors"},  # the contract, apps, dispatch, episodes, workspaces
        "sandbox": {"errors", "core"},  # process isolation; the app workers run core's apps
        "gui": {"errors", "core", "sandbox"},  # the page framework and the browser
        "apps": {"errors", "core", "gui"},  # a persona's apps
        "sites": {"errors", "core", "gui", "apps"},  # their pages, read through the apps
        "awm": {"errors", "core", "sandbox"},  # the AWM adapter and its host side
        "instances": {"errors", "core", "sandbox", "gui", "apps", "sites"},
        "protocol": {"errors", "core", "sandbox", "gui", "apps", "sites", "instances"},
        "serving": {"errors", "core", "sandbox", "gui", "apps", "sites", "awm", "instances",
                    "protocol"},  # every network surface
    },
    "synth": {
        "errors": set(),
        "prompts": {"errors"},
        "stage": {"errors", "prompts"},  # the shared stage framework
        "environments": {"errors", "prompts", "stage"},  # the AWM environment pipeline
        # the persona-world pipeline; from the other one only ``ROOM_CROSSINGS``
        "worlds": {"errors", "prompts", "stage"},
        "runs": {"errors", "prompts", "stage", "environments", "worlds"},  # drives both
    },
}
# Modules one room takes from a room its rules do not open, and why.
ROOM_CROSSINGS: dict[tuple[str, str], str] = {
    ("synth.worlds.applib", "synth.environments.appgen"):
        "a library app passes the same smoke check as an environment's app",
    ("synth.worlds.tasks", "synth.environments.verifiers"):
        "a task's verifier is gated with the same feedback as an environment's",
}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the imported module (or package)
    names: tuple[str, ...]  # names taken from it by ``from ... import``
    line: int
    type_only: bool

    @property
    def where(self) -> str:
        return f"{self.module.replace('.', '/')}.py:{self.line}"


def project_modules() -> dict[str, Path]:
    """Every module of the project's packages (folders with an ``__init__.py``; data
    folders of packs, task verifiers and build scripts are not modules)."""
    found: dict[str, Path] = {}
    for package in sorted(PACKAGES):
        top = ROOT / package
        if not (top / "__init__.py").exists():
            continue
        for path in sorted(top.rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if not all((ROOT.joinpath(*parts[:i]) / "__init__.py").exists()
                       for i in range(1, len(parts))):
                continue
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = project_modules()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk(node: ast.AST, type_only: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    for child in ast.iter_child_nodes(node):
        guarded = type_only or (isinstance(child, ast.If) and _is_type_checking(child.test))
        yield child, guarded
        yield from _walk(child, guarded)


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, target] if target else base)


def imports_of(module: str, path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    found = []
    for node, type_only in _walk(tree):
        if isinstance(node, ast.Import):
            found += [Import(module, a.name, (), node.lineno, type_only) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, is_package, node.level, node.module)
            names = tuple(a.name for a in node.names)
            # ``from pkg import submodule`` depends on the submodule itself
            subs = [n for n in names if f"{target}.{n}" in MODULES]
            for n in subs:
                found.append(Import(module, f"{target}.{n}", (), node.lineno, type_only))
            rest = tuple(n for n in names if n not in subs)
            if rest or not subs:
                found.append(Import(module, target, rest, node.lineno, type_only))
    return found


ALL_IMPORTS = [i for name, path in MODULES.items() for i in imports_of(name, path)]


def _package(module: str) -> str:
    return module.split(".")[0]


def test_the_packages_are_found() -> None:
    for package in ("worldstore", "replay", "worldenv", "worldllm", "gates", "packs", "synth", "rl",
                    "worldctl"):
        assert package in MODULES, package
    assert "replay.engine" in MODULES and "worldctl.main" in MODULES


def test_data_flows_one_way_between_packages() -> None:
    wrong = [f"{i.where}: {_package(i.module)} imports {i.target}"
             for i in ALL_IMPORTS
             if _package(i.target) in PACKAGES and _package(i.target) != _package(i.module)
             and _package(i.target) not in MAY_IMPORT[_package(i.module)]]
    assert not wrong, "imports against the direction of the house:\n" + "\n".join(wrong)


def _room(module: str) -> str | None:
    """The room of a module inside its package; None for the package's own ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


@pytest.mark.parametrize("package", sorted(ROOMS))
def test_every_room_has_its_rules(package: str) -> None:
    found = {room for m in MODULES if _package(m) == package and (room := _room(m))}
    assert found == set(ROOMS[package]), (
        f"rooms of {package} without rules: {sorted(found - set(ROOMS[package]))}; "
        f"rules without a room: {sorted(set(ROOMS[package]) - found)}")


def room_violations(imports: list[Import], package: str) -> list[str]:
    """The imports inside `package` that go against ``ROOMS``, in words."""
    rules = ROOMS[package]
    wrong = []
    for i in imports:
        if _package(i.module) != package or _package(i.target) != package:
            continue
        room, target = _room(i.module), _room(i.target)
        if room is None or target is None or target == room or target in rules[room]:
            continue
        if (i.module, i.target) in ROOM_CROSSINGS:
            continue
        wrong.append(f"{i.where}: {package}.{room} imports {i.target}")
    return wrong


@pytest.mark.parametrize("package", sorted(ROOMS))
def test_data_flows_one_way_between_rooms(package: str) -> None:
    wrong = room_violations(ALL_IMPORTS, package)
    assert not wrong, "imports against the direction of the rooms:\n" + "\n".join(wrong)


@pytest.mark.parametrize("module, target, allowed", [
    ("worldenv.gui.site", "worldenv.core.app", True),
    ("worldenv.core.app", "worldenv.gui.site", False),
    ("worldenv.sandbox.workers", "worldenv", True),  # the package itself
    ("worldenv.awm.host", "worldenv.instances.instance", False),
    ("synth.worlds.tasks", "synth.environments.verifiers", True),  # a crossing
    ("synth.worlds.tasks", "synth.environments.pipeline", False),
    ("synth.environments.pipeline", "synth.worlds.personas", False),
    ("synth.stage", "synth.runs", False),
])
def test_the_room_rules_refuse_a_wrong_way_import(module: str, target: str,
                                                  allowed: bool) -> None:
    found = room_violations([Import(module, target, (), 1, False)], _package(module))
    assert (not found) is allowed, found


def test_the_room_crossings_are_still_taken() -> None:
    taken = {(i.module, i.target) for i in ALL_IMPORTS}
    assert set(ROOM_CROSSINGS) <= taken, set(ROOM_CROSSINGS) - taken


def test_nothing_imports_the_command_line() -> None:
    wrong = [f"{i.where}: imports {i.target}" for i in ALL_IMPORTS
             if _package(i.target) == "worldctl" and _package(i.module) != "worldctl"]
    assert not wrong, "\n".join(wrong)


def test_verl_and_torch_only_inside_rl() -> None:
    wrong = [f"{i.where}: imports {i.target}" for i in ALL_IMPORTS
             if _package(i.target) in ONLY_IN_RL and _package(i.module) != "rl"]
    assert not wrong, "\n".join(wrong)


def test_no_module_takes_another_modules_private_names() -> None:
    wrong = [f"{i.where}: takes {n} from {i.target}" for i in ALL_IMPORTS
             if _package(i.target) in PACKAGES and i.target != i.module
             for n in i.names if n.startswith("_") and not n.startswith("__")]
    wrong += _private_attribute_uses()
    assert not wrong, "\n".join(wrong)


def _private_attribute_uses() -> list[str]:
    """``mod._name`` where ``mod`` is another project module bound by an import."""
    wrong = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        bound: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if _package(a.name) in PACKAGES:
                        bound[a.asname or a.name] = a.name
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for a in node.names:
                    if f"{node.module}.{a.name}" in MODULES:
                        bound[a.asname or a.name] = f"{node.module}.{a.name}"
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in bound and bound[node.value.id] != module \
                    and node.attr.startswith("_") and not node.attr.startswith("__"):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: uses "
                             f"{bound[node.value.id]}.{node.attr}")
    return wrong


def _module_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for i in ALL_IMPORTS:
        if i.type_only:
            continue
        target = i.target
        while target and target not in MODULES:  # ``import a.b.c`` of a name: its module
            target = target.rpartition(".")[0]
        if target and target != i.module:
            graph[i.module].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph (as a path that returns to its start), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_no_import_cycles_between_modules() -> None:
    graph = _module_graph()
    # a package's __init__ re-exporting its own modules is not a cycle with them
    for module in graph:
        if module in PACKAGES or any(m.startswith(module + ".") for m in MODULES):
            graph[module] = {t for t in graph[module] if not t.startswith(module + ".")}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("graph, cycle", [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
    ({"a": {"a"}}, ["a", "a"]),
    ({"a": {"b", "c"}, "b": set(), "c": {"d"}, "d": {"c"}}, ["c", "d", "c"]),
])
def test_the_cycle_finder_finds_cycles(graph: dict[str, set[str]],
                                       cycle: list[str] | None) -> None:
    assert find_cycle(graph) == cycle


def test_the_import_scanner_sees_function_level_and_type_only_imports(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    from gates.task import Task\n"
                      "def f():\n    from worldctl.main import cli\n"
                      "    import worldenv.instances.instance\n")
    found = {(i.target, i.type_only) for i in imports_of("replay.m", source)}
    assert {("gates.task", True), ("worldctl.main", False),
            ("worldenv.instances.instance", False)} <= found


def test_the_tree_names_where_each_concern_lives() -> None:
    """A newcomer finds these from the folder tree alone."""
    for path in ("worldstore/events.py",       # where events are defined
                 "worldstore/interchange.py",  # the interchange format
                 "worldstore/store.py",        # the store contract
                 "replay/fold.py",             # where replay happens
                 "replay/apply.py",            # how one event is applied
                 "replay/hashing.py",          # where a world is hashed
                 "worldenv/core/contract.py",  # the environments' contract
                 "worldenv/core/dispatch.py",  # where a tool call enters
                 "worldenv/sandbox/contract.py",  # what a sandbox promises
                 "synth/stage.py",             # the stage framework of synthesis
                 "gates/rewards.py",           # where a reward is computed
                 "gates/verifier.py",          # where a task is verified
                 "gates/quality.py",           # the five quality gates
                 "packs/registry.py",          # where packs are found
                 "worldctl/main.py"):          # the command line
        assert (ROOT / path).is_file(), path
