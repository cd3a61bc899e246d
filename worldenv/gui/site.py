"""Sites: the web pages of a service, what an agent sees and clicks in a browser.

A site belongs to one service and is declared beside the service's app (the shipped ones
in ``worldenv.sites``)::

    site = Site(service="shop", title="AVLager", nav=(("Products", "/products"),),
                templates=__name__)

    @site.page("/products/{product_id:int}")
    def product(ctx: PageContext, product_id: int) -> Page:
        row = ctx.row("SELECT * FROM products WHERE id = ?", (product_id,))
        ...
        return Page(title=row["name"], body=ctx.render("shop/product.html", p=row))

    @site.form("/cart/add")
    def add(ctx: PageContext, fields: Fields) -> Page | Redirect:
        result = ctx.call("add_to_cart", {"product_id": fields.integer("product_id")})
        return ctx.refused(result) or Redirect("/cart")

A page reads: the instance's own service databases (read-only) and workspace files, and
the frozen clock of the call that asked for it. It never writes. A form is the one way a
page changes the world: it calls a tool of its own service through the instance's one
dispatch (``ctx.call``), so its writes are captured into the episode exactly like a tool
call's, under the GUI call's clock. That is also why a site is not part of a world's app
pin: it changes how a world looks, never what it holds (every write is a pinned tool's).

Pages escape by default. A page's HTML is a Jinja2 template with autoescape
(``ctx.render("chat/conversation.html", ...)``, from the ``templates/`` folder of the
site's package, which can use this package's ``templates/`` too: the document around
every page, the form macros): every value put into it is escaped unless it is
``markupsafe.Markup`` (what ``render`` and ``esc`` return), so a value from the world, the
request or a tool (text, or a number column holding text: SQLite columns take any type) is
shown, never run. Shipped sites build no HTML any other way (tests/hostile/test_hostile_pages.py
checks the sources and the templates, and crawls every page of a world with markup in
every column). A photo
is served only as a still image type its bytes say it is (PNG, JPEG, GIF, WebP), never as
the world's ``content_type`` says: a world cannot serve a document of its own.

Every page of an instance lives under ``/<service>/...`` of the instance's origin; ``/``
lists the sites, ``/_static/`` serves the bundled font. Pages are deterministic: one
style sheet, a bundled font (DejaVu Sans), no script, no animation, no external resource,
so the same world and the same actions give the same bytes and the same screenshots.
"""

from __future__ import annotations

import functools
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Protocol

import jinja2
from markupsafe import Markup, escape

from worldenv.core.contract import ToolResult
from worldenv.errors import ToolError

__all__ = [
    "CSP",
    "Blob",
    "Fields",
    "Markup",
    "Page",
    "PageContext",
    "PageRequest",
    "PageResponse",
    "Redirect",
    "Route",
    "Site",
    "SiteHost",
    "esc",
    "render",
    "serve",
    "templates",
]

ORIGIN = "http://world.local"  # the origin an instance's pages have in its browser
MAX_FORM_BYTES = 64 * 1024
CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; font-src 'self'; "
       "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
STATIC_FILES = {"DejaVuSans.ttf": "font/ttf", "DejaVuSans-Bold.ttf": "font/ttf"}


def esc(value: object) -> Markup:
    """Text for HTML: a value is escaped, so a page shows it, never runs it (``None`` is
    empty; ``Markup`` is already HTML)."""
    return escape(_shown(value))


def _shown(value: object) -> object:
    """What a value shows as: nothing for None (an empty column), not "None"."""
    return "" if value is None else value


@functools.cache
def templates(package: str) -> jinja2.Environment:
    """The templates of `package` (its ``templates/`` folder), then this package's: HTML
    with autoescape, a missing value an error, None shown as nothing. One environment per
    package: a package adds the functions its templates call to its ``globals``."""
    loaders: list[jinja2.BaseLoader] = [jinja2.PackageLoader(package, "templates")]
    if package != _FRAMEWORK:
        loaders.append(jinja2.PackageLoader(_FRAMEWORK, "templates"))
    return jinja2.Environment(loader=jinja2.ChoiceLoader(loaders), autoescape=True,
                              undefined=jinja2.StrictUndefined, finalize=_shown)


_FRAMEWORK = __name__.rpartition(".")[0]


def render(module: str, template: str, /, **values: Any) -> Markup:
    """The HTML of `template`, from the templates of the package that `module` (a module
    name, ``__name__``) is in, with `values` escaped."""
    package = module if module == _FRAMEWORK else module.rpartition(".")[0]
    return Markup(templates(package).get_template(template).render(**values))


# --- requests and responses -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PageRequest:
    """One request for a page: its method, its path, its query and its form fields."""

    method: str
    path: str
    query: tuple[tuple[str, str], ...] = ()
    form: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, method: str, target: str, body: bytes = b"") -> PageRequest:
        """A request from a method, a target (``/shop/products?q=x``, or a URL of the
        instance's origin) and a form body (``application/x-www-form-urlencoded``)."""
        if target.startswith(ORIGIN):
            target = target[len(ORIGIN):] or "/"
        parts = urllib.parse.urlsplit(target)
        return cls(method.upper(), urllib.parse.unquote(parts.path) or "/",
                   tuple(urllib.parse.parse_qsl(parts.query, keep_blank_values=True)),
                   tuple(urllib.parse.parse_qsl(body.decode("utf-8", "replace"),
                                                keep_blank_values=True)))

    def arg(self, name: str, default: str = "") -> str:
        return next((v for k, v in self.query if k == name), default)


@dataclass(frozen=True, slots=True)
class PageResponse:
    status: int
    content_type: str
    body: bytes
    location: str | None = None  # a redirect's target (a path of the same origin)
    cacheable: bool = False  # the bundled font: the same bytes forever

    def headers(self) -> list[tuple[str, str]]:
        cache = "public, max-age=31536000, immutable" if self.cacheable else "no-store"
        found = [("Content-Type", self.content_type), ("Content-Security-Policy", CSP),
                 ("X-Content-Type-Options", "nosniff"), ("Cache-Control", cache),
                 ("Referrer-Policy", "no-referrer")]
        if self.location is not None:
            found.append(("Location", self.location))
        return found


@dataclass(frozen=True, slots=True)
class Page:
    """An HTML page: its title (text) and its body (HTML: ``Markup`` built with ``markup``;
    a plain string is taken as HTML as written, for a literal)."""

    title: str
    body: str
    status: int = 200


@dataclass(frozen=True, slots=True)
class Redirect:
    """After a form: where the browser goes next (a path of the same site)."""

    path: str


@dataclass(frozen=True, slots=True)
class Blob:
    """Bytes that are not a page (a product photo): served only as the still image type
    the bytes are (``image_type``), whatever `content_type` claims."""

    content_type: str
    data: bytes


Reply = Page | Redirect | Blob


class Fields:
    """A form's fields, read by name; a missing or malformed one is a ``ToolError`` the
    page shows (the form is refused, nothing is written)."""

    def __init__(self, pairs: Sequence[tuple[str, str]]) -> None:
        self._pairs = list(pairs)

    def text(self, name: str, *, required: bool = True) -> str:
        value = next((v for k, v in self._pairs if k == name), None)
        if value is None or (required and not value.strip()):
            if required:
                raise ToolError(f"the form needs the field {name!r}")
            return ""
        return value

    def optional(self, name: str) -> str | None:
        value = next((v for k, v in self._pairs if k == name), None)
        return value if value else None

    def integer(self, name: str, *, default: int | None = None) -> int:
        value = next((v for k, v in self._pairs if k == name), "")
        if not value.strip() and default is not None:
            return default
        try:
            return int(value.strip())
        except ValueError:
            raise ToolError(f"the field {name!r} must be a whole number, not "
                            f"{value!r}") from None

    def all(self, name: str) -> list[str]:
        return [v for k, v in self._pairs if k == name]


# --- what a page may use --------------------------------------------------------------------


class SiteHost(Protocol):
    """What an instance offers its sites (``worldenv.instances.instance.Instance`` implements
    it)."""

    def site_rows(self, service: str, sql: str, params: Sequence[Any] | Mapping[str, Any]
                  ) -> list[dict[str, Any]]: ...

    def site_file(self, path: str) -> bytes | None: ...

    def site_call(self, service: str, tool: str, arguments: dict[str, Any]) -> ToolResult: ...


class PageContext:
    """One request's view of the instance: reads of its databases and workspace, the frozen
    time of the call that asked, and (for a form) the calls of its service's tools."""

    def __init__(self, host: SiteHost, site: Site, request: PageRequest, now: str) -> None:
        self._host = host
        self.site = site
        self.service = site.service
        self.request = request
        self.now = now

    def rows(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = (), *,
             service: str | None = None) -> list[dict[str, Any]]:
        """A read of the site's service database (or `service`'s); writes are refused."""
        return self._host.site_rows(service or self.service, sql, params)

    def row(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = (), *,
            service: str | None = None) -> dict[str, Any] | None:
        found = self.rows(sql, params, service=service)
        return found[0] if found else None

    def value(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = (), *,
              service: str | None = None) -> Any:
        found = self.row(sql, params, service=service)
        return None if found is None else next(iter(found.values()))

    def has_table(self, table: str) -> bool:
        return bool(self.value("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND "
                               "name = ?", (table,)))

    def file(self, path: str) -> bytes | None:
        """A regular workspace file (never through a symlink); None if there is none."""
        return self._host.site_file(path)

    def call(self, tool: str, arguments: dict[str, Any]) -> ToolResult:
        """Call a tool of this site's service (forms only): the instance's own dispatch, so
        the write is captured and recorded like a tool call's."""
        if self.request.method != "POST":
            raise ToolError("a page only reads: tools are called by forms (POST)")
        return self._host.site_call(self.service, tool, arguments)

    def url(self, path: str, **query: object) -> str:
        """The path of a page of this site, with a query."""
        base = f"/{self.service}{path}"
        kept = {k: str(v) for k, v in query.items() if v is not None and v != ""}
        return base + ("?" + urllib.parse.urlencode(kept) if kept else "")

    def render(self, template: str, /, **values: Any) -> Markup:
        """HTML of a template of this site's package, given ``ctx`` and `values`."""
        return render(self.site.templates, template, ctx=self, **values)

    def refused(self, result: ToolResult, title: str = "Not done") -> Page | None:
        """The page that says why the tool refused a form (None when it did not)."""
        if not result.is_error:
            return None
        return Page(title=title, status=422, body=render(
            __name__, "refused.html", text=result.text, back=self.url("/"), site=self.site))


# --- sites and routes ---------------------------------------------------------------------

PageFn = Callable[..., Reply]
_SEGMENT = re.compile(r"\{([a-z_][a-z0-9_]*)(:int)?\}\Z")


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    pattern: str
    fn: PageFn
    parts: tuple[tuple[str, str | None, bool], ...]  # (literal, param name, is int)

    def match(self, segments: list[str]) -> dict[str, Any] | None:
        if len(segments) != len(self.parts):
            return None
        params: dict[str, Any] = {}
        for segment, (literal, name, is_int) in zip(segments, self.parts, strict=True):
            if name is None:
                if segment != literal:
                    return None
            elif is_int:
                if not segment.isdigit() or len(segment) > 18:
                    return None
                params[name] = int(segment)
            else:
                params[name] = segment
        return params


def _parts(pattern: str) -> tuple[tuple[str, str | None, bool], ...]:
    if not pattern.startswith("/"):
        raise TypeError(f"route {pattern!r}: must start with /")
    out = []
    for segment in [s for s in pattern.split("/") if s]:
        found = _SEGMENT.match(segment)
        out.append(("", found.group(1), bool(found.group(2))) if found else (segment, None, False))
    return tuple(out)


@dataclass
class Site:
    """The pages and forms of one service's web app."""

    service: str
    title: str
    nav: tuple[tuple[str, str], ...] = ()  # (label, site path) links in the header
    routes: list[Route] = field(default_factory=list)
    templates: str = __name__  # the module whose package's templates/ its pages render

    def page(self, pattern: str) -> Callable[[PageFn], PageFn]:
        """A page (GET) at `pattern` under the site (``/products/{product_id:int}``)."""
        return self._route("GET", pattern)

    def form(self, pattern: str) -> Callable[[PageFn], PageFn]:
        """A form's target (POST) at `pattern`; the function receives the ``Fields``."""
        return self._route("POST", pattern)

    def _route(self, method: str, pattern: str) -> Callable[[PageFn], PageFn]:
        def register(fn: PageFn) -> PageFn:
            if any(r.method == method and r.pattern == pattern for r in self.routes):
                raise TypeError(f"site {self.service}: {method} {pattern} is declared twice")
            self.routes.append(Route(method, pattern, fn, _parts(pattern)))
            return fn
        return register

    def find(self, method: str, segments: list[str]) -> tuple[Route, dict[str, Any]] | None:
        for route in self.routes:
            if route.method == method:
                params = route.match(segments)
                if params is not None:
                    return route, params
        return None


# --- serving ------------------------------------------------------------------------------


def serve(sites: Mapping[str, Site], host: SiteHost, request: PageRequest, now: str
          ) -> PageResponse:
    """The response to one request of an instance's pages. A bad request (an unknown page,
    a form the tool refused, a malformed field) is a page that says so, never an
    exception; a page that fails is a 500 page naming the page."""
    segments = [s for s in request.path.split("/") if s]
    if request.method not in ("GET", "POST"):
        return _page(Page("Not allowed", render(__name__, "message.html", text=(
            f"{request.method} is not served.")), 405), None)
    if not segments:
        return _page(_index(sites), None)
    if segments[0] == "_static" and len(segments) == 2 and segments[1] in STATIC_FILES:
        data = resources.files("worldenv.gui").joinpath("static", segments[1]).read_bytes()
        return PageResponse(200, STATIC_FILES[segments[1]], data, cacheable=True)
    site = sites.get(segments[0])
    found = site.find(request.method, segments[1:]) if site is not None else None
    if site is None or found is None:
        return _page(Page("Not found", render(__name__, "not_found.html", path=request.path),
                          404), site)
    route, params = found
    ctx = PageContext(host, site, request, now)
    try:
        reply = (route.fn(ctx, Fields(request.form), **params) if route.method == "POST"
                 else route.fn(ctx, **params))
    except ToolError as exc:
        reply = Page("Not done", render(__name__, "error.html", text=str(exc)), 422)
    except Exception as exc:  # a page's own bug: the agent sees a 500, its episode goes on
        reply = Page("Page failed", render(__name__, "error.html", text=(
            f"The page {route.pattern} failed ({type(exc).__name__}).")), 500)
    if isinstance(reply, Redirect):
        return PageResponse(303, "text/plain; charset=utf-8", b"",
                            location=f"/{site.service}{reply.path}")
    if isinstance(reply, Blob):
        kind = image_type(reply.data)
        if kind is None:
            return _page(Page("Not an image", render(__name__, "message.html", text=(
                f"{request.path} is not a still image (PNG, JPEG, GIF or WebP).")), 404), site)
        return PageResponse(200, kind, reply.data)
    return _page(reply, site)


# Image types by their first bytes: a world's photo is served as what it is, never as a
# document (HTML, SVG) whatever its row says.
IMAGE_MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"),
               (b"GIF87a", "image/gif"), (b"GIF89a", "image/gif"))


def image_type(data: bytes) -> str | None:
    """The image type `data` is, by its bytes; None for anything else."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return next((kind for magic, kind in IMAGE_MAGIC if data.startswith(magic)), None)


def _index(sites: Mapping[str, Site]) -> Page:
    return Page("Apps", render(__name__, "index.html",
                               sites=sorted(sites.values(), key=lambda s: s.service)))


def _page(page: Page, site: Site | None) -> PageResponse:
    title = page.title if site is None else f"{page.title} · {site.title}"
    body = page.body if isinstance(page.body, Markup) else Markup(page.body)
    document = render(__name__, "page.html", title=title, site=site, body=body)
    return PageResponse(page.status, "text/html; charset=utf-8", document.encode("utf-8"))
