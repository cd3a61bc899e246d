"""Replay rate: ``Worlds.replay(persona)`` against the same SQL applied raw with stdlib sqlite3.

Contenders, interleaved round by round (medians reported):

* ``raw``: the interchange file's statements, already parsed into memory, executed with
  Python's stdlib ``sqlite3`` in one transaction per service (file events written as plain
  files). This is the floor: SQLite's own cost plus the thinnest Python loop.
* ``replay``: ``Worlds.replay(persona)``: events read from the SQLite event store, decoded,
  applied through the guarded apsw connections, committed and hashed per day (and offered
  to the snapshot cache, which already holds every day after the import, so that is cheap).
* ``replay without hashing``: the same fold (store pages -> decode -> apply -> commit per
  day) without the per-day world hash and cache step, so readers see where time goes.
* ``read+decode``: only reading the events from the store (replay's scan, ``event_pages``)
  and decoding their payloads.

Three worlds: the default ``genworld`` world, where every table changes every day (per-day
hashing must re-hash all of it); a write-heavy few-tables world (``genworld --realistic``:
60 tables, 15 of them and ~5 files changed a day, the same number of events every day, so
a day rewrites a third of each table it touches); and the WildAWM-shaped one, judged
against the target: the same 60 tables, 15 tables and ~5 files a day, with 80 % of the
events on day 0 and small later days (``--day0-share 0.8``; WildAWM's worlds are 59.3 MiB
with ~31 KiB growth a day, so even this grows ten times faster than theirs).

Import (``Worlds.import_file`` into a fresh store: validate, apply, hash, cache, commit) is
timed separately. The raw world is checked to hash to the recorded hash of the last day, so
the baseline provably does the same work.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import genworld
from _common import (
    Report,
    Row,
    emit,
    fmt_bytes,
    fmt_rate,
    fmt_s,
    fresh_dir,
    interleave,
    median,
    remove,
    scratch_dir,
    scratch_root,
    spread,
    tree_bytes,
    world_args,
    world_file,
)

from replay.apply import WorldBuilder
from replay.engine import Worlds
from replay.hashing import hash_world, world_manifest
from replay.layout import SERVICES, WORKSPACE
from replay.rehash import DayHasher
from worldstore.events import decode_payload
from worldstore.interchange import BLOB_PARAM_KEY

TARGET_RATIO = 0.5  # replay speed >= 0.5x raw apply
PERSONA = "bench"


def parse_statements(path: Path) -> list[tuple[str, Any, Any]]:
    """(kind, service-or-path, (sql, params)-or-bytes) per line, for the raw baseline."""
    import base64

    ops: list[tuple[str, Any, Any]] = []
    with open(path, "rb") as fh:
        for raw in fh:
            obj = json.loads(raw)
            kind = obj["type"]
            if kind == "sql":
                params = obj.get("params")
                if isinstance(params, list):
                    params = tuple(
                        base64.b64decode(v[BLOB_PARAM_KEY]) if isinstance(v, dict) else v
                        for v in params
                    )
                ops.append(("sql", obj["service"], (obj["sql"], params or ())))
            elif kind == "file_write":
                data = (obj["text"].encode() if obj.get("text") is not None
                        else base64.b64decode(obj["base64"]))
                ops.append(("write", obj["path"], data))
            else:
                ops.append(("delete", obj["path"], None))
    return ops


def raw_apply(ops: list[tuple[str, Any, Any]], root: Path) -> None:
    services = root / SERVICES
    workspace = root / WORKSPACE
    services.mkdir(parents=True)
    workspace.mkdir()
    conns: dict[str, sqlite3.Connection] = {}
    for kind, where, what in ops:
        if kind == "sql":
            conn = conns.get(where)
            if conn is None:
                conn = sqlite3.connect(services / f"{where}.sqlite", isolation_level=None)
                conn.execute("BEGIN")
                conns[where] = conn
            conn.execute(*what)
        elif kind == "write":
            target = workspace / where
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(what)
        else:
            target = workspace / where
            target.unlink()
            parent = target.parent
            while parent != workspace and not any(parent.iterdir()):
                parent.rmdir()  # the engine prunes emptied folders too
                parent = parent.parent
    for conn in conns.values():
        conn.execute("COMMIT")
        conn.close()


def apply_without_hashing(worlds: Worlds, root: Path) -> None:
    """The replay fold minus the per-day hash and cache step (see replay.fold): the same
    scan (event pages), the same apply and a commit per day; no rowids noted (nothing
    would read them)."""
    builder = WorldBuilder(root, worlds.store.blob)
    builder.track_rows(False)
    current = None
    try:
        for rows in worlds.store.event_pages(PERSONA):
            at = 0
            while at < len(rows):
                if current is not None and rows[at][1] != current:
                    builder.commit()
                current = rows[at][1]
                at = builder.apply_rows(rows, at)
        builder.commit()
    finally:
        builder.abort()


def read_and_decode(worlds: Worlds) -> int:
    """Replay's scan alone: the event pages, each payload decoded."""
    n = 0
    for rows in worlds.store.event_pages(PERSONA):
        for row in rows:
            decode_payload(row[5], row[4])
        n += len(rows)
    return n


class ReplaySplit:
    """Wraps the hashing and cache steps of replay to time them (behaviour unchanged)."""

    def __init__(self, worlds: Worlds) -> None:
        self.hash_s = 0.0
        self.cache_s = 0.0
        self.full = False  # re-hash the whole world every day, as before per-day carry-over
        real_manifest = DayHasher.manifest
        real_put = worlds.cache.put

        def timed_manifest(hasher: DayHasher, changes: Any) -> Any:
            t0 = time.perf_counter()
            try:
                if self.full:
                    return world_manifest(hasher.root)
                return real_manifest(hasher, changes)
            finally:
                self.hash_s += time.perf_counter() - t0

        def timed_put(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return real_put(*args, **kwargs)
            finally:
                self.cache_s += time.perf_counter() - t0

        DayHasher.manifest = timed_manifest  # type: ignore[method-assign]
        worlds.cache.put = timed_put  # type: ignore[method-assign]
        self._real_manifest = real_manifest

    def undo(self) -> None:
        DayHasher.manifest = self._real_manifest  # type: ignore[method-assign]


REALISTIC_DAYS = 20


WILDAWM_DAY0_SHARE = 0.8


# Day 0 of the realistic shape creates its 60 tables among its events: fewer events than
# this over 20 days leave tables uncreated.
REALISTIC_MIN_EVENTS = 2_400


def realistic_world_file(events: int, payload: int, day0_share: float = 0.0) -> Path:
    """A realistic world's interchange file (generated once per generator version)."""
    import hashlib

    events = max(events, REALISTIC_MIN_EVENTS)
    src = hashlib.sha256(Path(genworld.__file__).read_bytes()).hexdigest()[:10]
    name = f"realistic-{events}-{payload}-{REALISTIC_DAYS}-{day0_share}-{src}.jsonl"
    path = scratch_root() / "worlds" / name
    if not path.exists():
        for stale in path.parent.glob("realistic-*.jsonl"):
            if not stale.stem.endswith(src):
                stale.unlink()
        genworld.write_world(path, genworld.Params(events, payload, REALISTIC_DAYS, True,
                                                   day0_share))
    return path


def run(events: int, payload: int, rounds: int, import_rounds: int) -> Report:
    report = Report("replay", {"events": events, "payload": payload, "rounds": rounds,
                               "import_rounds": import_rounds})
    heavy = Report("replay", {})
    wild = Report("replay", {})
    few = (f"60 tables, {genworld.REALISTIC_TOUCHED} tables and ~{genworld.REALISTIC_FILES} "
           "files a day")
    run_world(report, world_file(events, payload), "", rounds, import_rounds, judged=False)
    run_world(heavy, realistic_world_file(events, payload),
              f"write-heavy world ({few}, even days): ", rounds, import_rounds, judged=False)
    run_world(wild, realistic_world_file(events, payload, WILDAWM_DAY0_SHARE),
              f"WildAWM-shaped world ({few}, {WILDAWM_DAY0_SHARE:.0%} of events on day 0): ",
              rounds, import_rounds, judged=True)
    for other, label in ((heavy, "write-heavy"), (wild, "WildAWM-shaped")):
        report.rows += other.rows
        report.notes += [f"{label} world: {n}" for n in other.notes]
    report.data = {"all_tables_every_day": report.data, "write_heavy": heavy.data,
                   "wildawm_shaped": wild.data}
    return report


def run_world(report: Report, jsonl: Path, label: str, rounds: int, import_rounds: int,
              *, judged: bool) -> None:
    """Time one world's replay against raw sqlite3; add its rows to `report`."""
    work = scratch_dir("replay")
    ops = parse_statements(jsonl)
    n_events = len(ops)

    # Import into fresh stores; the last one is kept for the replay rounds.
    import_times = []
    store = work / "store"
    for i in range(import_rounds):
        store = fresh_dir(work / f"store{i}")
        t0 = time.perf_counter()
        with Worlds.open(store) as worlds:
            results = worlds.import_file(jsonl)
        import_times.append(time.perf_counter() - t0)
        if i < import_rounds - 1:
            remove(store)
    recorded = {r.day: r.world_hash for r in results}
    last_hash = recorded[max(recorded)]

    worlds = Worlds.open(store)
    split = ReplaySplit(worlds)
    replay_split: list[tuple[float, float, float]] = []

    def t_raw() -> float:
        root = fresh_dir(work / "raw") / "world"
        t0 = time.perf_counter()
        raw_apply(ops, root)
        return time.perf_counter() - t0

    def t_replay() -> float:
        split.hash_s = split.cache_s = 0.0
        t0 = time.perf_counter()
        days = worlds.replay(PERSONA)
        elapsed = time.perf_counter() - t0
        bad = [d for d in days if d.status != "replayed"]
        if bad:
            raise SystemExit(f"replay mismatch: {bad[0]}")
        replay_split.append((elapsed, split.hash_s, split.cache_s))
        return elapsed

    def t_replay_full() -> float:
        split.full = True
        try:
            t0 = time.perf_counter()
            days = worlds.replay(PERSONA)
            elapsed = time.perf_counter() - t0
        finally:
            split.full = False
        if any(d.status != "replayed" for d in days):
            raise SystemExit("replay mismatch with full per-day hashing")
        return elapsed

    def t_apply() -> float:
        root = fresh_dir(work / "apply") / "world"
        t0 = time.perf_counter()
        apply_without_hashing(worlds, root)
        return time.perf_counter() - t0

    def t_read() -> float:
        t0 = time.perf_counter()
        read_and_decode(worlds)
        return time.perf_counter() - t0

    times = interleave({"raw": t_raw, "replay": t_replay, "replay_full": t_replay_full,
                        "apply": t_apply, "read": t_read}, rounds)

    # The baseline and the hash-free fold must build the very world replay built.
    raw_hash = hash_world(work / "raw" / "world")
    apply_hash = hash_world(work / "apply" / "world")
    world_bytes = tree_bytes(work / "raw" / "world")
    worlds.close()
    split.undo()

    raw, rep, full, app, rd = (median(times[k])
                               for k in ("raw", "replay", "replay_full", "apply", "read"))
    imp = median(import_times)
    mid = sorted(replay_split)[len(replay_split) // 2]
    _, hash_s, cache_s = mid
    ratio = raw / rep
    report.data = {
        "seconds": {k: v for k, v in times.items()} | {"import": import_times},
        "replay_split_s": [{"total": t, "hash": h, "cache_put": c} for t, h, c in replay_split],
        "world_bytes": world_bytes, "days": len(recorded),
        "raw_world_hash": raw_hash, "apply_world_hash": apply_hash,
        "recorded_last_hash": last_hash,
    }
    if raw_hash != last_hash or apply_hash != last_hash:
        report.notes.append(f"WARNING: world hashes differ: raw {raw_hash}, hash-free fold "
                            f"{apply_hash}, recorded {last_hash}")

    def rate(s: float) -> str:
        return fmt_rate(n_events / s, "ev")

    b = "replay"
    report.rows += [
        Row(b, f"{label}replay {n_events:,} events ({fmt_bytes(world_bytes)} world, "
               f"{len(recorded)} days), median time", fmt_s(rep), fmt_s(raw) + " raw",
            f"raw/replay = {ratio:.2f}", f">= {TARGET_RATIO}" if judged else "",
            ratio >= TARGET_RATIO if judged else None),
        Row(b, "replay rate", rate(rep), rate(raw) + " raw"),
        Row(b, "replay re-hashing the whole world every day (as before)", rate(full),
            rate(raw) + " raw", f"raw/replay = {raw / full:.2f}"),
        Row(b, "replay without per-day hashing", rate(app), rate(raw) + " raw",
            f"raw/fold = {raw / app:.2f}"),
        Row(b, "  of replay: world hashing (per day) / cache", f"{fmt_s(hash_s)} / "
               f"{fmt_s(cache_s)}", "", f"{hash_s / mid[0]:.0%} / {cache_s / mid[0]:.0%}"),
        Row(b, "  of replay: read+decode events from store (timed alone)", fmt_s(rd), "",
            f"{rd / rep:.0%} of replay"),
        Row(b, "import (validate, apply, hash, cache, commit)", f"{fmt_s(imp)} = {rate(imp)}",
            fmt_s(raw) + " raw", f"raw/import = {raw / imp:.2f}"),
    ]
    report.notes.append(
        f"raw = stdlib sqlite3, statements pre-parsed in memory, one transaction per service; "
        f"raw world hash {'==' if raw_hash == last_hash else '!='} recorded last-day hash. "
        f"Spread (min..max s): raw {spread(times['raw'])}, replay {spread(times['replay'])}, "
        f"fold {spread(times['apply'])}, import {spread(import_times)}."
    )
    remove(work)


def main(argv: list[str] | None = None) -> int:
    a = world_args("replay rate vs raw sqlite3 apply", argv, rounds=7)
    emit(run(a.events, a.payload, a.rounds, import_rounds=1 if a.quick else 3), quick=a.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
