"""The tools offered to a model on an instance: one ``Toolset`` per instance, mode, GUI and
agent tools, in the one order every surface offers them (``observation.offered``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from worldenv.core.contract import ToolInfo
from worldenv.instances.instance import Instance
from worldenv.protocol.observation import Mode, function_schema, offered


@dataclass(frozen=True)
class Toolset:
    """What a model is offered: `tools` in the order offered (the service tools, or meta
    mode's two meta-tools, then the agent tools), `service` the instance's own tools
    (behind ``call_tool`` in meta mode)."""

    mode: Mode
    tools: tuple[ToolInfo, ...]
    service: tuple[ToolInfo, ...]
    names: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", frozenset(t.name for t in self.tools))

    def schemas(self) -> list[dict[str, Any]]:
        """The tools as function schemas (OpenAI format), in order."""
        return [function_schema(t) for t in self.tools]


def toolset(infos: Sequence[ToolInfo], *, mode: Mode = "tools", gui: bool = False,
            shell: bool | None = None, answer: bool = True) -> Toolset:
    """The tools offered beside the service tools `infos`. `shell` defaults to the
    agents' choice: offered in tools mode, not in meta mode (AWM's protocol has none)."""
    if mode not in ("tools", "meta"):
        raise ValueError(f"unknown mode {mode!r}: use 'tools' or 'meta'")
    return Toolset(mode, offered(infos, mode=mode, gui=gui,
                                 shell=mode == "tools" if shell is None else shell,
                                 answer=answer), tuple(infos))


def toolset_of(instance: Instance, *, mode: Mode = "tools", gui: bool = False,
               shell: bool | None = None, answer: bool = True) -> Toolset:
    """The tools offered on `instance` (``toolset`` of its service tools)."""
    return toolset(instance.list_tools(), mode=mode, gui=gui, shell=shell, answer=answer)


__all__ = ["Toolset", "toolset", "toolset_of"]
