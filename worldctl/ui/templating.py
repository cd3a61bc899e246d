"""The UI's Jinja2 environment: the templates shipped in ``worldctl/ui/templates``, every
value escaped (autoescape on, whatever a template's name), an undefined name an error.

The filters below turn values into plain text (a quoted URL part, a percentage, a metric's
shape); markup is written in the templates alone, so no Python string becomes HTML.
"""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

import jinja2

TEMPLATES = Path(__file__).parent / "templates"
CELL_CHARS = 200


@dataclass(frozen=True)
class Shown:
    """A value as a page shows it: its text and how (``cell`` and ``metric`` macros)."""

    kind: Literal["null", "bytes", "text", "none", "code"]
    text: str


def cell(value: object) -> Shown:
    """A stored value of a table: NULL, a blob by its size, text cut at CELL_CHARS."""
    if value is None:
        return Shown("null", "")
    if isinstance(value, bytes):
        return Shown("bytes", str(len(value)))
    text = str(value)
    return Shown("text", text if len(text) <= CELL_CHARS else text[:CELL_CHARS] + " …")


def metric(value: object) -> Shown:
    """A metric of results.json: missing, a number (4 significant digits), or JSON."""
    if value is None:
        return Shown("none", "")
    if isinstance(value, float):
        return Shown("text", f"{value:.4g}")
    if isinstance(value, list | dict):
        return Shown("code", json.dumps(value))
    return Shown("text", str(value))


def quote(text: object) -> str:
    """One path segment or query value of a URL (a '/' too is escaped)."""
    return urllib.parse.quote(str(text), safe="")


def quote_path(text: object) -> str:
    """A relative path in a URL, its '/' kept."""
    return urllib.parse.quote(str(text), safe="/")


def percent(value: float) -> str:
    return f"{value:.1%}"


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(q=quote, qpath=quote_path, pct=percent, metric=metric)
    return env


def render(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)


__all__ = ["CELL_CHARS", "Shown", "cell", "environment", "metric", "render"]
