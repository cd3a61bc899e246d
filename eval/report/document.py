"""A report as one structure (sections of text, tables and plots), rendered as Markdown
(``eval.report.markdown``) and as HTML (``eval.report.html``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from eval.report.numbers import DASH

__all__ = ["Document", "Plot", "Section", "Table", "numeric_columns"]


@dataclass(frozen=True)
class Table:
    headers: Sequence[str]
    rows: Sequence[Sequence[str]]
    caption: str | None = None


@dataclass(frozen=True)
class Plot:
    name: str  # the file stem under plots/
    title: str
    svg: str


@dataclass
class Section:
    title: str
    notes: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)


@dataclass
class Document:
    title: str
    intro: list[str]
    sections: list[Section]


_NUMERIC = re.compile(r"^[+\-$]?\d")


def numeric_columns(table: Table) -> list[bool]:
    """Which columns hold numbers (right-aligned): every cell a number or a dash."""
    return [i > 0 and all(_NUMERIC.match(row[i]) or row[i] == DASH for row in table.rows)
            for i in range(len(table.headers))]
