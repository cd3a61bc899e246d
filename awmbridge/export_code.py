"""A synthesized app rendered as AWM's server code: FastAPI handlers, SQLAlchemy models,
Pydantic v2 request models (the paper's code stage output, ``gen_envs.jsonl`` ``full_code``).

``render_server(scenario, tables, code, operations)`` turns the app that environment
synthesis accepted (the project's app contract, ``worldenv.core.app``: tool functions over
a ``ToolContext``) into one self-contained FastAPI module, deterministically: the same
inputs give the same bytes. Nothing is asked of a model, so what AWM's server and the
project's AWM adapter serve is the code the synthesis checked, not a second translation
that could differ from it.

The module holds, in order:

* the SQLAlchemy setup AWM's server expects: ``DATABASE_PATH`` read from the environment,
  one ``engine = create_engine(...)`` line (AWM's ``env start`` rewrites that line to its
  database; the adapter hands its own engine), ``SessionLocal``, ``Base`` and one ORM model
  per table, read from the schema's DDL (SQLite's ``PRAGMA table_info`` and
  ``foreign_key_list`` on an in-memory database: only SQL runs, never the code);
* ``ToolError`` and a ``ToolContext`` with the contract's methods (``rows``, ``row``,
  ``value``, ``execute``, ``insert``, ``next_id``, ``require``, ``now``, ``user_id``) over
  the request's SQLAlchemy session (``exec_driver_sql``: the tools' SQL unchanged);
* the synthesized module itself, minus its ``worldenv`` imports, its ``App`` object and
  the ``@app.tool`` decorators (parsed and unparsed with ``ast``: comments are dropped);
* ``app = FastAPI(...)``, a handler answering ``ToolError`` with HTTP 400 and its message,
  and one route per tool, in source order: ``operation_id`` the tool's name, summary and
  description from the spec (else the docstring), a Pydantic v2 body model whose fields
  are the tool's parameters with their own annotations and defaults (a read-only tool
  without parameters is a GET), ``response_model`` the tool's return annotation. The
  route opens a session, calls the tool, commits and closes; a ``ToolError`` or a bug
  leaves nothing committed, as the contract's dispatch does;
* the uvicorn entry point AWM's server looks for (``uvicorn.run(app``).

Refused (``ExportRefused``, naming the field): code that does not parse, imports other
project modules, uses its ``App`` object beyond ``@app.tool``, reads ``ctx.db`` (the raw
connection) or ``ctx.call_index`` (AWM's server has no call index), or binds a name the
rendered module needs.

The clock differs by design: ``ctx.now`` is ``datetime.now(timezone.utc)`` at the request.
Under the adapter that clock is the call's frozen one; under AWM's server it is the
machine's, as in every AWM environment.
"""

from __future__ import annotations

import ast
import keyword
import re
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from awmbridge.errors import ExportRefused

__all__ = ["Operation", "ToolDef", "render_server", "tool_defs"]

PROJECT_IMPORTS = ("worldenv.core.app", "worldenv.errors")
_PROJECT_PACKAGES = frozenset({"worldstore", "replay", "packs", "worldenv", "worldllm", "gates",
                               "awmbridge", "synth", "rl", "eval", "worldctl"})
_CONTRACT_NAMES = frozenset({"App", "ToolContext", "ToolError", "CURRENT_USER"})
_NO_COUNTERPART = {"db": "the raw database connection", "call_index": "the call's index"}
_RESERVED_ATTRS = frozenset({"metadata", "query", "query_class", "registry"})
# What the rendered module imports, by the name bound: the import that binds it. The
# synthesized module may import the same names the same way, and nothing else by them.
_OWN_IMPORTS = {
    "os": "import os", "_dt": "import datetime", "Any": "from typing",
    "FastAPI": "from fastapi", "Request": "from fastapi",
    "JSONResponse": "from fastapi.responses", "BaseModel": "from pydantic",
    "ConfigDict": "from pydantic", "Field": "from pydantic", "Column": "from sqlalchemy",
    "ForeignKey": "from sqlalchemy", "Integer": "from sqlalchemy", "Text": "from sqlalchemy",
    "Float": "from sqlalchemy", "Numeric": "from sqlalchemy", "LargeBinary": "from sqlalchemy",
    "create_engine": "from sqlalchemy", "declarative_base": "from sqlalchemy.orm",
    "sessionmaker": "from sqlalchemy.orm",
}
_OWN_DEFINED = ("DATABASE_URL", "engine", "SessionLocal", "Base", "ToolError", "ToolContext",
                "app", "handle_tool_error")


@dataclass(frozen=True, slots=True)
class Operation:
    """What the API spec says of one tool (summary, description, tables it uses)."""

    summary: str
    description: str
    tables: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    annotation: str  # source text
    default: str | None  # source text, None: required


@dataclass(frozen=True, slots=True)
class ToolDef:
    """One tool of the synthesized module, as parsed."""

    name: str
    writes: bool
    params: tuple[Param, ...]
    returns: str | None  # the return annotation's source
    doc: str


# --- the synthesized module -----------------------------------------------------------


def _refuse(message: str, field: str) -> ExportRefused:
    return ExportRefused(message, file="the app code", field=field)


def _is_project(module: str) -> bool:
    return module.partition(".")[0] in _PROJECT_PACKAGES


def _app_names(tree: ast.Module) -> set[str]:
    """The names bound to ``App(...)`` at the module's top level."""
    found: set[str] = set()
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name) and node.value.func.id == "App"):
            found |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return found


def _tool_decorator(node: ast.expr, apps: set[str]) -> bool | None:
    """``writes`` of an ``@<app>.tool(writes=...)`` decorator, None for another one."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "tool" and isinstance(node.func.value, ast.Name)
            and node.func.value.id in apps):
        return None
    for kw in node.keywords:
        if kw.arg == "writes":
            if not (isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, bool)):
                raise _refuse("writes= must be True or False", f"@tool of line {node.lineno}")
            return kw.value.value
    raise _refuse("the decorator has no writes=", f"@tool of line {node.lineno}")


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[Param, ...]:
    args = fn.args
    if args.vararg or args.kwarg or args.posonlyargs:
        raise _refuse("*args, **kwargs and positional-only parameters have no HTTP form",
                      f"tool {fn.name}")
    positional = args.args
    if not positional or positional[0].arg != "ctx":
        raise _refuse("the first parameter must be 'ctx'", f"tool {fn.name}")
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults))
    defaults += list(args.defaults)
    pairs = [*zip(positional, defaults, strict=True), *zip(args.kwonlyargs,
                                                              args.kw_defaults, strict=True)]
    found = []
    for arg, default in pairs[1:]:
        if keyword.iskeyword(arg.arg) or arg.arg.startswith("_"):
            raise _refuse(f"parameter {arg.arg!r} cannot be a body field", f"tool {fn.name}")
        found.append(Param(arg.arg, ast.unparse(arg.annotation) if arg.annotation else "Any",
                           None if default is None else ast.unparse(default)))
    return tuple(found)


def _check_context_use(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
    for node in ast.walk(fn):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == "ctx" and node.attr in _NO_COUNTERPART):
            raise _refuse(f"ctx.{node.attr} ({_NO_COUNTERPART[node.attr]}) has no "
                          "counterpart in AWM's server", f"tool {fn.name}, line {node.lineno}")


class _Strip(ast.NodeTransformer):
    """The module without its contract imports, its App object and the tool decorators."""

    def __init__(self, apps: set[str]) -> None:
        self.apps = apps
        self.tools: list[ToolDef] = []

    def visit_Module(self, node: ast.Module) -> ast.Module:
        body: list[ast.stmt] = []
        for stmt in node.body:
            if isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module:
                if stmt.module in PROJECT_IMPORTS:
                    extra = sorted({a.name for a in stmt.names} - _CONTRACT_NAMES)
                    if extra:
                        raise _refuse(f"imports {', '.join(extra)} from {stmt.module}",
                                      f"line {stmt.lineno}")
                    continue
                if _is_project(stmt.module):
                    raise _refuse(f"imports {stmt.module}, which AWM's server cannot load",
                                  f"line {stmt.lineno}")
            if isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    if _is_project(alias.name):
                        raise _refuse(f"imports {alias.name}, which AWM's server cannot "
                                      "load", f"line {stmt.lineno}")
            if isinstance(stmt, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id in self.apps for t in stmt.targets):
                continue
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                self._tool(stmt)
            body.append(stmt)
        node.body = body
        for inner in ast.walk(node):
            if isinstance(inner, ast.Name) and inner.id in self.apps:
                raise _refuse(f"uses its App object {inner.id!r} beyond @{inner.id}.tool",
                              f"line {inner.lineno}")
            if isinstance(inner, ast.ImportFrom | ast.Import) and inner not in node.body:
                names = ([inner.module or ""] if isinstance(inner, ast.ImportFrom)
                         else [a.name for a in inner.names])
                for name in names:
                    if _is_project(name):
                        raise _refuse(f"imports {name}, which AWM's server cannot load",
                                      f"line {inner.lineno}")
        return node

    def _tool(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        kept: list[ast.expr] = []
        writes: bool | None = None
        for decorator in fn.decorator_list:
            found = _tool_decorator(decorator, self.apps)
            if found is None:
                kept.append(decorator)
            else:
                writes = found
        if writes is None:
            return
        if isinstance(fn, ast.AsyncFunctionDef):
            raise _refuse("an async tool is not the app contract", f"tool {fn.name}")
        if kept:
            raise _refuse("a tool with other decorators than @app.tool", f"tool {fn.name}")
        fn.decorator_list = []
        _check_context_use(fn)
        doc = " ".join((ast.get_docstring(fn) or "").split())
        self.tools.append(ToolDef(fn.name, writes, _params(fn),
                                  ast.unparse(fn.returns) if fn.returns else None, doc))


def tool_defs(code: str) -> tuple[list[ToolDef], ast.Module]:
    """The tools of a synthesized module and the module stripped of the contract."""
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        raise _refuse(f"does not parse: {exc.msg}", f"line {exc.lineno}") from None
    apps = _app_names(tree)
    if not apps:
        raise _refuse("no `app = App(...)`: not the app contract", "app")
    strip = _Strip(apps)
    stripped = strip.visit(tree)
    if not strip.tools:
        raise _refuse("defines no tool (@app.tool)", "app")
    return strip.tools, stripped


def _bound_names(tree: ast.Module) -> dict[str, str]:
    """Top-level names the module binds: name -> the import that binds it ("" defined)."""
    found: dict[str, str] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                same = alias.asname is None or alias.asname == alias.name
                found[alias.asname or alias.name] = (f"from {stmt.module}" if same
                                                     else f"from {stmt.module} as")
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                top = alias.name.partition(".")[0]
                found[alias.asname or top] = (f"import {top}" if alias.asname is None
                                              else f"import {alias.name}")
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found[stmt.name] = ""
        elif isinstance(stmt, ast.Assign | ast.AnnAssign):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                for node in ast.walk(target):
                    if isinstance(node, ast.Name):
                        found[node.id] = ""
    return found


# --- the schema -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Column:
    name: str
    kind: str  # a SQLAlchemy type name
    not_null: bool
    pk: bool
    references: str | None  # "table.column"


def _affinity(declared: str) -> str:
    """SQLite's type affinity rules (in its order), as SQLAlchemy types."""
    upper = declared.upper()
    if "INT" in upper:
        return "Integer"
    if any(word in upper for word in ("CHAR", "CLOB", "TEXT")):
        return "Text"
    if not upper or "BLOB" in upper:
        return "LargeBinary" if upper else "Text"
    if any(word in upper for word in ("REAL", "FLOA", "DOUB")):
        return "Float"
    return "Numeric"


def _columns(tables: Sequence[tuple[str, str]]) -> dict[str, list[_Column]]:
    conn = sqlite3.connect(":memory:")
    try:
        for name, ddl in tables:
            try:
                conn.execute(ddl)
            except sqlite3.Error as exc:
                raise ExportRefused(f"the DDL does not run: {exc}", file="the schema",
                                    field=f"table {name}") from None
        found: dict[str, list[_Column]] = {}
        for name, _ddl in tables:
            refs = {row[3]: f"{row[2]}.{row[4] or 'id'}" for row in
                    conn.execute(f'PRAGMA foreign_key_list("{name}")')}
            found[name] = [_Column(row[1], _affinity(row[2] or ""), bool(row[3]),
                                   bool(row[5]), refs.get(row[1]))
                           for row in conn.execute(f'PRAGMA table_info("{name}")')]
            if not found[name]:
                raise ExportRefused("no such table after its DDL ran", file="the schema",
                                    field=f"table {name}")
        return found
    finally:
        conn.close()


def _camel(name: str) -> str:
    words = [w for w in re.split(r"[^0-9A-Za-z]+", name) if w]
    text = "".join(w[:1].upper() + w[1:] for w in words) or "Item"
    return text if text[0].isalpha() else f"T{text}"


def _attr(column: str) -> str:
    safe = re.sub(r"\W", "_", column)
    if not safe or safe[0].isdigit():
        safe = f"c_{safe}"
    if keyword.iskeyword(safe) or safe in _RESERVED_ATTRS or safe.startswith("_"):
        safe = f"{safe.lstrip('_')}_"
    return safe


def _model(table: str, columns: list[_Column]) -> list[str]:
    # A table without a declared key is mapped on all its columns: the ORM needs one, and
    # the model only describes the table (the tools query with SQL).
    every_pk = not any(c.pk for c in columns)
    lines = [f"class {_camel(table)}(Base):", f"    __tablename__ = {table!r}"]
    for col in columns:
        args = [repr(col.name), col.kind]
        if col.references:
            args.append(f"ForeignKey({col.references!r})")
        if col.pk or every_pk:
            args.append("primary_key=True")
        elif col.not_null:
            args.append("nullable=False")
        lines.append(f"    {_attr(col.name)} = Column({', '.join(args)})")
    return [*lines, "", "", ""]


# --- the module -----------------------------------------------------------------------

_HEAD = '''\
import datetime as _dt
import os
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Column, Float, ForeignKey, Integer, LargeBinary, Numeric, Text, create_engine
from sqlalchemy.orm import declarative_base, sessionmaker

DATABASE_URL = os.getenv("DATABASE_PATH") or {default_url}
engine = create_engine(DATABASE_URL, connect_args={{"check_same_thread": False}})
SessionLocal = sessionmaker(bind=engine, autoflush=False)
Base = declarative_base()


'''

_CONTEXT = '''\
class ToolError(Exception):
    pass


class ToolContext:
    def __init__(self, session: Any) -> None:
        self.session = session
        self.now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.user_id = 1

    def _run(self, sql: str, params: Any = ()) -> Any:
        bound = dict(params) if isinstance(params, dict) else tuple(params)
        return self.session.connection().exec_driver_sql(sql, bound)

    def rows(self, sql: str, params: Any = ()) -> list[dict[str, Any]]:
        result = self._run(sql, params)
        if not result.returns_rows:
            return []
        return [dict(row) for row in result.mappings()]

    def row(self, sql: str, params: Any = ()) -> dict[str, Any] | None:
        found = self.rows(sql, params)
        return found[0] if found else None

    def value(self, sql: str, params: Any = ()) -> Any:
        result = self._run(sql, params)
        if not result.returns_rows:
            return None
        first = result.first()
        return None if first is None else first[0]

    def execute(self, sql: str, params: Any = ()) -> int:
        return int(self._run(sql, params).rowcount)

    def insert(self, table: str, values: dict[str, Any]) -> int:
        cols = ", ".join(f'"{{c}}"' for c in values)
        marks = ", ".join("?" for _ in values)
        result = self._run(f'INSERT INTO "{{table}}" ({{cols}}) VALUES ({{marks}})',
                           tuple(values.values()))
        return int(result.lastrowid)

    def next_id(self, table: str, column: str = "id") -> int:
        return int(self.value(f'SELECT COALESCE(MAX("{{column}}"), 0) + 1 FROM "{{table}}"'))

    @staticmethod
    def require(row: dict[str, Any] | None, what: str, key: object) -> dict[str, Any]:
        if row is None:
            raise ToolError(f"No {{what}} with id {{key!r}}")
        return row


'''

_APP = '''\
app = FastAPI(title={title}, version="1.0.0", description={description})


@app.exception_handler(ToolError)
async def handle_tool_error(request: Request, exc: ToolError) -> JSONResponse:
    return JSONResponse(status_code=400, content={{"detail": str(exc)}})


'''

_MAIN = '''\
if __name__ == "__main__":
    import uvicorn

    host = os.getenv("HOST", "127.0.0.1")
    port = int(os.getenv("PORT", "8000"))
    uvicorn.run(app, host=host, port=port)
'''


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3].rstrip() + "..."


def _route(tool: ToolDef, op: Operation | None, scenario: str) -> list[str]:
    summary = _one_line(op.summary if op else tool.doc.partition(". ")[0] or tool.name, 80)
    description = _one_line(op.description if op else tool.doc or tool.name, 200)
    tags = list(op.tables[:1]) if op and op.tables else [scenario]
    method = "get" if not tool.writes and not tool.params else "post"
    response = tool.returns or "Any"
    lines: list[str] = []
    signature = ""
    call = "ToolContext(session)"
    if tool.params:
        model = f"{_camel(tool.name)}Request"
        lines += [f"class {model}(BaseModel):", "    model_config = ConfigDict(extra='forbid')"]
        for p in tool.params:
            lines.append(f"    {p.name}: {p.annotation}"
                         + (f" = {p.default}" if p.default is not None else ""))
        lines += ["", ""]
        signature = f"body: {model}"
        call += ", **body.model_dump(exclude_unset=True)"
    lines += [
        f"@app.{method}({f'/api/{tool.name}'!r}, operation_id={tool.name!r}, "
        f"summary={summary!r}, description={description!r}, tags={tags!r}, "
        f"response_model={response})",
        f"async def route_{tool.name}({signature}) -> Any:",
        "    session = SessionLocal()",
        "    try:",
        f"        result = {tool.name}({call})",
        "        session.commit()",
        "        return result",
        "    finally:",
        "        session.close()",
        "", "", ""]
    return lines


def render_server(scenario: str, tables: Sequence[tuple[str, str]], code: str,
                  operations: Mapping[str, Operation] | None = None,
                  description: str = "") -> str:
    """AWM's server module for a synthesized app (see the module docstring). `tables`:
    (name, DDL) in the schema's order; `operations`: the spec by operation id."""
    operations = operations or {}
    tools, stripped = tool_defs(code)
    columns = _columns(tables)
    own = set(_OWN_DEFINED) | {_camel(t) for t, _ in tables}
    own |= {f"{_camel(t.name)}Request" for t in tools if t.params}
    own |= {f"route_{t.name}" for t in tools}
    for name, source in sorted(_bound_names(stripped).items()):
        clash = name in own or (name in _OWN_IMPORTS and source != _OWN_IMPORTS[name])
        if clash:
            raise _refuse(f"binds {name!r}, which the rendered AWM module needs", "names")
    models = [_camel(t) for t, _ in tables]
    for dup in sorted({m for m in models if models.count(m) > 1}):
        raise ExportRefused(f"two tables map to the model name {dup}", file="the schema",
                            field="tables")
    future = [s for s in stripped.body
              if isinstance(s, ast.ImportFrom) and s.module == "__future__"]
    body = [s for s in stripped.body if s not in future]
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]  # the synthesized module's docstring: this module has its own
    parts = [f'"""{scenario}: an environment synthesized by agent-worlds, rendered in '
             "AWM's code format."
             '"""\n\n']
    parts += [ast.unparse(s) + "\n" for s in future]
    parts.append(_HEAD.format(default_url=repr(f"sqlite:///{scenario}.db")))
    for table, _ddl in tables:
        parts.append("\n".join(_model(table, columns[table])))
    parts.append("Base.metadata.create_all(engine)\n\n\n")
    parts.append(_CONTEXT.format())
    if body:
        parts.append(ast.unparse(ast.Module(body=body, type_ignores=[])) + "\n\n\n")
    parts.append(_APP.format(title=repr(scenario), description=repr(_one_line(description,
                                                                              200))))
    for tool in tools:
        parts.append("\n".join(_route(tool, operations.get(tool.name), scenario)))
    parts.append(_MAIN)
    text = "".join(parts)
    ast.parse(text)  # a rendering bug shows here, not in a worker
    return text
