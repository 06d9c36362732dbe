"""Config -> objects for the recipes: device, data, model, optimizer, schedule, strategy, callbacks.

Each builder takes one config group (see :mod:`fleetlite.recipe.schema`) and
returns plain fleetlite/torch objects; the recipe script wires them together.
Errors a user can fix (no CIFAR-10 offline, no CUDA) raise
:class:`~fleetlite.recipe.validate.ConfigError` with one line.

Example::

    data = build_data(cfg.data, cfg.trainer, device=torch.device("cpu"), world_size=1, rank=0)
    model = build_model(cfg.model, num_classes=len(data.classes), whitening_images=data.whitening_images)
    optimizer = build_optimizer(cfg.optim, model)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from fleetlite.distributed.agreement import from_rank0
from fleetlite.distributed.fleet import DistributedStrategy
from fleetlite.distributed.fleet.recompute import resolve_checkpoints
from fleetlite.io import TensorLoader
from fleetlite.trainer import callbacks as cb  # the Trainer's (Keras') callbacks: the recipe runs a Trainer
from fleetlite.trainer.connector import resolve_device as rank_device
from fleetlite.vision import datasets
from fleetlite.vision.models import build_model as build_vision_model
from fleetlite.vision.transforms import CIFAR10_MEAN, CIFAR10_STD

from .runlog import EpochLog
from .validate import CHECKPOINT_SUBDIR, ConfigError

__all__ = ["Data", "resolve_device", "apply_speed_flags", "build_data", "build_model", "build_optimizer",
           "build_scheduler", "build_strategy", "build_callbacks", "build_loggers", "check_recompute", "model_card",
           "optimizer_steps_per_epoch", "METRICS_FILE", "PLOT_FILE", "MODEL_FILE"]

METRICS_FILE = "metrics.csv"
PLOT_FILE = "training_curves.png"
MODEL_FILE = "model.safetensors"  # the trained weights (+ model.json), fleetlite.vision.models.from_safetensors
_WHITENING_IMAGES = 5000


def resolve_device(device: str) -> torch.device:
    """``auto`` -> this rank's GPU when CUDA is present, else the CPU; ``cuda`` without CUDA is an error.

    The connector decides (``fleetlite.trainer.connector.resolve_device``, Note [one device, one process
    group]); this only words its error for the recipe's ``device=`` key.
    """
    try:
        return rank_device(device)
    except ValueError:
        raise ConfigError(f"device={device} but no CUDA device is available here; use device=auto or "
                          "device=cpu") from None


def apply_speed_flags(trainer_cfg: DictConfig, device: torch.device) -> dict[str, bool]:
    """Turn on ``cudnn.benchmark`` and TF32 matmuls/convolutions as ``trainer.cudnn_benchmark`` /
    ``trainer.allow_tf32`` say (``null``: on for CUDA runs, off on the CPU); returns what was applied, for the
    run's recorded config."""
    on_cuda = device.type == "cuda"
    benchmark = on_cuda if trainer_cfg.get("cudnn_benchmark") is None else bool(trainer_cfg.cudnn_benchmark)
    tf32 = on_cuda if trainer_cfg.get("allow_tf32") is None else bool(trainer_cfg.allow_tf32)
    torch.backends.cudnn.benchmark = benchmark
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    return {"cudnn_benchmark": benchmark, "allow_tf32": tf32}


@dataclass
class Data:
    """The recipe's input: per-rank loaders over uint8 tensors, the class names, images for whitening.

    Example::

        data = build_data(cfg.data, cfg.trainer, torch.device("cpu"))
        for images, labels in data.train:   # this rank's share of each global batch
            ...
    """

    train: Any
    test: Any
    classes: list[str]
    whitening_images: torch.Tensor  # normalised float images (first N of the training split), same on every rank


def _load_split(cfg: DictConfig, mode: str, size: int | None, download: bool):
    if cfg.name.value == "synthetic":
        ds = datasets.SyntheticCifar10(mode=mode, size=size, seed=int(cfg.seed))
        return ds.as_tensors(), list(ds.classes)
    try:
        ds = datasets.Cifar10(mode=mode, download=download, root=str(cfg.root))
    except Exception as e:  # noqa: BLE001 - network, missing or corrupt files: all end the same way
        how = "the download failed" if download else "data.download=false"
        raise ConfigError(f"data=cifar10: no CIFAR-10 {mode} split under data.root={cfg.root} and {how} "
                          f"({_short_reason(e)}); put cifar-10-python.tar.gz under data.root, or run offline with "
                          "data=synthetic") from None
    images, labels = ds.as_tensors()
    if size is not None:
        images, labels = images[:size], labels[:size]
    return (images, labels), list(ds.classes)


def _short_reason(e: BaseException, limit: int = 120) -> str:
    """The root cause of a data-set failure in a few words: the network error under the data set's own advice
    (which the recipe's one line replaces), its first clause, at most ``limit`` characters."""
    cause = e.__context__ if e.__suppress_context__ and e.__context__ is not None else e
    text = " ".join(str(cause).split()).split("; ")[0]
    text = f"{type(cause).__name__}: {text}" if text else type(cause).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def build_data(cfg: DictConfig, trainer_cfg: DictConfig, device: torch.device, world_size: int = 1,
               rank: int = 0) -> Data:
    """Load (rank 0 first: it downloads) and wrap both splits in :class:`fleetlite.io.TensorLoader`.

    ``trainer.global_batch_size`` is global: each rank's loader takes ``global_batch_size / world_size`` (checked
    to divide by :func:`~fleetlite.recipe.validate.check_config`).
    """
    splits: dict[str, Any] = {}
    error = None
    if rank == 0:  # rank 0 alone may download; the others read its files afterwards
        try:
            splits = {m: _load_split(cfg, m, cfg[f"{m}_size"], bool(cfg.download)) for m in ("train", "test")}
        except ConfigError as e:
            error = str(e)
    error = from_rank0(error)
    if error:
        raise ConfigError(error)
    if rank != 0:
        splits = {m: _load_split(cfg, m, cfg[f"{m}_size"], False) for m in ("train", "test")}
    (x_train, y_train), classes = splits["train"]
    (x_test, y_test), _ = splits["test"]
    keep = device if cfg.on_device else None
    common = dict(channels_last=bool(cfg.channels_last), device=keep, num_replicas=world_size, rank=rank,
                  pad_mode=cfg.pad_mode.value, mean=CIFAR10_MEAN, std=CIFAR10_STD)
    train_bs = max(int(trainer_cfg.global_batch_size) // world_size, 1)
    test_bs = max(int(trainer_cfg.eval_batch_size or trainer_cfg.global_batch_size) // world_size, 1)
    train = TensorLoader(x_train, y_train, batch_size=train_bs, shuffle=True, drop_last=True,
                         augment=bool(cfg.augment), seed=int(cfg.seed), **common)
    test = TensorLoader(x_test, y_test, batch_size=test_bs, shuffle=False, drop_last=False, augment=False,
                        seed=int(cfg.seed), **common)
    if len(train) == 0:
        raise ConfigError(f"data: {x_train.shape[0]} training samples make no full batch of "
                          f"{train_bs} per rank ({world_size} ranks, "
                          f"trainer.global_batch_size={trainer_cfg.global_batch_size}); "
                          "lower trainer.global_batch_size or raise data.train_size")
    n = min(_WHITENING_IMAGES, x_train.shape[0])
    plain = TensorLoader(x_train[:n], y_train[:n], batch_size=n, shuffle=False, augment=False, num_replicas=1,
                         rank=0, device=keep, mean=CIFAR10_MEAN, std=CIFAR10_STD)
    whitening_images, _ = next(iter(plain))
    return Data(train, test, classes, whitening_images)


def build_model(cfg: DictConfig, num_classes: int, whitening_images: torch.Tensor | None = None,
                channels_last: bool = False) -> torch.nn.Module:
    """The network ``model.name`` names; ``fast`` gets its whitening layer from ``whitening_images``.

    ``channels_last`` puts the weights in NHWC, to match channels-last input batches.
    """
    kwargs = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k not in ("name", "whiten")}
    model = build_vision_model(cfg.name, num_classes=num_classes, **kwargs)
    if cfg.name == "fast" and cfg.whiten and whitening_images is not None:
        model.to(whitening_images.device).init_whitening(whitening_images)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


def build_optimizer(cfg: DictConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    """SGD (momentum, Nesterov), Adam or AdamW over the trainable parameters."""
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov,
                               weight_decay=cfg.weight_decay)
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[cfg.name]
    return cls(params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay)


def optimizer_steps_per_epoch(batches_per_epoch: int, strategy_cfg: DictConfig) -> int:
    """Optimizer steps in one epoch: batches, divided by ``k_steps`` under gradient merge."""
    k = int(strategy_cfg.gradient_merge_configs.k_steps) if strategy_cfg.gradient_merge else 1
    return max(batches_per_epoch // k, 1)


def _cos(start: float, end: float, pct: float) -> float:
    return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)


def _lr_factor(cfg: DictConfig, steps_per_epoch: int, total: int) -> Callable[[int], float] | None:
    if cfg.name == "cosine":
        warm = int(round(float(cfg.warmup_epochs) * steps_per_epoch))
        floor = float(cfg.min_lr_ratio)

        def cosine(step: int) -> float:
            if step < warm:
                return (step + 1) / warm
            pct = min(1.0, (step - warm) / max(total - warm, 1))
            return _cos(1.0, floor, pct)

        return cosine
    if cfg.name == "onecycle":  # torch's OneCycleLR phases (two, cosine), as a factor of optim.lr
        rise_end = max(float(cfg.pct_start) * total - 1, 1e-12)
        fall_end = max(total - 1, rise_end + 1e-12)
        start, end = 1.0 / float(cfg.div_factor), 1.0 / (float(cfg.div_factor) * float(cfg.final_div_factor))

        def one_cycle(step: int) -> float:
            if step <= rise_end:
                return _cos(start, 1.0, step / rise_end)
            return _cos(1.0, end, min(1.0, (step - rise_end) / (fall_end - rise_end)))

        return one_cycle
    return None


def build_scheduler(cfg: DictConfig, optimizer: torch.optim.Optimizer, epochs: int, steps_per_epoch: int):
    """A per-optimizer-step ``LambdaLR`` for ``cosine``/``onecycle`` (None for ``none``).

    One-cycle follows torch's ``OneCycleLR`` learning-rate shape (cosine up,
    cosine down) without momentum cycling. Steps past the planned total keep
    the final rate instead of failing.
    """
    factor = _lr_factor(cfg, steps_per_epoch, max(epochs * steps_per_epoch, 1))
    return None if factor is None else torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def check_recompute(cfg: DictConfig, model: torch.nn.Module) -> None:
    """With ``strategy.recompute``, every name in ``recompute_configs.checkpoints`` must be a submodule."""
    if not cfg.recompute:
        return
    try:
        resolve_checkpoints(model, list(cfg.recompute_configs.checkpoints))
    except (KeyError, ValueError, TypeError) as e:
        text = e.args[0] if e.args else str(e)
        raise ConfigError(f"strategy.recompute_configs.checkpoints: {text}") from None


def build_strategy(cfg: DictConfig):
    """The ``fleet.DistributedStrategy`` the ``strategy`` group describes."""
    return DistributedStrategy.from_dict(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))


def build_callbacks(cfg: DictConfig, run_dir: str | Path, scheduler=None) -> list:
    """The run log's epoch lines, the LR schedule, early stopping, metrics.csv, TensorBoard, the non-finite loss
    guard, checkpoints/ and pre-emption, as configured.

    Paths are absolute, inside ``run_dir``. The progress bar is the Trainer's
    own (``fit(verbose=1)``, rank 0 only).
    """
    c = cfg.callbacks
    run_dir = Path(run_dir).resolve()
    out: list = [EpochLog()]  # the epoch metrics in the run log
    if scheduler is not None:
        out.append(cb.LRScheduler(scheduler, by_step=True))
    if c.early_stopping.enabled:
        es = c.early_stopping
        out.append(cb.EarlyStopping(monitor=es.monitor, patience=int(es.patience), min_delta=float(es.min_delta)))
    if c.csv_logger:
        out.append(cb.CSVLogger(str(run_dir / METRICS_FILE)))
    if c.tensorboard:
        out.append(cb.TensorBoard(str(run_dir / "tensorboard")))
    if c.checkpoint:
        out.append(cb.ModelCheckpoint(str(run_dir / CHECKPOINT_SUBDIR), save_freq=int(cfg.save_freq),
                                      save_steps=cfg.save_steps, keep_last=cfg.keep_last,
                                      async_save=bool(cfg.async_save)))
    if c.terminate_on_nan:  # before ModelCheckpoint runs its saves: a non-finite step is never saved
        out.append(cb.TerminateOnNaN(raise_error=True))
    if c.preemption:  # SIGTERM: all ranks stop after the same step; ModelCheckpoint writes the last state
        out.append(cb.Preemption(save_dir=str(run_dir / CHECKPOINT_SUBDIR)))
    return out


def build_loggers(cfg: DictConfig, trainer_cfg: DictConfig, run_dir: str | Path) -> list:
    """The ``logger`` group's trackers (and ``trainer.profile``'s Profiler), paths inside ``run_dir``.

    A learning-rate monitor comes first when any logger is on; the CSV/TensorBoard entries are skipped
    when ``trainer.callbacks`` already writes the same file. Missing packages fail here, before training,
    with the ``pip install 'fleetlite[...]'`` line.
    """
    run_dir = Path(run_dir).resolve()
    c = trainer_cfg.callbacks
    out: list = []
    if cfg.csv is not None and not (c.csv_logger and cfg.csv.filename == METRICS_FILE):
        out.append(cb.CSVLogger(str(run_dir / cfg.csv.filename)))
    if cfg.tensorboard is not None and not (c.tensorboard and cfg.tensorboard.dir == "tensorboard"):
        out.append(cb.TensorBoard(str(run_dir / cfg.tensorboard.dir),
                                  histogram_freq=int(cfg.tensorboard.histogram_freq)))
    if cfg.mlflow is not None:
        m = cfg.mlflow
        out.append(cb.MLflowLogger(experiment_name=m.experiment_name, run_name=m.run_name,
                                   tracking_uri=m.tracking_uri))
    if cfg.wandb is not None:
        w = cfg.wandb
        out.append(cb.WandbCallback(project=w.project, entity=w.entity, name=w.name, mode=w.mode,
                                    dir=str(run_dir)))
    if cfg.lr_monitor and (out or c.csv_logger or c.tensorboard or cfg.csv is not None):
        out.insert(0, cb.LearningRateMonitor())
    if trainer_cfg.profile:
        out.append(cb.Profiler(dir=str(run_dir / "profiler")))
    return out


def model_card(cfg: DictConfig, classes: list[str]) -> dict[str, Any]:
    """What goes alongside ``model.safetensors``: the model's name and arguments (``num_classes`` included),
    the class names and the whole config, so :func:`fleetlite.vision.models.from_safetensors` rebuilds it."""
    full = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    model = dict(full["model"])
    model["num_classes"] = len(classes)
    return {"model": model, "classes": list(classes), "config": full}
