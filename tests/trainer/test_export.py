"""Trainer.export: safetensors (reloaded into a fresh model), torch.export (.pt2, torch.export.load) and ONNX
(onnx.checker + onnxruntime within 1e-5), each with a dynamic batch size and the config alongside; the
recipe-style model.safetensors rebuilds a vision model; a 2-rank run writes once."""

import json

import pytest
import torch
from trainer_helpers import dataset, mlp, trainer

import fleetlite
from fleetlite.testing import run_ranks
from fleetlite.trainer.export import export_model, load_safetensors, read_config


def _fitted(tmp_path=None):
    torch.set_num_threads(1)
    t = trainer(config={"model": {"width": 16}, "lr": 0.05})
    t.fit(dataset(32), epochs=1, batch_size=8, verbose=0)
    return t


def test_safetensors_roundtrip(tmp_path):
    t = _fitted()
    path = t.export(tmp_path / "model")  # suffix added
    assert path.name == "model.safetensors"
    assert read_config(path) == {"model": {"width": 16}, "lr": 0.05}
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        assert json.loads(f.metadata()["config"]) == t.config
    fresh = load_safetensors(mlp(seed=9), path)
    x = torch.randn(7, 6)
    torch.testing.assert_close(fresh(x), t.network(x))


@pytest.mark.parametrize("batch", [1, 7])
def test_torch_export_dynamic_batch(tmp_path, batch):
    t = _fitted()
    path = t.export(tmp_path / "model.pt2", format="torch.export")  # example inputs: the first batch seen
    program = torch.export.load(str(path))
    x = torch.randn(batch, 6)
    torch.testing.assert_close(program.module()(x), t.network.eval()(x))
    one = export_model(t.network, tmp_path / "one.pt2", "torch.export", example_inputs=(torch.randn(1, 6),))
    torch.testing.assert_close(torch.export.load(str(one)).module()(x), t.network(x))  # traced at 1, still dynamic


def test_onnx_checker_and_runtime(tmp_path):
    onnx = pytest.importorskip("onnx", reason="the [onnx] extra (onnx, onnxscript) is not installed")
    pytest.importorskip("onnxscript", reason="the [onnx] extra (onnx, onnxscript) is not installed")
    t = _fitted()
    path = t.export(tmp_path / "model.onnx", format="onnx", example_inputs=(torch.randn(4, 6),))
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed: the ONNX file was checked only")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch in (1, 9):
        x = torch.randn(batch, 6)
        (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        torch.testing.assert_close(torch.from_numpy(got), t.network.eval()(x).detach(), rtol=1e-5, atol=1e-5)


def test_vision_model_from_recipe_export(tmp_path):
    from fleetlite.vision.models import from_safetensors, tutorial_cnn

    torch.manual_seed(0)
    net = tutorial_cnn(num_classes=4)
    export_model(net, tmp_path / "model.safetensors", config={"model": {"name": "tutorial_cnn", "num_classes": 4}})
    rebuilt = from_safetensors(str(tmp_path / "model.safetensors"))
    x = torch.randn(3, 3, 32, 32)
    torch.testing.assert_close(rebuilt(x), net.eval()(x))
    export_model(net, tmp_path / "bare.safetensors")
    with pytest.raises(ValueError, match="no model description"):
        from_safetensors(str(tmp_path / "bare.safetensors"))


def test_bad_requests_fail_before_writing(tmp_path):
    t = fleetlite.Trainer(mlp(), device="cpu")
    with pytest.raises(ValueError, match="not one of"):
        t.export(tmp_path / "m", format="tflite")
    with pytest.raises(ValueError, match="needs example inputs"):
        t.export(tmp_path / "m.pt2", format="torch.export")  # no data seen yet
    assert list(tmp_path.iterdir()) == []


def test_missing_extra_names_it(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "onnxscript", None)
    with pytest.raises(ImportError, match=r"pip install 'fleetlite\[onnx\]'"):
        export_model(mlp(), tmp_path / "m.onnx", "onnx", example_inputs=(torch.randn(2, 6),))
    assert not (tmp_path / "m.onnx").exists()


def _export_on_ranks(rank, world, out):
    t = _fitted()
    t.fit(dataset(32), epochs=1, batch_size=4, verbose=0)
    return str(t.export(f"{out}/model.safetensors")), {k: v.clone() for k, v in t.network.state_dict().items()}


@pytest.mark.timeout(90)
def test_two_ranks_export_once(tmp_path):
    results = run_ranks(_export_on_ranks, args=(str(tmp_path),), timeout=80)
    assert results[0][0] == results[1][0] == str(tmp_path / "model.safetensors")
    fresh = load_safetensors(mlp(seed=5), tmp_path / "model.safetensors")
    for k, v in fresh.state_dict().items():
        torch.testing.assert_close(v, results[0][1][k])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.json", "model.safetensors"]
