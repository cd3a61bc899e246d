"""The gateway's HTTP reference, generated from what serves it: every route of
``worldenv.serving.gateway.ROUTES`` (its methods and path, its handler's docstring) and the
msgspec Structs its body is decoded into (their fields, types, defaults and
descriptions). The docs site renders it (``docs/hooks.py``); written once, here, it cannot
drift from the routes."""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence

import msgspec
from starlette.routing import BaseRoute, Route, WebSocketRoute

from worldenv.serving.http import description, fields_of, methods_of, type_text

_CELL_SPECIALS = re.compile(r"([|])")


def _cell(text: str) -> str:
    return _CELL_SPECIALS.sub(r"\\\1", text).replace("\n", " ")


def _doc(obj: object) -> str:
    """A handler's docstring as one paragraph per blank-line block."""
    doc = inspect.getdoc(obj if inspect.isfunction(obj) or inspect.isclass(obj)
                         else type(obj)) or ""
    blocks = re.split(r"\n\s*\n", doc.strip())
    return "\n\n".join(" ".join(line.strip() for line in b.splitlines()) for b in blocks)


def _default(field: msgspec.inspect.Field) -> str:
    if field.required:
        return "required"
    if field.default is not msgspec.NODEFAULT and field.default is not msgspec.UNSET:
        return f"default `{msgspec.json.encode(field.default).decode()}`"
    if field.default_factory is not msgspec.NODEFAULT:
        return f"default `{msgspec.json.encode(field.default_factory()).decode()}`"
    return "optional"


def struct_markdown(kind: type[msgspec.Struct]) -> list[str]:
    """A body's fields as a table (an unknown field is refused: 400)."""
    lines = [f"`{kind.__name__}`: {_doc(kind)}".rstrip(": ") if kind.__doc__
             else f"`{kind.__name__}`:", "",
             "| field | type | | meaning |", "|---|---|---|---|"]
    for field in fields_of(kind):
        lines.append(f"| `{field.encode_name}` | `{_cell(type_text(field.type))}` | "
                     f"{_default(field)} | {_cell(description(field))} |")
    return [*lines, ""]


def route_markdown(route: Route | WebSocketRoute) -> list[str]:
    """A route's section; a WebSocket's is titled ``WEBSOCKET`` and lists its messages."""
    if isinstance(route, WebSocketRoute):
        title, parts = "WEBSOCKET", "Its data, by type:"
        lead = "Messages (JSON text; a field not listed is refused):"
    else:
        methods = methods_of(route)
        title = ", ".join(methods) if methods != ("*",) else "any method"
        lead, parts = "Body (JSON; a field not listed is refused):", "Its parts, one of:"
    lines = [f"### `{title} {route.path_format}`", ""]
    text = _doc(route.endpoint)
    if text:
        lines += [text, ""]
    bodies: tuple[type[msgspec.Struct], ...] = getattr(route, "bodies", ())
    if bodies:
        lines += [lead, ""]
        lines += struct_markdown(bodies[0])
        if len(bodies) > 1:
            lines += [parts, ""]
            for part in bodies[1:]:
                lines += struct_markdown(part)
    return lines


def http_reference_markdown(routes: Sequence[BaseRoute] | None = None) -> str:
    """The reference of every route (the gateway's by default) as Markdown: a section
    (``###``) per route, in the order they are matched."""
    if routes is None:
        from worldenv.serving.gateway import ROUTES

        routes = ROUTES
    lines = ["Every request needs `Authorization: Bearer <token>` when the gateway has a "
             "token, and is answered only from loopback when it has none. Every refusal is "
             'a 4xx with `{"error": "..."}` naming what was wrong (the field of a body, '
             "the method allowed); a method a route does not take is 405.", ""]
    for route in routes:
        if isinstance(route, Route | WebSocketRoute):
            lines += route_markdown(route)
    return "\n".join(lines).rstrip() + "\n"
