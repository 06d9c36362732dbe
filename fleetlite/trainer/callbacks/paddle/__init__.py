"""Paddle's callbacks (``paddle.callbacks``), public as :mod:`fleetlite.callbacks` and
:mod:`fleetlite.hapi.callbacks`: Paddle's signatures, positional order, defaults and hooks.

Where Paddle and Keras differ, the class decides, not the face it runs under: these act after each evaluation
of ``fit`` (``on_eval_end``) on the evaluation logs (``'loss'``, metric names) and save Paddle's ``Model.save``
files, whether ``fleetlite.Model`` or ``fleetlite.Trainer`` runs them. Keras' classes of the same names are in
:mod:`fleetlite.trainer.callbacks`. Both share the hooks (:class:`~fleetlite.trainer.callbacks.Callback`) and
the "did it improve" rule (:mod:`~fleetlite.trainer.callbacks.monitor`). A Paddle script may also drive them by
hand after ``set_model(model)`` with a ``fleetlite.Model``, as Paddle's tests do: ``self.model`` is that Model and
``self.trainer`` its Trainer.

=========================== ======================================================================
module                      callbacks
=========================== ======================================================================
``model_checkpoint``        :class:`ModelCheckpoint` (``save_freq=1, save_dir=None``)
``lr_scheduler``            :class:`LRScheduler` (``by_step=True, by_epoch=False``)
``early_stopping``          :class:`EarlyStopping` (``monitor='loss', mode='auto', patience=0, ...``)
``reduce_lr_on_plateau``    :class:`ReduceLROnPlateau` (``monitor='loss', factor=0.1, patience=10, ...``)
``config``                  ``paddle_fit_callbacks`` (``Model.fit``'s defaults), ``PaddleCallbackList``
``during_fit``              ``DuringFit``: inside a training run? (the two above act only there)
=========================== ======================================================================

``ProgBarLogger``, ``VisualDL`` and ``WandbCallback`` have no Keras namesake: one class each, in
:mod:`fleetlite.trainer.callbacks`, exported here too.

Example::

    from fleetlite.callbacks import EarlyStopping, ModelCheckpoint
    model.fit(train_set, val_set, batch_size=64, epochs=20, save_dir="ckpt",
              callbacks=[EarlyStopping('loss', patience=2), ModelCheckpoint(save_freq=5)])
"""

from .early_stopping import EarlyStopping
from .lr_scheduler import LRScheduler
from .model_checkpoint import ModelCheckpoint
from .reduce_lr_on_plateau import ReduceLROnPlateau

__all__ = ["ModelCheckpoint", "LRScheduler", "EarlyStopping", "ReduceLROnPlateau"]
