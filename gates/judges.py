"""The two model judges of a rollout (tiers two and three of WildAWM's adjudication).

``CodeJudge`` is AWM's code-augmented LLM judge: it reads the task, the rubric, the
trajectory and the verifier's checklist and classifies the rollout as one of
``JUDGE_CLASSES``. The checklist grounds it (a record that only looks like success does
not fool it); the model rescues what code alone gets wrong (a transient tool error, an
idempotent action).

``AgentJudge`` investigates instead of reading: over several turns it calls read-only
tools on the initial world W0 and the final world W (tables, SELECT queries, workspace
files), then calls ``verdict``.

Both answer in the same strict JSON (``{"verdict": ..., "reasoning": ...}``), validated
with msgspec; an invalid answer gets one retry with the validation error, a second invalid
answer makes the judgement's status "error". No model configured: status "not_run" with
no verdict, which nobody may read as a pass. Every call is its own session: a blind
re-judgement is just another call (``fresh=True``); gate 5's counterfactual probe adds a
``framing`` message, and with ``fresh=False`` replays the judge's ``previous`` answer
before it, as if continuing the same conversation.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import apsw
import msgspec

from gates.contract import (
    JUDGE_CLASSES,
    AnswerStep,
    GuiStep,
    JudgeClass,
    Judgement,
    Rollout,
    ShellStep,
    ToolStep,
    Trajectory,
    Verdict,
)
from gates.errors import InspectionRefused, InvalidAnswer
from gates.quality import Judges
from gates.task import Task
from replay.engine import Worlds
from replay.layout import iter_workspace, list_services, service_db, workspace_path
from replay.sqlite import refuse_host_time_zone
from worldllm.client import (
    Completion,
    LLMClient,
    Message,
    ToolCall,
    assistant_message,
    client_from_env,
    function_tool,
    object_parameters,
)
from worldllm.errors import LLMCallError, NoModel
from worldstore.errors import ConfigError, PathError

NOT_RUN_REASON = "no model configured"
WORLDS = ("initial", "final")
MAX_ROWS = 50
MAX_RESULT_CHARS = 8000
MAX_FILE_BYTES = 16000
MAX_FILES = 500
MAX_QUERY_STEPS = 5_000_000  # SQLite VM instructions: bounds a query without a clock
_STEP_CHUNK = 1000
OBSERVATION_CHARS = 400  # of each tool result, in the rendered trajectory
EVIDENCE_CHARS = 12000  # of each verifier script's evidence, in the judge's prompt
REASONING_CHARS = 300


class JudgeAnswer(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What a judge must answer, exactly."""

    verdict: JudgeClass
    reasoning: Annotated[str, msgspec.Meta(min_length=1)]


ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"verdict": {"type": "string", "enum": list(JUDGE_CLASSES)},
                   "reasoning": {"type": "string"}},
    "required": ["verdict", "reasoning"],
    "additionalProperties": False,
}
RESPONSE_FORMAT: dict[str, Any] = {
    "type": "json_schema",
    "json_schema": {"name": "judgement", "strict": True, "schema": ANSWER_SCHEMA},
}

CLASSES_TEXT = """\
- Completed: every requirement of the task is met in the final world and the answer.
- Partially Completed: some requirements are met, not all.
- Agent Error: the agent failed (wrong, missing or extra changes, a wrong answer, a claim \
of success the world does not back).
- Environment Error: the environment failed the agent (tools erred or behaved wrongly \
through no fault of the agent)."""

CODE_JUDGE_PROMPT = f"""\
You judge an agent's attempt at a task on a simulated personal computer. Classify the \
attempt as exactly one of:
{CLASSES_TEXT}
The verifier's checks come from code that compared the initial and the final world: trust \
them for the facts they check, since code is not fooled by a record that only looks right. \
A check can still be wrong when the agent reached the goal another valid way (a transient \
tool error it recovered from, an action that was already done). Evidence a verifier \
reports (facts its code read from both worlds, with success and failure criteria) is to be \
classified by those criteria. Reply with only a JSON object: \
{{"verdict": "<one of the classes>", "reasoning": "<why, citing evidence>"}}."""

AGENT_JUDGE_PROMPT = f"""\
You judge an agent's attempt at a task on a simulated personal computer by inspecting the \
computer itself. Two copies are open, read-only: "initial" (before the attempt) and \
"final" (after it). Use the tools to compare them: list_tables and query (SELECT only) on \
a service's database, list_files and read_file on the workspace. Do not trust the \
agent's claims; check the worlds. Then call verdict with exactly one of:
{CLASSES_TEXT}"""

RETRY_TEMPLATE = ("That answer is invalid: {error}. Reply again with only a JSON object "
                  '{{"verdict": one of {classes}, "reasoning": "<non-empty text>"}}.')


def parse_answer(text: str) -> JudgeAnswer:
    """Strictly decode a judge's JSON answer; InvalidAnswer says what is wrong."""
    try:
        return msgspec.json.decode(text.strip().encode(), type=JudgeAnswer)
    except msgspec.ValidationError as exc:
        raise InvalidAnswer(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise InvalidAnswer(f"not a JSON object ({exc}): {text[:200]!r}") from None


def judged_success(judgement: Judgement) -> bool | None:
    """Whether a judgement says the rollout succeeded; None when the judge did not run or
    failed, so that "no judgement" can never count as a pass."""
    if judgement.status != "ran":
        return None
    return judgement.verdict == "Completed"


# --- the code-augmented LLM judge ---------------------------------------------------------


class CodeJudge:
    """Task + rubric + trajectory + the verifier's verdict -> one judge class."""

    name = "llm"

    def __init__(self, client: LLMClient, *, max_tokens: int = 1024) -> None:
        self.client = client
        self.max_tokens = max_tokens

    def judge(self, task: Task, rollout: Rollout, *, framing: str | None = None,
              fresh: bool = True, previous: Judgement | None = None) -> Judgement:
        """Judge a graded rollout (its trajectory and the verifier's verdict)."""
        return self.judge_trajectory(task, rollout.trajectory, rollout.verdict,
                                     framing=framing, fresh=fresh, previous=previous)

    def judge_trajectory(self, task: Task, trajectory: Trajectory, verdict: Verdict, *,
                         framing: str | None = None, fresh: bool = True,
                         previous: Judgement | None = None) -> Judgement:
        messages: list[Message] = [
            {"role": "system", "content": CODE_JUDGE_PROMPT},
            {"role": "user", "content": _case(task, trajectory, verdict)},
            *_session(framing, fresh, previous)]
        try:
            return self._answer(messages)
        except NoModel:
            return _not_run()
        except LLMCallError as exc:
            return Judgement(status="error", verdict=None, reasoning=str(exc),
                             model=self.client.model)

    def _answer(self, messages: list[Message]) -> Judgement:
        error = ""
        for attempt in range(2):
            completion = self._complete(messages)
            try:
                answer = parse_answer(completion.text)
            except InvalidAnswer as exc:
                error = str(exc)
                if attempt == 0:
                    messages = [*messages, {"role": "assistant", "content": completion.text},
                                {"role": "user", "content": _retry(error)}]
                continue
            return _ran(answer, self.client.model)
        return Judgement(status="error", verdict=None, model=self.client.model,
                         reasoning=f"invalid judge answer twice; last: {error}")

    def _complete(self, messages: list[Message]) -> Completion:
        return self.client.complete(messages, response_format=RESPONSE_FORMAT,
                                    temperature=0.0, max_tokens=self.max_tokens)


# --- the agent judge ----------------------------------------------------------------------


class WorldInspector:
    """The agent judge's read-only tools over world directories (``services/``,
    ``workspace/``), named "initial" and "final". Every refusal raises
    InspectionRefused naming the world, service, path or statement."""

    def __init__(self, worlds: Mapping[str, Path]) -> None:
        self.worlds = dict(worlds)

    def services(self, world: str) -> list[str]:
        return list_services(self._root(world))

    def list_tables(self, world: str, service: str) -> str:
        rows = self._select(world, service, "SELECT name, sql FROM sqlite_master "
                                            "WHERE type = 'table' ORDER BY name")
        return "\n\n".join(f"{name}:\n{sql}" for name, sql in rows[1]) or "(no tables)"

    def query(self, world: str, service: str, sql: str) -> str:
        if not _is_select(sql):
            raise InspectionRefused(f"only SELECT (or WITH ... SELECT) statements are "
                                    f"allowed, not {sql.strip()[:80]!r}")
        columns, rows, more = self._select(world, service, sql, limit=MAX_ROWS)
        text = json.dumps({"columns": columns, "rows": rows, "truncated": more},
                          default=_cell, ensure_ascii=False)
        return _bounded(text, MAX_RESULT_CHARS)

    def list_files(self, world: str) -> str:
        files = iter_workspace(self._root(world))
        lines = [f"{rel}\t{path.lstat().st_size} bytes" for rel, path in files[:MAX_FILES]]
        if len(files) > MAX_FILES:
            lines.append(f"[... {len(files) - MAX_FILES} more files]")
        return "\n".join(lines) or "(the workspace is empty)"

    def read_file(self, world: str, path: str) -> str:
        try:
            target = workspace_path(self._root(world), path)
        except PathError as exc:
            raise InspectionRefused(f"{world}: {exc}") from None
        if not target.is_file():
            raise InspectionRefused(f"{world}: no file {path!r} in the workspace")
        with open(target, "rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
        size = target.stat().st_size
        if b"\x00" in data:
            digest = hashlib.sha256(target.read_bytes()).hexdigest()
            return f"(binary file, {size} bytes, sha256 {digest})"
        text = data[:MAX_FILE_BYTES].decode("utf-8", errors="replace")
        return text + (f"\n[... cut at {MAX_FILE_BYTES} of {size} bytes]"
                       if size > MAX_FILE_BYTES else "")

    # --- internals ------------------------------------------------------------------

    def _root(self, world: str) -> Path:
        root = self.worlds.get(world)
        if root is None:
            raise InspectionRefused(f"no world {world!r}; the worlds are "
                                    f"{', '.join(sorted(self.worlds))}")
        return root

    def _db(self, world: str, service: str) -> Path:
        known = self.services(world)
        if service not in known:
            raise InspectionRefused(f"{world}: no service {service!r}; the services are "
                                    f"{', '.join(known)}")
        return service_db(self._root(world), service)

    def _select(self, world: str, service: str, sql: str, *, limit: int | None = None
                ) -> tuple[list[str], list[list[Any]], bool]:
        """(columns, rows, whether more rows were cut) of one read-only statement."""
        conn = _read_only(self._db(world, service))
        try:
            return _fetch(conn.cursor(), sql, limit)
        except apsw.InterruptError:
            raise InspectionRefused(f"{world}/{service}: the query was stopped after "
                                    f"{MAX_QUERY_STEPS} steps; narrow it") from None
        except apsw.AuthError:
            raise InspectionRefused(f"{world}/{service}: not authorized; only reading "
                                    f"(SELECT) is allowed") from None
        except apsw.Error as exc:
            raise InspectionRefused(f"{world}/{service}: {type(exc).__name__}: {exc}"
                                    ) from None
        finally:
            conn.close()


class AgentJudge:
    """Inspects W0 and W with read-only tools over several turns, then gives a verdict.

    ``judge(task, rollout)`` rebuilds both worlds from `worlds` (the store the rollout's
    episode was saved to): W0 is the task's snapshot, W that snapshot with the episode's
    effects applied. ``judge_worlds`` takes the two directories directly. The verifier's
    verdict is shown only with ``show_verdict=True``: by default the agent judge decides
    from the worlds alone, independent of the code tier (gate 1 compares the two).
    """

    name = "agent"

    def __init__(self, client: LLMClient, *, max_turns: int = 8,
                 worlds: Worlds | None = None, show_verdict: bool = False,
                 max_tokens: int = 1024) -> None:
        if max_turns < 1:
            raise ConfigError(f"AgentJudge max_turns must be at least 1, not {max_turns}")
        self.client = client
        self.max_turns = max_turns
        self.worlds = worlds
        self.show_verdict = show_verdict
        self.max_tokens = max_tokens

    def judge(self, task: Task, rollout: Rollout, *, framing: str | None = None,
              fresh: bool = True, previous: Judgement | None = None) -> Judgement:
        if not self.client.configured:  # before rebuilding any world
            return _not_run()
        if self.worlds is None:
            raise ConfigError("AgentJudge needs the Worlds store of the rollout's episode "
                              "to judge a rollout; construct it with worlds=...")
        with rollout_worlds(self.worlds, task, rollout.episode_id) as (initial, final):
            return self.judge_worlds(
                task, rollout.trajectory, initial=initial, final=final,
                verdict=rollout.verdict if self.show_verdict else None,
                framing=framing, fresh=fresh, previous=previous)

    def judge_worlds(self, task: Task, trajectory: Trajectory, *, initial: Path, final: Path,
                     verdict: Verdict | None = None, framing: str | None = None,
                     fresh: bool = True, previous: Judgement | None = None) -> Judgement:
        inspector = WorldInspector({"initial": initial, "final": final})
        messages: list[Message] = [
            {"role": "system", "content": AGENT_JUDGE_PROMPT},
            {"role": "user", "content": _case(task, trajectory, verdict)
             + "\n\n" + _world_listing(inspector)},
            *_session(framing, fresh, previous)]
        try:
            return _Investigation(self, inspector, messages).run()
        except NoModel:
            return _not_run()
        except LLMCallError as exc:
            return Judgement(status="error", verdict=None, reasoning=str(exc),
                             model=self.client.model)


@contextmanager
def rollout_worlds(worlds: Worlds, task: Task, episode_id: str
                   ) -> Iterator[tuple[Path, Path]]:
    """(W0, W) of a stored episode: the task's snapshot (read-only, shared) and a scratch
    mount of it with the episode's effects replayed, removed afterwards."""
    from gates.rollout import episode_worlds
    from worldenv.instances.episodes import load_episode

    with episode_worlds(worlds, task, load_episode(worlds, episode_id)) as pair:
        yield pair


def _tool(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    return function_tool(name, description, object_parameters(properties))


_WORLD = {"type": "string", "enum": list(WORLDS),
          "description": "initial (W0, before the attempt) or final (W, after it)"}
_SERVICE = {"type": "string", "description": "A service name, e.g. notes"}
INSPECTION_TOOLS: list[dict[str, Any]] = [
    _tool("list_tables", "The tables of a service's database, with their CREATE statements.",
          {"world": _WORLD, "service": _SERVICE}),
    _tool("query", f"Run one read-only SELECT on a service's database (at most {MAX_ROWS} "
                   "rows are returned).",
          {"world": _WORLD, "service": _SERVICE,
           "sql": {"type": "string", "description": "One SELECT statement."}}),
    _tool("list_files", "Every file of the workspace, with its size.", {"world": _WORLD}),
    _tool("read_file", f"A workspace file's text (the first {MAX_FILE_BYTES} bytes).",
          {"world": _WORLD, "path": {"type": "string",
                                     "description": "Relative to the workspace."}}),
    _tool("verdict", "Give the final judgement and stop.",
          {"verdict": {"type": "string", "enum": list(JUDGE_CLASSES)},
           "reasoning": {"type": "string", "description": "Why, citing what you found."}}),
]
LAST_TURN_NOTE = "This is your last turn: call verdict now."
NO_CALL_NOTE = "Use the tools to inspect the worlds; finish by calling verdict."


class _Investigation:
    """One agent-judge conversation: tool turns until a valid verdict or the turn limit."""

    def __init__(self, judge: AgentJudge, inspector: WorldInspector,
                 messages: list[Message]) -> None:
        self.judge = judge
        self.inspector = inspector
        self.messages = messages
        self.invalid = 0
        self.tools: dict[str, Callable[..., str]] = {
            "list_tables": inspector.list_tables, "query": inspector.query,
            "list_files": inspector.list_files, "read_file": inspector.read_file}

    def run(self) -> Judgement:
        model = self.judge.client.model
        for turn in range(self.judge.max_turns):
            if turn == self.judge.max_turns - 1:
                self.messages.append({"role": "user", "content": LAST_TURN_NOTE})
            completion = self.judge.client.complete(
                self.messages, tools=INSPECTION_TOOLS, temperature=0.0,
                max_tokens=self.judge.max_tokens)
            self.messages.append(assistant_message(completion))
            if not completion.tool_calls:
                self.messages.append({"role": "user", "content": NO_CALL_NOTE})
                continue
            for call in completion.tool_calls:
                outcome = self._call(call)
                if isinstance(outcome, Judgement):
                    return outcome
                self.messages.append({"role": "tool", "tool_call_id": call.id,
                                      "content": outcome})
        return Judgement(status="error", verdict=None, model=model,
                         reasoning=f"no valid verdict within {self.judge.max_turns} turns")

    def _call(self, call: ToolCall) -> Judgement | str:
        """A final judgement, or the text the tool call returns to the model."""
        if call.name == "verdict":
            return self._verdict(call.arguments)
        tool = self.tools.get(call.name)
        if tool is None:
            return (f"Error: no tool {call.name!r}; the tools are "
                    f"{', '.join([*self.tools, 'verdict'])}")
        try:
            arguments = json.loads(call.arguments or "{}")
            if not isinstance(arguments, dict):
                raise TypeError("the arguments must be a JSON object")
            return tool(**arguments)
        except (json.JSONDecodeError, TypeError) as exc:
            return f"Error: bad arguments for {call.name}: {exc}"
        except InspectionRefused as exc:
            return f"Error: {exc}"

    def _verdict(self, arguments: str) -> Judgement | str:
        try:
            answer = parse_answer(arguments)
        except InvalidAnswer as exc:
            self.invalid += 1
            if self.invalid >= 2:
                return Judgement(status="error", verdict=None, model=self.judge.client.model,
                                 reasoning=f"invalid verdict twice; last: {exc}")
            return f"Error: {_retry(str(exc))}"
        return _ran(answer, self.judge.client.model)


# --- conveniences -------------------------------------------------------------------------


def render_trajectory(trajectory: Trajectory) -> str:
    """A compact, deterministic text of a trajectory for a judge's prompt."""
    lines = [f"stopped: {trajectory.stopped or 'unknown'}"]
    if trajectory.format_error:
        lines.append(f"format error: {trajectory.format_error}")
    for turn in trajectory.turns:
        step = turn.step
        if turn.reasoning:
            lines.append(f"   thought: {_cut(turn.reasoning, REASONING_CHARS)}")
        if isinstance(step, ToolStep):
            action = f"mcp {step.tool} {json.dumps(step.arguments, sort_keys=True)}"
        elif isinstance(step, ShellStep):
            action = f"shell {step.command!r}"
        elif isinstance(step, GuiStep):
            action = f"gui_{step.action} {json.dumps(step.arguments, sort_keys=True)}"
        else:
            lines.append(f"{turn.index}. answer: {step.text!r}")
            continue
        flag = " [error]" if turn.is_error else ""
        lines.append(f"{turn.index}. {action}{flag} -> "
                     f"{_cut(turn.observation, OBSERVATION_CHARS)!r}")
    if not any(isinstance(t.step, AnswerStep) for t in trajectory.turns):
        lines.append(f"final answer: {trajectory.answer!r}")
    return "\n".join(lines)


def render_verdict(verdict: Verdict) -> str:
    """The verifier's checklist and errors as text."""
    lines = [f"V = {int(verdict.passed)} ({verdict.satisfied}/{verdict.n} checks pass)"]
    lines += [f"- [{'x' if c.passed else ' '}] {c.script}: {c.name}" for c in verdict.checks]
    lines += [f"- error: {e}" for e in verdict.errors]
    for script in verdict.scripts:
        if script.evidence:
            shown = json.dumps(script.evidence, indent=1, sort_keys=True, default=str,
                               ensure_ascii=False)
            lines += [f"Evidence from {script.script}:", _bounded(shown, EVIDENCE_CHARS)]
    return "\n".join(lines)


# --- internals ----------------------------------------------------------------------------


def _case(task: Task, trajectory: Trajectory, verdict: Verdict | None) -> str:
    rubric = task.rubric.strip() or "(none: the task has no rubric)"
    parts = [f"## Task\n{task.spec.instruction}", f"## Rubric\n{rubric}",
             f"## Trajectory\n{render_trajectory(trajectory)}"]
    if verdict is not None:
        parts.append(f"## Verifier\n{render_verdict(verdict)}")
    return "\n\n".join(parts)


def _session(framing: str | None, fresh: bool, previous: Judgement | None) -> list[Message]:
    """The messages after the case: the earlier answer (continued session) and framing."""
    if fresh and previous is not None:
        raise ValueError("a fresh judge session has no previous judgement; pass "
                         "fresh=False to continue one")
    if not fresh and (previous is None or previous.verdict is None):
        raise ValueError("fresh=False continues a session: pass the previous judgement "
                         "(one that ran)")
    messages: list[Message] = []
    if previous is not None and previous.verdict is not None:
        earlier = {"verdict": previous.verdict, "reasoning": previous.reasoning}
        messages.append({"role": "assistant",
                         "content": json.dumps(earlier, sort_keys=True)})
    if framing:
        messages.append({"role": "user", "content": framing})
    return messages


def _world_listing(inspector: WorldInspector) -> str:
    return "## Worlds\n" + "\n".join(
        f"- {w}: services {', '.join(inspector.services(w)) or '(none)'}" for w in WORLDS)


def _ran(answer: JudgeAnswer, model: str | None) -> Judgement:
    return Judgement(status="ran", verdict=answer.verdict, reasoning=answer.reasoning,
                     model=model)


def _not_run() -> Judgement:
    return Judgement(status="not_run", verdict=None, reasoning=NOT_RUN_REASON)


def _retry(error: str) -> str:
    return RETRY_TEMPLATE.format(error=error, classes=json.dumps(list(JUDGE_CLASSES)))


_COMMENT = re.compile(r"\A(?:\s+|--[^\n]*(?:\n|\Z)|/\*.*?\*/)*", re.S)


def _is_select(sql: str) -> bool:
    """A cheap first check for a clear refusal; the authorizer is the real guard."""
    comments = _COMMENT.match(sql)
    head = sql[comments.end():] if comments else sql
    return re.match(r"(?i)(select|with)\b", head) is not None


_ALLOWED = {apsw.SQLITE_SELECT, apsw.SQLITE_READ, apsw.SQLITE_FUNCTION,
            apsw.SQLITE_RECURSIVE}


def _read_only(path: Path) -> apsw.Connection:
    """A connection that cannot change anything: a read-only, immutable URI, an
    authorizer that allows only reading, and a budget of VM steps per statement; its date
    functions refuse the host's time zone."""
    uri = f"file:{quote(str(path))}?mode=ro&immutable=1"
    try:
        conn = apsw.Connection(uri, flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
    except apsw.Error as exc:
        raise InspectionRefused(f"{path}: cannot open read-only: {exc}") from None
    conn.set_authorizer(lambda op, *_: apsw.SQLITE_OK if op in _ALLOWED else apsw.SQLITE_DENY)
    refuse_host_time_zone(conn)
    budget = [MAX_QUERY_STEPS // _STEP_CHUNK]

    def spend() -> bool:
        budget[0] -= 1
        return budget[0] < 0  # True interrupts the statement

    conn.set_progress_handler(spend, _STEP_CHUNK)
    return conn


def _fetch(cursor: apsw.Cursor, sql: str, limit: int | None
           ) -> tuple[list[str], list[list[Any]], bool]:
    cursor.execute(sql)
    try:
        columns = [d[0] for d in cursor.getdescription()]
    except apsw.ExecutionCompleteError:  # no row at all: SQLite has finished already
        return [], [], False
    rows: list[list[Any]] = []
    for row in cursor:
        if limit is not None and len(rows) >= limit:
            return columns, rows, True
        rows.append(list(row))
    return columns, rows, False


def _cell(value: Any) -> Any:
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    return str(value)


def _bounded(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... cut at {limit} of {len(text)} characters]"


def _cut(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def judges_from_env(worlds: Worlds) -> Judges:
    """The code-augmented LLM judge and the agent judge, or none without a model."""
    client = client_from_env()
    if not client.configured:
        return Judges()
    return Judges(llm=CodeJudge(client), agent=AgentJudge(client, worlds=worlds))


__all__ = [
    "ANSWER_SCHEMA",
    "INSPECTION_TOOLS",
    "RESPONSE_FORMAT",
    "AgentJudge",
    "CodeJudge",
    "InspectionRefused",
    "InvalidAnswer",
    "JudgeAnswer",
    "WorldInspector",
    "judged_success",
    "judges_from_env",
    "parse_answer",
    "render_trajectory",
    "render_verdict",
    "rollout_worlds",
]
