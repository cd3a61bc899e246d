"""Start-up of the command line: ``worldctl --help``, ``--version`` and ``personas``.

Each is a fresh process, as a user runs it. The baseline is ``python -c pass`` with the
same interpreter, measured in the same run and interleaved with the commands (rounds
rotate the order); results are medians, reported as ratios to the baseline. For scale
the same run also times ``python -c "import click"`` and ``python -c "import
sqlalchemy"``: what the two floors cost on this machine. ``personas`` runs on a store
holding the demo world (imported once, before timing).

Targets: ``--help`` and ``--version`` <= 4x the bare interpreter (click alone is about
2-3x), ``personas`` <= 15x (SQLAlchemy alone is about 10x).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from _common import (
    REPO,
    Report,
    Row,
    bench_parser,
    emit,
    fmt_s,
    interleave,
    median,
    scratch_dir,
    setup_run,
)
from _common import spread as spread_of

WORLDCTL = Path(sys.executable).parent / "worldctl"
DEMO = REPO / "packs" / "demo" / "world" / "lars.jsonl"
TARGETS = {"--help": 4.0, "--version": 4.0, "personas": 15.0}


def timed(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    ap = bench_parser(__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int)
    a = ap.parse_args(argv)
    setup_run(a)
    rounds = a.rounds or (1 if a.quick else 21)
    store = scratch_dir("startup") / "store"
    subprocess.run([str(WORLDCTL), "--store", str(store), "import", str(DEMO)], check=True,
                   capture_output=True)
    python = sys.executable
    commands = {
        "python -c pass": [python, "-c", "pass"],
        "python -c 'import click'": [python, "-c", "import click"],
        "python -c 'import sqlalchemy'": [python, "-c", "import sqlalchemy"],
        "--help": [str(WORLDCTL), "--help"],
        "--version": [str(WORLDCTL), "--version"],
        "personas": [str(WORLDCTL), "--store", str(store), "personas"],
    }
    for command in commands.values() if not a.quick else ():  # warm page cache and .pyc
        timed(command)
    times = interleave({name: (lambda c=c: timed(c)) for name, c in commands.items()},
                       rounds)
    base = median(times["python -c pass"])
    report = Report("startup", {"rounds": rounds})
    for name in commands:
        if name == "python -c pass":
            continue
        ratio = median(times[name]) / base
        target = TARGETS.get(name)
        label = f"worldctl {name}" if name in TARGETS else name
        report.rows.append(Row(
            bench="startup", measure=f"{label}: median of {rounds} fresh processes",
            result=fmt_s(median(times[name])), baseline=f"python -c pass {fmt_s(base)}",
            ratio=f"{ratio:.1f}x", target=f"<= {target:.0f}x" if target else "",
            met=ratio <= target if target else None))
    report.data = {name: {"median_s": median(t), "spread_s": spread_of(t), "ratio":
                          median(t) / base} for name, t in times.items()}
    report.notes.append(f"baseline python -c pass: median {fmt_s(base)} "
                        f"({spread_of(times['python -c pass'])} s)")
    emit(report)


if __name__ == "__main__":
    main()
