"""Per-day hashing re-hashes only what a day touched, and is never wrong about it.

The property: for many generated multi-day logs, replaying them day by day gives, after
every day, a manifest equal to a full re-hash of the world (``world_manifest``). The logs
mix the ways a statement reaches beyond the table it names: triggers that write other
tables (created after the statement was first seen, too), INSTEAD OF triggers on views,
AUTOINCREMENT (``sqlite_sequence``), REPLACE and UPSERT, ALTER ADD COLUMN, DROP, indexes,
foreign-key declarations with cascades,
header pragmas, services that first appear on a later day, and workspace writes and
deletes; SQL texts repeat across days, so write sets learnt on one day are used on the
next.
"""

from __future__ import annotations

import io
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from replay.engine import Worlds
from replay.fold import build_days
from replay.hashing import world_manifest
from tests.replay.test_hash_properties import (
    SEGMENTS,
    SETTINGS,
    FileSpec,
    Log,
    World,
    encode_logs,
    plain_log,
    values,
    worlds,
)

# Objects every generated world also has, in services "alpha" and "gamma".
FIXTURE = [
    ("alpha", "CREATE TABLE parent(id INTEGER PRIMARY KEY, v)"),
    ("alpha", "CREATE TABLE child(id INTEGER PRIMARY KEY, "
              "pid INTEGER REFERENCES parent(id) ON DELETE CASCADE, v)"),
    ("alpha", "CREATE TABLE audit(n INTEGER PRIMARY KEY AUTOINCREMENT, what)"),
    ("alpha", "CREATE TABLE quiet(id INTEGER PRIMARY KEY, v)"),
    ("alpha", "INSERT INTO quiet(id, v) VALUES (1, 'never written again')"),
    ("alpha", "CREATE TRIGGER parent_audit AFTER UPDATE ON parent "
              "BEGIN INSERT INTO audit(what) VALUES ('updated ' || new.id); END"),
    ("alpha", "CREATE VIEW parent_view AS SELECT id, v FROM parent"),
    ("alpha", "CREATE TRIGGER parent_view_insert INSTEAD OF INSERT ON parent_view "
              "BEGIN INSERT INTO child(pid, v) VALUES (new.id, new.v); END"),
    ("gamma", "CREATE TABLE plain(id INTEGER PRIMARY KEY, v)"),
    # REPLACE on the UNIQUE column deletes another row, which SQLite's update hook does not
    # report: the row-reading rehash must notice it all the same.
    ("gamma", "CREATE TABLE uniq(id INTEGER PRIMARY KEY, code INTEGER UNIQUE, v)"),
]


# Row writes (kinds 0-7, 12, 13, 17-19) are drawn five times as often as schema changes
# (8-11, 15), so that most days carry digests over instead of re-hashing a whole service.
KINDS = [*range(8), 12, 13, 17, 18, 19] * 5 + [8, 9, 10, 11, 14, 15, 16, 16, 16, 20, 20]


@dataclass
class Model:
    """Just enough of the world's state to keep every generated statement valid."""

    tables: list[tuple[str, str, int, bool]]  # (service, table, columns besides id, pk)
    files: set[str] = field(default_factory=set)
    extra: str | None = None  # the name of the optional extra table, when it exists
    columns: int = 0  # columns added by ALTER TABLE so far


def day_op(log: Log, model: Model, draw: st.DrawFn) -> None:
    """One event of a later day, drawn from a menu of ways to change a world."""
    kind = draw(st.sampled_from(KINDS))
    service, table, ncols, pk = draw(st.sampled_from(model.tables))
    if kind == 0:
        row = [draw(st.integers(-5, 40))] if pk else []
        row += [draw(values) for _ in range(ncols)]
        log.sql(service, f"INSERT OR REPLACE INTO {table} VALUES "
                         f"({', '.join('?' * len(row))})", tuple(row))
    elif kind == 1:
        log.sql(service, f"UPDATE {table} SET c0 = ? WHERE rowid % 2 = 0", (draw(values),))
    elif kind == 2:
        log.sql(service, draw(st.sampled_from([f"DELETE FROM {table} WHERE rowid % 3 = 1",
                                               f"DELETE FROM {table}"])))
    elif kind == 3:
        log.sql("alpha", "INSERT INTO parent(v) VALUES (?)", (draw(values),))
    elif kind == 4:
        log.sql("alpha", "UPDATE parent SET v = ? WHERE id % 2 = 1", (draw(values),))
    elif kind == 5:
        log.sql("alpha", "DELETE FROM parent WHERE id % 3 = 0")
    elif kind == 6:
        log.sql("alpha", "INSERT INTO parent_view(id, v) VALUES (?, ?)",
                (draw(st.integers(0, 9)), draw(values)))
    elif kind == 7:
        log.sql("alpha", "INSERT INTO parent(id, v) VALUES (?, ?) "
                         "ON CONFLICT(id) DO UPDATE SET v = excluded.v",
                (draw(st.integers(0, 9)), draw(values)))
    elif kind == 8:
        # A trigger on a table whose INSERT text may already have been learnt: from now
        # on that same text writes `audit` as well.
        target = draw(st.sampled_from([t for s, t, _, _ in model.tables if s == "alpha"]))
        log.sql("alpha", f"CREATE TRIGGER IF NOT EXISTS {target}_copy AFTER INSERT ON "
                         f"{target} BEGIN INSERT INTO audit(what) VALUES ('copied'); END")
    elif kind == 9:
        target = draw(st.sampled_from([t for s, t, _, _ in model.tables if s == "alpha"]))
        log.sql("alpha", f"DROP TRIGGER IF EXISTS {target}_copy")
    elif kind == 10:
        model.columns += 1
        log.sql(service, f"ALTER TABLE {table} ADD COLUMN added{model.columns} DEFAULT 7")
        model.tables = [(s, t, n + 1 if (s, t) == (service, table) else n, k)
                        for s, t, n, k in model.tables]
    elif kind == 11:
        extra_op(log, model, draw)
    elif kind == 12:
        # (No FTS5 table here at present: any write to one on a later day runs the
        # module's own "PRAGMA data_version", which the SQL guard now refuses.)
        log.sql("gamma", "INSERT INTO plain(v) VALUES (?)", (draw(st.text(max_size=8)),))
    elif kind == 13:
        log.sql("gamma", "UPDATE plain SET v = v || '+' WHERE id % 2 = 0")
    elif kind == 17:
        log.sql("gamma", "INSERT OR REPLACE INTO uniq(id, code, v) VALUES (?, ?, ?)",
                (draw(st.integers(0, 12)), draw(st.integers(0, 5)), draw(values)))
    elif kind == 18:
        log.sql("gamma", "UPDATE OR REPLACE uniq SET code = ? WHERE id = ?",
                (draw(st.integers(0, 5)), draw(st.integers(0, 12))))
    elif kind == 19:  # a new rowid for a row
        log.sql("gamma", "UPDATE OR IGNORE uniq SET id = id + 20 WHERE id = ?",
                (draw(st.integers(0, 12)),))
    elif kind == 20:
        # A service first written on a later day: its database appears then (a statement
        # that only reads makes an empty one).
        late = draw(st.sampled_from(["delta", "epsilon"]))
        if any(s == late for s, *_ in model.tables) or draw(st.booleans()):
            log.sql(late, "SELECT 1")
        else:
            log.sql(late, "CREATE TABLE late(id INTEGER PRIMARY KEY, c0)")
            model.tables.append((late, "late", 1, True))
    elif kind == 14:
        log.sql(service, f"PRAGMA user_version = {draw(st.integers(0, 9))}")
    elif kind == 15:
        log.sql(service, f"CREATE INDEX IF NOT EXISTS {table}_c0 ON {table}(c0)")
    else:
        file_op(log, model, draw)


def extra_op(log: Log, model: Model, draw: st.DrawFn) -> None:
    """Create, fill, rename or drop a WITHOUT ROWID table of alpha."""
    if model.extra is None:
        log.sql("alpha", "CREATE TABLE extra(k INTEGER PRIMARY KEY, v) WITHOUT ROWID")
        model.extra = "extra"
        return
    choice = draw(st.integers(0, 3))
    if choice == 3:  # a rename rewrites the schema (and every trigger naming the table)
        renamed = "extra2" if model.extra == "extra" else "extra"
        log.sql("alpha", f"ALTER TABLE {model.extra} RENAME TO {renamed}")
        model.extra = renamed
    elif choice > 0:
        log.sql("alpha", f"INSERT OR REPLACE INTO {model.extra} VALUES (?, ?)",
                (draw(st.integers(0, 5)), draw(values)))
    else:
        log.sql("alpha", f"DROP TABLE {model.extra}")
        model.extra = None


def _clashes(path: str, taken: set[str]) -> bool:
    """A path that is a directory of another path, or has another path as a directory."""
    return any(path.startswith(t + "/") or t.startswith(path + "/") for t in taken)


def file_op(log: Log, model: Model, draw: st.DrawFn) -> None:
    if model.files and draw(st.booleans()):
        path = draw(st.sampled_from(sorted(model.files)))
        log.delete(path)
        model.files.discard(path)
        return
    path = "/".join(draw(st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=3)))
    if _clashes(path, model.files - {path}):
        return
    log.write(path, FileSpec(draw(st.binary(max_size=20)), False))
    model.files.add(path)


@st.composite
def logs(draw: st.DrawFn) -> bytes:
    world: World = draw(worlds())
    log = plain_log("p", world)
    for service, sql in FIXTURE:
        log.sql(service, sql)
    model = Model([(s.name, t.name, t.ncols, t.pk) for s in world.services for t in s.tables],
                  set(world.files))
    for _ in range(draw(st.integers(1, 6))):
        log.day += 1
        for _ in range(draw(st.integers(1, 8))):
            day_op(log, model, draw)
    return encode_logs(log)


def replay_checking_every_day(store: Path, data: bytes, root: Path) -> int:
    """Import `data`, then rebuild it day by day, comparing each day's carried-over
    manifest with a full re-hash and with the hash the import recorded."""
    with Worlds.open(store) as worlds:
        worlds.import_stream(io.BytesIO(data), source="generated.jsonl")
        recorded = {r.day: r.world_hash for r in worlds.store.days("p")}
        root.mkdir()
        days = 0
        for built in build_days(root, worlds.store.events("p"), worlds.store.blob):
            full = world_manifest(root)
            assert built.manifest == full, f"day {built.day}: carried manifest != full re-hash"
            assert built.world_hash == full.world_hash() == recorded[built.day]
            days += 1
    return days


@settings(SETTINGS, max_examples=60)
@given(data=logs())
def test_the_carried_manifest_equals_a_full_rehash_after_every_day(data: bytes) -> None:
    with tempfile.TemporaryDirectory(prefix="rehash-") as tmp:
        assert replay_checking_every_day(Path(tmp) / "store", data, Path(tmp) / "w") >= 2


def test_a_trigger_added_later_makes_a_learnt_statement_write_another_table(
        tmp_path: Path) -> None:
    # Day 1 learns that this INSERT writes only `a`; day 2 adds a trigger; day 3's same
    # INSERT text also writes `b`, which must be re-hashed.
    log = Log("p")
    log.sql("s", "CREATE TABLE a(id INTEGER PRIMARY KEY, v)")
    log.sql("s", "CREATE TABLE b(id INTEGER PRIMARY KEY, v)")
    for day, sql in [(1, None), (2, "CREATE TRIGGER a_b AFTER INSERT ON a "
                                    "BEGIN INSERT INTO b(v) VALUES (new.v); END"), (3, None)]:
        log.day = day
        if sql:
            log.sql("s", sql)
        log.sql("s", "INSERT INTO a(v) VALUES (?)", (f"day {day}",))
    assert replay_checking_every_day(tmp_path / "store", encode_logs(log), tmp_path / "w") == 4


def test_a_day_that_writes_nothing_keeps_every_digest(tmp_path: Path) -> None:
    log = Log("p")
    log.sql("s", "CREATE TABLE a(id INTEGER PRIMARY KEY, v)")
    log.sql("s", "INSERT INTO a(v) VALUES (1)")
    log.write("notes/a.txt", FileSpec(b"a", True))
    log.day = 1
    log.sql("s", "SELECT count(*) FROM a")
    log.write("notes/b.txt", FileSpec(b"b", True))
    assert replay_checking_every_day(tmp_path / "store", encode_logs(log), tmp_path / "w") == 2


def test_writes_through_triggers_are_re_hashed_on_a_day_without_schema_changes(
        tmp_path: Path) -> None:
    log = Log("p")
    for _service, sql in FIXTURE:
        if _service == "alpha":
            log.sql("alpha", sql)
    log.sql("alpha", "INSERT INTO parent(id, v) VALUES (1, 'a')")
    log.day = 1
    log.sql("alpha", "UPDATE parent SET v = 'b' WHERE id = 1")  # parent_audit -> audit
    log.day = 2
    log.sql("alpha", "INSERT INTO parent_view(id, v) VALUES (1, 'c')")  # INSTEAD OF -> child
    log.day = 3
    log.sql("alpha", "UPDATE parent SET v = 'd' WHERE id = 1")  # learnt text, new day

    assert replay_checking_every_day(tmp_path / "store", encode_logs(log), tmp_path / "w") == 4


def test_big_tables_are_re_hashed_across_chunks_and_split_runs(tmp_path: Path) -> None:
    # Tables past ROW_CHUNK (1,024) rows hash as several chunks; a day writing many rows
    # into one run of held rows splits it; INSERT ... SELECT copies a table in one go.
    fill = ("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2500) "
            "INSERT INTO big(id, v) SELECT i * 2, 'row ' || i FROM n")
    log = Log("p")
    log.sql("s", "CREATE TABLE big(id INTEGER PRIMARY KEY, v)")
    log.sql("s", "CREATE TABLE copy(id INTEGER PRIMARY KEY, v)")
    log.sql("s", fill)
    log.day = 1
    log.sql("s", "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 99) "
                 "INSERT INTO big(id, v) SELECT 2 * i + 1, 'odd' FROM n")  # into one run
    log.sql("s", "DELETE FROM big WHERE id BETWEEN 2000 AND 2400")
    log.sql("s", "UPDATE big SET v = v || '!' WHERE id % 100 = 0")
    log.sql("s", "INSERT INTO big(id, v) VALUES (9000, 'past the end')")
    log.day = 2
    log.sql("s", "INSERT INTO copy SELECT * FROM big")
    log.sql("s", "DELETE FROM big WHERE id < 40")  # empties the first run
    log.day = 3
    log.sql("s", "UPDATE copy SET v = 'changed' WHERE id IN (1, 2047, 2048, 4999)")
    log.sql("s", "DELETE FROM copy")
    log.sql("s", "INSERT INTO big(id, v) VALUES (1, 'back at the front')")
    assert replay_checking_every_day(tmp_path / "store", encode_logs(log), tmp_path / "w") == 4
