"""The recipes from an installed wheel (torchtune's model): build the wheel, install it into a fresh virtual
environment outside the checkout, then ``fleetlite ls``, ``fleetlite cp`` and ``fleetlite run`` there.

The fresh environment gets this environment's third-party packages (torch, hydra...) through a ``.pth`` line,
but not the checkout: it runs from a temporary directory, without PYTHONPATH, and must import fleetlite from the
wheel it installed.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ["data=synthetic", "data.train_size=64", "data.test_size=32", "trainer.epochs=1",
        "trainer.global_batch_size=32", "trainer.callbacks.progress=false", "trainer.plot=false"]


def _sh(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the fresh environment's bin directory, its environment variables, a working directory outside the checkout)"""
    tmp = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["OMP_NUM_THREADS"] = "1"
    src = tmp / "src"  # a copy: the build writes build/ and *.egg-info next to pyproject.toml
    shutil.copytree(ROOT / "fleetlite", src / "fleetlite", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    _sh([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-q", "-w",
         str(tmp / "dist")], src, env)
    (wheel,) = (tmp / "dist").glob("fleetlite-*.whl")
    venv = tmp / "venv"
    _sh([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp, env)
    py = venv / "bin" / "python"
    purelib = Path(_sh([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp,
                       env).stdout.strip())
    # this environment's packages (torch, hydra-core, ...) after the venv's own; its editable fleetlite is not seen
    (purelib / "_host_packages.pth").write_text("\n".join([sysconfig.get_paths()["purelib"],
                                                           *site.getsitepackages()]) + "\n")
    _sh([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q", str(wheel)],
        tmp, env)
    work = tmp / "work"
    work.mkdir()
    where = _sh([str(py), "-c", "import fleetlite; print(fleetlite.__file__)"], work, env).stdout.strip()
    assert where.startswith(str(purelib)), f"fleetlite came from {where}, not from the installed wheel"
    return venv / "bin", env, work


@pytest.mark.timeout(60)
def test_ls_lists_the_recipes_and_their_configs(installed):
    bin_dir, env, work = installed
    out = _sh([str(bin_dir / "fleetlite"), "ls"], work, env).stdout
    assert "cifar10      cifar10.yaml" in out
    assert "model/: fast, resnet18, tutorial_cnn" in out and "strategy/: " in out


@pytest.mark.timeout(60)
def test_cp_copies_a_recipe_and_a_config_and_refuses_to_overwrite(installed):
    bin_dir, env, work = installed
    exe = str(bin_dir / "fleetlite")
    _sh([exe, "cp", "cifar10", "./my_recipe.py"], work, env)
    _sh([exe, "cp", "cifar10.yaml", "./my.yaml"], work, env)
    assert "def train(cfg: DictConfig)" in (work / "my_recipe.py").read_text()
    assert "defaults:" in (work / "my.yaml").read_text()
    again = subprocess.run([exe, "cp", "cifar10.yaml", "./my.yaml"], capture_output=True, text=True, cwd=work,
                           env=env, timeout=60)
    assert again.returncode != 0 and "my.yaml already exists; pass --force to overwrite it" in again.stderr
    _sh([exe, "cp", "--force", "cifar10.yaml", "./my.yaml"], work, env)


@pytest.mark.timeout(120)
def test_run_a_shipped_recipe_and_a_copied_one_with_torchrun_options(installed):
    bin_dir, env, work = installed
    exe = str(bin_dir / "fleetlite")
    out = _sh([exe, "run", "--nproc_per_node", "1", "cifar10", *TINY, f"run_dir={work / 'a'}"], work, env)
    assert "final validation accuracy" in out.stdout and (work / "a" / "checkpoints" / "latest.pt").is_file()

    # a copied recipe with a copied (edited) config: the groups still come from the package
    _sh([exe, "cp", "--force", "cifar10", "./mine.py"], work, env)
    _sh([exe, "cp", "--force", "cifar10.yaml", "./mine.yaml"], work, env)
    yaml = work / "mine.yaml"
    yaml.write_text(yaml.read_text().replace("\nseed: 0\n", "\nseed: 5\n"))
    _sh([exe, "run", "./mine.py", "--config", "./mine.yaml", *TINY, f"run_dir={work / 'b'}"], work, env)
    assert "\nseed: 5\n" in (work / "b" / ".hydra" / "config.yaml").read_text()


@pytest.mark.timeout(120)
def test_help_after_a_wheel_install_shows_commands_that_work_there(installed):
    bin_dir, env, work = installed
    exe = str(bin_dir / "fleetlite")
    out = _sh([exe, "run", "--help"], work, env).stdout  # exit 0, the recipes listed
    assert "cifar10" in out and "gpt" in out
    out = _sh([exe, "run", "cifar10", "--help"], work, env).stdout
    assert "recipes/" not in out and "fleetlite run cifar10" in out  # no checkout path: there is no checkout


@pytest.mark.timeout(120)
def test_cp_to_a_name_without_py_then_run_by_that_name(installed):
    bin_dir, env, work = installed
    exe = str(bin_dir / "fleetlite")
    _sh([exe, "cp", "cifar10", "myrecipe"], work, env)
    assert (work / "myrecipe.py").is_file() and not (work / "myrecipe").exists()
    out = _sh([exe, "run", "myrecipe", "--help"], work, env).stdout
    assert "== Configuration groups ==" in out
