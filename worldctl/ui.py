"""``worldctl ui``: a read-only web view of the store, for people debugging a world.

Pages (server-rendered HTML, no script, no external resource, one inline style sheet):

* ``/``: the personas, with their days and last event;
* ``/p/<persona>``: its days (events, first and last timestamps, world hash) and a form
  to diff two of them;
* ``/p/<persona>/<day>``: the day's services and tables (rows per table) and its
  workspace files;
* ``/p/<persona>/<day>/t/<service>/<table>?page=N&q=TEXT``: the table's rows, 50 a page,
  searchable (rows where any column contains TEXT);
* ``/p/<persona>/<day>/f/<path>``: a workspace file: text shown escaped, an image shown
  (``/raw/<persona>/<day>/<path>`` serves its bytes);
* ``/diff?a=REF&b=REF``: the row- and file-level diff of two worlds (``worldctl diff``);
* ``/episodes`` and ``/episodes/<id>``: stored episodes, and one as a timeline of calls
  with their results and effects.

Everything is read from snapshots (pinned while a page reads them) through read-only
connections; workspace files are read with ``replay.files.read_regular`` (no symlink is
followed, nothing but a regular file is opened). Like the gateway, without a token it
answers only requests addressed to a loopback host (and from no or a loopback origin),
and it refuses to listen beyond loopback without one; with a token every request needs
``Authorization: Bearer <token>`` (or ``?token=`` on the first page, kept in a cookie).
"""

from __future__ import annotations

import hmac
import html
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import click

from envs.episode import DbChange, FileChange, ShellCall
from envs.episodes_store import list_episodes, load_episode
from envs.gateway import from_loopback
from replay.engine import Worlds
from replay.files import read_regular
from replay.layout import WORKSPACE, service_db
from replay.sqlite import open_readonly, quote_ident
from worldstore.errors import ConfigError, NotFoundError, WorldError
from worldstore.names import check_relpath

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

PAGE_ROWS = 50
SHOWN_FILE_BYTES = 256 * 1024
CELL_CHARS = 200
IMAGE_TYPES = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"),
               (b"GIF87a", "image/gif"), (b"GIF89a", "image/gif"))
STYLE = """body{font:14px/1.4 sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;
text-align:left;vertical-align:top}th{background:#eee}pre{background:#f6f6f6;padding:.5em;
overflow:auto}.nav{margin-bottom:1em}.muted{color:#777}img{max-width:100%}"""


class _HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class WorldsUI:
    """The ASGI app of ``worldctl ui`` over one store (see the module docstring)."""

    def __init__(self, worlds: Worlds, *, token: str | None = None) -> None:
        self.worlds = worlds
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = (await receive())["type"]
                if message == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        try:
            status, kind, body, extra = self.respond(scope)
        except _HttpError as exc:
            status, kind, body, extra = exc.status, "text/html", _page(
                "error", f"<p>error: {html.escape(str(exc))}</p>").encode(), []
        except WorldError as exc:
            status, kind, body, extra = 404 if isinstance(exc, NotFoundError) else 400, \
                "text/html", _page("error", f"<p>error: {html.escape(str(exc))}</p>").encode(), []
        headers = [(b"content-type", f"{kind}; charset=utf-8".encode() if kind.startswith(
            "text/") else kind.encode()), (b"content-length", str(len(body)).encode()),
            (b"content-security-policy", b"default-src 'none'; img-src 'self'; "
                                         b"style-src 'unsafe-inline'; form-action 'self'"),
            (b"x-content-type-options", b"nosniff"), *extra]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    # --- routing ----------------------------------------------------------------------

    def respond(self, scope: Scope) -> tuple[int, str, bytes, list[tuple[bytes, bytes]]]:
        """(status, content type, body, extra headers) of one GET."""
        extra = self._check_access(scope)
        if scope["method"] not in ("GET", "HEAD"):
            raise _HttpError(405, "the UI is read-only: GET only")
        path = urllib.parse.unquote(scope["path"])
        query = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1"))
        parts = [p for p in path.split("/") if p]
        if path == "/favicon.ico":
            return 204, "image/x-icon", b"", extra
        if parts[:1] == ["raw"] and len(parts) >= 4:
            kind, data = self.raw(parts[1], _day(parts[2]), "/".join(parts[3:]))
            return 200, kind, data, extra
        page = self._page(parts, query)
        return 200, "text/html", page.encode(), extra

    def _page(self, parts: list[str], query: dict[str, list[str]]) -> str:
        if not parts:
            return self.personas()
        if parts[0] == "diff":
            return self.diff(_one(query, "a"), _one(query, "b"))
        if parts[0] == "episodes":
            return self.episode(parts[1]) if len(parts) == 2 else self.episodes()
        if parts[0] == "p" and len(parts) == 2:
            return self.days(parts[1])
        if parts[0] == "p" and len(parts) == 3:
            return self.day(parts[1], _day(parts[2]))
        if parts[0] == "p" and len(parts) == 6 and parts[3] == "t":
            page = _int(query.get("page", ["1"])[0], "page")
            return self.table(parts[1], _day(parts[2]), parts[4], parts[5], page,
                              query.get("q", [""])[0])
        if parts[0] == "p" and len(parts) >= 5 and parts[3] == "f":
            return self.file(parts[1], _day(parts[2]), "/".join(parts[4:]))
        raise _HttpError(404, f"no page {'/'.join(parts)!r}")

    def _check_access(self, scope: Scope) -> list[tuple[bytes, bytes]]:
        if self.token is None:
            if not from_loopback(scope):
                raise _HttpError(403, "without a token the UI only answers requests for a "
                                     "loopback host from no or a loopback origin")
            return []
        headers = {bytes(k).lower(): bytes(v).decode("latin-1") for k, v in scope["headers"]}
        query = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1"))
        given = [headers.get(b"authorization", "").removeprefix("Bearer ").strip(),
                 *query.get("token", []), _cookie(headers.get(b"cookie", ""), "ui_token")]
        if not any(g and hmac.compare_digest(g.encode(), self.token.encode()) for g in given):
            raise _HttpError(401, "missing or wrong token (send 'Authorization: Bearer "
                                 "<token>', or open a page with ?token=<token>)")
        cookie = f"ui_token={self.token}; HttpOnly; SameSite=Strict; Path=/"
        return [(b"set-cookie", cookie.encode())]

    # --- pages ------------------------------------------------------------------------

    def personas(self) -> str:
        rows = [[_a(f"/p/{_q(p.persona)}", p.persona), str(p.n_days), str(p.last_day),
                 p.last_ts] for p in self.worlds.store.personas()]
        body = _table(["persona", "days", "last day", "last event"], rows,
                      empty="The store holds no world yet.")
        return _page("worlds", body + '<p>' + _a("/episodes", "stored episodes") + "</p>")

    def days(self, persona: str) -> str:
        records = self.worlds.store.days(persona)
        if not records:
            raise _HttpError(404, f"no persona {persona!r} in the store")
        rows = [[_a(f"/p/{_q(persona)}/{r.day}", f"day {r.day}"), str(r.n_events),
                 r.first_ts, r.last_ts, f"<code>{r.world_hash}</code>"] for r in records]
        options = "".join(f'<option value="{html.escape(persona)}@{r.day}">day {r.day}</option>'
                          for r in records)
        form = (f'<form action="/diff" method="get">diff <select name="a">{options}</select> '
                f'with <select name="b">{options}</select> <button>diff</button></form>')
        return _page(persona, _nav(persona) + _table(
            ["day", "events", "first event", "last event", "world hash"], rows) + form)

    def day(self, persona: str, day: int) -> str:
        record = self.worlds.store.day(persona, day)
        manifest = self.worlds.manifest(record)
        base = f"/p/{_q(persona)}/{day}"
        tables = [[html.escape(service), _a(f"{base}/t/{_q(service)}/{_q(table)}", table),
                   str(digest.rows)] for service, m in sorted(manifest.services.items())
                  for table, digest in sorted(m.tables.items())]
        files = [[_a(f"{base}/f/{_q(path, safe='/')}", path), str(entry.size)]
                 for path, entry in sorted(manifest.files.items())]
        return _page(f"{persona}@{day}", _nav(persona, day) + (
            f"<p>world hash <code>{record.world_hash}</code>, {record.n_events} events, "
            f"{html.escape(record.first_ts)} to {html.escape(record.last_ts)}</p>"
            "<h2>Services</h2>" + _table(["service", "table", "rows"], tables,
                                         empty="No service.")
            + "<h2>Workspace</h2>" + _table(["file", "bytes"], files, empty="No file.")))

    def table(self, persona: str, day: int, service: str, table: str, page: int,
              search: str) -> str:
        record = self.worlds.store.day(persona, day)
        found = self.worlds.manifest(record).services.get(service)
        if found is None or table not in found.tables:
            raise _HttpError(404, f"no table {service}.{table} in {persona}@{day}")
        with self.worlds.pinned(persona, day) as world, \
                open_readonly(service_db(world, service)) as conn:
            columns = [str(r[1]) for r in conn.execute(
                f"PRAGMA table_info({quote_ident(table)})")]
            where, params = _search(columns, search)
            counted: Any = conn.execute(f"SELECT count(*) FROM {quote_ident(table)}{where}",
                                        params).fetchall()[0][0]
            total = int(counted)
            rows = list(conn.execute(
                f"SELECT * FROM {quote_ident(table)}{where} ORDER BY rowid LIMIT ? OFFSET ?",
                [*params, PAGE_ROWS, (page - 1) * PAGE_ROWS]))
        base = f"/p/{_q(persona)}/{day}/t/{_q(service)}/{_q(table)}"
        pages = max(1, -(-total // PAGE_ROWS))
        keep = f"&q={_q(search)}" if search else ""
        links = " ".join(_a(f"{base}?page={n}{keep}", str(n)) if n != page else f"<b>{n}</b>"
                         for n in range(1, pages + 1) if n <= 20 or n in (pages, page))
        form = (f'<form action="{base}" method="get">search <input name="q" value="'
                f'{html.escape(search)}"> <button>find</button></form>')
        body = _table(columns, [[_cell(v) for v in row] for row in rows],
                      empty="No row." if not search else "No row contains that.")
        return _page(f"{service}.{table}", _nav(persona, day) + form
                     + f"<p>{total} rows{' found' if search else ''}; page {page} of {pages}</p>"
                     + body + f"<p>{links}</p>")

    def file(self, persona: str, day: int, path: str) -> str:
        kind, data = self.raw(persona, day, path)
        raw = f"/raw/{_q(persona)}/{day}/{_q(path, safe='/')}"
        if kind.startswith("image/"):
            shown = f'<img src="{raw}" alt="{html.escape(path)}">'
        else:
            text = data[:SHOWN_FILE_BYTES].decode("utf-8", "replace")
            cut = (f"<p class=muted>(the first {SHOWN_FILE_BYTES:,} of {len(data):,} "
                   "bytes)</p>") if len(data) > SHOWN_FILE_BYTES else ""
            shown = f"<pre>{html.escape(text)}</pre>{cut}"
        return _page(path, _nav(persona, day) + f"<p>{len(data):,} bytes, "
                     f"{_a(raw, 'raw')}</p>" + shown)

    def raw(self, persona: str, day: int, path: str) -> tuple[str, bytes]:
        check_relpath(path)  # a PathError (400) names what is wrong with it
        record = self.worlds.store.day(persona, day)
        entry = self.worlds.manifest(record).files.get(path)
        if entry is None:
            raise _HttpError(404, f"no file {path!r} in {persona}@{day}")
        with self.worlds.pinned(persona, day) as world:
            data = read_regular(world / WORKSPACE / path, limit=entry.size)
        if data is None:
            raise _HttpError(404, f"{path!r} in {persona}@{day} is not a regular file")
        kind = next((k for magic, k in IMAGE_TYPES if data.startswith(magic)), "text/plain")
        return kind, data

    def diff(self, a: str, b: str) -> str:
        found = self.worlds.diff(a, b)
        rows = [[html.escape(f"{t.service}.{t.table}"), t.change, str(t.added),
                 str(t.removed), str(t.changed)] for t in found.tables]
        files = [[html.escape(f.path), f.change, str(f.size_before or ""),
                  str(f.size_after or ""),
                  f"<pre>{html.escape(chr(10).join(f.text_diff or []))}</pre>"]
                 for f in found.files]
        return _page(f"{a} → {b}", f'<div class=nav>{_a("/", "worlds")}</div>'
                     f"<p><code>{found.before}</code> → <code>{found.after}</code></p>"
                     + "<h2>Tables</h2>" + _table(["table", "change", "added", "removed",
                                                   "changed"], rows, empty="No change.")
                     + "<h2>Files</h2>" + _table(["file", "change", "bytes before",
                                                  "bytes after", "diff"], files,
                                                 empty="No change."))

    def episodes(self) -> str:
        rows = [[_a(f"/episodes/{_q(s.episode_id)}", s.episode_id[:12]),
                 html.escape(f"{s.persona}@{s.day}"), html.escape(s.agent or ""),
                 html.escape(s.task or ""), str(len(s.calls)), str(s.n_errors)]
                for s in list_episodes(self.worlds)]
        return _page("episodes", f'<div class=nav>{_a("/", "worlds")}</div>' + _table(
            ["episode", "start", "agent", "task", "calls", "errors"], rows,
            empty="No stored episode."))

    def episode(self, episode_id: str) -> str:
        episode = load_episode(self.worlds, episode_id)
        effects: dict[int, list[str]] = {}
        for event in episode.events:
            if isinstance(event, DbChange):
                effects.setdefault(event.index, []).append(f"db: {event.service}")
            elif isinstance(event, FileChange):
                change = "deleted" if event.data is None else f"{len(event.data)} bytes"
                effects.setdefault(event.index, []).append(f"file {event.path}: {change}")
        rows = []
        for call in episode.calls:
            if isinstance(call, ShellCall):
                what, result = f"shell: {call.command}", call.stdout + call.stderr
            else:
                what, result = call.tool, call.text
            rows.append([str(call.index), html.escape(call.ts), html.escape(what),
                         f"<pre>{html.escape(result[:2000])}</pre>",
                         html.escape(", ".join(effects.get(call.index, [])))])
        head = (f'<div class=nav>{_a("/episodes", "episodes")}</div><p>'
                f"{html.escape(episode.persona)}@{episode.day}, agent "
                f"{html.escape(episode.agent or '-')}, answer "
                f"{html.escape(episode.answer or '-')}</p>")
        return _page(f"episode {episode_id[:12]}", head + _table(
            ["#", "time", "call", "result", "effects"], rows, empty="No call."))


# --- helpers ------------------------------------------------------------------------------




def _page(title: str, body: str) -> str:
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>'
            f"{html.escape(title)} · agent-worlds</title><style>{STYLE}</style></head><body>"
            f"<h1>{html.escape(title)}</h1>{body}</body></html>")


def _nav(persona: str, day: int | None = None) -> str:
    links = [_a("/", "worlds"), _a(f"/p/{_q(persona)}", persona)]
    if day is not None:
        links.append(_a(f"/p/{_q(persona)}/{day}", f"day {day}"))
    return '<div class="nav">' + " / ".join(links) + "</div>"


def _a(href: str, text: str) -> str:
    return f'<a href="{html.escape(href)}">{html.escape(text)}</a>'


def _q(text: str, safe: str = "") -> str:
    return urllib.parse.quote(text, safe=safe)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, empty: str = "") -> str:
    if not rows:
        return f"<p class=muted>{html.escape(empty)}</p>"
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _cell(value: object) -> str:
    if value is None:
        return "<span class=muted>NULL</span>"
    if isinstance(value, bytes):
        return f"<span class=muted>&lt;{len(value)} bytes&gt;</span>"
    text = str(value)
    return html.escape(text if len(text) <= CELL_CHARS else text[:CELL_CHARS] + " …")


def _search(columns: Sequence[str], text: str) -> tuple[str, list[str]]:
    if not text:
        return "", []
    like = "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    clause = " OR ".join(f"CAST({quote_ident(c)} AS TEXT) LIKE ? ESCAPE '\\'"
                         for c in columns)
    return f" WHERE {clause}", [like] * len(columns)


def _day(text: str) -> int:
    return _int(text, "day")


def _int(text: str, what: str) -> int:
    if not text.isdigit() or len(text) > 9 or int(text) < (1 if what == "page" else 0):
        raise _HttpError(400, f"{what} {text!r} is not a number")
    return int(text)


def _one(query: dict[str, list[str]], name: str) -> str:
    values = query.get(name, [])
    if len(values) != 1 or not values[0]:
        raise _HttpError(400, f"give exactly one {name}= (a persona@day or a world hash)")
    return values[0]


def _cookie(header: str, name: str) -> str:
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return ""


DEFAULT_PORT = 8790


@click.command("ui")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (beyond loopback only with --token).")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(1, 65535))
@click.option("--token", default=None, envvar="WORLDCTL_UI_TOKEN",
              help="Bearer token every request needs (env WORLDCTL_UI_TOKEN); required "
                   "beyond loopback.")
@click.pass_context
def ui_cmd(ctx: click.Context, host: str, port: int, token: str | None) -> None:
    """A read-only web view of the store: worlds, days, tables, files, diffs, episodes.

    For people debugging worlds: personas and their days with hashes, a day's tables (rows
    paged and searchable) and workspace files (text, images), the diff of two days, stored
    episodes as timelines."""
    try:
        import uvicorn
    except ImportError:
        raise click.ClickException("worldctl ui needs uvicorn: pip install "
                                   "'agent-worlds[envs]'") from None
    from envs.gateway import is_loopback
    from worldctl.envs import check_port_free
    from worldctl.session import worlds

    if not is_loopback(host) and not (token and token.strip()):
        raise ConfigError(f"refusing to serve the UI on {host!r} without a token: anyone who "
                          "can reach it could read every world; set one (--token or "
                          "WORLDCTL_UI_TOKEN) or bind to 127.0.0.1")
    check_port_free(host, port)
    click.echo(f"worldctl ui: http://{host}:{port}/" + ("?token=..." if token else ""))
    config = uvicorn.Config(WorldsUI(worlds(ctx), token=token), host=host, port=port,
                            lifespan="on", log_level="warning")
    uvicorn.Server(config).run()


__all__ = ["DEFAULT_PORT", "PAGE_ROWS", "WorldsUI", "ui_cmd"]
