"""Sharding stage 2 next to tensor and pipeline parallelism (Note [hybrid sharding stage 2]): mp2 × sharding2 and
pp2 × sharding2 on 4 ranks train like a single process of the same model from the same weights (AdamW,
global-norm clipping of the whole model), and after each step's reduction a rank holds only the gradients of
the parameters its ZeroRedundancyOptimizer partition owns (the others None): about half of stage 1's gradient
bytes per rank. Gradient merge and the Trainer keep working; stage 3 runs beside mp or pp (test_hybrid_stage3.py,
test_hybrid_stage3_pp.py), not beside both."""

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
    max_param_diff,
    reference,
    run_cases,
    tied_batch,
    tied_descs,
    tied_loss,
    train_with_reference,
)
from parity import max_abs_diff, worst
from torch.optim.optimizer import register_optimizer_step_pre_hook

import fleetlite
import fleetlite.distributed.fleet as fleet
from fleetlite.distributed.fleet import fleet as fleet_impl
from fleetlite.distributed.fleet.meta_parallel import PipelineLayer, PipelineParallel, TensorParallel
from fleetlite.testing import run_ranks
from fleetlite.trainer.clipping import ClipGradByGlobalNorm

STAGE2 = {"sharding": True, "sharding_configs": {"stage": 2}}


def _nbytes(params):
    return sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)


def _ownership(params, opt, hcg):
    """After the reduction: do the owned parameters (ZeRO partition) hold gradients and the others none; this rank's
    gradient bytes, all parameters' bytes (stage 1 keeps every gradient), and the bytes summed over the group."""
    to_rank, me = opt.inner_opt._param_to_rank, hcg.get_sharding_parallel_rank()
    ok = all((p.grad is not None) == (to_rank[p] == me) for p in params)
    freed = sum(p.grad is None for p in params)
    mine = torch.tensor(float(_nbytes(params)))
    total = mine.clone()
    tdist.all_reduce(total, group=hcg.get_sharding_parallel_group())
    full = sum(p.numel() * p.element_size() for p in params)
    largest = max(p.numel() * p.element_size() for p in params)  # ZeRO partitions whole parameters
    return ok, freed, mine.item(), total.item(), full, largest


def _mp_stage2(rank, world, stage, dp=1):
    hcg = init_fleet({"dp_degree": dp, "mp_degree": 2, "sharding_degree": 2},
                     **({"sharding": True, "sharding_configs": {"stage": stage}}))
    torch.manual_seed(0)
    ref, model = RefModel(), TPModel()
    copy_from(model, ref, hcg)
    model = fleet.distributed_model(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt._grad_clip = ClipGradByGlobalNorm(CLIP)
    opt = fleet.distributed_optimizer(opt)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    params = list(model.parameters())
    part, parts = hcg.get_data_sharding_parallel_rank(), hcg.get_data_sharding_parallel_world_size()
    owned = []
    losses, ref_losses, norms, ref_norms = train_with_reference(
        model, opt, ref, ref_opt, STEPS, BATCH, part, parts, CLIP,
        after_backward=lambda _step: owned.append(_ownership(params, opt, hcg)))
    full = torch.tensor(losses)
    tdist.all_reduce(full, group=hcg.get_data_sharding_parallel_group())
    full /= parts
    return dict(param=max_param_diff(model, ref, hcg), loss=max_abs_diff(full, torch.tensor(ref_losses)),
                norm=max_abs_diff(torch.tensor(norms), torch.tensor(ref_norms)), clipped=max(ref_norms) > CLIP,
                is_tp=isinstance(model, TensorParallel), zero=type(opt.inner_opt).__name__, owned=owned,
                buckets=[getattr(b, "buffer", None) is None for b in model._reducer.buckets],
                stage2=model.sharded_grads is not None)


@pytest.mark.timeout(300)
def test_mp2_sharding2_stage2_keeps_only_owned_gradients_and_trains_like_one_process():
    out = run_ranks(_mp_stage2, world_size=4, args=(2,), timeout=290)
    print({k: max(r[k] for r in out) for k in ("param", "loss", "norm")}, out[0]["owned"][0])
    for r in out:
        assert r["param"] <= 1e-5 and r["loss"] <= 1e-5 and r["norm"] <= 1e-5, r
        assert r["clipped"] and r["is_tp"] and r["stage2"] and r["zero"] == "ZeroRedundancyOptimizer"
        assert all(r["buckets"])  # the engine allocated no bucket holding every gradient
        for ok, freed, mine, total, full, _ in r["owned"]:
            assert ok and freed > 0, r["owned"]
            assert total == full  # each gradient on exactly one rank of the sharding group
            assert mine <= 0.6 * full, (mine, full)  # about 1/2 of stage 1's (which holds `full`)


@pytest.mark.timeout(300)
def test_mp2_sharding2_stage1_still_keeps_every_gradient():
    """The same measure on stage 1: every rank holds every gradient (what stage 2's bytes are compared to)."""
    for r in run_ranks(_mp_stage2, world_size=4, args=(1,), timeout=290):
        assert r["param"] <= 1e-5 and not r["stage2"]
        for _ok, freed, mine, total, full, _ in r["owned"]:
            assert freed == 0 and mine == full and total == 2 * full


@pytest.mark.timeout(400)
def test_dp2_mp2_sharding2_stage2_on_eight_ranks():
    """With dp > 1 each owner all-reduces its reduced part over the dp group (the owners of the same parameters in
    the other replica)."""
    for r in run_ranks(_mp_stage2, world_size=8, args=(2, 2), timeout=390):
        assert r["param"] <= 1e-5 and r["loss"] <= 1e-5 and r["norm"] <= 1e-5 and r["clipped"], r
        for ok, freed, mine, total, full, _ in r["owned"]:
            assert ok and freed > 0 and total == full and mine <= 0.6 * full, r["owned"]


def _no_optimizer(rank, world):
    init_fleet({"dp_degree": 1, "mp_degree": 2, "sharding_degree": 2}, **STAGE2)
    model = fleet.distributed_model(TPModel())
    ids, labels = data(1, BATCH)[0]
    model(ids, labels).backward()


def test_stage2_backward_before_the_optimizer_fails_on_every_rank_with_one_line():
    out = run_ranks(_no_optimizer, world_size=4, timeout=120, expect_failure=True)
    for status, text in out.values():
        assert status == "error" and "call fleet.distributed_optimizer(opt) before the first backward" in text, text


def _pp_stage2(rank, world):
    hcg = init_fleet({"dp_degree": 1, "pp_degree": 2, "sharding_degree": 2},
                     pipeline_configs={"accumulate_steps": 4, "micro_batch_size": 2}, **STAGE2)
    ref = reference("tied")
    stage = PipelineLayer(tied_descs(), topology=hcg.topology(), loss_fn=tied_loss)
    copy_from(stage, ref)
    model = fleet.distributed_model(stage)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
    inner._grad_clip = ClipGradByGlobalNorm(0.5)
    opt = fleet.distributed_optimizer(inner)
    params = list(stage.parameters())
    owned = []
    opt.register_step_pre_hook(lambda *_: owned.append(_ownership(params, opt, hcg)))  # after the reduction
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    part, parts = hcg.get_data_sharding_parallel_rank(), hcg.get_data_sharding_parallel_world_size()
    d_loss, d_norm, clipped = [], [], False
    for step in range(4):
        shards = [tied_batch(step, 8, d) for d in range(parts)]
        x, y = shards[part]
        loss = model.train_batch([x, y], opt)
        losses = [tied_loss(ref(*xs), ys) for xs, ys in shards]
        ref_opt.zero_grad()
        torch.stack(losses).mean().backward()
        ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        clipped |= bool(ref_norm > 0.5)
        ref_opt.step()
        d_loss.append(abs(loss.item() - losses[part].item()))
        d_norm.append(abs(opt.hybrid_clip.last_norm.item() - ref_norm.item()))
    d_param = max_abs_diff(stage.state_dict(), ref.state_dict())
    return dict(loss=worst(d_loss), param=d_param, norm=worst(d_norm), clipped=clipped,
                is_pp=isinstance(model, PipelineParallel),
                owned=owned, stage2=model.sharded_grads is not None)


@pytest.mark.timeout(300)
def test_pp2_sharding2_stage2_keeps_only_owned_gradients_and_trains_like_one_process():
    out = run_ranks(_pp_stage2, world_size=4, timeout=290)
    print({k: max(r[k] for r in out) for k in ("param", "loss", "norm")}, out[0]["owned"][0])
    for r in out:
        assert r["loss"] <= 1e-5 and r["param"] <= 1e-5 and r["norm"] <= 1e-5, r
        assert r["clipped"] and r["is_pp"] and r["stage2"] and len(r["owned"]) == 4
        for ok, freed, mine, total, full, largest in r["owned"]:
            # half of stage 1's at the granularity of whole parameters (this stage's tied weight is 78% of it)
            assert ok and freed > 0 and total == full and mine < full and mine <= full / 2 + largest, r["owned"]


def _merge_stage2(rank, world):
    """mp2 × sharding2 stage 2 with gradient merge (k=2): the window's first backward keeps full local gradients,
    the second reduces the accumulated sum to the owners."""
    hcg = init_fleet({"dp_degree": 1, "mp_degree": 2, "sharding_degree": 2}, gradient_merge=True,
                     gradient_merge_configs={"k_steps": 2, "avg": True}, **STAGE2)
    torch.manual_seed(0)
    ref, model = RefModel(), TPModel()
    copy_from(model, ref, hcg)
    model = fleet.distributed_model(model)
    opt = fleet.distributed_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-2))
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    params = list(model.parameters())
    part = hcg.get_data_sharding_parallel_rank()
    batches = data(4, BATCH * 2)
    stepped, freed = [], []
    for ids, labels in batches:  # 4 micro-batches: 2 optimizer steps
        rows = slice(part * BATCH, (part + 1) * BATCH)
        opt.backward(model(ids[rows], labels[rows]))
        freed.append(sum(p.grad is None for p in params))
        opt.step()
        opt.clear_grad()
        stepped.append(opt.stepped)
    for i in (0, 2):
        ((ref(*batches[i]) + ref(*batches[i + 1])) / 2).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    return max_param_diff(model, ref, hcg), stepped, freed


@pytest.mark.timeout(300)
def test_mp2_sharding2_stage2_gradient_merge_on_four_ranks():
    for diff, stepped, freed in run_ranks(_merge_stage2, world_size=4, timeout=290):
        assert diff <= 1e-5 and stepped == [False, True, False, True], diff
        assert freed[0] == freed[2] == 0 and freed[1] > 0 and freed[3] > 0, freed  # reduced (and freed) per window


CLIPS = {"global": {"global_clipnorm": 0.05}, "each": {"clipnorm": 0.05}}


def _trainer(rank=0, world=1, kind="mp", clip="global"):
    """The Trainer (SGD momentum, clipping, LR scheduler, eval, predict) on mp2 × sharding2 or pp2 × sharding2 stage
    2 (8 rows per rank), or one process with the global batch of 16; each optimizer step's freed-gradient count is
    recorded by a global step pre-hook."""
    seen = []
    handle = register_optimizer_step_pre_hook(
        lambda opt, *_: seen.append(sum(p.grad is None for g in opt.param_groups for p in g["params"]))
        if world == 1 or type(opt).__name__ == "ZeroRedundancyOptimizer" else None)  # (not its local optimizer)
    loss = torch.nn.CrossEntropyLoss()
    try:
        if world == 1:
            fleet_impl._reset()
            net = hybrid_models.reference_net()
            t, out = hybrid_models.run_trainer(net, None, 16, 8, clip=CLIPS[clip], loss=loss)
            out["weights"] = {k: v.detach().clone() for k, v in net.named_parameters()}
        else:
            torch.set_num_threads(1)
            init_fleet({"dp_degree": 1, "mp_degree": 2 if kind == "mp" else 1, "pp_degree": 2 if kind == "pp" else 1,
                       "sharding_degree": 2}, {"accumulate_steps": 2, "micro_batch_size": 4} if kind == "pp" else None,
                       **STAGE2)
            strategy = fleet.user_strategy()
            net = hybrid_models.tp_net() if kind == "mp" else hybrid_models.pipeline_stage(loss_fn=None)
            t, out = hybrid_models.run_trainer(net, strategy, 8, 8, clip=CLIPS[clip], loss=loss)
            out["weights"] = hybrid_models.full_tp_weights(net) if kind == "mp" else \
                hybrid_models.all_stage_weights(net)
            out["zero"] = type(t.optimizer.inner_opt).__name__
    finally:
        handle.remove()
    out["freed"] = seen
    return out


@pytest.fixture(scope="module")
def trainer_runs():
    """``trainer_runs(kind)``: every rank's results of that layout's runs (launched once for the module)."""
    runs = {}

    def get(kind):
        if kind not in runs:
            clips = list(CLIPS) if kind == "mp" else ["global"]
            cases = {clip: (_trainer, (kind, clip), {}) for clip in clips}
            runs[kind] = run_ranks(run_cases, 4, args=(cases,), timeout=500)
        return runs[kind]

    return get


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind, clip", [("mp", "global"), ("mp", "each"), ("pp", "global")])
def test_trainer_sharding2_stage2_equals_one_process(kind, clip, trainer_runs):
    ref = _trainer(clip=clip)
    for r in (out[clip] for out in trainer_runs(kind)):
        assert not hybrid_models.compare(r, ref), hybrid_models.compare(r, ref)
        assert r["zero"] == "ZeroRedundancyOptimizer"
        assert r["freed"] and all(n > 0 for n in r["freed"]), r["freed"]  # every step: non-owned gradients freed


@pytest.mark.parametrize("fields, hybrid, error, match", [
    ({"sharding": True, "sharding_configs": {"stage": 2}, "fp16_allreduce": True},
     {"mp_degree": 2, "sharding_degree": 2}, NotImplementedError, "fp16_allreduce with sharding stage 2"),
    ({"sharding": True, "sharding_configs": {"stage": 2, "offload": True}}, {"pp_degree": 2, "sharding_degree": 2},
     NotImplementedError, "offload/wrap apply to FSDP2"),
])
def test_hybrid_sharding_stage2_3_refusals(fields, hybrid, error, match):
    strategy = fleet.DistributedStrategy(**fields)
    strategy.hybrid_configs = hybrid
    with pytest.raises(error) as info:
        strategy.check_supported(4)
    assert match in str(info.value).splitlines()[0]


def test_hybrid_sharding_stage2_is_accepted():
    for hybrid in ({"mp_degree": 2, "sharding_degree": 2}, {"pp_degree": 2, "sharding_degree": 2}):
        strategy = fleet.DistributedStrategy(**STAGE2)
        strategy.hybrid_configs = hybrid
        strategy.check_supported(4)
        assert strategy.sharding_stage == 2


def test_hybrid_sharding_stage3_beside_pp_is_accepted():  # (it trains: test_hybrid_stage3_pp.py)
    strategy = fleet.DistributedStrategy(sharding=True, sharding_configs={"stage": 3})
    strategy.hybrid_configs = {"pp_degree": 2, "sharding_degree": 2}
    strategy.check_supported(4)
    assert strategy.sharding_stage == 3


def _manual_stage2(rank, world):
    """Paddle's manual pattern (no_sync, then fused_allreduce_gradients) under stage 2: every rank then holds every
    gradient, and the clip's norm still counts each once (only the owned ones)."""
    from fleetlite.distributed.fleet.utils.hybrid_parallel_util import fused_allreduce_gradients

    hcg = init_fleet({"dp_degree": 1, "mp_degree": 2, "sharding_degree": 2}, **STAGE2)
    torch.manual_seed(0)
    ref, model = RefModel(), TPModel()
    copy_from(model, ref, hcg)
    model = fleet.distributed_model(model)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
    inner._grad_clip = ClipGradByGlobalNorm(CLIP)
    opt = fleet.distributed_optimizer(inner)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    part, d_norm = hcg.get_data_sharding_parallel_rank(), []
    for ids, labels in data(3, BATCH * 2):
        with model.no_sync():
            model(ids[part * BATCH:(part + 1) * BATCH], labels[part * BATCH:(part + 1) * BATCH]).backward()
        fused_allreduce_gradients(list(model.parameters()), hcg)
        opt.step()
        opt.clear_grad()
        ref(ids, labels).backward()
        d_norm.append(abs(torch.nn.utils.clip_grad_norm_(ref.parameters(), CLIP).item()
                          - opt.hybrid_clip.last_norm.item()))
        ref_opt.step()
        ref_opt.zero_grad()
    return max_param_diff(model, ref, hcg), worst(d_norm)


@pytest.mark.timeout(300)
def test_mp2_sharding2_stage2_manual_fused_allreduce_counts_each_gradient_once():
    for diff, d_norm in run_ranks(_manual_stage2, world_size=4, timeout=290):
        assert diff <= 1e-5 and d_norm <= 1e-5, (diff, d_norm)


def _trainer_accumulate(rank=0, world=1):
    """The Trainer's accumulate_grad_batches=2 on mp2 × sharding2 stage 2 (the window keeps full local gradients,
    its last backward reduces to the owners), or one process with the global batch."""
    torch.set_num_threads(1)
    fleet_impl._reset()
    if world > 1:
        init_fleet({"dp_degree": 1, "mp_degree": 2, "pp_degree": 1, "sharding_degree": 2}, **STAGE2)
    net = hybrid_models.tp_net() if world > 1 else hybrid_models.reference_net()
    opt = torch.optim.AdamW(net.parameters(), lr=0.02)
    t = fleetlite.Trainer(net, opt, torch.nn.CrossEntropyLoss(), strategy=fleet.user_strategy() if world > 1 else None,
                          device="cpu")
    t.compile(global_clipnorm=0.05)
    t.fit(hybrid_models.dataset(48, 1), epochs=1, batch_size=4 if world > 1 else 8, accumulate_grad_batches=2,
          shuffle=False, verbose=0)
    weights = hybrid_models.full_tp_weights(net) if world > 1 else {
        k: v.detach().clone() for k, v in net.named_parameters()}
    return weights, t.global_step


@pytest.mark.timeout(300)
def test_trainer_accumulate_grad_batches_mp2_sharding2_stage2():
    ref, ref_steps = _trainer_accumulate()
    for weights, steps in run_ranks(_trainer_accumulate, 4, timeout=290):
        assert steps == ref_steps == 3
        for k, w in ref.items():
            assert (weights[k] - w).abs().max() <= 1e-5, k
