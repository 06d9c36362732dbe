"""Callbacks: the hooks the Trainer fires (:class:`Callback`), their dispatcher (:class:`CallbackList`), and the
built-ins, one module each (public as :mod:`fleetlite.callbacks`, Paddle's ``paddle.callbacks``).

Hooks and their arguments follow Keras (``on_train_batch_end(step, logs)``,
``on_epoch_end(epoch, logs)``, ...); every callback has ``state_dict()``/``load_state_dict()`` so its
state goes into the checkpoint (see :mod:`.base`).

=========================== =============================================================================
module                      callbacks
=========================== =============================================================================
``base``                    :class:`Callback` (the hooks), ``is_rank_zero``
``callback_list``           :class:`CallbackList` (dispatch, checkpoint keys)
``monitor``                 ``MonitorMixin``: monitor/mode/min_delta "did it improve" (Keras' and Paddle's rules)
``history``                 :class:`History` (added by ``fit``)
``progress``                :class:`ProgressBar`, :class:`ProgBarLogger` (Paddle's name)
``model_checkpoint``        :class:`ModelCheckpoint`
``backup_and_restore``      :class:`BackupAndRestore`
``early_stopping``          :class:`EarlyStopping`
``reduce_lr_on_plateau``    :class:`ReduceLROnPlateau`
``lr_scheduler``            :class:`LRScheduler` (a torch scheduler, per step or epoch)
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
``_build``, ``_hapi``       the callback lists of the Trainer and of ``fleetlite.Model`` (not exported)
=========================== =============================================================================

Example::

    import fleetlite

    class PrintLoss(fleetlite.callbacks.Callback):
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
