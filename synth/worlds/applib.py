"""The shared app library of persona-world synthesis (methods.md section 4): apps that a
day's implementer wrote when a plan needed a capability no service had, kept for later
days and personas of the run.

**Writing an app.** The implementer's ``create_app`` tool takes a service name, a
description, the service's schema (``CREATE`` statements) and the app's code in the
project's app contract (``worldenv.core.app``: ``app = App(service=..., ...)``, tools declared
with ``@app.tool``). The app stage checks it (``check_app``) as environment synthesis
checks its apps: the name is a free service name (not one of the world's, the shipped
apps' or the library's), the schema is ``CREATE`` statements only and applies under the
events' SQL gate, the code parses, and it loads in the sandboxed app worker on a scratch
store holding a day 0 with the schema and the code pinned, lists at least one tool (all
named ``<service>_...``) and answers a smoke call of every tool that needs no argument
(a refusal is fine; an exception or a timeout is not). Problems go back to the
implementer as the tool's error result, so it corrects the app in the same attempt.

**Using it.** An accepted app joins the day: its ``app`` event (the code carried in the
log) and its schema come first among the day's events (``app_events``), so the world
serves it, in its sandboxed worker, from that day on. Once the day is stored the app goes
into the run's library (``RUN/apps/<service>.json``): later personas may list the
service in their bibles (it grounds them like a shipped app) and get it pinned on day 0.
"""

from __future__ import annotations

import ast
import io
import re
import tempfile
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from replay.engine import Worlds
from synth.environments.appgen import SMOKE_LIMITS, smoke_problem
from synth.stage import encode, write_atomically
from worldenv.apps import SHIPPED
from worldenv.errors import AppPinError
from worldenv.instances.instance import Environment
from worldstore.canonical import digest
from worldstore.errors import WorldError
from worldstore.events import AppPayload, Payload, SqlPayload
from worldstore.names import is_service

LIBRARY_DIR = "apps"
APP_VERSION = "1.0.0"
CHECK_PERSONA = "app-check"
CHECK_TS = "2026-01-01T00:00:00Z"
MAX_CODE_CHARS = 60_000
_CREATE = re.compile(r"\s*CREATE\s+(TABLE|INDEX|UNIQUE\s+INDEX|VIEW|TRIGGER)\b", re.I)


class LibraryApp(msgspec.Struct, frozen=True):
    service: str
    app: str
    version: str
    description: str
    schema: list[str]
    code: str
    tools: list[str]  # the names agents call them by, sorted
    made_by: str  # "persona@day" of the day that wrote it

    @property
    def digest(self) -> str:
        return digest(self.code.encode("utf-8"))


def app_name(service: str) -> str:
    return f"library-{service.replace('_', '-')}"


def check_app(service: str, description: str, schema: Sequence[str], code: str, *,
              taken: Collection[str], made_by: str) -> tuple[LibraryApp | None, list[str]]:
    """The app stage's verdict on an app an implementer wrote: the app, or the problems
    (deterministic texts: no paths)."""
    problems = _static_problems(service, schema, code, taken)
    if problems:
        return None, problems
    app = LibraryApp(service=service, app=app_name(service), version=APP_VERSION,
                     description=description.strip(), schema=list(schema), code=code,
                     tools=[], made_by=made_by)
    with tempfile.TemporaryDirectory(prefix="synth-library-app-") as scratch:
        tools, problems = _load_and_smoke(Path(scratch), app)
    problems = [p.replace(scratch, "<scratch>") for p in problems]
    if problems:
        return None, problems
    return msgspec.structs.replace(app, tools=sorted(tools)), []


def _static_problems(service: str, schema: Sequence[str], code: str,
                     taken: Collection[str]) -> list[str]:
    problems = []
    if not is_service(service):
        problems.append(f"service {service!r} is not a service name ([a-z][a-z0-9_]*)")
    elif service in taken:
        problems.append(f"service {service!r} exists already (taken: "
                        f"{', '.join(sorted(taken))}); name the new one otherwise")
    if not any(_CREATE.match(s) and "TABLE" in s.upper()[:40] for s in schema):
        problems.append("the schema has no CREATE TABLE statement")
    problems += [f"schema statement {i}: only CREATE TABLE / INDEX / VIEW / TRIGGER "
                 f"statements make a schema: {s[:80]!r}"
                 for i, s in enumerate(schema, 1) if not _CREATE.match(s)]
    if len(code) > MAX_CODE_CHARS:
        problems.append(f"the code has {len(code):,} characters (at most {MAX_CODE_CHARS:,})")
    try:
        ast.parse(code)
    except SyntaxError as exc:
        problems.append(f"the code does not parse: line {exc.lineno}: {exc.msg}")
    return problems


def _load_and_smoke(scratch: Path, app: LibraryApp) -> tuple[list[str], list[str]]:
    worlds = Worlds.open(scratch / "store", scratch / "cache")
    try:
        lines = b"".join(_line(CHECK_PERSONA, 0, CHECK_TS, p, b)
                         for p, b in app_payloads(app))
        try:
            worlds.import_stream(io.BytesIO(lines), source="<the app's check world>")
        except WorldError as exc:
            return [], [f"the schema with the app does not import: {exc}"]
        with Environment(worlds, worker_limits=SMOKE_LIMITS) as env:
            return _smoke(env, f"{CHECK_PERSONA}@0", app.service)
    finally:
        worlds.close()


def _smoke(env: Environment, ref: str, service: str) -> tuple[list[str], list[str]]:
    try:
        with env.open(ref) as instance:
            listed = instance.list_tools()
    except AppPinError as exc:
        return [], [f"the app does not load: {exc}"]
    names = [t.name for t in listed]
    problems = [f"tool {n} is not named {service}_...: an app serves its own service"
                for n in names if not n.startswith(f"{service}_")]
    if not names:
        problems.append("the app has no tool")
    for tool in listed:
        if (tool.input_schema or {}).get("required"):
            continue
        with env.open(ref) as instance:
            problem = smoke_problem(tool.name, instance.call_tool(tool.name, {}))
        if problem is not None:
            problems.append(problem)
    return names, problems


def app_payloads(app: LibraryApp) -> list[tuple[Payload, bytes | None]]:
    """The events that give a world the app: its pin (the code carried) and its schema."""
    code = app.code.encode("utf-8")
    return [(AppPayload(service=app.service, app=app.app, version=app.version,
                        digest=digest(code), carried=True), code),
            *((SqlPayload(service=app.service, sql=s), None) for s in app.schema)]


def _line(persona: str, day: int, ts: str, payload: Payload, blob: bytes | None) -> bytes:
    from worldstore.interchange import export_line

    return export_line(persona, day, ts, payload, blob)


# --- the run's library --------------------------------------------------------------------


def read_library(folder: Path) -> dict[str, LibraryApp]:
    where = folder / LIBRARY_DIR
    found = {}
    for path in sorted(where.glob("*.json")) if where.is_dir() else []:
        app = msgspec.json.decode(path.read_bytes(), type=LibraryApp)
        found[app.service] = app
    return found


def add_to_library(folder: Path, apps: Sequence[LibraryApp]) -> None:
    for app in apps:
        write_atomically(folder / LIBRARY_DIR / f"{app.service}.json", encode(app))


def library_tools(library: Mapping[str, LibraryApp]) -> dict[str, list[str]]:
    """The shipped apps' tools and the run library's, by service (what bibles and plans are
    grounded in)."""
    found: dict[str, list[str]] = {
        service: sorted(spec.full_name for spec in app.tools.values())
        for service, app in SHIPPED.items()}
    found.update({service: list(app.tools) for service, app in library.items()})
    return dict(sorted(found.items()))


def taken_services(existing: Collection[str], library: Mapping[str, Any]) -> set[str]:
    return set(existing) | set(SHIPPED) | set(library)


__all__ = ["LIBRARY_DIR", "LibraryApp", "add_to_library", "app_name", "app_payloads",
           "check_app", "library_tools", "read_library", "taken_services"]
