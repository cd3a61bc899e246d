"""Five-layer world-day validation on real stores: the demo world's days pass, and each
planted defect fails the layer it belongs to, with a reason that names it."""

from __future__ import annotations

import io
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gates.contract import to_json
from replay import Worlds
from synth.worlds.validate_day import (
    LAYERS,
    DayReport,
    ReviewOutcome,
    clock_and_random_uses,
    inserted_identities,
    path_problem,
    render_day_report,
    validate_day,
)
from worldenv.instances.instance import Environment

HERE = Path(__file__).resolve().parents[1]
DEMO_JSONL = HERE.parent / "packs" / "demo" / "world" / "lars.jsonl"
FIXTURES = HERE / "fixtures" / "validate_day"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worlds]:
    worlds = Worlds.open(tmp_path_factory.mktemp("demo") / "store")
    worlds.import_file(DEMO_JSONL)
    yield worlds
    worlds.close()


def statuses(report: DayReport) -> dict[str, str]:
    return {layer.layer: layer.status for layer in report.layers}


# --- the demo world passes ---------------------------------------------------------------------


@pytest.mark.parametrize("day", [5, 7])
def test_demo_days_pass_layers_one_to_four(demo: Worlds, day: int) -> None:
    produces = FIXTURES / f"lars-day{day}.produces.json"
    report = validate_day(demo, f"lars@{day}", produces=produces)
    assert [layer.layer for layer in report.layers] == list(LAYERS)
    assert statuses(report) == {"lint": "passed", "replay": "passed",
                                "declarations": "passed", "health": "passed",
                                "review": "not_run"}, render_day_report(report)
    assert report.ok and (report.passed, report.failed, report.not_run) == (4, 0, 1)
    assert report.world_hash == demo.resolve(f"lars@{day}").world_hash
    entries = report.layer("declarations").evidence["entries"]
    assert len(entries) >= 10 and all(e["problem"] is None for e in entries)
    health = report.layer("health").evidence["services"]
    assert sorted(health) == ["calendar", "chat", "notes", "shop"]
    assert all(s.get("ok") for s in health.values())


def test_every_demo_day_replays_and_boots(demo: Worlds) -> None:
    with Environment(demo) as env:  # one environment for every day, kept open by the caller
        for day in range(8):
            report = validate_day(demo, f"lars@{day}", env=env)
            assert statuses(report) == {"lint": "passed", "replay": "passed",
                                        "declarations": "not_run", "health": "passed",
                                        "review": "not_run"}, render_day_report(report)
            assert report.layer("declarations").reason.startswith("no produces.json")
            runs = report.layer("replay").evidence["runs"]
            assert runs == [report.world_hash, report.world_hash]


def test_a_days_declarations_do_not_hold_for_the_next_day(demo: Worlds) -> None:
    """The day-5 fixture describes day 5 only: on day 6 its writes are all unchanged, so
    the check cannot be passed by declaring what merely exists."""
    report = validate_day(demo, "lars@6", produces=FIXTURES / "lars-day5.produces.json")
    layer = report.layer("declarations")
    assert layer.status == "failed" and not report.ok
    problems = {e["entry"]: e["problem"] for e in layer.evidence["entries"] if e["problem"]}
    # bom.md is rewritten on day 6 too and still names the order; accounts need only exist
    assert sorted(problems) == ["cross_refs[0]"] + [f"db_writes[{i}]" for i in range(9)]
    assert "missing" in problems["db_writes[1]"]  # order 2 is no longer 'placed'
    assert "unchanged (1 matching row," in problems["db_writes[6]"]  # chat message 50
    assert "unchanged (15 matching rows," in problems["db_writes[2]"]
    assert "no row matched the day before" in problems["db_writes[5]"]


# --- planted declaration defects ----------------------------------------------------------------


@pytest.mark.parametrize(("produces", "entry", "words"), [
    ({"db_writes": [{"service": "shop", "table": "orders", "where": {"id": 3}}]},
     "db_writes[0]", ["shop.orders", '"id": 3', "missing"]),
    ({"db_writes": [{"service": "shop", "table": "orders", "where": {"id": 2}},
                    {"service": "notes", "table": "notes", "where": {"id": 1}}]},
     "db_writes[1]", ["notes.notes", "unchanged"]),
    ({"db_writes": [{"service": "shop", "table": "refunds", "where": {}}]},
     "db_writes[0]", ["no table shop.refunds"]),
    ({"db_writes": [{"service": "crm", "table": "leads", "where": {}}]},
     "db_writes[0]", ["no service 'crm'"]),
    ({"db_writes": [{"service": "shop", "table": "orders", "where": {"colour": "red"}}]},
     "db_writes[0]", ["where.colour", "no column"]),
    ({"db_writes": [{"service": "shop", "table": "orders", "where": {"id": 2},
                     "change": "removed"}]}, "db_writes[0]", ["declared removed", "1 still match"]),
    ({"files": ["jobs/nordlys/bom.md", "docs/rates.md"]}, "files[1]",
     ["docs/rates.md", "unchanged"]),
    ({"files": ["jobs/nordlys/order.pdf"]}, "files[0]", ["missing"]),
    ({"files": ["../etc/passwd"]}, "files[0]", ["'..'"]),
    ({"files": [{"path": "docs/old-rates.txt", "change": "removed"}]}, "files[0]",
     ["did not exist the day before"]),
    ({"accounts": [{"service": "shop", "table": "users", "where": {"id": 2}}]},
     "accounts[0]", ["shop.users", "missing"]),
    ({"cross_refs": [{"from": {"service": "chat", "table": "messages", "where": {"id": 51}},
                      "mentions": "AVL-2026-99999"}]}, "cross_refs[0]",
     ["from:", "AVL-2026-99999"]),
    ({"cross_refs": [{"from": {"service": "chat", "table": "messages", "where": {"id": 29}},
                      "mentions": "NS-PO-2026-031"}]}, "cross_refs[0]",
     ["from:", "unchanged"]),  # message 29 does mention the PO, but it was written on day 2
    ({"cross_refs": [{"from": {"file": "jobs/nordlys/bom.md"}, "mentions": "AVL-2026-10533",
                      "to": {"file": "jobs/nordlys/invoice.md"}}]}, "cross_refs[0]",
     ["to:", "invoice.md"]),
    ({"cross_refs": [{"from": {"service": "chat", "table": "messages", "where": {"id": 51},
                               "column": "text"}, "mentions": "AVL"}]}, "cross_refs[0]",
     ["from:", "no column 'text'"]),
    ({"cross_refs": [{"from": {"file": "x.md", "service": "chat", "table": "messages"},
                      "mentions": "x"}]}, "cross_refs[0]", ["from:", "either 'file'"]),
])
def test_planted_declaration_defects_fail_layer_three(
        demo: Worlds, produces: dict[str, Any], entry: str, words: list[str]) -> None:
    report = validate_day(demo, "lars@5", produces=produces)
    layer = report.layer("declarations")
    assert layer.status == "failed", render_day_report(report)
    assert layer.reason.startswith(f"{entry}: ")
    for word in words:
        assert word in layer.reason
    assert statuses(report)["replay"] == "passed"  # the other layers still ran
    expected_health = "failed" if entry.startswith("accounts") else "passed"
    assert statuses(report)["health"] == expected_health


@pytest.mark.parametrize(("produces", "words"), [
    ({"db_wirtes": []}, ["unknown field", "db_wirtes"]),
    ({"files": [3]}, ["$.files[0]"]),
    ({"db_writes": [{"service": "shop", "where": {}}]}, ["table", "$.db_writes[0]"]),
    ({"db_writes": [{"service": "shop", "table": "orders", "change": "edited"}]},
     ["$.db_writes[0].change"]),
])
def test_a_malformed_produces_json_fails_naming_the_field(
        demo: Worlds, produces: dict[str, Any], words: list[str]) -> None:
    layer = validate_day(demo, "lars@5", produces=produces).layer("declarations")
    assert layer.status == "failed"
    for word in words:
        assert word in layer.reason


def test_a_produces_file_that_is_not_json_names_the_file(demo: Worlds, tmp_path: Path) -> None:
    bad = tmp_path / "produces.json"
    bad.write_text('{"files": ["a.md",]}')
    layer = validate_day(demo, "lars@5", produces=bad).layer("declarations")
    assert layer.status == "failed" and str(bad) in layer.reason


# --- a second persona: identities, clock warnings, credentials, pins -----------------------------


def _line(persona: str, day: int, second: int, **event: Any) -> dict[str, Any]:
    return {"persona": persona, "day": day, "ts": f"2026-05-{day + 1:02d}T09:00:{second:02d}Z",
            **event}


def _sql(persona: str, day: int, second: int, sql: str, params: Any = None) -> dict[str, Any]:
    extra = {"params": params} if params is not None else {}
    return _line(persona, day, second, type="sql", service="social", sql=sql, **extra)


def _accounts(*items: dict[str, str]) -> str:
    return json.dumps({"accounts": list(items)}, indent=1)


NINA = [
    _sql("nina", 0, 0, "CREATE TABLE users(id INTEGER PRIMARY KEY, name TEXT, email TEXT, "
                       "handle TEXT, created_at TEXT)"),
    _sql("nina", 0, 1, "INSERT INTO users(id, name, email, handle, created_at) VALUES "
                       "(1, 'Nina Berg', 'nina@example.no', 'nina', datetime('now'))"),
    _line("nina", 0, 2, type="file_write", path="accounts.json",
          text=_accounts({"site": "shop", "username": "nina.b", "password_hash": "9f2c"})),
    # day 1: Ingrid Solberg is lars's client (chat.users.name), spaced and cased differently
    _sql("nina", 1, 0, "INSERT INTO users(id, name, email) VALUES (?, ?, ?)",
         [2, "ingrid  SOLBERG", "ingrid@elsewhere.no"]),
    # day 2: no column list, so the identity check cannot read it
    _sql("nina", 2, 0, "INSERT INTO users VALUES (3, 'Ola Nordmann', 'ola@x.no', 'ola', '')"),
    # day 3: an account named like lars's own chat handle
    _line("nina", 3, 0, type="file_write", path="accounts.json",
          text=_accounts({"site": "shop", "username": "nina.b"},
                         {"site": "forum", "username": "Lars"})),
]
PIA = [  # a world pinning an app this install does not have
    _line("pia", 0, 0, type="sql", service="notes",
          sql="CREATE TABLE notes(id INTEGER PRIMARY KEY, title TEXT)"),
    _line("pia", 0, 1, type="app", service="notes", app="ghost-notes", version="9.9.9",
          digest="0" * 32),
]


def _jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worlds]:
    worlds = Worlds.open(tmp_path_factory.mktemp("planted") / "store")
    worlds.import_file(DEMO_JSONL)
    worlds.import_stream(io.BytesIO(_jsonl(NINA + PIA)), source="planted.jsonl")
    yield worlds
    worlds.close()


def test_a_clean_day_of_another_persona_passes_with_a_clock_warning(planted: Worlds) -> None:
    report = validate_day(planted, "nina@0", produces={
        "db_writes": [{"service": "social", "table": "users", "where": {"id": 1}}],
        "files": ["accounts.json"],
        "credentials": [{"file": "accounts.json", "contains": "nina.b"}]})
    assert statuses(report) == {"lint": "passed", "replay": "passed", "declarations": "passed",
                                "health": "passed", "review": "not_run"}, \
        render_day_report(report)
    lint = report.layer("lint")
    assert [w["seq"] for w in lint.evidence["warnings"]] == [1]
    assert "'now'" in lint.evidence["warnings"][0]["message"]
    assert "1 warnings" in lint.reason
    assert lint.evidence["other_personas"] == ["lars"]  # pia reserves nothing
    health = report.layer("health").evidence["services"]
    assert health == {"social": {"note": "no app serves it (data only)"}}


def test_a_name_reserved_by_another_persona_fails_lint(planted: Worlds) -> None:
    report = validate_day(planted, "nina@1")
    lint = report.layer("lint")
    assert lint.status == "failed" and not report.ok
    seq = planted.resolve("nina@1").first_seq
    problem = lint.evidence["problems"][0]
    assert (problem["seq"], problem["persona"], problem["value"]) == (seq, "lars",
                                                                       "ingrid  SOLBERG")
    assert problem["reserved_at"] in ("calendar.contacts.name", "chat.users.name")
    assert f"event seq {seq}" in lint.reason and "'lars'" in lint.reason
    assert "ingrid  SOLBERG" in lint.reason
    assert statuses(report)["replay"] == "passed"  # a failed lint stops nothing


def test_an_unreadable_insert_into_an_identity_table_fails_lint(planted: Worlds) -> None:
    lint = validate_day(planted, "nina@2").layer("lint")
    assert lint.status == "failed"
    assert "without a column list" in lint.reason and "'users'" in lint.reason


def test_an_account_file_colliding_with_a_reserved_handle_fails_lint(planted: Worlds) -> None:
    lint = validate_day(planted, "nina@3").layer("lint")
    assert lint.status == "failed"
    assert "accounts.json[1].username" in lint.reason and "'Lars'" in lint.reason
    assert "chat.users.handle" in lint.reason


def test_the_identity_rule_is_symmetric(planted: Worlds) -> None:
    """Once nina holds 'ingrid solberg', lars's day 0, which inserted Ingrid first, reports
    nina: the store holds a shared identity, whoever came first."""
    lint = validate_day(planted, "lars@0").layer("lint")
    assert lint.status == "failed"
    assert any(p["persona"] == "nina" and p["value"] == "Ingrid Solberg"
               for p in lint.evidence["problems"])


def test_missing_credentials_fail_health(planted: Worlds) -> None:
    report = validate_day(planted, "nina@0", produces={
        "credentials": [{"file": "accounts.json", "contains": "nina.b"},
                        {"file": "accounts.json", "contains": "nina.berg"},
                        {"file": "secrets/shop.txt", "contains": "nina"}]})
    health = report.layer("health")
    assert health.status == "failed"
    assert health.reason.startswith("credentials[1]: ") and "nina.berg" in health.reason
    assert "(and 1 more)" in health.reason
    assert any(p.startswith("credentials[2]") and "secrets/shop.txt" in p
               for p in health.evidence["problems"])


def test_a_pinned_app_this_install_lacks_fails_health(planted: Worlds) -> None:
    report = validate_day(planted, "pia@0")
    health = report.layer("health")
    assert health.status == "failed"
    assert "ghost-notes" in health.reason and "9.9.9" in health.reason
    assert "'notes'" in health.reason
    assert statuses(report)["replay"] == "passed" and statuses(report)["lint"] == "passed"


# --- replay failures and timestamps (stores edited behind the engine's back) -------------------


@pytest.fixture
def tampered(tmp_path: Path) -> Iterator[tuple[Worlds, Path]]:
    store = tmp_path / "store"
    worlds = Worlds.open(store)
    worlds.import_file(DEMO_JSONL)
    yield worlds, store / "events.sqlite"
    worlds.close()


def _edit(db: Path, sql: str, *params: Any) -> None:
    with sqlite3.connect(db) as conn:
        assert conn.execute(sql, params).rowcount == 1


def test_a_day_that_no_longer_replays_to_its_hash_fails_replay(
        tampered: tuple[Worlds, Path]) -> None:
    worlds, db = tampered
    record = worlds.resolve("lars@5")
    with sqlite3.connect(db) as conn:
        seq, body = conn.execute(
            "SELECT seq, body FROM events WHERE persona = 'lars' AND day = 5 "
            "AND instr(body, 'Equipment ordered') > 0").fetchone()
    _edit(db, "UPDATE events SET body = ? WHERE persona = 'lars' AND seq = ?",
          bytes(body).replace(b"Equipment ordered", b"Equipment ORDERED"), seq)
    report = validate_day(worlds, "lars@5", produces=FIXTURES / "lars-day5.produces.json",
                          reviewer=ApprovingReviewer(), plan="order the equipment")
    replay = report.layer("replay")
    assert replay.status == "failed"
    assert record.world_hash in replay.reason and "chat.messages" in replay.reason
    # Like verify, it names the first event of the day that writes the differing table.
    assert f"first written by event seq {record.first_seq} (#0 of lars@5)" in replay.reason
    for name in ("declarations", "health", "review"):
        assert report.layer(name).status == "not_run"
        assert "replay failed" in report.layer(name).reason
    assert statuses(report)["lint"] == "passed" and not report.ok


def test_a_timestamp_going_back_fails_lint_only(tampered: tuple[Worlds, Path]) -> None:
    worlds, db = tampered
    record = worlds.resolve("lars@3")
    seq = record.first_seq + 2
    _edit(db, "UPDATE events SET ts = ? WHERE persona = 'lars' AND seq = ?",
          "2026-03-05T07:00:00Z", seq)
    report = validate_day(worlds, "lars@3")
    lint = report.layer("lint")
    assert lint.status == "failed"
    assert f"event seq {seq} (#2 of lars@3)" in lint.reason and "is before" in lint.reason
    # The demo writes literal timestamps, so the frozen clock never showed: same world.
    assert statuses(report)["replay"] == "passed"


# --- the reviewer ------------------------------------------------------------------------------


class ApprovingReviewer:
    def review(self, world_dir: Path, plan: str) -> ReviewOutcome:
        return ReviewOutcome(passed=True, reason="looks right", model="scripted")


class FilesReviewer:
    """Checks that every workspace path named in the plan (a word with a '/' and a '.')
    exists in the world: a reviewer that reads the world, without a model."""

    def __init__(self) -> None:
        self.seen: list[tuple[Path, bool]] = []

    def review(self, world_dir: Path, plan: str) -> ReviewOutcome:
        self.seen.append((world_dir, (world_dir / "services" / "shop.sqlite").is_file()))
        named = [w.strip(".,") for w in plan.split() if "/" in w and "." in w]
        missing = [p for p in named if not (world_dir / "workspace" / p).is_file()]
        if missing:
            return ReviewOutcome(passed=False, reason=f"the plan's {missing[0]} is not in the "
                                 "world", findings=missing)
        return ReviewOutcome(passed=True, reason=f"all {len(named)} planned files exist")


class BrokenReviewer:
    def review(self, world_dir: Path, plan: str) -> ReviewOutcome:
        raise RuntimeError("model endpoint unreachable")


def test_without_a_reviewer_the_review_is_not_run_never_passed(demo: Worlds) -> None:
    layer = validate_day(demo, "lars@7").layer("review")
    assert (layer.status, layer.reason) == ("not_run", "no model configured")


def test_a_reviewer_checks_the_days_world_against_the_plan(demo: Worlds) -> None:
    reviewer = FilesReviewer()
    plan = "Write jobs/fjord/brief.md and jobs/nordlys/install-checklist.md."
    report = validate_day(demo, "lars@7", reviewer=reviewer, plan=plan)
    assert report.layer("review").status == "passed"
    world_dir, had_databases = reviewer.seen[0]
    assert had_databases
    assert not world_dir.exists()  # the reviewer's copy is scratch, removed after
    failed = validate_day(demo, "lars@5", reviewer=reviewer, plan=plan).layer("review")
    assert failed.status == "failed" and "jobs/fjord/brief.md" in failed.reason
    assert failed.evidence["findings"] == ["jobs/fjord/brief.md",
                                           "jobs/nordlys/install-checklist.md"]


def test_a_reviewer_without_a_plan_or_that_breaks_never_passes(demo: Worlds) -> None:
    no_plan = validate_day(demo, "lars@7", reviewer=ApprovingReviewer()).layer("review")
    assert no_plan.status == "not_run" and "no plan" in no_plan.reason
    broken = validate_day(demo, "lars@7", reviewer=BrokenReviewer(), plan="x").layer("review")
    assert broken.status == "failed" and "model endpoint unreachable" in broken.reason


# --- the report -------------------------------------------------------------------------------


def test_the_report_renders_and_encodes(demo: Worlds) -> None:
    report = validate_day(demo, "lars@5", produces=FIXTURES / "lars-day5.produces.json",
                          reviewer=ApprovingReviewer(), plan="place the order")
    text = render_day_report(report)
    lines = text.splitlines()
    assert lines[0] == f"lars@5  world {report.world_hash}"
    for number, name in enumerate(LAYERS, start=1):
        assert lines[number + 1].split()[:3] == [str(number), name, "passed"]
    assert lines[-1] == "ok: 5 passed, 0 failed, 0 not run"
    decoded = json.loads(to_json(report))
    assert decoded["ok"] is True and decoded["not_run"] == 0
    assert [layer["layer"] for layer in decoded["layers"]] == list(LAYERS)
    again = msgspec.json.decode(to_json(report), type=DayReport)
    assert again == report


def test_a_failed_report_says_so() -> None:
    from synth.worlds.validate_day import LayerResult

    report = DayReport("p", 1, "0" * 32, [LayerResult("lint", "failed", "bad"),
                                          LayerResult("replay", "not_run", "skipped")])
    assert not report.ok and report.summary == "FAILED: 0 passed, 1 failed, 1 not run"
    assert render_day_report(report).endswith("FAILED: 0 passed, 1 failed, 1 not run\n")


# --- the static parts, unit by unit -----------------------------------------------------------


@pytest.mark.parametrize(("sql", "params", "expected"), [
    ("INSERT INTO users(id, name) VALUES (1, 'Ann O''Neil')", None,
     [("users.name", "Ann O'Neil")]),
    ("INSERT INTO users(id, name, email) VALUES (?, ?, ?)", [1, "Ann", "ann@x"],
     [("users.name", "Ann"), ("users.email", "ann@x")]),
    ("INSERT INTO users(email, name) VALUES (?2, ?1)", ["Ann", "ann@x"],
     [("users.email", "ann@x"), ("users.name", "Ann")]),
    ("INSERT INTO users(id, name) VALUES (:id, :name)", {"id": 1, "name": "Ann"},
     [("users.name", "Ann")]),
    ("INSERT INTO users(id, name) VALUES (:id, :name)", [1, "Ann"], [("users.name", "Ann")]),
    ("insert or replace into \"Users\"(\"id\", [handle]) values (1, 'ann'), (2, ?)", ["bo"],
     [("Users.handle", "ann"), ("Users.handle", "bo")]),
    ("REPLACE INTO main.contacts AS c (name) VALUES ('Ann') ON CONFLICT DO NOTHING", None,
     [("contacts.name", "Ann")]),
    ("INSERT INTO users(id, name, created_at) VALUES (1, 'Ann', datetime('now'))", None,
     [("users.name", "Ann")]),
    ("INSERT INTO users(id, name) VALUES (1, NULL)", None, []),
    ("INSERT INTO messages(id, body) VALUES (1, 'Ingrid Solberg')", None, []),
    ("UPDATE users SET name = 'Ann'", None, []),
    ("/* note */ INSERT INTO accounts(username) VALUES ('ann') -- first", None,
     [("accounts.username", "ann")]),
])
def test_inserted_identities(sql: str, params: Any, expected: list[tuple[str, str]]) -> None:
    assert inserted_identities(sql, params) == expected


@pytest.mark.parametrize(("sql", "words"), [
    ("INSERT INTO users VALUES (1, 'Ann')", "without a column list"),
    ("INSERT INTO users(id, name) SELECT id, name FROM people", "other than VALUES"),
    ("INSERT INTO users(id, name) VALUES (1, 'A' || 'nn')", "expression"),
    ("INSERT INTO users(id, name) VALUES (1)", "1 values for 2 columns"),
])
def test_unreadable_identity_inserts_say_why(sql: str, words: str) -> None:
    problem = inserted_identities(sql, None)
    assert isinstance(problem, str) and words in problem


@pytest.mark.parametrize(("sql", "count"), [
    ("INSERT INTO t(at) VALUES (datetime('now'))", 1),
    ("CREATE TABLE t(at TEXT DEFAULT CURRENT_TIMESTAMP)", 1),
    ("SELECT random(), randomblob(4), unixepoch()", 3),
    ("INSERT INTO t(body) VALUES ('call me now please')", 0),
    ("INSERT INTO t(body) VALUES ('current_timestamp and random() are words here')", 0),
    ("SELECT unixepoch('2026-01-01')", 0),
    ("-- datetime('now') in a comment\nSELECT 1", 0),
])
def test_clock_and_random_uses(sql: str, count: int) -> None:
    assert len(clock_and_random_uses(sql)) == count


@pytest.mark.parametrize(("path", "ok"), [
    ("jobs/nordlys/bom.md", True), ("/etc/passwd", False), ("a/../b", False),
    ("a//b", False), ("tab\there.txt", False), ("x" * 256, False), ("x" * 255, True),
])
def test_path_problem(path: str, ok: bool) -> None:
    assert (path_problem(path) is None) == ok
