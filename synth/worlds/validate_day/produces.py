"""produces.json: what a day declares it writes (the format is in the package docstring)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec

from worldstore.errors import WorldError

__all__ = [
    "Change",
    "Credential",
    "CrossRef",
    "FileWrite",
    "Place",
    "Produces",
    "RowRef",
    "RowWrite",
    "Scalar",
    "load_produces",
]

Scalar = int | float | str | bool | None
Change = Literal["written", "removed"]


class RowRef(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    service: str
    table: str
    where: dict[str, Scalar] = {}


class RowWrite(RowRef, frozen=True, forbid_unknown_fields=True):
    change: Change = "written"


class FileWrite(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    path: str
    change: Change = "written"


class Place(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A row (service, table, where, optionally one column) or a workspace file."""

    file: str | None = None
    service: str | None = None
    table: str | None = None
    where: dict[str, Scalar] = {}
    column: str | None = None


class CrossRef(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    source: Place = msgspec.field(name="from")
    mentions: str
    to: Place | None = None


class Credential(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    file: str
    contains: str


class Produces(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    db_writes: list[RowWrite] = []
    files: list[str | FileWrite] = []
    accounts: list[RowRef] = []
    cross_refs: list[CrossRef] = []
    credentials: list[Credential] = []


def load_produces(source: Path | Mapping[str, Any]) -> Produces:
    """Decode produces.json (a path or its parsed object); WorldError names the field."""
    where = str(source) if isinstance(source, Path) else "produces"
    try:
        if isinstance(source, Path):
            return msgspec.json.decode(source.read_bytes(), type=Produces)
        return msgspec.convert(dict(source), Produces)
    except OSError as exc:
        raise WorldError(f"{where}: cannot read it ({exc.strerror})") from None
    except msgspec.DecodeError as exc:  # ValidationError too: its message names the field
        raise WorldError(f"{where}: {exc}") from None
