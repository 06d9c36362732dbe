"""Paddle's ``paddle.flops`` for torch modules (``fleetlite.flops``): forward hooks count each layer's operations.

The per-layer formulas are Paddle's ``dynamic_flops`` ones (multiply-accumulates counted once):
convolutions ``out.numel() * (in_channels / groups * prod(kernel) + bias)``, linear
``in_features * out.numel()``, batch norm ``2 * in.numel()`` (in eval mode), LeakyReLU ``in.numel()``,
average pooling ``out.numel()`` (adaptive: ``(prod(in_size // out_size) + 1) * out.numel()``), and zero for
ReLU, ReLU6 and Dropout. Other layers count 0 unless ``custom_ops`` gives a function ``fn(module, inputs,
output)`` that adds to ``module.total_ops``.

# Note [MFU]
Throughput as torchtitan reports it (``torchtitan/train.py``, ``components/metrics.py``): a transformer's
training FLOPs per token are ``6 * N + 12 * L * H * Q * T`` (:func:`transformer_flops_per_token`: N the
parameters that enter a matmul, counted once (a tied token table is the output head's matmul; a learned
position table is not), L layers, H heads of width Q, sequence length T: forward and backward of every weight
matmul, plus attention's two matmuls per layer, causal sparsity not subtracted, recomputation not counted).
Tokens per second per device are the global tokens per second over the world size (torchtitan divides each
data-parallel replica's tokens by the non-data-parallel degree: the same number); MFU is ``flops_per_token *
tokens_per_s_per_device / peak``, the peak being the device's dense bf16 one (:func:`peak_flops`, torchtitan's
``get_peak_flops`` table). A CPU, or a GPU not in the table, has no known peak: ``peak_flops`` returns None and
the MFU is not reported (torchtitan falls back to the A100's; a made-up peak gives a made-up MFU).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["flops", "peak_flops", "transformer_flops_per_token", "mfu"]


def _numel(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel()
    if isinstance(x, (list, tuple)) and x:
        return _numel(x[0])
    return 0


def _conv(m, x, y):
    kernel = int(torch.tensor(m.kernel_size).prod()) * (m.in_channels // m.groups)
    return _numel(y) * (kernel + (1 if m.bias is not None else 0))


def _adaptive_avg(m, x, y):
    inp, out = x[0], y
    kernel = [max(int(a) // int(b), 1) for a, b in zip(inp.shape[2:], out.shape[2:])]
    return (int(torch.tensor(kernel).prod()) + 1) * _numel(y)


_RULES: dict[type, Callable[..., int]] = {
    nn.Conv1d: _conv, nn.Conv2d: _conv, nn.Conv3d: _conv,
    nn.ConvTranspose1d: _conv, nn.ConvTranspose2d: _conv, nn.ConvTranspose3d: _conv,
    nn.Linear: lambda m, x, y: m.in_features * _numel(y),
    nn.BatchNorm1d: lambda m, x, y: 2 * _numel(x), nn.BatchNorm2d: lambda m, x, y: 2 * _numel(x),
    nn.BatchNorm3d: lambda m, x, y: 2 * _numel(x),
    nn.ReLU: lambda m, x, y: 0, nn.ReLU6: lambda m, x, y: 0, nn.Dropout: lambda m, x, y: 0,
    nn.LeakyReLU: lambda m, x, y: _numel(x),
    nn.AvgPool1d: lambda m, x, y: _numel(y), nn.AvgPool2d: lambda m, x, y: _numel(y),
    nn.AvgPool3d: lambda m, x, y: _numel(y),
    nn.AdaptiveAvgPool1d: _adaptive_avg, nn.AdaptiveAvgPool2d: _adaptive_avg, nn.AdaptiveAvgPool3d: _adaptive_avg,
}


def flops(net: nn.Module, input_size: list[int], custom_ops: dict[type, Callable] | None = None,
          print_detail: bool = False) -> int:
    """Total operations of one forward pass on an input of ``input_size`` (Paddle's ``paddle.flops``).

    Example::

        n = fleetlite.flops(torch.nn.Sequential(torch.nn.Linear(10, 4)), [1, 10])
        assert n == 40
    """
    if not isinstance(net, nn.Module):
        raise TypeError(f"flops needs a torch.nn.Module, got {type(net).__name__} (static programs are Paddle-only)")
    rules = dict(_RULES)
    rules.update(custom_ops or {})
    counted: list[tuple[str, nn.Module]] = []
    hooks = []

    def hook(m, x, y):
        rule = rules.get(type(m))
        if rule is None:
            return
        if rule in (custom_ops or {}).values():
            rule(m, x, y)  # Paddle's custom_ops add to m.total_ops themselves
        else:
            m.total_ops += int(rule(m, x, y))

    for name, m in net.named_modules():
        if list(m.children()):
            continue
        m.total_ops = 0
        m.total_params = sum(p.numel() for p in m.parameters(recurse=False))
        counted.append((name, m))
        hooks.append(m.register_forward_hook(hook))
    from .summary import probe

    with probe(net, hooks) as device:
        net(torch.randn(*input_size, device=device))
    total = 0
    rows = []
    for name, m in counted:
        ops = int(m.total_ops)
        total += ops
        rows.append((name or type(m).__name__, type(m).__name__, ops, int(m.total_params)))
        del m.total_ops, m.total_params
    if print_detail:
        print(f"{'Layer Name':<30} {'Type':<20} {'Flops':>14} {'Params':>12}")
        for r in rows:
            print(f"{r[0]:<30} {r[1]:<20} {r[2]:>14,} {r[3]:>12,}")
    print(f"Total Flops: {total}     Total Params: {sum(r[3] for r in rows)}")
    return total


# dense bf16 peaks per device name, torchtitan's get_peak_flops (torchtitan/tools/utils.py); first match wins
_PEAKS: tuple[tuple[tuple[str, ...], float], ...] = (
    (("A100",), 312e12), (("A6000",), 154.85e12),
    (("H100", "NVL"), 835e12), (("H100", "PCIe"), 756e12), (("H100",), 989e12),
    (("H200",), 989e12), (("H20",), 148e12),
    (("GB200",), 2.5e15), (("GB300",), 2.5e15), (("B300",), 2.25e15), (("B200",), 2.25e15),
    (("MI355X",), 2500e12), (("MI300X",), 1300e12), (("MI325X",), 1300e12), (("MI250X",), 191.5e12),
    (("L40S",), 362e12),
)


def peak_flops(device: torch.device | str) -> float | None:
    """The dense bf16 peak FLOPs per second of ``device``, or None when unknown (a CPU, a GPU not in the table):
    Note [MFU].

    Example::

        assert fleetlite.trainer.flops.peak_flops("cpu") is None
    """
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device)
    for words, peak in _PEAKS:
        if all(w.lower() in name.lower() for w in words):
            return peak
    return None


def transformer_flops_per_token(num_params: int, layers: int, heads: int, head_dim: int, seq_len: int) -> int:
    """Training FLOPs per token of a decoder-only transformer, ``6 * N + 12 * L * H * Q * T`` (Note [MFU]).

    Example::

        assert transformer_flops_per_token(1000, layers=2, heads=4, head_dim=8, seq_len=16) == 6000 + 12 * 1024
    """
    return 6 * int(num_params) + 12 * int(layers) * int(heads) * int(head_dim) * int(seq_len)


def mfu(flops_per_token: float, tokens_per_s_per_device: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation as a fraction of ``peak`` (None when the peak is unknown): Note [MFU]."""
    if peak is None or peak <= 0:
        return None
    return flops_per_token * tokens_per_s_per_device / peak
