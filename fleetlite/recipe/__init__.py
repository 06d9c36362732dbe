"""Support for the Hydra recipes in ``fleetlite/recipes/`` (configs in ``fleetlite/conf/``): one concept per module.

* :mod:`fleetlite.recipe.schema`    dataclass schemas of every config group, registered in Hydra's ConfigStore
* :mod:`fleetlite.recipe.validate`  value checks and one-line config errors
* :mod:`fleetlite.recipe.build`     config -> data, model, optimizer, schedule, strategy, callbacks
* :mod:`fleetlite.recipe.job`       a recipe's command: config composed once (Compose API), checked, one run dir
* :mod:`fleetlite.recipe.run`       a job's start (device, run directory, resume) and finish (plot, report)
* :mod:`fleetlite.utils.plot`       the training-curves PNG (shared with the Trainer's loggers)
* :mod:`fleetlite.recipe.catalog`   the shipped recipes (fleetlite/recipes/) and configs (fleetlite/conf/)

Nothing is imported here: each recipe imports the modules it uses.
"""
