"""Apps: the code behind a service's MCP tools.

An app is a module that builds one ``App`` for one service and registers tool functions::

    app = App(service="shop", name="avshop", version="1.0.0")

    @app.tool(writes=False)
    def get_product(ctx: ToolContext,
                    product_id: Annotated[int, Field(description="Product id")]) -> Product:
        '''Get one product by id.'''
        return Product(**ctx.require(ctx.row("SELECT * FROM products WHERE id = ?",
                                             (product_id,)), "product", product_id))

A tool's first parameter is the ``ToolContext``; the others are typed (pydantic
``Annotated[..., Field(...)]``) and become the tool's input schema; the return annotation
(a pydantic model, a list of them, or a scalar) becomes its output schema. The docstring
is its description. ``writes=True`` marks tools that change state: their calls record
the row-level effects in the episode; read-only calls record only the call.

Tools see a frozen clock (``ctx.now``) and derive new ids from the data
(``ctx.next_id``), so the same world and the same calls always give the same responses.
User 1 is the logged-in user (``ctx.user_id``). A tool refuses bad requests by raising
``ToolError``: the agent sees its message as an error result.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import apsw

from worldenv.errors import ToolError
from worldstore.canonical import digest

__all__ = ["CURRENT_USER", "App", "Runner", "ToolContext", "ToolError", "ToolSpec", "bind"]

F = TypeVar("F", bound=Callable[..., Any])
CURRENT_USER = 1


@dataclass(frozen=True)
class ToolSpec:
    service: str
    name: str
    fn: Callable[..., Any]
    description: str
    writes: bool

    @property
    def full_name(self) -> str:
        """The name agents see: service first, so it says where the tool belongs."""
        return f"{self.service}_{self.name}"


@dataclass
class App:
    service: str
    name: str
    version: str
    tools: dict[str, ToolSpec] = field(default_factory=dict)
    source: str = ""  # the module's source text; its digest pins the app in a world

    def tool(self, *, writes: bool) -> Callable[[F], F]:
        def register(fn: F) -> F:
            params = list(inspect.signature(fn).parameters)
            if not params or params[0] != "ctx":
                raise TypeError(f"tool {fn.__name__}: the first parameter must be 'ctx'")
            description = inspect.cleandoc(fn.__doc__ or "").strip()
            if not description:
                raise TypeError(f"tool {fn.__name__}: a docstring (its description) is required")
            if fn.__name__ in self.tools:
                raise TypeError(f"tool {fn.__name__} is registered twice in app {self.name}")
            self.tools[fn.__name__] = ToolSpec(self.service, fn.__name__, fn, description, writes)
            return fn
        return register

    @property
    def digest(self) -> str:
        return digest(self.source.encode("utf-8"))


class ToolContext:
    """What a tool may use: its service's database, the frozen time, the current user."""

    def __init__(self, db: apsw.Connection, now: str, call_index: int) -> None:
        self.db = db
        self.now = now
        self.call_index = call_index
        self.user_id = CURRENT_USER

    def rows(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[dict[str, Any]]:
        cursor = self.db.execute(sql, params)
        try:
            names = [d[0] for d in cursor.getdescription()]
        except apsw.ExecutionCompleteError:
            return []
        return [dict(zip(names, row, strict=True)) for row in cursor]

    def row(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> dict[str, Any] | None:
        found = self.rows(sql, params)
        return found[0] if found else None

    def value(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Any:
        row = self.db.execute(sql, params).fetchone()
        return None if row is None else row[0]

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> int:
        """Run a write; returns the number of rows it changed."""
        for _ in self.db.execute(sql, params):
            pass
        return int(self.db.changes())

    def insert(self, table: str, values: dict[str, Any]) -> int:
        """INSERT one row; returns its rowid."""
        cols = ", ".join(f'"{c}"' for c in values)
        marks = ", ".join("?" for _ in values)
        self.execute(f'INSERT INTO "{table}" ({cols}) VALUES ({marks})', tuple(values.values()))
        return int(self.db.last_insert_rowid())

    def next_id(self, table: str, column: str = "id") -> int:
        """A new primary key derived from the data (MAX + 1): deterministic, never random."""
        return int(self.value(f'SELECT COALESCE(MAX("{column}"), 0) + 1 FROM "{table}"'))

    @staticmethod
    def require(row: dict[str, Any] | None, what: str, key: object) -> dict[str, Any]:
        if row is None:
            raise ToolError(f"No {what} with id {key!r}")
        return row


Runner = Callable[[ToolSpec, dict[str, Any]], Any]


def bind(spec: ToolSpec, runner: Runner) -> Callable[..., Any]:
    """A function with the tool's signature minus ``ctx`` that hands its arguments to
    `runner`. MCP frameworks read schemas from it; `runner` supplies the context."""
    hints = _type_hints(spec.fn)
    signature = inspect.signature(spec.fn)
    params = [p.replace(annotation=hints.get(p.name, p.annotation))
              for p in list(signature.parameters.values())[1:]]

    def call(**kwargs: Any) -> Any:
        return runner(spec, kwargs)

    call.__name__ = spec.full_name
    call.__qualname__ = spec.full_name
    call.__doc__ = spec.description
    call.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=params, return_annotation=hints.get("return", signature.return_annotation))
    call.__annotations__ = {k: v for k, v in hints.items() if k != "ctx"}
    return call


def _type_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    import typing

    return typing.get_type_hints(fn, include_extras=True)
