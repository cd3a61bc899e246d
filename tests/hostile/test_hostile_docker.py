"""Verifiers under the Docker sandbox on a real engine: the verifier's hostile corpus
(``HOSTILE`` of tests/gates/test_verifier.py: hangs, spins, floods, hogs, forged and
malformed reports, writes to the worlds and the verifier, the network) gives the same
errors in a container as under bubblewrap, changes nothing, and leaves nothing running;
an honest checklist gives the same verdict on both backends.

A Docker sandbox runs every verifier run in a container of its own (verifier servers are
bubblewrap's alone), so no job can outlive its run to disturb another. Without an engine
the tests skip; under CI=true they fail.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gates.contract import Verdict
from gates.verifier import run_verifier, verifier_digests
from replay.engine import Worlds
from tests.gates.test_verifier import (
    ANSWER,
    CHECKLIST,
    FAST,
    HOSTILE,
    _agent_was_here,
    _hash,
    _open_to_all,
    _verifier,
)
from tests.support import docker_images
from tests.support.sandbox_uids import free_uid, uid_processes
from worldenv.sandbox.bubblewrap import BubblewrapSandbox
from worldenv.sandbox.docker import LABEL, DockerSandbox

pytestmark = pytest.mark.docker_image("base")

UID = free_uid(68_000 + 2 * (os.getpid() % 1_000))


@pytest.fixture(scope="module")
def box() -> DockerSandbox:
    return DockerSandbox(docker_images.base_image(), uid=UID, gid=UID)


@pytest.fixture(scope="module")
def open_worlds(demo_worlds: Worlds, tmp_path_factory: pytest.TempPathFactory
                ) -> tuple[Path, Path]:
    """W0 and W (the agent's changes made) that anyone may write: only the sandbox's
    read-only binds protect them."""
    base = tmp_path_factory.mktemp("open")
    pair = base / "w0", base / "w"
    for dest in pair:
        demo_worlds.checkout("lars@7", dest)
    _agent_was_here(pair[1])
    for dest in pair:
        _open_to_all(dest)
    return pair


@pytest.fixture(scope="module")
def listener() -> Iterator[socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.setblocking(False)
        yield server


@pytest.fixture(scope="module")
def hostile(box: DockerSandbox, open_worlds: tuple[Path, Path], listener: socket.socket,
            tmp_path_factory: pytest.TempPathFactory
            ) -> tuple[Verdict, dict[str, str], dict[str, str]]:
    """The whole corpus as one verifier folder, run once (four at a time) in Docker."""
    w0, w = open_worlds
    port = listener.getsockname()[1]
    verifier = _verifier(tmp_path_factory.mktemp("hostile") / "verifier", {
        name: source.replace("PORT", str(port)) for name, (source, _) in HOSTILE.items()})
    _open_to_all(verifier)
    before = {"w0": _hash(w0), "w": _hash(w), **verifier_digests(verifier)}
    verdict = run_verifier(verifier, w0, w, ANSWER, limits=FAST, sandbox=box)
    after = {"w0": _hash(w0), "w": _hash(w), **verifier_digests(verifier)}
    return verdict, before, after


def test_the_hostile_corpus_gives_an_error_verdict_changes_and_leaves_nothing(
        box: DockerSandbox, hostile: tuple[Verdict, dict[str, str], dict[str, str]],
        listener: socket.socket) -> None:
    verdict, before, after = hostile
    assert verdict.is_error and not verdict.passed
    assert len(verdict.errors) == len(HOSTILE) == len(verdict.scripts)
    assert verdict.checks == []
    assert after == before  # both worlds and every verifier file
    with pytest.raises(BlockingIOError):
        listener.accept()
    give_up = time.monotonic() + 3.0
    while uid_processes(UID) and time.monotonic() < give_up:
        time.sleep(0.05)
    assert uid_processes(UID) == []
    assert box.api().containers(all=True, filters={"label": LABEL}) == []


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_each_hostile_script_is_an_error_that_says_why(
        hostile: tuple[Verdict, dict[str, str], dict[str, str]], name: str) -> None:
    verdict, _, _ = hostile
    result = next(r for r in verdict.scripts if r.script == name)
    assert result.error is not None
    assert result.error.startswith(f"verifier script {name}: ")
    assert result.checks == []
    assert HOSTILE[name][1] in result.error + "\n" + result.stderr_tail, (
        result.error, result.stderr_tail)


def test_an_honest_checklist_gets_the_same_verdict_as_under_bubblewrap(
        box: DockerSandbox, open_worlds: tuple[Path, Path], tmp_path: Path) -> None:
    w0, w = open_worlds
    verifier = _verifier(tmp_path / "verifier", CHECKLIST)
    _open_to_all(verifier)
    docker = run_verifier(verifier, w0, w, ANSWER, sandbox=box)
    bubblewrap = run_verifier(verifier, w0, w, ANSWER, sandbox=BubblewrapSandbox())
    assert docker.errors == [] and docker.passed and docker.n == 6
    assert docker.checks == bubblewrap.checks
