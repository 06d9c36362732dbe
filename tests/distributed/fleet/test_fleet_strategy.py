"""DistributedStrategy: Paddle's names and defaults, validation on assignment, dict round trip, repr."""

import copy
import pickle

import pytest

from fleetlite.distributed.fleet.strategy import DistributedStrategy


def test_paddle_defaults():
    s = DistributedStrategy()
    assert (s.find_unused_parameters, s.fuse_all_reduce_ops, s.fuse_grad_size_in_MB, s.last_comm_group_size_MB) \
        == (False, True, 32, 1)
    # every key of Paddle's *_configs is there too, so the sections are checked key by key (the full
    # default dicts are pinned against distributed_strategy.proto in test_fleet_strategy_paddle.py)
    assert dict(s.amp_configs).items() >= {
        "init_loss_scaling": 32768.0, "incr_every_n_steps": 1000, "decr_every_n_nan_or_inf": 2, "incr_ratio": 2.0,
        "decr_ratio": 0.8, "use_dynamic_loss_scaling": True, "use_pure_fp16": False, "dtype": "float16"}.items()
    assert not any([s.amp, s.recompute, s.gradient_merge, s.sync_batch_norm, s.fp16_allreduce, s.sharding, s.dgc,
                    s.localsgd])
    assert s.recompute_configs["checkpoints"] == []
    assert s.gradient_merge_configs == {"k_steps": 1, "avg": True}
    sc = s.sharding_configs
    assert (sc["stage"], sc["offload"], sc["wrap"]) == (1, False, [])
    assert sc["sharding_degree"] == 8 and s.sharding_degree(world_size=2) == 2  # Paddle's default: all ranks here
    hc = s.hybrid_configs
    assert (hc["dp_degree"], hc["mp_degree"], hc["pp_degree"], hc["sharding_degree"]) == (-1, 1, 1, 1)


def test_config_assignment_merges_and_item_assignment_writes_through():
    s = DistributedStrategy()
    s.amp_configs = {"init_loss_scaling": 1024}
    s.amp_configs["dtype"] = "bfloat16"
    assert s.amp_configs["init_loss_scaling"] == 1024 and s.amp_configs["dtype"] == "bfloat16"
    assert s.amp_configs["incr_ratio"] == 2.0  # untouched keys keep their values
    s.gradient_merge_configs = {"k_steps": 4}
    assert s.gradient_merge_configs == {"k_steps": 4, "avg": True}


def test_unknown_names_list_valid_ones_with_suggestion():
    s = DistributedStrategy()
    with pytest.raises(AttributeError, match=r"'ampp'.*Did you mean 'amp'\?.*Valid names: .*gradient_merge"):
        s.ampp = True
    with pytest.raises(AttributeError, match="Did you mean 'gradient_merge'"):
        _ = s.gradient_merg
    with pytest.raises(KeyError, match=r"init_loss_scale.*Did you mean 'init_loss_scaling'.*incr_ratio"):
        s.amp_configs = {"init_loss_scale": 8}
    with pytest.raises(KeyError, match="Did you mean 'k_steps'"):
        s.gradient_merge_configs["k_step"] = 2
    with pytest.raises(KeyError, match="checkpoints"):
        _ = s.recompute_configs["checkpoint"]


@pytest.mark.parametrize("field, value, match", [
    ("last_comm_group_size_MB", 0, "last_comm_group_size_MB"),
    ("fuse_grad_size_in_MB", -3, "fuse_grad_size_in_MB"),
    ("amp", 1, "amp must be True or False"),
    ("amp", "yes", "amp must be True or False"),
    ("amp_configs", 3, "amp_configs must be a dict"),
])
def test_bad_flag_values(field, value, match):
    s = DistributedStrategy()
    with pytest.raises(ValueError, match=match):
        setattr(s, field, value)
    assert getattr(s, field) == getattr(DistributedStrategy(), field)  # unchanged


@pytest.mark.parametrize("section, key, value", [
    ("gradient_merge_configs", "k_steps", 0),
    ("gradient_merge_configs", "k_steps", 2.0),
    ("amp_configs", "dtype", "float8"),
    ("amp_configs", "init_loss_scaling", 0),
    ("amp_configs", "incr_ratio", 1.0),
    ("amp_configs", "decr_ratio", 1.5),
    ("sharding_configs", "stage", 4),
    ("hybrid_configs", "dp_degree", 0),
    ("recompute_configs", "checkpoints", "layer1"),
    ("fp16_allreduce_configs", "dtype", "float32"),
])
def test_bad_config_values_name_the_field(section, key, value):
    s = DistributedStrategy()
    with pytest.raises(ValueError, match=rf"{section}\['{key}'\]"):
        getattr(s, section)[key] = value
    before = s.to_dict()
    with pytest.raises(ValueError):
        setattr(s, section, {key: value})
    assert s.to_dict() == before


def test_a_bad_key_in_a_dict_changes_nothing():
    s = DistributedStrategy()
    with pytest.raises(ValueError, match="dtype"):
        s.amp_configs = {"init_loss_scaling": 8, "dtype": "float8"}
    with pytest.raises(KeyError):
        s.amp_configs = {"init_loss_scaling": 8, "dtyp": "float16"}
    assert s.amp_configs["init_loss_scaling"] == 32768.0


def test_dict_round_trip_and_repr_of_differences():
    s = DistributedStrategy()
    assert repr(s) == "DistributedStrategy()"
    s.amp = True
    s.amp_configs = {"dtype": "bfloat16"}
    s.recompute_configs = {"checkpoints": ("block1", "block2")}
    assert repr(s) == ("DistributedStrategy(amp=True, amp_configs={'dtype': 'bfloat16'}, "
                       "recompute_configs={'checkpoints': ['block1', 'block2']})")
    d = s.to_dict()
    assert d["recompute_configs"]["checkpoints"] == ["block1", "block2"]
    d["amp_configs"]["dtype"] = "float16"  # a copy: the strategy is unchanged
    assert s.amp_configs["dtype"] == "bfloat16"
    back = DistributedStrategy.from_dict(s.to_dict())
    assert back == s and back is not s
    assert DistributedStrategy.from_dict({"gradient_merge": True}).diff() == {"gradient_merge": True}
    assert DistributedStrategy(sharding=True) == DistributedStrategy.from_dict({"sharding": True})
    with pytest.raises(AttributeError, match="Did you mean 'sharding'"):
        DistributedStrategy.from_dict({"shardin": True})


def test_from_omegaconf():
    omegaconf = pytest.importorskip("omegaconf")
    cfg = omegaconf.OmegaConf.create({"amp": True, "recompute_configs": {"checkpoints": ["a"]},
                                      "gradient_merge_configs": {"k_steps": 2}})
    s = DistributedStrategy.from_dict(cfg)
    assert s.amp and s.recompute_configs["checkpoints"] == ["a"] and s.gradient_merge_configs["k_steps"] == 2
    assert type(s.to_dict()["recompute_configs"]["checkpoints"]) is list


def test_copy_and_pickle():
    s = DistributedStrategy(amp=True)
    for other in (copy.deepcopy(s), pickle.loads(pickle.dumps(s))):
        assert other == s
        other.amp_configs["dtype"] = "bfloat16"
        assert s.amp_configs["dtype"] == "float16"


@pytest.mark.parametrize("fields, match", [
    ({"hybrid_configs": {"sep_degree": 2, "pp_degree": 2}}, "sep_degree"),  # mp/pp/sep degrees each run
    ({"tensor_parallel": True}, "tensor_parallel"),
    ({"sharding": True, "sharding_configs": {"stage": 1, "offload": True}}, "offload"),
    ({"amp": True, "amp_configs": {"use_pure_fp16": True}}, "use_pure_fp16"),
    ({"sharding": True, "sharding_configs": {"stage": 1, "sharding_degree": 1}}, "hybrid"),
])
def test_unsupported_features_are_refused(fields, match):
    s = DistributedStrategy.from_dict(fields)  # settable (a Paddle script's strategy builds) ...
    with pytest.raises(NotImplementedError, match=match):  # ... but never silently ignored
        s.check_supported(world_size=2)


def test_degrees_must_fit_world():
    DistributedStrategy.from_dict({"hybrid_configs": {"dp_degree": 2}}).check_supported(2)
    with pytest.raises(ValueError, match="dp_degree"):
        DistributedStrategy.from_dict({"hybrid_configs": {"dp_degree": 4}}).check_supported(2)
    with pytest.raises(ValueError, match="does not divide the 2 ranks"):
        DistributedStrategy.from_dict({"hybrid_configs": {"sharding_degree": 3}}).check_supported(2)
    s3 = DistributedStrategy.from_dict({"sharding": True, "sharding_configs": {"stage": 3, "sharding_degree": 2}})
    s3.check_supported(4)  # hybrid sharding: 2 groups of 2
    assert s3.sharding_stage == 3 and s3.sharding_degree(4) == 2
    s = DistributedStrategy.from_dict({"hybrid_configs": {"sharding_degree": 2, "dp_degree": 1}})
    s.check_supported(2)
    assert s.sharding_enabled
