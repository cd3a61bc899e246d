"""The SFT warm start: successful stored trajectories as chat conversations.

An episode in the store counts when its task is one of the pack's (of `split`, the sft
split by default, or of every task) and its verdict, computed now by the task's verifier on
the world its effects lead to (``gates.rollout.verify_episode_of_task``), passes. An
episode of an eval-split task is refused unless asked for (``allow_eval_split``): a model
warm-started on the evaluation's own tasks would be measured on what it was shown (after an
``eval run``, the store holds many such episodes). Each becomes one conversation, the one
``gates.llm_agent`` would have had (tools mode)::

    system      SYSTEM_PROMPT
    user        the task's instruction (unhinted)
    assistant   per call, one tool call: {"id": "call_<i>", "type": "function",
                "function": {"name": ..., "arguments": "<JSON text>"}}; a tool call under
                the tool's name, a shell command as ``shell`` {"command": ...}, a GUI
                action as its ``gui_<action>`` tool with the action's arguments
    tool        its result as the agent is shown it (``worldenv.protocol.observation``: a shell
                command's text by ``shell_result``, then ``shown``: an error flagged
                "[error] ", a long result cut at OBSERVATION_LIMIT)
    user        after a GUI action that took a screenshot: the note that stands in for
                it (gates.llm_agent.screenshot_note; the data holds no images, as the RL
                loop shows none)
    assistant   the answer, as an ``answer`` call {"text": ...} (ends the conversation)

An episode with a GUI call no agent tool stands for (a page ``request`` made outside the
agent's tools), or with GUI calls under a task that does not declare ``gui``, is not an
agent's conversation and is left out.

Columns (verl's MultiTurnSFTDataset: ``data.messages_key`` "messages", ``data.tools_key``
"tools"): ``messages`` (every message has role, content, tool_calls, tool_call_id; the
last two null where they do not apply), ``tools`` (the tool schemas offered, as JSON
text: the instance's MCP tools, the GUI tools for a task declaring ``gui``, then ``shell``
and ``answer``: worldenv.protocol.observation.tool_schemas), ``data_source``,
``task_id`` and ``episode_id``.

Why the tools are JSON text: parquet types every element of a list alike, so tool schemas
with different parameters stored as structs would come back with every other tool's
parameters as nulls (and schemas with a field of two types cannot be written at all).
verl 0.9.1's MultiTurnSFTDataset passes the column on as it reads it, so train with
``data.custom_cls.path=pkg://rl.sft data.custom_cls.name=WorldSFTDataset``: that class is
verl's MultiTurnSFTDataset with the JSON decoded (built on first use: this module imports
no verl or torch).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gates.llm_agent import offers_gui, screenshot_caption, screenshot_note
from gates.rollout import verify_episode_of_task
from gates.task import Task, load_task
from packs.registry import Pack
from rl.contract import DATA_SOURCE_PREFIX
from rl.dataset import check_task_world, prompt_messages, split_tasks, write_parquet
from rl.errors import RLError
from worldenv.core.episode import GuiCall, ToolCall
from worldenv.gui.tools import GUI_ACTIONS
from worldenv.instances.episodes import list_episodes, load_episode
from worldenv.instances.instance import Environment
from worldenv.protocol.observation import ANSWER, SHELL, shell_result, shown, tool_schemas

if TYPE_CHECKING:
    from replay.engine import Worlds
    from worldenv.core.episode import Episode

SFT_DATASET_CLASS = "WorldSFTDataset"  # data.custom_cls.name (path: pkg://rl.sft)


def offered_tools(env: Environment, world_hash: str, *, gui: bool = False
                  ) -> list[dict[str, Any]]:
    """The tools gates.llm_agent offers on an instance of the world (tools mode), the GUI
    tools included when `gui` (a task declaring the gui interface)."""
    with env.open(world_hash) as instance:
        infos = instance.list_tools()
    return tool_schemas(infos, gui=gui)


def conversable(task: Task, episode: Episode) -> str | None:
    """Why an episode is not an agent's conversation under the task (see the module's
    docstring), or None when it is."""
    for call in episode.calls:
        if not isinstance(call, GuiCall):
            continue
        if call.action not in GUI_ACTIONS:
            return f"GUI call {call.index} ({call.action!r}) is no agent tool's"
        if not offers_gui(task):
            return f"GUI call {call.index}, but task {task.task_id!r} does not declare gui"
    return None


def episode_messages(task: Task, episode: Episode) -> list[dict[str, Any]]:
    """The conversation of one episode (see the module's docstring); RLError for an
    episode that is not an agent's conversation (``conversable``)."""
    problem = conversable(task, episode)
    if problem is not None:
        raise RLError(f"episode of task {task.task_id!r}: {problem}")
    messages: list[dict[str, Any]] = [_message(m["role"], m["content"])
                                      for m in prompt_messages(task, "tools")]
    for i, call in enumerate(episode.calls):
        call_id = f"call_{i}"
        note = None
        if isinstance(call, ToolCall):
            name, arguments = call.tool, dict(call.arguments)
            observation, is_error = call.text, call.is_error
        elif isinstance(call, GuiCall):
            name, arguments = f"gui_{call.action}", dict(call.arguments)
            observation, is_error = call.text, call.is_error
            if call.screenshot is not None:
                note = screenshot_note(screenshot_caption(call.action, call.text))
        else:
            name, arguments = SHELL, {"command": call.command}
            shell = shell_result(call)
            observation, is_error = shell.text, shell.is_error
        messages.append(_assistant_call(call_id, name, arguments))
        messages.append(_message("tool", shown(observation, is_error), tool_call_id=call_id))
        if note is not None:
            messages.append(_message("user", note))
    if episode.answer is not None:
        messages.append(_assistant_call(f"call_{len(episode.calls)}", ANSWER,
                                        {"text": episode.answer}))
    return messages


def sft_rows(worlds: Worlds, pack: Pack, *, split: str | None = "sft",
             allow_eval_split: bool = False) -> list[dict[str, Any]]:
    """One row per stored episode of the pack's tasks (those of `split`, or all of them
    when None) whose verdict passes now; ordered by task (in pack or split order), then
    episode id. RLError when a task's world is not in the store, when no episode passes,
    or when one is of an eval-split task and not `allow_eval_split` (nothing is kept)."""
    tasks = (split_tasks(pack, split) if split is not None
             else [load_task(pack.task_dir(name)) for name in pack.tasks])
    env = Environment(worlds)
    rows: list[dict[str, Any]] = []
    tools_by_world: dict[tuple[str, bool], str] = {}
    try:
        for task in tasks:
            check_task_world(worlds, pack, task)
            for summary in list_episodes(worlds, task=task.task_id):
                if summary.world_hash != task.spec.world_hash:
                    continue  # another world's episode under this task id: not this task
                if not verify_episode_of_task(worlds, task, summary.episode_id).passed:
                    continue
                episode = load_episode(worlds, summary.episode_id)
                if conversable(task, episode) is not None:
                    continue  # GUI calls the agent could not have made
                key = (task.spec.world_hash, offers_gui(task))
                if key not in tools_by_world:
                    tools_by_world[key] = json.dumps(offered_tools(env, key[0], gui=key[1]),
                                                     ensure_ascii=False)
                rows.append({"messages": episode_messages(task, episode),
                             "tools": tools_by_world[key],
                             "data_source": DATA_SOURCE_PREFIX + pack.name,
                             "task_id": task.task_id, "episode_id": summary.episode_id})
    finally:
        env.close()
    if not rows:
        which = f"split {split!r}" if split is not None else "any task"
        raise RLError(f"no stored episode of {which} of pack {pack.name!r} passes its "
                      "verifier; store successful rollouts first (worldctl rollout "
                      "TASK_DIR --agent scripted:reference)")
    if not allow_eval_split:
        _refuse_eval_split(pack, rows)
    return rows


def write_sft_dataset(worlds: Worlds, pack: Pack, out: Path, *, split: str | None = "sft",
                      allow_eval_split: bool = False) -> list[dict[str, Any]]:
    """Write the rows of `sft_rows` to the parquet file `out`; returns them (nothing is
    written when they are refused)."""
    rows = sft_rows(worlds, pack, split=split, allow_eval_split=allow_eval_split)
    write_parquet(rows, out, schema=_schema())
    return rows


def decode_tools(value: object) -> object:
    """A row's ``tools`` as the schemas (JSON text decoded; anything else as it is)."""
    return json.loads(value) if isinstance(value, str) else value


def sft_dataset_class() -> type:
    """verl's MultiTurnSFTDataset reading ``tools`` as JSON text (imports verl)."""
    global _DATASET_CLASS
    if _DATASET_CLASS is None:
        from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

        class WorldSFTDataset(MultiTurnSFTDataset):
            """MultiTurnSFTDataset with the ``tools`` column decoded from JSON text."""

            def _read_files_and_process(self) -> None:
                super()._read_files_and_process()  # type: ignore[no-untyped-call]
                if self.tools is not None:
                    self.tools = [decode_tools(t) for t in self.tools]

        # importable by name (pickle, verl's loader): rl.sft.WorldSFTDataset is this class
        WorldSFTDataset.__module__ = __name__
        WorldSFTDataset.__qualname__ = SFT_DATASET_CLASS
        _DATASET_CLASS = WorldSFTDataset
    return _DATASET_CLASS


_DATASET_CLASS: type | None = None


def __getattr__(name: str) -> Any:
    # verl's custom_cls loader does getattr(rl.sft, "WorldSFTDataset").
    if name == SFT_DATASET_CLASS:
        return sft_dataset_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --- internals ----------------------------------------------------------------------------


def _refuse_eval_split(pack: Pack, rows: list[dict[str, Any]]) -> None:
    """RLError naming the first row of an eval-split task (and how many more there are):
    the warm start would train on the tasks the model is then evaluated on."""
    held_out = set(pack.splits.get("eval", ()))
    leaked = [r for r in rows if r["task_id"] in held_out]
    if not leaked:
        return
    first = leaked[0]
    more = (f" (and {len(leaked) - 1} more episode{'s' if len(leaked) > 2 else ''} of "
            "eval-split tasks)" if len(leaked) > 1 else "")
    raise RLError(f"episode {first['episode_id']} of task {first['task_id']!r} is of the "
                  f"eval split of pack {pack.name!r}{more}: training on it leaks the "
                  "evaluation; use --split sft (or rl), or pass --allow-eval-split to train "
                  "on it anyway")


def _message(role: str, content: str, *, tool_calls: list[dict[str, Any]] | None = None,
             tool_call_id: str | None = None) -> dict[str, Any]:
    return {"role": role, "content": content, "tool_calls": tool_calls,
            "tool_call_id": tool_call_id}


def _assistant_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return _message("assistant", "", tool_calls=[{
        "id": call_id, "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}])


def _schema() -> Any:
    import polars as pl

    call = pl.Struct({"id": pl.String, "type": pl.String,
                      "function": pl.Struct({"name": pl.String, "arguments": pl.String})})
    message = pl.Struct({"role": pl.String, "content": pl.String,
                         "tool_calls": pl.List(call), "tool_call_id": pl.String})
    return {"messages": pl.List(message), "tools": pl.String, "data_source": pl.String,
            "task_id": pl.String, "episode_id": pl.String}


__all__ = ["SFT_DATASET_CLASS", "conversable", "decode_tools", "episode_messages",
           "offered_tools", "sft_dataset_class", "sft_rows", "write_sft_dataset"]
