"""The RL dataset: one row per task of a pack's split, in verl's ``RLHFDataset`` schema.

A row is what the agent loop starts a rollout from::

    data_source    "agent_worlds/<pack>"   (rl.contract.DATA_SOURCE_PREFIX + the pack's name)
    agent_name     "agent_worlds"          (rl.contract.AGENT_NAME: the loop verl runs)
    prompt         [{"role": "system", "content": SYSTEM_PROMPT (META_SYSTEM_PROMPT in
                     meta mode, GUI_SYSTEM_PROMPT for a task declaring gui in tools
                     mode)}, {"role": "user", "content": the task's instruction}]:
                   exactly the first two messages gates.llm_agent shows the model
    ability        "agent"
    reward_model   {"style": "rule", "ground_truth": <task_id>}
    extra_info     rl.contract.RowInfo as plain data: pack, task_id, world, world_hash,
                   interfaces, mode, reward, split, index

A mode must offer every interface a task declares (``MODE_INTERFACES``): meta mode has
no shell and no GUI tools, so a split with a task that needs them is refused in meta mode
(its rows could never be solved).

Rows hold no absolute path, so a dataset written here is valid on any node that has the
pack (``packs.registry.load_pack``) and a store with its worlds. The parquet file is
written with fixed options and no statistics: the same pack gives the same bytes.

polars only (the ``data`` extra); no torch or verl.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

import msgspec

from gates.contract import INTERFACES
from gates.llm_agent import GUI_SYSTEM_PROMPT, META_SYSTEM_PROMPT, SYSTEM_PROMPT, offers_gui
from gates.task import SPEC_FILE, Task, load_task
from packs.registry import SPLITS, Pack
from rl.contract import AGENT_NAME, DATA_SOURCE_PREFIX, Mode, RewardKind, RowInfo
from rl.errors import RLError
from worldstore.errors import NotFoundError

if TYPE_CHECKING:
    from replay.engine import Worlds

ABILITY = "agent"
REWARD_STYLE = "rule"
COLUMNS = ("data_source", "agent_name", "prompt", "ability", "reward_model", "extra_info")
MODES: tuple[str, ...] = get_args(Mode)
REWARDS: tuple[str, ...] = get_args(RewardKind)
# The task interfaces each mode's agent can act through: tools mode offers the MCP tools,
# the shell and (to a task declaring it) the GUI; meta mode only AWM's meta-tools over
# the MCP tools (gates.llm_agent, rl.world).
MODE_INTERFACES: dict[str, frozenset[str]] = {
    "tools": frozenset(INTERFACES), "meta": frozenset({"mcp"})}
_OFFER_NAMES = {"mcp": "MCP tools", "shell": "shell", "gui": "GUI tools"}
_MODE_NAMES = {"tools": "tools mode", "meta": "meta mode (AWM's list_tools/call_tool and answer)"}


def system_prompt(mode: Mode, *, gui: bool = False) -> str:
    """The system prompt the agent is shown in `mode` (as gates.llm_agent.LLMAgent), for
    a task that declares the gui interface when `gui` (no GUI tools in meta mode)."""
    if mode == "meta":
        return META_SYSTEM_PROMPT
    return GUI_SYSTEM_PROMPT if gui else SYSTEM_PROMPT


def prompt_messages(task: Task, mode: Mode) -> list[dict[str, str]]:
    """The prompt of a task: the system prompt and the unhinted instruction."""
    return [{"role": "system", "content": system_prompt(mode, gui=offers_gui(task))},
            {"role": "user", "content": task.instruction(hinted=False)}]


def split_tasks(pack: Pack, split: str) -> list[Task]:
    """The tasks of one split of a pack, loaded, in the split's order; RLError for an
    unknown or empty split."""
    if split not in SPLITS:
        raise RLError(f"pack {pack.name!r} has no split {split!r} (splits: "
                      f"{', '.join(SPLITS)})")
    names = pack.splits.get(split, ())
    if not names:
        raise RLError(f"split {split!r} of pack {pack.name!r} has no tasks (splits.json "
                      f"of {pack.root}); nothing to train on")
    return [load_task(pack.task_dir(name)) for name in names]


def check_task_world(worlds: Worlds, pack: Pack, task: Task) -> None:
    """Refuse a task whose start world is not in the store as the task pins it (the check
    gates.rollout makes before opening an instance)."""
    where = f"task {task.task_id!r} of pack {pack.name!r} ({task.path / SPEC_FILE})"
    try:
        record = worlds.resolve(task.spec.world)
    except NotFoundError as exc:
        raise RLError(f"{where}: its world {task.spec.world} is not in the store ({exc}); "
                      f"import the pack's logs first (worldctl import "
                      f"{' '.join(str(p) for p in pack.worlds)})") from None
    if record.world_hash != task.spec.world_hash:
        raise RLError(f"{where}: {task.spec.world} has world hash {record.world_hash} in "
                      f"this store, not {task.spec.world_hash}: the task was written for "
                      "another world")


def check_mode_offers(pack: Pack, split: str, tasks: Sequence[Task], mode: Mode) -> None:
    """Refuse tasks that need an interface `mode` does not offer (``MODE_INTERFACES``): no
    rollout of theirs could solve them, so every such row would only teach failure."""
    offered = MODE_INTERFACES[mode]
    lacking = [t for t in tasks if not set(t.spec.interfaces) <= offered]
    if not lacking:
        return
    missing = {i for t in lacking for i in t.spec.interfaces} - offered
    what = " and no ".join(_OFFER_NAMES[i] for i in INTERFACES[::-1] if i in missing)
    which = ", ".join(f"{t.task_id} ({', '.join(t.spec.interfaces)})" for t in lacking)
    one = len(lacking) == 1
    raise RLError(f"split {split!r} of pack {pack.name!r}: {_MODE_NAMES[mode]} offers no "
                  f"{what}, which "
                  f"{'task' if one else 'tasks'} {which} {'needs' if one else 'need'}: "
                  f"unsolvable there; use --mode tools or a split of MCP-only tasks")


def rl_rows(pack: Pack, split: str = "rl", *, mode: Mode = "tools",
            reward: RewardKind = "wildawm", worlds: Worlds | None = None
            ) -> list[dict[str, Any]]:
    """One row per task of `split`, in the split's order. With `worlds`, every task's
    start world must be in that store (RLError otherwise)."""
    if mode not in MODES:
        raise RLError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    if reward not in REWARDS:
        raise RLError(f"reward {reward!r} is not one of {', '.join(REWARDS)}")
    tasks = split_tasks(pack, split)
    check_mode_offers(pack, split, tasks, mode)
    rows = []
    for index, task in enumerate(tasks):
        if worlds is not None:
            check_task_world(worlds, pack, task)
        info = RowInfo(pack=pack.name, task_id=task.task_id, world=task.spec.world,
                       world_hash=task.spec.world_hash, interfaces=list(task.spec.interfaces),
                       mode=mode, reward=reward, split=split, index=index)
        rows.append({
            "data_source": DATA_SOURCE_PREFIX + pack.name,
            "agent_name": AGENT_NAME,
            "prompt": prompt_messages(task, mode),
            "ability": ABILITY,
            "reward_model": {"style": REWARD_STYLE, "ground_truth": task.task_id},
            "extra_info": msgspec.to_builtins(info),
        })
    return rows


def row_info(row: dict[str, Any]) -> RowInfo:
    """A row's ``extra_info`` as the RowInfo it was written from (as the loop reads it)."""
    return msgspec.convert(row["extra_info"], RowInfo)


def write_parquet(rows: list[dict[str, Any]], out: Path, *, schema: Any = None) -> None:
    """Write `rows` (with the polars `schema`, else the one inferred) to `out` with fixed
    options (no statistics, one row group, zstd at a fixed level): the same rows give the
    same bytes. The file appears whole or not at all: made in memory, written as a new
    file beside `out` and renamed over it, so a link or hardlink planted at `out` is
    never written through (a link, FIFO or folder there, or a symlinked folder, is
    refused before anything is written)."""
    import polars as pl

    from worldstore.folders import check_named_file, write_file

    check_named_file(out, "--out")
    frame = pl.DataFrame(rows, schema=schema, infer_schema_length=None)
    buffer = io.BytesIO()
    frame.write_parquet(buffer, compression="zstd", compression_level=3, statistics=False,
                        row_group_size=max(1, len(rows)), use_pyarrow=False)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_file(out, buffer.getvalue())


def write_rl_dataset(pack: Pack, out: Path, split: str = "rl", *, mode: Mode = "tools",
                     reward: RewardKind = "wildawm", worlds: Worlds | None = None
                     ) -> list[dict[str, Any]]:
    """Write the rows of `rl_rows` to the parquet file `out`; returns them."""
    rows = rl_rows(pack, split, mode=mode, reward=reward, worlds=worlds)
    write_parquet(rows, out)
    return rows


__all__ = ["ABILITY", "COLUMNS", "MODES", "MODE_INTERFACES", "REWARDS", "REWARD_STYLE",
           "check_mode_offers", "check_task_world", "prompt_messages", "rl_rows", "row_info",
           "split_tasks", "system_prompt", "write_parquet", "write_rl_dataset"]
