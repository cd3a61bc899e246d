"""The project's Docker images for the tests, built once per machine from Debian's packages
(no image registry is reachable): ``base_image()`` (deploy/build-base.sh: a debootstrap
minbase of bookworm, what the Docker sandbox runs commands in), ``project_image()`` (the
gateway image, deploy/build.py's ``gateway`` target, the FROM of exported tasks'
environments) and ``worker_image()`` (the RL worker node). Each is tagged by a hash of its
inputs, so an image already built is found at once; the base is also kept as a file under
~/.cache/agent-worlds/docker (deploy/build-base.sh), which a fresh engine loads.

The worker image is built only with WORLDCTL_TEST_WORKER_IMAGE=1 (its test skips
otherwise: torch, Ray and verl make it several GB). Builds start in the background from
the moment a test marked
``@pytest.mark.docker_image("base" | "gateway" | "worker")`` is collected
(``tests/conftest.py``), so they overlap the tests before it; the build scripts' own file
locks keep two sessions on one machine from building the same image at once. Without an engine the
tests skip, and fail under CI=true, where the engine must run (.ci/run starts it).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy"
CACHE = Path(os.environ.get("WORLDCTL_DOCKER_CACHE",
                            Path.home() / ".cache" / "agent-worlds" / "docker"))
BUILD_TIMEOUT_S = 1800
KINDS = ("base", "gateway", "worker")
# Images built only when asked for: the worker's (torch, Ray, verl) is several GB.
OPT_IN = {"worker": "WORLDCTL_TEST_WORKER_IMAGE"}


def engine_answers() -> bool:
    """Whether a Docker engine answers here (the docker SDK's ping, as the sandbox does)."""
    try:
        import docker
        client = docker.from_env(timeout=10)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # the SDK raises its own, requests' and OSError's kinds
        return False


def require_engine() -> None:
    """Skip the test without an engine; fail it under CI=true."""
    if engine_answers():
        return
    message = "no Docker engine answers (start dockerd; apt-get install docker.io)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but {message}: the Docker tests must run in CI")
    pytest.skip(message)


def _argv(kind: str) -> list[str]:
    if kind == "base":
        return ["bash", str(DOCKER / "build-base.sh")]
    return [sys.executable, str(DOCKER / "build.py"), kind]


@dataclass
class Build:
    kind: str
    proc: subprocess.Popen[bytes]
    log: Path

    def wait(self) -> str:
        code = self.proc.wait(timeout=BUILD_TIMEOUT_S)
        text = self.log.read_text(errors="replace").strip()
        err = Path(f"{self.log}.err")
        if code != 0 or not text:
            why = err.read_text(errors="replace")[-4000:] if err.is_file() else ""
            pytest.fail(f"the {self.kind} image did not build (exit {code}):\n{why}")
        self.log.unlink(missing_ok=True)
        err.unlink(missing_ok=True)
        return text.splitlines()[-1]


_BUILDS: dict[str, Build] = {}
_TAGS: dict[str, str] = {}
_LOCK = threading.Lock()


def start(kind: str) -> Build | None:
    """Start building (or finding) the image of `kind` once per session; None without an
    engine."""
    with _LOCK:
        if kind in _BUILDS:
            return _BUILDS[kind]
        if kind in OPT_IN and os.environ.get(OPT_IN[kind]) != "1":
            return None
        if not engine_answers():
            return None
        CACHE.mkdir(parents=True, exist_ok=True)
        log = CACHE / f"build-{kind}-{os.getpid()}.log"
        # The tag is the last line of stdout; the build's output goes to a file apart.
        script = f"exec {shlex.join(_argv(kind))} 2>{shlex.quote(f'{log}.err')}"
        with open(log, "wb") as out:
            proc = subprocess.Popen(["nice", "-n", "10", "bash", "-c", script], cwd=ROOT,
                                    stdout=out, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        _BUILDS[kind] = Build(kind, proc, log)
        return _BUILDS[kind]


def image(kind: str) -> str:
    """The tag of the image of `kind`, built first if missing (skips without an engine,
    fails under CI=true)."""
    if kind in _TAGS:
        return _TAGS[kind]
    if kind in OPT_IN and os.environ.get(OPT_IN[kind]) != "1":
        pytest.skip(f"the {kind} image is built only with {OPT_IN[kind]}=1 (several GB)")
    require_engine()
    build = start(kind)
    assert build is not None
    tag = _TAGS[kind] = build.wait()
    return tag


def base_image() -> str:
    """``agent-worlds-base:<key>``: Debian bookworm minbase with Python 3.11 and sqlite3."""
    return image("base")


def project_image() -> str:
    """``agent-worlds:<key>``: the project with its envs extra in /opt/agent-worlds (on
    PATH), ``worldctl serve`` by default, WORLDCTL_STORE=/store, user ``worlds``."""
    return image("gateway")


def worker_image() -> str:
    """``agent-worlds-worker:<key>``: the project with its rl extra (verl, Ray, torch)."""
    return image("worker")


def stop() -> None:
    """Stop builds still running at the end of the session (a build interrupted leaves no
    tag behind, so the next session starts it again)."""
    with _LOCK:
        for build in _BUILDS.values():
            if build.proc.poll() is None:
                os.killpg(build.proc.pid, signal.SIGKILL)
                build.proc.wait()
        _BUILDS.clear()
