"""The venv that holds the CPU torch and ``pip install '.[rl]'`` only, built in the
background from the start of the session (``tests/conftest.py`` starts it once the test
that needs it is selected), so its ~3 minutes of pip overlap the tests before it instead of
adding to the run. It runs at the lowest CPU priority: the tests that measure a bound in
seconds keep the cores they would have had.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEST_NAME = "test_the_rl_extra_alone_imports_the_agent_loop"
BUILD_TIMEOUT_S = 1800


@dataclass
class Build:
    folder: Path
    proc: subprocess.Popen[bytes]

    @property
    def venv(self) -> Path:
        return self.folder / "venv"

    @property
    def log(self) -> Path:
        return self.folder / "pip.log"

    def wait(self) -> int:
        return self.proc.wait(timeout=BUILD_TIMEOUT_S)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


_BUILD: Build | None = None


def environment() -> dict[str, str]:
    """This environment without what would point the new venv's Python elsewhere."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def start() -> Build:
    """Start building the venv (once per session): a fresh venv, the CPU torch, then the
    project with the ``rl`` extra. --no-compile: byte-compiling ~180 packages is a third of
    the install; the test's import compiles what it loads."""
    global _BUILD
    if _BUILD is None:
        folder = Path(tempfile.mkdtemp(prefix="agentworlds-rl-extra-"))
        venv = folder / "venv"
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile",
               "--disable-pip-version-check"]
        steps = [[sys.executable, "-m", "venv", str(venv)], [*pip, "torch==2.13.0"],
                 [*pip, f"{ROOT}[rl]", "torch==2.13.0"]]
        script = " && ".join(shlex.join(step) for step in steps)
        with open(folder / "pip.log", "wb") as log:
            proc = subprocess.Popen(["nice", "-n", "19", "bash", "-c", script], cwd=folder,
                                    env=environment(), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        _BUILD = Build(folder, proc)
    return _BUILD


def stop() -> None:
    global _BUILD
    if _BUILD is not None:
        _BUILD.stop()
        _BUILD = None
