"""``replay.browse``: the tables of a service, pages of rows and searches, read from a real
world imported through the interchange path, with a ``WITHOUT ROWID`` table (no rowid to
order by), a rowid table, a table without a primary key, and values that hold LIKE's
wildcards and its escape character."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from replay.browse import read_rows, service_tables
from replay.engine import Worlds
from replay.hashing import hash_world
from worldstore.errors import NotFoundError

STATEMENTS = [
    # Inserted out of key order: a page must come in key order, not insertion order.
    "CREATE TABLE stock (site TEXT NOT NULL, sku TEXT NOT NULL, qty INTEGER, "
    "PRIMARY KEY (site, sku)) WITHOUT ROWID",
    *(f"INSERT INTO stock VALUES ('{site}', 'sku-{n:03d}', {n})"
      for n in (7, 3, 11, 1, 5) for site in ("oslo", "bergen")),
    "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)",
    "INSERT INTO notes VALUES (3, '50% off_today')",
    "INSERT INTO notes VALUES (1, '50 percent offxtoday')",
    "INSERT INTO notes VALUES (2, 'C:\\dir\\file')",
    "INSERT INTO notes VALUES (4, 'Plain Words')",
    "CREATE TABLE loose (a TEXT, b BLOB)",
    "INSERT INTO loose VALUES ('z', NULL)",
    "INSERT INTO loose VALUES ('a', x'00ff')",
]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Worlds, Path]]:
    lines = "".join(json.dumps({"persona": "browse", "day": 0, "ts": "2026-01-01T00:00:00Z",
                                "type": "sql", "service": "inv", "sql": sql}) + "\n"
                    for sql in STATEMENTS)
    with Worlds.open(tmp_path_factory.mktemp("browse") / "store") as worlds:
        worlds.import_stream(io.BytesIO(lines.encode()), source="<browse>")
        with worlds.pinned("browse", 0) as root:
            yield worlds, root


def test_the_tables_of_a_service(world: tuple[Worlds, Path]) -> None:
    _, root = world
    tables = {t.name: t for t in service_tables(root, "inv")}
    assert sorted(tables) == ["loose", "notes", "stock"]
    stock = tables["stock"]
    assert (stock.without_rowid, stock.key, stock.rows) == (True, ("site", "sku"), 10)
    assert stock.columns == ("site", "sku", "qty")
    assert (tables["notes"].without_rowid, tables["notes"].key) == (False, ("id",))
    assert (tables["loose"].key, tables["loose"].rows) == ((), 2)


def test_a_without_rowid_table_pages_in_key_order(world: tuple[Worlds, Path]) -> None:
    _, root = world
    first = read_rows(root, "inv", "stock", offset=0, limit=4)
    assert first.total == 10 and first.columns == ("site", "sku", "qty")
    assert first.rows == (("bergen", "sku-001", 1), ("bergen", "sku-003", 3),
                          ("bergen", "sku-005", 5), ("bergen", "sku-007", 7))
    seen = [row for offset in (0, 4, 8)
            for row in read_rows(root, "inv", "stock", offset=offset, limit=4).rows]
    assert seen == sorted(seen) and len(set(seen)) == 10  # each row once, in key order


def test_other_tables_page_in_the_order_the_hash_reads(world: tuple[Worlds, Path]) -> None:
    _, root = world
    assert [r[0] for r in read_rows(root, "inv", "notes").rows] == [1, 2, 3, 4]
    # No key: every column, byte-wise (a NULL first), not the order of insertion.
    assert read_rows(root, "inv", "loose").rows == (("a", b"\x00\xff"), ("z", None))


@pytest.mark.parametrize(("text", "ids"), [
    ("50%", [3]),  # '%' is a character, not "anything": '50 percent' does not match
    ("off_", [3]),  # '_' likewise: 'offx' does not match
    ("\\dir\\", [2]),  # the escape character itself, literally
    ("plain words", [4]),  # LIKE's ASCII case folding
    ("50", [1, 3]),
    ("4", [4]),  # the id column is searched as text too
    ("nothing like it", []),
])
def test_a_search_matches_literally(world: tuple[Worlds, Path], text: str,
                                    ids: list[int]) -> None:
    _, root = world
    found = read_rows(root, "inv", "notes", search=text)
    assert [r[0] for r in found.rows] == ids and found.total == len(ids)
    assert found.search == text


def test_a_search_pages_too(world: tuple[Worlds, Path]) -> None:
    _, root = world
    found = read_rows(root, "inv", "stock", search="oslo", offset=3, limit=3)
    assert found.total == 5
    assert [r[1] for r in found.rows] == ["sku-007", "sku-011"]


def test_what_the_world_lacks_is_not_found(world: tuple[Worlds, Path]) -> None:
    _, root = world
    with pytest.raises(NotFoundError, match=r"no table inv\.nope"):
        read_rows(root, "inv", "nope")
    for service in ("nope", "../inv", "inv.sqlite"):
        with pytest.raises(NotFoundError, match="no service"):
            read_rows(root, service, "stock")
        with pytest.raises(NotFoundError, match="no service"):
            service_tables(root, service)
    with pytest.raises(ValueError, match="offset"):
        read_rows(root, "inv", "stock", offset=-1)


def test_reading_leaves_the_world_as_it_was(world: tuple[Worlds, Path]) -> None:
    worlds, root = world
    before = hash_world(root)
    read_rows(root, "inv", "stock", search="%")
    service_tables(root, "inv")
    assert hash_world(root) == before == worlds.record("browse@0").world_hash
