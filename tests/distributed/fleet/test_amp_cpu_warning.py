"""AMP on a CPU device warns once, also through the plain fleet API, not only the Trainer."""

import pytest
import torch

from fleetlite.distributed import fleet
from fleetlite.utils import user_warning


def test_distributed_model_with_amp_on_a_cpu_model_warns_once(single, monkeypatch):
    monkeypatch.setattr(user_warning, "_SEEN", set())
    single(amp=True, amp_configs={"dtype": "bfloat16"})
    with pytest.warns(UserWarning, match=r"strategy.amp is on with a CPU device.*7\.5x") as record:
        fleet.distributed_model(torch.nn.Linear(4, 2))
    assert record[0].filename == __file__  # the user's line, not fleetlite's
    with _no_warning():
        fleet.distributed_model(torch.nn.Linear(4, 2))  # once per process


def test_no_warning_without_amp(single, monkeypatch):
    monkeypatch.setattr(user_warning, "_SEEN", set())
    single()
    with _no_warning():
        fleet.distributed_model(torch.nn.Linear(4, 2))


class _no_warning:
    def __enter__(self):
        import warnings

        self._cm = warnings.catch_warnings(record=True)
        self.record = self._cm.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self._cm.__exit__(*exc)
        assert not [w for w in self.record if "CPU device" in str(w.message)], [str(w.message) for w in self.record]
