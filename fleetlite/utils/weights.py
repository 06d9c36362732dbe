"""Weight files below every layer: optional-dependency import, exported configs, safetensors loading.

The trainer's export (:mod:`fleetlite.trainer.export`) writes these files and
``fleetlite.vision.models.from_safetensors`` reads them back; both use the
helpers here, so the data side never imports the trainer.

Example::

    import torch
    from fleetlite.utils.weights import load_safetensors
    net = load_safetensors(torch.nn.Linear(4, 3), "out/net.safetensors")
"""

from __future__ import annotations

import importlib
import json
import os
import warnings
from pathlib import Path
from typing import Any

from torch import nn

__all__ = ["require", "config_path", "read_config", "load_safetensors", "strip_compile_prefix"]

_COMPILE_PREFIX = "_orig_mod."  # what torch.compile's OptimizedModule puts before its wrapped module's keys
_EXTRAS = {"safetensors": "safetensors", "onnx": "onnx", "onnxscript": "onnx", "mlflow": "mlflow",
           "wandb": "wandb", "tensorboard": "tensorboard"}


def require(module: str, what: str, extra: str | None = None):
    """Import an optional dependency, or raise a one-line ImportError naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        package = module.split(".")[0]
        extra = extra or _EXTRAS.get(package, package)
        how = f"pip install {package} (a fleetlite dependency)" if extra == "safetensors" else \
            f"pip install 'fleetlite[{extra}]'"
        raise ImportError(f"{what} needs the {package} package, which is not installed: {how}") from None


def config_path(path: str | os.PathLike) -> Path:
    """Where the config of an exported file lives: ``model.safetensors`` -> ``model.json``."""
    return Path(path).with_suffix(".json")


def read_config(path: str | os.PathLike) -> Any:
    """The config written alongside an exported file (None when there is none)."""
    p = config_path(path)
    return json.loads(p.read_text(encoding="utf-8")) if p.exists() else None


def strip_compile_prefix(state: dict[str, Any]) -> dict[str, Any]:
    """A state_dict saved from a ``torch.compile``-d module, with its ``_orig_mod.`` key prefixes removed."""
    if not any(isinstance(k, str) and _COMPILE_PREFIX in k for k in state):
        return state
    return {(k.replace(_COMPILE_PREFIX, "") if isinstance(k, str) else k): v for k, v in state.items()}


def load_safetensors(model: nn.Module, path: str | os.PathLike, strict: bool = True) -> nn.Module:
    """Load weights written by ``export(format="safetensors")`` into ``model``; returns ``model``."""
    st = require("safetensors.torch", "loading a .safetensors file", "safetensors")
    missing, unexpected = model.load_state_dict(strip_compile_prefix(st.load_file(str(path))), strict=strict)
    if not strict and (missing or unexpected):
        warnings.warn(f"fleetlite: {path}: missing {sorted(missing)[:10]}, unexpected {sorted(unexpected)[:10]}",
                      stacklevel=2)
    return model
