"""AWM tasks as task folders (``gates.task``): one folder per verified task of a scenario.

``write_tasks(scenario, persona=..., world_hash=..., out=...)`` writes, for every task of
the scenario that has a verifier in the files read, ``out/<task id>/``:

=========================  ================================================================
``task.json``              the task text as the instruction, world ``<persona>@0`` with its
                           hash pinned, interfaces ``["mcp"]``, one subtask (the task),
                           difficulty ``unlabeled``, ``absent``: solution, hint and rubric
                           (AWM ships none), ``source``: the files and lines it came from
``verifier/awm_complete.py``  code mode: calls AWM's ``verify_task_completion(initial_db_path,
                           final_db_path, final_answer)`` on the initial and final database
                           of the ``awm`` service with the episode's final answer; its one
                           check ``complete`` holds when it returns ``{"result":
                           "complete"}`` (``"others"``: it does not; anything else is a
                           verifier error). AWM's code is carried verbatim, byte for byte,
                           in ``verifier/_awm_code_verifier.py`` (a helper, not a script)
``verifier/awm_evidence.py``  sql mode: calls AWM's ``verify_task(initial_db_path,
                           final_db_path)`` and reports what it returns as *evidence* (no
                           checks), with the verifier's ``success_criteria`` and
                           ``failure_criteria``, for the code-augmented judge
                           (``gates.judges.CodeJudge``), which classifies the rollout into
                           AWM's four outcomes. AWM's code: ``verifier/_awm_sql_verifier.py``
``README.md``              the above in words, and what the missing artifacts mean for the
                           gates
=========================  ================================================================

The verifier code is generated and untrusted: it runs only in the verifier sandbox
(``gates.verifier.run_verifier``: ``/w0`` and ``/w`` read-only, the answer at
``/answer.txt``, no network, bounded time and memory), never in this process; this module
only writes it to files.

What the missing artifacts mean for the gates (``task check``): without a reference
solution there are no scripted rollouts, so gates 1 and 3-5 need model rollouts
(``--agent llm:MODEL``); without a model they report ``not_run`` and the task is
*undecided*, never accepted. Gate 2 (initially unsatisfied) runs on the code-mode check; a
task with only a sql-mode verifier has no check, so V needs the judge and gate 2 reports
``not_run`` too. Without a hint, hinted rollouts get the bare instruction; without a rubric
the judge reads the task, the trajectory and the verifier's output alone.

A task with no verifier in the files read (AWM-1K ships verifiers for some tasks only) gets
no folder: nothing could grade it. ``unverified_tasks`` lists them.

**The AWM protocol** (``awm_rollout_outcome``): a rollout of an agent in meta-tool mode
(``gates.llm_agent.LLMAgent(..., mode="meta")``: ``list_tools`` once and first, then
``call_tool``) is checked step by step by AWM's six-condition format validator
(``gates.rewards``) against the catalogue its ``list_tools`` call returned; a format error
gives -1 at its step and no judgement, an environment error (a call answered with an
error) 0; otherwise the code-augmented judge classifies the episode (the code-mode
check and the sql-mode evidence in its verdict) and every step gets AWM's outcome reward:
1.0 Completed, 0.1 Partially Completed, 0.0 Agent Error or Environment Error. Without a
model the judge does not run and there is no reward (never a guessed one).
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from awmbridge.errors import AwmError
from awmbridge.formats import TASKS_FILE, Origin, Scenario, Verifier, unverified_tasks
from awmbridge.world import AWM_SERVICE
from gates.contract import Judgement, Rollout, Solution, Subtask, TaskSpec, ToolStep, to_json
from gates.errors import RewardError
from gates.quality import RolloutJudge
from gates.rewards import (
    LIST_TOOLS,
    FormatCheck,
    awm_step_rewards,
    awm_steps,
    catalogue_from_list_tools,
    validate_awm_rollout,
)
from gates.task import SOLUTION_FILE, SPEC_FILE, VERIFIER_DIR, Task
from worldstore.errors import FolderError
from worldstore.folders import kind_of, read_file, staged_folder

__all__ = [
    "AWM_SERVICE",
    "CODE_HELPER",
    "CODE_SCRIPT",
    "README_FILE",
    "SQL_HELPER",
    "SQL_SCRIPT",
    "AwmOutcome",
    "add_solution",
    "awm_rollout_outcome",
    "listed_catalogue",
    "task_id_for",
    "unverified_tasks",
    "write_tasks",
]


CODE_SCRIPT, CODE_HELPER = "awm_complete.py", "_awm_code_verifier.py"
SQL_SCRIPT, SQL_HELPER = "awm_evidence.py", "_awm_sql_verifier.py"
README_FILE = "README.md"
DATASET = "AWM (Agent World Model, AgentWorldModel-1K)"
_SLUG = re.compile(r"[^a-z0-9_-]+")


# --- the public entry points ----------------------------------------------------------


def task_id_for(scenario: str, task_idx: int) -> str:
    """The task id of task `task_idx` of a scenario: ``<scenario>-task-<idx>``, the name
    lower-cased with anything outside ``[a-z0-9_-]`` made ``-`` (``e_commerce_33-task-0``).
    Refuses a name with nothing left."""
    slug = _SLUG.sub("-", scenario.lower()).strip("-_")
    if not slug:
        raise AwmError(f"scenario {scenario!r}: its name gives no task id "
                       "(nothing of [a-z0-9_-] in it)")
    return f"{slug}-task-{task_idx}"


def write_tasks(scenario: Scenario, *, persona: str, world_hash: str,
                out: Path) -> list[Path]:
    """Write a task folder under `out` for every verified task of `scenario`, on the world
    ``<persona>@0`` whose hash is `world_hash`; returns the folders in task order. A folder
    of the same task id that is already there is replaced (each is written beside it and
    renamed into place); anything else of that name is refused."""
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for index in _verified(scenario):
        text = scenario.tasks[index]
        code = scenario.code_verifiers.get(index)
        sql = scenario.sql_verifiers.get(index)
        task_id = task_id_for(scenario.name, index)
        spec = TaskSpec(
            task_id=task_id, instruction=text, world=f"{persona}@0", world_hash=world_hash,
            interfaces=["mcp"], difficulty="unlabeled",
            subtasks=[Subtask(description=text, interface="mcp")],
            absent=["solution", "hint", "rubric"],
            source=_source(scenario, index, code, sql))
        written.append(_publish(out / task_id, spec, _files(scenario, index, code, sql)))
    return written


def check_task_targets(scenario: Scenario, out: Path) -> None:
    """Refuse (AwmError naming the path) before anything is stored or written when a task
    folder of `scenario` could not be written under `out`: `out` is a symlink (even a
    dangling one) or not a folder, or a task folder's name there is a link or something
    other than an earlier folder of the same task (what ``write_tasks`` would refuse)."""
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        raise AwmError(f"--tasks-out {out}: a {kind_of(st.st_mode)}, not a folder; "
                       "refused (a link is never followed)")
    for index in _verified(scenario):
        task_id = task_id_for(scenario.name, index)
        _check_target(out / task_id, task_id)


def _verified(scenario: Scenario) -> list[int]:
    """The indexes of the scenario's tasks that have a verifier (the others get no folder)."""
    return [index for index in range(len(scenario.tasks))
            if scenario.code_verifiers.get(index) is not None
            or scenario.sql_verifiers.get(index) is not None]


def _check_target(dest: Path, task_id: str) -> None:
    if dest.is_symlink() or (dest.exists() and not _same_task(dest, task_id)):
        raise AwmError(f"{dest}: exists and is not a task folder of {task_id} (a "
                       "link is never followed); not replaced")


def add_solution(task_dir: Path, solution: Solution) -> None:
    """Give an AWM task folder a reference solution (one written by hand: AWM ships
    none), so that its scripted rollouts, and gates 3-5 without a model, can run."""
    spec_file = task_dir / SPEC_FILE
    data = json.loads(spec_file.read_text(encoding="utf-8"))
    data["absent"] = [a for a in data.get("absent", []) if a != "solution"]
    spec_file.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n",
                         encoding="utf-8")
    (task_dir / SOLUTION_FILE).write_bytes(to_json(solution) + b"\n")


# --- the AWM protocol ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AwmOutcome:
    """One rollout under AWM's protocol. `judgement` is None when the format check decided
    (no judge is asked); `rewards` (one per step, up to where the rollout stopped) is None
    when the judge did not run: no model, no reward."""

    check: FormatCheck
    judgement: Judgement | None
    rewards: list[float] | None

    @property
    def reward(self) -> float | None:
        """The rollout's reward: -1 on a format error, else the last step's."""
        return None if not self.rewards else self.rewards[-1]


def listed_catalogue(rollout: Rollout) -> dict[str, dict[str, Any]]:
    """Tool name -> input schema, as the rollout's first ``list_tools`` call returned them
    (empty when it made none, or its answer was no tool list)."""
    for turn in rollout.trajectory.turns:
        if isinstance(turn.step, ToolStep) and turn.step.tool == LIST_TOOLS:
            try:
                listed = json.loads(turn.observation)
                return catalogue_from_list_tools(listed if isinstance(listed, list) else [])
            except (ValueError, AttributeError, RewardError):
                return {}
    return {}


def awm_rollout_outcome(task: Task, rollout: Rollout, judge: RolloutJudge) -> AwmOutcome:
    """AWM's format check, judgement and step rewards of one graded rollout."""
    steps = awm_steps(rollout.trajectory)
    catalogue = listed_catalogue(rollout)
    check = validate_awm_rollout(steps, catalogue)
    if not check.ok:
        return AwmOutcome(check, None, awm_step_rewards(steps, catalogue, None).rewards)
    judgement = judge.judge(task, rollout)
    if judgement.status != "ran":
        return AwmOutcome(check, judgement, None)
    return AwmOutcome(check, judgement, awm_step_rewards(steps, catalogue, judgement).rewards)


# --- the files of one task ------------------------------------------------------------


def _files(scenario: Scenario, index: int, code: Verifier | None,
           sql: Verifier | None) -> dict[str, str]:
    files: dict[str, str] = {}
    if code is not None:
        files[f"{VERIFIER_DIR}/{CODE_HELPER}"] = code.code
        files[f"{VERIFIER_DIR}/{CODE_SCRIPT}"] = _code_script(scenario.name, index, code)
    if sql is not None:
        files[f"{VERIFIER_DIR}/{SQL_HELPER}"] = sql.code
        files[f"{VERIFIER_DIR}/{SQL_SCRIPT}"] = _sql_script(scenario.name, index, sql)
    files[README_FILE] = _readme(scenario.name, index, code, sql)
    return files


_COMMON = '''\
import json
import os
import runpy
import sys

import awsdk

SERVICE = {service!r}
HELPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), {helper!r})


def awm_function(name):
    """The function AWM's code defines, loaded as a module (its __main__ block stays idle)."""
    module = runpy.run_path(HELPER, run_name="awm_verifier")
    function = module.get(name)
    if not callable(function):
        sys.exit(f"{{HELPER}} defines no function {{name}}()")
    return function


def report(checks, evidence):
    line = json.dumps({{"checks": checks, "evidence": evidence}}, default=str,
                      ensure_ascii=False)
    print(awsdk.RESULT_PREFIX + line)
'''


def _code_script(scenario: str, index: int, verifier: Verifier) -> str:
    head = (f'"""AWM code-mode verifier of {scenario} task {index} '
            f'({_where(verifier.origin)}).\n\n'
            "AWM's code is in the helper beside this script, verbatim. It is called with the\n"
            "initial and final database of the service and the episode's final answer (None\n"
            "when the agent gave none); the check `complete` holds when it returns\n"
            '{"result": "complete"}, not when it returns {"result": "others"}; anything else\n'
            'is a verifier error."""\n\n')
    body = f'''
ws = awsdk.worlds()
verify = awm_function({verifier.function_name!r})
out = verify(str(awsdk.db_path(ws.w0, SERVICE)), str(awsdk.db_path(ws.w, SERVICE)),
             ws.answer or None)
result = out.get("result") if isinstance(out, dict) else None
if result not in ("complete", "others"):
    sys.exit(f"{{verify.__name__}} returned {{out!r:.300}}, not a dict whose 'result' is "
             "'complete' or 'others'")
report({{"complete": result == "complete"}}, {{"result": result}})
'''
    return head + _COMMON.format(service=AWM_SERVICE, helper=CODE_HELPER) + body


def _sql_script(scenario: str, index: int, verifier: Verifier) -> str:
    head = (f'"""AWM sql-mode verifier of {scenario} task {index} '
            f'({_where(verifier.origin)}).\n\n'
            "AWM's code is in the helper beside this script, verbatim. It is called with the\n"
            "initial and final database of the service; what it returns is reported as\n"
            "evidence (no checks), with the verifier's success and failure criteria, for the\n"
            'code-augmented judge, which classifies the rollout into AWM\'s four outcomes."""\n\n')
    criteria = {"success_criteria": verifier.success_criteria or "(none given)",
                "failure_criteria": verifier.failure_criteria or "(none given)"}
    body = f'''
CRITERIA = {criteria!r}

ws = awsdk.worlds()
verify = awm_function({verifier.function_name!r})
out = verify(str(awsdk.db_path(ws.w0, SERVICE)), str(awsdk.db_path(ws.w, SERVICE)))
report({{}}, {{"verify_task": out, **CRITERIA}})
'''
    return head + _COMMON.format(service=AWM_SERVICE, helper=SQL_HELPER) + body


def _readme(scenario: str, index: int, code: Verifier | None, sql: Verifier | None) -> str:
    modes = []
    if code is not None:
        modes.append(f"* code mode ({_where(code.origin)}): `verifier/{CODE_SCRIPT}` calls "
                     f"AWM's `{code.function_name}` (verbatim in `verifier/{CODE_HELPER}`) "
                     "with the initial and final database and the final answer; its check "
                     "`complete` is V.")
    if sql is not None:
        modes.append(f"* sql mode ({_where(sql.origin)}): `verifier/{SQL_SCRIPT}` calls "
                     f"AWM's `{sql.function_name}` (verbatim in `verifier/{SQL_HELPER}`) and "
                     "reports its result as evidence, with the success and failure "
                     "criteria, for the code-augmented judge (Completed / Partially "
                     "Completed / Agent Error / Environment Error; AWM's outcome reward "
                     "1.0 / 0.1 / 0 / 0).")
    v_line = ("V is the code-mode check." if code is not None else
              "There is no code-mode check: V needs the judge, so gate 2 (initially "
              "unsatisfied) reports not_run too.")
    return f"""# {scenario} task {index} (imported from {DATASET})

{modes[0] if len(modes) == 1 else chr(10).join(modes)}

The database is the `{AWM_SERVICE}` service of the world; the tools are the scenario's
server routes (MCP). AWM's verifier code is generated and untrusted: it runs only in the
verifier sandbox.

AWM ships no reference solution, hint or rubric (`task.json`: `absent`). For the gates
(`worldctl task check`): with no solution there are no scripted rollouts, so gates 1 and
3-5 need model rollouts (`--agent llm:MODEL`, or `--rollouts FILE`); without a model they
report not_run and the task is undecided, never accepted. {v_line} Hinted rollouts get
the bare instruction; the judge has no rubric beyond the verifier's output.
"""


def _source(scenario: Scenario, index: int, code: Verifier | None,
            sql: Verifier | None) -> str:
    tasks = scenario.origins.get(TASKS_FILE)
    where = [f"task {index} of {_where(tasks)}"] if tasks is not None else []
    where += [f"code-mode verifier {_where(code.origin)}"] if code is not None else []
    where += [f"sql-mode verifier {_where(sql.origin)}"] if sql is not None else []
    return f"{DATASET}, scenario {scenario.name}: {'; '.join(where)}"


def _where(origin: Origin) -> str:
    return f"{Path(origin.file).name}:{origin.line}"


# --- writing -------------------------------------------------------------------------


def _publish(dest: Path, spec: TaskSpec, files: dict[str, str]) -> Path:
    """Write the folder beside `dest`, then put it in place (replacing an earlier folder
    of the same task, never anything else)."""
    _check_target(dest, spec.task_id)
    with staged_folder(dest, "task folder", replacing=True) as staging:
        _write(staging / SPEC_FILE, to_json(spec).decode() + "\n")
        for rel, text in files.items():
            _write(staging / rel, text)
        for folder in (staging, staging / VERIFIER_DIR):
            folder.chmod(0o755)  # the verifier sandbox's user reads it as "other"
    return dest


def _same_task(folder: Path, task_id: str) -> bool:
    try:  # a regular file, never through a link
        data: Any = json.loads(read_file(folder / SPEC_FILE, limit=1 << 20))
    except (OSError, ValueError, FolderError):
        return False
    return isinstance(data, dict) and data.get("task_id") == task_id


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as fh:  # verbatim: no newline mapping
        fh.write(text)
    path.chmod(0o644)
