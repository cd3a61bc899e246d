"""Event types: the interchange form people write and the stored form the log keeps.

Both are msgspec Structs tagged with stable wire names (``sql``, ``file_write``,
``file_delete``), never class names. A stored event carries its stream position
(``persona``, dense ``seq``), its ``day`` and frozen ``ts``, the id of its predecessor
(``prev``: the hash chain) and its own deterministic ``event_id``. File contents are not
in the event: a stored ``file_write`` names a blob by digest.

``SCHEMA_VERSION`` is the version of the stored payload; records written under an older
version are upcast on read through ``UPCASTERS`` (v -> v+1, one function per step).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import msgspec

from worldstore.canonical import canonical_bytes, digest
from worldstore.errors import StoreVersionError

SCHEMA_VERSION = 1
GENESIS = "0" * 32  # the `prev` of a persona's first event

ParamValue = int | float | str | bool | None | dict[str, str]
Params = list[ParamValue] | dict[str, ParamValue]


# --- interchange form (one JSON object per line) -----------------------------------------


class _Wire(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True,
            tag_field="type"):
    persona: str
    day: int
    ts: str


class SqlLine(_Wire, tag="sql", frozen=True):
    service: str
    sql: str
    params: Params | None = None


class FileWriteLine(_Wire, tag="file_write", frozen=True):
    path: str
    text: str | None = None
    base64: str | None = None


class FileDeleteLine(_Wire, tag="file_delete", frozen=True):
    path: str


class AppLine(_Wire, tag="app", frozen=True):
    """Pins the app (the tools' code) that serves a service in this world: a shipped app by
    name, version and digest of its source, or an app carried in the log as code."""

    service: str
    app: str
    version: str
    digest: str | None = None
    code: str | None = None


Line = SqlLine | FileWriteLine | FileDeleteLine | AppLine
EVENT_TYPES: tuple[str, ...] = ("sql", "file_write", "file_delete", "app")


# --- stored payloads ------------------------------------------------------------------


class _Payload(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True,
               tag_field="type"):
    pass


class SqlPayload(_Payload, tag="sql", frozen=True):
    service: str
    sql: str
    params: Params | None = None


class FileWritePayload(_Payload, tag="file_write", frozen=True):
    path: str
    blob: str
    size: int
    # How the interchange line carried the bytes, so export writes the same kind of line.
    encoding: Literal["text", "base64"]


class FileDeletePayload(_Payload, tag="file_delete", frozen=True):
    path: str


class AppPayload(_Payload, tag="app", frozen=True):
    service: str
    app: str
    version: str
    digest: str  # xxh3-128 of the app's source text
    carried: bool  # True: the source is in the log, as the blob `digest`


Payload = SqlPayload | FileWritePayload | FileDeletePayload | AppPayload

def blob_of(payload: Payload) -> str | None:
    """The digest of the blob an event's payload refers to, if any."""
    if isinstance(payload, FileWritePayload):
        return payload.blob
    if isinstance(payload, AppPayload) and payload.carried:
        return payload.digest
    return None


_PAYLOAD_JSON = msgspec.json.Encoder(order="deterministic")
_PAYLOAD_DECODER = msgspec.json.Decoder(Payload)


# ``decode_payload`` of a body of the current SCHEMA_VERSION, as one call (replay's path).
decode_current_payload: Callable[[bytes], Payload] = _PAYLOAD_DECODER.decode


def encode_payload(payload: Payload) -> bytes:
    """The stored body of an event: deterministic JSON (readable in the database)."""
    return _PAYLOAD_JSON.encode(payload)


class StoredEvent(msgspec.Struct, kw_only=True, frozen=True):
    persona: str
    seq: int
    day: int
    ts: str
    prev: str
    event_id: str
    schema_version: int
    body: bytes  # encode_payload(payload) as written; the id covers these exact bytes

    @property
    def payload(self) -> Payload:
        return decode_payload(self.body, self.schema_version)

    @property
    def type(self) -> str:
        return self.payload.__struct_config__.tag  # type: ignore[return-value]


# One stored event as replay reads it: (seq, day, ts, event_id, schema_version, body), the
# columns the fold needs and no more (no persona, no prev), with no object built per event.
EventRow = tuple[int, int, str, str, int, bytes]


def event_row(event: StoredEvent) -> EventRow:
    return (event.seq, event.day, event.ts, event.event_id, event.schema_version, event.body)


def compute_event_id(
    *, persona: str, seq: int, day: int, ts: str, prev: str, schema_version: int, body: bytes
) -> str:
    """Deterministic id: a digest over the event's position, time, predecessor and body."""
    return digest(canonical_bytes([schema_version, persona, seq, day, ts, prev, body]))


def make_event(
    *, persona: str, seq: int, day: int, ts: str, prev: str, payload: Payload
) -> StoredEvent:
    body = encode_payload(payload)
    event_id = compute_event_id(
        persona=persona, seq=seq, day=day, ts=ts, prev=prev,
        schema_version=SCHEMA_VERSION, body=body,
    )
    return StoredEvent(
        persona=persona, seq=seq, day=day, ts=ts, prev=prev, event_id=event_id,
        schema_version=SCHEMA_VERSION, body=body,
    )


def recompute_id(event: StoredEvent) -> str:
    return compute_event_id(
        persona=event.persona, seq=event.seq, day=event.day, ts=event.ts, prev=event.prev,
        schema_version=event.schema_version, body=event.body,
    )


# --- upcasting ------------------------------------------------------------------------

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
# UPCASTERS[v] turns a version-v payload (as a plain dict) into a version-(v+1) payload.
UPCASTERS: dict[int, Upcaster] = {}


def upcast(raw: dict[str, Any], version: int, *, upcasters: dict[int, Upcaster] | None = None,
           target: int = SCHEMA_VERSION) -> dict[str, Any]:
    steps = UPCASTERS if upcasters is None else upcasters
    if version > target:
        raise StoreVersionError(
            f"event payload has schema_version {version}, newer than this code's {target}; "
            "upgrade agent-worlds to read this store"
        )
    for v in range(version, target):
        if v not in steps:
            raise StoreVersionError(f"no upcaster from event schema_version {v} to {v + 1}")
        raw = steps[v](raw)
    return raw


def decode_payload(body: bytes, schema_version: int) -> Payload:
    if schema_version == SCHEMA_VERSION:
        return _PAYLOAD_DECODER.decode(body)
    raw = upcast(msgspec.json.decode(body), schema_version)
    payload: Payload = msgspec.convert(raw, Payload)
    return payload
