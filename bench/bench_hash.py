"""World-hash throughput: ``replay.hashing.hash_world`` on a checkout of the big world.

MB = 10^6 bytes of input: the database files' sizes plus the workspace files' sizes of the
checkout (what a plain file hash would read). The baseline is xxh3-128 over those raw file
bytes (1 MiB reads, the same digest the world hash uses), measured in the same run and
interleaved with the world hash; both run with the files in the page cache (one warm-up
round is discarded). The world hash reads rows through SQLite in primary-key order and
encodes them canonically, so it is expected to be slower than hashing bytes; what it buys
is a hash that ignores page layout and history.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import xxhash
from _common import (
    Report,
    Row,
    emit,
    fmt_bytes,
    fmt_s,
    interleave,
    median,
    remove,
    scratch_dir,
    spread,
    world_args,
    world_file,
)

from replay.engine import Worlds
from replay.hashing import hash_world, world_manifest

TARGET_MBPS = 150.0
PERSONA = "bench"


def world_files(root: Path) -> list[Path]:
    found = []
    for dirpath, _dirs, files in os.walk(root):
        found += [Path(dirpath) / f for f in files]
    return sorted(found)


def xxh3_files(files: list[Path]) -> str:
    h = xxhash.xxh3_128()
    for path in files:
        with open(path, "rb") as fh:
            while block := fh.read(1 << 20):
                h.update(block)
    return h.hexdigest()


def run(events: int, payload: int, rounds: int) -> Report:
    work = scratch_dir("hash")
    jsonl = world_file(events, payload)
    with Worlds.open(work / "store") as worlds:
        worlds.import_file(jsonl)
        record = worlds.checkout(PERSONA, work / "checkout")
    root = work / "checkout"
    files = world_files(root)
    n_bytes = sum(p.stat().st_size for p in files)
    db_bytes = sum(p.stat().st_size for p in files if p.suffix == ".sqlite")
    mb = n_bytes / 1e6

    # Warm-up (page cache, statement caches), and the hash must be the recorded one.
    if hash_world(root) != record.world_hash:
        raise SystemExit(f"checkout hashes differently from the record {record.world_hash}")
    xxh3_files(files)

    def t_world() -> float:
        t0 = time.perf_counter()
        hash_world(root)
        return time.perf_counter() - t0

    def t_bytes() -> float:
        t0 = time.perf_counter()
        xxh3_files(files)
        return time.perf_counter() - t0

    times = interleave({"world_hash": t_world, "xxh3_bytes": t_bytes}, rounds)
    world_s, bytes_s = median(times["world_hash"]), median(times["xxh3_bytes"])
    manifest = world_manifest(root)
    n_rows = sum(t.rows for s in manifest.services.values() for t in s.tables.values())
    world_mbps = mb / world_s
    report = Report("hash", {"events": events, "payload": payload, "rounds": rounds})
    report.data = {
        "seconds": times, "bytes": n_bytes, "db_bytes": db_bytes, "rows": n_rows,
        "files": len(files), "world_hash": record.world_hash,
    }
    report.rows += [
        Row("hash", f"hash_world of a {fmt_bytes(n_bytes)} checkout ({n_rows:,} rows, "
                    f"{len(files)} files), MB/s", f"{world_mbps:,.0f} MB/s ({fmt_s(world_s)})",
            f"{mb / bytes_s:,.0f} MB/s xxh3 bytes", f"speed world/xxh3 = {bytes_s / world_s:.2f}",
            f">= {TARGET_MBPS:.0f} MB/s", world_mbps >= TARGET_MBPS),
        Row("hash", "hash_world rows/s", f"{n_rows / world_s / 1e3:,.0f}k rows/s"),
    ]
    report.notes.append(
        f"MB = 10^6 bytes of database + workspace files; page cache warm. Spread (min..max "
        f"s): world {spread(times['world_hash'])}, xxh3 {spread(times['xxh3_bytes'])}."
    )
    remove(work)
    return report


def main(argv: list[str] | None = None) -> int:
    a = world_args("world hash MB/s vs xxh3 over raw file bytes", argv, rounds=9)
    emit(run(a.events, a.payload, a.rounds), quick=a.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
