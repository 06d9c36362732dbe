"""Checks of a composed recipe config that types alone cannot express, each failing with one clear line.

Hydra and the schemas (:mod:`fleetlite.recipe.schema`) already refuse wrong
types and unknown keys of plain overrides; this module adds the rest: keys
appended with ``+key=value``, values out of range (lr <= 0, ...), settings
that do not fit the number of ranks, a missing checkpoint for
``resume=latest``, an unwritable run directory. It also turns Hydra's
multi-line composition errors into one line.

Example::

    from fleetlite.recipe.validate import ConfigError, check_config
    try:
        check_config(cfg, world_size=2)
    except ConfigError as e:
        raise SystemExit(f"error: {e}")
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import math
import os
import re
import uuid
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from fleetlite.checkpoint import CheckpointError, earlier_checkpoints, is_checkpoint_dir, list_checkpoints, load_newest
from fleetlite.distributed.fleet.strategy import DistributedStrategy
from fleetlite.trainer.checkpoint_connector import REQUIRED
from fleetlite.utils.atomic import why_unwritable

from .schema import LAUNCH_TIME_VAR, SCHEMAS, RecipeConfig

__all__ = ["ConfigError", "check_config", "check_known_keys", "check_run_dir", "check_resume",
           "choose_resume_checkpoint", "check_restartable", "describe_compose_error", "CHECKPOINT_SUBDIR"]

CHECKPOINT_SUBDIR = "checkpoints"


class ConfigError(ValueError):
    """A recipe setting is wrong; the message is one line saying what, why and how to fix it.

    Example::

        raise ConfigError("optim.lr=0.0 must be a positive number (the learning rate); e.g. optim.lr=0.05")
    """


#: Keys that were renamed: the old name -> the new one (a config or override using the old name is refused, naming
#: the new one).
RENAMED_KEYS = {
    "trainer.batch_size": ("trainer.global_batch_size", "the batch of one optimizer step over all ranks, split "
                           "across them; Trainer.fit(batch_size=) is the per-rank batch"),
}


def _renamed(full_key: str) -> str | None:
    """The one-line error for a key that was renamed (None for any other key)."""
    if full_key not in RENAMED_KEYS:
        return None
    new, what = RENAMED_KEYS[full_key]
    return f"{full_key} was renamed {new} ({what}): write {new}=... instead (in overrides and in config files)"


def _fields(schema: type) -> list[str]:
    return [f.name for f in dataclasses.fields(schema)]


def _suggest(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'? " if close else ""


def check_known_keys(cfg: DictConfig, schema: type = RecipeConfig, prefix: str = "") -> None:
    """Refuse keys a schema does not declare (Hydra lets ``+key=value`` append them)."""
    valid = _fields(schema)
    for key in cfg.keys():
        key = str(key)
        if key == "hydra" and not prefix:
            continue
        full = f"{prefix}{key}"
        if key not in valid:
            _need(_renamed(full) is None, str(_renamed(full)))
            raise ConfigError(f"unknown key '{full}' ({schema.__name__} has no field '{key}'): "
                              f"{_suggest(key, valid)}remove it; valid keys: {', '.join(valid)}")
        node = cfg._get_node(key)
        if isinstance(node, DictConfig) and not node._is_none() and not node._is_missing():
            sub = OmegaConf.get_type(node)
            if dataclasses.is_dataclass(sub):
                check_known_keys(node, sub, f"{full}.")


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _finite_positive(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def _schema_name(node: DictConfig, group: str) -> str:
    sub = OmegaConf.get_type(node)
    names = [n for (g, n), s in SCHEMAS.items() if g == group and s is sub]
    return names[0] if names else str(node.get("name"))


def check_config(cfg: DictConfig, world_size: int = 1) -> None:
    """Check every value of the composed recipe config; raise :class:`ConfigError` on the first problem."""
    check_known_keys(cfg)
    o, s, t, d, m = cfg.optim, cfg.sched, cfg.trainer, cfg.data, cfg.model
    for group in ("model", "optim", "sched"):
        node = cfg[group]
        expected = _schema_name(node, group)
        _need(node.name == expected, f"{group}.name={node.name!r} does not match the {group} option in use "
                                     f"({expected}); choose another option with {group}={node.name} instead")
    # optimizer
    _need(_finite_positive(o.lr), f"optim.lr={o.lr} must be a positive number (the learning rate); e.g. optim.lr=0.05")
    _need(o.weight_decay >= 0, f"optim.weight_decay={o.weight_decay} must be >= 0; e.g. optim.weight_decay=5e-4")
    if o.name == "sgd":
        _need(0 <= o.momentum < 1, f"optim.momentum={o.momentum} must be in [0, 1); e.g. optim.momentum=0.9")
        _need(not o.nesterov or o.momentum > 0, "optim.nesterov=true needs optim.momentum > 0; "
                                                "set optim.momentum=0.9 or optim.nesterov=false")
    else:
        _need(len(o.betas) == 2 and all(0 <= b < 1 for b in o.betas),
              f"optim.betas={list(o.betas)} must be two numbers in [0, 1); e.g. optim.betas=[0.9,0.999]")
        _need(_finite_positive(o.eps), f"optim.eps={o.eps} must be positive; e.g. optim.eps=1e-8")
    # trainer
    _need(t.epochs >= 1, f"trainer.epochs={t.epochs} must be at least 1")
    _need(t.max_steps is None or t.max_steps >= 1, f"trainer.max_steps={t.max_steps} must be at least 1 (or null)")
    for key in ("global_batch_size", "eval_batch_size"):
        value = t[key]
        if value is None:
            continue
        _need(value >= 1, f"trainer.{key}={value} must be at least 1")
        _need(value >= world_size, f"trainer.{key}={value} is smaller than the number of ranks ({world_size}): "
                                   f"it is the global batch, split across ranks, so every rank would get none; "
                                   f"set trainer.{key}={world_size} or more")
    g, n = t.global_batch_size, world_size
    _need(g % n == 0, f"trainer.global_batch_size={g} does not divide among {n} ranks: each rank takes an equal "
                      f"share of the global batch, so {g} would train with {g // n * n}; set "
                      f"trainer.global_batch_size to a multiple of {n}, e.g. {g // n * n} or {-(-g // n) * n}")
    for key in ("eval_freq", "log_freq", "save_freq"):
        _need(t[key] >= 1, f"trainer.{key}={t[key]} must be at least 1 (every N epochs/steps)")
    for key in ("save_steps", "keep_last"):
        _need(t[key] is None or t[key] >= 1, f"trainer.{key}={t[key]} must be at least 1 (or null)")
    _need(0 <= t.label_smoothing < 1, f"trainer.label_smoothing={t.label_smoothing} must be in [0, 1)")
    _need(not t.callbacks.tensorboard or _importable("tensorboard"),
          "trainer.callbacks.tensorboard=true needs the tensorboard package, which is not installed: "
          "pip install tensorboard (or 'fleetlite[tensorboard]'), or drop the override")
    es = t.callbacks.early_stopping
    _need(es.patience >= 1, f"trainer.callbacks.early_stopping.patience={es.patience} must be at least 1")
    # schedule
    if s.name == "cosine":
        _need(0 <= s.warmup_epochs < t.epochs, f"sched.warmup_epochs={s.warmup_epochs} must be in [0, "
                                               f"trainer.epochs={t.epochs}); lower it or train longer")
        _need(0 <= s.min_lr_ratio <= 1, f"sched.min_lr_ratio={s.min_lr_ratio} must be in [0, 1]")
    elif s.name == "onecycle":
        _need(0 < s.pct_start < 1, f"sched.pct_start={s.pct_start} must be in (0, 1); e.g. sched.pct_start=0.25")
        _need(_finite_positive(s.div_factor) and _finite_positive(s.final_div_factor),
              "sched.div_factor and sched.final_div_factor must be positive numbers")
    # data
    for key in ("train_size", "test_size"):
        value = d[key]
        _need(value is None or value >= 1, f"data.{key}={value} must be a positive number of samples (or null)")
    _need(d.seed >= 0, f"data.seed={d.seed} must be an integer >= 0")
    _need(bool(str(d.root).strip()), "data.root is empty; set it to a directory, e.g. data.root=data/cifar10")
    # model
    if m.name == "resnet18":
        _need(m.width >= 1, f"model.width={m.width} must be at least 1 (64 is ResNet-18)")
    elif m.name == "fast":
        _need(len(m.widths) == 3 and all(w >= 1 for w in m.widths),
              f"model.widths={list(m.widths)} must be three positive channel counts, e.g. [64,256,256]")
        _need(0 < m.bn_momentum <= 1, f"model.bn_momentum={m.bn_momentum} must be in (0, 1]")
    # top level
    _need(bool(str(cfg.run_dir).strip()), "run_dir is empty; set run_dir=outputs/my_run or drop the override")
    _check_strategy(cfg.strategy, world_size)


def _check_strategy(node: DictConfig, world_size: int) -> None:
    values = OmegaConf.to_container(node, resolve=True, enum_to_str=True)
    try:
        DistributedStrategy.from_dict(values).check_supported(world_size)
    except (ValueError, KeyError, AttributeError, NotImplementedError) as e:
        text = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        raise ConfigError(f"strategy: {text}") from None


def check_resume(resume: str | None, run_dir: str | os.PathLike) -> None:
    """The refusals of :func:`choose_resume_checkpoint` that need no reading, made before anything is written:
    a fresh run over an earlier run's checkpoints, ``resume=latest`` with none, a path that does not exist."""
    ckpt_dir = Path(run_dir) / CHECKPOINT_SUBDIR
    if resume is None or str(resume).strip() == "":
        _refuse_overwrite(ckpt_dir)
    elif str(resume) == "latest":
        if not list_checkpoints(ckpt_dir):
            raise ConfigError(f"resume=latest but {ckpt_dir} holds no checkpoint: point run_dir= at the "
                              "directory of the run to continue, or drop resume= to start afresh")
    elif str(resume) != "auto" and not Path(resume).is_file() and not is_checkpoint_dir(Path(resume)):
        raise ConfigError(f"resume={resume}: no such checkpoint file; give an existing .pt file, or "
                          "resume=latest with run_dir=<the earlier run>")


def choose_resume_checkpoint(resume: str | None, run_dir: str | os.PathLike):
    """The checkpoint ``resume`` names: None (a fresh start; ``auto`` too when there is none yet), the newest in
    ``run_dir/checkpoints`` (``latest``, ``auto``) or a path. ``latest``/``auto`` validate a file by loading it:
    it comes back as a ``LoadedCheckpoint`` (read once here); a sharded checkpoint directory, or a path given by
    the user (checked to exist, not read), as a ``Path``. The newest valid checkpoint of either kind is
    :func:`fleetlite.checkpoint.load_newest`'s (a directory comes back with its rank-0 entries read)."""
    check_resume(resume, run_dir)
    if resume is None or str(resume).strip() == "":
        return None
    if str(resume) in ("latest", "auto"):
        ckpt_dir = Path(run_dir) / CHECKPOINT_SUBDIR
        try:  # a .pt file or a sharded (DCP) checkpoint directory
            found = load_newest(ckpt_dir.absolute(), require=REQUIRED) if ckpt_dir.is_dir() else None
        except CheckpointError as e:
            raise ConfigError(f"resume={resume}: {e}; pass resume=<path of a good checkpoint> instead") from None
        if found is None and str(resume) == "latest":
            raise ConfigError(f"resume=latest but {ckpt_dir} holds no valid checkpoint: point run_dir= at the "
                              "directory of the run to continue, or drop resume= to start afresh")
        return found  # auto with nothing to continue yet: None, a fresh start (restartable jobs pass resume=auto)
    return Path(resume)


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def _refuse_overwrite(ckpt_dir: Path) -> None:
    """A fresh run (no ``resume=``) must not overwrite the checkpoints of an earlier run in the same run_dir."""
    shown = earlier_checkpoints(ckpt_dir)
    if shown:
        raise ConfigError(f"run_dir={ckpt_dir.parent} already holds the checkpoints of an earlier run ({shown}) "
                          f"and a fresh run would overwrite them: continue it with resume=latest (or resume=auto), "
                          f"or start afresh in another run_dir (or delete {ckpt_dir})")


def check_restartable(resume: str | None, raw_run_dir: str, environ: dict[str, str] | None = None) -> str | None:
    """Refuse an elastic job whose restarts would not find its checkpoints; return a warning when they start over.

    Under torchrun with ``--max_restarts N`` (``TORCHELASTIC_MAX_RESTARTS``) a
    restart runs the recipe again, so ``run_dir`` (``raw_run_dir``, not yet
    resolved) must come out the same: ``${launch_time:...}`` (the default)
    does under ``fleetlite launch`` on one node, ``${now:...}`` never does.
    """
    env = os.environ if environ is None else environ
    try:
        restarts = int(env.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)
    except ValueError:
        restarts = 0
    if restarts <= 0:
        return None
    resume = None if resume is None or not str(resume).strip() else str(resume)
    if resume is None:
        return (f"--max_restarts {restarts} without resume=auto: a restarted worker group trains from scratch; add "
                "resume=auto (and trainer.save_steps=N) to continue from the newest checkpoint")
    if resume not in ("auto", "latest"):
        return (f"--max_restarts {restarts} with resume={resume}: every restart resumes from that same file, not "
                "from newer checkpoints; use resume=auto with run_dir=<that run's directory>")
    why = None
    if "${now:" in raw_run_dir:
        why = "it follows the current time (${now:...}), so each restart would look in a new directory"
    elif "${launch_time:" in raw_run_dir:
        if not env.get(LAUNCH_TIME_VAR):
            why = ("it takes the launch time, which plain torchrun does not keep across restarts (fleetlite launch "
                   "does)")
        elif env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE")) != env.get("WORLD_SIZE"):
            why = ("on several nodes the launch time differs between the nodes' launchers, and a restart may put "
                   "rank 0 on another node")
    if why is None:
        return None
    raise ConfigError(f"resume={resume} with --max_restarts {restarts}: run_dir={raw_run_dir} would not be the same "
                      f"directory after a restart: {why}; set run_dir=outputs/<job name> (on a filesystem every "
                      "node shares)")


def check_run_dir(run_dir: str | os.PathLike) -> Path:
    """Create ``run_dir`` if needed and prove it is writable (rank 0 only); raise ConfigError when not."""
    path = Path(run_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{uuid.uuid4().hex[:8]}"
        with open(probe, "w") as f:
            f.write("ok")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"run_dir={run_dir} is not writable ({why_unwritable(run_dir, e)}): choose a directory "
                          "you can write to, e.g. run_dir=outputs/my_run") from None
    return path


def _first_line(text: str) -> str:
    return next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")


def describe_compose_error(exc: BaseException) -> str:
    """One line for an error Hydra raised while composing the config (wrong type, unknown key or option...)."""
    from hydra.errors import MissingConfigException  # hydra: heavy, only for the recipes

    cause = exc.__cause__
    named = re.search(r"full_key: (\S+)", str(exc))  # a config file's key (the error of an override has a cause)
    if named and _renamed(named.group(1)):
        return str(_renamed(named.group(1)))
    if isinstance(exc, MissingConfigException):
        missing = exc.missing_cfg_file or _first_line(str(exc))
        group, _, option = str(missing).rpartition("/")
        if exc.options and group:
            return (f"{group}={option}: no such option in config group '{group}'; "
                    f"choose one of: {', '.join(sorted(exc.options))}")
        return " ".join(str(exc).split())
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)):
        key = getattr(cause, "full_key", None) or ""
        if _renamed(str(key)):
            return str(_renamed(str(key)))
        obj = getattr(cause, "object_type", None)
        valid = _fields(obj) if obj is not None and dataclasses.is_dataclass(obj) else []
        leaf = str(key).rpartition(".")[2]
        hint = f"{_suggest(leaf, valid)}valid keys: {', '.join(valid)}" if valid else "check the key"
        return f"unknown key '{key}' ({_first_line(cause.msg if hasattr(cause, 'msg') else cause)}): {hint}"
    if isinstance(cause, OmegaConfBaseException):
        key = getattr(cause, "full_key", None)
        what = _first_line(str(exc)).removeprefix("Error merging override ")
        fix = f"; set {key} to a valid value (add --cfg job to print the config)" if key else ""
        return f"{what}: {_first_line(getattr(cause, 'msg', None) or str(cause))}{fix}"
    return " ".join(str(exc).split())
