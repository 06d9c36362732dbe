"""The recipe's command-line check: every kind of bad input stops with one line and exit status 2."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fleetlite.recipe.preflight import EXIT_CONFIG, prepare_cli

CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.fixture(autouse=True)
def _argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["cifar10.py"])
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM"):
        monkeypatch.delenv(var, raising=False)


def refused(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as info:
        prepare_cli(CONF, "cifar10", list(args))
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
    args = prepare_cli(CONF, "cifar10", ["data=synthetic"])
    assert args[0] == "data=synthetic" and args[1].startswith("run_dir=outputs/")
    assert sys.argv[1:] == args
    assert Path(args[1].split("=", 1)[1]).is_dir()  # created (and proved writable) before Hydra starts


def test_user_run_dir_is_kept_once(tmp_path):
    args = prepare_cli(CONF, "cifar10", [f"run_dir={tmp_path}/a", "-m", "optim.lr=0.1,0.2"])
    assert args == ["--multirun", "optim.lr=0.1,0.2", f"run_dir={tmp_path}/a"]


def test_informational_flags_pass_through(tmp_path):
    args = ["--cfg", "job", "trainer.epochs=abc"]
    assert prepare_cli(CONF, "cifar10", list(args)) == args
    assert prepare_cli(CONF, "cifar10", ["--help"]) == ["--help"]


def test_run_dir_with_spaces_is_quoted_for_hydra(tmp_path):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    args = prepare_cli(CONF, "cifar10", [f"run_dir='{tmp_path}/a b'"])
    (override,) = OverridesParser.create().parse_overrides(args)
    assert override.value() == f"{tmp_path}/a b" and (tmp_path / "a b").is_dir()


@pytest.mark.parametrize("override", ["trainer.batch_size=64", "+trainer.batch_size=64"])
def test_the_old_batch_size_key_names_its_new_name(capsys, tmp_path, override):
    line = refused(capsys, override, f"run_dir={tmp_path / 'run'}")
    assert line.startswith("error: trainer.batch_size was renamed trainer.global_batch_size (")
    assert "Trainer.fit(batch_size=) is the per-rank batch" in line
