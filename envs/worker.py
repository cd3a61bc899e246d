"""The app worker: serves the tools of app code carried in a world's log.

Run as ``python -m envs.worker`` inside the sandbox (``envs.workers.AppWorker`` starts it),
never in the project's own process. It speaks JSON lines on stdin/stdout:

* ``{"op": "load", "service", "code"}``: run `code` as a fresh module (it defines
  ``app = App(...)``); reply ``{"ok": true, "app", "version", "tools": [...]}``;
* ``{"op": "call", "tool", "arguments", "db", "millis", "seed", "now", "call_index"}``:
  run the tool against the database at `db` exactly as an in-process instance does
  (``envs.execute.execute_tool``), validating the arguments through the tool set's
  FastMCP server; reply ``{"ok": true, "is_error", "text", "structured", "changeset",
  "sequences"}`` (changeset base64, both null unless the call changed them);
* ``{"op": "forget", "db"}``: close the connection to `db`.

Anything the carried code prints goes to stderr: stdout carries only replies.
"""

from __future__ import annotations

import asyncio
import base64
import os
import sys
import traceback
import types
from pathlib import Path
from typing import Any

import apsw
import msgspec

_conns: dict[str, apsw.Connection] = {}


class _Call:
    """Stands in for the instance while one tool call runs (``envs.instance._CURRENT``)."""

    def __init__(self, request: dict[str, Any]) -> None:
        self.request = request
        self.effect: tuple[bytes, list[tuple[str, int]] | None] | None = None

    def _execute(self, spec: Any, kwargs: dict[str, Any]) -> Any:
        from envs.execute import execute_tool, open_tool_db

        path = str(self.request["db"])
        conn = _conns.get(path)
        if conn is None:
            conn = _conns[path] = open_tool_db(Path(path))
        result, self.effect = execute_tool(
            conn, spec, kwargs, millis=int(self.request["millis"]),
            seed=str(self.request["seed"]), now=str(self.request["now"]),
            call_index=int(self.request["call_index"]))
        return result


class _Worker:
    def __init__(self) -> None:
        self.tools: Any = None
        self.loop = asyncio.new_event_loop()

    def load(self, request: dict[str, Any]) -> dict[str, Any]:
        from envs.app import App
        from envs.instance import tool_set

        service, code = str(request["service"]), str(request["code"])
        module = types.ModuleType(f"agentworlds_carried_{service}")
        module.__file__ = f"<carried app {service}>"
        try:
            exec(compile(code, f"<carried app {service}>", "exec"), module.__dict__)
        except BaseException as exc:
            return {"ok": False, "error": _describe(exc)}
        app = module.__dict__.get("app")
        if not isinstance(app, App):
            return {"ok": False, "error": "the code does not define `app = App(...)`"}
        if app.service != service:
            return {"ok": False, "error": f"the code's app serves {app.service!r}, "
                                          f"not {service!r}"}
        app.source = code
        try:
            self.tools = tool_set([app])
        except Exception as exc:
            return {"ok": False, "error": _describe(exc)}
        return {"ok": True, "app": app.name, "version": app.version, "tools": [
            {"name": i.name, "description": i.description, "writes": i.writes,
             "input_schema": i.input_schema, "output_schema": i.output_schema}
            for i in self.tools.infos]}

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        from fastmcp.exceptions import NotFoundError, ToolError, ValidationError

        from envs import instance

        if self.tools is None:
            return {"ok": False, "error": "no app is loaded"}
        current = _Call(request)
        token = instance._CURRENT.set(current)  # type: ignore[arg-type]
        try:
            raw = self.loop.run_until_complete(self.tools.server.call_tool(
                str(request["tool"]), dict(request.get("arguments") or {})))
            is_error = bool(getattr(raw, "is_error", False))
            text = "".join(getattr(c, "text", "") for c in raw.content)
            structured = raw.structured_content
        except (ToolError, ValidationError, NotFoundError) as exc:
            is_error, text, structured = True, str(exc), None
        finally:
            instance._CURRENT.reset(token)
        effect = current.effect
        return {"ok": True, "is_error": is_error, "text": text, "structured": structured,
                "changeset": base64.b64encode(effect[0]).decode() if effect else None,
                "sequences": effect[1] if effect else None}

    def forget(self, request: dict[str, Any]) -> dict[str, Any]:
        conn = _conns.pop(str(request["db"]), None)
        if conn is not None:
            conn.close()
        return {"ok": True}


def _describe(exc: BaseException) -> str:
    lines = traceback.format_exception_only(type(exc), exc)
    return "".join(lines).strip()


def main() -> None:
    # Keep the protocol's pipes private: the app's prints and reads get stderr and nothing.
    replies = os.fdopen(os.dup(1), "wb", buffering=0)
    requests = os.fdopen(os.dup(0), "rb")
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdout = sys.stderr
    import logging

    logging.getLogger("fastmcp").setLevel(logging.CRITICAL)
    worker = _Worker()
    ops = {"load": worker.load, "call": worker.call, "forget": worker.forget}
    decoder = msgspec.json.Decoder()
    encoder = msgspec.json.Encoder()
    for line in requests:
        try:
            request = decoder.decode(line)
            op = ops.get(request.get("op"))
            reply = op(request) if op else {"ok": False, "error": f"unknown op {request!r}"}
        except Exception as exc:
            reply = {"ok": False, "error": _describe(exc)}
        try:
            data = encoder.encode(reply)
        except Exception as exc:
            data = encoder.encode({"ok": False, "error": f"unencodable reply: {exc}"})
        replies.write(data + b"\n")


if __name__ == "__main__":
    main()
