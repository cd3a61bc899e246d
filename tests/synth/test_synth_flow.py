"""The whole flow through the CLI: ``synth scenarios`` from a seeds file (expansion,
classifier, embeddings, category cap), then ``synth envs`` on the run's scenarios.jsonl
with two scenarios synthesized at once, then one offline replay of both commands; and
the progress bars a terminal shows."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from replay.engine import Worlds
from synth.runs import read_config, replay_run
from synth.stage import Progress
from tests.support import synth_script
from tests.support.cli_harness import invoke
from tests.support.llm_server import serving

MODEL = "openai/loopback"
SEEDS = [
    {"name": "Bike Rental", "description": "Riders rent city bikes from docks, pay per "
     "minute, report broken bikes and keep a history of their rides and invoices."},
    {"name": "Plant Nursery Shop", "description": "Gardeners order seedlings, trays and "
     "soil, schedule pickups at the greenhouse and track orders and loyalty points."},
]
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
         "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo",
         "sierra", "tango", "uniform", "victor", "whiskey", "xray"]


def _candidate(i: int, name: str, category: str) -> dict[str, Any]:
    # Twenty-four words of its own per candidate: no two are near-duplicates.
    own = " ".join(f"{w}{i}" for w in WORDS)
    return {"name": name, "description": f"Members manage records of kind {i}: {own}.",
            "category": category}


CANDIDATES = [
    {**synth_script.SCENARIO, "category": "library"},
    _candidate(1, "museum_tickets", "tickets"),  # rejected: read-only, says the classifier
    {"name": "bike_rental_two", "description": SEEDS[0]["description"] + " " + SEEDS[0][
        "description"], "category": "rental"},  # a near-duplicate of a seed
    _candidate(3, "library_loans_two", "library"),
    _candidate(4, "library_loans_three", "library"),  # over the cap of 2 "library"
    *[_candidate(i, f"spare_scenario_{i}", "other") for i in range(5, 10)],
]


def _classify(name: str, accept: bool, category: str) -> dict[str, Any]:
    return {"when": {"any_contains": "synth prompt classify@v1",
                     "last_contains": f"Scenario: {name}\n"},
            "reply": {"content": json.dumps({
                "accept": accept, "content_centric": False, "read_only": not accept,
                "category": category, "reason": "scripted"})}}


RULES = [
    {"when": {"any_contains": "synth prompt scenarios@v1"},
     "reply": {"content": json.dumps({"scenarios": CANDIDATES})}},
    _classify("museum_tickets", False, "tickets"),
    _classify("library_loans", True, "Library"),
    _classify("bike_rental_two", True, "rental"),
    _classify("library_loans_two", True, "library "),
    _classify("library_loans_three", True, "library"),
    {"when": {"any_contains": "synth prompt classify@v1"},
     "reply": {"content": json.dumps({"accept": True, "content_centric": False,
                                      "read_only": False, "category": "other",
                                      "reason": "scripted"})}},
    *synth_script.rules(),
]



pytestmark = pytest.mark.usefixtures("loopback_env")


def test_scenarios_then_envs_in_parallel_then_one_replay(tmp_path: Path) -> None:
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("".join(json.dumps(s) + "\n" for s in SEEDS), encoding="utf-8")
    run, store = tmp_path / "run", tmp_path / "store"
    with serving(RULES) as server:
        common = ["--run", str(run), "--model", MODEL, "--api-base", server.url]
        made = invoke("synth", "scenarios", "--seeds", str(seeds), "-n", "2",
                      "--category-cap", "2", "--embedding-model", "openai/embedder", *common)
        assert made.exit_code == 0, made.output
        # the duplicate filter's embeddings come from the embedding model, not the chat one
        assert {r["model"] for r in server.embedding_requests} == {"embedder"}
        kept = [json.loads(line) for line in
                (run / "scenarios.jsonl").read_text(encoding="utf-8").splitlines()]
        assert [(s["name"], s["category"]) for s in kept] == [
            ("library_loans", "library"), ("library_loans_two", "library")]
        report = json.loads((run / "scenarios.report.json").read_text(encoding="utf-8"))
        filters = {r["name"]: r["filter"] for r in report["rejected"]}
        assert filters == {"museum_tickets": "classifier", "bike_rental_two": "duplicate"}
        assert "rejected: classifier 1, duplicate 1" in made.stdout

        built = invoke("--store", str(store), "synth", "envs", "--tasks-per-scenario", "2",
                       "--concurrency", "2", *common)
        assert built.exit_code == 0, built.output
    assert "library_loans: world library_loans@0" in built.stdout
    assert "library_loans_two: world library_loans_two@0" in built.stdout
    assert "2 of 2 environments built" in built.stdout
    with Worlds.open(store) as worlds:
        hashes = {p: worlds.resolve(f"{p}@0").world_hash
                  for p in ("library_loans", "library_loans_two")}
    assert len(set(hashes.values())) == 2  # the app names differ: two worlds
    assert [c.kind for c in read_config(run).commands] == ["scenarios", "envs"]
    tasks = sorted(p.name for p in (run / "pack" / "run" / "tasks").iterdir())
    assert tasks == ["library-loans-01", "library-loans-02", "library-loans-two-01",
                     "library-loans-two-02"]

    replayed = replay_run(run)  # both commands, offline, one scenario at a time
    assert replayed.identical, replayed.differences
    assert replayed.world_hashes == hashes
    assert replayed.stopped == []


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_progress_bar_per_stage_and_a_file_nothing() -> None:
    screen = _Terminal()
    progress = Progress(screen)
    progress.expect("schema", 2)
    progress.done("schema", accepted=True)
    progress.expect("code")
    assert progress.lines() == [
        f"schema      [{'#' * 12}{'.' * 12}] 1/2  accepted 1",
        f"code        [{'.' * 24}] 0/1  accepted 0"]
    assert "1/2  accepted 1" in screen.getvalue() and "\x1b[" in screen.getvalue()
    quiet = io.StringIO()
    Progress(quiet).done("schema", accepted=False)
    assert quiet.getvalue() == ""
