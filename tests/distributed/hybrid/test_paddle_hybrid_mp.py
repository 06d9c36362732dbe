"""Paddle's tensor-parallel hybrid tests, ported with their models, steps and tolerances, on 2 gloo ranks (mp2).

- test/collective/fleet/hybrid_parallel_mp_random.py: the rng tracker's named stream and the global stream
  each continue where they left off.
- test/collective/fleet/hybrid_parallel_mp_model.py (``TestDistMPTraining``): ``SimpleMPNet`` (vocab-parallel
  embedding, column- and row-parallel linears, a logits matmul against the embedding through ``_c_identity`` and
  ``_c_concat``) trains like ``SimpleDPNet`` on one process, SGD, five steps, losses ``rtol=1e-6``.
- test/collective/fleet/hybrid_parallel_mp_broadcast_obj.py: the same through ``model(img, text=text)`` with a numpy
  ``img`` and a list of letters ``text``.
- test/collective/fleet/hybrid_parallel_mp_clip_grad.py: the same with ``ClipGradByGlobalNorm(2.0)`` and an
  ``ExponentialDecay`` learning rate.

Paddle's weights are ``[in, out]``; torch's ``[out, in]``: the full Paddle weight is transposed into the full
torch weight and each layer slices it itself (Note [tensor-parallel parameters]), where Paddle's test hands each
rank its slice.
"""

import random

import numpy as np
import pytest
import torch

import fleetlite.distributed.fleet as fleet
from fleetlite.distributed.fleet.meta_parallel.mp_ops import _c_concat, _c_identity
from fleetlite.testing import run_ranks
from fleetlite.trainer.clipping import ClipGradByGlobalNorm

VOCAB, HIDDEN, INNER, OUTPUT, SEQ, BATCH = 20, 10, 8, 10, 2, 4


def _assign(paddle_weight):
    """Paddle's ``initializer.Assign`` of an ``[in, out]`` array, as an initializer of torch's ``[out, in]``."""
    return lambda w: w.copy_(torch.from_numpy(paddle_weight.T))


def _parallel_matmul(lm_output, logit_weights):
    """Paddle's test helper with ``parallel_output=False``: logits against the vocab slice, gathered."""
    group = fleet.get_hybrid_communicate_group().get_model_parallel_group()
    logits = torch.matmul(_c_identity(lm_output, group), logit_weights.t())
    return _c_concat(logits, group)


class SimpleMPNet(torch.nn.Module):
    def __init__(self, np_fc1, np_fc2):
        super().__init__()
        mp = fleet.meta_parallel
        self.linear1 = mp.ColumnParallelLinear(HIDDEN, INNER, weight_attr=_assign(np_fc1), gather_output=False,
                                               has_bias=True)
        self.linear2 = mp.RowParallelLinear(INNER, HIDDEN, weight_attr=_assign(np_fc2), input_is_parallel=True,
                                            has_bias=True)
        self.linear3 = torch.nn.Linear(HIDDEN, OUTPUT)
        torch.nn.init.zeros_(self.linear3.weight), torch.nn.init.zeros_(self.linear3.bias)
        self.embedding = mp.VocabParallelEmbedding(VOCAB, HIDDEN, weight_attr=lambda w: w.fill_(0.5))

    def forward(self, x):
        x = self.linear3(self.linear2(self.linear1(self.embedding(x))))
        return _parallel_matmul(x, self.embedding.weight)


class SimpleDPNet(torch.nn.Module):
    def __init__(self, np_fc1, np_fc2):
        super().__init__()
        self.linear1, self.linear2 = torch.nn.Linear(HIDDEN, INNER), torch.nn.Linear(INNER, HIDDEN)
        self.linear3 = torch.nn.Linear(HIDDEN, OUTPUT)
        with torch.no_grad():
            self.linear1.weight.copy_(torch.from_numpy(np_fc1.T)), self.linear2.weight.copy_(torch.from_numpy(np_fc2.T))
            for layer in (self.linear1, self.linear2, self.linear3):
                layer.bias.zero_()
            self.linear3.weight.zero_()
        self.embedding = torch.nn.Embedding(VOCAB, HIDDEN)
        torch.nn.init.constant_(self.embedding.weight, 0.5)

    def forward(self, x):
        x = self.linear3(self.linear2(self.linear1(self.embedding(x))))
        return torch.matmul(x, self.embedding.weight.t())


class SimpleMPMultimodalNet(SimpleMPNet):
    """hybrid_parallel_mp_broadcast_obj.py's: a numpy input and a keyword argument that is not a tensor."""

    def forward(self, x, **kwargs):
        return super().forward(torch.as_tensor(x))


class SimpleDPMultimodalNet(SimpleDPNet):
    def forward(self, x, **kwargs):
        return super().forward(torch.as_tensor(x))


def _set_random_seed(seed, dp_id, rank_id):
    random.seed(seed)
    np.random.seed(seed + dp_id)
    torch.manual_seed(seed + rank_id)


def _cuda_rng_tracker():
    """hybrid_parallel_mp_random.py's ``test_cuda_rng_tracker``."""
    size = [20, 15]
    torch.manual_seed(2021)
    target_11, target_12 = torch.randn(size), torch.randn(size)
    torch.manual_seed(1024)
    target_21, target_22 = torch.randn(size), torch.randn(size)
    torch.manual_seed(2021)
    tracker = fleet.meta_parallel.get_rng_state_tracker()
    tracker.add("test", 1024)
    result_11 = torch.randn(size)
    with tracker.rng_state("test"):
        result_21 = torch.randn(size)
    result_12 = torch.randn(size)
    with tracker.rng_state("test"):
        result_22 = torch.randn(size)
    for got, want in ((result_11, target_11), (result_12, target_12), (result_21, target_21),
                      (result_22, target_22)):
        torch.testing.assert_close(got, want, rtol=1e-7, atol=0)  # numpy's assert_allclose default


def _mp_model(clip):
    """``TestDistMPTraining.test_mp_model``; with ``clip``, ``TestMPClipGrad``'s optimizer."""
    hcg = fleet.get_hybrid_communicate_group()
    _set_random_seed(1024, hcg.get_data_parallel_rank(), torch.distributed.get_rank())
    np_fc1, np_fc2 = np.random.random_sample((HIDDEN, INNER)), np.random.random_sample((INNER, HIDDEN))
    model_a, model_b = SimpleMPNet(np_fc1, np_fc2), SimpleDPNet(np_fc1, np_fc2)

    def build_optimizer(model):
        if not clip:
            return torch.optim.SGD(model.parameters(), lr=0.001), None
        opt = torch.optim.SGD(model.parameters(), lr=0.001)
        return opt, torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.999)  # Paddle's ExponentialDecay

    optimizer_a, sched_a = build_optimizer(model_a)
    if clip:
        optimizer_a._grad_clip = ClipGradByGlobalNorm(2.0)  # Paddle's grad_clip=, read by distributed_optimizer
    model_a, optimizer_a = fleet.distributed_model(model_a), fleet.distributed_optimizer(optimizer_a)
    optimizer_b, sched_b = build_optimizer(model_b)
    losses_a, losses_b, norms = [], [], []
    for _ in range(5):
        batch = torch.from_numpy(np.random.randint(0, VOCAB, (BATCH, SEQ)))
        for model, opt, sched, losses in ((model_a, optimizer_a, sched_a, losses_a),
                                          (model_b, optimizer_b, sched_b, losses_b)):
            loss = model(batch).mean()
            loss.backward()
            if clip and model is model_b:  # Paddle's model_b has the same grad_clip: torch's clip is the reference
                norms.append(torch.nn.utils.clip_grad_norm_(model_b.parameters(), 2.0).detach())
            opt.step()
            opt.zero_grad()
            if sched is not None:
                sched.step()
            losses.append(loss.detach())
    return torch.stack(losses_a), torch.stack(losses_b), torch.stack(norms) if norms else None


def _broadcast_obj():
    """TestMPBroadcastObj.test_mp_model: batches of (numpy ids, lists of letters) through ``model(img, text=text)``."""
    hcg = fleet.get_hybrid_communicate_group()
    _set_random_seed(1024, hcg.get_data_parallel_rank(), torch.distributed.get_rank())
    np_fc1, np_fc2 = np.random.random_sample((HIDDEN, INNER)), np.random.random_sample((INNER, HIDDEN))
    model_a = SimpleMPMultimodalNet(np_fc1, np_fc2)
    optimizer_a = fleet.distributed_optimizer(torch.optim.SGD(model_a.parameters(), lr=0.001))
    model_a = fleet.distributed_model(model_a)
    model_b = SimpleDPMultimodalNet(np_fc1, np_fc2)
    optimizer_b = torch.optim.SGD(model_b.parameters(), lr=0.001)
    losses_a, losses_b = [], []
    for _ in range(5):
        img = np.random.randint(0, VOCAB, (BATCH, SEQ))
        text = [random.sample("zyxwvutsrqponmlkjihgfedcba", 5) for _ in range(BATCH)]
        for model, opt, losses in ((model_a, optimizer_a, losses_a), (model_b, optimizer_b, losses_b)):
            loss = model(img, text=text).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
    return torch.stack(losses_a), torch.stack(losses_b), None


def _mp2(rank, world):
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 2, "pp_degree": 1}
    fleet.init(is_collective=True, strategy=strategy)
    _cuda_rng_tracker()
    return {"mp_model": _mp_model(clip=False), "clip": _mp_model(clip=True), "broadcast_obj": _broadcast_obj()}


@pytest.mark.timeout(200)
def test_paddle_mp_random_model_and_clip_grad_on_two_ranks():
    for r in run_ranks(_mp2, world_size=2, timeout=190):  # the rng tracker's asserts ran inside each rank
        for case in ("mp_model", "clip", "broadcast_obj"):
            losses_a, losses_b, norms = r[case]
            assert losses_b[1:].abs().min() > 0  # the model does train (its first loss is 0 by construction)
            torch.testing.assert_close(losses_a, losses_b, rtol=1e-6, atol=0)  # Paddle: rtol=1e-6
        assert r["clip"][2].min() > 2.0  # the clip acted at every step
