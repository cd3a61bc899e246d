"""Adaptive rollouts wired into verl: ``AdaptiveAgentLoopWorker`` really launches,
cancels and selects the WildAWM way inside ``generate_sequences`` (verl's own worker,
our scheduler, real instances and verifiers), keeps kappa across steps in its file, and
``AdaptiveAgentLoopManager`` runs it in a local Ray cluster of two worker processes, each
filling its own snapshot cache from the shared store with the same hashes.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rl_harness import (
    DEMO_JSONL,
    ScriptedServer,
    batch_of,
    demo_store,
    replaying,
    tiny_model,
    tokenizer_of,
    verl_config,
)

from envs.episodes_store import list_episodes
from gates.task import load_task
from packs.registry import load_pack
from replay import Worlds
from rl.dataset import rl_rows
from rl.verl_manager import AdaptiveAgentLoopWorker, kappa_book
from rl.world import CACHE_ENV, STORE_ENV

PACK = load_pack("demo")
TASKS = PACK.split("rl")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with demo_store(tmp_path_factory.mktemp("rl-adaptive")) as location:
        yield location


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("tiny-model"))


def reference(name: str) -> Any:
    return replaying(load_task(PACK.task_dir(name)).solution.steps)


def nothing(_k: int, _prompt: str) -> Any:
    return replaying([])


def row(name: str) -> dict[str, Any]:
    [found] = [r for r in rl_rows(PACK, "rl") if r["extra_info"]["task_id"] == name]
    return found


def step(config: Any, server: ScriptedServer, batch: Any) -> Any:
    worker = AdaptiveAgentLoopWorker(config, server)
    return asyncio.run(worker.generate_sequences(batch))


def outcomes(out: Any) -> list[dict[str, Any]]:
    """Each group's decision, once per group in batch order (rows carry their group's)."""
    found: list[dict[str, Any]] = []
    for decided in out.non_tensor_batch["adaptive"].tolist():
        if not found or found[-1] != decided:
            found.append(decided)
    return found


def config_with(model: Path, kappa: Path, *more: str) -> Any:
    return verl_config(model, f"+agent_worlds.kappa_state={kappa}",
                       "+agent_worlds.prefetch=1", *more)


def test_a_mixed_group_is_ready_at_its_base_rollouts(store: Path, model: Path,
                                                     tmp_path: Path) -> None:
    name = TASKS[0]
    # alternate by arrival: two of the four base rollouts solve it, two do nothing
    server = ScriptedServer(tokenizer_of(model),
                            lambda k, p: reference(name) if k % 2 == 0 else replaying([]))
    out = step(config_with(model, tmp_path / "kappa.json"), server, batch_of([row(name)], 4))
    [decided] = outcomes(out)
    assert decided == {"task": f"demo/{name}", "status": "ready", "launched": 4,
                       "cancelled": 0, "completed": 4, "kappa": "1"}
    assert len(out) == 4 and sorted(out.non_tensor_batch["V"].tolist()) == [0, 0, 1, 1]
    assert json.loads((tmp_path / "kappa.json").read_bytes()) == {"kappa": {
        f"demo/{name}": "1"}}


def test_a_hopeless_task_is_exhausted_then_launches_all_at_once_and_cancels(
        store: Path, model: Path, tmp_path: Path) -> None:
    """kappa carries over: an exhausted group (12 rollouts, all the same reward) sets
    kappa to 3, so the next step launches 12 at once; when the first 4 already decide
    (all solve it: mastered), the other 8 are cancelled and store no episode."""
    name = TASKS[1]
    kappa = tmp_path / "kappa.json"
    config = config_with(model, kappa)
    out = step(config, ScriptedServer(tokenizer_of(model), nothing),
               batch_of([row(name)], 4))
    [decided] = outcomes(out)
    assert (decided["status"], decided["launched"], decided["completed"],
            decided["kappa"]) == ("exhausted", 12, 12, "3")
    assert len(out) == 4
    before = _episodes(store, name)
    server = ScriptedServer(tokenizer_of(model), lambda k, p: reference(name))
    out = step(config, server, batch_of([row(name)], 4))
    [decided] = outcomes(out)
    assert (decided["status"], decided["launched"], decided["cancelled"],
            decided["kappa"]) == ("mastered", 12, 8, "1")
    assert out.non_tensor_batch["V"].tolist() == [1, 1, 1, 1]
    # a restarted process reads kappa from the file
    assert json.loads(kappa.read_bytes())["kappa"][f"demo/{name}"] == "1"
    # the stored episodes grew by the completed rollouts only (identical ones share an id)
    assert len(_episodes(store, name)) - len(before) <= 4


def test_groups_of_several_tasks_keep_the_batch_order(store: Path, model: Path,
                                                      tmp_path: Path) -> None:
    names = TASKS[:2]
    server = ScriptedServer(tokenizer_of(model), _by_task)
    out = step(config_with(model, tmp_path / "kappa.json"), server,
               batch_of([row(n) for n in names], 2))
    tasks = [info["task_id"] for info in out.non_tensor_batch["extra_info"].tolist()]
    assert tasks == [names[0], names[0], names[1], names[1]]
    assert [o["status"] for o in outcomes(out)] == ["mastered", "mastered"]
    assert kappa_book(str(tmp_path / "kappa.json")).get(f"demo/{names[0]}") == 1


def test_validation_batches_run_a_fixed_group_and_leave_kappa_alone(
        store: Path, model: Path, tmp_path: Path) -> None:
    name = TASKS[0]
    kappa = tmp_path / "kappa.json"
    batch = batch_of([row(name)], 4)
    batch.meta_info["validate"] = True
    out = step(config_with(model, kappa), ScriptedServer(tokenizer_of(model), nothing), batch)
    assert len(out) == 4 and "adaptive" not in out.non_tensor_batch
    assert not kappa.exists()


def test_workers_sharing_a_kappa_file_keep_each_others_tasks(tmp_path: Path) -> None:
    from fractions import Fraction

    from rl.verl_manager import save_kappa

    path = str(tmp_path / "kappa.json")
    first, second = kappa_book(path), kappa_book(path)  # two workers' starting points
    first.set("demo/a", Fraction(13, 5))
    second.set("demo/b", Fraction(3))
    save_kappa(path, first, ["demo/a"])
    save_kappa(path, second, ["demo/b"])  # must not put back a's kappa of before
    assert kappa_book(path).kappa == {"demo/a": "13/5", "demo/b": "3"}


def _by_task(k: int, prompt: str) -> Any:
    [name] = [n for n in TASKS if load_task(PACK.task_dir(n)).instruction(hinted=False)
              in prompt]
    return reference(name)


def _episodes(store: Path, name: str) -> list[Any]:
    worlds = Worlds.open(store)
    try:
        return list(list_episodes(worlds, task=name))
    finally:
        worlds.close()


# --- a local Ray cluster ----------------------------------------------------------------------


@pytest.mark.slow
def test_two_ray_workers_fill_their_own_caches_with_the_same_hashes(
        store_location: str, model: Path, tmp_path: Path) -> None:
    """verl's AgentLoopManager (ours) starts two worker processes; each opens the store
    (SQLite or PostgreSQL) with a cold cache of its own, like two nodes, and their
    rollouts of the same tasks start from the same world hashes and solve them."""
    import ray

    from rl.verl_manager import AdaptiveAgentLoopManager

    worlds = Worlds.open(store_location)
    worlds.import_file(DEMO_JSONL)
    worlds.close()
    caches = tmp_path / "caches"
    tests = str(Path(__file__).resolve().parent)
    root = str(Path(__file__).resolve().parent.parent)
    env = {STORE_ENV: store_location, CACHE_ENV: str(caches / "{pid}"),
           "PYTHONPATH": os.pathsep.join([tests, root])}
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": env},
             log_to_driver=False)
    try:
        # the store and the caches come from the workers' environment, as on a cluster
        config = verl_config(model, "actor_rollout_ref.rollout.agent.num_workers=2")
        manager = AdaptiveAgentLoopManager.create(
            config, llm_client=ScriptedServer(tokenizer_of(model), _by_task))
        # the same task for both workers (verl gives each an equal chunk of the batch)
        out = manager.generate_sequences(batch_of([row(TASKS[0]), row(TASKS[0])], 2))
    finally:
        ray.shutdown()
    assert out.non_tensor_batch["V"].tolist() == [1, 1, 1, 1]
    filled = sorted(p for p in caches.iterdir() if p.is_dir())
    assert len(filled) == 2, filled  # one cache per worker process
    snapshots = [sorted(q.name for q in (p / "snapshots").iterdir()) for p in filled
                 if (p / "snapshots").exists()]
    assert len(snapshots) == 2 and snapshots[0] == snapshots[1]
