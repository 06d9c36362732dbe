"""Program, default_main_program, program_guard and the strategies' checks."""

import pytest
import torch

from fleetlite.static import BuildStrategy, ExecutionStrategy, Program, default_main_program, program_guard


def _net():
    return torch.nn.Linear(3, 2)


def test_program_holds_module_and_optimizer_and_clone_for_test_drops_optimizer():
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    prog = Program(net, opt)
    assert prog.module is net and prog.optimizer is opt and not prog.for_test
    test = prog.clone(for_test=True)
    assert test.module is net and test.optimizer is None and test.for_test
    same = prog.clone()
    assert same.optimizer is opt and not same.for_test


def test_program_rejects_non_module_and_foreign_optimizer():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        Program(lambda x: x)
    other = _net()
    with pytest.raises(ValueError, match="not a parameter of the program's module"):
        Program(_net(), torch.optim.SGD(other.parameters(), lr=0.1))
    with pytest.raises(TypeError, match="step"):
        Program(_net(), optimizer=object())


def test_default_main_program_set_get_and_guard_restores():
    a, b = Program(_net()), Program(_net())
    assert default_main_program(a) is a
    assert default_main_program() is a
    with program_guard(b):
        assert default_main_program() is b
    assert default_main_program() is a
    with pytest.raises(TypeError, match="Program"):
        default_main_program(_net())


def test_build_strategy_checks():
    bs = BuildStrategy()
    bs._check()
    bs.gradient_scale_strategy = BuildStrategy.GradientScaleStrategy.Customized
    with pytest.raises(ValueError, match="Customized"):
        bs._check()
    bs = BuildStrategy()
    bs.sync_batch_norm = True
    with pytest.raises(ValueError, match="sync_batch_norm"):
        bs._check()
    bs = BuildStrategy()
    bs.fuse_grad_size_in_MB = 0
    with pytest.raises(ValueError, match="fuse_grad_size_in_MB"):
        bs._check()
    bs = BuildStrategy()
    bs.fuse_all_reduce_ops = True  # Paddle's fusion knobs are accepted
    bs.reduce_strategy = BuildStrategy.ReduceStrategy.Reduce
    bs._check()


def test_execution_strategy_checks():
    es = ExecutionStrategy()
    assert es.num_iteration_per_drop_scope == 100
    es._check()
    es.num_iteration_per_drop_scope = 0
    with pytest.raises(ValueError, match="num_iteration_per_drop_scope"):
        es._check()
    es = ExecutionStrategy()
    es.num_iteration_per_run = 2
    with pytest.raises(ValueError, match="num_iteration_per_run"):
        es._check()
