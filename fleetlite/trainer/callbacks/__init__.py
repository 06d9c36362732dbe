"""Callbacks: the hooks the Trainer fires (:class:`Callback`), their dispatcher (:class:`CallbackList`), and the
built-ins, one module each. This package is the Keras face's namespace, ``fleetlite.trainer.callbacks``;
Paddle's namespace (``fleetlite.callbacks`` = ``fleetlite.hapi.callbacks``, the import swap for
``paddle.callbacks``) holds the same classes except four, whose Paddle versions are in :mod:`.paddle`.

Hooks and their arguments follow Keras (``on_train_batch_end(step, logs)``,
``on_epoch_end(epoch, logs)``, ...); every callback has ``state_dict()``/``load_state_dict()`` so its
state goes into the checkpoint (see :mod:`.base`). Every callback works under either face
(``fleetlite.Trainer``, ``fleetlite.Model``); where Paddle and Keras differ, the class decides.

=========================== =============================================================================
module                      callbacks
=========================== =============================================================================
``base``                    :class:`Callback` (the hooks), ``is_rank_zero``
``callback_list``           :class:`CallbackList` (dispatch, checkpoint keys)
``monitor``                 ``MonitorMixin``: monitor/mode/min_delta "did it improve" (Keras' and Paddle's rules)
``history``                 :class:`History` (added by ``fit``)
``progress``                :class:`ProgressBar`, :class:`ProgBarLogger` (Paddle's, epochs counted from 1)
``model_checkpoint``        :class:`ModelCheckpoint` (full-state, resumable; Paddle's: ``paddle.model_checkpoint``)
``backup_and_restore``      :class:`BackupAndRestore`
``early_stopping``          :class:`EarlyStopping` (Keras; Paddle's: ``paddle.early_stopping``)
``reduce_lr_on_plateau``    :class:`ReduceLROnPlateau` (Keras) and the plateau rule Paddle's shares
``lr_scheduler``            :class:`LRScheduler` (a torch scheduler, per step or epoch; Paddle's: in ``paddle``)
``learning_rate_scheduler`` :class:`LearningRateScheduler` (Keras' schedule function)
``lr_monitor``              :class:`LearningRateMonitor`
``csv_logger``              :class:`CSVLogger`
``tensorboard``             :class:`TensorBoard`
``visualdl``                :class:`VisualDL`
``tracker``                 the trackers' shared base (Note [tracker callbacks])
``mlflow_logger``           :class:`MLflowLogger`
``wandb_callback``          :class:`WandbCallback`
``terminate_on_nan``        :class:`TerminateOnNaN` (and its :class:`NonFiniteLossError`)
``preemption``              :class:`Preemption`
``ema``                     :class:`EMA`
``profiler``                :class:`Profiler`
``lambda_callback``         :class:`LambdaCallback`
``paddle``                  Paddle's ModelCheckpoint, LRScheduler, EarlyStopping, ReduceLROnPlateau; fit defaults
=========================== =============================================================================

Example::

    import fleetlite

    class PrintLoss(fleetlite.trainer.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            print(epoch, logs["loss"])

    trainer.fit(train_set, epochs=2, callbacks=[PrintLoss()])
"""

from .backup_and_restore import BackupAndRestore
from .base import Callback
from .callback_list import CallbackList
from .csv_logger import CSVLogger
from .early_stopping import EarlyStopping
from .ema import EMA
from .history import History
from .lambda_callback import LambdaCallback
from .learning_rate_scheduler import LearningRateScheduler
from .lr_monitor import LearningRateMonitor
from .lr_scheduler import LRScheduler
from .mlflow_logger import MLflowLogger
from .model_checkpoint import ModelCheckpoint
from .preemption import Preemption
from .profiler import Profiler
from .progress import ProgBarLogger, ProgressBar
from .reduce_lr_on_plateau import ReduceLROnPlateau
from .tensorboard import TensorBoard
from .terminate_on_nan import NonFiniteLossError, TerminateOnNaN
from .visualdl import VisualDL
from .wandb_callback import WandbCallback

__all__ = ["Callback", "CallbackList", "History", "ProgressBar", "ProgBarLogger", "ModelCheckpoint",
           "BackupAndRestore", "EarlyStopping", "ReduceLROnPlateau", "LRScheduler", "LearningRateScheduler",
           "LearningRateMonitor", "CSVLogger", "TensorBoard", "VisualDL", "MLflowLogger", "WandbCallback",
           "TerminateOnNaN", "NonFiniteLossError", "Preemption", "EMA", "Profiler", "LambdaCallback"]
