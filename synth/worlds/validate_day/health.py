"""Layer 4, live health: an instance of the day opens with its pinned apps and answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from replay.layout import workspace_path
from synth.worlds.validate_day.context import DayContext
from synth.worlds.validate_day.declarations import exists_problem, select_in
from synth.worlds.validate_day.produces import Credential, Produces
from synth.worlds.validate_day.report import LayerResult
from worldenv.errors import AppPinError
from worldenv.instances.instance import Environment, Instance, read_pins
from worldstore.errors import PathError, WorldError

__all__ = ["health_layer", "probe_tool"]


def health_layer(context: DayContext, produces: Produces | None,
                 env: Environment | None) -> LayerResult:
    owned = env is None
    environment = env if env is not None else Environment(context.worlds)
    try:
        try:
            instance = environment.open(context.name)
        except AppPinError as exc:
            return LayerResult("health", "failed", f"{context.name} cannot be served: {exc}",
                               {"pins": "refused"})
        except WorldError as exc:
            return LayerResult("health", "failed", f"{context.name} cannot be opened: {exc}")
        with instance:
            return _probe(context, instance, produces)
    finally:
        if owned:
            environment.close()


def _probe(context: DayContext, instance: Instance, produces: Produces | None) -> LayerResult:
    declared = produces or Produces()
    if not read_pins(instance.mount.snapshot) and not (declared.accounts
                                                       or declared.credentials):
        # Nothing serves this world with its own code and nothing is declared to look
        # for: a "passed" here would claim a check that never happened.
        return LayerResult("health", "not_run", (
            f"nothing to check: {context.name} pins no apps (its log has no `app` event), "
            "so no service runs the world's own code, and produces.json declares no "
            "accounts or credentials"), {"pins": {}})
    services: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for service in sorted(instance.mount.manifest.services):
        outcome = _probe_service(instance, service)
        services[service] = outcome
        if outcome.get("problem"):
            problems.append(f"service {service!r}: {outcome['problem']}")
    for i, account in enumerate(declared.accounts):
        # Instances copy a database on first write; until then it is read in the snapshot.
        found = select_in(_live_db(instance, account.service), account)
        missing = exists_problem(found, account)
        if missing is not None:
            problems.append(f"accounts[{i}]: {missing} in the live instance")
    for i, credential in enumerate(declared.credentials):
        problem = _credential_problem(instance, credential)
        if problem is not None:
            problems.append(f"credentials[{i}]: {problem}")
    evidence = {"services": services, "accounts": len(declared.accounts),
                "credentials": len(declared.credentials)}
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return LayerResult("health", "failed", problems[0] + more,
                           {**evidence, "problems": problems})
    probed = sum(1 for s in services.values() if "tool" in s)
    return LayerResult("health", "passed", f"{context.name} opens with its pinned apps; "
                       f"{probed} of {len(services)} services answered a read-only call; "
                       f"{len(declared.accounts)} accounts and {len(declared.credentials)} "
                       "credentials found", evidence)


def _live_db(instance: Instance, service: str) -> Path | None:
    if service not in instance.mount.manifest.services:
        return None
    return instance.mount.read_db_path(service)


def _probe_service(instance: Instance, service: str) -> dict[str, Any]:
    tool = probe_tool(instance, service)
    if tool is None:
        served = any(spec.service == service for spec in instance.tools.values())
        note = ("no read-only tool without required arguments; not probed" if served
                else "no app serves it (data only)")
        return {"note": note}
    result = instance.call_tool(tool, {})
    if result.is_error:
        return {"tool": tool, "problem": f"{tool}({{}}) answered an error: {result.text[:200]}"}
    return {"tool": tool, "ok": True}


def probe_tool(instance: Instance, service: str) -> str | None:
    """The read-only tool of `service` to call with no arguments: none required; names
    with "list" or "search" first, then by name."""
    candidates = []
    for info in instance.list_tools():
        spec = instance.tools.get(info.name)
        if spec is None or spec.service != service or info.writes:
            continue
        if info.input_schema.get("required"):
            continue
        preferred = "list" in info.name or "search" in info.name
        candidates.append((not preferred, info.name))
    return min(candidates)[1] if candidates else None


def _credential_problem(instance: Instance, credential: Credential) -> str | None:
    workspace = instance.mount.workspace  # the instance's own copy, as an agent sees it
    try:
        path = workspace_path(workspace.parent, credential.file)
    except PathError as exc:
        return f"file: {exc}"
    if not path.is_file():
        return f"file {credential.file!r} is not in the workspace"
    text = path.read_bytes().decode("utf-8", "replace")
    if credential.contains not in text:
        return f"file {credential.file!r} does not contain {credential.contains!r}"
    return None
