"""This project checked against AWM's own package (``agent-world-model``, run in the ``awm``
peer venv; ``tests/support/awm_peer.py``), not against emulations of it:

- AWM's own agent (``awm agent``: its MCP client, its OpenAI client, its prompt and its
  text tool calls) works an imported AWM-1K world through the gateway serving AWM's bare
  tool names; the model is a loopback OpenAI-compatible server with scripted answers.
  Its calls work unchanged, the world changes as they say, and the gateway grades it.
- AWM's own verifier executor, run with AWM-1K's verifier code on the final worlds this
  project produces for the samples' tasks (passing and failing ones), gives the verdicts
  this project's verifier sandbox gives, and in sql mode the same evidence.

content_platform_1 has server code and fixture verifiers in AWM's formats
(``tests/fixtures/awm_tasks/content_platform_1``: the samples ship none for it);
e_commerce_33 has the samples' own verifiers and no server code, so its final worlds are
its database with a task's writes applied.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from awmbridge.importer import import_awm
from awmbridge.tasks import CODE_HELPER, CODE_SCRIPT, SQL_HELPER, SQL_SCRIPT, task_id_for
from gates.contract import Verdict
from gates.rollout import grade, open_task_instance, task_w0
from gates.served import load_served_tasks
from gates.task import Task, load_task
from gates.verifier import run_verifier
from replay import Worlds
from replay.layout import service_db
from tests.support import peer_venv
from tests.support.asgi_server import served
from tests.support.awm_peer import (
    DONE,
    VerifyJob,
    agent_rules,
    awm_verdicts,
    call_tool,
    run_agent,
    tool_call,
)
from tests.support.llm_server import serving
from worldenv.instances.instance import Environment
from worldenv.serving.gateway import Gateway

HERE = Path(__file__).resolve().parents[1]
SAMPLES = HERE / "fixtures" / "awm-1k-samples"  # AWM-1K's own files
VERIFIERS = HERE / "fixtures" / "awm_tasks" / "content_platform_1"
CP, EC = "content_platform_1", "e_commerce_33"
SERVICE = "awm"
KURZGESAGT = "Kurzgesagt – In a Nutshell"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both sample scenarios imported with their task folders: content_platform_1 with the
    fixture verifiers added to the samples' verifier files."""
    files = tmp_path_factory.mktemp("awm-peer-files")
    for name in ("gen_tasks.jsonl", "gen_db.jsonl", "gen_sample.jsonl", "gen_envs.jsonl"):
        shutil.copy(SAMPLES / name, files / name)
    for name in ("gen_verifier.jsonl", "gen_verifier.pure_code.jsonl"):
        lines = [(SAMPLES / name).read_text(encoding="utf-8").rstrip("\n"),
                 (VERIFIERS / name).read_text(encoding="utf-8").rstrip("\n")]
        (files / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    path = tmp_path_factory.mktemp("awm-peer") / "store"
    tasks_out = tmp_path_factory.mktemp("awm-peer-tasks")
    with Worlds.open(path) as worlds:
        report = import_awm(worlds, files, tasks_out=tasks_out)
        assert report.ok and {s.scenario for s in report.imported} == {CP, EC}, (
            report.as_dict())
    return {"path": path, "tasks_out": tasks_out}


@pytest.fixture(scope="module")
def worlds(store: dict[str, Any]) -> Iterator[Worlds]:
    with Worlds.open(store["path"]) as opened:
        yield opened


def task(store: dict[str, Any], scenario: str, index: int) -> Task:
    return load_task(Path(store["tasks_out"]) / task_id_for(scenario, index))


# --- AWM's agent through the gateway ------------------------------------------------------


def listed(name: str) -> str:
    """A tool's name as AWM's agent shows it to the model: mcp-agent prefixes it with the
    server's name (``mcp_server``) and AWM's listing with ``mcp_tool_``."""
    return f"mcp_tool_mcp_server_{name}"


@pytest.mark.peer("awm")
def test_awms_own_agent_works_an_imported_world_through_the_gateway(
        store: dict[str, Any], worlds: Worlds, tmp_path: Path) -> None:
    python = peer_venv.python("awm")
    the_task = task(store, CP, 0)
    turns = [tool_call("list_tools", None),
             call_tool(listed("search_channels"), {"query": "Kurzgesagt"}),
             call_tool(listed("subscribe_to_channel"), {"channel_id": 1})]
    final = f"You are now subscribed to {KURZGESAGT}."
    with Environment(worlds, bare_names=True) as env:
        gateway = Gateway(env, tasks=load_served_tasks(env, [str(store["tasks_out"])]))
        with served(gateway) as base, httpx2.Client(base_url=base, timeout=60) as rest, \
                serving(agent_rules(turns, final)) as llm:
            made = rest.post("/instances", json={"task": the_task.task_id, "answer": False})
            assert made.status_code == 201, made.text
            info = made.json()
            assert info["bare_names"] is True and info["tools"] == 34
            run = run_agent(python, task=the_task.spec.instruction,
                            mcp_url=base + info["mcp_url"], llm_url=llm.url,
                            model="awm-scripted", cwd=tmp_path, max_iterations=6, timeout=120)
            assert DONE in run.stderr, run.stderr[-4000:]
            assert run.returncode == 0 or run.hung_at_exit, run.stderr[-4000:]
            assert "Only executing first" not in run.stderr and "Error:" not in run.stderr

            # The model got AWM's listing of our 34 tools, then our tools' answers.
            requests = llm.requests
            assert len(requests) == 4, [r["messages"][-1] for r in requests]
            answers = [r["messages"][-1] for r in requests[1:]]
            assert all(a["role"] == "tool" for a in answers)
            assert answers[0]["content"].startswith("Available MCP Tools (34 tools):")
            assert f"{listed('subscribe_to_channel')}\n" in answers[0]["content"]
            assert KURZGESAGT in answers[1]["content"]
            assert not answers[2]["content"].startswith("Error:")

            # The calls reached the instance unchanged, under AWM's own names.
            episode = rest.get(f"/instances/{info['id']}/episode").json()
            assert [(e["tool"], e["arguments"]) for e in episode["events"] if "tool" in e] == [
                ("search_channels", {"query": "Kurzgesagt"}),
                ("subscribe_to_channel", {"channel_id": 1})]
            graded = rest.post(f"/instances/{info['id']}/grade", json={})
            assert graded.status_code == 200, graded.text
            assert graded.json()["V"] == 1
            closed = rest.delete(f"/instances/{info['id']}")
            assert closed.status_code == 200 and closed.json()["stored"], closed.text


# --- AWM's verifier on our final worlds -----------------------------------------------------


def jobs_for(the_task: Task, w0: Path, w: Path, answer: str | None) -> list[VerifyJob]:
    """AWM's verifiers of a task folder (its code verbatim in the helpers) on two worlds."""
    verifier = the_task.verifier_dir
    found = []
    for helper, function, mode in ((CODE_HELPER, "verify_task_completion", "code"),
                                   (SQL_HELPER, "verify_task", "sql")):
        if (verifier / helper).is_file():
            found.append(VerifyJob((verifier / helper).read_text(encoding="utf-8"), function,
                                   mode, service_db(w0, SERVICE), service_db(w, SERVICE),
                                   answer))
    return found


def ours(verdict: Verdict) -> dict[str, Any]:
    """This project's verdict, as AWM's modes give theirs: code mode's result, sql mode's
    evidence (JSON as it crossed the sandbox)."""
    assert not verdict.errors, verdict.errors
    got: dict[str, Any] = {}
    for script in verdict.scripts:
        if script.script == CODE_SCRIPT:
            got["code"] = script.evidence["result"]
            assert verdict.passed == (script.evidence["result"] == "complete")
        elif script.script == SQL_SCRIPT:
            got["sql"] = script.evidence["verify_task"]
    return got


def theirs(results: list[dict[str, Any]], jobs: list[VerifyJob]) -> dict[str, Any]:
    got: dict[str, Any] = {}
    for job, result in zip(jobs, results, strict=True):
        assert result["execution_status"] == "success", result
        got[job.mode] = result["result"]["result"] if job.mode == "code" else result["result"]
    as_json: dict[str, Any] = json.loads(json.dumps(got, default=str))
    return as_json


# content_platform_1 task 0 (subscribe to Kurzgesagt): tool calls on an instance.
CP_WORLDS: dict[str, tuple[list[tuple[str, dict[str, Any]]], str]] = {
    "subscribed": ([("search_channels", {"query": "Kurzgesagt"}),
                    ("subscribe_to_channel", {"channel_id": 1})], "complete"),
    "another_channel": ([("subscribe_to_channel", {"channel_id": 3})], "others"),
    "and_unsubscribed_another": ([("subscribe_to_channel", {"channel_id": 1}),
                                  ("unsubscribe_from_channel", {"channel_id": 2})], "others"),
    "untouched": ([], "others"),
}
REORDER = "INSERT INTO cart_items (cart_id, product_offer_id, quantity) VALUES (1, 8, 1)"
TOP_RATED = "INSERT INTO cart_items (cart_id, product_offer_id, quantity) VALUES (1, 1, 1)"
# e_commerce_33 (the samples' own verifiers): task, its writes, the final answer, AWM's
# result. Task 0's verifier is broken (tests/awmbridge/test_awm_tasks.py): the correct
# answer is "others" to both.
EC_WORLDS: dict[str, tuple[int, str | None, str | None, str]] = {
    "task0_correct_solution": (0, TOP_RATED, "Added the Bose QuietComfort 35 to your cart.",
                               "others"),
    "task1_reordered": (1, REORDER, "I reordered your Household Paper Towels 12-Roll Pack, "
                        "quantity 1.", "complete"),
    "task1_reordered_wrong_answer": (1, REORDER, "Reordered 3 paper towels.", "others"),
    "task1_untouched": (1, None, None, "others"),
    "task2_untouched": (2, None, None, "others"),
}


@pytest.mark.peer("awm")
def test_awms_own_verifier_gives_our_verdicts_on_our_final_worlds(
        store: dict[str, Any], worlds: Worlds, tmp_path: Path) -> None:
    cases: list[tuple[str, str, dict[str, Any], list[VerifyJob]]] = []

    def keep(name: str, the_task: Task, verdict: Verdict, w0: Path, w: Path,
             answer: str | None) -> None:
        # Copies: AWM runs after the instance is gone, on the world as it was graded.
        kept = tmp_path / name
        for side, world in (("w0", w0), ("w", w)):
            (kept / side / service_db(world, SERVICE).parent.relative_to(world)).mkdir(
                parents=True)
            shutil.copy(service_db(world, SERVICE), service_db(kept / side, SERVICE))
        cases.append((name, EXPECTED[name], ours(verdict),
                      jobs_for(the_task, kept / "w0", kept / "w", answer)))

    EXPECTED = {name: result for name, (_calls, result) in CP_WORLDS.items()}
    EXPECTED |= {name: case[3] for name, case in EC_WORLDS.items()}
    cp = task(store, CP, 0)
    with Environment(worlds, bare_names=True) as env:
        for name, (calls, _result) in CP_WORLDS.items():
            with open_task_instance(env, cp) as instance:
                for tool, arguments in calls:
                    assert not instance.call_tool(tool, arguments).is_error
                verdict = grade(env, cp, instance, None)
                keep(name, cp, verdict, instance.mount.snapshot, instance.mount.path, None)
    for name, (index, sql, answer, _result) in EC_WORLDS.items():
        ec = task(store, EC, index)
        w0 = task_w0(worlds, ec)
        with worlds.mount(ec.spec.world_hash) as mount:
            if sql is not None:
                conn = sqlite3.connect(mount.db_path(SERVICE))
                conn.execute(sql)
                conn.commit()
                conn.close()
            mount.hash()  # the world whole on disk, as a graded instance's
            verdict = run_verifier(ec.verifier_dir, w0, mount.path, answer)
            keep(name, ec, verdict, w0, mount.path, answer)

    results = awm_verdicts(peer_venv.python("awm"), [j for c in cases for j in c[3]])
    at = 0
    for name, expected, our, jobs in cases:
        their = theirs(results[at:at + len(jobs)], jobs)
        at += len(jobs)
        assert our["code"] == expected, (name, our)
        assert their == our, name
    assert at == len(results)
