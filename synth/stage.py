"""The stage framework of synthesis (methods.md section 2, "execution-based
self-correction"), shared by environment and persona-world synthesis.

A stage is: prompt -> LLM -> structured output validated strictly -> executed in
isolation -> measured (an error rate and the errors) -> accepted, or the errors are
summarised by a separate LLM call (root cause and fix, bounded) and the stage is asked
again with every summary so far -> at most ``MAX_ATTEMPTS`` attempts -> when none is
accepted, the best attempt by error rate is kept (``kept_best``), or the stage ``failed``
when no attempt even parsed.

**Content-addressed outputs.** A stage's outcome (every attempt with its output, errors
and summary, the tokens and cost) is written to ``<outputs>/<stage>/<key>.json``, the key
being the SHA-256 of the stage name, the prompt's version, the model and the stage's
inputs. Running a stage whose outcome exists reads it instead, so a killed run resumes
where it stopped and a finished stage is never paid for twice.

**Determinism.** Everything that goes into a request (inputs, error texts, summaries) is a
function of earlier outputs, never of paths, times or addresses: a run replays offline
from its recordings to the same outcomes, byte for byte.
"""

from __future__ import annotations

import hashlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, TextIO, TypeVar

import msgspec

from synth.errors import BudgetSpent
from synth.prompts import Prompt, prompt
from worldllm.client import Completion, Embeddings, LLMClient, Message
from worldstore.folders import write_file

OutT = TypeVar("OutT")
Status = Literal["accepted", "kept_best", "failed"]

MAX_ATTEMPTS = 5
SUMMARY_MAX_TOKENS = 400  # about 150 words asked for, 200-500 tokens as in AWM
SUMMARY_CHARS = 1500  # what a summary may add to the next request, at most
SHOWN_OUTPUT_CHARS = 6000  # of a failed output, shown to the summariser
SHOWN_ERRORS = 12  # errors shown to the summariser (and the count of the rest)
ERROR_CHARS = 400  # of each error


@dataclass(frozen=True, slots=True)
class Measure:
    """What executing one output gave: its error rate (0..1), the errors (deterministic
    texts: no paths, no times), and measured facts (counts) for reports."""

    error_rate: float
    errors: tuple[str, ...] = ()
    facts: dict[str, Any] = field(default_factory=dict)


class Attempt(msgspec.Struct, frozen=True):
    number: int
    output: Any  # the parsed output as JSON values; None when the reply did not parse
    error_rate: float
    errors: list[str]
    facts: dict[str, Any]
    summary: str | None  # the error summary that the next attempt was given
    tokens_in: int
    tokens_out: int
    cost: float | None


class StageOutcome(msgspec.Struct, frozen=True):
    """One stage run for one subject (a scenario, or a scenario's task)."""

    stage: str
    subject: str
    key: str
    prompt: str  # the prompt's tag, "<stage>@v<version>"
    status: Status
    chosen: int | None  # the attempt kept (1-based); None when the stage failed
    output: Any
    error_rate: float
    attempts: list[Attempt]

    @property
    def tokens(self) -> int:
        return sum(a.tokens_in + a.tokens_out for a in self.attempts)

    @property
    def cost(self) -> float | None:
        costs = [a.cost for a in self.attempts if a.cost is not None]
        return sum(costs) if costs else None

    @property
    def corrections(self) -> int:
        """Correction iterations: attempts after the first."""
        return len(self.attempts) - 1


class Stage(ABC, Generic[OutT]):
    """One stage for one subject. Subclasses set `name`, `threshold` (accepted when the
    error rate is below it; 0 means no error at all) and `keeps_best` (whether a best
    attempt kept after the last one lets later stages go on), and are built with their
    inputs."""

    name: ClassVar[str]
    threshold: ClassVar[float] = 0.0
    keeps_best: ClassVar[bool] = False
    max_tokens: ClassVar[int] = 4096
    output_type: ClassVar[type]

    @property
    def prompt(self) -> Prompt:
        return prompt(self.name)

    @abstractmethod
    def inputs(self) -> Any:
        """The stage's inputs as JSON values (part of the outcome's key)."""

    @abstractmethod
    def request(self) -> str:
        """The user message: the inputs as the model reads them."""

    def parse(self, text: str) -> OutT:
        """The reply as the stage's output type, validated strictly; ValueError naming
        what is wrong otherwise."""
        try:
            value: OutT = msgspec.json.decode(_json_text(text).encode(), type=self.output_type)
        except msgspec.ValidationError as exc:
            raise ValueError(str(exc)) from None
        except msgspec.DecodeError as exc:
            raise ValueError(f"not JSON: {exc}") from None
        return value

    @abstractmethod
    def execute(self, output: OutT) -> Measure:
        """Run the output in isolation and measure it."""

    def accepts(self, measure: Measure) -> bool:
        if self.threshold == 0:
            return not measure.errors and measure.error_rate == 0
        return measure.error_rate < self.threshold

    def proceeds(self, outcome: StageOutcome) -> bool:
        """Whether later stages may use this outcome's output."""
        return outcome.status == "accepted" or (outcome.status == "kept_best"
                                                and self.keeps_best)

    def decode(self, data: Any) -> OutT:
        """A stored output back as the output type."""
        value: OutT = msgspec.convert(data, type=self.output_type)
        return value


# --- the run's shared parts -----------------------------------------------------------


class Budget:
    """A token and a cost limit over the model calls made (answers from recordings cost
    nothing). A call is refused once a limit is reached."""

    def __init__(self, tokens: int | None = None, cost: float | None = None) -> None:
        self.tokens = tokens
        self.cost = cost
        self.spent_tokens = 0
        self.spent_cost = 0.0
        self._lock = threading.Lock()

    def check(self) -> None:
        with self._lock:
            if self.tokens is not None and self.spent_tokens >= self.tokens:
                raise BudgetSpent(f"the token budget is spent ({self.spent_tokens:,} of "
                                  f"{self.tokens:,} tokens); run again with a larger "
                                  "--budget-tokens to go on where it stopped")
            if self.cost is not None and self.spent_cost >= self.cost:
                raise BudgetSpent(f"the cost budget is spent (${self.spent_cost:.4f} of "
                                  f"${self.cost:.4f}); run again with a larger --budget-cost "
                                  "to go on where it stopped")

    def charge(self, tokens: int, cost: float | None) -> None:
        with self._lock:
            self.spent_tokens += tokens
            self.spent_cost += cost or 0.0


class Progress:
    """A progress bar per stage on a terminal (redrawn in place); silent elsewhere, where
    the summary at the end says the same."""

    WIDTH = 24

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream
        self.live = stream is not None and stream.isatty()
        self._counts: dict[str, list[int]] = {}  # stage -> [done, total, accepted]
        self._drawn = 0
        self._lock = threading.Lock()

    def expect(self, stage: str, n: int = 1) -> None:
        with self._lock:
            self._counts.setdefault(stage, [0, 0, 0])[1] += n
            self._draw()

    def done(self, stage: str, accepted: bool) -> None:
        with self._lock:
            counts = self._counts.setdefault(stage, [0, 0, 0])
            counts[0] += 1
            counts[2] += int(accepted)
            self._draw()

    def lines(self) -> list[str]:
        out = []
        for stage, (done, total, accepted) in self._counts.items():
            filled = self.WIDTH * done // total if total else 0
            out.append(f"{stage:<11} [{'#' * filled}{'.' * (self.WIDTH - filled)}] "
                       f"{done}/{total}  accepted {accepted}")
        return out

    def _draw(self) -> None:
        if not self.live or self.stream is None:
            return
        lines = self.lines()
        up = f"\x1b[{self._drawn}F" if self._drawn else ""
        self.stream.write(up + "".join(f"\x1b[2K{line}\n" for line in lines))
        self.stream.flush()
        self._drawn = len(lines)


@dataclass
class Context:
    """What stages share in one run: the (recording) client, where outcomes go, the
    budget, the progress display."""

    client: LLMClient
    outputs: Path
    budget: Budget = field(default_factory=Budget)
    progress: Progress = field(default_factory=Progress)
    max_attempts: int = MAX_ATTEMPTS
    embedder: LLMClient | None = None  # the embedding model's client (default: `client`)

    def complete(self, messages: Sequence[Message], *, json_output: bool = True,
                 max_tokens: int = 4096) -> Completion:
        self.budget.check()
        reply = self.client.complete(messages, max_tokens=max_tokens,
                                     response_format={"type": "json_object"}
                                     if json_output else None)
        if not reply.from_recording:
            self.budget.charge(reply.tokens_in + reply.tokens_out, reply.cost)
        return reply

    def embed(self, texts: Sequence[str]) -> Embeddings:
        self.budget.check()
        found = (self.embedder or self.client).embed(texts)
        if not found.from_recording:
            self.budget.charge(found.tokens_in, found.cost)
        return found

    def outcome_path(self, stage: str, key: str) -> Path:
        return self.outputs / stage / f"{key}.json"


def stage_key(ctx: Context, stage: Stage[Any]) -> str:
    """The content address of a stage run: its name, prompt version, model, attempts and
    inputs."""
    return canonical_digest({"stage": stage.name, "prompt": stage.prompt.tag,
                             "model": ctx.client.model, "max_attempts": ctx.max_attempts,
                             "inputs": stage.inputs()})


def stored_outcome(ctx: Context, stage: Stage[Any]) -> StageOutcome | None:
    path = ctx.outcome_path(stage.name, stage_key(ctx, stage))
    try:
        return msgspec.json.decode(path.read_bytes(), type=StageOutcome)
    except FileNotFoundError:
        return None


def run_stage(ctx: Context, stage: Stage[OutT], subject: str) -> StageOutcome:
    """The stage's outcome: stored already, or made now (see the module docstring).
    Raises NoModel without a model, BudgetSpent when the budget runs out (nothing of the
    stage is kept then), RecordingMissing in a replay that lacks an answer."""
    key = stage_key(ctx, stage)
    found = stored_outcome(ctx, stage)
    if found is not None:
        return found
    attempts: list[Attempt] = []
    summaries: list[str] = []
    accepted = False
    for number in range(1, ctx.max_attempts + 1):
        reply = ctx.complete(_messages(stage, summaries), max_tokens=stage.max_tokens)
        output, measure = _try(stage, reply.text)
        accepted = output is not None and stage.accepts(measure)
        summary = None
        if not accepted and number < ctx.max_attempts:
            summary = summarise(ctx, stage, reply.text, measure)
            summaries.append(summary)
        attempts.append(Attempt(
            number=number, output=None if output is None else msgspec.to_builtins(output),
            error_rate=measure.error_rate, errors=list(measure.errors),
            facts=dict(measure.facts), summary=summary, tokens_in=reply.tokens_in,
            tokens_out=reply.tokens_out, cost=reply.cost))
        if accepted:
            break
    outcome = _outcome(stage, subject, key, attempts, accepted)
    write_atomically(ctx.outcome_path(stage.name, key), encode(outcome))
    return outcome


def _try(stage: Stage[Any], text: str) -> tuple[Any, Measure]:
    """The parsed output (None when the reply does not parse) and its measure."""
    try:
        output = stage.parse(text)
    except ValueError as exc:
        return None, Measure(1.0, (_cut(f"the reply is not the required output: {exc}",
                                        ERROR_CHARS),))
    return output, stage.execute(output)


def _outcome(stage: Stage[Any], subject: str, key: str, attempts: list[Attempt],
             accepted: bool) -> StageOutcome:
    parsed = [a for a in attempts if a.output is not None]
    if accepted:
        chosen: Attempt | None = attempts[-1]
        status: Status = "accepted"
    elif parsed:
        chosen = min(parsed, key=lambda a: (a.error_rate, len(a.errors), a.number))
        status = "kept_best"
    else:
        chosen, status = None, "failed"
    return StageOutcome(stage=stage.name, subject=subject, key=key, prompt=stage.prompt.tag,
                        status=status, chosen=None if chosen is None else chosen.number,
                        output=None if chosen is None else chosen.output,
                        error_rate=1.0 if chosen is None else chosen.error_rate,
                        attempts=attempts)


def _messages(stage: Stage[Any], summaries: Sequence[str]) -> list[Message]:
    messages: list[Message] = [{"role": "system", "content": stage.prompt.system()},
                               {"role": "user", "content": stage.request()}]
    if summaries:
        notes = "\n\n".join(f"Attempt {i}: {s}" for i, s in enumerate(summaries, 1))
        messages.append({"role": "user", "content": (
            "Earlier attempts at this failed when they were run. What went wrong, and how "
            f"to fix it:\n\n{notes}\n\nWrite the whole output again with these fixed.")})
    return messages


def summarise(ctx: Context, stage: Stage[Any], text: str, measure: Measure) -> str:
    """The separate LLM call that explains a failed attempt's errors (bounded)."""
    errors = list(measure.errors[:SHOWN_ERRORS])
    more = len(measure.errors) - len(errors)
    shown = "\n".join(f"- {_cut(e, ERROR_CHARS)}" for e in errors)
    if more > 0:
        shown += f"\n- ... and {more} more"
    reply = ctx.complete([
        {"role": "system", "content": prompt("summarize").system()},
        {"role": "user", "content": (
            f"Stage: {stage.name}\nError rate: {measure.error_rate:.0%}\n\nThe output:\n"
            f"{_cut(text, SHOWN_OUTPUT_CHARS)}\n\nThe errors:\n{shown or '- (none listed)'}")},
    ], json_output=False, max_tokens=SUMMARY_MAX_TOKENS)
    return _cut(reply.text.strip() or "(the summariser said nothing)", SUMMARY_CHARS)


# --- encoding -----------------------------------------------------------------------


def canonical_digest(value: Any) -> str:
    return hashlib.sha256(msgspec.json.encode(value, order="sorted")).hexdigest()


def encode(value: Any) -> bytes:
    """The one encoding of everything a run writes: sorted keys, indented, a final
    newline (so outputs compare byte for byte)."""
    return msgspec.json.format(msgspec.json.encode(value, order="sorted"), indent=2) + b"\n"


def write_atomically(path: Path, data: bytes) -> None:
    """Written beside and renamed: a killed run leaves the old file or the new one. The
    new file is made with O_EXCL | O_NOFOLLOW (``worldstore.folders``): a link planted
    where it goes is replaced, never written through."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, data)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 15] + " ... [cut]"


def _json_text(text: str) -> str:
    """The JSON of a reply: the whole text, or the body of its one fenced block."""
    stripped = text.strip()
    if stripped.startswith("```"):
        first = stripped.find("\n")
        end = stripped.rfind("```")
        if first != -1 and end > first:
            return stripped[first + 1:end]
    return stripped


__all__ = ["MAX_ATTEMPTS", "Attempt", "Budget", "Context", "Measure", "Progress", "Stage",
           "StageOutcome", "canonical_digest", "encode", "run_stage", "stage_key",
           "stored_outcome", "summarise", "write_atomically"]
