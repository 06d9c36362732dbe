"""The recipe's integrations: the logger group (logger=[csv,tensorboard,mlflow,wandb]) composes and is
checked by the schema; a run with mlflow + tensorboard + trainer.profile=true leaves one MLflow run, event
files, one trace per rank, and model.safetensors that fleetlite.vision.models rebuilds; the default keeps
CSV + PNG only."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_cifar10_recipe import QUIET, TINY, _ok, read_csv, run_recipe

REPO = Path(__file__).resolve().parents[2]


def _compose(overrides):
    from hydra import compose, initialize_config_dir

    from fleetlite.recipe.schema import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(config_name="cifar10", overrides=overrides)


def test_logger_group_composes():
    cfg = _compose([])
    assert cfg.logger.csv.filename == "metrics.csv"  # make run: CSV (+ PNG) only
    assert cfg.logger.mlflow is None and cfg.logger.wandb is None and cfg.logger.tensorboard is None
    cfg = _compose(["logger=[csv,tensorboard,mlflow,wandb]", "logger.mlflow.experiment_name=x",
                    "trainer.compile=true", "trainer.profile=true"])
    assert cfg.logger.mlflow.experiment_name == "x" and cfg.logger.wandb.mode == "offline"
    assert cfg.logger.tensorboard.histogram_freq == 0 and cfg.logger.csv is not None
    assert cfg.trainer.compile and cfg.trainer.profile
    with pytest.raises(Exception, match="experment_name"):  # a typo is refused by the schema
        _compose(["logger=[mlflow]", "logger.mlflow.experment_name=x"])


@pytest.mark.timeout(300)
def test_run_with_trackers_profiler_and_exported_model(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="the [mlflow] extra is not installed")
    pytest.importorskip("tensorboard", reason="the [tensorboard] extra is not installed")
    import mlflow
    import torch

    run_dir = tmp_path / "run"
    proc = run_recipe([*TINY, *QUIET, "trainer.epochs=1", f"run_dir={run_dir}", "logger=[csv,tensorboard,mlflow]",
                       "trainer.profile=true"], timeout=280)
    _ok(proc)
    rows = read_csv(run_dir / "metrics.csv")
    assert rows[0]["lr"] > 0  # the learning-rate monitor feeds the CSV too
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = mlflow.MlflowClient((run_dir / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("cifar10").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["model.name"] == "tutorial_cnn"
    assert client.get_metric_history(run.info.run_id, "val_loss")[0].value == pytest.approx(rows[0]["val_loss"])
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert [p.name for p in (run_dir / "profiler").iterdir()] == ["rank0.step4.json"]  # 4 steps: window cut short
    assert "profiler: top ops by self time" in proc.stdout

    from fleetlite.vision.models import from_safetensors

    net = from_safetensors(str(run_dir / "model.safetensors"))
    ckpt = torch.load(run_dir / "checkpoints" / "latest.pt", map_location="cpu", weights_only=False)
    for k, v in net.state_dict().items():
        torch.testing.assert_close(v, ckpt["model"][k])
    assert net(torch.randn(3, 3, 32, 32)).shape == (3, 10)
