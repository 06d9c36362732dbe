"""The recipes and configs that ship inside the package: where they are, which there are, copying one out.

The recipe scripts live in ``fleetlite/recipes/`` and their Hydra configs in
``fleetlite/conf/`` (package data, so an installed wheel has them; in a
checkout ``recipes/`` and ``conf/`` at the top are links to the same
folders). ``fleetlite ls`` lists them, ``fleetlite run NAME`` runs one and
``fleetlite cp NAME DEST`` copies one out to edit (torchtune's ``tune``
commands). A recipe finds its configs through :data:`CONF_DIR`, so a copied
recipe runs from anywhere.

Example::

    from fleetlite.recipe.catalog import CONF_DIR, find_recipe, recipe_names
    recipe_names()            # ['cifar10']
    find_recipe("cifar10")    # .../fleetlite/recipes/cifar10.py
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["RECIPES_DIR", "CONF_DIR", "recipe_names", "config_names", "config_groups", "find_recipe", "find_config",
           "copy_out", "CatalogError"]

_PACKAGE = Path(__file__).resolve().parent.parent
#: The recipe scripts (``<name>.py``).
RECIPES_DIR = _PACKAGE / "recipes"
#: The Hydra config directory: ``<recipe>.yaml`` primary configs and one folder per config group.
CONF_DIR = _PACKAGE / "conf"


class CatalogError(ValueError):
    """A recipe or config name that does not exist, or a copy that would overwrite a file."""


def recipe_names() -> list[str]:
    """The shipped recipes, by name (``cifar10`` for ``recipes/cifar10.py``)."""
    return sorted(p.stem for p in RECIPES_DIR.glob("*.py") if not p.name.startswith("_"))


def config_names(recipe: str | None = None) -> list[str]:
    """The shipped configs as paths relative to :data:`CONF_DIR` (``cifar10.yaml``, ``model/resnet18.yaml``...).

    With ``recipe``: its primary config first, then the options of the groups it uses: the shared groups
    (``conf/<group>/``) its primary config's defaults name, and its own (``conf/<recipe>/<group>/``).
    """
    files = sorted(p.relative_to(CONF_DIR).as_posix() for p in CONF_DIR.rglob("*.yaml"))
    primary = [f for f in files if "/" not in f]
    if recipe is None:
        return files
    if f"{recipe}.yaml" not in primary:
        return []
    used = _default_groups(CONF_DIR / f"{recipe}.yaml")
    return [f"{recipe}.yaml"] + [f for f in files if "/" in f and (f.startswith(f"{recipe}/") or
                                                                   f.rpartition("/")[0] in used)]


def config_groups(recipe: str) -> dict[str, list[str]]:
    """The config groups recipe ``recipe`` takes, as picked on its command line (``group=option``), with their options:
    ``{"hybrid": ["dp2_mp2", ...]}`` for ``gpt`` (its own ``conf/gpt/hybrid/``), the shared groups for ``cifar10``."""
    groups: dict[str, list[str]] = {}
    for c in config_names(recipe)[1:]:
        group, _, option = c.removeprefix(f"{recipe}/").rpartition("/")
        groups.setdefault(group, []).append(option.removesuffix(".yaml"))
    return groups


def _default_groups(primary: Path) -> set[str]:
    """The config groups a primary config's ``defaults`` list names (``- data: cifar10`` -> ``data``)."""
    import yaml  # PyYAML (omegaconf's dependency); only for fleetlite ls

    entries = (yaml.safe_load(primary.read_text(encoding="utf-8")) or {}).get("defaults") or []
    return {str(k).split("@")[0].strip("/") for e in entries if isinstance(e, dict) for k in e
            if not str(k).startswith("override ")}


def find_recipe(name: str) -> Path:
    """The script of recipe ``name`` (or ``name`` itself when it is an existing ``.py`` file; or ``./name.py`` when
    no shipped recipe has that name)."""
    if name.endswith(".py") and Path(name).is_file():
        return Path(name)
    path = RECIPES_DIR / f"{name.removesuffix('.py')}.py"
    if not path.is_file() and Path(f"{name}.py").is_file():  # a copy fleetlite cp wrote here: ./name.py
        return Path(f"{name}.py")
    if not path.is_file():
        raise CatalogError(f"no recipe named {name!r}; the recipes are: {', '.join(recipe_names())} "
                           "(fleetlite ls lists them with their configs), or give the path of a recipe .py file")
    return path


def find_config(name: str) -> Path:
    """The shipped config ``name``: ``cifar10.yaml``, ``model/resnet18.yaml`` (``.yaml`` may be left out)."""
    rel = name if name.endswith((".yaml", ".yml")) else f"{name}.yaml"
    path = CONF_DIR / rel
    if not path.is_file():
        raise CatalogError(f"no config named {name!r}; the configs are: {', '.join(config_names())}")
    return path


def copy_out(name: str, dest: str | os.PathLike, force: bool = False) -> Path:
    """Copy recipe ``name`` (``cifar10``) or config ``name`` (``cifar10.yaml``, ``optim/sgd.yaml``) to ``dest``.

    ``dest`` may be a directory (the file keeps its name); a ``dest`` without the source's suffix gets it
    (``myrecipe`` -> ``myrecipe.py``, which ``fleetlite run myrecipe`` finds). An existing file is
    not overwritten unless ``force``. Returns the written path.
    """
    src = find_config(name) if name.endswith((".yaml", ".yml")) else find_recipe(name)
    out = Path(dest)
    if out.is_dir():
        out = out / src.name
    elif out.suffix not in ((".yaml", ".yml") if src.suffix == ".yaml" else (".py",)):
        # a recipe is found by its .py (fleetlite run), a config by its .yaml (--config)
        out = out.with_name(out.name + src.suffix)
    if out.exists() and not force:
        raise CatalogError(f"{out} already exists; pass --force to overwrite it, or choose another destination")
    if not out.parent.is_dir():
        raise CatalogError(f"cannot copy to {out}: the folder {out.parent} does not exist; create it first")
    shutil.copyfile(src, out)
    return out
