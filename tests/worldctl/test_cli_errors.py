"""The command line's refusals: every one is a single `error: ...` line on stderr, exit 2,
with the library's or the user's text printed literally.

The real `worldctl` runs in a subprocess where the process matters (a missing driver, a
traceback that must not appear); elsewhere through click's CliRunner.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from worldctl.main import cli

ROOT = Path(__file__).resolve().parents[2]
WORLDCTL = Path(sys.executable).parent / "worldctl"
DEMO = ROOT / "packs" / "demo" / "world" / "lars.jsonl"
TASK = ROOT / "packs" / "demo" / "tasks" / "mats-work-order"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="worldctl")


def assert_refused(stderr: str, code: int, *words: str) -> str:
    """Exit 2 and exactly one line, `error: ...`, holding every word; returns the line."""
    assert code == 2, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def run(*args: str, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(WORLDCTL), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})}, cwd=cwd)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    location = str(tmp_path_factory.mktemp("errors") / "store")
    result = invoke("--store", location, "import", str(DEMO))
    assert result.exit_code == 0, result.output
    return location


def without(tmp_path: Path, *names: str) -> dict[str, str]:
    """An environment in which the modules `names` are missing, as on an installation
    without the extras that bring them."""
    for name in names:
        package = tmp_path / "blocked" / name
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(
            f'raise ModuleNotFoundError("No module named {name!r} (blocked by the test)", '
            f"name={name!r})\n")
    return {"PYTHONPATH": str(tmp_path / "blocked")}


# --- text is printed literally -----------------------------------------------------------


def test_brackets_in_a_refusal_are_printed_as_they_are(tmp_path: Path) -> None:
    where = tmp_path / "x[abc]" / "[bold]store"
    result = invoke("--store", str(where), "personas")
    assert_refused(result.stderr, result.exit_code, f"no store at {where} ")


def test_the_install_hint_of_the_llm_extra_keeps_its_brackets(store: str,
                                                              tmp_path: Path) -> None:
    done = run("--store", store, "rollout", str(TASK), "--agent", "llm:some-model",
               env=without(tmp_path, "litellm"))
    assert_refused(done.stderr, done.returncode, "litellm", "pip install 'agent-worlds[llm]'")


# --- the store cannot be opened ----------------------------------------------------------


def test_an_unreachable_postgresql_store_is_one_line_without_its_password() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = run("--store", f"postgresql://aw:s3cr3t-pw@127.0.0.1:{port}/worlds", "personas")
    line = assert_refused(done.stderr, done.returncode,
                          f"postgresql://aw:***@127.0.0.1:{port}/worlds")
    assert "s3cr3t-pw" not in done.stderr + done.stdout
    assert "refused" in line.lower()


def test_a_missing_postgresql_database_is_one_line(pg_url: str) -> None:
    missing = pg_url + "_nowhere"
    done = run("--store", missing, "personas")
    assert_refused(done.stderr, done.returncode, missing.rsplit("/", 1)[1], "does not exist")


def test_a_missing_psycopg_is_one_line_naming_the_extra(tmp_path: Path) -> None:
    done = run("--store", "postgresql://aw:pw@127.0.0.1/worlds", "personas",
               env=without(tmp_path, "psycopg"))
    line = assert_refused(done.stderr, done.returncode, "psycopg",
                          "pip install 'agent-worlds[postgres]'")
    assert "aw:***@127.0.0.1" in line and ":pw@" not in line


# --- usage errors ------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "words"), [
    (["import"], ["Missing argument 'FILES...'", "worldctl import --help"]),
    (["nosuch"], ["No such command 'nosuch'", "worldctl --help"]),
    (["personas", "--colour"], ["--colour", "worldctl personas --help"]),
    (["diff", "--max-rows", "many", "a", "b"], ["'many' is not a valid integer"]),
    (["import", "/no/such/file.jsonl"], ["/no/such/file.jsonl", "does not exist"]),
    (["episode", "show"], ["Missing argument 'EPISODE_ID'", "worldctl episode show --help"]),
    (["task", "check", "/no/such/task"], ["/no/such/task", "does not exist"]),
])
def test_usage_errors_are_one_line(args: list[str], words: list[str]) -> None:
    result = invoke(*args)
    assert_refused(result.stderr, result.exit_code, *words)


def test_a_usage_error_of_the_real_binary_prints_no_usage_block() -> None:
    done = run("verify", "--bogus")
    assert_refused(done.stderr, done.returncode, "--bogus")
    assert "Usage:" not in done.stderr and done.stdout == ""


def test_worldctl_alone_prints_the_help() -> None:
    result = invoke()
    assert result.exit_code == 0 and "Commands:" in result.stdout


# --- refusals of the commands ------------------------------------------------------------


def test_verify_of_an_unknown_persona_is_refused(store: str) -> None:
    result = invoke("--store", store, "verify", "nobody")
    assert_refused(result.stderr, result.exit_code, "'nobody'")
    assert result.stdout == ""
    result = invoke("--store", store, "verify", "lars", "nobody")
    assert_refused(result.stderr, result.exit_code, "'nobody'", "nothing was verified")


def test_unknown_refs_and_episodes_are_refused(store: str) -> None:
    for args, word in ((["checkout", "lars@99", "out"], "lars@99"),
                       (["diff", "lars@1", "nina@2"], "'nina'"),
                       (["episode", "show", "nope"], "nope"),
                       (["export", "lars@1", "--through-day", "2"], "lars@1")):
        result = invoke("--store", store, *args)
        assert_refused(result.stderr, result.exit_code, word)


def test_an_unknown_scripted_agent_is_refused(store: str) -> None:
    result = invoke("--store", store, "rollout", str(TASK), "--agent", "scripted:genius")
    assert_refused(result.stderr, result.exit_code, "scripted:genius", "reference")
    result = invoke("--store", store, "rollout", str(TASK), "--agent", "genius")
    assert_refused(result.stderr, result.exit_code, "genius", "llm:MODEL")
    result = invoke("--store", store, "rollout", str(TASK), "-n", "2", "--hinted", "3")
    assert_refused(result.stderr, result.exit_code, "hinted = 3", "n = 2")


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


def test_serve_on_a_port_in_use_is_refused_before_starting(store: str, busy_port: int) -> None:
    done = run("--store", store, "serve", "--port", str(busy_port))
    assert_refused(done.stderr, done.returncode, f"127.0.0.1:{busy_port}", "--port")
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_serve_without_the_envs_extra_names_the_extra(store: str, tmp_path: Path) -> None:
    done = run("--store", store, "serve", "--port", "0", env=without(tmp_path, "uvicorn"))
    assert_refused(done.stderr, done.returncode, "uvicorn",
                   "pip install 'agent-worlds[envs]'")


def test_serve_refuses_tasks_it_cannot_serve_before_starting(store: str,
                                                             tmp_path: Path) -> None:
    done = run("--store", store, "serve", "--port", "0", "--tasks", "no-such-pack")
    assert_refused(done.stderr, done.returncode, "no pack named 'no-such-pack'")
    done = run("--store", store, "serve", "--port", "0", "--tasks", str(tmp_path))
    assert_refused(done.stderr, done.returncode, str(tmp_path), "neither a task folder")
