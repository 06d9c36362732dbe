"""Every docs block marked ``<!-- docs-test: launch N -->`` runs as the page says: saved as a file, under
``fleetlite launch --nproc_per_node N``, in an empty directory, with nothing but its own lines (no names
supplied by the test). Exit status 0 on every rank; the hybrid page's programs print per-rank values that must
agree where the page says they do."""

from __future__ import annotations

import math
import re

import pytest
from test_docs import DOCS, ROOT, doc_pages, launched_blocks

from fleetlite.testing import run_launch

_BLOCKS = [(page, line, code, n) for page in doc_pages() for line, code, n in launched_blocks(page.read_text())]


def test_the_hybrid_page_launches_its_multi_rank_blocks():
    from test_docs import python_blocks

    text = (DOCS / "hybrid.md").read_text()
    assert len([b for b in _BLOCKS if b[0].name == "hybrid.md"]) >= 5
    assert not [line for line, _, reason in python_blocks(text) if reason and not reason.startswith("launched")]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("page,line,code,nproc", _BLOCKS,
                         ids=[f"{p.relative_to(DOCS)}:{line}" for p, line, _, _ in _BLOCKS])
def test_launched_block_runs(page, line, code, nproc, tmp_path):
    script = tmp_path / "block.py"
    script.write_text(code + "\n")
    proc = run_launch(["--nproc_per_node", str(nproc), str(script)], timeout=240, cwd=str(tmp_path),
                      env={"PYTHONPATH": str(ROOT)})
    where = f"{page.relative_to(ROOT)}:{line}"
    assert proc.returncode == 0, f"{where} under fleetlite launch: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    # values a page says are the same on every rank of a group (the hybrid page's losses) are the same
    # ranks print at once: a print's text and its newline are two writes, so two ranks' lines can run together
    losses = re.findall(r"(?:rank|stage) \d+: loss (nan|-?inf|-?\d+\.\d+)", proc.stdout)
    if re.search(r'print\(f"(rank|stage) ', code):  # a block that prints one loss per rank
        assert len(losses) == nproc and len(set(losses)) == 1 and math.isfinite(float(losses[0])), (where,
                                                                                                    proc.stdout)
