"""Every python block of the README runs (issue 13 item 14): the docs cannot drift from the code again.

The blocks run in README order in one namespace (later blocks use names earlier ones made, as a reader
would), in a temporary directory, on tiny data: the synthetic CIFAR-10 sets are cut to a few samples.
Names the prose leaves to the reader (``net``, ``x``, ``train_set``...) are defined by ``_context``.
A block preceded by ``<!-- readme-test: skip (reason) -->`` is not run: the reason must say what it
needs that a test machine lacks (a launcher, the real CIFAR-10 files, a GPU).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

README = Path(__file__).resolve().parents[1] / "README.md"
_SKIP = re.compile(r"<!--\s*readme-test:\s*skip\s*\((.+?)\)\s*-->")


def python_blocks(text: str) -> list[tuple[int, str, str | None]]:
    """(line, code, skip reason or None) of every ```python block."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start, body = i + 1, []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            before = lines[start - 2] if start >= 2 else ""
            m = _SKIP.search(before)
            blocks.append((start, "\n".join(body), m.group(1) if m else None))
        i += 1
    return blocks


class _Feed(nn.Module):
    """A ParallelExecutor module: ``module(**feed)`` returns named tensors."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3 * 32 * 32, 10)

    def forward(self, x, y):
        return {"loss": nn.functional.cross_entropy(self.fc(x.flatten(1)), y)}


def _context() -> dict:
    from torchvision.transforms import ToTensor

    from fleetlite.vision.datasets import SyntheticCifar10
    from fleetlite.vision.models import TutorialCNN

    torch.manual_seed(0)
    module = _Feed()
    return {
        "net": TutorialCNN(num_classes=10),
        "x": torch.randn(4, 3, 32, 32), "x2": torch.randn(4, 3, 32, 32), "y": torch.randint(0, 10, (4,)),
        "train_set": SyntheticCifar10(mode="train", transform=ToTensor(), size=64),
        "test_set": SyntheticCifar10(mode="test", transform=ToTensor(), size=32),
        "strategy": None, "module": module, "optimizer": torch.optim.SGD(module.parameters(), lr=0.1),
    }


# user-facing notices the blocks give when run one after another in one process (as this test does)
_EXPECTED_NOTICES = (
    r"^sharding stage 3 with a single process: nothing to shard across",  # the sharding examples, one process
    r"checkpoint holds state for callbacks not passed to fit: \['EarlyStopping'\]",  # resume after the fit above
)


def test_every_block_is_run_or_says_why_not():
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 5
    for line, _, reason in blocks:
        assert reason is None or len(reason) > 10, f"README line {line}: say why the block cannot run"


@pytest.mark.timeout(600)
def test_readme_python_blocks_run(tmp_path, monkeypatch, clean_dist_env):
    from fleetlite.vision.datasets import synthetic

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(synthetic, "_DEFAULT_SIZE", {"train": 64, "test": 32})
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    from fleetlite.distributed.fleet import fleet

    namespace = _context()
    ran = 0
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for line, code, reason in python_blocks(README.read_text()):
                if reason is not None:
                    continue
                try:
                    exec(compile(code, f"README.md:{line}", "exec"), namespace)  # noqa: S102 - the README's own code
                except Exception as e:
                    raise AssertionError(f"the README block at line {line} fails: {type(e).__name__}: {e}") from e
                ran += 1
    finally:
        fleet._reset()  # the blocks call fleet.init (a sharding strategy, ...): later tests start clean
    # the notices a reader running these blocks in one process sees, and nothing else
    unexpected = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught
                  if not any(re.search(e, str(w.message)) for e in _EXPECTED_NOTICES)]
    assert not unexpected, unexpected
    assert ran >= 5
    assert "val_acc_top1" in namespace["history"].history  # the Trainer example's lookups hold
