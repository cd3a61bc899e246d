"""The error tree drawn in worldstore/errors.py is the project's real one, both ways.

Every module of every project package is imported and every exception class defined in it
is collected. A public one (a name without a leading '_') must be drawn in the tree, under
its real base class and the package that defines it, and live in that package's errors.py;
a class drawn under the WorldError root is a WorldError, and one that is not must be drawn
under the foreign base it derives from instead. Everything the tree names must exist.
Private classes ('_' names) are control flow inside one module and are not drawn.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

import worldstore.errors
from worldstore.errors import WorldError

PROJECT = Path(__file__).resolve().parents[2]
# Every project package there is (eval, say, once it exists).
PACKAGES = [name for name in ("worldstore", "replay", "packs", "worldenv", "worldllm", "gates",
                              "synth",
                              "rl", "eval", "awmbridge", "worldctl")
            if (PROJECT / name / "__init__.py").is_file()]
# Modules that only run inside another program, and cannot be imported on their own.
NOT_IMPORTABLE = {
    "worldstore.migrations.env": "alembic's environment script: it runs inside alembic only",
}
ENTRY = re.compile(r"(?P<name>\w+)\s+(?P<package>[a-z_]+)\s{2,}(?P<meaning>\S.*)")
ROOT = re.compile(r"(?P<name>[\w.]+)(\s+(?P<package>[a-z_]+)\s{2,}(?P<meaning>\S.*))?")


@dataclass(frozen=True)
class Drawn:
    """One class as the tree draws it."""

    name: str
    package: str | None  # None for a foreign root (a class from outside the project)
    parent: str | None  # the name of the entry it hangs under; None for a root
    root: str
    line: int

    @property
    def where(self) -> str:
        return f"worldstore/errors.py docstring, line {self.line}"


def parse_tree(doc: str) -> list[Drawn]:
    """The entries of the tree(s) drawn, indented by four spaces, in `doc`."""
    drawn: list[Drawn] = []
    path: list[Drawn] = []  # the entries from the current root down to the last one
    for number, line in enumerate(doc.splitlines(), start=1):
        if not line.startswith("    "):
            continue
        body = line[4:]
        if body[:1].isalpha():
            m = ROOT.fullmatch(body)
            assert m, f"line {number}: a root is '<Class>' or '<Class>  <package>  <meaning>'"
            entry = Drawn(m["name"], m["package"], None, m["name"], number)
            path = [entry]
        elif "── " in body:
            at = body.index("── ") - 1
            depth = at // 4 + 1
            m = ENTRY.fullmatch(body[at + 4:])
            assert m, (f"line {number}: {body.strip()!r}; an entry is "
                       "'<Class>  <package>  <meaning>'")
            assert path and depth <= len(path), f"line {number}: an entry without a parent"
            parent = path[depth - 1]
            entry = Drawn(m["name"], m["package"], parent.name, parent.root, number)
            path = [*path[:depth], entry]
        else:
            continue  # a meaning continued from the line above
        drawn.append(entry)
    return drawn


def project_modules() -> list[ModuleType]:
    modules = []
    for package_name in PACKAGES:
        package = importlib.import_module(package_name)
        modules.append(package)
        for info in pkgutil.walk_packages(package.__path__, f"{package_name}."):
            if info.name not in NOT_IMPORTABLE:
                modules.append(importlib.import_module(info.name))
    return modules


def project_exceptions() -> list[type[BaseException]]:
    """Every exception class defined in a project module (as its own, not imported)."""
    found = []
    for module in project_modules():
        for value in vars(module).values():
            if inspect.isclass(value) and issubclass(value, BaseException) \
                    and value.__module__ == module.__name__:
                found.append(value)
    return found


def package_of(cls: type) -> str:
    return cls.__module__.split(".")[0]


def resolve(entry: Drawn) -> type | None:
    """The class an entry names, or None if there is none where it says."""
    if entry.package is None:
        module_name, _, name = entry.name.rpartition(".")
        try:
            found = getattr(importlib.import_module(module_name), name, None)
        except ImportError:
            return None
        return found if inspect.isclass(found) else None
    module = importlib.import_module(f"{entry.package}.errors")
    found = getattr(module, entry.name, None)
    if not inspect.isclass(found) or found.__module__ != module.__name__:
        return None  # absent, or only imported there
    return found


TREE = parse_tree(worldstore.errors.__doc__ or "")
EXCEPTIONS = project_exceptions()
PUBLIC = [cls for cls in EXCEPTIONS if not cls.__name__.startswith("_")]


def drawn_as(cls: type) -> Drawn | None:
    return next((d for d in TREE if d.package == package_of(cls) and d.name == cls.__name__),
                None)


def test_the_tree_is_drawn_and_the_walk_finds_the_known_classes() -> None:
    assert {"worldstore", "replay", "worldenv", "gates", "worldctl"} <= set(PACKAGES)
    names = {d.name for d in TREE}
    assert {"WorldError", "StoreError", "ConflictError", "ApplyError", "ToolError"} <= names
    found = {f"{cls.__module__}.{cls.__qualname__}" for cls in EXCEPTIONS}
    assert {"worldstore.errors.WorldError", "replay.errors.ApplyError",
            "worldenv.errors.SandboxError", "gates.errors.TaskError"} <= found


def test_the_root_is_worlderror() -> None:
    assert TREE[0].name == "WorldError" and TREE[0].parent is None
    assert resolve(TREE[0]) is WorldError


@pytest.mark.parametrize("cls", PUBLIC, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_every_public_exception_is_drawn(cls: type[BaseException]) -> None:
    assert drawn_as(cls) is not None, (
        f"{cls.__module__}.{cls.__qualname__} is not in the error tree: add a line "
        f"'{cls.__name__}  {package_of(cls)}  <what it means>' under its base class to the "
        "docstring of worldstore/errors.py")


@pytest.mark.parametrize("cls", PUBLIC, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_every_public_exception_lives_in_its_packages_errors_module(
        cls: type[BaseException]) -> None:
    home = f"{package_of(cls)}.errors"
    assert cls.__module__ == home, (
        f"{cls.__module__}.{cls.__qualname__}: exception classes live in {home} "
        f"({home.replace('.', '/')}.py); move it there")


@pytest.mark.parametrize("entry", TREE, ids=lambda d: d.name)
def test_every_drawn_class_exists_under_its_drawn_base(entry: Drawn) -> None:
    cls = resolve(entry)
    home = f"{entry.package}.errors" if entry.package else entry.name.rpartition(".")[0]
    assert cls is not None, f"{entry.where}: {entry.name} is not a class defined in {home}"
    assert issubclass(cls, BaseException), f"{entry.where}: {entry.name} is no exception"
    if entry.parent is None:
        return
    parent = resolve(next(d for d in TREE if d.name == entry.parent and d.line < entry.line
                          and d.root == entry.root))
    assert parent is not None and parent in cls.__bases__, (
        f"{entry.where}: {entry.name} is drawn under {entry.parent}, but its bases are "
        f"{[b.__qualname__ for b in cls.__bases__]}")


@pytest.mark.parametrize("entry", TREE, ids=lambda d: d.name)
def test_worlderror_is_the_base_of_all_but_the_deliberate_exceptions(entry: Drawn) -> None:
    cls = resolve(entry)
    assert cls is not None
    if entry.root == "WorldError":
        assert issubclass(cls, WorldError), f"{entry.where}: {entry.name} is not a WorldError"
    elif entry.package is not None:
        # Drawn outside the WorldError tree: that must be the truth, not an oversight.
        assert not issubclass(cls, WorldError), (
            f"{entry.where}: {entry.name} is a WorldError; draw it in the WorldError tree")


def test_no_class_is_drawn_twice_and_no_private_class_is_drawn() -> None:
    keys = [(d.package, d.name) for d in TREE]
    assert sorted(k for k in set(keys) if keys.count(k) > 1) == []
    assert [d.name for d in TREE if d.name.rpartition(".")[2].startswith("_")] == []
