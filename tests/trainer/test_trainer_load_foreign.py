"""``Trainer.load`` of files another tool wrote: a torch ``DistributedDataParallel``/``DataParallel`` state_dict
(every key ``module.``-prefixed), Paddle's ``{prefix}.pdparams`` by its prefix, and a Paddle ``fit(save_dir=...)``
directory as a run directory; a state_dict sharing no name with the model is one error that does not suggest
``skip_mismatch`` (which would load nothing).

References: torch's own wrapper (``nn.DataParallel(net).state_dict()`` has DDP's ``module.`` keys), and the
weights of the network that was saved."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn
from trainer_helpers import dataset, mlp, params, trainer

import fleetlite
from fleetlite.checkpoint import CheckpointError


def _same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        torch.testing.assert_close(got[k], v, rtol=0, atol=0)


def test_a_ddp_wrapped_state_dict_loads(tmp_path):
    source = mlp(seed=3)
    wrapped = nn.DataParallel(source).state_dict()  # torch's wrapper prefix, as DDP's state_dict
    assert all(k.startswith("module.") for k in wrapped)
    torch.save(wrapped, tmp_path / "ddp.pt")
    t = trainer(seed=4)
    t.load(tmp_path / "ddp.pt")
    _same(params(t), source.state_dict())


def test_a_state_dict_of_other_names_says_so_without_skip_mismatch(tmp_path):
    torch.save({"encoder.weight": torch.zeros(16, 6)}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="shares no entry name with this model") as e:
        trainer().load(tmp_path / "other.pt")
    assert "skip_mismatch" not in str(e.value)


def _paddle_model(seed: int) -> fleetlite.Model:
    net = mlp(seed)
    m = fleetlite.Model(net)
    m.prepare(torch.optim.SGD(net.parameters(), lr=0.1), nn.CrossEntropyLoss())
    return m


def test_load_finds_prefix_pdparams(tmp_path):
    m = _paddle_model(5)
    m.save(str(tmp_path / "ckpt" / "final"))  # Paddle's Model.save: final.pdparams + final.pdopt
    assert (tmp_path / "ckpt" / "final.pdparams").is_file()
    for target in (tmp_path / "ckpt" / "final", tmp_path / "ckpt" / "final.pdparams"):
        t = trainer(seed=6, cls=fleetlite.Trainer)
        t.load(target, reset_optimizer=True)
        _same(params(t), m.network.state_dict())


def test_load_of_a_paddle_save_dir_takes_final_else_the_last_epoch(tmp_path):
    m = _paddle_model(7)
    m.fit(dataset(16), epochs=2, batch_size=8, verbose=0, save_dir=str(tmp_path))
    assert sorted(os.listdir(tmp_path))[:2] == ["0.pdopt", "0.pdparams"] and (tmp_path / "final.pdparams").is_file()
    trained = {k: v.detach().clone() for k, v in m.network.state_dict().items()}
    t = trainer(seed=8)
    t.load(tmp_path, reset_optimizer=True)
    _same(params(t), trained)
    for name in ("final.pdparams", "final.pdopt"):
        os.remove(tmp_path / name)
    t = trainer(seed=8)
    t.load(tmp_path, reset_optimizer=True)  # epoch 1's files: the weights at the end of the same 2 epochs
    _same(params(t), trained)
