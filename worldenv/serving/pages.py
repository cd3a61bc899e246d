"""The page proxy: an instance's web pages under ``/instances/{id}/gui/``, for a person's
browser or an agent's own.

``GET /instances/i3-<id>/gui/shop/products/1`` is the instance's ``/shop/products/1``,
recorded in the episode (a ``GuiCall`` "request") like every page request, and a form's
POST runs its tool like a tool call. Pages are the instance's bytes, never rewritten
(they are deterministic); they link by absolute paths of their own origin
(``/shop/cart``), so the gateway (1) adds the prefix to a redirect's ``Location`` and (2)
serves pages with ``Referrer-Policy: same-origin``, and answers a request for any path
outside ``/instances`` whose Referer is a page of an instance on the same origin with a
307 to that path under the instance's prefix (``PageLinks``; a form's POST is sent again
there). A page request from another site (``Sec-Fetch-Site``) is 403: it would write into
the episode; a page request made by a page is served only when that page is one of the
same instance's."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, quote, urlsplit

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from worldenv.errors import HttpError
from worldenv.gui.site import MAX_FORM_BYTES
from worldenv.serving.hosting import enabled, hosting_of
from worldenv.serving.http import (
    ASGIApp,
    JsonRoute,
    Receive,
    Scope,
    Send,
    error_response,
    header,
    raw_response,
    read_body,
    shown,
)

MAX_TARGET = 8192  # characters of a page request's path and query
FORM_TYPE = "application/x-www-form-urlencoded"
_GUI_PAGE = re.compile(r"/instances/([^/?#]+)/gui/")  # a page of an instance, in a Referer


async def favicon(request: Request) -> Response:
    """A browser asks for it on every page: none, and no episode records it."""
    return raw_response(204, b"", None, [(b"cache-control", b"max-age=86400")])

async def page(request: Request) -> Response:
    """One request of the instance's web pages (``Instance.page``, recorded in the
    episode; a form's POST, ``application/x-www-form-urlencoded``, runs its tool like
    a tool call), answered as the instance answers it: its status, body and headers,
    but for a redirect's Location, which gets the instance's prefix, and the
    Referrer-Policy (same-origin)."""
    hosting = hosting_of(request)
    hosted = hosting.hosted(request.path_params["iid"])
    scope = request.scope
    method = request.method
    same_origin_fetch(scope)
    page_source(scope, hosted.id)
    query = bytes(scope.get("query_string", b""))
    target = quote("/" + request.path_params["target"],
                   safe="/:@!$&'()*+,;=-._~") + (
        "?" + query.decode("latin-1") if query else "")
    if len(target) > MAX_TARGET:
        raise HttpError(414, f"the page's path and query are over {MAX_TARGET} "
                             "characters")
    utf8_form(query, "the query")
    body = await read_body(request, MAX_FORM_BYTES)
    if method == "GET" and body:
        raise HttpError(400, "a GET of a page has no body (a form posts its fields)")
    if method == "POST":
        kind = header(scope, b"content-type") or ""
        if kind.partition(";")[0].strip().lower() != FORM_TYPE:
            raise HttpError(415, f"a form posts {FORM_TYPE}, not "
                                 f"{shown(kind or 'no content type')} (a GUI action "
                                 f"is POST /instances/{hosted.id}/gui, JSON)")
        utf8_form(body, "the form body")
    enabled(hosted, "gui")
    response = await hosted.page(method, target, body)
    if isinstance(response, HttpError):
        raise response
    headers = []
    for name, value in response.headers():
        if name == "Location":  # a path of the instance's origin: under its prefix
            value = quote(hosted.gui_url[:-1] + value if value.startswith("/") else value,
                          safe="/?#&=%:@!$'()*+,;-._~")
        elif name == "Referrer-Policy":
            value = "same-origin"
        headers.append((name.lower().encode("latin-1"), value.encode("latin-1")))
    return raw_response(response.status, response.body, None, headers)


ROUTES: list[BaseRoute] = [
    JsonRoute("/favicon.ico", favicon, methods=("GET", "HEAD")),
    JsonRoute("/instances/{iid}/gui/{target:path}", page, methods=("GET", "POST"))]


class PageLinks:
    """A page's own link (``/shop/cart``) followed in a person's browser: the same
    request, answered with a 307 to that path under the prefix of the instance whose page
    it came from (pure ASGI middleware, after the guard, before routing)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            if (path != "/favicon.ico" and path.strip("/").split("/")[0] != "instances"
                    and (iid := linked_from_page(scope)) is not None):
                query = bytes(scope.get("query_string", b"")).decode("latin-1")
                location = f"/instances/{quote(iid, safe='')}/gui{quote(path, safe='/')}" + (
                    f"?{query}" if query else "")
                if len(location) > MAX_TARGET:
                    answer = error_response(HttpError(
                        414, f"the page's path and query are over {MAX_TARGET} characters"))
                else:
                    answer = raw_response(307, b"", "text/plain; charset=utf-8",
                                          [(b"location", location.encode("latin-1")),
                                           (b"cache-control", b"no-store")])
                await answer(scope, receive, send)
                return
        await self.app(scope, receive, send)


def linked_from_page(scope: Scope) -> str | None:
    """The instance whose page a request came from, when its Referer is a page of an
    instance on this same origin (the gateway serves pages with ``Referrer-Policy:
    same-origin`` so that a browser says so).

    Pages link by absolute paths of their own origin (``/shop/cart``, the font at
    ``/_static/...``): rewriting them under the instance's prefix would change the bytes
    a page is, so the gateway instead answers such a request, made from one of its pages,
    with a redirect to the same path under that instance's prefix (307: a form's POST
    is sent again there). A request without such a Referer is the gateway's own."""
    referer = header(scope, b"referer")
    if not referer:
        return None
    parts = urlsplit(referer)
    found = _GUI_PAGE.match(parts.path)
    if found is None or parts.netloc.lower() != (header(scope, b"host") or "").lower():
        return None
    return found.group(1)


def page_source(scope: Scope, iid: str) -> None:
    """Refuse a request of an instance's pages that a page of another instance made: a
    page a browser shows may only lead to its own instance. A person's own navigation
    (typed, bookmarked: ``Sec-Fetch-Site: none``) and a program (no fetch metadata, no
    Referer) may open any instance they know the id of; a page's request names its page
    in the Referer (pages are served with ``Referrer-Policy: same-origin``), which must be
    a page of this instance."""
    site = (header(scope, b"sec-fetch-site") or "").strip().lower()
    if site == "none":
        return
    referer = header(scope, b"referer")
    source = _GUI_PAGE.match(urlsplit(referer).path) if referer else None
    if source is not None and source.group(1) == iid:
        return
    if source is not None or site or referer or header(scope, b"origin") is not None:
        raise HttpError(403, "a page of an instance is only served to that instance's own "
                             "pages (this request was made by another page: "
                             f"{shown(referer or 'no Referer')})")


def same_origin_fetch(scope: Scope) -> None:
    """Refuse a page request a browser made for another site (``Sec-Fetch-Site``: an
    image of another site's page pointing here): every page request is recorded in the
    instance's episode, so only the person's own navigation may make one."""
    site = header(scope, b"sec-fetch-site")
    if site is not None and site.lower() not in ("same-origin", "none"):
        raise HttpError(403, f"a page of an instance is not served to a request from "
                             f"another site (Sec-Fetch-Site: {shown(site)})")


def utf8_form(data: bytes, what: str) -> None:
    """Refuse a query or form body that is not UTF-8 form encoding."""
    try:
        parse_qsl(data.decode("utf-8"), keep_blank_values=True, errors="strict")
    except UnicodeDecodeError:
        raise HttpError(400, f"{what} is not UTF-8 form encoding") from None
