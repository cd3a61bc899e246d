"""A local Ray cluster with TransferQueue started in it: what verl's V1 (TransferQueue)
worker path needs on one machine, for the training tests and ``bench/bench_rl.py``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def transfer_queue_cluster(**ray_init: Any) -> Iterator[None]:
    """A local Ray cluster with TransferQueue started in it. Its storage units ask Ray for
    CPUs: logical ones beyond the machine's two (with 2, verl's placement hangs)."""
    import ray
    import transfer_queue as tq

    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, **ray_init)
    tq.init()
    try:
        yield
    finally:
        tq.close()
        ray.shutdown()
