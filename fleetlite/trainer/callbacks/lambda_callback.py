"""``LambdaCallback``: Keras' callback made of plain functions. Public through :mod:`fleetlite.callbacks`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import HOOKS, Callback

__all__ = ["LambdaCallback"]


class LambdaCallback(Callback):
    """Keras' ``LambdaCallback``: a callback from plain functions, e.g. ``on_epoch_end=lambda epoch, logs: ...``.

    Any hook name of :class:`Callback` is accepted; Keras' ``on_batch_begin``/``on_batch_end`` mean the
    training batch hooks.

    Example::

        trainer.fit(data, epochs=2, callbacks=[LambdaCallback(on_epoch_end=lambda e, logs: print(e, logs))])
    """

    def __init__(self, on_epoch_begin=None, on_epoch_end=None, on_batch_begin=None, on_batch_end=None,
                 on_train_begin=None, on_train_end=None, **kwargs: Callable[..., Any]) -> None:
        super().__init__()
        given = dict(on_epoch_begin=on_epoch_begin, on_epoch_end=on_epoch_end, on_train_batch_begin=on_batch_begin,
                     on_train_batch_end=on_batch_end, on_train_begin=on_train_begin, on_train_end=on_train_end)
        for name, fn in kwargs.items():
            if name not in HOOKS:
                raise TypeError(f"LambdaCallback: unknown hook {name!r}; hooks are {', '.join(HOOKS)}")
            given[name] = fn
        for name, fn in given.items():
            if fn is not None:
                setattr(self, name, fn)
