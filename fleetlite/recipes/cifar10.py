"""CIFAR-10 with fleetlite, configured by Hydra: config -> data -> model -> strategy -> Trainer -> fit -> evaluate.

    python recipes/cifar10.py data=synthetic trainer.epochs=3            # one process
    fleetlite run cifar10 model=resnet18 optim=adamw optim.lr=3e-4       # the same, by name
    fleetlite launch --nproc_per_node 2 recipes/cifar10.py data=synthetic
    python recipes/cifar10.py resume=latest run_dir=outputs/2025-01-31/10-00-00
    python recipes/cifar10.py -m data=synthetic optim.lr=0.1,0.05        # one job per value
    python recipes/cifar10.py --help                                     # groups, options, the config
    fleetlite launch --nproc_per_node 2 --max_restarts 3 recipes/cifar10.py resume=auto trainer.save_steps=200
                                         # elastic: a crashed job restarts and continues from the newest checkpoint

Configs live in conf/ (fleetlite/conf/ in the package: cifar10.yaml and one directory per group; `fleetlite ls`
lists them, `fleetlite cp cifar10 my_recipe.py` copies this file out to edit); every key is checked against the
schemas in fleetlite/recipe/schema.py before training.
The run directory (default outputs/<date>/<time> of the launch, shared by all ranks and by every elastic
restart) gets .hydra/, metrics.csv, checkpoints/, training_curves.png and model.safetensors (+ model.json),
written by rank 0; logger=[csv,tensorboard,mlflow,wandb] adds trackers, trainer.compile/profile=true. SIGTERM
(pre-emption) makes every rank stop after the same step, save a checkpoint and exit with status 143.
"""

import hydra
import torch
from omegaconf import DictConfig

import fleetlite
from fleetlite.callbacks import NonFiniteLossError
from fleetlite.distributed import CollectiveError
from fleetlite.recipe.build import (
    MODEL_FILE,
    build_callbacks,
    build_data,
    build_loggers,
    build_model,
    build_optimizer,
    build_scheduler,
    build_strategy,
    check_recompute,
    model_card,
    optimizer_steps_per_epoch,
)
from fleetlite.recipe.catalog import CONF_DIR
from fleetlite.recipe.job import run_recipe
from fleetlite.recipe.preflight import fail
from fleetlite.recipe.preflight import rank as run_rank
from fleetlite.recipe.run import exit_if_preempted, finish_run, start_run
from fleetlite.recipe.runlog import log_failure
from fleetlite.recipe.validate import ConfigError
from fleetlite.trainer.checkpoint import CheckpointError


def train(cfg: DictConfig) -> float:
    # 1. the run: device, process group, seed, run directory (shared by all ranks), checkpoint to resume (read once)
    run = start_run(cfg)

    # 2. data: uint8 CIFAR-10 tensors (on the GPU when there is one), batched crop + flip, split across ranks
    data = build_data(cfg.data, cfg.trainer, run.device, run.world_size, run.rank)

    # 3. model
    model = build_model(cfg.model, num_classes=len(data.classes), whitening_images=data.whitening_images,
                        channels_last=cfg.data.channels_last)
    check_recompute(cfg.strategy, model)  # recompute names must be submodules of this model

    # 4. strategy (a fleet.DistributedStrategy), optimizer and learning-rate schedule
    strategy = build_strategy(cfg.strategy)
    optimizer = build_optimizer(cfg.optim, model)
    steps_per_epoch = optimizer_steps_per_epoch(len(data.train), cfg.strategy)
    scheduler = build_scheduler(cfg.sched, optimizer, cfg.trainer.epochs, steps_per_epoch)

    # 5. the Trainer: fleet.init, the data-parallel model and optimizer, and the strategy (AMP, gradient merge...)
    trainer = fleetlite.Trainer(model, optimizer,
                                loss=torch.nn.CrossEntropyLoss(label_smoothing=cfg.trainer.label_smoothing),
                                metrics=fleetlite.metric.Accuracy(), strategy=strategy, device=run.device,
                                config=run.config,
                                compile=cfg.trainer.compile)

    # 6. fit: progress on rank 0; metrics.csv, checkpoints/ and the logger group's trackers in the run directory
    callbacks = build_callbacks(cfg.trainer, run.dir, scheduler) + build_loggers(cfg.logger, cfg.trainer, run.dir)
    verbose = 1 if cfg.trainer.callbacks.progress else 0
    trainer.fit(data.train, eval_data=data.test, epochs=cfg.trainer.epochs, eval_freq=cfg.trainer.eval_freq,
                log_freq=cfg.trainer.log_freq, callbacks=callbacks,
                resume=run.resume, save_dir=run.dir if cfg.trainer.callbacks.checkpoint else None,
                num_iters=cfg.trainer.max_steps, verbose=verbose, seed=cfg.seed)
    exit_if_preempted(run, trainer)  # SIGTERM: checkpoint written, exit 143; resume=auto continues

    # 7. final evaluation on the whole test split, the curves, and where everything is
    final = trainer.evaluate(data.test, verbose=0)
    # 8. the weights for inference: model.safetensors + model.json (fleetlite.vision.models.from_safetensors)
    trainer.export(run.dir / MODEL_FILE, config=model_card(cfg, data.classes))
    return finish_run(run, final, plot=cfg.trainer.plot)["acc"]


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="cifar10")
def main(cfg: DictConfig) -> float:
    try:
        return train(cfg)
    except ConfigError as e:  # bad data/device/resume settings found once the job started: one line, exit 2
        fail(str(e))
    except CheckpointError as e:  # disk full, unwritable or damaged checkpoint: one line, exit 1
        fail(str(e), status=1)
    except CollectiveError as e:  # a rank was lost: each survivor's diagnosis on one line, exit 1
        fail(str(e), status=1, every_rank=True)
    except NonFiniteLossError as e:  # the loss diverged: every rank stopped at the same step, exit 1
        fail(str(e), status=1)
    except Exception as e:  # anything else: one line per failing rank here, the full traceback in the run log
        log = log_failure(e, run_rank())
        fail(f"{type(e).__name__}: {e}" + (f" (traceback in {log})" if log else ""), status=1, every_rank=True)


if __name__ == "__main__":
    # check the overrides (one clear line on bad input), one run dir for all ranks; then the job, config composed once
    run_recipe(main, CONF_DIR, "cifar10")
