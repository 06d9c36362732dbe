"""Every python block of the docs site runs: the docs cannot drift from the code.

Each page (``docs/**/*.md``; the README in ``tests/test_readme.py``) is one test: its blocks run in page
order in one namespace (later blocks use names earlier ones made, as a reader would), in a temporary
directory, on tiny data: the synthetic CIFAR-10 sets are cut to a few samples. A page's blocks define every
name they use (a reader copies them as they are; ``_UNDEFINED`` lists the exceptions left). A block preceded by
``<!-- readme-test: skip (reason) -->`` is not run: the reason must say what it needs that a test machine
lacks (the real CIFAR-10 files, a GPU). A block for several processes is a whole program preceded by
``<!-- docs-test: launch N -->``: ``tests/test_docs_launched.py`` runs it under ``fleetlite launch
--nproc_per_node N`` (``also launch N``: here too). Shell blocks are not run here; what they start
(``fleetlite launch``, the recipes) has its own tests.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
_SKIP = re.compile(r"<!--\s*readme-test:\s*skip\s*\((.+?)\)\s*-->")
#: a whole program for several processes: ``tests/test_docs_launched.py`` runs it under ``fleetlite launch``
#: (``also launch N``: it runs here as well, with the page's other blocks)
_LAUNCH = re.compile(r"<!--\s*docs-test:\s*(also\s+)?launch\s+(\d+)\s*-->")


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
            m, launch = _SKIP.search(before), _LAUNCH.search(before)
            reason = m.group(1) if m else (f"launched on {launch.group(2)} processes"
                                           if launch and not launch.group(1) else None)
            blocks.append((start, "\n".join(body), reason))
        i += 1
    return blocks


def launched_blocks(text: str) -> list[tuple[int, str, int]]:
    """(line, code, processes) of every block marked ``<!-- docs-test: launch N -->``: a whole program."""
    lines = text.splitlines()
    return [(line, code, int(_LAUNCH.search(lines[line - 2]).group(2))) for line, code, _ in python_blocks(text)
            if line >= 2 and _LAUNCH.search(lines[line - 2])]


def doc_pages() -> list[Path]:
    """Every page of the site, in a stable order."""
    return sorted(DOCS.rglob("*.md"))


#: Names a page uses without defining them, supplied while the page is made whole. Every other page runs with
#: nothing but its own lines, as a reader copying it would (``test_pages_are_self_contained``).
_UNDEFINED = {"strategies.md": ("net",)}  # its sharding example wraps a `net` it does not build


def _context(page: str) -> dict:
    from fleetlite.vision.models import TutorialCNN

    torch.manual_seed(0)
    given = {"net": lambda: TutorialCNN(num_classes=10)}
    return {name: given[name]() for name in _UNDEFINED.get(page, ())}


# user-facing notices a reader running a page's blocks in one process sees (as these tests do), per page
_EXPECTED_NOTICES = {
    "README.md": (
        r"checkpoint holds state for callbacks not passed to fit: \['EarlyStopping'\]",  # resume after the fit
    ),
    "strategies.md": (
        r"^sharding stage 3 with a single process: nothing to shard across",  # the sharding examples, one process
    ),
}


def run_page(path: Path, tmp_path: Path, monkeypatch) -> tuple[dict, int]:
    """Run the page's python blocks in order in one namespace; returns (namespace, blocks run).

    Fails when a block raises or when a warning other than the page's expected notices is given.
    """
    from fleetlite.distributed.fleet import fleet
    from fleetlite.vision.datasets import synthetic

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(synthetic, "_DEFAULT_SIZE", {"train": 64, "test": 32})
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    expected = _EXPECTED_NOTICES.get(path.name, ())
    namespace = _context(path.name)
    ran = 0
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for line, code, reason in python_blocks(path.read_text()):
                if reason is not None:
                    continue
                where = f"{path.relative_to(ROOT)}:{line}"
                try:
                    exec(compile(code, where, "exec"), namespace)  # noqa: S102 - the docs' own code
                except Exception as e:
                    raise AssertionError(f"the block at {where} fails: {type(e).__name__}: {e}") from e
                ran += 1
    finally:
        fleet._reset()  # the blocks call fleet.init (a sharding strategy, ...): later tests start clean
    unexpected = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught
                  if not any(re.search(e, str(w.message)) for e in expected)]
    assert not unexpected, unexpected
    return namespace, ran


def test_every_block_is_run_or_says_why_not():
    blocks = [(page, b) for page in [README, *doc_pages()] for b in python_blocks(page.read_text())]
    assert len(blocks) >= 5
    for page, (line, _, reason) in blocks:
        assert reason is None or len(reason) > 10, f"{page.name} line {line}: say why the block cannot run"
    assert sum(reason is None for _, (_, _, reason) in blocks) >= 5


def test_every_page_is_in_the_site():
    """A page mkdocs.yml's nav leaves out would be built but unreachable (mkdocs --strict also checks this)."""
    yaml = pytest.importorskip("yaml")

    def leaves(node):
        if isinstance(node, dict):
            return [x for v in node.values() for x in leaves(v)]
        if isinstance(node, list):
            return [x for v in node for x in leaves(v)]
        return [node]

    nav = set(leaves(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]))
    pages = {p.relative_to(DOCS).as_posix() for p in doc_pages()}
    assert pages == nav, f"not in mkdocs.yml's nav: {sorted(pages - nav)}; in nav, no page: {sorted(nav - pages)}"


_DIRECTIVE = re.compile(r"^::: (\S+)\n    options:\n      heading: (\S+)$", re.M)


def test_reference_headings_name_the_same_object():
    """An API page that shows a lazy top-level name (``fleetlite.Trainer``) reads it from its defining module."""
    import importlib

    pairs = _DIRECTIVE.findall((DOCS / "reference" / "fleetlite.md").read_text())
    assert len(pairs) >= 3

    def resolve(dotted: str):
        module, _, name = dotted.rpartition(".")
        return getattr(importlib.import_module(module), name)

    for source, public in pairs:
        assert resolve(source) is resolve(public), f"reference/fleetlite.md: {source} is not {public}; point it there"


_PAGES_WITH_CODE = [p for p in doc_pages() if any(r is None for _, _, r in python_blocks(p.read_text()))]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", _PAGES_WITH_CODE, ids=[str(p.relative_to(DOCS)) for p in _PAGES_WITH_CODE])
def test_page_python_blocks_run(page, tmp_path, monkeypatch, clean_dist_env):
    _, ran = run_page(page, tmp_path, monkeypatch)
    assert ran == sum(r is None for _, _, r in python_blocks(page.read_text()))


def test_getting_started_program_gives_every_process_the_same_data():
    """The first program runs in every process under a launcher: run twice, it must build the same data and train
    to the same result (unseeded random tensors gave each rank different samples)."""
    import contextlib
    import io

    (_, code, _), *_ = python_blocks((DOCS / "getting-started.md").read_text())
    outputs = []
    for _ in range(2):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, "getting-started.md", "exec"), {})  # noqa: S102 - the docs' own code
        outputs.append(out.getvalue())
    assert outputs[0] == outputs[1] and "acc" in outputs[0], outputs


def test_reference_covers_the_public_faces():
    """The API pages a newcomer looks for: each name has a ``:::`` section (mkdocs --strict checks it resolves)."""
    text = "\n".join(p.read_text() for p in (DOCS / "reference").glob("*.md"))
    shown = set(re.findall(r"^::: (\S+)$", text, re.M)) | set(re.findall(r"^      heading: (\S+)$", text, re.M))
    wanted = {"fleetlite.parallel.DistributedDataParallel", "fleetlite.distributed.spawn",
              "fleetlite.distributed.sharding.group_sharded_parallel", "fleetlite.cli",
              *(f"fleetlite.distributed.fleet.meta_parallel.{n}" for n in (
                  "ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding", "ParallelCrossEntropy",
                  "PipelineLayer", "LayerDesc", "PipelineParallel"))}
    assert not wanted - shown, f"no API section for {sorted(wanted - shown)}"


def test_pages_are_self_contained():
    """Only the pages listed in ``_UNDEFINED`` may use a name their blocks do not define (and only those names)."""
    assert set(_UNDEFINED) <= {p.name for p in doc_pages()}
    assert all(len(names) <= 1 for names in _UNDEFINED.values())  # shrink it, never grow it
