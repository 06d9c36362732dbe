"""ParallelExecutor with num_trainers=2: 2 processes (gloo) x CPU_NUM=2 replicas, against one torch device."""

import pytest
import torch
import torch.nn.functional as F

from fleetlite.testing import run_ranks


class FlagNet(torch.nn.Module):
    """``extra`` is used only when a flagged sample is on the device: on one replica of one trainer."""

    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.fc = torch.nn.Linear(5, 3)
        self.extra = torch.nn.Parameter(torch.randn(3))
        self.never = torch.nn.Parameter(torch.ones(2))

    def forward(self, x, y, flag):
        logits = self.fc(x)
        if flag.any():
            logits = logits + self.extra * flag[:, None]
        return {"logits": logits, "loss": F.cross_entropy(logits, y)}


def _global_batch(step):
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(8, 5, generator=g), torch.randint(0, 3, (8,), generator=g)
    flag = torch.zeros(8)
    flag[7] = 1.0  # only trainer 1's second replica sees it
    return x, y, flag


def _opt(net):
    return torch.optim.AdamW(net.parameters(), lr=0.05, weight_decay=0.1)


def _train(rank, world_size):
    from fleetlite.static import ParallelExecutor, Program

    net = FlagNet(seed=100 + rank)  # different on each trainer: the executor starts from trainer 0's values
    exe = ParallelExecutor(False, loss_name="loss", main_program=Program(net, _opt(net)),
                           num_trainers=world_size, trainer_id=rank)
    assert exe.device_count == 2
    losses = []
    for step in range(3):
        x, y, flag = _global_batch(step)
        part = slice(rank * 4, rank * 4 + 4)
        (loss,) = exe.run(["loss"], feed={"x": x[part], "y": y[part], "flag": flag[part]})
        losses.append(loss.tolist())
    return {
        "params": {n: p.detach().clone() for n, p in net.named_parameters()},
        "grads": {n: None if p.grad is None else p.grad.clone() for n, p in net.named_parameters()},
        "losses": losses,
    }


@pytest.mark.timeout(90)
def test_two_trainers_equal_one_device_on_the_global_batch():
    out = run_ranks(_train, world_size=2, env={"CPU_NUM": "2"}, timeout=80)
    ref = FlagNet(seed=100)
    opt = _opt(ref)
    for step in range(3):
        x, y, flag = _global_batch(step)
        opt.zero_grad(set_to_none=True)
        loss = ref(x, y, flag)["loss"]
        loss.backward()
        opt.step()
        mean = sum(sum(r["losses"][step]) for r in out) / 4  # 4 devices, 2 samples each
        assert abs(mean - loss.item()) < 1e-6
    for rank, r in enumerate(out):
        for n, q in ref.named_parameters():
            torch.testing.assert_close(r["params"][n], q.detach(), rtol=0, atol=1e-6,
                                       msg=f"trainer {rank}, parameter {n}")
            if q.grad is None:
                assert r["grads"][n] is None, f"trainer {rank}: {n} got no gradient anywhere, grad must stay None"
            else:
                torch.testing.assert_close(r["grads"][n], q.grad, rtol=0, atol=1e-6)
    assert ref.extra.grad is not None and ref.never.grad is None  # the test covers both cases


def _mismatch(rank, world_size):
    from fleetlite.static import ParallelExecutor, Program

    net = torch.nn.Linear(4, 2 + rank)

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x):
            return {"out": self.net(x)}

    exe = ParallelExecutor(False, main_program=Program(Wrap()), num_trainers=world_size, trainer_id=rank)
    exe.run(["out"], feed={"x": torch.randn(4, 4)})


@pytest.mark.timeout(90)
def test_different_models_on_the_trainers_fail_clearly_on_every_rank():
    got = run_ranks(_mismatch, world_size=2, env={"CPU_NUM": "2"}, timeout=80, expect_failure=True)
    for rank in (0, 1):
        status, text = got[rank]
        assert status == "error" and "the model differs across ranks" in text and "rank 1" in text, (rank, text)
