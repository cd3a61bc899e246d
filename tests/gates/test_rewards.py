"""Rewards: AWM's six format conditions and outcome reward, WildAWM's checklist reward,
group advantage and adaptive rollouts, each checked against the papers' definitions and
worked examples (methods.md sections 3 and 6)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gates.contract import (
    AnswerStep,
    Check,
    Judgement,
    ScriptResult,
    ShellStep,
    ToolStep,
    Trajectory,
    TurnRecord,
    Verdict,
)
from gates.errors import RewardError
from gates.rewards import (
    AwmStep,
    awm_outcome_reward,
    awm_step_rewards,
    awm_steps,
    catalogue_from_list_tools,
    schema_problem,
    validate_awm_rollout,
    wildawm_reward,
    wildawm_reward_exact,
)
from replay import Worlds
from rl.advantages import (
    group_advantages,
    group_status,
    launch_count,
    next_block,
    pick_group,
    update_kappa,
)
from worldenv.instances.instance import Environment

DEMO_JSONL = Path(__file__).resolve().parents[2] / "packs" / "demo" / "world" / "lars.jsonl"

THINK = "<thinking>Look up order 2 first.</thinking>"

# The schema of the demo's shop_get_order as pydantic emits it (optional ids as anyOf).
GET_ORDER = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "order_id": {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}],
                     "default": None},
        "order_number": {"anyOf": [{"type": "string", "minLength": 1, "maxLength": 40},
                                   {"type": "null"}], "default": None},
    },
}
SEND = {
    "type": "object", "additionalProperties": False, "required": ["conversation_id", "body"],
    "properties": {"conversation_id": {"type": "integer"}, "body": {"type": "string"}},
}
CATALOGUE = {"shop_get_order": GET_ORDER, "chat_send_message": SEND}


def listing(**over: Any) -> AwmStep:
    return AwmStep(**{"reasoning": THINK, "tool_name": "list_tools", "arguments_json": None,
                      "response_is_error": False, **over})


def call(tool: str = "shop_get_order", args: str | None = '{"order_id": 2}',
         error: bool | None = False, reasoning: str | None = THINK) -> AwmStep:
    return AwmStep(reasoning, tool, args, error)


def answer(reasoning: str | None = THINK) -> AwmStep:
    return AwmStep(reasoning, None)


CLEAN = [listing(), call(), answer()]


# --- the six conditions ---------------------------------------------------------------------

VIOLATIONS: list[tuple[str, list[AwmStep], int, int, str]] = [
    # (case, steps, condition, step, a word the reason must contain)
    ("no reasoning at the first step", [listing(reasoning=None), call(), answer()], 1, 0,
     "thinking"),
    ("empty thinking at a later step", [listing(), call(reasoning="<thinking> \n</thinking>"),
                                        answer()], 1, 1, "thinking"),
    ("reasoning outside the tags", [listing(), call(), answer("I am done.")], 1, 2,
     "thinking"),
    ("unclosed thinking tag", [listing(), call(reasoning="<thinking>order 2"), answer()], 1, 1,
     "thinking"),
    ("unknown tool right after list_tools", [listing(), call("shop_delete_everything", "{}"),
                                             answer()], 2, 1, "shop_delete_everything"),
    ("unknown tool at a later step", [listing(), call(), call("call_tool", "{}"), answer()],
     2, 2, "call_tool"),
    ("arguments not JSON", [listing(), call(args="{order_id: 2}"), answer()], 3, 1,
     "not valid JSON"),
    ("arguments NaN", [listing(), call(args='{"order_id": NaN}'), answer()], 3, 1, "NaN"),
    ("arguments overflow to infinity", [listing(), call(args='{"order_id": 1e999}'), answer()],
     3, 1, "too large"),
    ("arguments not an object", [listing(), call(args="[2]"), answer()], 3, 1,
     "expected object"),
    ("schema: wrong type", [listing(), call(args='{"order_id": "2"}'), answer()], 3, 1,
     "$.order_id"),
    ("schema: required missing at a later step",
     [listing(), call(), call("chat_send_message", '{"body": "hi"}'), answer()], 3, 2,
     "'conversation_id'"),
    ("schema: unknown property", [listing(), call(args='{"order_id": 2, "x": 1}'), answer()],
     3, 1, "$.x"),
    ("list_tools with arguments", [listing(arguments_json='{"all": true}'), call(), answer()],
     3, 0, "$.all"),
    ("list_tools not first", [call(), listing(), call(), answer()], 4, 0, "list_tools"),
    ("answer without list_tools", [answer()], 4, 0, "list_tools"),
    ("list_tools twice", [listing(), call(), listing(), call(), answer()], 4, 2, "second"),
    ("list_tools twice in a row", [listing(), listing(), call(), answer()], 4, 1, "second"),
    ("nothing beyond list_tools", [listing(), answer()], 5, 1, "no successful call"),
    ("only unanswered calls", [listing(), call(error=None)], 5, 1, "no successful call"),
    ("only list_tools", [listing()], 5, 0, "no successful call"),
    ("error response", [listing(), call(error=True), answer()], 6, 1, "error response"),
    ("error response at a later step", [listing(), call(), call(error=True), answer()], 6, 2,
     "error response"),
    ("list_tools error response", [listing(response_is_error=True), call(), answer()], 6, 0,
     "error response"),
    ("reasoning checked before list_tools order", [call(reasoning=None), answer()], 1, 0,
     "thinking"),
    ("a format error before an environment error",
     [listing(), call(error=True), call("nope"), answer()], 6, 1, "error response"),
]


@pytest.mark.parametrize(("steps", "condition", "step", "word"),
                         [v[1:] for v in VIOLATIONS], ids=[v[0] for v in VIOLATIONS])
def test_each_violation_names_its_condition_step_and_reason(
        steps: list[AwmStep], condition: int, step: int, word: str) -> None:
    check = validate_awm_rollout(steps, CATALOGUE)
    assert (check.condition, check.step) == (condition, step), check.reason
    assert word in check.reason
    assert check.kind == ("environment_error" if condition == 6 else "format_error")
    assert not check.ok


def test_a_clean_rollout_satisfies_all_six() -> None:
    check = validate_awm_rollout(CLEAN, CATALOGUE)
    assert check.ok and check.kind == "ok" and check.condition is None and check.step is None
    # Answering is optional: a rollout cut by the step limit after a success is clean too.
    assert validate_awm_rollout([listing(), call(), call(error=None)], CATALOGUE).ok


@pytest.mark.parametrize("steps", [[], [listing(), answer(), call()]],
                         ids=["empty", "steps after the answer"])
def test_a_malformed_rollout_is_refused(steps: list[AwmStep]) -> None:
    with pytest.raises(RewardError):
        validate_awm_rollout(steps, CATALOGUE)


# --- the JSON-schema subset, keyword by keyword -----------------------------------------------

SCHEMA_CASES: list[tuple[str, dict[str, Any], Any, str | None]] = [
    # (case, schema, value, expected problem fragment or None)
    ("integer ok", {"type": "integer"}, 3, None),
    ("integer written as 3.0", {"type": "integer"}, 3.0, None),
    ("integer refuses 3.5", {"type": "integer"}, 3.5, "expected integer, got number"),
    ("integer refuses true", {"type": "integer"}, True, "got boolean"),
    ("number takes an integer", {"type": "number"}, 3, None),
    ("number refuses a string", {"type": "number"}, "3", "got string"),
    ("boolean refuses 1", {"type": "boolean"}, 1, "got integer"),
    ("null ok", {"type": "null"}, None, None),
    ("null refuses 0", {"type": "null"}, 0, "expected null"),
    ("type list", {"type": ["string", "null"]}, None, None),
    ("type list refuses", {"type": ["string", "null"]}, 1, "expected string or null"),
    ("enum ok", {"enum": ["placed", "shipped"]}, "placed", None),
    ("enum refuses", {"enum": ["placed", "shipped"]}, "lost", "not one of"),
    ("enum tells true from 1", {"enum": [1]}, True, "not one of"),
    ("enum counts 1.0 as 1", {"enum": [1]}, 1.0, None),
    ("const", {"const": "x"}, "y", "must be"),
    ("required", {"type": "object", "required": ["b", "a"]}, {}, "'a' is missing"),
    ("properties", {"type": "object", "properties": {"a": {"type": "string"}}}, {"a": 1},
     "$.a: expected string"),
    ("additionalProperties false",
     {"type": "object", "properties": {"a": {}}, "additionalProperties": False},
     {"a": 1, "z": 2}, "$.z: unknown property"),
    ("additionalProperties schema", {"type": "object", "additionalProperties": {"type": "integer"}},
     {"k": "v"}, "$.k: expected integer"),
    ("items", {"type": "array", "items": {"type": "integer"}}, [1, "2"], "$[1]: expected integer"),
    ("nested items", {"type": "object", "properties": {"ids": {"items": {"type": "integer"}}}},
     {"ids": [1, 2.5]}, "$.ids[1]"),
    ("minItems", {"type": "array", "minItems": 1}, [], "fewer than 1"),
    ("maxItems", {"type": "array", "maxItems": 1}, [1, 2], "more than 1"),
    ("minimum", {"type": "integer", "minimum": 1}, 0, "not >= 1"),
    ("maximum", {"type": "integer", "maximum": 100}, 101, "not <= 100"),
    ("exclusiveMinimum", {"exclusiveMinimum": 0}, 0, "not > 0"),
    ("exclusiveMaximum", {"exclusiveMaximum": 1}, 0.5, None),
    ("minLength", {"type": "string", "minLength": 1}, "", "shorter than 1"),
    ("maxLength", {"type": "string", "maxLength": 2}, "abc", "longer than 2"),
    ("pattern", {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"}, "12 March",
     "does not match the pattern"),
    ("pattern ok", {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"}, "2026-03-12", None),
    ("anyOf picks the second form", {"anyOf": [{"type": "integer"}, {"type": "null"}]}, None,
     None),
    ("anyOf refuses", {"anyOf": [{"type": "integer"}, {"type": "null"}]}, "x",
     "matches none of the 2"),
    ("allOf", {"allOf": [{"type": "integer"}, {"minimum": 5}]}, 4, "not >= 5"),
    ("oneOf matched twice", {"oneOf": [{"type": "integer"}, {"type": "number"}]}, 1,
     "exactly one"),
    ("local $ref", {"$defs": {"Id": {"type": "integer"}},
                    "properties": {"id": {"$ref": "#/$defs/Id"}}}, {"id": "7"},
     "$.id: expected integer"),
    ("annotations are ignored", {"description": "x", "title": "t", "format": "email"}, 5, None),
    # keywords a hand-written subset ignored, so it let such arguments through
    ("uniqueItems (pydantic's set)", {"type": "array", "uniqueItems": True}, [1, 1.0],
     "$: [1, 1.0] has non-unique elements"),
    ("prefixItems (pydantic's tuple)",
     {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]}, [1, 2],
     "$[1]: expected string, got integer"),
    ("$ref keeps its siblings (draft 2020-12)",
     {"$defs": {"Id": {"type": "integer"}},
      "properties": {"id": {"$ref": "#/$defs/Id", "maximum": 5}}}, {"id": 7},
     "$.id: 7 is not <= 5"),
    ("multipleOf", {"multipleOf": 5}, 7, "$: 7 is not a multiple of 5"),
    ("not", {"not": {"type": "null"}}, None, "should not be valid"),
    ("minProperties", {"type": "object", "minProperties": 1}, {}, "$: {} should be non-empty"),
    ("an older draft named by $schema",
     {"$schema": "http://json-schema.org/draft-07/schema#",
      "definitions": {"Id": {"type": "integer"}}, "properties": {"id": {"$ref":
                                                                     "#/definitions/Id"}}},
     {"id": "7"}, "$.id: expected integer"),
]


@pytest.mark.parametrize(("schema", "value", "expected"), [c[1:] for c in SCHEMA_CASES],
                         ids=[c[0] for c in SCHEMA_CASES])
def test_schema_subset(schema: dict[str, Any], value: Any, expected: str | None) -> None:
    problem = schema_problem(value, schema)
    if expected is None:
        assert problem is None
    else:
        assert problem is not None and expected in problem


def test_schema_reports_the_same_first_problem_whatever_the_key_order() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"},
                                               "b": {"type": "integer"}}}
    assert schema_problem({"b": "x", "a": "y"}, schema) == \
        schema_problem({"a": "y", "b": "x"}, schema) == "$.a: expected integer, got string"
    closed = {**schema, "additionalProperties": False}
    assert schema_problem({"z": 1, "a": "y"}, closed) == "$.a: expected integer, got string"
    assert schema_problem({"c": 1, "a": 1}, closed) == \
        "$.c: unknown property (the schema allows only a, b)"


@pytest.mark.parametrize("schema", [{"$ref": "http://example.com/s"}, {"$ref": "#/$defs/Nope"},
                                    {"type": "decimal"}, {"minimum": "5"}])
def test_a_schema_outside_the_subset_is_refused(schema: dict[str, Any]) -> None:
    with pytest.raises(RewardError):
        schema_problem(1, schema)


def test_catalogue_from_list_tools() -> None:
    tools = [{"name": "a", "input_schema": {"type": "object"}},
             {"name": "b", "inputSchema": {"type": "object"}}]
    assert sorted(catalogue_from_list_tools(tools)) == ["a", "b"]
    with pytest.raises(RewardError, match="listed twice"):
        catalogue_from_list_tools([*tools, tools[0]])
    with pytest.raises(RewardError, match="item 0"):
        catalogue_from_list_tools([{"name": "a"}])


# --- the real demo catalogue and a real instance ----------------------------------------------


@pytest.fixture(scope="module")
def demo_worlds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worlds]:
    worlds = Worlds.open(tmp_path_factory.mktemp("rewards") / "store")
    worlds.import_file(DEMO_JSONL)
    yield worlds
    worlds.close()


def test_the_validator_reads_the_demo_apps_schemas_like_the_server_does(
        demo_worlds: Worlds) -> None:
    """Calls that the subset validator accepts run on a real instance; calls it refuses
    the server refuses too: the validator and the tools agree on the real schemas."""
    with Environment(demo_worlds).open("lars@7") as inst:
        catalogue = catalogue_from_list_tools(
            {"name": t.name, "input_schema": t.input_schema} for t in inst.list_tools())
        steps = [listing()]
        for tool, args in [("shop_get_order", '{"order_number": "AVL-2026-10533"}'),
                           ("calendar_list_events", '{"date_from": "2026-03-12", "limit": 5}'),
                           ("chat_list_users", "{}")]:
            result = inst.call_tool(tool, json.loads(args))
            steps.append(call(tool, args, result.is_error))
        steps.append(answer())
        assert validate_awm_rollout(steps, catalogue).ok
        for tool, args in [("calendar_list_events", '{"date_from": "12 March"}'),
                           ("shop_get_order", '{"order_id": 0}'),
                           ("chat_list_users", '{"limit": 1, "surprise": true}')]:
            check = validate_awm_rollout([listing(), call(tool, args), answer()], catalogue)
            assert check.condition == 3, check.reason
            assert inst.call_tool(tool, json.loads(args)).is_error


# --- AWM rewards ------------------------------------------------------------------------------


@pytest.mark.parametrize(("judge", "reward"), [
    ("Completed", 1.0), ("Partially Completed", 0.1), ("Agent Error", 0.0),
    ("Environment Error", 0.0),
])
def test_outcome_reward_is_broadcast_to_every_step(judge: Any, reward: float) -> None:
    assert awm_outcome_reward(judge) == reward
    result = awm_step_rewards(CLEAN, CATALOGUE, judge)
    assert result.check.ok and result.rewards == [reward] * len(CLEAN)
    ran = Judgement(status="ran", verdict=judge)
    assert awm_step_rewards(CLEAN, CATALOGUE, ran).rewards == [reward] * len(CLEAN)


def test_a_format_error_gives_minus_one_where_the_rollout_stops() -> None:
    steps = [listing(), call(), call("nope"), call(), answer()]
    result = awm_step_rewards(steps, CATALOGUE, "Completed")
    assert result.rewards == [0.0, 0.0, -1.0]
    assert result.check.condition == 2


def test_an_environment_error_gives_zero() -> None:
    steps = [listing(), call(), call(error=True), answer()]
    result = awm_step_rewards(steps, CATALOGUE, "Completed")
    assert result.rewards == [0.0, 0.0, 0.0]
    assert result.check.kind == "environment_error"


@pytest.mark.parametrize("judge", [None, Judgement(status="not_run", verdict=None),
                                   Judgement(status="error", verdict=None), "Done"])
def test_no_judge_class_means_no_reward(judge: Any) -> None:
    with pytest.raises(RewardError):
        awm_step_rewards(CLEAN, CATALOGUE, judge)


def test_a_format_error_needs_no_judge() -> None:
    assert awm_step_rewards([answer()], CATALOGUE, None).rewards == [-1.0]


def test_trajectories_convert_to_awm_steps() -> None:
    turns = [
        TurnRecord(index=0, step=ToolStep(tool="list_tools"), observation="[]", reasoning=THINK),
        TurnRecord(index=1, step=ToolStep(tool="call_tool", arguments={
            "tool_name": "shop_get_order", "arguments": {"order_id": 2}}), observation="{}",
                   reasoning=THINK),
        TurnRecord(index=2, step=ToolStep(tool="call_tool", arguments={
            "tool_name": "shop_get_order", "arguments": "{\"order_id\": 0}"}),
                   observation="error", is_error=True, reasoning=THINK),
        TurnRecord(index=3, step=AnswerStep(text="done"), observation="", reasoning=THINK),
    ]
    steps = awm_steps(Trajectory(turns=turns))
    assert steps[1] == AwmStep(THINK, "shop_get_order", '{"order_id": 2}', False)
    assert steps[3] == AwmStep(THINK, None, None, None)
    assert validate_awm_rollout(steps, CATALOGUE).condition == 3  # order_id 0 < minimum 1
    direct = TurnRecord(index=0, step=ToolStep(tool="shop_get_order", arguments={"order_id": 2}),
                        observation="")
    assert awm_steps(Trajectory(turns=[direct]))[0].tool_name == "shop_get_order"
    shell = TurnRecord(index=0, step=ShellStep(command="ls"), observation="")
    with pytest.raises(RewardError, match="shell"):
        awm_steps(Trajectory(turns=[shell]))


# --- WildAWM reward ---------------------------------------------------------------------------


@pytest.mark.parametrize(("failure", "checks", "reward"), [
    (False, [True, True, True, False], 0.075),  # V = 0, 0.1/4 * 3
    (False, [True, True, True, True], 1.0),  # min(1, 1 + 0.1)
    (False, [False] * 4, 0.0),
    (False, [True], 1.0),
    (False, [False], 0.0),
    (False, [True, False], 0.05),
    (False, [True, True, False], float(Fraction(1, 15))),
    (True, [True, True], -1.0),
    (True, [], -1.0),  # the verifier need not have run
])
def test_wildawm_reward(failure: bool, checks: list[bool], reward: float) -> None:
    assert wildawm_reward(failure, checks) == reward


def test_the_papers_example_is_exact() -> None:
    assert wildawm_reward_exact(False, [True, True, True, False]) == Fraction(3, 40)
    assert wildawm_reward(False, [True, True, True, False]) == 0.075


def _verdict(*passed: bool, errors: list[str] | None = None) -> Verdict:
    checks = [Check(script="check.py", name=f"c{i}", passed=p) for i, p in enumerate(passed)]
    return Verdict(checks=checks, errors=errors or [], scripts=[ScriptResult(
        script="check.py", checks=checks, error=None, exit_code=0, seconds=0.1)])


def test_a_verdict_is_a_checklist() -> None:
    assert wildawm_reward(False, _verdict(True, True, True, False)) == 0.075
    assert wildawm_reward(False, _verdict(True, True)) == 1.0
    assert wildawm_reward(True, _verdict(errors=["check.py: timeout"])) == -1.0


@pytest.mark.parametrize(("checks", "text"), [
    ([], "N = 0"),
    (_verdict(), "N = 0"),
    (_verdict(True, errors=["check.py: no RESULT_JSON line"]), "no RESULT_JSON line"),
    ([True, 1], "check 1"),
])
def test_no_reward_without_a_usable_checklist(checks: Any, text: str) -> None:
    with pytest.raises(RewardError, match=text):
        wildawm_reward(False, checks)
    with pytest.raises(ValueError):  # the brief's contract: N = 0 is a ValueError too
        wildawm_reward(False, checks)


@given(st.booleans(), st.lists(st.booleans(), min_size=1, max_size=30))
def test_reward_is_within_minus_one_and_one(failure: bool, checks: list[bool]) -> None:
    reward = wildawm_reward(failure, checks)
    assert -1.0 <= reward <= 1.0
    assert (reward == -1.0) == failure
    assert (reward == 1.0) == (not failure and all(checks))


@given(st.lists(st.booleans(), min_size=1, max_size=30), st.data())
def test_reward_is_monotone_in_satisfied_checks(checks: list[bool], data: st.DataObject) -> None:
    failing = [i for i, v in enumerate(checks) if not v]
    if not failing:
        return
    flipped = list(checks)
    flipped[data.draw(st.sampled_from(failing))] = True
    assert wildawm_reward(False, flipped) > wildawm_reward(False, checks)


# --- WildAWM group advantage ------------------------------------------------------------------


def test_advantage_is_the_z_score_with_population_std() -> None:
    advantages = group_advantages([1.0, 0.0, 0.0, 0.0])
    sigma = math.sqrt(0.1875)  # mean 0.25, population variance (0.5625 + 3 * 0.0625) / 4
    assert advantages == pytest.approx([0.75 / sigma, -0.25 / sigma, -0.25 / sigma,
                                        -0.25 / sigma], rel=1e-15)


@pytest.mark.parametrize(("rewards", "expected"), [
    ([-1.0] * 4, [-0.5] * 4),  # sigma = 0, every rollout a format failure: -K^(-1/2)
    ([-1.0] * 2, [-1 / math.sqrt(2)] * 2),
    ([0.0] * 4, [0.0] * 4),
    ([1.0] * 3, [0.0] * 3),
    ([0.075] * 2, [0.0] * 2),
])
def test_advantage_without_spread(rewards: list[float], expected: list[float]) -> None:
    assert group_advantages(rewards) == expected


def test_a_format_failure_among_others_gets_a_negative_advantage() -> None:
    advantages = group_advantages([-1.0, 0.0, 0.0, 0.0])
    assert advantages[0] < 0 < advantages[1]


@pytest.mark.parametrize("rewards", [[], [1.5], [-0.5], [math.nan], [True]])
def test_advantage_refuses_what_is_no_reward(rewards: list[Any]) -> None:
    with pytest.raises(RewardError):
        group_advantages(rewards)


REWARD = st.one_of(st.just(-1.0), st.sampled_from([0.0, 0.05, 0.075, 0.1, 1.0]),
                   st.floats(0, 1))


@given(st.lists(REWARD, min_size=1, max_size=16), st.randoms(use_true_random=False))
def test_advantage_is_order_independent_and_normalised(rewards: list[float], rnd: Any) -> None:
    advantages = group_advantages(rewards)
    order = list(range(len(rewards)))
    rnd.shuffle(order)
    shuffled = group_advantages([rewards[i] for i in order])
    assert shuffled == [advantages[i] for i in order]
    if len(set(rewards)) > 1:
        k = len(rewards)
        assert abs(sum(advantages) / k) < 1e-9
        assert sum(a * a for a in advantages) / k == pytest.approx(1.0)


# --- WildAWM adaptive rollouts ----------------------------------------------------------------


def test_the_papers_worked_example() -> None:
    g = 4
    kappa = Fraction(1)
    assert launch_count(kappa, g) == 4
    pool = [0.0, 0.0, 0.0, 0.0]
    assert group_status(pool, g) == "pending"  # four zeros: one distinct reward
    assert next_block(len(pool), g) == 8
    pool += [0.0, 1.0, 0.0, 0.05, 0.0, 0.0, 0.0, 0.0]
    assert group_status(pool, g) == "ready"
    kappa = update_kappa(kappa, "ready", len(pool), g)
    assert kappa == Fraction(13, 5)  # 0.2 * 1 + 0.8 * ceil(12 / 4)
    assert launch_count(kappa, g) == 12  # next time 12 launch at once
    first = [0.0, 1.0, 0.0, 0.0]  # the first four already differ: cancel the other 8
    assert group_status(first, g) == "ready"
    assert update_kappa(kappa, "ready", len(first), g) == Fraction(33, 25)  # 1.32


@pytest.mark.parametrize(("rewards", "status"), [
    ([1.0] * 4, "mastered"),
    ([1.0] * 4 + [0.0] * 8, "mastered"),  # decided by the base rollouts
    ([-1.0] * 4, "ready"),  # all format failures
    ([0.0, 0.0, 0.0, 0.05], "ready"),
    ([0.0] * 4, "pending"),
    ([0.0] * 12, "exhausted"),
    ([0.0] * 12 + [0.0], "exhausted"),
])
def test_group_status(rewards: list[float], status: str) -> None:
    assert group_status(rewards, 4) == status


def test_kappa_updates_and_launch_counts() -> None:
    assert update_kappa(Fraction(13, 5), "mastered", 4, 4) == 1
    assert update_kappa(Fraction(1), "exhausted", 12, 4) == 3
    with pytest.raises(RewardError):
        update_kappa(Fraction(1), "pending", 4, 4)
    assert launch_count(Fraction(3, 2), 4) == 12  # round half up: 1.5 -> 2 -> 4 + 8
    assert launch_count(Fraction(5, 2), 4) == 12  # 2.5 -> 3 -> min(12, 20)
    assert launch_count(Fraction(33, 25), 4) == 4
    assert next_block(8, 4) == 4  # capped at kappa_max * G = 12
    assert next_block(12, 4) == 0
    with pytest.raises(RewardError):
        group_status([0.0, 0.0], 4)
    with pytest.raises(RewardError):
        launch_count(Fraction(1), 0)


def test_pick_group_takes_both_halves() -> None:
    pool = [0.0, 0.0, 1.0, 0.05, 0.0, 0.0, 0.0, 0.0, 0.0, 0.1, 0.0, 0.0]
    chosen = pick_group(pool, 4)
    assert chosen == [0, 1, 2, 9]  # two lowest (first launched), two highest
    rewards = sorted(pool)
    lower, upper = set(rewards[:6]), set(rewards[6:])
    assert {pool[i] for i in chosen} & lower and {pool[i] for i in chosen} & upper
    assert pick_group([0.0, 1.0], 4) == [0, 1]
