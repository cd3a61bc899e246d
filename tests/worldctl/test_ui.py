"""``worldctl ui`` (worldctl/ui/): the read-only web view over a real store holding the
bundled demo world and a stored episode, served by a real uvicorn on a loopback port, read
with real HTTP requests (pages, search, paging, files, images, diffs of days and of a
checkout, episodes, tasks with gate reports written by ``worldctl task check --report``,
eval runs made by ``worldctl eval run`` and ``eval report``, refusals, the token) and
loaded in headless Chromium from Debian's package over the DevTools protocol (tests/support/cdp.py:
each main page loads with no console error and no failed resource, its screenshot exists
and has a size, and its DOM says what the page is about)."""

from __future__ import annotations

import html
import http.client
import io
import json
import os
import re
import shutil
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
from markupsafe import escape

from gates.contract import GateReport, GateResult, to_json
from packs.registry import load_pack
from replay.engine import Worlds
from replay.hashing import hash_world
from synth.worlds.tasks import TaskRecord
from tests.support.asgi_server import served
from tests.support.cdp import Browser
from tests.support.cli_harness import invoke, refused
from worldctl.ui import PAGE_ROWS, WorldsUI, synth_records, task_index
from worldctl.ui.sources import wilson
from worldenv.core.episode import Episode
from worldenv.instances.episodes import load_episode, save_episode
from worldenv.instances.instance import Environment

DEMO = load_pack("demo")
CHECKED = "nordlys-cart-vs-bom"  # the task with gate reports (see `site`)
RECORDED = "mats-work-order"  # the task whose report is a synthesis run's task record
EVALUATED = ("nordlys-delivery-checklist", "sagene-easter-quote")  # the eval run's tasks
# The store holds the demo's first world, Lars's; the pack's other tasks are on worlds it
# lacks.
LARS = [name for name in DEMO.tasks
        if json.loads((DEMO.task_dir(name) / "task.json").read_text())["world"].startswith(
            "lars@")]

PNG = (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x02\x00\x00"
       b"\x00\x90wS\xde\x00\x00\x00\x0cIDATx\x9cc\xf8\xcf\xc0\x00\x00\x03\x01\x01\x00\xc9\xfe"
       b"\x92\xef\x00\x00\x00\x00IEND\xaeB`\x82")


@contextmanager
def on_port(app: WorldsUI) -> Iterator[int]:
    with served(app) as base:
        yield int(base.rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ui") / "store"


@pytest.fixture(scope="module")
def store(store_dir: Path) -> Iterator[tuple[Worlds, str]]:
    with Worlds.open(store_dir) as worlds:
        worlds.import_file(load_pack("demo").worlds[0])
        with Environment(worlds) as env, env.open("lars@7") as instance:
            instance.call_tool("notes_create_note", {"notebook_id": 1, "title": "UI check",
                                                     "body": "<script>alert(1)</script>"})
            instance.shell("printf 'hello\\n' > hello.txt")
            instance.gui("open", {"url": "/shop/cart"})  # a GUI call with its screenshot
            episode_id = save_episode(worlds, instance)
        yield worlds, episode_id


@dataclass(frozen=True)
class Site:
    """What the UI is given beside the store, all made by the real commands."""

    worlds: Worlds
    episode_id: str
    reports: Path  # gate reports, as `worldctl task check --report` writes them
    runs: Path  # eval runs: ref (finished, reported), half (killed early), broken
    checkout: Path  # lars@3 checked out, a workspace file added and one edited by hand

    def app(self, *, tasks: dict[str, Path] | None = None) -> WorldsUI:
        return WorldsUI(self.worlds, tasks=task_index(()) if tasks is None else tasks,
                        reports=[self.reports], runs=[self.runs])


@pytest.fixture(scope="module")
def site(store: tuple[Worlds, str], store_dir: Path) -> Site:
    worlds, episode_id = store
    root = store_dir.parent
    reports, runs = root / "reports", root / "runs"
    (reports / "older").mkdir(parents=True)
    checked = invoke("--store", str(store_dir), "task", "check", str(DEMO.task_dir(CHECKED)),
                     "--report", str(reports / f"{CHECKED}.json"))
    assert checked.exit_code == 0, checked.output
    # An older report of the same task that was rejected: the accepted one is the latest.
    older = GateReport(task_id=CHECKED, accepted=False, rounds=[[GateResult(
        gate="solvability", status="failed", reason="reference_fails")]])
    (reports / "older" / "first-try.json").write_bytes(to_json(older))
    os.utime(reports / "older" / "first-try.json", (1_000_000_000, 1_000_000_000))
    (reports / "lars").mkdir()
    (reports / "lars" / f"{RECORDED}.json").write_bytes(msgspec.json.encode(record(RECORDED)))
    (reports / "notes.json").write_text('{"not": "a report"}')  # passed over
    (reports / "older" / "broken.json").write_text("{")  # passed over too
    ran = invoke("--store", str(store_dir), "eval", "run",
                 *(str(DEMO.task_dir(name)) for name in EVALUATED), "--agent",
                 "scripted:reference", "-k", "2", "--out", str(runs / "ref"))
    assert ran.exit_code == 0, ran.output
    assert invoke("eval", "report", str(runs / "ref")).exit_code == 0
    (runs / "half" / "trials").mkdir(parents=True)
    shutil.copy(runs / "ref" / "run.json", runs / "half" / "run.json")
    (runs / "broken").mkdir()
    (runs / "broken" / "run.json").write_text("{}")
    checkout = root / "lars3"
    worlds.checkout("lars@3", checkout)
    (checkout / "workspace" / "by-hand.txt").write_text("added by hand\n")
    with (checkout / "workspace" / "jobs" / "nordlys" / "bom.md").open("a") as bom:
        bom.write("edited by hand\n")
    return Site(worlds, episode_id, reports, runs, checkout)


def record(task_id: str) -> TaskRecord:
    """The record `synth tasks` keeps of a task the gates rejected (RUN/tasks/<persona>/)."""
    return TaskRecord(
        task_id=task_id, persona="lars", day=4, slot=0, round=0, rank=0, asked="hard",
        instruction="Do the thing.", proposal="accepted", candidates=3, diversity="claimed",
        nearest=None, cosine=None, revisions=0, accepted=False, difficulty=None, tokens=0,
        notes=[], rounds=[[{"gate": "judge_consistency", "status": "passed", "reason": "ok"},
                           {"gate": "difficulty", "status": "failed",
                            "reason": "too_easy"}]])


def get(port: int, path: str, headers: dict[str, str] | None = None
        ) -> tuple[int, str, bytes, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path, headers=headers or {})
    response = conn.getresponse()
    body = response.read()
    found = {k.lower(): v for k, v in response.getheaders()}
    conn.close()
    return response.status, found.get("content-type", ""), body, found


def test_the_pages_show_the_store(store: tuple[Worlds, str]) -> None:
    worlds, episode_id = store
    with on_port(WorldsUI(worlds)) as port:
        status, kind, body, headers = get(port, "/")
        assert (status, kind) == (200, "text/html; charset=utf-8")
        assert b'href="/p/lars"' in body and b"<script" not in body.lower()
        assert "default-src 'none'" in headers["content-security-policy"]
        record = worlds.record("lars@7")
        days = get(port, "/p/lars")[2].decode()
        assert record.world_hash in days and 'href="/p/lars/7"' in days
        day = get(port, "/p/lars/7")[2].decode()
        assert 'href="/p/lars/7/t/shop/orders"' in day
        assert 'href="/p/lars/7/f/jobs/nordlys/bom.md"' in day
        rows = get(port, "/p/lars/7/t/notes/notes")[2].decode()
        assert "Invoicing - February" in rows and "page 1 of 1" in rows
        found = get(port, "/p/lars/7/t/notes/notes?q=invoicing")[2].decode()
        assert "1 rows found" in found and "Invoicing - February" in found
        none = get(port, "/p/lars/7/t/notes/notes?q=nothing%25like%25this")[2].decode()
        assert "0 rows found" in none and "No row contains that." in none
        text = get(port, "/p/lars/7/f/jobs/nordlys/bom.md")[2].decode()
        assert "<pre>" in text and "raw" in text
        raw = get(port, "/raw/lars/7/jobs/nordlys/bom.md")
        assert raw[1] == "text/plain; charset=utf-8" and raw[2].startswith(b"#")
        diff = get(port, "/diff?a=lars@6&b=lars@7")[2].decode()
        assert worlds.record("lars@6").world_hash in diff and "<h2>Tables</h2>" in diff
        listed = get(port, "/episodes")[2].decode()
        assert episode_id[:12] in listed
        shown = get(port, f"/episodes/{episode_id}")[2].decode()
        assert "notes_create_note" in shown and "shell: printf" in shown
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in shown  # escaped, never markup
        assert "file hello.txt: 6 bytes" in shown


def test_paging_and_images(store: tuple[Worlds, str], tmp_path: Path) -> None:
    worlds, _ = store
    lines = b"".join(
        f'{{"persona":"pager","day":0,"ts":"2026-01-01T00:00:0{i // 100}Z","type":"sql",'
        f'"service":"s","sql":"INSERT INTO t VALUES ({i}, \'row {i}\')"}}\n'.encode()
        for i in range(120))
    setup = (b'{"persona":"pager","day":0,"ts":"2026-01-01T00:00:00Z","type":"sql",'
             b'"service":"s","sql":"CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)"}\n')
    import base64

    image = (b'{"persona":"pager","day":0,"ts":"2026-01-01T00:00:02Z","type":"file_write",'
             b'"path":"photos/dot.png","base64":"' + base64.b64encode(PNG) + b'"}\n')
    worlds.import_stream(io.BytesIO(setup + lines + image), source="<pager>")
    with on_port(WorldsUI(worlds)) as port:
        first = get(port, "/p/pager/0/t/s/t")[2].decode()
        assert "120 rows; page 1 of 3" in first and "row 49" in first
        assert "row 50" not in first and 'href="/p/pager/0/t/s/t?page=3"' in first
        last = get(port, "/p/pager/0/t/s/t?page=3")[2].decode()
        assert "row 119" in last and "row 99" not in last
        assert PAGE_ROWS == 50
        page = get(port, "/p/pager/0/f/photos/dot.png")[2].decode()
        assert '<img src="/raw/pager/0/photos/dot.png"' in page
        status, kind, body, _ = get(port, "/raw/pager/0/photos/dot.png")
        assert (status, kind, body) == (200, "image/png", PNG)


@pytest.mark.parametrize(("path", "status", "says"), [
    ("/p/nobody", 404, "no persona 'nobody'"),
    ("/p/lars/99", 404, "lars@99"),
    ("/p/lars/7/t/notes/nope", 404, "no table notes.nope in lars@7"),
    ("/p/lars/7/f/missing.txt", 404, "no file 'missing.txt' in lars@7"),
    ("/raw/lars/7/../../../etc/passwd", 400, "path"),
    ("/p/lars/x", 400, "day 'x' is not a number"),
    ("/p/lars/7/t/notes/notes?page=0", 400, "page '0' is not a number"),
    ("/diff?a=lars@7", 400, "give exactly one b="),
    ("/nothing/here", 404, "no page 'nothing/here'"),
])
def test_refusals_are_one_error_line(store: tuple[Worlds, str], path: str, status: int,
                                     says: str) -> None:
    worlds, _ = store
    with on_port(WorldsUI(worlds)) as port:
        got, _, body, _ = get(port, path)
    assert got == status, body
    assert "<p>error: " in body.decode() and says in html.unescape(body.decode())


def test_loopback_only_without_a_token_and_the_token_when_given(
        store: tuple[Worlds, str]) -> None:
    worlds, _ = store
    with on_port(WorldsUI(worlds)) as port:
        assert get(port, "/", {"Host": "example.com"})[0] == 403
        assert get(port, "/", {"Origin": "http://evil.test"})[0] == 403
    with on_port(WorldsUI(worlds, token="s3cret")) as port:
        assert get(port, "/")[0] == 401
        assert get(port, "/", {"Authorization": "Bearer wrong"})[0] == 401
        assert get(port, "/", {"Authorization": "Bearer s3cret"})[0] == 200
        status, _, _, headers = get(port, "/?token=s3cret")
        assert status == 200 and "HttpOnly" in headers["set-cookie"]
        assert get(port, "/p/lars", {"Cookie": "ui_token=s3cret"})[0] == 200


def test_tasks_with_their_artifacts_and_latest_gate_report(site: Site) -> None:
    with on_port(site.app()) as port:
        listed = get(port, "/tasks")[2].decode()
        for name in DEMO.tasks:
            assert f'href="/tasks/{name}"' in listed
        assert listed.count("<span class=ok>in the store</span>") == len(LARS)
        assert listed.count("not in the store") == len(DEMO.tasks) - len(LARS)
        assert 'href="/p/lars/3"' in listed  # the start world, under the hash it pins
        assert "ACCEPTED (hard)" in listed  # the latest report, not the older one
        assert "REJECTED" in listed  # the synthesis run's record of RECORDED
        assert listed.count("none found") == len(DEMO.tasks) - 2
        assert str(site.reports) in listed
        page = get(port, f"/tasks/{CHECKED}")[2].decode()
        task = DEMO.task_dir(CHECKED)
        spec = json.loads((task / "task.json").read_text())
        assert escape(spec["instruction"]) in page
        for subtask in spec["subtasks"]:
            assert escape(subtask["description"]) in page
        assert escape((task / "hint.md").read_text()) in page
        assert escape((task / "rubric.md").read_text()) in page
        for step in json.loads((task / "solution.json").read_text())["steps"]:
            assert escape(step.get("tool") or step.get("command") or step["text"]) in page
        for script in ("answer.py", "cart.py", "report.py"):
            source = (task / "verifier" / script).read_text()
            assert f"{script} <span class=muted>(script)</span>" in page
            assert escape(source) in page  # the source, escaped
        assert f"{CHECKED}.json" in page and "first-try.json" not in page
        assert "solvability" in page and "<details><summary>evidence" in page
        assert "scripted:" in page  # the rollouts task check stored, as episodes
        assert "<script" not in page.lower()
        recorded = get(port, f"/tasks/{RECORDED}")[2].decode()
        assert "REJECTED" in recorded and "too_easy" in recorded
        bare = get(port, "/tasks/sagene-easter-quote")[2].decode()
        assert "No gate report found." in bare and str(site.reports) in bare


def test_a_task_whose_world_the_store_lacks_or_holds_otherwise(site: Site,
                                                             tmp_path: Path) -> None:
    other, missing = tmp_path / "other", tmp_path / "missing"
    for folder, change in ((other, {"world_hash": "0" * 32}), (missing, {"world": "nobody@0"})):
        shutil.copytree(DEMO.task_dir(CHECKED), folder)
        spec = json.loads((folder / "task.json").read_text())
        spec.update(change, task_id=folder.name)
        (folder / "task.json").write_text(json.dumps(spec))
    tasks = task_index([str(tmp_path)])
    assert sorted(tasks) == ["missing", "other"]
    with on_port(site.app(tasks=tasks)) as port:
        listed = get(port, "/tasks")[2].decode()
        assert "not in the store" in listed and "in the store under another hash" in listed
        assert site.worlds.record("lars@3").world_hash in listed
        assert get(port, "/tasks/missing")[0] == 200
        assert get(port, f"/tasks/{CHECKED}")[0] == 404  # only the tasks it was given
        (missing / "hint.md").unlink()  # broken since the UI started: said, not a crash
        assert "error: " in get(port, "/tasks")[2].decode()
        status, _, body, _ = get(port, "/tasks/missing")
        assert status == 400 and "hint.md" in body.decode()


def test_tasks_of_a_synthesis_run_find_its_task_records(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")
    shutil.copytree(DEMO.task_dir(RECORDED), run / "pack" / "run" / "tasks" / RECORDED)
    (run / "tasks" / "lars").mkdir(parents=True)
    (run / "tasks" / "lars" / f"{RECORDED}.json").write_bytes(
        msgspec.json.encode(record(RECORDED)))
    tasks = task_index([str(run / "pack" / "run" / "tasks")])
    assert synth_records(tasks.values()) == [(run / "tasks").resolve()]
    assert synth_records(task_index(()).values()) == []  # the shipped pack is no run's


def test_eval_runs_and_their_reports(site: Site) -> None:
    with on_port(site.app()) as port:
        listed = get(port, "/runs")[2].decode()
        assert 'href="/runs/ref"' in listed and 'href="/runs/ref/report.html"' in listed
        assert "scripted:reference" in listed and "not finished" in listed
        assert "error: " in listed and "broken" in listed  # its row says what is wrong
        run = get(port, "/runs/ref")[2].decode()
        results = json.loads((site.runs / "ref" / "results.json").read_text())
        assert results["run"]["run_id"] in run and "success_rate" in run
        for task in results["tasks"]:
            assert f'href="/tasks/{task["task_id"]}"' in run
            for trial in task["trials"]:
                assert f'href="/episodes/{trial["episode_id"]}"' in run
        assert 'href="/runs/ref/report.md"' in run and "older than" not in run
        status, kind, body, headers = get(port, "/runs/ref/report.html")
        assert (status, kind) == (200, "text/html; charset=utf-8")
        assert body == (site.runs / "ref" / "report.html").read_bytes()
        policy = headers["content-security-policy"]
        assert "default-src 'none'" in policy and "sandbox" in policy
        md = get(port, "/runs/ref/report.md")
        assert md[1] == "text/plain; charset=utf-8" and md[2].startswith(b"#")
        half = get(port, "/runs/half")[2].decode()
        assert "Not finished" in half and "0 trial files" in half


def test_diff_of_a_day_and_a_checkout(site: Site) -> None:
    path = urllib.parse.quote(str(site.checkout))
    with on_port(site.app()) as port:
        forward = get(port, f"/diff?a=lars@3&b={path}")[2].decode()
        assert hash_world(site.checkout) in forward
        assert site.worlds.record("lars@3").world_hash in forward
        assert "<td>by-hand.txt</td><td>added</td>" in forward
        assert "<td>jobs/nordlys/bom.md</td><td>changed</td>" in forward
        assert "+edited by hand" in forward  # the unified diff of the text file
        backward = get(port, f"/diff?a={path}&b=lars@3")[2].decode()
        assert "<td>by-hand.txt</td><td>removed</td>" in backward
        assert "-edited by hand" in backward
        assert 'placeholder="/path/to/checkout"' in get(port, "/p/lars")[2].decode()


@pytest.mark.parametrize(("path", "status", "says"), [
    ("/tasks/nope", 404, "no task 'nope'"),
    ("/tasks/a/b", 404, "no page 'tasks/a/b'"),
    ("/runs/nope", 404, "no eval run 'nope'"),
    ("/runs/broken", 400, "run.json: not a run file"),
    ("/runs/half/report.html", 404, "no report.html in"),
    ("/diff?a=lars@3&b=/nonexistent/lars3", 400, "/nonexistent/lars3: not a directory"),
    ("/diff?a={runs}&b=lars@3", 400, "{runs}: not a world checkout"),
    ("/diff?a=lars@3&b={runs}/ref", 400, "{runs}/ref: not a world checkout"),
])
def test_refusals_of_tasks_runs_and_checkouts(site: Site, path: str, status: int,
                                              says: str) -> None:
    runs = str(site.runs)
    with on_port(site.app()) as port:
        got, _, body, _ = get(port, path.replace("{runs}", urllib.parse.quote(runs)))
    text = html.unescape(body.decode())
    assert got == status, text
    assert "<p>error: " in text and says.replace("{runs}", runs) in text


def test_the_command_refuses_bad_sources(store_dir: Path, tmp_path: Path) -> None:
    nowhere = tmp_path / "nowhere"
    line = refused(invoke("--store", str(store_dir), "ui", "--tasks", str(nowhere)))
    assert str(nowhere) in line
    line = refused(invoke("--store", str(store_dir), "ui", "--runs", str(nowhere)))
    assert "--runs" in line and str(nowhere) in line
    line = refused(invoke("--store", str(store_dir), "ui", "--reports", str(nowhere)))
    assert "--reports" in line and str(nowhere) in line
    twin = tmp_path / "twin"
    shutil.copytree(DEMO.task_dir(CHECKED), twin)
    line = refused(invoke("--store", str(store_dir), "ui", "--tasks", "demo", "--tasks",
                          str(twin)))
    assert f"task id '{CHECKED}' is in both" in line and str(twin) in line
    assert sorted(task_index(())) == sorted(DEMO.tasks)  # no --tasks: every pack's


# --- headless Chromium --------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None,
                                    reason="no Chromium (apt-get install chromium)")


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    assert CHROMIUM is not None
    with Browser(CHROMIUM, tmp_path_factory.mktemp("chromium")) as opened:
        yield opened


@pytest.fixture(scope="module")
def site_port(site: Site) -> Iterator[int]:
    with on_port(site.app()) as port:
        yield port


@needs_chromium
def test_the_console_check_sees_what_goes_wrong(browser: Browser, site_port: int) -> None:
    # A page of the test's own, not the UI's: it logs an error, throws, and loads an
    # image the UI answers 404 for; all three must be reported, or the check sees nothing.
    # So must a page the UI answers with an error.
    page = ("<p>broken</p><script>console.error('logged'); missing.call()</script>"
            f'<img src="http://127.0.0.1:{site_port}/raw/lars/7/nothing.png">')
    found = browser.load("data:text/html," + urllib.parse.quote(page))
    text = "\n".join(found.problems)
    assert "console.error: logged" in text and "missing is not defined" in text
    assert any(p.startswith("failed to load") and "nothing.png" in p for p in found.problems)
    refused = browser.load(f"http://127.0.0.1:{site_port}/tasks/nope")  # a page of errors
    assert any(p.startswith("HTTP 404") for p in refused.problems), refused.problems


@needs_chromium
@pytest.mark.parametrize(("path", "text"), [
    ("/", "persona"), ("/p/lars", "world hash"), ("/p/lars/7", "Workspace"),
    ("/p/lars/7/t/shop/orders", "page 1 of 1"), ("/diff?a=lars@6&b=lars@7", "Files"),
    ("/p/lars/7/f/img/rack-label.png", "raw"), ("/episodes", "episode"),
    ("/tasks", "gate report"), (f"/tasks/{CHECKED}", "Reference solution"),
    ("/runs", "avg reward"), ("/runs/ref", "success_rate"),
    ("/runs/ref/report.html", "Evaluation of scripted:reference"),
    ("/diff?a=lars@3&b={checkout}", "by-hand.txt"),
])
def test_headless_chromium_loads_the_main_pages_cleanly(
        browser: Browser, site: Site, site_port: int, tmp_path: Path, path: str,
        text: str) -> None:
    path = path.replace("{checkout}", str(site.checkout))
    url = f"http://127.0.0.1:{site_port}{urllib.parse.quote(path, safe='/?=&@')}"
    loaded = browser.load(url)
    assert loaded.problems == [], loaded.problems
    shot = tmp_path / "page.png"
    shot.write_bytes(loaded.screenshot)
    assert shot.stat().st_size > 5000 and shot.read_bytes().startswith(b"\x89PNG")
    assert text in loaded.dom
    if not path.endswith("report.html"):
        assert "agent-worlds" in loaded.dom


def test_an_episode_shows_its_gui_screenshots(store: tuple[Worlds, str]) -> None:
    worlds, episode_id = store
    with on_port(WorldsUI(worlds)) as port:
        page = get(port, f"/episodes/{episode_id}")[2].decode()
        assert "gui: open /shop/cart" in page
        digest = page.split(f"/episodes/{episode_id}/screenshots/")[1].split('"')[0]
        status, kind, body, _headers = get(port, f"/episodes/{episode_id}/screenshots/{digest}")
        assert (status, kind) == (200, "image/png") and body.startswith(b"\x89PNG")
        assert body == load_episode(worlds, episode_id).screenshots[digest]
        status, _kind, body, _headers = get(port, f"/episodes/{episode_id}/screenshots/0000")
        assert status == 404 and "keeps no screenshot" in body.decode()


# --- tables without a rowid, the run headline, the episode list, ids, diff defaults ---------


def test_a_without_rowid_table_pages_and_searches(store: tuple[Worlds, str]) -> None:
    worlds, _ = store
    statements = ["CREATE TABLE stock (site TEXT NOT NULL, sku TEXT NOT NULL, qty INTEGER, "
                  "PRIMARY KEY (site, sku)) WITHOUT ROWID",
                  *(f"INSERT INTO stock VALUES ('oslo', 'sku-{n:03d}', {n})"
                    for n in (5, 1, 3)),
                  "INSERT INTO stock VALUES ('oslo', 'sku_x', 0)"]
    worlds.import_stream(io.BytesIO("".join(
        json.dumps({"persona": "keyed", "day": 0, "ts": "2026-01-01T00:00:00Z",
                    "type": "sql", "service": "inv", "sql": sql}) + "\n"
        for sql in statements).encode()), source="<keyed>")
    with on_port(WorldsUI(worlds)) as port:
        status, _, body, _ = get(port, "/p/keyed/0/t/inv/stock")
        page = body.decode()
        assert status == 200, page
        assert "4 rows; page 1 of 1" in page
        shown = [page.index(f"<td>{sku}</td>") for sku in ("sku-001", "sku-003", "sku-005",
                                                            "sku_x")]
        assert shown == sorted(shown)  # primary-key order, not the order of insertion
        found = get(port, "/p/keyed/0/t/inv/stock?q=sku_")[2].decode()
        assert "1 rows found" in found and "<td>sku_x</td>" in found  # '_' taken literally
        assert 'href="/p/keyed/0/t/inv/stock"' in get(port, "/p/keyed/0")[2].decode()


def wilson_95(successes: int, n: int) -> tuple[float, float]:
    z = 1.959963984540054
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5
    return max(0.0, centre - half), min(1.0, centre + half)


def test_the_interval_is_wilsons() -> None:
    assert wilson(3, 3) == pytest.approx((0.4385, 1.0), abs=1e-4)
    assert wilson(0, 3) == pytest.approx((0.0, 0.5615), abs=1e-4)
    assert wilson(7, 20) == pytest.approx(wilson_95(7, 20))


def test_a_run_page_leads_with_its_headline(site: Site) -> None:
    results = json.loads((site.runs / "ref" / "results.json").read_text())
    trials = [t for task in results["tasks"] for t in task["trials"]]
    n, passed = len(trials), sum(t["success"] for t in trials)
    low, high = wilson_95(passed, n)
    with on_port(site.app()) as port:
        page = get(port, "/runs/ref")[2].decode()
    head, _, rest = page.partition("<details>")
    assert rest, "the other metrics are folded in a details element"
    assert f"<th>pass rate</th><td><b>{passed / n:.1%}</b>" in head
    assert f"95% interval {low:.1%} to {high:.1%}" in head
    assert f"{n} trials ({passed} passed) over {len(results['tasks'])} tasks" in head
    mean_steps = sum(t["steps"] for t in trials) / n
    assert f"<th>mean steps</th><td>{mean_steps:.1f}</td>" in head
    assert "<th>cost</th>" not in head  # no trial of a scripted agent has a cost
    summary, _, folded = rest.partition("</details>")
    assert "<summary>All " in summary
    for key in ("success_rate", "pass@k.1", "latency.p50", "tokens.in.total"):
        assert f"<td>{key}</td>" in summary and key not in head
    assert 'href="/episodes/' in folded  # the trials come after the fold


def _episode_rows(page: str) -> dict[str, str]:
    rows = {}
    for row in page.split("<tr>")[1:]:
        if 'href="/episodes/' in row:
            rows[row.split('href="/episodes/')[1].split('"')[0]] = row
    return rows


def test_the_episode_list_has_times_and_verdicts(site: Site) -> None:
    results = json.loads((site.runs / "ref" / "results.json").read_text())
    with on_port(site.app()) as port:
        page = get(port, "/episodes")[2].decode()
        rows = _episode_rows(page)
        for trial in [t for task in results["tasks"] for t in task["trials"]]:
            row = rows[trial["episode_id"]]
            verdict = "<span class=ok>passed</span>" if trial["success"] \
                else "<span class=bad>failed</span>"
            assert f'{verdict} (<a href="/runs/ref">ref</a>, trial ' in row
        assert "not graded" in rows[site.episode_id]
        times = []
        for episode_id, row in rows.items():
            calls = load_episode(site.worlds, episode_id).calls
            time = calls[0].ts if calls else "-"
            assert row.split("</td><td>")[1] == time
            times.append(time)
        assert times == sorted(times, reverse=True)  # newest first
        graded = next(iter(t["episode_id"] for t in results["tasks"][0]["trials"]))
        shown = get(port, f"/episodes/{graded}")[2].decode()
        assert "verdict <span class=" in shown and 'href="/runs/ref"' in shown


@pytest.fixture(scope="module")
def lone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worlds]:
    """A store with one persona of one day, and episodes with ids chosen to share
    prefixes (a bare Episode keeps the id it is saved under)."""
    with Worlds.open(tmp_path_factory.mktemp("lone") / "store") as worlds:
        worlds.import_stream(io.BytesIO(json.dumps(
            {"persona": "solo", "day": 0, "ts": "2026-01-01T00:00:00Z", "type": "sql",
             "service": "s", "sql": "CREATE TABLE t (id INTEGER PRIMARY KEY)"}).encode()
            + b"\n"), source="<solo>")
        start = worlds.record("solo@0").world_hash
        for episode_id in ("feed01aa", "feed02bb", "c0ffee"):
            save_episode(worlds, Episode(episode_id=episode_id, world_hash=start,
                                         persona="solo", day=0, final_hash=start))
        yield worlds


@pytest.mark.parametrize(("given", "status", "says"), [
    ("c0ffee", 200, "c0ffee"),
    ("c0f", 200, "c0ffee"),
    ("c", 200, "c0ffee"),
    ("feed02", 200, "feed02bb"),
    ("feed", 400, "episode prefix 'feed' is ambiguous: 2 stored episodes start so "
                  "(feed01aa, feed02bb)"),
    ("beef", 404, "no stored episode 'beef'"),
])
def test_an_episode_id_prefix_resolves_when_unique(lone: Worlds, given: str, status: int,
                                                   says: str) -> None:
    with on_port(WorldsUI(lone)) as port:
        got, _, body, _ = get(port, f"/episodes/{given}")
    text = html.unescape(body.decode())
    assert got == status, text
    if status == 200:
        assert f"<code>{says}</code>" in text and "No call." in text
    else:
        assert "<p>error: " in text and says in text


def _selected(form: str) -> dict[str, list[str]]:
    return {name: re.findall(r'<option value="([^"]+)" selected>', options)
            for name, options in re.findall(r'<select name="(\w)">(.*?)</select>', form)}


def test_the_diff_form_starts_at_the_latest_change(store: tuple[Worlds, str],
                                                   lone: Worlds) -> None:
    worlds, _ = store
    last = worlds.store.days("lars")[-1].day
    with on_port(WorldsUI(worlds)) as port:
        days, checkout = get(port, "/p/lars")[2].decode().split("<form")[1:]
    assert _selected(days) == {"a": [f"lars@{last - 1}"], "b": [f"lars@{last}"]}
    assert _selected(checkout) == {"a": [f"lars@{last}"]}
    with on_port(WorldsUI(lone)) as port:  # one day: that day on both sides
        days, _ = get(port, "/p/solo")[2].decode().split("<form")[1:]
    assert _selected(days) == {"a": ["solo@0"], "b": ["solo@0"]}


def test_the_ui_is_read_only(store: tuple[Worlds, str]) -> None:
    worlds, _ = store
    with on_port(WorldsUI(worlds)) as port:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", "/p/lars", body=b"x=1")
        response = conn.getresponse()
        body = response.read().decode()
        conn.close()
    assert response.status == 405 and "error: the UI is read-only: GET only" in body
    assert response.getheader("x-content-type-options") == "nosniff"
