"""Sandboxes of different roles cannot starve each other; the snapshot cache is untouchable
(hardening, class 2). Real bubblewrap, real app workers, real verifier runs, real Chromium.

**Process hoarders.** Each role's sandbox has a process limit counted for it alone
(``worldenv.sandbox``). A hoarder in each role (an agent shell, a carried app's tool call, a
verifier script) takes every process or thread it can, or forks a bomb, and holds them;
meanwhile a shell of another instance, a call of another instance in another worker of
the same app (forking processes and threads of its own) and an honest verifier run all
start and work, and the hoarder never holds more than its own limit. The browser cannot
be made to hoard by anything a world or a page holds (page script is off): it starts and
renders while every other role hoards at once, under a limit of its own.

**The cache.** Carried app code is handed the snapshot's database read-only; a tool, a
shell command and a verifier script each try to change the cache through every means they
have (re-mode, reopen through ``/proc/self/fd``, truncate, shared mappings, allocation,
links, paths, renames, parent directories, metadata). Run by a host process as root and as
an unprivileged uid (``setpriv``: then the worker's uid owns every cached file), every file
of the cache keeps its bytes, mode and mtime, ``verify`` passes and a fresh instance reads
the snapshot as it was.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gates.verifier import VERIFIER_LIMITS, run_verifier
from replay import Worlds
from tests.support.sandbox_uids import free_uid
from worldenv.gui.browser import BROWSER_MAX_PROCS, Browser
from worldenv.instances.instance import Environment, Instance
from worldenv.sandbox.bubblewrap import BubblewrapSandbox
from worldenv.sandbox.choice import default_sandbox
from worldenv.sandbox.contract import Limits
from worldenv.sandbox.workers import WorkerLimits, WorkerPool

REPO = Path(__file__).resolve().parents[2]
SHELL_LIMIT = Limits().max_procs
APP_LIMIT = WorkerLimits().max_procs
VERIFIER_LIMIT = VERIFIER_LIMITS.max_procs
HOLDING = 0.85  # a hoarder holds at least this share of its limit before the others run
HOLD_TIMEOUT_S = 30.0

# A carried app: an honest title, a neighbour that forks and threads, a hoarder, and the
# attacks on the database it is handed.
APP_CODE = '''
import errno, mmap, os, stat, threading, time
from worldenv.core.app import App, ToolContext

app = App(service="notes", name="hostile-notes", version="0.1")
GARBAGE = b"overwritten by the app" * 64


@app.tool(writes=False)
def title(ctx: ToolContext, note_id: int) -> str:
    """The note's title."""
    return ctx.value("SELECT title FROM notes WHERE id = ?", (note_id,))


@app.tool(writes=False)
def spawn(ctx: ToolContext, n: int) -> int:
    """Fork n children and start n threads, and wait for them all."""
    pids = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    threads = [threading.Thread(target=time.sleep, args=(0.01,)) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return n


@app.tool(writes=False)
def hoard(ctx: ToolContext, kind: str) -> int:
    """Take every process (or thread) the kernel gives, and hold them."""
    held = 0
    try:
        for _ in range(1000):
            if kind == "threads":
                threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
            elif os.fork() == 0:
                while kind == "bomb":
                    try:
                        os.fork()
                    except OSError:
                        time.sleep(0.1)
                time.sleep(600)
                os._exit(0)
            held += 1
    except (OSError, RuntimeError):
        pass
    time.sleep(600)
    return held


def _handed():
    """The descriptors of regular files (the database handed over) beyond 0-2."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if fd > 2 and stat.S_ISREG(os.fstat(fd).st_mode):
                found.append(fd)
        except OSError:
            pass
    return found


def _write(fd):
    return os.pwrite(fd, GARBAGE, 0)


OPENED = []  # what an attack opened, closed after it: the next attacks only what it is handed


def _reopen(fd, flags):
    try:
        os.fchmod(fd, 0o666)
    except OSError:
        pass
    OPENED.append(os.open(f"/proc/self/fd/{fd}", flags))
    return OPENED[-1]


def _libc_fallocate(fd, mode):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.fallocate(fd, mode, ctypes.c_long(0), ctypes.c_long(4096)) != 0:
        raise OSError(ctypes.get_errno(), "fallocate")
    return "allocated"


def _paths(fd):
    target = os.readlink(f"/proc/self/fd/{fd}")
    tried = []
    for step in (lambda: os.chmod(target, 0o666),
                 lambda: os.chmod(os.path.dirname(target), 0o777),
                 lambda: open(target, "r+b").write(GARBAGE),
                 lambda: os.unlink(target),
                 lambda: os.rename(target, target + ".moved"),
                 lambda: os.rename("/proc/self/fd/%d" % fd, "/tmp/moved")):
        try:
            step()
            tried.append("done")
        except OSError as exc:
            tried.append(errno.errorcode.get(exc.errno, str(exc.errno)))
    return f"{target}: {tried}"


def _link(fd):
    if os.path.exists("/tmp/linked"):
        os.unlink("/tmp/linked")
    os.link(f"/proc/self/fd/{fd}", "/tmp/linked", follow_symlinks=True)
    with open("/tmp/linked", "r+b") as f:
        return f.write(GARBAGE)


def _mmap(fd, reopen):
    target = _reopen(fd, os.O_RDWR) if reopen else fd
    with mmap.mmap(target, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as m:
        m[:len(GARBAGE)] = GARBAGE
    return "mapped and written"


ATTACKS = {
    "fchmod_pwrite": lambda fd: (os.fchmod(fd, 0o666), _write(fd)),
    "write": lambda fd: os.write(fd, GARBAGE),
    "reopen_rdwr": lambda fd: _write(_reopen(fd, os.O_RDWR)),
    "reopen_truncate": lambda fd: _reopen(fd, os.O_WRONLY | os.O_TRUNC),
    "reopen_append": lambda fd: os.write(_reopen(fd, os.O_WRONLY | os.O_APPEND), GARBAGE),
    "ftruncate": lambda fd: os.ftruncate(fd, 0),
    "ftruncate_reopened": lambda fd: os.ftruncate(_reopen(fd, os.O_RDWR), 0),
    "mmap": lambda fd: _mmap(fd, False),
    "mmap_reopened": lambda fd: _mmap(fd, True),
    "grow": lambda fd: os.posix_fallocate(_reopen(fd, os.O_RDWR), 0, 1 << 20),
    "punch_hole": lambda fd: _libc_fallocate(_reopen(fd, os.O_RDWR), 3),
    "hard_link": _link,
    "paths": _paths,
    "metadata": lambda fd: (os.utime(fd, (0, 0)), os.fchmod(fd, 0o000)),
}


@app.tool(writes=False)
def attack(ctx: ToolContext, how: str) -> list[str]:
    """Try to change the database handed over in one way; say what happened."""
    ctx.value("SELECT count(*) FROM notes")
    outcomes = []
    try:
        for fd in _handed():
            try:
                outcomes.append(f"{how} {fd}: {ATTACKS[how](fd)!r}")
            except OSError as exc:
                outcomes.append(f"{how} {fd}: {errno.errorcode.get(exc.errno, exc.errno)}")
    finally:
        while OPENED:
            os.close(OPENED.pop())
    return outcomes
'''
ATTACKS = ("fchmod_pwrite", "write", "reopen_rdwr", "reopen_truncate", "reopen_append",
           "ftruncate", "ftruncate_reopened", "mmap", "mmap_reopened", "grow", "punch_hole",
           "hard_link", "paths", "metadata")

# A process hoarder for a shell or a verifier script: python, as the app's hoard above,
# holding until the file `release` appears; then it kills its own process group.
HOARD = '''
import os, signal, sys, threading, time
kind, release = sys.argv[1], sys.argv[2]
# Threads meet the process limit before the memory limit (RLIMIT_AS): small stacks, and
# one malloc arena (M_ARENA_MAX) rather than 64 MiB of address space per thread.
threading.stack_size(1 << 16)
try:
    import ctypes
    ctypes.CDLL(None).mallopt(-8, 1)
except (ImportError, OSError, AttributeError):
    pass
try:
    os.setpgid(0, 0)  # a group of its own, to kill at the end (a session leader has one)
except OSError:
    pass
held = 0
try:
    for _ in range(1000):
        if kind == "threads":
            threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
        elif os.fork() == 0:
            while kind == "bomb":
                try:
                    os.fork()
                except OSError:
                    time.sleep(0.1)
            time.sleep(600)
            os._exit(0)
        held += 1
except (OSError, RuntimeError):
    pass
while not os.path.exists(release):
    time.sleep(0.02)
print(held, flush=True)
os.killpg(0, signal.SIGKILL)
'''
HONEST_VERIFIER = '''
import awsdk
ws = awsdk.worlds()
awsdk.result(title_kept=awsdk.value(ws.w, "notes", "SELECT title FROM notes WHERE id = 1")
             == "note of p")
'''
NEIGHBOUR = """
import os, threading, time
pids = [os.fork() or os._exit(0) for _ in range(20)]
[os.waitpid(p, 0) for p in pids]
threading.stack_size(1 << 16)
ts = [threading.Thread(target=time.sleep, args=(0.01,)) for _ in range(20)]
[t.start() for t in ts]
[t.join() for t in ts]
print("neighbour ok")
"""
NEIGHBOUR_SHELL = f"python3 -c {shlex.quote(NEIGHBOUR)}"


def _log(persona: str) -> list[dict[str, object]]:
    def line(second: int, **fields: object) -> dict[str, object]:
        return {"persona": persona, "day": 0, "ts": f"2026-01-01T00:00:0{second}Z",
                "service": "notes", **fields}

    return [line(0, type="sql", sql="CREATE TABLE notes(id INTEGER PRIMARY KEY, title TEXT)"),
            line(1, type="sql", sql=f"INSERT INTO notes VALUES (1, 'note of {persona}')"),
            line(2, type="app", app="hostile-notes", version="0.1", code=APP_CODE)]


def _world_log(personas: tuple[str, ...] = ("p", "q")) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n"
                    for persona in personas for line in _log(persona))


# --- processes, seen from the host ----------------------------------------------------------


def _scan(space: str = "pid") -> list[tuple[int, int, str, int, str]]:
    """(pid, parent pid, its `space` namespace, tasks, command line) of every process."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            ns = os.readlink(f"/proc/{entry}/ns/{space}")
            tasks = len(os.listdir(f"/proc/{entry}/task"))
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except (OSError, IndexError, ValueError):
            continue
        found.append((int(entry), ppid, ns, tasks, cmdline))
    return found


def _sandbox_tasks(marker: str) -> int:
    """The tasks (processes and threads) of the busiest sandbox holding a process whose
    command line has `marker`: of its user namespace (other than ours), where the kernel
    counts its process limit (bwrap's own processes outside it are not counted)."""
    ours = os.readlink("/proc/self/ns/user")
    procs = _scan("user")
    spaces = {ns for _, _, ns, _, cmd in procs if marker in cmd and ns != ours}
    return max((sum(t for _, _, ns, t, _ in procs if ns == space) for space in spaces),
               default=0)


class Watch:
    """Polls the task count of the sandbox with `marker` until stopped; the peak."""

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _sandbox_tasks(self.marker))
            self._stop.wait(0.05)

    def wait_for(self, at_least: int, running: Callable[[], bool]) -> None:
        give_up = time.monotonic() + HOLD_TIMEOUT_S
        while self.peak < at_least:
            assert running(), f"the hoarder ended before it held {at_least} tasks"
            assert time.monotonic() < give_up, (self.marker, self.peak)
            time.sleep(0.05)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


# --- the roles ------------------------------------------------------------------------------


@dataclass
class Roles:
    worlds: Worlds
    env: Environment
    verifier: Path  # the honest verifier's folder
    w0: Path  # the cached snapshot of p@0
    w: Path  # a world of p@0 the host may add files to (a hoarder's release)


@pytest.fixture(scope="module")
def roles(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Roles]:
    if not isinstance(default_sandbox(), BubblewrapSandbox):
        pytest.fail("these tests need bubblewrap (apt-get install bubblewrap util-linux)")
    base = tmp_path_factory.mktemp("roles")
    with Worlds.open(base / "store") as worlds:
        worlds.import_stream(io.BytesIO(_world_log()), source="w.jsonl")
        env = Environment(worlds, apps={})
        # A spare worker: another instance's call finds one started while a hoarder
        # holds the first (a worker's start is the slowest part of these tests).
        env._pool = WorkerPool(WorkerLimits(timeout_s=60, max_workers=8, spares=1))
        verifier = base / "verifier"
        verifier.mkdir()
        (verifier / "10_title.py").write_text(HONEST_VERIFIER)
        w = base / "w"
        worlds.checkout("p@0", w)
        (w / "workspace").mkdir(exist_ok=True)  # where the host releases a hoarder
        os.chmod(base, 0o755)
        with env:
            yield Roles(worlds, env, verifier, worlds.snapshot("p", 0), w)


def _title(instance: Instance) -> object:
    result = instance.call_tool("notes_title", {"note_id": 1})
    assert not result.is_error, result.text
    return result.structured


def _others_work(roles: Roles) -> None:
    """Another instance's shell, another instance's calls (in another worker of the same
    app), and a verifier run: each starts processes and threads, and works."""
    with roles.env.open("q@0") as other:
        shell = other.shell(NEIGHBOUR_SHELL)
        assert (shell.exit_code, shell.stdout.strip()) == (0, "neighbour ok"), shell.stderr
        spawned = other.call_tool("notes_spawn", {"n": 16})
        assert not spawned.is_error and spawned.structured == {"result": 16}, spawned.text
        assert _title(other) == {"result": "note of q"}
    verdict = run_verifier(roles.verifier, roles.w0, roles.w, "done")
    assert verdict.passed, (verdict.errors, verdict.checks)


def _hoarding_shell(roles: Roles, kind: str, marker: str) -> tuple[Callable[[], None], int]:
    """Start a shell hoarder on p@0; its release and its limit."""
    instance = roles.env.open("p@0")
    release = f"release-{marker}"
    command = f"python3 -c {shlex.quote(HOARD)} {kind} /workspace/{release}  # {marker}"
    done = threading.Event()

    def hoard() -> None:
        try:
            instance.shell(command, Limits(timeout_s=HOLD_TIMEOUT_S + 10))
        finally:
            done.set()

    threading.Thread(target=hoard, daemon=True).start()

    def stop() -> None:
        (instance.mount.workspace / release).write_text("")
        done.wait(HOLD_TIMEOUT_S)
        instance.close()

    return stop, SHELL_LIMIT


def _hoarding_app(roles: Roles, kind: str, marker: str) -> tuple[Callable[[], None], int]:
    """Start an app hoarder on p@0 (held until its worker is killed); its stop and limit."""
    instance = roles.env.open("p@0")
    assert _title(instance) == {"result": "note of p"}
    assert roles.env._pool is not None
    before = {w.pid for w in roles.env._pool.workers() if w.pid is not None}
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(
        instance.call_tool("notes_hoard", {"kind": kind})), daemon=True)
    thread.start()

    def stop() -> None:
        ours = os.readlink("/proc/self/ns/pid")
        busiest = max(before, key=lambda pid: _tasks_below(pid, ours))
        os.kill(busiest, signal.SIGKILL)  # its bwrap: the sandbox dies with it
        thread.join(HOLD_TIMEOUT_S)
        assert result and result[0].is_error  # the worker died under the call
        instance.close()

    return stop, APP_LIMIT


def _tasks_below(pid: int, ours: str) -> int:
    """The tasks of the sandboxes (pid namespaces other than ours) under process `pid`."""
    procs = _scan()
    children: dict[int, list[int]] = {}
    for p, parent, _, _, _ in procs:
        children.setdefault(parent, []).append(p)
    below, todo = set(), [pid]
    while todo:
        p = todo.pop()
        below.add(p)
        todo += children.get(p, [])
    return sum(t for p, _, ns, t, _ in procs if p in below and ns != ours)


def _hoarding_verifier(roles: Roles, kind: str, marker: str
                       ) -> tuple[Callable[[], None], int]:
    """Start a verifier run whose one script hoards; its release and limit."""
    folder = Path(tempfile.mkdtemp(prefix="hoarding-verifier-"))
    os.chmod(folder, 0o755)
    release = f"release-{marker}"
    (folder / f"10_{marker}.py").write_text(
        f"import sys\nsys.argv = ['hoard', {kind!r}, '/w/workspace/{release}']\n" + HOARD)
    done = threading.Event()

    def hoard() -> None:
        try:
            run_verifier(folder, roles.w0, roles.w, "done")
        finally:
            done.set()

    threading.Thread(target=hoard, daemon=True).start()

    def stop() -> None:
        (roles.w / "workspace" / release).write_text("")
        done.wait(HOLD_TIMEOUT_S)
        (roles.w / "workspace" / release).unlink()
        shutil.rmtree(folder)

    return stop, VERIFIER_LIMIT


HOARDERS = {"shell": _hoarding_shell, "app": _hoarding_app, "verifier": _hoarding_verifier}


def _marker_of(role: str, marker: str) -> str:
    return "worldenv.sandbox.app_worker" if role == "app" else marker


@pytest.mark.parametrize(("role", "kind"), [
    (role, kind) for role in HOARDERS for kind in ("procs", "threads", "bomb")])
def test_a_hoarder_starves_no_other_sandbox(roles: Roles, role: str, kind: str) -> None:
    marker = f"hoard{uuid.uuid4().hex[:12]}"
    watch = Watch(_marker_of(role, marker))
    stop, limit = HOARDERS[role](roles, kind, marker)
    try:
        watch.wait_for(int(HOLDING * limit), lambda: True)
        _others_work(roles)
        held = watch.peak
    finally:
        stop()
        peak = watch.stop()
    assert int(HOLDING * limit) <= held <= peak <= limit, (held, peak, limit)


def test_the_browser_starts_while_every_other_role_hoards(roles: Roles) -> None:
    stops = []
    try:
        for role, hoarder in HOARDERS.items():
            marker = f"hoard{uuid.uuid4().hex[:12]}"
            watch = Watch(_marker_of(role, marker))
            stop, limit = hoarder(roles, "procs", marker)
            stops.append(stop)
            watch.wait_for(int(HOLDING * limit), lambda: True)
            watch.stop()
        browser = Browser()
        browser.start()
        try:
            target = browser.call("Target.createTarget", {"url": "about:blank"})
            assert target.get("targetId")
            assert browser.pid is not None
            ours = os.readlink("/proc/self/ns/pid")
            chromium = [p for p, _, ns, _, cmd in _scan()  # not bwrap's, setpriv's
                        if ns != ours and os.path.basename(cmd.split(" ", 1)[0]) == "chromium"]
            assert chromium
            with open(f"/proc/{chromium[0]}/limits") as f:
                limits = [line.split() for line in f if line.startswith("Max processes")]
            assert limits == [["Max", "processes", str(BROWSER_MAX_PROCS),
                               str(BROWSER_MAX_PROCS), "processes"]]
        finally:
            browser.close()
        _others_work(roles)
    finally:
        for stop in stops:
            stop()


# --- the cache ------------------------------------------------------------------------------

# What the host side runs, as root or as an unprivileged uid: a store and its cache of its
# own; each of the hostile app's attacks on a lazy instance of a world of its own (handed
# its cached snapshot); a shell and a verifier attacking the cache's paths; after each,
# which files of the cache changed; then what verify says and what new workers read.
HOST_SIDE = '''
import hashlib, json, os, sys
from pathlib import Path
from worldenv.instances.instance import Environment
from worldenv.sandbox.workers import WorkerLimits, WorkerPool
from gates.verifier import run_verifier
from replay import Worlds

base = Path(sys.argv[1])
attacks = json.loads(sys.argv[2])


def cache_files(root):
    found = {}
    for dirpath, dirs, files in os.walk(root):
        for name in sorted(dirs + files):
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            data = b""
            if os.path.isfile(path) and not os.path.islink(path):
                try:
                    with open(path, "rb") as f:
                        data = f.read()
                except OSError as exc:  # an attack took it away
                    data = str(exc).encode()
            used = name == "lock"  # its mtime is the entry's last use: touched by design
            found[os.path.relpath(path, root)] = [st.st_mode, None if used else st.st_mtime_ns,
                                                  st.st_size, hashlib.sha256(data).hexdigest()]
    return found


class Changes:
    def __init__(self, root):
        self.root = root
        self.state = cache_files(root)

    def since(self):
        now = cache_files(self.root)
        changed = sorted(k for k in set(now) | set(self.state) if now.get(k) != self.state.get(k))
        self.state = now
        return changed


def title(instance):
    return instance.call_tool("notes_title", {"note_id": 1}).structured


out = {"uid": os.getuid(), "attacks": {}}
with Worlds.open(base / "store") as worlds:
    worlds.import_file(base / "world.jsonl")
    snapshots = {p.persona: worlds.snapshot(p.persona, 0) for p in worlds.store.personas()}
    changes = Changes(worlds.cache.root / "snapshots")
    env = Environment(worlds, apps={})
    env._pool = WorkerPool(WorkerLimits(timeout_s=10))
    with env:
        for i, how in enumerate(attacks):
            with env.open(f"a{i}@0") as a:
                got = a.call_tool("notes_attack", {"how": how})
                out["attacks"][how] = {"outcome": got.text, "changed": changes.since(),
                                       "title": title(a)}
        with env.open("p@0") as p:
            snapshot = snapshots["p"]
            cache = worlds.cache.root
            db = snapshot / "services" / "notes.sqlite"
            shell = p.shell(
                f"chmod -R a+w {cache}; echo x >> {db}; ln {db} /workspace/l; "
                f"rm -rf {cache}; mv {snapshot} /workspace/moved; "
                "find / -xdev -name '*.sqlite' 2>/dev/null | while read f; do "
                "chmod 666 \\"$f\\"; echo x >> \\"$f\\"; done; echo shell done")
            out["shell"] = {"result": [shell.exit_code, shell.stdout[-200:], shell.stderr[-600:]],
                            "changed": changes.since()}
        verdict = run_verifier(base / "attacker", snapshots["p"], snapshots["q"], "x")
        out["verifier"] = {"result": [[c.name, c.passed] for c in verdict.checks]
                           + verdict.errors, "changed": changes.since()}
        # Every snapshot handed again (its kept sealed copy) after all the attacks.
        out["fresh_titles"] = {}
        for persona in snapshots:
            with env.open(f"{persona}@0") as instance:
                out["fresh_titles"][persona] = title(instance)
    out["verify"] = [str(p) for p in worlds.verify().problems]
print("RESULT " + json.dumps(out))
'''

# Verifier scripts attacking the world they see, which is the cache's snapshot.
ATTACKER = '''
import errno, mmap, os
import awsdk

GARBAGE = b"overwritten by the verifier"
changed = []


def attempt(name, step):
    try:
        step()
        changed.append(name)
    except OSError:
        pass


for world in ("/w0", "/w"):
    for dirpath, dirs, files in os.walk(world):
        attempt("chmod dir " + dirpath, lambda: os.chmod(dirpath, 0o777))
        for name in files:
            path = os.path.join(dirpath, name)
            attempt("chmod " + path, lambda: os.chmod(path, 0o666))
            attempt("write " + path, lambda: open(path, "r+b").write(GARBAGE))
            attempt("truncate " + path, lambda: os.truncate(path, 0))
            attempt("utime " + path, lambda: os.utime(path, (0, 0)))
            attempt("link " + path, lambda: os.link(path, "/workspace/linked"))
            attempt("rename " + path, lambda: os.rename(path, path + ".x"))
            attempt("unlink " + path, lambda: os.unlink(path))
            fd = os.open(path, os.O_RDONLY)
            attempt("fchmod " + path, lambda: os.fchmod(fd, 0o666))
            attempt("reopen " + path,
                    lambda: os.write(os.open(f"/proc/self/fd/{fd}", os.O_RDWR), GARBAGE))
            attempt("mmap " + path, lambda: mmap.mmap(fd, 0, mmap.MAP_SHARED,
                                                      mmap.PROT_WRITE))
awsdk.result(nothing_changed=not changed)
'''


HOSTS = {"root host": None, "non-root host": free_uid(62_000 + os.getpid() % 1_000)}


def _start_host_side(base: Path, uid: int | None) -> subprocess.Popen[str]:
    """Start HOST_SIDE in a fresh python in `base`, as root (`uid` None) or as `uid` with
    no capability (a host that does not run as root)."""
    personas = ("p", "q", *(f"a{i}" for i in range(len(ATTACKS))))
    (base / "world.jsonl").write_bytes(_world_log(personas))
    (base / "attacker").mkdir()
    (base / "attacker" / "10_attack.py").write_text(textwrap.dedent(ATTACKER))
    (base / "host_side.py").write_text(HOST_SIDE)
    prefix: list[str] = []
    if uid is not None:
        for path in (base, *base.iterdir(), *(base / "attacker").iterdir()):
            os.chown(path, uid, uid)
        setpriv = shutil.which("setpriv")
        assert setpriv is not None
        prefix = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                  "--inh-caps=-all", "--bounding-set=-all", "--"]
    return subprocess.Popen(
        [*prefix, sys.executable, str(base / "host_side.py"), str(base), json.dumps(ATTACKS)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=base,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(base),
             "PYTHONPATH": str(REPO)})


@pytest.fixture(scope="module")
def host_sides() -> Iterator[dict[str, dict[str, Any]]]:
    """What HOST_SIDE found on each host (both run at once: most of it is waiting)."""
    if os.geteuid() != 0:
        pytest.fail("these tests run the host side as root and through setpriv: run as root")
    bases = {host: Path(tempfile.mkdtemp(prefix="hostile-cache-", dir="/tmp"))
             for host in HOSTS}  # /tmp: an unprivileged uid reaches it
    try:
        running = {host: _start_host_side(bases[host], uid) for host, uid in HOSTS.items()}
        found = {}
        for host, proc in running.items():
            stdout, stderr = proc.communicate(timeout=300)
            lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
            assert proc.returncode == 0 and lines, (host, stderr[-3000:])
            found[host] = json.loads(lines[-1][len("RESULT "):])
            assert (found[host]["uid"] == 0) == (HOSTS[host] is None)
        yield found
    finally:
        for base in bases.values():
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(params=list(HOSTS))
def host_side(request: pytest.FixtureRequest, host_sides: dict[str, dict[str, Any]]
              ) -> dict[str, Any]:
    return host_sides[request.param]


@pytest.mark.parametrize("how", ATTACKS)
def test_app_code_cannot_change_the_snapshot_it_is_handed(host_side: dict[str, Any],
                                                          how: str) -> None:
    attack = host_side["attacks"][how]
    assert f"{how} " in attack["outcome"]  # it ran, on a descriptor it was handed
    assert attack["changed"] == [], attack
    index = ATTACKS.index(how)
    assert attack["title"] == {"result": f"note of a{index}"}, attack
    assert host_side["fresh_titles"][f"a{index}"] == {"result": f"note of a{index}"}
    assert not any(f"a{index}@0" in problem for problem in host_side["verify"]), host_side


def test_a_shell_cannot_reach_the_cache(host_side: dict[str, Any]) -> None:
    code, stdout, stderr = host_side["shell"]["result"]
    assert code == 0 and "shell done" in stdout, stderr
    assert host_side["shell"]["changed"] == []
    assert host_side["fresh_titles"]["p"] == {"result": "note of p"}


def test_a_verifier_cannot_change_the_snapshot_it_reads(host_side: dict[str, Any]) -> None:
    assert host_side["verifier"]["result"] == [["nothing_changed", True]], host_side
    assert host_side["verifier"]["changed"] == []


def test_verify_finds_the_cache_whole(host_side: dict[str, Any]) -> None:
    assert host_side["verify"] == []
