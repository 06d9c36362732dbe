"""fleet.util (Paddle's UtilBase), fleet.is_worker and spawn's option check, against Paddle's documented behaviour
(util_factory.py's docstrings, test_fleet_util.py, spawn's _options_valid_check); collectives on 2 real ranks."""

import numpy as np
import pytest

import fleetlite.distributed as dist
from fleetlite.distributed import fleet
from fleetlite.distributed.spawn import _check_options
from fleetlite.testing import run_ranks


class _Role:
    """A role maker with a fixed rank, as Paddle's UserDefinedRoleMaker in its get_file_shard examples."""

    def __init__(self, rank, world):
        self.rank, self.world = rank, world

    def worker_index(self):
        return self.rank

    def worker_num(self):
        return self.world


def _shard(files, rank, world):
    util = fleet.UtilBase()
    util._set_role_maker(_Role(rank, world))
    return util.get_file_shard(files)


def test_get_file_shard_splits_as_paddle():
    files = ["a", "b", "c", "d", "e"]
    assert [_shard(files, r, 2) for r in range(2)] == [["a", "b", "c"], ["d", "e"]]
    assert [_shard(["a", "b"], r, 3) for r in range(3)] == [["a"], ["b"], []]
    assert _shard(["file1", "file2", "file3"], 0, 2) == ["file1", "file2"]
    for world in (1, 3, 4, 7):  # every file exactly once, in order
        assert sum((_shard(list(range(10)), r, world) for r in range(world)), []) == list(range(10))
    with pytest.raises(TypeError, match="list"):
        fleet.util.get_file_shard("file1")


def test_single_process_util_and_worker_queries(capsys):
    assert fleet.is_worker() and not fleet.is_server()
    out = fleet.util.all_reduce((1, 2), mode="max")
    assert isinstance(out, np.ndarray) and out.tolist() == [1, 2]
    assert fleet.util.all_reduce(np.ones((2, 3)), "sum").shape == (2, 3)
    assert fleet.util.all_gather(5) == [5]
    fleet.util.barrier()
    fleet.util.print_on_rank("I'm worker 0", 0)
    fleet.util.print_on_rank("not me", 1)
    assert capsys.readouterr().out == "I'm worker 0\n"
    with pytest.raises(ValueError, match="mode"):
        fleet.util.all_reduce([1], mode="prod")
    with pytest.raises(ValueError, match="parameter servers"):
        fleet.util.all_reduce([1], comm_world="server")
    with pytest.raises(ValueError, match="comm_world"):
        fleet.util.barrier("everyone")


def test_a_user_subclass_replaces_fleet_util():
    class UserDefinedUtil(fleet.UtilBase):
        def get_user_id(self):
            return 10

    saved = fleet.util
    try:
        fleet.util = UserDefinedUtil()
        assert fleet.util.get_user_id() == 10
        assert fleet.util.get_file_shard(["a"]) == ["a"]  # the base's methods still there
    finally:
        fleet.util = saved
    strategy = fleet.DistributedStrategy()
    util = fleet.UtilFactory()._create_util({"role_maker": None, "valid_strategy": strategy})
    assert util.role_maker is None and util.dist_strategy is strategy


def _util_on_ranks(rank, world_size):
    r = fleet.util.all_reduce([rank + 1, 10 * (rank + 1)], mode="sum")
    mn = fleet.util.all_reduce(np.array([[rank + 0.5]]), mode="min", comm_world="all")
    mx = fleet.util.all_reduce(np.array([rank, -rank]), mode="max")
    gathered = fleet.util.all_gather(fleet.worker_index())
    fleet.util.barrier()
    files = fleet.util.get_file_shard(["a", "b", "c", "d", "e"])
    return r.tolist(), str(r.dtype), mn.tolist(), str(mn.dtype), mx.tolist(), gathered, files


@pytest.mark.timeout(180)
def test_util_collectives_on_two_ranks():
    results = run_ranks(_util_on_ranks, world_size=2, timeout=120)
    for rank, (r, r_dtype, mn, mn_dtype, mx, gathered, files) in enumerate(results):
        assert r == [3, 30] and r_dtype == "int64"  # Paddle's example: [1, 2] + ... summed element-wise
        assert mn == [[0.5]] and mn_dtype == "float64"  # shape kept
        assert mx == [1, 0]
        assert gathered == [0, 1]
        assert files == [["a", "b", "c"], ["d", "e"]][rank]


def _noop():
    pass


def test_spawn_rejects_unknown_options_as_paddle():
    with pytest.raises(ValueError, match=r"config option \(error\)"):
        dist.spawn(_noop, nprocs=2, error="error")
    with pytest.raises(ValueError):
        _check_options({"start_method": "spawn", "error": "error"})
    _check_options({"start_method": "spawn", "ips": "127.0.0.1", "gpus": "0", "backend": "gloo",
                    "print_config": True})
    with pytest.warns(DeprecationWarning, match="selected_devices"):
        _check_options({"selected_devices": "0"})
    with pytest.raises(NotImplementedError, match="xpus"):
        _check_options({"xpus": "0"})
