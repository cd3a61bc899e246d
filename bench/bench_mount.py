"""Mount + reset latency, and many mounts at once.

Per world (a ~5 MB one and the ~25+ MB one), interleaved round by round:

* ``copy`` (baseline): make a fresh directory next to where instances go and
  ``shutil.copyfile`` every file of the cached snapshot into it (the file list is computed
  once, outside the timing; the copy is deleted right after, as an instance is closed).
* ``mount``: ``Worlds.mount(ref)`` (resolve, find the cached snapshot, copy it in, pin
  stamps), then one small write (one row UPDATE through stdlib sqlite3), then ``reset()``
  (which re-copies only what was written). Also timed on the same instance: a second write
  followed by ``reset(full=True)`` (re-copy of everything).

Target: mount + reset <= 1.5x the plain copy. The write itself (stdlib sqlite3 with its
default fsyncs) is the caller's work, so it is timed and shown but not counted.

Then, in a child process (so its memory is its own): 1,000 mounts of the 5 MB world kept
open at once (baseline: 1,000 plain copies kept at once, before and after, averaged): total
time, disk used (sum of st_blocks * 512 over the instance dirs, and the file system's
free-space delta), peak RSS, then closing them all. Whether the file system shares extents
(reflinks) is checked with ``filefrag -v`` and by comparing the df delta with the allocated
blocks.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import (
    QUICK_EVENTS,
    Report,
    Row,
    bench_parser,
    copy_files,
    emit,
    fmt_bytes,
    fmt_s,
    fs_type,
    interleave,
    median,
    remove,
    scratch_dir,
    setup_run,
    snapshot_files,
    spread,
    time_plain_copy,
    tree_blocks,
    tree_bytes,
    world_file,
)

from replay.engine import Worlds
from replay.mount import Mount

TARGET_X_COPY = 1.5
PERSONA = "bench"
SMALL_EVENTS = 7_500  # about 5 MB of databases with the default payload
BIG_EVENTS = 50_000


def small_write(mount: Mount) -> None:
    conn = sqlite3.connect(mount.db_path("mail"), isolation_level=None)
    try:
        conn.execute("UPDATE messages SET is_read = 1 - is_read "
                     "WHERE id = (SELECT min(id) FROM messages)")
    finally:
        conn.close()


def bench_world(label: str, events: int, payload: int, rounds: int, work: Path
                ) -> tuple[list[Row], dict[str, Any]]:
    jsonl = world_file(events, payload)
    store = work / f"store-{label}"
    worlds = Worlds.open(store)
    worlds.import_file(jsonl)
    record = worlds.resolve(PERSONA)
    snapshot = worlds.snapshot(record.persona, record.day)
    files = snapshot_files(snapshot)
    n_bytes = sum(p.stat().st_size for _, p in files)
    steps: dict[str, list[float]] = {"mount": [], "write": [], "reset": [], "full": []}
    checked: list[bool] = []

    def t_copy() -> float:
        # Same parent directory and the same clean-up pattern as an instance (a fresh
        # directory, deleted right after use): on ext4 when deletes happen matters.
        return time_plain_copy(worlds.cache.scratch, files)

    def t_mount() -> float:
        t0 = time.perf_counter()
        m = worlds.mount(PERSONA)
        t1 = time.perf_counter()
        small_write(m)
        t2 = time.perf_counter()
        m.reset()
        t3 = time.perf_counter()
        if not checked:  # once: reset really restores the snapshot (outside the timing)
            checked.append(m.hash() == record.world_hash)
        small_write(m)
        t4 = time.perf_counter()
        m.reset(full=True)
        t5 = time.perf_counter()
        if len(checked) == 1:
            checked.append(m.hash() == record.world_hash)
        m.close()
        for name, dt in (("mount", t1 - t0), ("write", t2 - t1), ("reset", t3 - t2),
                         ("full", t5 - t4)):
            steps[name].append(dt)
        return (t1 - t0) + (t3 - t2)  # the engine's part: mount and reset

    t_copy(), t_mount()  # warm-up: page cache, statement caches, snapshot lookup
    for v in steps.values():
        v.clear()
    times = interleave({"copy": t_copy, "mount_reset": t_mount}, rounds)
    worlds.close()

    copy_s = median(times["copy"])
    engine_s = median(times["mount_reset"])
    total_s = median([m + w + r for m, w, r in zip(steps["mount"], steps["write"],
                                                   steps["reset"], strict=True)])
    mount_s, write_s, reset_s, full_s = (median(steps[k]) for k in
                                         ("mount", "write", "reset", "full"))
    b = "mount"
    size = f"{label} {fmt_bytes(n_bytes)}"
    rows = [
        Row(b, f"mount + reset() around a 1-row write (write excluded), {size}",
            fmt_s(engine_s), fmt_s(copy_s) + " copy", f"mount/copy = {engine_s / copy_s:.2f}x",
            f"<= {TARGET_X_COPY}x copy", engine_s <= TARGET_X_COPY * copy_s),
        Row(b, f"  same, write included, {size}", fmt_s(total_s), fmt_s(copy_s) + " copy",
            f"{total_s / copy_s:.2f}x copy"),
        Row(b, f"  mount alone, {size}", fmt_s(mount_s), fmt_s(copy_s) + " copy",
            f"{mount_s / copy_s:.2f}x copy"),
        Row(b, f"  the 1-row write (stdlib sqlite3, fsync), {size}", fmt_s(write_s)),
        Row(b, f"  reset() after the write, {size}", fmt_s(reset_s), fmt_s(copy_s) + " copy",
            f"{reset_s / copy_s:.2f}x copy"),
        Row(b, f"reset(full=True), {size}", fmt_s(full_s), fmt_s(copy_s) + " copy",
            f"{full_s / copy_s:.2f}x copy"),
    ]
    data = {
        "bytes": n_bytes, "files": len(files), "world_hash": record.world_hash,
        "seconds": times, "steps_s": steps, "reset_restores_hash": all(checked),
        "spread": {k: spread(v) for k, v in times.items()},
        "store": str(store), "events": events,
    }
    return rows, data


# --- many mounts (child process) -----------------------------------------------------------


def filefrag_shared(path: Path) -> str:
    """'shared', 'not shared', or why we cannot tell, from `filefrag -v` extent flags."""
    try:
        out = subprocess.run(["filefrag", "-v", str(path)], capture_output=True, text=True,
                             check=False)
    except OSError as exc:
        return f"unknown (filefrag: {exc.strerror})"
    if out.returncode != 0:
        return f"unknown (filefrag: {out.stderr.strip() or out.returncode})"
    return "shared" if "shared" in out.stdout else "not shared"


def proc_status_bytes(field: str) -> int:
    """VmRSS / VmHWM of this process from /proc (kB there), 0 where /proc is missing."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def many_copies(worlds: Worlds, files: list[tuple[str, Path]], n: int) -> dict[str, float]:
    """n plain copies kept at once, then deleted: the baseline of many_mounts."""
    st0 = os.statvfs(worlds.cache.root)
    t0 = time.perf_counter()
    copies = []
    for _ in range(n):
        copies.append(worlds.cache.scratch())
        copy_files(files, copies[-1])
    made_s = time.perf_counter() - t0
    df = (st0.f_bavail - os.statvfs(worlds.cache.root).f_bavail) * st0.f_frsize
    t0 = time.perf_counter()
    for dest in copies:
        remove(dest)
    return {"s": made_s, "remove_s": time.perf_counter() - t0, "df_bytes": df}


def many_mounts(store: Path, n: int) -> dict[str, Any]:
    """n mounts kept at once, between two rounds of n plain copies kept at once."""
    worlds = Worlds.open(store)
    record = worlds.resolve(PERSONA)
    snapshot = worlds.snapshot(record.persona, record.day)
    files = snapshot_files(snapshot)
    worlds.mount(PERSONA).close()  # warm-up

    copies_before = many_copies(worlds, files, n)

    rss_before = proc_status_bytes("VmRSS")
    st0 = os.statvfs(store)
    mounts: list[Mount] = []
    latencies = []
    t0 = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        mounts.append(worlds.mount(PERSONA))
        latencies.append(time.perf_counter() - t)
    open_s = time.perf_counter() - t0
    rss_after = proc_status_bytes("VmRSS")
    st1 = os.statvfs(store)
    blocks = sum(tree_blocks(m.path) for m in mounts)
    apparent = sum(tree_bytes(m.path) for m in mounts)
    shared = filefrag_shared(mounts[0].db_path(sorted(mounts[0].services)[0]))
    t1 = time.perf_counter()
    for m in mounts:
        m.close()
    close_s = time.perf_counter() - t1
    st2 = os.statvfs(store)
    # The baseline runs before and after the mounts (how fast a file system creates
    # files depends on what was deleted just before), and the two are averaged.
    copies_after = many_copies(worlds, files, n)
    worlds.close()
    latencies.sort()
    return {
        "n": n, "open_s": open_s, "close_s": close_s,
        "copies_before": copies_before, "copies_after": copies_after,
        "copies_s": (copies_before["s"] + copies_after["s"]) / 2,
        "copies_remove_s": (copies_before["remove_s"] + copies_after["remove_s"]) / 2,
        "copies_df_bytes": (copies_before["df_bytes"] + copies_after["df_bytes"]) / 2,
        "mount_p50_s": statistics.median(latencies),
        "mount_p99_s": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "blocks_bytes": blocks, "apparent_bytes": apparent,
        "df_delta_bytes": (st0.f_bavail - st1.f_bavail) * st0.f_frsize,
        "df_after_close_delta_bytes": (st0.f_bavail - st2.f_bavail) * st0.f_frsize,
        # ru_maxrss survives exec on Linux, so it also counts the parent's peak at fork
        # time; VmHWM is this process's own high-water mark.
        "ru_maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "vmhwm_bytes": proc_status_bytes("VmHWM"),
        "rss_before_bytes": rss_before, "rss_after_bytes": rss_after,
        "filefrag": shared, "fs": fs_type(store),
    }


def many_rows(d: dict[str, Any], world_bytes: int) -> tuple[list[Row], list[str]]:
    n = d["n"]
    ratio = d["df_delta_bytes"] / d["blocks_bytes"] if d["blocks_bytes"] else 0.0
    reflinks = d["filefrag"] == "shared" or ratio < 0.5
    b = "mount"
    rows = [
        Row(b, f"{n:,} mounts of the {fmt_bytes(world_bytes)} world kept open: total time",
            f"{fmt_s(d['open_s'])} ({fmt_s(d['open_s'] / n)}/mount, p99 "
            f"{fmt_s(d['mount_p99_s'])})", f"{fmt_s(d['copies_s'])} for {n:,} copies",
            f"mount/copy = {d['open_s'] / d['copies_s']:.2f}x"),
        Row(b, f"  disk used by {n:,} instances (sum st_blocks*512 / df delta)",
            f"{fmt_bytes(d['blocks_bytes'])} / {fmt_bytes(d['df_delta_bytes'])}",
            f"{fmt_bytes(d['copies_df_bytes'])} df for {n:,} copies",
            f"df/blocks = {ratio:.2f}"),
        Row(b, "  peak RSS of the mounting process (getrusage / VmHWM)",
            f"{fmt_bytes(d['ru_maxrss_bytes'])} / {fmt_bytes(d['vmhwm_bytes'])}",
            f"{fmt_bytes(d['rss_before_bytes'])} RSS before mounting",
            f"+{fmt_bytes((d['rss_after_bytes'] - d['rss_before_bytes']) / n)}/mount"),
        Row(b, f"  close all {n:,}", fmt_s(d["close_s"]),
            f"{fmt_s(d['copies_remove_s'])} to delete the copies",
            f"df after close: {fmt_bytes(d['df_after_close_delta_bytes'])} vs start"),
        Row(b, "  reflinks (extent sharing) on this file system",
            "yes" if reflinks else "no", "", f"{d['fs']}; filefrag: {d['filefrag']}"),
    ]
    notes = []
    if not reflinks:
        notes.append(
            f"File system {d['fs']}: copy_file_range copies data in the kernel and shares no "
            f"extents (filefrag: {d['filefrag']}; df delta = {ratio:.2f} x allocated blocks), "
            "so every instance costs its full size on disk. On XFS or Btrfs the same code "
            "clones extents and an instance costs about what it writes."
        )
    notes.append(
        "Many mounts: the copies (kept, then deleted) run before and after the mounts and "
        "are averaged; df deltas "
        "are of the whole file system, which other processes share. getrusage's ru_maxrss "
        "includes the parent's RSS at fork (Linux keeps it across exec); VmHWM does not."
    )
    return rows, notes


def run(small_events: int, big_events: int, payload: int, rounds: int, n_many: int) -> Report:
    work = scratch_dir("mount")
    report = Report("mount", {"small_events": small_events, "big_events": big_events,
                              "payload": payload, "rounds": rounds, "many": n_many})
    rows_small, data_small = bench_world("small", small_events, payload, rounds, work)
    rows_big, data_big = bench_world("big", big_events, payload, rounds, work)
    report.rows += rows_small + rows_big
    report.data = {"small": data_small, "big": data_big}
    for label, d in (("small", data_small), ("big", data_big)):
        if not d["reset_restores_hash"]:
            report.notes.append(f"WARNING: after reset the {label} instance hashed differently")
    report.notes.append(
        "copy = shutil.copyfile of each snapshot file (list precomputed); mount = "
        "Worlds.mount incl. resolving the ref; write = one-row UPDATE via stdlib sqlite3. "
        f"Spread (min..max s): small {data_small['spread']}, big {data_big['spread']}."
    )
    # The many-mounts test runs in a child process so that its memory is its own.
    out = subprocess.run(
        [sys.executable, __file__, "--many-child", str(n_many), "--store",
         data_small["store"]], capture_output=True, text=True, check=True,
    )
    many = json.loads(out.stdout)
    rows, notes = many_rows(many, data_small["bytes"])
    report.rows += rows
    report.notes += notes
    report.data["many"] = many
    remove(work)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("mount+reset latency vs plain copy; many mounts")
    ap.add_argument("--payload", type=int, default=640)
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--many", type=int, help="how many mounts to keep open at once")
    ap.add_argument("--many-child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--store", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.many_child is not None:
        print(json.dumps(many_mounts(a.store, a.many_child)))
        return 0
    setup_run(a)
    small, big = (QUICK_EVENTS // 2, QUICK_EVENTS) if a.quick else (SMALL_EVENTS, BIG_EVENTS)
    rounds = a.rounds or (1 if a.quick else 15)
    n_many = a.many or (5 if a.quick else 1_000)
    emit(run(small, big, a.payload, rounds, n_many))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
