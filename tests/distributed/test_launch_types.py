"""The type check `make test` runs (mypy, settings in pyproject.toml's [tool.mypy]) is strict enough that a wrong
call of a public function, a body that disagrees with its signature and an unannotated function all fail."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: the interpreter that has mypy (this one, from the dev extra; FLEETLITE_MYPY_PYTHON names another)
MYPY_PYTHON = os.environ.get("FLEETLITE_MYPY_PYTHON", sys.executable)

BAD = textwrap.dedent("""
    from fleetlite.distributed.collective import init_parallel_env
    from fleetlite.distributed.env import read_env

    read_env(5)
    init_parallel_env(timeout="soon")


    def rank_of_worker() -> int:
        return read_env().source


    def untyped(x):
        return x
""")


def _mypy(*args: str) -> subprocess.CompletedProcess:
    if MYPY_PYTHON == sys.executable:
        pytest.importorskip("mypy", reason="mypy comes with the dev extra (pip install -e '.[dev]')")
    cmd = [MYPY_PYTHON, "-m", "mypy", "--python-executable", sys.executable,
           "--config-file", str(ROOT / "pyproject.toml"), *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_checked_modules_pass_and_the_settings_catch_wrong_signatures(tmp_path):
    res = _mypy()  # what make test runs
    assert res.returncode == 0, res.stdout[-3000:]
    bad = tmp_path / "bad.py"
    bad.write_text(BAD)
    res = _mypy(str(bad))
    assert res.returncode == 1
    out = res.stdout
    assert 'Argument 1 to "read_env" has incompatible type "int"' in out
    assert 'Argument "timeout" to "init_parallel_env" has incompatible type "str"' in out
    assert 'Incompatible return value type (got "str", expected "int")' in out
    assert "Function is missing a type annotation" in out


def test_the_package_says_it_is_typed():
    assert (ROOT / "fleetlite" / "py.typed").is_file()
    assert '"py.typed"' in (ROOT / "pyproject.toml").read_text()  # shipped in the wheel (package-data)
