"""``fleetlite.checkpoint.load_full`` reads every checkpoint path ``fit`` writes, offline: a checkpoint file (and
``NAME`` for ``NAME.pt``), the ``latest.pt`` / ``latest`` pointers of either kind, a run's checkpoint directory
holding files; the directory kind as before.

Reference: the state_dict of the module that was saved (a plain ``nn.Module``), compared exactly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fleetlite.checkpoint as ckpt
from fleetlite.checkpoint import CheckpointError


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def _same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        torch.testing.assert_close(got[k], v, rtol=0, atol=0)


@pytest.fixture
def file_run(tmp_path):
    """Two checkpoint files as a run writes them (step-*.pt, latest.pt naming the newest); the newest's weights."""
    root = tmp_path / "ck"
    root.mkdir()
    for step, seed in ((1, 0), (2, 1)):
        ckpt.save_checkpoint({"model": _net(seed).state_dict()}, root / f"step-{step:08d}.pt", latest=True)
    return root, _net(1).state_dict()


def test_checkpoint_files_and_latest_pt(file_run):
    root, trained = file_run
    files = sorted(root.glob("step-*.pt"))
    assert files and (root / "latest.pt").is_file()
    _same(ckpt.load_full(root), trained)                          # a run's checkpoint directory of files
    _same(ckpt.load_full(root / "latest.pt"), trained)            # the file pointer
    _same(ckpt.load_full(files[-1]), trained)                     # a checkpoint file
    _same(ckpt.load_full(files[-1].with_suffix("")), trained)     # NAME finds NAME.pt
    other = _net(1)
    _same(ckpt.load_full(files[-1], model=other), trained)        # loaded into a module
    _same(other.state_dict(), trained)
    with pytest.raises(CheckpointError, match="does not fit Linear"):
        ckpt.load_full(root, model=nn.Linear(3, 2))
    with pytest.raises(CheckpointError, match="holds no 'ema' entry"):
        ckpt.load_full(root, key="ema")


def test_directory_latest_pointer(tmp_path):
    nets = [_net(s) for s in (0, 1)]
    for step, net in enumerate(nets, 1):
        ckpt.save({"model": net.state_dict()}, tmp_path / f"step-{step:08d}", latest=True)
    assert (tmp_path / "latest").read_text().strip() == "step-00000002"
    _same(ckpt.load_full(tmp_path / "latest"), nets[1].state_dict())  # follows the pointer
    _same(ckpt.load_full(tmp_path / "step-00000001"), nets[0].state_dict())
    _same(ckpt.load_full(tmp_path), nets[1].state_dict())
