"""The training loop's costs on CPU, with a fake model server (no GPU, no weights).

    .venv/bin/python bench/bench_rl.py [--quick] [--rounds R] [--trajectories N]

1. **Per-turn overhead** of our agent loop (``rl.verl_loop.WorldAgentLoop``: parse, the
   real tool call on a demo instance, recording, token merging) against verl's own
   ``ToolAgentLoop`` with no-op function tools of the same names and schemas, both through
   verl's V1 worker path (``AgentLoopWorkerTQ`` for verl's loop, our
   ``WorldAgentLoopWorker`` over it for ours: every rollout put into a real TransferQueue
   on a local Ray cluster) with the same scripted server and the same local tokenizer.
   Each is timed on a 1-turn and a 21-turn trajectory, interleaved round by round; the
   per-turn cost is (t21 - t1) / 20, so the fixed costs (our instance
   and grading, their prompt) cancel out. Target <= 1.5x.
2. **1,024 concurrent trajectories** (64 task prompts x G = 16, the demo pack's tasks
   cycled) through one V1 worker into TransferQueue, instances pre-fetched: errors
   (rollouts lost), trajectories per second, p50/p99 of an environment step (one tool
   call as the loop waited for it).
   Each trajectory: three reads and an answer, graded by the task's verifier.
3. **Instance preparation per batch** (pre-fetching the batch's 1,024 instances) against
   the time the fake model takes for the same batch (its calls at ``--model-ms`` each,
   concurrent, as a served model would be): what the pre-fetch has to hide.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from _common import (
    REPO,
    Report,
    Row,
    bench_parser,
    emit,
    fmt_s,
    interleave,
    median,
    scratch_dir,
    setup_run,
)

B = "rl"
READ = ("chat_list_users", {})


def main(argv: list[str] | None = None) -> None:
    ap = bench_parser(__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--trajectories", type=int, default=None)
    ap.add_argument("--model-ms", type=float, default=50.0)
    a = ap.parse_args(argv)
    setup_run(a)
    rounds = a.rounds or (1 if a.quick else 7)
    count = a.trajectories or (4 if a.quick else 1024)
    work = scratch_dir(B)
    setup = _setup(work)
    report = Report(B, {"rounds": rounds, "trajectories": count, "model_ms": a.model_ms})
    if a.quick:  # a smoke path: no Ray cluster (its start alone takes most of a minute)
        _prefetch(report, setup, count)
    else:
        from rl.local_cluster import transfer_queue_cluster

        with transfer_queue_cluster():
            _per_turn(report, setup, rounds)
            _concurrent(report, setup, count, a.model_ms)
    emit(report)


# --- set-up -----------------------------------------------------------------------------


def _setup(work: Path) -> dict[str, Any]:
    from transformers import Qwen2Config

    from packs.registry import load_pack
    from replay import Worlds
    from rl.tiny_model import tiny_tokenizer

    store = work / "store"
    worlds = Worlds.open(store)
    for log in load_pack("demo").worlds:  # every world the pack's tasks start from
        worlds.import_file(log)
    worlds.close()
    os.environ["WORLDCTL_STORE"] = str(store)
    model = work / "model"
    tokenizer = tiny_tokenizer(model)
    Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                max_position_embeddings=65536,
                architectures=["Qwen2ForCausalLM"]).save_pretrained(model)
    tools = _noop_tools(work / "noop_tools.py", store)
    return {"store": store, "model": model, "tools": tools, "work": work}


def _noop_tools(path: Path, store: Path) -> Path:
    """verl function tools with the demo world's tool names and schemas (and shell and
    answer), each returning the text the real read returns: verl's loop sees the same
    prompt and the same tool turns as ours, and does no work for them."""
    from replay import Worlds
    from rl.world import WorldRuntime
    from worldenv.instances.instance import Environment

    worlds = Worlds.open(store)
    try:
        with Environment(worlds).open("lars@7") as instance:
            schemas, _ = WorldRuntime(worlds).tools(instance, "tools")
            seen = instance.call_tool(*READ).text  # what the real call returns
    finally:
        worlds.close()
    lines = ["from verl.tools.function_tool import function_tool", ""]
    for i, schema in enumerate(_verl_shaped(s) for s in schemas):
        name = schema["function"]["name"]
        lines += [f"@function_tool(name={name!r}, schema={schema!r})",
                  f"def tool_{i}(**kwargs):", f"    return {seen!r}", ""]
    path.write_text("\n".join(lines))
    return path


def _verl_shaped(schema: dict[str, Any]) -> dict[str, Any]:
    """verl's tool schema model needs a ``type`` on every property: an ``anyOf`` of a
    type and null (an optional argument) becomes that type, the rest is kept."""
    function = dict(schema["function"])
    parameters = dict(function["parameters"])
    properties = {}
    for name, prop in parameters.get("properties", {}).items():
        if "type" not in prop:
            kinds = [p.get("type") for p in prop.get("anyOf", []) if p.get("type") != "null"]
            prop = {**{k: v for k, v in prop.items() if k != "anyOf"},
                    "type": kinds[0] if kinds else "string"}
        properties[name] = prop
    parameters["properties"] = properties
    return {**schema, "function": {**function, "parameters": parameters}}


def _config(setup: dict[str, Any], *overrides: str) -> Any:
    import verl
    from hydra import compose, initialize_config_dir

    folder = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=folder, version_base=None):
        return compose(config_name="ppo_trainer", overrides=[
            f"actor_rollout_ref.model.path={setup['model']}",
            "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.mode=async",
            "actor_rollout_ref.rollout.prompt_length=32768",
            "actor_rollout_ref.rollout.response_length=32768",
            "actor_rollout_ref.rollout.multi_turn.format=hermes",
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=64",
            # verl cuts tool results to 256 characters by default; ours shows up to 8,000:
            # the same for both, so both loops see the same tool turns
            "actor_rollout_ref.rollout.multi_turn.max_tool_response_length=8000",
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path="
            f"{REPO / 'rl' / 'agent_loop.yaml'}",
            f"actor_rollout_ref.rollout.multi_turn.function_tool_path={setup['tools']}",
            *overrides])


class FakeServer:
    """verl's server manager: each trajectory makes `turns` calls of one read tool, then
    answers (ours) or stops calling (verl's loop ends a trajectory on a reply without a
    call); `delay` seconds per call, like a model's latency."""

    def __init__(self, tokenizer: Any, turns: int, *, delay: float = 0.0) -> None:
        self.turns, self.delay = turns, delay
        self.counts: dict[str, int] = {}
        call = json.dumps({"name": READ[0], "arguments": READ[1]})
        self.call = tokenizer.encode(f"<think>Look.</think>\n<tool_call>\n{call}\n"
                                     "</tool_call><|im_end|>")
        answer = json.dumps({"name": "answer", "arguments": {"text": "done"}})
        self.answer = tokenizer.encode(f"<tool_call>\n{answer}\n</tool_call><|im_end|>")
        self.stop = tokenizer.encode("Done.<|im_end|>")
        self.model_seconds = 0.0

    async def generate(self, request_id: str, *, prompt_ids: list[int],
                       sampling_params: dict[str, Any], **_: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        n = self.counts.get(request_id, 0)
        self.counts[request_id] = n + 1
        if self.delay:
            await asyncio.sleep(self.delay)
            self.model_seconds += self.delay
        ids = self.call if n < self.turns else self.answer if n == self.turns else self.stop
        return TokenOutput(token_ids=list(ids), stop_reason="completed")


def _rows(count: int) -> list[dict[str, Any]]:
    from packs.registry import load_pack
    from rl.dataset import rl_rows

    pack = load_pack("demo")
    every = [r for split in ("sft", "rl", "eval") for r in rl_rows(pack, split)]
    return [every[i % len(every)] for i in range(count)]


def _batch(rows: list[dict[str, Any]], agent: str, *, step: int) -> Any:
    """verl's V1 training batch (one entry per prompt, each run G times by the worker),
    its prompts registered in TransferQueue as the V1 trainer registers them."""
    import numpy as np
    import transfer_queue as tq
    from verl.utils import tensordict_utils as tu

    uids = [f"b{step}x{i}" for i in range(len(rows))]
    batch = tu.get_tensordict({
        "raw_prompt": np.array([r["prompt"] for r in rows], dtype=object),
        "agent_name": np.array([agent] * len(rows), dtype=object),
        "extra_info": np.array([r["extra_info"] for r in rows], dtype=object),
        "index": np.arange(len(rows)),
        "uid": np.array(uids, dtype=object),
    })
    tu.assign_non_tensor_data(batch, "global_steps", step)
    tq.kv_batch_put(keys=uids, partition_id="train",
                    tags=[{"is_prompt": True, "status": "pending", "global_steps": step}
                          for _ in uids])
    return batch


def _settle(worker: Any, batch: Any) -> None:
    """The batch through the V1 worker: its prompts spawned, then every one settled."""

    async def go() -> None:
        await worker.generate_sequences(batch)
        await asyncio.gather(*list(worker.background_tasks))
        refill = getattr(worker, "_refill", None)
        if refill is not None:
            await refill

    asyncio.run(go())


def _collect(batch: Any) -> list[dict[str, Any]]:
    """The extra fields of the batch's rollouts in TransferQueue; then cleared."""
    import transfer_queue as tq

    uids = set(batch["uid"])
    listed = tq.kv_list("train").get("train", {})
    keys = sorted(k for k, tag in listed.items()
                  if not tag.get("is_prompt") and k.split("_")[0] in uids)
    found = tq.kv_batch_get(keys=keys, partition_id="train",
                            select_fields=["extra_fields"])["extra_fields"] if keys else []
    listed_extras = found.tolist() if hasattr(found, "tolist") else list(found)
    extras = [getattr(e, "data", e) for e in listed_extras]
    tq.kv_clear(keys=[*uids, *keys], partition_id="train")
    return extras


# --- 1. per-turn overhead ----------------------------------------------------------------


def _per_turn(report: Report, setup: dict[str, Any], rounds: int, *, turns: int = 21) -> None:
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    from rl.verl_manager import WorldAgentLoopWorker

    verl_class = AgentLoopWorkerTQ.__ray_actor_class__  # the class behind the Ray actor
    verl_worker = verl_class(_config(setup), FakeServer(_tok(setup), 0))
    worker = WorldAgentLoopWorker(_config(setup), FakeServer(_tok(setup), 0))
    row = _rows(1)
    heavy = WorldAgentLoopWorker(_config(setup, "+agent_worlds.lean_tool_turns=false"),
                                 FakeServer(_tok(setup), 0))
    counter = iter(range(10**9))

    def run(agent: str, turns: int, on: Any) -> float:
        on.llm_client = FakeServer(on.tokenizer, turns)
        batch = _batch(row, agent, step=next(counter))
        t0 = time.perf_counter()
        _settle(on, batch)
        took = time.perf_counter() - t0
        _collect(batch)
        return took

    ours = {"agent_worlds": worker, "tool_agent": verl_worker}
    for agent, on in ours.items():  # warm both: imports, caches, tokenizer
        run(agent, 1, on)
    run("agent_worlds", 1, heavy)
    times = interleave({
        "ours_1": lambda: run("agent_worlds", 1, worker),
        f"ours_{turns}": lambda: run("agent_worlds", turns, worker),
        "full_1": lambda: run("agent_worlds", 1, heavy),
        f"full_{turns}": lambda: run("agent_worlds", turns, heavy),
        "verl_1": lambda: run("tool_agent", 1, verl_worker),
        f"verl_{turns}": lambda: run("tool_agent", turns, verl_worker)},
        rounds)

    def per_turn(name: str) -> float:
        return (median(times[f"{name}_{turns}"]) - median(times[f"{name}_1"])) / (turns - 1)

    ours, full, verl = per_turn("ours"), per_turn("full"), per_turn("verl")
    report.rows += [
        Row(B, "per-turn overhead (parse, tool call, recording, tokens)", fmt_s(ours),
            fmt_s(verl), f"ours/verl = {ours / verl:.2f}x", "<= 1.5x", ours / verl <= 1.5),
        Row(B, "per-turn, tool turns rendered with the schemas as verl does", fmt_s(full),
            fmt_s(verl), f"ours/verl = {full / verl:.2f}x", "<= 1.5x", full / verl <= 1.5)]
    report.data["per_turn"] = {k: v for k, v in times.items()}
    report.notes.append(
        f"per turn: ours {fmt_s(ours)} ({fmt_s(full)} rendering tool turns with every "
        f"schema, as verl's builder does by default), verl's ToolAgentLoop {fmt_s(verl)} "
        f"with no-op tools of the same schemas returning the same text; fixed costs per "
        f"trajectory: ours {fmt_s(median(times['ours_1']))} (instance, episode, "
        f"verifier), verl's {fmt_s(median(times['verl_1']))}")


def _tok(setup: dict[str, Any]) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(setup["model"]))


# --- 2 and 3. a batch of concurrent trajectories -------------------------------------------


def _prefetch(report: Report, setup: dict[str, Any], count: int) -> None:
    """The quick run's smoke path: what the full run prepares (the store with every world
    of the pack, the tokenizer, the model's config, verl's tools from the world's schemas,
    verl's composed config, the dataset's rows) and one pre-fetch of `count` instances;
    no Ray cluster, no worker, no trajectory."""
    import msgspec

    from gates.task import load_task
    from packs.registry import load_pack
    from rl.contract import RowInfo
    from rl.world import runtime

    _config(setup, "actor_rollout_ref.rollout.n=1")
    rows = _rows(count)
    world = runtime(str(setup["store"]))
    pack = load_pack("demo")
    tasks = [load_task(pack.task_dir(msgspec.convert(r["extra_info"], RowInfo).task_id))
             for r in rows]
    t0 = time.perf_counter()
    asyncio.run(world.prefetch(tasks))
    prepare = time.perf_counter() - t0
    world.close()
    report.rows.append(Row(B, f"instance preparation for {count} (pre-fetch, no model)",
                           fmt_s(prepare), "", "", "", None))
    report.data["prefetch"] = {"seconds": prepare, "opened": world.opened}
    report.notes.append("quick run: set-up and one pre-fetch only; the per-turn and "
                        "concurrent measures need a local Ray cluster (full run)")


def _concurrent(report: Report, setup: dict[str, Any], count: int, model_ms: float) -> None:
    import msgspec

    from gates.task import load_task
    from packs.registry import load_pack
    from rl.contract import RowInfo
    from rl.verl_manager import WorldAgentLoopWorker
    from rl.world import runtime

    group = 16 if count >= 16 else 1
    config = _config(setup, f"actor_rollout_ref.rollout.n={group}")
    rows = _rows(count // group)
    world = runtime(str(setup["store"]))
    pack = load_pack("demo")
    tasks = [load_task(pack.task_dir(msgspec.convert(r["extra_info"], RowInfo).task_id))
             for r in rows for _ in range(group)]
    t0 = time.perf_counter()
    asyncio.run(world.prefetch(tasks))
    prepare = time.perf_counter() - t0
    server = FakeServer(_tok(setup), 3, delay=model_ms / 1000)
    worker = WorldAgentLoopWorker(config, server)
    batch = _batch(rows, "agent_worlds", step=10**6)
    t0 = time.perf_counter()
    _settle(worker, batch)
    took = time.perf_counter() - t0
    extras = _collect(batch)
    finished = len(extras)
    lost = count - finished + sum(int(e["reward_extra_info"]["env_error"]) for e in extras)
    steps = sorted(s for e in extras for s in (e.get("env_step_seconds") or []))
    p50 = statistics.median(steps) if steps else 0.0
    p99 = steps[min(len(steps) - 1, int(0.99 * len(steps)))] if steps else 0.0
    model_wall = 4 * model_ms / 1000  # four calls per trajectory, all concurrent
    report.rows += [
        Row(B, f"{count} concurrent trajectories: rollouts lost", str(lost), "", "", "0",
            lost == 0),
        Row(B, f"{count} concurrent trajectories: throughput", f"{count / took:.1f}/s",
            "", f"{fmt_s(took)} for the batch", "", None),
        Row(B, "environment step p50 / p99", f"{fmt_s(p50)} / {fmt_s(p99)}", "", "", "",
            None),
        Row(B, f"instance preparation for {count} (pre-fetch)", fmt_s(prepare),
            fmt_s(model_wall), f"prepare/model = {prepare / model_wall:.2f}x", "", None),
    ]
    report.data["concurrent"] = {"seconds": took, "lost": lost, "p50": p50, "p99": p99,
                                 "prepare": prepare, "prefetch_hits": world.prefetched_hits,
                                 "opened": world.opened, "model_seconds_serial":
                                 server.model_seconds}
    report.notes.append(
        f"{count} trajectories in {fmt_s(took)} on {os.cpu_count()} cores ({lost} lost); "
        f"each: 3 reads and an answer at {model_ms:g} ms per model call, then the episode "
        f"stored and the verifier run; {world.prefetched_hits} of {count} instances came "
        "pre-fetched")


if __name__ == "__main__":
    main()
