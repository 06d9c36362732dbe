"""FitState: the progress of a fit in one object, saved and loaded as the checkpoint's entries."""

import torch
from trainer_helpers import dataset, trainer

from fleetlite.trainer.fit_loop import FitState


def test_state_dict_round_trip_and_running_sums():
    st = FitState(epoch=2, global_step=7, batch_in_epoch=3, epoch_finished=True)
    again = FitState()
    again.load_state_dict(st.state_dict())
    assert (again.epoch, again.global_step, again.batch_in_epoch, again.epoch_finished) == (2, 7, 3, True)
    st.start_epoch(3, metrics=[])
    assert (st.epoch, st.batch_in_epoch, st.epoch_finished, st.count) == (3, 0, False, 0)
    assert float(st.add_batch(torch.tensor(1.0), 2)) == 1.0 and float(st.add_batch(torch.tensor(4.0), 1)) == 2.0
    assert st.sums().tolist() == [6.0, 3.0]
    assert st.rank_state_dict([])["train_accum"] == {"loss_sum": 6.0, "count": 3, "metrics": []}


def test_trainer_progress_is_read_only_and_lives_in_fit_state():
    t = trainer()
    t.fit(dataset(20), epochs=2, batch_size=8, accumulate_grad_batches=2, verbose=0)
    assert (t.epoch, t.global_step, t.epoch_finished, t.fitting) == (1, 4, True, False)
    assert t.global_step is t.fit_state.global_step and t.fit_state.accumulate == 2
    try:
        t.global_step = 0
    except AttributeError:
        pass
    else:
        raise AssertionError("trainer.global_step must be read-only")


def test_progress_round_trips_every_field():
    from dataclasses import fields

    from fleetlite.trainer.fit_loop import FitProgress

    values = {"epoch": 3, "global_step": 11, "batch_in_epoch": 2, "epoch_finished": True, "pass_done": True,
              "accumulate_grad_batches": 4}
    assert {f.name for f in fields(FitProgress)} == set(values)  # a new field must be added here too
    saved = FitState(**values).state_dict()
    assert saved == values  # exactly the fields: nothing else (no running sums, no data) goes in
    again = FitState()
    again.load_state_dict(saved)
    assert {f.name: getattr(again, f.name) for f in fields(FitProgress)} == values
