"""The ASGI app of ``worldctl ui``: Starlette's routing over the pages (``pages.Pages``),
a guard in front of every request (the loopback rule or the token, and the headers every
answer carries), and one error page for every refusal.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from replay.engine import Worlds
from worldctl.errors import PageRefused
from worldctl.ui.pages import REPORT_FILES, Pages
from worldenv.serving.gateway import from_loopback
from worldstore.errors import NotFoundError, WorldError

CSP = (b"default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; "
       b"form-action 'self'")
# The policy of a served eval report: `sandbox` gives it an opaque origin with no script,
# form or plugin, whatever its HTML holds.
SANDBOXED = CSP + b"; sandbox"
COOKIE = "ui_token"

Endpoint = Callable[[Request], Awaitable[Response]]


class WorldsUI:
    """The ASGI app of ``worldctl ui`` over one store (see the package docstring)."""

    def __init__(self, worlds: Worlds, *, token: str | None = None,
                 tasks: Mapping[str, Path] | None = None, reports: Sequence[Path] = (),
                 runs: Sequence[Path] = ()) -> None:
        self.worlds = worlds
        self.token = token
        self.pages = Pages(worlds, tasks=tasks or {}, reports=reports, runs=runs)
        pages = self.pages

        # The pages read SQLite and files synchronously, on the event loop, one at a time,
        # as they always have: the store's connections are not shared between threads.
        def page(render: Callable[[Request], str]) -> Endpoint:
            async def endpoint(request: Request) -> Response:
                return HTMLResponse(render(request))
            return endpoint

        async def raw(request: Request) -> Response:
            p = request.path_params
            kind, data = pages.raw(p["persona"], _day(p["day"]), p["path"])
            return Response(data, media_type=kind)

        async def screenshot(request: Request) -> Response:
            p = request.path_params
            return Response(pages.screenshot(p["episode_id"], p["digest"]),
                            media_type="image/png")

        async def run_file(request: Request) -> Response:
            name, file = request.path_params["name"], request.path_params["file"]
            if file not in REPORT_FILES:
                raise PageRefused(404, _no_page(request))
            return Response(pages.run_report(name, file), media_type=REPORT_FILES[file],
                            headers={"content-security-policy": SANDBOXED.decode()})

        async def favicon(request: Request) -> Response:
            return Response(status_code=204)

        def table(request: Request) -> str:
            p, query = request.path_params, request.query_params
            return pages.table(p["persona"], _day(p["day"]), p["service"], p["table"],
                               _int(query.get("page", "1"), "page"), query.get("q", ""))

        def episode(request: Request) -> str:
            return pages.episode(pages.resolve_episode(request.path_params["episode_id"]))

        routes = [
            Route("/", page(lambda r: pages.personas())),
            Route("/favicon.ico", favicon),
            Route("/diff", page(lambda r: pages.diff(_one(r, "a"), _one(r, "b")))),
            Route("/episodes", page(lambda r: pages.episodes())),
            Route("/episodes/{episode_id}", page(episode)),
            Route("/episodes/{episode_id}/screenshots/{digest}", screenshot),
            Route("/tasks", page(lambda r: pages.task_list())),
            Route("/tasks/{task_id}", page(lambda r: pages.task(r.path_params["task_id"]))),
            Route("/runs", page(lambda r: pages.run_list())),
            Route("/runs/{name}", page(lambda r: pages.run(r.path_params["name"]))),
            Route("/runs/{name}/{file}", run_file),
            Route("/p/{persona}", page(lambda r: pages.days(r.path_params["persona"]))),
            Route("/p/{persona}/{day}", page(lambda r: pages.day(
                r.path_params["persona"], _day(r.path_params["day"])))),
            Route("/p/{persona}/{day}/t/{service}/{table}", page(table)),
            Route("/p/{persona}/{day}/f/{path:path}", page(lambda r: pages.file(
                r.path_params["persona"], _day(r.path_params["day"]),
                r.path_params["path"]))),
            Route("/raw/{persona}/{day}/{path:path}", raw),
        ]
        self.app = Starlette(
            routes=routes, middleware=[Middleware(_Guard, token=token)],
            exception_handlers={PageRefused: _error_page, WorldError: _error_page,
                                HTTPException: _error_page})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


class _Guard:
    """In front of every request: without a token only requests for a loopback host from
    no or a loopback origin (a web page elsewhere cannot read the store through a
    browser); with one, the token in the Authorization header, ``?token=`` or the cookie
    that a page opened with ``?token=`` set. Every answer gets ``nosniff`` and the page
    policy (unless it brings its own, as a served report does)."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extra: list[tuple[bytes, bytes]] = [(b"x-content-type-options", b"nosniff")]
        refusal = self._refusal(scope)
        if refusal is not None:
            response = _error_response(*refusal)
            response.raw_headers += [*extra, (b"content-security-policy", CSP)]
            await response(scope, receive, send)
            return
        if self.token is not None:
            extra.append((b"set-cookie", f"{COOKIE}={self.token}; HttpOnly; SameSite=Strict; "
                                         "Path=/".encode()))

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not any(bytes(k).lower() == b"content-security-policy"
                           for k, _ in headers):
                    headers.append((b"content-security-policy", CSP))
                message = {**message, "headers": headers + extra}
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def _refusal(self, scope: Scope) -> tuple[int, str] | None:
        if self.token is None:
            if not from_loopback(scope):
                return 403, ("without a token the UI only answers requests for a loopback "
                             "host from no or a loopback origin")
            return None
        conn = HTTPConnection(scope)
        given = [conn.headers.get("authorization", "").removeprefix("Bearer ").strip(),
                 *conn.query_params.getlist("token"), conn.cookies.get(COOKIE, "")]
        if not any(g and hmac.compare_digest(g.encode(), self.token.encode()) for g in given):
            return 401, ("missing or wrong token (send 'Authorization: Bearer <token>', or "
                         "open a page with ?token=<token>)")
        return None


async def _error_page(request: Request, exc: Exception) -> Response:
    if isinstance(exc, PageRefused):
        return _error_response(exc.status, str(exc))
    if isinstance(exc, HTTPException):  # from the router: no route, or not a GET
        message = {404: _no_page(request), 405: "the UI is read-only: GET only"}.get(
            exc.status_code, exc.detail)
        return _error_response(exc.status_code, message)
    return _error_response(404 if isinstance(exc, NotFoundError) else 400, str(exc))


def _no_page(request: Request) -> str:
    return f"no page {str(request.scope['path']).strip('/')!r}"


def _error_response(status: int, message: str) -> Response:
    return HTMLResponse(Pages.error(message), status_code=status)


def _one(request: Request, name: str) -> str:
    values = request.query_params.getlist(name)
    if len(values) != 1 or not values[0]:
        raise PageRefused(400, f"give exactly one {name}= (a persona@day or a world hash)")
    return values[0]


def _day(text: str) -> int:
    return _int(text, "day")


def _int(text: str, what: str) -> int:
    least = 1 if what == "page" else 0
    if not (text.isascii() and text.isdigit()) or len(text) > 9 or int(text) < least:
        raise PageRefused(400, f"{what} {text!r} is not a number")
    return int(text)


__all__ = ["CSP", "SANDBOXED", "WorldsUI"]
