"""Exported models: weights as safetensors, a ``torch.export`` program (``.pt2``) or ONNX, config alongside.

``Trainer.export`` calls :func:`export_model`; so can Paddle's ``Model.save(path, training=False)`` (the
hapi face) or any code holding a plain ``nn.Module``. Every format is written atomically (a failed export
leaves no half-written file behind) with the batch dimension dynamic, and next to it ``<stem>.json``: the
configuration given (the recipe's config, for instance), so the model can be rebuilt
(:func:`fleetlite.vision.models.from_safetensors`).

Example::

    import torch
    from fleetlite.trainer.export import export_model, load_safetensors

    net = torch.nn.Sequential(torch.nn.Linear(4, 3))
    export_model(net, "out/net.safetensors", config={"layers": [4, 3]})
    export_model(net, "out/net.pt2", format="torch.export", example_inputs=(torch.randn(2, 4),))
    fresh = load_safetensors(torch.nn.Sequential(torch.nn.Linear(4, 3)), "out/net.safetensors")
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..distributed import collective
from ..utils.atomic import atomic_open, atomic_write_text, default_permissions, fsync_dir, temp_name
from ..utils.weights import config_path, load_safetensors, read_config, require

__all__ = ["FORMATS", "export_model", "load_safetensors", "read_config", "config_path", "example_inputs_of",
           "require"]

#: format -> the file suffix it is written with (added when ``path`` has none).
FORMATS = {"safetensors": ".safetensors", "torch.export": ".pt2", "onnx": ".onnx"}





def example_inputs_of(inputs: Sequence[Any], rows: int = 2) -> tuple[torch.Tensor, ...]:
    """A small CPU copy (``rows`` samples) of a batch's inputs: what export traces with."""
    out = []
    for x in inputs:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"export traces tensor inputs only, got {type(x).__name__}; pass example_inputs=")
        out.append(x[:rows].detach().to("cpu", copy=True))
    return tuple(out)


def _check(format: str, path: Path, example_inputs) -> Path:
    if format not in FORMATS:
        raise ValueError(f"export format={format!r} is not one of {list(FORMATS)}")
    if path.suffix == "":
        path = path.with_suffix(FORMATS[format])
    if format != "safetensors" and not example_inputs:
        raise ValueError(f"export(format={format!r}) traces the model, so it needs example inputs: pass "
                         "example_inputs=(x,) (a batch of inputs), or run fit/evaluate/predict first (the "
                         "Trainer keeps two rows of the first batch it sees)")
    return path


def _two_rows(example_inputs: tuple) -> tuple:
    """Inputs of batch size 1 doubled: torch.export specializes a dimension traced at size 1."""
    return tuple(torch.cat([x, x]) if isinstance(x, torch.Tensor) and x.dim() and x.shape[0] == 1 else x
                 for x in example_inputs)


def _dynamic_batch(example_inputs) -> tuple[dict[int, Any], ...]:
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    return tuple({0: batch} for _ in example_inputs)


def export_model(model: nn.Module, path: str | os.PathLike, format: str = "safetensors",
                 example_inputs: Sequence[torch.Tensor] | None = None, config: Any = None,
                 dynamic_batch: bool = True, state: dict[str, torch.Tensor] | None = None) -> Path:
    """Write ``model`` to ``path`` as ``format`` (``safetensors``, ``torch.export`` or ``onnx``); returns the path.

    ``example_inputs``: a tuple of input tensors (any batch size above 1) for the formats that trace;
    with ``dynamic_batch`` (default) the exported program accepts any batch size. ``config`` (plain,
    JSON-able values) is written to ``<stem>.json`` and, for safetensors, into the file's metadata too.
    The model is exported in eval mode (restored afterwards). ``state``: the full weights to write as
    safetensors instead of ``model.state_dict()`` (a sharded model's gathered state).
    """
    path = _check(format, Path(path), example_inputs)
    if example_inputs is not None and dynamic_batch:
        example_inputs = _two_rows(tuple(example_inputs))
    path.parent.mkdir(parents=True, exist_ok=True)
    was_training = model.training
    model.eval()
    try:
        if format == "safetensors":
            _save_safetensors(model, path, config, state)
        elif format == "torch.export":
            program = _torch_export(model, tuple(example_inputs), dynamic_batch)
            with atomic_open(path, "wb") as f:
                torch.export.save(program, f)
        else:
            _save_onnx(model, path, tuple(example_inputs), dynamic_batch)
    finally:
        model.train(was_training)
    if config is not None:
        atomic_write_text(config_path(path), json.dumps(config, indent=2, sort_keys=True, default=str))
    return path


def _torch_export(model: nn.Module, example_inputs: tuple, dynamic_batch: bool):
    shapes = _dynamic_batch(example_inputs) if dynamic_batch else None
    with torch.no_grad():
        return torch.export.export(model, example_inputs, dynamic_shapes=shapes)


def _save_safetensors(model: nn.Module, path: Path, config: Any, state: dict[str, torch.Tensor] | None = None) -> None:
    st = require("safetensors.torch", "export(format='safetensors')", "safetensors")
    meta = {"format": "pt"}
    if config is not None:
        meta["config"] = json.dumps(config, sort_keys=True, default=str)
    # own contiguous copies: channels-last weights and tied (shared) tensors are both saved as plain tensors
    tensors = {k: v.detach().cpu().clone(memory_format=torch.contiguous_format)
               for k, v in (model.state_dict() if state is None else state).items()}
    tmp = temp_name(path)
    try:
        st.save_file(tensors, str(tmp), metadata=meta)
        default_permissions(tmp)  # safetensors writes 0600; every other artifact is 0644
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _save_onnx(model: nn.Module, path: Path, example_inputs: tuple, dynamic_batch: bool) -> None:
    require("onnxscript", "export(format='onnx')", "onnx")
    require("onnx", "export(format='onnx')", "onnx")
    shapes = _dynamic_batch(example_inputs) if dynamic_batch else None
    tmp = temp_name(path).with_suffix(".onnx")
    names = [f"input_{i}" for i in range(len(example_inputs))] if len(example_inputs) > 1 else ["input"]
    try:
        with torch.no_grad():
            torch.onnx.export(model, example_inputs, str(tmp), dynamo=True, dynamic_shapes=shapes,
                              input_names=names, external_data=False, verbose=False)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()



def example_inputs_of_batch(split_batch, batch: Any) -> tuple[torch.Tensor, ...]:
    """Two rows of a batch's inputs (``split_batch(batch)[0]``), or ``()`` when they are not tensors: what
    ``Trainer.export`` traces with by default (the Trainer keeps the first batch's as ``example_inputs``)."""
    try:
        return example_inputs_of(split_batch(batch)[0])
    except (TypeError, IndexError):
        return ()


def export_collective(network: nn.Module, path: str | os.PathLike, format: str, example: tuple | None,
                      config: Any, dynamic_batch: bool, full_state: Callable[[], dict] | None = None) -> Path:
    """``Trainer.export``: rank 0 writes (the weights are the same on every rank); every rank returns the path.
    ``full_state``: for a sharded (stage 2/3) or tensor/pipeline-parallel model, gathers its full weights, the
    single-process model's state (collective: every rank calls it)."""
    path = _check(format, Path(path), example)
    full = None
    if full_state is not None:
        if format != "safetensors":
            raise ValueError(f"export(format={format!r}) of a sharded (stage 2/3) or tensor/pipeline-parallel model "
                             "is not supported (no rank holds the whole program): export format='safetensors', load "
                             "it into the single-process model (fleetlite.trainer.export.load_safetensors) and "
                             "export that")
        full = full_state()
    error = None
    if collective.get_rank() == 0:
        try:
            export_model(network, path, format, example, config, dynamic_batch, state=full)
        except Exception as e:  # noqa: BLE001 - re-raised below, after the other ranks know
            error = e
    if collective.get_world_size() > 1:
        failed = collective.all_gather_object(error is not None)
        if any(failed) and error is None:
            raise RuntimeError(f"export to {path} failed on rank 0 (see its error)")
    if error is not None:
        raise error
    return path
