"""Paddle's ``Model.save``/``Model.load`` files: ``{path}.pdparams`` (parameters) and ``{path}.pdopt`` (optimizer
state), as ``paddle.Model.save``/``load`` write and read them, for any Trainer.

Used by ``fleetlite.Model`` and by Paddle's ``ModelCheckpoint``/``EarlyStopping`` callbacks (whichever face runs
them), so it imports neither the Trainer nor the callbacks: it works on the Trainer's public API
(``get_weights``/``set_weights``, ``optimizer``/``user_optimizer``, ``setup``, ``save``/``load``).

# Note [collective hapi save]
Under sharding the weights and the optimizer state are spread over the ranks: gathering them
(``trainer.get_weights()``, the fleet optimizer's ``state_dict()``) is a collective every rank must join, in
the same order. So :meth:`PaddleFiles.save` runs on every rank (``fit``'s callbacks and ``Model.save`` call it on
every rank) and only the *writing* is rank 0's. A rank-0-only gather is the classic hang.

# Note [safe loads]
Every file is read with ``torch.load(..., weights_only=True)``: a crafted ``.pdparams``/``.pdopt`` cannot run
code. The optimizer state (tensors, numbers, strings, nested dicts/lists) and the amp scaler state (floats and
ints under ``'fleet_amp'``) need nothing beyond torch's default allow-list.

Example::

    from fleetlite.trainer.hapi_io import PaddleFiles
    PaddleFiles(trainer).save("ckpt/final")     # ckpt/final.pdparams + ckpt/final.pdopt (collective; rank 0 writes)
    PaddleFiles(trainer).load("ckpt/final", skip_mismatch=False, reset_optimizer=False)
"""

from __future__ import annotations

import os
import pickle
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ..distributed import collective
from ..distributed.fleet.meta_parallel.hybrid_state import (
    full_optimizer_state,
    has_flat_optimizer,
    is_hybrid_module,
    load_flat_optimizer_state,
    load_full_optimizer_state,
)
from ..utils.atomic import atomic_open

__all__ = ["PaddleFiles", "strip_postfix", "paddle_prefix", "safe_load", "spec_inputs", "PROGRAM_SUFFIX"]

#: what ``Model.save(path, training=False)`` writes the inference program to: ``{path}.pt2``, a ``torch.export``
#: program saved with ``torch.export.save`` (Paddle names its program ``{path}.pdmodel``; ``torch.export.load``
#: expects ``.pt2`` and warns on another name, so torch's name is kept).
PROGRAM_SUFFIX = ".pt2"

_POSTFIXES = (".pdparams", ".pdopt", ".pdmodel", ".pt2")


def strip_postfix(path: str) -> str:
    """``path`` without a Paddle postfix (``ckpt/final.pdparams`` -> ``ckpt/final``)."""
    for p in _POSTFIXES:
        if path.endswith(p):
            return path[: -len(p)]
    return path


def paddle_prefix(path: str | os.PathLike) -> str | None:
    """The ``{prefix}`` of the Paddle files ``path`` names for ``Trainer.load``, or None when it names none.

    ``ckpt/final.pdparams``, or ``ckpt/final`` when only ``final.pdparams`` is there (no ``final``, ``final.pt``):
    ``ckpt/final``; a Paddle ``fit(save_dir=...)``/``ModelCheckpoint`` directory (``{epoch}.pdparams``,
    ``final.pdparams``, no fleetlite checkpoint): its ``final``, else its last epoch.
    """
    path = os.fspath(path)
    if path.endswith((".pdparams", ".pdopt")):
        return strip_postfix(path)
    if os.path.isfile(path + ".pdparams") and not os.path.exists(path) and not os.path.exists(path + ".pt"):
        return path
    if not os.path.isdir(path):
        return None
    stems = [n[: -len(".pdparams")] for n in os.listdir(path) if n.endswith(".pdparams")]
    if not stems or any(n.endswith(".pt") or n == "latest" for n in os.listdir(path)):
        return None  # a fleetlite checkpoint directory (or none at all): the Trainer's own lookup
    if "final" in stems:
        return os.path.join(path, "final")
    epochs = [s for s in stems if s.isdigit()]
    return os.path.join(path, max(epochs, key=int)) if epochs else None


def safe_load(path: str) -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU (Note [safe loads]); an unsafe file is refused."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise ValueError(f"refusing to load {path}: it holds objects other than tensors and plain values, which "
                         f"could run code when unpickled ({str(e).splitlines()[0]}); load only files you trust, "
                         "re-saved as plain state dicts") from None


def _atomic_torch_save(obj: Any, path: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with atomic_open(path, "wb") as f:
        torch.save(obj, f)


def spec_inputs(specs) -> tuple[torch.Tensor, ...]:
    """Example inputs built from Paddle's ``InputSpec``s: free dimensions (``None``/-1) are 2, values are zeros of
    the spec's dtype (what ``torch.export`` traces with; the batch dimension stays dynamic)."""
    out = []
    for s in specs:
        shape = [2 if d is None or d == -1 else int(d) for d in getattr(s, "shape", s)]
        dtype = getattr(torch, str(getattr(s, "dtype", "float32")).replace("torch.", ""), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"InputSpec {s!r}: dtype {getattr(s, 'dtype', None)!r} is not a torch dtype name")
        out.append(torch.zeros(shape, dtype=dtype))
    return tuple(out)


def _missing(path: str, prefix: str) -> ValueError:
    return ValueError(f"Model.load({path!r}): no parameter file {prefix}.pdparams (Model.save(path) writes it), "
                      f"nor {prefix}.pt (Model.save(path, training=False) writes it), nor a checkpoint at {path}; "
                      "check the path")


class PaddleFiles:
    """Paddle's files of one Trainer: ``{path}.pdparams``/``{path}.pdopt`` (``save``/``load``, Paddle's
    ``Model.save``/``Model.load``) and the inference program ``{path}.pt2`` (``save_program``).

    Example::

        PaddleFiles(trainer).save("ckpt/final")      # ckpt/final.pdparams, ckpt/final.pdopt
    """

    def __init__(self, trainer) -> None:
        self.trainer = trainer

    def _optimizer_state(self) -> dict[str, Any] | None:
        """The full optimizer state (collective under sharding and hybrid parallel, full on rank 0), or None without
        an optimizer. A hybrid model's is the single-process model's state in torch's flattened, parameter-named
        form (Note [hybrid full state]): the index-keyed form names no parameter, so it could not be split again."""
        opt = self.trainer.optimizer if self.trainer.optimizer is not None else self.trainer.user_optimizer
        if opt is None:
            return None
        if self._hybrid():
            self.trainer.setup()
            return full_optimizer_state(self.trainer.network, self.trainer.optimizer,
                                        getattr(self.trainer.parallel_network, "pp_group", None))
        return opt.state_dict()

    def _hybrid(self) -> bool:
        """Whether the ranks hold different parts of the model (tensor-parallel slices, pipeline stages)."""
        return collective.is_initialized() and is_hybrid_module(self.trainer.network)

    def _sharded(self) -> bool:
        """Whether the run shards weights or optimizer state (the strategy says so, or the model is hybrid), so a
        save must be collective."""
        strategy = self.trainer.strategy
        sharding = strategy is not None and strategy.sharding_enabled and collective.is_initialized()
        return sharding or self._hybrid()

    def save(self, path: str) -> None:
        """Write ``{path}.pdparams`` and ``{path}.pdopt``; rank 0 writes.

        Under sharding and hybrid parallelism it is collective (Note [collective hapi save]): every rank calls it,
        and it returns on every rank once rank 0 has written (or raises on every rank when rank 0 could not); a
        hybrid model's files hold the full model and its full optimizer state, which load into one process or any
        degrees. Without sharding nothing is gathered, so a rank-0-only call works too, as Paddle's ``Model.save``.
        """
        path = strip_postfix(os.fspath(path))
        together = self._sharded()
        weights = self.trainer.get_weights()  # collective under sharding
        opt_state = self._optimizer_state()  # collective under sharding
        error = None
        if collective.get_rank() == 0:
            try:
                _atomic_torch_save(weights, path + ".pdparams")
                if opt_state:
                    _atomic_torch_save(opt_state, path + ".pdopt")
            except OSError as e:
                if not together:
                    raise
                error = f"rank 0 could not write {path}.pdparams/.pdopt: {e}"
        if together:  # also the barrier: the files exist when save returns, on every rank
            error = collective.all_gather_object(error)[0]
            if error is not None:
                raise OSError(f"{error}; check that the directory is writable and has space")

    def save_program(self, path: str, example_inputs: tuple[torch.Tensor, ...]) -> str | None:
        """Write the inference program ``{path}.pt2``: a ``torch.export`` program of ``trainer.network`` in eval
        mode, traced with ``example_inputs``, batch dimension dynamic (``Trainer.export``; rank 0 writes). It runs
        without the model's class: ``torch.export.load(path + ".pt2").module()(x)``. A sharded (stage 2/3) model
        is not exported (the program of one rank's shards would be wrong): a warning says so and None is returned."""
        program = strip_postfix(path) + PROGRAM_SUFFIX
        if self.trainer.parallel_network.is_sharded:
            warnings.warn(f"Model.save({path!r}, training=False) under sharding stage 2/3 or tensor/pipeline "
                          f"parallelism wrote the (full) weights "
                          f"({strip_postfix(path)}.pt) but not the inference program {program}: load the weights into "
                          "the plain network in one process and call save(path, training=False) there", stacklevel=3)
            return None
        if not example_inputs:
            raise RuntimeError(f"Model.save({path!r}, training=False) wrote the weights ({strip_postfix(path)}.pt) but "
                               f"cannot trace the inference program {program}: the batches seen hold no tensor inputs; "
                               "pass Model(net, inputs=[InputSpec([None, ...], 'float32', 'x')])")
        self.trainer.export(program, format="torch.export", example_inputs=example_inputs)
        return program

    def load(self, path: str, skip_mismatch: bool, reset_optimizer: bool,
                    other: Callable[[str, bool, bool], Any] | None = None) -> None:
        """Paddle's ``Model.load``: the parameters of ``{path}.pdparams`` and, unless ``reset_optimizer``, the optimizer
        state of ``{path}.pdopt``. Without ``.pdparams``: what ``save(path, training=False)`` wrote (``{path}.pt``) or
        a fleetlite checkpoint at ``path``, read by ``other(path, skip_mismatch, reset_optimizer)`` (default:
        ``trainer.load``, the Trainer's loader)."""
        path = os.fspath(path)
        prefix = strip_postfix(path)
        params_path = prefix + ".pdparams"
        if not os.path.isfile(params_path):
            for candidate in (prefix + ".pt", path):
                if os.path.exists(candidate) and candidate != params_path:
                    (other or self.trainer.load)(candidate, skip_mismatch, reset_optimizer)
                    return
            raise _missing(path, prefix)
        state = safe_load(params_path)
        if not state:
            raise ValueError(f"Failed to load parameters, please check path: {params_path} is empty")
        opt_path = prefix + ".pdopt"
        opt_state = None
        if not reset_optimizer and os.path.isfile(opt_path) and self.trainer.user_optimizer is not None:
            opt_state = safe_load(opt_path)  # read (and checked) before any weight changes
        flat_opt = opt_state is not None and has_flat_optimizer("optim." + str(k) for k in opt_state)
        hybrid = self._hybrid()
        if hybrid and opt_state is not None and not flat_opt:
            raise ValueError(f"{opt_path} holds the optimizer state in torch's index-keyed form (a single-process "
                             "save), which names no parameter, so it cannot be split over tensor-parallel ranks or "
                             "pipeline stages; load the weights only with reset_optimizer=True, or save from the "
                             "hybrid run (its .pdopt names each parameter)")
        if hybrid:
            self.trainer.setup()  # wrapped: the full weights are gathered (collective), the shapes to check against
        own = self.trainer.get_weights() if hybrid else self.trainer.network.state_dict()
        matched = {}
        for key, param in own.items():
            try:
                if key not in state:
                    raise ValueError(f"{key} is not found in the providing file.")
                if tuple(state[key].shape) != tuple(param.shape):
                    raise ValueError(f"{key} receives a shape {list(state[key].shape)}, but the expected shape is "
                                     f"{list(param.shape)}.")
            except ValueError as err:
                if skip_mismatch:
                    warnings.warn(f"Skip loading for {key}. {err}", stacklevel=3)
                    continue
                raise
            matched[key] = state[key]
        if hybrid:
            full = own
        else:
            full = self.trainer.get_weights() if len(matched) < len(own) else {}  # collective under sharding
        full.update(matched)
        self.trainer.set_weights(full)
        if opt_state is not None:
            self.trainer.setup()
            if hybrid:
                load_full_optimizer_state(self.trainer.network, self.trainer.optimizer, opt_state)
            elif flat_opt:  # a hybrid run's: by parameter name
                load_flat_optimizer_state(self.trainer.network, self.trainer.optimizer, opt_state)
            else:
                self.trainer.optimizer.load_state_dict(opt_state)  # collective under sharding
