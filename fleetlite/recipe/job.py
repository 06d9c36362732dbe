"""A recipe's ``__main__``: check the command line, then run the Hydra job on the config the check composed.

``hydra.main`` composes the config itself, after :func:`~fleetlite.recipe.preflight.prepare_cli` composed
and checked it; :func:`run_recipe` runs a single run's job on the preflight's config instead (composed
once), through Hydra's own ``run_job`` (the run directory, ``.hydra/``, the run log's logging), exactly as
``hydra.main`` does. A multirun (``-m``: Hydra composes one config per job) and Hydra's informational flags
(``--help``, ``--cfg``...) go to ``hydra.main`` unchanged.

Example (the last lines of a recipe)::

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="cifar10")
    def main(cfg): ...

    if __name__ == "__main__":
        run_recipe(main, CONF_DIR, "cifar10")
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from .preflight import handed_on, prepare_cli

__all__ = ["run_recipe"]


def run_recipe(main: Callable[..., Any], config_dir: str | os.PathLike, config_name: str) -> Any:
    """Check the command line (one clear line and exit 2 on bad input), then run ``main``'s job on that config.

    ``main`` is the ``@hydra.main``-decorated function (called with a config, Hydra hands it through).
    """
    from hydra._internal.utils import detect_calling_file_or_module_from_task_function, detect_task_name  # hydra

    calling_file, calling_module = detect_calling_file_or_module_from_task_function(main)
    prepare_cli(config_dir, config_name, job_name=detect_task_name(calling_file, calling_module))
    pre = handed_on()
    if pre is None or pre.job is None:
        return main()  # hydra.main composes: each job of a multirun, or --help / --cfg
    return _run_job(main, *pre.job, config_name)


def _run_job(main: Callable[..., Any], cfg, loader, config_name: str) -> Any:
    """What ``hydra.main`` does for a single run once it has composed the config (``Hydra.run``)."""
    from hydra._internal.callbacks import Callbacks  # hydra: heavy, only for the recipes
    from hydra.core.utils import configure_log, run_job  # hydra: as above
    from hydra.types import HydraContext, RunMode  # hydra: as above
    from omegaconf import open_dict, read_write

    with read_write(cfg), open_dict(cfg):
        if cfg.hydra.mode is None:
            cfg.hydra.mode = RunMode.RUN
    configure_log(cfg.hydra.hydra_logging, cfg.hydra.verbose)
    callbacks = Callbacks(cfg)
    callbacks.on_run_start(config=cfg, config_name=config_name)
    ret = run_job(hydra_context=HydraContext(config_loader=loader, callbacks=callbacks), task_function=main,
                  config=cfg, job_dir_key="hydra.run.dir", job_subdir_key=None, configure_logging=True)
    callbacks.on_run_end(config=cfg, config_name=config_name, job_return=ret)
    return ret.return_value  # raises the job's exception, as hydra.main does
