"""awsdk: the standard-library-only toolkit for verifier scripts.

A task's verifier is a folder of scripts. ``gates.verifier.run_verifier`` runs each
``*.py`` file of it (files starting with ``_`` are helpers) as ``__main__`` of its own
process, all of them in one sandbox, with the project's Python in isolated mode (``-I -S``:
the standard library and this module only), no network, no kernel keyrings, and bounded
time, memory and output per script. The module path is the standard library's, then
``/sdk``, then ``/verifier``: a helper is imported by its name, but a file named like a
module of the standard library (``select.py``) or this SDK never stands in for it. What
a script sees:

=================  =================================================================
``/w0``            the initial world W0, read-only (``services/<service>.sqlite``,
                   ``workspace/...``)
``/w``             the final world W, read-only
``/answer.txt``    the agent's final answer ("" when it gave none), read-only
``/verifier``      the verifier folder itself, read-only (its helpers are importable)
``/sdk``           this module (``import awsdk``) and the runner's driver
``/workspace``     a scratch directory, the working directory (shared by the scripts
                   of one run, like ``/tmp``; a tmpfs of its own, as /tmp and /dev/shm)
``AW_W0``, ``AW_W``, ``AW_ANSWER``  environment variables naming the three paths above
=================  =================================================================

A script's verdict is its last stdout line starting with ``RESULT_JSON=``: a JSON object
whose ``"checks"`` maps each criterion's name to true or false (or is a list of
``{"name": ..., "passed": ...}``); an optional ``"evidence"`` object is kept for the
code-augmented judge (a script with evidence may have no checks: an AWM sql-mode
verifier's findings). ``result()`` prints that line and exits 0. Anything
else (no such line, a non-boolean check, a crash, a timeout) makes the verdict an error,
never a pass. Every check of every script must hold for the task to count as done.

Example, ``verifier/10_note_renamed.py``::

    import awsdk

    ws = awsdk.worlds()
    diff = awsdk.row_diff(ws.w0, ws.w, "notes", "notes")
    renamed = [(old, new) for old, new in diff.changed if old["title"] != new["title"]]
    brief = awsdk.file_text(ws.w, "jobs/fjord/brief.md") or ""
    awsdk.result(
        one_note_renamed=len(renamed) == 1 and not diff.added and not diff.removed,
        new_title_is_fjord=bool(renamed) and renamed[0][1]["title"] == "Fjord kickoff",
        brief_untouched=brief == (awsdk.file_text(ws.w0, "jobs/fjord/brief.md") or ""),
        answer_names_fjord=awsdk.contains(ws.answer, "fjord"),
    )

The same checks, accumulated one by one::

    awsdk.check("one_note_renamed", len(renamed) == 1)
    awsdk.check("answer_names_fjord", awsdk.contains(ws.answer, "fjord"))
    awsdk.done()

Databases are opened read-only and immutable: a verifier can never change a world.
Amounts in free text are checked with ``has_amount(text, "59829.00")``, which accepts
"59,829.00", "59 829,00", "59.829,00" and, for whole kroner, "59829".

The runner's driver, the sandbox's one Python process that forks a process per script, is
``awdriver`` beside this module, not part of the toolkit.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import sys
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

# Every verifier run pays for this module's imports at start-up (the driver imports it
# once for all scripts): typing, dataclasses (which loads inspect) and difflib stay out of
# the import path.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn, TypeAlias

    PathLike: TypeAlias = str | os.PathLike[str]
    Params: TypeAlias = Sequence[Any] | Mapping[str, Any]

__all__ = [
    "RESULT_PREFIX",
    "Checklist",
    "RowDiff",
    "WorldPair",
    "check",
    "contains",
    "db",
    "db_path",
    "done",
    "file_text",
    "files",
    "has_amount",
    "result",
    "result_list",
    "row_diff",
    "rows",
    "similar",
    "text_diff",
    "value",
    "worlds",
]

RESULT_PREFIX = "RESULT_JSON="
ENV_W0, ENV_W, ENV_ANSWER = "AW_W0", "AW_W", "AW_ANSWER"
SERVICES, WORKSPACE, DB_SUFFIX = "services", "workspace", ".sqlite"


# --- the worlds --------------------------------------------------------------------------


class WorldPair:
    """The initial world, the final world and the agent's answer."""

    __slots__ = ("answer", "w", "w0")

    def __init__(self, w0: Path, w: Path, answer: str) -> None:
        self.w0 = w0
        self.w = w
        self.answer = answer

    def __repr__(self) -> str:
        return f"WorldPair(w0={self.w0!r}, w={self.w!r}, answer={self.answer!r})"


def worlds() -> WorldPair:
    """W0, W and the answer as the runner hands them over (environment variables)."""
    missing = [name for name in (ENV_W0, ENV_W, ENV_ANSWER) if not os.environ.get(name)]
    if missing:
        raise RuntimeError(f"{', '.join(missing)} not set: run this script through "
                           "gates.verifier.run_verifier")
    answer = Path(os.environ[ENV_ANSWER]).read_text(encoding="utf-8", errors="replace")
    return WorldPair(Path(os.environ[ENV_W0]), Path(os.environ[ENV_W]), answer)


# --- databases ---------------------------------------------------------------------------


def db_path(world: PathLike, service: str) -> Path:
    if not service or "/" in service or service.startswith("."):
        raise ValueError(f"bad service name {service!r}")
    return Path(world) / SERVICES / f"{service}{DB_SUFFIX}"


def db(world: PathLike, service: str) -> sqlite3.Connection:
    """A read-only connection to a service's database; rows are ``sqlite3.Row``."""
    path = db_path(world, service)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the world has no service {service!r}")
    # immutable=1: the file cannot change while a verifier runs, and SQLite then needs no
    # lock and no journal, which a read-only mount could not provide.
    uri = f"file:{urllib.parse.quote(str(path))}?mode=ro&immutable=1"
    conn = sqlite3.connect(uri, uri=True)
    conn.row_factory = sqlite3.Row
    return conn


_connections: dict[tuple[str, str], sqlite3.Connection] = {}


def _shared(world: PathLike, service: str) -> sqlite3.Connection:
    """One connection per database for the helpers below (a script lives briefly)."""
    key = (str(world), service)
    if key not in _connections:
        _connections[key] = db(world, service)
    return _connections[key]


def rows(world: PathLike, service: str, sql: str, params: Params = ()) -> list[dict[str, Any]]:
    """Every row of a query, as dicts in the query's order."""
    return [dict(row) for row in _shared(world, service).execute(sql, params)]


def value(world: PathLike, service: str, sql: str, params: Params = ()) -> Any:
    """The first column of the query's first row; None when there is no row."""
    row = _shared(world, service).execute(sql, params).fetchone()
    return None if row is None else row[0]


class RowDiff:
    """How one table changed from W0 to W. ``changed`` holds (before, after) pairs.
    Every list is in key order, so two runs give identical diffs."""

    __slots__ = ("added", "changed", "key", "removed")

    def __init__(self, key: tuple[str, ...], added: list[dict[str, Any]] | None = None,
                 removed: list[dict[str, Any]] | None = None,
                 changed: list[tuple[dict[str, Any], dict[str, Any]]] | None = None) -> None:
        self.key = key
        self.added = added or []
        self.removed = removed or []
        self.changed = changed or []

    @property
    def unchanged(self) -> bool:
        return not (self.added or self.removed or self.changed)

    def __repr__(self) -> str:
        return (f"RowDiff(key={self.key!r}, added={self.added!r}, removed={self.removed!r}, "
                f"changed={self.changed!r})")


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _has_table(conn: sqlite3.Connection, table: str) -> bool:
    found = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                         (table,)).fetchone()
    return found is not None


def _primary_key(conn: sqlite3.Connection, table: str) -> tuple[str, ...]:
    info = conn.execute(f"PRAGMA table_info({_quote(table)})").fetchall()
    pk = sorted((row["pk"], row["name"]) for row in info if row["pk"])
    return tuple(name for _, name in pk) or ("rowid",)


def _keyed_rows(world: PathLike, service: str, table: str, key: tuple[str, ...],
                ) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The table's rows by key, in key order; empty when the database or table is absent."""
    if not db_path(world, service).is_file():
        return {}
    conn = _shared(world, service)
    if not _has_table(conn, table):
        return {}
    cols = ", ".join(_quote(k) for k in key)
    extra = ", rowid AS __rowid__" if key == ("rowid",) else ""
    found: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in conn.execute(f"SELECT *{extra} FROM {_quote(table)} ORDER BY {cols}"):
        record = dict(row)
        ident = (record.pop("__rowid__"),) if extra else tuple(record[k] for k in key)
        found[ident] = record
    return found


def row_diff(w0: PathLike, w: PathLike, service: str, table: str,
             key: str | Sequence[str] | None = None) -> RowDiff:
    """Rows added, removed and changed in `table` of `service` between W0 and W.

    Rows are matched by `key` (default: the table's primary key in W, else W0; the rowid
    when it has none). A table or database missing from one world counts as empty there.
    """
    if key is None:
        for world in (w, w0):
            if db_path(world, service).is_file() and _has_table(_shared(world, service), table):
                key = _primary_key(_shared(world, service), table)
                break
        else:
            return RowDiff(("rowid",))
    names = (key,) if isinstance(key, str) else tuple(key)
    before = _keyed_rows(w0, service, table, names)
    after = _keyed_rows(w, service, table, names)
    return RowDiff(
        key=names,
        added=[row for ident, row in after.items() if ident not in before],
        removed=[row for ident, row in before.items() if ident not in after],
        changed=[(before[ident], row) for ident, row in after.items()
                 if ident in before and before[ident] != row],
    )


# --- files and text ----------------------------------------------------------------------


def _workspace_file(world: PathLike, relpath: str) -> Path:
    parts = relpath.split("/")
    if relpath.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{relpath!r} is not a plain relative workspace path")
    return Path(world) / WORKSPACE / relpath


def file_text(world: PathLike, relpath: str) -> str | None:
    """The text of ``workspace/<relpath>`` (undecodable bytes replaced); None if absent."""
    path = _workspace_file(world, relpath)
    if not path.is_file():
        return None
    return path.read_text(encoding="utf-8", errors="replace")


def files(world: PathLike) -> list[str]:
    """Relative paths of every file in the world's workspace, sorted."""
    base = Path(world) / WORKSPACE
    found = [p.relative_to(base).as_posix() for p in base.rglob("*")
             if p.is_file() or p.is_symlink()]
    return sorted(found)


def text_diff(a: str, b: str, *, context: int = 3) -> list[str]:
    """A unified diff of two texts, line by line (empty when they are equal)."""
    import difflib

    return list(difflib.unified_diff(a.splitlines(), b.splitlines(), "before", "after",
                                     n=context, lineterm=""))


def similar(a: str, b: str) -> float:
    """difflib's similarity ratio in [0, 1] (1.0: identical)."""
    import difflib

    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def contains(text: str | None, needle: str, casefold: bool = True) -> bool:
    """Whether `needle` occurs in `text` (case-insensitively by default)."""
    if text is None:
        return False
    if casefold:
        return needle.casefold() in text.casefold()
    return needle in text


# A thousands separator: one space, comma, dot or thin/no-break space before a group of
# exactly three digits ("59,829.00", "59 829,00", "59.829,00").
_GROUPING = re.compile(r"(?<=\d)[ ,.\u00a0\u202f](?=\d{3}(?!\d))")


def has_amount(text: str | None, amount: str) -> bool:
    """Whether `amount` (kroner, a dot, two digits of øre: "59829.00") is written in
    `text`, however the writer grouped the thousands: "59,829.00", "59 829,00",
    "59.829,00", "NOK 59829.00" and, for whole kroner, "59829" (or "59829." ending a
    sentence). A longer number ("159,829.00") or other øre ("59,829.50"; "2,812.5" for
    "2812.50") does not count. False when `text` is None or empty."""
    if not re.fullmatch(r"\d+\.\d\d", amount):
        raise ValueError(f"amount {amount!r} must be digits, a dot and two digits, "
                         "e.g. '59829.00'")
    if not text:
        return False
    flat = _GROUPING.sub("", text)
    kroner, ore = amount.split(".")
    decimals = r"(?:[.,]00)?" if ore == "00" else rf"[.,]{ore}"
    return re.search(rf"(?<![\d.,]){kroner}{decimals}(?![.,]?\d)", flat) is not None


# --- the verdict -------------------------------------------------------------------------


def _line(checks: list[tuple[str, bool]]) -> str:
    seen: set[str] = set()
    for name, passed in checks:
        if not isinstance(name, str) or not name:
            raise TypeError(f"check name {name!r} must be a non-empty string")
        if name in seen:
            raise ValueError(f"check {name!r} is reported twice")
        if not isinstance(passed, bool):
            raise TypeError(f"check {name!r} is {passed!r} ({type(passed).__name__}), "
                            "not True/False; wrap it in bool() if that is what you mean")
        seen.add(name)
    payload = [{"name": name, "passed": passed} for name, passed in checks]
    return RESULT_PREFIX + json.dumps({"checks": payload}, ensure_ascii=False)


def result_list(checks: Iterable[tuple[str, bool] | Mapping[str, Any]]) -> NoReturn:
    """Print the verdict line for (name, passed) pairs or {"name", "passed"} dicts; exit 0."""
    pairs = [(c["name"], c["passed"]) if isinstance(c, Mapping) else (c[0], c[1])
             for c in checks]
    line = _line(pairs)
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    raise SystemExit(0)


def result(**checks: bool) -> NoReturn:
    """Print the verdict line for the keyword checks, in their order, and exit 0."""
    result_list(list(checks.items()))


class Checklist:
    """Checks gathered one at a time, then reported together with ``done()``."""

    def __init__(self) -> None:
        self.checks: list[tuple[str, bool]] = []

    def check(self, name: str, passed: bool) -> bool:
        self.checks.append((name, passed))
        return passed

    def done(self) -> NoReturn:
        result_list(self.checks)


_default = Checklist()


def check(name: str, passed: bool) -> bool:
    """Record one check on the script's checklist; returns `passed`."""
    return _default.check(name, passed)


def done() -> NoReturn:
    """Report the checks recorded with ``check()`` and exit 0."""
    _default.done()
