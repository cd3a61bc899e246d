"""The container sandbox (``WORLDCTL_SANDBOX=container``): refused on the host, in the
host's pid namespace; and inside a real container (the project image, this checkout
mounted on its PYTHONPATH, as root as a Harbor task runs) its cases run by
``tests/support/container_probe.py``: the sandbox user, the limits, what a command leaves
behind, binds, and a verifier run through it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import docker_images
from worldenv.errors import SandboxError
from worldenv.sandbox.bubblewrap import find_sandbox_tools
from worldenv.sandbox.choice import default_sandbox
from worldenv.sandbox.container import ContainerSandbox, inside_container

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def chosen(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """The environment with WORLDCTL_SANDBOX as a test sets it, and default_sandbox's
    cached choice forgotten before and after."""
    default_sandbox.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    default_sandbox.cache_clear()


def test_the_host_is_not_a_container() -> None:
    # Kernel threads are visible only in the host's pid namespace.
    on_host = Path("/proc/2/comm").read_text().strip() == "kthreadd"
    assert inside_container() is not on_host


def test_the_container_backend_is_refused_on_the_host(chosen: pytest.MonkeyPatch) -> None:
    if inside_container():
        pytest.skip("these tests run inside a container here: nothing to refuse")
    with pytest.raises(SandboxError, match="WORLDCTL_SANDBOX=container is for a container"):
        ContainerSandbox()
    chosen.setenv("WORLDCTL_SANDBOX", "container")
    with pytest.raises(SandboxError, match="WORLDCTL_SANDBOX=container is for a container"):
        default_sandbox()


def test_the_setting_names_a_known_backend_or_nothing(chosen: pytest.MonkeyPatch) -> None:
    chosen.setenv("WORLDCTL_SANDBOX", "chroot")
    with pytest.raises(SandboxError, match="WORLDCTL_SANDBOX='chroot' names no sandbox"):
        default_sandbox()
    chosen.setenv("WORLDCTL_SANDBOX", "")
    assert default_sandbox().name != "container"  # never chosen by the probe


def test_bubblewrap_users_refuse_under_the_container_backend(
        chosen: pytest.MonkeyPatch) -> None:
    """App workers and the browser make their bubblewrap sandboxes through this one
    function: under the container backend they stop with the reason, naming the setting."""
    chosen.setenv("WORLDCTL_SANDBOX", "container")
    with pytest.raises(SandboxError, match=r"WORLDCTL_SANDBOX=container: .*browser"):
        find_sandbox_tools()


@pytest.fixture(scope="module")
def probe() -> dict[str, Any]:
    """The probe's cases, run once in a fresh container as root (~5 s)."""
    image = docker_images.project_image()
    done = subprocess.run(
        ["docker", "run", "--rm", "-u", "root", "-e", "WORLDCTL_SANDBOX=container",
         "-e", "PYTHONDONTWRITEBYTECODE=1", "-e", "PYTHONPATH=/src",
         "-v", f"{ROOT}:/src:ro", "-w", "/src", "--entrypoint", "python", image,
         "-m", "tests.support.container_probe"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    found: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return found



@pytest.mark.slow
@pytest.mark.docker_image("gateway")
def test_a_command_runs_as_the_sandbox_user_in_its_workspace(probe: dict[str, Any]) -> None:
    assert probe["backend"] == "ContainerSandbox"
    code, stdout, written = probe["plain"]
    lines = stdout.splitlines()
    assert code == 0 and written == "made\n"
    assert lines[0] == str(probe["sandbox_uid"]) != "0"
    assert lines[1:3] == ["/workspace", "/workspace"]  # cwd and HOME
    env = {line.split("=", 1)[0] for line in lines[3:]}
    assert env <= {"HOME", "LANG", "PATH", "PWD", "SHLVL", "TMPDIR", "TZ", "_"}
    assert "WORLDCTL_SANDBOX" not in env  # scrubbed: nothing of the caller's environment


@pytest.mark.slow
@pytest.mark.docker_image("gateway")
def test_the_limits_hold(probe: dict[str, Any]) -> None:
    assert probe["timeout"] == "timeout"
    assert probe["flood"] == ["output limit", True]
    assert probe["memory"] == "memory"
    assert probe["file_size"] == "file size"
    # processes, CPU s, address space KiB, file size blocks (1 KiB), open files, core:
    # the process limit left as the container has it: Linux would count one across every
    # container of the machine.
    assert probe["rlimits"] == [probe["own_nproc"], "7", str(300 << 10), str(3 << 10),
                                "256", "0"]


@pytest.mark.slow
@pytest.mark.docker_image("gateway")
def test_what_a_command_leaves_is_ended_with_it(probe: dict[str, Any]) -> None:
    code, stdout, seconds = probe["left"]
    # Two sleeps of 300 s (one in a session of its own) held its pipes: the run ends
    # with its shell all the same, and nothing of the sandbox user is left afterwards.
    assert code == 0 and stdout == "started\n" and seconds < 5
    assert probe["sandbox_user_processes"] == []


@pytest.mark.slow
@pytest.mark.docker_image("gateway")
def test_binds_are_links_for_one_run(probe: dict[str, Any]) -> None:
    text, code, answer_left, workspace_left = probe["bind"]
    # A read-only file in a folder closed to the sandbox user is read through a copy.
    assert text == "the answer" and code != 0
    assert not answer_left and not workspace_left
    assert "/taken exists in this container" in probe["taken"]
    assert "which the sandbox user cannot enter" in probe["closed"]


@pytest.mark.slow
@pytest.mark.docker_image("gateway")
def test_a_verifier_runs_through_it(probe: dict[str, Any]) -> None:
    assert probe["verdict"] == [True, [], ["changed", "answered"]]
