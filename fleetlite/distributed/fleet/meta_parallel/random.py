"""Paddle's model-parallel random states: ``get_rng_state_tracker`` and ``model_parallel_random_seed``.

Inside ``get_rng_state_tracker().rng_state()`` the default torch generator(s) run from the tracker's
``"model_parallel_rng"`` state, seeded differently on each model-parallel rank, so a dropout on a sharded
activation draws a different mask per shard; outside it the global seed (equal on every mp rank) rules,
so a dropout on a replicated activation agrees across the mp group, as in Paddle.

Example::

    from fleetlite.distributed.fleet import meta_parallel as mpu
    mpu.model_parallel_random_seed(1234)
    with mpu.get_rng_state_tracker().rng_state():
        y = torch.nn.functional.dropout(x_shard, 0.1)      # differs across mp ranks
    z = torch.nn.functional.dropout(x_replicated, 0.1)     # agrees across mp ranks
"""

from __future__ import annotations

import contextlib
import random as _py_random
from collections.abc import Iterator

import torch

__all__ = ["RNGStatesTracker", "get_rng_state_tracker", "model_parallel_random_seed", "MODEL_PARALLEL_RNG"]

MODEL_PARALLEL_RNG = "model_parallel_rng"


def _get_state() -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    return torch.get_rng_state(), (torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None)


def _set_state(state: tuple[torch.Tensor, list[torch.Tensor] | None]) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None and torch.cuda.is_initialized():
        torch.cuda.set_rng_state_all(state[1])


def _seeded_state(seed: int) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    saved = _get_state()
    torch.manual_seed(seed)
    out = _get_state()
    _set_state(saved)
    return out


class RNGStatesTracker:
    """Named random states that a ``with tracker.rng_state(name):`` block runs under (Paddle's class).

    Example::

        tracker = RNGStatesTracker()
        tracker.add("model_parallel_rng", 100)
        with tracker.rng_state("model_parallel_rng"):
            torch.rand(2)
    """

    def __init__(self) -> None:
        self.states_: dict[str, tuple[torch.Tensor, list[torch.Tensor] | None]] = {}
        self.seeds_: set[int] = set()

    def reset(self) -> None:
        self.states_ = {}
        self.seeds_ = set()

    def add(self, name: str, seed: int) -> None:
        if seed in self.seeds_:
            raise ValueError(f"seed {seed} is already used by another random state; give {name!r} another seed")
        if name in self.states_:
            raise ValueError(f"random state {name!r} already exists; call reset() first to re-seed it")
        self.seeds_.add(seed)
        self.states_[name] = _seeded_state(seed)

    def get_states_tracker(self) -> dict[str, tuple[torch.Tensor, list[torch.Tensor] | None]]:
        return {k: (v[0].clone(), None if v[1] is None else [s.clone() for s in v[1]]) for k, v in self.states_.items()}

    def set_states_tracker(self, states: dict[str, tuple[torch.Tensor, list[torch.Tensor] | None]]) -> None:
        self.states_ = dict(states)

    @contextlib.contextmanager
    def rng_state(self, name: str = MODEL_PARALLEL_RNG) -> Iterator[None]:
        """Run the block under the named state; the state advances, the global one is left as it was."""
        if name not in self.states_:
            raise ValueError(f"random state {name!r} does not exist; call model_parallel_random_seed(seed) (or "
                             f"get_rng_state_tracker().add({name!r}, seed)) first")
        outside = _get_state()
        _set_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = _get_state()
            _set_state(outside)


RNG_STATE_TRACKER = RNGStatesTracker()


def get_rng_state_tracker() -> RNGStatesTracker:
    """The process's tracker (Paddle's ``get_rng_state_tracker``)."""
    return RNG_STATE_TRACKER


def model_parallel_random_seed(seed: int | None = None) -> None:
    """Seed the global generator alike on every rank and the tracker's ``model_parallel_rng`` per mp rank.

    With ``seed`` (Paddle's formula): global seed ``seed``, local seed ``seed * 1024 + mp_rank * 100``.
    Without, a seed drawn on global rank 0 and broadcast (collective: call it on every rank).
    """
    from ..base.topology import get_hybrid_communicate_group

    hcg = get_hybrid_communicate_group()
    rank = hcg.get_model_parallel_rank() if hcg is not None else 0
    if not seed:
        import torch.distributed as tdist

        drawn = [_py_random.randint(1, 655350)]
        if tdist.is_available() and tdist.is_initialized():
            tdist.broadcast_object_list(drawn, src=0)
        seed = drawn[0]
    RNG_STATE_TRACKER.reset()
    RNG_STATE_TRACKER.add(MODEL_PARALLEL_RNG, seed * 1024 + rank * 100)
    torch.manual_seed(seed)
