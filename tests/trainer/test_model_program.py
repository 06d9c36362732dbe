"""``fleetlite.Model.save(path, training=False)`` writes a deployable inference program, as Paddle's
``paddle.jit.save`` does: ``{path}.pt2`` is a ``torch.export`` program that a
fresh process runs without the model's class, and its outputs equal ``predict_batch``."""

import subprocess
import sys

import numpy as np
import pytest
import torch
from test_model import MyDataset, _model

import fleetlite
from fleetlite.static import InputSpec

# each (program, input, output) triple of argv: one fresh process runs them all (torch is imported once)
RUN = """
import sys, numpy as np, torch
args = sys.argv[1:]
for program, x, y in zip(args[0::3], args[1::3], args[2::3]):
    prog = torch.export.load(program).module()
    np.save(y, prog(torch.from_numpy(np.load(x))).detach().numpy())
assert "test_model" not in sys.modules and "fleetlite" not in sys.modules
"""


def _run_fresh(jobs, tmp_path) -> list[np.ndarray]:
    """Run each ``(program, x)`` of ``jobs`` in one fresh process; its outputs, in order."""
    argv = []
    for i, (program, x) in enumerate(jobs):
        np.save(tmp_path / f"x{i}.npy", x)
        argv += [str(program), str(tmp_path / f"x{i}.npy"), str(tmp_path / f"y{i}.npy")]
    proc = subprocess.run([sys.executable, "-c", RUN, *argv], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [np.load(tmp_path / f"y{i}.npy") for i in range(len(jobs))]


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    """Both tests' programs, saved, then run in ONE fresh process (a second process would only import torch
    again): a trained model's, and one traced from input specs. Each test asserts on its own."""
    tmp_path = tmp_path_factory.mktemp("programs")
    model, _ = _model()
    model.fit(MyDataset(), batch_size=8, verbose=0)
    model.save(str(tmp_path / "infer"), training=False)
    x_fit = np.random.default_rng(3).random((5, 20)).astype(np.float32)  # another batch size than traced

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(20, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
    spec_model = fleetlite.Model(net, [InputSpec([None, 20], "float32", "x")])
    spec_model.save(str(tmp_path / "spec"), training=False)  # no run: traced from the specs
    x_spec = np.random.default_rng(4).random((7, 20)).astype(np.float32)

    fit_out, spec_out = _run_fresh([(tmp_path / "infer.pt2", x_fit), (tmp_path / "spec.pt2", x_spec)], tmp_path)
    return {"dir": tmp_path, "fit": (model, x_fit, fit_out), "spec": (spec_model, net, x_spec, spec_out)}


def test_inference_program_runs_without_the_model_class(programs):
    tmp_path = programs["dir"]
    model, x, fresh = programs["fit"]
    assert (tmp_path / "infer.pt2").is_file() and (tmp_path / "infer.pt").is_file()
    np.testing.assert_allclose(fresh, model.predict_batch([x])[0], rtol=1e-6, atol=1e-6, equal_nan=False)
    model2, _ = _model(seed=7)
    model2.load(str(tmp_path / "infer"))  # finds what save(training=False) wrote
    np.testing.assert_allclose(model2.predict_batch([x])[0], model.predict_batch([x])[0], rtol=0, atol=0,
                               equal_nan=False)


def test_program_from_input_specs_and_from_a_batch_call(programs, tmp_path):
    model, net, x, fresh = programs["spec"]
    np.testing.assert_allclose(fresh, model.predict_batch([x])[0], rtol=1e-6, atol=1e-6, equal_nan=False)
    other = fleetlite.Model(net)
    other.predict_batch([x[:1]])  # the first batch seen (one row) traces it
    other.save(str(tmp_path / "batch"), training=False)
    prog = torch.export.load(str(tmp_path / "batch.pt2")).module()
    np.testing.assert_allclose(prog(torch.from_numpy(x)).detach().numpy(), other.predict_batch([x])[0],
                               rtol=1e-6, atol=1e-6, equal_nan=False)
