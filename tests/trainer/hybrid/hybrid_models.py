"""Small hybrid-parallel models, their single-process twins and data, for the Trainer's hybrid tests (module
level: run_ranks pickles the rank functions by name).

Every model starts from the weights of a seeded single-process reference (sliced for tensor parallelism, one
stage's layers for a pipeline), so a hybrid Trainer run and a one-process Trainer run must agree."""

from __future__ import annotations

import torch
import torch.distributed as td
from parity import close
from torch import nn
from torch.utils.data import TensorDataset

import fleetlite
from fleetlite.distributed import fleet
from fleetlite.distributed.fleet import fleet as fleet_impl
from fleetlite.distributed.fleet.meta_parallel import (
    ColumnParallelLinear,
    LayerDesc,
    PipelineLayer,
    RowParallelLinear,
    is_split,
)
from fleetlite.metric import Accuracy
from fleetlite.trainer.callbacks import LRScheduler

N_TRAIN, N_EVAL = 48, 37  # 37: the last evaluation batches are short and padded across ranks
TOL = 1e-5


def dataset(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return TensorDataset(x, y)


def reference_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))


class TPNet(nn.Module):
    """The reference's layers, the first two tensor-parallel (column, then row: the output is replicated)."""

    def __init__(self):
        super().__init__()
        self.l0 = ColumnParallelLinear(6, 16, has_bias=True, gather_output=False)
        self.l2 = RowParallelLinear(16, 16, input_is_parallel=True)
        self.l4 = nn.Linear(16, 3)

    def forward(self, x):
        return self.l4(torch.tanh(self.l2(torch.tanh(self.l0(x)))))


def _ref_name(name: str) -> str:
    """TPNet's ``l0.weight`` is the reference's ``0.weight``."""
    return name[1:]


def init_fleet(degrees: dict, pipeline: dict | None = None) -> fleet.DistributedStrategy:
    fleet_impl._reset()
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = degrees
    if pipeline is not None:
        strategy.pipeline_configs = pipeline
    fleet.init(is_collective=True, strategy=strategy)
    return strategy


def tp_net() -> TPNet:
    """A TPNet holding this rank's slices of the reference's weights (after fleet.init)."""
    hcg = fleet.get_hybrid_communicate_group()
    ref = dict(reference_net().named_parameters())
    net = TPNet()
    with torch.no_grad():
        for name, p in net.named_parameters():
            full = ref[_ref_name(name)]
            if is_split(p):
                full = full.chunk(hcg.get_model_parallel_world_size(), dim=p.split_axis)[
                    hcg.get_model_parallel_rank()]
            p.copy_(full)
    return net


def full_tp_weights(net: nn.Module, rename: bool = True) -> dict[str, torch.Tensor]:
    """The full weights under the reference's names: slices gathered over the tensor-parallel group."""
    hcg = fleet.get_hybrid_communicate_group()
    group, size = hcg.get_model_parallel_group(), hcg.get_model_parallel_world_size()
    out = {}
    for name, p in net.named_parameters():
        t = p.detach().contiguous()
        if is_split(p) and size > 1:
            parts = [torch.empty_like(t) for _ in range(size)]
            td.all_gather(parts, t, group=group)
            t = torch.cat(parts, dim=p.split_axis)
        out[_ref_name(name) if rename else name] = t.clone()
    return out


def pipeline_descs(tp: bool = False):
    """The reference's layers as a pipeline description; ``tp``: the first two tensor-parallel (mp x pp)."""
    if tp:
        return [LayerDesc(ColumnParallelLinear, 6, 16, has_bias=True, gather_output=False), nn.Tanh(),
                LayerDesc(RowParallelLinear, 16, 16, input_is_parallel=True), nn.Tanh(), LayerDesc(nn.Linear, 16, 3)]
    return [LayerDesc(nn.Linear, 6, 16), nn.Tanh(), LayerDesc(nn.Linear, 16, 16), nn.Tanh(),
            LayerDesc(nn.Linear, 16, 3)]


def pipeline_stage(loss_fn: nn.Module | None, tp: bool = False) -> PipelineLayer:
    """This rank's stage (after fleet.init with pp), holding the reference's weights of its layers (sliced)."""
    hcg = fleet.get_hybrid_communicate_group()
    stage = PipelineLayer(pipeline_descs(tp), loss_fn=loss_fn, topology=hcg.topology())
    ref = dict(reference_net().named_parameters())
    with torch.no_grad():
        for name, p in stage.named_parameters():
            full = ref[name]
            if is_split(p):
                full = full.chunk(hcg.get_model_parallel_world_size(), dim=p.split_axis)[
                    hcg.get_model_parallel_rank()]
            p.copy_(full)
    return stage


def all_stage_weights(stage: nn.Module) -> dict[str, torch.Tensor]:
    """Every stage's full weights (keys are global layer indices): slices gathered over the tensor-parallel
    group, then the stages' over the pipe group."""
    hcg = fleet.get_hybrid_communicate_group()
    mine = full_tp_weights(stage, rename=False)
    parts = [None] * hcg.get_pipe_parallel_world_size()
    td.all_gather_object(parts, mine, group=hcg.get_pipe_parallel_group())
    return {k: v for p in parts for k, v in p.items()}


def run_trainer(net: nn.Module, strategy, batch_size: int, eval_batch: int, epochs: int = 2, clip=None,
                loss: nn.Module | None = None):
    """fit (with eval_data), evaluate and predict; the same calls on every kind of run."""
    torch.set_num_threads(1)
    opt = torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9)
    t = fleetlite.Trainer(net, opt, loss, metrics=Accuracy(topk=(1, 2)), strategy=strategy, device="cpu")
    if clip is not None:
        t.compile(**clip)
    train, test = dataset(N_TRAIN, 1), dataset(N_EVAL, 2)
    sched = LRScheduler(torch.optim.lr_scheduler.StepLR(opt, 2, 0.5), by_step=True)  # the Trainer's own rules
    history = t.fit(train, eval_data=test, epochs=epochs, batch_size=batch_size, shuffle=True, seed=3, verbose=0,
                    callbacks=[sched])
    return t, {"history": history.history, "evaluate": t.evaluate(test, batch_size=eval_batch, verbose=0),
               "predict": t.predict(test, batch_size=eval_batch, stack_outputs=True)}


def more_predictions(t, batch: int, out_dir) -> dict:
    """predict of the inputs alone (no labels) and streamed to ``out_dir`` (merged .npy, dataset order)."""
    import numpy as np

    x = dataset(N_EVAL, 2).tensors[0]
    paths = t.predict(dataset(N_EVAL, 2), batch_size=batch, output_dir=out_dir)
    return {"predict_x": t.predict((x,), batch_size=batch, stack_outputs=True),
            "predict_file": torch.from_numpy(np.load(paths[0]))}


def stat_scores(t) -> list[int]:
    """A torchmetrics metric of counts (tp, fp, tn, fn, support): gathered over more ranks than the data group,
    every count would be doubled."""
    import torchmetrics

    t.compile(metrics=torchmetrics.classification.MulticlassStatScores(num_classes=3, average="micro"))
    return t.evaluate(dataset(N_EVAL, 2), batch_size=8, verbose=0)["multiclassstatscores"]


def compare(got: dict, ref: dict) -> list[str]:
    """What differs by more than TOL between two runs' results (empty when they agree; a NaN on either side
    differs, see tests/parity.py)."""
    bad = []
    for key in ref["history"]:
        a, b = torch.tensor(got["history"][key]), torch.tensor(ref["history"][key])
        if not _close(a, b):
            bad.append(f"history[{key}]: {a.tolist()} vs {b.tolist()}")
    if set(got["evaluate"]) != set(ref["evaluate"]):
        bad.append(f"evaluate keys {sorted(got['evaluate'])} vs {sorted(ref['evaluate'])}")
    for key, v in ref["evaluate"].items():
        if not _close(got["evaluate"].get(key, float("nan")), v):
            bad.append(f"evaluate[{key}]: {got['evaluate'].get(key)} vs {v}")
    if "stat_scores" in ref and got.get("stat_scores") != ref["stat_scores"]:
        bad.append(f"torchmetrics counts {got.get('stat_scores')} vs {ref['stat_scores']}")
    for key in ("predict", "predict_x", "predict_file"):
        if key in got and not _close(got[key], ref["predict"]):
            bad.append(f"{key}: shapes {tuple(got[key].shape)} / {tuple(ref['predict'].shape)}")
    for key, w in ref["weights"].items():
        if key not in got["weights"] or not _close(got["weights"][key], w):
            bad.append(f"weight {key}")
    return bad


def _close(a, b) -> bool:
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    return a.shape == b.shape and close(a, b, TOL)
