"""The project's Docker images and compose file (docker/), on a real engine: the gateway
image builds a store and serves it (health, an instance of the demo world, its shell under
bubblewrap inside the container); the compose file is valid for Compose; the locks cover
what the project requires; the RL worker image imports verl and the project's RL code
(slow: a multi-GB image).

Without an engine the engine's tests skip; under CI=true they fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import tomllib
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import docker_images

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy"
TOKEN = "docker-smoke-token"
# What the gateway's shell needs of the engine (deploy/compose.yaml says why).
UNCONFINED = ["seccomp=unconfined", "apparmor=unconfined", "systempaths=unconfined"]


def _name(requirement: str) -> str:
    found = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert found, requirement
    return re.sub(r"[-_.]+", "-", found.group(0)).lower()


def _pins(target: str) -> dict[str, str]:
    lines = (DOCKER / f"{target}.lock").read_text().splitlines()
    return dict(line.split("==", 1) for line in lines if line and not line.startswith("#"))


@pytest.mark.parametrize(("target", "extra"), [("gateway", "envs"), ("worker", "rl")])
def test_each_lock_pins_what_the_project_requires(target: str, extra: str) -> None:
    """A lock that misses a requirement fails the image build (it installs --no-index):
    caught here first, with the command that rewrites it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_name(r) for r in [*project["dependencies"],
                                 *project["optional-dependencies"][extra]]}
    pins = {_name(name) for name in _pins(target)}
    missing = sorted(wanted - pins - {"agent-worlds"})
    assert not missing, (f"docker/{target}.lock misses {missing}: "
                         f"python3 deploy/build.py --lock {target}")


def test_the_compose_file_is_valid() -> None:
    compose = shutil.which("docker-compose")
    if compose is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI=true but docker-compose is missing (apt-get install docker-compose)")
        pytest.skip("no docker-compose (apt-get install docker-compose)")
    env = {**os.environ, "WORLDCTL_IMAGE": "agent-worlds:x", "WORLDCTL_TOKEN": TOKEN}
    done = subprocess.run([compose, "-f", str(DOCKER / "compose.yaml"), "config"],
                          capture_output=True, text=True, env=env, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "seccomp=unconfined" in done.stdout
    bare = {k: v for k, v in env.items() if k != "WORLDCTL_IMAGE"}
    refused = subprocess.run([compose, "-f", str(DOCKER / "compose.yaml"), "config"],
                             capture_output=True, text=True, env=bare, check=False, timeout=60)
    assert refused.returncode != 0
    assert "python3 deploy/build.py gateway" in refused.stderr


# --- the gateway image ---------------------------------------------------------------


def _client() -> Any:
    import docker

    return docker.from_env(timeout=120)


def _request(url: str, body: dict[str, Any] | None = None, *, method: str | None = None
             ) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={
        "Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer


def _docker(*args: str, timeout: float = 120) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, check=False,
                          timeout=timeout)
    assert done.returncode == 0, f"docker {' '.join(args)}:\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def gateway() -> Iterator[str]:
    """The gateway image serving the demo world, which it imported itself into a volume of
    its own, started as docs/peers/docker.md says (the docker CLI: only it turns
    ``systempaths=unconfined`` into what the engine takes): its base URL."""
    image = docker_images.project_image()
    volume = f"agent-worlds-test-{uuid.uuid4().hex[:12]}"
    container = None
    _docker("volume", "create", volume)
    try:
        imported = _docker("run", "--rm", "--network", "none", "-v", f"{volume}:/store",
                           "--entrypoint", "worldctl", image, "import",
                           "/opt/agent-worlds/demo/lars.jsonl")
        assert "imported" in imported
        container = _docker("run", "-d", "-v", f"{volume}:/store", "-p", "127.0.0.1::8765",
                            "-e", f"WORLDCTL_TOKEN={TOKEN}",
                            *[a for opt in UNCONFINED for a in ("--security-opt", opt)],
                            image).strip()
        port = _docker("port", container, "8765/tcp").splitlines()[0].rsplit(":", 1)[1]
        give_up = time.monotonic() + 60
        while True:
            try:
                _request(f"http://127.0.0.1:{port}/healthz")
                break
            except (urllib.error.URLError, ConnectionError):
                pass
            if time.monotonic() > give_up:
                pytest.fail("the gateway did not answer:\n" + subprocess.run(
                    ["docker", "logs", container], capture_output=True, text=True,
                    check=False).stderr[-3000:])
            time.sleep(0.3)
        yield f"http://127.0.0.1:{port}"
    finally:
        if container is not None:
            subprocess.run(["docker", "rm", "-f", container], capture_output=True, check=False)
        subprocess.run(["docker", "volume", "rm", "-f", volume], capture_output=True,
                       check=False)


@pytest.mark.docker_image("gateway")
def test_the_gateway_serves_the_store_it_imported(gateway: str) -> None:
    assert _request(f"{gateway}/healthz") == {"ok": True, "instances": 0, "tasks": 0}
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{gateway}/healthz", timeout=10)
    assert refused.value.code == 401


@pytest.mark.docker_image("gateway")
def test_an_instance_of_the_gateway_runs_its_shell_under_bubblewrap(gateway: str) -> None:
    made = _request(f"{gateway}/instances", {"world": "lars@7", "shell": True})
    iid = made["id"]
    try:
        done = _request(f"{gateway}/instances/{iid}/shell",
                        {"command": "id -u; ls /workspace | head -3; cat /proc/1/cmdline"})
        assert done["exit_code"] == 0, done
        assert done["stdout"].split("\n", 1)[0] != "0"
    finally:
        _request(f"{gateway}/instances/{iid}", method="DELETE")


# --- the RL worker image --------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.docker_image("worker")
def test_the_worker_image_holds_verl_ray_and_the_rl_code() -> None:
    client = _client()
    try:
        out = client.containers.run(
            docker_images.worker_image(), ["python", "-c", (
                "import importlib.metadata as m, ray, verl, rl.loss, rl.verl_loop\n"
                "print(sorted(e.name for e in m.entry_points(group='verl.plugins')))\n")],
            remove=True, network_mode="none")
    finally:
        client.close()
    assert out.decode().strip() == "['agent_worlds']"
