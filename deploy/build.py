"""Builds the project's images from the local base (deploy/build-base.sh), with no image
registry: ``agent-worlds:<key>`` (the gateway serving a store) and
``agent-worlds-worker:<key>`` (an RL worker node), each tagged by a hash of everything it
is made of (the base's tag, the Dockerfile, the lock file, the project's sources), so an
existing tag is the image these inputs make and the build is skipped.

pip gets the project and its dependencies into the image from wheels made on this host: the
project's own wheel, built from a copy of its sources, and its dependencies' wheels at the
exact versions of deploy/<target>.lock (kept under the docker cache folder by the lock's
hash, so only a changed lock downloads). ``docker build`` itself then runs with no network
and installs with ``--no-index``: a lock that misses a dependency fails the build.

    python3 deploy/build.py gateway|worker   build if missing; print the tag
    python3 deploy/build.py --tag gateway    print the tag only
    python3 deploy/build.py --lock gateway   rewrite deploy/gateway.lock from PyPI
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CACHE = Path(os.environ.get("WORLDCTL_DOCKER_CACHE",
                            Path.home() / ".cache" / "agent-worlds" / "docker"))
# What the project's wheel is made of (setup.py's packages, its metadata, the migrations).
SOURCES = ("setup.py", "pyproject.toml", "README.md", "migrations", "worldstore", "replay",
           "worldenv", "worldllm", "gates", "packs", "synth", "rl", "eval", "worldctl",
           "awmbridge")
TARGETS = {"gateway": ("agent-worlds", "envs"), "worker": ("agent-worlds-worker", "rl")}


def run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    kwargs.setdefault("check", True)
    return subprocess.run(argv, text=True, **kwargs)  # type: ignore[call-overload]


def base_tag(*, build: bool) -> str:
    argv = ["bash", str(HERE / "build-base.sh"), *([] if build else ["--key"])]
    return run(argv, stdout=subprocess.PIPE).stdout.strip().splitlines()[-1]


def source_files() -> list[str]:
    """The project's source files, relative to the root, sorted: git's view (tracked and
    untracked but not ignored) in a checkout, else every file but caches."""
    if (ROOT / ".git").exists():
        listed = run(["git", "-C", str(ROOT), "ls-files", "-z", "-co", "--exclude-standard",
                      "--", *SOURCES], stdout=subprocess.PIPE).stdout.split("\0")
        return sorted({f for f in listed if f and (ROOT / f).is_file()})
    found = []
    for top in SOURCES:
        path = ROOT / top
        if path.is_file():
            found.append(top)
        for folder, dirs, files in os.walk(path):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            found += [str(Path(folder, f).relative_to(ROOT)) for f in files
                      if not f.endswith(".pyc")]
    return sorted(found)


def image_tag(target: str, base: str) -> str:
    name, _ = TARGETS[target]
    digest = hashlib.sha256()
    for part in (base.encode(), (HERE / "Dockerfile").read_bytes(),
                 (HERE / f"{target}.lock").read_bytes()):
        digest.update(hashlib.sha256(part).digest())
    for rel in source_files():
        digest.update(rel.encode() + b"\0" + hashlib.sha256((ROOT / rel).read_bytes()).digest())
    return f"{name}:{digest.hexdigest()[:16]}"


def project_wheel(into: Path) -> Path:
    """The project's wheel, built from a copy of its sources (a stale build/ folder in the
    checkout would otherwise slip old modules into it)."""
    with tempfile.TemporaryDirectory(prefix="agent-worlds-src-") as src:
        for rel in source_files():
            (Path(src) / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, Path(src) / rel)
        run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check",
             "--no-deps", "--no-build-isolation", "-w", str(into), src])
    (wheel,) = into.glob("agent_worlds-*.whl")
    return wheel


def dependency_wheels(target: str) -> Path:
    """The wheels of deploy/<target>.lock, downloaded once per lock into the cache."""
    lock = HERE / f"{target}.lock"
    folder = CACHE / f"wheels-{target}-{hashlib.sha256(lock.read_bytes()).hexdigest()[:16]}"
    if (folder / "ready").is_file():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check",
         "--no-deps", "-w", str(folder), "-r", str(lock)])
    (folder / "ready").write_text("ok\n")
    return folder


def write_lock(target: str) -> None:
    """Resolve the project's dependencies with the target's extra (pip's resolver, against
    the indexes pip is configured with) and write them pinned to deploy/<target>.lock."""
    _, extra = TARGETS[target]
    with tempfile.TemporaryDirectory() as tmp:
        wheel = project_wheel(Path(tmp))
        report = Path(tmp) / "report.json"
        run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
             "--dry-run", "--ignore-installed", "--report", str(report),
             f"{wheel}[{extra}]"])
        items = json.loads(report.read_text())["install"]
    pins = sorted(f"{i['metadata']['name'].lower()}=={i['metadata']['version']}"
                  for i in items if i["metadata"]["name"] != "agent-worlds")
    (HERE / f"{target}.lock").write_text(
        f"# {target}: agent-worlds[{extra}]'s dependencies, pinned "
        f"(python3 deploy/build.py --lock {target})\n" + "\n".join(pins) + "\n")


def build(target: str) -> str:
    base = base_tag(build=True)
    tag = image_tag(target, base)
    CACHE.mkdir(parents=True, exist_ok=True)
    # One build of a target at a time on this machine; whoever waited finds it made.
    with open(CACHE / f"build-{target}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if run(["docker", "image", "inspect", tag], stdout=subprocess.DEVNULL,
               stderr=subprocess.DEVNULL, check=False).returncode != 0:
            _build(target, base, tag)
    return tag


def _build(target: str, base: str, tag: str) -> None:
    _, extra = TARGETS[target]
    with tempfile.TemporaryDirectory(prefix="agent-worlds-image-") as tmp:
        context = Path(tmp)
        shutil.copy2(HERE / "Dockerfile", context / "Dockerfile")
        shutil.copytree(dependency_wheels(target), context / "wheels",
                        ignore=shutil.ignore_patterns("ready"))
        wheel = project_wheel(context / "project")
        run(["docker", "build", "-q", "--network", "none", "--target", target,
             "--build-arg", f"BASE={base}", "--build-arg", f"EXTRA={extra}",
             "--build-arg", f"WHEEL={wheel.name}", "-t", tag, str(context)],
            stdout=sys.stderr, env={**os.environ, "DOCKER_BUILDKIT": "0"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", choices=sorted(TARGETS))
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--tag", action="store_true", help="print the tag only")
    group.add_argument("--lock", action="store_true", help="rewrite the target's lock file")
    args = parser.parse_args()
    if args.lock:
        write_lock(args.target)
    elif args.tag:
        print(image_tag(args.target, base_tag(build=False)))
    else:
        print(build(args.target))


if __name__ == "__main__":
    main()
