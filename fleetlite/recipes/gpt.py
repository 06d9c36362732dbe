"""A small GPT with fleetlite's hybrid parallelism, configured by Hydra: build, setup, train, cleanup.

    fleetlite run gpt                                             # one process
    fleetlite run --nproc_per_node 4 gpt hybrid=dp2_mp2           # data x tensor parallel
    fleetlite run --nproc_per_node 2 gpt hybrid=pp2 train.steps=20
    fleetlite run --nproc_per_node 4 gpt hybrid=dp2_pp2
    fleetlite run --nproc_per_node 2 gpt hybrid=mp2 train.save_steps=10 run_dir=outputs/g      # checkpoints
    fleetlite run --nproc_per_node 2 gpt hybrid=mp2 train.save_steps=10 run_dir=outputs/g resume=latest

The model is fleetlite.text.gpt (tensor-parallel layers when mp > 1, a PipelineLayer when pp > 1) on a
deterministic synthetic corpus, byte-tokenized (fleetlite.text.corpus). It trains through ``fleetlite.Trainer``,
as the cifar10 recipe does: ``fleet.init`` with ``strategy.hybrid_configs`` (the hybrid group, conf/gpt/hybrid/;
the pipeline's layers need the topology before the model is built), then the Trainer wraps the model and the
optimizer and runs its loop (a pipeline through its ``train_batch``, Note [hybrid trainer]), its checkpoints and
its resume. A new hybrid group is a file in conf/gpt/hybrid/: the recipe asks fleet for the degrees. Rank 0
prints every ``train.log_freq``-th step's loss (the mean over the global batch) with tokens/s and MFU (Note
[MFU] in fleetlite/trainer/flops.py), and last ``final eval loss: <float>``. A config mistake is one ``error:``
line and exit status 2 (e.g. hybrid degrees that do not fit --nproc_per_node).

# Note [gpt steps]
The batch of optimizer step s is a function of (seed, s) alone (``batch_of_windows``), the same global batch
on any degrees, each data-parallel replica taking its rows. The Trainer reads it as epochs of ``train.save_steps``
steps (all ``train.steps`` in one epoch without checkpoints): epoch e of :class:`StepSampler` hands out the rows
of steps ``e*k .. (e+1)*k - 1``. So every checkpoint is the Trainer's at an epoch end, which loads into any
degrees (Note [hybrid checkpoints in the Trainer]).

# Note [gpt checkpoints]
With ``train.save_steps=N`` a ``ModelCheckpoint`` writes the Trainer's DCP checkpoint directory
``run_dir/checkpoints/epoch-EEEE/`` every N steps (epoch E ends after step (E + 1) * N) and after the last
step (``step-NNNNNNNN/`` when it does not end an epoch); ``latest`` names the newest. They hold the model and
AdamW state as each rank's slices and stages, the loop's progress, the data position and every rank's RNG
states (Note [hybrid checkpoints in the Trainer]). ``resume=latest`` (or ``true``), ``auto`` or a checkpoint
path continues from it: on the same degrees the resumed run takes the steps the uninterrupted one would and ends
with the same weights, bit for bit. On other degrees or another pipeline layout (mp 2 -> 1, pp 2 -> 1, pp 2 ->
mp 2, mp 2 -> pp 2, another dp) DCP reshards the model and optimizer, and the losses agree within float
rounding: the GPT and its pipeline description name every weight alike (Note [gpt names]). Resuming with
another ``train.save_steps`` or ``train.global_batch_size`` is refused (the steps would not line up).
"""

import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from omegaconf import MISSING, DictConfig, OmegaConf, open_dict, read_write

import fleetlite
from fleetlite.io import DistributedBatchSampler
from fleetlite.recipe import job
from fleetlite.recipe.build import build_strategy
from fleetlite.recipe.catalog import CONF_DIR
from fleetlite.recipe.run import exit_if_preempted, start_run
from fleetlite.recipe.schema import Device, StrategyConfig
from fleetlite.recipe.validate import CHECKPOINT_SUBDIR, ConfigError, check_known_keys
from fleetlite.trainer.callbacks import Callback, ModelCheckpoint


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
class PipelineConfig:
    virtual_stages: int = 1    # Paddle's PipelineLayer(num_virtual_pipeline_stages=): chunks per stage (interleaved)


@dataclass
class GPTRecipeConfig:
    """The GPT recipe's config (conf/gpt.yaml); ``strategy`` is a fleet.DistributedStrategy (hybrid group)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    seed: int = 0
    device: Device = Device.cpu
    run_dir: str = MISSING
    resume: str | None = None


def check_gpt_config(cfg: DictConfig, world_size: int) -> None:
    """Every value of the composed config; one :class:`ConfigError` line for the first problem."""
    from fleetlite.distributed.fleet.plan import ParallelPlan
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
        plan = ParallelPlan.from_configs(strategy.hybrid_configs, world_size, rank=0)  # the degrees: the plan's
    except (ValueError, KeyError, NotImplementedError) as e:
        raise ConfigError(f"strategy: {e.args[0] if e.args else e}") from None
    dp, mp, pp, sep, v = plan.data_size, plan.mp, plan.pp, plan.sep, cfg.pipeline.virtual_stages  # dp: data group
    need(min(m.width, m.layers, m.heads, m.seq_len, m.vocab_size) >= 1, "model: every size must be at least 1")
    need(m.width % m.heads == 0, f"model.width={m.width} is not divisible by model.heads={m.heads}")
    need(m.heads % mp == 0, f"model.heads={m.heads} is not divisible by mp_degree {mp}: each tensor-parallel rank "
                            "holds whole heads; choose heads that mp_degree divides")
    need(m.vocab_size % mp == 0 and m.vocab_size >= 256, f"model.vocab_size={m.vocab_size} must be >= 256 (bytes) "
                                                         f"and divisible by mp_degree {mp}")
    need(m.seq_len % sep == 0 and m.heads % (mp * sep) == 0,
         f"sep_degree {sep}: model.seq_len={m.seq_len} and model.heads={m.heads} / mp_degree {mp} must divide by it "
         "(each segment-parallel rank holds a part of every sequence, then a part of the heads)")
    need(pp <= m.layers + 3, f"pp_degree {pp} exceeds the {m.layers + 3} pipeline layers; use fewer stages")
    need(v >= 1 and (v == 1 or pp > 1), f"pipeline.virtual_stages={v}: at least 1, and above 1 only with "
                                        "pp_degree > 1 (chunks of a pipeline's stages)")
    need(pp * v <= m.layers + 3, f"pp_degree {pp} x pipeline.virtual_stages {v} chunks exceed the {m.layers + 3} "
                                 "pipeline layers; use fewer virtual stages")
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


class StepSampler(DistributedBatchSampler):
    """Epoch e hands out the rows of steps ``e*k .. (e+1)*k - 1``, as indices ``step * G + row`` (Note [gpt steps]).

    Each chunk of G consecutive indices is one step's global batch; rank r of the data group takes its rows
    ``[r * G/n, (r + 1) * G/n)`` (Note [sampler layout]). Its state (epoch, offset, ``k * G``) is the Trainer's
    data position.
    """

    def __init__(self, global_batch: int, steps_per_epoch: int, num_replicas: int, rank: int) -> None:
        super().__init__(range(global_batch * steps_per_epoch), global_batch // num_replicas, num_replicas, rank,
                         shuffle=False)

    def __iter__(self):
        first = self.epoch * len(self.dataset)  # the epoch this pass hands out (read as the pass starts)
        for batch in super().__iter__():
            yield [first + i for i in batch]


class StepWindows(torch.utils.data.Dataset):
    """Row ``i % G`` of step ``i // G``'s global batch of windows (``batch_of_windows(ids, G, T, seed, step)``)."""

    def __init__(self, ids: torch.Tensor, global_batch: int, seq_len: int, seed: int) -> None:
        self.ids, self.global_batch, self.seq_len, self.seed = ids, global_batch, seq_len, seed
        self._step: tuple[int, tuple[torch.Tensor, torch.Tensor]] | None = None  # the last step's batch

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        from fleetlite.text.corpus import batch_of_windows

        step, row = divmod(int(i), self.global_batch)
        if self._step is None or self._step[0] != step:
            self._step = (step, batch_of_windows(self.ids, self.global_batch, self.seq_len, self.seed, step))
        x, y = self._step[1]
        return x[row], y[row]


def eval_windows(ids: torch.Tensor, cfg: DictConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The eval split's ``train.eval_batches`` global batches, one after the other (the Trainer splits them)."""
    from fleetlite.text.corpus import batch_of_windows

    t = cfg.train
    pairs = [batch_of_windows(ids, t.global_batch_size, cfg.model.seq_len, cfg.seed, 10_000 + i)
             for i in range(t.eval_batches)]
    return torch.cat([x for x, _ in pairs]), torch.cat([y for _, y in pairs])


class GPTTrainer(fleetlite.Trainer):
    """The Trainer; its train step also hands the step's own loss to the callbacks (``step_loss``: the logs'
    ``loss`` is the epoch's running mean), a device tensor read only where :class:`StepLog` prints it. Under
    segment parallelism (``sep`` > 1) each rank takes its part of every sequence, inputs and targets alike
    (Paddle's ``split_inputs_sequence_dim``)."""

    sep = 1

    def split_batch(self, batch: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        inputs, labels = super().split_batch(batch)
        if self.sep > 1:
            from fleetlite.distributed.fleet.meta_parallel import split_inputs_sequence_dim

            inputs, labels = (tuple(split_inputs_sequence_dim(list(part))) for part in (inputs, labels))
        return inputs, labels

    def train_step(self, batch: Any) -> dict[str, Any]:
        out = super().train_step(batch)
        return {**out, "step_loss": out["loss"].detach()}


class StepLog(Callback):
    """Every ``log_freq``-th step and the last: the global batch's loss, tokens/s and MFU on rank 0.

    The step loss is averaged over the data group (a collective on every rank at the same steps) and read
    there, the only host sync the log makes; the throughput covers the steps since the last line, timed after
    that sync (torchtitan's: the first line includes the start-up). Note [MFU] in fleetlite/trainer/flops.py.
    """

    def __init__(self, steps: int, log_freq: int, tokens_per_step: int, flops_per_token: int, group: Any,
                 replicas: int, world_size: int, peak: float | None, device: torch.device) -> None:
        super().__init__()
        self.steps, self.log_freq, self.tokens_per_step = steps, log_freq, tokens_per_step
        self.flops_per_token, self.group, self.replicas, self.world_size = flops_per_token, group, replicas, world_size
        self.peak, self.device = peak, device
        self.first_step = 0

    def on_train_begin(self, logs=None):
        self.last_time, self.last_step = time.perf_counter(), self.trainer.global_step
        self.first_step = self.last_step  # a resumed run starts after its checkpoint's step

    def on_train_batch_end(self, step, logs=None):
        from fleetlite.trainer.flops import mfu

        t = self.trainer
        s = t.global_step
        if not t.at_step_boundary or ((s - 1) % self.log_freq and s != self.steps):
            return
        loss = logs["step_loss"].detach().float().clone()
        if self.replicas > 1:
            torch.distributed.all_reduce(loss, group=self.group)
            loss /= self.replicas
        if torch.distributed.get_rank() if torch.distributed.is_initialized() else 0:
            return  # (rank 0 prints: the other ranks read nothing)
        value = loss.item()
        now = time.perf_counter()
        tps = self.tokens_per_step * (s - self.last_step) / max(now - self.last_time, 1e-9)
        self.last_time, self.last_step = now, s
        per_device = tps / self.world_size
        util = mfu(self.flops_per_token, per_device, self.peak)
        shown = f"MFU {100 * util:.2f}%" if util is not None else f"MFU n/a: peak FLOPs unknown ({self.device.type})"
        print(f"step {s}/{self.steps} loss {value:.6f} | {tps:,.0f} tokens/s, {per_device:,.0f}/device | {shown}",
              flush=True)


def gpt_flops_per_token(mcfg) -> int:
    """``6 * N + 12 * L * H * Q * T`` of the whole (unsplit) GPT: N its matmul weights, the tied token table once,
    the position table not (Note [MFU])."""
    from fleetlite.text.gpt import GPT
    from fleetlite.trainer.flops import transformer_flops_per_token

    with torch.device("meta"):
        plain = GPT(mcfg)  # called before fleet.init: the one-process (unsplit) model, on no memory
    n = sum(p.numel() for name, p in plain.named_parameters() if not name.startswith("1."))
    return transformer_flops_per_token(n, mcfg.layers, mcfg.heads, mcfg.width // mcfg.heads, mcfg.seq_len)


class GPTRecipe:
    """fleet.init -> corpus -> GPT (tensor/pipeline parallel per the hybrid group) -> AdamW -> Trainer -> fit."""

    def __init__(self, cfg: DictConfig) -> None:
        # the run: device, process group, seed, run directory (shared by all ranks), checkpoint to resume (read once)
        self.cfg, self.run = cfg, start_run(cfg)
        t, state = cfg.train, self.run.resume.state if self.run.resume is not None else None
        if state is None:
            return
        if state["progress"]["global_step"] > t.steps:
            raise ConfigError(f"resume={cfg.resume}: the checkpoint is at step {state['progress']['global_step']}, "
                              f"past train.steps={t.steps}; raise train.steps to continue training")
        rows, mine = (state.get("data") or {}).get("dataset_size"), (t.save_steps or t.steps) * t.global_batch_size
        if rows is not None and rows != mine:  # Note [gpt steps]: an epoch is k steps of G rows
            raise ConfigError(f"resume={cfg.resume}: the checkpoint's epochs are {rows} rows (train.save_steps x "
                              f"train.global_batch_size), this run's {mine}: "
                              "its steps would not line up; resume with the saving run's train.save_steps and "
                              "train.global_batch_size")

    def setup(self) -> None:
        from fleetlite.distributed import fleet
        from fleetlite.distributed.fleet.meta_parallel import PipelineLayer
        from fleetlite.text.corpus import encode, synthetic_corpus
        from fleetlite.text.gpt import GPT, GPTConfig, gpt_loss, gpt_pipeline_descs
        from fleetlite.trainer.flops import peak_flops

        cfg, run, t = self.cfg, self.run, self.cfg.train
        mcfg = GPTConfig(**OmegaConf.to_container(cfg.model), seed=cfg.seed)
        fpt, peak = gpt_flops_per_token(mcfg), peak_flops(run.device)  # (before fleet.init: the unsplit GPT)
        strategy = build_strategy(cfg.strategy)
        fleet.init(is_collective=True, strategy=strategy)  # before the model: a PipelineLayer needs the topology
        plan, hcg = fleet.get_parallel_plan(), fleet.get_hybrid_communicate_group()  # the degrees: the plan's
        replicas, data_rank, pp = plan.data_size, plan.data_rank, plan.pp
        # data: the same corpus on every rank; its tail is the eval split; step s's batch from (seed, s)
        ids = encode(synthetic_corpus(cfg.data.num_chars, cfg.data.seed))
        cut = int(len(ids) * (1 - cfg.data.eval_fraction))
        k = t.save_steps or t.steps  # Note [gpt steps]: an epoch ends at each checkpoint
        self.epochs = -(-t.steps // k)
        self.rows = t.global_batch_size // replicas
        self.train_data = torch.utils.data.DataLoader(StepWindows(ids[:cut], t.global_batch_size, cfg.model.seq_len,
                                                                  cfg.seed),
                                                      batch_sampler=StepSampler(t.global_batch_size, k, replicas,
                                                                                data_rank))
        self.eval_data = eval_windows(ids[cut:], cfg)
        # model: weights drawn alike on any degrees (Note [gpt init] in fleetlite/text/gpt.py)
        model = (PipelineLayer(gpt_pipeline_descs(mcfg), topology=hcg.topology(), loss_fn=gpt_loss,
                               num_virtual_pipeline_stages=cfg.pipeline.virtual_stages) if pp > 1 else GPT(mcfg))
        o = cfg.optim
        optimizer = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay)
        self.trainer = GPTTrainer(model, optimizer, loss=gpt_loss, strategy=strategy, device=run.device,
                                  config=run.config)
        self.trainer.sep = self.sep = plan.sep
        # the loss of a step or of the eval split: the mean over the data group and sep's parts of a sequence
        loss_group = plan.group("loss")
        self.log = StepLog(t.steps, t.log_freq, t.global_batch_size * cfg.model.seq_len, fpt, loss_group,
                           replicas * self.sep, run.world_size, peak, run.device)
        self.hcg = hcg
        self.callbacks = [self.log]
        if t.save_steps:
            self.callbacks.append(ModelCheckpoint(str(run.dir / CHECKPOINT_SUBDIR), save_freq=1, sharded=True,
                                                  verbose=1))
        if run.is_main:
            n = sum(p.numel() for p in model.parameters())
            known = f"peak {peak / 1e12:g} TFLOP/s (bf16)" if peak else f"peak FLOPs of {run.device} unknown"
            print(f"gpt: dp={hcg.get_data_parallel_world_size()} mp={hcg.get_model_parallel_world_size()} pp={pp}; "
                  f"{n} parameters on rank 0; {fpt:,} FLOPs per token (6N + 12LHQT), {known}", flush=True)

    def train(self) -> None:
        start = time.perf_counter()
        self.trainer.fit(self.train_data, epochs=self.epochs, batch_size=self.rows, callbacks=self.callbacks,
                         resume=self.run.resume, save_dir=self.run.dir if self.cfg.train.save_steps else None,
                         num_iters=self.cfg.train.steps, shuffle=False, verbose=0, seed=self.cfg.seed)
        self.seconds = time.perf_counter() - start
        exit_if_preempted(self.run, self.trainer)

    def cleanup(self) -> float:
        final = self.trainer.evaluate(self.eval_data, batch_size=self.rows, verbose=0)["loss"]
        if self.sep > 1:  # evaluate averages over the data group; each sep rank holds its part's (equal tokens)
            part = torch.tensor(float(final), dtype=torch.float64)
            torch.distributed.all_reduce(part, group=self.hcg.get_sep_parallel_group())
            final = float(part) / self.sep
        if self.run.is_main:
            # the composed config, resolved, beside the checkpoints: what rebuilds the model for their weights
            # (fleetlite.checkpoint.load_full) without Hydra; .hydra/ holds Hydra's own copy
            OmegaConf.save(self.cfg, self.run.dir / "config.yaml", resolve=True)
            print(f"run directory: {self.run.dir} (config.yaml: this run's composed config; checkpoints/)\n"
                  f"{self.seconds:.1f}s for steps {self.log.first_step + 1}-{self.cfg.train.steps}\n"
                  f"final eval loss: {final:.6f}", flush=True)
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
