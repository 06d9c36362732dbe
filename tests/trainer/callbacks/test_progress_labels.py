"""The progress lines number epochs from 1 as Keras and Paddle print them;
the epoch numbers elsewhere (History, callback arguments, the run log's label) stay 0-based."""

import io

from trainer_helpers import dataset, trainer

from fleetlite.trainer.callbacks import Callback, ProgressBar
from fleetlite.trainer.callbacks.progress import display_epoch_label, epoch_label


class Seen(Callback):
    def __init__(self):
        super().__init__()
        self.epochs = []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(epoch)


def test_printed_label_is_one_based_and_epoch_numbers_stay_zero_based():
    out, seen = io.StringIO(), Seen()
    history = trainer().fit(dataset(16), epochs=3, batch_size=8, callbacks=[ProgressBar(stream=out), seen])
    done = [ln.split(" - ")[0] for ln in out.getvalue().splitlines() if " done" in ln]
    assert done == ["Epoch 1/3 done", "Epoch 2/3 done", "Epoch 3/3 done"]  # Keras: "Epoch 1/3"
    assert history.epoch == [0, 1, 2] and seen.epochs == [0, 1, 2]
    assert display_epoch_label(0, 10) == "Epoch 1/10" and epoch_label(0, 10) == "Epoch 0/9"
    assert display_epoch_label(4, None) == "Epoch 5/?"
