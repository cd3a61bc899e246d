"""The SFT warm start: the stored episodes of a pack's tasks that pass their verifier now,
as the conversations the LLM agent would have had, in a file verl's multi-turn SFT
dataset loads (through ``data.custom_cls`` = ``pkg://rl.sft`` ``WorldSFTDataset``)."""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from pathlib import Path

import msgspec
import polars as pl
import pytest

from gates.agents import scripted
from gates.contract import AnswerStep, Rollout, ShellStep, ToolStep
from gates.llm_agent import ANSWER, ANSWER_TOOL, SHELL, SHELL_TOOL, SYSTEM_PROMPT
from gates.rollout import run_rollout
from gates.task import load_task
from packs.registry import Pack, load_pack
from replay.engine import Worlds
from rl.errors import RLError
from rl.sft import SFT_DATASET_CLASS, decode_tools, sft_rows, write_sft_dataset
from tests.support.rl_tokenizer import tiny_tokenizer
from worldenv.instances.instance import Environment

SFT_TASK = "nordlys-deposit-invoice"  # the demo pack's sft split
RL_TASK = "mats-work-order"
EVAL_TASK = "nordlys-delivery-checklist"  # the demo pack's eval split


@pytest.fixture(scope="module")
def pack() -> Pack:
    return load_pack("demo")


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory, pack: Pack
           ) -> Iterator[tuple[Worlds, dict[str, Rollout]]]:
    """A store with the demo world and scripted rollouts: the reference (passes) and
    answer-only (fails) on the sft task, the reference on an rl task and on an eval task
    (as an `eval run` leaves them)."""
    worlds = Worlds.open(str(tmp_path_factory.mktemp("rl-sft") / "store"), create=True)
    for log in pack.worlds:
        worlds.import_file(log)
    done: dict[str, Rollout] = {}
    with Environment(worlds) as env:
        for task_id, agent in [(SFT_TASK, "reference"), (SFT_TASK, "answer-only"),
                               (RL_TASK, "reference"), (EVAL_TASK, "reference")]:
            task = load_task(pack.task_dir(task_id))
            done[f"{task_id}/{agent}"] = run_rollout(env, task, scripted(agent), hinted=False)
    assert done[f"{SFT_TASK}/reference"].succeeded
    assert not done[f"{SFT_TASK}/answer-only"].succeeded
    yield worlds, done
    worlds.close()


def test_only_episodes_that_pass_now_are_kept(pack: Pack,
                                              stored: tuple[Worlds, dict[str, Rollout]]) -> None:
    worlds, done = stored
    (only,) = sft_rows(worlds, pack)  # the sft split by default
    assert only["episode_id"] == done[f"{SFT_TASK}/reference"].episode_id
    assert only["data_source"] == "agent_worlds/demo"
    assert sft_rows(worlds, pack, split="sft") == [only]
    (rl,) = sft_rows(worlds, pack, split="rl")
    assert rl["episode_id"] == done[f"{RL_TASK}/reference"].episode_id
    every = sft_rows(worlds, pack, split=None, allow_eval_split=True)
    assert [(r["task_id"], r["episode_id"]) for r in every] == sorted(
        [(t, done[f"{t}/reference"].episode_id) for t in (SFT_TASK, RL_TASK, EVAL_TASK)],
        key=lambda pair: pack.tasks.index(pair[0]))


def test_episodes_of_eval_split_tasks_are_refused_unless_asked(
        pack: Pack, stored: tuple[Worlds, dict[str, Rollout]], tmp_path: Path) -> None:
    """Every task or the eval split itself: the eval task's passing episode is named, and
    nothing is written; asked for explicitly, it is kept."""
    worlds, done = stored
    episode_id = done[f"{EVAL_TASK}/reference"].episode_id
    refusal = (rf"episode {episode_id} of task '{EVAL_TASK}' is of the eval split of pack "
               r"'demo'.*--allow-eval-split")
    out = tmp_path / "sft.parquet"
    for split in (None, "eval"):
        with pytest.raises(RLError, match=refusal):
            write_sft_dataset(worlds, pack, out, split=split)
        assert not out.exists()
    (row,) = write_sft_dataset(worlds, pack, out, split="eval", allow_eval_split=True)
    assert row["episode_id"] == episode_id and out.is_file()


def test_the_conversation_is_the_agents(pack: Pack,
                                        stored: tuple[Worlds, dict[str, Rollout]]) -> None:
    worlds, done = stored
    rollout = done[f"{SFT_TASK}/reference"]
    task = load_task(pack.task_dir(SFT_TASK))
    (row,) = sft_rows(worlds, pack, split="sft")
    messages = row["messages"]
    assert messages[0] == {"role": "system", "content": SYSTEM_PROMPT, "tool_calls": None,
                           "tool_call_id": None}
    assert messages[1]["role"] == "user"
    assert messages[1]["content"] == task.instruction(hinted=False)
    turns = rollout.trajectory.turns
    body = messages[2:]
    assert len(body) == 2 * len(turns) - 1  # a call and its result per turn; the answer alone
    for i, turn in enumerate(turns):
        call = body[2 * i]
        assert call["role"] == "assistant" and call["content"] == ""
        (tool_call,) = call["tool_calls"]
        assert tool_call["id"] == f"call_{i}" and tool_call["type"] == "function"
        name, arguments = tool_call["function"]["name"], json.loads(
            tool_call["function"]["arguments"])
        step = turn.step
        if isinstance(step, ToolStep):
            assert (name, arguments) == (step.tool, step.arguments)
        elif isinstance(step, ShellStep):
            assert (name, arguments) == (SHELL, {"command": step.command})
        else:
            assert isinstance(step, AnswerStep) and i == len(turns) - 1
            assert (name, arguments) == (ANSWER, {"text": step.text})
            continue
        result = body[2 * i + 1]
        assert result["role"] == "tool" and result["tool_call_id"] == f"call_{i}"
        shown = f"[error] {turn.observation}" if turn.is_error else turn.observation
        assert result["content"] == shown


def test_the_tools_are_those_the_agent_is_offered(pack: Pack,
                                                  stored: tuple[Worlds, dict[str, Rollout]]
                                                  ) -> None:
    worlds, _ = stored
    (row,) = sft_rows(worlds, pack, split="sft")
    tools = decode_tools(row["tools"])
    assert isinstance(tools, list)
    task = load_task(pack.task_dir(SFT_TASK))
    with Environment(worlds) as env, env.open(task.spec.world_hash) as instance:
        infos = instance.list_tools()
    assert [t["function"]["name"] for t in tools] == [i.name for i in infos] + [SHELL, ANSWER]
    assert tools[-2:] == [SHELL_TOOL, ANSWER_TOOL]
    for tool, info in zip(tools, infos, strict=False):
        assert tool["function"]["parameters"] == info.input_schema
        assert tool["function"]["description"] == info.description


def test_the_file_is_deterministic_and_loads_in_verl(pack: Pack,
                                                     stored: tuple[Worlds, dict[str, Rollout]],
                                                     tmp_path: Path) -> None:
    from omegaconf import OmegaConf
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset
    from verl.utils.import_utils import load_extern_object

    worlds, _ = stored
    rows = write_sft_dataset(worlds, pack, tmp_path / "a.parquet")
    write_sft_dataset(worlds, pack, tmp_path / "b.parquet")
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    assert pl.read_parquet(tmp_path / "a.parquet").to_dicts() == rows

    cls = load_extern_object("pkg://rl.sft", SFT_DATASET_CLASS)  # verl's custom_cls loader
    assert isinstance(cls, type) and issubclass(cls, MultiTurnSFTDataset)
    config = OmegaConf.create({"max_length": 200_000, "pad_mode": "no_padding",
                               "truncation": "error", "messages_key": "messages",
                               "tools_key": "tools"})
    tok = tiny_tokenizer(None)
    dataset = cls(str(tmp_path / "a.parquet"), tok, config)
    assert len(dataset) == len(rows)
    for i, row in enumerate(rows):
        assert dataset.tools[i] == json.loads(row["tools"])
        item = dataset[i]  # tokenizes turn by turn; verl checks it equals the whole
        ids, mask = item["input_ids"], item["loss_mask"]
        assert ids.shape == mask.shape and 0 < int(mask.sum()) < len(ids)
        trained = tok.decode(ids[mask.bool()].tolist())
        assert "<tool_call>" in trained and '"name": "answer"' in trained
        assert "<tool_response>" not in trained and SYSTEM_PROMPT not in trained
        whole = tok.apply_chat_template(msgspec.convert(row["messages"], list[dict[str, object]]),
                                        tools=json.loads(row["tools"]), tokenize=False)
        assert tok.decode(ids.tolist()) == whole
    assert pickle.loads(pickle.dumps(dataset)).tools == dataset.tools  # for spawned workers
    # verl's own class as it is reads the column as the JSON text (why the subclass exists)
    stock = MultiTurnSFTDataset(str(tmp_path / "a.parquet"), tok, config)
    assert stock.tools is not None and isinstance(stock.tools[0], str)
