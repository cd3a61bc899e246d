"""OpenEnv's official client (``openenv-core``) driven by the tests: run with the openenv
peer venv's Python (tests/support/peer_venv.py), never imported by the tests themselves.

Importing the client takes seconds, so one process serves a whole test module: it reads
one JSON command a line on stdin and writes one JSON answer a line on stdout.

- ``{"op": "play", "base", "reset": {...}, "actions": [...]}``: one session with
  ``GenericEnvClient``: reset with those keyword arguments, step each action (``{"sleep":
  s}`` waits instead), then the state; a failure ends the play and is reported.
- ``{"op": "many", "base", "n", "reset", "action"}``: `n` sessions at once in this one
  process (the client's async API): each resets, steps, reads its state and closes.
- ``{"op": "hold", "base", "reset", "actions"}``: a forked child opens a session, resets,
  steps, answers with its pid and waits to be killed (its socket then drops unclosed).
- ``{"op": "exec", "code"}``: runs a block of the docs as a script; answers what it
  printed (and its failure).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import signal
import sys
import time
from typing import Any

from openenv.core import GenericEnvClient


async def play(base: str, reset: dict[str, Any], actions: list[dict[str, Any]]
               ) -> dict[str, Any]:
    done: dict[str, Any] = {"steps": []}
    try:
        async with GenericEnvClient(base_url=base) as env:
            first = await env.reset(**reset)
            done["reset"] = {"observation": first.observation, "reward": first.reward,
                             "done": first.done}
            for action in actions:
                if "sleep" in action:
                    await asyncio.sleep(action["sleep"])
                    continue
                result = await env.step(action)
                done["steps"].append({"observation": result.observation,
                                      "reward": result.reward, "done": result.done})
            done["state"] = await env.state()
    except Exception as exc:  # the client's own failure is what the test checks
        done["error"] = f"{type(exc).__name__}: {exc}"
    return done


async def one(base: str, reset: dict[str, Any], action: dict[str, Any]) -> dict[str, Any]:
    async with GenericEnvClient(base_url=base, message_timeout_s=300) as env:
        await env.reset(**reset)
        result = await env.step(action)
        state = await env.state()
        return {"episode_id": state["episode_id"], "instance": state["instance"],
                "step_count": state["step_count"], "done": result.done}


async def many(base: str, n: int, reset: dict[str, Any], action: dict[str, Any]
               ) -> dict[str, Any]:
    started = time.monotonic()
    results = await asyncio.gather(*(one(base, reset, action) for _ in range(n)),
                                   return_exceptions=True)
    failed = [f"{type(r).__name__}: {r}" for r in results if isinstance(r, BaseException)]
    return {"sessions": [r for r in results if isinstance(r, dict)], "failed": failed,
            "seconds": round(time.monotonic() - started, 3)}


def hold(base: str, reset: dict[str, Any], actions: list[dict[str, Any]]) -> None:
    """Fork a child that holds a session until killed; the child writes the answer."""
    if os.fork() != 0:
        return

    async def held() -> None:
        env = GenericEnvClient(base_url=base)
        await env.connect()
        await env.reset(**reset)
        for action in actions:
            await env.step(action)
        state = await env.state()
        say({"pid": os.getpid(), "instance": state["instance"],
             "episode_id": state["episode_id"]})
        await asyncio.sleep(3600)

    try:
        asyncio.run(held())
    except BaseException as exc:
        say({"error": f"{type(exc).__name__}: {exc}"})
    os._exit(0)


def run_block(code: str) -> dict[str, Any]:
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(code, "<docs block>", "exec"), {"__name__": "__main__"})
    except Exception as exc:
        return {"stdout": printed.getvalue(), "error": f"{type(exc).__name__}: {exc}"}
    return {"stdout": printed.getvalue()}


def say(answer: dict[str, Any]) -> None:
    os.write(1, (json.dumps(answer) + "\n").encode())


def main() -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # held children are reaped as they die
    say({"ready": True})
    for line in sys.stdin:
        command = json.loads(line)
        op, base = command["op"], command.get("base", "")
        if op == "exec":
            say(run_block(command["code"]))
        elif op == "play":
            say(asyncio.run(play(base, command["reset"], command["actions"])))
        elif op == "many":
            say(asyncio.run(many(base, command["n"], command["reset"], command["action"])))
        elif op == "hold":
            hold(base, command["reset"], command.get("actions", []))
        else:
            say({"error": f"unknown op {op!r}"})


if __name__ == "__main__":
    main()
