"""A resume runs through at most five modules: trainer -> fit_setup -> checkpoint_connector ->
fleetlite.checkpoint -> fit_loop. Traced while the checkpoint is read and put back: the trainer modules whose
functions run, and every call into the checkpoint code with the fleetlite modules on its stack (the package
fleetlite.checkpoint counts as one; what a callback's own ``on_train_begin`` does, e.g. ModelCheckpoint checking its
directory, is the callback's)."""

import sys

from trainer_helpers import NoisyDataset, dataset, trainer

from fleetlite.trainer import callbacks as C

RESUME = {"fleetlite.trainer.trainer", "fleetlite.trainer.fit_setup", "fleetlite.trainer.checkpoint_connector",
          "fleetlite.checkpoint", "fleetlite.trainer.fit_loop"}

# objects restoring their own state (load_state_dict, on_train_begin, load_position), called by the resume
OWNERS = ("fleetlite.trainer.callbacks", "fleetlite.trainer.data_adapter", "fleetlite.trainer.metrics")


def _fit(save_dir, resume):
    t = trainer(dropout=0.3)
    t.fit(NoisyDataset(37), eval_data=dataset(9), epochs=2, batch_size=8, verbose=0, resume=resume,
          callbacks=[C.ModelCheckpoint(str(save_dir), save_freq=None, save_steps=2)],
          num_iters=3 if resume is None else None)


def _module(frame) -> str:
    name = frame.f_globals.get("__name__", "")
    return "fleetlite.checkpoint" if name.startswith("fleetlite.checkpoint") else name


def test_a_resume_visits_at_most_five_modules(tmp_path):
    _fit(tmp_path, None)
    seen, depth = set(), [0]

    def outer(frame):
        return frame.f_code.co_name in ("read", "restore") and _module(frame).endswith("checkpoint_connector")

    def profile(frame, event, arg):
        if event == "return" and outer(frame):
            depth[0] -= 1
        if event != "call":
            return
        depth[0] += outer(frame)
        if not depth[0]:
            return
        if _module(frame).startswith("fleetlite.trainer") and not _module(frame).startswith(OWNERS):
            seen.add(_module(frame))  # resume code, not an object restoring its own state
        if _module(frame) in ("fleetlite.checkpoint", "fleetlite.trainer.checkpoint_connector"):
            stack, f = set(), frame
            while f is not None:
                if _module(f).startswith("fleetlite"):
                    stack.add(_module(f))
                f = f.f_back
            if not any(m.startswith("fleetlite.trainer.callbacks") for m in stack):  # a callback's own hook
                seen.update(stack)

    sys.setprofile(profile)
    try:
        _fit(tmp_path, "latest")
    finally:
        sys.setprofile(None)
    assert seen == RESUME
