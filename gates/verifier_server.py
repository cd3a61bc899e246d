"""Verifier servers: V(W0, W, a) in a sandbox that stays up from one run to the next.

A run of ``run_verifier`` in a sandbox of its own pays, before its first script starts,
for a bubblewrap sandbox (~9 ms here), a Python start (~8 ms) and the driver's imports
(~12 ms), and that is most of a run: a rollout's grade, a gate's check and each of
synthesis' verifier checks pay it again. A server is that sandbox and that driver kept:
the runner stages a run's worlds, verifier and answer where the server sees them, the
driver (``awdriver.drive`` serving) forks the scripts as for a one-run sandbox, then ends
what they left (processes, files under /tmp, /dev/shm and /workspace, System V IPC
objects) and compares what it cannot restore with what it was before the first job (its
own rlimits, scheduling, signal state, descriptors and modules, which a script can change
from outside or the driver could take from a job, and the sandbox's sockets) before it
says the job is done; a server that could not clean up, or that a job changed, is stopped.
Kernel keyrings are closed to every process of a verifier sandbox (``awdriver``), so none
carries a key from one job to the next.

What a script sees is what a one-run sandbox shows it: ``/w0``, ``/w``, ``/verifier``
and ``/answer.txt`` read-only at the same paths, a scratch ``/workspace`` (a tmpfs of its
own, as in a one-run sandbox), the same limits per process, the same modules: neither
driver ever has the verifier folder on its module path, and a script has it last, after
the standard library and the SDK. A server's binds are fixed when it starts, so each run's trees are
*staged* into the server's own directories: hardlinked entry by entry (directories made
with their source's mode and owner; files, symlinks and special files linked, never
followed nor opened), which needs the server's directory on the worlds' file system —
hence the caller's `scratch`, a directory there (``run_verifier(scratch=...)``; the gates
pass their snapshot cache's scratch area). The links are removed when the job is done.
Staging walks W as ``replay.files`` walks every agent-made tree (``lstat`` per entry, each
directory checked to be the inode its parent listed); nothing of the agent runs while its
world is graded (a shell's processes end with its call, and grading holds the instance),
so what was listed is what is linked.

A run is served only when that gives the verdict a one-run sandbox gives; otherwise it
runs in a sandbox of its own as before: a writable verifier (the counterfactual probe), a
sandbox other than bubblewrap, a tree that cannot be linked (another file system, over
``STAGE_MAX_ENTRIES`` entries), or a server that fails to start (the one-run sandbox then
says why). A run that times out, floods
its output, or whose driver a script killed, is judged as in a one-run sandbox, and the
server is stopped. A server also retires after ``MAX_JOBS`` jobs or once its driver has
used half its CPU limit, and idles at most ``IDLE_S`` seconds; at most ``MAX_IDLE`` wait
in this process.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import shlex
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from replay.errors import WorldDirError
from replay.files import link_tree, remove_tree
from worldenv.errors import SandboxError
from worldenv.sandbox.bubblewrap import BubblewrapSandbox, kill_sandbox
from worldenv.sandbox.contract import OUTPUT_KILL_FACTOR, Bind, Limits, Sandbox, ShellResult

__all__ = ["IDLE_S", "MAX_IDLE", "MAX_JOBS", "STAGE_MAX_ENTRIES", "ServerSetup",
           "close_servers", "jobs_served", "run_served", "servers_started"]

MAX_JOBS = 256
IDLE_S = 30.0
MAX_IDLE = 8
STAGE_MAX_ENTRIES = 20_000  # linking beyond this costs more than a sandbox start
START_TIMEOUT_S = 30.0
_TREES = ("w0", "w", "verifier")


class ServerSetup:
    """What a server needs from the runner (``gates.verifier``): the sandbox's Python
    command line, environment and binds, and the paths the scripts see."""

    def __init__(self, argv: list[str], env: dict[str, str], binds: list[Bind],
                 targets: dict[str, str], marker: str) -> None:
        self.argv = argv
        self.env = env
        self.binds = binds
        self.targets = targets  # "w0", "w", "verifier", "answer" -> path in the sandbox
        self.marker = marker


class _Server:
    """One sandbox running the driver in serving mode, with its staging directory."""

    def __init__(self, box: BubblewrapSandbox, limits: Limits, scratch: Path,
                 setup: ServerSetup) -> None:
        self.limits = limits
        self.marker = setup.marker
        self.jobs = 0
        self.idle_since = time.monotonic()
        self.root = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-verifier-", dir=scratch))
        self.proc: subprocess.Popen[bytes] | None = None
        try:
            # "workspace" is only the sandbox's required directory: /workspace is a
            # tmpfs (limits.workspace_mib, which gates.verifier always sets).
            for name in (*_TREES, "workspace"):
                (self.root / name).mkdir(mode=0o755)
            self.answer = self.root / "answer.txt"
            self.answer.write_bytes(b"")
            self.answer.chmod(0o444)
            binds = [*setup.binds, *(Bind(self.root / name, setup.targets[name])
                                     for name in _TREES),
                     Bind(self.answer, setup.targets["answer"])]
            self.proc = box.start(shlex.join(["exec", *setup.argv]), self.root / "workspace",
                                  limits, setup.env, binds)
            self.stderr = bytearray()
            self._ready()
        except BaseException:
            self.close()
            raise

    # --- staging -------------------------------------------------------------------------

    def stage(self, verifier_dir: Path, w0: Path, w: Path, answer: str | None) -> bool:
        """The run's trees and answer where this server's scripts see them; False when a
        tree cannot be linked here (then nothing of it is left staged)."""
        sources = {"w0": w0, "w": w, "verifier": verifier_dir}
        try:
            linked = all(link_tree(path, self.root / name, max_entries=STAGE_MAX_ENTRIES)
                         for name, path in sources.items())
        except WorldDirError:
            linked = False
        if not linked:
            self.unstage()
            return False
        self.answer.chmod(0o644)
        with open(self.answer, "w", encoding="utf-8") as f:
            f.write(answer or "")
        self.answer.chmod(0o444)
        return True

    def unstage(self) -> None:
        """Remove every link of the last run (a deleted instance's files are freed)."""
        for name in _TREES:
            top = self.root / name
            for entry in os.listdir(top):
                remove_tree(top / entry)
            os.chmod(top, 0o755)

    # --- running -------------------------------------------------------------------------

    def run(self, job: dict[str, object], whole: Limits) -> tuple[ShellResult, bool]:
        """The staged job's outcome as a one-run sandbox's result would be, and whether
        this server may take another job."""
        assert self.proc is not None and self.proc.stdin is not None
        self.jobs += 1
        job = {**job, "id": self.jobs}
        started = time.monotonic()
        try:
            self.proc.stdin.write((json.dumps(job) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            pass  # it died: reading says how
        cap = OUTPUT_KILL_FACTOR * whole.max_output_bytes
        out, err, done, how = self._read_job(self.jobs, started + whole.timeout_s, cap)
        seconds = time.monotonic() - started
        stderr = self.marker + "\n" + err.decode("utf-8", errors="replace")
        stdout = out.decode("utf-8", errors="replace")
        if done is not None:
            cpu_s = done.get("cpu_s")
            reusable = (not done.get("problems") and self.jobs < MAX_JOBS
                        and isinstance(cpu_s, (int, float)) and cpu_s < self.limits.cpu_s / 2)
            return ShellResult(0, stdout, stderr, False, False, None, seconds), reusable
        self.close()
        assert self.proc is not None
        code = self.proc.returncode
        status = None if how != "ended" or code is None else (128 - code if code < 0 else code)
        return ShellResult(status, stdout, stderr, False, how == "timeout",
                           {"timeout": "timeout", "flood": "output limit"}.get(how),
                           seconds), False

    def _ready(self) -> None:
        """Wait for the driver's ready line."""
        _out, err, done, how = self._read_job(None, time.monotonic() + START_TIMEOUT_S,
                                              1 << 20)
        if done is None:
            raise SandboxError(f"the verifier server did not start ({how}): "
                               f"{err.decode(errors='replace')[-500:]}")
        if self.marker.encode() not in err:
            raise SandboxError("the verifier server started without its marker")

    def _read_job(self, job: int | None, deadline: float, cap: int
                  ) -> tuple[bytes, bytes, dict[str, object] | None, str]:
        """Read stdout and stderr until the job's last line (its ``done`` record, or the
        ``ready`` line when `job` is None), the deadline, `cap` bytes or the driver's end.
        Records before it, stderr, that last line decoded, and how the reading ended."""
        assert self.proc is not None and self.proc.stdout is not None
        assert self.proc.stderr is not None
        streams = {self.proc.stdout.fileno(): bytearray(), self.proc.stderr.fileno(): self.stderr}
        out_fd = self.proc.stdout.fileno()
        lines = bytearray()
        with selectors.DefaultSelector() as sel:
            for fd in streams:
                os.set_blocking(fd, False)
                sel.register(fd, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return bytes(lines), self._take_stderr(), None, "timeout"
                for key, _ in sel.select(left):
                    fd = int(key.fd)
                    try:
                        chunk = os.read(fd, 65536)
                    except BlockingIOError:
                        continue
                    if not chunk:  # the driver's end: stdout's is the one that counts
                        sel.unregister(fd)
                        if fd != out_fd:
                            continue
                        self._drain_stderr(min(deadline, time.monotonic() + 1.0))
                        return bytes(lines), self._take_stderr(), None, "ended"
                    if fd != out_fd:
                        self.stderr += chunk
                        continue
                    buffer = streams[fd]
                    buffer += chunk
                    while b"\n" in buffer:
                        line, _, rest = bytes(buffer).partition(b"\n")
                        buffer[:] = rest
                        last = _last_line(line, job)
                        if last is not None:
                            return bytes(lines), self._take_stderr(), last, "done"
                        lines += line + b"\n"
                    if len(lines) + len(buffer) > cap or len(self.stderr) > cap:
                        return bytes(lines), self._take_stderr(), None, "flood"

    def _drain_stderr(self, until: float) -> None:
        """What the driver wrote on stderr before it ended, up to its end or `until`."""
        assert self.proc is not None and self.proc.stderr is not None
        fd = self.proc.stderr.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while (left := until - time.monotonic()) > 0 and sel.select(left):
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    return
                self.stderr += chunk

    def _take_stderr(self) -> bytes:
        taken = bytes(self.stderr)
        self.stderr.clear()
        return taken

    def alive(self) -> bool:
        """Running, with its staging directory still there (a removed snapshot cache
        takes it along)."""
        return self.proc is not None and self.proc.poll() is None and self.root.is_dir()

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                kill_sandbox(self.proc)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
            for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()
        with contextlib.suppress(OSError, WorldDirError):
            remove_tree(self.root)


def _last_line(line: bytes, job: int | None) -> dict[str, object] | None:
    """The decoded line if it ends `job` (its done record; the ready line for None)."""
    if not line.startswith(b'{"ready"' if job is None else b'{"done"'):
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    if job is None:
        return record if "ready" in record else None
    return record if record.get("done") == job else None


_Key = tuple[Sandbox, Limits, str]


class _Servers:
    """The idle servers of one process, by sandbox, limits and scratch directory. A
    forked child gets a registry of its own (``_servers``): its parent's servers, whose
    pipes it inherited, are never its to use or to stop."""

    def __init__(self) -> None:
        self._idle: list[tuple[_Key, _Server]] = []
        self._lock = threading.Lock()
        self._owner = os.getpid()
        self.started = 0
        self.served = 0
        atexit.register(self.close)

    def count(self, *, started: int = 0, served: int = 0) -> None:
        with self._lock:
            self.started += started
            self.served += served

    def take(self, key: _Key) -> _Server | None:
        found = None
        with self._lock:
            expired = self._expired()
            at = next((i for i, (k, _) in enumerate(self._idle) if k == key), None)
            if at is not None:
                found = self._idle.pop(at)[1]
        for old in expired:  # stopping one may wait: never with the lock held
            old.close()
        return found

    def give_back(self, key: _Key, server: _Server) -> None:
        kept = server.alive()
        with self._lock:
            if kept:
                server.idle_since = time.monotonic()
                self._idle.append((key, server))
            surplus = [s for _, s in self._idle[:max(0, len(self._idle) - MAX_IDLE)]]
            del self._idle[:len(surplus)]
        for old in surplus if kept else [*surplus, server]:
            old.close()

    def _expired(self) -> list[_Server]:
        """Take out the servers idle for longer than IDLE_S or gone (the lock held)."""
        now = time.monotonic()
        old = [s for _, s in self._idle if now - s.idle_since > IDLE_S or not s.alive()]
        self._idle = [(k, s) for k, s in self._idle if s not in old]
        return old

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        if os.getpid() != self._owner:
            return  # a forked child's copies are its parent's servers
        for _, server in idle:
            server.close()


_REGISTRIES: dict[int, _Servers] = {}
_REGISTRIES_LOCK = threading.Lock()


def _servers() -> _Servers:
    with _REGISTRIES_LOCK:
        found = _REGISTRIES.get(os.getpid())
        if found is None:
            found = _REGISTRIES[os.getpid()] = _Servers()
        return found


def run_served(box: Sandbox, limits: Limits, scratch: Path, setup: ServerSetup,
               verifier_dir: Path, w0: Path, w: Path, answer: str | None,
               job: dict[str, object], whole: Limits) -> ShellResult | None:
    """Run one job (the driver's per-run config, `job`) on a server for `box` and
    `limits` staging under `scratch`: the result a one-run sandbox would give, or None
    when this run is not one a server gives the same verdict for (see the module
    docstring); the caller then runs it in a sandbox of its own."""
    if not isinstance(box, BubblewrapSandbox) or not scratch.is_dir():
        return None
    registry = _servers()
    key: _Key = (box, limits, os.path.realpath(scratch))
    server = registry.take(key)
    if server is None:
        try:
            server = _Server(box, limits, Path(key[2]), setup)
        except (SandboxError, OSError):
            return None
        registry.count(started=1)
    try:
        staged = server.stage(verifier_dir, w0, w, answer)
    except OSError:  # its own directory is not what it was: this server is done
        server.close()
        return None
    if not staged:
        registry.give_back(key, server)
        return None
    registry.count(served=1)
    try:
        result, reusable = server.run(job, whole)
    except BaseException:
        server.close()
        raise
    try:
        server.unstage()
    except (OSError, WorldDirError):
        reusable = False
    if reusable:
        registry.give_back(key, server)
    else:
        server.close()
    return result


def servers_started() -> int:
    """How many servers this process has started (tests and benchmarks read it)."""
    return _servers().started


def jobs_served() -> int:
    """How many runs servers of this process have taken."""
    return _servers().served


def close_servers() -> None:
    """Stop every idle server of this process."""
    _servers().close()
