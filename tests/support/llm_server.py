"""A loopback OpenAI-compatible chat server that answers from a script of canned replies.

Tests point the real client at it (``model="openai/<name>"``, ``api_base=server.url``), so
every request takes litellm's real path over HTTP; only the model is canned. A script is a
list of rules, tried in order; the first whose ``when`` matches the request answers::

    {"rules": [
      {"when": {"last_role": "tool", "last_contains": "Nordlys"},
       "reply": {"content": "<thinking>...</thinking>",
                 "tool_calls": [{"name": "shell", "arguments": {"command": "ls"}}]}},
      {"when": {}, "reply": {"content": "..."}}
    ]}

``when`` keys (all must hold): ``last_role`` (role of the last message), ``last_contains``
(a substring of its content), ``any_contains`` (a substring of any message's content),
``has_tools`` (whether the request offers tools). ``arguments`` given as a string are sent
verbatim (to script malformed JSON). A request no rule matches gets HTTP 400 naming its
last message. Scripts live in ``tests/fixtures/llm/``.

``/v1/embeddings`` answers every text with a deterministic bag-of-words vector
(``EMBEDDING_DIMS`` buckets of SHA-256-hashed lower-case words, unit length): the same
text always gets the same vector, texts sharing most of their words get a cosine near 1,
unrelated texts one near 0. ``embedding_requests`` keeps those requests.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "llm"
EMBEDDING_DIMS = 256


def load_script(name: str) -> list[dict[str, Any]]:
    """The rules of ``tests/fixtures/llm/<name>.json``."""
    data = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    rules: list[dict[str, Any]] = data["rules"]
    return rules


class LoopbackLLM:
    """The server; ``requests`` keeps every request body it received, in order."""

    def __init__(self, rules: list[dict[str, Any]]) -> None:
        self.rules = rules
        self.requests: list[dict[str, Any]] = []
        self.embedding_requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        # A short poll interval: stopping waits for the next poll (0.5 s by default).
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,),
                                        name="loopback-llm", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}/v1"

    def start(self) -> LoopbackLLM:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def answer(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The chat.completion body for a request, or None when no rule matches."""
        with self._lock:
            self.requests.append(body)
            count = len(self.requests)
        for rule in self.rules:
            if _matches(rule.get("when", {}), body):
                return _completion(rule["reply"], body, count)
        return None


@contextmanager
def serving(rules: list[dict[str, Any]]) -> Iterator[LoopbackLLM]:
    server = LoopbackLLM(rules).start()
    try:
        yield server
    finally:
        server.stop()


def _handler(owner: LoopbackLLM) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length))
            if self.path.endswith("/embeddings"):
                with owner._lock:
                    owner.embedding_requests.append(body)
                self._send(200, _embedding_reply(body))
                return
            if not self.path.endswith("/chat/completions"):
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            reply = owner.answer(body)
            if reply is None:
                last = (body.get("messages") or [{}])[-1]
                self._send(400, {"error": {
                    "message": f"no scripted reply for a request ending with "
                               f"{last.get('role')}: {str(last.get('content'))[:200]!r}",
                    "type": "invalid_request_error"}})
                return
            self._send(200, reply)

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # a test's output is its assertions, not an access log

    return Handler


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def _matches(when: dict[str, Any], body: dict[str, Any]) -> bool:
    messages = body.get("messages") or []
    last = messages[-1] if messages else {}
    checks: dict[str, Callable[[Any], bool]] = {
        "last_role": lambda v: last.get("role") == v,
        "last_contains": lambda v: v in _content(last),
        "any_contains": lambda v: any(v in _content(m) for m in messages),
        "has_tools": lambda v: bool(body.get("tools")) == v,
    }
    unknown = sorted(set(when) - set(checks))
    if unknown:
        raise ValueError(f"unknown rule condition(s) {unknown}; known: {sorted(checks)}")
    return all(checks[key](value) for key, value in when.items())


def _completion(reply: dict[str, Any], body: dict[str, Any], count: int) -> dict[str, Any]:
    # Ids derive from the request, so the same conversation gets the same ids every run.
    key = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]
    calls = []
    for i, call in enumerate(reply.get("tool_calls", [])):
        arguments = call.get("arguments", {})
        calls.append({"id": call.get("id", f"call_{key}_{i}"), "type": "function",
                      "function": {"name": call["name"],
                                   "arguments": arguments if isinstance(arguments, str)
                                   else json.dumps(arguments)}})
    message: dict[str, Any] = {"role": "assistant", "content": reply.get("content")}
    if calls:
        message["tool_calls"] = calls
    finish = reply.get("finish_reason", "tool_calls" if calls else "stop")
    return {"id": f"chatcmpl-{count}", "object": "chat.completion", "created": 0,
            "model": body.get("model", "loopback"),
            "choices": [{"index": 0, "finish_reason": finish, "message": message}],
            "usage": _usage(body, message)}


def _usage(body: dict[str, Any], message: dict[str, Any]) -> dict[str, int]:
    """Token counts as a provider reports them: here a word count of the request's
    messages and of the reply, so usage is deterministic and not zero."""
    words_in = sum(len(_content(m).split()) for m in body.get("messages", []))
    words_out = len(str(message.get("content") or "").split()) + sum(
        len(c["function"]["arguments"].split()) for c in message.get("tool_calls", []))
    return {"prompt_tokens": words_in, "completion_tokens": words_out,
            "total_tokens": words_in + words_out}


def bag_of_words(text: str) -> list[float]:
    """The loopback server's embedding of `text` (see the module docstring)."""
    vector = [0.0] * EMBEDDING_DIMS
    for word in re.findall(r"[a-z0-9]+", text.lower()):
        bucket = int.from_bytes(hashlib.sha256(word.encode()).digest()[:4], "big")
        vector[bucket % EMBEDDING_DIMS] += 1.0
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]


def _embedding_reply(body: dict[str, Any]) -> dict[str, Any]:
    texts = body.get("input") or []
    if isinstance(texts, str):
        texts = [texts]
    data = [{"object": "embedding", "index": i, "embedding": bag_of_words(str(t))}
            for i, t in enumerate(texts)]
    words = sum(len(str(t).split()) for t in texts)
    return {"object": "list", "data": data, "model": body.get("model", "loopback"),
            "usage": {"prompt_tokens": words, "total_tokens": words}}
