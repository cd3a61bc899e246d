"""Run every benchmark, each in its own process, and print one combined markdown table.

    .venv/bin/python bench/run_all.py           # full size (several minutes)
    .venv/bin/python bench/run_all.py --quick   # smoke run of every benchmark (~1 minute)

A full run: each benchmark writes bench/out/<name>.json; the combined table is also
written to bench/out/summary.md. A quick run writes nothing into the checkout unless
--out names a folder (then the JSON files and summary.md go there). A benchmark that fails
is reported and the others still run; the exit status is then 1.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import BENCH_DIR, OUT_DIR, environment, markdown_table, rows_from_json

# Every bench_<name>.py of this folder (tests/project/test_bench_quick.py checks none is missing).
BENCHMARKS = ("replay", "hash", "mount", "envs", "awm", "rl", "eval", "verifier", "gates",
              "startup", "synth", "persona", "gui")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: tiny sizes, no figures judged, nothing written")
    ap.add_argument("--out", type=Path, help="folder for the results (default: bench/out/ "
                    "for a full run, none for a quick one)")
    ap.add_argument("--only", choices=BENCHMARKS, action="append",
                    help="run only this benchmark (repeatable)")
    a = ap.parse_args(argv)
    names = a.only or list(BENCHMARKS)
    with tempfile.TemporaryDirectory(prefix="bench-run-all-") as scratch:
        out = a.out or (Path(scratch) if a.quick else OUT_DIR)
        return _run(names, a.quick, out, keep=a.out is not None or not a.quick)


def _run(names: list[str], quick: bool, out: Path, *, keep: bool) -> int:
    failed = []
    started = time.perf_counter()
    rows, notes = [], []
    for name in names:
        (out / f"{name}.json").unlink(missing_ok=True)
        cmd = [sys.executable, str(BENCH_DIR / f"bench_{name}.py"), "--out", str(out)]
        cmd += ["--quick"] * quick
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        took = time.perf_counter() - t0
        print(f"[{name}: {took:.1f} s]", file=sys.stderr)
        result = out / f"{name}.json"
        if proc.returncode != 0 or not result.exists():
            failed.append(name)
            print(f"benchmark {name} failed (exit {proc.returncode}):\n{proc.stderr}",
                  file=sys.stderr)
            continue
        doc = json.loads(result.read_text())
        rows += rows_from_json(doc)
        notes += [f"{name}: {n}" for n in doc["notes"]]
    env = environment()
    mode = "quick" if quick else "full"
    text = "\n".join([
        f"Benchmarks ({mode} run; Python {env['python']}, SQLite {env['sqlite']}, "
        f"{env['cpus']} CPUs, {env['fs']} file system, load {env['loadavg'][0]}):",
        "",
        markdown_table(rows),
        "",
        *[f"- {n}" for n in notes],
    ])
    if keep:
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.md").write_text(text + "\n")
    print(text)
    print(f"\n[all benchmarks: {time.perf_counter() - started:.1f} s]", file=sys.stderr)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
