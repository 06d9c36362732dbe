"""``fleetlite.callbacks``: the Trainer's callbacks (Paddle's ``paddle.callbacks``).

Example::

    from fleetlite.callbacks import EarlyStopping, ModelCheckpoint
"""

from .trainer.callbacks import *  # noqa: F401,F403
from .trainer.callbacks import __all__  # noqa: F401
