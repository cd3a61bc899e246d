"""``worldctl ui`` (worldctl/ui.py): the read-only web view over a real store holding the
bundled demo world and a stored episode, served by a real uvicorn on a loopback port, read
with real HTTP requests (pages, search, paging, files, images, diffs, episodes, refusals,
the token) and rendered by headless Chromium from Debian's package (each main page's
screenshot exists and has a size, and its DOM says what the page is about)."""

from __future__ import annotations

import html
import http.client
import shutil
import subprocess
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from asgi_server import served

from envs.episodes_store import save_episode
from envs.instance import Environment
from packs.registry import load_pack
from replay.engine import Worlds
from worldctl.ui import PAGE_ROWS, WorldsUI

PNG = (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x02\x00\x00"
       b"\x00\x90wS\xde\x00\x00\x00\x0cIDATx\x9cc\xf8\xcf\xc0\x00\x00\x03\x01\x01\x00\xc9\xfe"
       b"\x92\xef\x00\x00\x00\x00IEND\xaeB`\x82")


@contextmanager
def on_port(app: WorldsUI) -> Iterator[int]:
    with served(app) as base:
        yield int(base.rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Worlds, str]]:
    root = tmp_path_factory.mktemp("ui")
    with Worlds.open(root / "store") as worlds:
        worlds.import_file(load_pack("demo").worlds[0])
        with Environment(worlds) as env, env.open("lars@7") as instance:
            instance.call_tool("notes_create_note", {"notebook_id": 1, "title": "UI check",
                                                     "body": "<script>alert(1)</script>"})
            instance.shell("printf 'hello\\n' > hello.txt")
            episode_id = save_episode(worlds, instance)
        yield worlds, episode_id


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
    import io

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


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install chromium)")
@pytest.mark.parametrize(("path", "text"), [
    ("/", "persona"), ("/p/lars", "world hash"), ("/p/lars/7", "Workspace"),
    ("/p/lars/7/t/shop/orders", "page 1 of 1"), ("/diff?a=lars@6&b=lars@7", "Files"),
])
def test_headless_chromium_renders_the_main_pages(store: tuple[Worlds, str], tmp_path: Path,
                                                  path: str, text: str) -> None:
    worlds, _ = store
    assert CHROMIUM is not None
    shot = tmp_path / "page.png"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'profile'}"]
    with on_port(WorldsUI(worlds)) as port:
        url = f"http://127.0.0.1:{port}{urllib.parse.quote(path, safe='/?=&@')}"
        subprocess.run([CHROMIUM, *flags, "--window-size=1280,900", f"--screenshot={shot}",
                        url], capture_output=True, timeout=120, check=False)
        dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", url], capture_output=True,
                             timeout=120, check=False, text=True).stdout
    assert shot.is_file() and shot.stat().st_size > 5000
    assert shot.read_bytes().startswith(b"\x89PNG")
    assert "agent-worlds" in dom and text in dom
