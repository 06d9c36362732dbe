"""Paddle's pipeline model description: ``LayerDesc``, ``SharedLayerDesc``, ``SegmentLayers``, ``PipelineLayer``.

A :class:`PipelineLayer` is given the whole model as a list of layer
descriptions and builds only the layers of this rank's stage, so a model
that no single device holds can be described in one place. Segmentation
follows Paddle (``seg_method="uniform"``, ``"layer:ClassName"`` or a list of
boundaries); ``num_virtual_pipeline_stages`` gives each stage several
interleaved chunks (Note [virtual pipeline stages]).

Note [pipeline rank layout]: without a topology the ranks are laid out as
Paddle's default ``CommunicateTopology(["data", "pipe", "model"], [dp, pp, 1])``:
rank ``r`` is stage ``r % pp`` of pipeline ``r // pp``. With a topology (or a
``HybridCommunicateGroup``'s) its ``get_coord(rank).pipe`` and
``get_comm_list("pipe")`` decide. Either way the layout is read from the topology's
:class:`~fleetlite.distributed.fleet.plan.ParallelPlan` (its ``pp`` coordinate, degree and
``comm_list("pp")``: :func:`stage_plan`), as ``fleet``'s groups are. Every rank creates every
group in the same order (``new_group`` is collective).

Example (2 ranks, each builds one of the two ``Linear`` layers)::

    from torch import nn
    from fleetlite.distributed.fleet.meta_parallel import LayerDesc, PipelineLayer

    model = PipelineLayer([LayerDesc(nn.Linear, 8, 8), nn.ReLU(), LayerDesc(nn.Linear, 8, 2)],
                          num_stages=2, loss_fn=nn.CrossEntropyLoss())
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as td
from torch import nn
from torch.utils.checkpoint import checkpoint

from ...base.topology import PADDLE_TO_MESH, CommunicateTopology
from ...plan import ParallelPlan

logger = logging.getLogger("fleetlite")

__all__ = ["LayerDesc", "SharedLayerDesc", "SegmentLayers", "PipelineLayer"]


class LayerDesc:
    """A layer not built yet: ``layer_class(*inputs, **kwargs)``, built only on the stage that runs it."""

    def __init__(self, layer_func: type[nn.Module], *inputs: Any, **kwargs: Any) -> None:
        if not (isinstance(layer_func, type) and issubclass(layer_func, nn.Module)):
            raise TypeError(f"LayerDesc needs a torch.nn.Module subclass, got {layer_func!r}")
        self.layer_func = layer_func
        self.inputs = inputs
        self.kwargs = kwargs

    def build_layer(self) -> nn.Module:
        return self.layer_func(*self.inputs, **self.kwargs)

    def __repr__(self) -> str:
        args = [repr(a) for a in self.inputs] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{self.layer_func.__name__}({', '.join(args)})"


class SharedLayerDesc(LayerDesc):
    """A layer shared by several positions of the model (e.g. the embedding and the tied output head).

    Every position with the same ``key`` uses one layer; on different stages
    the copies start from the first stage's weight and the gradient of
    ``shared_weight_attr`` (a name, or a list of names as Paddle takes) is summed across them after backward, so
    they stay equal. ``forward_func(layer, x)`` replaces ``layer(x)`` at that position.
    """

    def __init__(self, key: str, layer_func: type[nn.Module], forward_func: Callable[..., Any] | None = None,
                 shared_weight_attr: str | Sequence[str] = "weight", *inputs: Any, **kwargs: Any) -> None:
        super().__init__(layer_func, *inputs, **kwargs)
        self.layer_name = key
        self.forward_func = forward_func
        self.shared_weight_attr = shared_weight_attr


def _tied_attrs(descs: Sequence[Any], key: str) -> list[str]:
    """The attributes tied under ``key``: every position's ``shared_weight_attr``, in order, each once, so the
    stages agree however the positions (Paddle lets each name a subset) are split among them."""
    names: list[str] = []
    for d in descs:
        if isinstance(d, SharedLayerDesc) and d.layer_name == key:
            attrs = d.shared_weight_attr
            for a in [attrs] if isinstance(attrs, str) else attrs:
                if a not in names:
                    names.append(a)
    return names


class SegmentLayers:
    """Paddle's partition of ``len(layers_desc)`` layers into ``num_parts`` stages (times
    ``num_virtual_pipeline_stage`` chunks each when interleaving): the boundaries, one more than the parts.

    ``method``: ``"uniform"``, ``"layer:ClassName"`` (equal counts of the layers whose class matches), or a list
    of boundaries as Paddle's (``[0, 2, 4]`` for two parts of four layers; the last boundary may be left out).
    """

    def __init__(self, layers_desc: Sequence[Any], num_parts: int, method: str | Sequence[int] = "uniform",
                 num_virtual_pipeline_stage: int | None = None) -> None:
        self._layers_desc = list(layers_desc)
        self.method = list(method) if isinstance(method, (list, tuple)) else method
        self.num_parts = num_parts
        self.num_virtual_pipeline_stage = num_virtual_pipeline_stage
        self.total_parts = num_parts * (num_virtual_pipeline_stage or 1)
        self.num_items = len(self._layers_desc)
        if self.num_items < self.total_parts:
            virtual = (num_virtual_pipeline_stage or 1) > 1
            chunks = f" x {num_virtual_pipeline_stage} virtual" if virtual else ""
            raise ValueError(f"the pipeline has {self.num_items} layer(s) for {num_parts} stages{chunks}: every "
                             f"stage needs at least one layer; use fewer stages (pp_degree"
                             f"{' or num_virtual_pipeline_stages' if virtual else ''}) or describe more layers")

    def do_segment(self) -> list[int]:
        if isinstance(self.method, list):
            return self._boundaries(self.method)
        if self.method == "uniform":
            return self.uniform(self.num_items, self.total_parts)
        if isinstance(self.method, str) and self.method.startswith("layer:"):
            weights = [0] * self.num_items
            for idx in self._gen_layer_weight(self.method.split(":", 1)[1]):
                weights[idx] = 1
            parts = self.total_parts
            if sum(weights) % parts:
                raise ValueError(f"seg_method={self.method!r} matches {sum(weights)} layer(s), which do not divide "
                                 f"evenly into {parts} stages; use a layer count that is a multiple of "
                                 "the stages or seg_method='uniform'")
            part_size = sum(weights) // parts
            result = [0] * (parts + 1)
            counter, result_idx = 0, 1
            for idx, weight in enumerate(weights):
                counter += weight
                if counter == part_size:
                    result[result_idx] = idx + 1
                    result_idx += 1
                    counter = 0
            result[parts] = self.num_items
            return result
        raise ValueError(f"unknown seg_method {self.method!r}: use 'uniform', 'layer:ClassName' or a list of "
                         "boundaries such as [0, 2, 4]")

    def _boundaries(self, bounds: list[Any]) -> list[int]:
        """Paddle's list form: ``total_parts + 1`` boundaries from 0, or ``total_parts`` (the end is added)."""
        parts = self.total_parts
        if len(bounds) == parts:
            bounds = [*bounds, self.num_items]
        ok = (len(bounds) == parts + 1 and all(isinstance(b, int) and not isinstance(b, bool) for b in bounds)
              and bounds[0] == 0 and bounds[-1] == self.num_items
              and all(a < b for a, b in zip(bounds, bounds[1:])))
        if not ok:
            raise ValueError(f"seg_method={bounds} is not a list of {parts + 1} increasing layer boundaries from 0 "
                             f"to {self.num_items} (one per stage plus the end, e.g. "
                             f"{self.uniform(self.num_items, parts)}); every stage needs at least one layer")
        return list(bounds)

    def _gen_layer_weight(self, layername: str) -> list[int]:
        regex = re.compile(layername, re.IGNORECASE)
        idxs = []
        for idx, layer in enumerate(self._layers_desc):
            if isinstance(layer, LayerDesc):
                name = layer.layer_func.__name__
            elif isinstance(layer, nn.Module):
                name = type(layer).__name__
            else:
                name = getattr(layer, "__name__", None)
            if name is not None and regex.search(name):
                idxs.append(idx)
        if not idxs:
            raise ValueError(f"seg_method='layer:{layername}' matches no layer of the pipeline; name a layer class "
                             "that appears in the layers list")
        return idxs

    def uniform(self, num_items: int, num_parts: int) -> list[int]:
        """Equal parts; the remainder goes one layer each to the last stages (as Paddle)."""
        result = [0] * (num_parts + 1)
        part_size = math.floor(num_items / num_parts)
        extra = num_items % num_parts
        for i in range(1, num_parts):
            offset = 1 if i > (num_parts - extra) else 0
            result[i] = int(min(result[i - 1] + part_size + offset, num_items))
        result[num_parts] = num_items
        return result


@dataclass
class StageLayout:
    """Where this rank sits in the pipelines: its stage, and every pipeline's ranks ordered by stage, as the
    :class:`~fleetlite.distributed.fleet.plan.ParallelPlan` of the topology lays them out (Note [pipeline rank
    layout])."""

    stage_id: int
    num_stages: int
    pipelines: list[list[int]]  # one list per pipeline (data/model/sharding coordinate), ranks by stage

    @classmethod
    def of_plan(cls, plan: ParallelPlan) -> StageLayout:
        """The layout the plan gives: its ``pp`` coordinate and degree, and its ``pp`` groups."""
        return cls(plan.coord["pp"], plan.pp, plan.comm_list("pp"))

    @classmethod
    def resolve(cls, num_stages: int | None, topology: Any | None) -> StageLayout:
        """The layout of ``PipelineLayer(num_stages=, topology=)`` (Paddle's arguments and checks)."""
        return cls.of_plan(stage_plan(num_stages, topology))


def stage_plan(num_stages: int | None, topology: Any | None) -> ParallelPlan:
    """The plan of a ``PipelineLayer``'s topology: ``topology``'s axes (a ``CommunicateTopology``, an HCG's), else
    Paddle's default ``CommunicateTopology(["data", "pipe", "model"], [world // num_stages, num_stages, 1])``;
    no process group is created. Paddle's checks: ``num_stages`` agrees with the topology's pipe degree and
    divides the world size (Note [pipeline rank layout])."""
    rank, world = (td.get_rank(), td.get_world_size()) if td.is_initialized() else (0, 1)
    if topology is None:
        if not num_stages:
            raise ValueError("PipelineLayer needs num_stages or topology (e.g. topology=hcg.topology())")
        if world % num_stages:
            raise ValueError(f"num_stages={num_stages} does not divide the world size {world}; use a number of "
                             "stages that divides the number of ranks")
        topology = CommunicateTopology(["data", "pipe", "model"], [world // num_stages, num_stages, 1])
    names = topology.get_hybrid_group_names()
    pp = topology.get_dim("pipe")
    if num_stages and num_stages != pp:
        raise ValueError(f"num_stages={num_stages} but the topology has {pp} pipeline stages; "
                         "pass one or make them agree")
    return ParallelPlan({PADDLE_TO_MESH.get(n, n): topology.get_dim(n) for n in names},
                        [PADDLE_TO_MESH.get(n, n) for n in names], topology.world_size(), rank=rank)


class _PipelineChunk(nn.Module):
    """One model chunk (virtual stage) of an interleaved :class:`PipelineLayer`: what torch's ``PipelineStage``
    runs. It holds the chunk's layers (for ``parameters()``) without owning their names: the ``PipelineLayer``
    keeps them by global index (Note [virtual pipeline stages]); its forward is the owner's for this chunk."""

    def __init__(self, owner: PipelineLayer, chunk_id: int, layers: dict[str, nn.Module]) -> None:
        super().__init__()
        self._owner = [owner]  # a list: not a submodule (the owner holds the names)
        self.chunk_id = chunk_id
        for name, layer in layers.items():
            self.add_module(name, layer)

    def forward(self, *inputs: Any) -> Any:
        return self._owner[0].forward(*inputs, chunk_id=self.chunk_id)


class PipelineLayer(nn.Module):
    """Paddle's ``PipelineLayer``: this rank's stage of a model given as a list of layers and layer descriptions.

    ``layers`` holds :class:`LayerDesc` / :class:`SharedLayerDesc` (built only
    on their stage), modules and plain callables. ``loss_fn(output, label)``
    runs on the last stage (``label`` as given to ``train_batch``); a list of
    loss functions is Paddle's: all are computed, ``train_batch(...,
    loss_fn_idx=i)`` trains with the ``i``-th. ``seg_method``: ``"uniform"``,
    ``"layer:ClassName"`` or a list of boundaries (:class:`SegmentLayers`).
    ``recompute_interval > 0`` checkpoints every that many layers. Sublayers
    are named by their global index (``"3"``) and shared ones
    ``shared_layers.<key>``, so a state dict names the same weight alike on
    every degree. ``num_virtual_pipeline_stages=v`` interleaves: the layers
    are cut into ``num_stages * v`` chunks and chunk ``i`` runs on stage
    ``i % num_stages`` (Note [virtual pipeline stages]). Give it to
    ``fleet.distributed_model`` with ``pp_degree > 1`` for a
    :class:`~.parallel.PipelineParallel`.
    """

    def __init__(self, layers: Sequence[Any], num_stages: int | None = None, topology: Any | None = None,
                 loss_fn: Callable[..., torch.Tensor] | Sequence[Callable[..., torch.Tensor]] | None = None,
                 seg_method: str | Sequence[int] = "uniform", recompute_interval: int = 0,
                 recompute_ctx: dict[str, Any] | None = None,
                 num_virtual_pipeline_stages: int | None = None) -> None:
        super().__init__()
        virtual = 1 if num_virtual_pipeline_stages is None else num_virtual_pipeline_stages
        if not isinstance(virtual, int) or isinstance(virtual, bool) or virtual < 1:
            raise ValueError(f"num_virtual_pipeline_stages={num_virtual_pipeline_stages!r}: give None or an int >= 1 "
                             "(the model chunks per stage)")
        ctx = {k: v for k, v in (recompute_ctx or {}).items() if k in ("offload", "partition") and v}
        if ctx:
            raise NotImplementedError(f"recompute_ctx {sorted(ctx)} (activation offload/partition) is not supported; "
                                      "recompute_interval alone recomputes inside each stage")
        self._layers_desc = list(layers)
        if num_stages and len(self._layers_desc) < num_stages:  # before the layout: the world may not fit either
            raise ValueError(f"the pipeline has {len(self._layers_desc)} layer(s) for {num_stages} stages: every "
                             "stage needs at least one layer; use fewer stages (pp_degree) or describe more layers")
        if isinstance(loss_fn, (list, tuple)) and (not loss_fn or not all(callable(f) for f in loss_fn)):
            raise ValueError(f"loss_fn={list(loss_fn)!r} is not a list of loss functions; give one, a non-empty "
                             "list of callables (train_batch's loss_fn_idx picks the trained one), or None")
        self._loss_fn = list(loss_fn) if isinstance(loss_fn, (list, tuple)) else loss_fn
        self._topo = topology
        self._recompute_interval = int(recompute_interval)
        self._layout = StageLayout.resolve(num_stages, topology)
        self._stage_id, self._num_stages = self._layout.stage_id, self._layout.num_stages
        if virtual > 1 and self._num_stages == 1:
            raise ValueError(f"num_virtual_pipeline_stages={virtual} needs a pipeline of several stages (num_stages "
                             "or the topology's pp degree > 1); leave it None for one stage")
        self._num_virtual_pipeline_stages = virtual
        self._total_stages_with_virtual_stages = self._num_stages * virtual
        self._num_layers = len(self._layers_desc)
        self.segment_parts = SegmentLayers(self._layers_desc, self._num_stages, seg_method,
                                           virtual if virtual > 1 else None).do_segment()
        # Note [virtual pipeline stages]
        # Paddle's interleave: the layers are cut into pp * v parts and part i runs on stage i % pp, so this rank
        # holds parts stage_id, stage_id + pp, ... (its chunks, virtual stages); torch's interleaved schedules
        # number the stages the same way (stage index i on pipe rank i % pp). The layers stay named by their
        # global index on the PipelineLayer (state dicts, checkpoints and full states as with one chunk); each
        # chunk is a _PipelineChunk over a slice of run_function, which torch's PipelineStage runs.
        parts = range(self._stage_id, self._total_stages_with_virtual_stages, self._num_stages)
        self._start_poss = [self.segment_parts[i] for i in parts]
        self._end_poss = [self.segment_parts[i + 1] for i in parts]
        self._start_pos, self._end_pos = self._start_poss[0], self._end_poss[-1]
        self.shared_layers = nn.ModuleDict()
        self.shared_weight_attrs: dict[str, list[str]] = {}
        self.run_function: list[Callable[..., Any]] = []
        self._chunk_slices: list[tuple[int, int]] = []  # each chunk's run_function[start:end]
        chunk_layers: list[dict[str, nn.Module]] = []
        for start, end in zip(self._start_poss, self._end_poss):
            first = len(self.run_function)
            chunk_layers.append(self._build_layer(start, end))
            self._chunk_slices.append((first, len(self.run_function)))
        self._model_chunks = [_PipelineChunk(self, i, held) for i, held in enumerate(chunk_layers)] \
            if virtual > 1 else None
        self.shared_comm = self._construct_shared_comm()
        self._synchronize_shared_weights()

    def get_stage_from_index(self, layer_idx: int) -> int:
        """The (real) stage holding layer ``layer_idx``: its part's index modulo the stages."""
        if not 0 <= layer_idx < self._num_layers:
            raise IndexError(f"layer index {layer_idx} is out of range [0, {self._num_layers})")
        part = next(p for p in range(self._total_stages_with_virtual_stages)
                    if self.segment_parts[p] <= layer_idx < self.segment_parts[p + 1])
        return part % self._num_stages

    def get_num_virtual_stages(self) -> int:
        return self._num_virtual_pipeline_stages

    def get_model_chunks(self) -> list[nn.Module] | None:
        """This rank's chunks (one module each) when interleaving, else None (Paddle's)."""
        return self._model_chunks

    def _build_layer(self, start: int, end: int) -> dict[str, nn.Module]:
        """Build layers ``start:end`` onto run_function; returns the modules they use (the chunk's, by name)."""
        held: dict[str, nn.Module] = {}
        for index, layer in enumerate(self._layers_desc[start:end], start=start):
            if isinstance(layer, SharedLayerDesc):
                if layer.layer_name not in self.shared_layers:
                    self.shared_layers[layer.layer_name] = layer.build_layer()
                    self.shared_weight_attrs[layer.layer_name] = _tied_attrs(self._layers_desc, layer.layer_name)
                shared = self.shared_layers[layer.layer_name]
                held[f"shared_{layer.layer_name}"] = shared
                self.run_function.append(shared if layer.forward_func is None else partial(layer.forward_func, shared))
            elif isinstance(layer, LayerDesc):
                module = layer.build_layer()
                self.add_module(str(index), module)
                self.run_function.append(module)
                held[str(index)] = module
            elif isinstance(layer, nn.Module):
                self.add_module(str(index), layer)
                self.run_function.append(layer)
                held[str(index)] = layer
            elif callable(layer):
                self.run_function.append(layer)
            else:
                raise TypeError(f"pipeline layer {index} is {type(layer).__name__}: use a LayerDesc, a "
                                "SharedLayerDesc, an nn.Module or a callable")
        return held

    def _shared_weights(self, key: str) -> list[torch.Tensor]:
        return [getattr(self.shared_layers[key], a) for a in self.shared_weight_attrs[key]]

    def _construct_shared_comm(self) -> dict[str, dict[str, Any]]:
        """One group per (shared key, pipeline) over the stages holding that key (Note [pipeline rank layout])."""
        comm: dict[str, dict[str, Any]] = {}
        keys = sorted({d.layer_name for d in self._layers_desc if isinstance(d, SharedLayerDesc)})
        for key in keys:  # with one stage no key spans two stages: no group (nor process group) is needed
            stages = sorted({self.get_stage_from_index(i) for i, d in enumerate(self._layers_desc)
                             if isinstance(d, SharedLayerDesc) and d.layer_name == key})
            if len(stages) < 2:
                continue
            for pipeline in self._layout.pipelines:
                ranks = [pipeline[s] for s in stages]
                group = td.new_group(ranks=ranks)
                if td.get_rank() in ranks:
                    comm[key] = {"ranks": ranks, "group": group, "weight_attr": self.shared_weight_attrs[key],
                                 "layer": self.shared_layers[key]}
        return comm

    @torch.no_grad()
    def _synchronize_shared_weights(self) -> None:
        """Start every copy from the first holder's weight; mark the others' parameters
        ``is_firstly_shared = False`` (Paddle's attribute: a global norm counts a shared weight once)."""
        for layer in self.shared_layers.values():
            for p in layer.parameters():
                p.is_firstly_shared = True
        for key, c in self.shared_comm.items():
            for weight in self._shared_weights(key):
                td.broadcast(weight, src=min(c["ranks"]), group=c["group"])
            for p in c["layer"].parameters():
                p.is_firstly_shared = td.get_rank() == min(c["ranks"])

    def allreduce_shared_weight_gradients(self) -> None:
        """Sum the gradient of every shared weight across the stages that hold it (Paddle's name)."""
        for key, c in self.shared_comm.items():
            for weight in self._shared_weights(key):
                if weight.grad is None:
                    weight.grad = torch.zeros_like(weight)
                td.all_reduce(weight.grad, group=c["group"])

    def forward_function(self, start: int, end: int) -> Callable[..., Any]:
        def execute(*x: Any) -> Any:
            out: Any = x[0] if len(x) == 1 else x
            for layer in self.run_function[start:end]:
                out = layer(out)
            return out
        return execute

    def forward(self, *inputs: Any, chunk_id: int | None = None) -> Any:
        """Run this stage's layers (chunk ``chunk_id``'s when interleaving: Paddle's ``forward(input, chunk_id)``);
        several inputs reach the first layer as one tuple (as Paddle's)."""
        if chunk_id is None:
            if self._num_virtual_pipeline_stages > 1:
                raise ValueError(f"this PipelineLayer holds {len(self._chunk_slices)} model chunks "
                                 "(num_virtual_pipeline_stages > 1); call forward(x, chunk_id=i)")
            chunk_id = 0
        if not 0 <= chunk_id < len(self._chunk_slices):
            raise ValueError(f"chunk_id={chunk_id}: this stage holds chunks 0 to {len(self._chunk_slices) - 1}")
        first, last = self._chunk_slices[chunk_id]
        if self._recompute_interval <= 0 or not torch.is_grad_enabled():
            return self.forward_function(first, last)(*inputs)
        out: Any = inputs
        for start in range(first, last, self._recompute_interval):
            end = min(start + self._recompute_interval, last)
            args = out if isinstance(out, tuple) else (out,)
            out = checkpoint(self.forward_function(start, end), *args, use_reentrant=False)
        return out

    def get_num_stages(self) -> int:
        return self._num_stages

    def save_state_dict(self, path: str) -> None:
        """Paddle's: each of this stage's layers into its own file under ``path`` (data rank 0 writes)."""
        from .layer_files import save_state_dict

        save_state_dict(self, path)

    def set_state_dir(self, path: str) -> None:
        """Paddle's: load this stage's layers from the files ``save_state_dict`` wrote under ``path``."""
        from .layer_files import set_state_dir

        set_state_dir(self, path)

    def get_stage_id(self) -> int:
        return self._stage_id
