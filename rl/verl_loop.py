"""The agent loop verl runs for every trajectory (``agent_name: agent_worlds``).

For one dataset row (``rl.contract.RowInfo`` in ``extra_info``: pack, task, world hash,
interface mode, reward recipe) it opens a fresh instance of the task's world from this
process's runtime (``rl.world``), offers the model the instance's tools (MCP tools, the
GUI tools when the task declares ``gui``, ``shell`` and ``answer``; or AWM's
``list_tools``/``call_tool`` and ``answer`` in meta mode) and loops, token in and token
out:

    generate -> parse the tool calls (verl's parser for the chat format: hermes,
    qwen3_coder, glm, ...) -> execute each, under a timeout -> append the tool turn's
    tokens (trained on: no) -> ... until an answer, the step limit, the token budget, a
    format failure or the rollout's time limit.

GUI screenshots are not shown to the model here: verl's multi-modal path (a processor, a
vision-language builder, images carried with every sample) is left out, and the policy
sees text only. Where ``gates.llm_agent`` puts a GUI step's screenshot (a user message
after the step's tool results), this loop puts the note that stands in for it, the
page's title and path (``gates.llm_agent.screenshot_note``, "[screenshot after gui_click
— page: Cart · AVLager — /shop/cart (not shown)]"); ``gui_read`` gives the page as text.

Tokens go through verl's Continuous Token builder for the model family (verl's fix for
turn-boundary tokens lost between assistant and tool turns, #6501/#6921): the model's own
tokens are kept as generated, never re-tokenized, and only the appended messages are
rendered. Then the episode is stored, the final world graded by the task's verifier (in a
thread), and the reward computed (``rl.rewards``); verl's reward manager is skipped.

History (one policy for inference and training, since the samples are cut from exactly
the contexts the model saw):

- ``window`` (AWM): the system prompt, the task, in meta mode the ``list_tools``
  exchange, and the ``window`` most recent steps (0: all);
- ``compaction`` (WildAWM): when the context passes ``compact_at`` tokens, a separate
  call summarises the work so far and the rollout goes on from system, task and summary.

Samples (``samples``): ``rollout`` (one sequence: needs a single context), ``segments``
(WildAWM: one per run of steps sharing a context) or ``history`` (AWM: one per step, loss
on its own turn). A rollout cut into several samples returns them as a list, which verl's
V1 (TransferQueue) worker puts as one entry each (``rl.verl_manager``).

Infrastructure errors (the instance cannot open, the verifier crashes, the model server
fails) retry the whole rollout on a fresh instance up to ``retries`` times; after that the
rollout is reported lost (``env_error`` 1, reward 0, nothing trained). A rollout that runs
past ``rollout_timeout`` stops and is still graded on its final world.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import msgspec
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)
from verl.experimental.agent_loop.tool_parser import FunctionCall, ToolParser
from verl.tools.schemas import OpenAIFunctionToolSchema

from gates.compaction import COMPACT_PROMPT as COMPACT_PROMPT  # tests read it from here
from gates.compaction import compaction_prompt, summary_message
from gates.contract import AnswerStep
from gates.llm_agent import parse_call
from rl.contract import AGENT_NAME, HistoryKind, ModelStep, RowInfo, Sample
from rl.errors import RLError, RolloutLost
from rl.rewards import awm_format, awm_score, extra_info, lost_info, wildawm_score
from rl.samples import history_samples, segment_samples
from rl.world import Graded, Observation, WorldRuntime, WorldSession, runtime
from worldenv.protocol.observation import LIST_TOOLS, shown
from worldstore.errors import WorldError

log = logging.getLogger("agentworlds.rl")
SampleKind = Literal["rollout", "segments", "history"]
SETTINGS_KEY = "agent_worlds"  # our section of verl's config: +agent_worlds.store=...


@dataclass(frozen=True)
class LoopSettings:
    """The loop's settings, from ``agent_worlds`` in verl's config and the loop's YAML
    entry (the entry wins)."""

    store: str | None = None
    packs_dir: str | None = None
    cache: str | None = None
    history: HistoryKind = "window"
    window: int = 0
    compact_at: int = 0
    max_steps: int = 20
    tool_timeout: float = 60.0
    rollout_timeout: float = 1800.0
    samples: SampleKind = "rollout"
    retries: int = 3
    format: str = "hermes"
    observation_limit: int = 8000
    # render tool turns without the tool schemas once checked to give the same tokens
    lean_tool_turns: bool = True
    # adaptive rollouts (rl.verl_manager): the kappa file, the block C, kappa_max, and how
    # many instances per row of a batch are opened before its rollouts start (0: none)
    kappa_state: str | None = None
    block: int = 8
    kappa_max: int = 3
    prefetch: int = 0
    # WildAWM's adaptive rollout counts in the V1 manager (rl.verl_manager); off: a fixed G
    adaptive: bool = False
    # the papers' reward ablations: no format penalty (a format failure scores 0, not -1),
    # no partial credit (r = V)
    format_penalty: bool = True
    partial_credit: bool = True

    @classmethod
    def read(cls, *sources: Any) -> LoopSettings:
        known = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for source in sources:
            for key, value in dict(source or {}).items():
                if key in ("name", "_target_"):
                    continue
                if key not in known:
                    raise RLError(f"agent loop setting {key!r} is unknown; known: "
                                  f"{', '.join(sorted(known))}")
                values[key] = value
        try:  # OmegaConf gives typed values; text (a launch script's) is converted
            settings = msgspec.convert(values, cls, strict=False)
        except msgspec.ValidationError as exc:
            raise RLError(f"agent loop setting: {exc}") from None
        settings.check()
        return settings

    def check(self) -> None:
        if self.history not in ("window", "compaction"):
            raise RLError(f"history {self.history!r}: use 'window' or 'compaction'")
        if self.samples not in ("rollout", "segments", "history"):
            raise RLError(f"samples {self.samples!r}: use 'rollout', 'segments' or 'history'")
        if self.max_steps < 1 or self.retries < 1 or self.window < 0 or self.compact_at < 0:
            raise RLError("max_steps and retries must be at least 1; window and compact_at "
                          "at least 0")


@dataclass
class _Trace:
    """What one attempt produced, token by token."""

    steps: list[ModelStep] = field(default_factory=list)
    format_failure: bool = False
    termination: str = "step_limit"
    why: str = ""  # the format failure, when there was one
    generate_seconds: float = 0.0
    # per model step, the policy versions (verl's global steps) its tokens came from, as
    # the server reports them: verl's V1 trainer tags every sample with them
    versions: dict[int, tuple[int, int]] = field(default_factory=dict)
    tool_seconds: float = 0.0


_PARSERS: dict[tuple[str, int], ToolParser] = {}
_DELTA_NEEDS_TOOLS: dict[tuple[int, int], bool] = {}  # (tokenizer, schemas) -> checked once
_SCHEMAS: dict[int, list[OpenAIFunctionToolSchema] | None] = {}


@register(AGENT_NAME)
class WorldAgentLoop(AgentLoopBase):
    """verl's agent loop over agent-worlds instances (see the module docstring)."""

    def __init__(self, *args: Any, tools: Any = None, **kwargs: Any) -> None:
        entry = {k: kwargs.pop(k) for k in list(kwargs) if k in _SETTING_NAMES}
        super().__init__(*args, **kwargs)
        multi_turn = self.rollout_config.get("multi_turn", {}) or {}
        defaults: dict[str, Any] = {}
        if multi_turn.get("max_assistant_turns"):
            defaults["max_steps"] = int(multi_turn["max_assistant_turns"])
        if multi_turn.get("format"):
            defaults["format"] = str(multi_turn["format"])
        self.settings = LoopSettings.read(defaults, self.config.get(SETTINGS_KEY, {}), entry)
        self.response_length = int(self.rollout_config.response_length)
        self.tool_parser = _parser(self.settings.format, self.tokenizer)

    async def run(self, sampling_params: dict[str, Any],  # type: ignore[override]
                  **kwargs: Any) -> AgentLoopOutput | list[AgentLoopOutput]:
        # A list when a rollout is cut into samples: verl's TransferQueue worker takes it.
        info = _row_info(kwargs.get("extra_info"))
        messages = [dict(m) for m in kwargs["raw_prompt"]]
        # the batch's training step: the policy version of what no server call reports
        self._global_steps = _int_or_none(kwargs.get("global_steps"))
        world = runtime(self.settings.store, packs_dir=self.settings.packs_dir,
                        cache=self.settings.cache)
        problems: list[str] = []
        for attempt in range(1, self.settings.retries + 1):
            try:
                return await self._attempt(world, info, messages, sampling_params, attempt)
            except RolloutLost as exc:
                problems.append(str(exc))
                log.warning("rollout of %s lost (attempt %d): %s", info.task_id, attempt, exc)
        return self._lost(info, messages, attempt=self.settings.retries,
                          why=" | ".join(problems))

    # --- one attempt ----------------------------------------------------------------

    async def _attempt(self, world: WorldRuntime, info: RowInfo, messages: list[dict[str, Any]],
                       sampling_params: dict[str, Any], attempt: int
                       ) -> AgentLoopOutput | list[AgentLoopOutput]:
        try:
            session = await WorldSession.start(world, info,
                                               timeout=self.settings.tool_timeout)
        except WorldError as exc:
            raise RolloutLost(f"cannot open the task's world: {exc}") from exc
        trace = _Trace()
        try:
            try:
                await asyncio.wait_for(self._steps(session, messages, sampling_params, trace),
                                       self.settings.rollout_timeout)
            except TimeoutError:
                trace.termination = "timeout"  # still graded on the world it reached
            graded = await session.finish(agent=f"rl:{AGENT_NAME}")
        except asyncio.CancelledError:
            await asyncio.shield(session.abandon())
            raise
        except RolloutLost:
            await session.abandon()
            raise
        except Exception as exc:
            await session.abandon()
            raise RolloutLost(f"{type(exc).__name__}: {exc}") from exc
        if graded.grading_error is not None and not trace.format_failure:
            raise RolloutLost(f"the verifier failed: {graded.grading_error}")
        return await self._outputs(session, info, trace, graded, attempt)

    async def _steps(self, session: WorldSession, base: list[dict[str, Any]],
                     sampling_params: dict[str, Any], trace: _Trace) -> None:
        schemas, names = session.tools()
        parsed_tools = _schema_objects(schemas)
        context = list(base)
        history: list[list[dict[str, Any]]] = []  # each step: assistant + its tool messages
        runtime_ids = await self.ct_build_initial_tokens(context, tools=schemas)
        start = len(runtime_ids)
        mask: list[int] = []
        for _ in range(self.settings.max_steps):
            before = list(runtime_ids)
            began = time.perf_counter()
            try:
                output = await self.server_manager.generate(
                    request_id=self._request_id, prompt_ids=runtime_ids,
                    sampling_params=self._sampling(sampling_params))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                raise RolloutLost(f"the model server failed: {exc}") from exc
            trace.generate_seconds += time.perf_counter() - began
            _note_versions(trace, len(trace.steps), output)
            tokens = list(output.token_ids)
            if not tokens:  # an aborted or preempted request: the server's, not the model's
                raise RolloutLost(f"the model server returned no tokens "
                                  f"(stop reason {getattr(output, 'stop_reason', None)!r})")
            merged, mask, _ = await self.ct_merge_assistant_token(runtime_ids, tokens, mask)
            runtime_ids = merged.token_ids
            # verl's annotation says a list; its parsers take None (no schemas) too
            content, calls = await self.tool_parser.extract_tool_calls(
                tokens, parsed_tools)  # type: ignore[arg-type]
            step = ModelStep(index=len(trace.steps), kind="action", prompt_ids=before,
                             output_ids=tokens, logprobs=_logprobs(output, len(tokens)))
            began = time.perf_counter()
            messages, done = await self._act(session, names, content, calls, trace)
            trace.tool_seconds += time.perf_counter() - began
            if trace.format_failure:
                trace.steps.append(msgspec.structs.replace(step, format_error=True))
                trace.termination = "format_error"
                return
            trace.steps.append(step)
            if done:
                trace.termination = "answer"
                return
            history.append(messages)
            # The assistant message is in the context already as the model's own tokens
            # (merged above): only the tool turns that follow are rendered and appended.
            previous = [*context, messages[0]]
            context = [*previous, *messages[1:]]
            merged, mask = await self._merge_tool_turns(previous, context, runtime_ids, mask,
                                                        schemas)
            runtime_ids = merged.token_ids
            if len(runtime_ids) - start >= self.response_length:
                trace.termination = "length"
                return
            rebuilt = await self._next_context(base, history, runtime_ids, session, trace,
                                               sampling_params)
            if rebuilt is not None:
                context = rebuilt
                runtime_ids = await self.ct_build_initial_tokens(context, tools=schemas)
                start, mask = len(runtime_ids), []

    async def _merge_tool_turns(self, previous: list[dict[str, Any]],
                                context: list[dict[str, Any]], runtime_ids: list[int],
                                mask: list[int], schemas: list[dict[str, Any]]
                                ) -> tuple[Any, list[int]]:
        """verl's merge of the appended tool turns. It renders the delta after a synthetic
        prefix, with the tool schemas when given: dozens of schemas rendered twice per
        turn. Chat templates put the schemas in the system block, where they cannot
        change the delta; whether this one does is checked once per tokenizer and tool
        set (both ways, compared token for token), and the schemas are left out after
        that only when the delta is the same without them."""
        key = (id(self.tokenizer), id(schemas))
        needs = _DELTA_NEEDS_TOOLS.get(key) if self.settings.lean_tool_turns else True
        if needs is None:
            with_tools = await self.ct_merge_context_msg(previous, context, runtime_ids,
                                                         mask, tools=schemas)
            without = await self.ct_merge_context_msg(previous, context, runtime_ids, mask)
            needs = _DELTA_NEEDS_TOOLS[key] = (
                with_tools[0].token_ids != without[0].token_ids or with_tools[1] != without[1])
            return with_tools[0], with_tools[1]
        given: Any = schemas if needs else None  # verl's annotation omits its None default
        merged, aligned, _ = await self.ct_merge_context_msg(previous, context, runtime_ids,
                                                             mask, tools=given)
        return merged, aligned

    async def _act(self, session: WorldSession, names: frozenset[str], content: str,
                   calls: list[FunctionCall], trace: _Trace
                   ) -> tuple[list[dict[str, Any]], bool]:
        """Execute one step's calls; (its messages, whether the rollout answered)."""
        ids = [f"call_{len(session.trajectory.turns) + i}" for i in range(len(calls))]
        messages: list[dict[str, Any]] = [{"role": "assistant", "content": content,
                                           "tool_calls": [_call_message(c, i)
                                                          for c, i in zip(calls, ids,
                                                                          strict=True)]}]
        if not messages[0]["tool_calls"]:
            del messages[0]["tool_calls"]
        if not calls:
            if session.mode == "tools":  # every action is a call; the answer too
                return messages, self._fail(session, trace)
            # AWM: a step that calls nothing is the final answer (its text)
            await session.act(AnswerStep(text=content), content)
            if self._awm_stops(session, len(session.trajectory.turns) - 1):
                return messages, self._fail(session, trace)
            return messages, True
        screenshot: str | None = None  # the note of the step's last GUI screenshot
        for call, call_id in zip(calls, ids, strict=True):
            parsed = parse_call(call.name, call.arguments, names)
            if isinstance(parsed, str):
                observation = session.refuse(call.name, parsed, content)
                if session.mode == "tools" or self._awm_stops(session, len(
                        session.trajectory.turns) - 1):
                    return messages, self._fail(session, trace)
            else:
                observation = await session.act(parsed, content)
                if session.mode == "meta" and self._awm_stops(
                        session, len(session.trajectory.turns) - 1):
                    return messages, self._fail(session, trace)
                if session.answered:
                    return messages, True
            messages.append({"role": "tool", "tool_call_id": call_id,
                             "content": self._shown(observation)})
            screenshot = observation.screenshot or screenshot
        if screenshot is not None:
            # Text only: verl's multi-modal path is not used (module docstring), so where
            # gates.llm_agent sends the step's screenshot as an image, its note goes.
            messages.append({"role": "user", "content": screenshot})
        return messages, False

    @staticmethod
    def _fail(session: WorldSession, trace: _Trace) -> bool:
        """Stop the rollout for its format; False: it did not answer."""
        trace.format_failure = True
        session.trajectory.stopped = "format_error"
        if session.trajectory.format_error is None:
            session.trajectory.format_error = "the step's output has no executable tool call"
        trace.why = session.trajectory.format_error
        return False

    def _awm_stops(self, session: WorldSession, turn: int | None) -> bool:
        """AWM: a format error (conditions 1-5) at this turn stops the rollout."""
        if session.mode != "meta":
            return False
        kind, at, why = awm_format(session.trajectory, _listing(session),
                                   final=session.answered)
        stops = kind == "format_error" and (turn is None or at is None or at >= turn)
        if stops:
            session.trajectory.format_error = why
        return stops

    async def _next_context(self, base: list[dict[str, Any]], history: list[list[dict[str, Any]]],
                            runtime_ids: list[int], session: WorldSession, trace: _Trace,
                            sampling_params: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The context to go on from when the history policy cuts it, else None."""
        settings = self.settings
        if settings.history == "window":
            if settings.window and len(history) > settings.window:
                pinned = history[:1] if session.mode == "meta" and _lists_tools(history[0]) \
                    else []
                recent = history[len(pinned):][-settings.window:]
                return [*base, *(m for step in [*pinned, *recent] for m in step)]
            return None
        if settings.compact_at and len(runtime_ids) > settings.compact_at:
            summary = summary_message(await self._compact(base, history, trace,
                                                          sampling_params))
            # the summary heads the history: a later compaction summarises it too, so no
            # earlier work is forgotten
            history[:] = [[summary]]
            return [*base, summary]
        return None

    async def _compact(self, base: list[dict[str, Any]], history: list[list[dict[str, Any]]],
                       trace: _Trace, sampling_params: dict[str, Any]) -> str:
        prompt = compaction_prompt([*base[1:], *(m for step in history for m in step)])
        prompt_ids = await self.ct_build_initial_tokens(prompt)
        try:
            output = await self.server_manager.generate(
                request_id=self._request_id, prompt_ids=prompt_ids,
                # the rollout's own sampling: the summary is trained on like any step
                sampling_params=self._sampling(sampling_params))
        except Exception as exc:
            raise RolloutLost(f"the model server failed while compacting: {exc}") from exc
        tokens = list(output.token_ids)
        _note_versions(trace, len(trace.steps), output)
        trace.steps.append(ModelStep(index=len(trace.steps), kind="compaction",
                                     prompt_ids=prompt_ids, output_ids=tokens,
                                     logprobs=_logprobs(output, len(tokens))))
        tokenizer: Any = self.tokenizer
        text = await asyncio.to_thread(tokenizer.decode, tokens, skip_special_tokens=True)
        return str(text).strip()

    # --- results ----------------------------------------------------------------------

    async def _outputs(self, session: WorldSession, info: RowInfo, trace: _Trace,
                       graded: Graded, attempt: int) -> AgentLoopOutput | list[AgentLoopOutput]:
        if info.reward == "awm":
            judgement = await asyncio.to_thread(_judge, session, graded)
            scored = awm_score(session.trajectory, _listing(session), graded.verdict, judgement)
        else:
            scored = wildawm_score(trace.format_failure, graded.verdict,
                                   format_penalty=self.settings.format_penalty,
                                   partial_credit=self.settings.partial_credit)
        details = extra_info(info.reward, scored, graded.verdict,
                             interfaces=graded.interfaces, steps=len(trace.steps),
                             termination=_termination(trace), episode_id=graded.episode_id,
                             attempts=attempt)
        samples = self._samples(trace, scored.format_failure)
        metrics = AgentLoopMetrics(generate_sequences=trace.generate_seconds,
                                   tool_calls=trace.tool_seconds)
        outputs = [self._output(s, scored.reward, details, metrics, len(trace.steps),
                                session.step_seconds, self._versions(trace, s.steps))
                   for s in samples]
        return outputs[0] if len(outputs) == 1 else outputs

    def _samples(self, trace: _Trace, format_failure: bool) -> list[Sample]:
        rollout_id = self._request_id
        if self.settings.samples == "history":
            return history_samples(rollout_id, trace.steps, format_failure=format_failure)
        return segment_samples(rollout_id, trace.steps, format_failure=format_failure)

    def _versions(self, trace: _Trace, steps: list[int]) -> dict[str, int]:
        """The sample's policy versions (verl's V1 trainer tags its entries with them and
        reads them for off-policy control): the earliest and latest of its steps', or the
        batch's step for what no server call reported."""
        known = [trace.versions[i] for i in steps if i in trace.versions]
        low = min((v[0] for v in known), default=self._global_steps)
        high = max((v[1] for v in known), default=self._global_steps)
        return {} if low is None or high is None else {"min_global_steps": low,
                                                       "max_global_steps": high}

    def _output(self, sample: Sample, reward: float, details: dict[str, Any],
                metrics: AgentLoopMetrics, steps: int, step_seconds: list[float],
                versions: dict[str, int]) -> AgentLoopOutput:
        response = sample.response_ids[: self.response_length]
        return AgentLoopOutput(
            prompt_ids=self._cap_text_prompt_length(sample.prompt_ids),
            response_ids=response,
            response_mask=sample.response_mask[: len(response)],
            response_logprobs=None if sample.response_logprobs is None
            else sample.response_logprobs[: len(response)],
            reward_score=reward, num_turns=2 * steps + 1, metrics=metrics,
            extra_fields={"reward_extra_info": dict(details), "rollout_id": sample.rollout_id,
                          "sample_steps": list(sample.steps), "sample_weight": sample.weight,
                          "env_step_seconds": list(step_seconds), **versions})

    def _lost(self, info: RowInfo, messages: list[dict[str, Any]], *, attempt: int,
              why: str) -> AgentLoopOutput:
        """A rollout the infrastructure lost: reward 0, nothing trained, reported."""
        ids = self.continuous_token_builder.build_initial_tokens(messages)
        tokenizer: Any = self.tokenizer
        eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
        return AgentLoopOutput(
            prompt_ids=self._cap_text_prompt_length(ids), response_ids=[int(eos)],
            response_mask=[0], reward_score=0.0, num_turns=1, metrics=AgentLoopMetrics(),
            extra_fields={"reward_extra_info": lost_info(info.reward, attempts=attempt,
                                                         why=why),
                          "rollout_id": self._request_id, "sample_steps": [],
                          "sample_weight": 0.0, "env_step_seconds": [],
                          **self._versions(_Trace(), [])})

    # --- small parts ------------------------------------------------------------------

    @property
    def _request_id(self) -> str:
        found: str | None = getattr(self, "_rid", None)
        if found is None:
            found = self._rid = uuid.uuid4().hex  # transport only: never hashed or stored
        return found

    def _sampling(self, given: dict[str, Any]) -> dict[str, Any]:
        params = dict(given)
        stops = list(self.tool_parser.stop_token_ids or [])
        if stops:
            params["stop_token_ids"] = sorted(set(params.get("stop_token_ids") or []) | set(stops))
        return params

    def _shown(self, observation: Observation) -> str:
        return shown(observation.text, observation.is_error, self.settings.observation_limit,
                     whole=observation.whole)


_SETTING_NAMES = frozenset(f.name for f in fields(LoopSettings)) | {"name"}


def _note_versions(trace: _Trace, step: int, output: Any) -> None:
    extra = getattr(output, "extra_fields", None) or {}
    low = _int_or_none(extra.get("min_global_steps", extra.get("global_steps")))
    high = _int_or_none(extra.get("max_global_steps", extra.get("global_steps")))
    if low is not None and high is not None:
        trace.versions[step] = (low, high)


def _int_or_none(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def _termination(trace: _Trace) -> str:
    if trace.termination == "format_error" and trace.why:
        return f"format_error: {trace.why}"[:200]
    return trace.termination


def _row_info(raw: Any) -> RowInfo:
    try:
        return msgspec.convert(dict(raw or {}), RowInfo)
    except (msgspec.ValidationError, TypeError, ValueError) as exc:
        raise RLError(f"the row's extra_info is not an agent-worlds row ({exc}); write the "
                      "dataset with worldctl rl dataset") from None


def _parser(name: str, tokenizer: Any) -> ToolParser:
    key = (name, id(tokenizer))
    found = _PARSERS.get(key)
    if found is None:
        found = _PARSERS[key] = ToolParser.get_tool_parser(name, tokenizer)
    return found


def _schema_objects(schemas: list[dict[str, Any]]) -> list[OpenAIFunctionToolSchema] | None:
    """verl's typed schemas, which some parsers read for argument types (qwen3_coder);
    None when a schema uses JSON Schema that verl's model cannot hold (``anyOf`` without
    a ``type``): the parsers then take the arguments as the model wrote them."""
    key = id(schemas)  # the runtime's cached list: one per world and mode, kept alive
    if key not in _SCHEMAS:
        try:
            _SCHEMAS[key] = [OpenAIFunctionToolSchema.model_validate(s) for s in schemas]
        except ValueError:
            _SCHEMAS[key] = None
    return _SCHEMAS[key]


def _call_message(call: FunctionCall, call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def _logprobs(output: Any, n: int) -> list[float] | None:
    found = getattr(output, "log_probs", None)
    return [float(x) for x in found] if found and len(found) == n else None


def _lists_tools(step: list[dict[str, Any]]) -> bool:
    calls = step[0].get("tool_calls") or [] if step else []
    return len(calls) == 1 and calls[0]["function"]["name"] == LIST_TOOLS


def _listing(session: WorldSession) -> list[dict[str, Any]]:
    return [{"name": t.name, "input_schema": t.input_schema or {"type": "object"}}
            for t in session.instance.list_tools()]


def _judge(session: WorldSession, graded: Graded) -> Any:
    """The code-augmented judge's class, or None without a model (said in the details)."""
    if graded.verdict is None:
        return None
    from gates.judges import CodeJudge
    from worldllm.client import client_from_env

    client = client_from_env()
    if not client.configured:
        return None
    return CodeJudge(client).judge_trajectory(session.task, session.trajectory,
                                              graded.verdict)


__all__ = ["AGENT_NAME", "LoopSettings", "WorldAgentLoop"]
