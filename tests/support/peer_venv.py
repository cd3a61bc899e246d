"""Venvs of their own for the peers tested with their own code (OpenEnv's client, Harbor,
AWM's package): each is built once per machine in the background from the moment a test
marked ``@pytest.mark.peer("<name>")`` is collected (``tests/conftest.py``), so its pip run
overlaps the tests before it, and is kept under a folder keyed by its Python and its
requirements, so a second run on the same machine starts at once.

A test asks for one with ``peer_venv.python("harbor")``: it waits for the build and fails
with the tail of pip's log if the build failed. Harbor and AWM's package need Python 3.12
(``python3.12`` is on these machines, from pyenv); ``find_python`` finds it where a pyenv
shim on PATH would refuse to run it.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

BUILD_TIMEOUT_S = 1800
CACHE = Path(os.environ.get("WORLDCTL_TEST_PEER_CACHE",
                            Path.home() / ".cache" / "agent-worlds" / "peer-venvs"))


@dataclass(frozen=True)
class Peer:
    python: str                    # "3.11" (the tests' own) or "3.12"
    requirements: tuple[str, ...]  # pip arguments, in order (pins, --no-deps lines apart)
    no_deps: tuple[str, ...] = ()  # installed after, with --no-deps


PEERS: dict[str, Peer] = {
    # The client half only: openenv-core's own dependencies pull gradio and a docs stack.
    # fastapi too: openenv.core's __init__ imports its server module, which imports it.
    "openenv": Peer("3.11", ("websockets>=15.0.1", "pydantic>=2", "requests>=2.25",
                             "httpx>=0.28.1", "fastmcp>=3.0.0", "pyyaml>=6",
                             "fastapi>=0.104"),
                    ("openenv-core==0.3.0",)),
    "harbor": Peer("3.12", ("harbor==0.25.0",)),
    # mcp 2 renamed what mcp-agent (AWM's agent and its server check) imports.
    "awm": Peer("3.12", ("agent-world-model==0.1.0", "mcp>=1.20,<2")),
}


def find_python(version: str) -> str | None:
    """A Python interpreter of this ``major.minor`` that runs, or None."""
    if version == f"{sys.version_info.major}.{sys.version_info.minor}":
        return sys.executable
    candidates = sorted(glob.glob(str(Path.home() / ".pyenv" / "versions" / f"{version}.*"
                                      / "bin" / f"python{version}")), reverse=True)
    found = shutil.which(f"python{version}")
    candidates += [found] if found else []
    for candidate in candidates:
        done = subprocess.run([candidate, "-c", "import venv"], capture_output=True,
                              check=False, env=environment())
        if done.returncode == 0:
            return candidate
    return None


def environment() -> dict[str, str]:
    """This environment without what would point another Python at this venv."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}


@dataclass
class Build:
    name: str
    folder: Path
    proc: subprocess.Popen[bytes] | None  # None: found ready from an earlier run

    @property
    def python(self) -> Path:
        return self.folder / "venv" / "bin" / "python"

    @property
    def log(self) -> Path:
        return self.folder / "pip.log"

    def wait(self) -> int:
        if self.proc is None:
            return 0
        code = self.proc.wait(timeout=BUILD_TIMEOUT_S)
        if code == 0:
            (self.folder / "ready").write_text("ok\n")
        return code


_BUILDS: dict[str, Build] = {}
_LOCK = threading.Lock()


def _key(peer: Peer, python: str) -> str:
    text = "\n".join([python, *peer.requirements, "--no-deps", *peer.no_deps])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def start(name: str) -> Build | None:
    """Start building the named peer's venv (once per session); None when no Python of
    the version it needs is installed."""
    with _LOCK:
        if name in _BUILDS:
            return _BUILDS[name]
        peer = PEERS[name]
        python = find_python(peer.python)
        if python is None:
            return None
        folder = CACHE / f"{name}-{_key(peer, python)}"
        if (folder / "ready").is_file():
            _BUILDS[name] = Build(name, folder, None)
            return _BUILDS[name]
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        venv = folder / "venv"
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile",
               "--disable-pip-version-check"]
        steps = [[python, "-m", "venv", str(venv)], [*pip, *peer.requirements]]
        if peer.no_deps:
            steps.append([*pip, "--no-deps", *peer.no_deps])
        script = " && ".join(shlex.join(step) for step in steps)
        with open(folder / "pip.log", "wb") as log:
            proc = subprocess.Popen(["nice", "-n", "19", "bash", "-c", script], cwd=folder,
                                    env=environment(), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        _BUILDS[name] = Build(name, folder, proc)
        return _BUILDS[name]


def python(name: str) -> Path:
    """The named peer's venv Python, once built; skips where its Python is not installed
    (fails under CI=true) and fails with pip's log when the build did."""
    build = start(name)
    if build is None:
        message = f"no python{PEERS[name].python} on this machine for the {name} peer"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    code = build.wait()
    if code != 0:
        tail = build.log.read_text(errors="replace")[-4000:]
        pytest.fail(f"the {name} peer's venv did not build (pip exit {code}):\n{tail}")
    return build.python


def stop() -> None:
    """Stop builds still running at the end of the session (a half-built venv is removed
    and rebuilt next time)."""
    with _LOCK:
        for build in _BUILDS.values():
            if build.proc is not None and build.proc.poll() is None:
                build.proc.kill()
                build.proc.wait()
                shutil.rmtree(build.folder, ignore_errors=True)
        _BUILDS.clear()
