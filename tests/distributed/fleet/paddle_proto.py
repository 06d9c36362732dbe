"""Paddle's ``distributed_strategy.proto`` (the collective messages, plus two out-of-scope ones a Paddle file may
hold), rebuilt with protobuf's descriptor API, so tests can print and parse with protobuf's own text format
exactly as Paddle's ``save_to_prototxt`` / ``load_from_prototxt`` do. Field names, types and defaults are
transcribed from the proto; the numbers of fields newer than the transcribed version are placeholders (the text
format does not use them)."""

from __future__ import annotations

B, I, F, S = "bool", "int32", "float", "string"
R = "repeated"

# message -> [(field, type or message name, default or R)]
MESSAGES = {
    "RefinedOpsPattern": [("main_ops", S, R), ("num", I, "0"), ("pre_ops", S, R), ("suf_ops", S, R)],
    "RecomputeConfig": [("checkpoints", S, R), ("enable_offload", B, "false"), ("checkpoint_shape", I, R),
                        ("enable_tuning", B, "false"), ("refined_ops_patterns", "RefinedOpsPattern", R)],
    "ShardingConfig": [("sharding_segment_strategy", S, "segment_broadcast_MB"), ("segment_broadcast_MB", F, "32.0"),
                       ("segment_anchors", S, R), ("sharding_degree", I, "8"), ("mp_degree", I, "1"),
                       ("dp_degree", I, "1"), ("hybrid_dp", B, "false"), ("gradient_merge_acc_step", I, "1"),
                       ("optimize_offload", B, "false"), ("pp_allreduce_in_optimize", B, "false"),
                       ("pp_degree", I, "1"), ("optimize_cast", B, "false"), ("_dp_as_optimizer_sharding", B, "false"),
                       ("stage", I, "1"), ("enable_tuning", B, "false"), ("use_calc_stream", B, "false")],
    "MpConfig": [("sync_param", B, "false"), ("sync_grad", B, "false"), ("sync_moment", B, "false"),
                 ("sync_mode", S, "broadcast")],
    "PpConfig": [("dp_comm_overlap", B, "false"), ("delay_scale_loss", B, "false"), ("enable_timer", B, "false"),
                 ("sharding_comm_overlap", B, "false"), ("profiling", B, "false"), ("release_gradients", B, "false"),
                 ("overlap_p2p_comm", B, "false"), ("clear_every_step_cache", B, "false"),
                 ("use_batch_p2p_comm", B, "true"), ("sync_param", B, "false"), ("sync_moment", B, "false"),
                 ("sync_mode", S, "broadcast")],
    "HybridConfig": [("dp_degree", I, "-1"), ("mp_degree", I, "1"), ("pp_degree", I, "1"),
                     ("sharding_degree", I, "1"), ("mp_configs", "MpConfig", None), ("pp_configs", "PpConfig", None),
                     ("sep_degree", I, "1")],
    "AMPConfig": [("init_loss_scaling", F, "32768.0"), ("incr_every_n_steps", I, "1000"),
                  ("decr_every_n_nan_or_inf", I, "2"), ("incr_ratio", F, "2.0"), ("decr_ratio", F, "0.8"),
                  ("use_dynamic_loss_scaling", B, "true"), ("custom_white_list", S, R), ("custom_black_list", S, R),
                  ("custom_black_varnames", S, R), ("use_pure_fp16", B, "false"), ("use_fp16_guard", B, "true"),
                  ("use_optimizer_fp16", B, "false"), ("dtype", S, "float16"), ("level", S, "o1"),
                  ("use_master_grad", B, "false"), ("use_pure_bf16", B, "false")],
    "LocalSGDConfig": [("k_steps", I, "1"), ("begin_step", I, "1")],
    "AdaptiveLocalSGDConfig": [("init_k_steps", I, "1"), ("begin_step", I, "1")],
    "GradientMergeConfig": [("k_steps", I, "1"), ("avg", B, "true")],
    "DGCConfig": [("rampup_begin_step", I, "0"), ("rampup_step", I, "1"), ("sparsity", F, R)],
    "LarsConfig": [("lars_coeff", F, "0.001"), ("lars_weight_decay", F, "0.0005"), ("epsilon", F, "0.0"),
                   ("exclude_from_weight_decay", S, R)],
    "LambConfig": [("lamb_weight_decay", F, "0.01"), ("exclude_from_weight_decay", S, R)],
    "PipelineConfig": [("micro_batch_size", I, "1"), ("accumulate_steps", I, "1"), ("schedule_mode", S, "1F1B"),
                       ("p2p_cache_shape", B, "true"), ("enable_partial_send_recv", B, "true")],
    "TensorParallelConfig": [("tensor_parallel_degree", I, "1"), ("tensor_init_seed", I, "-1")],
    "AsyncConfig": [("k_steps", I, "-1"), ("max_merge_var_num", I, "1")],  # parameter server (out of scope)
    "BuildStrategy": [("enable_sequential_execution", B, "false"), ("fuse_elewise_add_act_ops", B, "false")],
    "DistributedStrategy": [
        ("amp", B, "false"), ("recompute", B, "false"), ("localsgd", B, "false"), ("dgc", B, "false"),
        ("gradient_merge", B, "false"), ("lars", B, "false"), ("lamb", B, "false"), ("pipeline", B, "false"),
        ("elastic", B, "false"), ("auto", B, "false"), ("a_sync", B, "true"), ("sync_nccl_allreduce", B, "true"),
        ("nccl_comm_num", I, "1"), ("sync_batch_norm", B, "false"), ("fuse_all_reduce_ops", B, "true"),
        ("fuse_grad_size_in_MB", I, "32"), ("adaptive_localsgd", B, "false"), ("fp16_allreduce", B, "false"),
        ("sharding", B, "false"), ("last_comm_group_size_MB", F, "1"), ("find_unused_parameters", B, "false"),
        ("tensor_parallel", B, "false"), ("without_graph_optimization", B, "true"),
        ("recompute_configs", "RecomputeConfig", None), ("amp_configs", "AMPConfig", None),
        ("localsgd_configs", "LocalSGDConfig", None), ("gradient_merge_configs", "GradientMergeConfig", None),
        ("dgc_configs", "DGCConfig", None), ("pipeline_configs", "PipelineConfig", None),
        ("a_sync_configs", "AsyncConfig", None), ("lars_configs", "LarsConfig", None),
        ("lamb_configs", "LambConfig", None), ("adaptive_localsgd_configs", "AdaptiveLocalSGDConfig", None),
        ("sharding_configs", "ShardingConfig", None), ("hybrid_configs", "HybridConfig", None),
        ("tensor_parallel_configs", "TensorParallelConfig", None), ("build_strategy", "BuildStrategy", None)],
}


def strategy_message_class():
    """The protobuf class of Paddle's ``DistributedStrategy`` message (needs the ``protobuf`` package)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fd = descriptor_pb2.FileDescriptorProto(name="paddle_distributed_strategy_test.proto", package="paddle.fleet",
                                            syntax="proto2")
    types = {B: descriptor_pb2.FieldDescriptorProto.TYPE_BOOL, I: descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
             F: descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT, S: descriptor_pb2.FieldDescriptorProto.TYPE_STRING}
    for name, fields in MESSAGES.items():
        msg = fd.message_type.add(name=name)
        for number, (field, kind, default) in enumerate(fields, start=1):
            f = msg.field.add(name=field, number=number)
            f.label = (descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED if default == R
                       else descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
            if kind in types:
                f.type = types[kind]
                if default not in (R, None):
                    f.default_value = default
            else:
                f.type, f.type_name = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE, f".paddle.fleet.{kind}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("paddle.fleet.DistributedStrategy"))
