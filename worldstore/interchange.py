"""The JSON Lines interchange format: read and validate it, group it into persona-days,
and write it back (export).

Every refusal is an InputError naming the file, the line and the field. Reading never
touches a store: a file with any bad line is refused as a whole.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any

import msgspec

from worldstore.canonical import digest
from worldstore.errors import InputError, PathError
from worldstore.events import (
    AppLine,
    AppPayload,
    FileDeleteLine,
    FileDeletePayload,
    FileWriteLine,
    FileWritePayload,
    Line,
    Params,
    Payload,
    SqlLine,
    SqlPayload,
)
from worldstore.names import check_relpath, is_persona, is_service, ts_key, ts_problem
from worldstore.sqlcheck import refused_statement_problem, statement_count_problem

_DECODER = msgspec.json.Decoder(Line)
_FIELD_AT = re.compile(r"at `\$\.?([^`]*)`")
_FIELD_NAMED = re.compile(r"field `([^`]*)`")
BLOB_PARAM_KEY = "$base64"
MAX_INT = 2**63 - 1
_HEX32 = re.compile(r"[0-9a-f]{32}")
# The deepest line of the format is 3 levels (line, params, blob parameter); anything far
# deeper is refused before decoding, whose recursion a deep enough line would exhaust.
MAX_JSON_DEPTH = 16
# A string (escapes included) or one bracket: strings are skipped whole, so the scan costs
# one step per bracket outside strings.
_JSON_NESTING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.S)


@dataclass(frozen=True, slots=True)
class SourceLine:
    line: int
    event: Line


@dataclass(frozen=True, slots=True)
class DayBatch:
    """All lines of one persona-day, in file order: the unit of commit."""

    source: str
    persona: str
    day: int
    lines: tuple[SourceLine, ...]

    @property
    def first_ts(self) -> str:
        return self.lines[0].event.ts


def _field_of(message: str) -> str | None:
    for pattern in (_FIELD_AT, _FIELD_NAMED):
        m = pattern.search(message)
        if m:
            return m.group(1) or None
    return None


def parse_line(text: str | bytes, *, source: str, line: int) -> Line:
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    _check_depth(raw, source=source, line=line)
    try:
        event = _DECODER.decode(text)
    except msgspec.ValidationError as exc:
        message = str(exc)
        if "Invalid value" in message and "$.type" in message:
            message = f"unknown event type ({message}); known types: sql, file_write, file_delete"
        raise InputError(message, file=source, line=line, field=_field_of(str(exc))) from None
    except msgspec.DecodeError as exc:
        raise InputError(f"malformed JSON: {exc}", file=source, line=line) from None
    check_line(event, source=source, line=line)
    return event


def _check_depth(raw: bytes, *, source: str, line: int) -> None:
    """Refuse JSON nested deeper than MAX_JSON_DEPTH, naming the top-level field it is in
    (the last key at depth 1 before the deep part)."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return  # (most lines: too few brackets to nest that deep, strings' ones included)
    depth = 0
    field: str | None = None
    last_string = b""
    for m in _JSON_NESTING.finditer(raw):
        token = m.group()
        if token in (b"[", b"{"):
            if depth == 1:  # a value of the line's object: the string before is its key
                field = _key_name(last_string)
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise InputError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels",
                                 file=source, line=line, field=field)
        elif token in (b"]", b"}"):
            depth -= 1
        elif depth == 1:
            last_string = token


def _key_name(token: bytes) -> str | None:
    try:
        name = msgspec.json.decode(token)
    except msgspec.DecodeError:
        return None
    return name if isinstance(name, str) else None


def check_line(event: Line, *, source: str, line: int) -> None:
    def bad(message: str, field: str) -> InputError:
        return InputError(message, file=source, line=line, field=field)

    if not is_persona(event.persona):
        raise bad(f"bad persona name {event.persona!r}: use [a-z0-9][a-z0-9_-]*", "persona")
    if event.day < 0:
        raise bad(f"day {event.day} is negative", "day")
    if event.day > MAX_INT:
        raise bad(f"day {event.day} does not fit SQLite's 64 bits (at most {MAX_INT})", "day")
    problem = ts_problem(event.ts)
    if problem:
        raise bad(problem, "ts")
    if isinstance(event, SqlLine):
        if not is_service(event.service):
            raise bad(f"bad service name {event.service!r}: use [a-z][a-z0-9_]*", "service")
        if "\x00" in event.sql:
            raise bad(f"the SQL text contains a NUL byte at character "
                      f"{event.sql.index(chr(0))}; SQLite would stop reading there", "sql")
        problem = statement_count_problem(event.sql) or refused_statement_problem(event.sql)
        if problem:
            raise bad(problem, "sql")
        _check_params(event.params, bad)
        return
    if isinstance(event, AppLine):
        _check_app(event, bad)
        return
    try:
        check_relpath(event.path)
    except PathError as exc:
        raise bad(str(exc), "path") from None
    if isinstance(event, FileWriteLine):
        if (event.text is None) == (event.base64 is None):
            raise bad("a file_write has exactly one of 'text' or 'base64'",
                      "text" if event.base64 is None else "text/base64")
        if event.base64 is not None:
            try:
                base64.b64decode(event.base64, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise bad(f"invalid base64: {exc}", "base64") from None


def _check_app(event: AppLine, bad: Any) -> None:
    if not is_service(event.service):
        raise bad(f"bad service name {event.service!r}: use [a-z][a-z0-9_]*", "service")
    if not event.app or not event.version:
        raise bad("an app event names the app and its version", "app" if not event.app
                  else "version")
    if (event.digest is None) == (event.code is None):
        raise bad("an app event has exactly one of 'digest' (a shipped app) or 'code' "
                  "(an app carried in the log)", "digest")
    if event.digest is not None and not _HEX32.fullmatch(event.digest):
        raise bad(f"digest {event.digest!r} is not an xxh3-128 hex digest", "digest")


def _check_params(params: Params | None, bad: Any) -> None:
    if params is None:
        return
    items = params.items() if isinstance(params, dict) else enumerate(params)
    for key, value in items:
        kind = type(value)  # (as the decoder made it: exactly one of ParamValue's types)
        if kind is str or kind is float or kind is bool or value is None:
            continue
        field = f"params.{key}" if isinstance(params, dict) else f"params[{key}]"
        if isinstance(value, dict):
            if set(value) != {BLOB_PARAM_KEY}:
                raise bad(f"an object parameter must be {{\"{BLOB_PARAM_KEY}\": \"...\"}}", field)
            try:
                base64.b64decode(value[BLOB_PARAM_KEY], validate=True)
            except (binascii.Error, ValueError) as exc:
                raise bad(f"invalid base64 in blob parameter: {exc}", field) from None
        elif isinstance(value, int) and not -MAX_INT - 1 <= value <= MAX_INT:  # -2**63..2**63-1
            raise bad(f"integer {value} does not fit SQLite's 64 bits", field)


def read_lines(stream: IO[bytes] | Iterable[bytes], *, source: str) -> Iterator[SourceLine]:
    for number, raw in enumerate(stream, start=1):
        if not raw.strip():
            continue
        yield SourceLine(number, parse_line(raw, source=source, line=number))


def group_days(lines: Iterable[SourceLine], *, source: str) -> list[DayBatch]:
    """Persona-days in file order. Within a persona, days and timestamps never go back."""
    batches: list[DayBatch] = []
    current: dict[str, tuple[int, list[SourceLine]]] = {}
    last_ts: dict[str, str] = {}
    order: list[tuple[str, int, list[SourceLine]]] = []
    for sl in lines:
        ev = sl.event
        prev_ts = last_ts.get(ev.persona)
        if prev_ts is not None and ts_key(ev.ts) < ts_key(prev_ts):
            raise InputError(
                f"timestamp {ev.ts} is before {prev_ts} of an earlier line of persona "
                f"{ev.persona!r}; timestamps never decrease within a persona",
                file=source, line=sl.line, field="ts",
            )
        last_ts[ev.persona] = ev.ts
        open_day = current.get(ev.persona)
        if open_day is not None and open_day[0] == ev.day:
            open_day[1].append(sl)
            continue
        if open_day is not None and ev.day < open_day[0]:
            raise InputError(
                f"day {ev.day} of persona {ev.persona!r} comes after day {open_day[0]}; "
                "days are appended in increasing order and a day's lines stay together",
                file=source, line=sl.line, field="day",
            )
        day_lines: list[SourceLine] = [sl]
        current[ev.persona] = (ev.day, day_lines)
        order.append((ev.persona, ev.day, day_lines))
    for persona, day, day_lines in order:
        batches.append(DayBatch(source, persona, day, tuple(day_lines)))
    return batches


def read_days(stream: IO[bytes] | Iterable[bytes], *, source: str) -> list[DayBatch]:
    return group_days(read_lines(stream, source=source), source=source)


def to_payload(event: Line) -> tuple[Payload, bytes | None]:
    """The stored payload of a validated line, and the file bytes it carries (if any)."""
    if isinstance(event, SqlLine):
        return SqlPayload(service=event.service, sql=event.sql, params=event.params), None
    if isinstance(event, FileDeleteLine):
        return FileDeletePayload(path=event.path), None
    if isinstance(event, AppLine):
        code = event.code.encode("utf-8") if event.code is not None else None
        pin = digest(code) if code is not None else event.digest
        assert pin is not None
        return AppPayload(service=event.service, app=event.app, version=event.version,
                          digest=pin, carried=code is not None), code
    if event.text is not None:
        data, encoding = event.text.encode("utf-8"), "text"
    else:
        assert event.base64 is not None
        data, encoding = base64.b64decode(event.base64), "base64"
    payload = FileWritePayload(
        path=event.path, blob=digest(data), size=len(data),
        encoding=encoding,  # type: ignore[arg-type]
    )
    return payload, data


def export_line(persona: str, day: int, ts: str, payload: Payload, blob: bytes | None) -> bytes:
    """One interchange line for a stored event (keys in the documented order)."""
    obj: dict[str, Any] = {"persona": persona, "day": day, "ts": ts}
    if isinstance(payload, SqlPayload):
        obj.update(type="sql", service=payload.service, sql=payload.sql)
        if payload.params is not None:
            obj["params"] = payload.params
    elif isinstance(payload, FileDeletePayload):
        obj.update(type="file_delete", path=payload.path)
    elif isinstance(payload, AppPayload):
        obj.update(type="app", service=payload.service, app=payload.app,
                   version=payload.version)
        if payload.carried:
            assert blob is not None
            obj["code"] = blob.decode("utf-8")
        else:
            obj["digest"] = payload.digest
    else:
        assert blob is not None
        obj.update(type="file_write", path=payload.path)
        if payload.encoding == "text":
            obj["text"] = blob.decode("utf-8")
        else:
            obj["base64"] = base64.b64encode(blob).decode("ascii")
    return msgspec.json.encode(obj) + b"\n"
