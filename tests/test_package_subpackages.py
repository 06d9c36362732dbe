"""``import fleetlite`` then ``fleetlite.trainer`` (or ``.checkpoint``...) works, as ``import torch; torch.nn`` does,
and stays light: the subpackage is imported on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.timeout(120)
def test_subpackages_are_attributes_after_a_bare_import():
    probe = """
import sys
import fleetlite
assert "fleetlite.trainer" not in sys.modules
print(fleetlite.trainer.Trainer.__name__, callable(fleetlite.checkpoint.load_full),
      fleetlite.parallel.DistributedDataParallel.__name__, fleetlite.utils.__name__, "trainer" in dir(fleetlite))
"""
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["Trainer", "True", "DistributedDataParallel", "fleetlite.utils", "True"]
