"""Paddle's hapi behaviours behind ``fleetlite.Model``: callback set-up, Paddle-mode callback logic, and
``save``/``load`` of Paddle's file prefixes (``{path}.pdparams`` / ``{path}.pdopt``).

Used by :mod:`fleetlite.trainer.model` and by the shared callbacks when their
trainer is a ``fleetlite.Model`` (``trainer._paddle_hapi``).
"""

from __future__ import annotations

import itertools
import numbers
import os
import warnings
from typing import Any

import numpy as np
import torch

from .callback_base import Callback, CallbackList, is_rank_zero
from .data_adapter import DataAdapter

__all__ = ["config_callbacks", "config_fit_callbacks", "LimitedAdapter", "save_prefix", "load_prefix",
           "find_scheduler", "monitor_value"]

_POSTFIXES = (".pdparams", ".pdopt", ".pdmodel")


def monitor_value(logs: dict[str, Any] | None, key: str) -> float | None:
    """Paddle's reading of a monitored log value: the first of a list, a number, else None."""
    if not logs or key not in logs:
        return None
    v = logs[key]
    if isinstance(v, (list, tuple)):
        v = v[0] if v else None
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        v = v.item()
    if isinstance(v, np.ndarray) and v.size == 1:
        v = v.item()
    return float(v) if isinstance(v, numbers.Number) else None


# -- callbacks of a Model.fit (Paddle's config_callbacks) --------------------------------------------------------
def config_fit_callbacks(model, callbacks: Any, save_dir: str | None, save_freq: int) -> list[Callback]:
    """The user's callbacks plus Paddle's defaults: a ModelCheckpoint(save_freq, save_dir) and an
    LRScheduler() stepping the optimizer's scheduler per batch; EarlyStopping gets ``save_dir``."""
    from .callbacks import LRScheduler
    from .early_stopping import EarlyStopping
    from .model_checkpoint import ModelCheckpoint

    cbks = list(callbacks) if isinstance(callbacks, (list, tuple)) else ([callbacks] if callbacks else [])
    if not any(isinstance(k, ModelCheckpoint) for k in cbks):
        cbks.append(ModelCheckpoint(save_freq, save_dir))
    for k in cbks:
        if isinstance(k, EarlyStopping):
            k.save_dir = save_dir
    if not any(isinstance(k, LRScheduler) for k in cbks):
        cbks.append(LRScheduler())
    return cbks


class PaddleCallbackList(CallbackList):
    """Paddle's ``CallbackList`` methods (``on_begin(mode)``, ``on_batch_end(mode, step)``, ...) on ours."""

    _MODES = {"train": "train", "eval": "eval", "predict": "predict", "test": "predict"}

    def _mode(self, mode: str) -> str:
        if mode not in self._MODES:
            raise ValueError(f"mode should be train, eval or predict, got {mode!r}")
        return self._MODES[mode]

    def on_begin(self, mode: str, logs=None) -> None:
        self._call(f"on_{self._mode(mode)}_begin", logs)

    def on_end(self, mode: str, logs=None) -> None:
        self._call(f"on_{self._mode(mode)}_end", logs)

    def on_batch_begin(self, mode: str, step=None, logs=None) -> None:
        self._call(f"on_{self._mode(mode)}_batch_begin", step, logs)

    def on_batch_end(self, mode: str, step=None, logs=None) -> None:
        self._call(f"on_{self._mode(mode)}_batch_end", step, logs)


def config_callbacks(callbacks: Any = None, model=None, batch_size: int | None = None, epochs: int | None = None,
                     steps: int | None = None, log_freq: int = 2, verbose: int = 2, save_freq: int = 1,
                     save_dir: str | None = None, metrics: list[str] | None = None,
                     mode: str = "train") -> PaddleCallbackList:
    """Paddle's ``paddle.hapi.callbacks.config_callbacks``: the callback list a Paddle loop drives.

    Example::

        cbks = config_callbacks(model=model, epochs=2, steps=10, verbose=0, metrics=["loss", "acc"])
        cbks.on_begin("train"); cbks.on_epoch_begin(0); cbks.on_epoch_end(0, {"loss": 1.0}); cbks.on_end("train")
    """
    from .callbacks import LRScheduler, ProgBarLogger
    from .progress import ProgressBar

    cbks = list(callbacks) if isinstance(callbacks, (list, tuple)) else ([callbacks] if callbacks else [])
    if not any(isinstance(k, ProgressBar) for k in cbks) and verbose:
        cbks = [ProgBarLogger(log_freq, verbose=verbose), *cbks]
    cbks = config_fit_callbacks(model, cbks, save_dir, save_freq)
    if not any(isinstance(k, LRScheduler) for k in cbks):
        cbks.append(LRScheduler())
    params = {"batch_size": batch_size, "epochs": epochs, "steps": steps, "verbose": verbose,
              "metrics": (metrics or []) if mode != "test" else [], "log_freq": log_freq, "world_size": 1}
    return PaddleCallbackList(cbks, trainer=model, params=params)


# -- Paddle-mode logic of shared callbacks --------------------------------------------------------------------
def paddle_early_stopping_begin(cb) -> None:
    cb.monitor = "loss" if cb._monitor_given is None else cb._monitor_given
    mode = cb._mode_arg
    cb._greater = mode == "max" or (mode == "auto" and "acc" in cb.monitor)
    cb.wait_epoch = 0
    cb.stopped_epoch = 0
    if cb.baseline is not None:
        cb.best_value = cb.baseline
    else:
        cb.best_value = -np.inf if cb._greater else np.inf
        cb.best_weights = None


def paddle_early_stopping_eval_end(cb, logs) -> None:
    """Paddle's ``EarlyStopping.on_eval_end``, rule for rule."""
    if logs is None or cb.monitor not in logs:
        warnings.warn("Monitor of EarlyStopping should be loss or metric name.", stacklevel=3)
        return
    current = monitor_value(logs, cb.monitor)
    if current is None:
        return
    delta = cb.min_delta if cb._greater else -cb.min_delta
    improved = (current - delta > cb.best_value) if cb._greater else (current - delta < cb.best_value)
    if improved:
        cb.best_value = current
        cb.wait_epoch = 0
        if cb.save_best_model and cb.save_dir is not None:
            cb.trainer.save(os.path.join(cb.save_dir, "best_model"))
    else:
        cb.wait_epoch += 1
    if cb.wait_epoch >= cb.patience:
        cb.trainer.stop_training = True
        if cb.verbose > 0 and is_rank_zero():
            print(f"Epoch {cb.stopped_epoch + 1}: Early stopping.")
            if cb.save_best_model and cb.save_dir is not None:
                print(f"Best checkpoint has been saved at {os.path.abspath(os.path.join(cb.save_dir, 'best_model'))}")
    cb.stopped_epoch += 1


def paddle_checkpoint_epoch_end(cb, epoch: int) -> None:
    """Paddle's ``ModelCheckpoint``: ``{save_dir}/{epoch}`` when ``epoch % save_freq == 0`` (rank 0)."""
    if cb.save_dir and cb.save_freq and epoch % cb.save_freq == 0 and is_rank_zero():
        path = f"{cb.save_dir}/{epoch}"
        if cb.verbose:
            print(f"save checkpoint at {os.path.abspath(path)}")
        cb.trainer.save(path)


def paddle_checkpoint_train_end(cb) -> None:
    if cb.save_dir and is_rank_zero():
        path = f"{cb.save_dir}/final"
        if cb.verbose:
            print(f"save checkpoint at {os.path.abspath(path)}")
        cb.trainer.save(path)


def find_scheduler(optimizer: Any) -> Any:
    """The torch LR scheduler driving ``optimizer`` (Paddle's optimizers own theirs; torch's do not).

    Looked up as ``optimizer._learning_rate`` / ``optimizer.lr_scheduler`` when set, else among the
    live schedulers whose ``.optimizer`` is this optimizer (the outermost one when schedulers are chained).
    ``ReduceLROnPlateau`` is left out (it needs a metric: use the ``ReduceLROnPlateau`` callback).
    """
    import gc

    from torch.optim.lr_scheduler import LRScheduler as TorchScheduler
    from torch.optim.lr_scheduler import ReduceLROnPlateau

    if optimizer is None:
        return None
    opt = getattr(optimizer, "inner_opt", optimizer)
    for attr in ("_learning_rate", "lr_scheduler"):
        s = getattr(opt, attr, None)
        if s is not None and hasattr(s, "step") and hasattr(s, "state_dict"):
            return s
    found = []
    for ref in gc.get_referrers(opt):
        if isinstance(ref, TorchScheduler):
            owners = [ref]
        elif isinstance(ref, dict) and ref.get("optimizer") is opt:  # a scheduler's __dict__
            owners = [o for o in gc.get_referrers(ref) if isinstance(o, TorchScheduler)]
        else:
            owners = []
        for s in owners:
            if getattr(s, "optimizer", None) is opt and not isinstance(s, ReduceLROnPlateau) and s not in found:
                found.append(s)
    inner = {id(c) for s in found for c in getattr(s, "_schedulers", [])}
    found = [s for s in found if id(s) not in inner]
    if len(found) > 1:
        raise ValueError(f"{len(found)} LR schedulers drive this optimizer ({[type(s).__name__ for s in found]}); "
                         "pass the one to step: LRScheduler(scheduler) or optimizer.lr_scheduler = scheduler")
    return found[0] if found else None


# -- evaluate(num_iters=) ---------------------------------------------------------------------------------
class LimitedAdapter(DataAdapter):
    """The first ``num_iters`` batches of an adapter (Paddle's ``evaluate(num_iters=)``)."""

    @classmethod
    def wrap(cls, adapter: DataAdapter, num_iters: int) -> LimitedAdapter:
        if isinstance(num_iters, bool) or not isinstance(num_iters, int) or num_iters < 1:
            raise ValueError(f"num_iters={num_iters!r} must be a positive integer")
        new = cls(adapter.loader, adapter.sampler, adapter.sharded, adapter.kind)
        new.num_iters = num_iters
        return new

    def __iter__(self):
        return itertools.islice(iter(self.loader), self.num_iters)

    def length(self) -> int | None:
        n = super().length()
        return self.num_iters if n is None else min(n, self.num_iters)


# -- save / load of Paddle's file prefixes ---------------------------------------------------------------------
def _strip(path: str) -> str:
    for p in _POSTFIXES:
        if path.endswith(p):
            return path[: -len(p)]
    return path


def _atomic_torch_save(obj: Any, path: str) -> None:
    from ..utils.atomic import atomic_open

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
        from .trainer import Trainer

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
    from .trainer import Trainer

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
