"""Task folders: load and validate one, naming the file and field of anything wrong.

A task is a folder::

    task.json        the spec (gates.contract.TaskSpec)
    verifier/        the verifier: one or more *.py scripts (files starting "_" are helpers)
    rubric.md        what a judge checks, in words
    hint.md          the hint given to hinted rollouts
    solution.json    the reference solution (gates.contract.Solution): tool calls, shell
                     commands and a final answer, in order

An imported task may lack the last three (AWM ships none): ``task.json`` then lists them
in ``absent`` and their files must not exist. A task without a solution has no scripted
rollouts (the gates that need rollouts, 1 and 3-5, then need a model's), one without a
hint gives hinted rollouts the bare instruction, one without a rubric is judged without.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from gates.contract import (
    AnswerStep,
    Artifact,
    GuiStep,
    Interface,
    ShellStep,
    Solution,
    Step,
    TaskSpec,
    ToolStep,
)
from gates.errors import TaskError
from packs.registry import PACK_FILE, load_pack
from worldstore.errors import ConfigError, FolderError
from worldstore.folders import refuse_links
from worldstore.jsonfile import decode_json_file

SPEC_FILE = "task.json"
VERIFIER_DIR = "verifier"
RUBRIC_FILE = "rubric.md"
HINT_FILE = "hint.md"
SOLUTION_FILE = "solution.json"

T = TypeVar("T")

_TASK_ID = re.compile(r"[a-z0-9][a-z0-9_-]*\Z")
_WORLD_REF = re.compile(r"[a-z0-9][a-z0-9_-]*@[0-9]+\Z")
_WORLD_HASH = re.compile(r"[0-9a-f]{32}\Z")


@dataclass(frozen=True)
class Task:
    path: Path
    spec: TaskSpec
    verifier_dir: Path
    scripts: tuple[str, ...]
    rubric: str
    hint: str
    solution: Solution

    @property
    def task_id(self) -> str:
        return self.spec.task_id

    def lacks(self, artifact: Artifact) -> bool:
        """Whether the task declares it has no such artifact (``task.json`` ``absent``)."""
        return artifact in self.spec.absent

    def instruction(self, *, hinted: bool) -> str:
        """What the agent is told: the instruction, plus the hint for hinted rollouts (a
        task without a hint gives every rollout the bare instruction)."""
        if not hinted or not self.hint:
            return self.spec.instruction
        return f"{self.spec.instruction}\n\nHint: {self.hint}"


def load_task(path: str | Path) -> Task:
    """Load and validate a task folder; raises TaskError naming the file and field."""
    root = Path(path)
    if not root.is_dir():
        raise TaskError("not a task folder (no such directory)", file=str(root))
    try:  # a task folder is data: a link or a FIFO in it is refused, never followed
        refuse_links(root, max_entries=100_000)
    except FolderError as exc:
        raise TaskError(str(exc), file=str(root)) from None
    spec = decode_json_file(root / SPEC_FILE, TaskSpec, TaskError)
    _check_spec(root / SPEC_FILE, spec)
    _check_absent(root, spec)
    if "solution" in spec.absent:
        solution = Solution(steps=[])
    else:
        solution = decode_json_file(root / SOLUTION_FILE, Solution, TaskError)
        _check_solution(root / SOLUTION_FILE, solution, spec)
    verifier_dir = root / VERIFIER_DIR
    return Task(path=root, spec=spec, verifier_dir=verifier_dir,
                scripts=_verifier_scripts(verifier_dir),
                rubric="" if "rubric" in spec.absent else _text(root / RUBRIC_FILE),
                hint="" if "hint" in spec.absent else _text(root / HINT_FILE),
                solution=solution)


def step_interface(step: Step) -> Interface | None:
    if isinstance(step, ToolStep):
        return "mcp"
    if isinstance(step, ShellStep):
        return "shell"
    if isinstance(step, GuiStep):
        return "gui"
    return None



def task_folders(source: str, installed: Path | None = None, *,
                 split: str | None = None) -> list[Path]:
    """The task folders a source names: a task folder, a folder of them, or a pack by
    name or by the path of its folder (its tasks, or those of `split`; installed packs
    are in `installed`)."""
    folder = Path(source)
    if (folder / SPEC_FILE).is_file():
        return [folder]
    if (folder / PACK_FILE).is_file():
        source = str(folder) if "/" in str(folder) else f"./{folder}"  # a path, not a name
    elif folder.is_dir():
        found = sorted(p for p in folder.iterdir() if (p / SPEC_FILE).is_file())
        if not found:
            raise ConfigError(f"{source}: neither a task folder nor a folder of task "
                              f"folders (no {SPEC_FILE} in it or its subfolders)")
        return found
    pack = load_pack(source, installed)
    return [pack.task_dir(name) for name in (pack.tasks if split is None
                                             else pack.split(split))]

# --- internals ----------------------------------------------------------------------------




def _check_spec(file: Path, spec: TaskSpec) -> None:
    def bad(message: str, field: str) -> TaskError:
        return TaskError(message, file=str(file), field=field)

    if not _TASK_ID.match(spec.task_id):
        raise bad(f"{spec.task_id!r} is not a task id ([a-z0-9][a-z0-9_-]*)", "task_id")
    if not spec.instruction.strip():
        raise bad("must not be empty", "instruction")
    if not _WORLD_REF.match(spec.world):
        raise bad(f"{spec.world!r} is not persona@day", "world")
    if not _WORLD_HASH.match(spec.world_hash):
        raise bad(f"{spec.world_hash!r} is not a world hash (32 hex digits)", "world_hash")
    if not spec.interfaces:
        raise bad("must declare at least one interface", "interfaces")
    if len(set(spec.interfaces)) != len(spec.interfaces):
        raise bad("lists an interface twice", "interfaces")
    if not spec.subtasks:
        raise bad("must list at least one subtask", "subtasks")
    for i, sub in enumerate(spec.subtasks):
        if sub.interface not in spec.interfaces:
            raise bad(f"uses interface {sub.interface!r}, which the task does not declare",
                      f"subtasks[{i}].interface")
        if not sub.description.strip():
            raise bad("must not be empty", f"subtasks[{i}].description")
    unused = sorted(set(spec.interfaces) - {s.interface for s in spec.subtasks})
    if unused:
        raise bad(f"declares {unused} but no subtask uses it", "interfaces")


_ARTIFACT_FILES: dict[Artifact, str] = {
    "solution": SOLUTION_FILE, "hint": HINT_FILE, "rubric": RUBRIC_FILE}


def _check_absent(root: Path, spec: TaskSpec) -> None:
    """An artifact the spec declares absent must have no file (one or the other is wrong)."""
    if len(set(spec.absent)) != len(spec.absent):
        raise TaskError("lists an artifact twice", file=str(root / SPEC_FILE), field="absent")
    for artifact in spec.absent:
        file = root / _ARTIFACT_FILES[artifact]
        if file.exists():
            raise TaskError(f"exists, but task.json declares the {artifact} absent",
                            file=str(file))


def _check_solution(file: Path, solution: Solution, spec: TaskSpec) -> None:
    if not solution.steps:
        raise TaskError("the reference solution has no steps", file=str(file), field="steps")
    for i, step in enumerate(solution.steps):
        if isinstance(step, AnswerStep) and i != len(solution.steps) - 1:
            raise TaskError("an answer step must be the last step", file=str(file),
                            field=f"steps[{i}]")
        interface = step_interface(step)
        if interface is not None and interface not in spec.interfaces:
            raise TaskError(f"uses interface {interface!r}, which the task does not declare",
                            file=str(file), field=f"steps[{i}]")
    used = {step_interface(s) for s in solution.steps}
    missing = sorted(i for i in spec.interfaces if i not in used)
    if missing:
        raise TaskError(f"never uses the declared interface(s) {missing}", file=str(file),
                        field="steps")


def _verifier_scripts(folder: Path) -> tuple[str, ...]:
    if not folder.is_dir():
        raise TaskError("missing (the verifier folder)", file=str(folder))
    scripts = tuple(sorted(p.name for p in folder.iterdir()
                           if p.is_file() and p.suffix == ".py" and not p.name.startswith("_")))
    if not scripts:
        raise TaskError("holds no verifier script (*.py)", file=str(folder))
    return scripts


def _text(file: Path) -> str:
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TaskError("missing", file=str(file)) from None
    except UnicodeDecodeError as exc:
        raise TaskError(f"not UTF-8 text: {exc}", file=str(file)) from None
    if not text.strip():
        raise TaskError("is empty", file=str(file))
    return text
