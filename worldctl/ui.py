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
  either side may be the path of a world checkout on the server's disk (any side with a
  ``/``: a reference never has one);
* ``/episodes`` and ``/episodes/<id>``: stored episodes, and one as a timeline of calls
  with their results and effects;
* ``/tasks`` and ``/tasks/<id>``: the tasks given (``--tasks``, as ``worldctl serve``
  reads them; default every shipped and installed pack's), whether each one's start world
  is in the store under the hash it pins, and its latest gate report; one task with all
  its artifacts (instruction, subtasks, hint, rubric, reference solution, the verifier's
  source) and its stored episodes;
* ``/runs`` and ``/runs/<name>``: eval run folders (``--runs``, default ``./runs``), one
  with its configuration, metrics and trials; ``/runs/<name>/report.html`` and
  ``report.md`` serve the report ``worldctl eval report`` wrote (the HTML under the same
  policy, sandboxed).

Gate reports are files: ``worldctl task check --report FILE`` writes one wherever it is
told, so the UI reads the folders ``--reports`` names (and the task records a synthesis
run keeps beside its pack) and shows, per task, the one modified last.

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
import json
import os
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import msgspec

from eval.contract import Results, RunInfo, decode_results
from eval.errors import EvalError
from eval.runner import RESULTS_FILE, RUN_FILE, TRIALS_DIR, load_run_info
from gates.contract import (
    Artifact,
    GateReport,
    GateResult,
    GuiStep,
    ShellStep,
    TaskSpec,
    ToolStep,
)
from gates.quality import failure_detail, render_report
from gates.task import Task, load_task, task_folders
from packs.registry import list_packs
from replay.engine import Worlds
from replay.files import read_regular
from replay.layout import APPS, SERVICES, WORKSPACE, check_world_dir, service_db
from replay.sqlite import open_readonly, quote_ident
from worldenv.core.episode import DbChange, FileChange, GuiCall, ShellCall, ToolCall
from worldenv.instances.episodes import list_episodes, load_episode
from worldenv.serving.gateway import from_loopback
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
overflow:auto}.nav{margin-bottom:1em}.muted{color:#777}img{max-width:100%}
pre.text{white-space:pre-wrap}.ok{color:#170}.bad{color:#a00}"""
CSP = (b"default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; "
       b"form-action 'self'")
# The policy of a served eval report: `sandbox` gives it an opaque origin with no script,
# form or plugin, whatever its HTML holds.
SANDBOXED = CSP + b"; sandbox"
REPORT_FILES = {"report.html": "text/html", "report.md": "text/plain"}
MAX_REPORT_FILES = 10_000  # JSON files looked at per reports folder, per page
MAX_JSON_BYTES = 64 * 1024 * 1024
EVIDENCE_CHARS = 20_000


class _HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class WorldsUI:
    """The ASGI app of ``worldctl ui`` over one store (see the module docstring)."""

    def __init__(self, worlds: Worlds, *, token: str | None = None,
                 tasks: Mapping[str, Path] | None = None, reports: Sequence[Path] = (),
                 runs: Sequence[Path] = ()) -> None:
        self.worlds = worlds
        self.token = token
        self.tasks = dict(tasks or {})  # task id -> its folder (see task_index)
        self.reports = GateReports(reports)
        self.runs = list(runs)

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
            (b"x-content-type-options", b"nosniff"), *extra]
        if not any(name == b"content-security-policy" for name, _ in extra):
            headers.append((b"content-security-policy", CSP))
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
        if parts[:1] == ["episodes"] and len(parts) == 4 and parts[2] == "screenshots":
            return 200, "image/png", self.screenshot(parts[1], parts[3]), extra
        if parts[:1] == ["runs"] and len(parts) == 3 and parts[2] in REPORT_FILES:
            return 200, REPORT_FILES[parts[2]], self.run_report(parts[1], parts[2]), \
                [*extra, (b"content-security-policy", SANDBOXED)]
        page = self._page(parts, query)
        return 200, "text/html", page.encode(), extra

    def _page(self, parts: list[str], query: dict[str, list[str]]) -> str:
        if not parts:
            return self.personas()
        if parts[0] == "diff":
            return self.diff(_one(query, "a"), _one(query, "b"))
        if parts[0] == "episodes":
            return self.episode(parts[1]) if len(parts) == 2 else self.episodes()
        if parts[0] in ("tasks", "runs") and len(parts) <= 2:
            if parts[0] == "tasks":
                return self.task(parts[1]) if len(parts) == 2 else self.task_list()
            return self.run(parts[1]) if len(parts) == 2 else self.run_list()
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
        links = " · ".join([_a("/episodes", "stored episodes"), _a("/tasks", "tasks"),
                            _a("/runs", "eval runs")])
        return _page("worlds", body + f"<p>{links}</p>")

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
        checkout = (f'<form action="/diff" method="get">diff <select name="a">{options}'
                    '</select> with the checkout <input name="b" size="40" '
                    'placeholder="/path/to/checkout"> <button>diff</button></form>')
        return _page(persona, _nav(persona) + _table(
            ["day", "events", "first event", "last event", "world hash"], rows) + form
            + checkout)

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
        side_a, side_b = _diff_side(a), _diff_side(b)
        try:
            found = self.worlds.diff(side_a, side_b)
        except OSError as exc:  # a checkout that changed or cannot be read meanwhile
            raise _HttpError(400, f"{exc.filename or a}: cannot be read: "
                                  f"{exc.strerror or exc}") from None
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
            elif isinstance(call, ToolCall):
                what, result = call.tool, call.text
            else:  # a GUI action in the instance's browser (worldenv.gui.tools)
                what, result = f"gui: {call.action} {call.url or ''}".rstrip(), call.text
            shown = f"<pre>{html.escape(result[:2000])}</pre>"
            if isinstance(call, GuiCall) and call.screenshot in episode.screenshots:
                src = f"/episodes/{_q(episode_id)}/screenshots/{call.screenshot}"
                shown += (f'<a href="{src}"><img class=shot src="{src}" width=384 '
                          f'alt="screenshot after {html.escape(call.action)}"></a>')
            elif isinstance(call, GuiCall) and call.screenshot:
                shown += f"<p>screenshot {call.screenshot} (not kept)</p>"
            rows.append([str(call.index), html.escape(call.ts), html.escape(what), shown,
                         html.escape(", ".join(effects.get(call.index, [])))])
        head = (f'<div class=nav>{_a("/episodes", "episodes")}</div><p>'
                f"{html.escape(episode.persona)}@{episode.day}, agent "
                f"{html.escape(episode.agent or '-')}, answer "
                f"{html.escape(episode.answer or '-')}</p>")
        return _page(f"episode {episode_id[:12]}", head + _table(
            ["#", "time", "call", "result", "effects"], rows, empty="No call."))

    def screenshot(self, episode_id: str, digest: str) -> bytes:
        """A GUI call's screenshot kept in a stored episode (PNG)."""
        data = load_episode(self.worlds, episode_id).screenshots.get(digest)
        if data is None or not data.startswith(IMAGE_TYPES[0][0]):
            raise _HttpError(404, f"episode {episode_id} keeps no screenshot {digest!r}")
        return data

    # --- tasks ------------------------------------------------------------------------

    def task_list(self) -> str:
        reports = self.reports.latest()
        rows = [self._task_row(task_id, folder, reports.get(task_id))
                for task_id, folder in sorted(self.tasks.items())]
        return _page("tasks", _top() + _table(
            ["task", "world", "interfaces", "difficulty", "start world", "gate report"], rows,
            empty="No task: give task folders or packs with --tasks.") + self._report_note())

    def _task_row(self, task_id: str, folder: Path, found: FoundReport | None) -> list[str]:
        link = _a(f"/tasks/{_q(task_id)}", task_id)
        verdict = "<span class=muted>none found</span>" if found is None else html.escape(
            _verdict(found.report))
        try:
            spec = load_task(folder).spec
        except WorldError as exc:  # edited into a broken folder since the UI started
            return [link, f"<span class=bad>error: {html.escape(str(exc))}</span>", "", "",
                    "", verdict]
        return [link, html.escape(spec.world), html.escape(", ".join(spec.interfaces)),
                html.escape(spec.difficulty), self._start_world(spec), verdict]

    def _start_world(self, spec: TaskSpec) -> str:
        try:
            record = self.worlds.resolve(spec.world)
        except NotFoundError:
            return "<span class=bad>not in the store</span>"
        if record.world_hash != spec.world_hash:
            return (f"<span class=bad>in the store under another hash</span> "
                    f"(<code>{record.world_hash}</code>)")
        return (f"<span class=ok>in the store</span>, "
                f"{_a(f'/p/{_q(record.persona)}/{record.day}', 'pinned hash')}")

    def _report_note(self) -> str:
        where = ", ".join(str(f) for f in self.reports.folders)
        return ("<p class=muted>Gate reports: the latest JSON report per task (from "
                "<code>worldctl task check --report FILE</code>) in "
                + (html.escape(where) if where else "no folder (give one with --reports)")
                + ".</p>")

    def task(self, task_id: str) -> str:
        folder = self.tasks.get(task_id)
        if folder is None:
            raise _HttpError(404, f"no task {task_id!r} among the {len(self.tasks)} tasks "
                                  "the UI was given")
        task = load_task(folder)
        spec = task.spec
        facts = [["folder", f"<code>{html.escape(str(folder))}</code>"],
                 ["world", f"{html.escape(spec.world)}, pinned hash "
                           f"<code>{html.escape(spec.world_hash)}</code>"],
                 ["start world", self._start_world(spec)],
                 ["interfaces", html.escape(", ".join(spec.interfaces))],
                 ["difficulty", html.escape(spec.difficulty)],
                 ["source", html.escape(spec.source or "-")]]
        subtasks = [[str(i), html.escape(s.description), html.escape(s.interface)]
                    for i, s in enumerate(spec.subtasks, 1)]
        body = (_top(("/tasks", "tasks")) + _facts(facts)
                + f'<h2>Instruction</h2><pre class="text">{html.escape(spec.instruction)}</pre>'
                + "<h2>Subtasks</h2>" + _table(["#", "subtask", "interface"], subtasks)
                + _artifact("Hint", task, "hint", task.hint)
                + _artifact("Rubric", task, "rubric", task.rubric)
                + "<h2>Reference solution</h2>" + _solution(task)
                + "<h2>Verifier</h2>" + _verifier(task)
                + "<h2>Latest gate report</h2>"
                + self._gate_report(self.reports.latest().get(task_id))
                + "<h2>Stored episodes</h2>" + self._task_episodes(task_id))
        return _page(f"task {task_id}", body)

    def _gate_report(self, found: FoundReport | None) -> str:
        if found is None:
            return "<p><b>No gate report found.</b></p>" + self._report_note()
        report = found.report
        when = datetime.fromtimestamp(found.mtime, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        rounds = "".join(
            (f"<h3>Round {i}</h3>" if len(report.rounds) > 1 else "")
            + _table(["#", "gate", "status", "reason", "evidence"],
                     [_gate_row(n, r) for n, r in enumerate(results, 1)])
            for i, results in enumerate(report.rounds, 1))
        return (f"<p><b>{html.escape(_verdict(report))}</b>, from "
                f"<code>{html.escape(str(found.path))}</code> (modified {when})</p>"
                f"<pre>{html.escape(render_report(report))}</pre>" + rounds)

    def _task_episodes(self, task_id: str) -> str:
        rows = [[_a(f"/episodes/{_q(s.episode_id)}", s.episode_id[:12]),
                 html.escape(f"{s.persona}@{s.day}"), html.escape(s.agent or ""),
                 str(len(s.calls)), str(s.n_errors)]
                for s in list_episodes(self.worlds, task=task_id)]
        return _table(["episode", "start", "agent", "calls", "errors"], rows,
                      empty="No stored episode of this task.")

    # --- eval runs --------------------------------------------------------------------

    def run_list(self) -> str:
        rows = [self._run_row(name, folder) for name, folder in run_folders(self.runs)]
        where = ", ".join(str(f) for f in self.runs) or "no folder (give one with --runs)"
        return _page("eval runs", _top() + _table(
            ["run", "agent", "k", "split", "started", "tasks", "success", "pass@1",
             "avg reward", "lost", "report"], rows, empty="No eval run found.")
            + f"<p class=muted>Run folders in {html.escape(where)}.</p>")

    def _run_row(self, name: str, folder: Path) -> list[str]:
        link = _a(f"/runs/{_q(name)}", name)
        try:
            info, results = _load_run(folder)
        except WorldError as exc:
            return [link, f"<span class=bad>error: {html.escape(str(exc))}</span>",
                    *[""] * 9]
        metrics = results.metrics if results is not None else {}
        shown = [_metric(metrics.get("success_rate")),
                 _metric(_mapping(metrics.get("pass@k")).get("1")),
                 _metric(metrics.get("avg_reward")), _metric(metrics.get("trials_lost"))]
        report = _a(f"/runs/{_q(name)}/report.html", "report") \
            if (folder / "report.html").is_file() else "<span class=muted>none</span>"
        tasks = str(len(results.tasks)) if results is not None \
            else "<span class=muted>not finished</span>"
        return [link, html.escape(info.agent), str(info.k), html.escape(info.split or "-"),
                html.escape(info.started), tasks, *shown, report]

    def run(self, name: str) -> str:
        folder = self._run_folder(name)
        info, results = _load_run(folder)
        body = _top(("/runs", "eval runs")) + _facts(_run_facts(folder, info))
        body += "<h2>Report</h2>" + self._report_links(name, folder)
        if results is None:
            trials = sum(1 for _ in (folder / TRIALS_DIR).glob("*.json"))
            body += (f"<p><b>Not finished</b>: no {RESULTS_FILE} yet; {trials} trial files "
                     f"in {TRIALS_DIR}/ (the same <code>worldctl eval run</code> resumes "
                     "it).</p>")
            return _page(f"eval run {name}", body)
        body += "<h2>Metrics</h2>" + _table(["metric", "value"], [
            [html.escape(key), _metric(value)] for key, value in _flat(results.metrics)])
        body += "<h2>Tasks</h2>" + self._run_tasks(results)
        return _page(f"eval run {name}", body)

    def _run_folder(self, name: str) -> Path:
        for found, folder in run_folders(self.runs):
            if found == name:
                return folder
        raise _HttpError(404, f"no eval run {name!r} in "
                              f"{', '.join(str(f) for f in self.runs) or 'no run folder'}")

    def _report_links(self, name: str, folder: Path) -> str:
        present = [f for f in REPORT_FILES if (folder / f).is_file()]
        if not present:
            return (f"<p>No report in the folder (<code>worldctl eval report "
                    f"{html.escape(str(folder))}</code> writes report.html and report.md); "
                    "the metrics below are read from results.json.</p>")
        links = " · ".join(_a(f"/runs/{_q(name)}/{f}", f) for f in present)
        results = folder / RESULTS_FILE
        stale = results.is_file() and any(
            results.stat().st_mtime > (folder / f).stat().st_mtime for f in present)
        return f"<p>{links}" + (" <span class=bad>(older than results.json: run "
                                "<code>worldctl eval report</code> again)</span>"
                                if stale else "") + "</p>"

    def _run_tasks(self, results: Results) -> str:
        rows = []
        for task in results.tasks:
            name = _a(f"/tasks/{_q(task.task_id)}", task.task_id) \
                if task.task_id in self.tasks else html.escape(task.task_id)
            trials = "<br>".join(
                f"{_a(f'/episodes/{_q(t.episode_id)}', f'trial {t.trial}')}: "
                f"V={t.V}, reward {_metric(t.reward)}, {html.escape(t.termination)}"
                + (f", <span class=bad>{html.escape(t.error)}</span>" if t.error else "")
                for t in task.trials)
            rows.append([name, html.escape(task.difficulty),
                         html.escape(", ".join(task.interfaces)),
                         f"{sum(t.success for t in task.trials)}/{len(task.trials)}", trials])
        return _table(["task", "difficulty", "interfaces", "successes", "trials"], rows,
                      empty="No task.")

    def run_report(self, name: str, file: str) -> bytes:
        path = self._run_folder(name) / file
        if not path.is_file():
            raise _HttpError(404, f"no {file} in {path.parent} (worldctl eval report writes "
                                  "it)")
        data = read_regular(path, limit=MAX_JSON_BYTES)
        if data is None:
            raise _HttpError(400, f"{path}: larger than {MAX_JSON_BYTES:,} bytes")
        return data


# --- sources: tasks, gate reports, eval runs ----------------------------------------------


def task_index(sources: Sequence[str], installed: Path | None = None) -> dict[str, Path]:
    """The task folders the UI shows, by task id: those of `sources` (each as ``worldctl
    serve --tasks`` reads it: a task folder, a folder of them, or a pack), or with none
    given every shipped and installed pack's. Each must load now (TaskError names the
    file and field); an id in two folders is refused, as ``serve`` refuses it."""
    if sources:
        folders = [f for source in sources for f in task_folders(source, installed)]
    else:
        folders = [p.task_dir(name) for p in list_packs(installed) for name in p.tasks]
    index: dict[str, Path] = {}
    for folder in folders:
        task_id = load_task(folder).task_id
        if task_id in index and index[task_id].resolve() != folder.resolve():
            raise ConfigError(f"task id {task_id!r} is in both {index[task_id]} and {folder}")
        index[task_id] = folder
    return index


def synth_records(folders: Iterable[Path]) -> list[Path]:
    """The task-record folders of the synthesis runs whose packs hold `folders`: ``synth
    tasks`` keeps every task's gate rounds in RUN/tasks/<persona>/ beside the pack
    RUN/pack/<run>/, which is where the gate reports of those tasks already are."""
    found: list[Path] = []
    for folder in folders:
        pack = folder.resolve().parent.parent
        run = pack.parent.parent
        records = run / "tasks"
        if (pack.parent.name == "pack" and (run / "run.json").is_file()
                and records.is_dir() and records not in found):
            found.append(records)
    return found


@dataclass(frozen=True)
class FoundReport:
    report: GateReport
    path: Path
    mtime: float


class GateReports:
    """The gate reports in some folders: every ``*.json`` directly in one or a level down
    that decodes as a ``GateReport`` (what ``worldctl task check --report`` writes; a
    synthesis run's task record has the same fields) and reached the gates. Other JSON
    files are passed over: a folder of reports may hold anything else too. Folders are
    read again on every page, so a new report shows without a restart; a file is decoded
    again only when it changed."""

    def __init__(self, folders: Sequence[Path]) -> None:
        self.folders = list(folders)
        self._decoded: dict[Path, tuple[tuple[int, int], GateReport | None]] = {}

    def latest(self) -> dict[str, FoundReport]:
        """Per task id, the report modified last (ties: the later path)."""
        found: dict[str, FoundReport] = {}
        for path, stat in self._files():
            report = self._decode(path, stat)
            if report is None:
                continue
            known = found.get(report.task_id)
            if known is None or (stat.st_mtime, str(path)) >= (known.mtime, str(known.path)):
                found[report.task_id] = FoundReport(report, path, stat.st_mtime)
        return found

    def _files(self) -> Iterator[tuple[Path, os.stat_result]]:
        for folder in self.folders:
            yield from _json_files(folder, depth=2, limit=MAX_REPORT_FILES)

    def _decode(self, path: Path, stat: os.stat_result) -> GateReport | None:
        key = (stat.st_mtime_ns, stat.st_size)
        cached = self._decoded.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        report: GateReport | None = None
        try:
            data = read_regular(path, limit=MAX_JSON_BYTES)
            if data is not None:
                report = msgspec.json.decode(data, type=GateReport)
        except (OSError, WorldError, msgspec.DecodeError):
            report = None
        if report is not None and not report.rounds:
            report = None  # a task record of a candidate that never reached the gates
        self._decoded[path] = (key, report)
        return report


def _json_files(folder: Path, *, depth: int, limit: int
                ) -> Iterator[tuple[Path, os.stat_result]]:
    """Regular ``*.json`` files in `folder` and its subfolders down to `depth` levels,
    sorted, at most `limit` (no symlink is followed)."""
    pending, seen = [(folder, depth)], 0
    while pending and seen < limit:
        current, left = pending.pop(0)
        try:
            entries = sorted(os.scandir(current), key=lambda e: e.name)
        except OSError:
            continue  # removed or unreadable meanwhile: nothing to show from it
        for entry in entries:
            if entry.is_dir(follow_symlinks=False) and left > 1:
                pending.append((Path(entry.path), left - 1))
            elif entry.name.endswith(".json") and entry.is_file(follow_symlinks=False):
                seen += 1
                yield Path(entry.path), entry.stat(follow_symlinks=False)
                if seen >= limit:
                    return


def run_folders(sources: Sequence[Path]) -> list[tuple[str, Path]]:
    """The eval run folders of `sources` (each a run folder, holding run.json, or a folder
    of them), read now, each named by its folder; a name taken already gets -2, -3, ..."""
    folders: list[Path] = []
    for source in sources:
        if (source / RUN_FILE).is_file():
            folders.append(source)
        elif source.is_dir():
            folders += sorted(p for p in source.iterdir() if (p / RUN_FILE).is_file())
    named: list[tuple[str, Path]] = []
    for folder in folders:
        base = folder.resolve().name
        name, n = base, 2
        while any(name == taken for taken, _ in named):
            name, n = f"{base}-{n}", n + 1
        named.append((name, folder))
    return named


def _load_run(folder: Path) -> tuple[RunInfo, Results | None]:
    """A run folder's configuration, and its results once it has finished."""
    info = load_run_info(folder / RUN_FILE)
    path = folder / RESULTS_FILE
    if not path.is_file():
        return info, None
    data = read_regular(path, limit=MAX_JSON_BYTES)
    if data is None:
        raise EvalError(f"{path}: larger than {MAX_JSON_BYTES:,} bytes")
    try:
        return info, decode_results(data)
    except msgspec.DecodeError as exc:
        raise EvalError(f"{path}: not a results file of eval.contract: {exc}") from None


def _diff_side(text: str) -> str | Path:
    """A side of /diff: a reference, or (with a '/', which no reference has) the path of
    a world checkout on this machine, refused unless it is one."""
    if "/" not in text:
        return text
    folder = Path(text)
    if not folder.is_dir():
        raise _HttpError(400, f"{text}: not a directory (a side with a '/' is the path of "
                              "a world checkout)")
    try:
        check_world_dir(folder)
    except OSError as exc:
        raise _HttpError(400, f"{text}: cannot be read: {exc.strerror or exc}") from None
    except WorldError:  # its message names an entry: no listing of other folders
        raise _HttpError(400, f"{text}: not a world checkout (a world holds only "
                              f"{SERVICES}/, {WORKSPACE}/ and {APPS}/)") from None
    if not any((folder / part).is_dir() for part in (SERVICES, WORKSPACE)):
        raise _HttpError(400, f"{text}: not a world checkout (it holds neither {SERVICES}/ "
                              f"nor {WORKSPACE}/)")
    return folder


# --- helpers ------------------------------------------------------------------------------


def _top(*links: tuple[str, str]) -> str:
    return '<div class="nav">' + " / ".join(
        [_a("/", "worlds"), *(_a(href, text) for href, text in links)]) + "</div>"


def _facts(rows: Sequence[Sequence[str]]) -> str:
    """A table of (name, HTML value) rows, the names as row headers."""
    return "<table>" + "".join(f"<tr><th>{html.escape(name)}</th><td>{value}</td></tr>"
                               for name, value in rows) + "</table>"


def _artifact(title: str, task: Task, artifact: Artifact, text: str) -> str:
    if task.lacks(artifact):
        return (f"<h2>{title}</h2><p class=muted>None: task.json declares the {artifact} "
                "absent.</p>")
    return f'<h2>{title}</h2><pre class="text">{html.escape(text)}</pre>'


def _solution(task: Task) -> str:
    if task.lacks("solution"):
        return "<p class=muted>None: task.json declares the solution absent.</p>"
    rows = []
    for i, step in enumerate(task.solution.steps, 1):
        if isinstance(step, ToolStep | GuiStep):
            name, kind = (step.tool, "tool (mcp)") if isinstance(step, ToolStep) \
                else (step.action, "gui")
            arguments = json.dumps(step.arguments, ensure_ascii=False, indent=1)
            what = (f'<code>{html.escape(name)}</code><pre class="text">'
                    f"{html.escape(arguments)}</pre>")
        elif isinstance(step, ShellStep):
            kind, what = "shell", f'<pre class="text">{html.escape(step.command)}</pre>'
        else:  # the final answer
            kind, what = "answer", f'<pre class="text">{html.escape(step.text)}</pre>'
        rows.append([str(i), kind, what])
    return _table(["#", "step", ""], rows)


def _verifier(task: Task) -> str:
    """Every Python file of the verifier folder, escaped: the scripts and their helpers."""
    out = []
    for path in sorted(task.verifier_dir.glob("*.py")):
        role = "script" if path.name in task.scripts else "helper"
        try:
            data = read_regular(path, limit=SHOWN_FILE_BYTES)
        except (OSError, WorldError) as exc:
            out.append(f"<h3>{html.escape(path.name)}</h3><p class=bad>not shown: "
                       f"{html.escape(str(exc))}</p>")
            continue
        shown = "(larger than the UI shows)" if data is None else data.decode("utf-8",
                                                                              "replace")
        out.append(f"<h3>{html.escape(path.name)} <span class=muted>({role})</span></h3>"
                   f"<pre>{html.escape(shown)}</pre>")
    return "".join(out)


def _gate_row(n: int, result: GateResult) -> list[str]:
    detail = failure_detail(result)
    reason = f"{result.reason}: {detail}" if detail else result.reason
    evidence = msgspec.json.format(msgspec.json.encode(result.evidence, order="sorted"),
                                   indent=2).decode()
    if len(evidence) > EVIDENCE_CHARS:
        evidence = evidence[:EVIDENCE_CHARS] + "\n…"
    shown = "" if not result.evidence else \
        f"<details><summary>evidence</summary><pre>{html.escape(evidence)}</pre></details>"
    css = {"passed": "ok", "failed": "bad"}.get(result.status, "muted")
    return [str(n), html.escape(result.gate), f"<span class={css}>{result.status}</span>",
            html.escape(reason), shown]


def _verdict(report: GateReport) -> str:
    # render_report's first line is "task <id>: <verdict>", the one wording of a verdict
    head = render_report(report).partition("\n")[0]
    return head.removeprefix(f"task {report.task_id}: ")


def _run_facts(folder: Path, info: RunInfo) -> list[list[str]]:
    facts: list[tuple[str, object]] = [
        ("folder", folder), ("run id", info.run_id), ("agent", info.agent),
        ("model", info.model or "-"), ("k", info.k), ("split", info.split or "-"),
        ("hinted", info.hinted), ("max steps", info.max_steps), ("history", info.history),
        ("concurrency", info.concurrency), ("tasks from", ", ".join(info.tasks_source)),
        ("started", info.started), ("model server", info.api_base or "-")]
    return [[name, html.escape(str(value))] for name, value in facts]


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _flat(metrics: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, object]]:
    """The metrics as (dotted key, value) rows: nested objects spelled out, lists kept."""
    for key, value in metrics.items():
        if isinstance(value, Mapping) and value:
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _metric(value: object) -> str:
    if value is None:
        return "<span class=muted>-</span>"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | dict):
        return f"<code>{html.escape(json.dumps(value))}</code>"
    return html.escape(str(value))


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
@click.option("--tasks", "task_sources", multiple=True, metavar="DIR|PACK",
              help="Tasks to show: a task folder, a folder of task folders, or a pack name "
                   "(repeatable, as for serve); default: every shipped and installed pack's.")
@click.option("--reports", "report_dirs", multiple=True, metavar="DIR",
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A folder of gate reports (JSON of `worldctl task check --report`), "
                   "itself and its subfolders; each task shows its latest (repeatable).")
@click.option("--runs", "run_dirs", multiple=True, metavar="DIR",
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="An eval run folder or a folder of them (repeatable; default: ./runs "
                   "when it exists).")
@click.pass_context
def ui_cmd(ctx: click.Context, host: str, port: int, token: str | None,
           task_sources: tuple[str, ...], report_dirs: tuple[Path, ...],
           run_dirs: tuple[Path, ...]) -> None:
    """A read-only web view of the store: worlds, days, tables, files, diffs, episodes.

    For people debugging worlds: personas and their days with hashes, a day's tables (rows
    paged and searchable) and workspace files (text, images), the diff of two days or of a
    day and a checkout, stored episodes as timelines, tasks with their artifacts and
    latest gate report, eval runs with their metrics and reports."""
    try:
        import uvicorn
    except ImportError:
        raise click.ClickException("worldctl ui needs uvicorn: pip install "
                                   "'agent-worlds[envs]'") from None
    from worldctl.envs import check_port_free
    from worldctl.session import installed_packs, worlds
    from worldenv.serving.gateway import is_loopback

    if not is_loopback(host) and not (token and token.strip()):
        raise ConfigError(f"refusing to serve the UI on {host!r} without a token: anyone who "
                          "can reach it could read every world; set one (--token or "
                          "WORLDCTL_UI_TOKEN) or bind to 127.0.0.1")
    tasks = task_index(task_sources, installed_packs(ctx))
    reports = [*report_dirs, *synth_records(tasks.values())]
    runs = list(run_dirs) or [p for p in [Path("runs")] if p.is_dir()]
    check_port_free(host, port)
    app = WorldsUI(worlds(ctx), token=token, tasks=tasks, reports=reports, runs=runs)
    click.echo(f"worldctl ui: http://{host}:{port}/" + ("?token=..." if token else "")
               + f" ({len(tasks)} tasks, {len(reports)} report folders, {len(runs)} run "
                 "folders)")
    config = uvicorn.Config(app, host=host, port=port, lifespan="on", log_level="warning")
    uvicorn.Server(config).run()


__all__ = ["DEFAULT_PORT", "PAGE_ROWS", "GateReports", "WorldsUI", "run_folders",
           "synth_records", "task_index", "ui_cmd"]
