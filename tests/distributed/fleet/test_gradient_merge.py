"""The gradient-merge window on its own (Note [gradient merge window]): counted by step() alone, driven by a
loop (early close at an epoch end, the loss scaled instead of the gradients), and its model sync flags."""

import torch

from fleetlite.distributed.fleet.gradient_merge import GradientMerge


class _Model:
    require_backward_grad_sync = True


def test_alone_step_counts_micro_batches_and_switches_sync():
    merge, model = GradientMerge(k=3), _Model()
    merge.attach(model)
    seen = []
    for _ in range(6):
        seen.append((model.require_backward_grad_sync, merge.on_step(), merge.holding))
    assert seen == [(False, False, True), (False, False, True), (True, True, False)] * 2
    assert merge.grad_divisor == 3 and merge.scale_loss(torch.tensor(3.0)) == 3.0  # alone: the step divides


def test_driven_window_closes_early_and_scales_the_loss():
    merge, model = GradientMerge(k=1), _Model()
    merge.attach(model)
    closes = []
    with merge.driven(k=3, avg=True):
        assert merge.grad_divisor == 1 and merge.scale_loss(torch.tensor(3.0)) == 1.0
        for i in range(5):  # 5 micro-batches: a full window, then one closed early by the epoch end
            boundary = merge.begin(last=i == 4)
            closes.append((boundary, model.require_backward_grad_sync))
            if boundary:
                assert merge.on_step() and not merge.holding
            else:
                assert not merge.on_step() and merge.holding
            merge.end()
        assert merge.micro == 0
    assert closes == [(False, False), (False, False), (True, True), (False, False), (True, True)]
    assert (merge.k, merge.is_driven, model.require_backward_grad_sync) == (1, False, True)  # settings back


def test_flush_closes_a_window_left_open():
    merge = GradientMerge(k=4)
    with merge.driven():
        merge.begin()
        merge.end()
        assert merge.micro == 1
        merge.flush([])  # one process: nothing to all-reduce
        assert merge.on_step() and merge.micro == 0
