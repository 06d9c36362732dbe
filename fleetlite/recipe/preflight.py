"""Before ``hydra.main`` runs: check the command line and agree on ONE run directory across ranks.

Hydra composes the config inside each process, so under torchrun every rank
would resolve ``${now:...}`` itself and make its own timestamped directory,
and every rank would write ``.hydra/`` and a log file. :func:`prepare_cli`
fixes both before Hydra starts:

1. compose the config exactly as Hydra will (each sweep value of ``-m``
   too) and check it (:mod:`fleetlite.recipe.validate`): a bad override
   stops every rank with ONE line on stderr (from rank 0) and exit status 2;
2. when several ranks run, start the process group (the connector's
   ``init_process_group``, Note [one device, one process group]); every rank learns
   every rank's verdict (a config bad on one rank only stops all of them),
   and ranks that composed different configs (other command lines, conf/
   files or environment) stop with the differences listed;
3. let rank 0 resolve ``run_dir`` (``${launch_time:...}``: one directory for
   all elastic restarts, :func:`~fleetlite.recipe.validate.check_restartable`),
   create it and prove it writable, choose the checkpoint ``resume=`` names
   (reading it at most once); every rank gets rank 0's answer (or its error),
   and the job gets the result (:func:`take_preflight`) instead of working it out again;
4. rewrite ``sys.argv`` so every rank passes the same ``run_dir=...``, and
   ranks other than 0 pass ``hydra.output_subdir=null`` and disabled Hydra
   logging: only rank 0 writes into the run directory.

The recipe's ``__main__`` calls it through :func:`fleetlite.recipe.job.run_recipe`, which then runs a
single run's job on the config composed here (once).

Example::

    prepare_cli(CONF_DIR, "cifar10")   # exits with one line on bad input; sys.argv now pins run_dir
    main()                              # the @hydra.main function (composes again: run_recipe avoids that)
"""

from __future__ import annotations

import copy
import itertools
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf, open_dict, read_write

from fleetlite.distributed import all_gather_object
from fleetlite.distributed.agreement import RankMismatchError, check_same_across_ranks, from_rank0
from fleetlite.distributed.env import read_env
from fleetlite.trainer.connector import init_process_group

from .schema import register_configs
from .validate import (
    ConfigError,
    check_config,
    check_restartable,
    check_run_dir,
    choose_resume_checkpoint,
    describe_compose_error,
)

__all__ = ["prepare_cli", "take_preflight", "handed_on", "Preflight", "fail", "agree", "rank", "world_size",
           "EXIT_CONFIG"]

#: Exit status of a run refused before training (bad config, data, run directory).
EXIT_CONFIG = 2
# passed to Hydra unchecked (--config-path replaces the recipe's config folder: Hydra checks that itself)
# what ranks other than 0 pass to Hydra: only rank 0 writes into the run directory
_RANK_HYDRA = ["hydra.output_subdir=null", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]
_HYDRA_INFO_FLAGS = ("help", "hydra_help", "version", "cfg", "info", "shell_completion", "config_path",
                     "experimental_rerun")
_MAX_SWEEP_CHECKS = 64


@dataclass(frozen=True)
class Preflight:
    """What :func:`prepare_cli` settled for a single run, handed on to the job (:func:`take_preflight`).

    ``resume`` is the agreed checkpoint path (None: a fresh start); ``loaded`` is what rank 0 read while
    choosing it (a ``LoadedCheckpoint`` for ``resume=latest``/``auto``, else None), so it is not read again.

    Example::

        Preflight(run_dir=Path("/abs/outputs/a"), resume=None, loaded=None)
    """

    run_dir: Path
    resume: str | None
    loaded: Any = None
    job: Any = None  # (the job's whole config, Hydra's config loader) when composed for it, else None


_handed_on: Preflight | None = None


def handed_on() -> Preflight | None:
    """The last :func:`prepare_cli`'s result (not consumed)."""
    return _handed_on


def take_preflight(run_dir: str | os.PathLike) -> Preflight | None:
    """The preflight's result for the job writing to ``run_dir`` (once; None for a multirun job or without one)."""
    global _handed_on
    found, _handed_on = _handed_on, None
    if found is None or found.run_dir != Path(run_dir).resolve():
        return None
    return found


def rank() -> int:
    """This process's rank from the launcher's variables (0 when not launched)."""
    return read_env().rank



def world_size() -> int:
    return read_env().world_size



def fail(message: str, status: int = EXIT_CONFIG, every_rank: bool = False) -> None:
    """Print ``error: message`` on one line (rank 0 only, or ``every_rank``) and exit with ``status``.

    Every rank calls it with the same message (the default), or each with its own (``every_rank``: a
    rank-specific error, such as a survivor's diagnosis of a lost peer).
    """
    if every_rank or rank() == 0:
        print(f"error: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
    raise SystemExit(status)


def agree(value):
    """Rank 0's ``value`` on every rank (``value`` itself when no process group exists)."""
    return from_rank0(value)


def _split_overrides(overrides: list[str]) -> tuple[list[str], list[list[str]]]:
    """Config overrides (no hydra.* ones) as a list of override lists: one per sweep combination."""
    from hydra.core.override_parser.overrides_parser import OverridesParser  # hydra: heavy, only for the recipes

    parsed = OverridesParser.create().parse_overrides(overrides)
    plain, sweeps = [], []
    for o in parsed:
        if o.is_hydra_override():
            continue
        if o.is_sweep_override():
            key = o.get_key_element()
            sweeps.append([f"{key}={v}" for v in o.sweep_string_iterator()])
        else:
            plain.append(o.input_line)
    combos = [plain + list(c) for c in itertools.islice(itertools.product(*sweeps), _MAX_SWEEP_CHECKS)]
    return plain, combos


def _compose(config_dir: str, config_name: str, overrides: list[str], extra_dir: str | None = None,
             job_name: str | None = None):
    """The config as Hydra will compose it; ``extra_dir`` (``--config-dir``) is searched as well, first.

    With ``job_name``: (the whole config of that job, ``hydra`` node included, as ``hydra.main`` composes it;
    Hydra's config loader), for the job to run on (:func:`fleetlite.recipe.job.run_recipe`).
    """
    from hydra import compose, initialize_config_dir  # hydra: heavy, only for the recipes
    from hydra.core.global_hydra import GlobalHydra  # hydra: as above
    from hydra.types import RunMode  # hydra: as above

    primary = str(Path(config_dir).resolve())
    if extra_dir is not None:  # the user's folder first, then the recipe's groups (as hydra.main's --config-dir)
        primary, overrides = extra_dir, [*overrides, f"hydra.searchpath=[file://{primary}]"]
    with initialize_config_dir(config_dir=primary, version_base="1.3", job_name=job_name or "app"):
        if job_name is None:
            return compose(config_name=config_name, overrides=overrides)
        hydra = GlobalHydra.instance().hydra
        full = hydra.compose_config(config_name, overrides, run_mode=RunMode.RUN, from_shell=True,
                                    with_log_configuration=False)
        return full, hydra.config_loader


def _job_part(full):
    """The job's config: ``full`` without its ``hydra`` node."""
    job = copy.deepcopy(full)
    with open_dict(job):
        del job["hydra"]
    return job


def prepare_cli(config_dir: str | os.PathLike, config_name: str, argv: list[str] | None = None,
                job_name: str | None = None) -> list[str]:
    """Check the Hydra command line in ``sys.argv`` and pin one run directory for every rank.

    Returns the new argument list (also written to ``sys.argv``). Calls
    :func:`fail` (one line, exit status 2) on bad input. Informational Hydra
    flags (``--help``, ``--cfg``, ``--info``...) are passed through untouched.
    With ``job_name`` (Hydra's name of the job), a single run's whole config
    is kept for the job (``Preflight.job_config``): it is composed once.
    """
    from hydra._internal.utils import get_args_parser  # hydra: heavy, only for the recipes

    register_configs()
    args_in = list(sys.argv[1:] if argv is None else argv)
    args = get_args_parser().parse_intermixed_args(args_in)  # Hydra's parser; flags may follow overrides here
    if any(getattr(args, flag, None) for flag in _HYDRA_INFO_FLAGS):
        return args_in
    config_name = args.config_name or config_name  # --config-name NAME: a config of the user's (--config-dir DIR)
    extra_dir = str(Path(args.config_dir).resolve()) if args.config_dir else None
    try:
        _, combos = _split_overrides(args.overrides)
    except Exception as e:  # noqa: BLE001 - Hydra's parser raises several types; all are user errors
        fail(f"cannot parse the overrides: {describe_compose_error(e)}")
    if len(combos) > 1 and not args.multirun:
        fail("an override lists several values (a sweep) but --multirun (-m) is not given; add -m, "
             "or give one value")
    n = world_size()
    cfgs, error, job = [], None, None
    for overrides in combos:
        try:
            if job_name is not None and not args.multirun:  # the job's whole config, its hydra.* overrides included
                extra = [*(_RANK_HYDRA if rank() else []), "hydra.mode=RUN"]  # what hydra.main adds
                job = _compose(str(config_dir), config_name, [*args.overrides, *extra], extra_dir, job_name)
                cfg = _job_part(job[0])
            else:
                cfg = _compose(str(config_dir), config_name, overrides, extra_dir)
            check_config(cfg, world_size=n)
        except ConfigError as e:
            error = str(e)
        except Exception as e:  # noqa: BLE001 - Hydra/OmegaConf composition errors
            error = describe_compose_error(e)
        if error is not None:
            break
        cfgs.append(cfg)
    if n > 1:
        init_process_group(cfgs[0].device.value if error is None else "auto")  # the connector's; the job reuses it
        # every rank learns every rank's verdict: a rank whose config alone is bad must not leave the others waiting
        failed = [(r, e) for r, e in enumerate(all_gather_object(error)) if e is not None]
        if failed:
            r, e = failed[0]
            fail(e if r == 0 else f"on rank {r}: {e}")
        _check_same_config(cfgs)
    elif error is not None:
        fail(error)
    cfg = cfgs[0]
    answer: dict = {}
    chosen = None
    if rank() == 0:
        try:
            run_dir = str(cfg.run_dir)  # resolves ${launch_time:...} once, here
            note = check_restartable(cfg.resume, _raw_run_dir(cfg))
            if note:
                print(f"warning: {note}", file=sys.stderr, flush=True)
            if not args.multirun:  # multirun jobs choose in their own run_dir/<job> directory
                chosen = choose_resume_checkpoint(cfg.resume, run_dir)
            check_run_dir(run_dir)
            answer = {"run_dir": run_dir, "resume": None if chosen is None else os.fspath(chosen)}
        except ConfigError as e:
            answer = {"error": str(e)}
        except Exception as e:  # noqa: BLE001 - e.g. a bad interpolation in run_dir
            answer = {"error": f"run_dir: {describe_compose_error(e)}"}
    answer = agree(answer)
    if "error" in answer:
        fail(answer["error"])
    global _handed_on
    _handed_on = None if args.multirun else Preflight(Path(answer["run_dir"]).resolve(), answer["resume"], chosen,
                                                      _pin_run_dir(job, answer["run_dir"]))
    flags = (["--multirun"] if args.multirun else []) + (["--run"] if args.run else [])
    flags += (["--config-dir", extra_dir] if extra_dir else []) + (["--config-name", args.config_name]
                                                                  if args.config_name else [])
    new_args = flags + [a for a in args.overrides if not _sets_run_dir(a)] + [f"run_dir={_quote(answer['run_dir'])}"]
    if rank() != 0:
        new_args += _RANK_HYDRA
    sys.argv = [sys.argv[0], *new_args]
    return new_args


def _pin_run_dir(job, run_dir: str):
    """The job's (config, loader) with ``run_dir`` set to rank 0's answer, recorded as Hydra records an override."""
    if job is None:
        return None
    from hydra._internal.config_loader_impl import get_overrides_dirname  # hydra: heavy, only for the recipes
    from hydra.core.override_parser.overrides_parser import OverridesParser  # hydra: as above

    full, loader = job
    task = [o for o in full.hydra.overrides.task if not _sets_run_dir(o)] + [f"run_dir={_quote(run_dir)}"]
    d = full.hydra.job.config.override_dirname
    dirname = get_overrides_dirname(OverridesParser.create().parse_overrides(task), list(d.exclude_keys),
                                    d.item_sep, d.kv_sep)
    with read_write(full), open_dict(full):
        full.run_dir = run_dir
        full.hydra.overrides.task = task
        full.hydra.job.override_dirname = dirname
    return full, loader


def _raw_run_dir(cfg) -> str:
    """``run_dir`` as written, interpolations unresolved (``outputs/${launch_time:%Y-%m-%d}/...``)."""
    return str(OmegaConf.to_container(cfg, resolve=False).get("run_dir"))


def _check_same_config(cfgs) -> None:
    """Fail (exit 2, one line showing the differences) when the ranks composed different configs."""
    plain = []
    for c in cfgs:
        d = OmegaConf.to_container(c, resolve=True, enum_to_str=True)
        d.pop("run_dir", None)  # rank 0 resolves it for everyone
        plain.append(d)
    try:
        check_same_across_ranks("recipe config", plain[0] if len(plain) == 1 else plain,
                                hint="run every rank with the same command line, the same conf/ files and the same "
                                     "values of the environment variables the config reads")
    except RankMismatchError as e:
        fail(str(e))


def _quote(value: str) -> str:
    """``value`` as a Hydra override value: quoted when it holds characters the override grammar reserves."""
    if re.fullmatch(r"[\w./:@+-]+", value):
        return value
    return "'" + value.replace("'", "\\'") + "'"


def _sets_run_dir(arg: str) -> bool:
    key = arg.split("=", 1)[0].lstrip("+~")
    return "=" in arg and key == "run_dir"
