"""4 ranks, each test against a reference.

dp2 x mp2 resumed at an epoch end ends as the uninterrupted run (``torch.equal``). Hybrid checkpoints written
with dp = 2 (dp2 x mp2 through ``fit``, dp2 x pp2 through ``train_batch``) load into dp = 4 (the single-process
twin under data parallel over the 4 ranks): the full weights of the saved model, gathered when it was saved
(``torch.equal``). ``PipelineParallel.agree_buffers`` agrees a stage's buffers over its data-parallel group
only (the other stage has none: over the world it would hang).

mp2 x pp2 (tensor-parallel layers inside stages): the full state is the single-process model's (the weights it
was built from, exactly), and its DCP state, saved after two steps, holds the full weights then (read offline)
and loads back into a fresh mp2 x pp2 model, each rank's slices and optimizer state ``torch.equal``.

mp2 x sharding2 (stage 1: each sharding rank holds the AdamW state of part of the parameters), with a StepLR
stepped per batch: stopped mid-epoch and resumed, the weights, each rank's optimizer partition and the learning
rate (the partition's groups take it only at their next step: the checkpoint holds the scheduler's) equal the
uninterrupted run's; the checkpoint loads into one process (the saved full weights).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hybrid_models import (
    HIDDEN,
    IN,
    OUT,
    PipelineLayer,
    RefNet,
    ResBlock,
    batches,
    copy_from,
    degrees,
    init_fleet,
    mp_pp_descs,
    pipe_batch,
    pp_steps,
    pp_trainer,
    single_pipe_trainer,
    tp_trainer,
)
from torch import nn

import fleetlite.checkpoint as ckpt
from fleetlite.checkpoint.torch_state import app_state, load_app_state
from fleetlite.distributed import fleet
from fleetlite.distributed.fleet.meta_parallel import is_split
from fleetlite.testing import run_ranks
from fleetlite.trainer import callbacks as C


def _save_then_load_on_dp4(rank, world, root):
    root = Path(root)
    t = tp_trainer(mp=2, dp=2)
    t.fit(batches(), epochs=1, save_dir=root / "mp", verbose=0)
    tp_saved = t.get_weights()
    t = tp_trainer(mp=2, dp=2)  # dp2 x mp2 resumed at the epoch end, against the uninterrupted run
    t.fit(batches(), epochs=2, save_dir=root / "mp", resume="latest", verbose=0)
    resumed = t.get_weights()
    t = tp_trainer(mp=2, dp=2)
    t.fit(batches(), epochs=2, save_dir=root / "whole", verbose=0)
    resumed_equal = all(torch.equal(v, resumed[k]) for k, v in t.get_weights().items())
    t = pp_trainer(dp=2)
    pp_steps(t, 0, 2)
    t.save(root / "pp")
    pp_saved = t.get_weights()
    stage = t.parallel_network.stage_id
    if stage == 1:  # a buffer on the last stage only: agreed over its data-parallel group, never over the world
        t.network.register_buffer("mark", torch.full((2,), float(rank)))
    t.parallel_network.agree_buffers()
    mark = t.network.mark.tolist() if stage == 1 else None

    t = tp_trainer(mp=1, dp=4)  # (re-initialises fleet with dp = 4)
    t.load(root / "mp" / "epoch-0000")
    tp_loaded = t.get_weights()
    init_fleet(degrees(dp=4))
    t = single_pipe_trainer()
    t.load(root / "pp")
    return tp_saved, tp_loaded, pp_saved, t.get_weights(), type(t.parallel_network).__name__, (stage, mark), \
        resumed_equal


@pytest.mark.timeout(600)
def test_dp2_checkpoints_load_into_dp4(tmp_path):
    out = run_ranks(_save_then_load_on_dp4, world_size=4, args=(str(tmp_path),), timeout=500)
    tp_saved, _, pp_saved, _, _, _, _ = out[0]
    assert all(o[6] for o in out)  # dp2 x mp2: the resumed run's weights torch.equal the uninterrupted run's
    assert tp_saved.keys() == RefNet().state_dict().keys()
    # dp2 x pp2: ranks 0, 2 are stage 0 and ranks 1, 3 stage 1; rank 3's buffer became its replica rank 1's
    assert [o[5] for o in out] == [(0, None), (1, [1.0, 1.0]), (0, None), (1, [1.0, 1.0])]
    for _tp, tp_loaded, _pp, pp_loaded, wrapper, _, _ in out:
        assert wrapper == "DataParallel"
        for k, v in tp_saved.items():
            assert torch.equal(tp_loaded[k], v), k
        assert pp_loaded.keys() == pp_saved.keys()
        for k, v in pp_saved.items():
            assert torch.equal(pp_loaded[k], v), k


def _mp_pp_stage(hcg, ref):
    stage = PipelineLayer(mp_pp_descs(), topology=hcg.topology(), loss_fn=nn.CrossEntropyLoss())
    copy_from(stage, ref, hcg)
    return stage


def _mp_pp(rank, world, root):
    torch.manual_seed(0)  # the reference: mp_pp_descs' layers as a plain torch model (the stages' names)
    ref = nn.Sequential(ResBlock(IN, HIDDEN, torch.relu, tp=False), nn.LayerNorm(IN),
                        ResBlock(IN, HIDDEN, torch.relu, tp=False), nn.Linear(IN, OUT, bias=False))
    hcg = init_fleet(degrees(mp=2, pp=2), {"accumulate_steps": 2, "micro_batch_size": 4})
    model = fleet.distributed_model(_mp_pp_stage(hcg, ref))
    assert any(is_split(p) for p in model.module.parameters())
    start_full = model.full_state_dict()
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    for step in range(2):
        model.train_batch(list(pipe_batch(step)), opt)
    ckpt.save(app_state(model.module, opt, writing=True), root)
    trained_full = model.full_state_dict(rank0_only=True)
    again = fleet.distributed_model(_mp_pp_stage(hcg, ref))
    again_opt = torch.optim.AdamW(again.parameters(), lr=0.05)
    load_app_state(again.module, again_opt, root)
    same = all(torch.equal(v, again.module.state_dict()[k]) for k, v in model.module.state_dict().items())
    a, b = opt.state_dict()["state"], again_opt.state_dict()["state"]
    same_opt = a.keys() == b.keys() and all(torch.equal(a[i][n], b[i][n]) for i in a for n in a[i])
    return start_full, ref.state_dict(), trained_full, same, same_opt


@pytest.mark.timeout(600)
def test_mp2_pp2_full_state_and_checkpoint(tmp_path):
    out = run_ranks(_mp_pp, world_size=4, args=(str(tmp_path / "mp_pp"),), timeout=500)
    for rank, (start_full, ref, trained_full, same, same_opt) in enumerate(out):
        assert start_full.keys() == ref.keys()
        for k, v in ref.items():
            assert torch.equal(start_full[k], v), k
        assert same and same_opt
        assert trained_full == {} if rank else trained_full.keys() == ref.keys()
    saved = ckpt.load_full(tmp_path / "mp_pp")
    for k, v in out[0][2].items():
        assert torch.equal(saved[k], v), k


def _mp_sharding(rank, world, root):
    root = Path(root)

    def fit(save_dir, **kw):
        t = tp_trainer(mp=2, sharding=2)
        t.setup(training=True)
        sched = torch.optim.lr_scheduler.StepLR(t.user_optimizer, step_size=1, gamma=0.5)
        t.fit(batches(), epochs=2, callbacks=[C.LRScheduler(sched, by_step=True)], save_dir=save_dir, verbose=0, **kw)
        inner = t.optimizer.inner_opt
        assert hasattr(inner, "consolidate_state_dict")  # the ZeroRedundancyOptimizer: stage 1 really runs
        state = {k: {n: v.clone() for n, v in e.items()} for k, e in inner.optim.state_dict()["state"].items()}
        return t.get_weights(), state, [g["lr"] for g in t.optimizer.param_groups]

    whole = fit(root / "whole")
    fit(root / "cut", num_iters=3)
    resumed = fit(root / "cut", resume="latest")
    return whole, resumed


@pytest.mark.timeout(600)
def test_mp2_sharding2_resumes_bit_identically_and_loads_into_one_process(tmp_path, clean_dist_env):
    out = run_ranks(_mp_sharding, world_size=4, args=(str(tmp_path),), timeout=500)
    for whole, resumed in out:
        assert whole[0].keys() == resumed[0].keys()
        for k, v in whole[0].items():
            assert torch.equal(resumed[0][k], v), k
        assert whole[1].keys() == resumed[1].keys() and whole[1]  # this rank's partition
        for i in whole[1]:
            for n in whole[1][i]:
                assert torch.equal(resumed[1][i][n], whole[1][i][n]), (i, n)
        assert resumed[2] == whole[2] == [0.05 * 0.5 ** 12]  # 12 steps, each halving it
        assert 0 < len(whole[1]) < 4  # the AdamW state of part of TPNet's 4 parameters
    t = tp_trainer(mp=1)
    t.load(tmp_path / "whole" / "epoch-0001")  # saved at the end: the uninterrupted run's final weights
    for k, v in t.get_weights().items():
        assert torch.equal(v, out[0][0][0][k]), k
