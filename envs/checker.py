"""The determinism checker: the same snapshot and the same calls must give the same
responses and the same final world, every time (in the spirit of Gymnasium's env checker).

``check_determinism(environment, ref, calls)`` opens two fresh instances of `ref`, plays
`calls` on both, and compares every response, the final hashes, and the final hash of
replaying each episode's effects onto the snapshot. It names the first call that differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from envs.episode import apply_effects
from envs.gui import gui_tool_action
from envs.instance import Environment, Instance

# (tool name, arguments); tool "shell" runs a command, "gui_ACTION" a GUI action (its
# response is the text and the screenshot's digest: the same pixels every time).
Call = tuple[str, dict[str, Any]]


@dataclass
class CheckReport:
    ok: bool = True
    calls: int = 0
    final_hash: str | None = None
    problems: list[str] = field(default_factory=list)

    def fail(self, message: str) -> None:
        self.ok = False
        self.problems.append(message)


def check_determinism(environment: Environment, ref: str, calls: Sequence[Call]) -> CheckReport:
    report = CheckReport(calls=len(calls))
    first, second = environment.open(ref), environment.open(ref)
    try:
        for index, (name, arguments) in enumerate(calls, start=1):
            a, b = _play(first, name, arguments), _play(second, name, arguments)
            if a != b:
                report.fail(f"call #{index} ({name}) gave different responses: {a!r} vs {b!r}")
                break
        hashes = first.hash(), second.hash()
        report.final_hash = hashes[0]
        if hashes[0] != hashes[1]:
            report.fail(f"final world hashes differ: {hashes[0]} vs {hashes[1]}")
        for label, instance in (("first", first), ("second", second)):
            replayed = _replayed_hash(environment, instance)
            if replayed != instance.hash():
                report.fail(f"replaying the {label} episode gives {replayed}, the instance "
                            f"is at {instance.hash()}")
        first.reset()
        if first.hash() != first.record.world_hash:
            report.fail("reset() did not restore the snapshot's hash")
    finally:
        first.close()
        second.close()
    return report


def _play(instance: Instance, name: str, arguments: dict[str, Any]) -> bytes:
    if name == "shell":
        result: Any = instance.shell(str(arguments["command"]))
        return msgspec.json.encode([result.exit_code, result.stdout, result.stderr])
    action = gui_tool_action(name)
    if action is not None:
        done = instance.gui(action, arguments)
        return msgspec.json.encode([done.is_error, done.text, done.screenshot])
    outcome = instance.call_tool(name, arguments)
    return msgspec.json.encode([outcome.is_error, outcome.text])


def _replayed_hash(environment: Environment, instance: Instance) -> str:
    mount = environment.worlds.mount(instance.record.world_hash)
    try:
        apply_effects(mount, instance.episode.events)
        return mount.hash()
    finally:
        mount.close()
