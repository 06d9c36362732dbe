"""Sharding stage 1 next to tensor and pipeline parallelism (Paddle's ``hybrid_configs`` ``sharding_degree``):
mp2 × sharding2 and pp2 × sharding2 on 4 ranks train like a single process of the same model from the same
weights (AdamW, global-norm clipping), each sharding rank keeps the optimizer state of part of the parameters
(Note [sharding with mp and pp]), and the combinations that do not run fail with one line before any work."""

import pytest
import torch
import torch.distributed as tdist
from hybrid_models import (
    BATCH,
    CLIP,
    LM_MICRO,
    LM_ROWS,
    STEPS,
    TP_VOCAB,
    RefModel,
    TPModel,
    copy_from,
    data,
    init_fleet,
    lm_descs,
    lm_loss,
    lm_reference,
    local_slice,
    max_param_diff,
    reference,
    tied_batch,
    tied_descs,
    tied_loss,
    train_with_reference,
)
from parity import max_abs_diff, worst

import fleetlite
import fleetlite.distributed.fleet as fleet
from fleetlite.distributed.fleet.meta_parallel import PipelineLayer, PipelineParallel, TensorParallel
from fleetlite.testing import run_ranks
from fleetlite.trainer import callbacks as C
from fleetlite.trainer.clipping import ClipGradByGlobalNorm


def _state_split(opt, n_params, hcg):
    """How many parameters' AdamW state each sharding rank holds, and the consolidated state's size on its rank 0."""
    counts = [None] * hcg.get_sharding_parallel_world_size()
    tdist.all_gather_object(counts, len(opt.state), group=hcg.get_sharding_parallel_group())
    full = opt.state_dict()  # collective over the sharding group: rank 0 of it gets the full state
    return counts, (len(full["state"]) if hcg.get_sharding_parallel_rank() == 0 else None), n_params


def _groups(hcg):
    ranks = tdist.get_process_group_ranks
    return dict(data_sharding=ranks(hcg.get_data_sharding_parallel_group()),
                replica=ranks(hcg._get_replica_group()), sharding=ranks(hcg.get_sharding_parallel_group()),
                sharding_check=ranks(hcg.get_check_parallel_group(sharding=True)),
                part=(hcg.get_data_sharding_parallel_rank(), hcg.get_data_sharding_parallel_world_size()))


def _mp_sharding(rank, world, sharding_flag):
    fields = {"sharding": True} if sharding_flag else {}  # hybrid_configs' sharding_degree alone turns stage 1 on
    hcg = init_fleet({"dp_degree": 1, "mp_degree": 2, "sharding_degree": 2}, **fields)
    torch.manual_seed(0)
    ref, model = RefModel(), TPModel()
    copy_from(model, ref, hcg)
    model = fleet.distributed_model(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt._grad_clip = ClipGradByGlobalNorm(CLIP)
    opt = fleet.distributed_optimizer(opt)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    part, parts = hcg.get_data_sharding_parallel_rank(), hcg.get_data_sharding_parallel_world_size()
    losses, ref_losses, norms, ref_norms = train_with_reference(model, opt, ref, ref_opt, STEPS, BATCH, part, parts,
                                                                CLIP)
    full = torch.tensor(losses)
    tdist.all_reduce(full, group=hcg.get_data_sharding_parallel_group())
    full /= parts
    return dict(param=max_param_diff(model, ref, hcg), loss=max_abs_diff(full, torch.tensor(ref_losses)),
                norm=max_abs_diff(torch.tensor(norms), torch.tensor(ref_norms)), clipped=max(ref_norms) > CLIP,
                is_tp=isinstance(model, TensorParallel), zero=type(opt.inner_opt).__name__,
                split=_state_split(opt, len(list(model.parameters())), hcg), **_groups(hcg))


@pytest.mark.timeout(300)
def test_mp2_sharding2_stage1_trains_like_a_single_process_on_four_ranks():
    out = run_ranks(_mp_sharding, world_size=4, args=(True,), timeout=290)
    print({k: max(r[k] for r in out) for k in ("param", "loss", "norm")})
    for rank, r in enumerate(out):
        assert r["param"] <= 1e-5 and r["loss"] <= 1e-5 and r["norm"] <= 1e-5, r
        assert r["clipped"] and r["is_tp"] and r["zero"] == "ZeroRedundancyOptimizer"
        counts, consolidated, n = r["split"]
        assert sum(counts) == n and all(0 < c < n for c in counts), counts  # each rank: part of the state
        assert consolidated in (None, n)
        # default order dp, pp, sharding, sep, mp: rank = 2 * sharding + mp
        mp_id, sh_id = rank % 2, rank // 2
        assert r["sharding"] == r["data_sharding"] == [mp_id, mp_id + 2]
        assert r["replica"] == [2 * sh_id, 2 * sh_id + 1] and r["sharding_check"] == [2 * sh_id, 2 * sh_id + 1]
        assert r["part"] == (sh_id, 2)


def _pp_sharding(rank, world):  # no strategy.sharding: hybrid_configs' sharding_degree turns stage 1 on
    hcg = init_fleet({"dp_degree": 1, "pp_degree": 2, "sharding_degree": 2},
                     pipeline_configs={"accumulate_steps": 4, "micro_batch_size": 2})
    ref = reference("tied")
    stage = PipelineLayer(tied_descs(), topology=hcg.topology(), loss_fn=tied_loss)
    copy_from(stage, ref)
    model = fleet.distributed_model(stage)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
    inner._grad_clip = ClipGradByGlobalNorm(0.5)
    opt = fleet.distributed_optimizer(inner)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    part, parts = hcg.get_data_sharding_parallel_rank(), hcg.get_data_sharding_parallel_world_size()
    d_loss, clipped = [], False
    for step in range(4):
        shards = [tied_batch(step, 8, d) for d in range(parts)]
        x, y = shards[part]
        loss = model.train_batch([x, y], opt)
        losses = [tied_loss(ref(*xs), ys) for xs, ys in shards]
        ref_opt.zero_grad()
        torch.stack(losses).mean().backward()
        clipped |= bool(torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5) > 0.5)
        ref_opt.step()
        d_loss.append(abs(loss.item() - losses[part].item()))
    return dict(loss=worst(d_loss), param=max_abs_diff(stage.state_dict(), ref.state_dict()), clipped=clipped,
                is_pp=isinstance(model, PipelineParallel),
                split=_state_split(opt, len(list(model.parameters())), hcg),
                dp_group=tdist.get_process_group_ranks(model.dp_group))


@pytest.mark.timeout(300)
def test_pp2_sharding2_stage1_trains_like_a_single_process_on_four_ranks():
    out = run_ranks(_pp_sharding, world_size=4, timeout=290)
    for rank, r in enumerate(out):
        assert r["loss"] <= 1e-5 and r["param"] <= 1e-5 and r["clipped"] and r["is_pp"], r
        counts, consolidated, n = r["split"]
        assert sum(counts) == n and all(0 < c < n for c in counts), counts
        assert consolidated in (None, n)
        assert r["dp_group"] == [rank // 2 * 2, rank // 2 * 2 + 1]  # order dp, pp, sharding: rank = 2 * pp + sharding


@pytest.mark.parametrize("fields, hybrid, error, match", [
    ({"sharding": True}, {"pp_degree": 2},
     ValueError, "hybrid_configs['sharding_degree'] is 1: set it to the number of ranks"),
    ({"sharding": True, "sharding_configs": {"sharding_degree": 4}}, {"mp_degree": 2, "sharding_degree": 2},
     ValueError, "sharding_configs['sharding_degree'] = 4 but hybrid_configs['sharding_degree'] = 2"),
    ({"sharding": True, "sharding_configs": {"offload": True}}, {"mp_degree": 2, "sharding_degree": 2},
     NotImplementedError, "offload/wrap apply to FSDP2"),
    ({}, {"mp_degree": 2, "sharding_degree": 2, "dp_degree": 2}, ValueError, "dp_degree'] = 2 does not fit 4 ranks"),
    ({"sharding": True, "sharding_configs": {"sharding_degree": 2}}, {},  # partial stage 1 only on the hcg's axis
     NotImplementedError, "set hybrid_configs['sharding_degree'] = 2 (dp_degree 2)"),
])
def test_hybrid_sharding_that_does_not_run_fails_with_one_line(fields, hybrid, error, match):
    strategy = fleet.DistributedStrategy(**fields)
    strategy.hybrid_configs = hybrid
    with pytest.raises(error) as info:
        strategy.check_supported(4)
    assert match in str(info.value).splitlines()[0]


def test_hybrid_sharding_stage1_is_accepted():
    strategy = fleet.DistributedStrategy(sharding=True)
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 2, "sharding_degree": 2}
    strategy.check_supported(4)
    assert strategy.hybrid_degrees(4) == {"dp": 1, "pp": 1, "sharding": 2, "sep": 1, "mp": 2}
    strategy.hybrid_configs = {"dp_degree": 2, "mp_degree": 1, "sharding_degree": 2}
    strategy.check_supported(4)
    assert strategy.sharding_stage == 1 and strategy.sharding_degree(4) == 2


def _merge(rank, world):
    """mp2 × sharding2 with gradient merge (k=2): the engine over dp × sharding reduces the accumulated sum once
    per window, the sharded optimizer steps on it."""
    hcg = init_fleet({"dp_degree": 1, "mp_degree": 2, "sharding_degree": 2}, gradient_merge=True,
                     gradient_merge_configs={"k_steps": 2, "avg": True})
    torch.manual_seed(0)
    ref, model = RefModel(), TPModel()
    copy_from(model, ref, hcg)
    model = fleet.distributed_model(model)
    opt = fleet.distributed_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-2))
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    part = hcg.get_data_sharding_parallel_rank()
    batches = data(4, BATCH * 2)
    stepped = []
    for ids, labels in batches:  # 4 micro-batches: 2 optimizer steps
        rows = slice(part * BATCH, (part + 1) * BATCH)
        opt.minimize(model(ids[rows], labels[rows]))
        opt.clear_grad()
        stepped.append(opt.stepped)
    for i in (0, 2):
        ((ref(*batches[i]) + ref(*batches[i + 1])) / 2).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    return max_param_diff(model, ref, hcg), type(opt.inner_opt).__name__, stepped


@pytest.mark.timeout(300)
def test_mp2_sharding2_gradient_merge_on_four_ranks():
    for diff, zero, stepped in run_ranks(_merge, world_size=4, timeout=290):
        assert diff <= 1e-5 and zero == "ZeroRedundancyOptimizer" and stepped == [False, True, False, True], diff


def _dp_sharding(rank, world):
    """Paddle's ``{"dp_degree": 2, "sharding_degree": 2}``: stage 1 in sharding groups of 2, replicated over dp."""
    hcg = init_fleet({"dp_degree": 2, "sharding_degree": 2})
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))
    net = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))
    net.load_state_dict(ref.state_dict())
    model = fleet.distributed_model(net)
    opt = fleet.distributed_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-2))
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    part, parts = hcg.get_data_sharding_parallel_rank(), hcg.get_data_sharding_parallel_world_size()
    g = torch.Generator().manual_seed(3)
    for _ in range(STEPS):
        x, y = torch.randn(BATCH * parts, 6, generator=g), torch.randint(0, 3, (BATCH * parts,), generator=g)
        rows = slice(part * BATCH, (part + 1) * BATCH)
        torch.nn.functional.cross_entropy(model(x[rows]), y[rows]).backward()
        opt.step()
        opt.clear_grad()
        torch.nn.functional.cross_entropy(ref(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    diff = max_abs_diff(list(net.parameters()), list(ref.parameters()))
    return dict(param=diff, split=_state_split(opt, 4, hcg), sharding=tdist.get_process_group_ranks(
        opt.inner_opt.process_group), part=(part, parts))


@pytest.mark.timeout(300)
def test_dp2_sharding2_stage1_in_groups_on_four_ranks():
    for rank, r in enumerate(run_ranks(_dp_sharding, world_size=4, timeout=290)):
        assert r["param"] <= 1e-5, r
        counts, consolidated, n = r["split"]
        assert sum(counts) == n and all(0 < c < n for c in counts), counts
        assert consolidated in (None, n) and (consolidated == n) == (rank % 2 == 0)  # each group's first rank
        assert r["sharding"] == [rank // 2 * 2, rank // 2 * 2 + 1] and r["part"] == (rank, 4)


class _StopAt(C.Callback):
    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, step, logs=None):
        if self.trainer.global_step == self.step and self.trainer.at_step_boundary:
            self.trainer.stop_training = True


def _trainer_fit(ckpt, strategy, stop=None, resume=None):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(48, 6, generator=g)
    data_set = torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long())
    net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    t = fleetlite.Trainer(net, torch.optim.AdamW(net.parameters(), lr=0.02), torch.nn.CrossEntropyLoss(),
                          strategy=strategy, device="cpu")
    cbs = [C.ModelCheckpoint(ckpt, save_freq=None, save_steps=1, keep_last=2)] + ([_StopAt(stop)] if stop else [])
    t.fit(data_set, epochs=2, batch_size=4, callbacks=cbs, resume=resume, verbose=0)
    return t.global_step, t.checkpoint_connector.model_state(rank0_only=False), type(t.optimizer.inner_opt).__name__


def _trainer_resume(rank, world, root):
    torch.set_num_threads(1)
    strategy = {"hybrid_configs": {"dp_degree": 2, "sharding_degree": 2}}
    _, straight, zero = _trainer_fit(f"{root}/straight", strategy)
    _trainer_fit(f"{root}/b", strategy, stop=3)
    steps, resumed, _ = _trainer_fit(f"{root}/b", strategy, resume="latest")
    return all(torch.equal(straight[k], resumed[k]) for k in straight), steps, zero


@pytest.mark.timeout(300)
def test_trainer_fits_and_resumes_dp2_sharding2_stage1_on_four_ranks(tmp_path):
    """The Trainer takes Paddle's dp × sharding strategy: the optimizer state sharded in groups, and a run stopped
    at step 3 resumes from its checkpoint to the same weights as a straight run."""
    for same, steps, zero in run_ranks(_trainer_resume, world_size=4, args=(str(tmp_path),), timeout=290):
        assert same and steps == 6 and zero == "ZeroRedundancyOptimizer"  # 48 samples / (4 ranks x 4) x 2 epochs


def _manual_sync(rank, world):
    """Paddle's manual pattern under mp2 × sharding2: no_sync, then fused_allreduce_gradients(params, hcg)."""
    from fleetlite.distributed.fleet.utils.hybrid_parallel_util import fused_allreduce_gradients

    hcg = init_fleet({"dp_degree": 1, "mp_degree": 2, "sharding_degree": 2})
    torch.manual_seed(0)
    ref, model = RefModel(), TPModel()
    copy_from(model, ref, hcg)
    model = fleet.distributed_model(model)
    opt = fleet.distributed_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-2))
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    part = hcg.get_data_sharding_parallel_rank()
    for ids, labels in data(3, BATCH * 2):
        with model.no_sync():
            model(ids[part * BATCH:(part + 1) * BATCH], labels[part * BATCH:(part + 1) * BATCH]).backward()
        fused_allreduce_gradients(list(model.parameters()), hcg)  # averages over dp × sharding
        opt.step()
        opt.clear_grad()
        ref(ids, labels).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    return max_param_diff(model, ref, hcg)


@pytest.mark.timeout(300)
def test_mp2_sharding2_manual_fused_allreduce_on_four_ranks():
    for diff in run_ranks(_manual_sync, world_size=4, timeout=290):
        assert diff <= 1e-5, diff


def _mp_pp_sharding(rank, world):
    """mp2 × pp2 × sharding2: tensor-parallel layers inside pipeline stages, optimizer state sharded, clipped."""
    hcg = init_fleet({"dp_degree": 1, "mp_degree": 2, "pp_degree": 2, "sharding_degree": 2},
                     pipeline_configs={"accumulate_steps": LM_ROWS // LM_MICRO, "micro_batch_size": LM_MICRO})
    ref = lm_reference()  # a plain torch model, trained below by a plain loop
    stage = PipelineLayer(lm_descs(), topology=hcg.topology(), loss_fn=lm_loss)
    copy_from(stage, ref, hcg)
    ref_params = dict(ref.named_parameters())
    model = fleet.distributed_model(stage)
    inner = torch.optim.AdamW(model.parameters(), lr=0.05)
    inner._grad_clip = ClipGradByGlobalNorm(0.05)
    opt = fleet.distributed_optimizer(inner)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.05)
    part, parts = hcg.get_data_sharding_parallel_rank(), hcg.get_data_sharding_parallel_world_size()
    g = torch.Generator().manual_seed(3)
    d_loss, d_norm = [], []
    for _ in range(3):
        x = torch.randint(0, TP_VOCAB, (LM_ROWS * parts, 5), generator=g)
        y = torch.randint(0, TP_VOCAB, (LM_ROWS * parts, 5), generator=g)
        rows = slice(part * LM_ROWS, (part + 1) * LM_ROWS)
        loss = model.train_batch([x[rows], y[rows]], opt)
        ref_opt.zero_grad()
        ref_losses = [lm_loss(ref(x[i * LM_ROWS:(i + 1) * LM_ROWS]), y[i * LM_ROWS:(i + 1) * LM_ROWS])
                      for i in range(parts)]
        torch.stack(ref_losses).mean().backward()
        ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05).item()
        ref_opt.step()
        d_loss.append(abs(loss.item() - ref_losses[part].item()))
        d_norm.append(abs(opt.hybrid_clip.last_norm.item() - ref_norm))
    d_param = worst(max_abs_diff(p, local_slice(ref_params[n], p, hcg)) for n, p in stage.named_parameters())
    return worst(d_loss), d_param, worst(d_norm), ref_norm > 0.05


@pytest.mark.timeout(400)
def test_mp2_pp2_sharding2_stage1_on_eight_ranks():
    for d_loss, d_param, d_norm, clipped in run_ranks(_mp_pp_sharding, world_size=8, timeout=390):
        assert d_loss <= 1e-5 and d_param <= 1e-5 and d_norm <= 1e-5 and clipped, (d_loss, d_param, d_norm)
