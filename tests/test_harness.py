"""The test harness itself: run_ranks reports every fault a rank can hide, and tests/conftest.py gives every
test the process state the session started with (Note [test isolation])."""

from __future__ import annotations

import importlib.util
import multiprocessing.util
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as tdist

from fleetlite.testing import RankFailure, run_ranks, timeout_scale

TESTS = Path(__file__).resolve().parent


# -- run_ranks ------------------------------------------------------------------------------------------------
def _async_on_rank_zero_only(rank, world):
    if rank == 0:
        tdist.all_reduce(torch.ones(1), async_op=True)  # never waited on, never matched by rank 1
    return rank


def _matched_collectives_and_p2p(rank, world):
    t = torch.ones(1)
    tdist.all_reduce(t)
    if rank + 1 < world:  # a pipeline's chain: the middle rank sends and receives, the ends do one of them
        tdist.send(t, rank + 1)
    if rank > 0:
        tdist.recv(t, rank - 1)
    sub = tdist.new_group([0, 1])
    if rank in (0, 1):
        tdist.all_reduce(t, group=sub, async_op=True).wait()
    return t.item()


@pytest.mark.timeout(120)
def test_a_collective_issued_on_one_rank_only_fails():
    with pytest.raises(RankFailure, match=r"different numbers of collectives on process group '0': rank 0: 1, "
                                          r"rank 1: 0"):
        run_ranks(_async_on_rank_zero_only, timeout=100)
    # point-to-point operations advance a group's count unevenly, and are not collectives: no failure
    assert run_ranks(_matched_collectives_and_p2p, world_size=3, timeout=100) == [6.0, 6.0, 3.0]


def _exit_7_after_returning(rank, world):
    if rank == 1:  # runs once fn has returned and its result is on its way: as a crash in teardown would
        multiprocessing.util.Finalize(None, os._exit, args=(7,), exitpriority=100)
    return rank


@pytest.mark.timeout(120)
def test_a_rank_exiting_non_zero_after_its_result_fails():
    with pytest.raises(RankFailure, match="rank 1 returned its result but then exited with code 7"):
        run_ranks(_exit_7_after_returning, timeout=100)


def _rank_one_shuts_down_itself(rank, world):
    if rank == 1:
        tdist.destroy_process_group()  # a clean shutdown inside fn: its group is gone before run_ranks' teardown
    return rank


@pytest.mark.timeout(120)
def test_a_rank_that_destroyed_its_group_does_not_keep_rank_0_waiting():
    # rank 0 hosts the store and waits for every rank to say it is done (up to 30 s, scaled) before it exits; a
    # rank whose group is gone still says so, through the store kept from the start: rank 0 exits at once, well
    # within this run's own 20 s (scaled), which rank 0 waiting out its 30 s would overrun ("did not exit")
    assert run_ranks(_rank_one_shuts_down_itself, timeout=20) == [0, 1]


def _warns_from(rank, world, module):
    warnings.warn_explicit("a warning from fleetlite's code", UserWarning, "x.py", 1, module=module)
    return rank


@pytest.mark.timeout(120)
def test_the_suites_warning_filters_hold_inside_ranks():
    # pyproject's `error::Warning:fleetlite`: a warning raised from fleetlite's modules is a bug, in ranks too
    with pytest.raises(RankFailure, match="UserWarning: a warning from fleetlite's code"):
        run_ranks(_warns_from, args=("fleetlite.distributed.collective",), timeout=100)
    with pytest.warns(UserWarning):  # control: the same warning from elsewhere only warns
        warnings.warn_explicit("a user's warning", UserWarning, "x.py", 1, module="user_code")
    assert run_ranks(_warns_from, args=("user_code",), timeout=100) == [0, 1]


def _hash_and_variable(rank, world):
    return hash("fleetlite"), os.environ.get("FLEETLITE_SET_LATE")


@pytest.mark.timeout(120)
def test_ranks_get_their_own_hash_seed_and_the_environment_of_now(monkeypatch):
    run_ranks(_hash_and_variable, timeout=100)  # the rank processes' servers are running from here on
    monkeypatch.setenv("FLEETLITE_SET_LATE", "now")
    (h0, v0), (h1, v1) = run_ranks(_hash_and_variable, timeout=100)
    assert v0 == v1 == "now"
    assert h0 != h1  # as in a real launch: str hashes (set orders) differ between processes


# -- Note [test isolation] -------------------------------------------------------------------------------------
_LEAKS = """
    import os, signal
    import torch
    from fleetlite.distributed import fleet
    from fleetlite.distributed.fleet import DistributedStrategy
    from fleetlite.static import Program, default_main_program

    def test_leaves_state_behind():
        fleet.init(is_collective=True, strategy=DistributedStrategy(
            gradient_merge=True, gradient_merge_configs={"k_steps": 2}))
        default_main_program(Program(torch.nn.Identity()))
        os.environ["PYTHONHASHSEED"] = "3"
        signal.signal(signal.SIGTERM, lambda *a: None)
        torch.manual_seed(123)
"""
_SEES_NONE = """
    import os, signal
    import torch
    from fleetlite.distributed import fleet
    from fleetlite.static import default_main_program

    def test_no_fleet_strategy():
        assert not fleet.is_initialized() and fleet.user_strategy() is None
        assert not fleet.get_strategy().gradient_merge

    def test_no_default_program():
        try:
            default_main_program()
            raise AssertionError("a default program is still set")
        except RuntimeError:
            pass

    def test_no_variable():
        assert "PYTHONHASHSEED" not in os.environ

    def test_no_signal_handler():
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

    def test_no_seed():
        assert not torch.equal(torch.get_rng_state(), torch.Generator().manual_seed(123).get_state())
"""


def _run_two_files(tmp_path: Path, with_conftest: bool) -> subprocess.CompletedProcess:
    """pytest on test_a.py (which changes process state) and then test_b.py (which checks for none), in one
    process, with or without the suite's conftest."""
    tmp_path.mkdir()
    (tmp_path / "test_a.py").write_text(textwrap.dedent(_LEAKS))
    (tmp_path / "test_b.py").write_text(textwrap.dedent(_SEES_NONE))
    if with_conftest:
        shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHASHSEED", "PYTEST_CURRENT_TEST")}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS.parent), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                           "-p", "no:xdist", "test_a.py", "test_b.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300 * timeout_scale())


@pytest.mark.timeout(600)
def test_a_later_file_sees_nothing_of_what_an_earlier_one_changed(tmp_path):
    without = _run_two_files(tmp_path / "bare", with_conftest=False)  # the control: the leaks are real
    assert "5 failed, 1 passed" in without.stdout, without.stdout[-3000:] + without.stderr[-3000:]
    isolated = _run_two_files(tmp_path / "suite", with_conftest=True)
    assert isolated.returncode == 0 and "6 passed" in isolated.stdout, isolated.stdout[-3000:] + isolated.stderr


# -- the shared examples ---------------------------------------------------------------------------------------
def _suite_conftest():
    spec = importlib.util.spec_from_file_location("suite_conftest", TESTS / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_missing_examples_fail_under_ci_and_skip_elsewhere(tmp_path, monkeypatch):
    conftest = _suite_conftest()
    assert conftest.EXAMPLES == TESTS.parent.parent / "shared" / "examples"  # beside the checkout, not a fixed path
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="the examples are missing at .*: CI clones with shared/"):
        conftest.find_examples(tmp_path / "missing")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="examples not found"):
        conftest.find_examples(tmp_path / "missing")
    assert conftest.find_examples(tmp_path) == tmp_path
