"""Saving and restoring a Trainer's training state: one owner for both (Lightning's checkpoint connector).

:class:`CheckpointConnector` writes the state (:meth:`~CheckpointConnector.save`: a checkpoint file;
:meth:`~CheckpointConnector.save_sharded`: a DCP directory), reads the one to resume from
(:meth:`~CheckpointConnector.read`) and puts it back in one ordered method
(:meth:`~CheckpointConnector.restore`, Note [resume order]). ``Trainer.fit(resume=...)``,
``Trainer.load``, ``Trainer.save`` and ``ModelCheckpoint`` all go through it, under every
strategy (data parallel, sharding stages 1-3, tensor and pipeline parallel). The file and directory formats are
:mod:`fleetlite.checkpoint`'s; what a Trainer checkpoint holds is decided here
(:meth:`~CheckpointConnector.state_dict`):

``model`` (unprefixed state_dict) · ``optimizer`` · ``scaler`` (amp) · ``data`` (the training data's
position) · ``progress`` (``FitProgress.state_dict``) · ``ranks`` (per rank: RNG states now and at the
epoch start, the epoch's partial sums: ``FitState.rank_state_dict``) · ``world_size`` · ``callbacks``
(LR schedulers inside their ``LRScheduler``) · ``strategy`` · ``config`` · ``degrees`` (dp, mp, pp) ·
``meta``. A sharded checkpoint (a DCP directory) holds the model and optimizer as shards and the rest as
``trainer.pt``.

# Note [per-rank state]
Under local SGD (weights and momentum differ between averagings) and DGC (each rank's unsent residuals) the ranks'
model and optimizer states differ, so rank 0's alone cannot resume the run: each rank's entry of ``ranks`` then
also holds ``state`` (``{"model": this rank's module state_dict, "optimizer": its optimizer state_dict}``, on the
CPU), written in the same atomic file (or ``trainer.pt``) as the rest. A resume on the same ranks and degrees loads
each rank's own after the shared model and optimizer (step (2) of Note [resume order]); elsewhere every rank resumes
from rank 0's, with a warning. Whether the ranks differ is the optimizer's to say (``meta.rank_local``); plain data
parallel checkpoints hold no ``state`` and old checkpoints load as before.

# Note [hybrid checkpoints in the Trainer]
A tensor- or pipeline-parallel model is checkpointed as a DCP directory whatever asked for the checkpoint
(``ModelCheckpoint``, ``fit(save_dir=...)``, ``Trainer.save``/``save_checkpoint``: a ``NAME.pt`` path becomes
the directory ``NAME/``): no rank holds the whole model or optimizer, and a gathered file would be written
from rank 0's optimizer state alone. Each rank's per-rank entry also holds the model-parallel RNG tracker's
states (dropout inside tensor-parallel regions), put back with the other RNG states. The checkpoint records
the hybrid degrees: at an epoch end it loads into any degrees (DCP reshards: mp 2 -> 1, pp 2 -> 1, dp 2 -> 4);
saved mid-epoch it resumes only on the same degrees (the data position and random streams are per
data-parallel rank).

A resume (``Trainer.fit(resume=...)``) runs in five modules: :mod:`fleetlite.trainer.trainer` (``fit``),
:mod:`fleetlite.trainer.fit_setup` (reads and checks the checkpoint through :meth:`~CheckpointConnector.read`),
this one (:meth:`~CheckpointConnector.restore`), the :mod:`fleetlite.checkpoint` package (lookup, files,
DCP, RNG) and :mod:`fleetlite.trainer.fit_loop` (the loop and its progress, which calls ``restore``).

# Note [saves in flight]
An asynchronous save (``ModelCheckpoint(async_save=True)``) commits only when
waited on, collectively. Every way a fit ends settles the one in flight:
the normal end, ``stop_training``, a preemption signal and TerminateOnNaN's
stop commit it (:meth:`CheckpointConnector.finish_saves`, after
``on_train_end``), and so does TerminateOnNaN's ``NonFiniteLossError``
(raised on every rank at the same step). Any other exception may be one
rank's alone, where a collective wait could hang: the save is then left
uncommitted and a warning says so (:meth:`CheckpointConnector.abandon_saves`);
``latest`` keeps naming the previous checkpoint. The save requests of the step
that stopped on a non-finite loss never run (``Trainer.run_pending_saves``).

# Note [resume replay]
A loader without a DistributedBatchSampler has no position to save; it is
resumed by re-creating the epoch's iterator from the epoch-start RNG states
and skipping the batches already consumed. This is exact for deterministic
loaders (``num_workers=0``) at the same world size.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch

from .. import __version__
from ..checkpoint import (
    RANK0_FILE,
    CheckpointError,
    LoadedCheckpoint,
    PendingSave,
    load_checkpoint,
    on_every_rank,
    read,
    resolve,
    restore_rng_state,
    save,
    save_checkpoint,
)
from ..checkpoint.torch_state import app_state, check_finite, check_optimizer, load_app_state, optimizer_name
from ..distributed import collective
from ..distributed.fleet.meta_parallel import get_rng_state_tracker
from ..parallel.wrapped import StateLayout
from ..utils.user_warning import warn_user
from ..utils.weights import strip_compile_prefix

__all__ = ["CheckpointConnector", "Resumed", "REQUIRED"]

REQUIRED = ("model", "progress", "ranks", "world_size", "callbacks")  # the entries a resumable checkpoint has

_RESUME_HINT = ("resume with the optimizer it was trained with (recipes: the same optim=...), or start a new run from "
                "its weights with Trainer.load(path, reset_optimizer=True)")


class Resumed(NamedTuple):
    """Where a restored fit continues: ``epoch``, and for a checkpoint saved mid-epoch that epoch's ``batches``
    (positioned after the ones already done), else None; ``exhausted``: the saved pass had no batch left (only
    its epoch's end was missing)."""

    epoch: int
    batches: Iterator | None
    exhausted: bool = False


class CheckpointConnector:
    """Save and restore one Trainer's training state (every strategy; collective where the model is sharded).

    Example::

        conn = trainer.checkpoint_connector
        conn.save("ckpt/step-00000010.pt", latest=True)     # collective; rank 0 writes
        found = conn.read("latest", "ckpt", train)           # on every rank, checked before any work
    """

    def __init__(self, trainer) -> None:
        self.trainer = trainer
        self._in_flight: PendingSave | None = None  # the asynchronous save not yet committed
        self._requests: list[Callable[[], None]] = []  # Note [checkpoint timing]

    # -- save ---------------------------------------------------------------------------------------------------
    def save(self, path: str | Path, latest: bool = False) -> Path:
        """Write the full training state as a checkpoint file (collective; rank 0 writes, every rank returns the
        path or raises the same error). With ``latest`` non-finite weights are refused (``latest.pt`` stays)."""
        path = Path(path)
        if self.layout.partial:  # Note [hybrid checkpoints in the Trainer]
            directory = path.with_suffix("") if path.suffix == ".pt" else path
            if latest and directory.name == "latest":
                raise ValueError(f"{path}: a hybrid-parallel model checkpoints to a directory, and 'latest' is the "
                                 "pointer's name; choose another name")
            return self.save_sharded(directory, latest=latest).final
        state = self.state_dict()
        error = None
        if state is not None:
            try:
                if latest:
                    check_finite(state["model"], path)
                save_checkpoint(state, path, latest=latest)
            except CheckpointError as e:
                error = e.problem
            except TypeError as e:
                error = f"TypeError: {e}"
        if collective.is_initialized():
            error = collective.all_gather_object(error)[0]
        if error is not None:
            raise CheckpointError(path, f"saving failed on rank 0: {error}")
        return path

    def save_sharded(self, path: str | Path, latest: bool = True, async_save: bool = False) -> PendingSave:
        """Write the training state as a DCP directory (collective); the model and optimizer shards are staged
        before this returns, so training may go on while an async save writes them."""
        if not self.trainer.at_step_boundary:
            raise RuntimeError("a checkpoint can only be written at an optimizer-step boundary")
        t = self.trainer
        state = self.state_dict(weights=False, optimizer=False)  # the shards hold both
        files = {} if state is None else {RANK0_FILE: lambda p: save_checkpoint(state, p)}
        meta = {"global_step": t.global_step, "epoch": t.epoch,
                "stage": t.strategy.sharding_stage if t.strategy is not None else 0, "degrees": self.degrees()}
        pending = save(app_state(self._module(), t.optimizer, writing=True), path, rank0_files=files, meta=meta,
                       async_save=async_save, latest=latest)
        if async_save:
            self._in_flight = pending
        return pending

    def state_dict(self, weights: bool = True, optimizer: bool = True) -> dict[str, Any] | None:
        """The whole training state (the entries above); collective, returned on rank 0 only (None elsewhere).
        ``weights``/``optimizer`` False leave ``model``/``optimizer`` None (a sharded checkpoint's shards hold them)."""
        t = self.trainer
        entry = t.fit_state.rank_state_dict(t.metrics)
        tracker = get_rng_state_tracker().get_states_tracker()
        if tracker:  # Note [hybrid checkpoints in the Trainer]
            entry["mp_rng"] = tracker
        if self._rank_local():  # Note [per-rank state]
            entry["state"] = _on_cpu({"model": self._module().state_dict(), "optimizer": t.optimizer.state_dict()})
        ranks = collective.all_gather_object(entry)
        optimizer = t.optimizer.state_dict() if optimizer and t.optimizer is not None else None  # collective
        model = self.model_state() if weights else None  # collective if sharded
        if collective.get_rank() != 0:
            return None
        amp = getattr(t.optimizer, "amp", None)
        return {
            "model": model, "optimizer": optimizer,
            "scaler": amp.state_dict() if amp is not None and amp.uses_scaler else None,
            "data": t.fit_state.data_position(), "progress": t.fit_state.state_dict(), "ranks": ranks,
            "world_size": collective.get_world_size(),
            "callbacks": t.callbacks.state_dict() if t.callbacks is not None else {},
            "strategy": None if t.strategy is None else t.strategy.to_dict(), "config": t.config,
            "degrees": self.degrees(),
            "meta": {"time": time.time(), "torch": str(torch.__version__), "fleetlite": __version__,
                     "optimizer": optimizer_name(t.user_optimizer)},
        }

    def model_state(self, rank0_only: bool = True) -> dict[str, Any]:
        """The model's full unprefixed state; collective for a sharded (stage 2/3) model (then gathered on rank 0
        only unless ``rank0_only=False``)."""
        net = self.trainer.parallel_network
        return self.trainer.network.state_dict() if net is None else net.full_state_dict(rank0_only=rank0_only)

    def full_weights(self) -> dict[str, torch.Tensor]:
        """A copy of the model's full unprefixed state on every rank (collective for a sharded model)."""
        weights = self.model_state(rank0_only=False)
        live = {(t.to_local() if hasattr(t, "to_local") else t).data_ptr()
                for t in self.trainer.network.state_dict().values() if torch.is_tensor(t)}
        # gathered shards are new tensors already; what still aliases the model (plain tensors, buffers) is copied
        return {k: v.detach().clone() if v.data_ptr() in live else v for k, v in weights.items()}

    def load_model_state(self, weights: dict[str, Any], strict: bool = True) -> None:
        """Load a full state into the model (into the shards of a sharded model; every rank holds ``weights``)."""
        net = self.trainer.parallel_network
        if net is None:
            self.trainer.network.load_state_dict(weights, strict=strict)
        else:
            net.load_full_state_dict(weights, strict=strict)

    @property
    def layout(self) -> StateLayout:
        """How each rank's state sits in the full model's, as the wrapped model answers it (``partial``: no rank
        holds it all, Note [hybrid checkpoints in the Trainer]; the degrees a checkpoint records)."""
        net = self.trainer.parallel_network
        return StateLayout.whole() if net is None else net.state_layout()

    def degrees(self) -> dict[str, int]:
        """This run's ``{"dp", "mp", "pp"}`` degrees (the wrapped model's: sharding and sep folded into dp)."""
        return self.layout.degrees

    def _module(self) -> torch.nn.Module:
        """The plain module whose parameter names a sharded checkpoint uses."""
        net = self.trainer.parallel_network
        return net.module if net is not None and hasattr(net, "module") else self.trainer.network

    def request(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` (a save) once the current hook has reached every callback (Note [checkpoint timing])."""
        self._requests.append(fn)

    def has_requests(self) -> bool:
        """Whether saves are requested and not run yet (the fit loop reads TerminateOnNaN's verdict first)."""
        return bool(self._requests)

    def run_requests(self) -> None:
        """Run the requested saves in order; dropped after a non-finite loss stopped fit (Note [saves in flight])."""
        if self.trainer.terminated_on_nan is not None:
            self._requests.clear()
        while self._requests:
            self._requests.pop(0)()

    def drop_requests(self) -> None:
        """Forget the requested saves (a fit that ended)."""
        self._requests.clear()

    def finish_saves(self) -> None:
        """Wait for the asynchronous save in flight, if any, and commit it (collective; Note [saves in flight])."""
        pending, self._in_flight = self._in_flight, None
        if pending is not None:
            pending.wait()

    def abandon_saves(self, why: BaseException) -> None:
        """Say that the asynchronous save in flight, if any, is not committed (Note [saves in flight])."""
        pending, self._in_flight = self._in_flight, None
        if pending is not None and not pending.done and collective.get_rank() == 0:
            warn_user(f"fleetlite: fit ended with {type(why).__name__} while the asynchronous checkpoint "
                      f"{pending.final} was being written; it was not committed (its temporary directory "
                      f"{pending.tmp.name} is deleted by the next run) and 'latest' still names the previous "
                      "checkpoint")

    def save_weights(self, path: str | Path) -> Path:
        """The weights alone (and the config) as a checkpoint file (collective when sharded; rank 0 writes)."""
        weights = self.model_state()
        if collective.get_rank() == 0:
            save_checkpoint({"model": weights, "config": self.trainer.config}, path)
        return Path(path)

    # -- choose and read --------------------------------------------------------------------------------------------
    def read(self, resume: Any, directory: str | Path | None, train) -> LoadedCheckpoint | None:
        """The checkpoint ``resume`` names, read on every rank and checked against this run (or None: fresh).

        ``resume``: None/False (fresh), a file, a checkpoint directory, a run's directory (its newest valid
        checkpoint), ``"latest"`` (the newest valid one in ``directory``, an error when there is none),
        ``"auto"`` (the same, or a fresh start), or a :class:`LoadedCheckpoint` (already read: kept).
        """
        if resume is None or resume is False:
            return None
        if not isinstance(resume, LoadedCheckpoint):
            path = self._choose(resume, directory)
            if path is None:
                return None
            resume = LoadedCheckpoint(path, on_every_rank(lambda: read(path, REQUIRED).state))
        path, s = Path(resume.path), resume.state
        world = collective.get_world_size()
        if s["world_size"] != world and not train.resumable and not s["progress"]["epoch_finished"]:
            raise CheckpointError(path, f"saved mid-epoch by {s['world_size']} ranks; resuming on {world} ranks needs "
                                        "training data with a DistributedBatchSampler (a Dataset, such a DataLoader "
                                        "or a TensorLoader)")
        saved = s.get("degrees") or {"dp": s["world_size"], "mp": 1, "pp": 1}
        mine = self.degrees()
        if saved != mine and max(saved["mp"], saved["pp"], mine["mp"], mine["pp"]) > 1 and \
                not s["progress"]["epoch_finished"]:
            raise CheckpointError(path, f"saved mid-epoch with {_show(saved)}; resuming with {_show(mine)} needs the "
                                        "same degrees, or a checkpoint saved at an epoch end (ModelCheckpoint("
                                        "save_freq=1)), which loads into any degrees")
        return resume

    @staticmethod
    def _choose(resume: Any, directory: str | Path | None) -> Path | None:
        """The checkpoint to resume from, chosen on rank 0 (the same on every rank), or None."""

        def choose() -> str | None:
            if collective.get_rank() != 0:
                return None
            try:
                p = resolve(resume, directory, require=REQUIRED)
            except ValueError as e:
                raise CheckpointError(None, str(e)) from None
            return None if p is None else str(p)

        choice = on_every_rank(choose)
        if collective.is_initialized():
            choice = collective.all_gather_object(choice)[0]
        return None if choice is None else Path(choice)

    # -- restore ------------------------------------------------------------------------------------------------------
    def restore(self, loaded: LoadedCheckpoint, train, callbacks) -> Resumed:
        """Put a read checkpoint back into the Trainer, its callbacks and the training data, in this order.

        Called by the fit loop in place of ``callbacks.on_train_begin()``, which it fires at its step (3).
        Raises ``CheckpointError`` naming the checkpoint when it does not fit the model or the run.

        # Note [resume order]
        Bit-identical resume needs the same state and the same sequence of random draws as the
        uninterrupted run. (1) the model; (2) the optimizer and the amp scaler (their loads keep the
        parameter-group dicts an LR scheduler holds, Note [shared parameter groups]); (3) the loop's
        progress and the data position, which callbacks read in ``on_train_begin``; (4) the callbacks,
        LR schedulers included: ``on_train_begin`` (where they reset themselves), then their saved
        state; (5) the RNG states: creating a DataLoader iterator draws from the global torch RNG, so
        for an epoch saved midway the epoch-start states are restored first, the iterator is created
        (and for loaders without a sampler cursor the consumed batches are replayed, Note [resume
        replay]), and only then are the states of the saved step restored.
        """
        t, s, path = self.trainer, loaded.state, Path(loaded.path)
        self._restore_model(path, s)                                              # (1)
        self._restore_optimizer_and_scaler(path, s)                               # (2)
        self._restore_rank_state(path, s)                                         # Note [per-rank state]
        progress = s["progress"]                                                  # (3)
        t.fit_state.load_state_dict(progress)
        try:
            if s.get("data") is not None:
                train.load_position(s["data"])
        except (ValueError, KeyError, RuntimeError) as e:
            raise CheckpointError(path, f"incompatible with this run: {e}") from None
        callbacks.on_train_begin()                                                # (4)
        callbacks.load_state_dict(s["callbacks"])
        entry, sums = rank_entry(s, collective.get_rank(), collective.get_world_size())
        if entry.get("mp_rng") and s["world_size"] == collective.get_world_size() and \
                s.get("degrees") == self.degrees():  # Note [hybrid checkpoints in the Trainer]: this rank's own
            get_rng_state_tracker().set_states_tracker(entry["mp_rng"])
        epoch = t.fit_state.epoch
        if progress["epoch_finished"]:                                            # (5)
            restore_rng_state(entry["rng"])
            return Resumed(epoch + 1, None)
        exhausted = train.resumable and bool(progress.get("pass_done", False))  # only the epoch's end is left
        if not exhausted:
            train.set_epoch(epoch)
        t.fit_state.resume_epoch(epoch, t.metrics, sums, entry["epoch_rng"])
        restore_rng_state(entry["epoch_rng"])
        batches = iter(()) if exhausted else iter(train)
        if not train.resumable:  # Note [resume replay]
            for _ in range(t.fit_state.batch_in_epoch):
                next(batches)
        restore_rng_state(entry["rng"])
        return Resumed(epoch, batches, exhausted)

    def _restore_model(self, path: Path, s: dict[str, Any]) -> None:
        if path.is_dir():  # a sharded checkpoint: model and optimizer through DCP (resharded to this run)
            load_app_state(self._module(), self.trainer.optimizer, path)
            return
        try:
            self.load_model_state(s["model"])
        except (RuntimeError, KeyError, ValueError) as e:
            raise CheckpointError(path, f"incompatible with this model: {e}") from None

    def _restore_optimizer_and_scaler(self, path: Path, s: dict[str, Any]) -> None:
        opt = self.trainer.optimizer
        check_optimizer(path, s, self.trainer.user_optimizer, _RESUME_HINT)
        if s.get("optimizer") is not None and not path.is_dir():
            self._refuse_file_optimizer(path, "resume from a checkpoint directory, or start afresh from its weights "
                                              "with Trainer.load(path, reset_optimizer=True)")
        try:
            if s.get("optimizer") is not None and not path.is_dir():  # (a directory's came with the model)
                opt.load_state_dict(s["optimizer"])
            amp = getattr(opt, "amp", None)
            if s.get("scaler") and amp is not None:
                amp.load_state_dict(s["scaler"])
        except (ValueError, KeyError, RuntimeError) as e:
            raise CheckpointError(path, f"incompatible with this run: {e}") from None

    def _rank_local(self) -> bool:
        """Whether the ranks' model and optimizer states differ (Note [per-rank state])."""
        meta = getattr(self.trainer.optimizer, "meta", None)
        return collective.is_initialized() and bool(getattr(meta, "rank_local", False))

    def _restore_rank_state(self, path: Path, s: dict[str, Any]) -> None:
        """This rank's own model and optimizer state where the checkpoint holds every rank's (Note [per-rank state])."""
        if not any("state" in r for r in s["ranks"]):
            return
        world = collective.get_world_size()
        saved = s.get("degrees") or {"dp": s["world_size"], "mp": 1, "pp": 1}
        if s["world_size"] != world or saved != self.degrees():
            if collective.get_rank() == 0:
                warn_user(f"fleetlite: {path} holds each of its {s['world_size']} ranks' own state (local SGD or "
                          f"DGC); on {world} ranks with other degrees every rank resumes from rank 0's, so the run "
                          "differs from an uninterrupted one")
            return
        mine = s["ranks"][collective.get_rank()]["state"]
        try:
            self._module().load_state_dict(mine["model"])
            self.trainer.optimizer.load_state_dict(mine["optimizer"])
        except (ValueError, KeyError, RuntimeError) as e:
            raise CheckpointError(path, f"incompatible with this run (its per-rank state): {e}") from None

    # -- Trainer.load -------------------------------------------------------------------------------------------------
    def load(self, path: str | Path, skip_mismatch: bool = False, reset_optimizer: bool = False) -> None:
        """``Trainer.load``: the weights (and the optimizer state unless ``reset_optimizer``) of any checkpoint
        ``fit`` writes (a file, a DCP directory, the ``latest`` pointer, a run's checkpoint directory) or of a
        plain state_dict file."""
        t = self.trainer
        path = resolve(path, check=False)
        if path.is_dir():
            self._load_directory(path, skip_mismatch, reset_optimizer)
            return
        try:
            s = load_checkpoint(path)
            weights = s["model"]
        except CheckpointError as e:
            if "not a fleetlite checkpoint" not in e.problem:
                raise
            s, weights = {}, torch.load(path, map_location="cpu", weights_only=True)  # a plain state_dict file
            if not isinstance(weights, dict):
                raise
        if not reset_optimizer:  # before anything is loaded
            check_optimizer(path, s, t.user_optimizer, "use reset_optimizer=True to load the weights only")
            if s.get("optimizer") is not None and t.user_optimizer is not None:
                t.setup()  # (the wrapped model says whether it is hybrid)
                self._refuse_file_optimizer(path, "use reset_optimizer=True to load the weights only")
        weights = self._own_names(strip_compile_prefix(weights), path)  # compile-d and DDP-wrapped state_dicts too
        own = self.model_state(rank0_only=False) if skip_mismatch else {}  # (collective when sharded)
        if skip_mismatch:
            bad = [k for k, v in weights.items() if k not in own or tuple(own[k].shape) != tuple(v.shape)]
            if bad:
                warn_user(f"fleetlite: load skipped {len(bad)} mismatched entries from {path}: {bad[:10]}")
            own.update({k: v for k, v in weights.items() if k not in bad})
            weights = own
        try:
            self.load_model_state(weights)
        except RuntimeError as e:
            raise CheckpointError(path, f"incompatible with this model (use skip_mismatch=True to load what "
                                        f"matches): {e}") from None
        if not reset_optimizer and s.get("optimizer") is not None and t.user_optimizer is not None:
            t.setup()  # wraps the optimizer too; a loss is not needed to load
            try:
                t.optimizer.load_state_dict(s["optimizer"])
            except (ValueError, KeyError, RuntimeError) as e:
                raise CheckpointError(path, f"its optimizer state does not fit this optimizer ({e}); use "
                                            "reset_optimizer=True to load the weights only") from None

    def _own_names(self, weights: dict[str, Any], path: Path) -> dict[str, Any]:
        """``weights`` under this model's names: a state_dict of a torch ``DistributedDataParallel`` (or
        ``DataParallel``) wrapper, every key ``module.``-prefixed, loses the prefix (torch's
        ``consume_prefix_in_state_dict_if_present``). A state_dict sharing no name with the model is an error
        saying so (``skip_mismatch`` would load nothing)."""
        own = list(self._module().state_dict())
        names = [k for k in weights if isinstance(k, str)]
        if names and all(k.startswith("module.") for k in names) and not any(k.startswith("module.") for k in own):
            weights = dict(weights)
            torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(weights, "module.")
        if weights and own and not set(weights) & set(own):
            raise CheckpointError(path, f"shares no entry name with this model (it holds {sorted(weights)[:3]}..., "
                                        f"the model {own[:3]}...): it was saved from another model or under a "
                                        "wrapper's prefix; rename its keys to the model's and pass them to "
                                        "set_weights")
        return weights

    def _refuse_file_optimizer(self, path: Path, hint: str) -> None:
        """A checkpoint file's optimizer state is one process's, over whole tensors: it does not fit the slices or the
        stage of a hybrid-parallel model (Note [hybrid checkpoints in the Trainer])."""
        if self.layout.partial:
            raise CheckpointError(path, "is a checkpoint file, whose optimizer state holds whole tensors of one "
                                        "process; this tensor/pipeline-parallel run's optimizer holds slices or one "
                                        f"stage, so it cannot take it: {hint}")

    def _load_directory(self, path: Path, skip_mismatch: bool, reset_optimizer: bool) -> None:
        """``load`` of a DCP checkpoint directory: its shards, resharded to this run (collective)."""
        if skip_mismatch:
            raise ValueError(f"load(skip_mismatch=True) reads checkpoint files; {path} is a sharded checkpoint "
                             "directory: take its weights with fleetlite.checkpoint.load_full(path), drop the "
                             "mismatched entries, and pass them to set_weights")
        t = self.trainer
        s = on_every_rank(lambda: read(path).state)
        if not reset_optimizer:
            check_optimizer(path, s, t.user_optimizer, "use reset_optimizer=True to load the weights only")
        t.setup()
        load_app_state(self._module(), None if reset_optimizer else t.optimizer, path)


def _on_cpu(value: Any) -> Any:
    """A copy of ``value`` with every tensor on the CPU (gathered from every rank, written by rank 0)."""
    if torch.is_tensor(value):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _on_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_on_cpu(v) for v in value)
    return value


def _show(degrees: dict[str, int]) -> str:
    return " x ".join(f"{k}={degrees[k]}" for k in ("dp", "mp", "pp"))


def rank_entry(state: dict[str, Any], rank: int, world_size: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(RNG entry, training partial sums) for ``rank``; on another world size all sums go to rank 0."""
    ranks = state["ranks"]
    saved_world = int(state["world_size"])
    if saved_world == world_size:
        entry = ranks[rank]
        return entry, entry["train_accum"]
    if rank == 0:
        warn_user(f"fleetlite: resuming a {saved_world}-rank checkpoint on {world_size} ranks: every remaining "
                      "sample of the epoch is still seen once, but random streams (and so results) differ from "
                      "an uninterrupted run")
    entry = ranks[rank % saved_world]
    if rank != 0:
        return entry, {"loss_sum": 0.0, "count": 0, "metrics": None}
    total = {"loss_sum": sum(r["train_accum"]["loss_sum"] for r in ranks),
             "count": sum(r["train_accum"]["count"] for r in ranks), "metrics": None}
    metric_states = [r["train_accum"]["metrics"] for r in ranks]
    if metric_states and metric_states[0]:
        total["metrics"] = [{k: sum(ms[i][k] for ms in metric_states) for k in metric_states[0][i]}
                            for i in range(len(metric_states[0]))]
    return entry, total
