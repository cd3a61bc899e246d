"""One client for every LLM call: the agent's steps and both judges' answers.

Every call goes through litellm (``completion`` / ``acompletion``), so any provider it
knows, or any OpenAI-compatible server (``model="openai/<name>"`` plus ``api_base``),
serves it. Calls can be recorded and replayed by content:

    request  = model, messages, tools, response_format, temperature, max_tokens (and
               top_p, top_k when set)
    key      = SHA-256 of the request's canonical JSON (sorted keys)
    file     = <recordings>/<key>.json   {"request": ..., "response": ...}

``replay`` answers only from those files and never touches the network, so grading with
recorded answers is deterministic; ``record`` calls the model and stores each answer;
``cache`` answers from a recording when there is one and otherwise calls the model and
stores its answer (a resumed run asks the model nothing it has asked before, so what it
resumes from and what it records agree); ``live`` stores nothing.

Embeddings (``embed``) are recorded the same way: the request is the model and the texts
(``{"kind": "embedding", ...}``), the file holds the vectors. The endpoint (``api_base``,
``api_key``) is not part of the key: the same request recorded against one server replays
anywhere.

litellm is imported on the first call that needs a model: importing it costs seconds,
and without ``LITELLM_LOCAL_MODEL_COST_MAP`` it tries to download a price table.

Errors (all ``WorldError``)::

    NoModel             no model configured; callers report "not_run", never a pass
    RecordingMissing    replay found no recording for a request (names hash and message)
    LLMCallError        the provider refused or could not be reached
"""

from __future__ import annotations

import copy
import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple, Protocol, TypeVar, get_args

import msgspec

from worldllm.errors import LLMCallError, NoModel, RecordingMissing
from worldstore.errors import ConfigError
from worldstore.folders import write_file

Mode = Literal["live", "record", "replay", "cache"]
MODES: tuple[Mode, ...] = get_args(Mode)
Message = dict[str, Any]
RECORDING_FORMAT = 1
DEFAULT_MAX_TOKENS = 2048
ENV_MODEL = "WORLDCTL_LLM_MODEL"
ENV_API_BASE = "WORLDCTL_LLM_API_BASE"
ENV_API_KEY = "WORLDCTL_LLM_API_KEY"
ENV_RECORDINGS = "WORLDCTL_LLM_RECORDINGS"
ENV_MODE = "WORLDCTL_LLM_MODE"
R = TypeVar("R", "_Recording", "_EmbeddingRecording")


class ToolCall(NamedTuple):
    """One tool call the model asked for; `arguments` is its JSON text, unparsed, because
    a malformed argument string is something the caller must see and report."""

    id: str
    name: str
    arguments: str


class Completion(msgspec.Struct, frozen=True):
    """The model's answer to one request."""

    text: str
    tool_calls: list[ToolCall]
    finish_reason: str | None
    model: str
    request_hash: str
    from_recording: bool = False
    reasoning: str = ""  # a provider's separate reasoning channel, when it has one
    tokens_in: int = 0  # the provider's usage; 0 when it reported none
    tokens_out: int = 0
    cost: float | None = None  # USD by litellm's price map; None when the model is unpriced


class _Response(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    text: str
    tool_calls: list[ToolCall]
    finish_reason: str | None
    model: str
    reasoning: str = ""
    # usage as recorded: a replayed call reports what the recorded one cost
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float | None = None


class _Recording(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    format: int
    request_hash: str
    request: dict[str, Any]
    response: _Response


class Embeddings(msgspec.Struct, frozen=True):
    """The vectors of one embedding request, one per text in order."""

    vectors: list[list[float]]
    model: str
    request_hash: str
    from_recording: bool = False
    tokens_in: int = 0
    cost: float | None = None


class _EmbeddingResponse(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    vectors: list[list[float]]
    model: str
    tokens_in: int = 0
    cost: float | None = None


class _EmbeddingRecording(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    format: int
    request_hash: str
    request: dict[str, Any]
    response: _EmbeddingResponse


class Meter(Protocol):
    """What a metered client reports its live calls to (a synthesis run's budget): asked
    before each call (it raises to refuse it), told what each call cost after."""

    def check(self) -> None: ...

    def charge(self, tokens: int, cost: float | None) -> None: ...


class LLMClient:
    """Sends chat requests to one model, recording or replaying them by content hash."""

    meter: Meter | None = None  # see `metered`

    def __init__(self, model: str | None, *, api_base: str | None = None,
                 api_key: str | None = None, recordings: Path | None = None,
                 mode: Mode | None = None, timeout: float = 120.0,
                 num_retries: int = 2) -> None:
        """`mode` defaults to "replay" when `recordings` is given (a recordings folder
        never leads to a network call by accident) and to "live" otherwise."""
        resolved: Mode = mode or ("replay" if recordings is not None else "live")
        if resolved not in MODES:
            raise ConfigError(f"LLM mode {resolved!r} is not one of {', '.join(MODES)}")
        if resolved != "live" and recordings is None:
            raise ConfigError(f"LLM mode {resolved!r} needs a recordings folder")
        self.model = model
        self.api_base = api_base
        self.api_key = api_key
        self.recordings = recordings
        self.mode: Mode = resolved
        self.timeout = timeout
        self.num_retries = num_retries

    @property
    def configured(self) -> bool:
        return self.model is not None

    def metered(self, meter: Meter) -> LLMClient:
        """This client, its live calls checked and charged by `meter` (answers from
        recordings cost nothing and are never refused)."""
        found = copy.copy(self)
        found.meter = meter
        return found

    def _before_call(self) -> None:
        if self.meter is not None:
            self.meter.check()

    def _charged(self, reply: Completion) -> Completion:
        if self.meter is not None:
            self.meter.charge(reply.tokens_in + reply.tokens_out, reply.cost)
        return reply

    def complete(self, messages: Sequence[Message], *,
                 tools: Sequence[dict[str, Any]] | None = None,
                 response_format: dict[str, Any] | None = None,
                 temperature: float = 0.0,
                 max_tokens: int = DEFAULT_MAX_TOKENS, top_p: float | None = None,
                 top_k: int | None = None) -> Completion:
        key, request = self._request(messages, tools, response_format, temperature,
                                     max_tokens, top_p=top_p, top_k=top_k)
        if self._answers_from_recording(key):
            return self._replay(key, request)
        self._before_call()
        litellm = _litellm()
        try:
            raw = litellm.completion(**self._call_args(request))
        except _provider_errors() as exc:
            raise self._call_error(exc) from exc
        return self._charged(self._keep(key, request, raw))

    async def acomplete(self, messages: Sequence[Message], *,
                        tools: Sequence[dict[str, Any]] | None = None,
                        response_format: dict[str, Any] | None = None,
                        temperature: float = 0.0,
                        max_tokens: int = DEFAULT_MAX_TOKENS, top_p: float | None = None,
                        top_k: int | None = None) -> Completion:
        key, request = self._request(messages, tools, response_format, temperature,
                                     max_tokens, top_p=top_p, top_k=top_k)
        if self._answers_from_recording(key):
            return self._replay(key, request)
        self._before_call()
        litellm = _litellm()
        try:
            raw = await litellm.acompletion(**self._call_args(request))
        except _provider_errors() as exc:
            raise self._call_error(exc) from exc
        return self._charged(self._keep(key, request, raw))

    def embed(self, texts: Sequence[str]) -> Embeddings:
        """One vector per text from the model's embedding endpoint (litellm ``embedding``),
        recorded and replayed like a chat request."""
        model = self._require_model()
        inputs = [str(t) for t in texts]
        request: dict[str, Any] = {"kind": "embedding", "model": model, "input": inputs}
        key = request_hash(request)
        if self._answers_from_recording(key):
            return self._replay_embedding(key, request)
        self._before_call()
        litellm = _litellm()
        try:
            raw = litellm.embedding(model=model, input=inputs,
                                    api_base=self.api_base, api_key=self.api_key,
                                    timeout=self.timeout, num_retries=self.num_retries)
        except _provider_errors() as exc:
            raise self._call_error(exc) from exc
        response = _embedding_response_of(raw, model, len(inputs))
        if self.mode in ("record", "cache"):
            self._write(key, _EmbeddingRecording(format=RECORDING_FORMAT, request_hash=key,
                                                 request=request, response=response))
        found = _embeddings(response, key, from_recording=False)
        if self.meter is not None:
            self.meter.charge(found.tokens_in, found.cost)
        return found

    def recording_path(self, key: str) -> Path:
        if self.recordings is None:
            raise ConfigError("this LLM client has no recordings folder")
        return self.recordings / f"{key}.json"

    # --- internals ------------------------------------------------------------------

    def _request(self, messages: Sequence[Message],
                 tools: Sequence[dict[str, Any]] | None,
                 response_format: dict[str, Any] | None, temperature: float,
                 max_tokens: int, *, top_p: float | None = None, top_k: int | None = None
                 ) -> tuple[str, dict[str, Any]]:
        """The canonical request of a call and its content hash (the recording's key)."""
        request = build_request(self._require_model(), messages, tools, response_format,
                                temperature, max_tokens, top_p=top_p, top_k=top_k)
        return request_hash(request), request

    def _require_model(self) -> str:
        if self.model is None:
            raise NoModel(f"no LLM model configured (set {ENV_MODEL})")
        return self.model

    def _call_args(self, request: dict[str, Any]) -> dict[str, Any]:
        args = {k: v for k, v in request.items() if v is not None}
        args.update(api_base=self.api_base, api_key=self.api_key, timeout=self.timeout,
                    num_retries=self.num_retries)
        return args

    def _call_error(self, exc: Exception) -> LLMCallError:
        where = f" at {self.api_base}" if self.api_base else ""
        return LLMCallError(f"model {self.model!r}{where} failed: {type(exc).__name__}: {exc}")

    def _answers_from_recording(self, key: str) -> bool:
        """Replay always; cache when the request was recorded before."""
        if self.mode == "replay":
            return True
        return self.mode == "cache" and self.recording_path(key).is_file()

    def _keep(self, key: str, request: dict[str, Any], raw: Any) -> Completion:
        response = _response_of(raw, self.model or "")
        if self.mode in ("record", "cache"):
            self._store(key, request, response)
        return _completion(response, key, from_recording=False)

    def _store(self, key: str, request: dict[str, Any], response: _Response) -> None:
        self._write(key, _Recording(format=RECORDING_FORMAT, request_hash=key,
                                    request=request, response=response))

    def _write(self, key: str, record: _Recording | _EmbeddingRecording) -> None:
        path = self.recording_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = msgspec.json.format(msgspec.json.encode(record, order="sorted"), indent=2)
        # Written beside and renamed, so a concurrent replay never reads half a file.
        write_file(path, data + b"\n")

    def _replay(self, key: str, request: dict[str, Any]) -> Completion:
        record = self._recording(key, _Recording, lambda path: (
            f"no recording {path} for this request (model {request['model']!r}; "
            f"first message: {_first_message(request['messages'])}); record it with "
            f"{ENV_MODE}=record"), "a valid recording")
        return _completion(record.response, key, from_recording=True)

    def _replay_embedding(self, key: str, request: dict[str, Any]) -> Embeddings:
        first = request["input"][0] if request["input"] else ""
        record = self._recording(key, _EmbeddingRecording, lambda path: (
            f"no recording {path} for this embedding request (model "
            f"{request['model']!r}; {len(request['input'])} texts, the first "
            f"{first[:80]!r}); record it with {ENV_MODE}=record"),
            "a valid embedding recording")
        return _embeddings(record.response, key, from_recording=True)

    def _recording(self, key: str, kind: type[R], missing: Callable[[Path], str],
                   what: str) -> R:
        """The recording of `key` as `kind`; RecordingMissing (`missing`'s message) when
        there is none, or naming the file when it is not `what`."""
        path = self.recording_path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise RecordingMissing(missing(path)) from None
        try:
            return msgspec.json.decode(data, type=kind)
        except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
            raise RecordingMissing(f"{path}: not {what}: {exc}") from None


def client_from_env(environ: Mapping[str, str] | None = None, *,
                    model: str | None = None) -> LLMClient:
    """The client the environment configures (``WORLDCTL_LLM_*``); `model`, when given,
    overrides ``WORLDCTL_LLM_MODEL``. Without either there is no model and every call
    raises NoModel."""
    env = os.environ if environ is None else environ
    recordings = env.get(ENV_RECORDINGS) or None
    return LLMClient(model or env.get(ENV_MODEL) or None,
                     api_base=env.get(ENV_API_BASE) or None,
                     api_key=env.get(ENV_API_KEY) or None,
                     recordings=Path(recordings) if recordings else None,
                     mode=_mode_of(env.get(ENV_MODE) or None))


def _mode_of(value: str | None) -> Mode | None:
    if value is None:
        return None
    for mode in MODES:
        if value == mode:
            return mode
    raise ConfigError(f"{ENV_MODE}={value!r} is not one of {', '.join(MODES)}")


def assistant_message(completion: Completion) -> Message:
    """The completion as the assistant message that continues the conversation."""
    message: Message = {"role": "assistant", "content": completion.text or None}
    if completion.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}}
            for c in completion.tool_calls]
    return message


def function_tool(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """A tool as OpenAI-style function calling offers it to a model."""
    return {"type": "function",
            "function": {"name": name, "description": description, "parameters": parameters}}


def object_parameters(properties: dict[str, Any]) -> dict[str, Any]:
    """Parameters of a tool whose arguments are exactly `properties`, all required (in
    the order given: the order is part of the request, and so of its recording's hash)."""
    return {"type": "object", "properties": properties, "required": list(properties),
            "additionalProperties": False}


def build_request(model: str, messages: Sequence[Message],
                  tools: Sequence[dict[str, Any]] | None,
                  response_format: dict[str, Any] | None, temperature: float,
                  max_tokens: int, *, top_p: float | None = None, top_k: int | None = None
                  ) -> dict[str, Any]:
    """The part of a call that decides the answer, and so the part that is hashed.
    `top_p` and `top_k` are in it only when set, so a request without them keeps the key
    it was recorded under before they existed. litellm sends `top_k` (no OpenAI
    parameter) as the provider's own (Anthropic, Gemini) or in the body of an
    OpenAI-compatible server's request (vLLM, SGLang)."""
    request = {"model": model, "messages": [dict(m) for m in messages],
               "tools": [dict(t) for t in tools] if tools else None,
               "response_format": response_format, "temperature": float(temperature),
               "max_tokens": int(max_tokens)}
    if top_p is not None:
        request["top_p"] = float(top_p)
    if top_k is not None:
        request["top_k"] = int(top_k)
    return request


def request_hash(request: dict[str, Any]) -> str:
    """SHA-256 of the request's canonical JSON: sorted keys, no whitespace."""
    return hashlib.sha256(msgspec.json.encode(request, order="sorted")).hexdigest()


def _completion(response: _Response, key: str, *, from_recording: bool) -> Completion:
    return Completion(text=response.text, tool_calls=list(response.tool_calls),
                      finish_reason=response.finish_reason, model=response.model,
                      request_hash=key, from_recording=from_recording,
                      reasoning=response.reasoning, tokens_in=response.tokens_in,
                      tokens_out=response.tokens_out, cost=response.cost)


def _embeddings(response: _EmbeddingResponse, key: str, *, from_recording: bool
                ) -> Embeddings:
    return Embeddings(vectors=[list(v) for v in response.vectors], model=response.model,
                      request_hash=key, from_recording=from_recording,
                      tokens_in=response.tokens_in, cost=response.cost)


def _embedding_response_of(raw: Any, model: str, n: int) -> _EmbeddingResponse:
    """Reduce litellm's EmbeddingResponse to the vectors, in the order of the texts."""
    data = getattr(raw, "data", None) or []
    items = [(int(_field(d, "index", i)), _field(d, "embedding", None))
             for i, d in enumerate(data)]
    if len(items) != n or any(not isinstance(v, list) or not v for _i, v in items):
        raise LLMCallError(f"model {model!r} answered {len(items)} embeddings for {n} texts")
    usage = getattr(raw, "usage", None)
    return _EmbeddingResponse(vectors=[[float(x) for x in v] for _i, v in sorted(items)],
                              model=str(getattr(raw, "model", None) or model),
                              tokens_in=int(getattr(usage, "prompt_tokens", 0) or 0),
                              cost=_cost_of(raw))


def _field(item: Any, name: str, default: Any) -> Any:
    if isinstance(item, dict):
        return item.get(name, default)
    return getattr(item, name, default)


def _response_of(raw: Any, model: str) -> _Response:
    """Reduce litellm's ModelResponse to the fields this project reads."""
    choices = getattr(raw, "choices", None) or []
    if not choices:
        raise LLMCallError(f"model {model!r} answered without any choice")
    choice = choices[0]
    message = choice.message
    calls = [ToolCall(str(c.id or f"call_{i}"), str(c.function.name or ""),
                      str(c.function.arguments or ""))
             for i, c in enumerate(message.tool_calls or [])]
    usage = getattr(raw, "usage", None)
    return _Response(text=str(message.content or ""), tool_calls=calls,
                     finish_reason=choice.finish_reason,
                     model=str(getattr(raw, "model", None) or model),
                     reasoning=str(getattr(message, "reasoning_content", None) or ""),
                     tokens_in=int(getattr(usage, "prompt_tokens", 0) or 0),
                     tokens_out=int(getattr(usage, "completion_tokens", 0) or 0),
                     cost=_cost_of(raw))


def _cost_of(raw: Any) -> float | None:
    """litellm's price of a response (its local price map, offline), None for a model it
    has no price for (a local vLLM server, a loopback test server)."""
    try:
        value = _litellm().completion_cost(completion_response=raw)
    except Exception:  # litellm raises for unpriced models; a price is only a report
        return None
    return float(value) if value else None


def _first_message(messages: list[Message]) -> str:
    if not messages:
        return "(none)"
    first = messages[0]
    content = str(first.get("content") or "")
    short = content if len(content) <= 120 else content[:117] + "..."
    return f"{first.get('role', '?')}: {short!r}"


def _litellm() -> Any:
    # The env var must be set before the import: litellm fetches its cost map on import.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        import litellm
    except ImportError as exc:
        raise ConfigError(f"a model is configured but litellm is not installed ({exc}): "
                          "pip install 'agent-worlds[llm]'") from None

    litellm.suppress_debug_info = True
    return litellm


def _provider_errors() -> type[Exception]:
    # litellm maps every provider's failure onto openai's exception tree.
    import openai

    return openai.OpenAIError


__all__ = ["MODES", "Completion", "Embeddings", "LLMCallError", "LLMClient", "Mode", "NoModel",
           "RecordingMissing", "ToolCall", "assistant_message", "build_request", "client_from_env",
           "function_tool", "object_parameters", "request_hash"]
