"""Profiler callback on 2 real ranks: one Chrome trace per rank in the run directory, valid JSON, holding the
engine's gradient all-reduces; the top-ops table printed by rank 0 only."""

import json

import pytest
import torch
from trainer_helpers import dataset, trainer

from fleetlite.testing import run_ranks


def _profiled_fit(rank, world, run_dir):
    from fleetlite.callbacks import Profiler

    torch.set_num_threads(1)
    t = trainer()
    prof = Profiler(wait=1, warmup=1, active=2, print_table=False)
    t.fit(dataset(64), epochs=1, batch_size=4, verbose=0, save_dir=run_dir, callbacks=[prof])
    return [str(p) for p in prof.traces], prof.table


@pytest.mark.timeout(120)
def test_traces_per_rank_hold_all_reduces(tmp_path):
    results = run_ranks(_profiled_fit, args=(str(tmp_path),), timeout=110)
    for rank, (traces, table) in enumerate(results):
        assert [p.split("/")[-1] for p in traces] == [f"rank{rank}.step4.json"]  # wait 1 + warmup 1 + active 2
        with open(traces[0]) as f:
            trace = json.load(f)
        names = [e.get("name", "") for e in trace["traceEvents"]]
        assert any("all_reduce" in n for n in names), "no all-reduce in the trace"
        assert any("aten::addmm" in n or "aten::linear" in n for n in names)
        if rank == 0:
            assert "Self CPU" in table and "Name" in table
        else:
            assert table is None
    assert sorted(p.name for p in (tmp_path / "profiler").iterdir()) == ["rank0.step4.json", "rank1.step4.json"]


def test_stopped_inside_a_window_still_writes(tmp_path):
    from fleetlite.callbacks import Profiler

    prof = Profiler(wait=0, warmup=1, active=50, dir=str(tmp_path / "p"), print_table=False)
    trainer().fit(dataset(16), epochs=1, batch_size=4, verbose=0, callbacks=[prof])
    assert len(prof.traces) == 1 and prof.traces[0].exists()
    json.loads(prof.traces[0].read_text())
    with pytest.raises(ValueError, match="active"):
        Profiler(active=0)
