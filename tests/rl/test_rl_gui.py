"""Training on a task that declares the gui interface: the RL dataset's prompt, the tools
the runtime offers, verl's agent loop (on CPU, a scripted token server) executing GUI
calls in the real browser with the screenshot's note where an image would be, and the
SFT conversation of a stored GUI episode."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

from gates.agents import reference_agent
from gates.contract import AnswerStep, GuiStep, Step, ToolStep
from gates.llm_agent import (
    GUI_SYSTEM_PROMPT,
    SYSTEM_PROMPT,
    screenshot_caption,
    screenshot_note,
)
from gates.rollout import open_task_instance
from gates.task import Task, load_task
from packs.registry import Pack, load_pack
from replay import Worlds
from rl.dataset import rl_rows
from rl.errors import RLError
from rl.sft import conversable, episode_messages, offered_tools, sft_rows
from rl.world import WorldRuntime
from tests.gates.test_llm_agent_gui import ANSWER, GUI_NAMES, GUI_TASK, write_gui_task
from tests.support.rl_harness import (
    DEMO_JSONL,
    ScriptedServer,
    batch_of,
    demo_store,
    tiny_model,
    tokenizer_of,
    verl_config,
)
from worldenv.core.episode import GuiCall, ToolCall
from worldenv.gui.tools import GUI_TOOLS
from worldenv.instances.episodes import load_episode, save_episode
from worldenv.instances.instance import Environment

PACK_NAME = "guipack"
CART_NOTE = screenshot_note("screenshot after gui_click — page: Cart · AVLager — /shop/cart")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with demo_store(tmp_path_factory.mktemp("rl-gui")) as location:
        yield location


@pytest.fixture(scope="module")
def packs(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An installed packs folder with one pack: the demo world and the GUI task (lars@7,
    its hash as this store has it) in its rl split."""
    root = tmp_path_factory.mktemp("packs")
    pack = root / PACK_NAME
    (pack / "world").mkdir(parents=True)
    shutil.copyfile(DEMO_JSONL, pack / "world" / "lars.jsonl")
    with Worlds.open(store) as worlds:
        world_hash = worlds.resolve("lars@7").world_hash
    write_gui_task(pack / "tasks", world_hash)
    (pack / "pack.json").write_text(json.dumps({
        "name": PACK_NAME, "title": "A GUI task", "description": "The GUI tests' pack.",
        "worlds": ["world/lars.jsonl"], "splits": "splits.json", "format": 1}),
        encoding="utf-8")
    (pack / "splits.json").write_text(json.dumps({"rl": [GUI_TASK]}), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def pack(packs: Path) -> Pack:
    return load_pack(PACK_NAME, packs)


@pytest.fixture(scope="module")
def task(pack: Pack) -> Task:
    return load_task(pack.task_dir(GUI_TASK))


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("tiny-model"))


def call_text(step: Step) -> str:
    """A step as the model writes it in the hermes format (GUI steps included)."""
    if isinstance(step, GuiStep):
        name, arguments = f"gui_{step.action}", dict(step.arguments)
    elif isinstance(step, ToolStep):
        name, arguments = step.tool, dict(step.arguments)
    else:
        assert isinstance(step, AnswerStep)
        name, arguments = "answer", {"text": step.text}
    return ("<think>Next.</think>\n<tool_call>\n"
            + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call><|im_end|>")


def test_the_rl_prompt_of_a_gui_task_is_the_gui_agents(pack: Pack) -> None:
    (row,) = rl_rows(pack, "rl")
    assert row["prompt"][0] == {"role": "system", "content": GUI_SYSTEM_PROMPT}
    assert row["extra_info"]["interfaces"] == ["mcp", "gui"]
    with pytest.raises(RLError, match="offers no GUI tools"):  # meta mode has no GUI
        rl_rows(pack, "rl", mode="meta")
    demo = rl_rows(load_pack("demo"), "rl")
    assert {r["prompt"][0]["content"] for r in demo} == {SYSTEM_PROMPT}


def test_the_runtime_offers_gui_tools_only_to_a_gui_task_in_tools_mode(
        store: Path, task: Task) -> None:
    with Worlds.open(store) as worlds:
        runtime = WorldRuntime(worlds)
        try:
            instance = open_task_instance(runtime.environment, task)
            try:
                plain, plain_names = runtime.tools(instance, "tools")
                gui, gui_names = runtime.tools(instance, "tools", gui=True)
                meta, _ = runtime.tools(instance, "meta", gui=True)
                n = len(instance.list_tools())
            finally:
                instance.close()
        finally:
            runtime.close()
    assert not GUI_NAMES & plain_names and gui_names >= GUI_NAMES
    assert len(plain) == n + 2 and len(gui) == n + len(GUI_TOOLS) + 2
    assert [t["function"]["name"] for t in gui[n:n + len(GUI_TOOLS)]] == [
        t.name for t in GUI_TOOLS]
    assert [t["function"]["name"] for t in meta] == ["list_tools", "call_tool", "answer"]


def run_worker(config: Any, server: ScriptedServer, rows: list[dict[str, Any]]) -> Any:
    worker = AgentLoopWorker(config, server)
    return asyncio.run(worker.generate_sequences(batch_of(rows)))


def test_the_verl_loop_offers_and_executes_gui_tools(
        store: Path, packs: Path, pack: Pack, task: Task, model: Path) -> None:
    """The reference solution (open, click the panel, Add to cart, the shop's cart tool,
    answer) through verl's worker: the model was offered the GUI tools, each GUI call
    ran in the instance's browser, and after each one the context holds the tool result
    (page title and path) and the screenshot's note, never an image."""
    steps = task.solution.steps
    config = verl_config(model, f"+agent_worlds.packs_dir={packs}")
    tokenizer = tokenizer_of(model)
    server = ScriptedServer(tokenizer, lambda _k, _p: lambda n, _prompt: call_text(
        steps[n % len(steps)]))
    out = run_worker(config, server, rl_rows(pack, "rl"))
    [prompts] = server.prompts.values()
    texts = [tokenizer.decode(p) for p in prompts[:len(steps)]]
    first = texts[0]
    assert GUI_SYSTEM_PROMPT in first and '"name": "gui_open"' in first
    assert "page: Products · AVLager — /shop/products" in texts[1]
    assert screenshot_note("screenshot after gui_open — page: Products · AVLager — "
                           "/shop/products") in texts[1]
    assert "clicked link \"1U blank panel\"" in texts[2]
    assert CART_NOTE in texts[3] and CART_NOTE in texts[4]
    assert "RCK-BLANK-1U" in texts[4].split(CART_NOTE)[-1]  # the cart tool's result
    assert "image" not in texts[4].split(GUI_SYSTEM_PROMPT)[-1].lower()
    # The model's own tokens, then the tool turns and the note: nothing re-tokenized.
    [generated] = server.outputs.values()
    for before, output, after in zip(prompts[:len(steps) - 1], generated[:len(steps) - 1],
                                     prompts[1:len(steps)], strict=True):
        assert after[: len(before) + len(output)] == before + output
    assert out.batch["responses"].shape[0] == 1


def test_a_gui_rollout_in_the_verl_loop_is_graded_by_its_verifier(
        store: Path, packs: Path, pack: Pack, task: Task, model: Path) -> None:
    steps = task.solution.steps
    config = verl_config(model, f"+agent_worlds.packs_dir={packs}")
    server = ScriptedServer(tokenizer_of(model), lambda _k, _p: lambda n, _prompt: call_text(
        steps[n % len(steps)]))
    out = run_worker(config, server, rl_rows(pack, "rl"))
    assert list(out.non_tensor_batch["env_error"]) == [0]
    mask = out.batch["response_mask"][0]
    response = out.batch["responses"][0]
    tokenizer = tokenizer_of(model)
    untrained = tokenizer.decode([int(t) for t, m in zip(response.tolist(), mask.tolist(),
                                                         strict=True) if not m and t])
    assert CART_NOTE in untrained  # the note is context, never trained on
    assert list(out.non_tensor_batch["V"]) == [1]
    assert list(out.non_tensor_batch["interfaces"]) == ["gui,mcp"]
    with Worlds.open(store) as worlds:
        episode = load_episode(worlds, str(out.non_tensor_batch["episode_id"][0]))
    assert [c.action for c in episode.calls if isinstance(c, GuiCall)] == [
        "open", "click", "click"]


@pytest.fixture(scope="module")
def gui_episode(store: Path, task: Task) -> Iterator[tuple[Worlds, str]]:
    """The reference solution played on an instance and stored as the task's episode
    (ungraded: as the RL loop stores it)."""
    worlds = Worlds.open(store)
    with Environment(worlds) as env:
        instance = open_task_instance(env, task)
        try:
            trajectory = reference_agent().run(instance, task, hinted=False)
            instance.episode = msgspec.structs.replace(
                instance.episode, answer=trajectory.answer, task=task.task_id,
                agent="scripted:reference")
            episode_id = save_episode(worlds, instance)
        finally:
            instance.close()
    yield worlds, episode_id
    worlds.close()


def test_the_sft_conversation_of_a_gui_episode(gui_episode: tuple[Worlds, str],
                                               task: Task) -> None:
    worlds, episode_id = gui_episode
    episode = load_episode(worlds, episode_id)
    assert conversable(task, episode) is None
    messages = episode_messages(task, episode)
    assert messages[0]["content"] == GUI_SYSTEM_PROMPT
    body = messages[2:]
    roles = [m["role"] for m in body]
    # per GUI call: the call, its result, the screenshot's note; the tool call; the answer
    assert roles == ["assistant", "tool", "user"] * 3 + ["assistant", "tool", "assistant"]
    calls = [(m["tool_calls"][0]["function"]["name"],
              json.loads(m["tool_calls"][0]["function"]["arguments"]))
             for m in body if m["tool_calls"]]
    assert calls == [(f"gui_{s.action}", s.arguments) if isinstance(s, GuiStep)
                     else (s.tool, s.arguments) if isinstance(s, ToolStep)
                     else ("answer", {"text": ANSWER}) for s in task.solution.steps]
    gui_calls = [c for c in episode.calls if isinstance(c, GuiCall)]
    notes = [m["content"] for m in body if m["role"] == "user"]
    assert notes == [screenshot_note(screenshot_caption(c.action, c.text)) for c in gui_calls]
    assert notes[-1] == CART_NOTE
    assert body[1]["content"].startswith("page: Products · AVLager — /shop/products")
    assert isinstance(episode.calls[3], ToolCall)


def test_sft_offers_the_gui_tools_and_refuses_gui_calls_no_agent_made(
        gui_episode: tuple[Worlds, str], task: Task, store: Path) -> None:
    worlds, episode_id = gui_episode
    with Environment(worlds) as env:
        with_gui = offered_tools(env, task.spec.world_hash, gui=True)
        without = offered_tools(env, task.spec.world_hash)
    assert len(with_gui) == len(without) + len(GUI_TOOLS)
    assert {t["function"]["name"] for t in with_gui} >= GUI_NAMES
    assert not GUI_NAMES & {t["function"]["name"] for t in without}
    episode = load_episode(worlds, episode_id)
    # A page request made outside the agent's tools has no tool to stand for it.
    odd = msgspec.structs.replace(episode, events=[
        msgspec.structs.replace(e, action="request") if isinstance(e, GuiCall) else e
        for e in episode.events])
    assert "no agent tool's" in (conversable(task, odd) or "")
    with pytest.raises(RLError, match="no agent tool's"):
        episode_messages(task, odd)
    # GUI calls under a task that does not declare gui: not its agent's conversation.
    plain = msgspec.structs.replace(task.spec, interfaces=["mcp"], subtasks=[
        s for s in task.spec.subtasks if s.interface == "mcp"])
    assert "does not declare gui" in (conversable(dataclasses.replace(task, spec=plain),
                                                  episode) or "")


def test_the_sft_conversation_loads_in_verls_multiturn_dataset(
        gui_episode: tuple[Worlds, str], task: Task, tmp_path: Path) -> None:
    """The screenshot notes are user turns between tool results and the next call: verl
    tokenizes the conversation turn by turn (checking it equals the whole) and trains on
    the calls only."""
    from omegaconf import OmegaConf

    from rl.dataset import write_parquet
    from rl.sft import SFT_DATASET_CLASS, _schema, sft_dataset_class
    from tests.support.rl_tokenizer import tiny_tokenizer

    worlds, episode_id = gui_episode
    with Environment(worlds) as env:
        tools = offered_tools(env, task.spec.world_hash, gui=True)
    row = {"messages": episode_messages(task, load_episode(worlds, episode_id)),
           "tools": json.dumps(tools, ensure_ascii=False), "data_source": "agent_worlds/x",
           "task_id": task.task_id, "episode_id": episode_id}
    write_parquet([row], tmp_path / "sft.parquet", schema=_schema())
    config = OmegaConf.create({"max_length": 200_000, "pad_mode": "no_padding",
                               "truncation": "error", "messages_key": "messages",
                               "tools_key": "tools"})
    tok = tiny_tokenizer(None)
    dataset = sft_dataset_class()(str(tmp_path / "sft.parquet"), tok, config)
    assert sft_dataset_class().__qualname__ == SFT_DATASET_CLASS
    item = dataset[0]
    ids, mask = item["input_ids"], item["loss_mask"]
    trained = tok.decode(ids[mask.bool()].tolist())
    assert '"name": "gui_click"' in trained and '"name": "answer"' in trained
    assert CART_NOTE not in trained and CART_NOTE in tok.decode(ids.tolist())


def test_sft_rows_keep_a_passing_gui_episode_with_the_gui_tools(
        gui_episode: tuple[Worlds, str], pack: Pack) -> None:
    worlds, episode_id = gui_episode
    rows = sft_rows(worlds, pack, split="rl")  # the RL loop's passing rollouts, stored
    (row,) = [r for r in rows if r["episode_id"] == episode_id]
    assert {r["task_id"] for r in rows} == {GUI_TASK}
    assert {t["function"]["name"] for t in json.loads(row["tools"])} >= GUI_NAMES
    assert row["messages"][0]["content"] == GUI_SYSTEM_PROMPT
