"""Small hybrid-parallel models and their single-process twins for the hybrid checkpoint tests (module level:
run_ranks pickles the rank functions by name).

``TPNet`` (mp slices) and ``RefNet`` (plain) share parameter names and, seeded alike, initial weights (the
tensor-parallel layers draw the full weight and keep their slice). ``pipe_descs()`` is a pipeline with a
weight shared by its first and last layer; ``PipelineLayer(pipe_descs(), num_stages=1)`` is its single-process
model.
"""

from __future__ import annotations

import torch
from torch import nn

import fleetlite
import fleetlite.distributed.fleet as fleet
from fleetlite.distributed.fleet import fleet as fleet_impl
from fleetlite.distributed.fleet.meta_parallel import (
    ColumnParallelLinear,
    LayerDesc,
    PipelineLayer,
    RowParallelLinear,
    SharedLayerDesc,
    get_rng_state_tracker,
    model_parallel_random_seed,
)

IN, HIDDEN, OUT = 6, 8, 6


class TPNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = ColumnParallelLinear(IN, HIDDEN, has_bias=True, gather_output=False)
        self.down = RowParallelLinear(HIDDEN, OUT, input_is_parallel=True)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class TPDropNet(TPNet):
    """``TPNet`` with dropout on the sharded activations, under the model-parallel RNG tracker (its state must be
    checkpointed per rank for a bit-identical resume)."""

    def forward(self, x):
        h = torch.relu(self.up(x))
        with get_rng_state_tracker().rng_state():
            h = nn.functional.dropout(h, 0.3, self.training)
        return self.down(h)


class RefNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(IN, HIDDEN)
        self.down = nn.Linear(HIDDEN, OUT)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class Batches:
    """The same batches on every rank: a plain iterable of ``(x, y)``, which the Trainer does not split over ranks
    (a tensor-parallel group must see the same rows; how data parallel splits the data is not what these tests
    are about)."""

    def __init__(self, n=6, rows=8):
        g = torch.Generator().manual_seed(7)
        self.items = [(torch.randn(rows, IN, generator=g), torch.randint(0, OUT, (rows,), generator=g))
                      for _ in range(n)]

    def __iter__(self):
        return iter(self.items)


def batches(n=6, rows=8):
    return Batches(n, rows)


def init_fleet(dp=1, mp=1, pp=1, pipeline=None, sharding=1):
    fleet_impl._reset()
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": dp, "mp_degree": mp, "pp_degree": pp, "sharding_degree": sharding}
    if pipeline:
        strategy.pipeline_configs = pipeline
    fleet.init(is_collective=True, strategy=strategy)
    return fleet.get_hybrid_communicate_group()


def tp_trainer(mp=2, dp=1, lr=0.05, dropout=False, sharding=1):
    """A Trainer over ``TPNet`` (mp > 1) or ``RefNet`` (mp = 1), seeded alike: the same full initial weights;
    ``dropout``: ``TPDropNet``, the tracker seeded afresh; ``sharding``: stage 1 over that many ranks."""
    init_fleet(dp=dp, mp=mp, sharding=sharding)
    if dropout:
        model_parallel_random_seed(5)
    torch.manual_seed(0)
    net = TPDropNet() if dropout else TPNet() if mp > 1 else RefNet()
    return fleetlite.Trainer(net, torch.optim.AdamW(net.parameters(), lr=lr), nn.CrossEntropyLoss())


class Shared(nn.Module):
    """The first layer, whose weight the last layer reuses (a tied head)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(IN, IN)

    @property
    def weight(self):
        return self.proj.weight

    def forward(self, x):
        return torch.tanh(self.proj(x))


def _head(shared, x):
    return x @ shared.weight.t()


def pipe_descs():
    return [SharedLayerDesc("tied", Shared, shared_weight_attr="weight"), LayerDesc(nn.Linear, IN, HIDDEN), nn.Tanh(),
            LayerDesc(nn.Linear, HIDDEN, IN), SharedLayerDesc("tied", Shared, forward_func=_head,
                                                              shared_weight_attr="weight")]


PIPE = {"accumulate_steps": 2, "micro_batch_size": 4}


def pipe_layer(loss, topology=None, num_stages=None):
    torch.manual_seed(0)  # the stages' layers draw in order from one seed: load a common start instead
    return PipelineLayer(pipe_descs(), num_stages=num_stages, topology=topology, loss_fn=loss)


def pipe_batch(step, rows=8):
    g = torch.Generator().manual_seed(300 + step)
    return torch.randn(rows, IN, generator=g), torch.randint(0, IN, (rows,), generator=g)


def start_weights():
    """The single-process pipeline's initial weights (every stage loads its entries of them)."""
    torch.manual_seed(1)
    return PipelineLayer(pipe_descs(), num_stages=1).state_dict()


def pp_trainer(dp=1, pp=2):
    hcg = init_fleet(dp=dp, pp=pp, pipeline=PIPE)
    loss = nn.CrossEntropyLoss()  # the PipelineLayer's loss_fn is the Trainer's loss (one object)
    layer = pipe_layer(loss, topology=hcg.topology())
    layer.load_state_dict({k: v for k, v in start_weights().items() if k in layer.state_dict()})
    return fleetlite.Trainer(layer, torch.optim.AdamW(layer.parameters(), lr=0.05), loss)


def pp_steps(trainer, start, stop):
    trainer.setup(training=True)
    for step in range(start, stop):
        trainer.parallel_network.train_batch(list(pipe_batch(step)), trainer.optimizer)


class OneStage(nn.Module):
    """The one-stage PipelineLayer's layers under the same names, as a plain module (``fleet.distributed_model``
    takes a PipelineLayer only with pp_degree > 1)."""

    def __init__(self):
        super().__init__()
        layer = PipelineLayer(pipe_descs(), num_stages=1)
        for name, child in layer.named_children():
            self.add_module(name, child)
        self._run = [layer]  # not registered: its parameters are the ones above

    def forward(self, x):
        return self._run[0](x)


def single_pipe_trainer():
    """pp = 1 in one process: the one-stage PipelineLayer of the same descs (its state's keys)."""
    net = OneStage()
    return fleetlite.Trainer(net, torch.optim.AdamW(net.parameters(), lr=0.05), nn.CrossEntropyLoss())


def opt_state(trainer):
    """This rank's optimizer state, by parameter name (the slices' and this stage's)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    opt = getattr(trainer.optimizer, "inner_opt", trainer.optimizer)
    return {k: {n: v.clone() for n, v in e.items()}
            for k, e in get_optimizer_state_dict(trainer.network, opt)["state"].items()}


class TPBlock(nn.Module):
    """A residual MLP of tensor-parallel layers (mp > 1) or plain ones (``tp=False``), the same names."""

    def __init__(self, tp=True):
        super().__init__()
        if tp:
            self.up = ColumnParallelLinear(IN, HIDDEN, has_bias=True, gather_output=False)
            self.down = RowParallelLinear(HIDDEN, IN, input_is_parallel=True)
        else:
            self.up, self.down = nn.Linear(IN, HIDDEN), nn.Linear(HIDDEN, IN)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


def mp_pp_descs(tp=True):
    """Tensor-parallel blocks inside pipeline stages (mp x pp); ``tp=False``: the single-process layers."""
    return [LayerDesc(TPBlock, tp), LayerDesc(nn.LayerNorm, IN), LayerDesc(TPBlock, tp),
            LayerDesc(ColumnParallelLinear, IN, OUT, has_bias=False, gather_output=True) if tp else
            LayerDesc(nn.Linear, IN, OUT, bias=False)]
