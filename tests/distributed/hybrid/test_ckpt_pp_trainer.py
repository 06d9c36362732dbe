"""Trainer checkpoints of a pipeline-parallel model (pp = 2, 2 ranks; a weight tied across the two stages):
``full_state_dict`` / ``load_full_state_dict``, DCP directories through ``Trainer.save``/``Trainer.load`` (the
steps driven by ``train_batch``) and through ``fit(save_dir=..., resume=...)`` (at an epoch end and mid-epoch),
the reshard to pp = 1 and the export.

References: the single-process model ``PipelineLayer(the same descs, num_stages=1)`` (its state is the full
state; it takes the pp = 2 checkpoint), the uninterrupted run (``torch.equal`` weights and optimizer state), the
saved model's full weights.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hybrid_models import (
    PipelineLayer,
    batches,
    opt_state,
    pipe_batch,
    pipe_descs,
    pp_steps,
    pp_trainer,
    single_pipe_trainer,
    start_weights,
)
from torch.utils.data import TensorDataset

import fleetlite.checkpoint as ckpt
from fleetlite.testing import run_ranks
from fleetlite.trainer.export import load_safetensors


def _pp2_runs(rank, world, root):
    root = Path(root)
    out = {}
    t = pp_trainer()
    t.setup(training=True)
    out["keys"] = sorted(t.network.state_dict())
    out["start_full"] = t.get_weights()  # every stage's entries
    pp_steps(t, 0, 4)
    out["whole"], out["whole_opt"] = t.get_weights(), opt_state(t)
    out["export"] = t.export(root / "pp.safetensors")

    t = pp_trainer()
    pp_steps(t, 0, 2)
    out["saved_to"] = t.save(root / "step-2.pt")
    out["at_2"] = t.get_weights()
    t = pp_trainer()
    t.load(out["saved_to"])
    pp_steps(t, 2, 4)
    out["resumed"], out["resumed_opt"] = t.get_weights(), opt_state(t)

    t = pp_trainer()  # load_full_state_dict: the single-process state in, each stage keeps its entries
    t.setup(training=True)
    t.set_weights(out["whole"])
    out["set_back"] = t.get_weights()
    return out


@pytest.fixture(scope="module")
def pp2(tmp_path_factory):
    root = tmp_path_factory.mktemp("pp2")
    return root, run_ranks(_pp2_runs, world_size=2, args=(str(root),), timeout=400)


def _equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.timeout(500)
def test_full_state_is_the_one_stage_models_and_loads_back(pp2):
    _root, out = pp2
    single = PipelineLayer(pipe_descs(), num_stages=1).state_dict()
    for rank in (0, 1):
        assert out[rank]["keys"] != sorted(single)  # each stage holds a part of the model
        _equal(out[rank]["start_full"], start_weights())
        _equal(out[rank]["set_back"], out[rank]["whole"])
    assert "shared_layers.tied.proj.weight" in out[0]["keys"] and "shared_layers.tied.proj.weight" in out[1]["keys"]


@pytest.mark.timeout(500)
def test_save_then_load_continues_like_the_uninterrupted_run(pp2):
    root, out = pp2
    assert out[0]["saved_to"] == root / "step-2" and ckpt.is_checkpoint_dir(root / "step-2")
    for rank in (0, 1):
        r = out[rank]
        _equal(r["resumed"], r["whole"])
        # the last stage's copy of the shared layer's bias never gets a gradient (only the tied weight is used
        # there), so it has no AdamW state until a load gives it the first stage's (Note [hybrid DCP state])
        extra = {"shared_layers.tied.proj.bias"} if rank == 1 else set()
        assert set(r["resumed_opt"]) == set(r["whole_opt"]) | extra
        for p in r["whole_opt"]:
            for n in r["whole_opt"][p]:
                assert torch.equal(r["resumed_opt"][p][n], r["whole_opt"][p][n]), (p, n)
    assert not set(out[0]["whole_opt"]) & {k for k in out[1]["whole_opt"] if not k.startswith("shared")}


@pytest.mark.timeout(500)
def test_pp2_checkpoint_loads_into_one_process_and_trains_on_alike(pp2, clean_dist_env):
    root, out = pp2
    _equal(ckpt.load_full(root / "step-2"), out[0]["at_2"])
    t = single_pipe_trainer()
    t.load(root / "step-2")  # pp 2 -> 1: weights and AdamW state
    _equal(t.get_weights(), out[0]["at_2"])
    data = batches()
    data.items = [pipe_batch(2), pipe_batch(3)]  # the two steps pp = 2 took after the save
    t.fit(data, epochs=1, verbose=0)
    for k, v in t.get_weights().items():
        assert (v - out[0]["whole"][k]).abs().max().item() <= 1e-5, k


@pytest.mark.timeout(500)
def test_export_holds_every_stage(pp2, clean_dist_env):
    root, out = pp2
    net = load_safetensors(PipelineLayer(pipe_descs(), num_stages=1), root / "pp.safetensors")
    _equal(net.state_dict(), out[0]["whole"])


def _fit_runs(rank, world, root):
    root = Path(root)
    g = torch.Generator().manual_seed(11)
    data = TensorDataset(torch.randn(48, 6, generator=g), torch.randint(0, 6, (48,), generator=g))
    out = {}

    def fit(save_dir, **kw):
        t = pp_trainer()
        t.fit(data, epochs=2, batch_size=8, save_dir=save_dir, verbose=0, **kw)
        return t.get_weights(), opt_state(t)

    out["whole"] = fit(root / "whole")
    t = pp_trainer()
    t.fit(data, epochs=1, batch_size=8, save_dir=root / "epoch", verbose=0)
    out["epoch"] = fit(root / "epoch", resume="latest")
    fit(root / "mid", num_iters=3)
    out["mid"] = fit(root / "mid", resume="latest")
    out["dirs"] = sorted(p.name for p in (root / "mid").iterdir())
    return out


@pytest.mark.timeout(500)
def test_fit_resumes_at_an_epoch_end_and_mid_epoch_like_the_uninterrupted_run(tmp_path):
    for rank, out in enumerate(run_ranks(_fit_runs, world_size=2, args=(str(tmp_path),), timeout=400)):
        whole_w, whole_opt = out["whole"]
        for case in ("epoch", "mid"):
            w, opt = out[case]
            _equal(w, whole_w)
            extra = {"shared_layers.tied.proj.bias"} if rank == 1 else set()  # (see the test above)
            assert set(opt) <= set(whole_opt) | extra and set(whole_opt) <= set(opt)
            for p in whole_opt:
                for n in whole_opt[p]:
                    assert torch.equal(opt[p][n], whole_opt[p][n]), (case, p, n)
        assert "step-00000003" in out["dirs"] and ckpt.is_checkpoint_dir(tmp_path / "mid" / "step-00000003")
