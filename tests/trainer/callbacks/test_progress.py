"""ProgressBar: plain periodic lines off a terminal, a rich bar on one; evaluation line; format helpers."""

import io

from trainer_helpers import dataset, trainer

from fleetlite.trainer.callbacks import ProgressBar
from fleetlite.trainer.callbacks.progress import format_logs


def test_plain_lines_when_not_a_terminal():
    out = io.StringIO()
    trainer().fit(dataset(40), eval_data=dataset(7), epochs=2, batch_size=8, callbacks=[ProgressBar(stream=out)],
                  log_freq=2)
    lines = out.getvalue().splitlines()
    steps = [ln.split(" - ")[0] for ln in lines]
    # the printed label is 1-based as Keras and Paddle print it: the first
    # of two is "Epoch 1/2"; the epoch numbers in logs and checkpoints stay 0-based
    assert steps == ["Epoch 1/2 step 2/5", "Epoch 1/2 step 4/5", "Epoch 1/2 step 5/5", "Epoch 1/2 done",
                     "Epoch 2/2 step 2/5", "Epoch 2/2 step 4/5", "Epoch 2/2 step 5/5", "Epoch 2/2 done"]
    assert "loss: " in lines[0] and "acc_top1: " in lines[0] and "samples/s" in lines[0] and "ETA 0:" in lines[0]
    assert "val_loss: " in lines[3] and "val_acc_top2: " in lines[3]
    assert "\x1b[" not in out.getvalue()  # no terminal escapes in a log file


def test_rich_bar_on_a_terminal_and_eval_line():
    out = io.StringIO()
    t = trainer()
    t.fit(dataset(24), epochs=1, batch_size=8, callbacks=[ProgressBar(stream=out, use_rich=True)])
    text = out.getvalue()
    assert "Epoch 1/1" in text and "3/3" in text and "\x1b[" in text  # drawn by rich
    out = io.StringIO()
    res = t.evaluate(dataset(9), callbacks=[ProgressBar(stream=out)])
    assert out.getvalue().strip() == f"Eval - loss: {res['loss']:.4f} - acc_top1: {res['acc_top1']:.4f} - " \
                                     f"acc_top2: {res['acc_top2']:.4f}"


def test_verbose_zero_prints_nothing(capsys):
    trainer().fit(dataset(16), epochs=1, batch_size=8, verbose=0)
    assert capsys.readouterr().out == ""


def test_format_logs():
    import torch

    assert format_logs({"loss": torch.tensor(0.5), "acc": [0.25, 1.0], "batch_size": 8, "n": 3}) == \
        "loss: 0.5000 - acc: 0.2500/1.0000 - n: 3"
