"""The life of one recipe job: where it runs and writes (start), and what it leaves behind (finish).

``start_run`` is called first thing by a recipe (``fleetlite.recipes.cifar10``). It asks the connector for
the device and the process group (Note [one device, one process group]; under a launcher
:mod:`fleetlite.recipe.job` started the group), seeds every rank alike, takes the job's directory (the same
on every rank; only rank 0 writes there) and chooses the checkpoint ``resume=`` names: rank 0 chooses
(:func:`~fleetlite.recipe.validate.choose_resume_checkpoint` reads a file to validate it), every rank gets
its answer, and the file is read once per rank (:func:`read_resume_on_every_rank`), handed to
``fit(resume=...)`` as a ``LoadedCheckpoint``. ``finish_run`` draws the training curves and prints the
final lines on rank 0.

Example::

    run = start_run(cfg)
    ...
    finish_run(run, trainer.evaluate(data.test), plot=cfg.trainer.plot)
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from fleetlite.checkpoint import LoadedCheckpoint, on_every_rank, read
from fleetlite.distributed import get_rank, get_world_size, read_env
from fleetlite.distributed.agreement import from_rank0
from fleetlite.trainer.checkpoint_connector import REQUIRED
from fleetlite.trainer.config import AgreedConfig
from fleetlite.trainer.connector import init_process_group

from ..utils import plot as curves
from .build import METRICS_FILE, PLOT_FILE, apply_speed_flags, resolve_device
from .validate import CHECKPOINT_SUBDIR, ConfigError, choose_resume_checkpoint

__all__ = ["Run", "start_run", "finish_run", "exit_if_preempted", "EXIT_PREEMPTED"]

#: Exit status after a pre-emption (SIGTERM): 128 + 15, as if terminated, but after a clean checkpoint.
EXIT_PREEMPTED = 143


@dataclass(frozen=True)
class Run:
    """Where and how this job runs (made by :func:`start_run`).

    Example::

        run = Run(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), dir=Path("outputs/a"), resume=None)
        assert run.is_main
    """

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    dir: Path                   # the run directory, identical on every rank
    resume: Any                 # checkpoint to continue from: a LoadedCheckpoint (read once), a sharded dir, None
    config: Any = None          # the job's config as plain values for Trainer(config=...): an AgreedConfig
                                # (recipe.job compared it across ranks; the Trainer does not compare it again)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def start_run(cfg: DictConfig) -> Run:
    """Process group, seed, device, run directory and resume checkpoint of this job (see the module doc)."""
    from hydra.core.hydra_config import HydraConfig  # hydra: heavy, only inside a recipe's job

    device = resolve_device(cfg.device.value)  # device=cuda without CUDA: fail before starting anything
    init_process_group(cfg.device.value)  # the connector's: under a launcher recipe.job already started it
    if "trainer" in cfg:  # the speed flags of a recipe with a trainer group (cifar10's; gpt has none)
        speed = apply_speed_flags(cfg.trainer, device)
        with open_dict(cfg):  # what was applied goes into the run's recorded config
            cfg.trainer.cudnn_benchmark, cfg.trainer.allow_tf32 = speed["cudnn_benchmark"], speed["allow_tf32"]
    torch.manual_seed(int(cfg.seed))
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    answer: dict[str, Any] = {}
    chosen = None
    if get_rank() == 0:  # rank 0 chooses (reading a file at most once); every rank gets its answer
        try:
            chosen = choose_resume_checkpoint(cfg.resume, run_dir)
            answer = {"resume": None if chosen is None else os.fspath(chosen)}
        except ConfigError as e:
            answer = {"error": str(e)}
    answer = from_rank0(answer)
    if "error" in answer:
        raise ConfigError(answer["error"])
    resume = read_resume_on_every_rank(answer["resume"], chosen)
    if resume is not None and get_rank() == 0:
        restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        what = f"elastic restart {restart}: " if restart else ""
        print(f"{what}resuming from {os.fspath(resume)}", flush=True)
    config = AgreedConfig(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
    return Run(get_rank(), get_world_size(), read_env().local_rank, device, run_dir, resume, config)


def read_resume_on_every_rank(path: str | None, loaded: Any = None) -> LoadedCheckpoint | None:
    """The checkpoint to hand to ``fit(resume=...)``, file or sharded directory, read once on every rank (rank 0
    reuses ``loaded``, what it read while choosing it); every rank fails together
    (:func:`fleetlite.checkpoint.on_every_rank`), with the first failing rank's message."""
    if path is None:
        return None
    return on_every_rank(lambda: loaded if isinstance(loaded, LoadedCheckpoint) else read(path, REQUIRED))


def exit_if_preempted(run: Run, trainer) -> None:
    """After ``fit``: when a signal stopped training (``trainer.preempted``), say where to continue and exit 143.

    The checkpoint is already written (``Preemption`` + ``ModelCheckpoint``);
    the final evaluation and the curves are skipped, since the run is not
    finished and a pre-empted job has little time left.
    """
    if not getattr(trainer, "preempted", None):
        return
    if run.is_main:
        print(f"pre-empted ({trainer.preempted}) after optimizer step {trainer.global_step}: checkpoint in "
              f"{run.dir / CHECKPOINT_SUBDIR}; continue with resume=auto run_dir={run.dir}", flush=True)
    raise SystemExit(EXIT_PREEMPTED)


def _value(logs: dict[str, Any], *names: str) -> float:
    for n in names:
        if n in logs:
            v = logs[n]
            v = v[0] if isinstance(v, (list, tuple)) and v else v
            return float(v.item() if hasattr(v, "item") else v)
    return math.nan


def finish_run(run: Run, final: dict[str, Any], plot: bool = True) -> dict[str, float]:
    """Plot the curves from metrics.csv and print the final accuracy and the run directory (rank 0).

    Returns ``{"acc": ..., "loss": ...}`` of the final evaluation on every rank.
    """
    result = {"acc": _value(final, "acc", "accuracy", "val_acc"), "loss": _value(final, "loss", "val_loss")}
    if not run.is_main:
        return result
    lines = [f"final validation accuracy: {result['acc']:.4f} (loss {result['loss']:.4f})",
             f"run directory: {run.dir}"]
    csv_path = run.dir / METRICS_FILE
    if plot and csv_path.exists():
        if curves.matplotlib_available():
            png = curves.plot_training_curves(csv_path, run.dir / PLOT_FILE, title=str(run.dir))
            if png is not None:
                lines.append(f"training curves: {png}")
        else:
            lines.append(curves.missing_note())
    print("\n".join(lines), flush=True)
    return result
