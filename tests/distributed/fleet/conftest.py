"""Fixtures for the fleet facade tests."""

import warnings

import pytest
from fleet_models import fresh_fleet

from fleetlite.distributed.fleet import DistributedStrategy
from fleetlite.distributed.fleet import fleet as fleet_impl


@pytest.fixture
def single(clean_dist_env):
    """``single(**strategy_fields)``: fleet.init single-process (no launcher variables) with that strategy."""

    def make(**fields):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "world size is 1"
            fresh_fleet(DistributedStrategy(**fields))

    yield make
    fleet_impl._reset()
