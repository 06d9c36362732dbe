"""The training-curves figure and the final report of a run."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from fleetlite.recipe.run import Run, finish_run
from fleetlite.utils import plot

CSV = "epoch,acc,loss,val_acc,val_loss\n0,0.3,2.0,0.35,1.9\n1,0.5,1.5,,\n2,0.7,1.0,0.65,1.1\n"


def _run(tmp_path: Path, rank: int = 0) -> Run:
    return Run(rank=rank, world_size=2, local_rank=rank, device=torch.device("cpu"), dir=tmp_path, resume=None)


def test_read_metrics_keeps_gaps_as_nan(tmp_path):
    (tmp_path / "m.csv").write_text(CSV)
    cols = plot.read_metrics(tmp_path / "m.csv")
    assert cols["epoch"] == [0, 1, 2] and cols["acc"] == [0.3, 0.5, 0.7]
    assert cols["val_acc"][0] == 0.35 and math.isnan(cols["val_acc"][1])


def test_plot_draws_train_and_validation_curves(tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "m.csv").write_text(CSV)
    png = plot.plot_training_curves(tmp_path / "m.csv", tmp_path / "out" / "curves.png", title="t")
    assert png == tmp_path / "out" / "curves.png" and png.read_bytes()[:4] == b"\x89PNG"
    assert [p.name for p in png.parent.iterdir()] == ["curves.png"]  # no temporary file left behind
    import matplotlib.image

    image = matplotlib.image.imread(png)
    assert image.shape[:2] == (400, 1000)
    assert len({tuple(px) for px in image.reshape(-1, image.shape[-1])[::97].tolist()}) > 3  # not blank


def test_plot_without_epochs_gives_none(tmp_path):
    (tmp_path / "m.csv").write_text("epoch,loss\n")
    assert plot.plot_training_curves(tmp_path / "m.csv", tmp_path / "p.png") is None


def test_finish_reports_accuracy_run_dir_and_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    (tmp_path / "metrics.csv").write_text(CSV)
    result = finish_run(_run(tmp_path), {"loss": 1.1, "acc": 0.65})
    assert result == {"acc": 0.65, "loss": 1.1}
    out = capsys.readouterr().out.splitlines()
    assert out == ["final validation accuracy: 0.6500 (loss 1.1000)", f"run directory: {tmp_path}",
                   f"training curves: {tmp_path / 'training_curves.png'}"]


def test_finish_without_matplotlib_prints_one_note(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(plot, "matplotlib_available", lambda: False)
    (tmp_path / "metrics.csv").write_text(CSV)
    finish_run(_run(tmp_path), {"loss": 1.1, "acc": 0.65})
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == plot.missing_note() and not (tmp_path / "training_curves.png").exists()


def test_only_rank_zero_reports_or_writes(tmp_path, capsys):
    (tmp_path / "metrics.csv").write_text(CSV)
    assert finish_run(_run(tmp_path, rank=1), {"loss": 1.1, "acc": 0.65})["acc"] == 0.65
    assert capsys.readouterr().out == "" and not (tmp_path / "training_curves.png").exists()
