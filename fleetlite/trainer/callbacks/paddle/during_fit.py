"""``DuringFit``: whether a callback's hooks run inside a training run (between ``on_train_begin`` and
``on_train_end``), whoever drives them: ``fit``, or a Paddle script calling the hooks itself after
``set_model(model)``, as Paddle's own tests do."""

from __future__ import annotations

__all__ = ["DuringFit"]


class DuringFit:
    """Mixin of Paddle's ``EarlyStopping`` and ``ReduceLROnPlateau``: they act on the evaluations of a training run
    only (a standalone ``evaluate()`` is not an epoch of ``fit``). ``self._training`` is True from
    ``on_train_begin`` (the class calls :meth:`_start_training`) until ``on_train_end`` or ``on_exception``; it
    is the callback's own state, so it needs nothing from the object given to ``set_model``."""

    _training = False

    def _start_training(self) -> None:
        self._training = True

    def on_train_end(self, logs=None) -> None:
        self._training = False

    def on_exception(self, error: BaseException) -> None:
        self._training = False
