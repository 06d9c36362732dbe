"""A crafted DCP directory runs no code (torch reads .metadata with plain pickle.load)."""

import pickle

import pytest
import torch

import fleetlite.checkpoint as ckpt


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):  # what an attacker's pickle does on load: call any function
        return (open, (str(self.marker), "w"))


def _checkpoint(tmp_path):
    net = torch.nn.Linear(3, 2)
    path = tmp_path / "step-00000001"
    ckpt.save({"model": net.state_dict()}, path, latest=False)
    return net, path


def test_a_valid_directory_still_loads(tmp_path):
    net, path = _checkpoint(tmp_path)
    full = ckpt.load_full(path)
    assert all(torch.equal(full[k], v) for k, v in net.state_dict().items())


@pytest.mark.parametrize("reader", ["validate", "load_full", "load"])
def test_a_crafted_metadata_file_is_refused_without_running_code(tmp_path, reader):
    net, path = _checkpoint(tmp_path)
    marker = tmp_path / "pwned"
    (path / ".metadata").write_bytes(pickle.dumps(_Payload(marker), protocol=2))
    with pytest.raises(ckpt.CheckpointError, match="not allowed|unreadable"):
        if reader == "validate":
            ckpt.validate(path)
        elif reader == "load_full":
            ckpt.load_full(path)
        else:
            ckpt.load({"model": net.state_dict()}, path)
    assert not marker.exists()


def test_a_crafted_trainer_file_in_a_directory_is_refused(tmp_path):
    import fleetlite

    net = torch.nn.Linear(3, 2)
    t = fleetlite.Trainer(net, torch.optim.SGD(net.parameters(), lr=0.1), torch.nn.MSELoss(), device="cpu")
    from fleetlite.trainer.callbacks import ModelCheckpoint

    data = (torch.randn(8, 3), torch.randn(8, 2))
    t.fit(data, epochs=1, batch_size=4, callbacks=[ModelCheckpoint(str(tmp_path), sharded=True)], verbose=0)
    (folder,) = [p for p in tmp_path.iterdir() if ckpt.is_checkpoint_dir(p)]
    marker = tmp_path / "pwned"
    (folder / ckpt.RANK0_FILE).write_bytes(pickle.dumps(_Payload(marker), protocol=2))
    with pytest.raises(ckpt.CheckpointError):
        t.load(folder)
    assert not marker.exists()
