"""Generated AWM code is deterministic, or refused, or caught (hardening, class 3).

Hostile probes, each an AWM route that reads one source of time or entropy and writes
what it read into the world (``probes``), in three scenarios imported with the AWM importer
and served by real sandboxed app workers:

* ``frozen``: every way found to reach a clock or entropy that the worker freezes or
  seeds from the call's clock and seed (module attributes, ``from x import y`` taken at
  import, ``sys.modules``, ``importlib``, ``__import__``, ``builtins``, the C modules,
  sleeps) or makes unreadable (kernel files, directly or through a subprocess; ctypes).
  Two fresh instances reach the same world hash, and the checker names no call.
* ``leaky``: what cannot be frozen (``id()``, addresses, the real C datetime through
  another module's reference, CPU time, ``/proc``, a clock in a subprocess, module state
  that outlives an instance): ``check_carried_tools`` names exactly these calls, and
  ``worldctl check-awm`` prints them (exit 1).
* ``native``: code that imports ctypes at load by a computed name is refused when the
  worker loads it (``worldctl check-awm`` says so in one ``error:`` line); code that
  imports ctypes or cffi by name is refused by ``worldctl import-awm``, nothing stored.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from awmbridge.importer import import_awm
from replay.engine import Worlds
from worldctl.main import cli
from worldenv.core.contract import CallClock
from worldenv.instances.checker import CheckReport, check_carried_tools
from worldenv.instances.instance import Environment
from worldenv.sandbox.bubblewrap import find_sandbox_tools
from worldenv.sandbox.workers import WorkerLimits, WorkerPool

try:
    find_sandbox_tools(setpriv=False)
except Exception as exc:  # pragma: no cover - the sandbox is a requirement of carried apps
    pytest.skip(f"no sandbox for carried apps: {exc}", allow_module_level=True)

PREAMBLE = '''
from fastapi import FastAPI
from sqlalchemy import create_engine, text
import os
import sys
import time
import random
import asyncio
import builtins
import importlib
import subprocess
import tempfile
import threading
from os import urandom as imported_urandom
from time import perf_counter as imported_perf_counter
from random import random as imported_random
from datetime import datetime
from uuid import uuid4

engine = create_engine(os.getenv("DATABASE_PATH", "sqlite:///probes.db"))
app = FastAPI(title="Probes", version="1.0.0")
CALLS = 0


def record(name, value):
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO probes (name, value) VALUES (:n, :v)"),
                     {"n": name, "v": str(value)})
    return {"name": name, "value": str(value)}


def read(path):
    try:
        with open(path, "rb") as f:
            return f.read(64).hex()
    except OSError as exc:
        return f"unreadable: {type(exc).__name__}"


def run(*argv):
    done = subprocess.run(argv, capture_output=True)
    return [done.returncode, done.stdout.hex()]
'''

# name -> the route's body; it ends by setting `value`, which the route records.
FROZEN: dict[str, str] = {
    # entropy: os
    "os_urandom": "value = os.urandom(8).hex()",
    "os_getrandom": "value = os.getrandom(8).hex()",
    "urandom_imported_at_load": "value = imported_urandom(8).hex()",
    "urandom_sys_modules": "value = sys.modules['os'].urandom(8).hex()",
    "urandom_importlib_posix": "value = importlib.import_module('posix').urandom(8).hex()",
    "urandom_dunder_import": "value = __import__('os').urandom(8).hex()",
    # entropy: random, the C generator, SystemRandom, secrets, uuid, ssl, tempfile
    "random_module": "value = random.random()",
    "random_imported_at_load": "value = imported_random()",
    "random_sys_modules": "value = sys.modules['random'].random()",
    "random_builtins_import": "value = builtins.__import__('random').getrandbits(64)",
    "random_unseeded_instance": "value = sys.modules['random'].Random().random()",
    "random_c_module": "import _random\nvalue = _random.Random().random()",
    "random_c_type_by_mro": "value = sys.modules['random'].Random.__bases__[0]().random()",
    "random_c_reseeded": ("r = sys.modules['random'].Random(5)\nr.seed()\n"
                          "value = r.random()"),
    "system_random": "value = sys.modules['random'].SystemRandom().random()",
    "secrets_sys_modules": "value = sys.modules['secrets'].token_hex(8)",
    "secrets_importlib": "value = importlib.import_module('secrets').randbelow(10**12)",
    "uuid4_imported": "value = uuid4()",
    "uuid_sys_modules": ("u = sys.modules['uuid']\n"
                         "value = [u.uuid4(), u.uuid1(), u.getnode()]"),
    "uuid_c_module": "import _uuid\nvalue = _uuid.generate_time_safe()",
    "ssl_rand_bytes": "import ssl\nvalue = ssl.RAND_bytes(8).hex()",
    "tempfile_name": ("with tempfile.NamedTemporaryFile() as f:\n"
                      "        value = os.path.basename(f.name)"),
    "tempfile_candidates": "value = next(sys.modules['tempfile']._get_candidate_names())",
    # entropy: kernel files, directly and through a subprocess
    "kernel_uuid": "value = read('/proc/sys/kernel/random/uuid')",
    "kernel_boot_id": "value = read('/proc/sys/kernel/random/boot_id')",
    "dev_urandom": "value = read('/dev/urandom')",
    "dev_random": "value = read('/dev/random')",
    "kernel_uuid_subprocess": "value = run('cat', '/proc/sys/kernel/random/uuid')",
    "dev_urandom_subprocess": "value = run('head', '-c', '8', '/dev/urandom')",
    # native code: refused, whatever the spelling
    "ctypes_import": ("try:\n        value = __import__('ctypes')\n"
                      "    except ImportError as exc:\n        value = str(exc)"),
    "ctypes_importlib": ("try:\n        value = importlib.import_module('_ctypes')\n"
                         "    except ImportError as exc:\n        value = str(exc)"),
    # clocks: time, by every name
    "time_time": "value = time.time()",
    "time_monotonic": "value = [time.monotonic(), time.monotonic_ns()]",
    "time_perf_counter": "value = [time.perf_counter(), time.perf_counter_ns()]",
    "time_cpu": "value = [time.process_time(), time.thread_time_ns()]",
    "time_clock_gettime": ("value = [time.clock_gettime(time.CLOCK_REALTIME), "
                           "time.clock_gettime_ns(time.CLOCK_MONOTONIC)]"),
    "perf_counter_imported_at_load": "value = imported_perf_counter()",
    "time_sys_modules": "value = sys.modules['time'].time_ns()",
    "time_importlib": "value = importlib.import_module('time').localtime()",
    "time_through_strptime": "import _strptime\nvalue = _strptime.time.time()",
    "time_through_email": "import email.utils\nvalue = email.utils.formatdate()",
    "time_sleep": "time.sleep(1.5)\nvalue = [time.time(), datetime.now()]",
    "asyncio_loop_time": "value = asyncio.new_event_loop().time()",
    # clocks: datetime, by every name the code's imports reach
    "datetime_now": "value = [datetime.now(), datetime.utcnow()]",
    "datetime_c_module": "import _datetime\nvalue = _datetime.datetime.now()",
    "datetime_importlib": "value = importlib.import_module('datetime').date.today()",
    "datetime_dunder_import": "value = __import__('datetime').datetime.now()",
    # hash() of a string: the workers share one hash seed
    "str_hash": "value = hash('probe')",
}
ASYNC_FROZEN: dict[str, str] = {
    "asyncio_sleep": "await asyncio.sleep(3)\n    value = [time.monotonic(), datetime.now()]",
}
LEAKY: dict[str, str] = {
    "object_id": "value = id(object())",
    "object_repr": "value = repr(object())",
    "thread_ident": "value = threading.get_ident()",
    "datetime_sys_modules": "value = sys.modules['datetime'].datetime.now()",
    "datetime_through_calendar": "import calendar\nvalue = calendar.datetime.datetime.now()",
    "cpu_times": "value = os.times()",
    "proc_self_stat": "value = read('/proc/self/stat')",
    "clock_in_subprocess": "value = run('date', '+%s%N')",
    "module_state": "global CALLS\nCALLS += 1\nvalue = CALLS",
}
# Imported by a name no parser sees: the importer stores it, the worker refuses to load it.
NATIVE_CODE = PREAMBLE + "\nimportlib.import_module('c' + 'types')\n"
# Imported by name: the importer refuses the scenario, naming each import.
STATIC_NATIVE = {"import ctypes": "ctypes", "from ctypes.util import find_library":
                 "ctypes.util", "import _ctypes as c": "_ctypes", "import cffi": "cffi"}


def _routes(probes: dict[str, str], *, is_async: bool = False) -> str:
    routes = []
    for name, body in probes.items():
        indented = "\n".join(f"    {line}" if not line.startswith("    ") else line
                             for line in body.splitlines())
        routes.append(f'''
@app.post("/probe/{name}", operation_id="probe_{name}")
{"async " if is_async else ""}def probe_{name}():
{indented}
    return record("{name}", value)
''')
    return "".join(routes)


def _write_scenario(directory: Path, name: str, code: str) -> None:
    """One scenario in AWM's gen_db / gen_sample / gen_envs formats."""
    ddl = ("CREATE TABLE probes (\n    id INTEGER PRIMARY KEY AUTOINCREMENT,\n"
           "    name TEXT NOT NULL,\n    value TEXT\n)")
    lines = {
        "gen_db.jsonl": {"scenario": name, "db_path": f"./outputs/databases/{name}.db",
                         "db_schema": {"tables": [{"name": "probes", "ddl": ddl,
                                                   "indexes": []}]}},
        "gen_sample.jsonl": {"scenario": name, "tables_count": 1, "inserts_count": 1,
                             "sample_data": {"tables": [{
                                 "table_name": "probes", "reasoning": "a seed row",
                                 "insert_statements": [
                                     "INSERT INTO probes (name, value) VALUES ('seed', '0');"]
                             }]}},
        "gen_envs.jsonl": {"scenario": name, "db_path": f"./outputs/databases/{name}.db",
                           "full_code": code},
    }
    directory.mkdir(parents=True, exist_ok=True)
    for file, line in lines.items():
        with (directory / file).open("a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")


SCENARIOS = {
    "frozen": PREAMBLE + _routes(FROZEN) + _routes(ASYNC_FROZEN, is_async=True),
    "leaky": PREAMBLE + _routes(LEAKY),
    "native": NATIVE_CODE + _routes({"nothing": "value = 0"}),
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Worlds]]:
    root = tmp_path_factory.mktemp("hostile-awm")
    for name, code in SCENARIOS.items():
        _write_scenario(root / "awm", name, code)
    with Worlds.open(root / "store") as worlds:
        report = import_awm(worlds, root / "awm")
        assert report.ok and sorted(r.persona for r in report.imported) == sorted(SCENARIOS)
        yield root / "store", worlds


@pytest.fixture(scope="module")
def frozen_report(store: tuple[Path, Worlds]) -> CheckReport:
    return check_carried_tools(store[1], "frozen@0", limits=WorkerLimits(timeout_s=20))


@pytest.fixture(scope="module")
def leaky_checked(store: tuple[Path, Worlds]) -> Result:
    """``worldctl check-awm leaky@0`` (the checker through the command line)."""
    return CliRunner().invoke(cli, ["--store", str(store[0]), "check-awm", "leaky@0"],
                              prog_name="worldctl", catch_exceptions=False)


def _named(problems: list[str]) -> set[str]:
    """The probes whose calls the checker named."""
    return {problem.split("(awm_probe_", 1)[1].split(")", 1)[0]
            for problem in problems if problem.startswith("call #")}


def test_every_frozen_probe_is_the_same_on_fresh_instances(frozen_report: CheckReport
                                                          ) -> None:
    assert frozen_report.calls == len(FROZEN) + len(ASYNC_FROZEN)
    assert frozen_report.ok, frozen_report.problems
    assert _named(frozen_report.problems) == set()


def test_frozen_probes_read_the_calls_clock_and_refusals(store: tuple[Path, Worlds]) -> None:
    """What the probes saw: the call's instant (plus what it slept), draws that differ from
    call to call, kernel files unreadable, ctypes refused."""
    probes = [*FROZEN, *ASYNC_FROZEN]
    pool = WorkerPool(WorkerLimits(timeout_s=20))
    try:
        with Environment(store[1], workers=pool).open("frozen@0") as instance:
            seen: dict[str, str] = {}
            for name in probes:
                result = instance.call_tool(f"awm_probe_{name}", {})
                assert not result.is_error, (name, result.text)
                seen[name] = result.structured["value"]
            again = instance.call_tool("awm_probe_os_urandom", {}).structured["value"]
            start = instance.record.last_ts
    finally:
        pool.close()
    assert again != seen["os_urandom"]  # seeded by each call, not a constant

    def at(name: str) -> float:
        """The call's clock, in seconds."""
        return CallClock.of_call(start, "", probes.index(name) + 1).millis / 1000

    assert float(seen["time_time"]) == at("time_time")
    assert seen["time_monotonic"] == str([at("time_monotonic"),
                                          round(at("time_monotonic") * 1e9)])
    assert seen["time_through_strptime"] == str(at("time_through_strptime"))
    assert seen["time_sleep"].startswith(f"[{at('time_sleep') + 1.5}, ")
    slept = float(seen["asyncio_sleep"][1:].split(",")[0])
    assert abs(slept - (at("asyncio_sleep") + 3)) < 1e-3
    now = CallClock.of_call(start, "", probes.index("datetime_c_module") + 1).now
    assert seen["datetime_c_module"] == now.removesuffix("Z").replace("T", " ")
    for name in ("kernel_uuid", "kernel_boot_id", "dev_urandom", "dev_random"):
        assert seen[name].startswith("unreadable: "), (name, seen[name])
    for name in ("kernel_uuid_subprocess", "dev_urandom_subprocess"):
        assert seen[name].startswith("[1, ''"), (name, seen[name])  # read nothing
    for name, module in (("ctypes_import", "ctypes"), ("ctypes_importlib", "_ctypes")):
        assert seen[name].startswith(f"{module}: generated AWM code may not use it")


def test_the_checker_names_each_call_it_cannot_freeze(leaky_checked: Result) -> None:
    assert leaky_checked.exit_code == 1, leaky_checked.output
    lines = leaky_checked.stdout.splitlines()
    assert lines[0] == f"leaky@0: {len(LEAKY)} tool(s), each called once on 3 instances"
    problems = [line.strip() for line in lines[1:]]
    assert _named(problems) == set(LEAKY)
    # A fresh worker counts from 1 again; the worker that served an instance before goes on.
    state = [p for p in problems if "(awm_probe_module_state)" in p]
    assert len(state) == 1 and "differ in one worker, after another instance" in state[0]


def test_the_importer_refuses_code_importing_native_modules(tmp_path: Path) -> None:
    code = PREAMBLE + "".join(f"{line}\n" for line in STATIC_NATIVE) + _routes({"x": "value = 0"})
    _write_scenario(tmp_path / "awm", "native_static", code)
    result = CliRunner().invoke(cli, ["--store", str(tmp_path / "store"), "import-awm",
                                      str(tmp_path / "awm")], prog_name="worldctl",
                                catch_exceptions=False)
    assert result.exit_code == 2, result.output
    errors = result.stderr.splitlines()
    assert len(errors) == len(STATIC_NATIVE)
    first = PREAMBLE.count("\n") + 1
    for at, (error, name) in enumerate(zip(errors, STATIC_NATIVE.values(), strict=True)):
        assert error == (f"error: {tmp_path / 'awm' / 'gen_envs.jsonl'}:1: scenario "
                         f"native_static: its server code imports {name} (line {first + at} "
                         "of the code), which generated AWM code may not use: it reaches "
                         "the machine's clock and entropy around the frozen ones")
    with Worlds.open(tmp_path / "store") as worlds:
        assert worlds.store.personas() == []


@pytest.mark.parametrize(("ref", "why"), [
    ("nobody@0", "nobody"),
    ("native@0", "ctypes: generated AWM code may not use it"),  # refused at load
])
def test_worldctl_check_awm_refusals(store: tuple[Path, Worlds], ref: str, why: str) -> None:
    refused = CliRunner().invoke(cli, ["--store", str(store[0]), "check-awm", ref],
                                 prog_name="worldctl", catch_exceptions=False)
    assert refused.exit_code == 2, refused.output
    assert refused.stderr.count("\n") == 1 and refused.stderr.startswith("error: ")
    assert why in refused.stderr and refused.stdout == ""
