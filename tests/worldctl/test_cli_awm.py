"""`worldctl import-awm` keeps its promises: a block per scenario (dropped statements one per
line), `--json` with the per-scenario report, one `error:` line per refusal naming file,
line and scenario with exit 2 and the other scenarios imported, `--strict` storing
nothing, and no traceback for input that is not AWM's. Stored data are checked through
the library.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner, Result

from replay.engine import Worlds
from worldctl.main import cli

SAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "awm-1k-samples"  # AWM-1K's own files
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "awm"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="worldctl", catch_exceptions=False)


def personas(store: Path) -> list[str]:
    if not store.exists():
        return []
    with Worlds.open(store, create=False) as worlds:
        return [p.persona for p in worlds.store.personas()]


def both(tmp_path: Path) -> Path:
    """The samples and our fixture scenario in one directory."""
    directory = tmp_path / "awm"
    directory.mkdir()
    for name in {p.name for src in (SAMPLES, FIXTURE) for p in src.glob("gen_*.jsonl")}:
        text = "".join((src / name).read_text() for src in (SAMPLES, FIXTURE)
                       if (src / name).exists())
        (directory / name).write_text(text)
    return directory


def test_human_output_is_one_block_per_scenario(tmp_path: Path) -> None:
    store = tmp_path / "store"
    result = invoke("--store", str(store), "import-awm", str(both(tmp_path)))
    assert result.exit_code == 0, result.output
    out = result.stdout
    with Worlds.open(store, create=False) as worlds:
        for persona in ("e_commerce_33", "content_platform_1", "library_loans_1"):
            assert f"{persona}: imported\n  persona     {persona}\n  world hash  " \
                f"{worlds.resolve(persona).world_hash}\n" in out
    assert "  tables      19: users, product_categories," in out
    assert "  tools       34\n" in out and "  tools       0 (no server code)\n" in out
    assert "  dropped     1 of 20 statements\n    " in out
    assert "gen_sample.jsonl:3: insert statement #14 (into table books) dropped: " \
        "ConstraintError: UNIQUE constraint failed: books.isbn\n" in out
    assert "skipped marketplace_1 (" in out
    assert "  tasks       not written (no --tasks-out)" in out
    assert result.stderr == ""


def test_json_is_the_per_scenario_report(tmp_path: Path) -> None:
    store = tmp_path / "store"
    result = invoke("--store", str(store), "import-awm", str(both(tmp_path)), "--json",
                    "--tasks-out", str(tmp_path / "tasks"))
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    rows = {r["scenario"]: r for r in report["scenarios"]}
    assert set(rows) == {"e_commerce_33", "content_platform_1", "library_loans_1"}
    ours = rows["library_loans_1"]
    assert ours["persona"] == "library_loans_1" and ours["tools"] == 5
    assert ours["rows"] == {"members": 3, "books": 4, "loans": 4}
    assert ours["tables"] == ["members", "books", "loans"]
    (dropped,) = ours["dropped"]
    assert (dropped["kind"], dropped["table"], dropped["index"], dropped["line"]) == (
        "insert", "books", 14, 3)
    assert "UNIQUE constraint failed" in dropped["error"]
    assert rows["e_commerce_33"]["tasks_written"] == 3
    assert ours["tasks_written"] == 1
    with Worlds.open(store, create=False) as worlds:
        for row in rows.values():
            assert row["world_hash"] == worlds.resolve(row["persona"]).world_hash
    assert report["refused"] == [] and len(report["skipped"]) == 3


def test_a_refusal_is_an_error_line_and_the_others_import(tmp_path: Path) -> None:
    directory = both(tmp_path)
    code = json.loads((directory / "gen_envs.jsonl").read_text().splitlines()[1])
    code["full_code"] = code["full_code"].replace("def list_my_loans(", "def list_my_loans((")
    lines = (directory / "gen_envs.jsonl").read_text().splitlines()
    (directory / "gen_envs.jsonl").write_text(lines[0] + "\n" + json.dumps(code) + "\n")
    store = tmp_path / "store"
    result = invoke("--store", str(store), "import-awm", str(directory))
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: {directory}/gen_envs.jsonl:2: scenario library_loans_1: "
                           "the server code (full_code) does not parse")
    assert "Traceback" not in result.output
    assert set(personas(store)) == {"e_commerce_33", "content_platform_1"}


def test_strict_stores_nothing_when_a_scenario_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "store"
    result = invoke("--store", str(store), "import-awm", str(both(tmp_path)), "--strict")
    assert result.exit_code == 2
    errors = result.stderr.splitlines()
    assert errors[0].startswith("error: ") and "scenario library_loans_1: 1 of 20 " \
        "statements fail and --strict drops none" in errors[0]
    assert "gen_sample.jsonl:3: insert statement #14" in errors[1]
    assert "nothing stored (--strict, a scenario was refused)" in result.stdout
    assert personas(store) == []


def test_strict_imports_clean_scenarios(tmp_path: Path) -> None:
    store = tmp_path / "store"
    result = invoke("--store", str(store), "import-awm", str(SAMPLES), "--strict")
    assert result.exit_code == 0, result.output
    assert set(personas(store)) == {"e_commerce_33", "content_platform_1"}


def test_a_file_that_is_not_awms_is_one_error_line(tmp_path: Path) -> None:
    directory = tmp_path / "awm"
    shutil.copytree(SAMPLES, directory)
    (directory / "gen_tasks.jsonl").chmod(0o644)
    (directory / "gen_tasks.jsonl").write_text('{"scenario": "e_commerce_33", "tasks": []}\n'
                                               "[1, 2]\n")
    store = tmp_path / "store"
    result = invoke("--store", str(store), "import-awm", str(directory))
    assert result.exit_code == 2
    assert result.stderr == (f"error: {directory}/gen_tasks.jsonl:2: not AWM's JSON Lines: "
                             "the line is a JSON list, not an object\n")
    assert personas(store) == []


def test_scenario_filters_and_unknown_names(tmp_path: Path) -> None:
    store = tmp_path / "store"
    result = invoke("--store", str(store), "import-awm", str(SAMPLES),
                    "--scenario", "e_commerce_33")
    assert result.exit_code == 0, result.output
    assert personas(store) == ["e_commerce_33"]
    result = invoke("--store", str(store), "import-awm", str(SAMPLES), "--scenario", "nope")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --scenario nope: no such scenario in ")
    assert personas(store) == ["e_commerce_33"]


def test_a_missing_directory_is_a_usage_error(tmp_path: Path) -> None:
    result = invoke("--store", str(tmp_path / "store"), "import-awm", str(tmp_path / "no"))
    assert result.exit_code == 2 and result.stderr.startswith("error: ")
    assert "does not exist" in result.stderr
