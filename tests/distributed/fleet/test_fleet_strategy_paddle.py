"""DistributedStrategy against Paddle: the defaults of distributed_strategy.proto, the assertions of Paddle's
test/collective/fleet/test_fleet_distributed_strategy.py (collective fields), refusals that name the field, and
save_to_prototxt / load_from_prototxt in Paddle's protobuf text format."""

import warnings

import pytest

from fleetlite.distributed.fleet.strategy import DistributedStrategy
from fleetlite.distributed.fleet.strategy_fields import CONFIGS, FLAGS, REFUSED

# Paddle's defaults, from paddle/fluid/framework/distributed_strategy.proto (and hybrid_parallel_order /
# sync_param_name, which Paddle keeps beside the proto).
PADDLE_DEFAULTS = {
    "amp": False, "recompute": False, "localsgd": False, "dgc": False, "gradient_merge": False, "lars": False,
    "lamb": False, "pipeline": False, "sync_batch_norm": False, "fuse_all_reduce_ops": True,
    "fuse_grad_size_in_MB": 32, "adaptive_localsgd": False, "fp16_allreduce": False, "sharding": False,
    "last_comm_group_size_MB": 1, "find_unused_parameters": False, "tensor_parallel": False,
    "without_graph_optimization": True,
    "recompute_configs": {"checkpoints": [], "enable_offload": False, "checkpoint_shape": []},
    "amp_configs": {"init_loss_scaling": 32768.0, "incr_every_n_steps": 1000, "decr_every_n_nan_or_inf": 2,
                    "incr_ratio": 2.0, "decr_ratio": 0.8, "use_dynamic_loss_scaling": True, "custom_white_list": [],
                    "custom_black_list": [], "custom_black_varnames": [], "use_pure_fp16": False,
                    "use_fp16_guard": True, "use_optimizer_fp16": False},
    "localsgd_configs": {"k_steps": 1, "begin_step": 1},
    "adaptive_localsgd_configs": {"init_k_steps": 1, "begin_step": 1},
    "gradient_merge_configs": {"k_steps": 1, "avg": True},
    "dgc_configs": {"rampup_begin_step": 0, "rampup_step": 1, "sparsity": []},
    "lars_configs": {"lars_coeff": 0.001, "lars_weight_decay": 0.0005, "epsilon": 0.0, "exclude_from_weight_decay": []},
    "lamb_configs": {"lamb_weight_decay": 0.01, "exclude_from_weight_decay": []},
    "pipeline_configs": {"micro_batch_size": 1, "accumulate_steps": 1, "schedule_mode": "1F1B",
                         "p2p_cache_shape": True},
    "tensor_parallel_configs": {"tensor_parallel_degree": 1, "tensor_init_seed": -1},
    "sharding_configs": {"sharding_segment_strategy": "segment_broadcast_MB", "segment_broadcast_MB": 32.0,
                         "segment_anchors": [], "sharding_degree": 8, "mp_degree": 1, "dp_degree": 1,
                         "hybrid_dp": False, "gradient_merge_acc_step": 1, "optimize_offload": False,
                         "pp_allreduce_in_optimize": False, "pp_degree": 1, "optimize_cast": False,
                         "_dp_as_optimizer_sharding": False, "stage": 1},
    "hybrid_configs": {"dp_degree": -1, "mp_degree": 1, "pp_degree": 1, "sharding_degree": 1, "sep_degree": 1},
}


# The keys Paddle 3.x added (paddlepaddle 3.3.1, distributed_strategy_pb2: AMPConfig field 13, RecomputeConfig 4-5,
# ShardingConfig 15-16, PipelineConfig 5, PpConfig 18-20) with the proto's defaults.
PADDLE_3_DEFAULTS = {
    "amp_configs": {"use_pure_bf16": False},
    "recompute_configs": {"enable_tuning": False, "refined_ops_patterns": []},
    "sharding_configs": {"enable_tuning": False, "use_calc_stream": False},
    "pipeline_configs": {"enable_partial_send_recv": True},
}
PADDLE_3_PP_CONFIGS = {"sync_param": False, "sync_moment": False, "sync_mode": "broadcast"}


def test_paddle_3_keys_with_paddles_defaults():
    s = DistributedStrategy()
    d = s.to_dict()
    for section, keys in PADDLE_3_DEFAULTS.items():
        assert {k: d[section][k] for k in keys} == keys, section
        assert {k: getattr(s, section)[k] for k in keys} == keys, section
    pp = s.hybrid_configs["pp_configs"]
    assert {k: pp[k] for k in PADDLE_3_PP_CONFIGS} == PADDLE_3_PP_CONFIGS
    assert pp.sync_param is False  # attribute access, as on Paddle's message
    # set as Paddle's users set them
    s.recompute_configs = {"checkpoints": ["x"], "refined_ops_patterns": [{"main_ops": ["matmul_v2"], "num": -1}],
                           "enable_tuning": True}
    assert s.recompute_configs["refined_ops_patterns"] == [{"main_ops": ["matmul_v2"], "num": -1, "pre_ops": [],
                                                            "suf_ops": []}]  # protobuf fills the message's defaults
    s.hybrid_configs = {"pp_configs": {"sync_param": True, "sync_moment": True}}
    assert s.hybrid_configs["pp_configs"]["sync_moment"] is True
    s.pipeline_configs = {"enable_partial_send_recv": False}
    s.sharding_configs = {"enable_tuning": True, "use_calc_stream": True}
    s.amp_configs = {"use_pure_bf16": True}
    with pytest.raises(TypeError, match="use_pure_bf16"):
        s.amp_configs = {"use_pure_bf16": "yes"}
    with pytest.raises(ValueError, match="RefinedOpsPattern"):
        s.recompute_configs = {"refined_ops_patterns": [{"main_op": ["x"]}]}


def test_paddle_3_keys_refused_only_when_they_would_act():
    s = DistributedStrategy()
    s.amp_configs = {"use_pure_bf16": True}
    s.check_supported(1)  # amp is off: Paddle ignores amp_configs
    s.amp = True
    with pytest.raises(NotImplementedError, match=r"amp_configs\['use_pure_bf16'\]"):
        s.check_supported(1)
    s = DistributedStrategy(recompute=True)
    s.recompute_configs = {"refined_ops_patterns": [{"main_ops": ["matmul_v2"]}]}
    with pytest.raises(NotImplementedError, match="refined_ops_patterns"):
        s.check_supported(1)
    s = DistributedStrategy(recompute=True, sharding=True, pipeline=False)  # accepted with no effect
    s.recompute_configs = {"enable_tuning": True}
    s.sharding_configs = {"enable_tuning": True, "use_calc_stream": True, "sharding_degree": 1}
    s.pipeline_configs = {"enable_partial_send_recv": False}
    s.check_supported(1)


def test_paddle_3_keys_written_as_paddle_parses_them(tmp_path):
    from google.protobuf import text_format

    s = DistributedStrategy()
    s.recompute_configs = {"enable_tuning": True, "refined_ops_patterns": [
        {"main_ops": ["matmul_v2", "elementwise_add"], "num": -1}, {"main_ops": ["softmax"], "pre_ops": ["scale"]}]}
    s.sharding_configs = {"use_calc_stream": True, "enable_tuning": True}
    s.pipeline_configs = {"enable_partial_send_recv": False}
    s.amp_configs = {"use_pure_bf16": True}
    s.hybrid_configs = {"pp_configs": {"sync_param": True, "sync_moment": True, "sync_mode": "average"}}
    out = tmp_path / "s.prototxt"
    s.save_to_prototxt(str(out))
    m = text_format.Parse(out.read_text(), _paddle_message())  # protobuf, on Paddle 3.3's definitions
    patterns = m.recompute_configs.refined_ops_patterns
    assert [list(p.main_ops) for p in patterns] == [["matmul_v2", "elementwise_add"], ["softmax"]]
    assert [p.num for p in patterns] == [-1, 0] and list(patterns[1].pre_ops) == ["scale"]
    assert m.sharding_configs.use_calc_stream and m.sharding_configs.enable_tuning
    assert m.pipeline_configs.enable_partial_send_recv is False and m.amp_configs.use_pure_bf16
    assert m.hybrid_configs.pp_configs.sync_moment and m.hybrid_configs.pp_configs.sync_mode == "average"
    back = DistributedStrategy()
    back.load_from_prototxt(str(out))
    assert back == s
    paddle_written = tmp_path / "paddle.prototxt"
    paddle_written.write_text(str(m))  # protobuf's own printing, as Paddle's save_to_prototxt writes
    again = DistributedStrategy()
    again.load_from_prototxt(str(paddle_written))
    assert again == s


def test_every_paddle_field_and_key_with_paddles_default():
    s = DistributedStrategy().to_dict()
    for name, default in PADDLE_DEFAULTS.items():
        if isinstance(default, dict):
            assert {k: s[name][k] for k in default} == default, name
        else:
            assert s[name] == default, name
    assert s["hybrid_configs"]["mp_configs"] == {"sync_param": False, "sync_grad": False, "sync_moment": False,
                                                 "sync_mode": "broadcast",
                                                 "sync_param_name": ["embedding", "layer_norm", ".b_"]}
    assert s["hybrid_configs"]["pp_configs"]["use_batch_p2p_comm"] is True
    assert DistributedStrategy().hybrid_parallel_order == ["dp", "pp", "sharding", "sep", "mp"]


@pytest.mark.parametrize("flag", ["amp", "recompute", "pipeline", "localsgd", "dgc", "sync_batch_norm",
                                  "fuse_all_reduce_ops", "find_unused_parameters", "gradient_merge", "lars", "lamb",
                                  "fp16_allreduce", "sharding", "tensor_parallel", "adaptive_localsgd",
                                  "without_graph_optimization"])
def test_flags_as_paddle_tests_set_them(flag):
    s = DistributedStrategy()
    s.__setattr__(flag, True)
    assert getattr(s, flag) is True
    s.__setattr__(flag, False)
    assert getattr(s, flag) is False
    # Paddle prints a warning and keeps the value (fp16_allreduce: TypeError); fleetlite always raises TypeError
    with pytest.raises(TypeError, match=flag):
        s.__setattr__(flag, "True")
    assert getattr(s, flag) is False


def test_paddle_raises_the_same_exception_types():
    s = DistributedStrategy()
    with pytest.raises(TypeError):
        s.fp16_allreduce = "True"
    with pytest.raises(TypeError, match="unknown_key"):
        s.unknown_key = "UNK"
    with pytest.raises(ValueError):
        s.last_comm_group_size_MB = -1
    s.last_comm_group_size_MB = 50
    s.fuse_grad_size_in_MB = 50
    with pytest.raises(TypeError):
        s.fuse_grad_size_in_MB = "40"
    assert (s.last_comm_group_size_MB, s.fuse_grad_size_in_MB) == (50, 50)


def test_configs_as_paddle_tests_set_them():
    s = DistributedStrategy()
    s.amp_configs = {"init_loss_scaling": 32768, "decr_every_n_nan_or_inf": 2, "incr_every_n_steps": 1000,
                     "incr_ratio": 2.0, "use_dynamic_loss_scaling": True, "decr_ratio": 0.5}
    assert s.amp_configs["init_loss_scaling"] == 32768
    s.recompute_configs = {"checkpoints": ["x", "y"]}
    assert len(s.recompute_configs["checkpoints"]) == 2
    s.pipeline_configs = {"micro_batch_size": 4}
    s.pipeline_configs = {"accumulate_steps": 2}
    assert (s.pipeline_configs["micro_batch_size"], s.pipeline_configs["accumulate_steps"]) == (4, 2)
    s.localsgd_configs = {"k_steps": 4, "begin_step": 120}
    assert (s.localsgd_configs["k_steps"], s.localsgd_configs["begin_step"]) == (4, 120)
    s.adaptive_localsgd_configs = {"init_k_steps": 1, "begin_step": 120}
    assert s.adaptive_localsgd_configs["begin_step"] == 120
    s.gradient_merge_configs = {"k_steps": 4}
    assert s.gradient_merge_configs["k_steps"] == 4
    s.hybrid_configs = {"dp_degree": 1, "mp_degree": 2, "pp_degree": 4, "order": ["sharding", "mp", "dp", "pp"],
                        "mp_configs": {"sync_param": True, "sync_grad": False, "sync_moment": False,
                                       "sync_mode": "broadcast",
                                       "sync_param_name": ["embedding", "layer_norm", ".w", ".b_"]}}
    hc = s.hybrid_configs
    assert (hc["dp_degree"], hc["mp_degree"], hc["pp_degree"]) == (1, 2, 4)
    assert hc["mp_configs"].sync_param is True and hc["mp_configs"].sync_mode == "broadcast"
    assert s.sync_param_name == ["embedding", "layer_norm", ".w", ".b_"]
    assert s.hybrid_parallel_order == ["sharding", "mp", "dp", "pp"]
    s.hybrid_configs = {"pp_configs": {"delay_scale_loss": True}}  # merges: the rest stays
    assert s.hybrid_configs["pp_configs"]["delay_scale_loss"] and s.hybrid_configs["mp_degree"] == 2
    with pytest.raises(ValueError, match="order"):
        s.hybrid_configs = {"order": ["dp", "dp"]}
    with pytest.raises(KeyError, match="sync_parm"):
        s.hybrid_configs = {"mp_configs": {"sync_parm": True}}
    assert "repr" not in repr(s) and "hybrid_configs" in repr(s)


def _turn_on(path):
    """A strategy with the REFUSED field or key at a non-default value (and its feature flag on)."""
    section, _, key = path.partition(".")
    s = DistributedStrategy()
    if not key:
        setattr(s, section, not FLAGS[section][0])
        return s
    flag = section.removesuffix("_configs")
    if flag in FLAGS:
        setattr(s, flag, True)
    default = CONFIGS[section][key][0]
    if isinstance(default, bool):
        value = not default
    elif isinstance(default, (int, float)):
        value = default + 1
    elif isinstance(default, str):
        value = {"level": "o2", "sharding_segment_strategy": "segment_anchors"}[key]
    else:
        value = {"checkpoint_shape": [1, 2], "refined_ops_patterns": [{"main_ops": ["x"]}]}.get(key, ["x"])
    getattr(s, section)[key] = value
    return s


@pytest.mark.parametrize("path", sorted(REFUSED))
def test_every_refused_field_raises_not_implemented_naming_it(path):
    s = _turn_on(path)
    section, _, key = path.partition(".")
    with pytest.raises(NotImplementedError, match=key or section):
        s.check_supported(world_size=2)


def test_configs_of_a_feature_that_is_off_are_ignored_as_paddle_does():
    s = DistributedStrategy()
    s.lamb_configs = {"lamb_weight_decay": 0.1}
    s.amp_configs = {"custom_white_list": ["conv2d"]}
    s.check_supported(world_size=2)
    s.without_graph_optimization = False  # no effect in eager mode (Paddle's dygraph ignores it too)
    s.check_supported(world_size=2)


# --- protobuf text format ----------------------------------------------------------------------------------------
# What Paddle's save_to_prototxt writes (str() of the proto message: set fields in field-number order) for a
# strategy with parameter-server and static-graph fields set too.
PADDLE_FILE = '''\
a_sync: true
amp: true
recompute: true
dgc: true
fuse_all_reduce_ops: true
fuse_grad_size_in_MB: 16
find_unused_parameters: true
without_graph_optimization: true
recompute_configs {
  checkpoints: "x"
  checkpoints: "y"
}
amp_configs {
  init_loss_scaling: 1024.0
  custom_white_list: "conv2d"
  use_pure_fp16: false
}
localsgd_configs {
  k_steps: 5
  begin_step: 1
}
a_sync_configs {
  k_steps: 0
}
sharding_configs {
  sharding_degree: 2
  stage: 2
}
hybrid_configs {
  dp_degree: 1
  mp_configs {
    sync_param: true
  }
}
build_strategy {
  fuse_elewise_add_act_ops: true
  enable_auto_fusion: true
}
'''


def test_a_file_paddle_writes_loads(tmp_path):
    path = tmp_path / "dist_strategy.prototxt"
    path.write_text(PADDLE_FILE)
    s = DistributedStrategy()
    with pytest.warns(UserWarning, match="a_sync, a_sync_configs, build_strategy"):
        s.load_from_prototxt(str(path))
    assert s.amp and s.recompute and s.dgc and s.find_unused_parameters and s.fuse_grad_size_in_MB == 16
    assert s.recompute_configs["checkpoints"] == ["x", "y"]
    assert s.amp_configs["init_loss_scaling"] == 1024.0 and s.amp_configs["custom_white_list"] == ["conv2d"]
    assert s.localsgd_configs == {"k_steps": 5, "begin_step": 1}
    assert s.sharding_configs["sharding_degree"] == 2 and s.sharding_configs["stage"] == 2
    assert s.hybrid_configs["dp_degree"] == 1 and s.hybrid_configs["mp_configs"]["sync_param"] is True
    # ... and back: what fleetlite writes is the same text minus the fields fleetlite leaves out (and defaults)
    out = tmp_path / "back.prototxt"
    s.save_to_prototxt(str(out))
    expected = [line for line in PADDLE_FILE.splitlines()
                if line not in ("a_sync: true", "fuse_all_reduce_ops: true", "without_graph_optimization: true",
                                "  use_pure_fp16: false", "  begin_step: 1")]
    expected = "\n".join(expected[:expected.index("a_sync_configs {")] + expected[expected.index("a_sync_configs {")
                         + 3:expected.index("build_strategy {")]) + "\n"
    assert out.read_text() == expected


def test_round_trip_with_fleetlite_keys_as_comments(tmp_path):
    s = DistributedStrategy(amp=True, sharding=True, fp16_allreduce=True)
    s.amp_configs = {"dtype": "bfloat16", "decr_ratio": 0.5}
    s.sharding_configs = {"stage": 3, "sharding_degree": 2, "offload": True, "wrap": ["Block"]}
    s.fp16_allreduce_configs = {"dtype": "bfloat16"}
    s.hybrid_configs = {"order": ["mp", "dp"], "mp_configs": {"sync_mode": "average"}}
    path = tmp_path / "s.prototxt"
    s.save_to_prototxt(str(path))
    text = path.read_text()
    assert 'sharding_configs {\n  sharding_degree: 2\n  stage: 3\n}\n' in text
    assert '# fleetlite: sharding_configs.wrap: "Block"\n' in text and "offload: true" in text
    for line in text.splitlines():  # outside comments, only Paddle's proto field names
        assert line.startswith("# fleetlite: ") or line.strip() == "}" or line.split()[0].rstrip(":") in (
            *PADDLE_DEFAULTS, *PADDLE_DEFAULTS["amp_configs"], *PADDLE_DEFAULTS["sharding_configs"], "mp_configs",
            "sync_mode", "dtype"), line
    back = DistributedStrategy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back.load_from_prototxt(str(path))
    assert back == s


def test_paddle_prototxt_test_and_text_format_variants(tmp_path):
    s = DistributedStrategy(localsgd=True, dgc=True)
    s.localsgd_configs = {"k_steps": 5, "begin_step": 1}
    s.save_to_prototxt(str(tmp_path / "d.prototxt"))
    s2 = DistributedStrategy()
    s2.load_from_prototxt(str(tmp_path / "d.prototxt"))
    assert s2.dgc == s.dgc and s2 == s
    (tmp_path / "v.prototxt").write_text(
        "# a comment\namp: True amp_configs < custom_black_list: ['a', \"b\\\"c\"] dtype: 'bfloat16' >\n"
        "recompute_configs: { checkpoints: \"\\303\\251\" }\n")
    s3 = DistributedStrategy()
    s3.load_from_prototxt(str(tmp_path / "v.prototxt"))
    assert s3.amp and s3.amp_configs["custom_black_list"] == ["a", 'b"c'] and s3.amp_configs["dtype"] == "bfloat16"
    assert s3.recompute_configs["checkpoints"] == ["\u00e9"]
    (tmp_path / "bad.prototxt").write_text("amp: 3\n")
    with pytest.raises(TypeError, match="amp"):
        DistributedStrategy().load_from_prototxt(str(tmp_path / "bad.prototxt"))


# --- against protobuf's own text format, on Paddle's message definitions (paddle_proto.py) ------------------------
def _paddle_message():
    pytest.importorskip("google.protobuf")
    from paddle_proto import strategy_message_class

    return strategy_message_class()()


def test_protobuf_printed_strategy_loads_and_writes_back_identically(tmp_path):
    from google.protobuf import text_format

    m = _paddle_message()
    m.amp, m.recompute, m.sharding, m.find_unused_parameters, m.a_sync = True, True, True, True, True
    m.fuse_grad_size_in_MB, m.last_comm_group_size_MB, m.without_graph_optimization = 16, 2, False
    m.amp_configs.init_loss_scaling, m.amp_configs.decr_ratio, m.amp_configs.dtype = 1024, 0.5, "bfloat16"
    m.amp_configs.custom_black_varnames.extend(["v1"])
    m.recompute_configs.checkpoints.extend(["block1", "block2"])
    m.sharding_configs.stage, m.sharding_configs.sharding_degree = 3, 2
    m.hybrid_configs.dp_degree, m.hybrid_configs.mp_configs.sync_mode = 2, "average"
    m.hybrid_configs.pp_configs.use_batch_p2p_comm = False
    m.dgc_configs.sparsity.extend([0.75, 0.999])
    m.lars_configs.exclude_from_weight_decay.extend(["bias"])
    m.pipeline_configs.schedule_mode, m.tensor_parallel_configs.tensor_init_seed = "FThenB", 7
    m.a_sync_configs.k_steps = 0
    path = tmp_path / "paddle.prototxt"
    path.write_text(str(m))  # exactly what Paddle's save_to_prototxt writes
    s = DistributedStrategy()
    with pytest.warns(UserWarning, match="a_sync, a_sync_configs"):
        s.load_from_prototxt(str(path))
    assert s.amp and s.sharding and s.fuse_grad_size_in_MB == 16 and s.without_graph_optimization is False
    assert s.amp_configs["init_loss_scaling"] == 1024 and s.amp_configs["dtype"] == "bfloat16"
    assert s.recompute_configs["checkpoints"] == ["block1", "block2"]
    assert s.dgc_configs["sparsity"] == [0.75, pytest.approx(0.999)]
    assert s.hybrid_configs["mp_configs"]["sync_mode"] == "average"
    assert s.hybrid_configs["pp_configs"]["use_batch_p2p_comm"] is False
    assert s.sharding_degree(world_size=4) == 2 and s.sharding_stage == 3
    # back: what fleetlite writes, parsed by protobuf on Paddle's definitions, is the same message minus the
    # parameter-server fields fleetlite leaves out
    out = tmp_path / "fleetlite.prototxt"
    s.save_to_prototxt(str(out))
    back = text_format.Parse(out.read_text(), _paddle_message())
    m.ClearField("a_sync")
    m.ClearField("a_sync_configs")
    assert str(back) == str(m)
    again = DistributedStrategy()
    again.load_from_prototxt(str(out))
    assert again == s


def test_every_field_fleetlite_writes_parses_on_paddles_definitions():
    from google.protobuf import text_format

    from fleetlite.distributed.fleet.prototxt import dumps

    s = DistributedStrategy()
    for name, (default, *_) in FLAGS.items():
        setattr(s, name, (not default) if isinstance(default, bool) else default * 2)
    s.amp_configs = {"custom_white_list": ["conv2d"], "level": "o2", "use_master_grad": True, "incr_ratio": 3.0}
    s.recompute_configs = {"enable_offload": True, "checkpoint_shape": [4, 8]}
    s.sharding_configs = {"segment_anchors": ["a"], "hybrid_dp": True, "optimize_cast": True, "wrap": ["Block"]}
    s.hybrid_configs = {"sep_degree": 2, "order": ["mp", "dp"], "pp_configs": {"profiling": True},
                        "mp_configs": {"sync_param": True, "sync_param_name": ["w"]}}
    s.lamb_configs = {"lamb_weight_decay": 0.1, "exclude_from_weight_decay": ["ln"]}
    s.adaptive_localsgd_configs = {"init_k_steps": 4}
    s.fuse_grad_size_in_MB = 0.5  # fleetlite takes fractions; Paddle's field is an int32 (so: a comment line)
    text = dumps(s)
    parsed = text_format.Parse(text, _paddle_message())  # raises on any field Paddle does not have
    assert parsed.hybrid_configs.sep_degree == 2 and list(parsed.amp_configs.custom_white_list) == ["conv2d"]
    loaded = DistributedStrategy()
    from fleetlite.distributed.fleet.prototxt import loads

    loads(text, loaded)
    assert loaded == s  # fleetlite's own keys came back through the comment lines


def test_the_tables_name_only_real_fields():
    from fleetlite.distributed.fleet.strategy_fields import EXTRAS, NO_EFFECT

    def exists(path):
        section, *keys = path.split(".")
        if not keys:
            return section in FLAGS or section in CONFIGS
        spec = CONFIGS.get(section, {})
        for key in keys:
            if not isinstance(spec, dict) or key not in spec:
                return False
            spec = spec[key]
        return True

    for path in (*REFUSED, *NO_EFFECT, *EXTRAS):
        assert exists(path), path
    assert not set(REFUSED) & set(NO_EFFECT)
    later = sorted(p for p, r in REFUSED.items() if r.later)
    assert {"pipeline", "tensor_parallel"} <= set(later)
    assert "hybrid_configs.sep_degree" not in REFUSED  # mp/pp/sep degrees run (tests/distributed/hybrid)
