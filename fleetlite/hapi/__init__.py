"""``fleetlite.hapi``: Paddle's ``paddle.hapi`` module paths, for code that imports from them.

``fleetlite.hapi.Model`` is ``fleetlite.Model``; ``fleetlite.hapi.model`` and ``fleetlite.hapi.callbacks``
mirror ``paddle.hapi.model`` / ``paddle.hapi.callbacks``.

Example::

    from fleetlite.hapi.callbacks import config_callbacks
    from fleetlite.hapi.model import Model, to_list
"""

from ..trainer.model import Model

__all__ = ["Model"]
