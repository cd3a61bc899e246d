"""The AWM importer (awm/): real AWM files become verified worlds, failing statements are
dropped and reported (or refuse the scenario under strict), and every kind of bad input
is refused naming file, line and scenario, with nothing stored for that scenario.

Stores are real SQLite stores in tmp dirs; expected row counts come from AWM's own
statements run in a plain stdlib sqlite3 database, as AWM runs them.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sqlite3
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from awmbridge.errors import AwmError, AwmFormatError, ScenarioRefused
from awmbridge.formats import read_awm_dir
from awmbridge.importer import ImportReport, import_awm
from awmbridge.world import AWM_DAY0_TS, AWM_SERVICE, persona_for, plan_day0
from replay.engine import Worlds
from worldenv.awm.host import AWM_ADAPTER_VERSION, AWM_APP

SAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "awm-1k-samples"  # AWM-1K's own files
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "awm"
OURS = "library_loans_1"  # the fixture scenario (tests/fixtures/awm)


@pytest.fixture
def worlds(tmp_path: Path) -> Iterator[Worlds]:
    with Worlds.open(tmp_path / "store") as opened:
        yield opened


def lines_of(directory: Path, name: str) -> list[dict[str, Any]]:
    path = directory / name
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def awm_dir(root: Path, *sources: Path, edit: dict[str, Any] | None = None) -> Path:
    """A directory with the AWM files of `sources` concatenated, file by file; `edit`
    maps a file name to a function of its list of objects (or to raw text)."""
    root.mkdir(parents=True, exist_ok=True)
    names = {p.name for src in sources for p in src.glob("gen_*.jsonl")} | set(edit or {})
    for name in sorted(names):
        objs = [obj for src in sources for obj in lines_of(src, name)]
        change = (edit or {}).get(name)
        if isinstance(change, str):
            (root / name).write_text(change)
            continue
        if change is not None:
            objs = change(objs)
        (root / name).write_text("".join(json.dumps(o) + "\n" for o in objs))
    return root


def only(report: ImportReport, scenario: str) -> Any:
    return next(r for r in report.imported if r.scenario == scenario)


def awm_row_counts(directory: Path, scenario: str) -> dict[str, int]:
    """What AWM's own statements produce: its db step, then its sample step with foreign
    keys on (awm/core/db.py and sample.py), in a plain stdlib database."""
    conn = sqlite3.connect(":memory:")
    db = next(o for o in lines_of(directory, "gen_db.jsonl") if o["scenario"] == scenario)
    for table in db["db_schema"]["tables"]:
        try:
            conn.execute(table["ddl"])
            for index in table.get("indexes", []):
                conn.execute(index)
        except sqlite3.Error:
            pass
    conn.execute("PRAGMA foreign_keys = ON")
    sample = next(o for o in lines_of(directory, "gen_sample.jsonl")
                  if o["scenario"] == scenario)
    for table in sample["sample_data"]["tables"]:
        for statement in table["insert_statements"]:
            with contextlib.suppress(sqlite3.Error):
                conn.execute(statement)
    names = [r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
    return {name: conn.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0]
            for name in names}


def checkout_counts(worlds: Worlds, ref: str, dest: Path) -> dict[str, int]:
    worlds.checkout(ref, dest)
    conn = sqlite3.connect(dest / "services" / f"{AWM_SERVICE}.sqlite")
    try:
        names = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' "
            "AND name NOT LIKE 'sqlite_%'")]
        return {name: conn.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0]
                for name in names}
    finally:
        conn.close()


# --- the real samples -----------------------------------------------------------------


def test_both_sample_scenarios_import_verify_and_check_out(worlds: Worlds,
                                                           tmp_path: Path) -> None:
    report = import_awm(worlds, SAMPLES)
    assert report.ok, report.refused
    assert [r.scenario for r in report.imported] == ["e_commerce_33", "content_platform_1"]
    assert {s.scenario for s in report.skipped} == {
        "marketplace_1", "booking_marketplace_1", "booking_and_appointments_1"}
    for r in report.imported:
        assert r.persona == r.scenario and r.status == "imported" and r.dropped == ()
        assert r.world_hash == worlds.resolve(f"{r.persona}@0").world_hash
        assert len(worlds.store.days(r.persona)) == 1
        expected = awm_row_counts(SAMPLES, r.scenario)
        assert r.rows == {name: expected[name] for name in r.tables}
        assert checkout_counts(worlds, r.persona, tmp_path / r.persona) == expected
    verified = worlds.verify()
    assert verified.problems == [] and verified.personas == 2


def test_the_report_counts_tables_rows_statements_and_tools(worlds: Worlds) -> None:
    report = import_awm(worlds, SAMPLES)
    shop, videos = only(report, "e_commerce_33"), only(report, "content_platform_1")
    assert len(shop.tables) == 19 and len(videos.tables) == 14
    assert sum(shop.rows.values()) == 133 and sum(videos.rows.values()) == 154
    tables = {t["name"]: t for t in lines_of(SAMPLES, "gen_db.jsonl")[0]["db_schema"]["tables"]}
    assert shop.tables == tuple(tables)  # AWM's order
    assert shop.statements == 19 + sum(len(t["indexes"]) for t in tables.values()) + 133
    assert shop.tools == 0 and videos.tools == 34
    assert shop.tasks is None and shop.tasks_written is None


def test_server_code_is_pinned_as_the_app_of_the_awm_service(worlds: Worlds,
                                                             tmp_path: Path) -> None:
    import_awm(worlds, SAMPLES)
    worlds.checkout("content_platform_1", tmp_path / "videos")
    pin = json.loads((tmp_path / "videos" / "apps" / f"{AWM_SERVICE}.json").read_text())
    assert (pin["app"], pin["version"], pin["carried"]) == (AWM_APP, AWM_ADAPTER_VERSION, True)
    code = lines_of(SAMPLES, "gen_envs.jsonl")[0]["full_code"]
    carried = (tmp_path / "videos" / "apps" / f"{AWM_SERVICE}.py").read_text()
    assert repr(code) in carried  # the generated code, verbatim
    worlds.checkout("e_commerce_33", tmp_path / "shop")
    assert not (tmp_path / "shop" / "apps").exists()  # no server code, no app


def test_importing_again_is_a_no_op(worlds: Worlds) -> None:
    first = import_awm(worlds, SAMPLES)
    heads = {p.persona: (p.last_seq, p.head) for p in worlds.store.personas()}
    again = import_awm(worlds, SAMPLES, strict=True)
    assert again.ok and [r.status for r in again.imported] == ["unchanged", "unchanged"]
    assert [r.world_hash for r in again.imported] == [r.world_hash for r in first.imported]
    assert {p.persona: (p.last_seq, p.head) for p in worlds.store.personas()} == heads


def test_day0_is_one_frozen_instant_in_awms_order() -> None:
    scenario = read_awm_dir(SAMPLES).scenarios["e_commerce_33"]
    day = plan_day0(scenario)
    events = [json.loads(line) for line in day.lines().splitlines()]
    assert {e["ts"] for e in events} == {AWM_DAY0_TS}
    assert {e["service"] for e in events} == {AWM_SERVICE}
    first = scenario.tables[0]
    assert [e["sql"] for e in events[:1 + len(first.indexes)]] == [first.ddl, *first.indexes]
    inserts = [sql for t in scenario.inserts for sql in t.statements]
    assert [e["sql"] for e in events[-len(inserts):]] == inserts


def test_scenario_filter_imports_only_the_named(worlds: Worlds) -> None:
    report = import_awm(worlds, SAMPLES, scenarios=["content_platform_1"])
    assert [r.scenario for r in report.imported] == ["content_platform_1"]
    assert [p.persona for p in worlds.store.personas()] == ["content_platform_1"]
    assert report.skipped == []


def test_an_unknown_scenario_name_is_refused_naming_it(worlds: Worlds) -> None:
    with pytest.raises(AwmError, match="--scenario nope: no such scenario"):
        import_awm(worlds, SAMPLES, scenarios=["nope"])
    with pytest.raises(AwmError, match=r"gen_scenario\.jsonl:1: scenario marketplace_1: "
                                       r"only a description"):
        import_awm(worlds, SAMPLES, scenarios=["marketplace_1"])
    assert worlds.store.personas() == []


def test_task_folders_are_written_for_the_verified_tasks(worlds: Worlds,
                                                         tmp_path: Path) -> None:
    report = import_awm(worlds, SAMPLES, tasks_out=tmp_path / "tasks")
    assert report.ok, report.refused
    shop = only(report, "e_commerce_33")
    assert shop.tasks_written == 3  # task_idx 0, 1, 2 have verifiers in the sample
    assert all(folder.is_dir() for folder in shop.tasks or ())
    assert only(report, "content_platform_1").tasks_written == 0  # no verifier there


def test_tasks_that_cannot_be_written_are_refused_before_the_world_is_stored(
        worlds: Worlds, tmp_path: Path) -> None:
    in_the_way = tmp_path / "tasks"
    in_the_way.write_text("a file, not a folder")
    report = import_awm(worlds, SAMPLES, scenarios=["e_commerce_33"], tasks_out=in_the_way)
    (refused,) = report.refused
    assert "gen_db.jsonl:1: scenario e_commerce_33: not stored: --tasks-out " \
        f"{in_the_way}: a file, not a folder" in refused.problems[0]
    assert report.imported == []
    assert list(worlds.store.personas()) == []


def test_statements_with_parameters_are_dropped(worlds: Worlds, tmp_path: Path) -> None:
    def bind(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        books = objs[0]["sample_data"]["tables"][1]["insert_statements"]
        books[3] = "INSERT INTO books (id, isbn, title, author) VALUES (?, :isbn, 'T', 'A');"
        return objs

    directory = awm_dir(tmp_path / "p", FIXTURE, edit={"gen_sample.jsonl": bind})
    (dropped,) = only(import_awm(worlds, directory), OURS).dropped
    assert dropped.statement.index == 14 and "binding" in dropped.error.lower()


# --- our own scenario: AWM's quirks ---------------------------------------------------


def test_a_failing_insert_is_dropped_and_reported(worlds: Worlds, tmp_path: Path) -> None:
    report = import_awm(worlds, FIXTURE)
    assert report.ok, report.refused
    ours = only(report, OURS)
    (dropped,) = ours.dropped
    st = dropped.statement
    assert (st.kind, st.table, st.index) == ("insert", "books", 14)
    assert st.origin.file.endswith("gen_sample.jsonl") and st.origin.line == 1
    assert "UNIQUE constraint failed: books.isbn" in dropped.error
    assert str(dropped).startswith(f"{st.origin}: insert statement #14 (into table books)")
    assert ours.rows == {"members": 3, "books": 4, "loans": 4}
    assert ours.rows == awm_row_counts(FIXTURE, OURS)
    assert ours.tools == 5
    assert worlds.verify().problems == []


def test_now_defaults_read_the_frozen_instant(worlds: Worlds, tmp_path: Path) -> None:
    import_awm(worlds, FIXTURE)
    worlds.checkout(OURS, tmp_path / "co")
    conn = sqlite3.connect(tmp_path / "co" / "services" / f"{AWM_SERVICE}.sqlite")
    instant = datetime.fromisoformat(AWM_DAY0_TS.removesuffix("Z"))
    frozen = instant.strftime("%Y-%m-%d %H:%M:%S")
    # DEFAULT (datetime('now')) and DEFAULT CURRENT_TIMESTAMP, and datetime('now', ...)
    assert conn.execute("SELECT added_at FROM books WHERE id = 1").fetchone() == (frozen,)
    assert conn.execute("SELECT joined_at FROM members WHERE id = 3").fetchone() == (frozen,)
    borrowed = (instant - timedelta(days=30)).strftime("%Y-%m-%d %H:%M:%S")
    assert conn.execute("SELECT borrowed_at FROM loans WHERE id = 1").fetchone() == (borrowed,)
    conn.close()


def test_strict_refuses_a_failing_statement_and_stores_nothing(worlds: Worlds,
                                                               tmp_path: Path) -> None:
    both = awm_dir(tmp_path / "both", SAMPLES, FIXTURE)
    report = import_awm(worlds, both, strict=True)
    assert [r.scenario for r in report.refused] == [OURS]
    (refused,) = report.refused
    assert "1 of 20 statements fail and --strict drops none" in refused.problems[0]
    assert "gen_sample.jsonl:3: insert statement #14" in refused.problems[1]
    assert report.imported == [] and set(report.not_stored) == {"e_commerce_33",
                                                                "content_platform_1"}
    assert worlds.store.personas() == []


def test_ten_percent_failing_statements_refuse_the_scenario(worlds: Worlds,
                                                            tmp_path: Path) -> None:
    def break_one_more(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        loans = objs[0]["sample_data"]["tables"][2]["insert_statements"]
        loans[3] = loans[3].replace("(4, 3, 1,", "(4, 99, 1,")  # no member 99: FK fails
        return objs

    directory = awm_dir(tmp_path / "two", FIXTURE, edit={"gen_sample.jsonl": break_one_more})
    report = import_awm(worlds, directory)
    (refused,) = report.refused
    assert "2 of 20 statements fail (10%); AWM keeps a scenario only when fewer than 10% " \
        "fail" in refused.problems[0]
    assert any("FOREIGN KEY constraint failed" in p for p in refused.problems)
    assert worlds.store.personas() == []


def test_a_ddl_that_fails_entirely_refuses_the_scenario(worlds: Worlds,
                                                        tmp_path: Path) -> None:
    def break_ddl(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for table in objs[0]["db_schema"]["tables"]:
            table["ddl"] = table["ddl"].replace("CREATE TABLE", "CREATE TABEL")
        return objs

    directory = awm_dir(tmp_path / "ddl", FIXTURE, edit={"gen_db.jsonl": break_ddl})
    report = import_awm(worlds, directory)
    (refused,) = report.refused
    assert refused.scenario == OURS
    assert "gen_db.jsonl:1: scenario library_loans_1: the DDL fails entirely: none of its " \
        "3 CREATE TABLE statements runs" in refused.problems[0]
    assert worlds.store.personas() == []


def test_a_statement_the_interchange_refuses_is_dropped_like_a_failing_one(
        worlds: Worlds, tmp_path: Path) -> None:
    def two_in_one(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        objs[0]["db_schema"]["tables"][0]["indexes"][0] += " CREATE INDEX x ON members(id);"
        return objs

    def without_the_failing_insert(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        objs[0]["sample_data"]["tables"][1]["insert_statements"].pop(3)
        objs[0]["inserts_count"] -= 1
        return objs

    directory = awm_dir(tmp_path / "two", FIXTURE, edit={
        "gen_db.jsonl": two_in_one, "gen_sample.jsonl": without_the_failing_insert})
    report = import_awm(worlds, directory, scenarios=[OURS])
    (dropped,) = only(report, OURS).dropped
    assert (dropped.statement.kind, dropped.statement.table) == ("index", "members")
    assert "more than one SQL statement" in dropped.error


# --- bad input ------------------------------------------------------------------------


def refused_alone(worlds: Worlds, directory: Path, scenario: str, *expected: str) -> None:
    """`scenario` is refused with a message naming each of `expected` (its file:line and
    the scenario), nothing is stored for it, and e_commerce_33 is imported."""
    report = import_awm(worlds, directory)
    refused = [r for r in report.refused if r.scenario == scenario]
    assert refused, report.refused
    text = " ".join(p for r in refused for p in r.problems)
    for part in (f"scenario {scenario}", *expected):
        assert part in text, text
    personas = {p.persona for p in worlds.store.personas()}
    assert "e_commerce_33" in personas and persona_for(scenario) not in personas


def test_a_line_that_is_not_json_refuses_the_whole_import(worlds: Worlds,
                                                          tmp_path: Path) -> None:
    text = (SAMPLES / "gen_tasks.jsonl").read_text() + "{not json\n"
    directory = awm_dir(tmp_path / "d", SAMPLES, edit={"gen_tasks.jsonl": text})
    with pytest.raises(AwmFormatError, match=r"gen_tasks.jsonl:3: not AWM's JSON Lines: the "
                                             "line is not JSON"):
        import_awm(worlds, directory)
    assert worlds.store.personas() == []


def test_a_line_that_is_not_an_object_refuses_the_whole_import(worlds: Worlds,
                                                               tmp_path: Path) -> None:
    directory = awm_dir(tmp_path / "d", SAMPLES,
                        edit={"gen_envs.jsonl": lambda objs: [*objs, ["scenario", "x"]]})
    with pytest.raises(AwmFormatError, match=r"gen_envs.jsonl:2: .*a JSON list, not an object"):
        import_awm(worlds, directory)
    directory = awm_dir(tmp_path / "e", SAMPLES,
                        edit={"gen_db.jsonl": lambda objs: [{"name": "x"}, *objs]})
    with pytest.raises(AwmFormatError, match=r"gen_db.jsonl:1: not AWM's format: no scenario"):
        import_awm(worlds, directory)
    assert worlds.store.personas() == []


def test_a_wrong_key_refuses_that_scenario_only(worlds: Worlds, tmp_path: Path) -> None:
    def rename(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        objs[1]["taskz"] = objs[1].pop("tasks")
        return objs

    directory = awm_dir(tmp_path / "d", SAMPLES, edit={"gen_tasks.jsonl": rename})
    refused_alone(worlds, directory, "content_platform_1",
                  "gen_tasks.jsonl:2:", "missing key 'tasks'")


def test_an_unknown_key_refuses_that_scenario_only(worlds: Worlds, tmp_path: Path) -> None:
    def add(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        objs[1]["db_schema"]["tables"][3]["triggers"] = []
        return objs

    directory = awm_dir(tmp_path / "d", SAMPLES, edit={"gen_db.jsonl": add})
    refused_alone(worlds, directory, "content_platform_1", "gen_db.jsonl:2:",
                  "db_schema.tables[3]: unknown key 'triggers' (not AWM's format)")


def test_a_wrong_type_refuses_that_scenario_only(worlds: Worlds, tmp_path: Path) -> None:
    def stringify(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        table = objs[1]["sample_data"]["tables"][0]
        table["insert_statements"] = "; ".join(table["insert_statements"])
        return objs

    directory = awm_dir(tmp_path / "d", SAMPLES, edit={"gen_sample.jsonl": stringify})
    refused_alone(worlds, directory, "content_platform_1", "gen_sample.jsonl:2:",
                  "sample_data.tables[0].insert_statements must be a list, not string")


def test_counts_that_disagree_with_the_data_refuse_the_scenario(worlds: Worlds,
                                                                tmp_path: Path) -> None:
    def cut(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        objs[1]["sample_data"]["tables"][0]["insert_statements"].pop()
        return objs

    directory = awm_dir(tmp_path / "d", SAMPLES, edit={"gen_sample.jsonl": cut})
    refused_alone(worlds, directory, "content_platform_1", "gen_sample.jsonl:2:",
                  "inserts_count says 154 but sample_data holds 153")


def test_a_duplicate_scenario_line_refuses_the_scenario(worlds: Worlds,
                                                        tmp_path: Path) -> None:
    directory = awm_dir(tmp_path / "d", SAMPLES,
                        edit={"gen_envs.jsonl": lambda objs: [*objs, objs[0]]})
    refused_alone(worlds, directory, "content_platform_1", "gen_envs.jsonl:2:",
                  "a second line for this scenario in gen_envs.jsonl (the first is line 1)")


def test_a_verifier_for_a_scenario_with_no_tasks_is_refused(worlds: Worlds,
                                                            tmp_path: Path) -> None:
    def verifier_for_videos(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [*objs, {**objs[0], "scenario": "content_platform_1"}]

    directory = awm_dir(tmp_path / "d", SAMPLES, edit={
        "gen_tasks.jsonl": lambda objs: objs[:1],
        "gen_verifier.pure_code.jsonl": verifier_for_videos})
    refused_alone(worlds, directory, "content_platform_1",
                  "gen_verifier.pure_code.jsonl:4:",
                  "a verifier for task_idx 0 of a scenario with no tasks")


def test_a_verifier_for_another_task_text_is_refused(worlds: Worlds, tmp_path: Path) -> None:
    def other_task(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        objs[1]["task"] = "Something else entirely."
        return objs

    directory = awm_dir(tmp_path / "d", SAMPLES, FIXTURE,
                        edit={"gen_verifier.pure_code.jsonl": other_task})
    report = import_awm(worlds, directory)
    (refused,) = report.refused
    assert "gen_verifier.pure_code.jsonl:2: scenario e_commerce_33: the verifier's task " \
        "text differs from task 1" in refused.problems[0]
    assert {r.scenario for r in report.imported} == {"content_platform_1", OURS}


def test_a_verifier_without_its_function_is_refused(worlds: Worlds, tmp_path: Path) -> None:
    def rename(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        code = objs[0]["verification"]["code"]
        objs[0]["verification"]["code"] = code.replace("def verify_task_completion(",
                                                       "def verify(")
        return objs

    directory = awm_dir(tmp_path / "d", SAMPLES, FIXTURE,
                        edit={"gen_verifier.pure_code.jsonl": rename})
    report = import_awm(worlds, directory)
    (refused,) = report.refused
    assert refused.scenario == "e_commerce_33"
    assert "gen_verifier.pure_code.jsonl:1: scenario e_commerce_33: the verifier code of " \
        "task 0 defines no function verify_task_completion()" in refused.problems[0]
    assert {r.scenario for r in report.imported} == {"content_platform_1", OURS}


def test_an_env_with_no_database_is_refused(worlds: Worlds, tmp_path: Path) -> None:
    directory = awm_dir(tmp_path / "d", SAMPLES, FIXTURE, edit={
        "gen_db.jsonl": lambda objs: [o for o in objs if o["scenario"] != OURS],
        "gen_sample.jsonl": lambda objs: [o for o in objs if o["scenario"] != OURS]})
    refused_alone(worlds, directory, OURS, "gen_envs.jsonl:2:",
                  "server code for a scenario with no database: gen_db.jsonl has no line")


def test_code_that_does_not_parse_is_refused(worlds: Worlds, tmp_path: Path) -> None:
    def garble(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        objs[1]["full_code"] = objs[1]["full_code"].replace("async def list_my_loans(",
                                                            "async def list_my_loans((")
        return objs

    directory = awm_dir(tmp_path / "d", SAMPLES, FIXTURE, edit={"gen_envs.jsonl": garble})
    refused_alone(worlds, directory, OURS, "gen_envs.jsonl:2:",
                  "the server code (full_code) does not parse")


def test_a_name_that_cannot_map_to_a_persona_is_refused(worlds: Worlds,
                                                        tmp_path: Path) -> None:
    assert persona_for("Library Loans - 1") == "library_loans_1"
    with pytest.raises(AwmError, match="no letter or digit"):
        persona_for("¿¡!")
    with pytest.raises(AwmError, match="at most 64"):
        persona_for("x" * 65)

    def rename(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**o, "scenario": "¿¡!"} if o["scenario"] == OURS else o for o in objs]

    directory = awm_dir(tmp_path / "d", SAMPLES, FIXTURE, edit={
        name: rename for name in ("gen_db.jsonl", "gen_sample.jsonl", "gen_envs.jsonl",
                                  "gen_tasks.jsonl", "gen_verifier.pure_code.jsonl")})
    report = import_awm(worlds, directory)
    (refused,) = report.refused
    assert "gen_db.jsonl:3: scenario ¿¡!: scenario name '¿¡!' has no letter or digit" \
        in refused.problems[0]
    assert {r.scenario for r in report.imported} == {"e_commerce_33", "content_platform_1"}


def test_two_scenarios_mapping_to_one_persona_are_refused(worlds: Worlds,
                                                          tmp_path: Path) -> None:
    def twin(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [*objs, *[{**o, "scenario": "Library Loans 1"} for o in objs
                         if o["scenario"] == OURS]]

    directory = awm_dir(tmp_path / "d", FIXTURE, edit={
        "gen_db.jsonl": twin, "gen_sample.jsonl": twin})
    report = import_awm(worlds, directory)
    assert [r.scenario for r in report.imported] == [OURS]
    (refused,) = report.refused
    assert "gen_db.jsonl:2: scenario Library Loans 1: maps to persona 'library_loans_1', " \
        f"as scenario {OURS}" in refused.problems[0]


def test_a_persona_holding_another_world_is_refused_and_kept(worlds: Worlds,
                                                             tmp_path: Path) -> None:
    import_awm(worlds, FIXTURE)
    before = worlds.resolve(OURS)

    def change(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        members = objs[0]["sample_data"]["tables"][0]["insert_statements"]
        members[2] = members[2].replace("Nina New", "Nina Newer")
        return objs

    directory = awm_dir(tmp_path / "d", FIXTURE, edit={"gen_sample.jsonl": change})
    report = import_awm(worlds, directory)
    (refused,) = report.refused
    assert f"persona '{OURS}' is already in the store" in refused.problems[0]
    assert worlds.resolve(OURS) == before


def test_scenario_refused_carries_every_problem() -> None:
    refused = ScenarioRefused("s", ["a:1: scenario s: one", "a:2: scenario s: two"])
    assert refused.problems == ("a:1: scenario s: one", "a:2: scenario s: two")
    assert str(refused) == "a:1: scenario s: one; a:2: scenario s: two"


def test_the_fixture_is_in_awms_formats(tmp_path: Path) -> None:
    files = read_awm_dir(FIXTURE)
    ours = files.scenarios[OURS]
    assert ours.problems == () and ours.code is not None and list(ours.code_verifiers) == [0]
    assert ours.description is not None and len(ours.tasks) == 2
    # the same keys as AWM's own lines, file by file
    for name in ("gen_db.jsonl", "gen_sample.jsonl", "gen_envs.jsonl", "gen_tasks.jsonl",
                 "gen_verifier.pure_code.jsonl"):
        assert set(lines_of(FIXTURE, name)[0]) == set(lines_of(SAMPLES, name)[0]), name
    shutil.copytree(FIXTURE, tmp_path / "copy")
    assert set(read_awm_dir(tmp_path / "copy").scenarios) == {OURS}
