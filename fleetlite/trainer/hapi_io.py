"""``save``/``load`` of Paddle's file prefixes behind ``fleetlite.Model``: ``{path}.pdparams`` (parameters) and
``{path}.pdopt`` (optimizer state), as ``paddle.Model.save``/``load`` write and read them.

Example::

    from fleetlite.trainer.hapi_io import load_prefix, save_prefix
    save_prefix(model, "ckpt/final", training=True)       # ckpt/final.pdparams + ckpt/final.pdopt (rank 0)
    load_prefix(model, "ckpt/final", skip_mismatch=False, reset_optimizer=False)
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch

from ..utils.atomic import atomic_open
from .callbacks.base import is_rank_zero
from .trainer import Trainer

__all__ = ["save_prefix", "load_prefix"]

_POSTFIXES = (".pdparams", ".pdopt", ".pdmodel")


def _strip(path: str) -> str:
    for p in _POSTFIXES:
        if path.endswith(p):
            return path[: -len(p)]
    return path


def _atomic_torch_save(obj: Any, path: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with atomic_open(path, "wb") as f:
        torch.save(obj, f)


def save_prefix(model, path: str, training: bool) -> None:
    if not training:
        if os.path.basename(path) == "":
            raise ValueError(f"The input path MUST be format of dirname/file_prefix [dirname\\file_prefix in "
                             f"Windows system], but received file_prefix is empty string: {path!r}")
        if not model._ran and model._inputs is None:
            raise RuntimeError("Model.save(training=False) needs the input shapes: pass Model(net, inputs=[...]) "
                               "or run the model first (fit, evaluate, predict or a *_batch call)")
        model.setup()
        Trainer.save(model, path, training=False)
        return
    if not is_rank_zero():
        return
    path = _strip(path)
    _atomic_torch_save(model.network.state_dict(), path + ".pdparams")
    opt = model.optimizer if model.optimizer is not None else model.user_optimizer
    if opt is not None:
        state = opt.state_dict()
        if state:
            _atomic_torch_save(state, path + ".pdopt")


def load_prefix(model, path: str, skip_mismatch: bool, reset_optimizer: bool) -> None:
    prefix = _strip(path)
    params_path = prefix + ".pdparams"
    if not os.path.isfile(params_path):
        if os.path.isfile(path):  # a fleetlite checkpoint or weights file
            Trainer.load(model, path, skip_mismatch, reset_optimizer)
            return
        raise ValueError(f"Model.load({path!r}): no parameter file {params_path} (Paddle's save(path) writes "
                         f"path + '.pdparams'); check the path")
    state = torch.load(params_path, map_location="cpu", weights_only=True)
    if not state:
        raise ValueError(f"Failed to load parameters, please check path: {params_path} is empty")
    matched = {}
    for key, param in model.network.state_dict().items():
        try:
            if key not in state:
                raise ValueError(f"{key} is not found in the providing file.")
            if tuple(state[key].shape) != tuple(param.shape):
                raise ValueError(f"{key} receives a shape {list(state[key].shape)}, but the expected shape is "
                                 f"{list(param.shape)}.")
        except ValueError as err:
            if skip_mismatch:
                warnings.warn(f"Skip loading for {key}. {err}", stacklevel=3)
                continue
            raise
        matched[key] = state[key]
    model.network.load_state_dict(matched, strict=False)
    opt_path = prefix + ".pdopt"
    if not reset_optimizer and os.path.isfile(opt_path) and model.user_optimizer is not None:
        model.setup()
        model.optimizer.load_state_dict(torch.load(opt_path, map_location="cpu", weights_only=False))
