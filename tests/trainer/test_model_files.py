"""Fleetlite.Model's files: ``save(p, training=False)`` then ``load(p)`` works, and every
loader reads with ``weights_only=True``: a crafted ``.pdparams``, ``.pdopt`` or ``.pt`` runs no code."""

import builtins

import numpy as np
import pytest
import torch
from test_model import MyDataset, _model

import fleetlite

UNSAFE = "(?i)weights_only|refusing|unpickl|not a fleetlite checkpoint|unsupported"


class Payload:
    """Unpickling this runs ``builtins.exec`` with a statement that creates a marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return builtins.exec, (f"open({self.marker!r}, 'w').write('pwned')",)


def test_save_for_inference_then_load(tmp_path):
    model, net = _model()
    model.fit(MyDataset(), batch_size=8, verbose=0)
    path = str(tmp_path / "infer")
    model.save(path, training=False)
    model2, net2 = _model(seed=7)
    model2.load(path)  # finds what save(training=False) wrote
    for a, b in zip(net.state_dict().values(), net2.state_dict().values()):
        assert torch.equal(a, b)
    x = np.random.default_rng(0).random((3, 20)).astype(np.float32)
    np.testing.assert_allclose(model.predict_batch([x])[0], model2.predict_batch([x])[0], rtol=0, atol=0,
                               equal_nan=False)


def _adam_pdopt(tmp_path):
    model, net = _model()
    model.prepare(torch.optim.Adam(net.parameters(), 1e-3), model._loss)
    model.fit(MyDataset(), batch_size=8, verbose=0)
    model.save(str(tmp_path / "ok"))
    return model


def test_optimizer_and_scaler_states_load_weights_only(tmp_path):
    model = _adam_pdopt(tmp_path)
    state = torch.load(tmp_path / "ok.pdopt", weights_only=True)  # Adam's state needs no extra allow-list
    state["fleet_amp"] = {"scaler": torch.amp.GradScaler("cpu").state_dict()}  # what amp adds to .pdopt
    torch.save(state, tmp_path / "amp.pdopt")
    torch.load(tmp_path / "amp.pdopt", weights_only=True)
    model.load(str(tmp_path / "ok"))
    assert model._optimizer.state_dict()["state"]  # the moments came back


@pytest.mark.parametrize("bad", [".pdparams", ".pdopt", ".pt"])
def test_crafted_files_run_no_code(tmp_path, bad):
    model = _adam_pdopt(tmp_path)
    marker = tmp_path / "pwned"
    prefix = tmp_path / "ok"
    target = tmp_path / ("ok" + bad)
    if bad == ".pt":
        prefix = tmp_path / "evil"
        target = tmp_path / "evil.pt"
    torch.save({"x": Payload(marker)} if bad != ".pt" else {"model": Payload(marker)}, target)
    with pytest.raises(Exception, match=UNSAFE):
        model.load(str(prefix))
    assert not marker.exists()
    if bad == ".pt":
        with pytest.raises(Exception, match=UNSAFE):
            model.trainer.load(str(target))  # the Trainer's loader too
        t = fleetlite.Trainer(torch.nn.Linear(20, 10), device="cpu")
        with pytest.raises(Exception, match=UNSAFE):
            t.load(str(target))
        assert not marker.exists()
