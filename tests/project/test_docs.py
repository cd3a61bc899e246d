"""The documentation site stays true: it builds with ``mkdocs build --strict``, its runnable
blocks run as written, and the generated references cover every command.

Which blocks run: every ``python`` block of ``docs/`` (in a folder whose store holds the
demo world; a block that talks to a gateway at ``127.0.0.1:8765`` gets a real
``worldctl serve`` there), and every ``bash`` block that starts by putting the checkout's
``.venv`` on PATH (a user's shell from the checkout). Other blocks (those needing a model,
a GPU or a long run) are read, not run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import click
import pytest

from replay import Worlds
from worldctl.main import cli
from worldstore.events import EVENT_TYPES

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
BIN = Path(sys.executable).parent
RUNNABLE = 'export PATH="$PWD/.venv/bin:$PATH"'
GATEWAY = "127.0.0.1:8765"


def _pages() -> dict[str, str]:
    return {str(p.relative_to(DOCS)): p.read_text() for p in sorted(DOCS.rglob("*.md"))}


def _blocks(language: str) -> list[tuple[str, str]]:
    return [(page, block) for page, text in _pages().items()
            for block in re.findall(rf"```{language}\n(.*?)```", text, re.S)]


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _user_env(tmp_path: Path) -> dict[str, str]:
    """A user's shell: no worldctl on PATH until the block puts the checkout's .venv there,
    no store settings; `mktemp -d` makes its directory in tmp_path."""
    env = dict(os.environ)
    path = [p for p in env["PATH"].split(os.pathsep) if p and not (Path(p) / "worldctl").exists()]
    if not (ROOT / ".venv" / "bin" / "worldctl").exists():
        path.append(str(BIN))  # the tests run in another environment than the checkout's .venv
    env["PATH"] = os.pathsep.join(path)
    env["TMPDIR"] = str(tmp_path)
    for name in ("DEMO", "MODEL", "WORLDCTL_STORE", "WORLDCTL_CACHE", "WORLDCTL_PACKS"):
        env.pop(name, None)
    return env


def _runnable_bash() -> list[tuple[str, str]]:
    return [(page, b) for page, b in _blocks("bash") if b.startswith(RUNNABLE)]


def _run_bash(block: str, tmp_path: Path, env: dict[str, str] | None = None
              ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=ROOT,
                          env=env or _user_env(tmp_path), capture_output=True, text=True,
                          timeout=600)


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """`mkdocs build --strict`: every page in the navigation, every link and anchor
    resolving, every generated page made (a command that does not load is a warning)."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([str(BIN / "mkdocs"), "build", "--strict", "--quiet",
                           "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cli_page = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "worldctl eval run" in cli_page and "generated: cli" not in cli_page
    http_page = (tmp_path / "site" / "reference" / "http" / "index.html").read_text()
    assert "/instances/{iid}/openenv/step" in http_page
    assert (tmp_path / "site" / "methods" / "index.html").is_file()


def test_every_runnable_bash_block_defines_what_it_uses() -> None:
    blocks = _runnable_bash()
    assert len(blocks) >= 2
    for page, block in blocks:
        used = set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", block))
        defined = set(re.findall(r"^(?:export )?([A-Za-z_][A-Za-z0-9_]*)=", block, re.M))
        defined |= set(re.findall(r"\bread -r ([A-Za-z_][A-Za-z0-9_]*)", block))
        assert used - defined <= {"PATH", "PWD"}, (page, used - defined)


def _block_with(text: str) -> str:
    (block,) = [b for _, b in _runnable_bash() if text in b]
    return block


def test_the_quickstart_tour_runs(tmp_path: Path) -> None:
    assert shutil.which("sqlite3"), "the tour uses the sqlite3 CLI (apt-get install sqlite3)"
    proc = _run_bash(_block_with("worldctl --store fresh import"), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (where,) = tmp_path.iterdir()  # the tour's own directory, from `mktemp -d`
    with Worlds.open(where / ".worldctl") as worlds:
        lars3 = worlds.resolve("lars@3").world_hash
        latest = worlds.resolve("lars").world_hash
    assert lars3 in proc.stdout.splitlines()
    assert "table shop.products (changed): +0 -0 ~1" in proc.stdout  # the hand edit
    diff = json.loads((where / "diff.json").read_text())
    assert diff["after"] == lars3 and diff["tables"]
    fresh = json.loads(proc.stdout[proc.stdout.rindex("[\n"):])
    assert fresh[0]["world_hash"] == latest


def test_the_training_block_runs(tmp_path: Path) -> None:
    """The training guide's commands, as a user runs them from the checkout: both worlds
    imported, the datasets, an SFT episode and a run folder whose launch is checked
    against verl's config and the model's (a small local model folder here: no hub id can
    be resolved offline)."""
    env = _user_env(tmp_path)
    env["MODEL"] = str(ROOT / "tests" / "fixtures" / "models" / "long-context")
    proc = _run_bash(_block_with("worldctl rl config"), tmp_path, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (where,) = tmp_path.iterdir()
    run = where / "run"
    for name in ("launch.sh", "run.env", "sft.sh", "train.parquet", "val.parquet",
                 "sft.parquet"):
        assert (run / name).is_file(), name
    assert "trainer.use_v1=true" in (run / "launch.sh").read_text()
    with Worlds.open(where / ".worldctl") as worlds:
        assert sorted(p.persona for p in worlds.store.personas()) == ["lars", "nora"]


def test_the_awm_import_block_runs(tmp_path: Path) -> None:
    proc = _run_bash(_block_with("import-awm"), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "content_platform_1" in proc.stdout and "e_commerce_33" in proc.stdout
    # No model: the gates that need rollouts do not run, and the task is not accepted.
    assert "exit 1: UNDECIDED" in proc.stdout
    (where,) = tmp_path.iterdir()
    assert (where / "awm-tasks" / "e_commerce_33-task-1" / "task.json").is_file()


def test_the_recorded_synthesis_block_runs_offline(tmp_path: Path) -> None:
    """The synthesis guide's recorded run: replayed with no model, identical, its world
    imported and its tasks' reference solutions passing their verifiers."""
    proc = _run_bash(_block_with("synth replay"), tmp_path, _offline(_user_env(tmp_path)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "is an environment run (synth envs)" in proc.stdout  # funnel: its stages
    assert "all identical" in proc.stdout
    assert "success 100.0 %" in proc.stdout
    (where,) = tmp_path.iterdir()
    with Worlds.open(where / ".worldctl") as worlds:
        assert [p.persona for p in worlds.store.personas()] == ["library_loans"]


def test_the_recorded_agent_block_runs_offline(tmp_path: Path) -> None:
    """The evaluation guide's recorded LLM agent solves its task with no model server."""
    proc = _run_bash(_block_with("llm:openai/scripted"), tmp_path,
                     _offline(_user_env(tmp_path)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "success 100.0 %" in proc.stdout
    assert "fjellrommet-title  llm:openai/scripted" in proc.stdout  # the stored episode


def _offline(env: dict[str, str]) -> dict[str, str]:
    """No model, endpoint or key of the developer's own; a request leaving the machine
    fails at once."""
    env = {k: v for k, v in env.items()
           if not k.startswith(("WORLDCTL_LLM_", "OPENAI_", "ANTHROPIC_"))}
    env["HTTPS_PROXY"] = env["HTTP_PROXY"] = "http://127.0.0.1:9"
    return env


def test_every_runnable_bash_block_is_run_above() -> None:
    """A new runnable block needs a test of its own (with what it must show)."""
    markers = ("worldctl --store fresh import", "worldctl rl config", "import-awm",
               "synth replay", "llm:openai/scripted")
    for page, block in _runnable_bash():
        assert sum(m in block for m in markers) == 1, f"{page}: a runnable block no test runs"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def demo_folder(tmp_path: Path, demo_jsonl: Path) -> Path:
    """A folder whose store (./.worldctl) holds the demo world."""
    with Worlds.open(tmp_path / ".worldctl") as worlds:
        worlds.import_file(demo_jsonl)
    return tmp_path


@pytest.fixture
def gateway(demo_folder: Path) -> Iterator[str]:
    """`worldctl serve` on a free loopback port over the store of demo_folder."""
    port = _free_port()
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    for name in ("WORLDCTL_STORE", "WORLDCTL_CACHE"):
        env.pop(name, None)
    server = subprocess.Popen([str(BIN / "worldctl"), "serve", "--port", str(port)],
                              cwd=demo_folder, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                    break
            except OSError:
                assert server.poll() is None, server.communicate()[1]
                assert time.monotonic() < deadline, "the gateway did not start"
                time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)
        if server.stderr is not None:
            server.stderr.close()


def test_python_examples_run(demo_folder: Path, gateway: str) -> None:
    """Every Python block of the docs runs as written, against a store holding the demo
    world; those that talk to a gateway reach a real one serving that store."""
    blocks = _blocks("python")
    assert len(blocks) >= 4
    assert any("from mcp import" in b for _, b in blocks), "the MCP client example"
    for page, block in blocks:
        proc = subprocess.run([sys.executable, "-c", block.replace(GATEWAY, gateway)],
                              cwd=demo_folder, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{page}:\n{block}\n{proc.stderr}"
        if "from mcp import" in block:
            assert "stored: True" in proc.stdout, proc.stdout


def test_every_command_is_in_the_generated_cli_reference() -> None:
    reference = _hooks().cli_reference_markdown()
    context = click.Context(cli, info_name="worldctl")
    for name in cli.list_commands(context):
        command = cli.get_command(context, name)
        assert command is not None
        assert f"### `worldctl {name}`" in reference, f"worldctl {name}"
        if isinstance(command, click.Group):
            for sub in command.list_commands(click.Context(command)):
                assert f"#### `worldctl {name} {sub}`" in reference, f"worldctl {name} {sub}"
    assert "did not load" not in reference


def test_the_http_reference_is_generated_from_every_route() -> None:
    """The HTTP page is the gateway's own reference (no hand-kept copy): a section per
    route, every body's fields."""
    from starlette.routing import Route, WebSocketRoute

    from worldenv.serving.gateway import ROUTES

    reference = _hooks().http_reference_markdown()
    assert reference is not None, "the gateway's HTTP reference could not be generated"
    for route in ROUTES:
        assert isinstance(route, Route | WebSocketRoute)
        path = re.sub(r":[a-z]+}", "}", route.path)
        assert re.search(rf"^### `[A-Z, ]+ {re.escape(path)}`$", reference, re.M) or \
            f"any method {path}`" in reference, path
    assert "`command`" in reference and "`max_steps`" in reference  # bodies' fields
    page = (DOCS / "reference" / "http.md").read_text()
    assert "POST /instances" not in page, "the endpoints are generated, not written by hand"


def test_every_command_is_in_the_overview() -> None:
    """The hand-kept overview of the CLI reference names every command: it is what people
    read first."""
    overview = (DOCS / "reference" / "cli.md").read_text()
    for name in cli.list_commands(click.Context(cli)):
        assert f"`worldctl {name}" in overview, f"worldctl {name} is missing from the overview"


def test_every_event_type_is_documented() -> None:
    concepts = (DOCS / "concepts.md").read_text()
    for event_type in EVENT_TYPES:
        assert f"`{event_type}`" in concepts


def test_methods_sections_cited_by_the_code_exist() -> None:
    """Code cites "methods.md section N": docs/methods.md has those sections."""
    methods = (DOCS / "methods.md").read_text()
    sections = set(re.findall(r"^## (\d+)\. ", methods, re.M))
    cited: set[str] = set()
    for package in ("gates", "rl", "synth", "eval", "worldenv", "replay", "awmbridge"):
        for path in (ROOT / package).rglob("*.py"):
            for found in re.findall(r"methods\.md(?:``)? sections? ([\d ,and]+)",
                                    path.read_text()):
                cited |= set(re.findall(r"\d+", found))
    assert cited and cited <= sections, cited - sections


def test_the_docs_name_no_old_package_and_no_issue() -> None:
    for page, text in _pages().items():
        assert not re.search(r"\bissue \d+|\(issue|#\d{2,}\b", text), page
        assert not re.search(r"`(envs|llm|awm)/", text), page


def test_benchmark_tables_come_from_the_results_files(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    hooks = _hooks()
    row = {"bench": "x", "measure": "a | b", "result": "1 ms", "baseline": "2 ms",
           "ratio": "0.5x", "target": "<= 1x", "met": True}
    monkeypatch.setattr(hooks, "BENCH_OUT", tmp_path)
    (tmp_path / "x.json").write_text(json.dumps(
        {"rows": [row], "env": {"python": "3.11"}, "params": {"quick": True}, "notes": []}))
    table = hooks.bench_table_markdown("x")
    assert "| a \\| b | 1 ms | 2 ms | 0.5x | &lt;= 1x | yes |" in table
    assert "quick run" in table
    assert "No results" in hooks.bench_table_markdown("absent")
    page = hooks.render("<!-- generated: bench x -->\n<!-- generated: bench-others -->")
    assert page.count("| a \\| b |") == 1  # x is named, so it is not among the others


def test_the_files_the_docs_name_exist() -> None:
    """A path into the project (`worldenv/gui/`, `rl/loss.py`) names a file or folder that
    exists: moving code moves its mention too."""
    tops = ("worldstore", "replay", "packs", "worldenv", "worldllm", "gates", "synth", "rl",
            "eval", "awmbridge", "worldctl", "migrations", "bench", "tests", "scripts")
    pattern = re.compile(rf"`((?:{'|'.join(tops)})/[A-Za-z0-9_./-]*)`")
    missing = {(page, path) for page, text in _pages().items()
               for path in pattern.findall(text) if not (ROOT / path).exists()}
    assert not missing, sorted(missing)


def test_the_settings_the_docs_name_exist() -> None:
    """Every environment setting the docs name (`WORLDCTL_STORE`, ...) is read somewhere in
    the code: one spelling, and no setting that was renamed away."""
    code = "\n".join(p.read_text() for top in ("worldstore", "replay", "packs", "worldenv",
                                               "worldllm", "gates", "synth", "rl", "eval",
                                               "awmbridge", "worldctl")
                     for p in (ROOT / top).rglob("*.py"))
    # the image builds and the compose file read theirs too
    code += "\n".join(p.read_text() for p in sorted((ROOT / "deploy").iterdir())
                      if p.suffix in (".sh", ".py", ".yaml"))
    named = {name for text in _pages().values()
             for name in re.findall(r"\b((?:WORLDCTL|AGENT_WORLDS)_[A-Z_]+)\b", text)}
    assert named
    assert {n for n in named if n not in code} == set()
