"""A small GPT with fleetlite's hybrid parallelism, configured by Hydra: build, setup, train, cleanup.

    fleetlite run gpt                                             # one process
    fleetlite run --nproc_per_node 4 gpt hybrid=dp2_mp2           # data x tensor parallel
    fleetlite run --nproc_per_node 2 gpt hybrid=pp2 train.steps=20
    fleetlite run --nproc_per_node 4 gpt hybrid=dp2_pp2
    fleetlite run --nproc_per_node 2 gpt hybrid=mp2 train.save_steps=10 run_dir=outputs/g      # checkpoints
    fleetlite run --nproc_per_node 2 gpt hybrid=mp2 train.save_steps=10 run_dir=outputs/g resume=latest

The model is fleetlite.text.gpt (tensor-parallel layers when mp > 1, a PipelineLayer when pp > 1) on a
deterministic synthetic corpus, byte-tokenized (fleetlite.text.corpus). The loop is written out by hand:
``fleet.init`` with ``strategy.hybrid_configs`` (the hybrid group, conf/gpt/hybrid/), ``fleet.distributed_model``
and ``fleet.distributed_optimizer``; a pipeline steps with ``PipelineParallel.train_batch``. Every step's loss
(the mean over the global batch) and a final eval loss are printed by rank 0. A config mistake is one ``error:``
line and exit status 2 (e.g. hybrid degrees whose product is not --nproc_per_node).

# Note [gpt checkpoints]
With ``train.save_steps=N`` the recipe writes a DCP checkpoint directory ``run_dir/checkpoints/step-NNNNNNNN/``
every N steps and after the last one: the model and AdamW state as each rank's slices and stage entries
(``fleetlite.checkpoint.torch_state.app_state``, Note [hybrid checkpoints]), and in ``trainer.pt`` the step,
the losses so far and every rank's RNG states (the model-parallel tracker's included); ``latest`` names the
newest. ``resume=latest`` (or ``true``), ``auto`` or a checkpoint path continues from it: the batch of step s is
a function of (seed, s) alone, so the resumed run takes the steps the uninterrupted one would and ends with
the same weights, bit for bit, on the same degrees. On other degrees or another pipeline layout (mp 2 -> 1,
pp 2 -> 1, pp 2 -> mp 2, mp 2 -> pp 2, another dp) DCP reshards the model and optimizer, and the losses agree
within float rounding: the GPT and its pipeline description name every weight alike (Note [gpt names]).
"""

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import MISSING, DictConfig, OmegaConf, open_dict, read_write

from fleetlite.recipe import job
from fleetlite.recipe.catalog import CONF_DIR
from fleetlite.recipe.schema import Device, StrategyConfig
from fleetlite.recipe.validate import ConfigError, check_known_keys


@dataclass
class ModelConfig:
    vocab_size: int = 256
    width: int = 128
    layers: int = 2
    heads: int = 4
    seq_len: int = 32


@dataclass
class DataConfig:
    num_chars: int = 50_000
    seed: int = 0
    eval_fraction: float = 0.1


@dataclass
class OptimConfig:
    lr: float = 3e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    weight_decay: float = 0.01


@dataclass
class TrainConfig:
    steps: int = 50
    global_batch_size: int = 16
    log_freq: int = 1
    eval_batches: int = 4
    save_steps: int = 0    # a checkpoint every this many steps and after the last (0: none); Note [gpt checkpoints]


@dataclass
class GPTRecipeConfig:
    """The GPT recipe's config (conf/gpt.yaml); ``strategy`` is a fleet.DistributedStrategy (hybrid group)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    seed: int = 0
    device: Device = Device.cpu
    run_dir: str = MISSING
    resume: str | None = None


def check_gpt_config(cfg: DictConfig, world_size: int) -> None:
    """Every value of the composed config; one :class:`ConfigError` line for the first problem."""
    from fleetlite.distributed.fleet.strategy import DistributedStrategy

    def need(ok: bool, message: str) -> None:
        if not ok:
            raise ConfigError(message)

    check_known_keys(cfg, GPTRecipeConfig)
    m, t, d = cfg.model, cfg.train, cfg.data
    if str(cfg.resume).lower() == "true":  # resume=true: the newest checkpoint of run_dir (Note [gpt checkpoints])
        with read_write(cfg), open_dict(cfg):
            cfg.resume = "latest"
    try:
        strategy = DistributedStrategy.from_dict(OmegaConf.to_container(cfg.strategy, resolve=True, enum_to_str=True))
        strategy.check_supported(world_size)
        deg = strategy.hybrid_degrees(world_size)
    except (ValueError, KeyError, NotImplementedError) as e:
        raise ConfigError(f"strategy: {e.args[0] if e.args else e}") from None
    dp, mp, pp = deg["dp"], deg["mp"], deg["pp"]
    need(dp * mp * pp == world_size, f"hybrid degrees dp={dp} x mp={mp} x pp={pp} = {dp * mp * pp} ranks, but "
                                     f"{world_size} were started; pick a hybrid option for {world_size} ranks or "
                                     f"start {dp * mp * pp} (--nproc_per_node {dp * mp * pp})")
    need(min(m.width, m.layers, m.heads, m.seq_len, m.vocab_size) >= 1, "model: every size must be at least 1")
    need(m.width % m.heads == 0, f"model.width={m.width} is not divisible by model.heads={m.heads}")
    need(m.heads % mp == 0, f"model.heads={m.heads} is not divisible by mp_degree {mp}: each tensor-parallel rank "
                            "holds whole heads; choose heads that mp_degree divides")
    need(m.vocab_size % mp == 0 and m.vocab_size >= 256, f"model.vocab_size={m.vocab_size} must be >= 256 (bytes) "
                                                         f"and divisible by mp_degree {mp}")
    need(pp <= m.layers + 3, f"pp_degree {pp} exceeds the {m.layers + 3} pipeline layers; use fewer stages")
    need(optim_ok(cfg.optim), f"optim: lr={cfg.optim.lr} must be > 0, betas two numbers in [0, 1), weight_decay >= 0")
    g = t.global_batch_size
    need(t.steps >= 1 and t.log_freq >= 1 and t.eval_batches >= 1, "train.steps, log_freq, eval_batches must be >= 1")
    need(t.save_steps >= 0, f"train.save_steps={t.save_steps} must be >= 0 (0: no checkpoints)")
    need(g >= 1, f"train.global_batch_size={g} must be at least 1 (the rows of one optimizer step over all "
                 f"data-parallel replicas), e.g. train.global_batch_size={max(dp, 16 // dp * dp)}")
    need(g % dp == 0, f"train.global_batch_size={g} does not divide among dp_degree {dp} replicas; use a multiple "
                      f"of {dp}, e.g. {max(dp, g // dp * dp)} or {-(-g // dp) * dp}")
    if pp > 1:
        pc = cfg.strategy.pipeline_configs
        need(pc.accumulate_steps * pc.micro_batch_size == g // dp,
             f"pipeline_configs accumulate_steps={pc.accumulate_steps} x micro_batch_size={pc.micro_batch_size} must "
             f"equal the rows per replica, train.global_batch_size / dp_degree = {g // dp}; change one of them")
    need(0 < d.eval_fraction < 1 and d.num_chars > 4 * m.seq_len,
         "data: eval_fraction must be in (0, 1) and num_chars well above model.seq_len")


def optim_ok(o: DictConfig) -> bool:
    return o.lr > 0 and o.weight_decay >= 0 and len(o.betas) == 2 and all(0 <= b < 1 for b in o.betas)


class GPTRecipe:
    """fleet.init -> corpus -> GPT (tensor/pipeline parallel per the hybrid group) -> AdamW -> the loop."""

    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg

    def setup(self) -> None:
        from fleetlite.distributed import fleet
        from fleetlite.distributed.fleet.meta_parallel import PipelineLayer
        from fleetlite.text.corpus import encode, synthetic_corpus
        from fleetlite.text.gpt import GPT, GPTConfig, gpt_loss, gpt_pipeline_descs

        cfg = self.cfg
        strategy = fleet.DistributedStrategy.from_dict(OmegaConf.to_container(cfg.strategy, resolve=True,
                                                                              enum_to_str=True))
        fleet.init(is_collective=True, strategy=strategy)
        self.hcg = hcg = fleet.get_hybrid_communicate_group()
        self.dp, self.dp_rank = hcg.get_data_parallel_world_size(), hcg.get_data_parallel_rank()
        self.pp = hcg.get_pipe_parallel_world_size()
        self.is_main = torch.distributed.get_rank() == 0 if torch.distributed.is_initialized() else True
        torch.manual_seed(cfg.seed)
        # data: the same corpus on every rank; its tail is the eval split
        ids = encode(synthetic_corpus(cfg.data.num_chars, cfg.data.seed))
        cut = int(len(ids) * (1 - cfg.data.eval_fraction))
        self.train_ids, self.eval_ids = ids[:cut], ids[cut:]
        # model: weights drawn alike on any degrees (Note [gpt init] in fleetlite/text/gpt.py)
        mcfg = GPTConfig(**OmegaConf.to_container(cfg.model), seed=cfg.seed)
        if self.pp > 1:
            layer = PipelineLayer(gpt_pipeline_descs(mcfg), topology=hcg.topology(), loss_fn=gpt_loss)
        else:
            layer = GPT(mcfg)
        self.model = fleet.distributed_model(layer)
        o = cfg.optim
        inner = torch.optim.AdamW(self.model.parameters(), lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay)
        self.optimizer = fleet.distributed_optimizer(inner)
        if self.is_main:
            n = sum(p.numel() for p in layer.parameters())
            print(f"gpt: dp={self.dp} mp={hcg.get_model_parallel_world_size()} pp={self.pp}; {n} parameters on "
                  "rank 0", flush=True)
        self.start_step, self.losses = 0, []
        if cfg.resume is not None:
            self.resume(cfg.resume)

    # -- checkpoints (Note [gpt checkpoints]) -------------------------------------------------------------------
    @property
    def checkpoint_dir(self) -> Path:
        from fleetlite.recipe.validate import CHECKPOINT_SUBDIR

        return Path(self.cfg.run_dir) / CHECKPOINT_SUBDIR

    def _rng(self) -> dict[str, Any]:
        from fleetlite.checkpoint import capture_rng_state
        from fleetlite.distributed.fleet.meta_parallel import get_rng_state_tracker

        return {"rng": capture_rng_state(), "mp_rng": get_rng_state_tracker().get_states_tracker()}

    def _degrees(self) -> dict[str, int]:
        h = self.hcg
        return {"dp": self.dp, "mp": h.get_model_parallel_world_size(), "pp": self.pp}

    def save(self, step: int) -> Path:
        """Write ``checkpoints/step-{step:08d}/`` (collective) and point ``latest`` at it."""
        from fleetlite.checkpoint import RANK0_FILE, save, save_checkpoint
        from fleetlite.checkpoint.torch_state import app_state
        from fleetlite.distributed import all_gather_object, get_world_size

        ranks = all_gather_object(self._rng())
        state = {"step": step, "losses": list(self.losses), "ranks": ranks, "world_size": get_world_size(),
                 "degrees": self._degrees(),
                 "config": OmegaConf.to_container(self.cfg, resolve=True, enum_to_str=True)}
        path = self.checkpoint_dir / f"step-{step:08d}"
        save(app_state(self.model.module, self.optimizer, writing=True), path, meta={"global_step": step},
             rank0_files={RANK0_FILE: lambda p: save_checkpoint(state, p)}, latest=True)
        if self.is_main:
            print(f"saved checkpoint {path}", flush=True)
        return path

    def resume(self, target: str) -> None:
        """Load the checkpoint ``target`` names (latest/auto: the newest in ``checkpoints/``; or a path) and continue
        after its step; ``auto`` with none starts afresh."""
        from fleetlite.checkpoint import CheckpointError, on_every_rank, read, resolve, restore_rng_state
        from fleetlite.checkpoint.torch_state import load_app_state
        from fleetlite.distributed import get_rank, get_world_size
        from fleetlite.distributed.fleet.meta_parallel import get_rng_state_tracker

        path = on_every_rank(lambda: resolve(target, self.checkpoint_dir, require=("step",)))
        if path is None:
            return
        if not path.is_dir():
            raise ConfigError(f"resume={target}: {path} is not a gpt checkpoint directory (checkpoints/step-NNNNNNNN/)")
        s = on_every_rank(lambda: read(path, ("step", "losses", "ranks", "world_size")).state)
        if s["step"] > self.cfg.train.steps:
            raise ConfigError(f"resume={target}: the checkpoint is at step {s['step']}, past train.steps="
                              f"{self.cfg.train.steps}; raise train.steps to continue training")
        try:
            load_app_state(self.model.module, self.optimizer, path)
        except CheckpointError as e:
            raise ConfigError(f"resume={target}: {e}") from None
        same_layout = s["world_size"] == get_world_size() and s.get("degrees") == self._degrees()
        if same_layout:  # else resharded: the saved weights and optimizer state, this run's random streams
            entry = s["ranks"][get_rank()]
            restore_rng_state(entry["rng"])
            get_rng_state_tracker().set_states_tracker(entry["mp_rng"])
        self.start_step, self.losses = int(s["step"]), list(s["losses"])
        if self.is_main:
            print(f"resuming from {path} (step {self.start_step})", flush=True)

    def _batch(self, ids: torch.Tensor, step: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This data-parallel replica's rows of the global batch of ``step`` (the same on every rank)."""
        from fleetlite.text.corpus import batch_of_windows

        x, y = batch_of_windows(ids, rows, self.cfg.model.seq_len, self.cfg.seed, step)
        part = rows // self.dp
        return x[self.dp_rank * part:(self.dp_rank + 1) * part], y[self.dp_rank * part:(self.dp_rank + 1) * part]

    def _global_mean(self, loss: torch.Tensor) -> float:
        """The mean over the data-parallel replicas (equal rows each): the global batch's loss."""
        loss = loss.detach().float().clone()
        if self.dp > 1:
            torch.distributed.all_reduce(loss, group=self.hcg.get_data_parallel_group())
            loss /= self.dp
        return loss.item()

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.pp > 1:
            return self.model.train_batch([x, y], self.optimizer)
        loss = self.model(x, y)
        self.optimizer.backward(loss)  # the loss scaled for float16 amp (strategy.amp), as minimize does
        self.optimizer.step()
        self.optimizer.clear_grad()
        return loss

    def train(self) -> list[float]:
        t = self.cfg.train
        start = time.perf_counter()
        for step in range(self.start_step, t.steps):
            x, y = self._batch(self.train_ids, step, t.global_batch_size)
            self.losses.append(self._global_mean(self.train_step(x, y)))
            if self.is_main and (step % t.log_freq == 0 or step == t.steps - 1):
                print(f"step {step + 1}/{t.steps} loss {self.losses[-1]:.6f}", flush=True)
            if t.save_steps and ((step + 1) % t.save_steps == 0 or step == t.steps - 1):
                self.save(step + 1)
        self.seconds = time.perf_counter() - start
        return self.losses

    @torch.no_grad()
    def cleanup(self) -> float:
        t, losses = self.cfg.train, []
        for i in range(t.eval_batches):
            x, y = self._batch(self.eval_ids, 10_000 + i, t.global_batch_size)
            if self.pp > 1:
                losses.append(self._global_mean(self.model.eval_batch([x, y], compute_loss=True)))
            else:
                self.model.eval()
                losses.append(self._global_mean(self.model(x, y)))
        final = sum(losses) / len(losses)
        if self.is_main:
            # the composed config, resolved, beside the checkpoints: what rebuilds the model for their weights
            # (fleetlite.checkpoint.load_full) without Hydra; .hydra/ holds Hydra's own copy
            from hydra.core.hydra_config import HydraConfig

            run_dir = Path(HydraConfig.get().runtime.output_dir if HydraConfig.initialized() else self.cfg.run_dir)
            OmegaConf.save(self.cfg, run_dir / "config.yaml", resolve=True)
            print(f"final eval loss: {final:.6f} ({self.seconds:.1f}s for {t.steps - self.start_step} steps)\n"
                  f"run directory: {run_dir} (config.yaml: this run's composed config)", flush=True)
        return final


@job.main(CONF_DIR, "gpt", schema=GPTRecipeConfig, check=check_gpt_config)
def train(cfg: DictConfig) -> Any:
    """The recipe: build it from the config, set up, train, clean up; returns the final eval loss."""
    recipe = GPTRecipe(cfg)
    recipe.setup()
    recipe.train()
    return recipe.cleanup()


if __name__ == "__main__":
    sys.exit(train())
