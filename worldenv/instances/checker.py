"""The determinism checker: the same snapshot and the same calls must give the same
responses and the same final world, every time (in the spirit of Gymnasium's env checker).

``check_determinism(environment, ref, calls)`` opens two fresh instances of `ref`, plays
`calls` on both, and compares every response, the final hashes, and the final hash of
replaying each episode's effects onto the snapshot. It names the first call that differs.

``check_carried_tools(worlds, ref)`` needs no calls: it calls every tool of the world's
carried apps (an imported AWM world's routes) once, in name order, with arguments made from
its input schema (``example_arguments``), on three instances: two served by fresh sandboxed
workers of their own, and a third by the first one's worker after it. What the code reads
that the worker cannot freeze (``id()``, an object's address, a clock reached through a
library's own reference to it, CPU time, ``/proc``, what a previous instance left in the
code's module state) shows as a call whose response or effects differ; it names each such
call. ``worldctl check-awm REF`` runs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from replay.engine import Worlds
from worldenv.core.contract import ToolInfo
from worldenv.core.episode import DbChange, apply_effects
from worldenv.gui.tools import gui_tool_action
from worldenv.instances.instance import Environment, Instance
from worldenv.sandbox.workers import WorkerLimits, WorkerPool

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


# --- every carried tool, twice and more ------------------------------------------------

_STRING_EXAMPLES = {"date-time": "2026-01-01T00:00:00", "date": "2026-01-01",
                    "time": "00:00:00", "email": "user@example.com",
                    "uri": "https://example.com", "uuid": "00000000-0000-4000-8000-000000000000"}
_TYPE_EXAMPLES: dict[str, Any] = {"integer": 1, "number": 1.0, "boolean": True, "array": [],
                                  "object": {}, "null": None}


@dataclass(frozen=True)
class _Played:
    """One call as one instance saw it: its response and the effects it recorded."""

    response: bytes
    effects: bytes


def example_arguments(info: ToolInfo) -> dict[str, Any]:
    """Arguments for a call of `info`: each required parameter's default, example or first
    allowed value, else a value of its type (ids are 1: the first row of a seeded table)."""
    schema = info.input_schema
    properties = schema.get("properties", {})
    return {name: _example_value(properties.get(name, {}))
            for name in schema.get("required", []) if isinstance(name, str)}


def _example_value(prop: dict[str, Any]) -> Any:
    for key in ("default", "example"):
        if key in prop:
            return prop[key]
    for key in ("examples", "enum"):
        if prop.get(key):
            return prop[key][0]
    kind = prop.get("type", "string")
    if kind == "string":
        return _STRING_EXAMPLES.get(str(prop.get("format", "")), "test")
    return _TYPE_EXAMPLES.get(str(kind), "test")


def check_carried_tools(worlds: Worlds, ref: str, *, limits: WorkerLimits | None = None
                        ) -> CheckReport:
    """Every tool of `ref`'s carried apps, once each in name order, on three instances
    (see the module's docstring); one problem per call that differs, naming it. A world
    without carried tools is a ``ValueError``."""
    report = CheckReport()
    first_pool, second_pool = WorkerPool(limits), WorkerPool(limits)
    try:
        first_env = Environment(worlds, workers=first_pool)
        second_env = Environment(worlds, workers=second_pool)
        calls = _carried_calls(first_env, ref)
        report.calls = len(calls)
        played = [_play_all(first_env, ref, calls, report),
                  _play_all(second_env, ref, calls, report),
                  _play_all(first_env, ref, calls, report)]
    finally:
        first_pool.close()
        second_pool.close()
    report.final_hash = played[0][1]
    for (plays, final), where in ((played[1], "in two fresh workers"),
                                  (played[2], "in one worker, after another instance")):
        _compare(calls, played[0][0], plays, where, report)
        if final != played[0][1]:
            report.fail(f"the final world hashes differ {where}: {played[0][1]} vs {final}")
    return report


def _carried_calls(environment: Environment, ref: str) -> list[Call]:
    with environment.open(ref) as instance:
        carried = [info for info in instance.list_tools()
                   if not instance.runs_inline(info.name)]
    if not carried:
        raise ValueError(f"{ref}: the world carries no app code (no tool runs in a "
                         "sandboxed worker): nothing to check")
    return [(info.name, example_arguments(info)) for info in carried]


def _play_all(environment: Environment, ref: str, calls: Sequence[Call],
              report: CheckReport) -> tuple[list[_Played], str]:
    """`calls` on a fresh instance of `ref`: each call's response and effects, and the
    final hash (checked against replaying the episode's effects onto the snapshot)."""
    with environment.open(ref) as instance:
        responses = [_play(instance, name, arguments) for name, arguments in calls]
        effects: dict[int, list[Any]] = {}
        for event in instance.episode.events:
            if isinstance(event, DbChange):
                effects.setdefault(event.index, []).append(
                    [event.service, event.changeset, event.sequences])
        final = instance.hash()
        replayed = _replayed_hash(environment, instance)
        if replayed != final:
            report.fail(f"replaying an episode's effects gives {replayed}, its instance is "
                        f"at {final}")
    return [_Played(response, msgspec.msgpack.encode(effects.get(index, [])))
            for index, response in enumerate(responses, start=1)], final


def _compare(calls: Sequence[Call], first: list[_Played], other: list[_Played], where: str,
             report: CheckReport) -> None:
    for index, ((name, _arguments), a, b) in enumerate(zip(calls, first, other, strict=True),
                                                       start=1):
        differ = [what for what, same in (("response", a.response == b.response),
                                          ("effects", a.effects == b.effects)) if not same]
        if differ:
            report.fail(f"call #{index} ({name}): its {' and '.join(differ)} differ {where}"
                        + (f": {_short(a.response)} vs {_short(b.response)}"
                           if "response" in differ else ""))


def _short(response: bytes, limit: int = 80) -> str:
    text = response.decode("utf-8", "replace")
    return repr(text if len(text) <= limit else text[:limit] + "...")
