"""The LLM client: real litellm calls against a loopback server, recording by content
hash, replay without any network, and the errors that name what is missing."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tests.support.llm_server import FIXTURES, LoopbackLLM, serving
from worldllm.client import (
    Completion,
    LLMClient,
    ToolCall,
    build_request,
    client_from_env,
    request_hash,
)
from worldllm.errors import LLMCallError, NoModel, RecordingMissing
from worldstore.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = FIXTURES / "recordings"
MODEL = "openai/loopback-1"
SHELL_TOOL = {"type": "function", "function": {
    "name": "shell", "description": "Run a command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}}
RULES: list[dict[str, Any]] = [
    {"when": {"has_tools": True},
     "reply": {"content": "<thinking>list the files</thinking>",
               "tool_calls": [{"name": "shell", "arguments": {"command": "ls"}}]}},
    {"when": {"last_contains": "capital of Norway"}, "reply": {"content": "Oslo."}},
]
QUESTION = [{"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "What is the capital of Norway?"}]


@pytest.fixture
def server() -> Iterator[LoopbackLLM]:
    with serving(RULES) as running:
        yield running


def client(server: LoopbackLLM | None, folder: Path | None, mode: Any) -> LLMClient:
    return LLMClient(MODEL, api_base=server.url if server else None, api_key="sk-loopback",
                     recordings=folder, mode=mode, num_retries=0, timeout=10)


def test_record_then_replay_without_the_server(tmp_path: Path) -> None:
    with serving(RULES) as running:
        recorder = client(running, tmp_path, "record")
        text = recorder.complete(QUESTION)
        tools = recorder.complete(QUESTION, tools=[SHELL_TOOL])
        assert len(running.requests) == 2
    assert text.text == "Oslo." and text.finish_reason == "stop" and not text.from_recording
    assert tools.tool_calls == [ToolCall(tools.tool_calls[0].id, "shell", '{"command": "ls"}')]
    # litellm moves a <thinking> block out of the text into its reasoning channel
    assert (tools.text, tools.reasoning) == ("", "list the files")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"{text.request_hash}.json", f"{tools.request_hash}.json"])

    replayer = client(None, tmp_path, "replay")  # no endpoint at all, and the server is gone
    assert replayer.complete(QUESTION) == msgspec.structs.replace(text, from_recording=True)
    again = replayer.complete(QUESTION, tools=[SHELL_TOOL])
    assert again == msgspec.structs.replace(tools, from_recording=True)


def test_a_recording_holds_the_request_for_humans(server: LoopbackLLM, tmp_path: Path) -> None:
    done = client(server, tmp_path, "record").complete(QUESTION, max_tokens=64)
    stored = json.loads((tmp_path / f"{done.request_hash}.json").read_text())
    assert stored["request"]["messages"] == QUESTION
    assert stored["request"]["max_tokens"] == 64 and stored["request"]["model"] == MODEL
    assert stored["response"]["text"] == "Oslo." and stored["format"] == 1
    assert request_hash(stored["request"]) == done.request_hash


def test_replay_never_calls_the_model(server: LoopbackLLM, tmp_path: Path) -> None:
    client(server, tmp_path, "record").complete(QUESTION)
    before = len(server.requests)
    client(server, tmp_path, "replay").complete(QUESTION)  # the server is up and reachable
    assert len(server.requests) == before


def test_a_changed_request_misses_with_its_hash_and_first_message(
        server: LoopbackLLM, tmp_path: Path) -> None:
    client(server, tmp_path, "record").complete(QUESTION)
    replayer = client(None, tmp_path, "replay")
    changed = [*QUESTION[:1], {"role": "user", "content": "And of Sweden?"}]
    key = request_hash(build_request(MODEL, changed, None, None, 0.0, 2048))
    with pytest.raises(RecordingMissing) as caught:
        replayer.complete(changed)
    assert key in str(caught.value) and "system: 'Answer briefly.'" in str(caught.value)
    with pytest.raises(RecordingMissing, match="no recording"):
        replayer.complete(QUESTION, temperature=0.5)
    with pytest.raises(RecordingMissing, match="no recording"):
        replayer.complete(QUESTION, max_tokens=10)


def test_a_corrupt_recording_is_named(server: LoopbackLLM, tmp_path: Path) -> None:
    done = client(server, tmp_path, "record").complete(QUESTION)
    path = tmp_path / f"{done.request_hash}.json"
    path.write_text('{"format": 1}')
    with pytest.raises(RecordingMissing, match=f"{path}: not a valid recording"):
        client(None, tmp_path, "replay").complete(QUESTION)


def test_live_mode_stores_nothing(server: LoopbackLLM, tmp_path: Path) -> None:
    live = LLMClient(MODEL, api_base=server.url, api_key="k", num_retries=0)
    assert live.mode == "live"
    assert live.complete(QUESTION).text == "Oslo."
    assert list(tmp_path.iterdir()) == []


def test_the_async_path_records_the_same_answer(server: LoopbackLLM, tmp_path: Path) -> None:
    recorder = client(server, tmp_path, "record")
    done = asyncio.run(recorder.acomplete(QUESTION, tools=[SHELL_TOOL]))
    assert done.tool_calls[0].name == "shell"
    replayed = asyncio.run(client(None, tmp_path, "replay").acomplete(
        QUESTION, tools=[SHELL_TOOL]))
    assert replayed == msgspec.structs.replace(done, from_recording=True)


def test_no_model_raises_before_any_call(server: LoopbackLLM, tmp_path: Path) -> None:
    for mode in ("live", "record", "replay"):
        nothing = LLMClient(None, api_base=server.url, recordings=tmp_path, mode=mode)
        assert not nothing.configured
        with pytest.raises(NoModel, match="WORLDCTL_LLM_MODEL"):
            nothing.complete(QUESTION)
    assert server.requests == [] and list(tmp_path.iterdir()) == []


def test_a_provider_refusal_is_an_llm_call_error(server: LoopbackLLM) -> None:
    unscripted = [{"role": "user", "content": "something no rule answers"}]
    with pytest.raises(LLMCallError) as caught:
        client(server, None, "live").complete(unscripted)
    assert MODEL in str(caught.value) and server.url in str(caught.value)
    assert "something no rule answers" in str(caught.value)


def test_the_hash_covers_what_decides_the_answer_and_nothing_else() -> None:
    base = build_request(MODEL, QUESTION, [SHELL_TOOL], {"type": "json_object"}, 0.0, 100)
    reordered = build_request(MODEL, [dict(reversed(m.items())) for m in QUESTION],
                              [SHELL_TOOL], {"type": "json_object"}, 0, 100)
    assert request_hash(base) == request_hash(reordered)
    variants = [
        build_request("openai/other", QUESTION, [SHELL_TOOL], {"type": "json_object"}, 0.0, 100),
        build_request(MODEL, QUESTION[1:], [SHELL_TOOL], {"type": "json_object"}, 0.0, 100),
        build_request(MODEL, QUESTION, None, {"type": "json_object"}, 0.0, 100),
        build_request(MODEL, QUESTION, [SHELL_TOOL], None, 0.0, 100),
        build_request(MODEL, QUESTION, [SHELL_TOOL], {"type": "json_object"}, 0.2, 100),
        build_request(MODEL, QUESTION, [SHELL_TOOL], {"type": "json_object"}, 0.0, 101),
    ]
    hashes = {request_hash(v) for v in variants}
    assert len(hashes) == len(variants) and request_hash(base) not in hashes


def test_golden_recordings_still_replay() -> None:
    """Recordings written by an earlier version must keep replaying: the hash and the file
    format are a stored contract (re-record deliberately if either must change)."""
    replayer = LLMClient(MODEL, recordings=GOLDEN)
    assert replayer.mode == "replay"
    assert replayer.complete(QUESTION) == Completion(
        text="Oslo.", tool_calls=[], finish_reason="stop", model="loopback-1",
        request_hash="db3cd7b1905fb7546516cc0779a477b7a2f09e1e6e27efd0b440ee3096cc2d38",
        from_recording=True)


def test_client_from_env_reads_every_variable(tmp_path: Path) -> None:
    configured = client_from_env({
        "WORLDCTL_LLM_MODEL": MODEL, "WORLDCTL_LLM_API_BASE": "http://127.0.0.1:1/v1",
        "WORLDCTL_LLM_API_KEY": "sk-x", "WORLDCTL_LLM_RECORDINGS": str(tmp_path),
        "WORLDCTL_LLM_MODE": "record"})
    assert (configured.model, configured.api_base, configured.api_key, configured.recordings,
            configured.mode) == (MODEL, "http://127.0.0.1:1/v1", "sk-x", tmp_path, "record")
    assert client_from_env({}).model is None and client_from_env({}).mode == "live"
    assert client_from_env({}, model="openai/x").model == "openai/x"
    with pytest.raises(ConfigError, match="WORLDCTL_LLM_MODE='replay-please'"):
        client_from_env({"WORLDCTL_LLM_MODE": "replay-please"})
    with pytest.raises(ConfigError, match="needs a recordings folder"):
        client_from_env({"WORLDCTL_LLM_MODE": "replay"})


def test_litellm_is_imported_lazily_and_offline() -> None:
    """Importing the grading modules must not import litellm (seconds), and importing it
    through the client must not try to download the model cost map."""
    code = ("import sys\n"
            "import worldllm.client, gates.judges, gates.llm_agent\n"
            "assert 'litellm' not in sys.modules, 'litellm imported eagerly'\n"
            "from worldllm.client import _litellm\n"
            "_litellm()\n"
            "print('ok')\n")
    env = {k: v for k, v in os.environ.items() if k != "LITELLM_LOCAL_MODEL_COST_MAP"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    assert "cost map" not in done.stderr.lower(), done.stderr


def test_a_failed_call_is_retried_and_then_an_llm_call_error(server: LoopbackLLM) -> None:
    # litellm retries through tenacity (a dependency of ours for that): a provider's error
    # is retried num_retries times, then surfaces as our error, never as an import error.
    before = len(server.requests)
    retrying = LLMClient(MODEL, api_base=server.url, api_key="k", num_retries=1)
    with pytest.raises(LLMCallError, match="something no rule answers"):
        retrying.complete([{"role": "user", "content": "something no rule answers"}])
    assert len(server.requests) - before == 2


def test_a_metered_client_charges_live_calls_and_refuses_once_spent(
        server: LoopbackLLM, tmp_path: Path) -> None:
    from synth.errors import BudgetSpent
    from synth.stage import Budget

    budget = Budget(tokens=1)
    metered = client(server, tmp_path, "cache").metered(budget)
    first = metered.complete(QUESTION)
    assert budget.spent_tokens == first.tokens_in + first.tokens_out > 0
    assert metered.complete(QUESTION).from_recording  # a recorded answer: never refused
    with pytest.raises(BudgetSpent, match="token budget is spent"):
        metered.complete([{"role": "user", "content": "What is the capital of Sweden?"}])
    assert client(server, tmp_path, "cache").meter is None  # the plain client is unmetered
