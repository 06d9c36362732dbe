"""PyLayer patterns and fused_allreduce_gradients against a single process on the concatenated batch."""

import pytest
import torch
from torch import nn

import fleetlite
from fleetlite.autograd import PyLayer
from fleetlite.distributed.fleet.utils import fused_allreduce_gradients
from fleetlite.distributed.fleet.utils.hybrid_parallel_util import fused_allreduce_gradients as fag2
from fleetlite.testing import run_ranks


class cus_tanh(PyLayer):
    @staticmethod
    def forward(ctx, x):
        y = torch.tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensor()
        return dy * (1 - torch.square(y))


class run_func(PyLayer):
    """Recompute-style: forward without a graph, backward re-runs the sub-network."""

    @staticmethod
    def forward(ctx, inputs, run_function):
        ctx.run_function = run_function
        ctx.save_for_backward(inputs)
        with torch.no_grad():
            return run_function(inputs)

    @staticmethod
    def backward(ctx, grad):
        (inputs,) = ctx.saved_tensor()
        detached = inputs.detach().requires_grad_(inputs.requires_grad)
        with torch.enable_grad():
            outputs = ctx.run_function(detached)
        torch.autograd.backward([outputs], [grad])
        return detached.grad, None


class TanhNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 2)

    def forward(self, x):
        return self.linear(cus_tanh.apply(x))


class RecomputeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.ModuleList(nn.Linear(10, 10, bias=False) for _ in range(2))
        self.out = nn.Linear(10, 1, bias=False)

    def forward(self, x):
        for f in self.f:
            x = run_func.apply(x, f)
        return run_func.apply(x, self.out)


def _data(kind, step, rank):
    g = torch.Generator().manual_seed(10 * step + rank)
    return torch.randn(2, 2 if kind == "tanh" else 10, generator=g).requires_grad_()


def _dp_steps(rank, world, kind):
    torch.manual_seed(0)
    model = fleetlite.DataParallel(TanhNet() if kind == "tanh" else RecomputeNet(),
                                   find_unused_parameters=(kind == "recompute"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        with model.no_sync():
            model(_data(kind, step, rank)).mean().backward()
        fused_allreduce_gradients(list(model.parameters()), None)
        opt.step()
        opt.zero_grad()
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["tanh", "recompute"])
def test_pylayer_examples_equal_single_process_on_concatenated_batch(kind):
    got = run_ranks(_dp_steps, args=(kind,))
    torch.manual_seed(0)
    ref = TanhNet() if kind == "tanh" else RecomputeNet()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(5):
        x = torch.cat([_data(kind, step, r) for r in range(2)])
        ref(x).mean().backward()
        opt.step()
        opt.zero_grad()
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(got[0][k], v, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(got[1][k], v, rtol=1e-6, atol=1e-6)


def _fused(rank, world):
    ps = [torch.zeros(3, requires_grad=True), torch.zeros(2, dtype=torch.float64, requires_grad=True),
          torch.zeros(4, requires_grad=True), torch.zeros(1, dtype=torch.float16, requires_grad=True)]
    ps[0].grad = torch.tensor([1.0, 2.0, 3.0]) * (rank + 1)
    ps[1].grad = torch.tensor([10.0, 20.0], dtype=torch.float64) * (rank + 1)
    ps[3].grad = torch.tensor([60000.0], dtype=torch.float16)  # the sum overflows fp16, the mean does not
    fag2(ps, None)
    return [p.grad for p in ps]


@pytest.mark.timeout(60)
def test_fused_allreduce_gradients_averages_and_skips_missing():
    for grads in run_ranks(_fused):
        torch.testing.assert_close(grads[0], torch.tensor([1.5, 3.0, 4.5]))
        torch.testing.assert_close(grads[1], torch.tensor([15.0, 30.0], dtype=torch.float64))
        assert grads[2] is None
        assert grads[3].item() == 60000.0


def test_pylayer_ctx_saved_tensor_single_process():
    x = torch.randn(5, requires_grad=True)
    cus_tanh.apply(x).sum().backward()
    torch.testing.assert_close(x.grad, 1 - torch.tanh(x) ** 2)
