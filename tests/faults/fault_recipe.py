"""recipes/cifar10.py with a fault injected, for the fault-tolerance tests (run through `fleetlite launch`).

Environment:
    FAULT          kill | raise | enospc | none (default none); enospc: the checkpoint save after FAULT_STEP
                   successful ones writes half its bytes and fails with "No space left on device"
    FAULT_RANK     the rank that fails (default 1)
    FAULT_STEP     it fails before optimizer step FAULT_STEP + 1 (default 3)
    FAULT_RESTART  only in this elastic restart (default 0: the first attempt)
    FAULT_DIR      where to write pid-<rank> (every worker), killed-at (the victim, just before failing),
                   step (rank 0: the last finished optimizer step) and caught-at (a rank that saw an error)
    FAULT_SLEEP    seconds to sleep after each optimizer step on rank 0 (time for a test to send a signal)
    FAULT_HOLD     STEP:SIGNAL, e.g. 4:SIGTERM: rank 0 waits after optimizer step STEP until it has received
                   SIGNAL (the test sends it once `step` says STEP), so the signal comes before training ends
                   whatever the machine's load
"""

import os
import runpy
import signal
import sys
import time
from pathlib import Path

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "cifar10.py"
OUT = Path(os.environ.get("FAULT_DIR", "."))


def _write(name: str, text: str) -> None:
    tmp = OUT / f".{name}.tmp{os.getpid()}"
    tmp.write_text(text)
    os.replace(tmp, OUT / name)


def _catch(signum: int):
    """Note each ``signum`` from now on (then passed on to the handler there was); returns the notes list."""
    got, before = [], signal.getsignal(signum)

    def note(sig, frame):
        got.append(sig)
        if callable(before):
            before(sig, frame)

    signal.signal(signum, note)
    return got, signum, before


def _wait_for(caught, timeout: float = 300.0) -> None:
    """Block until the signal ``caught`` notes has come (or ``timeout`` s), then put its handler back."""
    got, signum, before = caught
    deadline = time.monotonic() + timeout
    try:
        while not got and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        signal.signal(signum, before)


def _injector():
    from fleetlite.callbacks import Callback
    from fleetlite.distributed import get_rank

    how = os.environ.get("FAULT", "none")
    victim, at = int(os.environ.get("FAULT_RANK", "1")), int(os.environ.get("FAULT_STEP", "3"))
    armed = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == os.environ.get("FAULT_RESTART", "0")
    pause = float(os.environ.get("FAULT_SLEEP", "0"))
    hold_step, _, hold_signal = os.environ.get("FAULT_HOLD", "-1:").partition(":")

    class Inject(Callback):
        def on_train_begin(self, logs=None):
            _write(f"pid-{get_rank()}", str(os.getpid()))

        def on_train_batch_begin(self, step, logs=None):
            t = self.trainer
            if how not in ("kill", "raise") or not armed or get_rank() != victim or t.global_step != at:
                return
            _write("killed-at", repr(time.time()))
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise ValueError("boom: a fault injected by the test")

        def on_train_batch_end(self, step, logs=None):
            if get_rank() == 0 and self.trainer.at_step_boundary:
                hold = self.trainer.global_step == int(hold_step)
                caught = _catch(getattr(signal, hold_signal)) if hold else None  # before the test can see `step`
                _write("step", str(self.trainer.global_step))
                time.sleep(pause)
                if caught:
                    _wait_for(caught)

    return Inject()


def _disk_fills_up() -> None:
    import errno

    import torch

    real_save, saves = torch.save, []

    def save(obj, f, *args, **kwargs):
        if len(saves) < int(os.environ.get("FAULT_STEP", "3")):
            saves.append(1)
            return real_save(obj, f, *args, **kwargs)
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device")

    torch.save = save


def main() -> None:
    import fleetlite.recipe.build as build

    if os.environ.get("FAULT") == "enospc":
        _disk_fills_up()

    original = build.build_callbacks
    build.build_callbacks = lambda *a, **k: [*original(*a, **k), _injector()]
    sys.argv[0] = str(RECIPE)
    try:
        runpy.run_path(str(RECIPE), run_name="__main__")
    except BaseException:  # Hydra reports an error and exits with SystemExit(1)
        _write(f"caught-at-{os.environ.get('RANK', '0')}", repr(time.time()))
        raise


if __name__ == "__main__":
    main()
