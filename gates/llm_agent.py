"""The LLM agent: a model works an instance through native tool calls.

The model is offered the instance's MCP tools, a ``shell`` tool (a command in the
workspace, in the sandbox) and an ``answer`` tool that ends the rollout; when the task
declares the ``gui`` interface, also the GUI tools of ``envs.gui`` (``gui_open``,
``gui_read``, ``gui_click``, ...: the instance's web pages in a real browser), and a system
prompt that says so (``GUI_SYSTEM_PROMPT``). Each model call is one *step*; each tool call
it makes becomes one ``TurnRecord`` (a step may make several, executed in order; a GUI
call is a ``GuiStep`` whose turn carries its screenshot's digest). The step's text,
thinking included, is the reasoning of every turn it produced.

Screenshots: tool results are text in OpenAI's format, so a step with GUI calls is
followed by one user message with the screenshot its last GUI call took, an
``image_url`` content part (``data:image/png;base64,...``) beside a caption (the page's
title and path). Only the most recent screenshot in the context is sent as an image; each
older one becomes its caption alone, in brackets (``screenshot_note``), which bounds the
context to one image. The trainers, which show no images (``rl.world``, ``rl.sft``), put
that same note where every screenshot would be.

History window (AWM): the model sees the system prompt, the task and only the ``window``
most recent steps (3 in training, 10 at evaluation), each step with its tool results, so a
step and its results are always kept or dropped together.

Bad calls are data for the model, never exceptions: a call to a tool that was not offered,
or arguments that are not a JSON object (or lack the string that ``shell`` and ``answer``
need), is recorded as a turn with ``is_error`` and nothing reaches the instance; the model
sees why and can recover. Such a turn is a ``ToolStep`` naming the tool as the model
wrote it. Argument errors the instance itself finds (schema, refusals) come back from the
instance as error results.

Meta-tool mode (``mode="meta"``, AWM's protocol, never with GUI tools): the model is
offered only AWM's two meta-tools and ``answer``: ``list_tools`` (every tool's name,
description and input schema, as JSON) and ``call_tool(tool_name, arguments)``, which
calls the named tool on the instance (``arguments`` a JSON object or its text). Their
turns are ``ToolStep``s named ``list_tools`` and ``call_tool`` with the arguments as the
model wrote them, so ``gates.rewards.awm_steps`` reads them as AWM steps; nothing enforces
AWM's format rules here (``list_tools`` once and first): the format validator judges them
afterwards.

Unrecoverable format failure (``Trajectory.format_error``, ``stopped="format_error"``):
``MAX_INVALID_STEPS`` steps in a row in which no call could be executed (no call at all,
unknown tools, unparsable arguments). Running out of steps is ``stopped="step_limit"``.
A missing model (``NoModel``) or a failed model call (``LLMCallError``) propagates: the
rollout did not happen, and the caller reports it as not run or retries it.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from envs.contract import ToolInfo
from envs.gui import GUI_TOOLS, gui_tool_action
from envs.instance import Instance
from gates.agents import gui_turn, take_step
from gates.contract import (
    AnswerStep,
    GuiStep,
    ShellStep,
    Step,
    ToolStep,
    Trajectory,
    TurnRecord,
)
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

_MCP_LINE = ("- the services' tools (MCP) read and change the user's apps (chat, shop, "
             "calendar, notes...);\n")
_GUI_LINE = ("- the `gui_` tools work the same apps' web pages in a browser: `gui_open` opens "
             "a page (/ lists the apps), `gui_read` gives its text with numbered elements, "
             "`gui_click`, `gui_type`, `gui_key` and `gui_scroll` act on it; after each, the "
             "page's latest screenshot is shown to you when images can be shown;\n")
assert _MCP_LINE in SYSTEM_PROMPT
GUI_SYSTEM_PROMPT = SYSTEM_PROMPT.replace(_MCP_LINE, _MCP_LINE + _GUI_LINE)

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
        rollout = _Rollout(self, instance, task.instruction(hinted=hinted),
                           gui=self.mode == "tools" and offers_gui(task))
        return rollout.run()

    def prompt(self, *, gui: bool) -> str:
        """The system prompt of a rollout: the GUI one when GUI tools are offered and the
        agent was given no prompt of its own."""
        return GUI_SYSTEM_PROMPT if gui and self.system_prompt == SYSTEM_PROMPT \
            else self.system_prompt


@dataclass
class _Rollout:
    agent: LLMAgent
    instance: Instance
    instruction: str
    gui: bool = False  # the GUI tools are offered (tools mode, a task declaring gui)
    trajectory: Trajectory = field(default_factory=lambda: Trajectory(turns=[]))
    steps: list[list[Message]] = field(default_factory=list)  # each: assistant + results
    # per step: the caption and PNG of the screenshot its last GUI call took, if any
    shots: list[tuple[str, bytes] | None] = field(default_factory=list)
    invalid_in_a_row: int = 0
    last_problem: str = ""

    def run(self) -> Trajectory:
        infos = self.instance.list_tools()
        tools = tool_schemas(infos, gui=self.gui)
        known = {t["function"]["name"] for t in tools}
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
        first = max(0, len(self.steps) - self.agent.window)
        recent = range(first, len(self.steps))
        latest = max((i for i in recent if self.shots[i] is not None), default=None)
        messages: list[Message] = [
            {"role": "system", "content": self.agent.prompt(gui=self.gui)},
            {"role": "user", "content": self.instruction}]
        for i in recent:
            messages.extend(self.steps[i])
            shot = self.shots[i]
            if shot is not None:  # the latest screenshot as an image, older ones in words
                caption, png = shot
                messages.append(screenshot_message(caption, png if i == latest else None))
        return messages

    def _step(self, completion: Completion, known: set[str]) -> bool:
        """Execute one model step; True when it answered (the rollout is over)."""
        reasoning = _reasoning(completion)
        messages: list[Message] = [assistant_message(completion)]
        self.steps.append(messages)
        self.shots.append(None)
        if not completion.tool_calls:
            messages.append({"role": "user", "content": NO_CALL_NUDGE})
            self.invalid_in_a_row += 1
            self.last_problem = "no tool call"
            return False
        executed = False
        for call in completion.tool_calls:
            turn, ran, png = self._act(call, known, reasoning)
            self.trajectory.turns.append(turn)
            if isinstance(turn.step, GuiStep) and png is not None:
                self.shots[-1] = (screenshot_caption(turn.step.action, turn.observation), png)
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

    def _act(self, call: ToolCall, known: set[str], reasoning: str
             ) -> tuple[TurnRecord, bool, bytes | None]:
        """The turn for one call, whether it was executable, and the screenshot (PNG) a
        GUI call took."""
        index = len(self.trajectory.turns)
        step_or_problem = parse_call(call.name, call.arguments, known)
        if isinstance(step_or_problem, str):
            self.last_problem = step_or_problem
            refused = TurnRecord(index=index, step=ToolStep(tool=call.name),
                                 observation=f"Not executed: {step_or_problem}",
                                 is_error=True, reasoning=reasoning)
            return refused, False, None
        if isinstance(step_or_problem, ToolStep) and self.agent.mode == "meta":
            return (*self._meta(index, step_or_problem, reasoning), None)
        if isinstance(step_or_problem, GuiStep):
            turn, png = gui_turn(self.instance, index, step_or_problem, reasoning)
            return turn, True, png
        return take_step(self.instance, index, step_or_problem, reasoning), True, None

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
    why it cannot be executed. The RL agent loop parses its calls with this too.

    A known ``gui_*`` tool of ``envs.gui`` is a ``GuiStep`` (the names are the GUI
    tools'; offered only with them): its arguments must be a JSON object, and the
    instance checks the rest (an error result, never an exception)."""
    if name not in known:
        return f"there is no tool {name!r}. Valid tools: {', '.join(sorted(known))}"
    try:
        arguments = json.loads(arguments_text) if arguments_text.strip() else {}
    except json.JSONDecodeError as exc:
        return f"the arguments of {name!r} are not valid JSON ({exc}): " \
               f"{arguments_text[:200]!r}"
    if not isinstance(arguments, dict):
        return f"the arguments of {name!r} must be a JSON object, not {arguments!r:.200}"
    action = gui_tool_action(name)
    if action is not None:
        return GuiStep(action=action, arguments=arguments)
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


GUI_TOOL_SCHEMAS: tuple[dict[str, Any], ...] = tuple(mcp_tool(t) for t in GUI_TOOLS)


def offers_gui(task: Task) -> bool:
    """Whether a task's agent is offered the GUI tools (it declares the gui interface)."""
    return "gui" in task.spec.interfaces


def tool_schemas(infos: Sequence[ToolInfo], *, gui: bool) -> list[dict[str, Any]]:
    """What tools mode offers (OpenAI function format), in this order: the instance's MCP
    tools, the GUI tools when `gui`, ``shell`` and ``answer``. The RL loop and the SFT
    data offer exactly these."""
    return [*(mcp_tool(t) for t in infos), *(GUI_TOOL_SCHEMAS if gui else ()), SHELL_TOOL,
            ANSWER_TOOL]


def screenshot_caption(action: str, observation: str) -> str:
    """What a screenshot is of, in words: the GUI tool that took it and the page (the
    first line of its result, "page: <title> — <path>")."""
    head = observation.split("\n", 1)[0].strip()
    page = head if head.startswith("page: ") else "the browser's page"
    return f"screenshot after gui_{action} — {page}"


def screenshot_note(caption: str) -> str:
    """A screenshot that is not shown as an image (an older one; always, to a trainer
    that shows no images): its caption, in brackets."""
    return f"[{caption} (not shown)]"


def screenshot_message(caption: str, png: bytes | None) -> Message:
    """The user message after a GUI step's tool results: the screenshot as an
    ``image_url`` content part (a PNG data URL) beside its caption, or, without `png`,
    the note that stands in for it."""
    if png is None:
        return {"role": "user", "content": screenshot_note(caption)}
    url = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    return {"role": "user", "content": [{"type": "text", "text": caption[:1].upper()
                                         + caption[1:] + ":"},
                                        {"type": "image_url", "image_url": {"url": url}}]}


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


__all__ = ["ANSWER", "ANSWER_TOOL", "CALL_TOOL", "CALL_TOOL_TOOL", "GUI_SYSTEM_PROMPT",
           "GUI_TOOL_SCHEMAS", "LIST_TOOLS", "LIST_TOOLS_TOOL", "MAX_INVALID_STEPS",
           "META_SYSTEM_PROMPT", "SHELL", "SHELL_TOOL", "SYSTEM_PROMPT", "LLMAgent",
           "gui_turn", "mcp_tool", "meta_call", "offers_gui", "parse_call",
           "screenshot_caption", "screenshot_message", "screenshot_note", "shown",
           "tool_schemas"]
