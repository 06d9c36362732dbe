"""Paddle's test/collective/fleet/hybrid_parallel_pp_send_recv_dict.py on 2 gloo ranks (pp2): the same three-linear
pipeline once passing tuples between its layers and once passing dicts (``{"x": x, "y": [y0, y1]}``), with the
batch given as ``[{"x": img, "z": None}, {"label": label}]``, reports the same loss at each of five steps
(``assert_equal``), and the dict pipeline's losses are those of the same net written out in plain torch on one
process. Paddle's layers take a dict only when it arrives one, as here. Also Paddle's
hybrid_parallel_pp_communicate_with_dict.py (pp2 here, pp3 there): dicts holding a mask and an int32 tensor that
need no gradients, evaluation and training alternating."""

import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fleetlite.distributed.fleet as fleet
from fleetlite.distributed.fleet.meta_parallel import LayerDesc, PipelineLayer
from fleetlite.testing import run_ranks

BATCH, MICRO = 10, 2


class FirstLinearPipe(nn.Linear):
    def __init__(self, use_dict):
        super().__init__(5, 5, bias=False)
        self.use_dict = use_dict

    def forward(self, input):
        if self.use_dict:
            x = super().forward(input["x"] if isinstance(input, dict) else input)
            return {"x": x, "y": [2 * x, 2 * x]}
        x = super().forward(input)
        return x, 2 * x, 2 * x


class SecondLinearPipe(nn.Linear):
    def __init__(self, use_dict):
        super().__init__(5, 5, bias=False)
        self.use_dict = use_dict

    def forward(self, input):
        if self.use_dict:
            return {"x": super().forward(input["x"]), "y": [input["y"][0], input["y"][1]]}
        return super().forward(input[0]), input[1], input[2]


class ThirdLinearPipe(nn.Linear):
    def __init__(self, use_dict):
        super().__init__(5, 5, bias=False)
        self.use_dict = use_dict

    def forward(self, input):
        if self.use_dict:
            return {"out": super().forward(input["x"] + input["y"][0] + input["y"][1])}
        return super().forward(input[0] + input[1] + input[2])


def _loss(logits, label):
    logits = logits["out"] if isinstance(logits, dict) else logits
    label = label["label"] if isinstance(label, dict) else label
    return F.cross_entropy(logits.flatten(0, -2), label.flatten())  # Paddle's CrossEntropyLoss over the last axis


def _pipe(use_dict, params):
    model = PipelineLayer([LayerDesc(cls, use_dict) for cls in (FirstLinearPipe, SecondLinearPipe, ThirdLinearPipe)],
                          num_stages=2, loss_fn=_loss)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(params[int(name.split(".")[0])])
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[2], gamma=2.0)  # PiecewiseDecay([2], [1e-3, 2e-3])
    return fleet.distributed_model(model), fleet.distributed_optimizer(opt), sched


def _send_recv_dict(rank, world):
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 2}
    strategy.pipeline_configs = {"accumulate_steps": BATCH // MICRO, "micro_batch_size": MICRO}
    fleet.init(is_collective=True, strategy=strategy)
    random.seed(1024)
    np.random.seed(1024)
    torch.manual_seed(1024)
    params = [nn.Linear(5, 5, bias=False).weight.detach().clone() for _ in range(3)]  # SimpleNet's
    model_b, optimizer_b, scheduler_b = _pipe(False, params)
    model_c, optimizer_c, scheduler_c = _pipe(True, params)
    losses_b, losses_c = [], []
    for _ in range(5):
        img = torch.from_numpy(np.random.random([BATCH, 5, 5]).astype("float32"))
        label = torch.from_numpy(np.random.randint(0, 5, (BATCH, 5)).astype("int64"))
        losses_b.append(model_b.train_batch([img, label], optimizer_b, scheduler_b).detach())
        losses_c.append(model_c.train_batch([{"x": img, "z": None}, {"label": label}], optimizer_c,
                                            scheduler_c).detach())
    return torch.stack(losses_b), torch.stack(losses_c)


def _one_process_losses():
    """The same net, data and steps written out in plain torch on one process (the independent reference)."""
    np.random.seed(1024)
    torch.manual_seed(1024)
    w = [nn.Linear(5, 5, bias=False).weight.detach().clone().requires_grad_() for _ in range(3)]
    losses = []
    for step in range(5):
        img = torch.from_numpy(np.random.random([BATCH, 5, 5]).astype("float32"))
        label = torch.from_numpy(np.random.randint(0, 5, (BATCH, 5)).astype("int64"))
        micro = []
        for x, y in zip(img.split(MICRO), label.split(MICRO)):
            h = x @ w[0].T
            out = (h @ w[1].T + 2 * h + 2 * h) @ w[2].T
            micro.append(F.cross_entropy(out.reshape(-1, 5), y.reshape(-1)))
        loss = torch.stack(micro).mean()
        grads = torch.autograd.grad(loss, w)
        lr = 1e-3 if step < 2 else 2e-3
        with torch.no_grad():
            for p, g in zip(w, grads):
                p -= lr * g
        losses.append(loss.detach())
    return torch.stack(losses)


@pytest.mark.timeout(200)
def test_paddle_pp_send_recv_dict_on_two_ranks():
    reference = _one_process_losses()
    for loss_b, loss_c in run_ranks(_send_recv_dict, world_size=2, timeout=190):
        torch.testing.assert_close(loss_c, loss_b, rtol=0, atol=0)  # Paddle: np.testing.assert_equal
        torch.testing.assert_close(loss_c, reference)  # every rank: the dict pipeline trains as one process


VOCAB, HIDDEN, LENGTH = 128, 16, 8


class EmbeddingPipe(nn.Module):
    """Paddle's hybrid_parallel_pp_communicate_with_dict.py: a dict of a float, a constant mask and an int32 tensor,
    none of the last two needing gradients, crossing the stage boundary."""

    def __init__(self):
        super().__init__()
        self.word_embeddings = nn.Embedding(VOCAB, HIDDEN)
        self.position_embeddings = nn.Embedding(VOCAB, HIDDEN)

    def forward(self, x):
        mask = torch.triu(torch.full((LENGTH, LENGTH), -1e9), 1)
        p_emb = self.position_embeddings(x)
        return {"x": self.word_embeddings(x) + p_emb, "mask": mask, "no_used": torch.ones(3, 3, dtype=torch.int32),
                "p_emb": p_emb}


class TransformerNetPipe(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(HIDDEN, HIDDEN) for _ in range(3))
        self.linear = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, kwargs):
        x, mask = kwargs["x"], kwargs["mask"]
        weights = F.softmax(self.q_proj(x) @ self.k_proj(x).transpose(-1, -2) * HIDDEN ** -0.5 + mask, dim=-1)
        out = self.linear(weights @ self.v_proj(x)) + kwargs["p_emb"]
        return {"x": out, "mask": mask, "no_used": kwargs["no_used"], "p_emb": kwargs["p_emb"]}


def _communicate_with_dict(rank, world):
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 2}
    strategy.pipeline_configs = {"accumulate_steps": 6, "micro_batch_size": 4}
    fleet.init(is_collective=True, strategy=strategy)
    np.random.seed(1024)
    torch.manual_seed(1024)
    layers = [LayerDesc(EmbeddingPipe), *(LayerDesc(TransformerNetPipe) for _ in range(4)), lambda d: d["x"]]
    model = PipelineLayer(layers, num_stages=2, loss_fn=lambda out, label: out.mean(),
                          seg_method="layer:TransformerNetPipe")
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    model, opt = fleet.distributed_model(model), fleet.distributed_optimizer(opt)
    losses = []
    for _ in range(5):
        x = torch.from_numpy(np.random.randint(0, VOCAB, size=[24, LENGTH]))
        eval_loss = model.eval_batch([x, x], True)
        losses.append((eval_loss.detach(), model.train_batch([x, x], opt).detach()))
    return losses


@pytest.mark.timeout(200)
def test_paddle_pp_communicate_with_dict_on_two_ranks():
    """Each step's evaluation loss equals its training loss (Paddle's assert_allclose), eval and train alternating
    (each switch infers the stages again), on every rank."""
    for losses in run_ranks(_communicate_with_dict, world_size=2, timeout=190):
        for eval_loss, train_loss in losses:
            torch.testing.assert_close(eval_loss, train_loss)
