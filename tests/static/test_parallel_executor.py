"""ParallelExecutor on CPU_NUM=2 CPU replicas, against a plain single-device torch reference."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fleetlite.static import BuildStrategy, ExecutionStrategy, ParallelExecutor, Program


@pytest.fixture(autouse=True)
def _two_cpus(monkeypatch):
    monkeypatch.setenv("CPU_NUM", "2")


class Net(torch.nn.Module):
    """A small classifier; ``unused`` never gets a gradient (the optimizer must skip it, as in plain torch)."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = torch.nn.Linear(6, 8)
        self.fc2 = torch.nn.Linear(8, 3)
        self.unused = torch.nn.Parameter(torch.ones(2))
        self.frozen = torch.nn.Parameter(torch.ones(1), requires_grad=False)

    def forward(self, x, y):
        logits = self.fc2(torch.tanh(self.fc1(x)))
        return {"logits": logits, "loss": F.cross_entropy(logits, y), "n": torch.tensor(x.shape[0])}


def _batch(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def _adam(net):
    return torch.optim.AdamW(net.parameters(), lr=0.05, weight_decay=0.1)


def test_split_rule_and_fetch_concatenation():
    net = Net()
    exe = ParallelExecutor(False, main_program=Program(net))
    assert exe.device_count == 2
    x, y = _batch(3)
    n, logits = exe.run(["n", "logits"], feed={"x": x, "y": y})
    assert n.tolist() == [1, 2]  # Paddle's split: 3 samples on 2 devices -> [0] and [1, 2]
    assert isinstance(logits, np.ndarray) and logits.shape == (3, 3)
    with torch.no_grad():
        np.testing.assert_allclose(logits, net(x, y)["logits"].numpy(), rtol=0, atol=1e-6, equal_nan=False)
    x, y = _batch(7)
    n, logits = exe.run(["n", "logits"], feed={"x": x, "y": y}, return_numpy=False)
    assert n.tolist() == [3, 4] and isinstance(logits, torch.Tensor) and logits.shape == (7, 3)


def test_list_feed_gives_one_dict_per_device_as_is():
    exe = ParallelExecutor(False, main_program=Program(Net()))
    (a, b), (c, d) = _batch(1), _batch(4, seed=2)
    (n,) = exe.run(["n"], feed=[{"x": a, "y": b}, {"x": c, "y": d}])
    assert n.tolist() == [1, 4]
    with pytest.raises(ValueError, match="one dict per device"):
        exe.run(["n"], feed=[{"x": a, "y": b}])


def test_too_few_samples_is_a_clear_error():
    exe = ParallelExecutor(False, main_program=Program(Net()))
    x, y = _batch(1)
    with pytest.raises(ValueError, match=r"1 sample\(s\).*2 devices.*drop_last=True"):
        exe.run(["loss"], feed={"x": x, "y": y})
    with pytest.raises(ValueError, match="scalar"):
        exe.run(["loss"], feed={"x": torch.tensor(1.0)})


def test_training_on_two_replicas_equals_single_device_steps_on_the_whole_batch():
    ref = Net()
    net = copy.deepcopy(ref)
    ref_opt = _adam(ref)
    exe = ParallelExecutor(False, loss_name="loss", main_program=Program(net, _adam(net)))
    for step in range(3):
        x, y = _batch(8, seed=10 + step)
        (loss,) = exe.run(["loss"], feed={"x": x, "y": y})
        ref_opt.zero_grad(set_to_none=True)
        ref_loss = ref(x, y)["loss"]
        ref_loss.backward()
        ref_opt.step()
        assert loss.shape == (2,)
        assert abs(loss.mean() - ref_loss.item()) < 1e-6  # mean of two half-batch means = whole-batch mean
        for (name, p), q in zip(net.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p, q, rtol=0, atol=1e-6, msg=f"parameter {name} after step {step}")
            if q.grad is None:
                assert p.grad is None, f"{name} got no gradient in torch, the executor must leave grad=None"
            else:
                torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=1e-6)
    assert torch.equal(net.unused, torch.ones(2))  # skipped by AdamW (no weight decay applied), as in torch


def test_gradient_scale_one_sums_device_gradients():
    ref = Net()
    net = copy.deepcopy(ref)
    bs = BuildStrategy()
    bs.gradient_scale_strategy = BuildStrategy.GradientScaleStrategy.One
    bs.fuse_grad_size_in_MB = 0.0002  # several buckets
    exe = ParallelExecutor(False, loss_name="loss", main_program=Program(net, torch.optim.SGD(net.parameters(), 0.0)),
                           build_strategy=bs)
    x, y = _batch(6)
    exe.run([], feed={"x": x, "y": y})
    ref(x, y)["loss"].backward()
    for p, q in zip(net.fc1.parameters(), ref.fc1.parameters()):
        torch.testing.assert_close(p.grad, 2 * q.grad, rtol=0, atol=1e-6)


def test_share_vars_from_sees_updated_parameters():
    net = Net()
    prog = Program(net, _adam(net))
    train = ParallelExecutor(False, loss_name="loss", main_program=prog)
    with pytest.raises(RuntimeError, match="has not run yet"):
        ParallelExecutor(False, main_program=prog.clone(for_test=True), share_vars_from=train)
    x, y = _batch(8)
    train.run(["loss"], feed={"x": x, "y": y})
    same = ParallelExecutor(False, main_program=prog.clone(for_test=True), share_vars_from=train)
    other_module = Net(seed=5)  # a separate module with the same names: its parameters are bound to train's
    other = ParallelExecutor(False, main_program=Program(other_module), share_vars_from=train)
    for _ in range(2):
        (lg1,) = same.run(["logits"], feed={"x": x, "y": y})
        (lg2,) = other.run(["logits"], feed={"x": x, "y": y})
        with torch.no_grad():
            expect = net(x, y)["logits"].numpy()
        np.testing.assert_allclose(lg1, expect, rtol=0, atol=1e-6, equal_nan=False)
        np.testing.assert_allclose(lg2, expect, rtol=0, atol=1e-6, equal_nan=False)
        train.run(["loss"], feed={"x": x, "y": y})  # the next evaluation must see this step
    with pytest.raises(ValueError, match="evaluation executors"):
        ParallelExecutor(False, loss_name="loss", main_program=prog, share_vars_from=train)


def test_drop_local_exe_scopes_keeps_results_unchanged():
    nets = [Net() for _ in range(3)]
    es = ExecutionStrategy()
    es.num_iteration_per_drop_scope = 1  # drops after every run
    exes = [ParallelExecutor(False, loss_name="loss", main_program=Program(n, _adam(n)),
                             exec_strategy=es if i == 2 else None) for i, n in enumerate(nets)]
    for step in range(3):
        x, y = _batch(6, seed=step)
        outs = [e.run(["loss", "logits"], feed={"x": x, "y": y}) for e in exes]
        exes[1].drop_local_exe_scopes()
        for out in outs[1:]:
            for a, b in zip(outs[0], out):
                np.testing.assert_allclose(a, b, rtol=0, atol=0, equal_nan=False)
    for n in nets[1:]:
        for p, q in zip(nets[0].parameters(), n.parameters()):
            assert torch.equal(p, q)


def test_replicas_follow_changes_to_the_module_between_runs():
    net, other = Net(), Net(seed=3)
    exe = ParallelExecutor(False, main_program=Program(net))
    x, y = _batch(4)
    exe.run(["logits"], feed={"x": x, "y": y})
    net.load_state_dict(other.state_dict())
    with torch.no_grad():
        net.fc2.bias.data.add_(1.0)  # a .data write is seen too
        other.fc2.bias.add_(1.0)
        expect = other(x, y)["logits"].numpy()
    (logits,) = exe.run(["logits"], feed={"x": x, "y": y})
    # rows 2..3 come from the second replica
    np.testing.assert_allclose(logits, expect, rtol=0, atol=1e-6, equal_nan=False)


def test_for_test_program_runs_in_eval_mode_and_restores_the_mode():
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5), torch.nn.BatchNorm1d(4))

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = net

        def forward(self, x):
            return {"out": self.body(x)}

    module = Wrap()
    exe = ParallelExecutor(False, main_program=Program(module).clone(for_test=True))
    x = torch.randn(6, 4)
    (out,) = exe.run(["out"], feed={"x": x})
    assert module.training and net[1].training
    with torch.no_grad():
        expect = module.eval()(x)["out"].numpy()
    np.testing.assert_allclose(out, expect, rtol=0, atol=1e-6, equal_nan=False)


def test_cpu_num_defaults_to_one_and_bad_values_are_errors(monkeypatch):
    monkeypatch.delenv("CPU_NUM")
    exe = ParallelExecutor(False, main_program=Program(Net()))
    assert exe.device_count == 1
    import os

    assert os.environ["CPU_NUM"] == "1"
    monkeypatch.setenv("CPU_NUM", "two")
    with pytest.raises(ValueError, match="CPU_NUM"):
        ParallelExecutor(False, main_program=Program(Net()))


def test_run_errors_name_the_problem():
    exe = ParallelExecutor(False, loss_name="loss", main_program=Program(Net(), None))
    x, y = _batch(4)
    with pytest.raises(KeyError, match="nope"):
        exe.run(["nope"], feed={"x": x, "y": y})
    with pytest.raises(ValueError, match="not both"):
        exe.run(["loss"], feed={"x": x, "y": y}, feed_dict={"x": x})
    with pytest.raises(TypeError, match="fetch_list"):
        exe.run([1], feed={"x": x, "y": y})

    class NotDict(torch.nn.Module):
        def forward(self, x):
            return x

    with pytest.raises(TypeError, match="dict of named tensors"):
        ParallelExecutor(False, main_program=Program(NotDict())).run(["x"], feed={"x": x})

    class VectorLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(6, 1)

        def forward(self, x):
            return {"loss": self.fc(x)}

    m = VectorLoss()
    bad = ParallelExecutor(False, loss_name="loss", main_program=Program(m, torch.optim.SGD(m.parameters(), 0.1)))
    with pytest.raises(ValueError, match="scalar"):
        bad.run(["loss"], feed={"x": x})
    with pytest.raises(ValueError, match="scope"):
        ParallelExecutor(False, main_program=Program(Net()), scope=object())
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="use_cuda=False"):
            ParallelExecutor(True, main_program=Program(Net()))


def test_num_trainers_without_matching_processes_is_a_clear_error(clean_dist_env):
    with pytest.raises(RuntimeError, match="world size 1.*fleetlite launch"):
        ParallelExecutor(False, main_program=Program(Net()), num_trainers=2, trainer_id=0)
    with pytest.raises(ValueError, match="trainer_id"):
        ParallelExecutor(False, main_program=Program(Net()), num_trainers=2, trainer_id=2)


def test_a_discarded_executor_leaves_no_hooks_on_the_module():
    import gc

    net = Net()
    exe = ParallelExecutor(False, loss_name="loss", main_program=Program(net, _adam(net)))
    x, y = _batch(4)
    exe.run([], feed={"x": x, "y": y})
    assert len(net.fc1.weight._post_accumulate_grad_hooks or {}) == 1
    del exe
    gc.collect()
    assert not net.fc1.weight._post_accumulate_grad_hooks
