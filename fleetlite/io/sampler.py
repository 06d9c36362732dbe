"""``DistributedBatchSampler``: Paddle's distributed batch sampler, stateful and exact for evaluation.

Note [sampler layout]
    An epoch has one global order of the ``N`` sample indices (``arange(N)``,
    or a permutation seeded by ``(seed, epoch)`` when shuffling). A pass over
    the epoch that starts at offset ``s`` of that order (``s = 0`` unless it
    resumes) takes the remaining ``order[s:]``, pads it to a multiple of
    ``num_replicas`` by repeating the head of the epoch's order, and cuts the
    padded list into chunks of ``batch_size * num_replicas``: rank ``r`` takes
    the batch-contiguous slice ``[r * batch_size, (r + 1) * batch_size)`` of
    each full chunk, and the ``r``-th equal share of the last, short chunk
    (Paddle's slicing). Every rank therefore yields the same number of
    batches, so per-batch collectives stay aligned.

    Padding sits at the very end of the padded list and every local batch is
    a contiguous piece of that list, so in any batch the padding samples are
    the *trailing* ones: ``num_valid(i)`` leading samples are real. After ``j``
    batches on every rank the consumed samples are exactly the prefix
    ``order[s : s + j * batch_size * num_replicas]``; that prefix offset is
    the position a ``state_dict`` records, which is why a resumed pass can be
    re-split over any number of ranks and still see each remaining sample
    exactly once.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized
from typing import Any

import numpy as np
import torch.utils.data

from ..distributed import collective
from ..distributed.env import read_env

__all__ = ["DistributedBatchSampler"]

_STATE_VERSION = 1


def _default_replicas() -> tuple[int, int]:
    if collective.is_initialized():
        return collective.get_world_size(), collective.get_rank()
    env = read_env()
    return env.world_size, env.rank


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name}={value!r} must be an integer >= {low}")
    return int(value)


def padded_length(n: int, replicas: int) -> int:
    """``n`` samples padded to a multiple of ``replicas`` (Note [sampler layout]; torch's DistributedSampler pads
    the same way, see :func:`fleetlite.io.evaluation.torch_sampler_num_valid`)."""
    return math.ceil(n / replicas) * replicas


def _pass_slices(remaining: int, batch_size: int, replicas: int, rank: int,
                 drop_last: bool) -> list[tuple[int, int]]:
    """(start, length) of each local batch in the padded remaining list (Note [sampler layout])."""
    total = padded_length(remaining, replicas)
    chunk = batch_size * replicas
    full = total // chunk
    slices = [(k * chunk + rank * batch_size, batch_size) for k in range(full)]
    per = (total - full * chunk) // replicas  # share of the short last chunk, always < batch_size
    if per and not drop_last:
        slices.append((full * chunk + rank * per, per))
    return slices


class _Pass:
    """One pass over (the rest of) an epoch: its layout and how far it got."""

    def __init__(self, epoch: int, start: int, n: int, batch_size: int, replicas: int, rank: int, drop_last: bool):
        self.epoch, self.start, self.replicas, self.batch_size = epoch, start, replicas, batch_size
        self.remaining = n - start
        self.slices = _pass_slices(self.remaining, batch_size, replicas, rank, drop_last)
        self.done = 0  # local batches handed out
        self.closed = False  # the generator finished or was abandoned

    def offset_after(self, batches: int) -> int:
        """Epoch offset once ``batches`` local batches of this pass are consumed on every rank."""
        return self.start + min(batches * self.batch_size * self.replicas, self.remaining)


class DistributedBatchSampler(torch.utils.data.Sampler):
    """Yields this rank's batches of dataset indices; Paddle's ``paddle.io.DistributedBatchSampler``.

    Every rank gets the same number of batches (see Note [sampler layout]).
    The epoch advances by itself after each full pass, and ``set_epoch(e)``
    sets it explicitly (keeping a loaded mid-epoch position when ``e`` is the
    current epoch). The sampler is a cursor: ``state_dict()`` records epoch,
    seed and position, a new iteration continues from the current position,
    and a state loaded with another ``num_replicas`` (or ``batch_size``)
    re-splits the rest of that epoch.

    For exact distributed evaluation keep ``drop_last=False`` and use
    ``num_valid(i)`` (or :func:`fleetlite.io.drop_padding`) to ignore the
    padding samples that complete the last batches.

    Args:
        dataset: anything with ``len()``.
        batch_size: samples per local batch.
        num_replicas, rank: default to the process group (or launcher
            variables when no group exists yet), as Paddle's. Under hybrid
            parallelism (mp or pp > 1) the ranks of one tensor-parallel group
            or pipeline must read the same batches: pass the data-parallel
            group's ``num_replicas=hcg.get_data_parallel_world_size(),
            rank=hcg.get_data_parallel_rank()``, as Paddle's hybrid programs
            do (the Trainer does it itself: Note [data group] in
            ``fleetlite.distributed.fleet.data_group``).
        shuffle: shuffle with a permutation seeded by ``(seed, epoch)``.
        drop_last: drop the incomplete local batch at the end of a pass.
        seed: base seed of the shuffle; the same on every rank.

    Example::

        from fleetlite.io import DistributedBatchSampler
        s = DistributedBatchSampler(range(11), batch_size=2, num_replicas=2, rank=1)
        print(list(s))          # [[2, 3], [6, 7], [10, 0]]  (index 0 pads rank 1's last batch)
        print(s.num_valid(2))   # 1
    """

    def __init__(self, dataset: Sized, batch_size: int, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = False, drop_last: bool = False, seed: int = 0):
        if not hasattr(dataset, "__len__"):
            raise TypeError(f"dataset of type {type(dataset).__name__} has no len(); DistributedBatchSampler "
                            "needs a map-style dataset (or any sized object such as range(n))")
        n = len(dataset)
        if n < 1:
            raise ValueError("the dataset is empty: there is nothing to sample; check the dataset's path or size")
        self.batch_size = _check_int("batch_size", batch_size, 1)
        if num_replicas is None or rank is None:
            default_replicas, default_rank = _default_replicas()
            num_replicas = default_replicas if num_replicas is None else num_replicas
            rank = default_rank if rank is None else rank
        self.nranks = _check_int("num_replicas", num_replicas, 1)
        self.local_rank = _check_int("rank", rank, 0)
        if self.local_rank >= self.nranks:
            raise ValueError(f"rank={rank} is outside 0..{self.nranks - 1} for num_replicas={self.nranks}; "
                             "pass a rank below num_replicas")
        for name, flag in (("shuffle", shuffle), ("drop_last", drop_last)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name}={flag!r} must be True or False")
        self.dataset = dataset
        self.shuffle, self.drop_last = shuffle, drop_last
        self.seed = _check_int("seed", seed, 0)
        self._n = n
        self.total_size = padded_length(n, self.nranks)
        self.num_samples = self.total_size // self.nranks  # per rank, padding included (Paddle's attribute)
        self.epoch = 0
        self._offset = 0  # position reached in the epoch's order (what state_dict saves)
        self._start = 0  # where the next pass starts: 0, or once the position load_state_dict restored
        self._pass: _Pass | None = None  # the current or most recent pass

    # -- order and layout --------------------------------------------------------------------------------------

    def _order(self, epoch: int) -> np.ndarray:
        if self.shuffle:
            return np.random.default_rng([self.seed, epoch]).permutation(self._n)
        return np.arange(self._n)

    def _new_pass(self) -> _Pass:
        return _Pass(self.epoch, self._start, self._n, self.batch_size, self.nranks, self.local_rank, self.drop_last)

    def __iter__(self) -> Iterator[list[int]]:
        # Every pass starts the epoch afresh (as Paddle's and torch's samplers do: a peek, a `break`
        # or a prefetching loader must not eat into the next pass), except the first pass after
        # load_state_dict, which continues from the restored position.
        return self._batches(None)

    def device_batches(self, device: torch.device | str) -> Iterator[torch.Tensor]:
        """The batches of ``iter(sampler)`` (same order, padding and cursor), as int64 index tensors on ``device``.

        The pass's whole order goes to ``device`` once, from pinned memory without blocking on CUDA; each batch
        is a slice of it, so no index tensor is made on the host per batch and nothing waits for the device.

        Example::

            s = DistributedBatchSampler(range(11), batch_size=2, num_replicas=2, rank=1)
            [b.tolist() for b in s.device_batches("cpu")]   # [[2, 3], [6, 7], [10, 0]]
        """
        return self._batches(torch.device(device))

    def _batches(self, device: torch.device | None) -> Iterator[Any]:
        p = self._new_pass()
        self._pass = p
        self._start = 0
        self._offset = p.start
        order = self._order(p.epoch)
        # Note [sampler layout]: the remaining order, padded by cycling the head of the epoch's order
        pad = padded_length(p.remaining, self.nranks) - p.remaining
        padded: Any = np.concatenate([order[p.start:], order[np.arange(pad) % self._n]])
        if device is None:
            padded = padded.tolist()
        else:
            host = torch.from_numpy(padded.astype(np.int64))
            padded = host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host.to(device)
        try:
            if not p.slices:  # nothing to hand out (drop_last with a short remainder): the epoch is over
                self.epoch, self._offset = p.epoch + 1, 0
            for start, length in p.slices:
                if self._pass is not p:  # a newer pass of this sampler took over: stop this one
                    return
                p.done += 1
                if p.done == len(p.slices):  # the epoch is complete once its last batch is out
                    self.epoch, self._offset = p.epoch + 1, 0
                else:
                    self._offset = p.offset_after(p.done)
                yield padded[start:start + length]
        finally:
            p.closed = True

    def __len__(self) -> int:
        """Local batches of the running pass, else of the pass the next iteration would make."""
        p = self._pass
        if p is not None and not p.closed:
            return len(p.slices)
        return len(self._new_pass().slices)

    # -- epochs ------------------------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch`` for the next pass (its shuffle order).

        A different epoch starts at its beginning; the same epoch keeps a
        position restored by ``load_state_dict``, so loading a state and then
        the usual ``set_epoch(epoch)`` at the top of the epoch loop resumes mid-epoch.
        """
        epoch = _check_int("epoch", epoch, 0)
        if epoch != self.epoch:
            self.epoch, self._offset, self._start, self._pass = epoch, 0, 0, None

    # -- exact evaluation --------------------------------------------------------------------------------------

    def num_valid(self, batch_index: int) -> int:
        """How many leading samples of local batch ``batch_index`` of the current pass are real.

        The rest of that batch repeats samples only to keep ranks aligned; drop
        them to count every sample exactly once. With ``drop_last=True`` the
        count is that of the batches actually yielded (dropped samples are
        not seen by anyone, so such a loader cannot evaluate exactly).
        """
        p = self._pass if self._pass is not None else self._new_pass()
        if isinstance(batch_index, bool) or not isinstance(batch_index, (int, np.integer)) \
                or not 0 <= batch_index < len(p.slices):
            raise IndexError(f"batch_index={batch_index!r} is outside 0..{len(p.slices) - 1}: this pass has "
                             f"{len(p.slices)} local batches")
        start, length = p.slices[batch_index]
        return max(0, min(length, p.remaining - start))

    # -- state -------------------------------------------------------------------------------------------------

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Epoch, seed and position as plain Python values (the same on every rank).

        Args:
            consumed: local batches of the current pass the training loop has
                really used. Needed only when a loader prefetches ahead of the
                loop (``DataLoader`` with workers); by default the position is
                the batches this sampler has handed out.
        """
        epoch, offset = self.epoch, self._offset
        if consumed is not None:
            p = self._pass
            if p is None:
                raise ValueError("state_dict(consumed=...) was given but no pass has started; call it while or "
                                 "after iterating, or leave consumed=None")
            consumed = _check_int("consumed", consumed, 0)
            if consumed > p.done:
                raise ValueError(f"consumed={consumed} exceeds the {p.done} batches this pass has handed out")
            if consumed == len(p.slices):
                epoch, offset = p.epoch + 1, 0
            else:
                epoch, offset = p.epoch, p.offset_after(consumed)
        return {"version": _STATE_VERSION, "epoch": epoch, "offset": offset, "seed": self.seed,
                "shuffle": self.shuffle, "dataset_size": self._n, "batch_size": self.batch_size,
                "num_replicas": self.nranks}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`, possibly of another world size).

        With another ``num_replicas`` or ``batch_size`` the remaining samples of
        the epoch are re-split so that together the ranks still see each of
        them exactly once.
        """
        if not isinstance(state, dict) or not {"epoch", "offset", "seed"} <= set(state):
            raise ValueError(f"not a DistributedBatchSampler state: expected a dict with epoch, offset and seed, "
                             f"got {state!r:.200}")
        if state.get("version", _STATE_VERSION) != _STATE_VERSION:
            raise ValueError(f"sampler state version {state.get('version')} is not supported (this fleetlite "
                             f"writes version {_STATE_VERSION}); resume with the fleetlite that saved it")
        if state.get("dataset_size", self._n) != self._n:
            raise ValueError(f"the state was saved for a dataset of {state['dataset_size']} samples but this one "
                             f"has {self._n}: resume with the same dataset (or start a fresh sampler)")
        if state.get("shuffle", self.shuffle) != self.shuffle:
            raise ValueError(f"the state was saved with shuffle={state['shuffle']} but this sampler has "
                             f"shuffle={self.shuffle}: the epoch orders differ; construct it with the same shuffle")
        offset = _check_int("offset", state["offset"], 0)
        if offset > self._n:
            raise ValueError(f"state offset {offset} exceeds the dataset size {self._n}; the state is corrupt")
        self.seed = _check_int("seed", state["seed"], 0)
        self.epoch = _check_int("epoch", state["epoch"], 0)
        self._offset = self._start = offset
        self._pass = None

    set_state_dict = load_state_dict  # Paddle's name

    def __repr__(self) -> str:
        return (f"DistributedBatchSampler(n={self._n}, batch_size={self.batch_size}, num_replicas={self.nranks}, "
                f"rank={self.local_rank}, shuffle={self.shuffle}, drop_last={self.drop_last}, seed={self.seed}, "
                f"epoch={self.epoch})")
