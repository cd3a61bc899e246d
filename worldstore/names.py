"""Rules for names and workspace paths, shared by import, replay and checkout."""

from __future__ import annotations

import re
from datetime import datetime

from worldstore.errors import PathError

PERSONA_RE = re.compile(r"[a-z0-9][a-z0-9_-]*")
SERVICE_RE = re.compile(r"[a-z][a-z0-9_]*")
TS_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?Z")
MAX_NAME = 64
# Workspace paths are measured in UTF-8 bytes, as file systems measure them: a segment is
# a file name (NAME_MAX, 255 bytes on Linux and macOS file systems) and the whole path
# leaves room under PATH_MAX (4096) for the host directory a world is built in.
MAX_PATH = 1024
MAX_SEGMENT = 255
_NAIVE_EPOCH = datetime(1970, 1, 1)  # timestamps are UTC (validated: they end in Z)


def is_persona(name: str) -> bool:
    return len(name) <= MAX_NAME and PERSONA_RE.fullmatch(name) is not None


def is_service(name: str) -> bool:
    return len(name) <= MAX_NAME and SERVICE_RE.fullmatch(name) is not None


def ts_problem(ts: str) -> str | None:
    """Why `ts` is not an ISO 8601 UTC timestamp ending in Z, or None when it is."""
    if TS_RE.fullmatch(ts) is None:
        return f"timestamp {ts!r} is not ISO 8601 UTC like 2026-03-02T08:00:00Z"
    try:
        datetime.fromisoformat(ts[:-1])
    except ValueError as exc:
        return f"timestamp {ts!r} is not a real date and time: {exc}"
    return None


def ts_key(ts: str) -> datetime:
    """Sort key of a validated timestamp. Strings do not compare in time order once a
    fraction is optional ('08:00:00.5Z' < '08:00:00Z' as text), so compare moments."""
    return datetime.fromisoformat(ts[:-1])


def ts_millis(ts: str) -> int:
    """Milliseconds since the Unix epoch of a validated timestamp (no clock involved)."""
    # Called for every event whose statement reads the clock and for every tool call, and
    # events of one minute are common: the minute is parsed once (through datetime, no tz
    # or timedelta objects kept), the seconds and the fraction's first three digits
    # (truncated, as datetime's microseconds // 1000) are read off the text that TS_RE
    # has already checked.
    minute = _MINUTE_MILLIS.get(ts[:16])
    if minute is None:
        minute = _minute_millis(ts[:16])
    millis = minute + _SECOND_MILLIS[ts[17:19]]
    if len(ts) > 20:  # 'YYYY-MM-DDTHH:MM:SS.f…Z'
        millis += int(ts[20:-1][:3].ljust(3, "0"))
    return millis


_MINUTE_MILLIS: dict[str, int] = {}
_SECOND_MILLIS = {f"{s:02d}": s * 1000 for s in range(60)}
_MINUTE_CACHE = 4096


def _minute_millis(minute: str) -> int:
    delta = datetime.fromisoformat(minute) - _NAIVE_EPOCH
    value = delta.days * 86_400_000 + delta.seconds * 1000
    if len(_MINUTE_MILLIS) >= _MINUTE_CACHE:
        _MINUTE_MILLIS.clear()
    _MINUTE_MILLIS[minute] = value
    return value


def check_relpath(path: str) -> str:
    """Return `path` if it is a clean relative workspace path, else raise PathError."""
    if not path:
        raise PathError("empty path")
    if "\x00" in path or "\\" in path:
        raise PathError(f"path {path[:80]!r} contains a NUL byte or a backslash")
    size = len(path.encode("utf-8", "surrogatepass"))
    if size > MAX_PATH:
        raise PathError(f"path of {size} bytes is longer than {MAX_PATH} bytes: "
                        f"{path[:40]!r}...")
    if path.startswith("/"):
        raise PathError(f"path {path!r} is absolute; paths are relative to the workspace")
    parts = path.split("/")
    if ".." in parts:
        raise PathError(f"path {path!r} contains '..' and could leave the workspace")
    if any(p in ("", ".") for p in parts):
        raise PathError(f"path {path!r} has an empty or '.' segment; write it normalised")
    for part in parts:
        size = len(part.encode("utf-8", "surrogatepass"))
        if size > MAX_SEGMENT:
            raise PathError(f"path segment of {size} bytes is longer than the {MAX_SEGMENT} "
                            f"bytes a file system allows for a name: {part[:40]!r}...")
    return path
