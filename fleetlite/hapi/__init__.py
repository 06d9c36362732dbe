"""``fleetlite.hapi``: Paddle's ``paddle.hapi`` module paths, for code that imports from them.

``fleetlite.hapi.Model`` is ``fleetlite.Model``; ``fleetlite.hapi.model``, ``fleetlite.hapi.callbacks`` and
``fleetlite.hapi.progressbar`` mirror ``paddle.hapi.model`` / ``paddle.hapi.callbacks`` /
``paddle.hapi.progressbar``.

Example::

    from fleetlite.hapi.callbacks import config_callbacks
    from fleetlite.hapi.model import Model, to_list
    from fleetlite.hapi.progressbar import ProgressBar
"""

from ..trainer.model import Model

__all__ = ["Model"]
