"""Tampering: edit the store (and the snapshot cache) behind the engine's back, then verify.

Every edit goes straight to the database with SQL (sqlite3 for the embedded store,
SQLAlchemy + psycopg for PostgreSQL) or straight to the cached files; never through our
API. After each one, ``Worlds.verify()`` must report it and name where it is, and
``worldctl verify --all`` must exit 1 and print it (``--json`` with the same fields).
"""

from __future__ import annotations

import base64
import io
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
import sqlalchemy as sa

from replay.engine import Problem, Worlds
from replay.errors import IntegrityError
from replay.hashing import hash_world
from worldstore.events import FileWritePayload, SqlPayload

WORLDCTL = Path(sys.executable).parent / "worldctl"
PERSONA = "tess"


# --- a small world: three days, two services, text and binary files ------------------------


def _log() -> bytes:
    lines: list[dict[str, Any]] = []

    def add(day: int, second: int, **event: Any) -> None:
        ts = f"2026-04-{day + 1:02d}T09:00:{second:02d}Z"
        lines.append({"persona": PERSONA, "day": day, "ts": ts, **event})

    def sql(day: int, second: int, service: str, text: str, *params: Any) -> None:
        add(day, second, type="sql", service=service, sql=text,
            **({"params": list(params)} if params else {}))

    sql(0, 0, "shop", "CREATE TABLE items(id INTEGER PRIMARY KEY, name TEXT, price INTEGER)")
    for i, (name, price) in enumerate([("cable", 199), ("plug", 49), ("amp", 9900),
                                       ("mic", 4500)], start=1):
        sql(0, i, "shop", "INSERT INTO items VALUES (?, ?, ?)", i, name, price)
    sql(0, 10, "notes", "CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT, at TEXT)")
    sql(0, 11, "notes", "INSERT INTO notes(body, at) VALUES (?, CURRENT_TIMESTAMP)", "start")
    add(0, 12, type="file_write", path="docs/plan.txt", text="line one\nline two\n")
    add(0, 13, type="file_write", path="img/logo.bin",
        base64=base64.b64encode(bytes(range(64))).decode())
    sql(1, 0, "shop", "UPDATE items SET price = price + 1 WHERE id = ?", 2)
    sql(1, 1, "shop", "INSERT INTO items VALUES (?, ?, ?)", 5, "stand", 2500)
    sql(1, 2, "notes", "INSERT INTO notes(body, at) VALUES (?, CURRENT_TIMESTAMP)", "day two")
    add(1, 3, type="file_write", path="docs/quote.md", text="# Quote\ntotal: 15 000\n")
    sql(1, 4, "shop", "DELETE FROM items WHERE id = ?", 3)
    add(1, 5, type="file_write", path="docs/plan.txt", text="line one\nline 2\n")
    sql(2, 0, "shop", "INSERT INTO items VALUES (?, ?, ?)", 6, "rack", 12000)
    add(2, 1, type="file_delete", path="img/logo.bin")
    sql(2, 2, "notes", "UPDATE notes SET body = body || ? WHERE id = 1", " (edited)")
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


LOG = _log()
# What gets tampered with: day 1, its events #0..#5 (seq 9..14).
DAY = 1


@dataclass
class Setup:
    location: str
    cache: Path

    def worlds(self) -> Worlds:
        return Worlds.open(self.location, self.cache)

    def execute(self, sql: str, **params: Any) -> int:
        """Run one statement on the store's database behind the engine's back."""
        if self.location.startswith("postgresql"):
            url = self.location.replace("postgresql://", "postgresql+psycopg://", 1)
            engine = sa.create_engine(url)
            try:
                with engine.begin() as conn:
                    return conn.execute(sa.text(sql), params).rowcount
            finally:
                engine.dispose()
        conn = sqlite3.connect(Path(self.location) / "events.sqlite")
        try:
            with conn:
                return conn.execute(sql, params).rowcount
        finally:
            conn.close()

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "COLUMNS": "250"}
        return subprocess.run(
            [str(WORLDCTL), "--store", self.location, "--cache", str(self.cache), *args],
            capture_output=True, text=True, env=env, timeout=120,
        )


@pytest.fixture
def setup(store_location: str, cache_dir: Path) -> Iterator[Setup]:
    s = Setup(store_location, cache_dir)
    with s.worlds() as worlds:
        worlds.import_stream(io.BytesIO(LOG), source="tess.jsonl")
        assert worlds.verify().ok
    yield s


def day_events(setup: Setup, day: int) -> list[Any]:
    with setup.worlds() as worlds:
        return [e for e in worlds.store.events(PERSONA) if e.day == day]


def verify_problems(setup: Setup) -> list[Problem]:
    with setup.worlds() as worlds:
        report = worlds.verify()
    assert not report.ok
    assert report.problems
    return report.problems


def cli_problems(setup: Setup) -> list[dict[str, Any]]:
    done = setup.cli("verify", "--all", "--json")
    assert done.returncode == 1, done.stderr
    report = msgspec.json.decode(done.stdout)
    assert report["ok"] is False
    return list(report["problems"])


def assert_cli_prints(setup: Setup, *needles: str) -> None:
    done = setup.cli("verify", "--all")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "verify FAILED" in done.stdout
    for needle in needles:
        assert needle in done.stdout, (needle, done.stdout)


def one_matching(problems: list[Any], **fields: Any) -> Any:
    """The problem (a Problem or its JSON dict) that has all `fields`."""
    def get(p: Any, k: str) -> Any:
        return p.get(k) if isinstance(p, dict) else getattr(p, k)
    found = [p for p in problems if all(get(p, k) == v for k, v in fields.items())]
    assert found, (fields, problems)
    return found[0]


# --- the store ------------------------------------------------------------------------------


def test_untouched_store_verifies(setup: Setup) -> None:
    done = setup.cli("verify", "--all", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = msgspec.json.decode(done.stdout)
    assert report["ok"] is True and report["problems"] == []
    assert report["days"] == 3 and report["events"] == 18


def test_edited_event_body(setup: Setup) -> None:
    target = day_events(setup, DAY)[4]  # DELETE FROM items WHERE id = 3
    body = json.loads(target.body)
    assert body["sql"].startswith("DELETE")
    body["params"] = [4]  # delete the mic instead of the amp
    new_body = json.dumps(body, separators=(",", ":")).encode()
    assert setup.execute("UPDATE events SET body = :b WHERE persona = :p AND seq = :s",
                         b=new_body, p=PERSONA, s=target.seq) == 1

    expected = dict(persona=PERSONA, kind="chain", day=DAY, seq=target.seq, event=4)
    problem = one_matching(verify_problems(setup), **expected)
    assert "modified" in problem.message and "#4" in problem.message
    one_matching(cli_problems(setup), **expected)
    assert_cli_prints(setup, f"{PERSONA}@{DAY} event #4 (seq {target.seq})")


def test_semantically_neutral_body_edit_is_still_caught(setup: Setup) -> None:
    """Appending a space changes no world, so only the hash chain can notice."""
    target = day_events(setup, DAY)[0]
    body = json.loads(target.body)
    body["sql"] += " "
    setup.execute("UPDATE events SET body = :b WHERE persona = :p AND seq = :s",
                  b=json.dumps(body).encode(), p=PERSONA, s=target.seq)
    one_matching(verify_problems(setup), kind="chain", day=DAY, seq=target.seq, event=0)


def test_edited_event_ts(setup: Setup) -> None:
    target = day_events(setup, DAY)[2]
    assert setup.execute("UPDATE events SET ts = :ts WHERE persona = :p AND seq = :s",
                         ts="2026-04-02T09:00:02.5Z", p=PERSONA, s=target.seq) == 1
    expected = dict(persona=PERSONA, kind="chain", day=DAY, seq=target.seq, event=2)
    one_matching(verify_problems(setup), **expected)
    one_matching(cli_problems(setup), **expected)


@pytest.mark.parametrize("ts", ["2026-13-99T99:99:99Z", "not a time"])
def test_an_edited_ts_that_is_no_timestamp_is_named_by_replay(setup: Setup, ts: str) -> None:
    # Event #2 of day 1 reads the clock (CURRENT_TIMESTAMP), which is when its ts is read.
    target = day_events(setup, DAY)[2]
    assert setup.execute("UPDATE events SET ts = :ts WHERE persona = :p AND seq = :s",
                         ts=ts, p=PERSONA, s=target.seq) == 1
    one_matching(cli_problems(setup), persona=PERSONA, kind="chain", day=DAY, seq=target.seq)
    done = setup.cli("replay", PERSONA)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: {PERSONA}@{DAY} event #2 refused, the whole day is not stored: service "
        f"'notes': the event's ts {ts!r} is not a timestamp"]


def test_edited_blob_data(setup: Setup) -> None:
    events = day_events(setup, DAY)
    index, target = next((i, e) for i, e in enumerate(events)
                         if isinstance(e.payload, FileWritePayload)
                         and e.payload.path == "docs/quote.md")
    blob = target.payload.blob
    assert setup.execute("UPDATE blobs SET data = :d WHERE digest = :g",
                         d=b"# Quote\ntotal: 1 500\n", g=blob) == 1
    expected = dict(persona=PERSONA, kind="blob", day=DAY, seq=target.seq, event=index,
                    file="docs/quote.md")
    problem = one_matching(verify_problems(setup), **expected)
    assert blob in problem.message and "modified" in problem.message
    one_matching(cli_problems(setup), **expected)
    assert_cli_prints(setup, blob, "docs/quote.md")


def test_deleted_blob(setup: Setup) -> None:
    events = day_events(setup, 0)
    index, target = next((i, e) for i, e in enumerate(events)
                         if isinstance(e.payload, FileWritePayload)
                         and e.payload.path == "img/logo.bin")
    assert setup.execute("DELETE FROM blobs WHERE digest = :g", g=target.payload.blob) == 1
    problem = one_matching(verify_problems(setup), kind="blob", day=0, seq=target.seq,
                           event=index, file="img/logo.bin")
    assert "missing" in problem.message


def test_edited_world_hash_of_a_day(setup: Setup) -> None:
    with setup.worlds() as worlds:
        record = worlds.store.day(PERSONA, DAY)
    forged = "f" * 32
    assert setup.execute("UPDATE days SET world_hash = :h WHERE persona = :p AND day = :d",
                         h=forged, p=PERSONA, d=DAY) == 1
    problem = one_matching(verify_problems(setup), persona=PERSONA, kind="hash", day=DAY)
    assert forged in problem.message and record.world_hash in problem.message
    one_matching(cli_problems(setup), persona=PERSONA, kind="hash", day=DAY)
    assert_cli_prints(setup, f"{PERSONA}@{DAY}", forged)
    # The engine refuses to hand out a world that does not match its record.
    with setup.worlds() as worlds:
        worlds.cache.evict(record.world_hash)
        with pytest.raises(IntegrityError):
            worlds.snapshot(PERSONA, DAY)


def test_edited_manifest_of_a_day(setup: Setup) -> None:
    """The stored manifest is what diff and mounts read; it must agree with the hash."""
    with setup.worlds() as worlds:
        record = worlds.store.day(PERSONA, DAY)
    manifest = json.loads(record.manifest)
    manifest["files"].pop("docs/quote.md")
    assert setup.execute("UPDATE days SET manifest = :m WHERE persona = :p AND day = :d",
                         m=json.dumps(manifest).encode(), p=PERSONA, d=DAY) == 1
    one_matching(verify_problems(setup), persona=PERSONA, day=DAY)
    one_matching(cli_problems(setup), persona=PERSONA, day=DAY)


def test_edited_persona_summary(setup: Setup) -> None:
    """`worldctl personas` shows the summary's world hash: it must agree with the last day."""
    assert setup.execute("UPDATE personas SET world_hash = :h WHERE persona = :p",
                         h="e" * 32, p=PERSONA) == 1
    one_matching(verify_problems(setup), persona=PERSONA, kind="day")


@pytest.mark.parametrize("position", ["middle", "last_of_day"])
def test_deleted_event_row(setup: Setup, position: str) -> None:
    events = day_events(setup, DAY)
    index = 2 if position == "middle" else len(events) - 1
    target = events[index]
    assert setup.execute("DELETE FROM events WHERE persona = :p AND seq = :s",
                         p=PERSONA, s=target.seq) == 1
    problems = verify_problems(setup)
    # The gap is reported at the missing seq, in the day that lost it.
    missing = [p for p in problems if p.kind == "chain" and str(target.seq) in p.message]
    assert missing, problems
    assert any(p.day == DAY for p in problems), problems
    from_cli = cli_problems(setup)
    assert any(p.get("day") == DAY and p["persona"] == PERSONA for p in from_cli), from_cli


def test_deleted_last_event_of_the_stream(setup: Setup) -> None:
    """No gap in seq is left behind, so only the day records can tell."""
    last = day_events(setup, 2)[-1]
    setup.execute("DELETE FROM events WHERE persona = :p AND seq = :s", p=PERSONA, s=last.seq)
    one_matching(verify_problems(setup), persona=PERSONA, kind="day", day=2)


def test_edited_sql_and_id_together_is_caught_by_the_chain(setup: Setup) -> None:
    """Forging an event's id to match its new body breaks the next event's link instead."""
    from worldstore.events import compute_event_id

    target = day_events(setup, DAY)[1]
    payload = target.payload
    assert isinstance(payload, SqlPayload)
    body = json.loads(target.body)
    body["params"] = [5, "stand", 1]
    new_body = json.dumps(body, separators=(",", ":")).encode()
    new_id = compute_event_id(persona=target.persona, seq=target.seq, day=target.day,
                              ts=target.ts, prev=target.prev,
                              schema_version=target.schema_version, body=new_body)
    setup.execute("UPDATE events SET body = :b, event_id = :i WHERE persona = :p AND seq = :s",
                  b=new_body, i=new_id, p=PERSONA, s=target.seq)
    one_matching(verify_problems(setup), kind="chain", day=DAY, seq=target.seq + 1, event=2)


# --- the snapshot cache -----------------------------------------------------------------------


def _writable(path: Path) -> None:
    os.chmod(path, 0o644)


def tamper_cached_row(setup: Setup, world_hash: str) -> None:
    db = setup.cache / "snapshots" / world_hash / "world" / "services" / "shop.sqlite"
    _writable(db)
    conn = sqlite3.connect(db)
    with conn:
        assert conn.execute("UPDATE items SET price = 1 WHERE id = 1").rowcount == 1
    conn.close()


def tamper_cached_file(setup: Setup, world_hash: str) -> None:
    path = setup.cache / "snapshots" / world_hash / "world" / "workspace" / "docs" / "quote.md"
    _writable(path)
    data = bytearray(path.read_bytes())
    data[3] ^= 0x20
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("what", ["row", "file"])
def test_edited_cached_snapshot(setup: Setup, what: str) -> None:
    tamper = tamper_cached_row if what == "row" else tamper_cached_file
    with setup.worlds() as worlds:
        record = worlds.store.day(PERSONA, DAY)
        assert worlds.cache.get(record.world_hash) is not None  # import filled the cache
    named = {"table": "shop.items"} if what == "row" else {"file": "docs/quote.md"}

    tamper(setup, record.world_hash)
    with setup.worlds() as worlds:
        report = worlds.verify()
        assert not report.ok
        problem = one_matching(report.problems, persona=PERSONA, kind="cache", day=DAY)
        assert record.world_hash in problem.message
        one_matching(report.problems, persona=PERSONA, kind="cache", day=DAY, **named)
        # verify dropped the bad entry ...
        assert worlds.cache.get(record.world_hash) is None
        assert worlds.verify().ok
        # ... and the next checkout rebuilds the world from the log.
        worlds.checkout(f"{PERSONA}@{DAY}", setup.cache.parent / "co1")
        assert hash_world(setup.cache.parent / "co1") == record.world_hash
        assert worlds.cache.check(record.world_hash) is None

    tamper(setup, record.world_hash)
    from_cli = cli_problems(setup)
    one_matching(from_cli, persona=PERSONA, kind="cache", day=DAY)
    with setup.worlds() as worlds:
        assert worlds.cache.get(record.world_hash) is None

    with setup.worlds() as worlds:
        worlds.snapshot(PERSONA, DAY)
    tamper(setup, record.world_hash)
    assert_cli_prints(setup, "[cache]", record.world_hash)


def test_checkout_never_hands_out_a_tampered_snapshot(setup: Setup) -> None:
    with setup.worlds() as worlds:
        record = worlds.store.day(PERSONA, DAY)
    tamper_cached_row(setup, record.world_hash)
    with setup.worlds() as worlds:
        got = worlds.checkout(f"{PERSONA}@{DAY}", setup.cache.parent / "co")
    assert got.world_hash == record.world_hash
    assert hash_world(setup.cache.parent / "co") == record.world_hash
    with setup.worlds() as worlds:
        assert worlds.verify().ok  # the bad entry was replaced by a sound one


def test_mount_never_hands_out_a_tampered_snapshot(setup: Setup) -> None:
    with setup.worlds() as worlds:
        record = worlds.store.day(PERSONA, DAY)
    tamper_cached_file(setup, record.world_hash)
    with setup.worlds() as worlds, worlds.mount(f"{PERSONA}@{DAY}") as instance:
        assert instance.hash() == record.world_hash
