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

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

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

# --- a JSON-schema subset -----------------------------------------------------------------
#
# Enough of JSON Schema for MCP tool input schemas (what pydantic and FastMCP emit): type
# (one or a list; "integer" is a number with no fractional part, booleans are never
# numbers), enum, const, properties, required, additionalProperties (false or a schema),
# items, minItems/maxItems, minLength/maxLength, minimum/maximum and their exclusive
# forms, pattern, anyOf/allOf/oneOf and local $ref ("#/$defs/...", which replaces its
# sibling keywords, as in draft 7). Other keywords
# (description, default, title, format, ...) are annotations here and are ignored.
# Objects are walked in sorted key order so the first problem reported never depends on
# the order a dict was built in.

_JSON_TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")


def schema_problem(value: Any, schema: Mapping[str, Any] | bool) -> str | None:
    """Why `value` (decoded JSON) does not match `schema`, naming where; None if it does."""
    return _problem(value, schema, schema, "$")


def _problem(value: Any, schema: Mapping[str, Any] | bool, root: Mapping[str, Any] | bool,
             at: str) -> str | None:
    if schema is True:
        return None
    if schema is False:
        return f"{at}: no value is allowed here"
    if "$ref" in schema:
        return _problem(value, _resolve_ref(root, str(schema["$ref"])), root, at)
    for check in (_type_problem, _enum_problem, _combinator_problem, _number_problem,
                  _string_problem, _array_problem, _object_problem):
        problem = check(value, schema, root, at)
        if problem is not None:
            return problem
    return None


def _resolve_ref(root: Mapping[str, Any] | bool, ref: str) -> Mapping[str, Any] | bool:
    if not ref.startswith("#/") or isinstance(root, bool):
        raise RewardError(f"schema $ref {ref!r}: only local references (#/...) are supported")
    node: Any = root
    for part in ref[2:].split("/"):
        key = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, Mapping) or key not in node:
            raise RewardError(f"schema $ref {ref!r} points at nothing")
        node = node[key]
    if not isinstance(node, Mapping | bool):
        raise RewardError(f"schema $ref {ref!r} does not point at a schema")
    return node


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


def _type_problem(value: Any, schema: Mapping[str, Any], _root: Any, at: str) -> str | None:
    wanted = schema.get("type")
    if wanted is None:
        return None
    allowed = [wanted] if isinstance(wanted, str) else list(wanted)
    unknown = [t for t in allowed if t not in _JSON_TYPES]
    if unknown:
        raise RewardError(f"schema at {at}: unknown JSON type {unknown[0]!r}")
    actual = json_type(value)
    if actual in allowed or (actual == "integer" and "number" in allowed):
        return None
    return f"{at}: expected {' or '.join(allowed)}, got {actual}"


def _json_key(value: Any) -> Any:
    """A comparable form under JSON equality: 1 == 1.0, but true is not 1."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return (type(value).__name__, value)
    if isinstance(value, int | float):
        return ("number", Fraction(value))
    if isinstance(value, list):
        return ("array", tuple(_json_key(v) for v in value))
    if isinstance(value, dict):
        return ("object", tuple(sorted((k, _json_key(v)) for k, v in value.items())))
    raise RewardError(f"{type(value).__name__} is not a JSON value")


def _enum_problem(value: Any, schema: Mapping[str, Any], _root: Any, at: str) -> str | None:
    if "const" in schema and _json_key(value) != _json_key(schema["const"]):
        return f"{at}: must be {json.dumps(schema['const'])}"
    if "enum" in schema and _json_key(value) not in {_json_key(v) for v in schema["enum"]}:
        allowed = ", ".join(json.dumps(v) for v in schema["enum"])
        return f"{at}: {json.dumps(value)} is not one of {allowed}"
    return None


def _combinator_problem(value: Any, schema: Mapping[str, Any], root: Any,
                        at: str) -> str | None:
    for sub in schema.get("allOf", []):
        problem = _problem(value, sub, root, at)
        if problem is not None:
            return problem
    if "anyOf" in schema:
        problems = [_problem(value, sub, root, at) for sub in schema["anyOf"]]
        if all(p is not None for p in problems):
            return f"{at}: matches none of the {len(problems)} allowed forms ({problems[0]})"
    if "oneOf" in schema:
        matches = sum(_problem(value, sub, root, at) is None for sub in schema["oneOf"])
        if matches != 1:
            return f"{at}: must match exactly one of the allowed forms, matches {matches}"
    return None


def _number_problem(value: Any, schema: Mapping[str, Any], _root: Any, at: str) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = Fraction(value)
    for keyword, symbol, sign_ok in _BOUNDS:
        bound = schema.get(keyword)
        if isinstance(bound, int | float) and not isinstance(bound, bool):
            sign = (number > bound) - (number < bound)
            if sign not in sign_ok:
                return f"{at}: {value} is not {symbol} {bound}"
    return None


# keyword, relation, the signs of (value - bound) it allows
_BOUNDS = (("minimum", ">=", (0, 1)), ("maximum", "<=", (-1, 0)),
           ("exclusiveMinimum", ">", (1,)), ("exclusiveMaximum", "<", (-1,)))


def _string_problem(value: Any, schema: Mapping[str, Any], _root: Any, at: str) -> str | None:
    if not isinstance(value, str):
        return None
    if "minLength" in schema and len(value) < schema["minLength"]:
        return f"{at}: shorter than {schema['minLength']} characters"
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        return f"{at}: longer than {schema['maxLength']} characters"
    if "pattern" in schema and re.search(schema["pattern"], value) is None:
        return f"{at}: does not match the pattern {schema['pattern']!r}"
    return None


def _array_problem(value: Any, schema: Mapping[str, Any], root: Any, at: str) -> str | None:
    if not isinstance(value, list):
        return None
    if "minItems" in schema and len(value) < schema["minItems"]:
        return f"{at}: fewer than {schema['minItems']} items"
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        return f"{at}: more than {schema['maxItems']} items"
    items = schema.get("items")
    if isinstance(items, Mapping | bool):
        for index, item in enumerate(value):
            problem = _problem(item, items, root, f"{at}[{index}]")
            if problem is not None:
                return problem
    return None


def _object_problem(value: Any, schema: Mapping[str, Any], root: Any, at: str) -> str | None:
    if not isinstance(value, dict):
        return None
    for name in sorted(schema.get("required", [])):
        if name not in value:
            return f"{at}: required property {name!r} is missing"
    properties: Mapping[str, Any] = schema.get("properties", {})
    extra_schema = schema.get("additionalProperties", True)
    for name in sorted(value):
        where = f"{at}.{name}"
        if name in properties:
            problem = _problem(value[name], properties[name], root, where)
        elif extra_schema is False:
            problem = f"{where}: unknown property (the schema allows only " \
                      f"{', '.join(sorted(properties)) or 'none'})"
        else:
            problem = _problem(value[name], extra_schema, root, where)
        if problem is not None:
            return problem
    return None


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
