"""AWM environments as carried apps: the host side of the shipped AWM adapter.

AWM (Agent World Model, arXiv 2602.10090) generates one FastAPI + SQLAlchemy + pydantic
server file per scenario. agent-worlds serves that code natively as MCP tools through the
**AWM adapter**, an app of the project: the adapter's code is shipped (the package
``worldenv.awm.adapter``), pinned by name (``AWM_APP``), version (``AWM_ADAPTER_VERSION``)
and the xxh3-128 digest of its modules' sources in a fixed order (``adapter_digest()``, from
``worldenv.awm.shipping``), and each scenario's generated code is carried verbatim
in the world's log inside a small module (``awm_app_source``) that names the adapter's
version and digest. Loading it refuses any other adapter than the pinned one.

The generated code is untrusted: it runs only in the sandboxed app worker, like any
carried app (``worldenv.sandbox.app_worker``). This module never executes it; it only parses it
(``ast``) to count and name its routes, and to find the imports of modules the adapter
refuses (``refused_imports``: native code, which reaches the machine's clock and entropy
around the adapter's frozen ones), so that an importer refuses such code before storing
it. The adapter refuses them again when it runs the code, however they are imported.

An importer writes, for a scenario with server code::

    {"type": "app", "service": "awm", "app": AWM_APP, "version": AWM_ADAPTER_VERSION,
     "code": awm_app_source(full_code)}

and the world's service ``awm`` is then served by one tool per FastAPI route, named by its
``operation_id`` (agents see ``awm_<operation_id>``, or the bare ``operation_id`` with the
instance's bare-names option, ``Environment(..., bare_names=True)``).
"""

from __future__ import annotations

import ast
import re

from worldenv.awm.shipping import adapter_digest, adapter_source

__all__ = ["AWM_ADAPTER_VERSION", "AWM_APP", "AWM_SERVICE", "HTTP_METHODS", "REFUSED_MODULES",
           "adapter_digest", "adapter_source", "awm_app_source", "operation_ids",
           "refused_imports", "route_count"]

AWM_APP = "awm"
AWM_ADAPTER_VERSION = "1.0.0"
AWM_SERVICE = "awm"  # the service an imported scenario's database and app are
HTTP_METHODS = ("get", "post", "put", "patch", "delete")
# As worldenv.awm.adapter.freeze.REFUSED_MODULES (the worker's copy; the host never
# imports it).
REFUSED_MODULES = frozenset({"ctypes", "_ctypes", "cffi", "_cffi_backend"})


def awm_app_source(code: str, *, service: str = AWM_SERVICE) -> str:
    """The carried app module for one scenario's generated server `code` (kept verbatim,
    as a string literal): it hands the code to the shipped adapter, naming the adapter's
    version and digest, which the adapter checks when the worker loads it. Refuses code
    that does not parse (``SyntaxError``), since no worker could serve it."""
    ast.parse(code)
    return (
        '"""An AWM scenario\'s generated server, served by the shipped AWM adapter '
        '(worldenv.awm.adapter).\n\n'
        "The scenario's code (CODE) is carried verbatim; it runs only in the sandboxed app "
        'worker."""\n\n'
        "from worldenv.awm.adapter import serve\n\n"
        f"ADAPTER = {AWM_APP!r}\n"
        f"ADAPTER_VERSION = {AWM_ADAPTER_VERSION!r}\n"
        f"ADAPTER_DIGEST = {adapter_digest()!r}\n"
        f"SERVICE = {service!r}\n"
        f"CODE = {code!r}\n\n"
        "app = serve(SERVICE, CODE, adapter=ADAPTER, version=ADAPTER_VERSION, "
        "digest=ADAPTER_DIGEST)\n"
    )


def operation_ids(code: str) -> list[str]:
    """The ``operation_id`` of each route the code declares with a
    ``@<app>.<method>("/path", ..., operation_id="...")`` decorator, in source order (parsed,
    never run). A route without a literal one gets the id FastAPI generates for it
    (function name, path and method: ``list_items_api_items_get``)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(code)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for decorator in node.decorator_list:
            if not (isinstance(decorator, ast.Call)
                    and isinstance(decorator.func, ast.Attribute)
                    and decorator.func.attr in HTTP_METHODS):
                continue
            path = decorator.args[0] if decorator.args else None
            if isinstance(path, ast.Constant) and isinstance(path.value, str):
                name = re.sub(r"\W", "_", f"{node.name}{path.value}") + \
                    f"_{decorator.func.attr}"
            else:
                name = node.name
            for keyword in decorator.keywords:
                if (keyword.arg == "operation_id" and isinstance(keyword.value, ast.Constant)
                        and isinstance(keyword.value.value, str)):
                    name = keyword.value.value
            found.append((decorator.lineno, name))
    return [name for _line, name in sorted(found)]


def route_count(code: str) -> int:
    """How many routes (tools) the code declares (see ``operation_ids``)."""
    return len(operation_ids(code))


def refused_imports(code: str) -> list[tuple[int, str]]:
    """The line and name of each ``import``/``from ... import`` of a refused module in
    `code` (``REFUSED_MODULES``; parsed, never run)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [(node.lineno, name) for name in names
                  if name.partition(".")[0] in REFUSED_MODULES]
    return sorted(found)
