"""The recipe's command line (fleetlite.recipe.job.plan): every kind of bad input stops with one line and exit
status 2; a good one gives each job its config, composed once, with one run directory pinned for every rank."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fleetlite.recipe.job import EXIT_CONFIG, plan

CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.fixture(autouse=True)
def _argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["cifar10.py"])
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM"):
        monkeypatch.delenv(var, raising=False)


def refused(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as info:
        plan(CONF, "cifar10", list(args))
    assert info.value.code == EXIT_CONFIG
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize("args, expected", [
    (["trainer.epochs=abc"], "trainer.epochs=abc: Value 'abc' of type 'str' could not be converted to Integer"),
    (["trainer.epoch=3"], "unknown key 'trainer.epoch'"),
    (["+trainer.foo=1"], "unknown key 'trainer.foo'"),
    (["model=vgg"], "model=vgg: no such option in config group 'model'; choose one of: fast, resnet18, tutorial_cnn"),
    (["optim.lr=0"], "optim.lr=0.0 must be a positive number"),
    (["optim.lr=0.1,0.2"], "several values (a sweep) but --multirun (-m) is not given"),
    (["-m", "optim.lr=0.1,-1"], "optim.lr=-1.0 must be a positive number"),
    (["trainer.epochs="], "trainer.epochs=: "),
    (["strategy=amp_fp16", "strategy.amp_configs.incr_ratio=0.5"], "strategy: amp_configs['incr_ratio'] must be"),
])
def test_bad_overrides(capsys, tmp_path, args, expected):
    assert expected in refused(capsys, *args, f"run_dir={tmp_path / 'run'}")
    assert not (tmp_path / "run").exists()


def test_resume_latest_without_a_checkpoint(capsys, tmp_path):
    line = refused(capsys, "resume=latest", f"run_dir={tmp_path}")
    assert f"resume=latest but {tmp_path}/checkpoints holds no checkpoint" in line


def test_resume_from_a_missing_file(capsys, tmp_path):
    assert "no such checkpoint file" in refused(capsys, f"resume={tmp_path}/x.pt", f"run_dir={tmp_path}")


def test_unwritable_run_dir(capsys, tmp_path):
    (tmp_path / "file").write_text("")
    assert f"run_dir={tmp_path}/file/run is not writable" in refused(capsys, f"run_dir={tmp_path}/file/run")


def test_good_command_line_pins_the_run_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (job,) = plan(CONF, "cifar10", ["data=synthetic"])
    assert job.cfg.data.name.value == "synthetic" and job.cfg.run_dir.startswith("outputs/")
    assert job.dir == tmp_path / job.cfg.run_dir and list(job.config.hydra.overrides.task) == ["data=synthetic"]
    assert job.dir.is_dir()  # created (and proved writable) before the job starts; sys.argv is left alone
    assert sys.argv == ["cifar10.py"]


def test_user_run_dir_is_kept_once(tmp_path):
    jobs = plan(CONF, "cifar10", [f"run_dir={tmp_path}/a", "-m", "optim.lr=0.1,0.2"])
    assert [(j.cfg.run_dir, j.dir, j.cfg.optim.lr) for j in jobs] == [
        (f"{tmp_path}/a", tmp_path / "a" / "0", 0.1), (f"{tmp_path}/a", tmp_path / "a" / "1", 0.2)]
    assert (tmp_path / "a" / "multirun.yaml").is_file()


def test_informational_flags_pass_through(tmp_path):
    assert plan(CONF, "cifar10", ["--cfg", "job", "trainer.epochs=abc"]) is None  # hydra.main prints them
    assert plan(CONF, "cifar10", ["--help"]) is None


def test_run_dir_with_spaces_is_kept_as_one_value(tmp_path):
    (job,) = plan(CONF, "cifar10", [f"run_dir='{tmp_path}/a b'"])
    assert job.cfg.run_dir == f"{tmp_path}/a b" and (tmp_path / "a b").is_dir()


@pytest.mark.parametrize("override", ["trainer.batch_size=64", "+trainer.batch_size=64"])
def test_the_old_batch_size_key_names_its_new_name(capsys, tmp_path, override):
    line = refused(capsys, override, f"run_dir={tmp_path / 'run'}")
    assert line.startswith("error: trainer.batch_size was renamed trainer.global_batch_size (")
    assert "Trainer.fit(batch_size=) is the per-rank batch" in line
