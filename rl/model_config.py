"""A policy model's ``config.json``, read before a launch is written: the context it can
take, and the YaRN rope scaling that stretches it when the launch needs more.

Where the file is found (nothing is downloaded):

- a folder: ``<folder>/config.json``;
- a Hugging Face id (``org/name``): the local Hugging Face cache, laid out as the hub
  client writes it: ``<cache>/models--org--name/refs/main`` names a snapshot, whose
  ``snapshots/<revision>/config.json`` is read. ``<cache>`` is ``HF_HUB_CACHE``, else
  ``HUGGINGFACE_HUB_CACHE``, else ``$HF_HOME/hub``, else
  ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub`` (the hub
  client's own order), read when called;
- anything else is refused, saying what is needed.

YaRN (``yarn_for``): a context longer than ``max_position_embeddings`` gets
``rope_type: yarn`` with ``factor = context / max_position_embeddings`` and
``original_max_position_embeddings`` the model's own, and ``max_position_embeddings``
raised to the context, so that transformers' implicit factor (the ratio of the two) is
the explicit one. The factor is capped at ``MAX_YARN_FACTOR``. Refused: a model that has
rope scaling already, or whose limit lives in a nested ``text_config`` (a multimodal
config: its own override would be needed), or has no ``max_position_embeddings``.

polars-free, verl-free: the standard library only.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl.errors import RLError

CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
# Qwen3's model cards document YaRN up to a factor of 4 (32,768 -> 131,072); beyond it
# nobody has measured what the stretched positions do to the model, so it is refused.
MAX_YARN_FACTOR = 4.0
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+\Z")
# Keys that say a model is a mixture of experts (Qwen-MoE, Mixtral, DeepSeek).
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


@dataclass(frozen=True)
class ModelConfig:
    """What a launch needs from a model's ``config.json``."""

    model: str  # as given: a folder or a hub id
    file: Path  # the config.json read
    raw: dict[str, Any]
    max_position_embeddings: int | None
    nested: bool  # max_position_embeddings read from text_config (a multimodal model)
    rope: dict[str, Any] | None  # rope_scaling / rope_parameters as written, if any
    rope_theta: float | None
    experts: int  # routed experts; 0 for a dense model
    vision: bool  # has a vision encoder (vision_config)

    @property
    def rope_type(self) -> str | None:
        """The rope scaling in force; None for plain rope ("default" is plain)."""
        if not self.rope:
            return None
        if any(isinstance(v, dict) for v in self.rope.values()):
            return "per-layer"  # transformers 5: one rope per attention kind (Gemma 3)
        kind = self.rope.get("rope_type", self.rope.get("type"))
        return None if kind in (None, "default") else str(kind)

    @property
    def folder(self) -> Path:
        return self.file.parent


@dataclass(frozen=True)
class Yarn:
    """The YaRN override of one model for one context."""

    factor: float
    original: int  # the model's max_position_embeddings
    max_position_embeddings: int  # the context it now takes
    rope_theta: float | None

    def rope_parameters(self) -> dict[str, Any]:
        """transformers 5's ``rope_parameters`` (verl 0.9.1 needs transformers >= 5.5):
        replaced as a whole by an override, so ``rope_theta`` is carried along."""
        out: dict[str, Any] = {"rope_type": "yarn", "factor": self.factor,
                               "original_max_position_embeddings": self.original}
        if self.rope_theta is not None:
            out["rope_theta"] = self.rope_theta
        return out

    def hf_overrides(self) -> dict[str, Any]:
        """vLLM's ``hf_overrides``: vLLM derives its length limit as original x factor."""
        return {"max_position_embeddings": self.max_position_embeddings,
                "rope_parameters": self.rope_parameters()}

    def config_json(self, model: ModelConfig) -> dict[str, Any]:
        """The model's config.json with the override applied (the file verl's actor
        reads through ``model.hf_config_path``: verl 0.9.1's ``model.override_config``
        cannot carry it, since it sets nested dicts key by key onto the config's
        ``rope_parameters`` dict and fails)."""
        out = dict(model.raw)
        out.pop("rope_scaling", None)  # the legacy key would win over rope_parameters
        out["rope_parameters"] = self.rope_parameters()
        out["max_position_embeddings"] = self.max_position_embeddings
        return out


def hub_cache() -> Path:
    """The Hugging Face hub cache folder, as the hub client chooses it."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return Path(os.environ[name]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(base).expanduser() / "huggingface" / "hub"


def config_file(model: str) -> Path:
    """The config.json of `model` (a folder, or a hub id in the local cache)."""
    folder = Path(model).expanduser()
    if folder.exists():
        if not (folder / CONFIG_FILE).is_file():
            raise RLError(f"model {model!r}: the folder has no {CONFIG_FILE}")
        return (folder / CONFIG_FILE).resolve()
    if not _HUB_ID.match(model):
        raise RLError(f"model {model!r}: no such folder, and not a Hugging Face id (org/name)")
    cache = hub_cache()
    repo = cache / ("models--" + model.replace("/", "--"))
    ref = repo / "refs" / "main"
    revision = ref.read_text(encoding="utf-8").strip() if ref.is_file() else ""
    found = repo / "snapshots" / revision / CONFIG_FILE if revision else None
    if found is None or not found.is_file():
        raise RLError(f"model {model!r}: no such folder, and its {CONFIG_FILE} is not in the "
                      f"Hugging Face cache ({cache}): download the model first (`hf download "
                      f"{model}`) or pass its folder")
    return found


def read_model_config(model: str) -> ModelConfig:
    file = config_file(model)
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RLError(f"model {model!r}: {file} is not readable JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise RLError(f"model {model!r}: {file} is not a JSON object")
    text = raw.get("text_config")
    nested = raw.get("max_position_embeddings") is None and isinstance(text, dict)
    where: dict[str, Any] = text if nested and isinstance(text, dict) else raw
    limit = where.get("max_position_embeddings")
    rope = where.get("rope_scaling") or where.get("rope_parameters")
    theta = where.get("rope_theta")
    if theta is None and isinstance(where.get("rope_parameters"), dict):
        theta = where["rope_parameters"].get("rope_theta")
    experts = max((int(where.get(k) or raw.get(k) or 0) for k in _EXPERT_KEYS), default=0)
    return ModelConfig(model=model, file=file, raw=raw,
                       max_position_embeddings=int(limit) if limit is not None else None,
                       nested=nested, rope=dict(rope) if isinstance(rope, dict) else None,
                       rope_theta=float(theta) if theta is not None else None,
                       experts=experts, vision=isinstance(raw.get("vision_config"), dict))


def yarn_for(model: ModelConfig, context: int, *, allow: bool = True) -> Yarn | None:
    """The YaRN override `model` needs for `context` tokens (None: it fits as it is)."""
    limit = model.max_position_embeddings
    if limit is None:
        raise RLError(f"model {model.model!r}: {model.file.name} has no "
                      f"max_position_embeddings; the {context:,}-token context cannot be "
                      f"checked against it")
    if context <= limit:
        return None
    lead = (f"the {context:,}-token context is longer than model {model.model!r}'s "
            f"max_position_embeddings ({limit:,})")
    if not allow:
        raise RLError(f"{lead}, and --no-rope-scaling refuses YaRN: choose a smaller "
                      f"--context or a model with a longer one")
    if model.rope_type is not None:
        raise RLError(f"{lead}, and it has {model.rope_type!r} rope scaling already: choose "
                      f"a smaller --context or a model with a longer one")
    if model.nested:
        raise RLError(f"{lead} (in its text_config): YaRN for a multimodal config is not "
                      f"written here; choose a smaller --context")
    factor = context / limit
    if limit * factor < context:  # vLLM truncates original x factor: never a token short
        factor = math.nextafter(factor, math.inf)
    if factor > MAX_YARN_FACTOR:
        raise RLError(f"{lead}: YaRN would need a factor of {factor:.2f}, over "
                      f"{MAX_YARN_FACTOR:g} (the largest documented); choose a smaller "
                      f"--context or a model with a longer one")
    return Yarn(factor=factor, original=limit, max_position_embeddings=context,
                rope_theta=model.rope_theta)


__all__ = ["CONFIG_FILE", "GENERATION_CONFIG_FILE", "MAX_YARN_FACTOR", "ModelConfig", "Yarn",
           "config_file", "hub_cache", "read_model_config", "yarn_for"]
