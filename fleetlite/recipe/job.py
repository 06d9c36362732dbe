"""A recipe's entry on Hydra's public Compose API: the command line, each job's config composed ONCE and checked,
and the job run in its run directory; a mistake is one ``error:`` line and an exit status.

:func:`main` turns a recipe function into its command (torchtune's ``config.parse``)::

    @job.main(CONF_DIR, "cifar10")
    def train(cfg: DictConfig) -> float: ...

    if __name__ == "__main__":
        sys.exit(train())        # the overrides come from sys.argv

What happens, in this order, in this module only:

1. the command line is Hydra's (``key=value``, ``group=option``, ``-m``, ``--config-dir``/``--config-name``);
   ``--help``, ``--cfg``, ``--info``... go to ``hydra.main`` unchanged (:func:`plan` returns None for them);
2. :func:`compose_jobs` composes one config per job (one, or one per sweep value with ``-m``) with
   ``hydra.compose`` and checks it (:func:`~fleetlite.recipe.validate.check_config`);
3. under a launcher, the connector starts the process group (Note [one device, one process group]); every rank
   learns every rank's verdict (a config bad on one rank stops all) and ranks that composed different configs
   stop with the differences listed;
4. rank 0 resolves ``run_dir`` (one for all ranks and elastic restarts), creates it, proves it writable and makes
   the resume checks that need no reading (:func:`~fleetlite.recipe.validate.check_resume`); every rank gets its
   answer. Any mistake up to here: ONE line (from rank 0) and exit status 2 (:data:`EXIT_CONFIG`), nothing written;
5. :func:`run_job` runs each job: its directory, ``.hydra/`` and the run log (rank 0 only), Hydra's job config
   (``HydraConfig.get()``), the function, and one ``error:`` line with an exit status for what it raises.
"""

from __future__ import annotations

import argparse
import copy
import functools
import inspect
import itertools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import InterpolationResolutionError

from fleetlite.distributed import all_gather_object
from fleetlite.distributed.agreement import RankMismatchError, check_same_across_ranks, from_rank0
from fleetlite.distributed.env import read_env
from fleetlite.trainer.connector import init_process_group

from .schema import register_configs
from .validate import (
    ConfigError,
    check_config,
    check_restartable,
    check_resume,
    check_run_dir,
    describe_compose_error,
)

__all__ = ["main", "plan", "compose_jobs", "check_command_line", "run_job", "Job", "fail", "EXIT_CONFIG"]

Recipe = Callable[[DictConfig], Any]
Check = Callable[[DictConfig, int], None]
#: A recipe's own schema and checks, by its config name (set by :func:`main`; cifar10 uses the shared ones).
_RECIPES: dict[str, tuple[type | None, Check | None]] = {}
#: Exit status of a run refused before training (bad config, data, run directory).
EXIT_CONFIG = 2
#: Hydra's informational flags: handed to ``hydra.main`` as they are.
_INFO_FLAGS = ("--help", "-h", "--hydra-help", "--version", "--cfg", "-c", "--info", "-i", "--shell-completion",
               "-sc", "--resolve", "--package", "-p")


@dataclass(frozen=True)
class Job:
    """One job of a command line: its whole config as Hydra composed it (``hydra`` node included) and its directory.

    Example::

        (job,) = plan(CONF_DIR, "cifar10", ["data=synthetic", "run_dir=outputs/a"])
        job.cfg.run_dir, job.dir      # the job's config (no hydra node); where it writes
    """

    config: DictConfig
    dir: Path

    @property
    def cfg(self) -> DictConfig:
        """The recipe's config: :attr:`config` without its ``hydra`` node, as ``hydra.main`` hands it on."""
        return _without_hydra(self.config)


def _without_hydra(full: DictConfig) -> DictConfig:
    cfg = copy.deepcopy(full)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def rank() -> int:
    """This process's rank from the launcher's variables (0 when not launched)."""
    return read_env().rank


def fail(message: str, status: int = EXIT_CONFIG, every_rank: bool = False) -> None:
    """Print ``error: message`` on one line (rank 0 only, or ``every_rank``) and exit with ``status``."""
    if every_rank or rank() == 0:
        print(f"error: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
    raise SystemExit(status)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Hydra's command line (the part a run needs); flags may follow the overrides."""
    p = argparse.ArgumentParser(add_help=False, prog="recipe")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--multirun", "-m", action="store_true")
    p.add_argument("--run", "-r", action="store_true")
    p.add_argument("--config-dir", "-cd")
    p.add_argument("--config-name", "-cn")
    p.add_argument("--config-path", "-cp")
    return p.parse_intermixed_args(argv)


def _job_overrides(overrides: list[str], multirun: bool) -> list[list[str]]:
    """The override list of each job: one, or one per combination of the sweeps' values (``-m``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser  # hydra: only for the recipes

    fixed, sweeps = [], []
    for o in OverridesParser.create().parse_overrides(overrides):
        if o.is_sweep_override():
            sweeps.append([f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()])
        else:
            fixed.append(o.input_line)
    if sweeps and not multirun:
        raise ConfigError("an override lists several values (a sweep) but --multirun (-m) is not given; add -m, "
                          "or give one value")
    return [fixed + list(values) for values in itertools.product(*sweeps)]


def compose_jobs(config_dir: str | os.PathLike, config_name: str, args: argparse.Namespace, world_size: int = 1,
                 job_name: str = "app") -> list[DictConfig]:
    """Each job's whole config, composed once by ``hydra.compose`` and checked; raises :class:`ConfigError`."""
    from hydra import compose, initialize_config_dir  # hydra: only for the recipes
    from hydra.types import RunMode  # hydra: as above

    _register(config_name)
    check = _RECIPES.get(config_name, (None, None))[1] or check_config
    primary, search = str(Path(args.config_path or config_dir).resolve()), _own_groups(config_dir, config_name)
    if args.config_dir:  # the user's folder first, then the recipe's groups (as hydra.main's --config-dir)
        search, primary = [primary, *search], str(Path(args.config_dir).resolve())
    extra = [f"hydra.searchpath=[{','.join(f'file://{p}' for p in search)}]"] if search else []
    try:
        jobs = _job_overrides(args.overrides, args.multirun)
        with initialize_config_dir(config_dir=primary, version_base="1.3", job_name=job_name):
            configs = [compose(args.config_name or config_name, [*o, *extra], return_hydra_config=True)
                       for o in jobs]
        for num, full in enumerate(configs):
            with read_write(full.hydra), open_dict(full.hydra):
                full.hydra.mode = RunMode.MULTIRUN if args.multirun else RunMode.RUN
                full.hydra.job.num, full.hydra.job.id = num, str(num)
            check(full, world_size)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - Hydra/OmegaConf parse, composition and interpolation errors
        raise ConfigError(describe_compose_error(e)) from e
    return configs


def plan(config_dir: str | os.PathLike, config_name: str, argv: list[str] | None = None,
         job_name: str = "app") -> list[Job] | None:
    """Steps 1-4 of the module doc: this command line's jobs, ready to run (None for Hydra's informational flags).

    Calls :func:`fail` (one line, exit status 2) on any mistake, before anything is written.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a.split("=", 1)[0] in _INFO_FLAGS for a in argv):
        return None
    world, args = read_env().world_size, parse_args(argv)
    configs, error = [], None
    try:
        configs = compose_jobs(config_dir, config_name, args, world, job_name)
    except ConfigError as e:
        error = str(e)
    if world > 1:
        init_process_group(configs[0].device.value if configs else "auto")  # the connector's; the job reuses it
        failed = [(r, e) for r, e in enumerate(all_gather_object(error)) if e is not None]
        if failed:  # a rank whose config alone is bad must not leave the others waiting
            r, e = failed[0]
            fail(e if r == 0 else f"on rank {r}: {e}")
        _check_same_config(configs)
    elif error is not None:
        fail(error)
    answer: dict[str, Any] = {}
    if rank() == 0:
        answer = _settle_run_dir(configs, args.overrides)
    answer = from_rank0(answer)
    if "error" in answer:
        fail(answer["error"])
    jobs = []
    for full in configs:
        with read_write(full), open_dict(full):
            full.run_dir = answer["run_dir"]
        jobs.append(Job(full, _job_dir(full)))
    return jobs


def _settle_run_dir(configs: list[DictConfig], overrides: list[str], quiet: bool = False) -> dict[str, Any]:
    """Rank 0: resolve ``run_dir`` once, create it and check the jobs' resume; ``{"run_dir"}`` or ``{"error"}``."""
    first = configs[0]
    try:
        run_dir = str(first.run_dir)  # resolves ${launch_time:...} once, here
        note = check_restartable(first.resume, str(OmegaConf.to_container(first, resolve=False)["run_dir"]))
        if note and not quiet:
            print(f"warning: {note}", file=sys.stderr, flush=True)
        check_run_dir(run_dir)
        for full in configs:
            with read_write(full), open_dict(full):
                full.run_dir = run_dir
            check_resume(full.resume, _job_dir(full))
    except ConfigError as e:
        return {"error": str(e)}
    except Exception as e:  # noqa: BLE001 - e.g. a bad interpolation in run_dir
        return {"error": f"run_dir: {describe_compose_error(e)}"}
    if _multirun(first) and not quiet:  # the sweep's config with the command line's overrides, as Hydra saves it
        _save(OmegaConf.merge(first, {"hydra": {"overrides": {"task": list(overrides)}}}),
              Path(run_dir) / "multirun.yaml")
    return {"run_dir": run_dir}


def _job_dir(full: DictConfig) -> Path:
    """Where the job writes: ``hydra.run.dir``, or ``hydra.sweep.dir/hydra.sweep.subdir`` in a multirun."""
    h = full.hydra
    if _multirun(full):
        return Path(str(h.sweep.dir), str(h.sweep.subdir)).absolute()
    return Path(str(h.run.dir)).absolute()


def _multirun(full: DictConfig) -> bool:
    return str(full.hydra.mode).endswith("MULTIRUN")


def _check_same_config(configs: list[DictConfig]) -> None:
    """Fail (exit 2, one line showing the differences) when the ranks composed different configs."""
    plain = []
    for full in configs:
        d = OmegaConf.to_container(_without_hydra(full), resolve=True, enum_to_str=True)
        d.pop("run_dir", None)  # rank 0 resolves it for everyone
        plain.append(d)
    try:
        check_same_across_ranks("recipe config", plain[0] if len(plain) == 1 else plain,
                                hint="run every rank with the same command line, the same conf/ files and the same "
                                     "values of the environment variables the config reads")
    except RankMismatchError as e:
        fail(str(e))


def _save(cfg: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(OmegaConf.to_yaml(cfg), encoding="utf-8")


def run_job(fn: Recipe, job: Job) -> Any:
    """Step 5: run ``fn`` on ``job`` in its directory; what it raises becomes one ``error:`` line and an exit status.

    Rank 0 writes ``.hydra/`` (config, hydra, overrides) and the run log (Hydra's job logging); every rank
    sees the job's Hydra config through ``HydraConfig.get()``, as under ``hydra.main``.
    """
    from hydra.core.hydra_config import HydraConfig  # hydra: only for the recipes
    from hydra.core.utils import configure_log  # hydra: as above

    full, cfg = job.config, job.cfg
    with read_write(full.hydra), open_dict(full.hydra):
        full.hydra.runtime.output_dir = str(job.dir)
    HydraConfig.instance().set_config(full)
    job.dir.mkdir(parents=True, exist_ok=True)
    if rank() == 0:
        configure_log(full.hydra.job_logging, full.hydra.verbose)
        if full.hydra.output_subdir is not None:
            out = job.dir / str(full.hydra.output_subdir)
            for name, part in (("config", cfg), ("hydra", {"hydra": full.hydra}),
                               ("overrides", full.hydra.overrides.task)):
                _save(part, out / f"{name}.yaml")
    return _report(fn, cfg)


def _report(fn: Recipe, cfg: DictConfig) -> Any:
    """``fn(cfg)``, with every failure as one ``error:`` line: exit 2 for a config mistake, else 1."""
    from fleetlite.callbacks import NonFiniteLossError
    from fleetlite.checkpoint import CheckpointError
    from fleetlite.distributed import CollectiveError

    from .runlog import log_failure

    try:
        return fn(cfg)
    except ConfigError as e:  # bad data/device/resume settings found once the job started: one line, exit 2
        fail(str(e))
    except (CheckpointError, NonFiniteLossError) as e:  # disk full, damaged checkpoint; a diverged loss: exit 1
        fail(str(e), status=1)
    except CollectiveError as e:  # a rank was lost: each survivor's diagnosis on one line, exit 1
        fail(str(e), status=1, every_rank=True)
    except Exception as e:  # anything else: one line per failing rank here, the full traceback in the run log
        log = log_failure(e, rank())
        fail(f"{type(e).__name__}: {e}" + (f" (traceback in {log})" if log else ""), status=1, every_rank=True)


def check_command_line(config_dir: str | os.PathLike, config_name: str, argv: list[str],
                       world_size: int) -> str | None:
    """What a launcher checks before starting ``world_size`` workers: each job's config, its run directory and its
    resume (steps 2 and 4 of the module doc, in the launcher's process). Returns the one-line error, or None."""
    if any(a.split("=", 1)[0] in _INFO_FLAGS for a in argv):
        return None
    try:
        configs = compose_jobs(config_dir, config_name, parse_args(argv), world_size)
    except ConfigError as e:  # a value only the workers can resolve (${oc.env:LOCAL_RANK}): they check it
        return None if isinstance(e.__cause__, InterpolationResolutionError) else str(e)
    return _settle_run_dir(configs, argv, quiet=True).get("error")


def _own_groups(config_dir: str | os.PathLike, config_name: str) -> list[str]:
    """A recipe's own config groups, ``conf/<recipe>/<group>/`` (e.g. ``conf/gpt/hybrid/``), picked as
    ``<group>=option``: that folder joins Hydra's search path. Groups directly in ``conf/`` are shared."""
    own = Path(config_dir).resolve() / config_name
    return [str(own)] if own.is_dir() else []


def help_groups(recipe: str) -> str:
    """The ``== Configuration groups ==`` lines of a recipe's ``--help``: only the groups it takes, as picked on its
    command line (Hydra's ``$APP_CONFIG_GROUPS`` lists every folder of the config directory, another recipe's
    groups and the schemas included). A primary config's ``hydra.help.template`` names it as
    ``${fleetlite_groups:<recipe>}``."""
    from .catalog import config_groups

    return "\n".join(f"{g}: {', '.join(options)}" for g, options in sorted(config_groups(recipe).items()))


def _register(config_name: str) -> None:
    """The shared schemas, the recipe's own primary schema as ``<config_name>_schema``, the help's resolver."""
    if not OmegaConf.has_resolver("fleetlite_groups"):
        OmegaConf.register_new_resolver("fleetlite_groups", help_groups)
    register_configs()
    schema = _RECIPES.get(config_name, (None, None))[0]
    if schema is not None:
        from hydra.core.config_store import ConfigStore  # hydra: only for the recipes

        ConfigStore.instance().store(name=f"{config_name}_schema", node=schema)


def _hydra_main(fn: Recipe, config_dir: str | os.PathLike, config_name: str) -> None:
    """Hydra's own informational output (``--help``, ``--cfg job``, ``--info``...), read from ``sys.argv``."""
    import hydra  # hydra: only for the recipes

    _register(config_name)
    own = _own_groups(config_dir, config_name)
    if own and not any(a.startswith("hydra.searchpath=") for a in sys.argv):
        sys.argv.append(f"hydra.searchpath=[file://{own[0]}]")
    hydra.main(version_base="1.3", config_path=str(Path(config_dir).resolve()), config_name=config_name)(fn)()


def main(config_dir: str | os.PathLike, config_name: str, schema: type | None = None,
         check: Check | None = None) -> Callable[[Recipe], Callable[..., int]]:
    """Decorate a recipe function ``fn(cfg)``: calling it runs the command line's jobs and returns exit status 0
    (Hydra's informational flags, ``--help``, ``--cfg``..., are read from ``sys.argv`` by ``hydra.main``).

    A recipe with its own config (not CIFAR-10's groups) passes its primary ``schema`` (stored as
    ``<config_name>_schema``, named first in the primary YAML's defaults) and ``check(cfg, world_size)``, which
    raises :class:`~fleetlite.recipe.validate.ConfigError` (default: :func:`~fleetlite.recipe.validate.check_config`).
    Its own groups may live in ``conf/<config_name>/`` (:func:`_own_groups`).

    Example::

        @main(CONF_DIR, "cifar10")
        def train(cfg: DictConfig) -> float: ...

        sys.exit(train())            # or train(["data=synthetic", "trainer.epochs=1"])
    """

    if schema is not None or check is not None:
        _RECIPES[config_name] = (schema, check)

    def decorate(fn: Recipe) -> Callable[..., int]:
        name = Path(inspect.getfile(fn)).stem  # Hydra's job name: the recipe file's (the run log is <name>.log)

        @functools.wraps(fn)
        def command(argv: list[str] | None = None) -> int:
            jobs = plan(config_dir, config_name, argv, job_name=name)
            if jobs is None:
                _hydra_main(fn, config_dir, config_name)
            for job in jobs or []:
                run_job(fn, job)
            return 0

        command.recipe_config = (config_dir, config_name)  # for fleetlite run's check before a launch
        return command

    return decorate
