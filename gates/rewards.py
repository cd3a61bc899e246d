"""Rewards of the two reference methods: AWM's step-level format rules and outcome reward,
and WildAWM's checklist reward (methods.md sections 3 and 6). Group advantages and the
adaptive rollout counts that consume these rewards are RL's: ``rl/advantages.py``.

Pure functions: no I/O, no clock, no randomness. Arithmetic that decides a reward is done
with ``fractions.Fraction`` and rounded to a float once at the end, so the papers'
examples come out exactly (N = 4 with 3 passing checks gives 0.075, not 0.07500000001) and
no result depends on the order of a sum.

AWM format rules (one assistant step at a time, first violation wins):

1. non-empty reasoning inside ``<thinking>...</thinking>``;
2. no tool name outside what ``list_tools`` returned;
3. arguments are valid JSON matching the tool's input schema;
4. ``list_tools`` called exactly once, and first;
5. the rollout makes at least one successful call beyond ``list_tools``;
6. every call gets a non-error server response.

Violating 1-5 is a format error (step reward -1, the rollout stops at that step);
violating 6 is an environment error (reward 0).
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

import jsonschema
import jsonschema.protocols
import jsonschema.validators
import referencing
import referencing.exceptions

from gates.contract import (
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
from gates.errors import RewardError

# --- tool input schemas ---------------------------------------------------------------
#
# Arguments are checked with ``jsonschema`` (draft 2020-12 unless the schema names its
# dialect with ``$schema``: what pydantic and FastMCP emit). Only references inside the
# schema resolve: the registry is empty, so nothing is ever fetched. ``format`` is an
# annotation, as the draft says. The first problem is chosen by a fixed order (the
# shallowest place first, objects' keys sorted, then by keyword), so it never depends on
# the order a dict was built in, and it is worded here, naming the place as ``$.a[1]``.

_JSON_TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")
# keyword -> rank among the problems at one place: the first is reported
_RANK = {name: rank for rank, names in enumerate((
    (None, "type"), ("const", "enum"), ("anyOf", "oneOf", "not"),
    ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
    ("minLength", "maxLength", "pattern"), ("minItems", "maxItems", "uniqueItems"),
    ("required",))) for name in names}


def schema_problem(value: Any, schema: Mapping[str, Any] | bool) -> str | None:
    """Why `value` (decoded JSON) does not match `schema`, naming where; None if it does.
    A schema that is not one (an unknown type, a reference to nothing or outside it) is a
    RewardError."""
    validator = _validator(json.dumps(schema, sort_keys=True))
    try:
        errors = list(validator.iter_errors(value))
    except referencing.exceptions.Unresolvable as exc:
        raise RewardError(f"schema $ref {exc}: only references inside the schema resolve"
                          ) from None
    if not errors:
        return None
    return min((_worded(error, validator) for error in errors), key=lambda found: found[0])[1]


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str) -> jsonschema.protocols.Validator:
    """A checked validator of one schema, by its canonical JSON text (a catalogue's
    schemas are checked again for every call of a rollout)."""
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise RewardError(f"not a JSON schema at {_place(exc.absolute_path)}: {exc.message}"
                          ) from None
    return cls(schema, registry=referencing.Registry())


def _place(path: Iterable[str | int]) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


def _order(path: Iterable[str | int]) -> tuple[tuple[int, int | str], ...]:
    return tuple((0, p) if isinstance(p, int) else (1, p) for p in path)


_Worded = tuple[tuple[Any, ...], str]


def _worded(error: jsonschema.ValidationError,
            validator: jsonschema.protocols.Validator) -> _Worded:
    """(sort key, problem) of one jsonschema error."""
    path = list(error.absolute_path)
    keyword = error.validator
    value: Any = error.instance
    bound: Any = error.validator_value  # Unset only on an error made by hand
    at = _place(path)
    if keyword == "additionalProperties" and bound is False and isinstance(value, dict):
        allowed = error.schema.get("properties", {}) if isinstance(error.schema, Mapping) \
            else {}
        patterns = error.schema.get("patternProperties", {}) \
            if isinstance(error.schema, Mapping) else {}
        extra = sorted(k for k in value if k not in allowed
                       and not any(re.search(p, k) for p in patterns))
        name = extra[0] if extra else ""
        # reported where the unknown key is, so keys are visited in sorted order
        return ((_order([*path, name]), 0, ""),
                f"{_place([*path, name])}: unknown property (the schema allows only "
                f"{', '.join(sorted(allowed)) or 'none'})")
    if keyword == "required" and isinstance(value, dict):
        name = sorted(n for n in bound if n not in value)[0]
        problem = f"{at}: required property {name!r} is missing"
    elif keyword is None:
        problem = f"{at}: no value is allowed here"
    else:
        problem = _worded_keyword(error, validator, at)
    return (_order(path), _RANK.get(str(keyword), len(_RANK)), problem), problem


def _worded_keyword(error: jsonschema.ValidationError,
                    validator: jsonschema.protocols.Validator, at: str) -> str:
    keyword = error.validator
    value: Any = error.instance
    bound: Any = error.validator_value  # Unset only on an error made by hand
    if keyword == "type":
        allowed = [bound] if isinstance(bound, str) else list(bound)
        return f"{at}: expected {' or '.join(allowed)}, got {json_type(value)}"
    if keyword == "const":
        return f"{at}: must be {json.dumps(bound)}"
    if keyword == "enum":
        return f"{at}: {json.dumps(value)} is not one of {', '.join(map(json.dumps, bound))}"
    if keyword == "anyOf":
        first = [e for e in error.context or () if e.relative_schema_path[0] == 0]
        reason = min((_worded(e, validator) for e in first), key=lambda found: found[0])[1] \
            if first else "no match"
        return f"{at}: matches none of the {len(bound)} allowed forms ({reason})"
    if keyword == "oneOf":
        matches = sum(validator.evolve(schema=sub).is_valid(value) for sub in bound)
        return f"{at}: must match exactly one of the allowed forms, matches {matches}"
    symbols = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">",
               "exclusiveMaximum": "<"}
    if keyword in symbols:
        return f"{at}: {value} is not {symbols[keyword]} {bound}"
    wording = {"minLength": f"shorter than {bound} characters",
               "maxLength": f"longer than {bound} characters",
               "pattern": f"does not match the pattern {bound!r}",
               "minItems": f"fewer than {bound} items", "maxItems": f"more than {bound} items"}
    return f"{at}: {wording.get(str(keyword), error.message)}"


def json_type(value: Any) -> str:
    """The JSON type name of a decoded JSON value ("integer" for whole numbers)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    raise RewardError(f"{type(value).__name__} is not a JSON value")


# --- AWM: the step-level format validator ------------------------------------------------

LIST_TOOLS = "list_tools"
_THINKING = re.compile(r"<thinking>(.*?)</thinking>", re.S)
_NO_ARGUMENTS: Mapping[str, Any] = {"type": "object", "additionalProperties": False}

Catalogue = Mapping[str, Mapping[str, Any]]  # tool name -> its JSON input schema


@dataclass(frozen=True, slots=True)
class AwmStep:
    """One assistant step of an AWM rollout.

    ``reasoning`` is the step's text (its reasoning must sit in ``<thinking>...</thinking>``).
    ``tool_name`` is ``"list_tools"`` for the meta-tool, the ``tool_name`` passed to
    ``call_tool`` otherwise, and None for a step that calls nothing (the final answer,
    which must be the last step). ``response_is_error`` is the server's error flag, None
    when no response was recorded.
    """

    reasoning: str | None
    tool_name: str | None
    arguments_json: str | None = None
    response_is_error: bool | None = None


@dataclass(frozen=True, slots=True)
class FormatCheck:
    """The first violated condition (1-6), the step where it happened and why; condition
    None when the rollout satisfies all six."""

    condition: int | None
    step: int | None
    reason: str

    @property
    def ok(self) -> bool:
        return self.condition is None

    @property
    def kind(self) -> Literal["ok", "format_error", "environment_error"]:
        if self.condition is None:
            return "ok"
        return "environment_error" if self.condition == 6 else "format_error"


def catalogue_from_list_tools(tools: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The catalogue from a ``list_tools`` response: items with ``name`` and
    ``input_schema`` (or MCP's ``inputSchema``)."""
    found: dict[str, dict[str, Any]] = {}
    for index, tool in enumerate(tools):
        name = tool.get("name")
        schema = tool.get("input_schema", tool.get("inputSchema"))
        if not isinstance(name, str) or not isinstance(schema, Mapping):
            raise RewardError(f"list_tools item {index}: needs a 'name' and an 'input_schema'")
        if name in found:
            raise RewardError(f"list_tools item {index}: tool {name!r} is listed twice")
        found[name] = dict(schema)
    return found


def validate_awm_rollout(steps: Sequence[AwmStep], catalogue: Catalogue) -> FormatCheck:
    """Check AWM's six format conditions step by step and return the first violation.

    Within one step the conditions are checked in the order 1, 4, 2, 3, 6: a call before
    ``list_tools`` is reported as condition 4 (its root cause), not as an unknown tool.
    Condition 5 is checked after the last step and reported at it.
    """
    if not steps:
        raise RewardError("an AWM rollout without steps cannot be validated")
    listed = False
    successes = 0
    for index, step in enumerate(steps):
        if step.tool_name is None and index != len(steps) - 1:
            raise RewardError(f"step {index} calls no tool, which ends the rollout, but "
                              f"{len(steps) - index - 1} steps follow it")
        problem = _step_problem(index, step, catalogue, listed)
        if problem is not None:
            return problem
        if step.tool_name == LIST_TOOLS:
            listed = True
        elif step.tool_name is not None and step.response_is_error is False:
            successes += 1
    if successes == 0:
        return FormatCheck(5, len(steps) - 1,
                           "the rollout made no successful call beyond list_tools")
    return FormatCheck(None, None, "all six format conditions hold")


def _step_problem(index: int, step: AwmStep, catalogue: Catalogue,
                  listed: bool) -> FormatCheck | None:
    if not _has_reasoning(step.reasoning):
        return FormatCheck(1, index, "no non-empty reasoning inside <thinking>...</thinking>")
    if index == 0 and step.tool_name != LIST_TOOLS:
        what = "calls no tool" if step.tool_name is None else f"calls {step.tool_name!r}"
        return FormatCheck(4, index, f"the first step {what}; it must call list_tools")
    if listed and step.tool_name == LIST_TOOLS:
        return FormatCheck(4, index, "list_tools called a second time; it is called once")
    if step.tool_name is None:
        return None
    if step.tool_name == LIST_TOOLS:
        schema: Mapping[str, Any] = _NO_ARGUMENTS
    elif step.tool_name not in catalogue:
        return FormatCheck(2, index, f"tool {step.tool_name!r} is not one list_tools returned")
    else:
        schema = catalogue[step.tool_name]
    problem = arguments_problem(step.arguments_json, schema)
    if problem is not None:
        return FormatCheck(3, index, f"arguments of {step.tool_name!r}: {problem}")
    if step.response_is_error:
        return FormatCheck(6, index, f"the call of {step.tool_name!r} got an error response")
    return None


def _has_reasoning(text: str | None) -> bool:
    return text is not None and any(m.group(1).strip() for m in _THINKING.finditer(text))


def arguments_problem(arguments_json: str | None, schema: Mapping[str, Any]) -> str | None:
    """Why a call's JSON arguments text does not fit the tool's input schema, or None.
    Missing or empty text means no arguments (``{}``)."""
    if arguments_json is None or not arguments_json.strip():
        arguments: Any = {}
    else:
        try:
            arguments = json.loads(arguments_json, parse_constant=_refuse_constant,
                                   parse_float=_finite_float)
        except ValueError as exc:
            return f"not valid JSON: {exc}"
    return schema_problem(arguments, schema)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses to inf, which no JSON schema can bound
        raise ValueError(f"{text} is too large for a JSON number")
    return value


def awm_steps(trajectory: Trajectory) -> list[AwmStep]:
    """A recorded trajectory as AWM steps. Meta mode (``list_tools`` / ``call_tool``) and
    direct tool calls are both understood; a shell step has no place in AWM."""
    steps = []
    for turn in trajectory.turns:
        step = turn.step
        if isinstance(step, AnswerStep):
            steps.append(AwmStep(turn.reasoning, None))
        elif isinstance(step, ShellStep | GuiStep):
            kind = "a shell" if isinstance(step, ShellStep) else "a GUI"
            raise RewardError(f"turn {turn.index} is {kind} step; AWM rollouts only call tools")
        else:
            name, arguments = _awm_call(turn.index, step)
            steps.append(AwmStep(turn.reasoning, name, arguments, turn.is_error))
    return steps


def _awm_call(index: int, step: ToolStep) -> tuple[str, str]:
    if step.tool != "call_tool":
        return step.tool, json.dumps(step.arguments, sort_keys=True)
    name = step.arguments.get("tool_name")
    if not isinstance(name, str):
        raise RewardError(f"turn {index}: call_tool without a 'tool_name' string")
    inner = step.arguments.get("arguments", "{}")
    return name, inner if isinstance(inner, str) else json.dumps(inner, sort_keys=True)


# --- AWM: outcome reward -------------------------------------------------------------------

AWM_OUTCOME: Mapping[JudgeClass, Fraction] = {
    "Completed": Fraction(1),
    "Partially Completed": Fraction(1, 10),
    "Agent Error": Fraction(0),
    "Environment Error": Fraction(0),
}


def awm_outcome_reward(judgement: JudgeClass | Judgement) -> float:
    """Completed 1.0, Partially Completed 0.1, Agent Error and Environment Error 0.0."""
    return float(AWM_OUTCOME[_judge_class(judgement)])


def _judge_class(judgement: JudgeClass | Judgement) -> JudgeClass:
    if isinstance(judgement, Judgement):
        if judgement.status != "ran" or judgement.verdict is None:
            raise RewardError(f"the judge did not run (status {judgement.status!r}); "
                              "a judgement that was not made is no reward")
        return judgement.verdict
    if judgement not in AWM_OUTCOME:
        raise RewardError(f"unknown judge class {judgement!r}; one of {', '.join(AWM_OUTCOME)}")
    return judgement


@dataclass(frozen=True, slots=True)
class AwmRewards:
    """Per-step rewards of one rollout and the format check they follow from. The list
    ends at the step where the rollout stopped."""

    check: FormatCheck
    rewards: list[float]


def awm_step_rewards(steps: Sequence[AwmStep], catalogue: Catalogue,
                     judgement: JudgeClass | Judgement | None) -> AwmRewards:
    """Step rewards: a format error at step k gives 0 before k and -1 at k (the rollout
    stops there); an environment error at step k gives 0 up to k; a normally terminated
    rollout gets the judge's outcome reward on every step. `judgement` is needed only
    for the last case."""
    check = validate_awm_rollout(steps, catalogue)
    if check.kind == "format_error":
        assert check.step is not None
        return AwmRewards(check, [0.0] * check.step + [-1.0])
    if check.kind == "environment_error":
        assert check.step is not None
        return AwmRewards(check, [0.0] * (check.step + 1))
    if judgement is None:
        raise RewardError("the rollout terminated normally; its reward needs the judge's class")
    return AwmRewards(check, [awm_outcome_reward(judgement)] * len(steps))


# --- WildAWM: checklist reward and group advantage ----------------------------------------

PARTIAL_CREDIT = Fraction(1, 10)


def wildawm_reward(format_failure: bool, checks: Sequence[bool] | Verdict) -> float:
    """r = -1 on a format failure, else min(1, V + 0.1/N * sum v_i) with V = prod v_i.

    A format failure is -1 whatever the checklist (the verifier need not have run). An
    error verdict raises: a verifier that failed measured nothing. N = 0 raises: a
    verifier with no criteria is invalid, not a pass.
    """
    return float(wildawm_reward_exact(format_failure, checks))


def wildawm_reward_exact(format_failure: bool, checks: Sequence[bool] | Verdict) -> Fraction:
    if format_failure:
        return Fraction(-1)
    values = _checklist(checks)
    if not values:
        raise RewardError("a verifier with no criteria (N = 0) is invalid; it has no reward")
    product = Fraction(int(all(values)))
    return min(Fraction(1), product + PARTIAL_CREDIT * sum(values) / len(values))


def _checklist(checks: Sequence[bool] | Verdict) -> list[bool]:
    if isinstance(checks, Verdict):
        if checks.is_error:
            raise RewardError(f"the verdict is a verifier error ({'; '.join(checks.errors)}); "
                              "a verifier error is not a reward")
        return [c.passed for c in checks.checks]
    for index, value in enumerate(checks):
        if not isinstance(value, bool):
            raise RewardError(f"check {index} is {value!r}, not a boolean")
    return list(checks)


def wildawm_rollout_reward(rollout: Rollout) -> float:
    """The reward of a graded rollout: its format error flag and its verdict."""
    return wildawm_reward(rollout.trajectory.format_error is not None, rollout.verdict)


def rollout_reward(rollout: Rollout) -> float | None:
    """The WildAWM reward of a graded rollout as reported beside it, or None when it has
    none: its verdict is a verifier error (which measured nothing)."""
    if rollout.verdict.is_error and rollout.trajectory.format_error is None:
        return None
    return wildawm_rollout_reward(rollout)


__all__ = [
    "AWM_OUTCOME",
    "LIST_TOOLS",
    "AwmRewards",
    "AwmStep",
    "FormatCheck",
    "RewardError",
    "arguments_problem",
    "awm_outcome_reward",
    "awm_step_rewards",
    "awm_steps",
    "catalogue_from_list_tools",
    "json_type",
    "rollout_reward",
    "schema_problem",
    "validate_awm_rollout",
    "wildawm_reward",
    "wildawm_reward_exact",
    "wildawm_rollout_reward",
]
