"""Paddle's per-layer pipeline files: ``PipelineLayer.save_state_dict(path)`` / ``set_state_dir(path)``.

Each layer with a state is one file, named as Paddle names it:
``layer_{global index:02d}-tensor_{mp rank:02d}-model_states.pdparams`` (a torch pickle of the layer's
``state_dict``). Only data-parallel rank 0 writes (the replicas hold the same weights); every rank reads its own
stage's layers, the mp rank its own slice's file. With virtual stages Paddle adds ``-virtual_pp_stage_{chunk:02d}``
after the index; the global index alone names a layer already, so the names here stay the same with or without
virtual stages (a directory saved with two chunks a stage loads into one, and back), and Paddle's longer names
are read too.
"""

from __future__ import annotations

import glob
import os
from typing import Any

import torch
import torch.distributed as td

from fleetlite.utils.atomic import atomic_open

__all__ = ["save_state_dict", "set_state_dir"]

PipelineLayer = Any  # .layers imports this module: the type is named, not imported (no import circle)


def _coordinate(layer: PipelineLayer) -> tuple[int, int, int]:
    """(data rank, model rank, model degree) of this rank; (0, 0, 1) without a topology."""
    topo = layer._topo
    if topo is None or not td.is_initialized():
        return 0, 0, 1
    coord = topo.get_coord(td.get_rank())
    return coord.data, coord.model, topo.get_dim("model")


def _layers(layer: PipelineLayer) -> list[tuple[str, Any]]:
    """(file prefix, layer) for each of this rank's layers (each chunk's, when interleaving), by global index."""
    out = []
    for chunk, (first, last) in enumerate(layer._chunk_slices):
        for offset, fn in enumerate(layer.run_function[first:last]):
            out.append((f"layer_{layer._start_poss[chunk] + offset:02d}", fn))
    return out


def save_state_dict(layer: PipelineLayer, path: str | os.PathLike) -> None:
    data_rank, model_rank, _ = _coordinate(layer)
    if data_rank != 0:
        return
    os.makedirs(path, exist_ok=True)
    for prefix, fn in _layers(layer):
        if isinstance(fn, torch.nn.Module):  # plain callables (and shared layers' forward_func) hold no state
            with atomic_open(os.path.join(path, f"{prefix}-tensor_{model_rank:02d}-model_states.pdparams")) as f:
                torch.save(fn.state_dict(), f)


def set_state_dir(layer: PipelineLayer, path: str | os.PathLike) -> None:
    if not os.path.isdir(path):
        raise FileNotFoundError(f"set_state_dir: {os.fspath(path)!r} is not a directory; give the path passed to "
                                "PipelineLayer.save_state_dict")
    _, model_rank, model_degree = _coordinate(layer)
    for prefix, fn in _layers(layer):
        if not isinstance(fn, torch.nn.Module):
            continue
        files = sorted(glob.glob(os.path.join(glob.escape(os.fspath(path)), prefix) + "-*model_states.pdparams"))
        if not files:
            raise FileNotFoundError(f"set_state_dir: no {prefix}*model_states.pdparams in {os.fspath(path)!r}; it "
                                    "was saved from another pipeline (other layers or seg_method)")
        with open(files[model_rank * len(files) // model_degree], "rb") as f:
            fn.load_state_dict(torch.load(f, weights_only=True))
    layer._synchronize_shared_weights()
