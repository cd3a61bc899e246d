"""The LLM agent: a model works an instance through native tool calls.

The model is offered the instance's MCP tools, a ``shell`` tool (a command in the
workspace, in the sandbox) and an ``answer`` tool that ends the rollout; when the task
declares the ``gui`` interface, also the GUI tools of ``worldenv.gui.tools`` (``gui_open``,
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

History, as the RL loop keeps it: the window (AWM): the model sees the
system prompt, the task, in meta mode the ``list_tools`` exchange, and only the
``window`` most recent steps (3 in training, 10 at evaluation; None: all), each step with
its tool results, so a step and its results are always kept or dropped together.
Compaction (WildAWM, ``compact_at``): when a call's context and output pass that many
tokens (as the provider counts them), a separate call without tools summarises the context
(``gates.compaction``, the RL loop's prompt) and the rollout goes on from the system
prompt, the task and the summary.

Sampling (``Sampling``): temperature 0 by default; the papers' evaluation protocols
(``eval.protocols``) set temperature, top-p and top-k, sent with every call.

What the model is offered and shown (the tools, the catalogue, tool and shell results,
refusals) is the agent protocol's (``worldenv.protocol``): each call is decoded into an
action (``decode_call``) and done by ``execute``, as in the RL loop, the gateway and Gym,
so a policy is evaluated on exactly the text it was trained on.

Bad calls are data for the model, never exceptions: a call to a tool that was not offered,
or arguments that are not a JSON object (or lack the string that ``shell`` and ``answer``
need), is recorded as a turn with ``is_error`` and nothing reaches the instance; the model
sees why and can recover. Such a turn is a ``ToolStep`` naming the tool as the model
wrote it. Argument errors the instance itself finds (schema, refusals) come back from the
instance as error results.

Meta-tool mode (``mode="meta"``, AWM's protocol, never with GUI tools): the model is
offered only AWM's two meta-tools and ``answer``: ``list_tools`` (every tool's name,
description and input schema, as JSON) and ``call_tool(tool_name, arguments)``, which
calls the named tool on the instance (``arguments`` a JSON object or its text; the
catalogue is shown whole, never cut). Their turns are ``ToolStep``s named ``list_tools``
and ``call_tool`` with the arguments as the model wrote them, so
``gates.rewards.awm_steps`` reads them as AWM steps; nothing enforces AWM's format rules
here (``list_tools`` once and first): the format validator judges them afterwards.

Unrecoverable format failure (``Trajectory.format_error``, ``stopped="format_error"``):
``MAX_INVALID_STEPS`` steps in a row in which no call could be executed (no call at all,
unknown tools, unparsable arguments). Running out of steps is ``stopped="step_limit"``.
A missing model (``NoModel``) or a failed model call (``LLMCallError``) propagates: the
rollout did not happen, and the caller reports it as not run or retries it.
"""

from __future__ import annotations

import base64
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gates.agents import step_of, turn_of
from gates.compaction import compaction_prompt, summary_message
from gates.contract import Step, Trajectory
from gates.task import Task
from worldenv.gui.tools import GUI_TOOLS
from worldenv.instances.instance import Instance
from worldenv.protocol import GuiAction, Unexecutable, decode_call, execute, toolset_of
from worldenv.protocol.observation import (
    ANSWER,
    ANSWER_TOOL_INFO,
    CALL_TOOL,
    CALL_TOOL_INFO,
    LIST_TOOLS,
    LIST_TOOLS_INFO,
    OBSERVATION_LIMIT,
    SHELL,
    SHELL_TOOL_INFO,
    meta_call,
    shown,
    tool_schemas,
)
from worldenv.protocol.observation import function_schema as mcp_tool
from worldllm.client import (
    Completion,
    LLMClient,
    Message,
    assistant_message,
)
from worldstore.errors import ConfigError

Mode = Literal["tools", "meta"]
MAX_INVALID_STEPS = 3

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


# The agent tools as offered (worldenv.protocol.observation defines them: every surface
# offers the same).
SHELL_TOOL = mcp_tool(SHELL_TOOL_INFO)
ANSWER_TOOL = mcp_tool(ANSWER_TOOL_INFO)
LIST_TOOLS_TOOL = mcp_tool(LIST_TOOLS_INFO)
CALL_TOOL_TOOL = mcp_tool(CALL_TOOL_INFO)


@dataclass(frozen=True)
class Sampling:
    """How the model samples each step. `top_p` and `top_k` are sent only when set (a
    request without them is the one recorded before they existed); `top_k` is no OpenAI
    parameter: litellm maps it for providers that have one and passes it on in the
    request body to OpenAI-compatible servers (vLLM, SGLang)."""

    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None

    def check(self) -> None:
        if self.temperature < 0 or (self.top_p is not None and not 0 < self.top_p <= 1) \
                or (self.top_k is not None and self.top_k < 1):
            raise ConfigError(f"sampling {self}: temperature must be at least 0, top_p in "
                              "(0, 1], top_k at least 1")


class LLMAgent:
    """Implements ``gates.agents.Agent`` with a model behind an ``LLMClient``.

    `window`: the most recent steps the model sees (None: all of them); `compact_at`: the
    context, in tokens, past which the history is summarised (``gates.compaction``; 0:
    never)."""

    def __init__(self, client: LLMClient, *, window: int | None = 10, max_steps: int = 20,
                 name: str | None = None, system_prompt: str = SYSTEM_PROMPT,
                 max_tokens: int = 2048, mode: Mode = "tools",
                 sampling: Sampling = Sampling(), compact_at: int = 0) -> None:
        if window is not None and window < 1:
            raise ConfigError(f"LLMAgent window must be at least 1 (None: all), not {window}")
        if max_steps < 1:
            raise ConfigError(f"LLMAgent max_steps must be at least 1, not {max_steps}")
        if compact_at < 0:
            raise ConfigError(f"LLMAgent compact_at must be at least 0, not {compact_at}")
        sampling.check()
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
        self.sampling = sampling
        self.compact_at = compact_at

    def complete(self, messages: Sequence[Message],
                 tools: Sequence[dict[str, Any]] | None = None) -> Completion:
        """One model call with the agent's sampling and output limit."""
        sampling = self.sampling
        return self.client.complete(messages, tools=tools, temperature=sampling.temperature,
                                    top_p=sampling.top_p, top_k=sampling.top_k,
                                    max_tokens=self.max_tokens)

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
    summary: str | None = None  # the last compaction's summary, standing for older steps
    compactions: int = 0

    def run(self) -> Trajectory:
        offer = toolset_of(self.instance, mode=self.agent.mode, gui=self.gui)
        tools, known = offer.schemas(), offer.names
        for _ in range(self.agent.max_steps):
            completion = self.agent.complete(self._context(), tools)
            self._count(completion)
            if self._step(completion, known):
                return self.trajectory
            if self.invalid_in_a_row >= MAX_INVALID_STEPS:
                self.trajectory.format_error = (
                    f"{MAX_INVALID_STEPS} steps in a row without an executable tool call; "
                    f"last: {self.last_problem}")
                self.trajectory.stopped = "format_error"
                return self.trajectory
            # The provider's count of the context just sent, plus the step it produced:
            # the next request's context less the results, which are not counted yet.
            if self.agent.compact_at and \
                    completion.tokens_in + completion.tokens_out > self.agent.compact_at:
                self._compact()
        self.trajectory.stopped = "step_limit"
        return self.trajectory

    def _compact(self) -> None:
        """Summarise the context so far (a separate call, without tools) and go on from the
        system prompt, the task and that summary, as the RL loop's compaction does."""
        completion = self.agent.complete(compaction_prompt(self._context(images=False)[1:]))
        self._count(completion)
        # litellm moves <thinking> out of the text: a summary written inside it is kept
        self.summary = completion.text.strip() or completion.reasoning.strip()
        self.steps.clear()
        self.shots.clear()
        self.compactions += 1

    def _count(self, completion: Completion) -> None:
        """Add a call's usage to the trajectory's (cost stays None while no call has one)."""
        trajectory = self.trajectory
        trajectory.tokens_in += completion.tokens_in
        trajectory.tokens_out += completion.tokens_out
        if completion.cost is not None:
            trajectory.cost = (trajectory.cost or 0.0) + completion.cost

    def _context(self, *, images: bool = True) -> list[Message]:
        """System prompt, task, the last compaction's summary, and the steps in the window;
        in meta mode the ``list_tools`` exchange stays when the window has moved past it
        (AWM's history). Only the latest screenshot is an image (none without `images`)."""
        window = self.agent.window
        first = max(0, len(self.steps) - window) if window is not None else 0
        pinned = [0] if first > 0 and self.agent.mode == "meta" and \
            _lists_tools(self.steps[0][0]) else []
        shown_steps = [*pinned, *range(first, len(self.steps))]
        latest = max((i for i in shown_steps if self.shots[i] is not None), default=None) \
            if images else None
        messages: list[Message] = [
            {"role": "system", "content": self.agent.prompt(gui=self.gui)},
            {"role": "user", "content": self.instruction}]
        if self.summary is not None:
            messages.append(summary_message(self.summary))
        for i in shown_steps:
            messages.extend(self.steps[i])
            shot = self.shots[i]
            if shot is not None:  # the latest screenshot as an image, older ones in words
                caption, png = shot
                messages.append(screenshot_message(caption, png if i == latest else None))
        return messages

    def _step(self, completion: Completion, known: frozenset[str]) -> bool:
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
            action = decode_call(call.name, call.arguments, known, mode=self.agent.mode)
            observation = execute(self.instance, action)
            turn = turn_of(len(self.trajectory.turns), step_of(action), observation, reasoning)
            self.trajectory.turns.append(turn)
            if isinstance(action, Unexecutable):
                self.last_problem = action.problem
            if isinstance(action, GuiAction) and observation.image is not None:
                self.shots[-1] = (screenshot_caption(action.action, observation.text),
                                  observation.image)
            executed = executed or observation.executed
            if observation.done:
                self.trajectory.answer = observation.answer
                self.trajectory.stopped = "answer"
                return True
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": observation.shown()})
        self.invalid_in_a_row = 0 if executed else self.invalid_in_a_row + 1
        return False


def parse_call(name: str, arguments_text: str, known: Collection[str]) -> Step | str:
    """The step a model's call (a tool name and its JSON arguments text) asks for, or
    why it cannot be executed (``worldenv.protocol.decode_call``, in tools mode: a
    meta-tool's call is a step named after it)."""
    action = decode_call(name, arguments_text, known)
    return action.problem if isinstance(action, Unexecutable) else step_of(action)


GUI_TOOL_SCHEMAS: tuple[dict[str, Any], ...] = tuple(mcp_tool(t) for t in GUI_TOOLS)


def offers_gui(task: Task) -> bool:
    """Whether a task's agent is offered the GUI tools (it declares the gui interface)."""
    return "gui" in task.spec.interfaces


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


def _lists_tools(message: Message) -> bool:
    """Whether an assistant message is the ``list_tools`` call alone (AWM's first step)."""
    calls = message.get("tool_calls") or []
    return len(calls) == 1 and calls[0]["function"]["name"] == LIST_TOOLS


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


__all__ = ["ANSWER", "ANSWER_TOOL", "CALL_TOOL", "CALL_TOOL_TOOL", "GUI_SYSTEM_PROMPT",
           "GUI_TOOL_SCHEMAS", "LIST_TOOLS", "LIST_TOOLS_TOOL", "MAX_INVALID_STEPS",
           "META_SYSTEM_PROMPT", "OBSERVATION_LIMIT", "SHELL", "SHELL_TOOL", "SYSTEM_PROMPT",
           "LLMAgent", "Sampling", "mcp_tool", "meta_call", "offers_gui",
           "parse_call", "screenshot_caption", "screenshot_message", "screenshot_note", "shown",
           "tool_schemas"]
