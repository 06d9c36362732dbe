"""ModelCheckpoint(keep_last=k, monitor=...) keeps at most k periodic checkpoints plus the current best, whether the
checkpoints are files or DCP directories (``sharded=True``, ``async_save``, hybrid models): a former best is deleted
once another epoch is better and it has left the newest k."""

import os

import pytest
from trainer_helpers import dataset, trainer

from fleetlite.trainer import callbacks as C

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled, unavailable or uninitialized")


class Scripted(C.Callback):
    """Writes a scripted ``score`` into each epoch's logs before ModelCheckpoint reads them."""

    def __init__(self, scores):
        super().__init__()
        self.scores = scores

    def on_epoch_end(self, epoch, logs=None):
        logs["score"] = self.scores[epoch]


# epochs 0-2 improve, 3-4 do not (epoch 2 stays best beyond the newest two), epoch 5 is the new best
SCORES = [5.0, 4.0, 3.0, 3.5, 3.6, 1.0]
IMPROVING = [6.0, 5.0, 4.0, 3.0, 2.0, 1.0]


def _fit(tmp_path, scores, keep_last, **kw):
    ck = C.ModelCheckpoint(str(tmp_path), save_freq=1, keep_last=keep_last, monitor="score", mode="min", **kw)
    trainer().fit(dataset(16), epochs=len(scores), batch_size=8, callbacks=[Scripted(scores), ck], verbose=0)
    return ck


def _checkpoints(root, dirs):
    names = os.listdir(root)
    if dirs:
        return sorted(n for n in names if (root / n).is_dir() and not n.startswith("."))
    return sorted(n[:-3] for n in names if n.startswith("epoch-") and n.endswith(".pt"))


def _best(root, dirs):
    return (root / "best").read_text().strip() if dirs else None


@pytest.mark.parametrize("scores", [SCORES, IMPROVING], ids=["former-best", "improving"])
@pytest.mark.parametrize("keep_last", [1, 2])
@pytest.mark.parametrize("form", ["sharded", "async"])
def test_directories_keep_last_k_plus_current_best_like_files(tmp_path, scores, keep_last, form):
    files = _fit(tmp_path / "files", scores, keep_last)
    kw = {"sharded": True} if form == "sharded" else {"async_save": True}
    dirs = _fit(tmp_path / "dirs", scores, keep_last, **kw)
    n = len(scores)
    best = min(range(n), key=lambda e: (scores[e], e))
    newest = [f"epoch-{e:04d}" for e in range(n - keep_last, n)]
    expected = sorted(set(newest) | {f"epoch-{best:04d}"})
    # the reference: the file form keeps the newest k periodic files (best.pt is its own link)
    assert _checkpoints(tmp_path / "files", dirs=False) == newest
    assert (tmp_path / "files" / "best.pt").is_file()
    # the directory form keeps the newest k and the best, and nothing else
    assert _checkpoints(tmp_path / "dirs", dirs=True) == expected
    assert _best(tmp_path / "dirs", dirs=True) == f"epoch-{best:04d}"
    assert files.best == dirs.best == scores[best]


def test_resumed_run_deletes_the_former_best_it_inherited(tmp_path):
    """Stopped after epoch 3 (epoch 2 is then the best, held past keep_last=1), resumed to epoch 5 (the new best):
    the same directories as the uninterrupted run."""
    _fit(tmp_path / "whole", SCORES, 1, sharded=True)
    first = C.ModelCheckpoint(str(tmp_path / "split"), save_freq=1, keep_last=1, monitor="score", mode="min",
                              sharded=True)
    t = trainer()
    t.fit(dataset(16), epochs=4, batch_size=8, callbacks=[Scripted(SCORES), first], verbose=0)
    assert _checkpoints(tmp_path / "split", dirs=True) == ["epoch-0002", "epoch-0003"]
    again = C.ModelCheckpoint(str(tmp_path / "split"), save_freq=1, keep_last=1, monitor="score", mode="min",
                              sharded=True)
    trainer().fit(dataset(16), epochs=6, batch_size=8, callbacks=[Scripted(SCORES), again], verbose=0,
                  resume="latest")
    assert _checkpoints(tmp_path / "split", dirs=True) == _checkpoints(tmp_path / "whole", dirs=True) == \
        ["epoch-0005"]


def _mp2_checkpoints(rank, world, root):
    import torch
    from hybrid_models import dataset as hybrid_data
    from hybrid_models import init_fleet, tp_net

    import fleetlite
    from fleetlite.distributed import fleet

    torch.set_num_threads(1)
    init_fleet({"dp_degree": 1, "mp_degree": 2, "pp_degree": 1})
    strategy = fleet.user_strategy()
    net = tp_net()
    t = fleetlite.Trainer(net, torch.optim.SGD(net.parameters(), lr=0.1), torch.nn.CrossEntropyLoss(),
                          strategy=strategy, device="cpu")
    ck = C.ModelCheckpoint(root, save_freq=1, keep_last=1, monitor="score", mode="min")
    t.fit(hybrid_data(16, 1), epochs=len(SCORES), batch_size=8, callbacks=[Scripted(SCORES), ck], verbose=0)
    return ck.best_epoch


@pytest.mark.timeout(300)
def test_a_hybrid_models_directories_keep_last_k_plus_current_best(tmp_path):
    import sys

    from fleetlite.testing import run_ranks

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "distributed",
                                    "hybrid"))
    assert run_ranks(_mp2_checkpoints, 2, args=(str(tmp_path),), timeout=240) == [5, 5]
    assert _checkpoints(tmp_path, dirs=True) == ["epoch-0005"]  # the file form keeps epoch-0005.pt and best.pt
