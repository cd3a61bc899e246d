"""The RL dataset: rows in verl's RLHFDataset schema whose prompt is exactly what the agent
is shown, the same bytes for the same pack, one clear refusal for a split or store that
cannot train, and a file verl's own RLHFDataset loads (with a tokenizer built here)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from types import MappingProxyType

import msgspec
import polars as pl
import pytest

from gates.llm_agent import (
    GUI_SYSTEM_PROMPT,
    META_SYSTEM_PROMPT,
    SYSTEM_PROMPT,
    LLMAgent,
    _Rollout,
    offers_gui,
)
from gates.task import load_task
from packs.registry import Pack, load_pack
from replay.engine import Worlds
from rl.contract import AGENT_NAME, DATA_SOURCE_PREFIX, RowInfo
from rl.dataset import COLUMNS, rl_rows, row_info, write_rl_dataset
from rl.errors import RLError
from tests.support.rl_tokenizer import SPECIAL_TOKENS, tiny_tokenizer
from worldllm.client import LLMClient

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pack() -> Pack:
    return load_pack("demo")


@pytest.fixture(scope="module")
def worlds(demo_worlds: Worlds) -> Worlds:
    return demo_worlds  # the shared demo store (tests/conftest.py), this module's copy


MCP_TASK = "shop-cart-count"


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory, pack: Pack, worlds: Worlds) -> Pack:
    """The demo pack with an MCP-only task (what meta mode can solve) in its rl split and
    beside a demo task that needs the shell in its eval split."""
    tasks = tmp_path_factory.mktemp("mixed-tasks")
    folder = tasks / MCP_TASK
    (folder / "verifier").mkdir(parents=True)
    (folder / "task.json").write_text(json.dumps({
        "task_id": MCP_TASK, "instruction": "How many items are in my shop cart?",
        "world": "lars@7", "world_hash": worlds.resolve("lars@7").world_hash,
        "interfaces": ["mcp"], "difficulty": "unlabeled",
        "subtasks": [{"description": "Read the cart with the shop's tools.",
                      "interface": "mcp"}]}), encoding="utf-8")
    (folder / "solution.json").write_text(json.dumps({"steps": [
        {"kind": "tool", "tool": "shop_get_cart", "arguments": {}},
        {"kind": "answer", "text": "none"}]}), encoding="utf-8")
    (folder / "verifier" / "answer.py").write_text(
        "import awsdk\n\nawsdk.result(answered=bool(awsdk.worlds().answer))\n",
        encoding="utf-8")
    (folder / "rubric.md").write_text("Completed when the count is given.\n", encoding="utf-8")
    (folder / "hint.md").write_text("Use shop_get_cart.\n", encoding="utf-8")
    shell_task = "mats-work-order"
    shutil.copytree(pack.task_dir(shell_task), tasks / shell_task)
    return dataclasses.replace(pack, tasks_dir=tasks, tasks=(MCP_TASK, shell_task),
                               splits=MappingProxyType({"sft": (), "rl": (MCP_TASK,),
                                                        "eval": (MCP_TASK, shell_task)}))


def test_rows_have_verls_columns_and_the_row_info(pack: Pack, worlds: Worlds) -> None:
    rows = rl_rows(pack, "rl", worlds=worlds)
    assert [r["extra_info"]["task_id"] for r in rows] == list(pack.splits["rl"])
    for index, row in enumerate(rows):
        assert tuple(row) == COLUMNS
        task = load_task(pack.task_dir(row["extra_info"]["task_id"]))
        assert row["data_source"] == DATA_SOURCE_PREFIX + "demo"
        assert row["agent_name"] == AGENT_NAME
        assert row["ability"] == "agent"
        assert row["reward_model"] == {"style": "rule", "ground_truth": task.task_id}
        assert row_info(row) == RowInfo(
            pack="demo", task_id=task.task_id, world=task.spec.world,
            world_hash=task.spec.world_hash, interfaces=list(task.spec.interfaces),
            mode="tools", reward="wildawm", split="rl", index=index)


@pytest.mark.parametrize("mode", ["tools", "meta"])
def test_the_prompt_is_what_the_llm_agent_shows(pack: Pack, mixed: Pack, mode: str) -> None:
    # The demo's eval split holds a GUI task; meta mode (no shell, no GUI tools) can only
    # be offered an MCP-only task.
    split, found = ("eval", pack) if mode == "tools" else ("rl", mixed)
    rows = rl_rows(found, split, mode=mode, reward="awm")  # type: ignore[arg-type]
    assert rows
    agent = LLMAgent(LLMClient(model="none"), mode=mode)  # type: ignore[arg-type]
    for row in rows:
        task = load_task(found.task_dir(row["extra_info"]["task_id"]))
        gui = mode == "tools" and offers_gui(task)  # the agent's GUI prompt
        shown = _Rollout(agent, None, task.instruction(hinted=False), gui=gui)._context()  # type: ignore[arg-type]
        assert row["prompt"] == shown
        assert row["prompt"][0]["content"] == (META_SYSTEM_PROMPT if mode == "meta"
                                               else GUI_SYSTEM_PROMPT if gui
                                               else SYSTEM_PROMPT)
        assert row["extra_info"]["mode"] == mode and row["extra_info"]["reward"] == "awm"
        assert row["extra_info"]["split"] == split


def test_a_mode_that_cannot_offer_a_tasks_interfaces_is_refused(
        pack: Pack, mixed: Pack, tmp_path: Path) -> None:
    """Meta mode offers AWM's list_tools/call_tool and answer only: a task that needs the
    shell (or the GUI) could never be solved there, so its split is refused, naming the
    task and its interfaces, and nothing is written. Tools mode offers them all."""
    out = tmp_path / "meta.parquet"
    with pytest.raises(RLError, match=r"split 'eval' of pack 'demo': meta mode .* offers no "
                                      r"shell, which task mats-work-order \(mcp, shell\) "
                                      r"needs: unsolvable there; use --mode tools"):
        write_rl_dataset(mixed, out, "eval", mode="meta")
    assert not out.exists()
    with pytest.raises(RLError, match=r"offers no GUI tools and no shell, which tasks "
                                      r".*sjoboden-bar-surge-protectors \(mcp, shell, gui\)"):
        rl_rows(pack, "eval", mode="meta")
    assert len(rl_rows(mixed, "eval", mode="tools")) == 2


def test_the_same_pack_gives_the_same_bytes(pack: Pack, tmp_path: Path) -> None:
    first = write_rl_dataset(pack, tmp_path / "a" / "train.parquet")
    write_rl_dataset(pack, tmp_path / "b" / "train.parquet")
    data = (tmp_path / "a" / "train.parquet").read_bytes()
    assert data == (tmp_path / "b" / "train.parquet").read_bytes()
    assert pl.read_parquet(tmp_path / "a" / "train.parquet").to_dicts() == first
    assert not list((tmp_path / "a").glob(".*"))  # no scratch file left


def test_refusals_name_the_pack_split_or_task(pack: Pack, tmp_path: Path) -> None:
    with pytest.raises(RLError, match="no split 'train'"):
        rl_rows(pack, "train")
    empty = dataclasses.replace(pack, splits=MappingProxyType({**pack.splits, "rl": ()}))
    with pytest.raises(RLError, match="split 'rl' of pack 'demo' has no tasks"):
        write_rl_dataset(empty, tmp_path / "x.parquet")
    assert not (tmp_path / "x.parquet").exists()
    with pytest.raises(RLError, match="mode 'gui'"):
        rl_rows(pack, mode="gui")  # type: ignore[arg-type]
    with pytest.raises(RLError, match="reward 'v'"):
        rl_rows(pack, reward="v")  # type: ignore[arg-type]
    with Worlds.open(str(tmp_path / "empty"), create=True) as bare, pytest.raises(
            RLError, match=r"task 'nordlys-cart-vs-bom' of pack 'demo'.*lars@3 is not in the "
                           r"store"):
        rl_rows(pack, worlds=bare)


def test_a_task_written_for_another_world_is_refused(pack: Pack, worlds: Worlds,
                                                     tmp_path: Path) -> None:
    source = pack.task_dir("mats-work-order")
    copy = tmp_path / "tasks" / "mats-work-order"
    copy.parent.mkdir()
    import shutil

    shutil.copytree(source, copy)
    spec = msgspec.json.decode((copy / "task.json").read_bytes())
    spec["world_hash"] = "0" * 32
    (copy / "task.json").write_bytes(msgspec.json.encode(spec))
    moved = dataclasses.replace(pack, tasks_dir=tmp_path / "tasks", tasks=("mats-work-order",),
                                splits=MappingProxyType({"sft": (), "rl": ("mats-work-order",),
                                                         "eval": ()}))
    with pytest.raises(RLError, match="the task was written for another world"):
        rl_rows(moved, worlds=worlds)


def test_tiny_tokenizer_round_trips_any_text(tmp_path: Path) -> None:
    tok = tiny_tokenizer(tmp_path / "tok")
    assert (tmp_path / "tok" / "tokenizer.json").is_file()
    for text in ["plain", "æøå 日本語 🙂\n\t  spaced", '<tool_call>\n{"name": "x"}\n</tool_call>',
                 "<|im_start|>user\nhi<|im_end|>\n<think>hm</think>", "\x00\x7f bytes"]:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    for special in SPECIAL_TOKENS:
        (only,) = tok.encode(special, add_special_tokens=False)
        assert tok.convert_ids_to_tokens(only) == special


def test_verls_rlhf_dataset_loads_the_file(pack: Pack, worlds: Worlds, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    out = tmp_path / "train.parquet"
    rows = write_rl_dataset(pack, out, worlds=worlds)
    tok = tiny_tokenizer(None)
    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 100_000,
                               "filter_overlong_prompts": True,
                               "filter_overlong_prompts_workers": 1,
                               "cache_dir": str(tmp_path / "verl"), "return_raw_chat": True})
    dataset = RLHFDataset(str(out), tok, config)
    assert len(dataset) == len(rows)
    for i, row in enumerate(rows):
        item = dataset[i]
        assert item["raw_prompt"] == row["prompt"]
        assert item["agent_name"] == AGENT_NAME and item["data_source"] == row["data_source"]
        assert item["extra_info"] == row["extra_info"] and item["index"] == i
        assert msgspec.convert(item["extra_info"], RowInfo) == row_info(row)
    batch = collate_fn([dataset[0], dataset[1]])
    assert list(batch["agent_name"]) == [AGENT_NAME, AGENT_NAME]
    ids = tok.apply_chat_template(rows[0]["prompt"], tools=[], tokenize=True,
                                  add_generation_prompt=True)
    text = tok.decode(ids["input_ids"] if not isinstance(ids, list) else ids)
    assert text.endswith("<|im_start|>assistant\n") and SYSTEM_PROMPT in text
