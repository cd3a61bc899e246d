"""AWM's own package (``agent-world-model``, in the ``awm`` peer venv of
``tests/support/peer_venv.py``) driven from the tests, in subprocesses of that venv:

- ``run_agent``: AWM's agent as its command line runs it (``awm agent --task ... --mcp_url
  ... --vllm_url ... --model ...``): its own MCP client (mcp-agent over streamable HTTP) and
  its own OpenAI client. AWM's agent reads tool calls from the model's text, one
  ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` per turn (``list_tools``, then
  ``call_tool`` with ``tool_name`` and ``arguments`` as a JSON string), and stops at a
  reply with none; ``agent_rules`` scripts such a model for ``tests/support/llm_server.py``.
- ``awm_verdicts``: AWM's verifier code run by AWM's own executor,
  ``awm.core.verifier.execute_verification_code`` (the namespace it gives the code, the
  initial database made read-only, its checks of a code-mode result). That executor is
  AWM's self-test of generated code and passes the initial database as the final one
  too; a three-line shim appended to the verifier's code binds the real final database
  (and, in code mode, the final answer) and calls AWM's function unchanged.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support import peer_venv

# Ends every scripted reply, so the next rule can key on how far the episode has come.
STEP_MARK = "[awm step {}]"


def awm_environment() -> dict[str, str]:
    """The peer's environment, writing bytecode: the venv is installed without it and AWM's
    imports (mcp-agent pulls in scikit-learn and OpenTelemetry) take several times longer
    compiled from source on every run than from a cache written once."""
    env = peer_venv.environment()
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONFAULTHANDLER"] = "1"
    return env


def tool_call(name: str, arguments: dict[str, Any] | None) -> str:
    """One tool call in the text form AWM's agent parses (``awm.core.agent.parse_tool_calls``)."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def call_tool(tool: str, arguments: dict[str, Any]) -> str:
    """AWM's ``call_tool`` meta-call: the tool's arguments as a JSON string, as AWM's
    system prompt asks of the model."""
    return tool_call("call_tool", {"tool_name": tool, "arguments": json.dumps(arguments)})


def agent_rules(turns: Sequence[str], final: str) -> list[dict[str, Any]]:
    """A model that answers AWM's agent with `turns` (one tool call each), in order, then
    `final` (no tool call: AWM's agent stops there)."""
    replies = [*turns, final]
    rules: list[dict[str, Any]] = []
    for i in reversed(range(len(replies))):
        when = {"any_contains": STEP_MARK.format(i - 1)} if i else {"last_role": "user"}
        rules.append({"when": when,
                      "reply": {"content": f"{replies[i]}\n{STEP_MARK.format(i)}"}})
    return rules


DONE = "Agent execution complete."  # AWM's agent logs it as its last line
EXIT_GRACE_S = 15


@dataclass(frozen=True)
class AgentRun:
    """How ``awm agent`` ended: its exit status (negative: the signal that stopped it),
    whether it had to be stopped after logging that it was done, and its output."""

    returncode: int
    hung_at_exit: bool
    stdout: str
    stderr: str


def run_agent(python: Path, *, task: str, mcp_url: str, llm_url: str, model: str,
              cwd: Path, max_iterations: int, timeout: float = 180) -> AgentRun:
    """``awm agent`` (AWM's console script of the venv of `python`) on one task; its
    output goes through files in `cwd`: a process the agent leaves behind can hold a pipe
    open after the agent has exited, and reading one to its end would then wait for it."""
    argv = [str(python.parent / "awm"), "agent", "--task", task, "--mcp_url", mcp_url,
            "--vllm_url", llm_url, "--model", model, "--max_iterations", str(max_iterations),
            "--temperature", "0"]
    out, err = cwd / "awm-agent.out", cwd / "awm-agent.err"
    hung_at_exit = False
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = subprocess.Popen(argv, cwd=cwd, env=awm_environment(), stdout=stdout,
                                stderr=stderr, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            if DONE in err.read_text(errors="replace"):
                # Done: what is left is asyncio.run's cleanup, which at times waits on a
                # task of mcp-agent's session that never ends (seen through this gateway
                # only, after a write; the agent's work is complete by then).
                try:
                    proc.wait(EXIT_GRACE_S)
                except subprocess.TimeoutExpired:
                    hung_at_exit = True
                break
            time.sleep(0.2)
        if proc.poll() is None:
            proc.send_signal(signal.SIGABRT)  # faulthandler: every thread's stack, to stderr
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        code = proc.wait()
    return AgentRun(code, hung_at_exit, out.read_text(errors="replace"),
                    err.read_text(errors="replace"))


@dataclass(frozen=True)
class VerifyJob:
    """One AWM verifier run: its code verbatim, the function it defines, AWM's mode
    (``code``: ``verify_task_completion`` -> complete/others; ``sql``: ``verify_task`` ->
    a dict for the judge), the two databases and, in code mode, the final answer."""

    code: str
    function: str
    mode: str
    initial: Path
    final: Path
    answer: str | None = None


VERIFY_DRIVER = r'''
import json, os, shutil, sys, tempfile

from awm.core.verifier import VerificationMode, execute_verification_code

SHIM = """

def peer_final_world(initial_db_path, final_db_path, final_answer=None):
    return {function}(initial_db_path, {final!r}{answer})
"""

out = []
for job in json.load(sys.stdin):
    with tempfile.TemporaryDirectory() as tmp:
        # AWM's executor makes the initial database read-only for the run: copies, so the
        # worlds the project produced are left as they are.
        initial = shutil.copy(job["initial"], os.path.join(tmp, "initial.db"))
        final = shutil.copy(job["final"], os.path.join(tmp, "final.db"))
        mode = VerificationMode(job["mode"])
        answer = f", {job['answer']!r}" if mode is VerificationMode.code else ""
        code = job["code"] + SHIM.format(function=job["function"], final=final,
                                         answer=answer)
        out.append(execute_verification_code(code, "peer_final_world", initial, mode))
print("AWM-VERDICTS " + json.dumps(out, default=str))
'''


def awm_verdicts(python: Path, jobs: Sequence[VerifyJob], *, timeout: float = 180
                 ) -> list[dict[str, Any]]:
    """What AWM's ``execute_verification_code`` returns for each job (one process for all):
    ``{"execution_status": "success", "result": ...}`` or ``{"execution_status":
    "error", "error_message": ...}``."""
    payload = json.dumps([{"code": j.code, "function": j.function, "mode": j.mode,
                           "initial": str(j.initial), "final": str(j.final),
                           "answer": j.answer} for j in jobs])
    done = subprocess.run([str(python), "-c", VERIFY_DRIVER], input=payload,
                          env=awm_environment(), capture_output=True, text=True,
                          timeout=timeout, check=False)
    line = next((x for x in done.stdout.splitlines() if x.startswith("AWM-VERDICTS ")), None)
    assert done.returncode == 0 and line is not None, (
        f"AWM's verifier driver failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    found: list[dict[str, Any]] = json.loads(line.removeprefix("AWM-VERDICTS "))
    return found
