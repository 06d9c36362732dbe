"""MFU's pieces (Note [MFU] in fleetlite/trainer/flops.py) against torchtitan's: ``get_peak_flops``' dense bf16
peaks by device name (torchtitan/tools/utils.py), ``6 * N + 12 * L * H * Q * T`` FLOPs per token, and
``mfu = flops_per_token * tokens_per_s_per_device / peak`` (torchtitan/components/metrics.py); no peak, so no
MFU, on a CPU or an unknown GPU."""

import pytest
import torch

from fleetlite.trainer import flops


@pytest.mark.parametrize("name, peak", [("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12),
                                        ("NVIDIA H100 NVL", 835e12), ("NVIDIA H200", 989e12),
                                        ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA H20", 148e12),
                                        ("NVIDIA B200", 2.25e15), ("Tesla T4", None)])
def test_peak_flops_is_torchtitans_table_and_none_when_unknown(monkeypatch, name, peak):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert flops.peak_flops("cuda:0") == peak


def test_no_peak_and_no_mfu_on_a_cpu():
    assert flops.peak_flops("cpu") is None
    assert flops.mfu(1e6, 1e4, None) is None


def test_flops_per_token_and_mfu_formulas():
    # a 7B-like shape: N = 6.5e9 matmul weights, 32 layers of 32 heads of 128, 4096 tokens
    fpt = flops.transformer_flops_per_token(6_500_000_000, layers=32, heads=32, head_dim=128, seq_len=4096)
    assert fpt == 6 * 6_500_000_000 + 12 * 32 * 32 * 128 * 4096
    assert flops.mfu(fpt, 3000.0, 989e12) == pytest.approx(fpt * 3000.0 / 989e12, rel=1e-12)
