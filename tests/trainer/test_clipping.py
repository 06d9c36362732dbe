"""Gradient clipping (Keras' clipnorm/clipvalue/global_clipnorm, Paddle's ClipGradBy*) against a hand-written loop
with torch.nn.utils.clip_grad_norm_: single process, with gradient accumulation (clipped once after merging) and
on 2 ranks (every rank clips the same averaged gradient)."""

import pytest
import torch
from torch import nn
from trainer_helpers import mlp, xy

import fleetlite
from fleetlite.testing import run_ranks
from fleetlite.trainer.clipping import ClipGradByGlobalNorm, ClipGradByNorm, ClipGradByValue

N, BS = 32, 8


def _hand(clip, accumulate=1, lr=0.5):
    x, y = xy(N)
    net = mlp()
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    for i in range(0, N, BS):
        loss = nn.functional.cross_entropy(net(x[i:i + BS]), y[i:i + BS]) / accumulate
        loss.backward()
        if (i // BS + 1) % accumulate == 0:
            clip(list(net.parameters()))
            opt.step()
            opt.zero_grad()
    return net.state_dict()


def _trainer(accumulate=1, lr=0.5, **clip):
    net = mlp()
    t = fleetlite.Trainer(net, device="cpu")
    t.compile(torch.optim.SGD(net.parameters(), lr=lr), nn.CrossEntropyLoss(), **clip)
    x, y = xy(N)
    t.fit((x, y), epochs=1, batch_size=BS, shuffle=False, verbose=0, accumulate_grad_batches=accumulate)
    return t.network.state_dict()


def _close(a, b):
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kw,clip", [
    ({"global_clipnorm": 0.1}, lambda ps: torch.nn.utils.clip_grad_norm_(ps, 0.1)),
    ({"grad_clip": ClipGradByGlobalNorm(0.1)}, lambda ps: torch.nn.utils.clip_grad_norm_(ps, 0.1)),
    ({"clipnorm": 0.05}, lambda ps: [torch.nn.utils.clip_grad_norm_([p], 0.05) for p in ps]),
    ({"grad_clip": ClipGradByNorm(0.05)}, lambda ps: [torch.nn.utils.clip_grad_norm_([p], 0.05) for p in ps]),
    ({"clipvalue": 0.01}, lambda ps: torch.nn.utils.clip_grad_value_(ps, 0.01)),
    ({"grad_clip": ClipGradByValue(0.01)}, lambda ps: torch.nn.utils.clip_grad_value_(ps, 0.01)),
])
def test_clipping_equals_hand_loop(kw, clip):
    got = _trainer(**kw)
    _close(got, _hand(clip))
    unclipped = _hand(lambda ps: None)
    assert any(not torch.allclose(got[k], unclipped[k]) for k in got)  # the clip really acted


def test_clip_once_after_accumulation():
    clip = lambda ps: torch.nn.utils.clip_grad_norm_(ps, 0.1)  # noqa: E731
    _close(_trainer(accumulate=2, global_clipnorm=0.1), _hand(clip, accumulate=2))


def test_clip_arguments_checked():
    with pytest.raises(ValueError, match="cannot both be set"):
        fleetlite.Trainer(mlp(), device="cpu").compile(clipnorm=1.0, global_clipnorm=1.0)
    with pytest.raises(ValueError):
        ClipGradByGlobalNorm(0)
    with pytest.raises(ValueError):
        ClipGradByValue(-1.0)


def _two_ranks(rank=0, world=1):
    torch.set_num_threads(1)
    net = mlp()
    t = fleetlite.Trainer(net, device="cpu")
    t.compile(torch.optim.SGD(net.parameters(), lr=0.5), nn.CrossEntropyLoss(), global_clipnorm=0.1)
    x, y = xy(N)
    t.fit((x, y), epochs=1, batch_size=BS // world, shuffle=False, verbose=0)
    return t.network.state_dict()


def test_clipping_on_two_ranks_equals_one_process():
    ref = _two_ranks()  # one process, global batch BS; the 2-rank run averages two halves of it, then clips
    for got in run_ranks(_two_ranks, world_size=2, timeout=240):
        _close(got, ref)


@pytest.mark.parametrize("init_scale", [1024.0, 2.0 ** 40])  # 2**40 overflows float16: those steps are skipped
def test_clipping_with_float16_amp_unscales_first(init_scale):
    import warnings

    x, y = xy(N)
    net = mlp()
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    for i in range(0, N, BS):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.cross_entropy(net(x[i:i + BS]), y[i:i + BS])
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(net.parameters(), 0.1)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    net2 = mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # amp on a CPU device
        t = fleetlite.Trainer(net2, device="cpu", strategy={"amp": True, "amp_configs": {
            "dtype": "float16", "init_loss_scaling": init_scale}})
        t.compile(torch.optim.SGD(net2.parameters(), lr=0.5), nn.CrossEntropyLoss(), global_clipnorm=0.1)
        t.fit((x, y), epochs=1, batch_size=BS, shuffle=False, verbose=0)
    _close(net2.state_dict(), net.state_dict())
    if init_scale > 1e6:
        assert scaler.get_scale() < init_scale  # the reference really skipped overflowing steps
