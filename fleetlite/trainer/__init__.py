"""fleetlite.trainer: the Keras-style Trainer, its callbacks, metrics and checkpoints, and Paddle's Model over it.

Public names: ``Trainer`` (also ``fleetlite.Trainer``), ``Model`` (Paddle's ``paddle.Model``, also
``fleetlite.Model``; a thin class that runs on a Trainer), ``History``. Callbacks: the Keras face's in
:mod:`fleetlite.trainer.callbacks`, Paddle's in :mod:`fleetlite.callbacks` (= ``fleetlite.hapi.callbacks``);
the metrics in :mod:`fleetlite.metric` (= ``fleetlite.trainer.metrics``); checkpoints in
:mod:`fleetlite.checkpoint` (saved and restored by :mod:`fleetlite.trainer.checkpoint_connector`).

Example::

    import fleetlite
    trainer = fleetlite.Trainer(net, opt, torch.nn.CrossEntropyLoss(), metrics=fleetlite.metric.Accuracy())
    trainer.fit(train_set, eval_data=test_set, epochs=3, save_dir="runs/a")
"""

from .callbacks import History
from .model import Model
from .trainer import Trainer

__all__ = ["Trainer", "Model", "History"]
