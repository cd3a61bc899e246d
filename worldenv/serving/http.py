"""The gateway's HTTP layer on Starlette: what every request passes before a handler acts
(the bearer token or the loopback check, as middleware), how a body is read and decoded
(bounded in size and depth, then into a msgspec Struct), and how anything that went wrong
becomes one JSON line (``{"error": ...}``, a 4xx naming the field, or a 500 that names
only the exception's type).

Nothing here knows about instances: ``hosting`` holds them, ``rest``, ``openenv`` and
``pages`` answer their routes, ``gateway`` assembles the app."""

from __future__ import annotations

import hmac
import ipaddress
import logging
import re
from collections.abc import Awaitable, Callable, Collection, Mapping, MutableMapping, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import msgspec
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute

from replay.errors import IntegrityError
from worldenv.errors import HttpError
from worldstore.errors import ConflictError, NotFoundError, WorldError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

MAX_BODY = 64 * 1024  # a REST body
MAX_DEPTH = 64  # JSON nesting of any body (decoders recurse: 30,000 levels crash them)
# A JSON string, or an unterminated one to the end: linear, never re-scanned.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")
JSON_HEADERS: Headers = [(b"x-content-type-options", b"nosniff"),
                         (b"content-security-policy", b"default-src 'none'; sandbox")]
log = logging.getLogger("agentworlds.gateway")

S = TypeVar("S", bound=msgspec.Struct)


def status_of(exc: WorldError) -> int:
    """The one place a library error becomes an HTTP status."""
    if isinstance(exc, NotFoundError):
        return 404
    if isinstance(exc, ConflictError):
        return 409
    if isinstance(exc, IntegrityError):  # the store is damaged: not the request's fault
        return 500
    return 400


def shown(value: object) -> str:
    """A client's value in an error message, cut short."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# --- answers -------------------------------------------------------------------------------


def raw_response(status: int, body: bytes, content_type: str | None = "application/json",
                 headers: Headers | None = None) -> Response:
    """An answer of exactly these bytes and headers (a list: a page may repeat a name)."""
    response = Response(body, status_code=status, media_type=content_type)
    response.raw_headers.extend(headers or [])
    return response


def json_bytes_response(status: int, body: bytes, headers: Headers | None = None) -> Response:
    # Data, never a document: a browser sent here renders nothing of it and sniffs nothing.
    return raw_response(status, body, headers=[*JSON_HEADERS, *(headers or [])])


def json_response(data: Any, status: int = 200, headers: Headers | None = None) -> Response:
    return json_bytes_response(status, msgspec.json.encode(data), headers)


def error_response(exc: HttpError) -> Response:
    return json_response({"error": exc.message, **exc.extra}, exc.status, exc.headers)


# --- routes ----------------------------------------------------------------------------------


class JsonRoute(Route):
    """A Starlette route whose methods are exactly those listed (no HEAD added for GET) and
    whose 405 is the gateway's JSON, with the methods in the order given; `bodies` are the
    Structs its request body is decoded into (the body first, then its parts), for the
    HTTP reference."""

    def __init__(self, path: str, endpoint: Callable[..., Any], *,
                 methods: Sequence[str] | None = None, name: str | None = None,
                 bodies: Sequence[type[msgspec.Struct]] = ()) -> None:
        super().__init__(path, endpoint, methods=methods, name=name)
        self.bodies = tuple(bodies)
        self.allowed: tuple[str, ...] | None = tuple(methods) if methods is not None else None
        if self.allowed is not None:
            self.methods = set(self.allowed)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.allowed is not None:
            allow(scope["method"], *self.allowed)
        await self.app(scope, receive, send)


class SocketRoute(WebSocketRoute):
    """A WebSocket route and the Structs its messages are decoded into (the message
    first, then its parts), for the HTTP reference."""

    def __init__(self, path: str, endpoint: Callable[..., Any], *,
                 bodies: Sequence[type[msgspec.Struct]] = ()) -> None:
        super().__init__(path, endpoint)
        self.bodies = tuple(bodies)


def allow(method: str, *allowed: str) -> str:
    if method not in allowed:
        raise HttpError(405, f"method {method} not allowed here (use {', '.join(allowed)})",
                        [(b"allow", ", ".join(allowed).encode())])
    return method


async def not_found(request: Request, exc: Exception) -> Response:
    """Starlette's own HTTPException (no route matched): the gateway's JSON."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"no such endpoint: {shown(request.url.path)}"
    else:
        message = exc.detail
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1"))
               for k, v in (exc.headers or {}).items()]
    return json_response({"error": message}, exc.status_code, headers)


async def refused(request: Request, exc: Exception) -> Response:
    """A refusal raised by a handler, or a library error, as one JSON line."""
    if isinstance(exc, WorldError):
        return json_response({"error": str(exc)}, status_of(exc))
    assert isinstance(exc, HttpError)
    return error_response(exc)


EXCEPTION_HANDLERS: Mapping[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
    HTTPException: not_found, HttpError: refused, WorldError: refused}


# --- middleware ------------------------------------------------------------------------------


class Guard:
    """The first thing every request meets (pure ASGI middleware): the bearer token when
    there is one, else the loopback check (a tokenless gateway answers only requests for a
    loopback host from no or a loopback origin: DNS rebinding, cross-site requests). A
    WebSocket is refused before its handshake completes (the client sees the 4xx) when a
    web page opened it (browsers send an Origin with every one, and no WebSocket is
    held to the same origin) or it fails those checks. An error nothing else answered is
    a 500 with one line, the trace logged, never sent."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token.encode() if token is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self._socket(scope, receive, send)
            return
        if scope["type"] != "http":  # the lifespan
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            if self.token is not None and not self._authorized(scope):
                raise HttpError(401, "missing or wrong bearer token "
                                     "(send 'Authorization: Bearer <token>')",
                                [(b"www-authenticate", b'Bearer realm="agent-worlds"')])
            if self.token is None and not from_loopback(scope):
                raise HttpError(403, "without a token the gateway only answers requests "
                                     "for a loopback host from no or a loopback origin "
                                     "(DNS-rebinding and cross-site protection)")
            await self.app(scope, receive, watched)
        except HttpError as exc:
            if started:
                raise
            await error_response(exc)(scope, receive, send)
        except Exception as exc:  # a bug of ours: one line for the client, the trace logged
            log.exception("request %s %s failed", scope.get("method"), scope.get("path"))
            if started:
                raise
            await json_response({"error": f"internal error: {type(exc).__name__}"},
                                500)(scope, receive, send)

    async def _socket(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.token is not None and not self._authorized(scope):
            await refuse_socket(scope, send, HttpError(
                401, "missing or wrong bearer token (send 'Authorization: Bearer <token>' "
                     "with the handshake)"))
        elif self.token is None and not from_loopback(scope):
            await refuse_socket(scope, send, HttpError(
                403, "without a token the gateway only answers requests for a loopback "
                     "host (DNS-rebinding protection)"))
        elif made_by_a_page(scope):
            await refuse_socket(scope, send, HttpError(
                403, "a WebSocket a web page opened is refused (a program connects with no "
                     "Origin or Sec-Fetch-Site header)"))
        else:
            await self.app(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        assert self.token is not None
        value = header(scope, b"authorization")
        if value is None:
            return False
        scheme, _, credentials = value.encode("latin-1").partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(),
                                                                   self.token)


async def refuse_socket(scope: Scope, send: Send, exc: HttpError) -> None:
    """Refuse a WebSocket handshake: the error as a JSON answer where the server can send
    one (ASGI's websocket.http.response extension), else a bare close (a 403)."""
    if "websocket.http.response" in scope.get("extensions", {}):
        body = msgspec.json.encode({"error": exc.message})
        await send({"type": "websocket.http.response.start", "status": exc.status,
                    "headers": [(b"content-type", b"application/json"), *JSON_HEADERS,
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1008})


class Slashes:
    """Slashes around an endpoint's path are not part of its name: ``/instances/`` is
    ``/instances`` (answered, never redirected). An instance's page keeps its own
    (``/instances/{id}/gui/`` is its page ``/``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            path: str = scope["path"]
            parts = path.split("/")  # a page: "", "instances", id, "gui", its path...
            if not (len(parts) > 4 and parts[1] == "instances" and parts[3] == "gui"):
                scope["path"] = "/" + path.strip("/")
        await self.app(scope, receive, send)


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def from_loopback(scope: Scope) -> bool:
    """The Host header names a loopback address and an Origin header, if any, too: a web
    page elsewhere cannot drive a tokenless gateway through the browser."""
    host = header(scope, b"host")
    if host is not None:
        name = host[1:].partition("]")[0] if host.startswith("[") else host.partition(":")[0]
        if not is_loopback(name):
            return False
    origin = header(scope, b"origin")
    return origin is None or is_loopback(urlsplit(origin).hostname or "")


def header(scope: Scope, name: bytes) -> str | None:
    """The first header of that (lower-case) name: the one the checks read."""
    for key, value in scope["headers"]:
        if bytes(key) == name:
            return bytes(value).decode("latin-1")
    return None


def client_of(scope: Scope) -> str:
    """Who made a request, for the per-client caps: the peer address the server saw."""
    peer = scope.get("client")
    return str(peer[0]) if peer else ""


def made_by_a_page(scope: Scope) -> bool:
    """Whether a web page made this request, rather than a program or a person's own
    navigation: fetch metadata says so (``Sec-Fetch-Site`` other than ``none``), or, from
    a browser without it, an ``Origin`` header (sent on every POST a page makes)."""
    site = header(scope, b"sec-fetch-site")
    if site is not None:
        return site.strip().lower() != "none"
    return header(scope, b"origin") is not None


def not_from_a_page(scope: Scope) -> None:
    """Refuse a change (create, reset, shell, answer, grade, close, GUI action, MCP,
    OpenEnv) that a web page asked for: a page served for one instance could otherwise
    drive the JSON API of any (a form's text/plain body is valid JSON)."""
    if made_by_a_page(scope):
        raise HttpError(403, "the JSON API does not act on a request a web page made (a "
                             "program calls it, with no Sec-Fetch-Site or Origin header)")


# --- bodies ----------------------------------------------------------------------------------


async def read_body(request: Request, limit: int = MAX_BODY) -> bytes:
    """The whole body, refused (413) as soon as it passes `limit` bytes."""
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise HttpError(413, f"request body over {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        raise HttpError(400, "the client disconnected") from None
    return b"".join(chunks)


def check_depth(body: bytes) -> None:
    """Refuse JSON nested deeper than MAX_DEPTH before any decoder sees it (linear: the
    strings are cut out, then only brackets are counted)."""
    brackets = _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    if len(brackets) <= MAX_DEPTH:
        return
    depth = 0
    for char in brackets:
        depth += 1 if char in b"[{" else -1
        if depth > MAX_DEPTH:
            raise HttpError(400, f"the body nests JSON deeper than {MAX_DEPTH} levels")


async def decode_body(request: Request, kind: type[S]) -> S:
    """The request's JSON body as a `kind` (an empty body is ``{}``): bounded in size and
    depth first; a body that is not JSON, or not a `kind`, is a 400 naming the field."""
    body = await read_body(request)
    check_depth(body)
    try:
        return msgspec.json.decode(body or b"{}", type=kind)
    except msgspec.ValidationError as exc:
        raise HttpError(400, f"{problem(exc)}: the body is {shape(kind)}") from None
    except msgspec.DecodeError as exc:
        raise HttpError(400, f"the body is not valid JSON: {exc}") from None


def convert(value: Any, kind: type[S], what: str) -> S:
    """A part of a body already decoded (`value`) as a `kind`, or a 400 naming the field."""
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        raise HttpError(400, f"{problem(exc)}: {what} is {shape(kind)}") from None


_AT = re.compile(r" - at `\$(?P<path>[^`]*)`\Z")
_UNKNOWN = re.compile(r"Object contains unknown field `(?P<name>[^`]*)`\Z")
_MISSING = re.compile(r"Object missing required field `(?P<name>[^`]*)`\Z")
_EXPECTED = re.compile(r"Expected `(?P<want>[^`]*)`, got `(?P<got>[^`]*)`\Z")
_WORDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false",
          "object": "an object", "array": "an array", "null": "null"}


def problem(exc: msgspec.ValidationError) -> str:
    """msgspec's message in the gateway's words, naming the field."""
    message = str(exc)
    at = _AT.search(message)
    where = at.group("path").lstrip(".") if at else ""
    message = message[:at.start()] if at else message
    if (found := _UNKNOWN.match(message)) is not None:
        name = f"{where}.{found['name']}" if where else found["name"]
        return f"unknown field(s) {name!r}"
    if (found := _MISSING.match(message)) is not None:
        name = f"{where}.{found['name']}" if where else found["name"]
        return f"missing field {name!r}"
    if (found := _EXPECTED.match(message)) is not None:
        want = " or ".join(_WORDS.get(w, w) for w in found["want"].split(" | "))
        subject = where or "the body"
        return f"{subject} must be {want}, not {_WORDS.get(found['got'], found['got'])}"
    # The only pattern the bodies use is r"\S": a string with something in it.
    if message.startswith("Expected `str` matching regex") or \
            message == "Expected `str` of length >= 1":
        return f"{where or 'the body'} must be a non-empty string"
    return f"{where}: {message[:1].lower()}{message[1:]}" if where else message


# --- what a Struct's fields are, in words (errors and the HTTP reference) -------------------


_MI = msgspec.inspect
# a field's type in the words of the HTTP reference, for the types that are one word
_TYPE_WORDS: dict[type[msgspec.inspect.Type], str] = {
    _MI.StrType: "string", _MI.BoolType: "true | false", _MI.IntType: "int",
    _MI.FloatType: "number", _MI.NoneType: "null", _MI.AnyType: "any", _MI.DictType: "{...}",
    _MI.ListType: "[...]", _MI.TupleType: "[...]", _MI.VarTupleType: "[...]"}


def type_text(info: msgspec.inspect.Type) -> str:
    """A field's type as a reader of the HTTP reference would write it."""
    if type(info) in _TYPE_WORDS:
        return _TYPE_WORDS[type(info)]
    if isinstance(info, _MI.Metadata):
        return type_text(info.type)
    if isinstance(info, _MI.LiteralType):
        return " | ".join(msgspec.json.encode(v).decode() for v in info.values)
    if isinstance(info, _MI.UnionType):
        return " | ".join(type_text(t) for t in info.types)
    if isinstance(info, _MI.StructType):
        return shape(info.cls)
    return type(info).__name__.removesuffix("Type").lower()


def fields_of(kind: type[msgspec.Struct]) -> tuple[msgspec.inspect.Field, ...]:
    info = msgspec.inspect.type_info(kind)
    assert isinstance(info, msgspec.inspect.StructType)
    return info.fields


def description(field: msgspec.inspect.Field) -> str:
    """A field's description (``Meta(description=...)``), or ``""``."""
    found = field.type
    if isinstance(found, msgspec.inspect.UnionType):
        for member in found.types:
            if isinstance(member, msgspec.inspect.Metadata):
                found = member
    if isinstance(found, msgspec.inspect.Metadata):
        return str((found.extra_json_schema or {}).get("description", ""))
    return ""


def shape(kind: type[msgspec.Struct]) -> str:
    """A body as the Struct takes it: ``{"command": string}``."""
    return "{" + ", ".join(f'"{f.encode_name}": {type_text(f.type)}'
                           for f in fields_of(kind)) + "}"


def methods_of(route: Route) -> Collection[str]:
    """The methods a route answers, in the order declared (all: ``*``)."""
    if isinstance(route, JsonRoute):
        return route.allowed or ("*",)
    return sorted(route.methods or ("*",))
