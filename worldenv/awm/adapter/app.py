"""One scenario's generated FastAPI server as an app: the code runs as a module of its own
with the stand-ins visible to it only (its imports, its ``create_engine``), and one HTTP
request is handled in this process."""

from __future__ import annotations

import base64
import builtins
import importlib
import importlib.util
import logging
import os
import random as _random
import secrets
import sys
import time as _time
import types
import urllib.parse
import uuid as _uuid
import warnings
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any

import anyio.to_thread

from worldenv.awm.adapter.dbapi import create_engine
from worldenv.awm.adapter.freeze import (
    CLOCK,
    DATETIME,
    FROZEN_TIME,
    RANDOM_NAMES,
    REFUSED_MODULES,
    SeededRandom,
    bound_rng,
    freeze_process,
    shim_module,
    token_bytes,
    uuid1,
    uuid4,
    virtual_time_loop,
)
from worldenv.awm.adapter.routes import AwmTool, tools_of
from worldenv.core.app import App
from worldenv.errors import AppPinError

__all__ = ["NAME", "VERSION", "AwmApp"]

NAME = "awm"
VERSION = "1.0.0"
log = logging.getLogger(__name__)


def _require_extra() -> None:
    """The generated code imports FastAPI and SQLAlchemy: say which extra brings them."""
    import importlib.util

    missing = [name for name in ("fastapi", "sqlalchemy", "pydantic")
               if importlib.util.find_spec(name) is None]
    if missing:
        raise AppPinError(f"serving an AWM environment needs {', '.join(missing)}: "
                          "pip install 'agent-worlds[awm]'")


class _LazyProxy(types.ModuleType):
    """A stand-in package: our overrides, else the real module's attributes."""

    def __init__(self, real: types.ModuleType, overrides: dict[str, Any]) -> None:
        super().__init__(real.__name__, real.__doc__)
        self.__dict__["_real"] = real
        self.__dict__.update(overrides)
        self.__dict__["__path__"] = getattr(real, "__path__", [])
        self.__dict__["__file__"] = getattr(real, "__file__", None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_real"], name)


def _stand_ins() -> dict[str, types.ModuleType]:
    import sqlalchemy
    import sqlalchemy.engine

    return {
        "datetime": DATETIME, "_datetime": DATETIME,
        "time": shim_module("time", _time, dict(FROZEN_TIME)),
        "random": shim_module("random", _random, {
            **{n: bound_rng(n) for n in RANDOM_NAMES},
            "Random": SeededRandom, "SystemRandom": SeededRandom}),
        "secrets": shim_module("secrets", secrets, {
            "token_bytes": token_bytes,
            "token_hex": lambda n=None: token_bytes(n).hex(),
            "token_urlsafe": lambda n=None: base64.urlsafe_b64encode(
                token_bytes(n)).rstrip(b"=").decode(),
            "randbelow": lambda n: CLOCK.rng.randrange(n),
            "choice": lambda seq: CLOCK.rng.choice(seq),
            "randbits": lambda k: CLOCK.rng.getrandbits(k),
            "SystemRandom": SeededRandom}),
        "uuid": shim_module("uuid", _uuid, {"uuid4": uuid4, "uuid1": uuid1}),
        "sqlalchemy": _LazyProxy(sqlalchemy, {"create_engine": create_engine}),
        "sqlalchemy.engine": _LazyProxy(sqlalchemy.engine, {"create_engine": create_engine}),
    }


def _importer(stand_ins: dict[str, types.ModuleType]) -> Callable[..., Any]:
    real_import = builtins.__import__

    def _import(name: str, globals: Any = None, locals: Any = None,
                fromlist: Sequence[str] | None = (), level: int = 0) -> Any:
        if level == 0:
            if name.partition(".")[0] in REFUSED_MODULES:
                raise ImportError(f"{name}: generated AWM code may not use it (it reaches "
                                  "the machine's clock and entropy around the frozen ones)",
                                  name=name)
            if name in stand_ins and (fromlist or "." not in name):
                return stand_ins[name]
            top = name.partition(".")[0]
            if not fromlist and top in stand_ins:
                real_import(name, globals, locals, fromlist, level)
                return stand_ins[top]
        return real_import(name, globals, locals, fromlist, level)

    return _import


def _code_import() -> Callable[..., Any]:
    """The code's ``__import__``: the stand-ins, also by ``builtins.__import__``,
    ``importlib.import_module`` and ``importlib.__import__``."""
    stand_ins = _stand_ins()
    hook = _importer(stand_ins)

    def import_module(name: str, package: str | None = None) -> types.ModuleType:
        if name.startswith("."):
            name = importlib.util.resolve_name(name, package)
        module: types.ModuleType = hook(name, None, None, ("__name__",), 0)
        return module

    stand_ins["builtins"] = shim_module("builtins", builtins, {"__import__": hook})
    stand_ins["importlib"] = _LazyProxy(importlib, {"import_module": import_module,
                                                    "__import__": hook})
    return hook


def _inline_threads() -> None:
    """FastAPI runs sync endpoints and dependencies in anyio's worker threads; here they
    run inline (a thread left running would retire the worker, and calls are serial)."""

    async def run_sync(func: Callable[..., Any], *args: Any, **_: Any) -> Any:
        return func(*args)

    anyio.to_thread.run_sync = run_sync  # type: ignore[assignment]


class AwmApp(App):
    """One scenario's routes as tools (``compile_tools``; built when the worker loads)."""

    def __init__(self, service: str, code: str) -> None:
        super().__init__(service=service, name=NAME, version=VERSION)
        self.code = code
        _require_extra()
        os.environ["DATABASE_PATH"] = "sqlite://"  # never a file, whatever the code reads
        _inline_threads()
        freeze_process()
        self.loop = virtual_time_loop()
        module = types.ModuleType(f"awm_scenario_{service}")
        module.__file__ = f"<awm scenario {service}>"
        scope = module.__dict__
        scope["__builtins__"] = {**vars(builtins), "__import__": _code_import()}
        sys.modules[module.__name__] = module  # pydantic resolves annotations through it
        with warnings.catch_warnings():  # FastAPI deprecates `example=`, which AWM uses
            warnings.simplefilter("ignore")
            exec(compile(code, module.__file__, "exec"), scope)
        fastapi_app = scope.get("app")
        from fastapi import FastAPI

        if not isinstance(fastapi_app, FastAPI):
            raise TypeError("the scenario's code does not define `app = FastAPI(...)`")
        self.fastapi = fastapi_app
        self._tools = {t.info.name: t for t in tools_of(self)}
        for tool in self._tools.values():
            self.tools[tool.spec.name] = tool.spec

    def compile_tools(self) -> dict[str, AwmTool]:
        return dict(self._tools)

    def request(self, method: str, path: str, query: list[tuple[str, str]],
                body: bytes | None, extra_headers: Sequence[tuple[str, str]] = ()
                ) -> tuple[int, bytes]:
        """One HTTP request handled by the app in this process: its status and body."""
        headers = [(b"host", b"awm"), (b"accept", b"application/json"),
                   *((k.lower().encode("latin-1"), v.encode("latin-1"))
                     for k, v in extra_headers)]
        if body is not None:
            headers += [(b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())]
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1", "method": method.upper(), "scheme": "http",
            "path": path, "raw_path": path.encode(), "root_path": "",
            "query_string": urllib.parse.urlencode(query).encode(), "headers": headers,
            "client": ("127.0.0.1", 1), "server": ("awm", 80), "state": {},
        }
        sent = False
        status: list[int] = []
        chunks: list[bytes] = []

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body or b"", "more_body": False}
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status.append(int(message["status"]))
            elif message["type"] == "http.response.body":
                chunks.append(bytes(message.get("body", b"")))

        try:
            self.loop.run_until_complete(self.fastapi(scope, receive, send))
        except (Exception, SystemExit):  # the code's bug: starlette answered 500
            log.debug("AWM route %s %s failed", method, path, exc_info=True)
            if not status:
                return 500, b"Internal Server Error"
        return (status[0] if status else 500), b"".join(chunks)
