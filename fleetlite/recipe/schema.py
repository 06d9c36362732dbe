"""Dataclass schemas of the recipe configs, registered in Hydra's ConfigStore.

Every YAML option in ``conf/<group>/`` starts from one of these schemas
(``defaults: [/schema/<group>/<name>@_here_, _self_]``), so Hydra rejects an
unknown key or a value of the wrong type while composing, before any
training. Value checks that types cannot express (lr > 0, ...) live in
:mod:`fleetlite.recipe.validate`.

No work at import time: call :func:`register_configs` (idempotent) before
``hydra.main`` runs.

Example::

    from fleetlite.recipe.schema import register_configs
    register_configs()     # then: @hydra.main(version_base="1.3", config_path="conf", config_name="cifar10")
"""

from __future__ import annotations

import datetime
import os
import time
from dataclasses import dataclass, field, make_dataclass
from enum import Enum
from typing import Any

from omegaconf import MISSING, OmegaConf

from fleetlite.distributed.fleet.strategy import DistributedStrategy

__all__ = [
    "DataName", "Device", "AmpDtype", "DataConfig", "TutorialCNNConfig", "ResNet18Config", "FastConfig",
    "SGDConfig", "AdamConfig", "AdamWConfig", "CosineConfig", "OneCycleConfig", "NoSchedConfig",
    "AmpConfigs", "RecomputeConfigs", "GradientMergeConfigs", "Fp16AllreduceConfigs", "ShardingConfigs",
    "StrategyConfig", "EarlyStoppingConfig", "CallbacksConfig", "TrainerConfig", "RecipeConfig",
    "LoggerConfig", "CsvLoggerConfig", "TensorBoardLoggerConfig", "MLflowLoggerConfig", "WandbLoggerConfig",
    "register_configs", "SCHEMAS", "launch_time", "LAUNCH_TIME_VAR",
]


class DataName(Enum):
    cifar10 = "cifar10"
    synthetic = "synthetic"


class Device(Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class AmpDtype(Enum):
    float16 = "float16"
    bfloat16 = "bfloat16"


class PadMode(Enum):
    zeros = "zeros"
    reflect = "reflect"


# --- data -----------------------------------------------------------------------------------------------------
@dataclass
class DataConfig:
    """``data/``: which CIFAR-10 and how it is fed (uint8 tensors, batched crop + flip)."""

    name: DataName = DataName.cifar10
    root: str = "data/cifar10"      # where CIFAR-10 is looked for (and downloaded to)
    download: bool = True           # try to download when the files are not under root
    train_size: int | None = None   # None: the whole split; else the first N samples (synthetic: N generated)
    test_size: int | None = None
    seed: int = 0                   # synthetic data only: the generator's seed
    augment: bool = True            # random crop (pad 4) + horizontal flip on training batches
    pad_mode: PadMode = PadMode.zeros
    channels_last: bool = False     # NHWC memory format (faster convolutions on GPUs with AMP)
    on_device: bool = True          # keep the uint8 data set on the accelerator (no host-to-device copy per batch)


# --- model ----------------------------------------------------------------------------------------------------
@dataclass
class TutorialCNNConfig:
    """``model/tutorial_cnn``: the 3-conv + 2-linear network of the fleet quick start."""

    name: str = "tutorial_cnn"


@dataclass
class ResNet18Config:
    """``model/resnet18``: ResNet-18 with the CIFAR 3x3 stem."""

    name: str = "resnet18"
    width: int = 64


@dataclass
class FastConfig:
    """``model/fast``: the airbench-style network (whitening init from the training images)."""

    name: str = "fast"
    widths: list[int] = field(default_factory=lambda: [64, 256, 256])
    bn_momentum: float = 0.6
    scaling_factor: float = 1 / 9
    whiten: bool = True  # initialise the first layer from the training images' patch covariance


# --- optimizer ------------------------------------------------------------------------------------------------
@dataclass
class SGDConfig:
    name: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.9
    nesterov: bool = True
    weight_decay: float = 5e-4


@dataclass
class AdamConfig:
    name: str = "adam"
    lr: float = 2e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    weight_decay: float = 0.0


@dataclass
class AdamWConfig:
    name: str = "adamw"
    lr: float = 2e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    weight_decay: float = 0.05


# --- schedule (stepped every optimizer step) -----------------------------------------------------------------
@dataclass
class CosineConfig:
    name: str = "cosine"
    warmup_epochs: float = 0.0   # linear warm-up from 0 over this many epochs
    min_lr_ratio: float = 0.0    # final lr = optim.lr * min_lr_ratio


@dataclass
class OneCycleConfig:
    name: str = "onecycle"
    pct_start: float = 0.25      # fraction of the run spent rising to optim.lr
    div_factor: float = 25.0     # start lr = optim.lr / div_factor
    final_div_factor: float = 1e4


@dataclass
class NoSchedConfig:
    name: str = "none"


# --- strategy: fleet.DistributedStrategy, generated from its own field table ---------------------------------------
def _schema_type(value_type: Any) -> Any:
    """A strategy table value type as a schema annotation: a choice of strings becomes an Enum, of ints an int."""
    if not isinstance(value_type, tuple):
        return value_type
    if all(isinstance(v, str) for v in value_type):
        known = set(value_type) == {e.value for e in AmpDtype}
        return AmpDtype if known else Enum("Choice", {v: v for v in value_type})
    return int


def _schema_default(annotation: Any, default: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return field(default=annotation(default))
    if isinstance(default, list):
        return field(default_factory=lambda d=default: list(d))
    return field(default=default)


def _schema_field(name: str, value_type: Any, default: Any) -> tuple[str, Any, Any]:
    """One schema field; the annotation is built once, so a choice's Enum and its default are the same class."""
    annotation = _schema_type(value_type)
    return name, annotation, _schema_default(annotation, default)


def _make_schema(name: str, doc: str, fields: list[tuple[str, Any, Any]]) -> type:
    cls = make_dataclass(name, fields)
    cls.__module__, cls.__qualname__, cls.__doc__ = __name__, name, doc
    return cls


def _strategy_schemas() -> dict[str, type]:
    """``StrategyConfig`` and one schema per ``*_configs`` section, from ``DistributedStrategy.field_table()``:
    the strategy's fields, types and defaults are written down once, in fleetlite/distributed/fleet/strategy.py."""
    out: dict[str, type] = {}
    top: list[tuple[str, Any, Any]] = []
    for name, entry in DistributedStrategy.field_table().items():
        if isinstance(entry, dict):
            cls_name = "".join(part.capitalize() for part in name.split("_"))  # amp_configs -> AmpConfigs
            keys = [_schema_field(k, t, d) for k, (t, d) in entry.items()]
            out[cls_name] = _make_schema(cls_name, f"``strategy.{name}``: DistributedStrategy's {name}.", keys)
            top.append((name, out[cls_name], field(default_factory=out[cls_name])))
        else:
            top.append(_schema_field(name, *entry))
    out["StrategyConfig"] = _make_schema("StrategyConfig", "``strategy/``: a ``fleet.DistributedStrategy`` in YAML "
                                         "(Paddle's names), field for field.", top)
    return out


_STRATEGY = _strategy_schemas()
StrategyConfig = _STRATEGY["StrategyConfig"]
AmpConfigs, RecomputeConfigs = _STRATEGY["AmpConfigs"], _STRATEGY["RecomputeConfigs"]
GradientMergeConfigs, Fp16AllreduceConfigs = _STRATEGY["GradientMergeConfigs"], _STRATEGY["Fp16AllreduceConfigs"]
ShardingConfigs = _STRATEGY["ShardingConfigs"]


# --- trainer --------------------------------------------------------------------------------------------------
@dataclass
class EarlyStoppingConfig:
    enabled: bool = False
    monitor: str = "val_loss"
    patience: int = 5
    min_delta: float = 0.0


@dataclass
class CallbacksConfig:
    progress: bool = True        # rich progress bar (rank 0)
    csv_logger: bool = True      # metrics.csv in the run directory
    checkpoint: bool = True      # checkpoints/ in the run directory (needed for resume)
    preemption: bool = True      # on SIGTERM: all ranks stop after the same step, checkpoint, exit 143
    tensorboard: bool = False    # needs the tensorboard package
    terminate_on_nan: bool = True  # a non-finite loss stops every rank at the same step (exit 1, one line)
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)


@dataclass
class TrainerConfig:
    """``trainer/``: the loop's knobs. ``global_batch_size`` is the batch of one step over all ranks: each of N
    ranks takes global_batch_size / N, which must be whole (``Trainer.fit(batch_size=)`` is per rank)."""

    epochs: int = 10
    max_steps: int | None = None        # stop after this many optimizer steps (a slice; resume=latest continues)
    global_batch_size: int = 128
    eval_batch_size: int | None = 512  # global too; None: global_batch_size
    eval_freq: int = 1                  # evaluate every N epochs (and after the last)
    log_freq: int = 10                  # progress/log every N steps
    save_freq: int = 1                  # checkpoint every N epochs (and after the last)
    save_steps: int | None = None       # also every N optimizer steps: a crash loses at most N steps
    keep_last: int | None = None        # keep only the newest N periodic checkpoints (latest.pt always stays)
    async_save: bool = False            # write checkpoints in the background (sharded DCP directories)
    label_smoothing: float = 0.0
    plot: bool = True                   # training_curves.png at the end (needs matplotlib)
    cudnn_benchmark: bool | None = None  # cudnn autotuning (fixed input sizes); null: on for CUDA runs
    allow_tf32: bool | None = None      # TF32 matmuls/convolutions on Ampere+; null: on for CUDA runs
    compile: bool = False               # torch.compile the network (before the data-parallel wrapping)
    profile: bool = False               # torch.profiler: one trace per rank in run_dir/profiler, top ops printed
    callbacks: CallbacksConfig = field(default_factory=CallbacksConfig)


# --- logger: any of csv, tensorboard, mlflow, wandb (logger=[csv,mlflow]) -----------------------------------------
@dataclass
class CsvLoggerConfig:
    filename: str = "metrics.csv"    # in the run directory; the training-curves PNG is drawn from it


@dataclass
class TensorBoardLoggerConfig:
    dir: str = "tensorboard"         # in the run directory
    histogram_freq: int = 0          # parameter/gradient histograms every N optimizer steps (0: none)


@dataclass
class MLflowLoggerConfig:
    experiment_name: str = "cifar10"
    run_name: str | None = None
    tracking_uri: str | None = None  # null: $MLFLOW_TRACKING_URI, else the local file store run_dir/mlruns


@dataclass
class WandbLoggerConfig:
    project: str = "fleetlite"
    entity: str | None = None
    name: str | None = None
    mode: str = "offline"            # offline: written under run_dir/wandb, sent by `wandb sync`; or online


@dataclass
class LoggerConfig:
    """``logger/``: the experiment trackers in use (each option fills its own entry; rank 0 logs)."""

    csv: CsvLoggerConfig | None = None
    tensorboard: TensorBoardLoggerConfig | None = None
    mlflow: MLflowLoggerConfig | None = None
    wandb: WandbLoggerConfig | None = None
    lr_monitor: bool = True          # the learning rate in every logger's records (LearningRateMonitor)


# --- the primary config ---------------------------------------------------------------------------------------
@dataclass
class RecipeConfig:
    """The CIFAR-10 recipe: one option of each group, and where the run lives.

    Example::

        from omegaconf import OmegaConf
        base = OmegaConf.structured(RecipeConfig)
        OmegaConf.merge(base, {"seed": "x"})   # raises ValidationError: seed is an int
    """

    data: Any = MISSING
    model: Any = MISSING
    optim: Any = MISSING
    sched: Any = MISSING
    strategy: Any = MISSING
    trainer: Any = MISSING
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    seed: int = 0
    device: Device = Device.auto
    run_dir: str = MISSING       # one directory per run, shared by all ranks
    resume: str | None = None    # null, latest (newest in run_dir/checkpoints), auto (latest if any) or a path


#: (group, name) -> schema, as stored in the ConfigStore under ``schema/<group>/<name>``.
SCHEMAS: dict[tuple[str, str], type] = {
    ("data", "data"): DataConfig,
    ("model", "tutorial_cnn"): TutorialCNNConfig,
    ("model", "resnet18"): ResNet18Config,
    ("model", "fast"): FastConfig,
    ("optim", "sgd"): SGDConfig,
    ("optim", "adam"): AdamConfig,
    ("optim", "adamw"): AdamWConfig,
    ("sched", "cosine"): CosineConfig,
    ("sched", "onecycle"): OneCycleConfig,
    ("sched", "none"): NoSchedConfig,
    ("strategy", "strategy"): StrategyConfig,
    ("trainer", "trainer"): TrainerConfig,
}


#: Set by ``fleetlite launch`` (seconds since the epoch, once per launch): the time ``${launch_time:...}`` shows.
LAUNCH_TIME_VAR = "FLEETLITE_LAUNCH_TIME"  # the same name as fleetlite.distributed.launch.LAUNCH_TIME_VAR
_process_start: float | None = None


def launch_time(pattern: str) -> str:
    """The ``${launch_time:PATTERN}`` resolver: when the job was launched, formatted by ``strftime(PATTERN)``.

    Under ``fleetlite launch`` this is the launcher's start time, the same in
    every worker and in every elastic restart of the worker group, so the
    default ``run_dir`` stays one directory for the whole job; otherwise the
    time this process first asked (like Hydra's ``${now:...}``).
    """
    global _process_start
    raw = os.environ.get(LAUNCH_TIME_VAR, "").strip()
    try:
        stamp = float(raw) if raw else None
    except ValueError:
        stamp = None
    if stamp is None:
        if _process_start is None:
            _process_start = time.time()
        stamp = _process_start
    return datetime.datetime.fromtimestamp(stamp).strftime(pattern)


def register_configs() -> None:
    """Store every schema in Hydra's ConfigStore (``cifar10_schema`` and ``schema/<group>/<name>``) and
    register the ``launch_time`` resolver."""
    from hydra.core.config_store import ConfigStore  # hydra: heavy, only when a recipe registers its schemas

    if not OmegaConf.has_resolver("launch_time"):
        OmegaConf.register_new_resolver("launch_time", launch_time)

    cs = ConfigStore.instance()
    cs.store(name="cifar10_schema", node=RecipeConfig)
    for (group, name), schema in SCHEMAS.items():
        cs.store(group=f"schema/{group}", name=name, node=schema)
