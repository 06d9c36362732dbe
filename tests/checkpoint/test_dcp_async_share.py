"""An async save of a replicated state stages only the tensors this rank writes (Note [stage only this rank's
share]) and still holds the whole state."""

import pytest
import torch

from fleetlite.testing import run_ranks


def _state(rank):
    g = torch.Generator().manual_seed(0)  # replicated: the same tensors on every rank
    model = {f"{i}.weight": torch.randn(8, 8 + i, generator=g) for i in range(5)}
    optim = {"state": {k: {"exp_avg": torch.randn(v.shape, generator=g), "step": torch.tensor(3.0)}
                       for k, v in model.items()},
             "param_groups": [{"lr": 0.1, "params": sorted(model)}]}
    extra = {"rows": [torch.full((2,), 7.0)],  # in a list: kept on every rank
             "odd": torch.full((rank + 1,), float(rank))}  # another shape on each rank: left to DCP
    if rank == 1:
        extra["only1"] = torch.arange(4.0)  # held by one rank
    return {"model": model, "optim": optim, "extra": extra}


def _share(rank, world, root):
    import fleetlite.checkpoint as ckpt
    from fleetlite.checkpoint.dcp import _ckpt_group, _plain_tensors

    state = _state(rank)
    share = ckpt.own_share(state, _ckpt_group())
    kept = {p for p, _ in _plain_tensors(share)}
    ckpt.save(state, f"{root}/ck", async_save=True).wait()
    return kept, {p for p, _ in _plain_tensors(state)}


@pytest.mark.timeout(120)
def test_async_save_of_a_replicated_state_stages_each_tensor_on_one_rank(tmp_path, clean_dist_env):
    import fleetlite.checkpoint as ckpt
    from fleetlite.checkpoint import dcp

    (kept0, all0), (kept1, all1) = run_ranks(_share, args=(str(tmp_path),), timeout=100)
    replicated = (all0 & all1) - {("extra", "odd")}
    assert kept0 & kept1 == {("extra", "odd")}  # each replicated tensor is staged by exactly one rank
    assert replicated <= kept0 | kept1 and ("extra", "only1") in kept1
    sizes = [sum(_size(_state(0), p) for p in kept & replicated) for kept in (kept0, kept1)]
    assert abs(sizes[0] - sizes[1]) <= max(sizes) // 2  # balanced by bytes
    full = _state(1)
    for key in ("model", "optim"):
        weights = ckpt.load_full(tmp_path / "ck", key=key)
        flat = {".".join(map(str, p[1:])): t for p, t in dcp._plain_tensors(full) if p[0] == key}
        assert set(weights) == set(flat) and all(torch.equal(weights[k], flat[k]) for k in flat)
    rows = ckpt.load_full(tmp_path / "ck", key="extra")
    assert torch.equal(rows["only1"], torch.arange(4.0)) and torch.equal(rows["rows.0"], torch.full((2,), 7.0))


def _size(state, path):
    for k in path:
        state = state[k]
    return state.numel() * state.element_size()
