"""The snapshot cache is bounded and inspectable (replay/cache.py).

Least recently used entries go first; an entry an open instance uses (a mount, an
Environment instance, in this process or another) is never evicted, and a dead process's
pin dies with it; the cap holds after many imports; a cache pruned to nothing still
serves every day with its recorded hash; ``worldctl cache stats`` and ``cache prune``
report and prune through the same library.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from replay import Worlds
from replay.cache import (
    CACHE_MAX_ENV,
    CHECKPOINT_DAYS,
    CHECKPOINT_EVENTS,
    DEFAULT_MAX_BYTES,
    RECENT_DAYS,
    SnapshotCache,
    days_to_keep,
    default_max_bytes,
    parse_size,
)
from replay.hashing import hash_world
from worldctl.main import cli
from worldenv.instances.instance import Environment
from worldstore.errors import ConfigError

DEMO = Path(__file__).resolve().parents[2] / "packs" / "demo" / "world" / "lars.jsonl"
TINY = "tiny"


def du(folder: Path) -> int:
    """Bytes on disk under `folder`'s entries, as du counts them (the folder itself not)."""
    return sum(os.lstat(os.path.join(here, name)).st_blocks * 512
               for here, dirs, files in os.walk(folder) for name in dirs + files)


def tiny_log(path: Path, days: range) -> Path:
    """One persona, one table, one insert a day: the smallest world that has many days."""
    lines = []
    for day in days:
        if day == 0:
            lines.append({"persona": TINY, "day": 0, "ts": "2026-01-01T00:00:00Z", "type": "sql",
                          "service": "s", "sql": "CREATE TABLE t(id INTEGER PRIMARY KEY, v)"})
        lines.append({"persona": TINY, "day": day, "ts": "2026-01-01T00:00:01Z", "type": "sql",
                      "service": "s", "sql": "INSERT INTO t(v) VALUES (?)", "params": [day]})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("cache") / "store"
    with Worlds.open(store, store.parent / "import-cache") as worlds:
        worlds.import_file(DEMO)
    return store


@pytest.fixture
def worlds(demo_store: Path, tmp_path: Path) -> Iterator[Worlds]:
    """The demo store with a cache of its own, every day cached (in day order)."""
    with Worlds.open(demo_store, tmp_path / "cache") as w:
        for record in w.store.days("lars"):
            w.snapshot("lars", record.day)
            time.sleep(0.02)  # the kernel's file clock is coarse: keep the uses apart
        yield w


def recorded(worlds: Worlds) -> dict[int, str]:
    return {r.day: r.world_hash for r in worlds.store.days("lars")}


def entry_bytes(worlds: Worlds, world_hash: str) -> int:
    return next(e.bytes for e in worlds.cache.entries() if e.world_hash == world_hash)


# --- which days are kept ----------------------------------------------------------------------


def test_days_to_keep_checkpoints_the_recent_and_the_wanted_days() -> None:
    days = [(d, 1) for d in range(5000)]
    keep = days_to_keep(days, {1234})
    assert 1234 in keep
    assert set(range(5000 - RECENT_DAYS, 5000)) <= keep
    ordered = sorted(keep)
    assert max(b - a for a, b in itertools.pairwise(ordered)) <= CHECKPOINT_DAYS
    assert len(keep) < 5000 // CHECKPOINT_DAYS + RECENT_DAYS + 2
    # Heavy days are kept more often: no gap holds CHECKPOINT_EVENTS events.
    heavy = days_to_keep([(d, CHECKPOINT_EVENTS // 2) for d in range(100)], set(), recent=0)
    assert heavy == set(range(1, 100, 2))
    assert days_to_keep(days[:5], set(), recent=0) == set()


def test_an_import_of_many_days_keeps_checkpoints_and_serves_every_day(tmp_path: Path) -> None:
    log = tiny_log(tmp_path / "tiny.jsonl", range(200))
    with Worlds.open(tmp_path / "store", tmp_path / "cache") as worlds:
        results = worlds.import_file(log)
        kept = worlds.cache.hashes()
        assert len(kept) == len(days_to_keep([(d, 1) for d in range(200)], set()))
        assert len(kept) < 30
        assert results[-1].world_hash in kept  # the next import starts from the last day
        for r in results[::17]:  # any other day is rebuilt from the checkpoint before it
            assert hash_world(worlds.snapshot(TINY, r.day)) == r.world_hash
        assert worlds.verify().ok


# --- least recently used ----------------------------------------------------------------------


def test_eviction_takes_the_least_recently_used_first(worlds: Worlds) -> None:
    days = recorded(worlds)
    for day in (5, 0, 2):  # used again: now the most recent, in this order
        worlds.snapshot("lars", day)
        time.sleep(0.02)
    order = [1, 3, 4, 6, 7, 5, 0, 2]  # least recently used first
    assert [e.world_hash for e in worlds.cache.stats().entries] == [days[d] for d in order]
    keep_last = [days[d] for d in order[-3:]]
    limit = sum(entry_bytes(worlds, h) for h in keep_last)
    report = worlds.cache_prune(limit)
    assert [e.world_hash for e in report.evicted] == [days[d] for d in order[:-3]]
    assert sorted(worlds.cache.hashes()) == sorted(keep_last)
    assert report.total_bytes <= limit
    assert report.freed_bytes == sum(e.bytes for e in report.evicted)


def test_a_mount_and_a_checkout_count_as_uses(worlds: Worlds, tmp_path: Path) -> None:
    days = recorded(worlds)
    with worlds.mount("lars@1"):
        pass
    time.sleep(0.02)
    worlds.checkout("lars@0", tmp_path / "co")
    assert [e.world_hash for e in worlds.cache.stats().entries][-2:] == [days[1], days[0]]


# --- the cap ----------------------------------------------------------------------------------


def test_the_cap_holds_after_imports_of_many_days(tmp_path: Path) -> None:
    with Worlds.open(tmp_path / "probe", tmp_path / "probe-cache") as probe:
        probe.import_file(tiny_log(tmp_path / "one.jsonl", range(1)))
        one = probe.cache.entries()[0].bytes
    cap = 6 * one
    store, cache = tmp_path / "store", tmp_path / "cache"
    for first in range(0, 400, 40):  # ten imports, each a checkpoint and 8 recent days
        log = tiny_log(tmp_path / f"d{first}.jsonl", range(first, first + 40))
        with Worlds.open(store, cache, cache_max_bytes=cap) as worlds:
            worlds.import_file(log)
            stats = worlds.cache.stats()
            assert stats.max_bytes == cap
            assert 0 < stats.total_bytes <= cap
            assert du(cache / "snapshots") == stats.total_bytes  # the count is du's
    with Worlds.open(store, cache, cache_max_bytes=cap) as worlds:
        last = worlds.store.days(TINY)[-1]
        assert hash_world(worlds.snapshot(TINY, last.day)) == last.world_hash
        for r in worlds.store.days(TINY)[::37]:
            assert hash_world(worlds.snapshot(TINY, r.day)) == r.world_hash
        assert du(cache / "snapshots") <= cap
        assert worlds.verify().ok


def test_the_cap_comes_from_the_argument_the_environment_or_the_default(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CACHE_MAX_ENV, raising=False)
    assert SnapshotCache(tmp_path / "a").max_bytes == default_max_bytes(tmp_path)
    st = os.statvfs(tmp_path)
    assert default_max_bytes(tmp_path) == min(DEFAULT_MAX_BYTES, st.f_blocks * st.f_frsize // 4)
    monkeypatch.setenv(CACHE_MAX_ENV, "1.5G")
    assert SnapshotCache(tmp_path / "b").max_bytes == 3 * 1024**3 // 2
    assert SnapshotCache(tmp_path / "c", 1234).max_bytes == 1234
    monkeypatch.setenv(CACHE_MAX_ENV, "lots")
    with pytest.raises(ConfigError, match=f"env {CACHE_MAX_ENV}: 'lots' is not a size"):
        SnapshotCache(tmp_path / "d")
    with pytest.raises(ConfigError, match="cannot be negative"):
        SnapshotCache(tmp_path / "e", -1)
    assert [parse_size(t, what="x") for t in ("0", "512", "2k", "3MiB", "1 GB", "1t")] == [
        0, 512, 2048, 3 * 1024**2, 1024**3, 1024**4]


def test_a_lost_or_garbled_total_is_counted_again(worlds: Worlds) -> None:
    total = sum(e.bytes for e in worlds.cache.entries())
    (worlds.cache.root / "usage").write_text("garbage")  # say, an old cache, or a crash
    worlds.cache.max_bytes = total * 10
    worlds.cache_prune(0)
    assert du(worlds.cache.snapshots) == 0
    assert hash_world(worlds.snapshot("lars", 7)) == recorded(worlds)[7]
    assert int((worlds.cache.root / "usage").read_text()) == du(worlds.cache.snapshots)


# --- pins -------------------------------------------------------------------------------------


def test_a_mount_pins_its_snapshot_until_it_is_closed(worlds: Worlds) -> None:
    days = recorded(worlds)
    eager = worlds.mount("lars@3")
    lazy = worlds.mount("lars@6", lazy=True)
    report = worlds.cache_prune(0)
    assert sorted(e.world_hash for e in report.pinned) == sorted([days[3], days[6]])
    assert sorted(worlds.cache.hashes()) == sorted([days[3], days[6]])
    stats = worlds.cache.stats()
    assert {e.world_hash for e in stats.pinned} == {days[3], days[6]}
    # The lazy mount still reads the snapshot's own files.
    assert lazy.read_db_path("shop").is_file() and lazy.hash() == days[6]
    eager.close()
    worlds.cache_prune(0)
    assert worlds.cache.hashes() == [days[6]]
    lazy.close()
    worlds.cache_prune(0)
    assert worlds.cache.hashes() == []


def test_an_open_environment_instance_pins_its_snapshot(worlds: Worlds) -> None:
    days = recorded(worlds)
    with Environment(worlds) as env:
        instance = env.open("lars@4")
        worlds.cache.max_bytes = 0  # every later publish evicts all it can
        worlds.cache_prune()
        assert worlds.cache.hashes() == [days[4]]
        assert instance.hash() == days[4]
        other = env.open("lars@2")  # rebuilt from the log, published under a cap of 0
        assert sorted(worlds.cache.hashes()) == sorted([days[4], days[2]])
        other.close()
        instance.close()
    worlds.cache_prune()
    assert worlds.cache.hashes() == []


def _hold_a_mount(store: str, cache: str, ref: str, ready: object, done: object) -> None:
    worlds = Worlds.open(store, cache)
    mount = worlds.mount(ref, lazy=True)
    ready.set()  # type: ignore[attr-defined]
    done.wait(60)  # type: ignore[attr-defined]
    mount.close()
    worlds.close()


def test_another_process_pins_and_its_death_unpins(worlds: Worlds) -> None:
    days = recorded(worlds)
    ctx = mp.get_context("spawn")
    ready, done = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_hold_a_mount,
                       args=(_store_of(worlds), str(worlds.cache.root), "lars@5", ready, done))
    proc.start()
    try:
        assert ready.wait(60)
        report = worlds.cache_prune(0)
        assert [e.world_hash for e in report.pinned] == [days[5]]
        assert worlds.cache.hashes() == [days[5]]
        assert worlds.cache.stats().pinned[0].world_hash == days[5]
    finally:
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)  # dies holding its pin, its mount never closed
        proc.join(30)
    report = worlds.cache_prune(0)
    assert [e.world_hash for e in report.evicted] == [days[5]]
    assert worlds.cache.hashes() == []


def _store_of(worlds: Worlds) -> str:
    """The demo store's directory (its events database's folder)."""
    return str(Path(worlds.store.url).parent)


def _mount_many(store: str, cache: str, days: dict[int, str], rounds: int, out: object) -> None:
    worlds = Worlds.open(store, cache, cache_max_bytes=0)  # every publish evicts what it can
    bad = []
    try:
        for i in range(rounds):
            day = (i * 3 + os.getpid()) % 8
            with worlds.mount(f"lars@{day}", lazy=bool(i % 2)) as m:
                if m.hash() != days[day]:
                    bad.append(day)
        out.put(("ok", bad))  # type: ignore[attr-defined]
    except Exception as exc:  # report, do not hang the parent
        out.put(("error", repr(exc)))  # type: ignore[attr-defined]
    finally:
        worlds.close()


def test_eviction_races_with_mounts_in_two_processes(worlds: Worlds) -> None:
    days = recorded(worlds)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_mount_many,
                         args=(_store_of(worlds), str(worlds.cache.root), days, 30, out))
             for _ in range(2)]
    for p in procs:
        p.start()
    results = []
    deadline = time.monotonic() + 180
    while len(results) < len(procs) and time.monotonic() < deadline:
        worlds.cache_prune(0)  # a third party evicting all the while
        try:
            results.append(out.get(timeout=0.05))
        except Exception:  # queue.Empty: not done yet
            continue
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert results == [("ok", [])] * 2, results
    for world_hash in worlds.cache.hashes():  # whatever is left is whole
        assert worlds.cache.check(world_hash) is None
    with Worlds.open(_store_of(worlds), worlds.cache.root) as fresh:
        assert list(fresh.cache.tmp.iterdir()) == []


# --- pruned to nothing ------------------------------------------------------------------------


def test_a_cache_pruned_to_nothing_serves_every_day_with_its_hash(worlds: Worlds,
                                                                  tmp_path: Path) -> None:
    days = recorded(worlds)
    worlds.cache_prune(0)
    assert worlds.cache.hashes() == [] and du(worlds.cache.snapshots) == 0
    for day in sorted(days, reverse=True):  # the latest first: nothing to start from
        worlds.cache_prune(0)
        assert hash_world(worlds.snapshot("lars", day)) == days[day]
        with worlds.mount(f"lars@{day}", lazy=True) as m:
            assert m.hash() == days[day]
        worlds.checkout(f"lars@{day}", tmp_path / f"co{day}")
        assert hash_world(tmp_path / f"co{day}") == days[day]
    worlds.cache_prune(0)
    assert worlds.diff("lars@2", "lars@3").after == days[3]
    worlds.cache_prune(0)
    assert all(r.status == "replayed" for r in worlds.replay("lars"))
    worlds.cache_prune(0)
    report = worlds.verify()
    assert report.ok, report.problems


# --- the CLI ----------------------------------------------------------------------------------


def run_cli(worlds: Worlds, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(
        cli, ["--store", _store_of(worlds), "--cache", str(worlds.cache.root), *args],
        env=env, terminal_width=200)
    return result.exit_code, result.output


def test_cli_cache_stats(worlds: Worlds) -> None:
    days = recorded(worlds)
    with worlds.mount("lars@2"):
        code, output = run_cli(worlds, "cache", "stats", "--json",
                               env={CACHE_MAX_ENV: "5G"})
        assert code == 0, output
        found = json.loads(output)
        assert found["entries"] == 8 and found["max_bytes"] == 5 * 1024**3
        assert found["total_bytes"] == du(worlds.cache.snapshots)
        assert found["pinned_entries"] == 1
        assert [s["world_hash"] for s in found["snapshots"] if s["pinned"]] == [days[2]]
        assert found["personas"] == {"lars": {"entries": 8, "bytes": found["total_bytes"]}}
        assert found["snapshots"][0]["days"] == ["lars@0"]
        assert found["oldest_use"] <= found["newest_use"]
        code, text = run_cli(worlds, "cache", "stats")
    assert code == 0, text
    assert "entries         8 (1 pinned" in text
    assert days[0] in text.splitlines()[3] and "lars@0" in text  # the oldest use
    assert "lars" in text.splitlines()[-1]


def test_cli_cache_prune(worlds: Worlds) -> None:
    days = recorded(worlds)
    size = entry_bytes(worlds, days[7]) + entry_bytes(worlds, days[6])
    code, output = run_cli(worlds, "cache", "prune", "--max-size", str(size))
    assert code == 0, output
    lines = output.splitlines()
    assert [line.split()[1] for line in lines if line.startswith("evicted ")] == [
        days[d] for d in range(6)]
    assert "lars@0" in lines[0]
    assert lines[-1].startswith("freed ")
    assert sorted(worlds.cache.hashes()) == sorted([days[6], days[7]])
    with worlds.mount("lars@7"):
        code, output = run_cli(worlds, "cache", "prune", "--max-size", "0", "--json")
    assert code == 0, output
    found = json.loads(output)
    assert [e["world_hash"] for e in found["evicted"]] == [days[6]]
    assert [e["world_hash"] for e in found["pinned_kept"]] == [days[7]]
    assert found["total_bytes"] == du(worlds.cache.snapshots)
    # The default is the cap.
    code, output = run_cli(worlds, "cache", "prune", env={CACHE_MAX_ENV: "0"})
    assert code == 0 and worlds.cache.hashes() == []
    code, output = run_cli(worlds, "verify")
    assert code == 0, output


def test_cli_refuses_a_bad_size(worlds: Worlds) -> None:
    code, output = run_cli(worlds, "cache", "prune", "--max-size", "ten")
    assert code == 2
    assert output.strip().splitlines() == [
        "error: --max-size: 'ten' is not a size (bytes, or a number with K, M, G or T, e.g. 10G)"]
    code, output = run_cli(worlds, "cache", "stats", env={CACHE_MAX_ENV: "-3"})
    assert code == 2
    assert output.strip().splitlines()[-1].startswith(f"error: env {CACHE_MAX_ENV}: '-3'")
