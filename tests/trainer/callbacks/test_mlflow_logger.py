"""MLflowLogger with the real mlflow (local file store): a 2-rank fit makes ONE run, read back with
mlflow.MlflowClient: the flattened config as params, the epoch metric history equal to fit's History, step
metrics with their global step, the curves PNG and the final checkpoint path; an exception marks it FAILED."""

import sys

import pytest
import torch
from trainer_helpers import dataset, trainer

from fleetlite.testing import run_ranks

mlflow = pytest.importorskip("mlflow", reason="the [mlflow] extra (mlflow-skinny) is not installed")

@pytest.fixture(autouse=True)
def _file_store(monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # reading MLflow 3's file store back (see MLflowLogger)


CONFIG = {"model": {"width": 16, "act": "tanh"}, "optim": {"lr": 0.05}, "seed": 0}


def _fit(rank, world, run_dir):
    from fleetlite.callbacks import LearningRateMonitor, MLflowLogger

    torch.set_num_threads(1)
    t = trainer(config=CONFIG)
    hist = t.fit(dataset(48), eval_data=dataset(20, seed=7), epochs=3, batch_size=4, log_freq=2, verbose=0,
                 save_dir=run_dir, callbacks=[MLflowLogger(experiment_name="exp"), LearningRateMonitor()])
    return hist.history, t.global_step


@pytest.mark.timeout(120)
def test_two_rank_fit_logs_one_run(tmp_path):
    results = run_ranks(_fit, args=(str(tmp_path),), timeout=110)
    history, steps = results[0]
    client = mlflow.MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    exp = client.get_experiment_by_name("exp")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1  # rank 0 only
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.params == {"model.width": "16", "model.act": "tanh", "optim.lr": "0.05", "seed": "0"}
    for key in ("loss", "val_loss", "acc_top1", "val_acc_top1"):
        got = client.get_metric_history(run.info.run_id, key)
        assert [m.step for m in got] == [0, 1, 2]
        assert [m.value for m in got] == pytest.approx(history[key], rel=1e-6), key
    lr = client.get_metric_history(run.info.run_id, "lr")
    assert [m.value for m in lr] == pytest.approx([0.05] * 3)
    batch = client.get_metric_history(run.info.run_id, "batch/loss")
    assert [m.step for m in batch] == list(range(2, steps + 1, 2))
    arts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"training_curves.png", "final_checkpoint.txt"} <= arts
    ckpt = run.data.tags["final_checkpoint"]
    assert ckpt.startswith(str(tmp_path.resolve())) and ckpt.endswith(".pt")


def test_exception_marks_run_failed(tmp_path):
    from fleetlite.callbacks import Callback, MLflowLogger

    class Boom(Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise RuntimeError("boom")

    t = trainer(config=CONFIG)
    uri = (tmp_path / "store").as_uri()
    with pytest.raises(RuntimeError, match="boom"):
        t.fit(dataset(16), epochs=3, batch_size=8, verbose=0, callbacks=[MLflowLogger(tracking_uri=uri), Boom()])
    client = mlflow.MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("fleetlite").experiment_id])
    assert run.info.status == "FAILED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [0, 1]


def test_missing_mlflow_names_the_extra(monkeypatch):
    from fleetlite.callbacks import MLflowLogger

    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(ImportError, match=r"^MLflowLogger needs the mlflow package.*install 'fleetlite\[mlflow\]'$"):
        MLflowLogger()


def test_resumed_fit_continues_the_same_run(tmp_path):
    from fleetlite.callbacks import MLflowLogger

    uri = (tmp_path / "store").as_uri()
    first = trainer(config=CONFIG)
    first.fit(dataset(32), epochs=3, batch_size=8, verbose=0, save_dir=tmp_path / "run", num_iters=6,
              callbacks=[MLflowLogger(tracking_uri=uri)])  # stops in epoch 2 (4 steps per epoch)
    again = trainer(config=CONFIG)
    hist = again.fit(dataset(32), epochs=3, batch_size=8, verbose=0, save_dir=tmp_path / "run", resume="latest",
                     callbacks=[MLflowLogger(tracking_uri=uri)])
    client = mlflow.MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("fleetlite").experiment_id])  # one run, continued
    assert run.info.status == "FINISHED"
    got = client.get_metric_history(run.info.run_id, "loss")
    assert [m.step for m in got] == [0, 1, 2]
    assert [m.value for m in got] == pytest.approx(hist.history["loss"], rel=1e-6)
