"""Config -> objects: schedules against torch's own schedulers, optimizers, models and strategies from the groups."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from fleetlite.recipe.build import (
    build_model,
    build_optimizer,
    build_scheduler,
    build_strategy,
    optimizer_steps_per_epoch,
    resolve_device,
)
from fleetlite.recipe.schema import register_configs
from fleetlite.recipe.validate import ConfigError

CONF = Path(__file__).resolve().parents[2] / "conf"


def _compose(*overrides: str):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("cifar10", overrides=list(overrides))


def _lrs(scheduler, optimizer, steps):
    out = []
    for _ in range(steps):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def _opt(lr=0.1):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def test_cosine_matches_torch_cosine_annealing():
    cfg = _compose("sched=cosine", "sched.min_lr_ratio=0.1")
    ours_opt, ref_opt = _opt(), _opt()
    ours = build_scheduler(cfg.sched, ours_opt, epochs=3, steps_per_epoch=7)
    ref = torch.optim.lr_scheduler.CosineAnnealingLR(ref_opt, T_max=21, eta_min=0.01)
    assert _lrs(ours, ours_opt, 21) == pytest.approx(_lrs(ref, ref_opt, 21), rel=1e-9, abs=1e-12)


def test_cosine_warmup_rises_linearly_then_decays():
    cfg = _compose("sched=cosine", "sched.warmup_epochs=1")
    opt = _opt(0.1)
    lrs = _lrs(build_scheduler(cfg.sched, opt, epochs=2, steps_per_epoch=4), opt, 10)
    assert lrs[:4] == pytest.approx([0.025, 0.05, 0.075, 0.1])
    assert lrs[4] == pytest.approx(0.1) and lrs[7] < lrs[5] and lrs[-1] == pytest.approx(0.0, abs=1e-12)


def test_onecycle_matches_torch_one_cycle_lr():
    cfg = _compose("sched=onecycle", "sched.pct_start=0.3")
    ours_opt, ref_opt = _opt(0.2), _opt(0.2)
    ours = build_scheduler(cfg.sched, ours_opt, epochs=4, steps_per_epoch=5)
    ref = torch.optim.lr_scheduler.OneCycleLR(ref_opt, max_lr=0.2, total_steps=20, pct_start=0.3,
                                              cycle_momentum=False, div_factor=25.0, final_div_factor=1e4)
    assert _lrs(ours, ours_opt, 20) == pytest.approx(_lrs(ref, ref_opt, 20), rel=1e-9, abs=1e-15)
    ours_opt.step()
    ours.step()  # past the planned end: keeps the final rate instead of raising like OneCycleLR
    assert ours_opt.param_groups[0]["lr"] == pytest.approx(0.2 / 25 / 1e4)


def test_no_schedule():
    assert build_scheduler(_compose("sched=none").sched, _opt(), epochs=2, steps_per_epoch=3) is None


def test_optimizers_follow_the_config():
    model = torch.nn.Linear(4, 2)
    sgd = build_optimizer(_compose("optim=sgd", "optim.lr=0.2").optim, model)
    assert isinstance(sgd, torch.optim.SGD)
    g = sgd.param_groups[0]
    assert (g["lr"], g["momentum"], g["nesterov"], g["weight_decay"]) == (0.2, 0.9, True, 5e-4)
    adamw = build_optimizer(_compose("optim=adamw", "optim.betas=[0.8,0.9]").optim, model)
    assert isinstance(adamw, torch.optim.AdamW) and adamw.param_groups[0]["betas"] == (0.8, 0.9)
    assert isinstance(build_optimizer(_compose("optim=adam").optim, model), torch.optim.Adam)


def test_optimizer_skips_frozen_parameters():
    net = build_model(_compose("model=fast", "model.widths=[8,8,8]").model, num_classes=10,
                      whitening_images=torch.randn(64, 3, 32, 32))
    opt = build_optimizer(_compose("optim=sgd").optim, net)
    ids = {id(p) for g in opt.param_groups for p in g["params"]}
    assert id(net.whiten.weight) not in ids and id(net.whiten.bias) in ids


def test_models_from_the_groups():
    x = torch.randn(2, 3, 32, 32)
    for option in ("tutorial_cnn", "resnet18", "fast"):
        extra = ["model.width=8"] if option == "resnet18" else ["model.widths=[8,8,8]"] if option == "fast" else []
        net = build_model(_compose(f"model={option}", *extra).model, num_classes=10)
        assert net(x).shape == (2, 10), option
    fast = build_model(_compose("model=fast", "model.widths=[8,8,8]", "model.whiten=false").model, num_classes=10,
                       whitening_images=torch.randn(64, 3, 32, 32))
    assert fast.whiten.weight.requires_grad  # whitening off: the first layer stays a trainable conv
    nhwc = build_model(_compose("model=tutorial_cnn").model, num_classes=10, channels_last=True)
    assert nhwc.conv2.weight.is_contiguous(memory_format=torch.channels_last)


def test_strategy_and_steps_per_epoch_under_gradient_merge():
    cfg = _compose("strategy=grad_merge")
    strategy = build_strategy(cfg.strategy)
    assert strategy.gradient_merge and strategy.gradient_merge_configs["k_steps"] == 4
    assert optimizer_steps_per_epoch(10, cfg.strategy) == 2
    assert optimizer_steps_per_epoch(10, _compose().strategy) == 10
    assert optimizer_steps_per_epoch(3, cfg.strategy) == 1


def test_devices():
    assert resolve_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        assert resolve_device("auto") == torch.device("cpu")
        with pytest.raises(ConfigError, match="device=cuda but no CUDA device"):
            resolve_device("cuda")


def test_cosine_formula_spot_value():
    cfg = _compose("sched=cosine")
    opt = _opt(1.0)
    lrs = _lrs(build_scheduler(cfg.sched, opt, epochs=1, steps_per_epoch=4), opt, 3)
    assert lrs == pytest.approx([1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5])


def test_synthetic_data_is_split_across_ranks_with_the_global_batch():
    from fleetlite.recipe.build import build_data

    cfg = _compose("data=synthetic", "data.train_size=200", "data.test_size=50", "trainer.global_batch_size=40",
                   "trainer.eval_batch_size=20")
    data = build_data(cfg.data, cfg.trainer, torch.device("cpu"), world_size=2, rank=1)
    assert data.train.batch_size == 20 and len(data.train) == 5  # 200 samples / (20 per rank x 2 ranks)
    assert data.test.batch_size == 10 and len(data.classes) == 10
    x, y = next(iter(data.train))
    assert x.shape == (20, 3, 32, 32) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert data.whitening_images.shape == (200, 3, 32, 32)
    assert abs(float(data.whitening_images.mean())) < 1.0  # normalised, not 0..255


def test_real_cifar10_missing_offline_says_so_and_suggests_synthetic(tmp_path):
    from fleetlite.recipe.build import build_data

    cfg = _compose("data=cifar10", f"data.root={tmp_path}", "data.download=false")
    with pytest.raises(ConfigError, match=r"^data=cifar10: no CIFAR-10 train split under data.root=.* and "
                                          r"data.download=false \(.*\); .*or run offline with data=synthetic$"):
        build_data(cfg.data, cfg.trainer, torch.device("cpu"))


def test_too_few_samples_for_one_batch():
    from fleetlite.recipe.build import build_data

    cfg = _compose("data=synthetic", "data.train_size=30", "data.test_size=10", "trainer.global_batch_size=64")
    with pytest.raises(ConfigError, match="make no full batch of 32 per rank"):
        build_data(cfg.data, cfg.trainer, torch.device("cpu"), world_size=2, rank=0)
