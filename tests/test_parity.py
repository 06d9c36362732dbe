"""The parity tests' comparison helpers fail on a NaN wherever it sits (first or last value, either side).

Each helper is fed two results that agree except for one NaN; a helper that drops it (``max(0.0, nan)`` is
0.0, ``nan > tol`` is False) would let a run that produced NaN pass its parity test.
"""

import math
import sys
from pathlib import Path

import pytest
import torch
from parity import close, max_abs_diff, worst
from torch import nn

HERE = Path(__file__).resolve().parent
for sub in ("distributed/sharding", "distributed/fleet", "distributed/hybrid"):
    sys.path.insert(0, str(HERE / sub))

import fleet_models  # noqa: E402
import hybrid_models  # noqa: E402
import sharding_helpers  # noqa: E402

NAN = float("nan")


def _states(where):
    """Two equal state dicts of three tensors, the one at ``where`` holding a NaN in ``b``."""
    a = {f"w{i}": torch.full((2, 3), float(i)) for i in range(3)}
    b = {k: v.clone() for k, v in a.items()}
    b[f"w{where}"][1, 2] = NAN
    return a, b


@pytest.mark.parametrize("values", [[NAN, 1.0], [1.0, NAN], [0.0, 2.0, NAN], [torch.tensor(NAN)]])
def test_worst_propagates_nan(values):
    assert math.isnan(worst(values))
    assert not worst(values) <= 1e-5
    assert worst([1.0, 3.0, 2.0]) == 3.0 and worst([]) == 0.0


@pytest.mark.parametrize("where", [0, 1, 2])
def test_max_abs_diff_propagates_nan_from_any_tensor(where):
    a, b = _states(where)
    assert math.isnan(max_abs_diff(a, b)) and math.isnan(max_abs_diff(b, a))
    assert math.isnan(max_abs_diff(list(a.values()), list(b.values())))
    assert not close(a, b, 1e-5)
    assert max_abs_diff(a, a) == 0.0 and close(a, a, 0.0)


def test_max_abs_diff_inf_and_shapes():
    assert max_abs_diff(torch.tensor([1.0, math.inf]), torch.tensor([1.0, 0.0])) == math.inf
    assert math.isnan(max_abs_diff(torch.tensor([math.inf]), torch.tensor([math.inf])))  # inf - inf
    with pytest.raises(AssertionError, match="shapes"):
        max_abs_diff(torch.zeros(3), torch.zeros(1))  # no broadcasting past a shape mismatch
    with pytest.raises(AssertionError, match="missing"):
        max_abs_diff({"a": torch.zeros(1)}, {})


@pytest.mark.parametrize("helper", [sharding_helpers.max_diff, fleet_models.max_diff], ids=["sharding", "fleet"])
@pytest.mark.parametrize("where", [0, 2])
def test_state_dict_max_diff_helpers_propagate_nan(helper, where):
    a, b = _states(where)
    assert math.isnan(helper(a, b)) and math.isnan(helper(b, a))
    assert not helper(a, b) <= 1e-5


def test_tp_max_param_diff_propagates_nan_from_a_later_parameter():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    model.load_state_dict(ref.state_dict())
    assert hybrid_models.max_param_diff(model, ref, None) == 0.0  # unsplit parameters: no hcg needed
    with torch.no_grad():
        model[1].bias[0] = NAN
    assert math.isnan(hybrid_models.max_param_diff(model, ref, None))


def _run():
    weights = {"0.weight": torch.ones(2, 2), "0.bias": torch.zeros(2)}
    return {"history": {"loss": [0.5, 0.4]}, "evaluate": {"loss": 0.3, "acc": 0.5},
            "predict": torch.ones(4, 3), "weights": weights}


@pytest.mark.parametrize("part", ["history", "evaluate", "predict", "weights", "all"])
def test_hybrid_compare_reports_nan_as_a_difference(part):
    ref, got = _run(), _run()
    assert hybrid_models.compare(got, ref) == []
    if part in ("history", "all"):
        got["history"]["loss"] = [0.5, NAN]
    if part in ("evaluate", "all"):
        got["evaluate"]["acc"] = NAN
    if part in ("predict", "all"):
        got["predict"] = torch.full((4, 3), NAN)
    if part in ("weights", "all"):
        got["weights"] = {k: torch.full_like(v, NAN) for k, v in got["weights"].items()}
    bad = hybrid_models.compare(got, ref)
    assert bad, part
    if part == "all":  # a run that is NaN throughout differs everywhere
        assert len(bad) == 1 + 1 + 1 + 2, bad
