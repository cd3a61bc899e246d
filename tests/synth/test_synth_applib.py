"""The app library (synth.worlds.applib) through litellm's real path against the loopback server:
astrid's day 1 needs a service no app serves; the implementer's first ``create_app`` is
refused by the app stage (an app that serves another service), the second is accepted,
and the day is stored with the app carried in the log. Day 2 plans and calls the new
service's tools (in its sandboxed worker). A second persona, bo, lists the service in its
bible (grounded by the run's library), gets it on day 0 and uses it on day 1. The run
replays offline to the same worlds; and the app stage's checks one by one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from replay.engine import Worlds
from synth.runs import replay_run
from synth.worlds.applib import check_app, read_library
from tests.support.cli_harness import invoke
from tests.support.llm_server import serving
from tests.synth.test_synth_plans import BIBLE, EXPLORE_RULES, PLAN1
from worldenv.instances.instance import Environment

MODEL = "openai/loopback"
IMPLEMENT = "synth prompt implement@v1"
SCHEMA = ["CREATE TABLE payments(id INTEGER PRIMARY KEY, payee TEXT NOT NULL, "
          "amount REAL NOT NULL, paid_at TEXT NOT NULL)"]
CODE = '''\
from typing import Annotated, Any

from pydantic import Field

from worldenv.core.app import App, ToolContext

app = App(service="bank", name="library-bank", version="1.0.0")


@app.tool(writes=False)
def list_payments(ctx: ToolContext) -> list[dict[str, Any]]:
    """Payments made, newest first."""
    return ctx.rows("SELECT id, payee, amount, paid_at FROM payments ORDER BY id DESC")


@app.tool(writes=True)
def record_payment(ctx: ToolContext,
                   payee: Annotated[str, Field(description="Who was paid")],
                   amount: Annotated[float, Field(description="Amount in NOK", gt=0)]
                   ) -> dict[str, Any]:
    """Record a payment made today."""
    payment_id = ctx.next_id("payments")
    ctx.insert("payments", {"id": payment_id, "payee": payee, "amount": amount,
                            "paid_at": ctx.now})
    return {"id": payment_id, "payee": payee, "amount": amount, "paid_at": ctx.now}
'''
OTHER_SERVICE = CODE.replace('service="bank"', 'service="money"')
T1 = "2026-03-02T09:00:00Z"


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def create(code: str) -> dict[str, Any]:
    return call("create_app", service="bank", description="Payments I make.",
                schema=SCHEMA, code=code)


DAY1 = [call("begin", activity=1),
        create(OTHER_SERVICE), create(CODE),
        call("sql", service="chat", sql="INSERT INTO users (id, name, handle, created_at, "
             "updated_at) VALUES (1, 'Astrid Holm', 'astrid', ?, ?), (2, 'Ingrid Dahl', "
             "'ingrid', ?, ?)", params=[T1] * 4),
        call("sql", service="chat", sql="INSERT INTO conversations (id, kind, created_by, "
             "created_at, updated_at) VALUES (1, 'direct', 1, ?, ?)", params=[T1] * 2),
        call("sql", service="chat", sql="INSERT INTO conversation_members VALUES "
             "(1, 1, 'owner', ?), (1, 2, 'member', ?)", params=[T1] * 2),
        call("chat_send_message", conversation_id=1, body="I will pay the deposit."),
        call("begin", activity=2),
        call("shell", command="mkdir -p photos && printf 'JPEG' > photos/order.jpg"),
        call("done", summary="Set up payments.")]
PLAN2 = {"day": 2, "date": "2026-03-03", "summary": "Paying.", "activities": [
    {"time": "10:00", "interface": "mcp", "what": "Pay Ingrid's deposit",
     "tool": "bank_record_payment", "file": None, "arc": "the planning notes"}]}
DAY2 = [call("begin", activity=1),
        call("bank_record_payment", payee="Ingrid Dahl", amount=2500.0),
        call("bank_list_payments"),
        call("done", summary="Paid the deposit.")]
BO = {"name": "bo", "occupation": "bookkeeper", "life_domain": "small-business accounts",
      "contacts": [{"name": n, "relation": "client"} for n in ("Kari", "Odd", "Siri")],
      "services": ["bank", "notes"],
      "arcs": [{"title": "the quarterly close", "days": [1, 2], "summary": "Closing.",
                "tools": ["bank_record_payment"], "image": "scans/receipt.png"},
               {"title": "the audit", "days": [3, 4], "summary": "An audit.",
                "tools": ["notes_create_note"], "image": None}],
      "accounts": [{"service": "bank", "username": "bo", "password": "pw"}]}
BO_PLAN1 = {"day": 1, "date": "2026-04-01", "summary": "A payment.", "activities": [
    {"time": "09:30", "interface": "mcp", "what": "Pay Kari", "tool": "bank_record_payment",
     "file": None, "arc": "the quarterly close"},
    {"time": "10:00", "interface": "shell", "what": "Scan the receipt",
     "tool": None, "file": "scans/receipt.png", "arc": "the quarterly close"}]}
BO_DAY1 = [call("begin", activity=1),
           call("bank_record_payment", payee="Kari", amount=300.0),
           call("begin", activity=2),
           call("shell", command="mkdir -p scans && printf 'PNG' > scans/receipt.png"),
           call("done", summary="Paid Kari.")]


def _rules() -> list[dict[str, Any]]:
    persona, plan = "synth prompt persona@v1", "synth prompt plan@v1"
    return [
        *EXPLORE_RULES,
        {"when": {"any_contains": "You review one day of a simulated persona's computer"},
         "reply": {"content": json.dumps({"passed": True, "reason": "Fine."})}},
        {"when": {"any_contains": "synth prompt diversity@v1"},
         "reply": {"content": json.dumps({"verdict": "accept"})}},
        {"when": {"any_contains": persona, "last_contains": "Persona: bo"},
         "reply": {"content": json.dumps(BO)}},
        {"when": {"any_contains": persona}, "reply": {"content": json.dumps(BIBLE)}},
        {"when": {"any_contains": plan, "last_contains": "Persona: bo"},
         "reply": {"content": json.dumps(BO_PLAN1)}},
        {"when": {"any_contains": plan, "last_contains": "Plan day 2."},
         "reply": {"content": json.dumps(PLAN2)}},
        {"when": {"any_contains": plan}, "reply": {"content": json.dumps(PLAN1)}},
        {"when": {"any_contains": IMPLEMENT, "last_contains": "Persona: bo"},
         "reply": {"tool_calls": BO_DAY1}},
        {"when": {"any_contains": IMPLEMENT, "last_contains": "The plan of day 2"},
         "reply": {"tool_calls": DAY2}},
        {"when": {"any_contains": IMPLEMENT}, "reply": {"tool_calls": DAY1}},
    ]


pytestmark = pytest.mark.usefixtures("loopback_env")


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, Any]]:
    base = tmp_path_factory.mktemp("applib")
    run, store = base / "run", base / "store"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WORLDCTL_LLM_API_KEY", "x")
        with serving(_rules()) as server:
            common = ["--run", str(run), "--model", MODEL, "--api-base", server.url]
            at = ["--store", str(store)]
            assert invoke("synth", "persona", "--name", "astrid", *common).exit_code == 0
            world = invoke(*at, "synth", "world", "astrid", "--to-day", "2", *common, "--json")
            assert world.exit_code == 0, world.output
            bo = invoke("synth", "persona", "--name", "bo", *common)
            assert bo.exit_code == 0, bo.output
            day = invoke(*at, "synth", "day", "bo", "--day", "1", *common, "--json")
            assert day.exit_code == 0, day.output
    yield run, store, json.loads(world.stdout)


def test_a_missing_service_is_written_as_an_app_and_used_the_next_day(
        made: tuple[Path, Path, Any]) -> None:
    run, store, report = made
    day1, day2 = report["days"]
    assert (day1["status"], len(day1["attempts"])) == ("stored", 1)
    library = read_library(run)
    assert list(library) == ["bank"]
    app = library["bank"]
    assert (app.tools, app.made_by) == (["bank_list_payments", "bank_record_payment"],
                                        "astrid@1")
    refused, accepted = day1["attempts"][0]["apps"]
    assert (refused["service"], refused["accepted"]) == ("bank", False)
    assert any("the app does not load" in p for p in refused["problems"])
    assert (accepted["accepted"], accepted["problems"]) == (True, [])
    with Worlds.open(store) as worlds:
        lines = [json.loads(line) for line in _export(worlds, "astrid").splitlines()]
        first = [line for line in lines if line["day"] == 1][:2]
        assert first[0]["type"] == "app" and first[0]["service"] == "bank"
        assert first[0]["code"] == CODE and first[1]["sql"] == SCHEMA[0]
        with Environment(worlds) as env, env.open("astrid@2") as instance:
            listed = instance.call_tool("bank_list_payments", {})
            assert not listed.is_error, listed.text
            assert [p["payee"] for p in listed.structured["result"]] == ["Ingrid Dahl"]
            assert listed.structured["result"][0]["paid_at"] == "2026-03-03T10:00:00Z"
    assert day2["status"] == "stored"


def _export(worlds: Worlds, persona: str) -> bytes:
    import io

    out = io.BytesIO()
    worlds.export(persona, out)
    return out.getvalue()


def test_another_persona_reuses_the_library_app(made: tuple[Path, Path, Any]) -> None:
    run, store, _ = made
    bible = json.loads((run / "personas" / "bo" / "bible.json").read_text())
    assert bible["services"] == ["bank", "notes"]
    with Worlds.open(store) as worlds:
        day0 = [json.loads(line) for line in _export(worlds, "bo").splitlines()
                if json.loads(line)["day"] == 0]
        assert any(e["type"] == "app" and e["service"] == "bank" and e.get("code") == CODE
                   for e in day0)
        with Environment(worlds) as env, env.open("bo@1") as instance:
            paid = instance.call_tool("bank_list_payments", {}).structured["result"]
            assert [(p["payee"], p["amount"]) for p in paid] == [("Kari", 300.0)]


def test_the_run_replays_offline(made: tuple[Path, Path, Any], tmp_path: Path) -> None:
    run, _, _ = made
    again = replay_run(run, tmp_path / "again")
    assert again.identical, again.differences
    assert set(again.world_hashes) == {"astrid", "bo"}


@pytest.mark.parametrize(("service", "schema", "code", "problem"), [
    ("bank", SCHEMA, OTHER_SERVICE, "the app does not load"),
    ("chat", SCHEMA, CODE, "service 'chat' exists already"),
    ("Bank!", SCHEMA, CODE, "is not a service name"),
    ("bank", ["INSERT INTO payments VALUES (1)"], CODE, "no CREATE TABLE statement"),
    ("bank", [*SCHEMA, "DROP TABLE x"], CODE, "schema statement 2: only CREATE"),
    ("bank", SCHEMA, "def broken(:\n", "the code does not parse: line 1"),
    ("bank", SCHEMA, CODE.replace("return ctx.rows(", "raise RuntimeError('x')\n    return ("),
     "tool bank_list_payments: the smoke call raised"),
])
def test_the_app_stage_refuses(service: str, schema: list[str], code: str, problem: str
                               ) -> None:
    app, problems = check_app(service, "x", schema, code, taken={"chat", "notes"},
                              made_by="t@1")
    assert app is None
    assert any(problem in p for p in problems), problems
    assert not any("/tmp" in p for p in problems)
