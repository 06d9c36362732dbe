"""fleetlite: PaddlePaddle's collective ``fleet`` workflow on PyTorch, with a Keras-style Trainer.

Importing the package is cheap: submodules (and torchvision, hydra, rich) load
on first use of a public name.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> (module, attribute or None for the module itself)
_LAZY = {
    "DataParallel": ("fleetlite.parallel", "DataParallel"),
    "DistributedDataParallel": ("fleetlite.parallel", "DistributedDataParallel"),
    "Trainer": ("fleetlite.trainer", "Trainer"),
    "Model": ("fleetlite.trainer", "Model"),
    "summary": ("fleetlite.trainer.summary", "summary"),
    "flops": ("fleetlite.trainer.flops", "flops"),
    "seed_everything": ("fleetlite.utils.seed", "seed_everything"),
    "fleet": ("fleetlite.distributed.fleet", None),
    "distributed": ("fleetlite.distributed", None),
    "autograd": ("fleetlite.autograd", None),
    "callbacks": ("fleetlite.callbacks", None),
    "metric": ("fleetlite.metric", None),
    "io": ("fleetlite.io", None),
    "vision": ("fleetlite.vision", None),
    "static": ("fleetlite.static", None),
    "nn": ("fleetlite.nn", None),
    "hapi": ("fleetlite.hapi", None),
}

# subpackages reachable as attributes after a bare ``import fleetlite`` (``fleetlite.trainer.Trainer``), as
# ``import torch; torch.distributed`` works; each is imported on first use
_SUBPACKAGES = ("checkpoint", "parallel", "recipe", "text", "trainer", "utils", "testing")

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        module, attr = _LAZY[name]
        mod = importlib.import_module(module)
        value = mod if attr is None else getattr(mod, attr)
        globals()[name] = value
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f"fleetlite.{name}")  # the import sets it as this module's attribute
    raise AttributeError(f"module 'fleetlite' has no attribute {name!r}")


def __dir__():
    return sorted({*__all__, *_SUBPACKAGES})
