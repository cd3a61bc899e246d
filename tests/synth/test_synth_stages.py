"""The synthesis stages for real: run_stage's self-correction against the loopback model
server (litellm over HTTP), content-addressed outcomes, the budget, the schema and data
stages on real SQLite, the spec checks, the code stage in the real sandboxed worker, and
the Self-Instruct expansion of scenarios with its four filters."""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest

from awmbridge.world import Day0
from synth.environments.appgen import CodeOut, CodeStage, SpecOut, SpecStage
from synth.environments.database import (
    DataOut,
    DataStage,
    ScenarioSpec,
    SchemaOut,
    SchemaStage,
    day0,
    schema_statements,
    table_columns,
)
from synth.environments.scenarios import SEEDS, Seed, expand, read_seeds
from synth.errors import BudgetSpent, SynthError
from synth.prompts import Prompt
from synth.stage import (
    SUMMARY_CHARS,
    Budget,
    Context,
    Measure,
    Stage,
    StageOutcome,
    run_stage,
    stage_key,
)
from tests.support.llm_server import LoopbackLLM, serving
from tests.support.synth_script import (
    CODE_OK,
    CODE_RAISES,
    DATA_OK,
    SCENARIO,
    SPEC,
    TABLES_OK,
    TASKS,
)
from worldllm.client import LLMClient
from worldllm.errors import NoModel

MODEL = "openai/loopback-1"
RETRY = "Earlier attempts at this failed"
PROBE = "synth prompt probe@v1"
SUMMARIZE = "synth prompt summarize@v1"
SPEC_SCENARIO = ScenarioSpec(SCENARIO["name"], SCENARIO["description"])


# --- helpers ----------------------------------------------------------------------------


class ProbeOut(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    tag: str
    rate: float
    errors: list[str] = []


class ProbeStage(Stage[ProbeOut]):
    """A stage whose error rate is what the model says: run_stage's choices, exactly."""

    name = "probe"
    threshold = 0.5
    output_type: ClassVar[type] = ProbeOut

    def __init__(self, case: str) -> None:
        self.case = case

    @property
    def prompt(self) -> Prompt:
        return Prompt("probe", 1, "Answer with a probe object.\n")

    def inputs(self) -> Any:
        return {"case": self.case}

    def request(self) -> str:
        return f"probe case {self.case}"

    def execute(self, output: ProbeOut) -> Measure:
        return Measure(output.rate, tuple(output.errors))


def probe(tag: str, rate: float, errors: list[str] | None = None) -> dict[str, Any]:
    return {"content": json.dumps({"tag": tag, "rate": rate,
                                   "errors": errors if errors is not None else [f"e {tag}"]})}


def summary_rule(tag: str, text: str) -> dict[str, Any]:
    """The summariser's answer for the attempt whose output carries `tag`."""
    return {"when": {"any_contains": SUMMARIZE, "last_contains": f'"tag": "{tag}"'},
            "reply": {"content": text}}


def attempt_rule(after: int, reply: dict[str, Any]) -> dict[str, Any]:
    """The probe's answer once `after` summaries were given (0: the first attempt)."""
    when: dict[str, Any] = {"any_contains": PROBE}
    if after:
        when["last_contains"] = f"Attempt {after}: "
    return {"when": when, "reply": reply}


def make_ctx(server: LoopbackLLM | None, tmp_path: Path, budget: Budget | None = None,
             recordings: str = "rec") -> Context:
    client = LLMClient(MODEL if server else None, api_base=server.url if server else None,
                       api_key="x", recordings=tmp_path / recordings, mode="cache",
                       num_retries=0, timeout=10)
    return Context(client, tmp_path / "outputs", budget=budget or Budget())


def system_of(request: dict[str, Any]) -> str:
    return str(request["messages"][0]["content"])


def count(server: LoopbackLLM, tag: str) -> int:
    return sum(tag in system_of(r) for r in server.requests)


@pytest.fixture
def persona() -> str:
    return day0_plan().persona


def day0_plan() -> Day0:
    schema = msgspec.convert({"tables": TABLES_OK}, SchemaOut)
    data = msgspec.convert({"inserts": DATA_OK}, DataOut)
    return day0(SPEC_SCENARIO, TASKS, schema, data)


# --- run_stage: self-correction ---------------------------------------------------------


def test_accepted_on_the_first_attempt(tmp_path: Path) -> None:
    with serving([attempt_rule(0, probe("a1", 0.2))]) as server:
        outcome = run_stage(make_ctx(server, tmp_path), ProbeStage("first"), "s")
        assert len(server.requests) == 1 and count(server, SUMMARIZE) == 0
    assert (outcome.status, outcome.chosen, outcome.error_rate) == ("accepted", 1, 0.2)
    assert outcome.output == {"tag": "a1", "rate": 0.2, "errors": ["e a1"]}
    assert outcome.attempts[0].summary is None and outcome.corrections == 0
    assert outcome.prompt == "probe@v1" and outcome.tokens > 0


def test_a_failure_then_a_success_carries_the_summary(tmp_path: Path) -> None:
    text = "ROOT-CAUSE-ONE: the rate was too high; lower it."
    rules = [summary_rule("a1", text), attempt_rule(1, probe("a2", 0.0, [])),
             attempt_rule(0, probe("a1", 0.9))]
    with serving(rules) as server:
        outcome = run_stage(make_ctx(server, tmp_path), ProbeStage("retry"), "s")
        requests = list(server.requests)
    assert [SUMMARIZE in system_of(r) for r in requests] == [False, True, False]
    summarize_user = requests[1]["messages"][-1]["content"]
    assert "Error rate: 90%" in summarize_user and "- e a1" in summarize_user
    last = requests[2]["messages"][-1]["content"]
    assert RETRY in last and f"Attempt 1: {text}" in last
    assert (outcome.status, outcome.chosen, outcome.error_rate) == ("accepted", 2, 0.0)
    assert [a.summary for a in outcome.attempts] == [text, None]
    assert outcome.attempts[0].errors == ["e a1"] and outcome.attempts[0].error_rate == 0.9


def test_five_failures_keep_the_best_attempt(tmp_path: Path) -> None:
    # rates 0.9, 0.7, 0.55 (two errors), 0.55 (one error), 0.95: the fourth is best
    replies = [probe("a1", 0.9), probe("a2", 0.7), probe("a3", 0.55, ["x", "y"]),
               probe("a4", 0.55, ["x"]), probe("a5", 0.95)]
    rules = [summary_rule(f"a{i}", f"fix attempt {i}") for i in range(1, 5)]
    rules += [attempt_rule(after, replies[after]) for after in (4, 3, 2, 1, 0)]
    with serving(rules) as server:
        outcome = run_stage(make_ctx(server, tmp_path), ProbeStage("best"), "s")
        assert count(server, PROBE) == 5 and count(server, SUMMARIZE) == 4
        final = server.requests[-1]["messages"][-1]["content"]
    assert all(f"Attempt {i}: fix attempt {i}" in final for i in range(1, 5))
    assert (outcome.status, outcome.chosen, outcome.error_rate) == ("kept_best", 4, 0.55)
    assert outcome.output["tag"] == "a4"
    assert [a.error_rate for a in outcome.attempts] == [0.9, 0.7, 0.55, 0.55, 0.95]
    assert [a.summary for a in outcome.attempts][-1] is None


def test_replies_that_never_parse_fail(tmp_path: Path) -> None:
    rules = [{"when": {"any_contains": SUMMARIZE}, "reply": {"content": "It is not JSON."}},
             {"when": {"any_contains": PROBE}, "reply": {"content": "no json here"}}]
    with serving(rules) as server:
        outcome = run_stage(make_ctx(server, tmp_path), ProbeStage("never"), "s")
        assert count(server, PROBE) == 5
        # the four summarise requests are the same request: the cache answers three
        assert count(server, SUMMARIZE) == 1
    assert (outcome.status, outcome.chosen, outcome.output) == ("failed", None, None)
    assert outcome.error_rate == 1.0 and len(outcome.attempts) == 5
    assert [a.summary for a in outcome.attempts] == ["It is not JSON."] * 4 + [None]
    assert all(a.output is None and a.errors[0].startswith(
        "the reply is not the required output: not JSON") for a in outcome.attempts)


def test_the_summary_is_cut(tmp_path: Path) -> None:
    long = "word " * 1000
    rules = [summary_rule("a1", long), attempt_rule(1, probe("a2", 0.0, [])),
             attempt_rule(0, probe("a1", 1.0))]
    with serving(rules) as server:
        outcome = run_stage(make_ctx(server, tmp_path), ProbeStage("cut"), "s")
        last = server.requests[-1]["messages"][-1]["content"]
    summary = outcome.attempts[0].summary
    assert summary is not None and SUMMARY_CHARS - 15 <= len(summary) <= SUMMARY_CHARS
    assert summary.endswith(" ... [cut]") and summary in last and long.strip() not in last


# --- content addressing, budget, no model -----------------------------------------------


def test_a_stored_outcome_is_read_not_asked_again(tmp_path: Path) -> None:
    rules = [attempt_rule(0, probe("a1", 0.1))]
    with serving(rules) as server:
        ctx = make_ctx(server, tmp_path)
        stage = ProbeStage("resume")
        first = run_stage(ctx, stage, "s")
        key = stage_key(ctx, stage)
        path = tmp_path / "outputs" / "probe" / f"{key}.json"
        assert first.key == key and path.is_file()
        assert msgspec.json.decode(path.read_bytes(), type=StageOutcome) == first
        # a fresh client without recordings: only the outcome file can answer
        other = make_ctx(server, tmp_path, recordings="rec-empty")
        assert run_stage(other, ProbeStage("resume"), "s") == first
        assert run_stage(ctx, stage, "s") == first
        assert len(server.requests) == 1
        changed = run_stage(ctx, ProbeStage("resume-2"), "s")
        assert len(server.requests) == 2
    assert changed.key != key and len(key) == 64
    assert sorted(p.name for p in (tmp_path / "outputs" / "probe").iterdir()) == sorted(
        [f"{key}.json", f"{changed.key}.json"])


def test_a_spent_budget_stops_the_stage_and_keeps_nothing(tmp_path: Path) -> None:
    rules = [summary_rule("a1", "fix it"), attempt_rule(0, probe("a1", 0.9))]
    budget = Budget(tokens=1)
    with serving(rules) as server:
        with pytest.raises(BudgetSpent, match="token budget is spent") as caught:
            run_stage(make_ctx(server, tmp_path, budget), ProbeStage("budget"), "s")
        assert len(server.requests) == 1  # the summarise call is never sent
    assert "--budget-tokens" in str(caught.value) and budget.spent_tokens > 1
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").rglob("*"))


def test_without_a_model_run_stage_raises_no_model(tmp_path: Path) -> None:
    with pytest.raises(NoModel, match="no LLM model configured"):
        run_stage(make_ctx(None, tmp_path), ProbeStage("nomodel"), "s")
    assert not (tmp_path / "outputs").exists()


# --- schema and data on real SQLite -----------------------------------------------------


def tables(n: int, broken: int = 0) -> SchemaOut:
    found = []
    for i in range(n):
        ddl = f"CREATE TABLE t{i} (id INTEGER PRIMARY KEY, created_at TEXT, updated_at TEXT)"
        found.append({"name": f"t{i}", "ddl": ddl.replace("CREATE", "CREAT") if i < broken
                      else ddl})
    return msgspec.convert({"tables": found}, SchemaOut)


def test_schema_accepted_below_ten_percent_of_failing_statements(persona: str) -> None:
    stage = SchemaStage(SPEC_SCENARIO, TASKS, persona)
    one = stage.execute(tables(11, broken=1))
    assert one.error_rate == pytest.approx(1 / 11) and stage.accepts(one)
    assert len(one.errors) == 1 and one.errors[0].startswith(
        "statement 1 (CREATE TABLE of t0) fails:")
    assert one.facts == {"tables": 10, "columns": 30, "statements": 11, "failed": 1}
    two = stage.execute(tables(11, broken=2))
    assert two.error_rate == pytest.approx(2 / 11) and not stage.accepts(two)
    assert stage.execute(tables(11)) == Measure(0.0, (), {"tables": 11, "columns": 33,
                                                          "statements": 11, "failed": 0})


def test_schema_timestamps_and_credentials_are_errors(persona: str) -> None:
    stage = SchemaStage(SPEC_SCENARIO, TASKS, persona)
    schema = msgspec.convert({"tables": [
        {"name": "notes", "ddl": "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)"},
        {"name": "members", "ddl": "CREATE TABLE members (id INTEGER PRIMARY KEY, "
                                   "password TEXT, created_at TEXT, updated_at TEXT)"},
    ]}, SchemaOut)
    measure = stage.execute(schema)
    assert measure.errors == ("table notes has no created_at or updated_at column",
                              "table members stores credentials (password); no schema does")
    assert measure.error_rate == 1.0 and not stage.accepts(measure)


def test_data_missing_parent_and_non_insert_are_errors(persona: str) -> None:
    schema = msgspec.convert({"tables": TABLES_OK}, SchemaOut)
    stage = DataStage(SPEC_SCENARIO, TASKS, schema, persona)
    assert stage.execute(msgspec.convert({"inserts": DATA_OK}, DataOut)).errors == ()
    orphan = DATA_OK[2]["statements"][0].replace("VALUES (1, 2, 3,", "VALUES (9, 2, 99,")
    update = "UPDATE books SET available = 0 WHERE id = 1"
    bad = [*DATA_OK[:2], {"table": "loans", "statements": [*DATA_OK[2]["statements"], orphan,
                                                           update]}]
    measure = stage.execute(msgspec.convert({"inserts": bad}, DataOut))
    # 4 schema statements (three tables and an index), then 8 good INSERTs, the orphan
    # and the UPDATE
    statements = len(schema_statements(schema))
    assert measure.errors[0] == f"statement {statements + 10} (into loans) is not an INSERT"
    assert measure.errors[1].startswith(
        f"statement {statements + 9} (an INSERT into loans) fails:")
    assert "FOREIGN KEY" in measure.errors[1].upper() and len(measure.errors) == 2
    assert measure.error_rate == pytest.approx(2 / 10) and not stage.accepts(measure)
    assert measure.facts["rows"] == {"users": 2, "books": 4, "loans": 2}


# --- the spec ---------------------------------------------------------------------------


def spec_stage() -> SpecStage:
    schema = msgspec.convert({"tables": TABLES_OK}, SchemaOut)
    statements = schema_statements(schema)
    return SpecStage(SCENARIO["name"], TASKS, [s.sql for s in statements],
                     table_columns(statements))


def with_op(index: int, **changes: Any) -> SpecOut:
    tools = [dict(op) for op in SPEC]
    tools[index].update(changes)
    return msgspec.convert({"tools": tools}, SpecOut)


@pytest.mark.parametrize(("changes", "needle"), [
    ({"summary": "s" * 81}, "summary has 81 characters"),
    ({"description": "d" * 201}, "description has 201 characters"),
    ({"parameters": [{"name": "book_id", "type": "integer", "example": "one"}]},
     "parameter book_id: example 'one' is not an integer"),
    ({"tables": ["books", "shelves"]}, "table shelves is not in the schema"),
    ({"fields": ["loans.colour"]}, "field loans.colour is not a column of the schema"),
    ({"parameters": [{"name": "user_id", "type": "integer", "example": 1}]},
     "parameter user_id: the user is logged in"),
])
def test_spec_problems_name_the_operation(changes: dict[str, Any], needle: str) -> None:
    measure = spec_stage().execute(with_op(1, **changes))
    assert len(measure.errors) == 1 and measure.error_rate == 0.25
    assert measure.errors[0].startswith("operation borrow_book: ") and needle in measure.errors[0]


def test_a_clean_spec_has_no_error() -> None:
    stage = spec_stage()
    measure = stage.execute(msgspec.convert({"tools": SPEC}, SpecOut))
    assert measure == Measure(0.0, (), {"tools": 4, "writing": 2}) and stage.accepts(measure)


# --- the code, in the sandboxed worker --------------------------------------------------

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


def code_stage() -> CodeStage:
    plan = day0_plan()
    ddl = [s.sql for s in schema_statements(msgspec.convert({"tables": TABLES_OK}, SchemaOut))]
    return CodeStage(SCENARIO["name"], plan.persona, msgspec.convert({"tools": SPEC}, SpecOut),
                     ddl, plan.lines())


def no_scratch(measure: Measure) -> None:
    assert not any("synth-app-" in e for e in measure.errors), measure.errors


@needs_bwrap
def test_code_loads_and_every_tool_answers() -> None:
    stage = code_stage()
    good = stage.execute(CodeOut(CODE_OK))
    assert good == Measure(0.0, (), {"tools": 4, "smoked": 4}) and stage.accepts(good)
    raises = stage.execute(CodeOut(CODE_RAISES))
    assert raises.error_rate == 1.0 and len(raises.errors) == 1
    assert raises.errors[0].startswith("the app does not load: ")
    assert "RuntimeError: the generated module fails on import" in raises.errors[0]
    missing = stage.execute(CodeOut(CODE_OK.replace("def return_book", "def give_back")))
    assert missing.error_rate == 0.25 and missing.errors == (
        "operation return_book is in the spec but the app has no tool of that name (its "
        "tools: borrow_book, give_back, list_loans, search_books)",)
    for measure in (good, raises, missing):
        no_scratch(measure)


def test_code_that_does_not_parse_names_the_line() -> None:
    measure = code_stage().execute(CodeOut("import os\n\ndef broken(:\n    pass\n"))
    assert measure.error_rate == 1.0 and len(measure.errors) == 1
    assert measure.errors[0].startswith("the code does not parse: line 3: ")


@needs_bwrap
def test_hostile_code_is_contained(tmp_path: Path) -> None:
    target = tmp_path / "escaped.txt"
    # each hostile body goes right after its tool's docstring
    body = {
        "Books whose title contains the query.": "    while True:\n        pass\n",
        "Borrow an available book.": "    import socket\n    socket.create_connection("
                                     "('1.1.1.1', 53), timeout=3).close()\n",
        "My loans, open ones first.": f"    open({str(target)!r}, 'w').write('out')\n",
    }
    code = CODE_OK
    for doc, lines in body.items():
        assert code.count(f'"""{doc}"""\n') == 1
        code = code.replace(f'"""{doc}"""\n', f'"""{doc}"""\n{lines}')
    assert code.count("1.1.1.1") == 1 and code.count("while True") == 1
    started = time.monotonic()
    measure = code_stage().execute(CodeOut(code))
    assert time.monotonic() - started < 45
    assert not target.exists()
    assert measure.error_rate == 0.75 and measure.facts == {"tools": 4, "smoked": 1}
    by_tool = {e.split(":")[0]: e for e in measure.errors}
    assert sorted(by_tool) == ["tool borrow_book", "tool list_loans", "tool search_books"]
    assert "longer than 5 s" in by_tool["tool search_books"]
    # no network in the sandbox; the host's tmp_path is not there to write into
    assert "the smoke call raised" in by_tool["tool borrow_book"]
    assert "[Errno" in by_tool["tool borrow_book"]
    assert "the smoke call raised" in by_tool["tool list_loans"]
    assert "[Errno" in by_tool["tool list_loans"]
    no_scratch(measure)


# --- scenarios ----------------------------------------------------------------------------


def test_read_seeds(tmp_path: Path) -> None:
    seeds = read_seeds(SEEDS)
    assert len(seeds) == 100 and len({s.name for s in seeds}) == 100
    assert seeds[0].name == "online_storefront"
    bad = tmp_path / "seeds.jsonl"
    bad.write_text(json.dumps({"name": "a", "description": "b"}) + "\n{not json\n")
    with pytest.raises(SynthError, match=re.escape(f"{bad}:2: not a line of seeds")):
        read_seeds(bad)
    bad.write_text(json.dumps({"name": "a", "description": "b", "extra": 1}) + "\n")
    with pytest.raises(SynthError, match=re.escape(f"{bad}:1: not a line of seeds")):
        read_seeds(bad)


def words(prefix: str, n: int = 22) -> str:
    return " ".join(f"{prefix}w{i}" for i in range(n))


def candidate(name: str) -> dict[str, Any]:
    return {"name": name, "description": words(name.replace("_", "")), "category": "misc"}


SEED_LIST = [Seed("harbour_berths", words("harbour")), Seed("bike_rental", words("bike"))]


def verdict(accept: bool, category: str, **flags: bool) -> dict[str, Any]:
    return {"content": json.dumps({"accept": accept, "content_centric": False,
                                   "read_only": False, **flags, "category": category,
                                   "reason": "scripted"})}


@pytest.fixture
def expansion() -> Iterator[LoopbackLLM]:
    dup = {"name": "harbour_copy", "description": SEED_LIST[0].description, "category": "x"}
    round_1 = [candidate("recipe_blog"), dup, candidate("fin_ledger"),
               candidate("fin_budget"), candidate("fin_taxes"), candidate("travel_a")]
    round_2 = [candidate("travel_b"), candidate("travel_c"), candidate("travel_d"),
               candidate("travel_e"), candidate("travel_f"), candidate("travel_g")]
    rules = [
        {"when": {"any_contains": "synth prompt scenarios@v1", "last_contains": "travel_a"},
         "reply": {"content": json.dumps({"scenarios": round_2})}},
        {"when": {"any_contains": "synth prompt scenarios@v1"},
         "reply": {"content": json.dumps({"scenarios": round_1})}},
        {"when": {"any_contains": "synth prompt classify@v1",
                  "last_contains": "Scenario: recipe_blog"},
         "reply": verdict(False, "media", content_centric=True)},
        {"when": {"any_contains": "synth prompt classify@v1",
                  "last_contains": "Scenario: travel"}, "reply": verdict(True, "Travel")},
        {"when": {"any_contains": "synth prompt classify@v1"},
         "reply": verdict(True, "  Personal   Finance ")},
    ]
    with serving(rules) as server:
        yield server


def test_expand_filters_and_stops_at_n(expansion: LoopbackLLM, tmp_path: Path) -> None:
    report = expand(make_ctx(expansion, tmp_path), SEED_LIST, 4, cap=2, batch=6,
                    max_rounds=5)
    assert [s.name for s in report.kept] == ["fin_ledger", "fin_budget", "travel_a",
                                             "travel_b"]
    assert [s.category for s in report.kept] == ["personal finance"] * 2 + ["travel"] * 2
    assert report.rounds == 2 and count(expansion, "synth prompt scenarios@v1") == 2
    rejected = {r["name"]: r for r in report.rejected}
    assert sorted(rejected) == ["fin_taxes", "harbour_copy", "recipe_blog"]
    assert rejected["recipe_blog"]["filter"] == "classifier"
    assert rejected["recipe_blog"]["reason"] == "content-centric: scripted"
    dup = rejected["harbour_copy"]
    assert dup["filter"] == "duplicate" and "to harbour_berths" in dup["reason"]
    found = re.match(r"cosine ([0-9.]+) ", dup["reason"])
    assert found is not None and float(found.group(1)) >= 0.85
    assert rejected["fin_taxes"]["filter"] == "category cap"
    assert "'personal finance' has 2 scenarios" in rejected["fin_taxes"]["reason"]
    # classified: every candidate up to travel_b, none after it
    assert count(expansion, "synth prompt classify@v1") == 7
    # one embedding request for the seeds, one per candidate the classifier accepted
    assert len(expansion.embedding_requests) == 1 + 6
