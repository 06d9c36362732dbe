"""A deterministic synthetic text corpus (nothing downloads) and a byte-level tokenizer (vocabulary 256).

Example::

    from fleetlite.text.corpus import synthetic_corpus, encode, batch_of_windows
    ids = encode(synthetic_corpus(20_000, seed=0))          # int64 tensor of bytes
    x, y = batch_of_windows(ids, batch=8, seq_len=32, seed=0, step=0)   # y is x shifted by one
"""

from __future__ import annotations

import random

import torch

__all__ = ["VOCAB_SIZE", "synthetic_corpus", "encode", "decode", "batch_of_windows"]

#: Byte-level vocabulary: every id is one byte.
VOCAB_SIZE = 256

_SUBJECTS = ["the cat", "a dog", "the old man", "my sister", "the robot", "a small bird", "the teacher", "our team"]
_VERBS = ["sees", "likes", "builds", "finds", "paints", "follows", "carries", "remembers"]
_OBJECTS = ["the red ball", "a quiet house", "the long road", "some warm bread", "a blue kite", "the river",
            "an open door", "the night sky"]
_ENDINGS = [".", " today.", " again.", " in the morning.", " with care.", "!"]


def synthetic_corpus(num_chars: int, seed: int = 0) -> str:
    """``num_chars`` characters of simple English sentences drawn from a small grammar (the same for a seed)."""
    rng = random.Random(seed)
    parts, n = [], 0
    while n < num_chars:
        s = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}{rng.choice(_ENDINGS)}\n"
        parts.append(s)
        n += len(s)
    return "".join(parts)[:num_chars]


def encode(text: str) -> torch.Tensor:
    """The UTF-8 bytes of ``text`` as an int64 tensor of ids in [0, 256)."""
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def decode(ids: torch.Tensor) -> str:
    """The text of byte ids (invalid UTF-8 replaced)."""
    return bytes(int(i) for i in ids.flatten()).decode("utf-8", errors="replace")


def batch_of_windows(ids: torch.Tensor, batch: int, seq_len: int, seed: int, step: int) -> tuple[torch.Tensor,
                                                                                                 torch.Tensor]:
    """``batch`` random windows of ``ids`` (inputs ``[batch, seq_len]`` and next-byte targets), the same on every
    rank for the same ``(seed, step)``: each data-parallel rank then takes its rows of this global batch."""
    if len(ids) <= seq_len + 1:
        raise ValueError(f"the corpus has {len(ids)} tokens, too few for windows of seq_len={seq_len}; use a "
                         "longer corpus or a shorter seq_len")
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(ids) - seq_len - 1, (batch,), generator=g)
    rows = torch.stack([ids[s:s + seq_len + 1] for s in starts.tolist()])
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
