"""Shared fixtures: real SQLite stores in tmp dirs and real PostgreSQL databases.

PostgreSQL comes from WORLDCTL_TEST_PG_URL (.ci/run starts a server and sets it). With
CI=true and no server configured, PostgreSQL tests fail instead of skipping, so CI can
never silently drop half of the store-contract suite.
"""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import sqlalchemy as sa

from tests.support import docker_images, peer_venv, rl_extra_venv

if TYPE_CHECKING:
    from replay import Worlds

DEMO_WORLD = Path(__file__).resolve().parent.parent / "packs" / "demo" / "world"
DEMO_JSONL = DEMO_WORLD / "lars.jsonl"


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if any(item.name == rl_extra_venv.TEST_NAME for item in items):
        rl_extra_venv.start()
    # Each peer's venv (tests/support/peer_venv.py) starts building once a test that
    # needs it is selected, so its pip run overlaps the tests before it.
    for name in sorted({mark.args[0] for item in items
                        for mark in item.iter_markers("peer")}):
        peer_venv.start(name)
    # Likewise the Docker images (tests/support/docker_images.py): the base's debootstrap
    # and the project image's build overlap the tests before theirs.
    for kind in sorted({mark.args[0] for item in items
                        for mark in item.iter_markers("docker_image")}):
        docker_images.start(kind)


def pytest_sessionfinish() -> None:
    rl_extra_venv.stop()
    peer_venv.stop()
    docker_images.stop()
_DB_COUNTER = itertools.count()


def _admin_url() -> str | None:
    url = os.environ.get("WORLDCTL_TEST_PG_URL")
    if url:
        return url
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("CI=true but WORLDCTL_TEST_PG_URL is not set: the PostgreSQL half of the "
                    "store tests must run in CI (.ci/run starts a server)")
    pytest.skip("no PostgreSQL configured (set WORLDCTL_TEST_PG_URL)")
    return None


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test; dropped afterwards."""
    admin = _admin_url()
    assert admin is not None
    name = f"aw_test_{os.getpid()}_{next(_DB_COUNTER)}"
    engine = sa.create_engine(admin.replace("postgresql://", "postgresql+psycopg://", 1),
                              isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    base = admin.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with engine.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_location(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """Where a store lives: a directory (SQLite) or a fresh PostgreSQL database."""
    if backend == "sqlite":
        return str(tmp_path / "store")
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def demo_jsonl() -> Path:
    return DEMO_JSONL


@pytest.fixture
def loopback_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model call's environment for the loopback server (tests/support/llm_server.py): an API key,
    and no model or endpoint of the developer's own (``WORLDCTL_LLM_*``)."""
    monkeypatch.setenv("WORLDCTL_LLM_API_KEY", "x")
    for name in ("WORLDCTL_LLM_MODEL", "WORLDCTL_LLM_API_BASE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def demo_store_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo pack's two worlds (``lars``, ``nora``) imported once per session into a
    SQLite store that no test writes to: ``demo_store`` hands out copies."""
    from replay import Worlds

    root = tmp_path_factory.mktemp("demo-template") / "store"
    with Worlds.open(root) as worlds:
        for log in ("lars.jsonl", "nora.jsonl"):
            worlds.import_file(DEMO_WORLD / log)
    return root


@pytest.fixture(scope="module")
def demo_store(demo_store_template: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private copy of the demo store for one test module (a file copy, not an import)."""
    dest = tmp_path_factory.mktemp("demo") / "store"
    shutil.copytree(demo_store_template, dest, symlinks=True)
    return dest


@pytest.fixture(scope="module")
def demo_worlds(demo_store: Path) -> Iterator[Worlds]:
    """The module's copy of the demo store, open."""
    from replay import Worlds

    with Worlds.open(demo_store) as worlds:
        yield worlds
