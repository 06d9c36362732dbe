"""Note [pipeline boundaries]: what one stage hands the next, as Paddle's pipeline passes it.

Paddle's stages pass a tensor, or tuples, lists and dicts of tensors (``{"x": x, "y": [y0, y1]}``), with ``None``
entries as placeholders; ``torch.distributed.pipelining`` sends tuples of tensors only. :class:`BoundaryStage` is a
``PipelineStage`` that flattens each stage's output (``torch.utils._pytree``) into its tensor leaves for torch's
sends and rebuilds the structure on the receiving stage. The structure (the treespec, ``None`` entries included)
travels once, beside torch's own metadata, when the schedule infers the stages' shapes on its first step (and on
each train/eval switch); the first stage takes it from the micro-batch itself. The leaves are the stage's own tensors,
so gradients flow through them unchanged. A structure that is a tuple or list is given to the layers as several
arguments, one other value (a tensor, a dict) as one, as the stages did before.

Example::

    leaves, spec = flatten_boundary({"x": x, "z": None}, "the input")   # (x,), the dict's spec
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.distributed.pipelining import PipelineStage
from torch.utils import _pytree as pytree

__all__ = ["BoundaryStage", "flatten_boundary", "link_stages", "unflatten_boundary"]


Spec = tuple[pytree.TreeSpec, tuple[bool, ...]]  # the structure, and which of its leaves are None


def flatten_boundary(value: Any, what: str) -> tuple[tuple[torch.Tensor, ...], Spec]:
    """The tensor leaves of ``value`` (tensors in tuples, lists and dicts) and its structure, ``None`` entries
    kept in it."""
    leaves, spec = pytree.tree_flatten(value)
    for leaf in leaves:
        if leaf is not None and not isinstance(leaf, torch.Tensor):
            raise TypeError(f"{what} holds a {type(leaf).__name__} ({leaf!r:.40}); pipeline stages pass tensors "
                            "(alone or in tuples, lists and dicts, None as a placeholder) only; make it a tensor or "
                            "drop it")
    return tuple(t for t in leaves if t is not None), (spec, tuple(t is None for t in leaves))


def unflatten_boundary(tensors: Sequence[Any], spec: Spec) -> Any:
    """The value :func:`flatten_boundary` took apart."""
    it = iter(tensors)
    return pytree.tree_unflatten([None if none else next(it) for none in spec[1]], spec[0])


class BoundaryStage(PipelineStage):
    """A ``PipelineStage`` whose module takes and returns tensors in tuples, lists and dicts (Note [pipeline
    boundaries]). ``set_input_spec`` gives the first stage its micro-batches' structure."""

    _in_spec: Spec | None = None
    _out_spec: Spec | None = None
    _prev_local: BoundaryStage | None = None  # the previous stage when it runs on this rank (it passes no meta)
    _last_output: Any = None

    def flatten_inputs(self, micro_batches: list[Any]) -> list[tuple[torch.Tensor, ...]]:
        """The input micro-batches as tuples of tensors (on every stage: a bad batch fails everywhere); the first
        stage keeps their structure for its layers."""
        flat = [flatten_boundary(m, "the pipeline's input") for m in micro_batches]
        if self.is_first:
            self._in_spec = flat[0][1] if flat else None
        return [leaves for leaves, _ in flat]

    def _call(self, leaves: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        spec = self._prev_local._out_spec if self._prev_local is not None else self._in_spec
        if spec is None:  # no structure came with the metadata (another torch's schedule): tensors as torch passes them
            return self.submod(*leaves, **kwargs)
        value = unflatten_boundary(leaves, spec)
        return self.submod(*value, **kwargs) if type(value) in (tuple, list) else self.submod(value, **kwargs)

    def forward_maybe_with_nosync(self, *args: Any, **kwargs: Any) -> Any:
        """torch's forward of one micro-batch: the rebuilt inputs in, the leaves out (the last stage: the output
        itself, for the loss and the gathered outputs)."""
        out = self._call(args, kwargs)
        return out if self.is_last else flatten_boundary(out, f"pipeline stage {self.stage_index}'s output")[0]

    def forward_one_chunk(self, fwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        out = super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)
        if self.is_last:  # torch keeps the outputs to free their graph after backward: their tensors
            _, inputs = self.fwd_cache[fwd_chunk_id]
            self.fwd_cache[fwd_chunk_id] = (tuple(t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)),
                                            inputs)
        return out

    def _compute_outputs(self, *args: Any, module: torch.nn.Module, **kwargs: Any) -> Any:
        """torch's shape inference: the leaves, and their structure kept to send with the metadata."""
        out = self._call(args, kwargs)
        self._last_output = out
        leaves, self._out_spec = flatten_boundary(out, f"pipeline stage {self.stage_index}'s output")
        return leaves

    def _forward_metadata_inference(self, *args: Any, **kwargs: Any) -> Any:
        meta = super()._forward_metadata_inference(*args, **kwargs)
        if self.is_last:  # its loss during backward inference gets the output as the layers returned it
            self._fwd_outputs_for_bwd_meta = (self._last_output,)
        self._last_output = None
        return meta

    def _send_meta(self, meta: Any, dst_stage: int) -> None:
        super()._send_meta((meta, self._out_spec) if dst_stage == self.stage_index + 1 else meta, dst_stage)

    def _recv_meta(self, src_stage: int) -> Any:
        meta = super()._recv_meta(src_stage)
        if src_stage == self.stage_index - 1:
            meta, self._in_spec = meta
        return meta


def link_stages(stages: list[BoundaryStage]) -> None:
    """A stage whose previous stage runs on this rank reads that stage's output structure (no meta is sent)."""
    by_index = {s.stage_index: s for s in stages}
    for s in stages:
        s._prev_local = by_index.get(s.stage_index - 1)
