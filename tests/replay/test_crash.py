"""Crash safety: SIGKILL `worldctl import`, `replay` and `checkout` at many points.

The kill times are not random: one uninterrupted run is timed first, and the kills are
spread evenly from just before the command starts working (the end of Python start-up)
to the end of that run. After every kill:

* the store opens; every persona-day present is whole and has its recorded hash (the
  same as in an uninterrupted import), days that are absent are simply absent, and
  ``worldctl verify --all`` (or ``Worlds.verify``) passes;
* the snapshot cache holds no torn entry: every ``snapshots/<hash>`` re-hashes to its
  name, and opening the store sweeps away the dead process's staging directories;
* importing the same file again succeeds and ends with all days and a clean verify.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from replay.engine import Worlds
from replay.files import copy_tree
from replay.hashing import hash_world

WORLDCTL = Path(sys.executable).parent / "worldctl"
DEMO = Path(__file__).resolve().parents[2] / "packs" / "demo" / "world" / "lars.jsonl"
N_DAYS = 8


# --- running and killing worldctl -------------------------------------------------------------


def worldctl(store: str, cache: Path, *args: str) -> list[str]:
    return [str(WORLDCTL), "--store", store, "--cache", str(cache), *args]


def timed_run(argv: Sequence[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, timeout=120)
    return time.perf_counter() - started


def startup_seconds() -> float:
    """How long worldctl takes to start (import everything) before doing any work."""
    return min(timed_run([str(WORLDCTL), "--version"]) for _ in range(2))


def kill_points(startup: float, total: float, n: int) -> list[float]:
    """`n` delays spread evenly over the working part of a run that takes `total`."""
    first = 0.9 * startup  # a little before the work starts: store creation is covered too
    span = max(total - first, 0.05)
    return [first + span * (k + 0.5) / n for k in range(n)]


def run_and_kill(argv: Sequence[str], delay: float) -> int | None:
    """Start `argv`, SIGKILL it after `delay` s; its exit code if it finished first."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        return None


# --- checking what a kill left behind --------------------------------------------------------


def assert_cache_sound(cache: Path) -> None:
    """Every published entry is whole: it re-hashes to its name and has its manifest."""
    snapshots = cache / "snapshots"
    if not snapshots.is_dir():
        return
    for entry in sorted(snapshots.iterdir()):
        assert (entry / "manifest.json").is_file(), f"torn cache entry {entry}"
        assert hash_world(entry / "world") == entry.name, f"torn cache entry {entry}"


def assert_store_consistent(location: str, cache: Path, reference: list[tuple[int, str]],
                            *, cli: bool) -> int:
    """The days present are a prefix of the reference, each whole; return how many."""
    assert_cache_sound(cache)
    with Worlds.open(location, cache) as worlds:
        assert list(worlds.cache.tmp.iterdir()) == [], "the dead process's staging remains"
        days = [(r.day, r.world_hash) for r in worlds.store.days("lars")]
        assert days == reference[:len(days)]
        summaries = worlds.store.personas()
        if days:
            assert [(s.persona, s.n_days, s.last_day) for s in summaries] == \
                [("lars", len(days), days[-1][0])]
            n_events = sum(1 for _ in worlds.store.events("lars"))
            assert n_events == worlds.store.days("lars")[-1].last_seq + 1
        else:
            assert summaries == []
        if not cli:
            report = worlds.verify()
            assert report.ok, report.problems
    if cli:
        done = subprocess.run(worldctl(location, cache, "verify", "--all"),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
    assert_cache_sound(cache)  # verify re-hashed and kept only sound entries
    return len(days)


def assert_reimport_completes(location: str, cache: Path, data: Path,
                              reference: list[tuple[int, str]]) -> None:
    with Worlds.open(location, cache) as worlds:
        results = worlds.import_file(data)
        assert len(results) == N_DAYS
        assert {r.status for r in results} <= {"imported", "unchanged"}
        assert [(r.day, r.world_hash) for r in worlds.store.days("lars")] == reference
        report = worlds.verify()
        assert report.ok, report.problems
        assert report.days == N_DAYS


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[int, str]]:
    """Day hashes of an uninterrupted import of the demo."""
    root = tmp_path_factory.mktemp("reference")
    with Worlds.open(root / "store") as worlds:
        worlds.import_file(DEMO)
        days = [(r.day, r.world_hash) for r in worlds.store.days("lars")]
    assert len(days) == N_DAYS
    return days


# --- import ----------------------------------------------------------------------------------


def _kill_imports(make_location: object, tmp_path: Path, reference: list[tuple[int, str]],
                  n_kills: int, *, cli_verify: bool) -> list[int]:
    startup = startup_seconds()
    location, cache = make_location(tmp_path / "timing")  # type: ignore[operator]
    total = timed_run(worldctl(location, cache, "import", str(DEMO)))
    outcomes = []
    for k, delay in enumerate(kill_points(startup, total, n_kills)):
        location, cache = make_location(tmp_path / f"kill{k}")  # type: ignore[operator]
        run_and_kill(worldctl(location, cache, "import", str(DEMO)), delay)
        outcomes.append(assert_store_consistent(location, cache, reference, cli=cli_verify))
        assert_reimport_completes(location, cache, DEMO, reference)
    return outcomes


@pytest.mark.slow
def test_kill_import_sqlite(tmp_path: Path, reference: list[tuple[int, str]]) -> None:
    def make(root: Path) -> tuple[str, Path]:
        return str(root / "store"), root / "store" / "cache"

    outcomes = _kill_imports(make, tmp_path, reference, 12, cli_verify=True)
    print("days present after each kill:", outcomes)


def run_and_kill_when(argv: Sequence[str], ready: Callable[[], bool]) -> int | None:
    """Start `argv` and SIGKILL it as soon as `ready()` (polled) is true."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if ready():
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            return None
        time.sleep(0.001)
    return proc.wait()


def days_committed(store: Path, at_least: int) -> Callable[[], bool]:
    def ready() -> bool:
        db = store / "events.sqlite"
        if not db.exists():
            return False
        try:
            conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0.01)
            try:
                return int(conn.execute("SELECT count(*) FROM days").fetchone()[0]) >= at_least
            finally:
                conn.close()
        except sqlite3.Error:  # not created or not migrated yet
            return False
    return ready


def snapshots_published(cache: Path, at_least: int) -> Callable[[], bool]:
    def ready() -> bool:
        folder = cache / "snapshots"
        return folder.is_dir() and len(os.listdir(folder)) >= at_least
    return ready


@pytest.mark.slow
def test_kill_import_right_after_commits_and_publishes(
        tmp_path: Path, reference: list[tuple[int, str]]) -> None:
    """Time-spread kills rarely land in the short commit phase; these wait for the k-th
    day to be committed (or the k-th snapshot published) and kill at once."""
    points = [("commit", 1), ("commit", 4), ("commit", 7), ("publish", 2), ("publish", 6)]
    outcomes = []
    for what, k in points:
        store = tmp_path / f"{what}{k}" / "store"
        cache = store / "cache"
        ready = days_committed(store, k) if what == "commit" else snapshots_published(cache, k)
        run_and_kill_when(worldctl(str(store), cache, "import", str(DEMO)), ready)
        outcomes.append(assert_store_consistent(str(store), cache, reference, cli=False))
        assert_reimport_completes(str(store), cache, DEMO, reference)
    print("days present after each kill:", outcomes)
    assert outcomes[2] >= 7  # a kill never takes back a committed day


@pytest.mark.slow
def test_kill_import_postgres(tmp_path: Path, reference: list[tuple[int, str]],
                              request: pytest.FixtureRequest) -> None:
    urls: list[str] = []

    def make(root: Path) -> tuple[str, Path]:
        # A fresh database for every run: the pg_url fixture's, then new ones beside it.
        if not urls:
            urls.append(request.getfixturevalue("pg_url"))
            return urls[0], root / "cache"
        url = _fresh_database(urls[0], len(urls))
        urls.append(url)
        return url, root / "cache"

    try:
        outcomes = _kill_imports(make, tmp_path, reference, 5, cli_verify=False)
        print("days present after each kill:", outcomes)
    finally:
        for url in urls[1:]:
            _drop_database(url)


def _admin(url: str) -> object:
    import sqlalchemy as sa

    admin = url.rsplit("/", 1)[0] + "/postgres"
    return sa.create_engine(admin.replace("postgresql://", "postgresql+psycopg://", 1),
                            isolation_level="AUTOCOMMIT")


def _fresh_database(base_url: str, n: int) -> str:
    import sqlalchemy as sa

    name = f"{base_url.rsplit('/', 1)[1]}_k{n}"
    engine = _admin(base_url)
    with engine.connect() as conn:  # type: ignore[attr-defined]
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    engine.dispose()  # type: ignore[attr-defined]
    return base_url.rsplit("/", 1)[0] + "/" + name


def _drop_database(url: str) -> None:
    import sqlalchemy as sa

    engine = _admin(url)
    with engine.connect() as conn:  # type: ignore[attr-defined]
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)'))
    engine.dispose()  # type: ignore[attr-defined]


@pytest.mark.slow
def test_kill_second_import_keeps_the_first(tmp_path: Path,
                                            reference: list[tuple[int, str]]) -> None:
    """A store with days 0..4 loses nothing when an import of days 0..7 is killed."""
    lines = DEMO.read_bytes().splitlines(keepends=True)
    first_half = tmp_path / "first-half.jsonl"
    first_half.write_bytes(b"".join(line for line in lines if json.loads(line)["day"] < 5))
    store = tmp_path / "base" / "store"
    with Worlds.open(store) as worlds:
        worlds.import_file(first_half)
        assert len(worlds.store.days("lars")) == 5
    startup = startup_seconds()
    timing = tmp_path / "timing"
    copy_tree(store, timing)
    total = timed_run(worldctl(str(timing), timing / "cache", "import", str(DEMO)))
    for k, delay in enumerate(kill_points(startup, total, 4)):
        target = tmp_path / f"kill{k}"
        copy_tree(store, target)
        run_and_kill(worldctl(str(target), target / "cache", "import", str(DEMO)), delay)
        assert assert_store_consistent(str(target), target / "cache", reference,
                                       cli=False) >= 5
        assert_reimport_completes(str(target), target / "cache", DEMO, reference)


# --- replay and checkout -------------------------------------------------------------------


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("imported") / "store"
    with Worlds.open(store) as worlds:
        worlds.import_file(DEMO)
    return store


def _reset_cache(cache: Path) -> None:
    shutil.rmtree(cache, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["replay", "checkout"])
def test_kill_replay_and_checkout(imported: Path, tmp_path: Path,
                                  reference: list[tuple[int, str]], command: str) -> None:
    cache = tmp_path / "cache"

    def argv(k: int) -> list[str]:
        if command == "replay":
            return worldctl(str(imported), cache, "replay", "lars")
        return worldctl(str(imported), cache, "checkout", "lars@7", str(tmp_path / f"co{k}"))

    startup = startup_seconds()
    _reset_cache(cache)
    total = timed_run(argv(-1))
    for k, delay in enumerate(kill_points(startup, total, 6)):
        _reset_cache(cache)  # cold: the command has to build and publish snapshots
        run_and_kill(argv(k), delay)
        assert assert_store_consistent(str(imported), cache, reference, cli=False) == N_DAYS
        with Worlds.open(imported, cache) as worlds:
            record = worlds.checkout("lars@7", tmp_path / f"after{k}")
            assert hash_world(tmp_path / f"after{k}") == record.world_hash == reference[-1][1]
            if command == "replay":
                assert {r.status for r in worlds.replay("lars")} == {"replayed"}
        assert_cache_sound(cache)


# --- many processes opening a store a crash left staging in -------------------------------


def _open_store(location: str, barrier: object, out: object) -> None:
    try:
        barrier.wait()  # type: ignore[attr-defined]
        with Worlds.open(location) as worlds:
            out.put(("ok", len(worlds.store.days("lars"))))  # type: ignore[attr-defined]
    except Exception as exc:
        out.put(("error", repr(exc)))  # type: ignore[attr-defined]


def test_processes_opening_a_store_after_a_crash_all_succeed(imported: Path,
                                                            tmp_path: Path) -> None:
    """Every process sweeps dead processes' staging directories on open; when several
    start at once (workers after a crash) they must not trip over each other."""
    store = tmp_path / "store"
    copy_tree(imported, store)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid is (almost surely) not reused during this test
    tmp = store / "cache" / "tmp"
    snapshot = next((store / "cache" / "snapshots").iterdir()) / "world"
    for n in range(4):  # what a killed import leaves: big half-written staging trees
        for copy in range(15):
            copy_tree(snapshot, tmp / f"{dead.pid}-{n}" / f"w{copy}")

    ctx = mp.get_context("spawn")
    n_procs = 6
    barrier = ctx.Barrier(n_procs)
    out = ctx.Queue()
    procs = [ctx.Process(target=_open_store, args=(str(store), barrier, out))
             for _ in range(n_procs)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert results == [("ok", N_DAYS)] * n_procs
    assert list(tmp.iterdir()) == []
