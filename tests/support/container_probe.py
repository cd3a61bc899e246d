"""Run inside a container by tests/worldenv/test_sandbox_container.py (as root, the
checkout on PYTHONPATH): the container sandbox's cases, each one's outcome printed as one
JSON object on the last line of stdout, for the test on the host to judge."""

from __future__ import annotations

import json
import os
import resource
import tempfile
import time
from pathlib import Path

from gates.verifier import run_verifier
from worldenv.errors import SandboxError
from worldenv.sandbox.choice import default_sandbox
from worldenv.sandbox.container import ContainerSandbox
from worldenv.sandbox.contract import Bind, Limits
from worldenv.sandbox.policy import sandbox_ids


def _world(root: Path, text: str) -> Path:
    for part in ("services", "workspace", "apps"):
        (root / part).mkdir(parents=True)
    (root / "workspace" / "note.txt").write_text(text)
    for path in [root.parent, root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


def main() -> None:
    out: dict[str, object] = {}
    box = default_sandbox()
    out["backend"] = type(box).__name__
    assert isinstance(box, ContainerSandbox)
    ws = Path(tempfile.mkdtemp(prefix="ws-"))
    plain = box.run("id -u; pwd; echo $HOME; echo made > f; env | sort", ws)
    out["plain"] = [plain.exit_code, plain.stdout, (ws / "f").read_text()]
    out["sandbox_uid"] = sandbox_ids()[0]
    left = box.run("setsid sleep 300 & sleep 300 & echo started", ws)
    out["left"] = [left.exit_code, left.stdout, left.seconds]
    out["timeout"] = box.run("sleep 30", ws, Limits(timeout_s=1)).killed_reason
    flood = box.run("yes", ws)
    out["flood"] = [flood.killed_reason, flood.truncated]
    memory = box.run("python3 -c 'x = bytearray(1 << 30)'", ws, Limits(memory_mib=256))
    out["memory"] = memory.killed_reason
    out["file_size"] = box.run("head -c 4M /dev/zero > big", ws,
                               Limits(max_file_mib=1)).killed_reason
    limits = box.run("ulimit -u; ulimit -t; ulimit -v; ulimit -f; ulimit -n; ulimit -c", ws,
                     Limits(cpu_s=7, memory_mib=300, max_file_mib=3))
    out["rlimits"] = limits.stdout.split()
    own = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    out["own_nproc"] = "unlimited" if own == resource.RLIM_INFINITY else str(own)
    time.sleep(0.2)
    out["sandbox_user_processes"] = sorted(
        int(p.name) for p in Path("/proc").iterdir()
        if p.name.isdigit() and p.stat().st_uid == sandbox_ids()[0])
    secret = Path(tempfile.mkdtemp(prefix="private-")) / "answer.txt"
    secret.write_text("the answer")
    bound = box.run("cat /answer.txt; echo x > /answer.txt", ws, binds=[
        Bind(secret, "/answer.txt")])
    out["bind"] = [bound.stdout, bound.exit_code, os.path.lexists("/answer.txt"),
                   os.path.lexists("/workspace")]
    os.mkdir("/taken")
    try:
        box.run("true", ws, binds=[Bind(secret, "/taken")])
    except SandboxError as exc:
        out["taken"] = str(exc)
    verifier = Path(tempfile.mkdtemp(prefix="verifier-"))
    (verifier / "check.py").write_text(
        "import awsdk\n"
        "ws = awsdk.worlds()\n"
        "awsdk.result(changed=awsdk.file_text(ws.w, 'note.txt') == 'after'\n"
        "             and awsdk.file_text(ws.w0, 'note.txt') == 'before',\n"
        "             answered=ws.answer == '42')\n")
    for path in (verifier, verifier / "check.py"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    w0 = _world(Path(tempfile.mkdtemp()) / "w0", "before")
    w = _world(Path(tempfile.mkdtemp()) / "w", "after")
    verdict = run_verifier(verifier, w0, w, "42")
    out["verdict"] = [verdict.passed, verdict.errors, [c.name for c in verdict.checks]]
    closed = Path(tempfile.mkdtemp()) / "w"
    closed.mkdir()
    try:
        box.run("true", ws, binds=[Bind(closed, "/w")])
    except SandboxError as exc:
        out["closed"] = str(exc)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
