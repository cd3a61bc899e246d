"""Persona bibles (synth.worlds.personas) through the real CLI (``worldctl synth persona``) and
litellm's real path against the loopback server: a bible refused by its checks and
corrected, a second persona rejected by the diversity judge for sharing the first one's
occupation and life domain and revised, the accounts file's deterministic hashes, the
offline replay of the run, and no model."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from synth.runs import replay_run
from synth.worlds.personas import (
    BibleOut,
    accounts_salt,
    bible_problems,
    library_tools,
    password_hash,
    signature,
)
from tests.support.cli_harness import invoke, refused
from tests.support.llm_server import LoopbackLLM, serving
from worldenv.apps import SHIPPED

MODEL = "openai/loopback"
RETRY = "Earlier attempts at this failed"
PERSONA = "synth prompt persona@v1"
DIVERSITY = "synth prompt diversity@v1"
SUMMARIZE = "synth prompt summarize@v1"
LIBRARY = library_tools(SHIPPED)


def bible(name: str, occupation: str, domain: str, *, contacts: int = 3,
          image: bool = True, **changes: Any) -> dict[str, Any]:
    found: dict[str, Any] = {
        "name": name, "occupation": occupation, "life_domain": domain,
        "contacts": [{"name": n, "relation": r} for n, r in
                     [("Ingrid Holm", "client"), ("Per Lunde", "supplier"),
                      ("Sofie Dahl", "sister"), ("Ola Berg", "neighbour")][:contacts]],
        "services": ["chat", "notes"],
        "arcs": [
            {"title": f"{occupation}: the delayed order", "days": [1, 3],
             "summary": "An order is late and a client must be told.",
             "tools": ["chat_send_message"],
             "image": "photos/order.jpg" if image else None},
            {"title": f"{occupation}: the planning notes", "days": [2, 4, 5],
             "summary": "Notes for the next job are kept up to date.",
             "tools": ["notes_create_note"], "image": None}],
        "accounts": [{"service": "chat", "username": f"{name}.work",
                      "password": f"{name}-secret"}]}
    return {**found, **changes}


ASTRID_FEW = bible("astrid", "carpenter", "home renovation", contacts=2)
ASTRID = bible("astrid", "carpenter", "home renovation")
BJORN_LIKE_ASTRID = bible("bjorn", "carpenter", "home renovation",
                          arcs=[{**a, "title": a["title"].replace("carpenter", "joiner")}
                                for a in ASTRID["arcs"]])
BJORN = bible("bjorn", "nurse", "shift work at a hospital")


def _json(value: Any) -> str:
    return json.dumps(value)


def rules() -> list[dict[str, Any]]:
    return [
        {"when": {"any_contains": SUMMARIZE},
         "reply": {"content": "Root cause: too few contacts. Fix: name at least three."}},
        {"when": {"any_contains": PERSONA, "last_contains": "diversity judge rejected"},
         "reply": {"content": _json(BJORN)}},
        {"when": {"any_contains": PERSONA, "last_contains": "Persona: bjorn"},
         "reply": {"content": _json(BJORN_LIKE_ASTRID)}},
        {"when": {"any_contains": PERSONA, "last_contains": RETRY},
         "reply": {"content": _json(ASTRID)}},
        {"when": {"any_contains": PERSONA}, "reply": {"content": _json(ASTRID_FEW)}},
        {"when": {"any_contains": DIVERSITY, "last_contains": "Candidate: bjorn: carpenter"},
         "reply": {"content": _json({
             "verdict": "reject", "shares": "occupation_and_domain",
             "with_persona": "astrid", "feedback": "Give bjorn another trade and domain."})}},
        {"when": {"any_contains": DIVERSITY},
         "reply": {"content": _json({"verdict": "accept"})}},
    ]


def count(server: LoopbackLLM, tag: str) -> int:
    return sum(tag in str(r["messages"][0]["content"]) for r in server.requests)


pytestmark = pytest.mark.usefixtures("loopback_env")


@dataclass
class Recorded:
    run: Path
    outputs: list[dict[str, Any]]
    requests: dict[str, int]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    """One run: astrid, then bjorn."""
    run = tmp_path_factory.mktemp("personas") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WORLDCTL_LLM_API_KEY", "x")
        with serving(rules()) as server:
            outputs = []
            for name in ("astrid", "bjorn"):
                result = invoke("synth", "persona", "--run", str(run), "--name", name,
                                "--model", MODEL, "--api-base", server.url, "--json")
                assert result.exit_code == 0, result.output
                outputs.append(json.loads(result.stdout))
            requests = {tag: count(server, tag) for tag in (PERSONA, DIVERSITY, SUMMARIZE)}
    yield Recorded(run, outputs, requests)


def test_a_bible_refused_by_its_checks_is_corrected(recorded: Recorded) -> None:
    astrid = recorded.outputs[0]
    assert (astrid["status"], astrid["name"], astrid["revisions"]) == ("accepted", "astrid", 0)
    assert astrid["stages"] == [{"stage": "persona", "status": "accepted", "attempts": 2,
                                 "tokens": astrid["stages"][0]["tokens"]}]
    kept = msgspec.json.decode((recorded.run / "personas" / "astrid" / "bible.json")
                               .read_bytes(), type=BibleOut)
    assert kept == msgspec.convert(ASTRID, BibleOut)  # the corrected one, not the first


def test_a_persona_like_an_accepted_one_is_rejected_and_revised(recorded: Recorded) -> None:
    bjorn = recorded.outputs[1]
    assert (bjorn["status"], bjorn["revisions"]) == ("accepted", 1)
    assert [s["stage"] for s in bjorn["stages"]] == ["persona", "diversity", "persona",
                                                     "diversity"]
    assert "nurse" in bjorn["signature"]
    # astrid met no judge (nobody was accepted yet); bjorn met it twice
    assert recorded.requests[DIVERSITY] == 2
    lines = (recorded.run / "personas.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["name"] for line in lines] == ["astrid", "bjorn"]
    assert json.loads(lines[1])["signature"] == signature(msgspec.convert(BJORN, BibleOut))


def test_the_accounts_file_holds_deterministic_hashes(recorded: Recorded) -> None:
    accounts = json.loads((recorded.run / "personas" / "astrid" / "accounts.json")
                          .read_text(encoding="utf-8"))
    assert accounts["salt"] == accounts_salt("astrid") != accounts_salt("bjorn")
    (account,) = accounts["accounts"]
    assert account["password_hash"] == password_hash("astrid-secret", accounts["salt"])
    assert account["password_hash"].startswith("pbkdf2_sha256$100000$" + accounts["salt"])
    assert password_hash("astrid-secret", accounts_salt("bjorn")) != account["password_hash"]


def test_the_run_replays_offline_to_the_same_personas(recorded: Recorded,
                                                     tmp_path: Path) -> None:
    report = replay_run(recorded.run, tmp_path / "again")
    assert report.identical, report.differences
    assert (tmp_path / "again" / "personas" / "bjorn" / "bible.json").read_bytes() == (
        recorded.run / "personas" / "bjorn" / "bible.json").read_bytes()


def test_a_persona_run_again_resumes_from_its_outcomes(recorded: Recorded,
                                                      tmp_path: Path) -> None:
    """Killed after its stages but before its files were written: the same command again
    asks the model nothing and writes the same files."""
    run = tmp_path / "run"
    run.mkdir()
    for part in ("run.json", "outputs", "recordings"):
        source = recorded.run / part
        copy = shutil.copytree if source.is_dir() else shutil.copyfile
        copy(source, run / part)
    config = json.loads((run / "run.json").read_text(encoding="utf-8"))
    config["commands"] = config["commands"][:1]  # as if killed inside the first command
    (run / "run.json").write_text(json.dumps(config), encoding="utf-8")
    shutil.rmtree(run / "recordings")  # the outcomes alone must do
    with serving([]) as server:
        result = invoke("synth", "persona", "--run", str(run), "--name", "astrid",
                        "--model", MODEL, "--api-base", server.url)
        assert server.requests == []
    assert result.exit_code == 0, result.output
    assert "persona astrid: accepted" in result.output
    assert (run / "personas" / "astrid" / "accounts.json").read_bytes() == (
        recorded.run / "personas" / "astrid" / "accounts.json").read_bytes()


def test_status_counts_the_persona_stages(recorded: Recorded) -> None:
    report = json.loads(invoke("synth", "status", str(recorded.run), "--json").stdout)
    rows = {row["stage"]: row for row in report["stages"]}
    assert (rows["persona"]["accepted"], rows["persona"]["attempts"]) == (3, 4)
    assert (rows["diversity"]["accepted"], rows["diversity"]["attempts"]) == (2, 2)


def test_a_taken_name_is_sent_back_without_a_judge(tmp_path: Path) -> None:
    """A candidate named like an accepted persona needs no model to be refused; the
    revision's feedback says so, and a malformed verdict (a rejection naming nobody) is
    corrected like any stage output."""
    taken = bible("astrid", "beekeeper", "an island farm")
    other = bible("tove", "beekeeper", "an island farm")
    judge_rules = [
        {"when": {"any_contains": SUMMARIZE}, "reply": {"content": "Name the persona."}},
        {"when": {"any_contains": PERSONA, "last_contains": "is taken"},
         "reply": {"content": _json(other)}},
        {"when": {"any_contains": PERSONA}, "reply": {"content": _json(taken)}},
        {"when": {"any_contains": DIVERSITY, "last_contains": RETRY},
         "reply": {"content": _json({"verdict": "accept"})}},
        {"when": {"any_contains": DIVERSITY},
         "reply": {"content": _json({"verdict": "reject", "shares": "arc"})}},
    ]
    run = tmp_path / "run"
    run.mkdir()
    (run / "personas.jsonl").write_text(json.dumps(
        {"name": "astrid", "signature": signature(msgspec.convert(ASTRID, BibleOut))}) + "\n",
        encoding="utf-8")
    with serving(judge_rules) as server:
        result = invoke("synth", "persona", "--run", str(run), "--model", MODEL,
                        "--api-base", server.url, "--json")
        judged = count(server, DIVERSITY)
    report = json.loads(result.stdout)
    assert (report["status"], report["name"], report["revisions"]) == ("accepted", "tove", 1)
    assert [(s["stage"], s["attempts"]) for s in report["stages"]] == [
        ("persona", 1), ("persona", 1), ("diversity", 2)]
    assert judged == 2


def test_without_a_model_nothing_is_run(tmp_path: Path) -> None:
    result = invoke("synth", "persona", "--run", str(tmp_path / "run"), "--name", "x")
    assert "WORLDCTL_LLM_MODEL" in refused(result)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("change", "problem"), [
    ({"name": "Astrid Holm"}, "is not a persona name"),
    ({"contacts": [{"name": "A", "relation": "x"}, {"name": "a ", "relation": "y"},
                   {"name": " ", "relation": "z"}]},
     "1 distinct named contacts; a bible names at least 3"),
    ({"services": ["chat", "notes", "bank"]}, "services bank are not in the app library"),
    ({"arcs": [ASTRID["arcs"][0]]}, "1 story arcs; a bible has 2 to 5"),
    ({"arcs": [{**ASTRID["arcs"][0], "days": [3, 1]}, ASTRID["arcs"][1]]},
     "must be two or more distinct days"),
    ({"arcs": [{**ASTRID["arcs"][0], "tools": ["shop_place_order"]}, ASTRID["arcs"][1]]},
     "tools shop_place_order are not tools of the bible's services"),
    ({"arcs": [{**ASTRID["arcs"][0], "image": None}, ASTRID["arcs"][1]]},
     "no arc is decided by an image"),
    ({"arcs": [{**ASTRID["arcs"][0], "image": "../etc/shadow.png"}, ASTRID["arcs"][1]]},
     "image '../etc/shadow.png'"),
    ({"accounts": [{"service": "shop", "username": "a", "password": "b"}]},
     "its service is not one the bible uses"),
    ({"accounts": []}, "no web account"),
])
def test_each_check_of_a_bible_names_what_is_wrong(change: dict[str, Any],
                                                  problem: str) -> None:
    assert bible_problems(msgspec.convert(ASTRID, BibleOut), LIBRARY) == []
    problems = bible_problems(msgspec.convert({**ASTRID, **change}, BibleOut), LIBRARY)
    assert any(problem in p for p in problems), problems


def test_the_library_is_the_shipped_apps_tools() -> None:
    assert set(LIBRARY) == {"calendar", "chat", "notes", "shop"}
    assert "chat_send_message" in LIBRARY["chat"] and "notes_create_note" in LIBRARY["notes"]
