"""Keras' ``fit`` conveniences for the Trainer: ``validation_split``, ``steps_per_epoch``, ``validation_steps``
and ``initial_epoch``.

* ``validation_split=f``: the *last* fraction ``f`` of the training data (before any shuffling, as Keras)
  becomes the evaluation data; for a tuple of tensors or a sized ``Dataset`` (a ``DataLoader`` cannot be
  split: pass ``eval_data``).
* ``steps_per_epoch=n``: an epoch is the first ``n`` batches of each (reshuffled) pass.
* ``validation_steps=n``: each evaluation in ``fit`` uses the first ``n`` batches of each rank.
* ``eval_steps=n`` (Lightning's ``val_check_interval``): also evaluate every ``n`` optimizer steps inside an
  epoch; the results go to ``on_eval_end`` and ``trainer.step_evaluations`` (``{"step": ..., "val_loss": ...}``),
  on copies of the metrics, so the epoch's training metrics are not disturbed.
* ``initial_epoch=e``: start counting at epoch ``e`` (epochs ``e .. epochs-1`` run), as Keras when
  continuing a run by hand; ``resume=`` takes precedence.

Example::

    trainer.fit((x, y), epochs=10, batch_size=64, validation_split=0.2, steps_per_epoch=50)
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.utils.data import Dataset, Subset

from .arguments import check_positive
from .data_adapter import LimitedAdapter, build_adapter

__all__ = ["apply_keras_options", "check_call_order"]


def _split(data: Any, fraction: float) -> tuple[Any, Any]:
    if isinstance(data, (tuple, list)) and data and all(isinstance(t, torch.Tensor) for t in data):
        n = int(data[0].shape[0])
        cut = n - int(n * fraction)
        return tuple(t[:cut] for t in data), tuple(t[cut:] for t in data)
    if isinstance(data, Dataset) and hasattr(data, "__len__"):
        n = len(data)
        cut = n - int(n * fraction)
        return Subset(data, range(cut)), Subset(data, range(cut, n))
    raise TypeError(f"validation_split needs the training data as a tuple of tensors or a sized Dataset, got "
                    f"{type(data).__name__}; split it yourself and pass eval_data")


def apply_keras_options(device: torch.device, train_data: Any, eval_data: Any, batch_size: int, shuffle: bool,
                        drop_last: bool, num_workers: int, seed: int, validation_split: float,
                        steps_per_epoch: int | None, validation_steps: int | None,
                        initial_epoch: int, eval_steps: int | None = None) -> tuple[Any, Any]:
    """The (train, eval) data after the Keras options (checked; ``initial_epoch``/``eval_steps`` go to the loop)."""
    check_positive(steps_per_epoch=steps_per_epoch, validation_steps=validation_steps, eval_steps=eval_steps)
    if isinstance(initial_epoch, bool) or not isinstance(initial_epoch, int) or initial_epoch < 0:
        raise ValueError(f"initial_epoch={initial_epoch!r} must be an integer >= 0")
    if validation_split:
        if not 0.0 < float(validation_split) < 1.0:
            raise ValueError(f"validation_split={validation_split!r} must be a fraction in (0, 1)")
        if eval_data is not None:
            raise ValueError("give either eval_data or validation_split, not both")
        train_data, eval_data = _split(train_data, float(validation_split))
    pin = device.type == "cuda"
    if steps_per_epoch is not None:
        train = build_adapter(train_data, batch_size, shuffle=shuffle, drop_last=drop_last, num_workers=num_workers,
                              seed=seed, pin_memory=pin, role="train")
        train_data = LimitedAdapter.wrap(train, steps_per_epoch)
    if validation_steps is not None and eval_data is not None:
        ev = build_adapter(eval_data, batch_size, num_workers=num_workers, pin_memory=pin, role="eval")
        eval_data = LimitedAdapter.wrap(ev, validation_steps)
    return train_data, eval_data


def check_call_order(train_data: Any, eval_data: Any, batch_size: Any, epochs: Any, convention: str) -> None:
    """Errors and warnings for positional calls that would silently mean something else in the other convention."""
    for name, value in (("eval_data", eval_data),):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            order = ("fit(train_data, eval_data, batch_size, epochs, ...)" if convention == "paddle"
                     else "fit(train_data, eval_data, epochs, batch_size, ...)")
            raise TypeError(f"{name}={value!r} is a number, not data: this fit is {order}; pass numbers by "
                            f"keyword (e.g. epochs=10, batch_size=64)")
    try:
        n = len(train_data)
    except TypeError:
        return
    bs = batch_size[0] if isinstance(batch_size, (list, tuple)) and batch_size else batch_size
    loader = hasattr(train_data, "batch_sampler")
    if convention == "paddle" and isinstance(bs, int) and isinstance(n, int) and 0 < n < bs and epochs == 1 \
            and not loader:
        other = "fleetlite.Trainer.fit puts epochs before batch_size"
        warnings.warn(f"batch_size={bs} is larger than the {n} training samples and epochs=1: did you mean "
                      f"epochs={bs}? ({other}; pass them by keyword to be sure)", UserWarning, stacklevel=3)
