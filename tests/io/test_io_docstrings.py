"""The ``Example::`` blocks of fleetlite.io's public classes run as written."""

import inspect
import textwrap

import pytest

from fleetlite.io import DistributedBatchSampler, TensorLoader


def example(obj) -> str:
    doc = inspect.getdoc(obj)
    block = doc.split("Example::", 1)[1]
    lines = []
    for line in block.splitlines()[1:]:
        if line.strip() and not line.startswith(" "):
            break
        lines.append(line)
    return textwrap.dedent("\n".join(lines))


@pytest.mark.parametrize("obj", [DistributedBatchSampler, TensorLoader])
def test_class_example_runs(obj, capsys):
    exec(compile(example(obj), f"<{obj.__name__} example>", "exec"), {})
    if obj is DistributedBatchSampler:  # the printed values are the ones the docstring shows
        assert capsys.readouterr().out.split("\n")[:2] == ["[[2, 3], [6, 7], [10, 0]]", "1"]
