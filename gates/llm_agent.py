"""The LLM agent: a model works an instance through native tool calls.

The model is offered the instance's MCP tools, a ``shell`` tool (a command in the
workspace, in the sandbox) and an ``answer`` tool that ends the rollout. Each model call is
one *step*; each tool call it makes becomes one ``TurnRecord`` (a step may make several,
executed in order). The step's text, thinking included, is the reasoning of every turn
it produced.

History window (AWM): the model sees the system prompt, the task and only the ``window``
most recent steps (3 in training, 10 at evaluation), each step with its tool results, so a
step and its results are always kept or dropped together.

Bad calls are data for the model, never exceptions: a call to a tool that was not offered,
or arguments that are not a JSON object (or lack the string that ``shell`` and ``answer``
need), is recorded as a turn with ``is_error`` and nothing reaches the instance; the model
sees why and can recover. Such a turn is a ``ToolStep`` naming the tool as the model
wrote it. Argument errors the instance itself finds (schema, refusals) come back from the
instance as error results.

Meta-tool mode (``mode="meta"``, AWM's protocol): the model is offered only AWM's two
meta-tools and ``answer``: ``list_tools`` (every tool's name, description and input
schema, as JSON) and ``call_tool(tool_name, arguments)``, which calls the named tool on the
instance (``arguments`` a JSON object or its text). Their turns are ``ToolStep``s named
``list_tools`` and ``call_tool`` with the arguments as the model wrote them, so
``gates.rewards.awm_steps`` reads them as AWM steps; nothing enforces AWM's format rules
here (``list_tools`` once and first): the format validator judges them afterwards.

Unrecoverable format failure (``Trajectory.format_error``, ``stopped="format_error"``):
``MAX_INVALID_STEPS`` steps in a row in which no call could be executed (no call at all,
unknown tools, unparsable arguments). Running out of steps is ``stopped="step_limit"``.
A missing model (``NoModel``) or a failed model call (``LLMCallError``) propagates: the
rollout did not happen, and the caller reports it as not run or retries it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Literal

from envs.contract import ToolInfo
from envs.instance import Instance
from gates.agents import take_step
from gates.contract import AnswerStep, ShellStep, Step, ToolStep, Trajectory, TurnRecord
from gates.task import Task
from llm.client import (
    Completion,
    LLMClient,
    Message,
    ToolCall,
    assistant_message,
    function_tool,
    object_parameters,
)
from worldstore.errors import ConfigError

SHELL = "shell"
ANSWER = "answer"
LIST_TOOLS, CALL_TOOL = "list_tools", "call_tool"
Mode = Literal["tools", "meta"]
MAX_INVALID_STEPS = 3
OBSERVATION_LIMIT = 8000  # characters of one tool result the model is shown

SYSTEM_PROMPT = """\
You are an agent working on a user's personal computer. The user is logged in to every \
service. You act only through the tools offered:
- the services' tools (MCP) read and change the user's apps (chat, shop, calendar, notes...);
- `shell` runs one bash command in the user's workspace folder (no network);
- `answer` gives your final answer and ends the task; call it once, when you are done.
Before each tool call, think step by step inside <thinking>...</thinking>. Do exactly what \
the task asks, nothing more, and check your work before you answer."""

META_SYSTEM_PROMPT = """\
You are an agent working in a user's application environment; the user is logged in. You \
act only through the tools offered: `list_tools` lists the environment's tools (call it \
once, first), `call_tool` calls one of them by name with JSON arguments, and `answer` \
gives your final answer and ends the task. Before each tool call, think step by step \
inside <thinking>...</thinking>. Do exactly what the task asks, nothing more."""

NO_CALL_NUDGE = ("You did not call a tool. Act with one of the tools offered; when the task "
                 "is done, call `answer` with your final answer.")


SHELL_TOOL = function_tool(SHELL, "Run a bash command in the workspace folder (sandboxed, no "
                                  "network). Returns stdout, stderr and a non-zero exit code.",
                           object_parameters({"command": {"type": "string",
                                                          "description": "The bash command."}}))
ANSWER_TOOL = function_tool(ANSWER, "Give the final answer and end the task.",
                            object_parameters({"text": {"type": "string",
                                                        "description": "Your final answer."}}))
LIST_TOOLS_TOOL = function_tool(
    LIST_TOOLS, "List every tool of this environment: name, description and input schema. "
                "Call it once, first.", {"type": "object", "properties": {}})
CALL_TOOL_TOOL = function_tool(
    CALL_TOOL, "Call one tool of this environment by name with JSON arguments.",
    object_parameters({
        "tool_name": {"type": "string", "description": "A name returned by list_tools"},
        "arguments": {"type": ["object", "string"],
                      "description": "The tool's arguments: a JSON object (or its JSON text)"}}))


class LLMAgent:
    """Implements ``gates.agents.Agent`` with a model behind an ``LLMClient``."""

    def __init__(self, client: LLMClient, *, window: int = 10, max_steps: int = 20,
                 name: str | None = None, system_prompt: str = SYSTEM_PROMPT,
                 max_tokens: int = 2048, mode: Mode = "tools") -> None:
        if window < 1:
            raise ConfigError(f"LLMAgent window must be at least 1, not {window}")
        if max_steps < 1:
            raise ConfigError(f"LLMAgent max_steps must be at least 1, not {max_steps}")
        self.client = client
        self.window = window
        self.max_steps = max_steps
        self.name = name or f"llm:{client.model or 'none'}"
        if mode not in ("tools", "meta"):
            raise ConfigError(f"LLMAgent mode must be 'tools' or 'meta', not {mode!r}")
        self.mode: Mode = mode
        self.system_prompt = META_SYSTEM_PROMPT if mode == "meta" and \
            system_prompt == SYSTEM_PROMPT else system_prompt
        self.max_tokens = max_tokens

    def run(self, instance: Instance, task: Task, *, hinted: bool) -> Trajectory:
        rollout = _Rollout(self, instance, task.instruction(hinted=hinted))
        return rollout.run()


@dataclass
class _Rollout:
    agent: LLMAgent
    instance: Instance
    instruction: str
    trajectory: Trajectory = field(default_factory=lambda: Trajectory(turns=[]))
    steps: list[list[Message]] = field(default_factory=list)  # each: assistant + results
    invalid_in_a_row: int = 0
    last_problem: str = ""

    def run(self) -> Trajectory:
        infos = self.instance.list_tools()
        tools = [*(mcp_tool(t) for t in infos), SHELL_TOOL, ANSWER_TOOL]
        known = {t.name for t in infos} | {SHELL, ANSWER}
        if self.agent.mode == "meta":
            tools, known = [LIST_TOOLS_TOOL, CALL_TOOL_TOOL, ANSWER_TOOL], {
                LIST_TOOLS, CALL_TOOL, ANSWER}
        for _ in range(self.agent.max_steps):
            completion = self.agent.client.complete(
                self._context(), tools=tools, temperature=0.0,
                max_tokens=self.agent.max_tokens)
            self._count(completion)
            if self._step(completion, known):
                return self.trajectory
            if self.invalid_in_a_row >= MAX_INVALID_STEPS:
                self.trajectory.format_error = (
                    f"{MAX_INVALID_STEPS} steps in a row without an executable tool call; "
                    f"last: {self.last_problem}")
                self.trajectory.stopped = "format_error"
                return self.trajectory
        self.trajectory.stopped = "step_limit"
        return self.trajectory

    def _count(self, completion: Completion) -> None:
        """Add a call's usage to the trajectory's (cost stays None while no call has one)."""
        trajectory = self.trajectory
        trajectory.tokens_in += completion.tokens_in
        trajectory.tokens_out += completion.tokens_out
        if completion.cost is not None:
            trajectory.cost = (trajectory.cost or 0.0) + completion.cost

    def _context(self) -> list[Message]:
        recent = self.steps[-self.agent.window:]
        return [{"role": "system", "content": self.agent.system_prompt},
                {"role": "user", "content": self.instruction},
                *(m for step in recent for m in step)]

    def _step(self, completion: Completion, known: set[str]) -> bool:
        """Execute one model step; True when it answered (the rollout is over)."""
        reasoning = _reasoning(completion)
        messages: list[Message] = [assistant_message(completion)]
        self.steps.append(messages)
        if not completion.tool_calls:
            messages.append({"role": "user", "content": NO_CALL_NUDGE})
            self.invalid_in_a_row += 1
            self.last_problem = "no tool call"
            return False
        executed = False
        for call in completion.tool_calls:
            turn, ran = self._act(call, known, reasoning)
            self.trajectory.turns.append(turn)
            executed = executed or ran
            if isinstance(turn.step, AnswerStep):
                self.trajectory.answer = turn.step.text
                self.trajectory.stopped = "answer"
                return True
            # The catalogue is shown whole: a cut one would hide tools from the model.
            whole = self.agent.mode == "meta" and turn.step == ToolStep(tool=LIST_TOOLS)
            content = turn.observation if whole else shown(turn.observation, turn.is_error)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
        self.invalid_in_a_row = 0 if executed else self.invalid_in_a_row + 1
        return False

    def _act(self, call: ToolCall, known: set[str], reasoning: str) -> tuple[TurnRecord, bool]:
        """The turn for one call, and whether it was executable."""
        index = len(self.trajectory.turns)
        step_or_problem = parse_call(call.name, call.arguments, known)
        if isinstance(step_or_problem, str):
            self.last_problem = step_or_problem
            refused = TurnRecord(index=index, step=ToolStep(tool=call.name),
                                 observation=f"Not executed: {step_or_problem}",
                                 is_error=True, reasoning=reasoning)
            return refused, False
        if isinstance(step_or_problem, ToolStep) and self.agent.mode == "meta":
            return self._meta(index, step_or_problem, reasoning)
        return take_step(self.instance, index, step_or_problem, reasoning), True

    def _meta(self, index: int, step: ToolStep, reasoning: str) -> tuple[TurnRecord, bool]:
        """A meta-tool turn: the catalogue, or the named tool's call on the instance."""
        if step.tool == LIST_TOOLS:
            listed = [{"name": t.name, "description": t.description,
                       "input_schema": t.input_schema} for t in self.instance.list_tools()]
            return TurnRecord(index=index, step=step, observation=json.dumps(listed),
                              reasoning=reasoning), True
        called = meta_call(step.arguments)
        if isinstance(called, str):
            self.last_problem = called
            return TurnRecord(index=index, step=step, observation=f"Not executed: {called}",
                              is_error=True, reasoning=reasoning), False
        name, arguments = called
        result = self.instance.call_tool(name, arguments)
        return TurnRecord(index=index, step=step, observation=result.text,
                          is_error=result.is_error, reasoning=reasoning), True


def parse_call(name: str, arguments_text: str, known: Collection[str]) -> Step | str:
    """The step a model's call (a tool name and its JSON arguments text) asks for, or
    why it cannot be executed. The RL agent loop parses its calls with this too."""
    if name not in known:
        return f"there is no tool {name!r}. Valid tools: {', '.join(sorted(known))}"
    try:
        arguments = json.loads(arguments_text) if arguments_text.strip() else {}
    except json.JSONDecodeError as exc:
        return f"the arguments of {name!r} are not valid JSON ({exc}): " \
               f"{arguments_text[:200]!r}"
    if not isinstance(arguments, dict):
        return f"the arguments of {name!r} must be a JSON object, not {arguments!r:.200}"
    if name == SHELL:
        return _string_step(arguments, "command", lambda v: ShellStep(command=v), SHELL)
    if name == ANSWER:
        return _string_step(arguments, "text", lambda v: AnswerStep(text=v), ANSWER)
    return ToolStep(tool=name, arguments=arguments)


def meta_call(arguments: dict[str, Any]) -> tuple[str, dict[str, Any]] | str:
    """(tool name, arguments) of AWM's ``call_tool`` meta-call (its ``arguments`` a JSON
    object or that object's text), or why it cannot be executed."""
    name, raw = arguments.get("tool_name"), arguments.get("arguments", {})
    if not isinstance(name, str):
        return f"call_tool needs a 'tool_name' string, got {name!r}"
    try:
        decoded = json.loads(raw or "{}") if isinstance(raw, str) else raw
    except json.JSONDecodeError as exc:
        return f"arguments are not valid JSON: {exc}"
    if not isinstance(decoded, dict):
        return "arguments must be a JSON object"
    return name, decoded


def _string_step(arguments: dict[str, Any], key: str, make: Callable[[str], Step],
                 tool: str) -> Step | str:
    value = arguments.get(key)
    extra = sorted(set(arguments) - {key})
    if not isinstance(value, str) or extra:
        return (f"{tool!r} takes exactly one argument {key!r} (a string); got "
                f"{json.dumps(arguments)[:200]}")
    return make(value)


def mcp_tool(info: ToolInfo) -> dict[str, Any]:
    """An instance's tool as the model is offered it (OpenAI function format)."""
    return function_tool(info.name, info.description,
                         info.input_schema or {"type": "object", "properties": {}})


def _reasoning(completion: Completion) -> str:
    """The step's text as the model wrote it. litellm moves ``<thinking>`` (and
    ``<think>``) blocks out of the text into its reasoning channel, as it does with a
    provider's native reasoning; both go back inside tags, where AWM's format rule 1 (and
    ``gates.rewards``) looks for them."""
    thought = completion.reasoning.strip()
    text = completion.text.strip()
    if not thought:
        return text
    return f"<thinking>{thought}</thinking>" + (f"\n{text}" if text else "")


def shown(text: str, is_error: bool, limit: int = OBSERVATION_LIMIT) -> str:
    """A tool result as the model sees it: flagged when an error, cut when long."""
    if len(text) > limit:
        text = text[:limit] + f"\n[... {len(text) - limit} more characters cut]"
    return f"[error] {text}" if is_error else (text or "(no output)")


__all__ = ["ANSWER", "ANSWER_TOOL", "CALL_TOOL", "CALL_TOOL_TOOL", "LIST_TOOLS",
           "LIST_TOOLS_TOOL", "MAX_INVALID_STEPS", "META_SYSTEM_PROMPT", "SHELL",
           "SHELL_TOOL", "SYSTEM_PROMPT", "LLMAgent", "mcp_tool", "meta_call", "parse_call",
           "shown"]
