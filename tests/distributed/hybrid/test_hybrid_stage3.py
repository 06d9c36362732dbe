"""Sharding stage 3 (FSDP2) beside tensor parallelism (Note [stage 3 beside mp]): mp2 × sharding2 on 4 ranks,
through ``fleet.distributed_model`` / ``distributed_optimizer`` and through Paddle's ``group_sharded_parallel(...,
group=hcg.get_sharding_parallel_group())``, trains like a hand-written single-process model from the same full
weights on the global batch (AdamW, global-norm clipping of the whole model), every rank's shards checked against
the reference's; each rank holds a quarter of the model (half of mp2 × dp2's parameter bytes); the full state
gathers to the single-process model's state and loads back into the shards."""

import hybrid_models
import pytest
import torch
import torch.distributed as tdist
from hybrid_models import (
    BATCH,
    CLIP,
    STEPS,
    RefModel,
    TPModel,
    copy_from,
    data,
    init_fleet,
    local_slice,
    run_cases,
    train_with_reference,
)
from parity import max_abs_diff, worst

import fleetlite.distributed.fleet as fleet
from fleetlite.distributed.fleet import fleet as fleet_impl
from fleetlite.distributed.fleet.meta_parallel.hybrid_stage3 import HybridStage3
from fleetlite.distributed.sharding import group_sharded_parallel
from fleetlite.testing import run_ranks
from fleetlite.trainer.clipping import ClipGradByGlobalNorm

# the single-process side of the DCP checks; FSDP2's notice that a unit returned a view (nothing edits it in place)
pytestmark = [pytest.mark.filterwarnings("ignore:torch.distributed is disabled, unavailable or uninitialized"),
              pytest.mark.filterwarnings("ignore:FSDP2-wrapped module")]

STAGE3 = {"sharding": True, "sharding_configs": {"stage": 3}}
MP2_SHARDING2 = {"mp_degree": 2, "sharding_degree": 2}


def _shard_of(full, param, hcg):
    """The reference's part of ``param``: its mp slice, then FSDP2's dim-0 chunk for this data × sharding rank."""
    part = local_slice(full, param, hcg)
    n, r = hcg.get_data_sharding_parallel_world_size(), hcg.get_data_sharding_parallel_rank()
    chunks = list(part.chunk(n, dim=0))  # torch.chunk's sizes; FSDP2 gives the ranks past the last chunk 0 rows
    return (chunks + [part[:0]] * n)[r]


def _shard_diff(model, ref, hcg):
    ref_params = dict(ref.named_parameters())
    return worst(max_abs_diff(p.to_local(), _shard_of(ref_params[n].detach(), p, hcg))
                 for n, p in model.module.named_parameters())


def _nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def _one_process(seed):
    """A single-process model seeded ``seed`` and its AdamW after one step (state to save), with the flattened
    optimizer state DCP holds (torch's ``flatten_optimizer_state_dict``)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    torch.manual_seed(seed)
    model = RefModel()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(*[t[:4] for t in data(1, 4)[0]]).backward()
    opt.step()
    flat = get_optimizer_state_dict(model, opt, options=StateDictOptions(flatten_optimizer_state_dict=True))
    return model, opt, flat


def _dcp_save(model, opt, save_dir):
    """Save the model and optimizer to ``save_dir`` (DCP: the full tensors' shards)."""
    import torch.distributed.checkpoint as dcp

    from fleetlite.distributed.fleet.meta_parallel import hybrid_state

    dcp.save(hybrid_state.dcp_state(model.module, opt, writing=True), checkpoint_id=save_dir)


def _dcp_load(model, opt, hcg, load_dir):
    """Load the single-process checkpoint at ``load_dir`` (``_one_process(2)``, written by the test) into this rank's
    shards; how far its model and optimizer shards are from that model's."""
    import torch.distributed.checkpoint as dcp

    from fleetlite.distributed.fleet.meta_parallel import hybrid_state

    state = hybrid_state.dcp_state(model.module, opt)
    dcp.load(state, checkpoint_id=load_dir)
    hybrid_state.load_dcp_state(model.module, opt, state)
    ref, ref_opt, _ = _one_process(2)
    theirs = {n: ref_opt.state[p] for n, p in ref.named_parameters()}
    optim = worst(max_abs_diff(opt.state[p][k].to_local(), _shard_of(v, p, hcg))
                  for n, p in model.module.named_parameters() for k, v in theirs[n].items() if k != "step")
    return _shard_diff(model, ref, hcg), optim


def _stage3(rank, world, api, dirs=None, hybrid=MP2_SHARDING2):
    hcg = init_fleet(hybrid, **(STAGE3 if api == "fleet" else {}))
    torch.manual_seed(0)
    ref, model = RefModel(), TPModel()
    copy_from(model, ref, hcg)
    mp_dp_bytes = _nbytes(model.parameters())  # what mp2 x dp2 (TensorParallel) keeps per rank: the whole slices
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt._grad_clip = ClipGradByGlobalNorm(CLIP)
    if api == "fleet":
        model = fleet.distributed_model(model)
        opt = fleet.distributed_optimizer(opt)
    else:
        model, opt, _ = group_sharded_parallel(model, opt, level="p_g_os", group=hcg.get_sharding_parallel_group())
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    part, parts = hcg.get_data_sharding_parallel_rank(), hcg.get_data_sharding_parallel_world_size()
    grads = []
    losses, ref_losses, norms, ref_norms = train_with_reference(
        model, opt, ref, ref_opt, STEPS, BATCH, part, parts, CLIP,
        after_backward=lambda _s: grads.append(_nbytes(p.grad.to_local() for p in model.parameters())))
    full = torch.tensor(losses)
    tdist.all_reduce(full, group=hcg.get_data_sharding_parallel_group())
    full /= parts
    out = dict(param=_shard_diff(model, ref, hcg), loss=max_abs_diff(full, torch.tensor(ref_losses)),
               norm=max_abs_diff(torch.tensor(norms), torch.tensor(ref_norms)), clipped=max(ref_norms) > CLIP,
               stage3=isinstance(model, HybridStage3),
               bytes=_nbytes(p.to_local() for p in model.parameters()) / mp_dp_bytes,
               grad_bytes=[g / mp_dp_bytes for g in grads],
               state_bytes=_nbytes(v.to_local() for s in opt.state.values() for v in s.values()
                                   if isinstance(v, torch.Tensor) and v.dim() > 0) / (2 * mp_dp_bytes))
    out["ref"] = {k: v.clone() for k, v in ref.state_dict().items()}
    if dirs is not None:
        _dcp_save(model, opt, dirs[0])
        out["ref_optim"] = {n: {k: v.clone() for k, v in ref_opt.state[p].items()} for n, p in ref.named_parameters()}
    # the full state: the single-process model's (gathered over data x sharding and mp), on every rank
    out["full"] = max_abs_diff(dict(ref.state_dict()), model.full_state_dict())
    out["full_keys"] = sorted(model.state_dict()) == sorted(ref.state_dict())
    out["rank0_only"] = len(model.full_state_dict(rank0_only=True))
    # the optimizer: the single-process optimizer's full state on rank 0, and a full state loads into the shards
    mine, theirs = opt.state_dict(), ref_opt.state_dict()["state"]
    if rank == 0:
        out["opt_full"] = worst(max_abs_diff(mine["state"][i][k], v) for i, entry in theirs.items()
                                for k, v in entry.items())
        mine = {"state": {i: {k: v * 2 if k != "step" else v for k, v in entry.items()}
                          for i, entry in mine["state"].items()}, "param_groups": mine["param_groups"]}
    opt.load_state_dict(mine)  # (rank 0's full state, broadcast)
    out["opt_loaded"] = worst(max_abs_diff(opt.state[p][k].to_local(), _shard_of(2 * v, p, hcg))
                              for p, (i, entry) in zip(model.parameters(), sorted(theirs.items()))
                              for k, v in entry.items() if k != "step")
    # ... and back: another single-process model's state loads into this rank's shards of its slices
    torch.manual_seed(1)
    other = RefModel()
    model.load_full_state_dict(other.state_dict())
    out["loaded"] = _shard_diff(model, other, hcg)
    if dirs is not None:
        out["dcp_loaded"] = _dcp_load(model, opt, hcg, dirs[1])
    return out


def _one_process_checkpoint(tmp_path):
    """(where the ranks save, a single-process DCP checkpoint of ``_one_process(2)`` for them to load)."""
    import torch.distributed.checkpoint as dcp

    dirs = (str(tmp_path / "stage3"), str(tmp_path / "one"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank runs (run_ranks): the ranks redo this step and expect the same bits
    try:
        one_model, _, one_optim = _one_process(2)
    finally:
        torch.set_num_threads(threads)
    dcp.save({"model": one_model.state_dict(), "optim": one_optim}, checkpoint_id=dirs[1], no_dist=True)
    return dirs


def _check_dcp(out, dirs):
    """Every rank loaded the single-process checkpoint into its shards, and the ranks' checkpoint loads into one
    process as the reference's trained weights and AdamW state."""
    import torch.distributed.checkpoint as dcp

    assert all(r["dcp_loaded"] == (0.0, 0.0) for r in out), [r["dcp_loaded"] for r in out]
    one_model, _, one_optim = _one_process(3)  # (other values, filled by the load)
    one = {"model": one_model.state_dict(), "optim": one_optim}
    dcp.load(one, checkpoint_id=dirs[0], no_dist=True)
    for r in out:
        assert max_abs_diff(r["ref"], one["model"]) <= 1e-5
        for name, entry in r["ref_optim"].items():
            for k, v in entry.items():
                assert max_abs_diff(v, one["optim"][f"state.{name}.{k}"]) <= 1e-5, (name, k)


@pytest.fixture(scope="module")
def mp2_sharding2(tmp_path_factory):
    """(the DCP directories, every rank's results of the mp2 x sharding2 runs of this file): stage 3 through fleet
    (with the DCP round trip through the directories) and through group_sharded_parallel, then the Trainer, in one
    4-rank launch for the module."""
    dirs = _one_process_checkpoint(tmp_path_factory.mktemp("stage3"))  # DCP: to one process and back
    cases = {"fleet": (_stage3, ("fleet", dirs), {}),
             "group_sharded_parallel": (_stage3, ("group_sharded_parallel",), {}),
             "trainer": (_trainer, (), {})}
    return dirs, run_ranks(run_cases, world_size=4, args=(cases,), timeout=600)


@pytest.mark.timeout(700)
@pytest.mark.parametrize("api", ["fleet", "group_sharded_parallel"])
def test_mp2_sharding2_stage3_trains_like_one_process_on_a_quarter_of_the_model(api, mp2_sharding2):
    dirs, runs = mp2_sharding2
    out = [r[api] for r in runs]
    if api == "fleet":
        _check_dcp(out, dirs)
    for r in out:
        assert r["stage3"], r
        assert r["param"] <= 1e-5 and r["loss"] <= 1e-5 and r["norm"] <= 1e-5 and r["clipped"], r
        assert r["bytes"] == pytest.approx(0.5, abs=0.05), r  # mp2 x stage3: half of mp2 x dp2's per rank
        assert all(g == pytest.approx(0.5, abs=0.05) for g in r["grad_bytes"]), r  # gradients sharded as well
        assert r["state_bytes"] == pytest.approx(0.5, abs=0.05), r  # AdamW's two moments of the shards
        assert r["full"] <= 1e-5 and r["full_keys"], r
        assert r["loaded"] == 0.0, r
        assert r["opt_loaded"] <= 1e-5, r  # (twice the trained state, which is the reference's within 1e-5)
    assert out[0]["opt_full"] <= 1e-5, out[0]
    assert [r["rank0_only"] for r in out] == [len(TPModel_keys()), 0, 0, 0]


@pytest.mark.timeout(600)
def test_dp2_mp2_sharding2_stage3_on_eight_ranks_shards_over_dp_and_sharding(tmp_path):
    """dp and sharding both > 1: FSDP2 over the two flattened (the hcg's dp x sharding ranks), an eighth of the model
    per rank, unevenly (DCP included)."""
    dirs = _one_process_checkpoint(tmp_path)
    out = run_ranks(_stage3, world_size=8, args=("fleet", dirs, {"dp_degree": 2, **MP2_SHARDING2}), timeout=590)
    _check_dcp(out, dirs)
    for r in out:
        assert r["stage3"] and r["clipped"], r
        assert r["param"] <= 1e-5 and r["loss"] <= 1e-5 and r["norm"] <= 1e-5 and r["full"] <= 1e-5, r
        assert r["loaded"] == 0.0 and r["opt_loaded"] <= 1e-5, r
    assert out[0]["opt_full"] <= 1e-5, out[0]
    # each element once over the 4 data ranks of an mp rank (uneven here: 6 rows in 4 parts are 2, 2, 2, 0)
    assert sum(r["bytes"] for r in out) == pytest.approx(2.0) and sum(r["state_bytes"] for r in out) == \
        pytest.approx(2.0)


def _trainer(rank=0, world=1):
    """The Trainer (SGD momentum, global-norm clipping, LR scheduler, eval, predict) on mp2 x sharding2 stage 3 (8
    rows per rank), or one process with the global batch of 16."""
    fleet_impl._reset()
    clip, loss = {"global_clipnorm": 0.05}, torch.nn.CrossEntropyLoss()
    if world == 1:
        net = hybrid_models.reference_net()
        _, out = hybrid_models.run_trainer(net, None, 16, 8, clip=clip, loss=loss)
        out["weights"] = {k: v.detach().clone() for k, v in net.named_parameters()}
        return out
    torch.set_num_threads(1)
    init_fleet({"dp_degree": 1, **MP2_SHARDING2}, **STAGE3)
    t, out = hybrid_models.run_trainer(hybrid_models.tp_net(), fleet.user_strategy(), 8, 8, clip=clip, loss=loss)
    out["weights"] = {hybrid_models._ref_name(k): v for k, v in t.parallel_network.full_state_dict().items()}
    out["stage3"] = isinstance(t.parallel_network, HybridStage3)
    return out


@pytest.mark.timeout(700)
def test_trainer_on_mp2_sharding2_stage3_equals_one_process(mp2_sharding2):
    ref = _trainer()
    for r in (out["trainer"] for out in mp2_sharding2[1]):
        assert r["stage3"] and not hybrid_models.compare(r, ref), hybrid_models.compare(r, ref)


def _other_group(rank, world):
    fleet_impl._reset()
    fleet.init(is_collective=True)
    net = torch.nn.Linear(4, 4)
    try:
        group_sharded_parallel(net, torch.optim.SGD(net.parameters(), lr=0.1), level="p_g_os", group=tdist.group.WORLD)
    except NotImplementedError as e:
        return str(e)
    return None


def test_group_sharded_parallel_refuses_a_group_that_is_not_the_hcg_sharding_group():
    for message in run_ranks(_other_group, world_size=2, timeout=120):
        assert message is not None and "group_sharded_parallel(group=...) takes the hybrid communicate group's " \
            "sharding group only" in message.splitlines()[0], message


def TPModel_keys():
    return RefModel().state_dict().keys()


def test_stage3_beside_mp_is_accepted_and_beside_mp_and_pp_together_accepted():  # (3-D runs: test_3d_stage3.py)
    strategy = fleet.DistributedStrategy(**STAGE3)
    strategy.hybrid_configs = MP2_SHARDING2
    strategy.check_supported(4)
    strategy.hybrid_configs = {"pp_degree": 2, "mp_degree": 2, "sharding_degree": 2}
    strategy.check_supported(8)
