"""The agent loop through verl's own worker path (``AgentLoopWorker.generate_sequences``
-> hydra-instantiated ``WorldAgentLoop`` -> our runtime), on CPU: a scripted server
answers verl's token-in/token-out calls with hermes tool calls, the tokenizer is built
locally, the worlds are the demo pack's in a real store, the shell is the real sandbox
and the verifier the real one.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from omegaconf import DictConfig
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker, DictConfigWrap

from gates.contract import AnswerStep, ShellStep, ToolStep
from gates.rewards import wildawm_reward
from gates.rollout import verify_episode_of_task
from gates.task import Task, load_task
from packs.registry import load_pack
from replay import Worlds
from rl.dataset import prompt_messages, rl_rows
from rl.errors import RLError
from rl.verl_loop import COMPACT_PROMPT, WorldAgentLoop
from tests.support.rl_harness import (
    ScriptedServer,
    batch_of,
    call_text,
    demo_store,
    replaying,
    tiny_model,
    tokenizer_of,
    verl_config,
)
from worldenv.instances.episodes import list_episodes, load_episode, verify_episode

PACK = load_pack("demo")
RL_TASKS = PACK.split("rl")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with demo_store(tmp_path_factory.mktemp("rl-loop")) as location:
        yield location


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("tiny-model"))


def task(name: str) -> Task:
    return load_task(PACK.task_dir(name))


def rows(*names: str, mode: str = "tools", reward: str = "wildawm") -> list[dict[str, Any]]:
    found = {r["extra_info"]["task_id"]: r for r in rl_rows(PACK, "rl",
                                                            reward=reward)}  # type: ignore[arg-type]
    if mode == "meta":
        # rl_rows refuses meta mode for the demo's tasks (they need the shell, which meta
        # mode does not offer); the loop's meta-mode mechanics are tested on their rows
        # as a meta-mode dataset would hold them.
        for name, row in found.items():
            row["prompt"] = prompt_messages(task(name), "meta")
            row["extra_info"]["mode"] = "meta"
    return [found[n] for n in names]


def run_worker(config: DictConfig, server: ScriptedServer, batch: Any) -> Any:
    worker = AgentLoopWorker(config, server)
    return asyncio.run(worker.generate_sequences(batch))


def extra(output: Any, key: str) -> list[Any]:
    return list(output.non_tensor_batch[key])


# --- solving tasks ------------------------------------------------------------------------


def test_the_reference_policy_solves_every_rl_task_and_the_reward_is_the_verifiers(
        store: Path, model: Path) -> None:
    """One rollout per task of the rl split: V = 1, reward 1, and the stored episode,
    graded again the way `worldctl task verify` does, gives the same verdict and reward;
    replaying it reproduces its recorded world."""
    config = verl_config(model)
    order = list(RL_TASKS)
    server = ScriptedServer(tokenizer_of(model), by_task)
    out = run_worker(config, server, batch_of(rows(*order)))
    assert extra(out, "V") == [1] * len(order)
    assert [float(s) for s in out.batch["rm_scores"].sum(-1)] == [1.0] * len(order)
    assert extra(out, "termination") == ["answer"] * len(order)
    assert extra(out, "interfaces") == ["mcp,shell"] * len(order)
    worlds = Worlds.open(store)
    try:
        for name, episode_id in zip(order, extra(out, "episode_id"), strict=True):
            verdict = verify_episode_of_task(worlds, task(name), episode_id)
            assert verdict.passed
            assert wildawm_reward(False, verdict) == 1.0
            assert verify_episode(worlds, episode_id)[0]
            assert load_episode(worlds, episode_id).task == name
    finally:
        worlds.close()


def by_task(k: int, prompt: str) -> Any:
    """The reference solution of the task whose instruction the prompt holds."""
    [name] = [n for n in RL_TASKS if task(n).instruction(hinted=False) in prompt]
    return replaying(task(name).solution.steps)


def test_masks_are_one_on_exactly_the_models_tokens_across_tool_turns(
        store: Path, model: Path) -> None:
    config = verl_config(model)
    name = RL_TASKS[0]
    server = ScriptedServer(tokenizer_of(model),
                            lambda _k, _p: replaying(task(name).solution.steps))
    out = run_worker(config, server, batch_of(rows(name)))
    mask = out.batch["response_mask"][0]
    response = out.batch["responses"][0]
    trained = [int(t) for t, m in zip(response.tolist(), mask.tolist(), strict=True) if m]
    [generated] = server.outputs.values()
    assert trained == [t for step in generated for t in step]
    tokenizer = tokenizer_of(model)
    untrained = tokenizer.decode([int(t) for t, m in zip(response.tolist(), mask.tolist(),
                                                         strict=True) if not m and t])
    assert untrained.count("<tool_response>") == len(generated) - 1  # every tool turn
    assert "<tool_call>" not in untrained  # the model's calls are its tokens, never re-rendered
    # The context of every call is exactly what came before it: the model's own tokens
    # as it generated them, then the tool turns (nothing re-tokenized in between).
    [prompts] = server.prompts.values()
    for before, output, after in zip(prompts, generated, prompts[1:], strict=False):
        assert after[: len(before) + len(output)] == before + output
    # the logprobs the server returned travel with the model's tokens
    logprobs = out.batch["rollout_log_probs"][0]
    assert {round(float(x), 4) for x, m in zip(logprobs, mask, strict=True) if m} == {-0.25}


def test_leaving_the_schemas_out_of_the_tool_turn_delta_changes_no_token(
        store: Path, model: Path) -> None:
    """The loop renders tool turns without the tool schemas once it has checked, token
    for token, that they do not change the delta: forcing the schemas in every time gives
    exactly the same contexts."""
    name = RL_TASKS[0]
    contexts = []
    for lean in ("true", "false"):
        server = ScriptedServer(tokenizer_of(model),
                                lambda _k, _p: replaying(task(name).solution.steps))
        config = verl_config(model, f"+agent_worlds.lean_tool_turns={lean}")
        run_worker(config, server, batch_of(rows(name)))
        [prompts] = server.prompts.values()
        contexts.append(prompts)
    assert contexts[0] == contexts[1]


def test_doing_nothing_gets_the_checklist_credit_only(store: Path, model: Path) -> None:
    config = verl_config(model)
    name = RL_TASKS[0]
    server = ScriptedServer(tokenizer_of(model), lambda _k, _p: replaying([]))
    out = run_worker(config, server, batch_of(rows(name)))
    [checks] = extra(out, "checks")
    [reward] = extra(out, "reward")
    assert extra(out, "V") == [0]
    assert reward == pytest.approx(0.1 * checks.count("1") / len(checks))
    assert float(out.batch["rm_scores"].sum()) == pytest.approx(reward)


# --- format failures, timeouts, infrastructure errors -----------------------------------------


@pytest.mark.parametrize("text", [
    "I think the task is done.<|im_end|>",  # no call at all
    '<tool_call>\n{"name": "shop_get_cart", "arguments": {broken</tool_call><|im_end|>',
    '<tool_call>\n{"name": "no_such_tool", "arguments": {}}\n</tool_call><|im_end|>',
    '<tool_call>\n{"name": "shell", "arguments": {"cmd": "ls"}}\n</tool_call><|im_end|>',
])
def test_a_format_failure_stops_with_minus_one_and_trains_only_that_step(
        store: Path, model: Path, text: str) -> None:
    name = RL_TASKS[0]
    first = call_text(ToolStep(tool="shop_get_cart"))
    server = ScriptedServer(tokenizer_of(model),
                            lambda _k, _p: lambda n, prompt: first if n == 0 else text)
    out = run_worker(verl_config(model), server, batch_of(rows(name)))
    assert extra(out, "format_error") == [1]
    assert extra(out, "termination")[0].startswith("format_error: ")
    assert float(out.batch["rm_scores"].sum()) == -1.0
    [generated] = server.outputs.values()
    assert len(generated) == 2
    mask = out.batch["response_mask"][0]
    response = out.batch["responses"][0]
    trained = [int(t) for t, m in zip(response.tolist(), mask.tolist(), strict=True) if m]
    assert trained == generated[1]  # the offending step's tokens only


def test_a_tool_call_that_hangs_times_out_and_the_rollout_goes_on(
        store: Path, model: Path) -> None:
    name = RL_TASKS[0]
    steps = [ShellStep(command="sleep 3; echo late"), ShellStep(command="echo next"),
             AnswerStep(text="done")]
    config = verl_config(model, "+agent_worlds.tool_timeout=0.5")
    server = ScriptedServer(tokenizer_of(model), lambda _k, _p: replaying(steps))
    out = run_worker(config, server, batch_of(rows(name)))
    [prompts] = server.prompts.values()
    tokenizer = tokenizer_of(model)
    assert "shell command timed out after 0.5 s" in tokenizer.decode(prompts[1])
    assert "next" in tokenizer.decode(prompts[2])
    assert extra(out, "termination") == ["answer"]
    worlds = Worlds.open(store)
    try:
        episode = load_episode(worlds, extra(out, "episode_id")[0])
    finally:
        worlds.close()
    # the late call still ran to its end and is recorded, before the next one
    commands = [e.command for e in episode.events if hasattr(e, "command")]
    assert commands == ["sleep 3; echo late", "echo next"]


def test_a_server_failure_is_retried_on_a_fresh_instance(store: Path, model: Path) -> None:
    name = RL_TASKS[0]
    server = ScriptedServer(tokenizer_of(model),
                            lambda _k, _p: replaying(task(name).solution.steps), fail=1)
    out = run_worker(verl_config(model), server, batch_of(rows(name)))
    assert extra(out, "attempts") == [2]
    assert extra(out, "V") == [1]


def test_a_rollout_lost_three_times_is_counted_and_trains_nothing(
        store: Path, model: Path) -> None:
    name = RL_TASKS[0]
    server = ScriptedServer(tokenizer_of(model), lambda _k, _p: replaying([]), fail=99)
    out = run_worker(verl_config(model), server, batch_of(rows(name)))
    assert server.calls == 3
    assert extra(out, "env_error") == [1]
    assert extra(out, "attempts") == [3]
    assert extra(out, "termination")[0].startswith("lost: the model server failed")
    assert int(out.batch["response_mask"].sum()) == 0
    assert float(out.batch["rm_scores"].sum()) == 0.0


def test_a_rollout_past_its_time_limit_is_still_graded_on_its_final_world(
        store: Path, model: Path) -> None:
    name = RL_TASKS[0]
    steps = [*[s for s in task(name).solution.steps if not isinstance(s, AnswerStep)],
             ShellStep(command="sleep 5")]
    config = verl_config(model, "+agent_worlds.rollout_timeout=4")
    server = ScriptedServer(tokenizer_of(model), lambda _k, _p: replaying(steps))
    out = run_worker(config, server, batch_of(rows(name)))
    assert extra(out, "termination") == ["timeout"]
    [checks] = extra(out, "checks")
    assert checks.count("1") > 0 and extra(out, "env_error") == [0]


# --- meta mode and AWM's reward --------------------------------------------------------


def test_meta_mode_with_awm_reward_uses_the_verifier_when_no_judge_model(
        store: Path, model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("WORLDCTL_LLM")]:
        monkeypatch.delenv(key)
    name = RL_TASKS[0]
    reference = task(name).solution.steps
    meta = [ToolStep(tool="list_tools")]
    for step in reference:
        if isinstance(step, ToolStep):
            meta.append(ToolStep(tool="call_tool", arguments={
                "tool_name": step.tool, "arguments": dict(step.arguments)}))
    meta.append(AnswerStep(text="done"))
    server = ScriptedServer(tokenizer_of(model), lambda _k, _p: lambda n, p: call_text(
        meta[n], thought="") .replace("<think></think>", "<thinking>Next.</thinking>"))
    out = run_worker(verl_config(model), server, batch_of(rows(name, mode="meta",
                                                                reward="awm")))
    assert extra(out, "judge") == ["not_run"]
    assert extra(out, "format_error") == [0]
    # without the shell steps the reference cannot pass: the verifier's V is the outcome
    assert extra(out, "V") == [0] and float(out.batch["rm_scores"].sum()) == 0.0


def test_awm_format_rule_stops_a_call_before_list_tools(store: Path, model: Path) -> None:
    name = RL_TASKS[0]
    call = call_text(ToolStep(tool="call_tool", arguments={"tool_name": "shop_get_cart",
                                                           "arguments": {}}), thought="")
    call = call.replace("<think></think>", "<thinking>Cart first.</thinking>")
    server = ScriptedServer(tokenizer_of(model), lambda _k, _p: lambda n, p: call)
    out = run_worker(verl_config(model), server, batch_of(rows(name, mode="meta",
                                                                reward="awm")))
    assert extra(out, "format_error") == [1]
    assert float(out.batch["rm_scores"].sum()) == -1.0
    assert len(next(iter(server.outputs.values()))) == 1


# --- history policies and samples ------------------------------------------------------


def direct_loop(config: DictConfig, server: ScriptedServer) -> WorldAgentLoop:
    """The loop as verl's worker instantiates it, to see the samples it returns (made on
    the running event loop, which verl's loop binds to)."""
    worker = AgentLoopWorker(config, server)
    return WorldAgentLoop(trainer_config=DictConfigWrap(config), server_manager=server,
                          tokenizer=worker.tokenizer, processor=None,
                          dataset_cls=worker.dataset_cls,
                          data_config=DictConfigWrap(config.data),
                          hf_model_type=worker.hf_model_type)


def run_direct(config: DictConfig, server: ScriptedServer, row: dict[str, Any]) -> Any:
    async def run() -> Any:
        loop = direct_loop(config, server)
        return await loop.run({}, raw_prompt=row["prompt"], extra_info=row["extra_info"])

    return asyncio.run(run())


def test_a_window_keeps_the_w_most_recent_steps_and_history_samples_are_one_per_step(
        store: Path, model: Path) -> None:
    name = RL_TASKS[0]
    steps = task(name).solution.steps
    config = verl_config(model, "+agent_worlds.window=2", "+agent_worlds.samples=history")
    server = ScriptedServer(tokenizer_of(model), lambda _k, _p: replaying(steps))
    outputs = run_direct(config, server, rows(name)[0])
    [prompts] = server.prompts.values()
    [generated] = server.outputs.values()
    assert len(outputs) == len(steps)
    for output, prompt, tokens in zip(outputs, prompts, generated, strict=True):
        assert output.prompt_ids == prompt and output.response_ids == tokens
        assert output.response_mask == [1] * len(tokens)
    tokenizer = tokenizer_of(model)
    late = tokenizer.decode(prompts[5])
    assert late.count("<tool_response>") == 2  # the two most recent steps' results only
    assert all(o.reward_score == 1.0 for o in outputs)
    weights = {o.extra_fields["sample_weight"] for o in outputs}
    assert weights == {1.0 / sum(len(t) for t in generated)}


def test_compaction_cuts_the_rollout_into_segments(store: Path, model: Path) -> None:
    """WildAWM's segment samples on a real compaction: the context grows past
    `compact_at`, a separate call summarises, the rollout goes on from the summary."""
    name = RL_TASKS[0]
    steps = task(name).solution.steps
    tokenizer = tokenizer_of(model)
    config = verl_config(model, "+agent_worlds.history=compaction",
                         "+agent_worlds.compact_at=26000", "+agent_worlds.samples=segments")
    plan = iter(steps)

    def policy(n: int, prompt: str) -> str:
        if COMPACT_PROMPT[:40] in prompt:
            return "The cart was read and the BOM checked.<|im_end|>"
        return call_text(next(plan))

    server = ScriptedServer(tokenizer, lambda _k, _p: policy)
    outputs = run_direct(config, server, rows(name)[0])
    [prompts] = server.prompts.values()
    compactions = [i for i, p in enumerate(prompts) if COMPACT_PROMPT[:40] in
                   tokenizer.decode(p)]
    assert compactions, "the context never passed compact_at: raise the steps or lower it"
    assert len(outputs) == 2 * len(compactions) + 1
    assert sum(o.extra_fields["sample_weight"] * sum(o.response_mask) for o in outputs) \
        == pytest.approx(1.0)
    assert "Summary of the work so far" in tokenizer.decode(prompts[compactions[0] + 1])


def test_a_second_compaction_summarises_the_first_summary_too(store: Path,
                                                               model: Path) -> None:
    """Compacting again starts from the last summary: the second summariser's call is
    shown the first summary, so no earlier work is forgotten."""
    name = RL_TASKS[0]
    tokenizer = tokenizer_of(model)
    config = verl_config(model, "+agent_worlds.history=compaction",
                         "+agent_worlds.compact_at=100", "+agent_worlds.samples=segments")
    plan = iter([*task(name).solution.steps[:3], AnswerStep(text="done")])
    summaries = iter(range(1, 10))

    def policy(n: int, prompt: str) -> str:
        if COMPACT_PROMPT[:40] in prompt:
            return f"Summary number {next(summaries)} of the work.<|im_end|>"
        return call_text(next(plan))

    server = ScriptedServer(tokenizer, lambda _k, _p: policy)
    run_direct(config, server, rows(name)[0])
    [prompts] = server.prompts.values()
    compactions = [tokenizer.decode(p) for p in prompts if COMPACT_PROMPT[:40] in
                   tokenizer.decode(p)]
    assert len(compactions) >= 2  # every step passes compact_at=100
    assert "Summary number 1 of the work." in compactions[1]
    assert "Summary number 2 of the work." not in compactions[1]


def test_unknown_settings_and_stale_rows_are_refused(store: Path, model: Path) -> None:
    server = ScriptedServer(tokenizer_of(model), lambda _k, _p: replaying([]))
    with pytest.raises(RLError, match="setting 'windw' is unknown"):
        direct_loop(verl_config(model, "+agent_worlds.windw=3"), server)
    row = rows(RL_TASKS[0])[0]
    stale = {**row, "extra_info": {**row["extra_info"], "world_hash": "0" * 32}}
    out = run_worker(verl_config(model), server, batch_of([stale]))
    assert extra(out, "env_error") == [1]
    assert "the dataset is stale" in extra(out, "termination")[0]


def test_episodes_of_rollouts_are_listed_under_their_task(store: Path, model: Path) -> None:
    worlds = Worlds.open(store)
    try:
        listed = list_episodes(worlds, task=RL_TASKS[0])
    finally:
        worlds.close()
    assert listed and all(msgspec.to_builtins(e)["task"] == RL_TASKS[0] for e in listed)
