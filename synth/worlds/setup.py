"""A persona world's day 0 (methods.md section 4): the computer as it is before the first
planned day, made from the persona's bible and the app library, with no model involved.

For each of the bible's services, day 0 pins the library's app (an ``app`` event: the
service's name, the app's name, version and digest, so that every later day is served by
exactly that code) and creates the service's schema: the ``CREATE`` statements of that
service in the app library's reference world (the bundled demo world's day 0, whose
databases the shipped apps were written against). The workspace gets ``accounts.json``:
the persona's accounts with their deterministic password hashes (``synth.worlds.personas``).

A service of the run's app library (an app a day of another persona wrote,
``synth.worlds.applib``) comes with its carried app and its schema instead.

Everything else (contacts, messages, orders, files) is written by the days, which the
implementer makes from plans; the first plan sees empty tables. Day 0's events all carry
``SETUP_TS``: the world begins before any plan's date.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache

import msgspec

from packs.registry import load_pack
from synth.errors import SynthError
from synth.stage import encode
from synth.worlds.applib import LibraryApp, app_payloads
from synth.worlds.personas import BibleOut, accounts_file
from worldenv.apps import SHIPPED
from worldstore.canonical import digest
from worldstore.events import AppPayload, FileWritePayload, Payload, SqlPayload
from worldstore.interchange import export_line

SETUP_TS = "2026-01-01T00:00:00Z"
ACCOUNTS_FILE = "accounts.json"
_REFERENCE_PACK = "demo"


@cache
def library_schemas() -> dict[str, tuple[str, ...]]:
    """Per service of the app library, its schema: the ``CREATE`` statements of day 0 of
    the first reference world that has the service (the pack's first world, lars, is the
    one the shipped apps were written against; a later world may add tables of its own),
    in their order."""
    found: dict[str, list[str]] = {}
    for world in load_pack(_REFERENCE_PACK).worlds:
        this_world: dict[str, list[str]] = {}
        for line in world.read_bytes().splitlines():
            event = msgspec.json.decode(line)
            if event.get("day") != 0 or event.get("type") != "sql":
                continue
            sql = str(event["sql"])
            if sql.lstrip()[:6].upper() == "CREATE":
                this_world.setdefault(str(event["service"]), []).append(sql)
        for service, statements in this_world.items():
            found.setdefault(service, statements)
    return {service: tuple(statements) for service, statements in sorted(found.items())}


def setup_lines(bible: BibleOut, library: Mapping[str, LibraryApp] | None = None) -> bytes:
    """Day 0 of `bible`'s persona as interchange lines; a service of the run's app
    `library` (``synth.worlds.applib``) comes with its carried app and its schema."""
    schemas = library_schemas()
    events: list[tuple[Payload, bytes | None]] = []
    for service in sorted(bible.services):
        app = SHIPPED.get(service)
        if library and service in library:
            events += app_payloads(library[service])
            continue
        if app is None or service not in schemas:
            known = sorted({*schemas, *(library or {})})
            raise SynthError(f"persona {bible.name!r}: service {service!r} is not in the app "
                             f"library (services: {', '.join(known)})")
        events.append((AppPayload(service=service, app=app.name, version=app.version,
                                  digest=app.digest, carried=False), None))
        events += [(SqlPayload(service=service, sql=sql), None) for sql in schemas[service]]
    accounts = encode(accounts_file(bible))
    events.append((FileWritePayload(path=ACCOUNTS_FILE, blob=digest(accounts),
                                    size=len(accounts), encoding="text"), accounts))
    return b"".join(export_line(bible.name, 0, SETUP_TS, payload, blob)
                    for payload, blob in events)


__all__ = ["ACCOUNTS_FILE", "SETUP_TS", "library_schemas", "setup_lines"]
