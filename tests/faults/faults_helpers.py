"""Shared pieces of the fault-tolerance tests: a tiny Trainer, fault-injecting callbacks, rank functions
(module level: run_ranks pickles them by name), and the recipe arguments every launch test uses."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

import fleetlite
from fleetlite.trainer.callbacks import Callback, ModelCheckpoint, Preemption

REPO = Path(__file__).resolve().parents[2]
WRAPPER = Path(__file__).resolve().parent / "fault_recipe.py"
# 512 samples, global batch 64: 8 optimizer steps per epoch, 16 in all; checkpoints every 3 steps
RECIPE_ARGS = ["data=synthetic", "data.train_size=512", "data.test_size=128", "trainer.epochs=2",
               "trainer.global_batch_size=64", "trainer.eval_batch_size=128", "trainer.callbacks.progress=false",
               "trainer.plot=false", "trainer.save_steps=3"]
STEPS = 16


def launch_env(**extra: str) -> dict[str, str]:
    env = {"OMP_NUM_THREADS": "1", "FLEETLITE_COLLECTIVE_TIMEOUT": "30", "PYTHONPATH": str(REPO)}
    env.update(extra)
    return env


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


def final_model(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)["model"]


def assert_bit_identical(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), f"{k} differs (max abs diff {(got[k] - want[k]).abs().max()})"


# -- a tiny Trainer ------------------------------------------------------------------------------------------
def data(n: int = 96, seed: int = 1) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long())


def tiny_trainer(width: int = 16, config=None) -> fleetlite.Trainer:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, width), nn.Tanh(), nn.Dropout(0.1), nn.Linear(width, 3))
    return fleetlite.Trainer(net, torch.optim.Adam(net.parameters(), 0.05), nn.CrossEntropyLoss(), device="cpu",
                             config=config)


def weights(t) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in t.network.state_dict().items()}


class Fault(Callback):
    """On ``rank`` before optimizer step ``step`` + 1: ``kill`` (SIGKILL), ``stop`` (SIGSTOP), ``raise``
    (ValueError) or ``term`` (SIGTERM to itself only); writes the moment to ``stamp`` first."""

    def __init__(self, rank: int, step: int, how: str, stamp: str | None = None):
        super().__init__()
        self.rank, self.step, self.how, self.stamp = rank, step, how, stamp

    def on_train_batch_begin(self, step, logs=None):
        from fleetlite.distributed import get_rank

        if get_rank() != self.rank or self.trainer.global_step != self.step or not self.trainer.at_step_boundary:
            return
        if self.stamp:
            Path(self.stamp).write_text(repr(time.time()))
        if self.how == "term":
            self.step = -1  # once
            os.kill(os.getpid(), signal.SIGTERM)
            return
        if self.how in ("kill", "stop"):
            os.kill(os.getpid(), signal.SIGKILL if self.how == "kill" else signal.SIGSTOP)
        raise ValueError("boom: a fault injected by the test")


# -- rank functions --------------------------------------------------------------------------------------------
def fit_with_fault(rank, world, victim, how, stamp):
    """Fit with a fault on ``victim``; returns (the error's type, message, .lost, when it was caught) or None."""
    from fleetlite.distributed import faults

    t = tiny_trainer()
    try:
        t.fit(data(), epochs=4, batch_size=8, verbose=0, callbacks=[Fault(victim, 3, how, stamp)])
    except Exception as e:  # noqa: BLE001 - the test inspects it
        caught = time.time()
        if how == "stop":  # let the stopped peer go, now that this rank has reported
            os.kill(faults._peers[victim][1], signal.SIGKILL)
        return type(e).__name__, str(e), getattr(e, "lost", None), caught
    return None


def fit_preempted(rank, world, save_dir, term_rank, term_step):
    """A straight fit (the reference); a fit where only ``term_rank`` gets SIGTERM (before step ``term_step`` + 1);
    its resumption to the end. Returns (reference weights, how the 2nd stopped, handler restored, resumed weights)."""
    reference = fit_straight()
    first = tiny_trainer()
    ckpt = ModelCheckpoint(save_dir, save_freq=None)
    first.fit(data(), epochs=3, batch_size=8, verbose=0, save_dir=save_dir,
              callbacks=[ckpt, Preemption(verbose=0, check_interval_s=0), Fault(term_rank, term_step, "term")])
    handler_after = signal.getsignal(signal.SIGTERM)
    stopped = (first.preempted, first.global_step, sorted(p.name for p in Path(save_dir).iterdir()))
    second = tiny_trainer()
    second.fit(data(), epochs=3, batch_size=8, verbose=0, save_dir=save_dir, resume="latest",
               callbacks=[ModelCheckpoint(save_dir, save_freq=None), Preemption(verbose=0)])
    return reference, stopped, handler_after is signal.SIG_DFL, weights(second)


def fit_preempted_default_interval(rank, world, save_dir):
    """Fast steps, the default agreement interval (0.25 s): whenever the stop comes, it is the same on both ranks."""
    t = tiny_trainer()
    t.fit(data(), epochs=3, batch_size=8, verbose=0, save_dir=save_dir,
          callbacks=[ModelCheckpoint(save_dir, save_freq=None), Preemption(verbose=0), Fault(1, 2, "term")])
    return t.preempted, t.global_step


def fit_straight(rank=0, world=1):
    t = tiny_trainer()
    t.fit(data(), epochs=3, batch_size=8, verbose=0)
    return weights(t)


def fit_with_own_width(rank, world):
    t = tiny_trainer(width=16 if rank == 0 else 12)
    try:
        t.fit(data(), epochs=1, batch_size=8, verbose=0)
    except Exception as e:  # noqa: BLE001
        return type(e).__name__, str(e), t.global_step
    return None


def fit_with_own_config(rank, world):
    t = tiny_trainer(config={"optim": {"lr": 0.05, "name": "adam"}, "seed": rank})
    try:
        t.fit(data(), epochs=1, batch_size=8, verbose=0)
    except Exception as e:  # noqa: BLE001
        return type(e).__name__, str(e), t.global_step
    return None


def fit_with_agreed_config(rank, world):
    """The recipe hands the Trainer a config its preflight already compared (AgreedConfig): no second
    comparison, so ranks holding different per-rank values in it (as a test can fake) fit without a collective
    over the config, and the checkpointed config is a plain dict."""
    from fleetlite.trainer.config import AgreedConfig

    t = tiny_trainer(config=AgreedConfig({"optim": {"lr": 0.05, "name": "adam"}, "seed": rank}))
    t.fit(data(), epochs=1, batch_size=8, verbose=0)
    return t.global_step, type(t.config).__name__


def fit_dying_in_a_save(save_dir: str) -> None:
    """Fit with a checkpoint every 2 steps; the process is SIGKILLed halfway through writing its second one.

    Run in a subprocess: ``python -c "import faults_helpers as h; h.fit_dying_in_a_save(DIR)"``.
    """
    import io

    real_save, calls = torch.save, []

    def save(obj, f, *args, **kwargs):
        calls.append(1)
        if len(calls) < 2:
            return real_save(obj, f, *args, **kwargs)
        buf = io.BytesIO()
        real_save(obj, buf, *args, **kwargs)
        f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
        f.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    torch.save = save
    t = tiny_trainer()
    t.fit(data(), epochs=2, batch_size=8, verbose=0, callbacks=[ModelCheckpoint(save_dir, save_freq=None,
                                                                                save_steps=2)])
