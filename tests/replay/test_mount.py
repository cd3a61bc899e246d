"""Mounted instances of the demo world: isolation, diff, exact reset, many at once.

Everything is real: the demo log imported into an embedded store, writes through apsw
and the standard library's sqlite3, plain file operations, threads and spawned processes.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import apsw
import pytest

from replay.cache import SnapshotCache
from replay.engine import Worlds
from replay.errors import WorldDirError
from replay.hashing import hash_world
from replay.mount import Mount
from worldstore.errors import WorldError

DEMO = Path(__file__).resolve().parents[2] / "packs" / "demo" / "world" / "lars.jsonl"
REF = "lars@5"
SENTINEL_NS = 1_000_000_000  # the mtime replay/mount.py pins on every copied file


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("mount") / "store"
    with Worlds.open(store) as worlds:
        worlds.import_file(DEMO)
    return store


@pytest.fixture
def worlds(demo_store: Path) -> Iterator[Worlds]:
    with Worlds.open(demo_store) as w:
        yield w


@pytest.fixture
def recorded(worlds: Worlds) -> str:
    return worlds.resolve(REF).world_hash


@pytest.fixture
def mount(worlds: Worlds) -> Iterator[Mount]:
    with worlds.mount(REF) as m:
        yield m


def tree(root: Path) -> dict[str, bytes | str | None]:
    """Every entry below `root`: file bytes, link target, or None for a directory."""
    found: dict[str, bytes | str | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        for name in dirnames + filenames:
            path = here / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                found[rel] = os.readlink(path)
            elif path.is_dir():
                found[rel] = None
            else:
                found[rel] = path.read_bytes()
    return found


# --- basics -----------------------------------------------------------------------------------


def test_mount_hash_equals_recorded(mount: Mount, recorded: str) -> None:
    assert mount.hash() == recorded
    assert hash_world(mount.path) == recorded
    assert mount.services == ["calendar", "chat", "notes", "shop"]
    assert mount.db_path("chat").is_file()
    assert (mount.workspace / "jobs" / "nordlys" / "bom.md").is_file()
    assert tree(mount.path) == tree(mount.snapshot)


def test_mount_by_hash_and_by_negative_day(worlds: Worlds, recorded: str) -> None:
    with worlds.mount(recorded) as by_hash, worlds.mount("lars@-3") as by_offset:
        assert by_hash.hash() == recorded
        assert by_offset.hash() == recorded  # lars has days 0..7: -3 is day 5


def test_mount_into_given_directory(worlds: Worlds, recorded: str, tmp_path: Path) -> None:
    with worlds.mount(REF, tmp_path / "inst") as m:
        assert m.path == tmp_path / "inst"
        assert m.hash() == recorded
    assert not (tmp_path / "inst").exists()
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    with pytest.raises(WorldError, match="not empty"):
        worlds.mount(REF, tmp_path / "busy")


def test_writes_change_the_hash_and_diff_names_row_and_file(mount: Mount,
                                                            recorded: str) -> None:
    conn = apsw.Connection(str(mount.db_path("chat")))
    conn.execute("UPDATE messages SET body = ? WHERE id = 29", ("Approved, but NOK 1.00",))
    conn.close()
    after_db = mount.hash()
    assert after_db != recorded
    with sqlite3.connect(mount.db_path("shop")) as conn3:
        conn3.execute("DELETE FROM order_items WHERE id = 4")
    (mount.workspace / "jobs" / "nordlys" / "bom.md").write_text("emptied\n")
    (mount.workspace / "scratch.txt").write_text("agent notes\n")
    (mount.workspace / "docs" / "rates.md").unlink()
    assert mount.hash() not in (recorded, after_db)

    diff = mount.diff()
    tables = {(t.service, t.table): t for t in diff.tables}
    assert set(tables) == {("chat", "messages"), ("shop", "order_items")}
    messages = tables[("chat", "messages")]
    assert messages.changed == 1 and messages.added == 0 and messages.removed == 0
    row = messages.rows[0]
    assert row.change == "changed" and row.key == {"id": 29} and row.columns == ["body"]
    assert row.after is not None and row.after["body"] == "Approved, but NOK 1.00"
    items = tables[("shop", "order_items")]
    assert items.removed == 1 and items.rows[0].key == {"id": 4}
    files = {f.path: f.change for f in diff.files}
    assert files == {"jobs/nordlys/bom.md": "changed", "scratch.txt": "added",
                     "docs/rates.md": "removed"}
    bom = next(f for f in diff.files if f.path == "jobs/nordlys/bom.md")
    assert bom.text_diff and "+emptied" in bom.text_diff
    assert diff.before == recorded and diff.after == mount.hash()

    mount.reset()
    assert mount.hash() == recorded
    assert mount.diff().empty


# --- reset ------------------------------------------------------------------------------------


def _sql(service: str, statement: str) -> Callable[[Mount], None]:
    def change(m: Mount) -> None:
        conn = sqlite3.connect(m.db_path(service))
        with conn:
            conn.execute(statement)
        conn.close()
    return change


def _wal_write(m: Mount) -> None:
    conn = sqlite3.connect(m.db_path("notes"))
    conn.execute("PRAGMA journal_mode = WAL")
    with conn:
        conn.execute("DELETE FROM note_tags")
    conn.close()


def _same_size_rewrite_then_utime(m: Mount) -> None:
    """Rewrite bytes in place, same size, and put mtime back: only ctime can tell."""
    path = m.workspace / "inventory" / "gear.csv"
    data = bytearray(path.read_bytes())
    data[0] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(SENTINEL_NS, SENTINEL_NS))


def _db_write_then_utime(m: Mount) -> None:
    _sql("shop", "UPDATE products SET price_cents = price_cents + 1")(m)
    os.utime(m.db_path("shop"), ns=(SENTINEL_NS, SENTINEL_NS))


def _size_only(m: Mount) -> None:
    path = m.workspace / "docs" / "rates.md"
    os.truncate(path, path.stat().st_size - 1)
    os.utime(path, ns=(SENTINEL_NS, SENTINEL_NS))


def _recreate_same_size_file(m: Mount) -> None:
    """Delete and write a new file of the same size (maybe the same inode number)."""
    path = m.workspace / "docs" / "rates.md"
    size = path.stat().st_size
    path.unlink()
    path.write_bytes(b"#" * size)
    os.utime(path, ns=(SENTINEL_NS, SENTINEL_NS))


def _file_to_dir(m: Mount) -> None:
    path = m.workspace / "docs" / "rates.md"
    path.unlink()
    (path / "inner").mkdir(parents=True)
    (path / "inner" / "f.txt").write_text("x")


def _dir_to_file(m: Mount) -> None:
    folder = m.workspace / "jobs" / "nordlys"
    shutil.rmtree(folder)
    folder.write_text("now a file")


def _new_files_and_dirs(m: Mount) -> None:
    (m.workspace / "new" / "deep" / "er").mkdir(parents=True)
    (m.workspace / "new" / "deep" / "f.txt").write_text("new")
    (m.workspace / "empty-dir").mkdir()
    (m.workspace / "jobs" / "nordlys" / "extra.md").write_text("extra")


def _new_service(m: Mount) -> None:
    (m.path / "services").mkdir(exist_ok=True)  # a lazy mount makes it on first use
    conn = sqlite3.connect(m.path / "services" / "extra.sqlite")
    conn.execute("CREATE TABLE t(x)")
    conn.close()


def _stray_top_level(m: Mount) -> None:
    (m.path / "stray.txt").write_text("x")
    (m.path / "stray-dir").mkdir()


def _symlinks(m: Mount) -> None:
    os.symlink("inventory/gear.csv", m.workspace / "link")
    rates = m.workspace / "docs" / "rates.md"
    rates.unlink()
    os.symlink("../inventory/gear.csv", rates)


def _rename(m: Mount) -> None:
    os.rename(m.workspace / "docs" / "rates.md", m.workspace / "docs" / "rates-old.md")


def _chmod(m: Mount) -> None:
    os.chmod(m.workspace / "docs" / "rates.md", 0o600)


def _delete_everything(m: Mount) -> None:
    m.ensure_all()  # a lazy mount: copy everything first, then delete it all
    shutil.rmtree(m.workspace)
    shutil.rmtree(m.path / "services")


MODIFICATIONS: dict[str, Callable[[Mount], None]] = {
    "db_update_sqlite3": _sql("chat", "UPDATE messages SET is_read = 1 - is_read"),
    "db_schema_change": _sql("calendar", "CREATE TABLE agent_notes(x)"),
    "db_truncated": lambda m: os.truncate(m.db_path("shop"), 0),
    "db_half_truncated": lambda m: os.truncate(m.db_path("chat"),
                                               m.db_path("chat").stat().st_size // 2),
    "db_deleted": lambda m: m.db_path("notes").unlink(),
    "db_wal_write": _wal_write,
    "db_write_then_utime": _db_write_then_utime,
    "file_append": lambda m: (m.workspace / "inventory" / "gear.csv").open("a").write("x\n"),
    "file_deleted": lambda m: (m.workspace / "docs" / "rates.md").unlink(),
    "file_same_size_then_utime": _same_size_rewrite_then_utime,
    "file_size_only_then_utime": _size_only,
    "file_recreated_same_size": _recreate_same_size_file,
    "file_replaced_by_dir": _file_to_dir,
    "dir_replaced_by_file": _dir_to_file,
    "new_files_and_dirs": _new_files_and_dirs,
    "new_service_db": _new_service,
    "stray_top_level_entries": _stray_top_level,
    "symlinks": _symlinks,
    "rename": _rename,
    "chmod_only": _chmod,
    "everything_deleted": _delete_everything,
}
# Modifications that leave the content (and so the hash) as it was.
SAME_CONTENT = {"chmod_only"}


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
@pytest.mark.parametrize("full", [False, True], ids=["reset", "full_reset"])
@pytest.mark.parametrize("name", sorted(MODIFICATIONS))
def test_reset_restores_the_exact_world(worlds: Worlds, recorded: str, name: str,
                                        full: bool, lazy: bool) -> None:
    with worlds.mount(REF, lazy=lazy) as m:
        original = tree(m.snapshot)
        for _round in range(2):  # a reset instance must reset again just as well
            MODIFICATIONS[name](m)
            if name == "stray_top_level_entries":
                with pytest.raises(WorldDirError, match="stray"):
                    m.hash()
            elif name == "db_half_truncated":
                with pytest.raises(WorldDirError, match=r"chat\.sqlite"):
                    m.hash()
            elif name not in SAME_CONTENT:
                assert m.hash() != recorded
            m.reset(full=full)
            assert m.hash() == recorded
            assert tree(m.path) == original  # no leftovers: files, dirs and links as before
            for rel, value in original.items():
                if isinstance(value, bytes):
                    mode = os.stat(m.path / rel).st_mode
                    assert mode & 0o200, f"{rel} is not writable after reset"


def test_lazy_mount_copies_each_part_on_first_use(worlds: Worlds, recorded: str) -> None:
    with worlds.mount(REF, lazy=True) as m:
        assert list(m.path.iterdir()) == []
        assert m.read_db_path("chat") == m.snapshot / "services" / "chat.sqlite"
        _sql("chat", "UPDATE messages SET is_read = 1 - is_read")(m)
        assert m.read_db_path("chat") == m.path / "services" / "chat.sqlite"
        assert sorted(p.name for p in (m.path / "services").iterdir()) == ["chat.sqlite"]
        assert not (m.path / "workspace").exists()
        m.reset()  # the changed part is dropped, not copied back
        assert not any((m.path / "services").iterdir())
        assert m.read_db_path("chat") == m.snapshot / "services" / "chat.sqlite"
        (m.workspace / "docs" / "rates.md").write_text("changed")
        assert m.hash() != recorded
        m.reset()
        assert m.hash() == recorded
        untouched = os.stat(m.db_path("calendar")).st_ino
        m.reset()  # untouched parts stay copied
        assert os.stat(m.db_path("calendar")).st_ino == untouched


def test_reset_keeps_untouched_files(mount: Mount) -> None:
    """A plain reset re-copies only what changed (the stamp check), and still restores."""
    untouched = mount.db_path("calendar")
    inode = os.stat(untouched).st_ino
    _sql("chat", "DELETE FROM messages")(mount)
    mount.reset()
    assert os.stat(untouched).st_ino == inode
    mount.reset(full=True)
    assert mount.hash() == mount.world_hash


def test_close_is_idempotent_and_final(worlds: Worlds) -> None:
    m = worlds.mount(REF)
    path = m.path
    m.close()
    assert not path.exists()
    m.close()  # twice is fine
    for call in (m.hash, m.diff, m.reset, lambda: m.reset(full=True)):
        with pytest.raises(RuntimeError, match="closed"):
            call()
    assert not path.exists()  # nothing was recreated by the refused calls


def test_context_manager_closes_even_on_error(worlds: Worlds) -> None:
    with pytest.raises(ZeroDivisionError), worlds.mount(REF) as m:
        path = m.path
        raise ZeroDivisionError
    assert not path.exists()


# --- isolation and no hardlinks ---------------------------------------------------------------


def test_instances_never_share_inodes(worlds: Worlds) -> None:
    with worlds.mount(REF) as a, worlds.mount(REF) as b:
        for rel, _value in ((r, v) for r, v in tree(a.snapshot).items() if isinstance(v, bytes)):
            snap = os.lstat(a.snapshot / rel)
            inodes = {snap.st_ino}
            for inst in (a, b):
                st = os.lstat(inst.path / rel)
                assert st.st_nlink == 1, rel
                inodes.add(st.st_ino)
            assert len(inodes) == 3, rel
            assert snap.st_nlink == 1
        # Writing one instance leaves the other and the snapshot alone.
        _sql("shop", "DELETE FROM products")(a)
        assert b.hash() == a.world_hash
        assert hash_world(a.snapshot) == a.world_hash
        assert a.hash() != a.world_hash


def _change(i: int) -> Callable[[Mount], None]:
    """A different change for each instance: a row, a file, sometimes a deletion."""
    def change(m: Mount) -> None:
        conn = apsw.Connection(str(m.db_path("shop")))
        conn.execute("UPDATE products SET price_cents = ? WHERE id = ?", (100_000 + i, 1 + i % 5))
        conn.close()
        (m.workspace / "agent" / f"{i % 7}").mkdir(parents=True, exist_ok=True)
        (m.workspace / "agent" / f"{i % 7}" / "out.txt").write_text(f"instance {i}\n")
        if i % 3 == 0:
            (m.workspace / "docs" / "rates.md").unlink()
    return change


N_INSTANCES = 200


def test_hundreds_of_instances_in_threads_do_not_cross_talk(worlds: Worlds,
                                                           recorded: str) -> None:
    # What each change gives on its own, on one fresh instance reset in between.
    expected = []
    with worlds.mount(REF) as fresh:
        for i in range(N_INSTANCES):
            _change(i)(fresh)
            expected.append(fresh.hash())
            fresh.reset()
            assert fresh.hash() == recorded
    assert len(set(expected)) == N_INSTANCES

    def run(i: int) -> tuple[Mount, str]:
        m = worlds.mount(REF)
        _change(i)(m)
        return m, m.hash()

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(run, range(N_INSTANCES)))
    try:
        assert len({m.path for m, _ in results}) == N_INSTANCES
        # Hashed right after its own change, and again after every other instance wrote.
        for i, (m, first) in enumerate(results):
            assert first == expected[i], i
            assert m.hash() == expected[i], i
        # Resetting half of them in threads touches only those.
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda r: r[0].reset(), results[::2]))
        for i, (m, _) in enumerate(results):
            assert m.hash() == (recorded if i % 2 == 0 else expected[i]), i
    finally:
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda r: r[0].close(), results))
    assert all(not m.path.exists() for m, _ in results)
    assert hash_world(worlds.snapshot("lars", 5)) == recorded


def test_threads_mount_every_day_from_a_cold_cache(demo_store: Path, tmp_path: Path) -> None:
    with Worlds.open(demo_store, tmp_path / "cold") as worlds:
        recorded_days = {r.day: r.world_hash for r in worlds.store.days("lars")}

        def run(i: int) -> tuple[int, str]:
            with worlds.mount(f"lars@{i % 8}") as m:
                return i % 8, m.hash()

        with ThreadPoolExecutor(max_workers=8) as pool:
            results = list(pool.map(run, range(24)))
        assert all(h == recorded_days[day] for day, h in results), results
        assert sorted(worlds.cache.hashes()) == sorted(recorded_days.values())
        assert all(worlds.cache.check(h) is None for h in worlds.cache.hashes())
        assert list(worlds.cache.tmp.iterdir()) == []


# --- several processes, cold cache ------------------------------------------------------------


def _mount_in_process(store: str, cache: str, ref: str, barrier: object,
                      out: object) -> None:
    worlds = Worlds.open(store, cache)
    barrier.wait()  # type: ignore[attr-defined]
    try:
        with worlds.mount(ref) as m:
            links = {os.lstat(p).st_nlink for p in m.path.rglob("*") if p.is_file()}
            out.put((os.getpid(), m.hash(), sorted(links)))  # type: ignore[attr-defined]
    except Exception as exc:  # report, do not hang the parent
        out.put((os.getpid(), f"error: {exc!r}", []))  # type: ignore[attr-defined]
    finally:
        worlds.close()


def test_processes_mount_from_a_cold_cache_at_once(demo_store: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cold-cache"
    with Worlds.open(demo_store, cache) as worlds:
        recorded = worlds.resolve(REF).world_hash
        days = {r.day: r.world_hash for r in worlds.store.days("lars")}
    assert not (cache / "snapshots").exists() or not any((cache / "snapshots").iterdir())

    n = 5
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(n)
    out = ctx.Queue()
    procs = [ctx.Process(target=_mount_in_process,
                         args=(str(demo_store), str(cache), REF, barrier, out))
             for _ in range(n)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert [r[1] for r in results] == [recorded] * n, results
    assert all(r[2] == [1] for r in results), results

    snapshots = SnapshotCache(cache)
    present = snapshots.hashes()
    assert recorded in present
    assert set(present) <= set(days.values())
    for world_hash in present:  # every entry is whole and re-hashes to its name
        assert snapshots.check(world_hash) is None
        assert hash_world(snapshots.entry(world_hash) / "world") == world_hash
        assert (snapshots.entry(world_hash) / "manifest.json").is_file()
    assert list(snapshots.tmp.iterdir()) == []  # no staging or instance left behind


# --- an agent killed in the middle of writing -------------------------------------------------

_KILLED_WRITER = """
import os, signal, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA cache_size = 10")  # spill pages into the file before commit
if sys.argv[2] == "wal":
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("UPDATE products SET price_cents = 7")  # committed, but only in the WAL
conn.execute("BEGIN")
conn.execute("CREATE TABLE big(x)")
for _ in range(3000):
    conn.execute("INSERT INTO big VALUES (zeroblob(2000))")
conn.execute("UPDATE products SET price_cents = 0")
os.kill(os.getpid(), signal.SIGKILL)  # dies holding the transaction
"""


@pytest.mark.parametrize("mode", ["rollback_journal", "wal"])
def test_hash_and_diff_after_a_writer_was_killed_mid_transaction(worlds: Worlds, recorded: str,
                                                                 mode: str) -> None:
    """An agent killed mid-transaction leaves a hot journal (or a WAL). Any SQLite client
    opening the database rolls the transaction back (or reads the WAL); the instance's hash
    and diff must see that same database, not fail on it."""
    import subprocess
    import sys

    with worlds.mount(REF) as m:
        db = m.db_path("shop")
        subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(db), mode], check=False)
        assert any(p.name.startswith("shop.sqlite-") for p in db.parent.iterdir())
        if mode == "wal":
            with worlds.mount(REF) as fresh:
                _sql("shop", "UPDATE products SET price_cents = 7")(fresh)
                expected = fresh.hash()
        else:
            expected = recorded
        assert m.hash() == expected
        diff = m.diff()
        changed = {(t.service, t.table) for t in diff.tables}
        assert changed == (set() if mode != "wal" else {("shop", "products")})
        m.reset()
        assert m.hash() == recorded
        assert sorted(p.name for p in db.parent.iterdir()) == [
            "calendar.sqlite", "chat.sqlite", "notes.sqlite", "shop.sqlite"]


def test_diff_sees_a_storage_class_change(tmp_path: Path) -> None:
    """1 -> 1.0 in an untyped column changes the hash, so the diff must name the row."""
    import sqlite3

    from replay.diff import diff_worlds
    from replay.hashing import world_manifest

    worlds = []
    for value in (1, 1.0):
        root = tmp_path / f"w{value!r}"
        (root / "services").mkdir(parents=True)
        (root / "workspace").mkdir()
        conn = sqlite3.connect(root / "services" / "app.sqlite")
        conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")
        conn.execute("CREATE TABLE bag(v)")
        conn.execute("INSERT INTO t VALUES (1, ?)", (value,))
        conn.execute("INSERT INTO bag VALUES (?)", (value,))
        conn.commit()
        conn.close()
        worlds.append((root, world_manifest(root)))
    (a_root, a), (b_root, b) = worlds
    assert a.world_hash() != b.world_hash()
    d = diff_worlds(a_root, a, b_root, b)
    by_table = {t.table: t for t in d.tables}
    assert by_table["t"].changed == 1 and by_table["t"].rows[0].columns == ["v"]
    assert (by_table["bag"].added, by_table["bag"].removed) == (1, 1)
