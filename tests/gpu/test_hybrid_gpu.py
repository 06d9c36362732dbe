"""Group B: hybrid parallel on two GPUs over NCCL, against one GPU running the whole model from the same weights.

The CPU suite (tests/distributed/hybrid) holds the full set on gloo; these are the same
parity checks on CUDA and NCCL: tensor parallelism (mp = 2) through the fleet facade, a two-stage pipeline
(pp = 2, 1F1B), and the Trainer fitting a tensor-parallel model. TF32 is off so float32 matmuls are exact enough
for 1e-5.
"""

from __future__ import annotations

import pytest
import torch
from gpu_helpers import needs_gpus
from parity import max_abs_diff, worst
from torch import nn

from fleetlite.testing import run_ranks

pytestmark = [pytest.mark.gpu, needs_gpus(2)]

STEPS, ROWS, CLIP = 5, 8, 0.3


def _init(degrees, pipeline=None):
    import fleetlite.distributed as dist
    from fleetlite.distributed import fleet

    torch.backends.cuda.matmul.allow_tf32 = False
    dist.init_parallel_env(backend="nccl")
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = degrees
    if pipeline is not None:
        strategy.pipeline_configs = pipeline
    fleet.init(is_collective=True, strategy=strategy)
    return strategy, fleet.get_hybrid_communicate_group(), torch.device("cuda", torch.cuda.current_device())


def _reference(device):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4)).to(device)


def _batch(step, device):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(ROWS, 16, generator=g).to(device), torch.randint(0, 4, (ROWS,), generator=g).to(device)


class _TP(nn.Module):
    def __init__(self):
        from fleetlite.distributed.fleet import meta_parallel as mpu

        super().__init__()
        self.up = mpu.ColumnParallelLinear(16, 32, has_bias=True, gather_output=False)
        self.down = mpu.RowParallelLinear(32, 4, has_bias=True, input_is_parallel=True)

    def forward(self, x):
        return self.down(torch.tanh(self.up(x)))


def _slice(full, p, hcg):
    from fleetlite.distributed.fleet.meta_parallel import is_split

    if not is_split(p):
        return full
    return full.chunk(hcg.get_model_parallel_world_size(), dim=p.split_axis)[hcg.get_model_parallel_rank()]


def _tp_pair(hcg, device):
    """(the one-GPU reference, the tensor-parallel net holding its slices, the reference's weights by TP name)."""
    ref = _reference(device)
    full = {"up.weight": ref[0].weight, "up.bias": ref[0].bias, "down.weight": ref[2].weight,
            "down.bias": ref[2].bias}
    net = _TP().to(device)
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(_slice(full[name], p, hcg))
    return ref, net, full


def tensor_parallel(rank, world):
    from fleetlite.distributed import fleet
    from fleetlite.trainer.clipping import ClipGradByGlobalNorm

    _, hcg, device = _init({"dp_degree": 1, "mp_degree": 2, "pp_degree": 1})
    ref, net, full = _tp_pair(hcg, device)
    model = fleet.distributed_model(net)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    opt._grad_clip = ClipGradByGlobalNorm(CLIP)
    opt = fleet.distributed_optimizer(opt)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    loss_fn, d_loss = nn.CrossEntropyLoss(), []
    for step in range(STEPS):
        x, y = _batch(step, device)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.clear_grad()
        ref_loss = loss_fn(ref(x), y)
        ref_loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), CLIP)
        ref_opt.step()
        ref_opt.zero_grad()
        d_loss.append(abs(loss.item() - ref_loss.item()))
    d_param = worst(max_abs_diff(p, _slice(full[n], p, hcg)) for n, p in net.named_parameters())
    return worst(d_loss), d_param


@pytest.mark.timeout(300)
def test_mp2_over_nccl_equals_one_gpu():
    for d_loss, d_param in run_ranks(tensor_parallel, world_size=2, timeout=280, init=False):
        assert d_loss <= 1e-5 and d_param <= 1e-5, (d_loss, d_param)


def pipeline(rank, world):
    from fleetlite.distributed import fleet
    from fleetlite.distributed.fleet.meta_parallel import LayerDesc, PipelineLayer

    strategy, hcg, device = _init({"dp_degree": 1, "mp_degree": 1, "pp_degree": 2},
                                  {"accumulate_steps": 4, "micro_batch_size": ROWS // 4})
    ref = _reference(device)
    loss_fn = nn.CrossEntropyLoss()
    descs = [LayerDesc(nn.Linear, 16, 32), LayerDesc(nn.Tanh), LayerDesc(nn.Linear, 32, 4)]
    stage = PipelineLayer(descs, loss_fn=loss_fn, topology=hcg.topology()).to(device)
    ref_state = {k: v for k, v in ref.state_dict().items()}
    stage.load_state_dict({k: ref_state[k] for k in stage.state_dict()})
    model = fleet.distributed_model(stage)
    opt = fleet.distributed_optimizer(torch.optim.AdamW(stage.parameters(), lr=1e-2))
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    d_loss = []
    for step in range(STEPS):
        x, y = _batch(step, device)
        loss = model.train_batch([x, y], opt)
        ref_loss = loss_fn(ref(x), y)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        d_loss.append(abs(loss.item() - ref_loss.item()))
    ref_state = ref.state_dict()
    d_param = max_abs_diff(stage.state_dict(), ref_state)
    return worst(d_loss), d_param


@pytest.mark.timeout(300)
def test_pp2_over_nccl_equals_one_gpu():
    for d_loss, d_param in run_ranks(pipeline, world_size=2, timeout=280, init=False):
        assert d_loss <= 1e-5 and d_param <= 1e-5, (d_loss, d_param)


def trainer_tp(rank, world):
    import fleetlite

    strategy, hcg, device = _init({"dp_degree": 1, "mp_degree": 2, "pp_degree": 1})
    ref, net, full = _tp_pair(hcg, device)
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(64, 16, generator=g), torch.randint(0, 4, (64,), generator=g)
    t = fleetlite.Trainer(net, torch.optim.AdamW(net.parameters(), lr=1e-2), nn.CrossEntropyLoss(),
                          metrics=fleetlite.metric.Accuracy(), strategy=strategy, device=device)
    losses = t.fit((x, y), epochs=2, batch_size=ROWS, shuffle=False, verbose=0).history["loss"]
    ev = t.evaluate((x, y), batch_size=ROWS, verbose=0)
    # the reference: the same batches in order on one GPU (equal batches: the epoch loss is their mean)
    ref_opt, loss_fn, ref_losses = torch.optim.AdamW(ref.parameters(), lr=1e-2), nn.CrossEntropyLoss(), []
    xd, yd = x.to(device), y.to(device)
    for _ in range(2):
        epoch = []
        for i in range(0, 64, ROWS):
            loss = loss_fn(ref(xd[i:i + ROWS]), yd[i:i + ROWS])
            loss.backward()
            ref_opt.step()
            ref_opt.zero_grad()
            epoch.append(loss.item())
        ref_losses.append(sum(epoch) / len(epoch))
    with torch.no_grad():
        logits = ref(xd)
        ref_ev = {"loss": loss_fn(logits, yd).item(), "acc": (logits.argmax(1) == yd).float().mean().item()}
    d_eval = worst(abs(float(ev[k][0] if isinstance(ev[k], list) else ev[k]) - v) for k, v in ref_ev.items())
    return max_abs_diff(torch.tensor(losses), torch.tensor(ref_losses)), d_eval


@pytest.mark.timeout(300)
def test_trainer_fits_mp2_over_nccl_like_one_gpu():
    for d_loss, d_eval in run_ranks(trainer_tp, world_size=2, timeout=280, init=False):
        assert d_loss <= 1e-5 and d_eval <= 1e-5, (d_loss, d_eval)
