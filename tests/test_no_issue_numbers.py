"""No internal issue numbers in what users read: messages, comments and docstrings of the package, its configs,
the docs site, the README and CONTRIBUTING. Upstream references
(``pytorch/pytorch#141868``, a URL) are fine: they name where to look."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_INTERNAL = re.compile(r"\bissues?\s+#?\d+\b|(?<![\w/])#\d{1,3}\b(?!\w)", re.I)


def _files() -> list[Path]:
    out = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "mkdocs.yml"]
    for folder, pattern in (("fleetlite", "*.py"), ("fleetlite", "*.yaml"), ("docs", "*.md")):
        out += sorted((ROOT / folder).rglob(pattern))
    return [p for p in out if p.is_file()]


def test_no_internal_issue_numbers():
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in _files()
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if _INTERNAL.search(line)]
    assert not found, "internal issue numbers (say what, not which issue):\n" + "\n".join(found[:20])
