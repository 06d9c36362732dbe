"""Importing the Trainer and its callbacks loads neither rich, torchvision nor hydra (they load on use)."""

import subprocess
import sys

import pytest


@pytest.mark.timeout(60)
def test_no_heavy_imports():
    code = ("import sys, fleetlite; fleetlite.Trainer; fleetlite.callbacks.ProgressBar; fleetlite.metric.Accuracy; "
            "import fleetlite.checkpoint; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'rich', 'torchvision', 'hydra', 'omegaconf'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
