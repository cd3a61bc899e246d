"""The AWM adapter serving real imported AWM worlds (``worldenv.awm.host``,
``worldenv.awm.adapter``).

content_platform_1 is AWM's own generated server (34 routes, from the samples); "quirks" is
a small scenario written here in AWM's formats and style with the quirks its generator
produces (a GET that writes, ``utcnow()``, a pydantic body, a relationship, a sync route
with a ``Depends`` session, ``uuid4()``, a route with a bug). Both are imported with the
AWM importer and served by real sandboxed app workers; MCP through the real fastmcp client.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastmcp import Client
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from awmbridge.importer import import_awm
from replay.engine import Worlds
from replay.layout import service_db
from tests.support.asgi_server import served
from worldenv.awm.host import (
    AWM_ADAPTER_VERSION,
    AWM_APP,
    adapter_digest,
    awm_app_source,
    operation_ids,
    route_count,
)
from worldenv.awm.shipping import ADAPTER, adapter_source
from worldenv.core.contract import CallClock
from worldenv.core.episode import DbChange, ToolCall
from worldenv.errors import AppPinError
from worldenv.instances.checker import check_determinism
from worldenv.instances.episodes import replay_episode
from worldenv.instances.instance import Environment, Instance
from worldenv.sandbox.bubblewrap import find_sandbox_tools
from worldenv.sandbox.workers import WorkerLimits, WorkerPool
from worldenv.serving.gateway import Gateway
from worldenv.serving.mcp import instance_server

SAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "awm-1k-samples"  # AWM-1K's own files
CP = "content_platform_1"
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "awm"  # the importer's scenario
LOANS = "library_loans_1"

try:
    find_sandbox_tools(setpriv=False)
except Exception as exc:  # pragma: no cover - the sandbox is a requirement of carried apps
    pytest.skip(f"no sandbox for carried apps: {exc}", allow_module_level=True)


QUIRKS_DDL = [
    "CREATE TABLE authors (\n    id INTEGER PRIMARY KEY,\n    name TEXT NOT NULL UNIQUE,\n"
    "    created_at DATETIME DEFAULT (datetime('now'))\n)",
    "CREATE TABLE articles (\n    id INTEGER PRIMARY KEY AUTOINCREMENT,\n"
    "    author_id INTEGER NOT NULL REFERENCES authors(id),\n    title TEXT NOT NULL,\n"
    "    views INTEGER NOT NULL DEFAULT 0,\n    last_viewed_at DATETIME,\n"
    "    created_at DATETIME DEFAULT (datetime('now'))\n)",
]
QUIRKS_INSERTS = {
    "authors": ["INSERT INTO authors (id, name) VALUES (1, 'Ada');",
                "INSERT INTO authors (id, name) VALUES (2, 'Grace');"],
    "articles": ["INSERT INTO articles (id, author_id, title, views) VALUES "
                 "(1, 1, 'Engines', 3);",
                 "INSERT INTO articles (id, author_id, title, views) VALUES "
                 "(2, 1, 'Notes', 0);"],
}
QUIRKS_CODE = '''
from fastapi import FastAPI, Query, Path, Body, HTTPException, Depends
from pydantic import BaseModel, Field
from typing import Optional, List
from sqlalchemy import create_engine, Column, Integer, String, DateTime, ForeignKey
from sqlalchemy.orm import declarative_base, relationship, sessionmaker, Session
from datetime import datetime
import os
import time
import uuid

database_url = os.getenv("DATABASE_PATH", "sqlite:///outputs/databases/quirks.db")
engine = create_engine(database_url, connect_args={"check_same_thread": False})
SessionLocal = sessionmaker(bind=engine, autoflush=False, autocommit=False)
Base = declarative_base()


class Author(Base):
    __tablename__ = "authors"
    id = Column(Integer, primary_key=True)
    name = Column(String, nullable=False, unique=True)
    created_at = Column(DateTime, default=datetime.utcnow)
    articles = relationship("Article", back_populates="author")


class Article(Base):
    __tablename__ = "articles"
    id = Column(Integer, primary_key=True)
    author_id = Column(Integer, ForeignKey("authors.id"), nullable=False)
    title = Column(String, nullable=False)
    views = Column(Integer, nullable=False, default=0)
    last_viewed_at = Column(DateTime)
    created_at = Column(DateTime, default=datetime.utcnow)
    author = relationship("Author", back_populates="articles")


Base.metadata.create_all(engine)
app = FastAPI(title="Quirks API", version="1.0.0")


def get_db():
    db = SessionLocal()
    try:
        yield db
    finally:
        db.close()


class ArticleModel(BaseModel):
    id: int = Field(..., description="Article ID.")
    title: str = Field(..., description="Title.")
    author_name: str = Field(..., description="Name of the author.")
    views: int = Field(..., description="How many times it was opened.")
    last_viewed_at: Optional[datetime] = Field(None, description="Last opened (ISO 8601).")


class ArticleCreateBody(BaseModel):
    author_id: int = Field(..., description="ID of the author.", example=1)
    title: str = Field(..., description="Title of the new article.", example="On Engines")


class ArticleCreateResponse(BaseModel):
    article: ArticleModel = Field(..., description="The created article.")
    request_id: str = Field(..., description="An id for this request.")


@app.get("/api/articles/{article_id}", response_model=ArticleModel,
         summary="Open an article", description="Return an article (counts the view).",
         operation_id="view_article")
async def view_article(article_id: int = Path(..., description="Article to open.")):
    session = SessionLocal()
    art = session.query(Article).filter(Article.id == article_id).first()
    if art is None:
        session.close()
        raise HTTPException(status_code=404, detail="Article not found")
    art.views = art.views + 1
    art.last_viewed_at = datetime.utcnow()
    session.commit()
    out = ArticleModel(id=art.id, title=art.title, author_name=art.author.name,
                       views=art.views, last_viewed_at=art.last_viewed_at)
    session.close()
    return out


@app.get("/api/articles", summary="List articles", operation_id="list_articles")
async def list_articles(author_id: Optional[int] = Query(None, description="Only this author."),
                        limit: int = Query(10, description="At most this many.")):
    session = SessionLocal()
    q = session.query(Article)
    if author_id is not None:
        q = q.filter(Article.author_id == author_id)
    rows = q.order_by(Article.id).limit(limit).all()
    out = [{"id": a.id, "title": a.title, "views": a.views} for a in rows]
    session.close()
    return {"articles": out}


@app.post("/api/articles", response_model=ArticleCreateResponse, summary="Write an article",
          operation_id="create_article")
def create_article(body: ArticleCreateBody = Body(...), db: Session = Depends(get_db)):
    if db.query(Author).filter(Author.id == body.author_id).first() is None:
        raise HTTPException(status_code=404, detail="Author not found")
    art = Article(author_id=body.author_id, title=body.title)
    db.add(art)
    db.commit()
    db.refresh(art)
    return ArticleCreateResponse(
        article=ArticleModel(id=art.id, title=art.title, author_name=art.author.name,
                             views=art.views, last_viewed_at=art.last_viewed_at),
        request_id=str(uuid.uuid4()))


@app.get("/api/authors")
def list_authors(db: Session = Depends(get_db)):
    """No operation_id: FastAPI generates one."""
    return [{"id": a.id, "name": a.name} for a in db.query(Author).order_by(Author.id)]


@app.get("/api/clock", summary="Server time", operation_id="server_clock")
async def server_clock():
    return {"utcnow": datetime.utcnow().isoformat(), "now": datetime.now().isoformat(),
            "time": time.time()}


@app.get("/api/authors/{author_id}/stats", summary="Author statistics",
         operation_id="author_stats")
async def author_stats(author_id: int = Path(..., description="Author ID.")):
    session = SessionLocal()
    author = session.query(Author).filter(Author.id == author_id).first()
    total = sum(a.views for a in author.articles)
    average = total / len(author.articles)  # a bug: an author without articles
    session.close()
    return {"author_id": author_id, "total_views": total, "average_views": average}


@app.post("/api/articles/{article_id}/retitle", summary="Retitle, then fail",
          operation_id="retitle_then_fail")
async def retitle_then_fail(article_id: int = Path(...), title: str = Query(...)):
    session = SessionLocal()
    art = session.query(Article).filter(Article.id == article_id).first()
    art.title = title
    session.flush()  # written, never committed
    raise HTTPException(status_code=409, detail="conflict after a flush")
'''


def _write_scenario(directory: Path, name: str, ddl: list[str],
                    inserts: dict[str, list[str]], code: str) -> None:
    """One scenario in AWM's gen_db / gen_sample / gen_envs formats."""
    tables = [{"name": sql.split()[2], "ddl": sql, "indexes": []} for sql in ddl]
    files = {
        "gen_db.jsonl": {"scenario": name, "db_schema": {"tables": tables},
                         "db_path": f"./outputs/databases/{name}.db"},
        "gen_sample.jsonl": {"scenario": name, "tables_count": len(inserts),
                             "inserts_count": sum(map(len, inserts.values())),
                             "sample_data": {"tables": [
                                 {"table_name": t, "reasoning": "test data",
                                  "insert_statements": s} for t, s in inserts.items()]}},
        "gen_envs.jsonl": {"scenario": name, "db_path": f"./outputs/databases/{name}.db",
                           "full_code": code},
    }
    directory.mkdir(parents=True, exist_ok=True)
    for file, line in files.items():
        (directory / file).write_text(json.dumps(line) + "\n", encoding="utf-8")


def _cp_code() -> str:
    for line in (SAMPLES / "gen_envs.jsonl").read_text(encoding="utf-8").splitlines():
        data = json.loads(line)
        if data["scenario"] == CP:
            return str(data["full_code"])
    raise AssertionError("content_platform_1 has no code in the samples")


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worlds]:
    root = tmp_path_factory.mktemp("awm")
    quirks = root / "quirks-awm"
    _write_scenario(quirks, "quirks", QUIRKS_DDL, QUIRKS_INSERTS, QUIRKS_CODE)
    with Worlds.open(root / "store") as store:
        sources = [(SAMPLES, [CP]), (quirks, ["quirks"])]
        if (FIXTURE / "gen_envs.jsonl").is_file():
            sources.append((FIXTURE, [LOANS]))
        for directory, names in sources:
            report = import_awm(store, directory, scenarios=names)
            assert report.ok and [r.persona for r in report.imported] == names, \
                report.as_dict()
        yield store


@pytest.fixture(scope="module")
def env(worlds: Worlds) -> Iterator[Environment]:
    environment = Environment(worlds)
    environment._pool = WorkerPool(WorkerLimits(timeout_s=20))
    yield environment
    environment.close()


@pytest.fixture()
def cp(env: Environment) -> Iterator[Instance]:
    with env.open(f"{CP}@0") as instance:
        yield instance


@pytest.fixture()
def quirks(env: Environment) -> Iterator[Instance]:
    with env.open("quirks@0") as instance:
        yield instance


def _clock(instance: Instance, index: int) -> CallClock:
    return CallClock.of_call(instance.record.last_ts, instance.record.world_hash, index)


# --- the carried module and its pin ------------------------------------------------------


def test_the_carried_module_pins_the_adapter_and_carries_the_code_verbatim() -> None:
    code = _cp_code()
    source = awm_app_source(code)
    assert f"ADAPTER_VERSION = {AWM_ADAPTER_VERSION!r}" in source
    assert f"ADAPTER_DIGEST = {adapter_digest()!r}" in source
    assert f"CODE = {code!r}" in source and AWM_APP == "awm"
    assert route_count(code) == 34 == len(set(operation_ids(code)))
    with pytest.raises(SyntaxError):
        awm_app_source("def broken(:\n")


def test_a_world_pinning_another_adapter_is_refused(tmp_path: Path) -> None:
    code = _cp_code()
    wrong = awm_app_source(code).replace(adapter_digest(), "0" * 32)
    lines = [{"persona": "pin", "day": 0, "ts": "2026-01-01T00:00:00Z", "type": "sql",
              "service": "awm", "sql": "CREATE TABLE t(id INTEGER PRIMARY KEY)"},
             {"persona": "pin", "day": 0, "ts": "2026-01-01T00:00:00Z", "type": "app",
              "service": "awm", "app": AWM_APP, "version": AWM_ADAPTER_VERSION,
              "code": wrong}]
    log = tmp_path / "pin.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    with Worlds.open(tmp_path / "store") as worlds, Environment(worlds) as env:
        worlds.import_file(log)
        with pytest.raises(AppPinError, match=r"AWM adapter awm 1\.0\.0 \(0{32}\)"):
            env.open("pin@0")


def test_an_adapter_folder_with_an_extra_module_is_refused(tmp_path: Path) -> None:
    # The digest pins ADAPTER_MODULES only: a module beside them would run unpinned.
    copy = tmp_path / "adapter"
    shutil.copytree(ADAPTER, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert adapter_source(copy) == adapter_source()
    (copy / "extra.py").write_text("VALUE = 1\n", encoding="utf-8")
    with pytest.raises(AppPinError, match=rf"the AWM adapter at {re.escape(str(copy))} holds "
                       r"__init__\.py, app\.py, dbapi\.py, extra\.py,"):
        adapter_source(copy)


# --- content_platform_1: AWM's own generated server --------------------------------------


def test_content_platform_routes_are_served_as_tools(cp: Instance) -> None:
    tools = {t.name: t for t in cp.list_tools()}
    assert sorted(tools) == sorted(f"awm_{op}" for op in operation_ids(_cp_code()))
    assert len(tools) == 34
    search = tools["awm_search_channels"]
    assert search.description.startswith(
        "Search channels by name\n\nFind channels whose name matches a search query")
    assert "### Responses:" in search.description
    props = search.input_schema["properties"]
    assert list(props) == ["query", "limit", "offset"]
    assert props["limit"]["default"] == 10 and props["limit"]["type"] == "integer"
    assert search.input_schema["required"] == ["query"]
    # a pydantic body's fields become top-level parameters (fastapi-mcp's flattening)
    subscribe = tools["awm_subscribe_to_channel"].input_schema
    assert subscribe["properties"]["channel_id"]["description"] == \
        "ID of the channel to subscribe to."
    assert subscribe["required"] == ["channel_id"]
    upload = tools["awm_add_video_to_playlist"].input_schema
    assert set(upload["required"]) == {"playlist_id", "video_id"}  # path + body
    assert all(t.writes for t in tools.values())  # every route may write


def test_content_platform_read(cp: Instance) -> None:
    result = cp.call_tool("awm_search_channels", {"query": "spanish", "limit": 5})
    assert not result.is_error, result.text
    assert result.structured == json.loads(result.text)
    names = [c["name"] for c in result.structured["channels"]]
    assert names and all("spanish" in n.lower() for n in names)
    assert result.text == json.dumps(result.structured, indent=2, ensure_ascii=False)
    assert not [e for e in cp.episode.events if isinstance(e, DbChange)]  # nothing written
    assert cp.hash() == cp.record.world_hash


def test_a_get_that_only_reads_runs_on_the_snapshot_and_copies_nothing(
        env: Environment) -> None:
    # Every route may write, but a GET first runs on the snapshot, read-only, and is run on
    # the instance's own copy only when it tries to write.
    first, second = env.open(f"{CP}@0"), env.open(f"{CP}@0")
    try:
        for instance in (first, second):
            got = instance.call_tool("awm_get_channel_by_id", {"channel_id": 1})
            assert not got.is_error, got.text
            assert instance.mount.read_db_path("awm") == \
                service_db(instance.mount.snapshot, "awm")  # no copy was made
            assert not [e for e in instance.episode.events if isinstance(e, DbChange)]
        assert first.episode.events == second.episode.events
        assert first.hash() == second.hash() == first.record.world_hash
    finally:
        first.close()
        second.close()


def test_content_platform_write_is_recorded_and_reset_restores(env: Environment,
                                                               cp: Instance) -> None:
    before = cp.call_tool("awm_list_user_subscriptions", {"limit": 100})
    subscribed = {s["channel_id"] for s in before.structured["subscriptions"]}
    channel = next(c for c in range(1, 100) if c not in subscribed)
    result = cp.call_tool("awm_subscribe_to_channel", {"channel_id": channel})
    assert not result.is_error, result.text
    sub = result.structured["subscription"]
    # SQLAlchemy's default=datetime.utcnow read the call's frozen clock
    assert sub["subscribed_at"] == _clock(cp, 2).now.removesuffix("Z")
    changes = [e for e in cp.episode.events if isinstance(e, DbChange)]
    assert [(c.index, c.service) for c in changes] == [(2, "awm")]
    assert [t.table for t in cp.diff().tables] == ["user_subscriptions"]
    final = cp.hash()
    assert final != cp.record.world_hash
    assert replay_episode(env.worlds, cp.episode) == final
    after = cp.call_tool("awm_list_user_subscriptions", {"limit": 100})
    assert channel in {s["channel_id"] for s in after.structured["subscriptions"]}
    cp.reset()
    assert cp.hash() == cp.record.world_hash
    again = cp.call_tool("awm_list_user_subscriptions", {"limit": 100})
    assert again.text == before.text


def test_content_platform_errors_are_results(cp: Instance) -> None:
    bad = cp.call_tool("awm_get_channel_by_id", {"channel_id": "not a number"})
    assert bad.is_error and bad.text.startswith(
        "Error calling get_channel_by_id. Status code: 422.")
    missing = cp.call_tool("awm_search_channels", {})
    assert missing.is_error and "Status code: 422" in missing.text
    assert not cp.call_tool("awm_get_channel_by_id", {"channel_id": 1}).is_error


def test_two_fresh_instances_answer_byte_equal(env: Environment) -> None:
    calls: list[tuple[str, dict[str, Any]]] = [
        ("awm_search_videos", {"query": "a"}),
        ("awm_create_playlist", {"name": "Determinism", "visibility": "private"}),
        ("awm_list_playlists", {}),
        ("awm_subscribe_to_channel", {"channel_id": 2}),
        ("awm_add_watch_history_entry", {"video_id": "KURZ2"}),
        ("awm_get_user_watch_history", {}),
    ]
    report = check_determinism(env, f"{CP}@0", calls)
    assert report.ok, report.problems
    first, second = env.open(f"{CP}@0"), env.open(f"{CP}@0")
    try:
        texts = [[i.call_tool(n, a).text for n, a in calls] for i in (first, second)]
        assert texts[0] == texts[1]
        assert first.hash() == second.hash()
    finally:
        first.close()
        second.close()


# --- quirks: a GET that writes, the clock, bugs -------------------------------------------


def test_a_get_that_writes_is_recorded(env: Environment, quirks: Instance) -> None:
    result = quirks.call_tool("awm_view_article", {"article_id": 1})
    assert not result.is_error, result.text
    assert result.structured == {"id": 1, "title": "Engines", "author_name": "Ada",
                                 "views": 4, "last_viewed_at":
                                 _clock(quirks, 1).now.removesuffix("Z")}
    changes = [e for e in quirks.episode.events if isinstance(e, DbChange)]
    assert [c.index for c in changes] == [1]
    assert replay_episode(env.worlds, quirks.episode) == quirks.hash() != \
        quirks.record.world_hash
    quirks.reset()
    assert quirks.hash() == quirks.record.world_hash


def test_the_fixture_scenarios_get_that_writes(env: Environment) -> None:
    """library_loans_1 (tests/fixtures/awm, the importer's third scenario): its
    ``get_book_details`` counts a view, ``borrow_book`` stamps ``utcnow()``."""
    if not (FIXTURE / "gen_envs.jsonl").is_file():
        pytest.skip("no tests/fixtures/awm scenario yet")
    with env.open(f"{LOANS}@0") as instance:
        first = instance.call_tool("awm_get_book_details", {"book_id": 1})
        second = instance.call_tool("awm_get_book_details", {"book_id": 1})
        assert not first.is_error and not second.is_error, (first.text, second.text)
        assert second.structured["view_count"] == first.structured["view_count"] + 1
        assert [e.index for e in instance.episode.events if isinstance(e, DbChange)] == [1, 2]
        loan = instance.call_tool("awm_borrow_book", {"book_id": 1, "days": 14})
        assert not loan.is_error, loan.text
        assert loan.structured["borrowed_at"] == _clock(instance, 3).now.removesuffix("Z")
        assert replay_episode(env.worlds, instance.episode) == instance.hash()
        instance.reset()
        assert instance.hash() == instance.record.world_hash


def test_the_code_reads_the_frozen_clock(quirks: Instance) -> None:
    first = quirks.call_tool("awm_server_clock", {})
    second = quirks.call_tool("awm_server_clock", {})
    for index, result in ((1, first), (2, second)):
        clock = _clock(quirks, index)
        assert result.structured == {"utcnow": clock.now.removesuffix("Z"),
                                     "now": clock.now.removesuffix("Z"),
                                     "time": clock.millis / 1000}


def test_a_body_a_dependency_and_uuid4_are_deterministic(env: Environment) -> None:
    outcomes = []
    for _ in range(2):
        with env.open("quirks@0") as instance:
            result = instance.call_tool("awm_create_article", {"author_id": 2,
                                                                "title": "Compilers"})
            assert not result.is_error, result.text
            outcomes.append((result.text, instance.hash()))
            article = result.structured["article"]
            assert (article["id"], article["author_name"]) == (3, "Grace")
            missing = instance.call_tool("awm_create_article", {"author_id": 9,
                                                                 "title": "x"})
            assert missing.is_error and "Author not found" in missing.text
    assert outcomes[0] == outcomes[1]


def test_a_route_without_operation_id_and_a_list_result(quirks: Instance) -> None:
    result = quirks.call_tool("awm_list_authors_api_authors_get", {})
    assert not result.is_error and result.structured is None
    assert json.loads(result.text) == [{"id": 1, "name": "Ada"}, {"id": 2, "name": "Grace"}]
    tool = next(t for t in quirks.list_tools() if t.name.startswith("awm_list_authors"))
    # FastAPI's summary from the function's name, its description from the docstring
    assert tool.description.startswith("List Authors\n\nNo operation_id: FastAPI generates")


def test_generated_code_bugs_are_error_results(quirks: Instance) -> None:
    bug = quirks.call_tool("awm_author_stats", {"author_id": 2})  # no articles: 0 / 0
    assert bug.is_error and bug.text == (
        "Error calling author_stats. Status code: 500. Response: Internal Server Error")
    none = quirks.call_tool("awm_author_stats", {"author_id": 99})  # None.articles
    assert none.is_error and "Status code: 500" in none.text
    missing = quirks.call_tool("awm_view_article", {"article_id": 99})
    assert missing.is_error and missing.text == (
        'Error calling view_article. Status code: 404. Response: {"detail":"Article not '
        'found"}')
    flushed = quirks.call_tool("awm_retitle_then_fail", {"article_id": 1, "title": "Gone"})
    assert flushed.is_error and "409" in flushed.text
    assert quirks.hash() == quirks.record.world_hash  # uncommitted work was rolled back
    ok = quirks.call_tool("awm_author_stats", {"author_id": 1})  # the worker lives on
    assert ok.structured == {"author_id": 1, "total_views": 3, "average_views": 1.5}
    # the generated code ran in the worker only, never in this process
    assert not [m for m in sys.modules if m.startswith("awm_scenario_")]


# --- bare operation_id names -----------------------------------------------------------


def test_bare_names_in_tools_and_meta_mode(env: Environment) -> None:
    with env.open("quirks@0", bare_names=True) as instance:
        names = [t.name for t in instance.list_tools()]
        assert names == sorted(operation_ids(QUIRKS_CODE))
        assert not instance.call_tool("view_article", {"article_id": 2}).is_error
        assert instance.call_tool("awm_view_article", {"article_id": 2}).is_error
        assert [e.tool for e in instance.episode.events if isinstance(e, ToolCall)] == [
            "view_article", "awm_view_article"]

        async def session() -> None:
            async with Client(instance_server(instance)) as client:
                listed = sorted(t.name for t in await client.list_tools())
                assert listed == names
                got = await client.call_tool("view_article", {"article_id": 2})
                assert got.structured_content["views"] == 2
            async with Client(instance_server(instance, "meta")) as client:
                catalogue = await client.call_tool("list_tools", {})
                assert [t["name"] for t in catalogue.structured_content["result"]] == names
                called = await client.call_tool("call_tool", {
                    "tool_name": "view_article", "arguments": '{"article_id": 2}'})
                assert json.loads(called.content[0].text)["views"] == 3

        asyncio.run(session())
    with env.open("quirks@0") as default:
        assert all(t.name.startswith("awm_") for t in default.list_tools())


def test_the_bare_names_environment_option(worlds: Worlds, tmp_path: Path) -> None:
    with Environment(worlds, bare_names=True) as env, env.open(f"{CP}@0") as instance:
        assert "search_channels" in {t.name for t in instance.list_tools()}
        assert not instance.call_tool("search_channels", {"query": "x"}).is_error



def test_bare_names_through_the_gateway(env: Environment) -> None:
    """A gateway instance created with bare names, in meta-tool mode, through the real
    fastmcp client and the official MCP SDK client over streamable HTTP."""
    gateway = Gateway(env, max_instances=4)
    with served(gateway) as base, httpx2.Client(base_url=base, timeout=30) as rest:
        bad = rest.post("/instances", json={"world": "quirks@0", "bare_names": "yes"})
        assert bad.status_code == 400 and "bare_names" in bad.text
        made = rest.post("/instances", json={"world": "quirks@0", "mode": "meta",
                                             "bare_names": True})
        assert made.status_code == 201, made.text
        info = made.json()
        assert info["bare_names"] is True and info["tools"] == 7
        url = base + info["mcp_url"]

        async def clients() -> tuple[list[str], str, list[str], str]:
            async with Client(url, timeout=30) as client:
                listed = await client.call_tool("list_tools", {})
                names = [t["name"] for t in listed.structured_content["result"]]
                got = await client.call_tool("call_tool", {
                    "tool_name": "view_article", "arguments": {"article_id": 1}})
            async with httpx2.AsyncClient(timeout=30) as http, \
                        streamable_http_client(url, http_client=http) as (read, write), \
                        ClientSession(read, write) as session:
                await session.initialize()
                sdk_list = await session.call_tool("list_tools", {})
                sdk_names = [t["name"] for t in json.loads(
                    sdk_list.content[0].text)]  # type: ignore[union-attr]
                sdk_got = await session.call_tool("call_tool", {
                    "tool_name": "view_article", "arguments": {"article_id": 1}})
            return (names, got.content[0].text, sdk_names,
                    sdk_got.content[0].text)  # type: ignore[union-attr]

        names, text, sdk_names, sdk_text = asyncio.run(clients())
        assert names == sdk_names == sorted(operation_ids(QUIRKS_CODE))
        assert json.loads(text)["views"] == 4 and json.loads(sdk_text)["views"] == 5
        episode = rest.get(f"/instances/{info['id']}/episode").json()
        assert [e["tool"] for e in episode["events"] if "tool" in e] == [
            "view_article", "view_article"]
        closed = rest.delete(f"/instances/{info['id']}")  # stores the episode
        assert closed.status_code == 200 and closed.json()["stored"], closed.text
