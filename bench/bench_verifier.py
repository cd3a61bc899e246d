"""Verifier: time per rollout of a 4-script checklist in the sandbox, against its baselines.

On the bundled demo world: W0 is the cached snapshot of ``lars@7`` and W a checkout of it
in which an agent renamed a note, wrote a report file and sent a chat message. The
verifier is four SDK scripts (notes diff, workspace file, chat message, answer), each
opening one or two databases, as a task's checklist would.

Contenders, interleaved round by round (order rotated, a warm-up round discarded):

* **sandbox, 4 at a time**: ``run_verifier(...)`` as a rollout calls it (the default:
  up to four scripts at once), everything included: world checks, staging the answer,
  one bubblewrap sandbox holding the driver (one Python start, the SDK imported once, a
  forked process per script), reading its report, parsing;
* sandbox, one at a time: the same with ``parallel=1``;
* **plain, 4 at a time** (the baseline of the ratios): the same four scripts as plain
  ``python -I -S -B`` subprocesses on the host (no sandbox), one Python start each,
  started together, waited for together, stdout parsed by the same rule; and plain, one
  at a time;
* plain driver: the same driver as a plain subprocess on the host (no sandbox), 4 at a
  time, its report read by ``read_driver_output``: what the sandbox itself adds;
* one trivial script (``import awsdk; awsdk.result(ok=True)``) through ``run_verifier``:
  the fixed cost of a run (runner, sandbox, Python, SDK import, one fork);
* **served**: the same 4 scripts, and the trivial script, through ``run_verifier`` with
  ``scratch=`` (the store's cache scratch, as the gates call it): on a verifier server
  (``gates.verifier_server``), the run staged as hardlinks into a sandbox kept from one
  run to the next; and once, after the rounds, a server's start with its first run;
* bare ``python -I -S -c pass``, one start: the floor of any process-per-script design;
* one sandbox start running ``true`` (no Python): what bubblewrap alone costs per run.

Target: the sandboxed verifier <= 100 ms per rollout.

    .venv/bin/python bench/bench_verifier.py [--quick] [--rounds R]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from _common import (
    REPO,
    Report,
    Row,
    bench_parser,
    emit,
    fmt_s,
    median,
    remove,
    scratch_dir,
    setup_run,
    spread,
)

DEMO = REPO / "packs" / "demo" / "world" / "lars.jsonl"
REF = "lars@7"
TARGET_S = 0.100
B = "verifier"
ANSWER = "Renamed the Fjord note, wrote the summary and told Ingrid."

SCRIPTS = {
    "10_notes.py": """
        import awsdk
        ws = awsdk.worlds()
        diff = awsdk.row_diff(ws.w0, ws.w, "notes", "notes")
        renamed = [(a, b) for a, b in diff.changed if a["title"] != b["title"]]
        awsdk.result(
            one_note_renamed=len(renamed) == 1 and not diff.added and not diff.removed,
            new_title=bool(renamed) and renamed[0][1]["title"] == "Fjord kickoff",
        )
    """,
    "20_report.py": """
        import awsdk
        ws = awsdk.worlds()
        report, brief = "reports/summary.md", "jobs/fjord/brief.md"
        text = awsdk.file_text(ws.w, report)
        awsdk.result(
            report_written=text is not None and awsdk.file_text(ws.w0, report) is None,
            report_names_fjord=awsdk.contains(text, "fjord"),
            brief_untouched=awsdk.file_text(ws.w, brief) == awsdk.file_text(ws.w0, brief),
        )
    """,
    "30_chat.py": """
        import awsdk
        ws = awsdk.worlds()
        added = awsdk.row_diff(ws.w0, ws.w, "chat", "messages").added
        awsdk.result(
            one_message_sent=len(added) == 1,
            message_to_ingrid=bool(added) and added[0]["conversation_id"] == 1,
            shop_untouched=awsdk.row_diff(ws.w0, ws.w, "shop", "orders").unchanged,
        )
    """,
    "40_answer.py": """
        import awsdk
        ws = awsdk.worlds()
        awsdk.result(
            answer_names_fjord=awsdk.contains(ws.answer, "fjord"),
            answer_names_ingrid=awsdk.contains(ws.answer, "ingrid"),
        )
    """,
}
N_CHECKS = 10

# The baseline's per-process bootstrap, as the runtime ran every script before it had a
# driver: -I drops the script's folder from sys.path, so the SDK and the folder go in by
# hand; the script runs as __main__.
BOOT = (
    "import sys\n"
    "sys.path[:0] = [{sdk!r}, {verifier!r}]\n"
    "sys.argv = sys.argv[1:]\n"
    "__file__ = sys.argv[0]\n"
    "with open(__file__, 'rb') as _source:\n"
    "    _code = compile(_source.read(), __file__, 'exec')\n"
    "del _source\n"
    "exec(_code)\n"
)


# --- setup ---------------------------------------------------------------------------------


def make_worlds(work: Path) -> tuple[Any, Path, Path]:
    """The store, W0 (the cached snapshot) and W (a checkout an agent changed)."""
    from replay.engine import Worlds

    worlds = Worlds.open(work / "store")
    worlds.import_file(DEMO)
    record = worlds.resolve(REF)
    w0 = worlds.snapshot(record.persona, record.day)
    w = work / "w"
    worlds.checkout(REF, w)
    conn = sqlite3.connect(w / "services" / "notes.sqlite")
    with conn:
        conn.execute("UPDATE notes SET title = 'Fjord kickoff' WHERE id = 9")
    conn.close()
    conn = sqlite3.connect(w / "services" / "chat.sqlite")
    with conn:
        conn.execute("INSERT INTO messages(conversation_id, sender_id, body, sent_at, "
                     "created_at, updated_at) VALUES (1, 1, 'Summary is in reports/', "
                     "'2026-03-10T09:00:00Z', '2026-03-10T09:00:00Z', '2026-03-10T09:00:00Z')")
    conn.close()
    (w / "workspace" / "reports").mkdir()
    (w / "workspace" / "reports" / "summary.md").write_text("Fjord kickoff moved.\n")
    return worlds, w0, w


def make_verifier(work: Path) -> Path:
    folder = work / "verifier"
    folder.mkdir()
    for name, source in SCRIPTS.items():
        (folder / name).write_text(textwrap.dedent(source))
    return folder


# --- contenders ----------------------------------------------------------------------------


def _last_result(stdout: str) -> dict[str, Any]:
    for line in reversed(stdout.split("\n")):
        if line.startswith("RESULT_JSON="):
            return dict(json.loads(line[len("RESULT_JSON="):]))
    raise RuntimeError(f"no RESULT_JSON line in {stdout!r}")


def _host_env(w0: Path, w: Path, answer_file: Path) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "AW_W0": str(w0), "AW_W": str(w),
            "AW_ANSWER": str(answer_file), "LANG": "C.UTF-8"}


def plain_runs(verifier: Path, w0: Path, w: Path, answer_file: Path, *,
               together: bool) -> tuple[float, int]:
    """The four scripts as plain host subprocesses; returns (seconds, checks passed)."""
    from gates.verifier import sdk_folder

    python = os.path.realpath(sys.executable)
    boot = BOOT.format(sdk=str(sdk_folder()), verifier=str(verifier))
    env = _host_env(w0, w, answer_file)
    argvs = [[python, "-I", "-S", "-B", "-c", boot, str(verifier / name)]
             for name in sorted(SCRIPTS)]
    t0 = time.perf_counter()
    outs: list[str] = []
    if together:
        procs = [subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                  cwd="/tmp", text=True) for a in argvs]
        outs = [p.communicate()[0] for p in procs]
    else:
        outs = [subprocess.run(a, capture_output=True, env=env, cwd="/tmp", text=True,
                               check=False).stdout for a in argvs]
    elapsed = time.perf_counter() - t0
    passed = sum(1 for out in outs for c in _last_result(out)["checks"] if c["passed"])
    return elapsed, passed


def plain_driver(verifier: Path, w0: Path, w: Path, answer_file: Path) -> tuple[float, int]:
    """The four scripts through the runtime's driver as one plain host subprocess; returns
    (seconds, checks passed)."""
    from gates.verifier import (
        MAX_PARALLEL,
        VERIFIER_LIMITS,
        driver_argv,
        read_driver_output,
        sdk_folder,
    )

    names = sorted(SCRIPTS)
    argv = driver_argv(os.path.realpath(sys.executable), names, VERIFIER_LIMITS,
                       MAX_PARALLEL, sdk_dir=str(sdk_folder()), verifier_dir=str(verifier))
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, env=_host_env(w0, w, answer_file),
                          cwd="/tmp", text=True, check=False)
    elapsed = time.perf_counter() - t0
    report = read_driver_output(names, done.stdout, VERIFIER_LIMITS)
    if done.returncode != 0 or report.damage or len(report.runs) != len(names):
        raise RuntimeError(f"the plain driver failed: {done.stderr[-2000:]} {report.damage}")
    passed = sum(1 for run in report.runs.values()
                 for c in _last_result(run.stdout)["checks"] if c["passed"])
    return elapsed, passed


def bare_python() -> float:
    python = os.path.realpath(sys.executable)
    t0 = time.perf_counter()
    subprocess.run([python, "-I", "-S", "-c", "pass"], check=True)
    return time.perf_counter() - t0


# --- main ----------------------------------------------------------------------------------


def run(a: argparse.Namespace) -> Report:
    from gates.verifier import run_verifier
    from gates.verifier_server import close_servers, jobs_served
    from worldenv.sandbox.choice import default_sandbox

    work = scratch_dir("verifier")
    report = Report(B, {"rounds": a.rounds, "world": REF, "scripts": len(SCRIPTS),
                        "checks": N_CHECKS})
    worlds, w0, w = make_worlds(work)
    verifier = make_verifier(work)
    trivial = work / "trivial"
    trivial.mkdir()
    (trivial / "ok.py").write_text("import awsdk\nawsdk.result(ok=True)\n")
    answer_file = work / "answer.txt"
    answer_file.write_text(ANSWER)
    box = default_sandbox()
    scratch = work / "scratch"
    scratch.mkdir()
    per_script: list[float] = []
    failures: list[str] = []

    served_in = worlds.cache.tmp  # the gates' scratch: the store's own cache

    def sandboxed(parallel: int, serve: bool = False) -> float:
        t0 = time.perf_counter()
        verdict = run_verifier(verifier, w0, w, ANSWER, sandbox=box, parallel=parallel,
                               scratch=served_in if serve else None)
        elapsed = time.perf_counter() - t0
        per_script.extend(s.seconds for s in verdict.scripts)
        if not verdict.passed or verdict.n != N_CHECKS:
            failures.append(f"{verdict.errors or [c for c in verdict.checks if not c.passed]}")
        return elapsed

    def plain(together: bool) -> float:
        elapsed, passed = plain_runs(verifier, w0, w, answer_file, together=together)
        if passed != N_CHECKS:
            failures.append(f"plain run passed {passed}/{N_CHECKS} checks")
        return elapsed

    def driver() -> float:
        elapsed, passed = plain_driver(verifier, w0, w, answer_file)
        if passed != N_CHECKS:
            failures.append(f"plain driver passed {passed}/{N_CHECKS} checks")
        return elapsed

    def sandbox_trivial(serve: bool = False) -> float:
        t0 = time.perf_counter()
        verdict = run_verifier(trivial, w0, w, ANSWER, sandbox=box,
                               scratch=served_in if serve else None)
        elapsed = time.perf_counter() - t0
        if not verdict.passed:
            failures.append(f"trivial script: {verdict.errors}")
        return elapsed

    def sandbox_true() -> float:
        t0 = time.perf_counter()
        box.run("true", scratch)
        return time.perf_counter() - t0

    contenders = {
        "sandbox_parallel": lambda: sandboxed(4),
        "sandbox_serial": lambda: sandboxed(1),
        "plain_parallel": lambda: plain(True),
        "plain_serial": lambda: plain(False),
        "plain_driver": driver,
        "sandbox_trivial": sandbox_trivial,
        "served_parallel": lambda: sandboxed(4, serve=True),
        "served_trivial": lambda: sandbox_trivial(serve=True),
        "bare_python": bare_python,
        "sandbox_true": sandbox_true,
    }
    names = list(contenders)
    served_before = jobs_served()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(a.rounds + 1):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            took = contenders[name]()
            if r:  # round 0 warms the page cache and the sandbox probe
                times[name].append(took)
    served = jobs_served() - served_before
    close_servers()
    t0 = time.perf_counter()
    sandbox_trivial(serve=True)  # a server's start and its first run
    first_served = time.perf_counter() - t0
    worlds.close()

    med = {k: median(v) for k, v in times.items()}
    ours, base = med["sandbox_parallel"], med["plain_parallel"]
    report.rows += [
        Row(B, f"V(W0, W, a), {len(SCRIPTS)} scripts / {N_CHECKS} checks in the sandbox, "
               "4 at a time (run_verifier default), per rollout",
            fmt_s(ours), fmt_s(base) + " plain, 4 at a time",
            f"{ours / base:.2f}x plain", f"<= {fmt_s(TARGET_S)}", ours <= TARGET_S),
        Row(B, "  the same against the same driver as a plain process (no sandbox)",
            fmt_s(ours), fmt_s(med["plain_driver"]) + " plain driver",
            f"{ours / med['plain_driver']:.2f}x plain driver"),
        Row(B, "  the same in the sandbox, one script at a time", fmt_s(med["sandbox_serial"]),
            fmt_s(med["plain_serial"]) + " plain, one at a time",
            f"{med['sandbox_serial'] / med['plain_serial']:.2f}x plain"),
        Row(B, "  one script's forked process inside the driver (median over all runs)",
            fmt_s(median(per_script)), fmt_s(med["bare_python"]) + " bare python start",
            f"{median(per_script) / med['bare_python']:.2f}x bare start"),
        Row(B, "  one trivial script through run_verifier (runner + sandbox + Python + SDK "
               "import + one fork)", fmt_s(med["sandbox_trivial"]),
            fmt_s(med["bare_python"]) + " bare python start",
            f"{med['sandbox_trivial'] / med['bare_python']:.2f}x bare start"),
        Row(B, "V(W0, W, a) of the same 4 scripts on a verifier server (run_verifier with "
               "scratch=, as the gates call it: the run staged as hardlinks, no sandbox or "
               "Python start)", fmt_s(med["served_parallel"]),
            fmt_s(ours) + " a sandbox per run", f"{med['served_parallel'] / ours:.2f}x"),
        Row(B, "  one trivial script on a verifier server", fmt_s(med["served_trivial"]),
            fmt_s(med["sandbox_trivial"]) + " a sandbox per run",
            f"{med['served_trivial'] / med['sandbox_trivial']:.2f}x"),
        Row(B, "  a server's start with its first run (once per process, cache and limits)",
            fmt_s(first_served), fmt_s(med["sandbox_trivial"]) + " a sandbox per run",
            f"{first_served / med['sandbox_trivial']:.2f}x"),
        Row(B, "  one sandbox start running `true` (bubblewrap, no Python)",
            fmt_s(med["sandbox_true"]), fmt_s(med["bare_python"]) + " bare python start",
            f"{med['sandbox_true'] / med['bare_python']:.2f}x bare start"),
        Row(B, "  bare `python -I -S -c pass` (the floor per process)",
            fmt_s(med["bare_python"])),
    ]
    report.data = {"seconds": times, "medians_s": med, "per_script_s": per_script,
                   "spread": {k: spread(v) for k, v in times.items()},
                   "cpus": os.cpu_count(), "failures": failures[:5],
                   "served_runs": served, "first_served_s": first_served}
    if served != 2 * a.rounds + 2:  # every served contender's run, warm-up included
        failures.append(f"only {served} of the served runs went to a server")
    if failures:
        report.notes.append(f"WARNING: {len(failures)} runs did not pass every check: "
                            f"{failures[:3]}")
    report.notes += [
        f"Verifier: medians of {a.rounds} interleaved rounds (warm-up discarded); spread "
        "(min..max s): " + "; ".join(f"{k} {v}" for k, v in report.data["spread"].items())
        + ".",
        f"Verifier: {os.cpu_count()} CPUs. A sandboxed run costs one bubblewrap start (as "
        "root: bwrap, setpriv, a second unprivileged bwrap), one Python start and the "
        "driver's imports, then one fork per script; the plain baseline pays a Python start "
        "and the imports per script, so with 4 scripts and fewer than 4 cores it is bounded "
        "below by four starts' CPU time divided by the cores.",
    ]
    remove(work)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("verifier time per rollout in the sandbox")
    ap.add_argument("--rounds", type=int, help="interleaved rounds")
    a = ap.parse_args(argv)
    setup_run(a)
    a.rounds = a.rounds or (2 if a.quick else 30)
    emit(run(a))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
