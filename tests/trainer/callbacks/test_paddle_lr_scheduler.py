"""Paddle's ``LRScheduler`` under ``Model.fit(accumulate_grad_batches=k)``.

Paddle's rule (``python/paddle/hapi/callbacks.py``): ``LRScheduler.on_train_batch_end`` steps the optimizer's
scheduler whenever ``by_step`` is set, and ``Model.fit`` calls it after every *batch*, also inside an
accumulation window (``model.py`` ``_run_one_epoch``). So with k-batch accumulation the scheduler steps k times per
optimizer step, and the rate an optimizer step uses is the one after the batches before it.
"""

import pytest
import torch
from test_model import MyDataset, _model

from fleetlite.callbacks import Callback


class LrAtStep(Callback):
    """The learning rate each batch ran with (read before the batch)."""

    def __init__(self):
        super().__init__()
        self.lrs = []

    def on_train_batch_begin(self, step, logs=None):
        self.lrs.append(self.trainer.user_optimizer.param_groups[0]["lr"])


@pytest.mark.parametrize("k", [1, 2, 5])
def test_per_batch_schedule_under_accumulation(k):
    model, _ = _model(lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(model._optimizer, step_size=1, gamma=0.5)
    seen = LrAtStep()
    model.fit(MyDataset(40), batch_size=8, epochs=2, verbose=0, accumulate_grad_batches=k, callbacks=[seen])
    batches = 2 * 5
    assert sched.last_epoch == batches  # Paddle: one step per batch, whatever k
    assert seen.lrs == pytest.approx([0.1 * 0.5 ** i for i in range(batches)])
