"""Reading a JSON file strictly into a msgspec type (task.json, pack.json, splits.json, a
scripted episode): one place that turns msgspec's refusals into a project error naming the
file and the field at fault, so every such file is refused the same way."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import msgspec

from worldstore.errors import WorldError

T = TypeVar("T")
Refusal = Callable[..., WorldError]  # (message, *, file=..., field=...) -> the error to raise

_FIELD_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`")
_NAMED_FIELD = re.compile(r"(unknown|missing required) field `(?P<name>[^`]*)`")


def decode_json_file(path: Path, kind: type[T], refuse: Refusal, *,
                     missing: str = "missing") -> T:
    """The file decoded as `kind`; a missing file, bad JSON or a value that does not fit
    `kind` raises ``refuse(message, file=..., field=...)``."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise refuse(missing, file=str(path)) from None
    try:
        return msgspec.json.decode(data, type=kind)
    except msgspec.ValidationError as exc:
        message = str(exc)
        raise refuse(_FIELD_PATH.sub("", message), file=str(path),
                     field=field_of(message)) from None
    except msgspec.DecodeError as exc:
        raise refuse(f"not valid JSON: {exc}", file=str(path)) from None


def field_of(message: str) -> str | None:
    """The field a msgspec validation message is about: its path, and for an unknown or
    missing field that field's name too."""
    match = _FIELD_PATH.search(message)
    path = match.group("path").lstrip(".") if match else ""
    named = _NAMED_FIELD.search(message)
    if named:
        path = f"{path}.{named.group('name')}" if path else named.group("name")
    return path or None
