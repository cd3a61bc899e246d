"""Store schema migrations (alembic, run by open_event_store) and event-payload upcasting."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
import sqlalchemy as sa

from worldstore import events as ev
from worldstore.errors import StoreVersionError
from worldstore.events import (
    GENESIS,
    SCHEMA_VERSION,
    FileDeletePayload,
    SqlPayload,
    StoredEvent,
    compute_event_id,
    decode_payload,
    encode_payload,
    recompute_id,
    upcast,
)
from worldstore.migrate import head_revision
from worldstore.open import open_event_store
from worldstore.sqlstore import SqlEventStore
from worldstore.testing import append, build_day, contents, next_day

STORE_TABLES = {"personas", "events", "days", "blobs", "episodes", "claims",
                "alembic_version"}
FUTURE = "9999_from_the_future"


def revision(store: SqlEventStore) -> list[str]:
    with store.engine.connect() as conn:
        return [r[0] for r in conn.execute(sa.text("SELECT version_num FROM alembic_version"))]


def schema_fingerprint(store: SqlEventStore) -> Any:
    """Something that changes whenever DDL runs: SQLite's schema cookie (bumped by every
    schema change), PostgreSQL's table oids and catalog row versions (new on re-creation
    or ALTER)."""
    with store.engine.connect() as conn:
        if store.engine.dialect.name == "sqlite":
            return conn.exec_driver_sql("PRAGMA schema_version").scalar_one()
        return sorted(conn.execute(sa.text(
            "SELECT relname, oid::bigint, xmin::text FROM pg_class "
            "WHERE relnamespace = 'public'::regnamespace")).all())


def raw_rows(store: SqlEventStore) -> dict[str, list[Any]]:
    with store.engine.connect() as conn:
        return {table: sorted(tuple(bytes(v) if isinstance(v, memoryview) else v for v in r)
                              for r in conn.execute(sa.text(f"SELECT * FROM {table}")))
                for table in sorted(STORE_TABLES)}


def test_new_store_is_created_at_head(store_location: str) -> None:
    store = open_event_store(store_location)
    try:
        assert revision(store) == [head_revision()]
        assert set(sa.inspect(store.engine).get_table_names()) == STORE_TABLES
        columns = {c["name"] for c in sa.inspect(store.engine).get_columns("events")}
        assert columns == {"persona", "seq", "day", "ts", "prev", "event_id",
                           "schema_version", "body"}
        indexes = {i["name"] for i in sa.inspect(store.engine).get_indexes("days")}
        assert "ix_days_world_hash" in indexes
    finally:
        store.close()


def test_reopening_changes_nothing(store_location: str) -> None:
    store = open_event_store(store_location)
    append(store, build_day("lars", 0, first_seq=0, prev=GENESIS, files={"a": b"bytes"}))
    before = (raw_rows(store), schema_fingerprint(store))
    store.close()
    for _ in range(2):
        again = open_event_store(store_location)
        try:
            assert (raw_rows(again), schema_fingerprint(again)) == before
            assert revision(again) == [head_revision()]
        finally:
            again.close()


def test_store_at_an_unknown_newer_revision_is_refused(store_location: str) -> None:
    store = open_event_store(store_location)
    try:
        append(store, next_day(store, "lars", 0, files={"a": b"kept"}))
        append(store, next_day(store, "lars", 1))
        with store.engine.begin() as conn:
            conn.execute(sa.text("UPDATE alembic_version SET version_num = :v"), {"v": FUTURE})
        before = (raw_rows(store), schema_fingerprint(store))
    finally:
        store.close()
    with pytest.raises(StoreVersionError, match=FUTURE) as caught:
        open_event_store(store_location)
    assert "newer" in str(caught.value)
    assert "Nothing was changed" in str(caught.value)
    # Refused twice in a row: the first refusal did not "repair" the version either.
    with pytest.raises(StoreVersionError, match=FUTURE):
        open_event_store(store_location)
    inspect = open_raw(store_location)
    try:
        assert (raw_rows(inspect), schema_fingerprint(inspect)) == before
        assert revision(inspect) == [FUTURE]
    finally:
        inspect.close()


def open_raw(location: str) -> SqlEventStore:
    """A store object over the location without running migrations (to look at it)."""
    from worldstore.open import STORE_DB, is_database_url
    from worldstore.sqlstore import create_engine_for

    url = location if is_database_url(location) else f"{location}/{STORE_DB}"
    return SqlEventStore(create_engine_for(url), url)


def test_a_refused_store_is_readable_again_once_the_revision_is_known(store_location: str
                                                                      ) -> None:
    store = open_event_store(store_location)
    append(store, next_day(store, "lars", 0))
    before = contents(store)
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = :v"), {"v": FUTURE})
    store.close()
    with pytest.raises(StoreVersionError):
        open_event_store(store_location)
    raw = open_raw(store_location)
    with raw.engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = :v"),
                     {"v": head_revision()})
    raw.close()
    store = open_event_store(store_location)
    try:
        assert contents(store) == before
    finally:
        store.close()


# --- event payload schema versions ------------------------------------------------------


def v0_sql_upcaster(raw: dict[str, Any]) -> dict[str, Any]:
    """Version 0 (hypothetical) called the statement 'query' and had no params."""
    raw = dict(raw)
    raw["sql"] = raw.pop("query")
    return raw


def test_payload_newer_than_this_code_is_refused() -> None:
    body = encode_payload(SqlPayload(service="notes", sql="SELECT 1"))
    with pytest.raises(StoreVersionError, match=rf"schema_version {SCHEMA_VERSION + 1}"):
        decode_payload(body, SCHEMA_VERSION + 1)
    with pytest.raises(StoreVersionError, match="newer"):
        upcast({"type": "sql", "service": "notes", "sql": "SELECT 1"}, SCHEMA_VERSION + 5)


def test_current_payloads_decode_without_upcasting() -> None:
    payload = FileDeletePayload(path="docs/old.txt")
    assert decode_payload(encode_payload(payload), SCHEMA_VERSION) == payload
    raw = {"type": "file_delete", "path": "docs/old.txt"}
    assert upcast(raw, SCHEMA_VERSION, upcasters={}) == raw


def test_registered_upcaster_converts_an_old_shape() -> None:
    old = {"type": "sql", "service": "notes", "query": "DELETE FROM notes"}
    new = upcast(old, SCHEMA_VERSION - 1, upcasters={SCHEMA_VERSION - 1: v0_sql_upcaster})
    assert new == {"type": "sql", "service": "notes", "sql": "DELETE FROM notes"}
    assert old == {"type": "sql", "service": "notes", "query": "DELETE FROM notes"}
    assert msgspec.convert(new, ev.Payload) == SqlPayload(service="notes",
                                                          sql="DELETE FROM notes")


def test_upcasters_run_one_step_at_a_time_in_order() -> None:
    seen: list[int] = []

    def step(version: int) -> Any:
        def run(raw: dict[str, Any]) -> dict[str, Any]:
            seen.append(version)
            return {**raw, "trail": [*raw["trail"], version]}
        return run

    result = upcast({"trail": []}, 1, upcasters={v: step(v) for v in (3, 1, 2)}, target=4)
    assert result == {"trail": [1, 2, 3]}
    assert seen == [1, 2, 3]
    with pytest.raises(StoreVersionError, match="from event schema_version 2 to 3"):
        upcast({"trail": []}, 1, upcasters={1: step(1), 3: step(3)}, target=4)


def test_missing_upcaster_is_refused() -> None:
    with pytest.raises(StoreVersionError, match=r"schema_version 0 to 1"):
        upcast({"type": "sql"}, 0, upcasters={}, target=1)


def test_stored_old_event_is_upcast_on_read(store_location: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """An event written under schema version 0 reads back through the registered
    upcaster; its id still covers the bytes as written, so the chain stays intact."""
    body = msgspec.json.encode({"type": "sql", "service": "notes",
                                "query": "CREATE TABLE notes(id INTEGER PRIMARY KEY)"})
    fields = dict(persona="old", seq=0, day=0, ts="2026-03-02T08:00:00Z", prev=GENESIS,
                  schema_version=0, body=body)
    old_event = StoredEvent(event_id=compute_event_id(**fields), **fields)  # type: ignore[arg-type]
    from worldstore.testing import new_day

    store = open_event_store(store_location)
    try:
        append(store, new_day([old_event], {}))
        (stored,) = store.events("old")
        assert stored.schema_version == 0
        assert stored.body == body
        assert recompute_id(stored) == stored.event_id
        with pytest.raises(StoreVersionError, match="no upcaster"):
            _ = stored.payload  # nothing registered for version 0 in this code
        monkeypatch.setitem(ev.UPCASTERS, 0, v0_sql_upcaster)
        assert stored.payload == SqlPayload(service="notes",
                                            sql="CREATE TABLE notes(id INTEGER PRIMARY KEY)")
        assert stored.type == "sql"
    finally:
        store.close()


def test_stores_created_at_once_by_threads_are_each_created_at_head(tmp_path: Any) -> None:
    """alembic's migration scripts run through module-level proxies: creating several
    stores at once in one process (synthesis opens a scratch store per scenario thread)
    must not run one store's migration on another's connection."""
    from concurrent.futures import ThreadPoolExecutor

    def create(i: int) -> list[str]:
        store = open_event_store(str(tmp_path / f"store-{i}"))
        try:
            engine = store.engine if hasattr(store, "engine") else None
            assert engine is not None
            with engine.connect() as conn:
                return [str(r[0]) for r in conn.execute(
                    sa.text("SELECT version_num FROM alembic_version"))]
        finally:
            store.close()

    with ThreadPoolExecutor(max_workers=6) as pool:
        revisions = list(pool.map(create, range(12)))
    assert revisions == [[head_revision()]] * 12


def _schema(path: Any) -> list[Any]:
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        return [conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master "
                             "ORDER BY type, name").fetchall(),
                conn.execute("SELECT version_num FROM alembic_version").fetchall(),
                conn.execute("PRAGMA journal_mode").fetchall(),
                conn.execute("PRAGMA user_version").fetchall()]
    finally:
        conn.close()


def test_a_new_sqlite_store_is_the_migrations_own_result(tmp_path: Any) -> None:
    """New embedded stores are copies of one empty store the migrations made once per
    process (worldstore.open): the copy must be what the migrations make of a store."""
    from worldstore.migrate import migrate
    from worldstore.open import STORE_DB
    from worldstore.sqlstore import create_engine_for

    copied = open_event_store(str(tmp_path / "copied"))
    copied.close()
    migrated_at = tmp_path / "migrated.sqlite"
    engine = create_engine_for(str(migrated_at))
    try:
        migrate(engine, str(migrated_at))
    finally:
        engine.dispose()
    assert _schema(tmp_path / "copied" / STORE_DB) == _schema(migrated_at)
    assert sorted(p.name for p in (tmp_path / "copied").iterdir()) == [STORE_DB]


def test_one_store_created_at_once_by_threads_is_created_once(tmp_path: Any) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def create_and_write(i: int) -> None:
        store = open_event_store(str(tmp_path / "shared"))
        try:
            if i == 0:
                append(store, build_day("lars", 0, first_seq=0, prev=GENESIS))
        finally:
            store.close()

    with ThreadPoolExecutor(max_workers=6) as pool:
        list(pool.map(create_and_write, range(12)))
    store = open_event_store(str(tmp_path / "shared"))
    try:
        assert revision(store) == [head_revision()]
        assert raw_rows(store)["personas"]  # the one write was never overwritten by a copy
    finally:
        store.close()


def test_the_schema_module_equals_the_migrations_head(store_location: str) -> None:
    """``worldstore/schema.py`` is what the code reads and writes; the migrations are what
    builds a store. Alembic's own autogenerate comparison finds no difference between a
    store migrated to head and the schema module."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from worldstore.schema import metadata

    store = open_event_store(store_location)
    try:
        with store.engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), metadata)
    finally:
        store.engine.dispose()
    assert diff == []


def test_the_schema_comparison_sees_a_difference(tmp_path: Any) -> None:
    """The comparison above can fail: a column the migrations never made is reported."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from worldstore.schema import metadata

    changed = sa.MetaData()
    for table in metadata.sorted_tables:
        table.to_metadata(changed)
    changed.tables["personas"].append_column(sa.Column("nickname", sa.Text()))
    store = open_event_store(tmp_path / "store")
    try:
        with store.engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), changed)
    finally:
        store.engine.dispose()
    assert [(d[0], d[3].name) for d in diff] == [("add_column", "nickname")]


def test_alembic_upgrade_head_from_a_checkout(tmp_path: Any) -> None:
    """``alembic upgrade head`` run from the repository root (its ``alembic.ini``) builds
    the same store ``worldctl`` opens, and one refusal line names what is missing."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    alembic = [sys.executable, "-m", "alembic"]
    folder = tmp_path / "store"
    done = subprocess.run([*alembic, "-x", f"store={folder}", "upgrade", "head"], cwd=root,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    store = open_event_store(folder, create=False)
    try:
        assert revision(store) == [head_revision()]
    finally:
        store.engine.dispose()
    env = {k: v for k, v in __import__("os").environ.items() if k != "WORLDCTL_STORE"}
    refused = subprocess.run([*alembic, "upgrade", "head"], cwd=root, capture_output=True,
                             text=True, timeout=120, env=env)
    assert refused.returncode != 0
    assert "error: name the store" in refused.stderr + refused.stdout
