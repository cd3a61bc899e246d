"""The environments' commands: ``episode list|show|replay|verify`` and ``serve``."""

from __future__ import annotations

import socket
import sys

import click

from worldctl import render
from worldctl.session import installed_packs, worlds


@click.group()
def episode() -> None:
    """Stored agent episodes: list, show, replay and verify them."""


@episode.command("list")
@click.option("--task", "task_id", default=None, help="Only episodes of this task (its id).")
@click.option("--agent", default=None, help="Only episodes of this agent, e.g. "
                                            "scripted:reference.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def episode_list(ctx: click.Context, task_id: str | None, agent: str | None,
                 as_json: bool) -> None:
    """Stored episodes: where each started, its task and agent, its calls and errors."""
    from worldenv.instances.episodes import list_episodes

    found = list_episodes(worlds(ctx), task=task_id, agent=agent)
    if as_json:
        render.emit_json([render.episode_list_dict(s) for s in found])
    else:
        render.episode_list(found)


@episode.command("show")
@click.argument("episode_id")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def episode_show(ctx: click.Context, episode_id: str, as_json: bool) -> None:
    """The calls of episode EPISODE_ID (tool or command, error flag, response) and the
    effects each had."""
    from worldenv.instances.episodes import decode_episode, summarize_episode

    record = worlds(ctx).store.episode(episode_id)
    summary = summarize_episode(record)
    if as_json:
        render.emit_json({**render.episode_dict(summary),
                          "events": decode_episode(record).events})
    else:
        render.episode(summary)


@episode.command("replay")
@click.argument("episode_id")
@click.pass_context
def episode_replay(ctx: click.Context, episode_id: str) -> None:
    """Apply the effects of EPISODE_ID to a fresh mount of its snapshot; print the world
    hash. Exits 1 if it differs from the recorded final hash."""
    from worldenv.instances.episodes import load_episode, replay_episode

    store = worlds(ctx)
    ep = load_episode(store, episode_id)
    record = store.store.episode(episode_id)
    replayed = replay_episode(store, ep)
    render.echo(replayed)
    if {record.final_hash, ep.final_hash} != {replayed}:
        click.echo(f"MISMATCH: episode {episode_id} replays to {replayed}, the recorded "
                   f"final hash is {record.final_hash} (in its body: {ep.final_hash})",
                   err=True)
        sys.exit(1)


@episode.command("verify")
@click.argument("episode_ids", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Verify every episode (the default).")
@click.pass_context
def episode_verify(ctx: click.Context, episode_ids: tuple[str, ...], all_: bool) -> None:
    """Replay stored episodes and check each against its recorded final hash.

    Exits 1 and names each episode that fails.
    """
    from worldenv.instances.episodes import verify_episodes

    results = verify_episodes(worlds(ctx), None if all_ or not episode_ids
                              else list(episode_ids))
    for ok, message in results:
        render.episode_check(ok, message)
    failed = sum(not ok for ok, _message in results)
    render.episode_verify_summary(len(results), failed)
    if failed:
        sys.exit(1)


def _missing(exc: ImportError) -> str:
    """What is missing: the innermost module not found, else the error's own words."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ModuleNotFoundError) and cause.name:
            return f"{cause.name} is not installed"
        cause = cause.__cause__ or cause.__context__
    return " ".join(str(exc).split())


def check_port_free(host: str, port: int) -> None:
    """Refuse a port that another process listens on before the server starts (uvicorn
    would log a traceback-like error and exit 1 only after start-up)."""
    from worldenv.errors import GatewayError

    if port == 0:  # the system picks a free one
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise GatewayError(f"cannot serve on {host!r}: {exc.strerror}") from None
    family, kind, proto, _name, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind(address)
        except OSError as exc:
            raise GatewayError(f"cannot serve on {host}:{port}: {exc.strerror or exc} "
                               "(is another server using the port? choose one with "
                               "--port)") from None


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; beyond loopback a token is required.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535))
@click.option("--token", envvar="WORLDCTL_TOKEN", default=None,
              help="Bearer token every request must carry (env WORLDCTL_TOKEN).")
@click.option("--max-instances", default=256, show_default=True, type=click.IntRange(min=1))
@click.option("--idle-timeout", default=600.0, show_default=True,
              type=click.FloatRange(min=0, min_open=True),
              help="Seconds without a request after which an instance is closed.")
@click.option("--call-timeout", default=30.0, show_default=True,
              type=click.FloatRange(min=0, min_open=True),
              help="Seconds a tool call may take before the agent gets a timeout error.")
@click.option("--mode", type=click.Choice(["tools", "meta"]), default="tools",
              show_default=True, help="MCP surface of new instances: every tool, or "
                                      "list_tools/call_tool.")
@click.option("--bare-names", is_flag=True, default=False,
              help="Name tools without their service prefix (AWM's operation_id names, "
                   "as AWM-trained agents expect); a create request can say otherwise.")
@click.option("--tasks", "task_sources", multiple=True, metavar="DIR|PACK",
              help="Tasks to create instances for and grade against: a task folder, a "
                   "folder of task folders, or a pack name (repeatable).")
@click.option("--max-steps", default=50, show_default=True, type=click.IntRange(min=1),
              help="OpenEnv steps of an episode before it is done (a create request can "
                   "say otherwise).")
@click.option("--max-gui-instances", default=32, show_default=True,
              type=click.IntRange(min=1),
              help="Instances with the GUI at a time (each holds a browser page, ~75 MiB); "
                   "beyond it a create request is 429.")
@click.option("--max-gui-per-client", default=8, show_default=True,
              type=click.IntRange(min=1),
              help="Instances with the GUI one client (peer address) may hold at a time.")
@click.pass_context
def serve(ctx: click.Context, host: str, port: int, token: str | None, max_instances: int,
          idle_timeout: float, call_timeout: float, mode: str, bare_names: bool,
          task_sources: tuple[str, ...], max_steps: int, max_gui_instances: int,
          max_gui_per_client: int) -> None:
    """Serve instances of the stored worlds to agents over HTTP.

    REST at /instances (shell, answer, GUI actions, grade, close), MCP (streamable HTTP)
    at /instances/<id>/mcp, OpenEnv reset/step/state at /instances/<id>/openenv, and the
    web pages of an instance with the GUI at /instances/<id>/gui/. Every instance's
    episode is stored when it is closed or reset.
    """
    try:
        from worldenv.instances.instance import Environment
        from worldenv.serving.gateway import check_bind
        from worldenv.serving.gateway import serve as run_gateway
    except ImportError as exc:  # fastmcp re-raises a missing uvicorn as its own ImportError
        raise click.ClickException(f"worldctl serve needs the envs extra: {_missing(exc)}; "
                                   "pip install 'agent-worlds[envs]'") from None

    check_bind(host, token)
    check_port_free(host, port)
    env = Environment(worlds(ctx), bare_names=bare_names)
    tasks = None
    if task_sources:
        from gates.served import load_served_tasks

        tasks = load_served_tasks(env, task_sources, installed_packs(ctx))
    run_gateway(env, host=host, port=port, token=token, max_instances=max_instances,
                idle_timeout=idle_timeout, call_timeout=call_timeout, mode=mode,
                tasks=tasks, max_steps=max_steps, max_gui_instances=max_gui_instances,
                max_gui_per_client=max_gui_per_client)
