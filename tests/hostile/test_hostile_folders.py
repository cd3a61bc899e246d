"""Folders someone hands over are data (hardening, class 5): one corpus of attacks, swept
over every command that takes a folder.

Each case plants one thing in a folder a command is given (a run folder, a pack, a pack
archive, a checkout, a task folder, an AWM directory, ``--out``): a symlink to a file
outside, a symlinked folder, a dangling symlink, a FIFO where a file goes, a hardlink of
an outside file where a file is written, a file where a folder goes and the other way
round, ``..`` and clashing names in archives and JSON. Then it runs the real command and
requires, whatever the command: exit 2 with one ``error:`` line naming the path, or
success without following; no file outside the folder changed (bytes and mtimes of the
whole outside tree, before and after); nothing of the outside secret in the output; a
refused command wrote nothing (the handed-over folders compared entry by entry); and,
where a store is involved, the store unchanged (SQLite and PostgreSQL).

A FIFO read would block forever, so every command runs under an alarm.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import stat
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from packs.registry import load_pack
from replay.engine import Worlds
from synth.prompts import versions
from tests.support.asgi_server import served
from tests.support.cli_harness import invoke
from worldctl.ui import WorldsUI

ROOT = Path(__file__).resolve().parents[2]
DEMO = load_pack("demo")
TASK = "nordlys-delivery-checklist"  # on lars's world: the only one the stores import
SECRET = b"SECRET-7f3a9c-outside-the-folder"


# --- what the cases look at --------------------------------------------------------------


def snapshot(top: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry under `top` by lstat: kind, bytes or link target, mtime (never
    following a link)."""
    found: dict[str, tuple[Any, ...]] = {}
    if not top.exists() and not top.is_symlink():
        return found
    pending = [top]
    while pending:
        here = pending.pop()
        for entry in os.scandir(here):
            path = Path(entry.path)
            st = path.lstat()
            rel = str(path.relative_to(top))
            if stat.S_ISDIR(st.st_mode):
                found[rel] = ("dir",)
                pending.append(path)
            elif stat.S_ISLNK(st.st_mode):
                found[rel] = ("link", os.readlink(path))
            elif stat.S_ISREG(st.st_mode):
                found[rel] = ("file", path.read_bytes(), st.st_mtime_ns)
            else:
                found[rel] = ("special", stat.S_IFMT(st.st_mode))
    return found


def store_state(location: str) -> tuple[Any, ...]:
    with Worlds.open(location) as worlds:
        personas = [(p.persona, p.n_days) for p in worlds.store.personas()]
        episodes = sorted(e.episode_id for e in worlds.store.episodes())
    return tuple(personas), tuple(episodes)


class _Blocked(Exception):
    pass


@contextmanager
def alarm(seconds: int = 60) -> Iterator[None]:
    """A command that opens a FIFO blocks forever: fail it instead."""
    def ring(_signum: int, _frame: object) -> None:
        raise _Blocked(f"the command blocked for {seconds} s (opened a FIFO?)")

    before = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)


@dataclass
class Area:
    """One case's ground: the outside tree it must not touch, the folders it hands over."""

    tmp: Path
    outside: Path
    store: str

    def run(self, *args: str) -> Result:
        with alarm():
            return invoke("--store", self.store, *args,
                          env={"WORLDCTL_PACKS": str(self.tmp / "packs")})


def make_outside(tmp: Path) -> Path:
    outside = tmp / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "victim.txt").write_bytes(b"the victim's own bytes\n")
    (outside / "secret.txt").write_bytes(SECRET + b"\n")
    (outside / "dir" / "kept.txt").write_bytes(b"kept\n")
    return outside


def check(area: Area, result: Result, handed: list[Path], before: dict[Path, Any],
          outside_before: dict[str, Any], names: tuple[str, ...], *,
          may_succeed: bool, store_before: tuple[Any, ...] | None = None) -> None:
    """What every case requires (see the module docstring)."""
    assert "Traceback" not in result.output, result.output
    assert snapshot(area.outside) == outside_before, "a file outside the folder changed"
    assert SECRET.decode() not in result.output
    if result.exit_code == 2:
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        assert any(name in lines[0] for name in names), (names, lines[0])
        for folder in handed:
            assert snapshot(folder) == before[folder], f"a refused command wrote in {folder}"
        if store_before is not None:
            assert store_state(area.store) == store_before, "a refused command stored"
    else:
        assert may_succeed, f"expected a refusal, got exit {result.exit_code}: {result.output}"
        assert result.exit_code == 0, result.output
        for folder in handed:
            for rel, entry in snapshot(folder).items():
                assert entry[0] != "file" or SECRET not in entry[1], f"{rel} holds the secret"


# --- attacks ------------------------------------------------------------------------------


def _clear(path: Path) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        path.unlink()


def symlink_to(target: str) -> Callable[[Path, Path], None]:
    def plant(path: Path, outside: Path) -> None:
        _clear(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(outside / target, path)
    return plant


def fifo(path: Path, _outside: Path) -> None:
    _clear(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)


def hardlink(path: Path, outside: Path) -> None:
    _clear(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.link(outside / "victim.txt", path)


def file_for_dir(path: Path, _outside: Path) -> None:
    _clear(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"a file where a folder goes\n")


def dir_for_file(path: Path, _outside: Path) -> None:
    _clear(path)
    (path / "inner").mkdir(parents=True)


ATTACKS: dict[str, Callable[[Path, Path], None]] = {
    "symlink-file": symlink_to("victim.txt"),
    "symlink-secret": symlink_to("secret.txt"),
    "symlink-dir": symlink_to("dir"),
    "dangling": symlink_to("made-by-the-command"),
    "fifo": fifo,
    "hardlink": hardlink,
    "file-for-dir": file_for_dir,
    "dir-for-file": dir_for_file,
}


# --- the folders handed over, made once by the real commands -----------------------------


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    top = tmp_path_factory.mktemp("hostile-base")
    store = str(top / "store")
    assert invoke("--store", store, "import", str(DEMO.worlds[0])).exit_code == 0
    run = top / "run"
    made = invoke("--store", store, "eval", "run", str(DEMO.task_dir(TASK)), "--agent",
                  "scripted:nothing", "-k", "1", "--out", str(run))
    assert made.exit_code == 0, made.output
    assert invoke("eval", "report", str(run)).exit_code == 0
    checkout = top / "checkout"
    assert invoke("--store", store, "checkout", "lars@3", str(checkout)).exit_code == 0
    archive = top / "demo.tar.gz"
    assert invoke("--store", store, "pack", "export", "demo", str(archive)).exit_code == 0
    return {"store": Path(store), "run": run, "checkout": checkout, "archive": archive}


@pytest.fixture
def area(tmp_path: Path, base: dict[str, Path]) -> Area:
    """A case's ground over the module's store (for commands that only read it)."""
    (tmp_path / "packs").mkdir()
    return Area(tmp_path, make_outside(tmp_path), str(base["store"]))


def copy_of(base: dict[str, Path], name: str, area: Area) -> Path:
    dest = area.tmp / name
    shutil.copytree(base[name], dest, symlinks=True)
    return dest


def sweep(area: Area, handed: list[Path], args: list[str], names: tuple[str, ...], *,
          may_succeed: bool, store: bool = False) -> Result:
    before = {folder: snapshot(folder) for folder in handed}
    outside_before = snapshot(area.outside)
    store_before = store_state(area.store) if store else None
    result = area.run(*args)
    check(area, result, handed, before, outside_before, names, may_succeed=may_succeed,
          store_before=store_before)
    return result


# --- eval report and compare: a run folder --------------------------------------------------

# (what is planted, relative to the run folder; attacks; may the command succeed?)
REPORT_CASES = [
    *[("trials.csv", a, a == "hardlink") for a in
      ("symlink-file", "dangling", "fifo", "hardlink", "dir-for-file")],
    *[("report.md", a, a == "hardlink") for a in ("symlink-file", "fifo", "hardlink")],
    *[("plots", a, False) for a in ("symlink-dir", "file-for-dir")],
    *[("plots/pass_k.svg", a, a == "hardlink")
      for a in ("symlink-file", "dangling", "hardlink")],
    *[("results.json", a, False) for a in ("symlink-secret", "fifo", "dir-for-file")],
]


@pytest.mark.parametrize(("planted", "attack", "ok"), REPORT_CASES,
                         ids=[f"{p}-{a}" for p, a, _ in REPORT_CASES])
def test_eval_report(area: Area, base: dict[str, Path], planted: str, attack: str,
                     ok: bool) -> None:
    run = copy_of(base, "run", area)
    if attack == "symlink-secret":  # a results file of the attacker's, outside
        (area.outside / "secret.txt").write_bytes((run / "results.json").read_bytes())
    ATTACKS[attack](run / planted, area.outside)
    sweep(area, [run], ["eval", "report", str(run)], (planted.split("/")[0],),
          may_succeed=ok)


@pytest.mark.parametrize("attack", ["symlink-secret", "fifo", "dir-for-file"])
def test_eval_compare(area: Area, base: dict[str, Path], attack: str) -> None:
    first, second = copy_of(base, "run", area), area.tmp / "second"
    shutil.copytree(first, second)
    ATTACKS[attack](second / "results.json", area.outside)
    out = area.tmp / "cmp"
    out.mkdir()
    sweep(area, [first, second, out], ["eval", "compare", str(first), str(second), "--md",
                                       str(out / "c.md"), "--html", str(out / "c.html")],
          ("results.json",), may_succeed=False)


# --- eval run: resuming a run folder (a store is involved) ----------------------------------


def _trial_file(run: Path) -> Path:
    (path,) = (run / "trials").iterdir()
    return path


def _forge(path: Path, **changes: Any) -> None:
    data = json.loads(path.read_bytes())
    data["trial"].update(changes)
    path.write_text(json.dumps(data))


def _forged_success(run: Path, _outside: Path) -> None:
    trial = _trial_file(run)
    data = json.loads(trial.read_bytes())
    _forge(trial, success=True, V=1, reward=1.0, checks=[True] * len(data["trial"]["checks"]))


def _unknown_episode(run: Path, _outside: Path) -> None:
    _forged_success(run, _outside)
    _forge(_trial_file(run), episode_id="0" * 32)


def _renamed_trial(run: Path, _outside: Path) -> None:
    trial = _trial_file(run)
    _forged_success(run, _outside)
    trial.rename(trial.with_name("f" * 32 + ".json"))


def _other_task(run: Path, _outside: Path) -> None:
    _forged_success(run, _outside)
    data = json.loads(_trial_file(run).read_bytes())
    data["task_id"] = "sagene-easter-quote"
    _trial_file(run).write_text(json.dumps(data))


def _planted(rel: str, attack: str) -> Callable[[Path, Path], None]:
    def plant(run: Path, outside: Path) -> None:
        if attack == "symlink-dir":  # the run's own trials, moved outside behind a link
            shutil.copytree(run / rel, outside / "dir" / "trials")
            shutil.rmtree(run / rel)
            os.symlink(outside / "dir" / "trials", run / rel)
            return
        ATTACKS[attack](run / rel, outside)
    return plant


# name -> (plant, may succeed)
RESUME_CASES: dict[str, tuple[Callable[[Path, Path], None], bool]] = {
    "forged-success": (_forged_success, True),
    "unknown-episode": (_unknown_episode, True),
    "renamed-trial": (_renamed_trial, True),
    "other-task": (_other_task, True),
    "trials-symlink-dir": (_planted("trials", "symlink-dir"), False),
    "trials-file-for-dir": (_planted("trials", "file-for-dir"), False),
    "trial-fifo": (lambda run, o: fifo(_trial_file(run), o), True),
    "trial-symlink": (lambda run, o: symlink_to("victim.txt")(_trial_file(run), o), True),
    "run-json-symlink": (_planted("run.json", "symlink-file"), False),
    "run-json-fifo": (_planted("run.json", "fifo"), False),
    "results-symlink": (_planted("results.json", "symlink-file"), False),
    "results-hardlink": (_planted("results.json", "hardlink"), True),
}


def test_eval_run_resumes_only_what_the_store_backs(store_location: str,
                                                    tmp_path: Path) -> None:
    """On SQLite and PostgreSQL: trial files are claims the store must back, and a run
    folder's links are never followed."""
    assert invoke("--store", store_location, "import", str(DEMO.worlds[0])).exit_code == 0
    task = str(DEMO.task_dir(TASK))
    args = ["eval", "run", task, "--agent", "scripted:nothing", "-k", "1", "--json"]
    made = tmp_path / "made"
    first = invoke("--store", store_location, *args, "--out", str(made))
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout)["metrics"]["success_rate"] == 0.0
    # A real, stored, successful episode of the same task, by another agent: its trial
    # file, re-addressed to this run, must not count for the agent that failed.
    passing = tmp_path / "passing"
    second = invoke("--store", store_location, *args[:4], "scripted:reference", *args[5:],
                    "--out", str(passing))
    assert json.loads(second.stdout)["metrics"]["success_rate"] == 1.0

    def other_agent(run: Path, _outside: Path) -> None:
        mine, theirs = _trial_file(run), _trial_file(passing)
        data = json.loads(theirs.read_bytes())
        data["run_id"] = json.loads(mine.read_bytes())["run_id"]
        mine.write_text(json.dumps(data))

    failures = []
    cases = {**RESUME_CASES, "other-agent": (other_agent, True)}
    for name, (plant, ok) in cases.items():
        case = tmp_path / name
        case.mkdir()
        area = Area(case, make_outside(case), store_location)
        run = case / "run"
        shutil.copytree(made, run)
        plant(run, area.outside)
        result = sweep(area, [run], [*args, "--out", str(run)],
                       ("run.json", "results.json", "trials"), may_succeed=ok, store=True)
        if result.exit_code == 0:
            rate = json.loads(result.stdout)["metrics"]["success_rate"]
            if rate != 0.0:
                failures.append(f"{name}: success rate {rate} from a forged trial file")
    assert not failures, failures


# --- synth replay, status, funnel: a synthesis run folder -----------------------------------


def _synth_run(top: Path, commands: list[dict[str, Any]]) -> Path:
    run = top / "synth-run"
    (run / "inputs").mkdir(parents=True)
    (run / "recordings").mkdir()
    seeds = b'{"name": "seed"}\n'
    name = f"inputs/seeds-{hashlib.sha256(seeds).hexdigest()[:16]}.jsonl"
    (run / name).write_bytes(seeds)
    config = {"format": 1, "name": "synth-run", "model": "m", "max_attempts": 5,
              "prompts": versions(),
              "commands": [{"kind": c.pop("kind"), "args": {"seeds": name, **c}}
                           for c in commands]}
    (run / "run.json").write_text(json.dumps(config))
    return run


SYNTH_CASES: dict[str, tuple[list[dict[str, Any]], str | None, str, str]] = {
    # name: (commands, planted rel, attack, a name the error must give)
    "seeds-dotdot": ([{"kind": "scenarios", "n": 1, "seeds": "../outside/secret.txt"}],
                     None, "", "seeds"),
    "seeds-absolute": ([{"kind": "scenarios", "n": 1, "seeds": "/etc/passwd"}], None, "",
                       "seeds"),
    "persona-dotdot": ([{"kind": "plan", "persona": "../../outside", "day": 1}], None, "",
                       "persona"),
    "kind-unknown": ([{"kind": "shell", "n": 1}], None, "", "shell"),
    "seeds-symlink": ([{"kind": "scenarios", "n": 1}], "SEEDS", "symlink-secret", "seeds-"),
    "seeds-fifo": ([{"kind": "scenarios", "n": 1}], "SEEDS", "fifo", "seeds-"),
    "recordings-symlink": ([{"kind": "scenarios", "n": 1}], "recordings", "symlink-dir",
                           "recordings"),
    "run-json-symlink": ([{"kind": "scenarios", "n": 1}], "run.json", "symlink-secret",
                         "run.json"),
    "outputs-fifo": ([{"kind": "scenarios", "n": 1}], "outputs/x/y.json", "fifo", "y.json"),
}


# run.json's commands are read by replay only; links and FIFOs refuse every command
SYNTH_SWEEP = [(case, command) for case, (_c, planted, _a, _n) in SYNTH_CASES.items()
               for command in (("replay", "status", "funnel") if planted else ("replay",))]


@pytest.mark.parametrize(("case", "command"), SYNTH_SWEEP,
                         ids=[f"{case}-{command}" for case, command in SYNTH_SWEEP])
def test_synth_run_folders(area: Area, case: str, command: str) -> None:
    commands, planted, attack, name = SYNTH_CASES[case]
    run = _synth_run(area.tmp, [dict(c) for c in commands])
    if planted == "SEEDS":
        planted = next(str(p.relative_to(run)) for p in (run / "inputs").iterdir())
    if planted is not None:
        ATTACKS[attack](run / planted, area.outside)
    out = area.tmp / "replayed"
    extra = ["--out", str(out)] if command == "replay" else []
    result = sweep(area, [run], ["synth", command, str(run), *extra], (name,),
                   may_succeed=False)
    assert not out.exists(), "a refused replay left its --out"
    assert result.exit_code == 2


@pytest.mark.parametrize("attack", ["symlink-dir", "dangling", "file-for-dir"])
def test_synth_replay_out(area: Area, attack: str) -> None:
    run = _synth_run(area.tmp, [{"kind": "scenarios", "n": 1}])
    out = area.tmp / "out"
    ATTACKS[attack](out, area.outside)
    sweep(area, [run, area.tmp], ["synth", "replay", str(run), "--out", str(out)],
          ("out",), may_succeed=False)


# --- pack import: crafted archives (a store is involved) -----------------------------------


def _archive(path: Path, files: dict[str, bytes], *, manifest_files: dict[str, bytes] |
             None = None, extra: Callable[[tarfile.TarFile], None] | None = None) -> Path:
    listed = files if manifest_files is None else manifest_files
    manifest = {"name": "evil", "format": 1, "worlds": {},
                "files": {rel: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
                          for rel, data in listed.items()}}
    with tarfile.open(path, "w:gz") as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        add("manifest.json", json.dumps(manifest).encode())
        for rel, data in files.items():
            add(f"evil/{rel}", data)
        if extra is not None:
            extra(tar)
    return path


def _link_member(kind: bytes, name: str, target: str) -> Callable[[tarfile.TarFile], None]:
    def add(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        info.type = kind
        info.linkname = target
        tar.addfile(info)
    return add


LOG = (ROOT / "packs" / "demo" / "world" / "lars.jsonl").read_bytes()
ARCHIVES: dict[str, Callable[[Path, Path], Path]] = {
    "file-and-folder": lambda p, o: _archive(p, {"world": b"x", "world/lars.jsonl": LOG}),
    "folder-then-file": lambda p, o: _archive(p, {"world/lars.jsonl": LOG, "world": b"x"}),
    "dotdot-member": lambda p, o: _archive(p, {"../escape.txt": b"x"}),
    "dotdot-in-manifest": lambda p, o: _archive(p, {}, manifest_files={"../x": b"x"}),
    "absolute-member": lambda p, o: _archive(p, {}, extra=lambda t: t.addfile(
        tarfile.TarInfo(str(o / "victim.txt")), io.BytesIO(b""))),
    "symlink-member": lambda p, o: _archive(p, {}, manifest_files={"world": b""}, extra=(
        _link_member(tarfile.SYMTYPE, "evil/world", str(o / "dir")))),
    "hardlink-member": lambda p, o: _archive(p, {}, manifest_files={"pack.json": b""}, extra=(
        _link_member(tarfile.LNKTYPE, "evil/pack.json", str(o / "victim.txt")))),
    "fifo-member": lambda p, o: _archive(p, {}, manifest_files={"pack.json": b""}, extra=(
        _link_member(tarfile.FIFOTYPE, "evil/pack.json", ""))),
}


def test_pack_import_of_crafted_archives(store_location: str, tmp_path: Path) -> None:
    """On SQLite and PostgreSQL: each crafted archive is one error line, the store and the
    packs folder unchanged, nothing outside touched."""
    assert invoke("--store", store_location, "import", str(DEMO.worlds[0])).exit_code == 0
    for name, make in ARCHIVES.items():
        case = tmp_path / name
        (case / "packs").mkdir(parents=True)
        area = Area(case, make_outside(case), store_location)
        archive = make(case / "evil.tar.gz", area.outside)
        sweep(area, [case / "packs"], ["pack", "import", str(archive)],
              ("evil", str(archive)), may_succeed=False, store=True)


@pytest.mark.parametrize(("planted", "attack"), [
    ("world/lars.jsonl", "symlink-secret"), ("world/lars.jsonl", "fifo"),
    ("world", "symlink-dir"), ("pack.json", "symlink-secret"), ("pack.json", "fifo"),
    ("tasks/" + TASK, "symlink-dir"), ("tasks/" + TASK + "/task.json", "fifo"),
])
def test_pack_export_of_a_handed_over_pack(area: Area, planted: str, attack: str) -> None:
    pack = area.tmp / "packs" / "evil"
    shutil.copytree(ROOT / "packs" / "demo", pack,
                    ignore=shutil.ignore_patterns("__pycache__"))
    spec = json.loads((pack / "pack.json").read_text())
    (pack / "pack.json").write_text(json.dumps({**spec, "name": "evil"}))
    if attack == "symlink-dir" and planted == "world":
        shutil.copytree(pack / "world", area.outside / "dir" / "world")
        shutil.rmtree(pack / "world")
        os.symlink(area.outside / "dir" / "world", pack / "world")
    elif attack == "symlink-secret":
        (area.outside / "secret.txt").write_bytes((pack / planted).read_bytes()
                                                  .replace(b"Lars", SECRET))
        ATTACKS[attack](pack / planted, area.outside)
    else:
        ATTACKS[attack](pack / planted, area.outside)
    out = area.tmp / "out"
    out.mkdir()
    sweep(area, [pack, out], ["pack", "export", "evil", str(out / "evil.tar.gz")],
          (planted.split("/")[-1], "evil"), may_succeed=False)


@pytest.mark.parametrize("attack", ["symlink-file", "dangling", "hardlink"])
def test_pack_export_over_a_planted_dest(area: Area, attack: str) -> None:
    out = area.tmp / "out"
    out.mkdir()
    ATTACKS[attack](out / "demo.tar.gz", area.outside)
    sweep(area, [], ["pack", "export", "demo", str(out / "demo.tar.gz")], ("demo",),
          may_succeed=True)


# --- checkouts: hash, diff and the web UI's diff --------------------------------------------


def _private_world(outside: Path, checkout: Path) -> None:
    """A private folder outside holding another world's databases, tables and all."""
    shutil.copytree(checkout / "services", outside / "dir" / "services")


CHECKOUT_CASES = [
    ("services", "symlink-dir"), ("services", "file-for-dir"), ("workspace", "symlink-dir"),
    ("services/shop.sqlite", "symlink-file"), ("services/shop.sqlite", "fifo"),
    ("services/shop.sqlite-wal", "symlink-secret"), ("services/shop.sqlite-wal", "fifo"),
    ("apps", "symlink-dir"),
]


@pytest.mark.parametrize("how", ["hash", "diff", "ui"])
@pytest.mark.parametrize(("planted", "attack"), CHECKOUT_CASES,
                         ids=[f"{p}-{a}" for p, a in CHECKOUT_CASES])
def test_checkouts(area: Area, base: dict[str, Path], planted: str, attack: str,
                   how: str) -> None:
    checkout = copy_of(base, "checkout", area)
    _private_world(area.outside, checkout)
    if attack == "symlink-dir" and planted == "services":
        shutil.rmtree(checkout / "services")
        os.symlink(area.outside / "dir" / "services", checkout / "services")
    else:
        ATTACKS[attack](checkout / planted, area.outside)
    before, outside_before = snapshot(checkout), snapshot(area.outside)
    if how == "ui":
        with Worlds.open(area.store) as worlds, served(WorldsUI(worlds)) as url, alarm():
            query = urllib.parse.urlencode({"a": "lars@3", "b": str(checkout)})
            try:
                with urllib.request.urlopen(f"{url}/diff?{query}", timeout=30) as answer:
                    status, body = answer.status, answer.read().decode()
            except urllib.error.HTTPError as exc:
                status, body = exc.code, exc.read().decode()
        assert status == 400, body[:500]
        assert planted.split("/")[0] in body or "not a world checkout" in body
        assert "orders" not in body and SECRET.decode() not in body
    else:
        args = ["hash", str(checkout)] if how == "hash" else ["diff", "lars@3",
                                                                 str(checkout)]
        result = area.run(*args)
        check(area, result, [checkout], {checkout: before}, outside_before,
              (planted.split("/")[0], planted.split("/")[-1]), may_succeed=False)
    assert snapshot(checkout) == before and snapshot(area.outside) == outside_before


# --- task folders, AWM directories, rl run folders -----------------------------------------

TASK_CASES = [("task.json", "symlink-secret"), ("task.json", "fifo"),
              ("solution.json", "symlink-file"), ("verifier", "symlink-dir"),
              ("verifier/extra.py", "fifo"), ("hint.md", "dangling")]


def _task_case(planted: str, attack: str) -> Callable[[Area], tuple[list[Path], list[str],
                                                                   tuple[str, ...]]]:
    def make(area: Area) -> tuple[list[Path], list[str], tuple[str, ...]]:
        task = area.tmp / "task"
        shutil.copytree(DEMO.task_dir(TASK), task,
                        ignore=shutil.ignore_patterns("__pycache__"))
        ATTACKS[attack](task / planted, area.outside)
        return ([task], ["eval", "run", str(task), "--agent", "scripted:nothing", "-k", "1",
                         "--out", str(area.tmp / "out")],
                (planted.split("/")[-1], planted.split("/")[0]))
    return make


def _awm_case(attack: str) -> Callable[[Area], tuple[list[Path], list[str],
                                                     tuple[str, ...]]]:
    def make(area: Area) -> tuple[list[Path], list[str], tuple[str, ...]]:
        awm = area.tmp / "awm"
        awm.mkdir()
        ATTACKS[attack](awm / "gen_scenario.jsonl", area.outside)
        return [awm], ["import-awm", str(awm)], ("gen_scenario.jsonl",)
    return make


def _out_case(attack: str) -> Callable[[Area], tuple[list[Path], list[str],
                                                     tuple[str, ...]]]:
    def make(area: Area) -> tuple[list[Path], list[str], tuple[str, ...]]:
        ATTACKS[attack](area.tmp / "out", area.outside)
        return [], ["eval", "run", str(DEMO.task_dir(TASK)), "--agent", "scripted:nothing",
                    "-k", "1", "--out", str(area.tmp / "out")], ("out",)
    return make


AWM = ROOT / "tests" / "fixtures" / "awm"
AWM_TASK = "library_loans_1-task-0"


def _tasks_out_case(planted: str, attack: str) -> Callable[[Area], tuple[
        list[Path], list[str], tuple[str, ...]]]:
    """import-awm --tasks-out with a link, a file or a foreign folder where it writes: the
    scenario is refused before its world is stored."""
    def make(area: Area) -> tuple[list[Path], list[str], tuple[str, ...]]:
        tasks = area.tmp / "tasks"
        target = tasks if planted == "." else tasks / planted
        if attack == "foreign":
            (target / "inner").mkdir(parents=True)
        else:
            ATTACKS[attack](target, area.outside)
        handed = [] if planted == "." else [tasks]
        return handed, ["import-awm", str(AWM), "--scenario", "library_loans_1",
                        "--tasks-out", str(tasks)], (target.name,)
    return make


def _demo_case(attack: str) -> Callable[[Area], tuple[list[Path], list[str],
                                                      tuple[str, ...]]]:
    """demo --checkout-dir planted: refused as checkout is, before the store is opened."""
    def make(area: Area) -> tuple[list[Path], list[str], tuple[str, ...]]:
        dest = area.tmp / "checkout-dir"
        if attack == "link-below":
            dest.mkdir()
            os.symlink(area.outside / "dir", dest / "services")
        else:
            ATTACKS[attack](dest, area.outside)
        handed = [dest] if attack == "link-below" else []
        return handed, ["demo", "--checkout-dir", str(dest)], ("checkout-dir",)
    return make


STORE_CASES = {**{f"task-{p}-{a}": _task_case(p, a) for p, a in TASK_CASES},
               **{f"awm-{a}": _awm_case(a) for a in ("symlink-secret", "fifo")},
               **{f"eval-out-{a}": _out_case(a) for a in ("dangling", "file-for-dir")},
               **{f"tasks-out-{p}-{a}": _tasks_out_case(p, a) for p, a in [
                   (".", "symlink-dir"), (".", "dangling"), (".", "file-for-dir"),
                   (AWM_TASK, "symlink-dir"), (AWM_TASK, "dangling"),
                   (AWM_TASK, "file-for-dir"), (AWM_TASK, "foreign")]},
               **{f"demo-{a}": _demo_case(a) for a in ("symlink-dir", "dangling",
                                                       "file-for-dir", "link-below")}}


def test_task_folders_awm_directories_and_out(store_location: str, tmp_path: Path) -> None:
    """On SQLite and PostgreSQL: task folders (through eval run), AWM directories (through
    import-awm), a planted --out, a planted import-awm --tasks-out and a planted demo
    --checkout-dir are refused with the store unchanged."""
    assert invoke("--store", store_location, "import", str(DEMO.worlds[0])).exit_code == 0
    for name, make in STORE_CASES.items():
        case = tmp_path / name
        (case / "packs").mkdir(parents=True)
        area = Area(case, make_outside(case), store_location)
        handed, args, names = make(area)
        sweep(area, [*handed, case / "packs"], args, names, may_succeed=False, store=True)
        assert not (case / "out").exists() or (case / "out").is_symlink() \
            or (case / "out").is_file(), name


@pytest.mark.parametrize("attack", ["symlink-dir", "dangling"])
def test_rl_run_folder_out(area: Area, attack: str) -> None:
    out = area.tmp / "rlrun"
    ATTACKS[attack](out, area.outside)
    sweep(area, [area.tmp / "packs"], ["rl", "config", "demo", "--no-sft", "--model",
                                       str(area.tmp / "nomodel"), "--out", str(out)],
          ("rlrun",), may_succeed=False)
    assert out.is_symlink()


@pytest.mark.parametrize("attack", ["symlink-dir", "dangling", "file-for-dir"])
def test_checkout_into_a_planted_dest(area: Area, attack: str) -> None:
    dest = area.tmp / "dest"
    ATTACKS[attack](dest, area.outside)
    sweep(area, [area.tmp / "packs"], ["checkout", "lars@3", str(dest)], ("dest",),
          may_succeed=False)


def test_awm_tasks_out(area: Area) -> None:
    """import-awm --tasks-out: a task folder planted as a link to a look-alike outside is
    not replaced through it (refused by name), and a planted `.<task>.old` link is removed
    as a link when the folder is replaced; the outside never changes. (The task folders
    are checked before the scenario's world is stored: see STORE_CASES.)"""
    area.store = str(area.tmp / "awm-store")
    awm = ROOT / "tests" / "fixtures" / "awm"
    task = "library_loans_1-task-0"
    look_alike = area.outside / "dir" / task
    look_alike.mkdir()
    (look_alike / "task.json").write_text(json.dumps({"task_id": task}))
    planted = area.tmp / "planted"
    planted.mkdir()
    os.symlink(look_alike, planted / task)
    result = sweep(area, [], ["import-awm", str(awm), "--tasks-out", str(planted)], (task,),
                   may_succeed=False)
    assert (planted / task).is_symlink()
    fresh = area.tmp / "fresh"
    assert area.run("import-awm", str(awm), "--tasks-out", str(fresh)).exit_code == 0
    os.symlink(area.outside / "dir", fresh / f".{task}.old")
    sweep(area, [], ["import-awm", str(awm), "--tasks-out", str(fresh)], (task,),
          may_succeed=True)
    assert not (fresh / f".{task}.old").exists() and (fresh / task / "task.json").is_file()
    assert result.exit_code == 2


# --- files and folders named with --out: rl dataset/sft, rl smoke -----------------------

RL_OUT_REFUSED = ["symlink-file", "symlink-secret", "dangling", "fifo", "dir-for-file",
                  "symlinked-folder"]
RL_OUT_CASES = [*[(c, a) for c in ("dataset", "sft") for a in RL_OUT_REFUSED],
                ("dataset", "hardlink")]  # sft: the module store holds no passing episode


@pytest.mark.parametrize(("command", "attack"), RL_OUT_CASES,
                         ids=[f"{c}-{a}" for c, a in RL_OUT_CASES])
def test_rl_parquet_out(area: Area, command: str, attack: str) -> None:
    """rl dataset/sft --out FILE: a link, FIFO or folder there, or a symlinked folder, is
    refused before anything is written; a hardlink is replaced by a new file (the file it
    shares bytes with outside never changes)."""
    folder = area.tmp / "o"
    folder.mkdir()
    out = folder / "out.parquet"
    if attack == "symlinked-folder":
        shutil.rmtree(folder)
        os.symlink(area.outside / "dir", folder)
    else:
        ATTACKS[attack](out, area.outside)
    args = ["rl", command, "demo", "--out", str(out)]
    if command == "dataset":
        args.append("--no-store-check")
    handed = [area.tmp / "packs"] + ([] if attack == "symlinked-folder" else [folder])
    result = sweep(area, handed, args, ("out.parquet", str(folder)),
                   may_succeed=attack == "hardlink")
    if attack == "hardlink":
        assert result.exit_code == 0 and out.stat().st_nlink == 1
        assert out.read_bytes().startswith(b"PAR1")


SMOKE_CASES = [("--env", ".", "symlink-dir"), ("--env", ".", "dangling"),
               ("--out", ".", "symlink-dir"), ("--out", ".", "dangling"),
               ("--out", ".", "file-for-dir"), ("--out", "launch.txt", "symlink-file"),
               ("--out", "trainer.log", "fifo"), ("--out", "summary.json", "dangling"),
               ("--out", "train.parquet", "dir-for-file"), ("--out", "store", "symlink-dir"),
               ("--out", "model", "dangling")]


@pytest.mark.parametrize(("option", "planted", "attack"), SMOKE_CASES,
                         ids=[f"{o[2:]}-{p}-{a}" for o, p, a in SMOKE_CASES])
def test_rl_smoke_folders(area: Area, option: str, planted: str, attack: str) -> None:
    """rl smoke --env/--out: a symlinked folder (dangling included) or a link where the
    run writes is refused before the environment is looked at or anything written (the
    training itself never starts here)."""
    folders = {"--env": area.tmp / "env", "--out": area.tmp / "run"}
    folder = folders[option]
    target = folder if planted == "." else folder / planted
    if planted != ".":
        folder.mkdir()
    ATTACKS[attack](target, area.outside)
    handed = [area.tmp / "packs"] + ([] if planted == "." else [folder])
    sweep(area, handed, ["rl", "smoke", "demo", "--env", str(folders["--env"]), "--out",
                         str(folders["--out"])], (target.name,), may_succeed=False)
    assert not (area.tmp / "env").exists() or (area.tmp / "env").is_symlink()


def test_rl_smoke_writes_new_files(area: Area) -> None:
    """The files the smoke run writes at the top of its folder are new files: a hardlink
    of an outside file there is replaced, never written through."""
    from rl.smoke import _write_new, check_run_dir

    run = area.tmp / "run"
    run.mkdir()
    outside_before = snapshot(area.outside)
    for name in ("launch.txt", "summary.json"):
        hardlink(run / name, area.outside)
        check_run_dir(run)
        _write_new(run / name, "the run's own\n")
        assert (run / name).read_text() == "the run's own\n"
    assert snapshot(area.outside) == outside_before
