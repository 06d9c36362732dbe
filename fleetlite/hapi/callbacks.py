"""``paddle.hapi.callbacks`` names: the callbacks of :mod:`fleetlite.callbacks` and ``config_callbacks``.

Example::

    from fleetlite.hapi.callbacks import EarlyStopping, config_callbacks
"""

from ..trainer.callbacks import *  # noqa: F401,F403
from ..trainer.callbacks import __all__ as _callbacks
from ..trainer.callbacks._hapi import config_callbacks

__all__ = [*_callbacks, "config_callbacks"]
