"""DistributedBatchSampler: Paddle layout, epochs, padding marks, state, re-split (ranks simulated in-process)."""

import itertools
import json
import math

import numpy as np
import pytest
import torch

from fleetlite.io import DataLoader, DistributedBatchSampler


def paddle_reference(n, batch_size, nranks, rank, drop_last):
    """paddle.io.DistributedBatchSampler.__iter__ without shuffle, transcribed from Paddle 2.x."""
    num_samples = int(math.ceil(n * 1.0 / nranks))
    total_size = num_samples * nranks
    indices = list(range(n))
    indices += indices[:(total_size - len(indices))]
    if nranks > 1:
        sub = []
        last_batch_size = total_size % (batch_size * nranks)
        last_local = last_batch_size // nranks
        for i in range(rank * batch_size, len(indices) - last_batch_size, batch_size * nranks):
            sub.extend(indices[i:i + batch_size])
        tail = indices[len(indices) - last_batch_size:]
        sub.extend(tail[rank * last_local:(rank + 1) * last_local])
        indices = sub
    batches, cur = [], []
    for idx in indices:
        cur.append(idx)
        if len(cur) == batch_size:
            batches.append(cur)
            cur = []
    if not drop_last and cur:
        batches.append(cur)
    return batches


def ranks(n, batch_size, nranks, **kw):
    return [DistributedBatchSampler(range(n), batch_size, nranks, r, **kw) for r in range(nranks)]


def valid_samples(samplers, batches_per_rank):
    """The real (non-padding) samples of the given per-rank batch lists."""
    out = []
    for s, batches in zip(samplers, batches_per_rank):
        for i, b in enumerate(batches):
            out.extend(b[:s.num_valid(i)])
    return out


@pytest.mark.parametrize("drop_last", [False, True])
def test_layout_matches_paddle(drop_last):
    for n, b, r in itertools.product(range(1, 30), range(1, 6), range(1, 5)):
        if n < r:  # Paddle's own padding cannot pad more than n samples; covered below
            continue
        for rank, s in enumerate(ranks(n, b, r, drop_last=drop_last)):
            want = paddle_reference(n, b, r, rank, drop_last)
            assert list(s) == want, (n, b, r, rank)
            assert len(s) == len(want)


def test_small_case_by_hand():
    r0, r1 = ranks(11, 2, 2)
    assert list(r0) == [[0, 1], [4, 5], [8, 9]]
    assert list(r1) == [[2, 3], [6, 7], [10, 0]]  # padded by repeating the head
    assert [r1.num_valid(i) for i in range(3)] == [2, 2, 1]
    assert [r0.num_valid(i) for i in range(3)] == [2, 2, 2]
    r0, r1 = ranks(9, 2, 2)  # the short last chunk [8, pad 0] is split evenly
    assert list(r0) == [[0, 1], [4, 5], [8]] and list(r1) == [[2, 3], [6, 7], [0]]
    assert r1.num_valid(2) == 0
    r0, r1 = ranks(9, 2, 2, drop_last=True)
    assert list(r0) == [[0, 1], [4, 5]] and list(r1) == [[2, 3], [6, 7]]


@pytest.mark.parametrize("shuffle", [False, True])
def test_every_sample_exactly_once_and_ranks_aligned(shuffle):
    for n, b, r in itertools.product([1, 2, 5, 17, 64, 65, 101], [1, 3, 8], [1, 2, 3, 5]):
        samplers = ranks(n, b, r, shuffle=shuffle, seed=7)
        batches = [list(s) for s in samplers]
        assert len({len(x) for x in batches}) == 1, "every rank must get the same number of batches"
        assert all(len(x) == len(s) for x, s in zip(batches, samplers))
        assert sorted(valid_samples(samplers, batches)) == list(range(n)), (n, b, r)
        for s, bs in zip(samplers, batches):  # padding repeats real samples and only trails a batch
            for i, batch in enumerate(bs):
                assert 0 <= s.num_valid(i) <= len(batch) and all(0 <= j < n for j in batch)


def test_shuffle_is_seeded_by_epoch_and_auto_advances():
    s = DistributedBatchSampler(range(50), 8, 1, 0, shuffle=True, seed=3)
    first, second = list(s), list(s)
    assert s.epoch == 2
    assert first != second and sorted(sum(first, [])) == sorted(sum(second, [])) == list(range(50))
    fresh = DistributedBatchSampler(range(50), 8, 1, 0, shuffle=True, seed=3)
    fresh.set_epoch(1)
    assert list(fresh) == second
    fresh.set_epoch(0)
    assert list(fresh) == first
    other_seed = DistributedBatchSampler(range(50), 8, 1, 0, shuffle=True, seed=4)
    assert list(other_seed) != first
    plain = DistributedBatchSampler(range(50), 8, 1, 0)
    assert sum(list(plain), []) == list(range(50)) and plain.epoch == 1


def test_ranks_share_one_permutation():
    samplers = ranks(40, 4, 2, shuffle=True, seed=1)
    for s in samplers:
        s.set_epoch(5)
    r0, r1 = (list(s) for s in samplers)
    # chunk k of the global order = rank 0's batch k followed by rank 1's batch k
    order = np.random.default_rng([1, 5]).permutation(40).tolist()
    assert sum((a + b for a, b in zip(r0, r1)), []) == order


def test_state_round_trip_mid_epoch_gives_the_same_batches():
    def make():
        return ranks(103, 5, 3, shuffle=True, seed=11)

    reference = make()
    for s in reference:
        s.set_epoch(2)
    want = [list(s) for s in reference]
    interrupted = make()
    got = [[] for _ in interrupted]
    states = []
    for r, s in enumerate(interrupted):
        s.set_epoch(2)
        it = iter(s)
        got[r] = [next(it) for _ in range(4)]
        states.append(json.loads(json.dumps(s.state_dict())))  # plain Python types
    assert states[0] == states[1] == states[2] and states[0]["offset"] == 4 * 5 * 3
    resumed = make()
    for r, s in enumerate(resumed):
        s.load_state_dict(states[r])
        s.set_epoch(2)  # the usual top-of-epoch call keeps the loaded position
        assert len(s) == len(want[r]) - 4
        got[r] += list(s)
    assert got == want
    assert all(s.epoch == 3 for s in resumed)
    next_epoch = make()
    for s in next_epoch:
        s.set_epoch(3)
    assert [list(s) for s in resumed] == [list(s) for s in next_epoch]


def test_num_valid_after_resume_marks_the_new_padding():
    samplers = ranks(23, 4, 2)
    it = iter(samplers[0])
    next(it)
    state = samplers[0].state_dict()
    resumed = ranks(23, 4, 2)
    for s in resumed:
        s.load_state_dict(state)
    batches = [list(s) for s in resumed]
    assert sorted(valid_samples(resumed, batches)) == list(range(8, 23))


@pytest.mark.parametrize("new_replicas,new_batch", [(3, 5), (1, 5), (4, 2), (2, 7)])
def test_resplit_covers_the_rest_exactly_once(new_replicas, new_batch):
    n = 101
    old = ranks(n, 5, 2, shuffle=True, seed=2)
    seen = []
    for s in old:
        it = iter(s)
        for i in range(3):
            seen.extend(next(it)[:s.num_valid(i)])
    state = old[0].state_dict()
    new = ranks(n, new_batch, new_replicas, shuffle=True, seed=99)  # the seed comes from the state
    for s in new:
        s.load_state_dict(state)
    batches = [list(s) for s in new]
    assert len({len(b) for b in batches}) == 1
    rest = valid_samples(new, batches)
    assert sorted(seen + rest) == list(range(n)) and len(seen) == 30
    assert all(s.epoch == 1 and s.seed == 2 for s in new)
    # the next epoch is laid out normally for the new world size
    nxt = [list(s) for s in new]
    ref = ranks(n, new_batch, new_replicas, shuffle=True, seed=2)
    for s in ref:
        s.set_epoch(1)
    assert nxt == [list(s) for s in ref]


def test_state_with_consumed_for_prefetching_loaders():
    s = DistributedBatchSampler(range(20), 4, 1, 0)
    batches = list(s)  # a prefetching loader ran the whole pass ahead of the training loop
    assert s.epoch == 1
    state = s.state_dict(consumed=2)
    assert (state["epoch"], state["offset"]) == (0, 8)
    t = DistributedBatchSampler(range(20), 4, 1, 0)
    t.load_state_dict(state)
    assert list(t) == batches[2:]
    assert s.state_dict(consumed=5)["epoch"] == 1
    with pytest.raises(ValueError, match="exceeds"):
        s.state_dict(consumed=6)
    with pytest.raises(ValueError, match="no pass has started"):
        DistributedBatchSampler(range(20), 4, 1, 0).state_dict(consumed=1)


def test_abandoned_pass_restarts_the_epoch_but_its_position_can_be_saved():
    s = DistributedBatchSampler(range(10), 2, 1, 0)
    it = iter(s)
    assert next(it) == [0, 1] and next(it) == [2, 3]
    del it
    state = s.state_dict()
    # a peek or a break does not eat into the next pass (Paddle / torch semantics)
    assert len(s) == 5
    assert list(s) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]] and s.epoch == 1
    # ... but the position reached is what a checkpoint holds, and loading it resumes there once
    s.load_state_dict(state)
    s.set_epoch(0)  # the usual call at the top of the epoch loop keeps the restored position
    assert len(s) == 3
    assert list(s) == [[4, 5], [6, 7], [8, 9]] and s.epoch == 1
    s.set_epoch(0)
    assert len(list(s)) == 5


def test_with_torch_dataloader():
    data = torch.arange(30).float()
    s = DistributedBatchSampler(data, 4, 2, 1, shuffle=True)
    loader = DataLoader(data, batch_sampler=s)
    assert len(loader) == 4
    got = [b.long().tolist() for b in loader]
    s.set_epoch(0)
    assert got == list(s)


def test_defaults_come_from_the_launcher_environment(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    s = DistributedBatchSampler(range(9), 1)
    assert (s.nranks, s.local_rank) == (3, 2) and list(s) == [[2], [5], [8]]


def test_clear_errors():
    with pytest.raises(ValueError, match="rank=2 is outside 0..1"):
        DistributedBatchSampler(range(4), 2, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="batch_size=0"):
        DistributedBatchSampler(range(4), 0, 1, 0)
    with pytest.raises(ValueError, match="empty"):
        DistributedBatchSampler([], 2, 1, 0)
    with pytest.raises(TypeError, match="no len"):
        DistributedBatchSampler(iter(range(3)), 2, 1, 0)
    state = DistributedBatchSampler(range(10), 2, 1, 0).state_dict()
    with pytest.raises(ValueError, match="dataset of 10 samples"):
        DistributedBatchSampler(range(11), 2, 1, 0).load_state_dict(state)
    with pytest.raises(ValueError, match="shuffle"):
        DistributedBatchSampler(range(10), 2, 1, 0, shuffle=True).load_state_dict(state)
    with pytest.raises(IndexError, match="outside"):
        DistributedBatchSampler(range(10), 2, 1, 0).num_valid(5)
