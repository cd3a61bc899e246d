"""Golden logs replay to their recorded hashes, forever.

tests/fixtures/golden/<version>/ holds interchange logs written under event-schema
<version> and hashes.json: per persona-day the number of events, the head event id (pins
event ids and the hash chain) and the world hash (pins apply and hashing). A change that
moves any of them breaks every existing store, so these values are never regenerated;
tests/fixtures/make_golden.py only adds entries for new logs. A new event-schema version
adds a new directory (v2/) and keeps v1/ replaying.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from replay.engine import Worlds
from worldstore.events import EVENT_TYPES, SCHEMA_VERSION

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "golden"
VERSIONS = sorted(p.name for p in GOLDEN.iterdir() if p.is_dir())


def recorded(version: str) -> dict[str, Any]:
    return json.loads((GOLDEN / version / "hashes.json").read_text())  # type: ignore[no-any-return]


GOLDEN_LOGS = [(version, name) for version in VERSIONS
               for name in sorted(recorded(version)["logs"])]


@pytest.fixture
def worlds(store_location: str, cache_dir: Path) -> Iterator[Worlds]:
    with Worlds.open(store_location, cache_dir) as w:
        yield w


def test_every_golden_log_has_recorded_hashes() -> None:
    assert "v1" in VERSIONS
    for version in VERSIONS:
        logs = {p.name for p in (GOLDEN / version).glob("*.jsonl")}
        entry = recorded(version)
        assert entry["event_schema_version"] == int(version.lstrip("v"))
        assert set(entry["logs"]) == logs, version
    assert {"lars.jsonl", "features.jsonl"} <= set(recorded("v1")["logs"])


def test_the_newest_golden_version_is_the_current_schema() -> None:
    # Bumping SCHEMA_VERSION needs a golden directory for it (and upcasters for the old).
    assert VERSIONS[-1] == f"v{SCHEMA_VERSION}"


@pytest.mark.parametrize(("version", "name"), GOLDEN_LOGS,
                         ids=[f"{v}/{n}" for v, n in GOLDEN_LOGS])
def test_golden_log_replays_to_its_recorded_hashes(worlds: Worlds, version: str,
                                                   name: str) -> None:
    log = GOLDEN / version / name
    want = recorded(version)["logs"][name]
    assert hashlib.sha256(log.read_bytes()).hexdigest() == want["sha256"], (
        f"{log} was edited; golden logs never change (add a new log instead)")

    results = worlds.import_file(log)
    assert {r.status for r in results} == {"imported"}
    got = [{"persona": d.persona, "day": d.day, "events": d.n_events, "head": d.head,
            "world_hash": d.world_hash}
           for p in worlds.store.personas() for d in worlds.store.days(p.persona)]
    assert got == want["days"]
    assert sorted((r.persona, r.day, r.world_hash) for r in results) == sorted(
        (d["persona"], d["day"], d["world_hash"]) for d in want["days"])

    report = worlds.verify()
    assert report.ok, [p.as_dict() for p in report.problems]
    assert report.days == len(want["days"])
    assert report.events == sum(d["events"] for d in want["days"])


def test_golden_worlds_from_the_cache_match_a_replay(worlds: Worlds, tmp_path: Path) -> None:
    # Snapshots built day after day by import and a replay from nothing agree.
    log = GOLDEN / "v1" / "features.jsonl"
    worlds.import_file(log)
    for persona in ("ida", "jon"):
        results = worlds.replay(persona)
        assert {r.status for r in results} == {"replayed"}
        assert [r.world_hash for r in results] == [r.recorded_hash for r in results]


def test_features_log_covers_every_event_type_and_feature() -> None:
    # If a new event type is added, it needs a golden line too (in a new version dir, or a
    # new log in this one when the type is purely additive, like `app` in apps.jsonl).
    lines = [json.loads(line) for line in (GOLDEN / "v1" / "features.jsonl").read_text()
             .splitlines()]
    every_log = [json.loads(line) for log in sorted((GOLDEN / "v1").glob("*.jsonl"))
                 for line in log.read_text().splitlines()]
    assert {line["type"] for line in every_log} == set(EVENT_TYPES)
    assert {line["type"] for line in lines} == set(EVENT_TYPES) - {"app"}
    text = "\n".join(line.get("sql", "") for line in lines)
    for feature in ("WITHOUT ROWID", "AUTOINCREMENT", "PRAGMA user_version", "random()",
                    "randomblob(", "CURRENT_TIMESTAMP", "datetime('now')", "unixepoch()",
                    "CREATE TABLE log(at TEXT, what TEXT)", "CREATE TRIGGER", "1e-300"):
        assert feature in text, feature
    params = json.dumps([line.get("params") for line in lines])
    assert '"$base64"' in params and "true" in params and "\\u0000" in params
    assert any("\x00" in line.get("text", "") for line in lines)
    assert any("base64" in line for line in lines)
