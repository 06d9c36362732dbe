"""fleet.init / distributed_model / worker queries; sync_batch_norm and fp16_allreduce through the facade."""

import copy
import logging

import pytest
import torch
import torch.nn.functional as F
from fleet_models import MLP, Net, batch, fresh_fleet, max_diff, params_of

import fleetlite
import fleetlite.distributed.fleet as fleet
from fleetlite.distributed.fleet import DistributedStrategy
from fleetlite.distributed.fleet import fleet as fleet_impl
from fleetlite.nn import SyncBatchNorm
from fleetlite.parallel import module_units, plan_buckets
from fleetlite.testing import run_ranks


def _basics(rank, world):
    fleet_impl._reset()
    fleet.init(fleet.PaddleCloudRoleMaker(is_collective=True))
    info = (fleet.worker_index(), fleet.worker_num(), fleet.is_first_worker(), fleet.local_rank(),
            len(fleet.worker_endpoints()))
    fleet.barrier_worker()
    strategy = DistributedStrategy(fuse_grad_size_in_MB=0.001, last_comm_group_size_MB=0.0005,
                                   find_unused_parameters=True)
    fleet.init(strategy=strategy)  # again: keeps the process group, replaces the strategy
    net = MLP()
    names = [n for n, _ in net.named_parameters()]
    model = fleet.distributed_model(net)
    expected = [[names[i] for i in b.param_indices] for b in plan_buckets(list(net.parameters()), 0.001, 0.0005,
                                                                           units=module_units(names))]
    got = [b["params"] for b in model.bucket_plan]
    fleet.init(strategy=DistributedStrategy(fuse_all_reduce_ops=False))
    unfused = fleet.distributed_model(MLP())
    return (info, isinstance(model, fleetlite.DataParallel), model.find_unused_parameters, got, expected,
            len(unfused.bucket_plan), len(names))


@pytest.mark.timeout(120)
def test_init_worker_queries_and_bucket_sizes_from_the_strategy():
    results = run_ranks(_basics)
    for rank, (info, is_dp, unused, plan, expected, n_unfused, n_params) in enumerate(results):
        assert info == (rank, 2, rank == 0, rank, 2)
        assert is_dp and unused
        assert plan == expected and len(plan) > 2  # fuse_grad_size_in_MB / last_comm_group_size_MB became the plan
        assert n_unfused == n_params  # fuse_all_reduce_ops=False: one all-reduce per gradient


def _sync_bn(rank, world):
    fresh_fleet(DistributedStrategy(sync_batch_norm=True))
    torch.manual_seed(0)
    net = Net()
    ref = copy.deepcopy(net)  # single process on the concatenated batch
    model = fleet.distributed_model(net)
    opt = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for step in range(3):
        parts = [batch(step, r) for r in range(world)]
        x, y = parts[rank]
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.clear_grad()
        F.cross_entropy(ref(torch.cat([p[0] for p in parts])), torch.cat([p[1] for p in parts])).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    return max_diff(params_of(model), params_of(ref)), type(model.module.block1.bn).__name__


@pytest.mark.timeout(120)
def test_sync_batch_norm_equals_single_process_on_the_whole_batch():
    for diff, bn_type in run_ranks(_sync_bn):
        assert bn_type == SyncBatchNorm.__name__
        assert diff <= 1e-5  # weights and running statistics


def _fp16_allreduce(rank, world, dtype):
    fresh_fleet(DistributedStrategy(fp16_allreduce=True, fp16_allreduce_configs={"dtype": dtype}))
    torch.manual_seed(0)
    net = MLP(width=64)
    ref = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(net))  # the peer: torch DDP
    model = fleet.distributed_model(net)
    x, y = batch(0, rank, n=16)
    F.cross_entropy(model(x), y).backward()
    F.cross_entropy(ref(x), y).backward()
    g = torch.cat([p.grad.flatten() for p in model.parameters()])
    r = torch.cat([p.grad.flatten() for p in ref.parameters()])
    return ((g - r).norm() / r.norm()).item(), str(g.dtype)


U_FP16, U_BF16 = 2.0 ** -11, 2.0 ** -8  # unit roundoff of float16 and bfloat16


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype, low, high", [("float16", 0.0, 2 * U_FP16), ("bfloat16", 2 * U_FP16, 2 * U_BF16)])
def test_fp16_allreduce_is_close_to_fp32(dtype, low, high):
    """Each rank's gradient is rounded to ``dtype`` before the all-reduce and the sum is rounded again: a relative
    error of up to about twice the dtype's unit roundoff (the ranks' gradients here do not cancel); measured
    3.6e-4 (float16) and 2.2e-3 (bfloat16). bfloat16's error is above float16's bound, so the window also tells
    which dtype ran (the old 1e-2 for bfloat16 let float16 through)."""
    for rel, grad_dtype in run_ranks(_fp16_allreduce, args=(dtype,)):
        assert low < rel <= high, rel  # rounded through the reduced dtype, yet close; grads back in fp32
        assert grad_dtype == "torch.float32"


# --- single process ---------------------------------------------------------------------------------------------


def test_calls_before_init_and_parameter_server_mode_are_refused(clean_dist_env):
    fleet_impl._reset()
    with pytest.raises(RuntimeError, match=r"before fleet.init\(\)"):
        fleet.distributed_model(torch.nn.Linear(2, 2))
    with pytest.raises(RuntimeError, match=r"before fleet.init\(\)"):
        fleet.distributed_optimizer(torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1))
    with pytest.raises(NotImplementedError, match="parameter-server"):
        fleet.init(is_collective=False)
    with pytest.raises(NotImplementedError, match="parameter-server"):
        fleet.init(fleet.PaddleCloudRoleMaker(is_collective=False))
    with pytest.raises(NotImplementedError, match="use_pure_fp16"):
        fleet.init(strategy=DistributedStrategy(amp=True, amp_configs={"use_pure_fp16": True}))
    with pytest.raises(ValueError, match="log_level"):
        fleet.init(log_level="LOUD")
    with pytest.raises(TypeError, match="DistributedStrategy"):
        fleet.init(strategy="amp")
    assert not fleet.is_initialized()


def test_single_process_facade(single, caplog):
    with caplog.at_level(logging.INFO, logger="fleetlite"):
        single(amp=True, amp_configs={"dtype": "bfloat16"}, sync_batch_norm=True)
    assert "fleet initialised: 1 worker(s)" in caplog.text
    assert (fleet.worker_index(), fleet.worker_num(), fleet.is_first_worker()) == (0, 1, True)
    fleet.barrier_worker()
    strategy = fleet.get_strategy()
    strategy.amp = False  # a copy
    assert fleet.get_strategy().amp
    torch.manual_seed(0)
    net = Net()
    model = fleet.distributed_model(net)
    assert model.module is net and isinstance(net.block1.bn, SyncBatchNorm)
    out = model(torch.randn(4, 8))
    assert out.dtype == torch.float32
    assert list(model.state_dict()) == list(Net().state_dict())
    with pytest.raises(ValueError, match="already wrapped"):
        fleet.distributed_model(model)
    fleet.init(strategy={"gradient_merge": True})  # a plain dict (as Hydra gives it) is accepted
    assert fleet.get_strategy().gradient_merge
