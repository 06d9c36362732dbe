"""amp: autocast + loss scaling from the strategy; inf/nan skips agree on every rank; Paddle's scale rules."""

import pytest
import torch
import torch.nn.functional as F
from fleet_models import MLP, Net, batch, fresh_fleet, max_diff, params_of

import fleetlite.distributed.fleet as fleet
from fleetlite.distributed.fleet import AmpHelper, DistGradScaler, DistributedStrategy
from fleetlite.testing import run_ranks


def _train(rank, world, dtype):
    fresh_fleet(DistributedStrategy(amp=True, amp_configs={"dtype": dtype, "init_loss_scaling": 1024.0}))
    torch.manual_seed(0)
    model = fleet.distributed_model(Net())
    opt = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9))
    seen = []
    model.module.head.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    data = [batch(i, rank, n=8) for i in range(4)]
    losses = []
    for step in range(24):
        x, y = data[step % 4]
        out = model(x)
        loss = F.cross_entropy(out, y)
        opt.minimize(loss)
        opt.clear_grad()
        losses.append(loss.item())
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}  # BN running stats are per rank
    return losses, str(seen[0]), str(out.dtype), opt.amp.scaler.get_scale(), weights


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_amp_trains_and_ranks_stay_identical(dtype):
    results = run_ranks(_train, args=(dtype,))
    for losses, inner_dtype, out_dtype, scale, _ in results:
        assert inner_dtype == f"torch.{dtype}"  # the layers ran under autocast
        assert out_dtype == "torch.float32"  # outputs come back in float32 for the loss
        assert sum(losses[-4:]) < 0.7 * sum(losses[:4])  # the loss falls
        assert scale == (1024.0 if dtype == "float16" else 1.0)  # bfloat16: no scaler
    assert max_diff(results[0][4], results[1][4]) == 0


def _inf_skip(rank, world, use_dp, decr_every, k_steps):
    fresh_fleet(DistributedStrategy(
        amp=True, amp_configs={"init_loss_scaling": 1024.0, "decr_every_n_nan_or_inf": decr_every},
        gradient_merge=k_steps > 1, gradient_merge_configs={"k_steps": k_steps}))
    torch.manual_seed(0)
    model = fleet.distributed_model(MLP()) if use_dp else MLP()  # without the engine no all-reduce spreads inf
    opt = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    record = []
    for step in range(4):  # windows 1 and 2 carry an inf on rank 1 only
        before = params_of(model)
        for micro in range(k_steps):
            x, y = batch(10 * step + micro, rank)
            loss = F.cross_entropy(model(x), y)
            if rank == 1 and step in (1, 2) and micro == 0:
                loss = loss * float("inf")
            opt.minimize(loss)
            opt.clear_grad()
        after = params_of(model)
        # a skipped inf step must leave finite weights; exact comparison, so a NaN cannot read as "unchanged"
        assert all(torch.isfinite(v).all() for v in after.values()), f"rank {rank} step {step}: non-finite weights"
        changed = any(not torch.equal(before[k], v) for k, v in after.items())
        record.append((opt.stepped, changed, opt.amp.scaler.get_scale()))
    return record


@pytest.mark.timeout(120)
@pytest.mark.parametrize("use_dp, decr_every, k_steps", [(False, 1, 1), (True, 2, 1), (True, 1, 2)])
def test_inf_on_one_rank_skips_the_step_on_every_rank(use_dp, decr_every, k_steps):
    r0, r1 = run_ranks(_inf_skip, args=(use_dp, decr_every, k_steps))
    assert r0 == r1  # same skip decisions, same scales
    assert [(stepped, changed) for stepped, changed, _ in r0] == [(True, True), (False, False), (False, False),
                                                                  (True, True)]
    if decr_every == 1:
        scales = [1024.0 * 0.8, 1024.0 * 0.8 ** 2]
    else:  # Paddle: back off only after decr_every consecutive inf steps
        scales = [1024.0, 1024.0 * 0.8]
    assert [s for *_, s in r0] == pytest.approx([1024.0] + scales + [scales[-1]])


# --- single process ---------------------------------------------------------------------------------------------


def _scaler_run(scaler, pattern):
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.0)
    scales = []
    for bad in pattern:
        loss = (p * (float("inf") if bad else 1.0)).sum()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        scales.append(scaler.get_scale())
    return scales


def test_scale_rules_follow_paddle():
    s = DistGradScaler("cpu", init_scale=4.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2,
                       decr_every_n_nan_or_inf=2)
    # grows after 2 good steps; one inf resets the good count; two consecutive infs back off
    assert _scaler_run(s, [0, 0, 0, 1, 0, 0, 1, 1]) == [4.0, 8.0, 8.0, 8.0, 8.0, 16.0, 16.0, 8.0]
    tiny = DistGradScaler("cpu", init_scale=1.5, backoff_factor=0.5, decr_every_n_nan_or_inf=1)
    assert _scaler_run(tiny, [1, 1]) == [1.0, 1.0]  # never below 1
    static = DistGradScaler("cpu", init_scale=8.0, growth_interval=1, decr_every_n_nan_or_inf=1, dynamic=False)
    assert _scaler_run(static, [0, 1, 0]) == [8.0, 8.0, 8.0]
    state = s.state_dict()
    other = DistGradScaler("cpu", decr_every_n_nan_or_inf=2)
    other.load_state_dict(state)
    assert other.get_scale() == 8.0 and other.state_dict() == state
    with pytest.raises(ValueError, match="decr_every_n_nan_or_inf"):
        DistGradScaler("cpu", decr_every_n_nan_or_inf=0)


def test_helper_maps_the_strategy():
    s = DistributedStrategy(amp=True, amp_configs={"init_loss_scaling": 512, "incr_ratio": 3.0, "decr_ratio": 0.25,
                                                   "incr_every_n_steps": 7})
    amp = AmpHelper.from_strategy(s, device="cpu")
    assert amp.uses_scaler and amp.dtype == torch.float16 and amp.device_type == "cpu"
    sc = amp.scaler
    assert (sc.get_scale(), sc.get_growth_factor(), sc.get_backoff_factor(), sc.get_growth_interval()) == \
        (512.0, 3.0, 0.25, 7)
    with amp.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float16
    bf = AmpHelper.from_strategy(DistributedStrategy(amp=True, amp_configs={"dtype": "bfloat16"}), device="cpu")
    assert not bf.uses_scaler and bf.dtype == torch.bfloat16
    off = AmpHelper.from_strategy(DistributedStrategy(), device="cpu")
    with off.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    loss = torch.ones((), requires_grad=True)
    assert off.scale(loss) is loss
    with pytest.raises(ValueError, match="amp dtype"):
        AmpHelper(True, "float32")


def test_float16_without_loss_scaling_is_refused(single):
    single(amp=True)
    lin = torch.nn.Linear(2, 1)
    model = fleet.distributed_model(lin)
    opt = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    model(torch.ones(1, 2)).sum().backward()  # not scaled: the step would divide true gradients by the scale
    with pytest.raises(RuntimeError, match=r"optimizer.minimize\(loss\)"):
        opt.step()
    amp = fleet.amp.from_strategy(device="cpu")  # the strategy kept by fleet.init
    assert amp.uses_scaler and amp.scaler.get_scale() == 32768.0
    with pytest.raises(ValueError, match="applies amp itself"):
        amp.step(opt)


def test_distributed_scaler_keeps_torch_settings():
    torch_scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=10)
    scaler = fleet.distributed_scaler(torch_scaler)
    assert isinstance(scaler, DistGradScaler)
    assert (scaler.get_scale(), scaler.get_growth_interval()) == (256.0, 10)
    assert _scaler_run(scaler, [1]) == [256.0 * 0.5]  # torch's rule: back off on every inf step
