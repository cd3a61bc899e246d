"""The AWM adapter: serves an AWM scenario's generated FastAPI server as a carried app.

**Runs only inside the sandboxed app worker** (``worldenv.sandbox.app_worker``), where a
carried module written by ``worldenv.awm.host.awm_app_source`` calls ``serve(...)``. The host
never imports this package (it pins it by the digest of its modules' sources,
``worldenv.awm.shipping``).

The package: ``freeze`` (the frozen clock and entropy), ``dbapi`` (SQLAlchemy on the held
database), ``app`` (the scenario's code run with the stand-ins; one request), ``routes``
(route -> tool translation); this module checks the pin.

``serve`` checks that it is the pinned adapter (name, version, digest of its modules), then
runs the scenario's code as a module of its own, with these stand-ins visible to it only:

* ``create_engine(...)`` (from ``sqlalchemy``) returns one engine over a DBAPI-2 shim on
  apsw (``dbapi.DBAPI``): its one connection is the database the worker holds for the current
  call (the handed instance database, through the pinned SQLite and its frozen-clock VFS),
  so SQLAlchemy never opens a file by name and every write the code makes lands inside
  the call's session capture (``worldenv.core.dispatch.execute_tool``). Until a call hands a
  database (module level: ``Base.metadata.create_all``) it is a scratch in-memory one.
  The shim's transactions are savepoints inside the call's own, and what the code has not
  committed when the request ends is rolled back, as a server's session would be.
* ``datetime``, ``time``, ``random``, ``secrets`` and ``uuid`` modules whose ``now()``,
  ``utcnow()``, ``today()``, ``time()``, random draws, tokens and ``uuid4()`` read the
  call's frozen clock and seed (``worldenv.core.contract.CallClock``) instead of the machine's;
  ``_datetime``, ``builtins`` and ``importlib`` whose imports give the same stand-ins.

**Generated code is deterministic, or refused, or caught.** Stand-ins are not enough:
the code can reach the real modules (``sys.modules``, another module's reference to them).
So ``serve`` also freezes the worker process itself (``freeze.freeze_process``; the worker
serves nothing else): every clock of the ``time`` module (``time``, ``monotonic``,
``perf_counter``, ``process_time``, ``thread_time``, ``clock_gettime``, their ``_ns``
forms, ``localtime``...) reads the call's instant; ``time.sleep`` and the event loop's
timers take no time but move the call's clock on by what they wait (``freeze._Clock.advance``);
``os.urandom``/``getrandom``, ``SystemRandom``, ``secrets``, ``ssl.RAND_bytes``, ``uuid``
and every generator seeded with nothing (``random.Random()``, the C ``_random.Random()``,
tempfile's names) draw from the call's seed, and the ``random`` module's own generator is
reseeded by each call. ``ctypes`` and ``cffi`` cannot be imported at all (they reach the
C library's clock and entropy). The worker's sandbox (``worldenv.sandbox.workers``) masks the
kernel's entropy and clock files (``/dev/urandom``, ``/proc/sys/kernel/random/uuid``...)
and gives every worker one str hash seed. What is left (the C ``datetime`` type reached
through another module, ``id()``, addresses, CPU times, ``/proc/self``, a clock read in a
subprocess, module state kept between instances) is the determinism checker's:
``worldenv.instances.checker.check_carried_tools`` names each call that differs.

Each FastAPI route becomes one tool named ``<service>_<operation_id>``, with the input schema
fastapi-mcp (github.com/tadata-org/fastapi_mcp, MIT) derives from the app's OpenAPI
document: path, query and body parameters flattened into one object (a body model's fields
become top-level parameters), and its description (summary, description, the success
response with an example). A call is what fastapi-mcp does, without a network: the
arguments become one HTTP request (path parameters substituted, query parameters, the rest
as the JSON body) handled by the app in this process (ASGI, one event loop, no threads),
so FastAPI's own validation, dependencies, exception handlers and response models apply.
A 2xx response is the result (its JSON re-indented as fastapi-mcp does, and as structured
content when it is an object); a 4xx/5xx (an ``HTTPException``, a validation error, a bug
in the code: FastAPI answers 500) is an error result with fastapi-mcp's wording. Every
route may write (a GET that writes included): the session capture records whatever the
call changed.

Limits: FastAPI's startup/lifespan handlers are not run (AWM's code creates its tables at
import, on the scratch database); code that reaches a database other than through
``create_engine`` (``sqlite3.connect``) finds only the sandbox's private, empty ``/tmp``;
``uuid1()`` is a seeded ``uuid4()``; sync routes and dependencies run inline, not in a
thread pool (calls of one worker are serial anyway).
"""

from __future__ import annotations

from pathlib import Path

from worldenv.awm.adapter.app import NAME, VERSION, AwmApp
from worldenv.awm.adapter.routes import AwmTool
from worldenv.awm.shipping import adapter_digest
from worldenv.errors import AppPinError

__all__ = ["AwmApp", "AwmTool", "serve"]


def own_digest() -> str:
    """The digest of the adapter as installed here (``worldenv.awm.shipping``)."""
    return adapter_digest(Path(__file__).resolve().parent)


def serve(service: str, code: str, *, adapter: str, version: str, digest: str) -> AwmApp:
    """The app for one scenario's generated server `code` (called by the carried module)."""
    have = (NAME, VERSION, own_digest())
    if (adapter, version, digest) != have:
        raise AppPinError(
            f"the world pins AWM adapter {adapter} {version} ({digest}); this install has "
            f"{have[0]} {have[1]} ({have[2]})")
    return AwmApp(service, code)
