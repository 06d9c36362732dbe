"""``paddle.hapi.model`` names: ``Model``, ``to_list``, ``prepare_distributed_context``.

Example::

    from fleetlite.hapi.model import Model, to_list
    assert to_list(3) == [3]
"""

from __future__ import annotations

from typing import Any

from ..trainer.model import Model

__all__ = ["Model", "to_list", "prepare_distributed_context"]


def to_list(value: Any) -> Any:
    """Paddle's helper: None stays None, a list/tuple becomes a list, anything else a one-element list."""
    if value is None:
        return value
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def prepare_distributed_context(place: Any = None) -> Any:
    """Paddle's ``prepare_distributed_context``: start the process group when launched on several ranks.

    Returns the ``ParallelEnv`` (single process: nothing is started).
    """
    from ..distributed import ParallelEnv, collective

    env = ParallelEnv()
    if env.nranks > 1 and not collective.is_initialized():
        collective.init_parallel_env()
    return env
