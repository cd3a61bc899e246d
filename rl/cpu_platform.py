"""verl on a machine with no accelerator: a ``cpu`` platform for verl's platform registry.

verl 0.9.1 registers nvidia, npu and rocm only. Its registry is pluggable: a process that
imports this module (verl imports the modules named in ``VERL_USE_EXTERNAL_MODULES`` in
every process it starts, ``rl.smoke.smoke_env`` sets ``rl.cpu_platform``) has ``cpu``
registered, and ``VERL_PLATFORM=cpu`` selects it. Never chosen by auto-detection.

What the platform answers, and why:

* ``gloo`` for collectives. verl joins it to the device's own backend as
  ``"cpu:gloo,<device>:<backend>"``, which torch refuses when both are ``cpu``
  ("Duplicate device type cpu"): while this platform is selected, the backend string
  given to ``torch.distributed.init_process_group`` keeps one entry per device type.
* ``get_torch_device()`` is a stand-in for ``torch.cpu`` (``CPUDevice``) with the calls
  verl makes on ``torch.cuda`` that ``torch.cpu`` lacks: memory statistics (process RSS
  and the machine's free memory), the RNG state, ``empty_cache``, ``ipc_collect``...
* The current device is the CPU device itself, not an index: verl passes
  ``get_device_id()`` to ``.to()``, where an index means an accelerator.
* Ray's accelerator is ``GPU``: verl's resource pools always ask Ray for GPUs, so a CPU
  run declares logical ones (``ray_init.num_gpus``); no device is behind them.
* No CUDA IPC: verl's weight sync to the rollout then goes through shared memory.
* The vLLM server gets vLLM's CPU settings (``rollout_env_vars``): a 1 GiB KV cache
  unless ``VLLM_CPU_KVCACHE_SPACE`` says otherwise, no OpenMP thread binding.

One patch of vLLM's CPU build, made in the vLLM processes (where verl imports this module
too): after loading, vLLM prepacks each unquantized linear layer's weight for its CPU
kernels and drops the parameter, so verl's in-place weight sync fails (``'Parameter'
object has no attribute 'weight_loader'``) or, were the parameter kept, would update a
copy that no kernel reads. Layers are marked to keep their plain weight and use
``torch.nn.functional.linear`` (vLLM's own path for layers it does not pack).

And one of verl, for a host shared with other verl runs (not CPU-bound, but a CPU
machine is where several small runs share a host): verl's weight-sync socket is named by
the Ray job id, the same in every fresh cluster; the run's tag makes it the run's own
(``run_socket``).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed
from verl.plugin.platform import PlatformBase, PlatformRegistry

PLATFORM = "cpu"
CPU = torch.device("cpu")
MODULE = __name__  # what VERL_USE_EXTERNAL_MODULES names
VLLM_LINEAR = "vllm.model_executor.layers.linear"
VERL_SYNC_SENDER = "verl.workers.rollout.vllm_rollout.vllm_rollout"
VERL_SYNC_RECEIVER = "verl.workers.rollout.vllm_rollout.utils"
RUN_TAG_ENV = "WORLDCTL_RUN_TAG"  # set by rl.smoke: unique to the run


def selected() -> bool:
    """Whether this process runs verl on the CPU platform (``VERL_PLATFORM=cpu``)."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM


class CPUDevice(types.ModuleType):
    """``torch.cpu`` with the ``torch.cuda`` calls verl makes through ``get_torch_device()``.

    Memory figures are the process's resident set (allocated, reserved) and the machine's
    available memory (``mem_get_info``): what verl logs and checks, measured where the
    tensors live."""

    def __init__(self) -> None:
        super().__init__("agent_worlds_cpu_device")
        self._peak = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    # devices
    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def current_device(self) -> torch.device:
        return CPU

    def set_device(self, device: object) -> None:
        return None

    def get_device_name(self, device: object = None) -> str:
        return "cpu"

    def synchronize(self, device: object = None) -> None:
        return None

    # random numbers
    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def get_rng_state(self, device: object = None) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, device: object = None) -> None:
        torch.set_rng_state(state)

    # memory
    def empty_cache(self) -> None:
        return None

    def ipc_collect(self) -> None:
        return None

    def set_per_process_memory_fraction(self, fraction: float, device: object = None) -> None:
        return None

    def memory_allocated(self, device: object = None) -> int:
        used = _resident_bytes()
        self._peak = max(self._peak, used)
        return used

    def memory_reserved(self, device: object = None) -> int:
        return self.memory_allocated()

    def max_memory_allocated(self, device: object = None) -> int:
        return max(self._peak, self.memory_allocated())

    def max_memory_reserved(self, device: object = None) -> int:
        return self.max_memory_allocated()

    def reset_peak_memory_stats(self, device: object = None) -> None:
        self._peak = 0

    def reset_accumulated_memory_stats(self, device: object = None) -> None:
        return None

    def memory_stats(self, device: object = None) -> dict[str, int]:
        return {"allocated_bytes.all.current": self.memory_allocated()}

    def mem_get_info(self, device: object = None) -> tuple[int, int]:
        """(free, total) bytes of the machine's memory."""
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return _available_bytes(total), total


def _resident_bytes() -> int:
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _available_bytes(total: int) -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return total


@PlatformRegistry.register(platform=PLATFORM)
class PlatformCPU(PlatformBase):
    """verl's platform interface on the CPU (see the module docstring)."""

    def __init__(self) -> None:
        self._device = CPUDevice()
        _patch_process_group_backend()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return self._device

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return False  # chosen only by name (VERL_PLATFORM=cpu), never auto-detected

    def current_device(self) -> torch.device:  # type: ignore[override]
        # verl hands "the current device's index" to .to() and torch.device(); an index
        # means an accelerator to torch, so on the CPU it is the CPU device itself
        return CPU

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets it for the logical GPUs a CPU run declares; verl reads it to number them
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def rollout_env_vars(self) -> dict[str, str]:
        return {"VLLM_TARGET_DEVICE": "cpu",
                "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
                "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND",
                                                            "nobind")}

    def cudart(self) -> Any:
        return None


# --- torch.distributed: one backend per device type ------------------------------------


def single_device_backends(backend: str) -> str:
    """``"cpu:gloo,cpu:gloo"`` -> ``"cpu:gloo"``: the first backend named for each device
    type (torch refuses a device type named twice); any other string as it is."""
    if ":" not in backend:
        return backend
    kept: dict[str, str] = {}
    for part in backend.split(","):
        device, _, name = part.strip().partition(":")
        kept.setdefault(device, name)
    return ",".join(f"{device}:{name}" for device, name in kept.items())


def _patch_process_group_backend() -> None:
    init: Any = torch.distributed.init_process_group
    if getattr(init, "_agent_worlds_cpu", False):
        return

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if isinstance(kwargs.get("backend"), str):
            kwargs["backend"] = single_device_backends(kwargs["backend"])
        elif args and isinstance(args[0], str):
            args = (single_device_backends(args[0]), *args[1:])
        return init(*args, **kwargs)

    init_process_group._agent_worlds_cpu = True  # type: ignore[attr-defined]
    torch.distributed.init_process_group = init_process_group
    torch.distributed.distributed_c10d.init_process_group = init_process_group


# --- vLLM: keep plain linear weights ---------------------------------------------------


def keep_plain_linear_weights(linear: types.ModuleType) -> None:
    """Make vLLM's ``UnquantizedLinearMethod`` on CPU keep each layer's weight parameter
    and compute with ``torch.nn.functional.linear`` on it (vLLM's path for a layer marked
    ``_cpu_skip_gemm_dispatch``), so the weights verl syncs in place are the ones used."""
    method: Any = linear.UnquantizedLinearMethod
    original = method.process_weights_after_loading
    if getattr(original, "_agent_worlds_cpu", False):
        return

    def process_weights_after_loading(self: Any, layer: Any) -> None:
        layer._cpu_skip_gemm_dispatch = True
        original(self, layer)

    process_weights_after_loading._agent_worlds_cpu = True  # type: ignore[attr-defined]
    method.process_weights_after_loading = process_weights_after_loading


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `patch` on the module `name` right after it is first executed."""

    def __init__(self, name: str, patch: Callable[[types.ModuleType], None]) -> None:
        self.name = name
        self.patch = patch

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader: Any = spec.loader
        execute = loader.exec_module
        patch = self.patch

        def exec_module(module: types.ModuleType) -> None:
            execute(module)
            patch(module)

        loader.exec_module = exec_module
        return spec


def after_import(name: str, patch: Callable[[types.ModuleType], None]) -> None:
    """`patch` the module `name` now if it is imported, else as soon as it is."""
    module = sys.modules.get(name)
    if module is not None:
        patch(module)
        return
    if not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, patch))


# --- verl: a weight-sync socket of the run's own -------------------------------------------


def run_socket(handle: str) -> str:
    """verl's weight-sync socket ``ipc:///tmp/rl-colocate-zmq-<job>-...`` with the run's
    tag (``WORLDCTL_RUN_TAG``) after the prefix. verl names it by the Ray job id,
    which is ``01000000`` in every fresh local cluster: two verl runs on one host bind the
    same path, and the second one's bind unlinks the first one's socket file, whose next
    sync then waits forever."""
    tag = os.environ.get(RUN_TAG_ENV, "")
    prefix = "ipc:///tmp/rl-colocate-zmq-"
    if not tag or not handle.startswith(prefix) or handle.startswith(f"{prefix}{tag}-"):
        return handle
    return f"{prefix}{tag}-{handle[len(prefix):]}"


def tag_sender_socket(module: types.ModuleType) -> None:
    """verl's ``ServerAdapter`` (the actor's side of the sync) binds ``run_socket``."""
    adapter: Any = module.ServerAdapter
    original = adapter.__init__
    if getattr(original, "_agent_worlds_cpu", False):
        return

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.zmq_handle = run_socket(self.zmq_handle)

    __init__._agent_worlds_cpu = True  # type: ignore[attr-defined]
    adapter.__init__ = __init__


def tag_receiver_socket(module: types.ModuleType) -> None:
    """verl's vLLM worker extension (the rollout's side) connects to ``run_socket``."""
    extension: Any = module.vLLMColocateWorkerExtension
    original = extension._get_zmq_handle
    if getattr(original, "_agent_worlds_cpu", False):
        return

    def _get_zmq_handle(self: Any) -> str:
        return run_socket(original(self))

    _get_zmq_handle._agent_worlds_cpu = True  # type: ignore[attr-defined]
    extension._get_zmq_handle = _get_zmq_handle


if selected():
    after_import(VLLM_LINEAR, keep_plain_linear_weights)
    after_import(VERL_SYNC_SENDER, tag_sender_socket)
    after_import(VERL_SYNC_RECEIVER, tag_receiver_socket)


__all__ = ["MODULE", "PLATFORM", "RUN_TAG_ENV", "CPUDevice", "PlatformCPU", "after_import",
           "keep_plain_linear_weights", "run_socket", "selected", "single_device_backends",
           "tag_receiver_socket", "tag_sender_socket"]
