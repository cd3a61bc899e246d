"""What the training tests share: a tiny model folder (the local tokenizer and a
randomly-initialised config, nothing downloaded), verl's own composed config with our
overrides, a scripted model server that answers verl's token-in/token-out ``generate``,
and dataset rows of the demo pack as verl's batch.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import verl
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from transformers import AutoTokenizer, PreTrainedTokenizerBase, Qwen2Config
from verl.protocol import DataProto
from verl.workers.rollout.replica import TokenOutput

from gates.contract import AnswerStep, ShellStep, Step, ToolStep
from replay import Worlds
from rl.world import STORE_ENV, forget_runtimes
from tests.support.rl_tokenizer import tiny_tokenizer

VERL_CONFIG = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
LOOPS_YAML = Path(__file__).resolve().parents[2] / "rl" / "agent_loop.yaml"
DEMO_JSONL = Path(__file__).resolve().parents[2] / "packs" / "demo" / "world" / "lars.jsonl"


@contextlib.contextmanager
def demo_store(folder: Path) -> Iterator[Path]:
    """A store of the demo world in `folder`, named by WORLDCTL_STORE (as a training
    node's environment names it) while in use; this process's runtimes dropped after."""
    location = folder / "store"
    worlds = Worlds.open(location)
    worlds.import_file(DEMO_JSONL)
    worlds.close()
    previous = os.environ.get(STORE_ENV)
    os.environ[STORE_ENV] = str(location)
    try:
        yield location
    finally:
        forget_runtimes()
        if previous is None:
            os.environ.pop(STORE_ENV, None)
        else:
            os.environ[STORE_ENV] = previous


def tokenizer_of(model: Path) -> PreTrainedTokenizerBase:
    """The tiny model's tokenizer as verl loads it (from the folder)."""
    loaded: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(str(model))
    return loaded


def tiny_model(folder: Path) -> Path:
    """A model folder verl's HFModelConfig loads: the local tokenizer and a one-layer
    Qwen2 config (``model_type`` qwen2 selects verl's Qwen Continuous Token builder)."""
    tokenizer = tiny_tokenizer(folder)
    Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                max_position_embeddings=65536, tie_word_embeddings=True,
                architectures=["Qwen2ForCausalLM"]).save_pretrained(folder)
    return folder


def verl_config(model: Path, *overrides: str) -> DictConfig:
    """verl's ``ppo_trainer`` config, composed by hydra as ``main_ppo`` does, with the
    rollout pointed at our loop and the tiny model."""
    with initialize_config_dir(config_dir=VERL_CONFIG, version_base=None):
        return compose(config_name="ppo_trainer", overrides=[
            f"actor_rollout_ref.model.path={model}",
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.mode=async",
            "actor_rollout_ref.rollout.prompt_length=32768",
            "actor_rollout_ref.rollout.response_length=32768",
            "actor_rollout_ref.rollout.multi_turn.format=hermes",
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={LOOPS_YAML}",
            *overrides])


def call_text(step: Step, thought: str = "I check the next thing.") -> str:
    """A step as the model writes it in the hermes format."""
    if isinstance(step, ToolStep):
        name, arguments = step.tool, dict(step.arguments)
    elif isinstance(step, ShellStep):
        name, arguments = "shell", {"command": step.command}
    else:
        assert isinstance(step, AnswerStep)
        name, arguments = "answer", {"text": step.text}
    return (f"<think>{thought}</think>\n<tool_call>\n"
            + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call><|im_end|>")


Policy = Callable[[int, str], str]  # (the call's number in its trajectory, prompt) -> text


class ScriptedServer:
    """verl's server manager for the tests: ``generate(request_id, prompt_ids, ...)``
    returns the tokens of the text the trajectory's policy writes for its n-th call.
    A trajectory's policy is chosen when its first request arrives (``choose(k, prompt)``
    for the k-th trajectory seen, with its first prompt's text); ``fail`` makes the first
    calls raise, as a server that drops requests would."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase,
                 choose: Callable[[int, str], Policy], *, fail: int = 0) -> None:
        self.tokenizer = tokenizer
        self.choose = choose
        self.fail = fail
        self.calls = 0
        self.policies: dict[str, Policy] = {}
        self.counts: dict[str, int] = {}
        self.prompts: dict[str, list[list[int]]] = {}
        self.outputs: dict[str, list[list[int]]] = {}

    async def generate(self, request_id: str, *, prompt_ids: list[int],
                       sampling_params: dict[str, Any], **_: Any) -> TokenOutput:
        self.calls += 1
        if self.fail > 0:
            self.fail -= 1
            raise ConnectionError("the model server dropped the request")
        prompt = self.tokenizer.decode(prompt_ids)
        policy = self.policies.get(request_id)
        if policy is None:
            policy = self.policies[request_id] = self.choose(len(self.policies), prompt)
        n = self.counts.get(request_id, 0)
        self.counts[request_id] = n + 1
        ids = list(self.tokenizer.encode(policy(n, prompt)))
        self.prompts.setdefault(request_id, []).append(list(prompt_ids))
        self.outputs.setdefault(request_id, []).append(ids)
        return TokenOutput(token_ids=ids, log_probs=[-0.25] * len(ids), stop_reason="completed")


def replaying(steps: Sequence[Step]) -> Policy:
    """The policy that writes `steps` one per call, then answers "done"."""

    def policy(n: int, prompt: str) -> str:
        return call_text(steps[n]) if n < len(steps) else call_text(AnswerStep(text="done"))

    return policy


def batch_of(rows: Sequence[dict[str, Any]], n: int = 1) -> DataProto:
    """verl's generation batch: each row `n` times in a row, one uid per row (as the
    trainer repeats a prompt for its group)."""
    repeated = [row for row in rows for _ in range(n)]
    uids = [f"uid-{i}" for i, _ in enumerate(rows) for _ in range(n)]
    return DataProto.from_single_dict({
        "raw_prompt": np.array([r["prompt"] for r in repeated], dtype=object),
        "agent_name": np.array([r["agent_name"] for r in repeated], dtype=object),
        "extra_info": np.array([r["extra_info"] for r in repeated], dtype=object),
        "data_source": np.array([r["data_source"] for r in repeated], dtype=object),
        "uid": np.array(uids, dtype=object),
        "index": np.array([r["extra_info"]["index"] for r in repeated]),
    })


__all__ = ["DEMO_JSONL", "LOOPS_YAML", "ScriptedServer", "batch_of", "call_text",
           "demo_store", "replaying", "tiny_model", "tokenizer_of", "verl_config"]
