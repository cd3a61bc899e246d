"""Process supervision shared by the backends: read both pipes until the process ends,
the wall clock runs out or one stream floods, then kill it the backend's way."""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from worldenv.sandbox.contract import OUTPUT_KILL_FACTOR, Limits, ShellResult, classify_limit
from worldenv.sandbox.policy import HOST_ENV

__all__ = ["Outcome", "shell_result", "supervise"]


@dataclass
class Outcome:
    """How one supervised run ended, before ``shell_result`` makes it a ShellResult (the
    Docker backend, which reads a container's streams itself, fills one too)."""

    status: int | None  # shell-style: 128+N for a signal
    stdout: bytes
    stderr: bytes
    stdout_cut: bool
    stderr_cut: bool
    timed_out: bool
    flooded: bool
    cpu_s: float
    seconds: float


def supervise(argv: list[str], limits: Limits, kill: Callable[[subprocess.Popen[bytes]], None],
               *, env: Mapping[str, str] | None = None, cwd: str | None = None,
               ended: Callable[[subprocess.Popen[bytes]], None] | None = None) -> Outcome:
    """Start argv in its own session (in `cwd`, else here), read both pipes until it ends
    or a limit is hit. `ended` is called once the process itself has ended: a backend with
    no pid namespace ends what it left there, whose pipes would otherwise stay open."""
    started = time.monotonic()
    deadline = started + limits.timeout_s
    keep = limits.max_output_bytes
    hard_cap = OUTPUT_KILL_FACTOR * keep
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
                            cwd=cwd,
                            env=dict(env if env is not None else HOST_ENV))
    assert proc.stdout is not None and proc.stderr is not None
    streams = {proc.stdout.fileno(): 0, proc.stderr.fileno(): 1}
    kept = (bytearray(), bytearray())
    seen = [0, 0]
    timed_out = flooded = False
    wait_status: int | None = None
    cpu = 0.0
    sel = selectors.DefaultSelector()
    pidfd: int | None = None
    try:
        pidfd = os.pidfd_open(proc.pid)
        sel.register(pidfd, selectors.EVENT_READ)
    except (AttributeError, OSError):
        pidfd = None  # old kernel: poll with WNOHANG below

    def reap(flags: int) -> None:
        nonlocal wait_status, cpu
        pid, status, usage = os.wait4(proc.pid, flags)
        if pid == proc.pid:
            wait_status = status
            cpu = usage.ru_utime + usage.ru_stime
            if ended is not None:
                ended(proc)

    try:
        for fd in streams:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        while streams or wait_status is None:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            events = sel.select(left if pidfd is not None else min(left, 0.05))
            if pidfd is None and wait_status is None:
                reap(os.WNOHANG)
            for key, _ in events:
                fd = int(key.fd)
                if fd == pidfd:
                    sel.unregister(fd)
                    reap(0)
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    sel.unregister(fd)
                    del streams[fd]
                    continue
                which = streams[fd]
                seen[which] += len(chunk)
                room = keep - len(kept[which])
                if room > 0:
                    kept[which].extend(chunk[:room])
                if seen[which] > hard_cap:
                    flooded = True
            if flooded:
                break
        if wait_status is None:
            if timed_out or flooded:
                kill(proc)
            reap(0)
    finally:
        if wait_status is None:  # an exception above: never leave the sandbox running
            kill(proc)
            reap(0)
        sel.close()
        if pidfd is not None:
            os.close(pidfd)
        proc.stdout.close()
        proc.stderr.close()
    assert wait_status is not None
    code = os.waitstatus_to_exitcode(wait_status)
    proc.returncode = code
    status = None if (timed_out or flooded) else (128 - code if code < 0 else code)
    return Outcome(status=status, stdout=bytes(kept[0]), stderr=bytes(kept[1]),
                    stdout_cut=seen[0] > keep, stderr_cut=seen[1] > keep,
                    timed_out=timed_out, flooded=flooded, cpu_s=cpu,
                    seconds=time.monotonic() - started)


def _text(data: bytes, cut: bool, limit: int) -> str:
    text = data.decode("utf-8", errors="replace")
    return text + f"\n[... output truncated at {limit} bytes ...]" if cut else text


def shell_result(out: Outcome, limits: Limits) -> ShellResult:
    stderr = _text(out.stderr, out.stderr_cut, limits.max_output_bytes)
    return ShellResult(
        exit_code=out.status,
        stdout=_text(out.stdout, out.stdout_cut, limits.max_output_bytes),
        stderr=stderr,
        truncated=out.stdout_cut or out.stderr_cut,
        timed_out=out.timed_out,
        killed_reason=classify_limit(out.status, stderr, limits, cpu_s=out.cpu_s,
                                     timed_out=out.timed_out, flooded=out.flooded),
        seconds=out.seconds,
    )
