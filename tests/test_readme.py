"""Every python block of the README runs: the README cannot drift from the code again.

The README's blocks run in order in one namespace, in a temporary directory, on tiny data, exactly as the
docs site's pages do (``tests/test_docs.py`` holds the runner, the context and the skip marker).
"""

from __future__ import annotations

import pytest
from test_docs import README, python_blocks, run_page


def test_every_block_is_run_or_says_why_not():
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 2  # the quick starts: the fleet API in a script, the Trainer
    for line, _, reason in blocks:
        assert reason is None or len(reason) > 10, f"README line {line}: say why the block cannot run"


@pytest.mark.timeout(600)
def test_readme_python_blocks_run(tmp_path, monkeypatch, clean_dist_env):
    namespace, ran = run_page(README, tmp_path, monkeypatch)
    assert ran == len(python_blocks(README.read_text())) >= 2
    assert "val_acc_top1" in namespace["history"].history  # the Trainer example's lookups hold


def test_torch_floor_is_stated_alike_and_met():
    """pyproject.toml's torch floor is the one the README states, and this environment meets it."""
    import re

    import torch

    (floor,) = re.findall(r'^\s*"torch>=([\d.]+)",', (README.parent / "pyproject.toml").read_text(), re.M)
    assert f"torch >= {floor}" in README.read_text()
    have = tuple(int(p) for p in re.match(r"(\d+)\.(\d+)", torch.__version__).groups())
    assert have >= tuple(int(p) for p in floor.split(".")[:2])
    assert tuple(int(p) for p in floor.split(".")[:2]) >= (2, 9)  # set_custom_all_gather (gloo sharding) needs 2.9
