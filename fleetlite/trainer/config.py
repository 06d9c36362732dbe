"""The run's configuration as the Trainer keeps it: plain values (checkpoints hold it), agreed across ranks."""

from __future__ import annotations

from typing import Any

__all__ = ["AgreedConfig", "plain_config"]


class AgreedConfig(dict):
    """A run config already found identical on every rank (the recipe's preflight compared it before the job
    started): ``Trainer(config=...)`` keeps it as a plain dict and does not compare it again.

    Example::

        config = AgreedConfig({"seed": 0})   # only when every rank's config was compared already
    """


def plain_config(config: Any) -> Any:
    """``config`` as plain values (a dict), resolving an OmegaConf DictConfig."""
    if isinstance(config, AgreedConfig):
        return dict(config)  # plain: checkpoints are read back with weights_only=True
    if config is None or isinstance(config, dict):
        return config
    if hasattr(config, "_metadata") and hasattr(config, "items"):  # an OmegaConf DictConfig
        from omegaconf import OmegaConf  # optional (recipes/Hydra): only for a DictConfig

        return OmegaConf.to_container(config, resolve=True)
    if hasattr(config, "items"):
        return dict(config.items())
    raise TypeError(f"config must be a dict (or an OmegaConf DictConfig), got {type(config).__name__}")
