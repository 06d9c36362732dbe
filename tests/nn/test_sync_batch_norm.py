"""SyncBatchNorm on CPU/gloo against single-process batch norm on the concatenated batch."""

import pytest
import torch
import torch.distributed as td
from torch import nn

from fleetlite.nn import SyncBatchNorm, convert_sync_batchnorm
from fleetlite.testing import run_ranks


def _full_batch(shape_per_rank, sizes):
    g = torch.Generator().manual_seed(7)
    # a large offset makes E[x^2]-E[x]^2 style variance visibly wrong; the merge must stay exact
    return [torch.randn(n, *shape_per_rank, generator=g) * 3 + 50 for n in sizes]


def _compare(rank, world, dims, sizes, momentum):
    channels = 4
    shape = (channels,) + (5,) * (dims - 2)
    parts = _full_batch(shape, sizes)
    ref_cls = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d}[dims]
    torch.manual_seed(0)
    ref = ref_cls(channels, momentum=momentum)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
        ref.bias.uniform_(-0.5, 0.5)
    sync = convert_sync_batchnorm(nn.Sequential(ref_cls(channels, momentum=momentum)))[0]
    sync.load_state_dict(ref.state_dict())
    assert type(sync) is SyncBatchNorm
    out = {}
    for step in range(2):  # two steps: the running statistics compound
        xs = [p.clone().requires_grad_() + step for p in parts]
        xs = [x.detach().requires_grad_() for x in xs]
        y_ref = ref(torch.cat(xs))
        # global objective: sum of each rank's mean loss (what each rank's backward contributes)
        w = torch.linspace(-1, 1, y_ref[0].numel()).view(y_ref[0].shape)
        offsets = [0] + list(torch.tensor(sizes).cumsum(0))
        loss_ref = sum((y_ref[offsets[r]:offsets[r + 1]] * w).mean() for r in range(world))
        loss_ref.backward()
        x_local = xs[rank].detach().clone().requires_grad_()
        y = sync(x_local)
        (y * w).mean().backward()
        out[f"y{step}"] = (y.detach() - y_ref[offsets[rank]:offsets[rank + 1]].detach()).abs().max().item()
        out[f"dx{step}"] = (x_local.grad - xs[rank].grad).abs().max().item()
    gw, gb = sync.weight.grad.clone(), sync.bias.grad.clone()
    td.all_reduce(gw)
    td.all_reduce(gb)
    out["dw"] = (gw - ref.weight.grad).abs().max().item()
    out["db"] = (gb - ref.bias.grad).abs().max().item()
    out["mean"] = (sync.running_mean - ref.running_mean).abs().max().item()
    out["var"] = ((sync.running_var - ref.running_var).abs() / ref.running_var).max().item()
    out["n"] = int(sync.num_batches_tracked.item()) - int(ref.num_batches_tracked.item())
    sync.eval()
    ref.eval()
    x = parts[0][:2]
    out["eval"] = (sync(x) - ref(x)).abs().max().item()
    return out


@pytest.mark.timeout(120)
def test_matches_single_process_batch_norm_on_concatenated_batch():
    cases = [(4, (3, 3), 0.1), (2, (3, 5), 0.1), (3, (2, 6), None)]  # NCHW, uneven NC, NCL with cumulative avg
    results = run_ranks(_run_cases, args=(cases,))
    for rank, per_case in enumerate(results):
        for case, res in zip(cases, per_case):
            for key, value in res.items():
                tol = 0 if key == "n" else (1e-4 if key.startswith(("y", "dx", "eval")) else 1e-5)
                assert abs(value) <= tol, (rank, case, key, value)


def _run_cases(rank, world, cases):
    torch.use_deterministic_algorithms(False)
    return [_compare(rank, world, dims, sizes, momentum) for dims, sizes, momentum in cases]


def test_without_process_group_is_plain_batch_norm():
    torch.manual_seed(0)
    ref = nn.BatchNorm2d(3)
    sync = SyncBatchNorm.convert_sync_batchnorm(ref)  # a layer itself: a new object sharing parameters
    assert sync.weight is ref.weight and sync.running_mean is ref.running_mean
    x = torch.randn(4, 3, 5, 5)
    y_ref = nn.functional.batch_norm(x, torch.zeros(3), torch.ones(3), ref.weight, ref.bias, True, 0.1, ref.eps)
    torch.testing.assert_close(sync(x), y_ref)


def test_convert_keeps_state_dict_keys_and_shares_parameters():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Sequential(nn.BatchNorm2d(4)))
    keys = list(model.state_dict())
    weight = model[1].weight
    converted = convert_sync_batchnorm(model)
    assert list(converted.state_dict()) == keys
    assert isinstance(converted[1], SyncBatchNorm) and isinstance(converted[2][0], SyncBatchNorm)
    assert converted[1].weight is weight
