"""Config groups, schemas and value checks of the CIFAR-10 recipe, composed in-process as Hydra does."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from fleetlite.recipe.schema import register_configs
from fleetlite.recipe.validate import (
    ConfigError,
    check_config,
    check_run_dir,
    choose_resume_checkpoint,
    describe_compose_error,
)

CONF = Path(__file__).resolve().parents[2] / "conf"


def _compose(*overrides: str):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("cifar10", overrides=list(overrides))


def _compose_error(*overrides: str) -> str:
    with pytest.raises(Exception) as info:
        _compose(*overrides)
    return describe_compose_error(info.value)


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def test_groups_hold_the_documented_options():
    assert _options("data") == ["cifar10", "synthetic"]
    assert _options("model") == ["fast", "resnet18", "tutorial_cnn"]
    assert _options("optim") == ["adam", "adamw", "sgd"]
    assert _options("sched") == ["cosine", "none", "onecycle"]
    assert _options("strategy") == ["amp_bf16", "amp_fp16", "default", "grad_merge", "recompute", "sharding",
                                    "sharding2", "sharding3"]
    assert "default" in _options("trainer")
    assert _options("experiment") == ["airbench"]


@pytest.mark.parametrize("group", ["data", "model", "optim", "sched", "strategy", "trainer", "experiment"])
def test_every_option_composes_and_passes_the_checks(group):
    for option in _options(group):
        cfg = _compose(f"{group}={option}")
        check_config(cfg, world_size=2)
        assert group == "experiment" or OmegaConf.select(cfg, group) is not None


def test_defaults_are_the_documented_ones():
    cfg = _compose()
    assert cfg.data.name.value == "cifar10" and cfg.model.name == "tutorial_cnn" and cfg.optim.name == "adam"
    assert cfg.sched.name == "cosine" and cfg.resume is None and cfg.device.value == "auto"
    assert str(cfg.run_dir).startswith("outputs/")


def test_strategy_options_are_the_distributed_strategies_they_name():
    from fleetlite.distributed.fleet.strategy import DistributedStrategy

    def built(option):
        node = _compose(f"strategy={option}").strategy
        return DistributedStrategy.from_dict(OmegaConf.to_container(node, enum_to_str=True))

    assert built("default") == DistributedStrategy()
    expected = {
        "amp_bf16": DistributedStrategy(amp=True, amp_configs={"dtype": "bfloat16", "use_dynamic_loss_scaling": False}),
        "amp_fp16": DistributedStrategy(amp=True, amp_configs={"dtype": "float16"}),
        "grad_merge": DistributedStrategy(gradient_merge=True, gradient_merge_configs={"k_steps": 4, "avg": True}),
        "recompute": DistributedStrategy(recompute=True, recompute_configs={
            "checkpoints": ["layer1", "layer2", "layer3", "layer4"]}),
        "sharding": DistributedStrategy(sharding=True, sharding_configs={"stage": 1}),
        "sharding2": DistributedStrategy(sharding=True, sharding_configs={"stage": 2}),
        "sharding3": DistributedStrategy(sharding=True, sharding_configs={"stage": 3}),
    }
    for option, strategy in expected.items():
        assert built(option) == strategy, option


def test_wrong_type_is_one_line_naming_the_key():
    msg = _compose_error("trainer.epochs=abc")
    assert "\n" not in msg and "trainer.epochs" in msg and "Integer" in msg
    msg = _compose_error("device=tpu")
    assert "\n" not in msg and "auto, cpu, cuda" in msg


def test_unknown_key_is_one_line_with_the_valid_keys():
    msg = _compose_error("trainer.epoch=3")
    assert "\n" not in msg and "trainer.epoch" in msg and "did you mean 'epochs'" in msg
    msg = _compose_error("model.widths=[8,8,8]")  # tutorial_cnn has no widths
    assert "unknown key 'model.widths'" in msg


def test_unknown_key_appended_with_plus_is_refused_by_the_checks():
    cfg = _compose("+trainer.foo=1")
    with pytest.raises(ConfigError, match=r"unknown key 'trainer.foo' \(TrainerConfig has no field 'foo'\)"):
        check_config(cfg)
    with pytest.raises(ConfigError, match="unknown key 'bar'"):
        check_config(_compose("+bar=1"))


def test_unknown_group_option_lists_the_choices():
    msg = _compose_error("model=vgg")
    assert msg == "model=vgg: no such option in config group 'model'; choose one of: fast, resnet18, tutorial_cnn"


@pytest.mark.parametrize("overrides, match", [
    (["optim.lr=0"], r"optim.lr=0.0 must be a positive number"),
    (["optim.lr=-0.1"], r"optim.lr=-0.1 must be a positive"),
    (["optim=adam", "optim.betas=[0.9,1.5]"], r"optim.betas=\[0.9, 1.5\] must be two numbers"),
    (["trainer.global_batch_size=1"], r"trainer.global_batch_size=1 is smaller than the number of ranks \(2\)"),
    (["trainer.epochs=0"], r"trainer.epochs=0 must be at least 1"),
    (["sched.warmup_epochs=20"], r"sched.warmup_epochs=20.0 must be in \[0, trainer.epochs=10\)"),
    (["optim.name=sgd"], r"optim.name='sgd' does not match the optim option in use \(adam\)"),
    (["strategy.amp_configs.use_pure_fp16=true", "strategy.amp=true"], r"strategy: .*use_pure_fp16"),
    (["strategy.sharding=true", "strategy.sharding_configs.offload=true"], r"strategy: .*offload"),
    (["data.train_size=0"], r"data.train_size=0 must be a positive number"),
])
def test_bad_values_fail_with_one_clear_line(overrides, match):
    cfg = _compose(*overrides)
    with pytest.raises(ConfigError, match=match) as info:
        check_config(cfg, world_size=2)
    assert "\n" not in str(info.value)


def test_batch_size_equal_to_ranks_is_fine():
    check_config(_compose("trainer.global_batch_size=2"), world_size=2)


def test_resume_latest_without_checkpoint_and_missing_path(tmp_path):
    assert choose_resume_checkpoint(None, tmp_path) is None
    assert choose_resume_checkpoint("auto", tmp_path) is None  # auto: a fresh start when nothing is there yet
    with pytest.raises(ConfigError, match="resume=latest but .*checkpoints holds no checkpoint"):
        choose_resume_checkpoint("latest", tmp_path)
    with pytest.raises(ConfigError, match="no such checkpoint file"):
        choose_resume_checkpoint(str(tmp_path / "nope.pt"), tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere (the EACCES test below runs as root too)")
def test_unwritable_run_dir(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(ConfigError, match="run_dir=.* is not writable"):
            check_run_dir(locked / "run")
    finally:
        locked.chmod(0o700)


def test_a_run_dir_the_os_refuses_to_write_is_a_config_error(tmp_path, monkeypatch):
    """What a read-only folder does to a user who is not root (CI runs as root, whom the mode bits do not stop):
    the kernel's EACCES on creating the probe file."""
    import builtins
    import errno

    real_open = builtins.open

    def refusing_open(file, mode="r", *args, **kwargs):
        if "w" in mode and str(file).startswith(str(tmp_path / "locked")):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", refusing_open)
    with pytest.raises(ConfigError, match=r"run_dir=.*locked/run is not writable \(Permission denied\): choose a "):
        check_run_dir(tmp_path / "locked" / "run")


def test_run_dir_under_a_file_is_not_writable(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is not writable"):
        check_run_dir(tmp_path / "file" / "run")
    assert check_run_dir(tmp_path / "a" / "b").is_dir()


def test_airbench_experiment_sets_every_group_it_names():
    cfg = _compose("experiment=airbench")
    check_config(cfg, world_size=1)
    assert (cfg.model.name, cfg.optim.name, cfg.sched.name) == ("fast", "sgd", "onecycle")
    assert cfg.strategy.amp and cfg.strategy.amp_configs.dtype.value == "bfloat16"
    assert cfg.data.channels_last and cfg.trainer.global_batch_size == 1024 and cfg.trainer.label_smoothing == 0.2
    assert "experiment" not in cfg  # a preset, not a config key


def test_the_strategy_schema_is_the_strategy_table():
    """The recipe's strategy group has DistributedStrategy's fields, types and defaults, generated
    from its one table (a field added there appears here, with its default)."""
    from fleetlite.distributed.fleet import DistributedStrategy
    from fleetlite.recipe.schema import StrategyConfig

    schema = OmegaConf.to_container(OmegaConf.structured(StrategyConfig), enum_to_str=True)
    assert set(schema) == set(DistributedStrategy.field_names())
    assert schema == DistributedStrategy().to_dict()
    cfg = _compose("strategy=sharding2")
    assert DistributedStrategy.from_dict(OmegaConf.to_container(cfg.strategy, enum_to_str=True)).sharding_stage == 2
