"""Shared plumbing for the benchmarks: interleaved timing, result rows, JSON and markdown.

Machines running these are shared and noisy, so every benchmark measures its baseline in
the same run, interleaves the contenders round by round (rotating their order), and
reports medians. Nothing here asserts on time: benchmarks report, they do not fail.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
OUT_DIR = BENCH_DIR / "out"
WORK_DIR = OUT_DIR / "work"
QUICK_EVENTS = 1_000  # a quick run's generated world: big enough to have every kind of event

if str(REPO) not in sys.path:  # run as `python bench/x.py` from anywhere
    sys.path.insert(0, str(REPO))


@dataclass(slots=True)
class Row:
    """One line of a results table."""

    bench: str
    measure: str
    result: str  # formatted value of ours
    baseline: str = ""  # formatted value of the baseline measured in the same run
    ratio: str = ""  # e.g. "raw/replay = 0.61"
    target: str = ""
    met: bool | None = None  # None: no target for this row

    @property
    def met_text(self) -> str:
        return "" if self.met is None else ("yes" if self.met else "**no**")


@dataclass(slots=True)
class Report:
    name: str
    params: dict[str, Any]
    rows: list[Row] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)  # raw numbers (seconds, bytes...)
    notes: list[str] = field(default_factory=list)

    def save(self, folder: Path = OUT_DIR) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.name}.json"
        doc = {
            "name": self.name,
            "params": self.params,
            "env": environment(),
            "rows": [asdict(r) for r in self.rows],
            "data": self.data,
            "notes": self.notes,
        }
        path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        return path

    def markdown(self) -> str:
        out = [markdown_table(self.rows)]
        out += [f"- {n}" for n in self.notes]
        return "\n".join(out)


def markdown_table(rows: list[Row]) -> str:
    head = ["Benchmark", "Measure", "Result", "Baseline", "Ratio", "Target", "Met"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.bench, r.measure, r.result, r.baseline, r.ratio, r.target, r.met_text]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def rows_from_json(doc: dict[str, Any]) -> list[Row]:
    return [Row(**r) for r in doc["rows"]]


# --- timing ------------------------------------------------------------------------------

Timed = Callable[[], float]  # runs once, returns the seconds that count (setup excluded)


def interleave(contenders: dict[str, Timed], rounds: int) -> dict[str, list[float]]:
    """Run every contender once per round, rotating the order each round."""
    names = list(contenders)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(contenders[name]())
    return times


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def spread(xs: list[float]) -> str:
    """min..max, for the JSON and the notes: how noisy the run was."""
    return f"{min(xs):.4g}..{max(xs):.4g}"


def clock(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# --- formatting --------------------------------------------------------------------------


def fmt_s(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def fmt_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def fmt_rate(per_s: float, unit: str) -> str:
    if per_s >= 1e4:
        return f"{per_s / 1e3:,.1f}k {unit}/s"
    return f"{per_s:,.1f} {unit}/s"


# --- files and environment ---------------------------------------------------------------


def fresh_dir(path: Path) -> Path:
    remove(path)
    path.mkdir(parents=True)
    return path


def remove(path: Path) -> None:
    if path.exists():
        for dirpath, _dirs, _files in os.walk(path):
            os.chmod(dirpath, 0o755)  # snapshot dirs in a store's cache are read-only
        shutil.rmtree(path)


def tree_bytes(root: Path) -> int:
    """Apparent size (sum of st_size) of the regular files under root."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            st = os.lstat(os.path.join(dirpath, f))
            total += st.st_size
    return total


def tree_blocks(root: Path) -> int:
    """Allocated bytes (sum of st_blocks * 512) under root."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        total += os.lstat(dirpath).st_blocks * 512
        for f in files:
            total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
    return total


def fs_type(path: Path) -> str:
    try:
        out = subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True,
                             text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def environment() -> dict[str, Any]:
    import apsw

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "sqlite": apsw.sqlite_lib_version(),
        "fs": fs_type(_RUN.scratch if _RUN.scratch.exists() else BENCH_DIR),
    }


def world_file(events: int, payload: int, days: int = 10) -> Path:
    """The generated interchange file for these parameters (generated once, then reused).

    The name carries the parameters and a digest of the generator's source, so a change
    to the generator never reuses a stale file.
    """
    import hashlib

    import genworld

    src = hashlib.sha256(Path(genworld.__file__).read_bytes()).hexdigest()[:10]
    path = _RUN.scratch / "worlds" / f"world-{events}-{payload}-{days}-{src}.jsonl"
    if not path.exists():
        for stale in path.parent.glob("world-*.jsonl"):
            if not stale.stem.endswith(src):  # made by an older generator
                stale.unlink()
        genworld.write_world(path, genworld.Params(events, payload, days))
    return path


def emit(report: Report, *, quick: bool | None = None) -> None:
    """Save the JSON (where the run was told to) and print the markdown. A quick run's
    sizes are smaller than the targets are stated for, so its targets are shown but not
    judged."""
    quick = _RUN.quick if quick is None else quick
    report.params["quick"] = quick
    if quick:
        for row in report.rows:
            if row.met is not None:
                row.met = None
                row.target += " (judged at full size)"
    print(f"## {report.name}\n")
    print(report.markdown())
    if _RUN.out is not None:
        path = report.save(_RUN.out)
        shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        print(f"\n(results: {shown})\n")


# --- the run: quick or full, where results and scratch files go ----------------------------


@dataclass(slots=True)
class _Run:
    quick: bool = False
    out: Path | None = OUT_DIR  # where the JSON goes; None: nowhere
    scratch: Path = WORK_DIR  # stores, generated worlds, instances


_RUN = _Run()


def bench_parser(description: str, *, quick_help: str = "smoke run: tiny sizes, seconds, "
                 "no figures judged, nothing written unless --out is given") -> Any:
    """The command line every benchmark starts from: --quick and --out."""
    import argparse

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--out", type=Path, default=None,
                    help="folder for the results JSON (default: bench/out/ for a full run, "
                         "none for a quick one)")
    return ap


def setup_run(a: Any) -> None:
    """Set the run up from the parsed command line. A full run writes its JSON to
    bench/out/ and keeps its scratch (generated worlds are cached there); a quick run
    writes nothing into the checkout unless --out names a folder: its scratch is a
    temporary folder, removed at exit."""
    import atexit
    import tempfile

    _RUN.quick = bool(a.quick)
    if a.quick:
        _RUN.out = a.out
        _RUN.scratch = Path(tempfile.mkdtemp(prefix="bench-quick-"))
        atexit.register(remove, _RUN.scratch)
    else:
        _RUN.out = a.out or OUT_DIR
        _RUN.scratch = WORK_DIR


def quick() -> bool:
    return _RUN.quick


def scratch_dir(name: str) -> Path:
    """A fresh scratch folder for one part of a run."""
    return fresh_dir(_RUN.scratch / name)


def scratch_root() -> Path:
    return _RUN.scratch


def world_args(description: str, argv: list[str] | None, *, rounds: int) -> Any:
    """The command line shared by the world benchmarks: size, payload, rounds, --quick."""
    ap = bench_parser(description)
    ap.add_argument("--events", type=int)
    ap.add_argument("--payload", type=int, default=640)
    ap.add_argument("--rounds", type=int)
    a = ap.parse_args(argv)
    setup_run(a)
    a.events = a.events or (QUICK_EVENTS if a.quick else 50_000)
    a.rounds = a.rounds or (1 if a.quick else rounds)
    return a


def snapshot_files(snapshot: Path) -> list[tuple[str, Path]]:
    """(relative path, path) of every file of a cached snapshot: what a plain copy copies."""
    found = []
    for dirpath, _dirs, files in os.walk(snapshot):
        for f in files:
            path = Path(dirpath) / f
            found.append((path.relative_to(snapshot).as_posix(), path))
    return found


def copy_files(files: list[tuple[str, Path]], dest: Path) -> None:
    made: set[Path] = set()
    for rel, src in files:
        dst = dest / rel
        if dst.parent not in made:
            dst.parent.mkdir(parents=True, exist_ok=True)
            made.add(dst.parent)
        shutil.copyfile(src, dst)


def time_plain_copy(scratch: Callable[[], Path], files: list[tuple[str, Path]]) -> float:
    """The baseline of mount and open: a fresh directory plus shutil.copyfile of each file
    (making the target directory is part of a copy); the copy is removed untimed."""
    t0 = time.perf_counter()
    dest = scratch()
    copy_files(files, dest)
    elapsed = time.perf_counter() - t0
    remove(dest)
    return elapsed
