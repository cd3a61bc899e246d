"""The reviewer agent of world-day validation (layer 5 of ``synth.worlds.validate_day``): an LLM
with read-only tools over the day's world, configured from the environment
(``WORLDCTL_LLM_*``). Without a model it is absent and the layer says "not run".
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec

from gates.errors import InspectionRefused
from gates.judges import WorldInspector
from synth.worlds.validate_day import ReviewOutcome
from worldllm.client import (
    LLMClient,
    Message,
    assistant_message,
    client_from_env,
    function_tool,
    object_parameters,
)

REVIEW_PROMPT = """\
You review one day of a simulated persona's computer against the plan that day was built \
from. The world is open read-only: use list_tables and query (SELECT only) on a service's \
database, list_files and read_file on the workspace (the world is called "final"). Check \
that what the plan says happened did happen, with consistent values, and that nothing \
contradicts it. Then reply with only a JSON object: {"passed": true|false, "reason": \
"<one sentence>", "findings": ["<each problem found>", ...]}."""
MAX_REVIEW_TURNS = 8


class ReviewAnswer(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    passed: bool
    reason: Annotated[str, msgspec.Meta(min_length=1)]
    findings: list[str] = []


def reviewer_from_env() -> LLMReviewer | None:
    client = client_from_env()
    return LLMReviewer(client) if client.configured else None


class LLMReviewer:
    """The independent reviewer agent of layer 5: an LLM with read-only tools over the
    day's world, answering passed / reason / findings."""

    def __init__(self, client: LLMClient, *, max_turns: int = MAX_REVIEW_TURNS) -> None:
        self.client = client
        self.max_turns = max_turns

    def review(self, world_dir: Path, plan: str) -> ReviewOutcome:
        inspector = WorldInspector({"final": world_dir})
        messages: list[Message] = [
            {"role": "system", "content": REVIEW_PROMPT},
            {"role": "user", "content": f"## Plan of the day\n{plan}\n\n## World\nservices: "
                                        f"{', '.join(inspector.services('final')) or '(none)'}"},
        ]
        for _turn in range(self.max_turns):
            reply = self.client.complete(messages, tools=READ_TOOLS)
            if not reply.tool_calls:
                return self._outcome(reply.text)
            messages.append(assistant_message(reply))
            for call in reply.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id,
                                 "content": run_read_tool(inspector, call.name,
                                                          call.arguments)})
        return ReviewOutcome(False, f"the reviewer gave no verdict in {self.max_turns} turns",
                             model=self.client.model)

    def _outcome(self, text: str) -> ReviewOutcome:
        try:
            answer = msgspec.json.decode(text.strip().encode(), type=ReviewAnswer)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return ReviewOutcome(False, f"the reviewer's answer is not the required JSON: "
                                        f"{exc}", model=self.client.model)
        return ReviewOutcome(answer.passed, answer.reason, list(answer.findings),
                             model=self.client.model)


def _tool(name: str, description: str, properties: dict[str, dict[str, str]]
          ) -> dict[str, object]:
    return function_tool(name, description, object_parameters(properties))


READ_TOOLS = [
    _tool("list_tables", "Tables of a service database with their row counts.",
          {"service": {"type": "string"}}),
    _tool("query", "Run one read-only SELECT on a service database.",
          {"service": {"type": "string"}, "sql": {"type": "string"}}),
    _tool("list_files", "Every file of the workspace with its size.", {}),
    _tool("read_file", "Read a workspace file (bounded).", {"path": {"type": "string"}}),
]


def run_read_tool(inspector: WorldInspector, name: str, arguments: str) -> str:
    """One read-only tool call; a bad call is an error text for the model, never a crash."""
    try:
        args = msgspec.json.decode(arguments.encode() if arguments else b"{}")
        if not isinstance(args, dict):
            raise TypeError("arguments must be a JSON object")
        if name == "list_tables":
            return inspector.list_tables("final", str(args["service"]))
        if name == "query":
            return inspector.query("final", str(args["service"]), str(args["sql"]))
        if name == "list_files":
            return inspector.list_files("final")
        if name == "read_file":
            return inspector.read_file("final", str(args["path"]))
        return f"error: unknown tool {name!r}"
    except (InspectionRefused, KeyError, TypeError, msgspec.DecodeError) as exc:
        return f"error: {type(exc).__name__}: {exc}"


__all__ = ["READ_TOOLS", "LLMReviewer", "reviewer_from_env", "run_read_tool"]
