"""amp on the rank's device: default device, the fused-optimizer inf check agreeing across ranks, and at most one
host read per fp16 step (counted on the CPU; tests/gpu/ checks it with torch.cuda.set_sync_debug_mode)."""

import pytest
import torch

from fleetlite.distributed import ParallelEnv
from fleetlite.distributed.fleet import AmpHelper, DistGradScaler, DistributedStrategy
from fleetlite.testing import run_ranks


@pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled, but CUDA is not available")
def test_helper_defaults_to_the_ranks_or_the_models_device(monkeypatch):
    monkeypatch.setattr(ParallelEnv, "device", property(lambda self: torch.device("cuda", 0)))
    assert AmpHelper(True, "bfloat16").device_type == "cuda"  # a GPU job without an explicit device: CUDA autocast
    assert AmpHelper.from_strategy(DistributedStrategy(amp=True)).scaler._device == "cuda"
    cpu_model = torch.nn.Linear(2, 2)
    assert AmpHelper(True, "bfloat16", device=cpu_model).device_type == "cpu"
    assert AmpHelper.from_strategy(DistributedStrategy(amp=True), device=cpu_model).device_type == "cpu"


def _fused_inf(rank, world):
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.Adam([p], lr=0.1, fused=True)  # torch's _step_supports_amp_scaling path
    assert opt._step_supports_amp_scaling
    scaler = DistGradScaler("cpu", init_scale=8.0, backoff_factor=0.5, decr_every_n_nan_or_inf=1)
    record = []
    for step in range(3):
        bad = step == 1 and rank == 1  # only rank 1 sees inf, only at step 1
        loss = (p * (float("inf") if bad else 1.0)).sum()
        scaler.scale(loss).backward()
        before = p.detach().clone()
        scaler.step(opt)  # no unscale_ first: torch checks inf in _check_inf_per_device
        scaler.update()
        opt.zero_grad()
        record.append((bool(torch.isfinite(p).all()), not torch.equal(before, p), scaler.get_scale(),
                       scaler.last_found_inf))
    return record, p.detach().tolist()


@pytest.mark.timeout(120)
def test_fused_optimizer_path_skips_on_every_rank():
    (r0, p0), (r1, p1) = run_ranks(_fused_inf, world_size=2, timeout=100)
    assert r0 == r1 and p0 == p1
    assert [changed for _, changed, _, _ in r0] == [True, False, True]
    assert [found for *_, found in r0] == [False, True, False]
    assert [scale for _, _, scale, _ in r0] == [8.0, 4.0, 4.0]
    assert all(finite for finite, *_ in r0)


class _HostReads:
    """Counts the tensor methods that copy a value to the host (each a device sync on CUDA)."""

    NAMES = ("item", "tolist", "__bool__", "__float__", "__int__")

    def __init__(self, monkeypatch):
        self.count = 0
        for name in self.NAMES:
            original = getattr(torch.Tensor, name)

            def counted(t, *a, _original=original, **k):
                self.count += 1
                return _original(t, *a, **k)

            monkeypatch.setattr(torch.Tensor, name, counted)


@pytest.mark.parametrize("fused", [False, True])
def test_fp16_step_reads_the_device_at_most_once(monkeypatch, clean_dist_env, fused):
    p = torch.nn.Parameter(torch.ones(8))
    opt = torch.optim.SGD([p], lr=0.1, fused=fused) if fused else torch.optim.SGD([p], lr=0.1)
    amp = AmpHelper.from_strategy(DistributedStrategy(amp=True, amp_configs={"init_loss_scaling": 4.0}), device="cpu")
    for _ in range(2):  # warm-up: lazy scale tensors, optimizer state
        amp.backward((p * 2).sum())
        amp.step(opt)
        opt.zero_grad()
    reads = _HostReads(monkeypatch)
    for step in range(4):
        loss = (p * (float("inf") if step == 2 else 2.0)).sum()
        amp.backward(loss)
        before = reads.count
        stepped = amp.step(opt)
        assert reads.count - before <= 1, f"step {step}: {reads.count - before} host reads"
        assert stepped == (step != 2)
        opt.zero_grad()
    monkeypatch.undo()
    assert amp.scaler.get_scale() == 4.0  # one inf: Paddle backs off only after decr_every_n_nan_or_inf=2 in a row


def test_scale_counters_survive_a_checkpoint_on_device_updates():
    s = DistGradScaler("cpu", init_scale=4.0, growth_interval=3, decr_every_n_nan_or_inf=2)
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.0)
    for bad in (0, 0, 1):
        s.scale((p * (float("inf") if bad else 1.0)).sum()).backward()
        s.step(opt)
        s.update()
        opt.zero_grad()
    state = s.state_dict()
    assert (state["incr_count"], state["decr_count"], state["scale"]) == (0, 1, 4.0)
    other = DistGradScaler("cpu", growth_interval=3, decr_every_n_nan_or_inf=2)
    other.load_state_dict(state)
    other.scale((p * float("inf")).sum()).backward()  # the second consecutive inf: backs off now
    other.step(opt)
    other.update()
    assert other.get_scale() == pytest.approx(4.0 * 0.8)
