"""Every benchmark runs: each ``bench/bench_<name>.py --quick`` as a subprocess must exit 0.

A quick run is a smoke run (tiny sizes, no figures judged) and writes nothing into the
checkout: this test also requires that ``bench/out/`` is left as it was. Two benchmarks run
at a time (most of a benchmark's wall time is process starts and waits on its children),
so the whole test takes about a minute and a half on two cores.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
OUT = BENCH / "out"
TIMEOUT_S = 300  # one benchmark; a quick run takes seconds when the machine is idle


def listed_benchmarks() -> tuple[str, ...]:
    """``run_all.BENCHMARKS``, read without importing the benchmarks' plumbing."""
    tree = ast.parse((BENCH / "run_all.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "BENCHMARKS" for t in node.targets):
            names = ast.literal_eval(node.value)
            assert isinstance(names, tuple)
            return tuple(str(n) for n in names)
    raise AssertionError("bench/run_all.py has no BENCHMARKS")


def out_state() -> dict[str, int]:
    """The files under bench/out/ and their modification times."""
    if not OUT.exists():
        return {}
    return {str(p.relative_to(OUT)): p.stat().st_mtime_ns for p in OUT.rglob("*")
            if p.is_file()}


def quick(name: str, *extra: str) -> tuple[str, int, float, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORLDCTL_LLM_")}
    t0 = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, str(BENCH / f"bench_{name}.py"), "--quick",
                               *extra], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return name, -1, time.perf_counter() - t0, f"timed out after {TIMEOUT_S} s"
    return name, done.returncode, time.perf_counter() - t0, done.stdout + done.stderr


def test_run_all_lists_every_benchmark() -> None:
    found = sorted(p.stem.removeprefix("bench_") for p in BENCH.glob("bench_*.py"))
    assert sorted(listed_benchmarks()) == found


def test_every_benchmark_runs_quick(capsys: pytest.CaptureFixture[str]) -> None:
    before = out_state()
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(quick, listed_benchmarks()))
    took = time.perf_counter() - started
    with capsys.disabled():
        print(f"\nquick benchmarks, {took:.0f} s in all: "
              + ", ".join(f"{name} {seconds:.0f} s" for name, _rc, seconds, _o in results))
    failed = [f"{name} (exit {rc}):\n{output[-3000:]}" for name, rc, _s, output in results
              if rc != 0]
    assert not failed, "\n\n".join(failed)
    assert out_state() == before, "a quick run wrote into bench/out/"


def test_a_quick_run_writes_its_results_where_told(tmp_path: Path) -> None:
    name, rc, _seconds, output = quick("hash", "--out", str(tmp_path))
    assert rc == 0, output
    doc = json.loads((tmp_path / "hash.json").read_text(encoding="utf-8"))
    assert doc["name"] == name and doc["params"]["quick"] is True
    assert doc["rows"] and {"bench", "measure", "result", "met"} <= set(doc["rows"][0])
    # a quick run's targets are shown, never judged
    assert all(row["met"] is None for row in doc["rows"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hash.json"]
