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
schemas in fleetlite/recipe/schema.py before training (fleetlite/recipe/job.py: the command line, the config
composed once, a mistake is one `error:` line and exit status 2).
The run directory (default outputs/<date>/<time> of the launch, shared by all ranks and by every elastic
restart) gets .hydra/, metrics.csv, checkpoints/, training_curves.png and model.safetensors (+ model.json),
written by rank 0; logger=[csv,tensorboard,mlflow,wandb] adds trackers, trainer.compile/profile=true. SIGTERM
(pre-emption) makes every rank stop after the same step, save a checkpoint and exit with status 143.
"""

import sys

import torch
from omegaconf import DictConfig

import fleetlite
from fleetlite.recipe import job
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
from fleetlite.recipe.run import exit_if_preempted, finish_run, start_run


class CIFAR10Recipe:
    """config -> data -> model -> strategy -> Trainer -> fit -> evaluate, one step per method."""

    def __init__(self, cfg: DictConfig) -> None:
        # the run: device, process group, seed, run directory (shared by all ranks), checkpoint to resume (read once)
        self.cfg, self.run = cfg, start_run(cfg)

    def setup(self) -> None:
        cfg, run = self.cfg, self.run
        # data: uint8 CIFAR-10 tensors (on the GPU when there is one), batched crop + flip, split across ranks
        self.data = build_data(cfg.data, cfg.trainer, run.device, run.world_size, run.rank)
        model = build_model(cfg.model, num_classes=len(self.data.classes), channels_last=cfg.data.channels_last,
                            whitening_images=self.data.whitening_images)
        check_recompute(cfg.strategy, model)  # recompute names must be submodules of this model
        # strategy (a fleet.DistributedStrategy), optimizer and learning-rate schedule
        optimizer = build_optimizer(cfg.optim, model)
        steps_per_epoch = optimizer_steps_per_epoch(len(self.data.train), cfg.strategy)
        scheduler = build_scheduler(cfg.sched, optimizer, cfg.trainer.epochs, steps_per_epoch)
        # the Trainer: fleet.init, the data-parallel model and optimizer, the strategy (AMP, gradient merge...)
        self.trainer = fleetlite.Trainer(
            model, optimizer, loss=torch.nn.CrossEntropyLoss(label_smoothing=cfg.trainer.label_smoothing),
            metrics=fleetlite.metric.Accuracy(), strategy=build_strategy(cfg.strategy), device=run.device,
            config=run.config, compile=cfg.trainer.compile)
        # progress on rank 0; metrics.csv, checkpoints/ and the logger group's trackers in the run directory
        self.callbacks = build_callbacks(cfg.trainer, run.dir, scheduler) + build_loggers(cfg.logger, cfg.trainer,
                                                                                           run.dir)

    def train(self) -> None:
        t = self.cfg.trainer
        self.trainer.fit(self.data.train, eval_data=self.data.test, epochs=t.epochs, eval_freq=t.eval_freq,
                         log_freq=t.log_freq, callbacks=self.callbacks, resume=self.run.resume,
                         save_dir=self.run.dir if t.callbacks.checkpoint else None, num_iters=t.max_steps,
                         verbose=1 if t.callbacks.progress else 0, seed=self.cfg.seed)
        exit_if_preempted(self.run, self.trainer)  # SIGTERM: checkpoint written, exit 143; resume=auto continues

    def cleanup(self) -> float:
        # final evaluation on the whole test split; model.safetensors + model.json for inference; the curves
        final = self.trainer.evaluate(self.data.test, verbose=0)
        self.trainer.export(self.run.dir / MODEL_FILE, config=model_card(self.cfg, self.data.classes))
        return finish_run(self.run, final, plot=self.cfg.trainer.plot)["acc"]


@job.main(CONF_DIR, "cifar10")
def train(cfg: DictConfig) -> float:
    """The recipe: build it from the config, set up, train, clean up; returns the final validation accuracy."""
    recipe = CIFAR10Recipe(cfg)
    recipe.setup()
    recipe.train()
    return recipe.cleanup()


if __name__ == "__main__":
    sys.exit(train())
