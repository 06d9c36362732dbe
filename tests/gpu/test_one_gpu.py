"""Group A: one GPU. Host syncs on the hot path, the recipe on CUDA, fp16 skips, checkpoints, two ranks sharing the
GPU over gloo, and the `auto` fallback."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from gpu_helpers import SmallNet, batch, dp_vs_ddp, needs_gpus

from fleetlite.testing import run_launch, run_ranks

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gpu, needs_gpus(1)]


@pytest.fixture
def sync_mode():
    yield torch.cuda.set_sync_debug_mode
    torch.cuda.set_sync_debug_mode(0)


def test_tensor_loader_makes_batches_without_a_host_sync(sync_mode):
    from fleetlite.io import TensorLoader
    from fleetlite.vision.datasets import SyntheticCifar10

    x, y = SyntheticCifar10(size=512).as_tensors()
    loader = TensorLoader(x, y, batch_size=64, device="cuda", num_replicas=1, rank=0, channels_last=True)
    next(iter(loader))  # warm-up: constants, augmentation tables
    sync_mode("error")
    for images, labels in loader:
        assert images.is_cuda and labels.is_cuda
    sync_mode(0)


def _amp_steps(dtype, steps=3, model=None, batches=None):
    """``steps`` amp steps; ``model`` (on the GPU) and ``batches`` (on the GPU) made beforehand by the caller when
    the steps run under a sync check (moving them there is a host sync of its own, not the step's)."""
    from fleetlite.distributed import fleet

    model = SmallNet().cuda() if model is None else model
    batches = [batch(step, 0, "cuda") for step in range(steps)] if batches is None else batches
    fleet.init(is_collective=True, strategy=fleet.DistributedStrategy(amp=True, amp_configs={"dtype": dtype}))
    model = fleet.distributed_model(model)
    opt = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    for x, y in batches:
        with opt.amp.autocast():
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.minimize(loss)
        opt.clear_grad()
    return opt


def _on_gpu(steps):
    return SmallNet().cuda(), [batch(step, 0, "cuda") for step in range(steps)]


def test_bf16_step_has_no_host_sync_and_fp16_at_most_one(sync_mode, clean_dist_env):
    _amp_steps("bfloat16")  # warm-up
    model, batches = _on_gpu(2)  # outside the checked region: .cuda() and the batches' copies sync by themselves
    sync_mode("error")
    _amp_steps("bfloat16", model=model, batches=batches)
    sync_mode(0)
    _amp_steps("float16")
    model, batches = _on_gpu(2)
    sync_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _amp_steps("float16", model=model, batches=batches)
    sync_mode(0)
    syncs = [str(w.message) for w in caught if "synchroniz" in str(w.message).lower()]
    assert len(syncs) <= 2, syncs  # at most one per step


def test_fp16_inf_skips_the_step_and_backs_the_scale_off(clean_dist_env):
    from fleetlite.distributed.fleet import DistGradScaler

    p = torch.nn.Parameter(torch.ones(4, device="cuda"))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = DistGradScaler("cuda", init_scale=8.0, backoff_factor=0.5, decr_every_n_nan_or_inf=1)
    scaler.scale((p * float("inf")).sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert torch.equal(p.detach(), torch.ones(4, device="cuda")) and scaler.get_scale() == 4.0


def test_recipe_airbench_one_epoch_on_cuda(tmp_path):
    run = tmp_path / "run"
    res = subprocess.run([sys.executable, str(ROOT / "recipes" / "cifar10.py"), "experiment=airbench",
                          "data=synthetic", "data.train_size=2048", "data.test_size=512", "trainer.epochs=1",
                          f"run_dir={run}"], capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "final validation accuracy" in res.stdout and "nan" not in res.stdout.split("final")[-1]
    from fleetlite.checkpoint import load_checkpoint

    state = load_checkpoint(run / "checkpoints" / "latest.pt")
    assert state["config"]["trainer"]["cudnn_benchmark"] is True  # applied and recorded


def test_checkpoint_saved_on_gpu_loads_without_one(tmp_path, clean_dist_env):
    import fleetlite

    net = SmallNet().cuda()
    t = fleetlite.Trainer(net, loss=torch.nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    x = torch.randn(32, 3, 8, 8)
    y = torch.randint(0, 10, (32,))
    t.fit((x, y), epochs=1, batch_size=8, verbose=0)
    t.save_checkpoint(tmp_path / "ckpt.pt")
    code = ("import torch; from fleetlite.checkpoint import load_checkpoint; "
            f"s = load_checkpoint({str(tmp_path / 'ckpt.pt')!r}); print('ok', torch.cuda.is_available())")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert res.returncode == 0 and "ok False" in res.stdout, res.stderr[-3000:]


@pytest.mark.timeout(300)
def test_two_ranks_on_one_gpu_over_gloo_match_ddp():
    for out in run_ranks(dp_vs_ddp, world_size=2, timeout=280, env={"FLAGS_selected_gpus": "0"}):
        for k, v in out["ddp"].items():
            assert torch.allclose(out["fleetlite"][k], v, atol=1e-5), k


@pytest.mark.timeout(300)
def test_two_local_ranks_on_one_gpu_fall_back_to_gloo(tmp_path):
    if torch.cuda.device_count() != 1:
        pytest.skip("needs exactly one visible GPU")
    script = tmp_path / "w.py"
    script.write_text("import json, sys, fleetlite.distributed as dist\nimport gpu_helpers\n"
                      "dist.init_parallel_env()\nprint(json.dumps(gpu_helpers.device_report(0, 2)))\n")
    path = os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
    res = run_launch(["--nproc_per_node", "2", str(script)], timeout=280, env={"PYTHONPATH": path})
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("cpu:gloo,cuda:gloo") == 2  # gloo for both device types, not NCCL
    assert "2 ranks on this node but 1 visible GPU(s)" in res.stderr


@pytest.mark.parametrize("dtype, allowed", [("bfloat16", 0), ("float16", 1)])
def test_one_trainer_step_syncs_at_most_as_the_issue_allows(sync_mode, clean_dist_env, dtype, allowed):
    import fleetlite
    from fleetlite.distributed import fleet

    net = SmallNet()
    strategy = fleet.DistributedStrategy(amp=True, amp_configs={"dtype": dtype})
    t = fleetlite.Trainer(net, loss=torch.nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
                          strategy=strategy, device="cuda")
    x, y = batch(0, 0, "cpu", n=64)
    t.fit((x, y), epochs=1, batch_size=16, verbose=0)  # warm-up: wrapped model, optimizer state, scaler tensors
    step_batch = batch(1, 0, "cuda")
    sync_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t.train_step(step_batch)
    sync_mode(0)
    syncs = [str(w.message) for w in caught if "synchroniz" in str(w.message).lower()]
    assert len(syncs) <= allowed, syncs


def test_the_recipe_callbacks_train_between_progress_lines_without_a_host_sync(tmp_path, sync_mode, clean_dist_env,
                                                                               capsys):
    """The recipe's default callbacks (LR schedule, run log, metrics.csv, checkpoints, TerminateOnNaN, pre-emption)
    and fit's progress bar, on TensorLoader batches made on the GPU: every batch that prints no progress line runs
    under ``torch.cuda.set_sync_debug_mode("error")`` (from its ``on_train_batch_begin`` to the next one's, its
    hooks and requested saves included); the line batches and the epoch ends may read values."""
    from hydra import compose, initialize_config_dir

    import fleetlite
    from fleetlite.io import TensorLoader
    from fleetlite.recipe.build import build_callbacks, build_scheduler
    from fleetlite.recipe.schema import register_configs
    from fleetlite.trainer import callbacks as C
    from fleetlite.vision.datasets import SyntheticCifar10

    log_freq, steps = 4, 10

    class Checked(C.Callback):
        def on_train_batch_begin(self, step, logs=None):
            line = (step + 1) % log_freq == 0 or step + 1 == steps
            sync_mode(0 if line else "error")

        def on_epoch_end(self, epoch, logs=None):
            sync_mode(0)

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("cifar10", overrides=["sched=onecycle"])
    x, y = SyntheticCifar10(size=steps * 32).as_tensors()
    loader = TensorLoader(x, y, batch_size=32, device="cuda", num_replicas=1, rank=0, drop_last=True)
    net = SmallNet()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    t = fleetlite.Trainer(net, opt, torch.nn.CrossEntropyLoss(), metrics=fleetlite.metric.Accuracy(), device="cuda")
    callbacks = build_callbacks(cfg.trainer, tmp_path, build_scheduler(cfg.sched, opt, 3, steps))
    t.fit(loader, epochs=1, verbose=0)  # warm-up: the wrapped model, the optimizer's state, cuDNN plans
    t.fit(loader, epochs=3, log_freq=log_freq, verbose=1, callbacks=[Checked(), *callbacks], save_dir=tmp_path)
    sync_mode(0)
    assert t.global_step == 3 * steps + steps and t.terminated_on_nan is None
    lines = [ln for ln in capsys.readouterr().out.splitlines() if " step " in ln]
    assert len(lines) == 3 * 3, lines
