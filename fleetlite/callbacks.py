"""``fleetlite.callbacks``: Paddle's ``paddle.callbacks`` (the import swap), over the Trainer's callbacks.

Paddle's names with Paddle's signatures, positional order, defaults and behaviour: ``Callback``,
``ProgBarLogger``, ``ModelCheckpoint(save_freq=1, save_dir=None)``, ``VisualDL``,
``LRScheduler(by_step=True, by_epoch=False)``, ``EarlyStopping(monitor='loss', ...)``,
``ReduceLROnPlateau(monitor='loss', ...)``, ``WandbCallback``; plus fleetlite's callbacks that have no Paddle
namesake (``TerminateOnNaN``, ``Preemption``, ``EMA``, ``CSVLogger``, ...), the same classes as in
:mod:`fleetlite.trainer.callbacks`, the Keras face's namespace. The two namespaces differ in four classes
only: ``ModelCheckpoint``, ``EarlyStopping``, ``ReduceLROnPlateau`` and ``LRScheduler`` (Paddle's here, the
Trainer's/Keras' there); each works under either face, and the class decides how it behaves.

Example::

    from fleetlite.callbacks import EarlyStopping, ModelCheckpoint
    model.fit(train_set, val_set, batch_size=64, epochs=10, callbacks=[EarlyStopping('loss', patience=2)])
"""

from .trainer.callbacks import *  # noqa: F401,F403
from .trainer.callbacks import __all__ as _shared
from .trainer.callbacks.paddle import *  # noqa: F401,F403
from .trainer.callbacks.paddle import __all__ as _paddle

__all__ = [*_shared]
for _name in _paddle:
    if _name not in __all__:
        __all__.append(_name)
del _name
