"""What the AWM adapter ships as: the modules of ``worldenv.awm.adapter``, in a fixed order.

The carried modules pin the adapter by the digest of these modules' sources, concatenated in
this order, each under a line naming it. The host (``worldenv.awm.host``, writing the pin)
and the adapter in the worker (checking it) both read the unit here, so they agree on it;
a module added to the package without being listed here is refused rather than left
outside the digest.
"""

from __future__ import annotations

from pathlib import Path

from worldenv.errors import AppPinError
from worldstore.canonical import digest

__all__ = ["ADAPTER", "ADAPTER_MODULES", "adapter_digest", "adapter_source"]

ADAPTER = Path(__file__).with_name("adapter")
ADAPTER_MODULES = ("__init__.py", "freeze.py", "dbapi.py", "app.py", "routes.py")


def adapter_source(root: Path = ADAPTER) -> str:
    """The shipped adapter's source: its modules under `root`, in ``ADAPTER_MODULES`` order."""
    found = sorted(path.name for path in root.glob("*.py"))
    if found != sorted(ADAPTER_MODULES):
        raise AppPinError(f"the AWM adapter at {root} holds {', '.join(found)}; the shipped "
                          f"adapter is {', '.join(ADAPTER_MODULES)}")
    return "".join(f"# --- {name} ---\n" + (root / name).read_text(encoding="utf-8")
                   for name in ADAPTER_MODULES)


def adapter_digest(root: Path = ADAPTER) -> str:
    """xxh3-128 of ``adapter_source(root)``."""
    return digest(adapter_source(root).encode("utf-8"))
