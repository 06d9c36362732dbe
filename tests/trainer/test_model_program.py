"""``fleetlite.Model.save(path, training=False)`` writes a deployable inference program, as Paddle's
``paddle.jit.save`` does: ``{path}.pt2`` is a ``torch.export`` program that a
fresh process runs without the model's class, and its outputs equal ``predict_batch``."""

import subprocess
import sys

import numpy as np
import torch
from test_model import MyDataset, _model

import fleetlite
from fleetlite.static import InputSpec

RUN = """
import sys, numpy as np, torch
prog = torch.export.load(sys.argv[1]).module()
x = torch.from_numpy(np.load(sys.argv[2]))
np.save(sys.argv[3], prog(x).detach().numpy())
assert "test_model" not in sys.modules and "fleetlite" not in sys.modules
"""


def _run_fresh(program, x, tmp_path):
    np.save(tmp_path / "x.npy", x)
    proc = subprocess.run([sys.executable, "-c", RUN, str(program), str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return np.load(tmp_path / "y.npy")


def test_inference_program_runs_without_the_model_class(tmp_path):
    model, net = _model()
    model.fit(MyDataset(), batch_size=8, verbose=0)
    model.save(str(tmp_path / "infer"), training=False)
    assert (tmp_path / "infer.pt2").is_file() and (tmp_path / "infer.pt").is_file()
    x = np.random.default_rng(3).random((5, 20)).astype(np.float32)  # another batch size than traced
    np.testing.assert_allclose(_run_fresh(tmp_path / "infer.pt2", x, tmp_path), model.predict_batch([x])[0],
                               rtol=1e-6, atol=1e-6, equal_nan=False)
    model2, _ = _model(seed=7)
    model2.load(str(tmp_path / "infer"))  # finds what save(training=False) wrote
    np.testing.assert_allclose(model2.predict_batch([x])[0], model.predict_batch([x])[0], rtol=0, atol=0,
                               equal_nan=False)


def test_program_from_input_specs_and_from_a_batch_call(tmp_path):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(20, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
    model = fleetlite.Model(net, [InputSpec([None, 20], "float32", "x")])
    model.save(str(tmp_path / "spec"), training=False)  # no run: traced from the specs
    x = np.random.default_rng(4).random((7, 20)).astype(np.float32)
    np.testing.assert_allclose(_run_fresh(tmp_path / "spec.pt2", x, tmp_path), model.predict_batch([x])[0],
                               rtol=1e-6, atol=1e-6, equal_nan=False)
    other = fleetlite.Model(net)
    other.predict_batch([x[:1]])  # the first batch seen (one row) traces it
    other.save(str(tmp_path / "batch"), training=False)
    prog = torch.export.load(str(tmp_path / "batch.pt2")).module()
    np.testing.assert_allclose(prog(torch.from_numpy(x)).detach().numpy(), other.predict_batch([x])[0],
                               rtol=1e-6, atol=1e-6, equal_nan=False)
