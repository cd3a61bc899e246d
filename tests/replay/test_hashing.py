"""Unit tests for replay/hashing.py: the logical, history-independent world hash.

Worlds are built by hand with the standard library's sqlite3 (a different SQLite build
than the apsw one the product uses), so these tests also show that the hash depends on
content only, never on which library or which history wrote the bytes.
"""

from __future__ import annotations

import itertools
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from replay.engine import Worlds
from replay.errors import WorldDirError
from replay.hashing import (
    ROW_CHUNK,
    decode_manifest,
    encode_manifest,
    hash_world,
    table_digest,
    table_infos,
    world_manifest,
)
from replay.rehash import _read_all
from replay.sqlite import open_readonly

WORLDCTL = Path(sys.executable).parent / "worldctl"


# --- helpers -------------------------------------------------------------------------


def make_world(root: Path, services: dict[str, Sequence[tuple[str, Sequence[Any]]]] | None = None,
               files: dict[str, bytes] | None = None) -> Path:
    """A world directory: each service runs its (sql, params) statements in order."""
    if root.exists():
        shutil.rmtree(root)
    (root / "services").mkdir(parents=True)
    (root / "workspace").mkdir()
    for service, statements in (services or {}).items():
        conn = sqlite3.connect(root / "services" / f"{service}.sqlite")
        for sql, params in statements:
            conn.execute(sql, params)
        conn.commit()
        conn.close()
    for rel, data in (files or {}).items():
        path = root / "workspace" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def table_world(root: Path, create: str, rows: Iterable[Sequence[Any]]) -> str:
    """Hash of a world with one service holding one table filled with `rows` in order."""
    rows = list(rows)
    marks = ", ".join("?" * len(rows[0])) if rows else ""
    statements = [(create, ())] + [(f"INSERT INTO t VALUES ({marks})", r) for r in rows]
    return hash_world(make_world(root, {"svc": statements}))


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    demo = Path(__file__).resolve().parents[2] / "packs" / "demo" / "world" / "lars.jsonl"
    store = tmp_path_factory.mktemp("hashing") / "store"
    with Worlds.open(store) as worlds:
        worlds.import_file(demo)
    return store


# --- the hash of real worlds ------------------------------------------------------------


@pytest.mark.parametrize("day", [0, 3, 7])
def test_checkout_hash_equals_recorded_hash(demo_store: Path, tmp_path: Path, day: int) -> None:
    with Worlds.open(demo_store) as worlds:
        record = worlds.checkout(f"lars@{day}", tmp_path / "w")
        assert hash_world(tmp_path / "w") == record.world_hash
        # The manifest stored with the day is the manifest of the checkout.
        assert world_manifest(tmp_path / "w") == worlds.manifest(record)
        assert worlds.manifest(record).world_hash() == record.world_hash


def test_days_have_distinct_hashes(demo_store: Path) -> None:
    with Worlds.open(demo_store) as worlds:
        hashes = [r.world_hash for r in worlds.store.days("lars")]
    assert len(hashes) == 8
    assert len(set(hashes)) == 8


def test_worldctl_hash_prints_hash_world(demo_store: Path, tmp_path: Path) -> None:
    with Worlds.open(demo_store) as worlds:
        record = worlds.checkout("lars@4", tmp_path / "w")
    plain = subprocess.run([str(WORLDCTL), "hash", str(tmp_path / "w")], capture_output=True,
                           text=True, check=True)
    assert plain.stdout.strip().splitlines()[-1] == record.world_hash
    as_json = subprocess.run([str(WORLDCTL), "hash", "--json", str(tmp_path / "w")],
                             capture_output=True, check=True)
    data = msgspec.json.decode(as_json.stdout)
    assert data["world_hash"] == hash_world(tmp_path / "w") == record.world_hash
    assert set(data["manifest"]["services"]) == {"calendar", "chat", "notes", "shop"}


def test_worldctl_hash_refuses_a_non_world(tmp_path: Path) -> None:
    (tmp_path / "w" / "services").mkdir(parents=True)
    (tmp_path / "w" / "stray.txt").write_text("x")
    done = subprocess.run([str(WORLDCTL), "hash", str(tmp_path / "w")], capture_output=True,
                          text=True)
    assert done.returncode == 2
    assert "stray.txt" in done.stderr


def test_manifest_encoding_round_trips(demo_store: Path, tmp_path: Path) -> None:
    with Worlds.open(demo_store) as worlds:
        worlds.checkout("lars@7", tmp_path / "w")
    manifest = world_manifest(tmp_path / "w")
    again = decode_manifest(encode_manifest(manifest))
    assert again == manifest
    assert again.world_hash() == manifest.world_hash()


def test_empty_world_and_missing_folders(tmp_path: Path) -> None:
    empty = make_world(tmp_path / "a")
    bare = tmp_path / "b"
    bare.mkdir()
    # A world with no services and no files is the same world with or without the folders.
    assert hash_world(empty) == hash_world(bare)
    assert world_manifest(bare).services == {} and world_manifest(bare).files == {}


# --- values: types, NUL, unicode --------------------------------------------------------


def test_int_real_text_blob_null_all_differ(tmp_path: Path) -> None:
    # A column without declared type keeps every storage class as written.
    values: list[Any] = [1, 1.0, "1", b"1", None]
    hashes = [table_world(tmp_path / f"w{i}", "CREATE TABLE t(id INTEGER PRIMARY KEY, v)",
                          [(1, v)]) for i, v in enumerate(values)]
    assert len(set(hashes)) == len(values), dict(zip(map(repr, values), hashes, strict=True))


def test_nul_in_text_matters(tmp_path: Path) -> None:
    variants = ["a", "a\x00", "a\x00b", "a\x00c", "\x00a"]
    hashes = [table_world(tmp_path / f"w{i}", "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)",
                          [(1, v)]) for i, v in enumerate(variants)]
    assert len(set(hashes)) == len(variants)


def test_nul_and_unicode_in_file_contents_matter(tmp_path: Path) -> None:
    contents = [b"abc", b"abc\x00", b"ab\x00c", "æøå 🌍".encode(), "æøå 🌎".encode(), b""]
    hashes = [hash_world(make_world(tmp_path / f"w{i}", files={"f.txt": c}))
              for i, c in enumerate(contents)]
    assert len(set(hashes)) == len(contents)


def test_unicode_text_is_hashed_by_value(tmp_path: Path) -> None:
    create = "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)"
    composed = table_world(tmp_path / "a", create, [(1, "\u00e9")])  # é as one code point
    decomposed = table_world(tmp_path / "b", create, [(1, "e\u0301")])  # e + combining acute
    again = table_world(tmp_path / "c", create, [(1, "\u00e9")])
    assert composed == again
    assert composed != decomposed  # no normalisation: different strings, different worlds


def test_large_integers_and_reals_are_exact(tmp_path: Path) -> None:
    create = "CREATE TABLE t(id INTEGER PRIMARY KEY, v)"
    values = [2**62, 2**62 + 1, 2**63 - 1, -(2**63), 0.1, 0.1 + 2**-56, 1e300]
    hashes = [table_world(tmp_path / f"w{i}", create, [(1, v)]) for i, v in enumerate(values)]
    assert len(set(hashes)) == len(values)


# --- history independence inside one table ---------------------------------------------


def test_rows_with_pk_hash_the_same_in_any_insertion_order(tmp_path: Path) -> None:
    create = "CREATE TABLE t(id INTEGER PRIMARY KEY, v)"
    rows = [(3, "c"), (1, None), (2, b"\x00"), (10, 1.5)]
    hashes = {table_world(tmp_path / f"w{i}", create, perm)
              for i, perm in enumerate(itertools.permutations(rows))}
    assert len(hashes) == 1


NO_PK_ROWS: list[tuple[Any, ...]] = [
    (1, "x"), (1, "x"), (None, "x"), ("1", "x"), (b"1", "x"), (2.5, None), ("a\x00b", "y"),
    ("a\x00c", "y"), ("A", "y"), ("a", "y"),
]


@pytest.mark.parametrize("create", [
    "CREATE TABLE t(a, b)",
    "CREATE TABLE t(a TEXT COLLATE NOCASE, b)",  # a declared collation must not reorder
    "CREATE TABLE t(a PRIMARY KEY, b)",  # a non-integer key admits NULLs: not a total order
])
def test_tables_without_total_order_key_ignore_insertion_order(tmp_path: Path,
                                                               create: str) -> None:
    rows = NO_PK_ROWS if "PRIMARY KEY" not in create else list(dict.fromkeys(
        r for r in NO_PK_ROWS if r[0] is None or r[0] not in (1, "1")))
    orders = [rows, list(reversed(rows)), rows[1::2] + rows[::2], sorted(rows, key=repr)]
    hashes = {table_world(tmp_path / f"w{i}", create, order) for i, order in enumerate(orders)}
    assert len(hashes) == 1


def test_tables_without_pk_count_duplicates(tmp_path: Path) -> None:
    create = "CREATE TABLE t(a, b)"
    once = table_world(tmp_path / "a", create, [(1, "x"), (2, "y")])
    twice = table_world(tmp_path / "b", create, [(1, "x"), (1, "x"), (2, "y")])
    assert once != twice


def test_no_pk_rows_equal_for_sqlite_but_not_identical_ignore_insertion_order(
        tmp_path: Path) -> None:
    """Integer 1 and real 1.0 compare equal in SQL, so ORDER BY alone leaves them tied and
    they come out in insertion order; the hash must not depend on that order."""
    create = "CREATE TABLE t(a, b)"
    int_first = table_world(tmp_path / "a", create, [(1, "x"), (1.0, "x")])
    real_first = table_world(tmp_path / "b", create, [(1.0, "x"), (1, "x")])
    assert int_first == real_first


def test_no_pk_negative_zero_ignores_insertion_order(tmp_path: Path) -> None:
    """-0.0 and 0.0 are stored apart and hashed apart, but compare equal in SQL."""
    create = "CREATE TABLE t(a, b)"
    neg_first = table_world(tmp_path / "a", create, [(-0.0, "x"), (0.0, "x")])
    pos_first = table_world(tmp_path / "b", create, [(0.0, "x"), (-0.0, "x")])
    only_pos = table_world(tmp_path / "c", create, [(0.0, "x"), (0.0, "x")])
    assert neg_first == pos_first
    assert neg_first != only_pos


def test_without_rowid_table_is_ordered_by_its_key(tmp_path: Path) -> None:
    create = "CREATE TABLE t(k TEXT PRIMARY KEY, v) WITHOUT ROWID"
    rows = [("b", 1), ("a", 2), ("c\x00", 3), ("c", 4)]
    hashes = {table_world(tmp_path / f"w{i}", create, order)
              for i, order in enumerate([rows, rows[::-1], rows[2:] + rows[:2]])}
    assert len(hashes) == 1


# --- schema -----------------------------------------------------------------------------


def test_table_creation_order_does_not_matter(tmp_path: Path) -> None:
    tables = [f"CREATE TABLE t{i}(id INTEGER PRIMARY KEY, v)" for i in range(4)]
    index = ("CREATE INDEX t1_v ON t1(v)", ())
    forward = [(sql, ()) for sql in tables] + [index]
    backward = [(sql, ()) for sql in reversed(tables)] + [index]
    a = hash_world(make_world(tmp_path / "a", {"s": forward}))
    b = hash_world(make_world(tmp_path / "b", {"s": backward}))
    assert a == b


@pytest.mark.parametrize("extra", [
    "CREATE INDEX t_v ON t(v)",
    "CREATE VIEW vw AS SELECT * FROM t",
    "CREATE TRIGGER tr AFTER INSERT ON t BEGIN SELECT 1; END",
    "PRAGMA user_version = 7",
    "PRAGMA application_id = 42",
    "CREATE TABLE u(id INTEGER PRIMARY KEY)",
])
def test_schema_and_header_changes_change_the_hash(tmp_path: Path, extra: str) -> None:
    base = [("CREATE TABLE t(id INTEGER PRIMARY KEY, v)", ()), ("INSERT INTO t VALUES (1, 2)", ())]
    a = hash_world(make_world(tmp_path / "a", {"s": base}))
    b = hash_world(make_world(tmp_path / "b", {"s": [*base, (extra, ())]}))
    assert a != b


@pytest.mark.parametrize("rows", [0, 1, ROW_CHUNK, ROW_CHUNK + 1, 2 * ROW_CHUNK + 5])
def test_digest_of_held_rows_is_the_table_digest(tmp_path: Path, rows: int) -> None:
    """Per-day hashing digests a table from the rows it holds (``replay.rehash._Rows``,
    runs of joined encodings): the same bytes as reading it, in chunks of ROW_CHUNK rows
    (none for an empty table)."""
    world = make_world(tmp_path / "w", {"s": [
        ("CREATE TABLE t(id INTEGER PRIMARY KEY, v)", ()),
        *((f"INSERT INTO t VALUES ({i}, ?)", (f"row {i}",)) for i in range(rows)),
    ]})
    with open_readonly(world / "services" / "s.sqlite") as conn:
        (info,) = table_infos(conn)
        assert _read_all(conn, info).digest() == table_digest(conn, info)


def test_empty_service_database_counts(tmp_path: Path) -> None:
    a = hash_world(make_world(tmp_path / "a"))
    b = hash_world(make_world(tmp_path / "b", {"s": [("PRAGMA user_version = 0", ())]}))
    assert (tmp_path / "b" / "services" / "s.sqlite").exists()
    assert a != b


def test_sidecar_files_are_not_services(tmp_path: Path) -> None:
    world = make_world(tmp_path / "w", {"s": [("CREATE TABLE t(a)", ())]})
    before = hash_world(world)
    (world / "services" / "s.sqlite-journal").write_bytes(b"")
    assert hash_world(world) == before


# --- refusing what is not a world ----------------------------------------------------


@pytest.mark.parametrize("entry", ["notes.txt", ".hidden", "services2"])
def test_unexpected_top_level_entry_is_refused_by_name(tmp_path: Path, entry: str) -> None:
    world = make_world(tmp_path / "w", files={"a.txt": b"a"})
    if entry == "services2":
        (world / entry).mkdir()
    else:
        (world / entry).write_text("x")
    with pytest.raises(WorldDirError) as info:
        hash_world(world)
    assert entry in str(info.value)


def test_stray_file_in_services_is_refused_by_name(tmp_path: Path) -> None:
    world = make_world(tmp_path / "w")
    (world / "services" / "README").write_text("x")
    with pytest.raises(WorldDirError, match="README"):
        hash_world(world)


@pytest.mark.parametrize("damage", ["half", "garbage"])
def test_unreadable_database_is_refused_by_name(tmp_path: Path, damage: str) -> None:
    statements = [("CREATE TABLE t(id INTEGER PRIMARY KEY, v)", ())] + [
        ("INSERT INTO t VALUES (?, ?)", (i, "x" * 500)) for i in range(200)]
    world = make_world(tmp_path / "w", {"svc": statements})
    db = world / "services" / "svc.sqlite"
    if damage == "half":
        os.truncate(db, db.stat().st_size // 2)
    else:
        db.write_bytes(b"this is not a database" * 100)
    with pytest.raises(WorldDirError, match=r"svc\.sqlite"):
        hash_world(world)
    done = subprocess.run([str(WORLDCTL), "hash", str(world)], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.startswith("error:") and "svc.sqlite" in done.stderr
    assert "Traceback" not in done.stderr


def test_not_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(WorldDirError):
        hash_world(tmp_path / "file")
    with pytest.raises(WorldDirError):
        hash_world(tmp_path / "missing")


# --- workspace files, directories and links --------------------------------------------


def test_symlink_is_hashed_as_a_link(tmp_path: Path) -> None:
    target = b"target.txt"
    as_file = make_world(tmp_path / "a", files={"target.txt": b"data", "l": target})
    as_link = make_world(tmp_path / "b", files={"target.txt": b"data"})
    os.symlink("target.txt", as_link / "workspace" / "l")
    copy_of_target = make_world(tmp_path / "c", files={"target.txt": b"data", "l": b"data"})
    hashes = {hash_world(as_file), hash_world(as_link), hash_world(copy_of_target)}
    assert len(hashes) == 3
    link_digest = world_manifest(as_link).files["l"]
    assert link_digest.link == "target.txt"
    # A link is never followed: pointing elsewhere with the same content changes the hash.
    relinked = make_world(tmp_path / "d", files={"target.txt": b"data", "other": b"data"})
    os.symlink("other", relinked / "workspace" / "l")
    assert hash_world(relinked) not in hashes


def test_symlink_to_directory_is_a_link_not_a_tree(tmp_path: Path) -> None:
    world = make_world(tmp_path / "w", files={"d/inner.txt": b"x"})
    os.symlink("d", world / "workspace" / "alias")
    files = world_manifest(world).files
    assert set(files) == {"alias", "d/inner.txt"}
    assert files["alias"].link == "d"


def test_file_paths_and_renames_matter(tmp_path: Path) -> None:
    a = hash_world(make_world(tmp_path / "a", files={"d/x.txt": b"1"}))
    b = hash_world(make_world(tmp_path / "b", files={"d/y.txt": b"1"}))
    c = hash_world(make_world(tmp_path / "c", files={"e/x.txt": b"1"}))
    d = hash_world(make_world(tmp_path / "d", files={"d/x.txt": b"1", "d/y.txt": b"1"}))
    assert len({a, b, c, d}) == 4


def test_empty_directories_and_mtimes_are_not_content(tmp_path: Path) -> None:
    world = make_world(tmp_path / "w", files={"a.txt": b"a"})
    before = hash_world(world)
    (world / "workspace" / "empty" / "deeper").mkdir(parents=True)
    os.utime(world / "workspace" / "a.txt", ns=(0, 0))
    os.chmod(world / "workspace" / "a.txt", 0o600)
    assert hash_world(world) == before


def test_file_write_order_does_not_matter(tmp_path: Path) -> None:
    files = {f"d{i % 3}/f{i}.bin": bytes([i]) * i for i in range(12)}
    a = hash_world(make_world(tmp_path / "a", files=files))
    b = hash_world(make_world(tmp_path / "b", files=dict(reversed(list(files.items())))))
    assert a == b
